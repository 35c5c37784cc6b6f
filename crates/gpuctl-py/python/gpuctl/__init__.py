"""gpuctl from Python: who holds GPU memory, and getting it back safely.

The same road as the ``gpuctl`` command (which this wheel also installs): every call maps
its keywords onto gpuctl-core's requests, with the same guard, protection, identity checks
(pid and start time) and verification through NVML as the CLI. A caller who is not root
ends only its own processes. NVML calls are bounded by the CLI's deadline
(GPUCTL_NVML_TIMEOUT, the configuration's ``nvml_timeout``, 10 s), and the GIL is released
while gpuctl-core works.

Errors are exceptions carrying the CLI's one-line message and its exit status
(``.exit_code``): :class:`NvmlError` (no driver or library), :class:`UsageError` (a bad
GPU, selector, size), :class:`Error` (their base; an operation that failed).

The PyTorch hooks (``RunGuard``, ``MemoryMonitor``, ``OOMRecovery``) are in
:mod:`gpuctl.torch`, imported only where torch is installed.
"""

from __future__ import annotations

import json as _json
import os as _os

# collections' namedtuple, not typing's NamedTuple: importing `typing` (with contextlib and
# warnings) and building the class were about 6 of this module's own 7 ms of import, for
# one class; json has already imported collections. The stub (__init__.pyi) gives type
# checkers the fields' types.
from collections import namedtuple as _namedtuple

from . import _gpuctl
from ._gpuctl import Error, NvmlError, RunningError, UsageError

__version__ = _gpuctl.VERSION

__all__ = [
    "Device",
    "Error",
    "MigDevice",
    "NvmlError",
    "Process",
    "Report",
    "RunningError",
    "Skipped",
    "Snapshot",
    "UsageError",
    "clear",
    "enable",
    "fraction",
    "kill",
    "pick",
    "snapshot",
]


class Process:
    """One process holding memory on a GPU (or a MIG instance), as ``gpuctl info`` shows it."""

    __slots__ = ("_doc", "owner")

    def __init__(self, doc: dict, owner: str | None) -> None:
        self._doc = doc
        #: Who the process belongs to (``slurm 123.0``, ``nginx.service``, ``docker 3f2a…``),
        #: as the CLI's table labels it; None when its cgroup names no owner.
        self.owner = owner

    @property
    def pid(self) -> int:
        return self._doc["pid"]

    @property
    def user(self) -> str | None:
        return self._doc["user"]

    @property
    def used_bytes(self) -> int | None:
        return self._doc["used_bytes"]

    @property
    def command(self) -> str | None:
        return self._doc["command"]

    @property
    def state(self) -> str | None:
        return self._doc["state"]

    @property
    def age_seconds(self) -> float | None:
        return self._doc["age_seconds"]

    @property
    def idle(self) -> dict | None:
        """What the watchdog's ``[idle]`` window found, when it finds the process idle:
        ``idle_since``, ``idle_seconds``, ``memory_bytes``, ``measured_pct`` and
        ``utilization`` (docs/json.md); None otherwise."""
        return self._doc.get("idle")

    def to_dict(self) -> dict:
        """This process's entry of ``gpuctl info --json``."""
        return self._doc

    def __repr__(self) -> str:
        return f"Process(pid={self.pid}, user={self.user!r}, used_bytes={self.used_bytes}, command={self.command!r})"


class MigDevice:
    """A MIG instance of a GPU."""

    __slots__ = ("_doc", "processes")

    def __init__(self, doc: dict, processes: list[Process]) -> None:
        self._doc = doc
        self.processes = processes

    @property
    def gpu_instance_id(self) -> int:
        return self._doc["gpu_instance_id"]

    @property
    def uuid(self) -> str | None:
        return self._doc.get("uuid")

    def to_dict(self) -> dict:
        return self._doc

    def __repr__(self) -> str:
        return f"MigDevice(gpu_instance_id={self.gpu_instance_id}, processes={len(self.processes)})"


class Health:
    """A GPU's health verdict, as `gpuctl health` gives it: the action the GPU needs
    (`none`, `gpu_reset`, `node_reboot`, `drain_p2p`, `drain_and_reset`) and its causes, each
    a dict with `kind`, `action` and `message` (docs/json.md)."""

    __slots__ = ("_doc",)

    def __init__(self, doc: dict) -> None:
        self._doc = doc

    @property
    def action(self) -> str:
        return self._doc["action"]

    @property
    def causes(self) -> list:
        return self._doc["causes"]

    @property
    def ok(self) -> bool:
        """The GPU needs nothing (an application's Xid may still be listed)."""
        return self.action == "none"

    def to_dict(self) -> dict:
        return self._doc

    def __repr__(self) -> str:
        return f"Health(action={self.action!r}, causes={len(self.causes)})"


