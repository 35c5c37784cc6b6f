"""Typed interface of gpuctl.torch (see torch.py for the documentation)."""

from os import PathLike
from typing import Any, Callable, Optional, Sequence, TypeVar, Union

import torch

from . import Error, RunningError as RunningError

Batch = Union[torch.Tensor, tuple, list, dict]
F = TypeVar("F", bound=Callable[..., Any])

class Cleanup:
    leftovers: int
    freed_bytes: int
    log: list[str]

class RunGuard:
    name: str
    dir: Optional[str]
    cleanup: Cleanup
    def __init__(
        self,
        name: str,
        dir: Union[None, str, PathLike[str]] = None,
        *,
        watch: Optional[float] = 1.0,
        device: Optional[str] = None,
    ) -> None: ...
    @property
    def path(self) -> str: ...
    def __enter__(self) -> RunGuard: ...
    def __exit__(self, kind: Any, value: Any, traceback: Any) -> None: ...
    def record(self, workers: Optional[Sequence[int]] = None) -> None: ...

class MemoryMonitor:
    rows: list[dict[str, Any]]
    def __init__(self, trace: Union[None, str, PathLike[str]] = None, device: Any = None) -> None: ...
    def milestone(self, label: str) -> dict[str, Any]: ...
    def plot(self, path: Union[str, PathLike[str]]) -> None: ...

class OutOfMemoryAtOne(Error): ...

class OOMRecovery:
    recoveries: int
    steps: int
    def __init__(
        self,
        model: torch.nn.Module,
        batch_size: int,
        micro_batch: Union[int, str] = "auto",
        *,
        inject_oom_above: Optional[int] = None,
        seq_len: Optional[int] = None,
        vocab_size: Optional[int] = None,
        logits_dtype: Union[torch.dtype, str] = ...,
        log: Callable[[str], None] = ...,
    ) -> None: ...
    @property
    def micro_batch(self) -> int: ...
    def step(self, batch: Batch, loss_fn: Callable[[Batch], torch.Tensor]) -> torch.Tensor: ...

def logits_bytes(batch: int, seq: int, vocab: int, dtype: Union[torch.dtype, str] = ...) -> int: ...
def is_out_of_memory(error: BaseException) -> bool: ...
def find_executable_micro_batch(
    batch_size: int,
    starting_micro_batch: Optional[int] = None,
    *,
    inject_oom_above: Optional[int] = None,
    log: Callable[[str], None] = ...,
) -> Callable[[F], F]: ...
