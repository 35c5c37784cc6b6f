"""Typed interface of gpuctl.torch (see its modules for the documentation)."""

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

class MemoryLeakWarning(UserWarning): ...

class Leak:
    source: str
    kind: str
    tensors: int
    bytes: int
    bytes_per_step: float
    graph_nodes: int
    nodes_per_step: float
    step: int
    remedy: str

class MemoryMonitor:
    FIELDS: tuple[str, ...]
    GROWTH_CENSUSES: int
    rows: list[dict[str, Any]]
    check_every: int
    census_limit_s: float
    census_visits: int
    census_share: Optional[float]
    sweep_every: Optional[int]
    steps: int
    leaks: list[Leak]
    census_seconds: float
    step_seconds: float
    def __init__(
        self,
        trace: Union[None, str, PathLike[str]] = None,
        device: Any = None,
        *,
        check_every: int = 10,
        census_limit_s: float = 0.5,
        census_visits: int = 200_000,
        census_share: Optional[float] = 0.05,
        sweep_every: Optional[int] = 10,
    ) -> None: ...
    def step(self) -> list[Leak]: ...
    def milestone(self, label: str) -> dict[str, Any]: ...
    def plot(self, path: Union[str, PathLike[str]]) -> None: ...

class Estimate:
    parameters_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activations_per_sample_bytes: int
    fixed_bytes: int
    measured: dict[int, int]
    how: str
    def peak_bytes(self, micro_batch: int) -> int: ...
    def largest_micro_batch(self, free_bytes: int) -> int: ...

def estimate(
    model: torch.nn.Module,
    sample: Batch,
    optimizer: Union[None, str, Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]] = "adamw",
    dtype: Union[None, torch.dtype, str] = None,
    *,
    loss_fn: Optional[Callable[[torch.nn.Module, Batch], torch.Tensor]] = None,
) -> Estimate: ...
def explain_oom(
    error: Union[BaseException, str],
    device: Union[None, int, str, torch.device] = None,
    *,
    seq_len: Optional[int] = None,
    vocab_size: Optional[int] = None,
    logits_dtype: Union[torch.dtype, str] = ...,
) -> str: ...

class OutOfMemoryAtOne(Error): ...

class OOMRecovery:
    recoveries: int
    steps: int
    estimate: Optional[Estimate]
    def __init__(
        self,
        model: torch.nn.Module,
        batch_size: int,
        micro_batch: Union[int, str] = "auto",
        *,
        estimate: Optional[Estimate] = None,
        free_bytes: Optional[int] = None,
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