class Device:
    """One GPU: its memory and the processes that hold it."""

    __slots__ = ("_doc", "processes", "mig_devices")

    def __init__(self, doc: dict, owners: list) -> None:
        self._doc = doc
        self.processes = [Process(p, o) for p, o in zip(doc.get("processes") or [], owners)]
        by_pid = {p.pid: p for p in self.processes}
        self.mig_devices = [
            MigDevice(m, [by_pid.get(p["pid"]) or Process(p, None) for p in m.get("processes") or []])
            for m in doc.get("mig_devices") or []
        ]

    @property
    def index(self) -> int:
        return self._doc["index"]

    @property
    def uuid(self) -> str | None:
        return self._doc["uuid"]

    @property
    def name(self) -> str | None:
        return self._doc["name"]

    @property
    def memory_used(self) -> int | None:
        memory = self._doc.get("memory")
        return memory["used_bytes"] if memory else None

    @property
    def memory_total(self) -> int | None:
        memory = self._doc.get("memory")
        return memory["total_bytes"] if memory else None

    @property
    def health(self) -> Health | None:
        """The GPU's health verdict; None where the GPU did not answer."""
        doc = self._doc.get("health")
        return Health(doc) if doc is not None else None

    def to_dict(self) -> dict:
        return self._doc

    def __repr__(self) -> str:
        return (f"Device(index={self.index}, name={self.name!r}, memory_used={self.memory_used}, "
                f"memory_total={self.memory_total}, processes={len(self.processes)})")


class Snapshot:
    """Every selected GPU and every process holding memory on it, at one moment."""

    __slots__ = ("_doc", "devices")

    def __init__(self, doc: dict, owners: list) -> None:
        self._doc = doc
        self.devices = [Device(d, o) for d, o in zip(doc["devices"], owners)]

    def to_dict(self) -> dict:
        """The same document as ``gpuctl info --json`` (schema 1, docs/json.md)."""
        return self._doc

    def __repr__(self) -> str:
        return f"Snapshot(devices={self.devices!r})"


class Skipped(_namedtuple("Skipped", ["pid", "why"])):
    """A process ``clear`` or ``kill`` did not end, and why (protected, another user's, not
    on a GPU, reported only, or one that did not end). A tuple: ``pid, why = entry`` and
    ``dict(report.skipped)`` work as they did when it was a plain ``(pid, why)``."""

    __slots__ = ()


class Report:
    """What ``clear`` or ``kill`` did.

    ``ended``: the pids ended (their memory verified released through NVML);
    ``skipped``: a :class:`Skipped` ``(pid, why)`` for each process not ended;
    ``planned``: with ``dry_run``, the pids that would be signalled; ``free``: everything
    went well (for ``clear`` with ``wait``: the GPUs were free in time). ``to_dict()`` is
    the document of ``gpuctl kill --json`` / ``gpuctl clear --json``.
    """

    __slots__ = ("_doc", "ended", "skipped", "planned", "free")

    def __init__(self, native: _gpuctl.Reclaimed) -> None:
        self._doc = _json.loads(native.document)
        self.ended: list[int] = list(native.ended)
        self.skipped: list[Skipped] = [Skipped(pid, why) for pid, why in native.skipped]
        self.planned: list[int] = list(native.planned)
        self.free: bool = native.clean

    def to_dict(self) -> dict:
        return self._doc

    def __repr__(self) -> str:
        return f"Report(ended={self.ended}, skipped={self.skipped}, planned={self.planned}, free={self.free})"


def _names(value, what: str) -> list:
    """None, one value or an iterable of values, as a list of strings (GPU names, users...)."""
    if value is None:
        return []
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return [str(value)]
    try:
        items = list(value)
    except TypeError:
        raise UsageError(f"{what}: give a value or a list of values, not {type(value).__name__}") from None
    for item in items:
        if not isinstance(item, (str, int)) or isinstance(item, bool):
            raise UsageError(f"{what}: {item!r} is not a name or a number")
    return [str(item) for item in items]


def snapshot(gpus=None) -> Snapshot:
    """Every GPU (or those ``gpus`` names: index, UUID, bus id, MIG UUID, ``GPU/GI``) and
    the processes holding memory on them: ``gpuctl info``."""
    document, owners = _gpuctl.snapshot_json(_names(gpus, "gpus"))
    return Snapshot(_json.loads(document), owners)


