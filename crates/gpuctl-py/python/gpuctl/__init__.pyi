"""Typed interface of the gpuctl module (see __init__.py for the documentation)."""

from typing import Iterable, NamedTuple, Optional, Sequence, Union

__version__: str

GpuName = Union[int, str]

class Error(Exception):
    """A gpuctl operation failed; ``exit_code`` is the status the CLI would exit with."""
    exit_code: int

class NvmlError(Error):
    """NVML or the NVIDIA driver is unavailable (exit status 3)."""

class UsageError(Error):
    """A bad argument: an unknown GPU, a bad selector or size (exit status 2)."""

class RunningError(Error):
    """A live run of this name holds its lock (RunGuard)."""

class Process:
    owner: Optional[str]
    @property
    def pid(self) -> int: ...
    @property
    def user(self) -> Optional[str]: ...
    @property
    def used_bytes(self) -> Optional[int]: ...
    @property
    def command(self) -> Optional[str]: ...
    @property
    def state(self) -> Optional[str]: ...
    @property
    def age_seconds(self) -> Optional[float]: ...
    @property
    def idle(self) -> Optional[dict]: ...
    def to_dict(self) -> dict: ...

class MigDevice:
    processes: list[Process]
    @property
    def gpu_instance_id(self) -> int: ...
    @property
    def uuid(self) -> Optional[str]: ...
    def to_dict(self) -> dict: ...

class Health:
    @property
    def action(self) -> str: ...
    @property
    def causes(self) -> list[dict]: ...
    @property
    def ok(self) -> bool: ...
    def to_dict(self) -> dict: ...

class Device:
    processes: list[Process]
    mig_devices: list[MigDevice]
    @property
    def index(self) -> int: ...
    @property
    def uuid(self) -> Optional[str]: ...
    @property
    def name(self) -> Optional[str]: ...
    @property
    def memory_used(self) -> Optional[int]: ...
    @property
    def memory_total(self) -> Optional[int]: ...
    @property
    def health(self) -> Optional[Health]: ...
    def to_dict(self) -> dict: ...

class Snapshot:
    devices: list[Device]
    def to_dict(self) -> dict: ...

class Skipped(NamedTuple):
    pid: int
    why: str

class Report:
    ended: list[int]
    skipped: list[Skipped]
    planned: list[int]
    free: bool
    def to_dict(self) -> dict: ...

def snapshot(gpus: Union[None, GpuName, Iterable[GpuName]] = None) -> Snapshot: ...
def pick(
    n: int = 1,
    min_free: Union[None, int, str] = None,
    max_util: Optional[int] = None,
) -> list[Device]: ...
def clear(
    gpus: Union[None, GpuName, Iterable[GpuName]] = None,
    wait: Optional[float] = None,
    dry_run: bool = False,
) -> Report: ...
def kill(
    pids: Union[None, int, Sequence[int]] = None,
    user: Union[None, str, int, Iterable[Union[str, int]]] = None,
    owner: Union[None, str, Iterable[str]] = None,
    gpus: Union[None, GpuName, Iterable[GpuName]] = None,
    min_memory: Union[None, int, str] = None,
    signal: str = "TERM",
    dry_run: bool = False,
) -> Report: ...
def enable(framework: str = "pytorch") -> dict[str, str]: ...
def fraction(gpu: Optional[GpuName] = None) -> Optional[float]: ...