def pick(n: int = 1, min_free=None, max_util=None) -> list:
    """``n`` GPUs (or MIG instances) that qualify now, as :class:`Device` s: ``gpuctl pick``.
    A GPU qualifies when its health verdict is ``none`` and it is free as ``clear`` with
    ``wait`` judges free (no process, under 256 MiB in use), or, with ``min_free`` (bytes,
    a size such as ``"40GiB"`` or a share such as ``"50%"``) and ``max_util`` (percent),
    by those instead. A MIG instance is the Device of its GPU, showing only that instance.
    No lease is taken: another launcher may pick the same GPUs at the same moment; ``gpuctl
    run`` holds them while a command runs. Too few qualify: :class:`Error` with
    ``exit_code`` 4."""
    if not isinstance(n, int) or isinstance(n, bool):
        raise UsageError(f"n: {n!r} is not a number of GPUs")
    if n < 1:
        raise UsageError("n: ask for at least one GPU")
    if min_free is not None and (not isinstance(min_free, (int, str)) or isinstance(min_free, bool)):
        raise UsageError(f"min_free: {min_free!r} is not a number of bytes or a size")
    if max_util is not None and (not isinstance(max_util, int) or isinstance(max_util, bool)):
        raise UsageError(f"max_util: {max_util!r} is not a percentage")
    uuids = _gpuctl.pick(n, None if min_free is None else str(min_free), max_util)
    return snapshot(gpus=uuids).devices


def clear(gpus=None, wait: float | None = None, dry_run: bool = False) -> Report:
    """Reclaims what crashed runs left behind (orphaned workers, zombie holders) on every
    GPU or those ``gpus`` names, and with ``wait`` (seconds) waits until they are free:
    ``gpuctl clear``."""
    return Report(_gpuctl.clear(_names(gpus, "gpus"), None if wait is None else float(wait), bool(dry_run)))


def kill(pids=None, user=None, owner=None, gpus=None, min_memory=None, signal: str = "TERM",
         dry_run: bool = False) -> Report:
    """Ends the GPU processes the selectors name (they combine as AND; a list widens its
    own): ``gpuctl kill``. ``user``: a name or uid; ``owner``: ``slurm:JOBID``,
    ``unit:NAME``, ``unit:NAME@UID``...; ``min_memory``: bytes, or a size such as ``"2GiB"``. Signals
    ``signal`` (``TERM`` then ``KILL`` after 10 s) and verifies through NVML that the memory
    came back. No selector at all, or one no GPU process matches, raises UsageError."""
    if pids is None:
        pid_list = []
    elif isinstance(pids, int) and not isinstance(pids, bool):
        pid_list = [pids]
    else:
        try:
            pid_list = [int(p) for p in pids]
        except (TypeError, ValueError):
            raise UsageError(f"pids: {pids!r} is not a process id or a list of them") from None
    if min_memory is not None and not isinstance(min_memory, (int, str)) or isinstance(min_memory, bool):
        raise UsageError(f"min_memory: {min_memory!r} is not a number of bytes or a size")
    return Report(_gpuctl.kill(pid_list, _names(user, "user"), _names(owner, "owner"),
                               _names(gpus, "gpus"), min_memory, str(signal), bool(dry_run)))


def _cuda_initialized() -> bool:
    torch = __import__("sys").modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:
        return False


def enable(framework: str = "pytorch") -> dict:
    """Applies ``gpuctl enable``'s allocator settings for ``framework`` (``pytorch``,
    ``jax``, ``tensorflow``) to ``os.environ``, keeping any the user set, and returns those
    it set. Call it before CUDA initialises: the allocator reads them once."""
    if _cuda_initialized():
        raise UsageError("enable: CUDA is already initialised in this process, so the allocator "
                         "settings would not take effect: call gpuctl.enable() before the first CUDA use")
    applied = {}
    for name, value, kept, _why in _gpuctl.enable_settings(str(framework), dict(_os.environ)):
        if not kept:
            _os.environ[name] = value
            applied[name] = value
    return applied


def fraction(gpu=None) -> float | None:
    """The share of one GPU's memory a process of this user may hold (``[fraction]`` of
    gpuctl.toml), on ``gpu`` or, with none, the user or default entry; None for no limit."""
    found = _gpuctl.fraction(None if gpu is None else str(gpu))
    return None if found is None else found[0]
