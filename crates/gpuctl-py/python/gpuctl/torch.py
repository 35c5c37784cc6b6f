"""gpuctl for PyTorch training scripts: startup cleanup of a crashed run, memory at
milestones, and OOM recovery that keeps the effective batch.

Imported only where torch is installed (``import gpuctl`` never imports torch)::

    from gpuctl.torch import RunGuard, MemoryMonitor, OOMRecovery, logits_bytes

    with RunGuard("llama-ft", dir=checkpoint_dir):
        rec = OOMRecovery(model, batch_size=64, micro_batch=64)
        for batch in loader:
            loss = rec.step(batch, lambda mb: loss_fn(model(mb["x"]), mb["y"]))
            optimizer.step(); optimizer.zero_grad()

The adapter is :func:`find_executable_micro_batch`, in the style of HF Accelerate's
``find_executable_batch_size`` (the decorator users of hand-written loops already reach
for, and the loop the people gpuctl grew from write), chosen over a Lightning callback
because Lightning users already get accumulation from the Trainer, while Accelerate's
decorator halves the batch and so changes the effective batch (and the learning dynamics)
on every OOM. This one halves the micro-batch and doubles the accumulation instead.
"""

from __future__ import annotations

import collections
import csv
import functools
import gc
import itertools
import os
import re
import sys
import threading
import time
import types
import warnings
import weakref

import torch

import gpuctl
from gpuctl import Error, RunningError, _gpuctl

__all__ = [
    "Estimate",
    "Leak",
    "MemoryLeakWarning",
    "MemoryMonitor",
    "OOMRecovery",
    "OutOfMemoryAtOne",
    "RunGuard",
    "RunningError",
    "estimate",
    "explain_oom",
    "find_executable_micro_batch",
    "is_out_of_memory",
    "logits_bytes",
]

_GIB = float(1 << 30)


def _gib(value) -> str:
    return "n/a" if value is None else f"{value / _GIB:.2f} GiB"


def _log(line: str) -> None:
    print(f"gpuctl: {line}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- RunGuard


def _children() -> list:
    """This process's child processes (the DataLoader's workers among them)."""
    pids = set()
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as f:
                pids.update(int(p) for p in f.read().split())
        return sorted(pids)
    except OSError:
        pass
    # Kernels without the children file: every process whose parent is this one.
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == me:
            pids.add(int(entry))
    return sorted(pids)


# The run locks this process holds. A worker forked without exec (the DataLoader's, by
# default) would share the lock's open file, and outliving a crash it would keep the run's
# name taken: each forked child drops its copy at once (to /dev/null, so nothing else's
# descriptor is ever closed in its place).
_held_locks: set = set()


def _drop_locks_in_child() -> None:
    for fd in list(_held_locks):
        try:
            null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            os.dup2(null, fd, inheritable=False)
            os.close(null)
        except OSError:
            pass
    _held_locks.clear()


os.register_at_fork(after_in_child=_drop_locks_in_child)


class Cleanup:
    """What startup cleanup did: ``leftovers`` found alive, ``freed_bytes`` of GPU memory
    NVML showed released, and the ``log`` lines (also written to stderr)."""

    __slots__ = ("leftovers", "freed_bytes", "log")

    def __init__(self, leftovers: int = 0, freed_bytes: int = 0, log=None) -> None:
        self.leftovers = leftovers
        self.freed_bytes = freed_bytes
        self.log = list(log or [])

    def __repr__(self) -> str:
        return f"Cleanup(leftovers={self.leftovers}, freed_bytes={self.freed_bytes})"


class RunGuard:
    """A run's claim on its name, with startup cleanup of the previous run of that name.

    The Rust trainer's run file and lock, in the same format (gpuctl-core's ``runfile``):
    ``NAME.run.json`` and ``NAME.run.lock`` in ``dir`` (a checkpoint directory), else in
    ``$XDG_RUNTIME_DIR/gpuctl-trainer/``. On enter it takes the lock (a live run of the
    name raises :class:`gpuctl.RunningError`) and, if the previous run did not finish, ends
    its processes that are still alive, identified by pid *and* start time, through the
    guarded road of ``gpuctl clear``: those on a GPU are signalled and NVML must show their
    memory released. Anything it could not end raises :class:`gpuctl.Error` (exit status 4,
    as the trainer's). Then it records this process and, every ``watch`` seconds while the
    run lives, its child processes (the DataLoader's workers); :meth:`record` does so at
    once. A clean exit removes the run file; an exception keeps it, so the next start cleans
    up after this one.
    """

    def __init__(self, name: str, dir=None, *, watch: float | None = 1.0, device: str | None = None) -> None:
        self.name = name
        self.dir = None if dir is None else os.fspath(dir)
        self.watch = watch
        self.device = device
        self.cleanup = Cleanup()
        self._lock = None
        self._recorded = None
        self._stop = threading.Event()
        self._watcher = None

    @property
    def path(self) -> str:
        """The run file's path (where it is held, once entered)."""
        if self._lock is not None:
            return self._lock.path
        return _gpuctl.run_location(self.name, self.dir)

    def __enter__(self) -> "RunGuard":
        lock, previous = _gpuctl.run_acquire(self.name, self.dir)
        self._lock = lock
        self._fd = lock.fileno()
        # Another user's lock or directory where the run file would be: stepped around.
        for notice in lock.notices():
            _log(notice)
        _held_locks.add(self._fd)
        try:
            if previous is not None:
                leftovers, freed, failures, lines = _gpuctl.run_clean_up(previous)
                for line in lines:
                    _log(line)
                self.cleanup = Cleanup(leftovers, freed, lines)
                if failures:
                    error = Error("startup cleanup could not end the previous run's leftovers or "
                                  "free their memory: " + "; ".join(failures))
                    error.exit_code = 4
                    raise error
            if self.device is None:
                self.device = "cuda" if torch.cuda.is_available() else "cpu"
            self.record()
        except BaseException:
            _held_locks.discard(self._fd)
            lock.release()
            self._lock = None
            raise
        if self.watch:
            self._watcher = threading.Thread(target=self._watch, name="gpuctl-runguard", daemon=True)
            self._watcher.start()
        return self

    def record(self, workers=None) -> None:
        """Records this process and ``workers`` (pids; default: its child processes now)."""
        if self._lock is None:
            raise Error(f"run {self.name!r} is not held: use RunGuard as a context manager")
        workers = _children() if workers is None else sorted(int(p) for p in workers)
        self._lock.record(self.device, workers)
        self._recorded = workers

    def _watch(self) -> None:
        while not self._stop.wait(self.watch):
            try:
                children = _children()
                if children != self._recorded:
                    self.record(children)
            except Exception as error:  # the run goes on; the record stays as it was
                _log(f"run {self.name!r}: could not update the run file: {error}")

    def __exit__(self, kind, value, traceback) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join()
        if self._lock is not None:
            _held_locks.discard(self._fd)
            if kind is None:
                self._lock.finish()
            else:
                self._lock.release()
            self._lock = None


# --------------------------------------------------------------------------- Leak census


class MemoryLeakWarning(UserWarning):
    """A container or attribute that keeps tensors with autograd history, and so their
    graphs, from step to step (:meth:`MemoryMonitor.step`). Warned once per source."""


def _bytes_text(n: float) -> str:
    """Bytes for people: ``48 MiB``, ``1.5 GiB``, ``12 B``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            value = n / size
            return f"{value:.0f} {unit}" if abs(value) >= 10 else f"{value:.1f} {unit}"
    return f"{n:.0f} B"


class Leak:
    """One source of a leak: the attribute, variable or container (``source``, e.g.
    ``Net.reconstruction_targets``) that holds ``tensors`` tensors with autograd history
    (``kind``: ``list``, ``dict``, ``tensor``...), ``bytes`` in them and in the saved
    tensors of their graphs, growing by ``bytes_per_step`` (and ``nodes_per_step`` graph
    nodes); ``remedy`` says what to change."""

    __slots__ = ("source", "kind", "tensors", "bytes", "bytes_per_step", "graph_nodes", "step", "remedy",
                 "nodes_per_step")

    def __init__(self, source, kind, tensors, nbytes, bytes_per_step, graph_nodes, step, remedy,
                 nodes_per_step=0.0) -> None:
        self.source = source
        self.kind = kind
        self.tensors = tensors
        self.bytes = nbytes
        self.bytes_per_step = bytes_per_step
        self.graph_nodes = graph_nodes
        self.step = step
        self.remedy = remedy
        self.nodes_per_step = nodes_per_step

    def __str__(self) -> str:
        tensors = f"{self.tensors} tensor" + ("" if self.tensors == 1 else "s")
        growth = f"+{_bytes_text(self.bytes_per_step)}/step"
        if self.nodes_per_step >= 1 and self.bytes_per_step < 1024:
            # A graph that grows as a chain (a running value updated without .detach()).
            growth += f", +{self.nodes_per_step:.0f} graph nodes/step"
        return (f"{self.source} ({self.kind}, {tensors}, {growth}) keeps tensors with autograd history, and "
                f"their graphs, from step to step: {self.remedy}")

    def __repr__(self) -> str:
        return (f"Leak(source={self.source!r}, kind={self.kind!r}, tensors={self.tensors}, bytes={self.bytes}, "
                f"bytes_per_step={self.bytes_per_step:.0f})")


# What nn.Module keeps of its own in __dict__ (hooks, the parameter table): never a user's
# store. `_buffers` and `_modules` are walked (a buffer with a grad_fn is a leak too).
_MODULE_INTERNALS = frozenset(torch.nn.Module().__dict__) - {"_buffers", "_modules"}
_LIBRARY_ROOTS = tuple({os.path.dirname(os.__file__)} | {p for p in sys.path if p.endswith(("site-packages", "dist-packages"))})
_THIS_FILE = __file__
_SCALARS = (str, bytes, int, float, complex, bool, type(None), range, type, types.ModuleType, types.FunctionType,
            types.BuiltinFunctionType, types.MethodType, types.CodeType, types.FrameType, property, staticmethod,
            classmethod)
_user_types: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _library_file(path) -> bool:
    return bool(path) and (path.startswith(_LIBRARY_ROOTS) or path == _THIS_FILE or "<frozen" in path)


def _users_class(cls) -> bool:
    """A class of the user's program (its module's file outside the standard library and
    site-packages): its instances' attributes are walked; a library's objects are not."""
    known = _user_types.get(cls)
    if known is None:
        module = sys.modules.get(getattr(cls, "__module__", None) or "")
        known = module is not None and not _library_file(getattr(module, "__file__", None) or "<frozen>")
        _user_types[cls] = known
    return known


def _storage(tensor):
    """(key, bytes) of a tensor's storage; the key dedupes views of one storage."""
    try:
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        # No data (the meta device): the storage object itself is the identity.
        return ((storage.device, pointer) if pointer else id(storage)), storage.nbytes()
    except (RuntimeError, NotImplementedError, TypeError):  # sparse, nested: no plain storage
        return id(tensor), tensor.numel() * tensor.element_size()


# The `_saved_*` attributes of each kind of graph node (read once per kind; the kinds are
# torch's generated classes, a fixed set).
_saved_names: dict = {}


class _Reading:
    """One source's share of a census."""

    __slots__ = ("kind", "tensors", "bytes", "nodes", "scalars", "bounded")

    def __init__(self, kind: str, bounded: bool) -> None:
        self.kind = kind
        self.tensors = 0
        self.bytes = 0
        self.nodes = 0
        self.scalars = True
        self.bounded = bounded


class _Census:
    """The tensors with autograd history that the program holds after a step, by source.

    Walked from the roots a training loop holds its objects by (the locals of the frames
    that called :meth:`MemoryMonitor.step`, and the globals of the user's modules) through
    containers, modules, optimizers and the user's own objects, never into library objects,
    within a visit and a time budget. Each tensor found is charged to the attribute or
    variable of the nearest named object (``Net.targets``, ``losses in train()``,
    ``__main__.history``), with its storage and the storages its graph saved for backward.
    """

    def __init__(self, frame, budget_visits: int, deadline: float, known=frozenset()) -> None:
        self.readings: dict = {}
        # Sources already warned of: their tensors are counted, their graphs not walked
        # again (a leak found costs the census no more as it grows).
        self._known_leaks = known
        self.visits = 0
        self.complete = True
        self._budget = budget_visits
        self._deadline = deadline
        self._seen: set = set()
        self._storages: set = set()
        self._nodes: set = set()
        self._node_refs: list = []  # the nodes walked, alive until the census ends: ids stay unique
        stack = []
        globals_seen = set()
        while frame is not None:
            code = frame.f_code
            if not _library_file(code.co_filename):
                where = f"in {code.co_name}()" if code.co_name != "<module>" else None
                for name, value in list(frame.f_locals.items()) if where else ():
                    stack.append((value, f"{name} {where}", value))
                if id(frame.f_globals) not in globals_seen:
                    globals_seen.add(id(frame.f_globals))
                    module = frame.f_globals.get("__name__", "?")
                    for name, value in list(frame.f_globals.items()):
                        if not name.startswith("__"):
                            stack.append((value, f"{module}.{name}", value))
            frame = frame.f_back
        stack.reverse()  # the innermost frame's locals first: a model is named from there
        self._walk(stack)

    def _walk(self, stack) -> None:
        seen, readings = self._seen, self.readings
        while stack:
            obj, source, holder = stack.pop()
            if isinstance(obj, _SCALARS) or id(obj) in seen:
                continue
            seen.add(id(obj))
            self.visits += 1
            if self.visits % 1024 == 0 and (self.visits > self._budget or time.perf_counter() > self._deadline):
                self.complete = False
                return
            if isinstance(obj, torch.Tensor):
                if obj.grad_fn is not None and not obj.is_meta:
                    reading = readings.get(source)
                    if reading is None:
                        bounded = isinstance(holder, collections.deque) and holder.maxlen is not None
                        kind = "tensor" if holder is obj else type(holder).__name__
                        reading = readings[source] = _Reading(kind, bounded)
                    self._charge(reading, obj, source not in self._known_leaks)
                continue
            if isinstance(obj, torch.nn.Module):
                name = type(obj).__name__
                for key, value in list(vars(obj).items()):
                    if key == "_modules" or key == "_buffers":
                        for sub, child in list(value.items()):
                            if child is not None:
                                stack.append((child, f"{name}.{sub}", child))
                    elif key not in _MODULE_INTERNALS:
                        stack.append((value, f"{name}.{key}", value))
            elif isinstance(obj, torch.optim.Optimizer):
                stack.append((obj.state, f"{type(obj).__name__}.state", obj.state))
            elif isinstance(obj, dict):
                self._items(stack, obj.values(), len(obj), source, holder)
            elif isinstance(obj, (list, tuple, collections.deque, set, frozenset)):
                self._items(stack, obj, len(obj), source, holder)
            elif _users_class(type(obj)):
                attributes = getattr(obj, "__dict__", None)
                if isinstance(attributes, dict):
                    name = type(obj).__name__
                    for key, value in list(attributes.items()):
                        stack.append((value, f"{name}.{key}", value))

    @staticmethod
    def _items(stack, items, length, source, holder) -> None:
        if length > 4096:
            # A large container of plain data (a dataset's index, a vocabulary): walked
            # only if its ends hold something a tensor could hide in.
            probe = list(items)
            ends = probe[:64] + probe[-64:]
            if all(isinstance(v, _SCALARS) for v in ends):
                return
            items = probe
        for value in items:
            if not isinstance(value, _SCALARS):
                stack.append((value, source, holder))

    def _charge(self, reading: _Reading, tensor, graph: bool) -> None:
        reading.tensors += 1
        if tensor.dim() != 0:
            reading.scalars = False
        key, nbytes = _storage(tensor)
        if key not in self._storages:
            self._storages.add(key)
            reading.bytes += nbytes
        if not graph:
            return
        # The graph behind it: its nodes, and what they saved for backward. A node whose
        # saved tensors backward freed ends the walk there: that backward ran through
        # every node below it and freed them too (a graph kept after its backward, as a
        # logged loss's, costs one node per census, not the model's depth).
        nodes = [tensor.grad_fn]
        while nodes:
            node = nodes.pop()
            if node is None or id(node) in self._nodes:
                continue
            self._nodes.add(id(node))
            self._node_refs.append(node)
            self.visits += 1
            if self.visits > self._budget:
                self.complete = False
                return
            if not self._saved_bytes(reading, node):
                continue
            reading.nodes += 1
            nodes.extend(next_node for next_node, _ in node.next_functions)

    def sweep(self) -> None:
        """The tensors with autograd history the walk did not reach (held in a closure, a
        library's object, a hook's state), found among every object the garbage collector
        tracks, and named through their referrers: ``gc.get_referrers`` up to an object's
        attribute, a module's global, a closure's variable, within three levels."""
        self.readings = {}
        objects = gc.get_objects()
        kinds = {t for t in set(map(type, objects)) if issubclass(t, torch.Tensor)}
        found = [t for t in itertools.compress(objects, map(kinds.__contains__, map(type, objects)))
                 if id(t) not in self._seen and t.grad_fn is not None and not t.is_meta]
        del objects
        if not found:
            return
        named = self._names(found)
        for tensor in found:
            source, holder = named.get(id(tensor)) or (f"an unnamed tensor at {id(tensor):#x}", tensor)
            reading = self.readings.get(source)
            if reading is None:
                bounded = isinstance(holder, collections.deque) and holder.maxlen is not None
                kind = "tensor" if holder is tensor else type(holder).__name__
                reading = self.readings[source] = _Reading(kind, bounded)
            self._charge(reading, tensor, source not in self._known_leaks)
            if time.perf_counter() > self._deadline:
                self.complete = False
                return

    def _names(self, found: list) -> dict:
        """id(tensor) -> (source, holder) for the tensors ``found``: up their referrers,
        one ``gc.get_referrers`` for all of them per level (each call walks every object
        the collector tracks), to an instance's attribute, a module's global or a
        closure's variable."""
        modules = {id(m.__dict__): m for m in list(sys.modules.values()) if isinstance(m, types.ModuleType)}
        # A chain per object being traced: [object, the tensors it covers, holder, key].
        chains = {id(t): [t, [t], t, None] for t in found}
        named: dict = {}
        for _ in range(4):
            if not chains or time.perf_counter() > self._deadline:
                break
            objects = [chain[0] for chain in chains.values()]
            referrers = gc.get_referrers(*objects)
            # This function's own lists refer to the objects too: never a holder.
            ours = {id(objects), id(referrers), id(found)} | {id(c) for c in chains.values()} \
                | {id(c[1]) for c in chains.values()} | {id(v) for v in named.values()}
            following: dict = {}
            for referrer in referrers:
                if id(referrer) in ours or isinstance(referrer, types.FrameType):
                    continue
                for child in gc.get_referents(referrer):
                    chain = chains.get(id(child))
                    if chain is None or id(child) in following or any(id(t) in named for t in chain[1][:1]):
                        continue
                    held, key = chain[2], chain[3]
                    if isinstance(referrer, dict):
                        key = next((k for k, v in referrer.items() if v is child), key)
                        module = modules.get(id(referrer))
                        if module is not None:
                            self._resolve(named, chain, f"{module.__name__}.{key}")
                        else:  # an instance's __dict__ or a dict of the user's: one level up
                            following[id(child)] = (referrer, chain[1], held, key)
                    elif isinstance(referrer, types.FunctionType):
                        closure = referrer.__closure__ or ()
                        cell = next((c for c in closure if c is child), None)
                        if cell is None and isinstance(child, tuple) and child is closure:
                            cell = next((c for c in closure if c is chain[3]), None)
                        if cell is not None:
                            name = referrer.__code__.co_freevars[closure.index(cell)]
                            self._resolve(named, chain, f"{name} (closure of {referrer.__qualname__})")
                    elif type(referrer).__name__ == "cell":
                        following[id(child)] = (referrer, chain[1], held, key)
                    elif isinstance(referrer, tuple) and type(child).__name__ == "cell":
                        following[id(child)] = (referrer, chain[1], held, child)  # a function's __closure__
                    elif isinstance(referrer, (list, tuple, set, frozenset, collections.deque)):
                        following[id(child)] = (referrer, chain[1], referrer, None)
                    elif getattr(referrer, "__dict__", None) is child and key is not None:
                        self._resolve(named, chain, f"{type(referrer).__name__}.{key}")
                    elif isinstance(getattr(referrer, "__dict__", None), dict):
                        attribute = next((k for k, v in vars(referrer).items() if v is child), None)
                        if attribute is not None:
                            self._resolve(named, chain, f"{type(referrer).__name__}.{attribute}")
            chains = {}
            for obj, covers, held, key in following.values():
                if not any(id(t) in named for t in covers[:1]):
                    merged = chains.setdefault(id(obj), [obj, [], held, key])
                    merged[1].extend(covers)
            following = referrers = objects = None  # not to be found as holders next level
        return named

    @staticmethod
    def _resolve(named: dict, chain, source: str) -> None:
        for tensor in chain[1]:
            named.setdefault(id(tensor), (source, chain[2]))

    def _saved_bytes(self, reading: _Reading, node) -> bool:
        """Charges what ``node`` saved for backward; False once backward freed it."""
        names = _saved_names.get(type(node))
        if names is None:
            names = _saved_names[type(node)] = tuple(a for a in dir(type(node)) if a.startswith("_saved_"))
        for name in names:
            try:
                value = getattr(node, name)
            except Exception:  # noqa: BLE001 - "saved tensors ... have already been freed"
                return False
            for saved in (value,) if isinstance(value, torch.Tensor) else \
                    value if isinstance(value, (tuple, list)) else ():
                if isinstance(saved, torch.Tensor):
                    key, nbytes = _storage(saved)
                    if key not in self._storages:
                        self._storages.add(key)
                        reading.bytes += nbytes
        return True


# ------------------------------------------------------------------------ MemoryMonitor


def _remedy(source: str, reading) -> str:
    if " (closure of " in source or " in " in source:
        name = source.split(" ")[0]  # "history (closure of f)", "losses in train()"
    else:
        name = source.rsplit(".", 1)[-1]  # "Net.reconstruction_targets", "__main__.losses"
    if reading.scalars:
        if reading.kind == "tensor":
            return (f"keep it as a number with .item() ({name} = value.item()), or store value.detach(); "
                    f"or compute it under torch.no_grad()")
        return (f"log losses as numbers with .item() ({name}.append(loss.item())), or keep loss.detach(); "
                f"or compute them under torch.no_grad()")
    if reading.kind == "tensor":
        return f"store it with .detach() ({name} = x.detach(), .detach().cpu() off the GPU), or compute it under torch.no_grad()"
    return (f"store them with .detach() ({name}.append(x.detach()), .detach().cpu() off the GPU), or compute "
            f"them under torch.no_grad()")


def _cuda_up() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def _fragmentation(allocated, reserved):
    """1 − allocated/reserved: the share of what the caching allocator holds that no tensor
    uses (0 when it holds nothing)."""
    if allocated is None or not reserved:
        return None if reserved is None else 0.0
    return max(0.0, 1.0 - allocated / reserved)


def _allocator(device) -> dict:
    """torch's caching allocator on a CUDA ``device``: allocated, reserved and peak bytes,
    fragmentation, allocation retries and the largest free block it holds."""
    stats = torch.cuda.memory_stats(device)
    allocated = stats.get("allocated_bytes.all.current", torch.cuda.memory_allocated(device))
    reserved = stats.get("reserved_bytes.all.current", torch.cuda.memory_reserved(device))
    largest = None
    try:
        index = torch.device("cuda", device).index if isinstance(device, int) else torch.device(device).index
        index = torch.cuda.current_device() if index is None else index
        largest = max((block["size"] for segment in torch.cuda.memory_snapshot() if segment["device"] == index
                       for block in segment["blocks"] if block["state"] == "inactive"), default=0)
    except (RuntimeError, KeyError, TypeError, ValueError):
        pass
    return {
        "allocated": allocated,
        "reserved": reserved,
        "peak": stats.get("allocated_bytes.all.peak", torch.cuda.max_memory_allocated(device)),
        "fragmentation": _fragmentation(allocated, reserved),
        "retries": stats.get("num_alloc_retries"),
        "largest_free_block": largest,
    }


def _fragmented(request, allocated, reserved):
    """The fragmentation sentence, where an allocation of ``request`` bytes failed although
    the allocator held more than that reserved but unallocated; else None."""
    if request is None or allocated is None or reserved is None:
        return None
    idle = reserved - allocated
    if request >= idle:
        return None
    return (f"the allocator is fragmented: it holds {_gib(idle)} reserved but unallocated, more than the "
            f"{_gib(request)} asked for, in pieces too small for it. Set "
            f"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before CUDA starts (gpuctl.enable() "
            f"does, keeping your own settings; or start the run with `gpuctl enable python train.py`)")


class MemoryMonitor:
    """Memory at milestones, and a leak census every few steps.

    :meth:`milestone` logs what torch's caching allocator has allocated, reserved and peaked
    at on ``device``, its fragmentation, and what NVML says this process holds on its GPUs
    (None where NVML is unavailable); each is a row of ``trace`` (CSV) when given.

    :meth:`step`, called once per optimizer step, takes a census of the tensors with
    autograd history the program still holds every ``check_every`` steps (default 10). A
    source (an attribute, variable or container) that grows in two censuses running is a
    leak: it warns once with :class:`MemoryLeakWarning`, naming the source and what to
    change, and :attr:`leaks` holds it. A ``collections.deque`` with a ``maxlen`` is bounded
    and never a leak. Every ``sweep_every``-th census (10; None: never) a sweep looks for the
    tensors the census could not reach, among every object the garbage collector tracks
    (one held in a closure, say), and names them through ``gc.get_referrers``. A census
    stops at ``census_limit_s`` seconds or ``census_visits``
    objects (and is then not judged); when the censuses have taken more than
    ``census_share`` of the time of the steps (5 %; None: never), they are spaced twice as
    far apart (up to 64 × ``check_every``).
    """

    FIELDS = ("time", "label", "allocated_bytes", "reserved_bytes", "peak_bytes", "nvml_bytes", "fragmentation",
              "num_alloc_retries", "largest_free_block_bytes")
    # Censuses a source must grow in, one after the other, to be a leak: a container that
    # fills once (a warm-up) and stays is not one.
    GROWTH_CENSUSES = 2

    def __init__(self, trace=None, device=None, *, check_every: int = 10, census_limit_s: float = 0.5,
                 census_visits: int = 200_000, census_share: float | None = 0.05, sweep_every: int | None = 10) -> None:
        if not isinstance(check_every, int) or isinstance(check_every, bool) or check_every < 1:
            raise gpuctl.UsageError(f"MemoryMonitor: check_every {check_every!r} must be a whole number of at least 1")
        self.trace = None if trace is None else os.fspath(trace)
        self.device = device
        self.rows: list[dict] = []
        self.check_every = check_every
        self.census_limit_s = float(census_limit_s)
        self.census_visits = int(census_visits)
        self.census_share = census_share
        self.sweep_every = sweep_every
        self._censuses = 0
        self._previous_swept: dict = {}
        self.steps = 0
        #: The leaks found, one per source, in the order they were found.
        self.leaks: list[Leak] = []
        #: Seconds the censuses took, and the seconds of the steps between them.
        self.census_seconds = 0.0
        self.step_seconds = 0.0
        self._interval = check_every
        self._next_census = check_every
        self._last_step_at = None
        self._since_census = 0.0
        self._previous: dict = {}  # source -> (reading, step, censuses grown in a row)
        self._warned: set = set()
        self._started = time.monotonic()
        if self.trace is not None:
            with open(self.trace, "w", newline="") as f:
                csv.writer(f).writerow(self.FIELDS)

    def step(self) -> list:
        """Counts one optimizer step; every ``check_every`` steps, takes the census. Returns
        the leaks newly found (each also warned as a :class:`MemoryLeakWarning`)."""
        now = time.perf_counter()
        if self._last_step_at is not None:
            self._since_census += now - self._last_step_at
        self._last_step_at = now
        self.steps += 1
        if self.steps < self._next_census:
            return []
        try:
            found, census = self._census(now)
        except Exception as error:  # noqa: BLE001 - the census must never end the training run
            _log(f"the leak census failed at step {self.steps} ({type(error).__name__}: {error}): "
                 f"no more censuses in this run")
            self._next_census = float("inf")
            return []
        cost = time.perf_counter() - now
        self.census_seconds += cost
        self.step_seconds += self._since_census
        if not census.complete:
            _log(f"leak census at step {self.steps} stopped at its limit ({census.visits} objects, "
                 f"{cost:.2f} s): this one is not judged")
        if (self.census_share is not None and self.census_seconds > self.census_share * self.step_seconds
                and self._interval < 64 * self.check_every):
            self._interval *= 2
            _log(f"the leak censuses took {self.census_seconds * 1e3:.0f} ms, more than "
                 f"{self.census_share:.0%} of the {self.step_seconds * 1e3:.0f} ms of steps: one every "
                 f"{self._interval} steps from now")
        self._since_census = 0.0
        self._next_census = self.steps + self._interval
        self._last_step_at = time.perf_counter()  # the census is not the next step's time
        return found

    def _census(self, now: float):
        census = _Census(sys._getframe(2), self.census_visits, now + self.census_limit_s, self._warned)
        found = []
        if census.complete:
            found, self._previous = self._judge(census.readings, self._previous)
            # The sweep closes each run of sweep_every censuses: never the first census,
            # whose cost would space the cheap ones out before they start.
            if self.sweep_every and (self._censuses + 1) % self.sweep_every == 0:
                census.sweep()
                if census.complete:
                    swept, self._previous_swept = self._judge(census.readings, self._previous_swept)
                    found += swept
                else:
                    # A program too large to sweep within the limit: no sweep again.
                    _log(f"the leak census's sweep through every object stopped at its limit "
                         f"({self.census_limit_s} s) at step {self.steps}: no more sweeps in this run")
                    self.sweep_every = None
                    census.complete = True
        self._censuses += 1
        return found, census

    def _judge(self, readings: dict, previous: dict):
        """The leaks among ``readings``, against the ``previous`` ones; and the readings to
        keep for next time."""
        found = []
        current = {}
        for source, reading in readings.items():
            grown = 0
            before = previous.get(source)
            if before is not None:
                last, at, streak = before
                # More tensors, or a longer graph behind them: bytes alone grow and shrink with
                # the batch (a variable sequence length) and say nothing of a leak.
                grew = reading.tensors > last.tensors or reading.nodes > last.nodes
                grown = streak + 1 if grew else 0
                if grown >= self.GROWTH_CENSUSES and not reading.bounded and source not in self._warned:
                    steps = max(1, self.steps - at)
                    rate = max(0.0, (reading.bytes - last.bytes) / steps)
                    leak = Leak(source, reading.kind, reading.tensors, reading.bytes, rate, reading.nodes, self.steps,
                                _remedy(source, reading), (reading.nodes - last.nodes) / steps)
                    self._warned.add(source)
                    self.leaks.append(leak)
                    found.append(leak)
                    warnings.warn(str(leak), MemoryLeakWarning, stacklevel=4)  # the line that called step()
            current[source] = (reading, self.steps, grown)
        return found, current

    def _nvml_bytes(self):
        try:
            held = [p.used_bytes or 0 for d in gpuctl.snapshot().devices for p in d.processes
                    if p.pid == os.getpid()]
        except gpuctl.Error:
            return None
        return sum(held)

    def milestone(self, label: str) -> dict:
        """Logs and returns one row of figures, labelled ``label`` ("epoch 3"):
        ``fragmentation`` is 1 − allocated/reserved of torch's caching allocator,
        ``num_alloc_retries`` the allocations it had to retry after freeing its cache, and
        ``largest_free_block_bytes`` the largest block it holds free (None on a CPU)."""
        cuda = _cuda_up()
        device = self.device if self.device is not None else (torch.cuda.current_device() if cuda else None)
        allocator = _allocator(device) if cuda else {}
        row = {
            "time": round(time.monotonic() - self._started, 3),
            "label": label,
            "allocated_bytes": allocator.get("allocated"),
            "reserved_bytes": allocator.get("reserved"),
            "peak_bytes": allocator.get("peak"),
            "nvml_bytes": self._nvml_bytes(),
            "fragmentation": allocator.get("fragmentation"),
            "num_alloc_retries": allocator.get("retries"),
            "largest_free_block_bytes": allocator.get("largest_free_block"),
        }
        self.rows.append(row)
        line = (f"{label}: allocated {_gib(row['allocated_bytes'])}, reserved {_gib(row['reserved_bytes'])}, "
                f"peak {_gib(row['peak_bytes'])}, NVML {_gib(row['nvml_bytes'])}")
        if row["fragmentation"] is not None:
            line += (f", fragmentation {row['fragmentation']:.0%} ({row['num_alloc_retries']} allocation retries, "
                     f"largest free block {_gib(row['largest_free_block_bytes'])})")
        _log(line)
        if self.trace is not None:
            with open(self.trace, "a", newline="") as f:
                csv.writer(f).writerow(["" if row[k] is None else row[k] for k in self.FIELDS])
        return row

    def plot(self, path) -> None:
        """The milestones as a chart (needs matplotlib: ``pip install gpuctl[plot]``)."""
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            raise Error("MemoryMonitor.plot needs matplotlib: pip install matplotlib") from None
        figure, axes = plt.subplots(figsize=(8, 4))
        x = list(range(len(self.rows)))
        for key in ("allocated_bytes", "reserved_bytes", "peak_bytes", "nvml_bytes"):
            axes.plot(x, [(r[key] or 0) / _GIB for r in self.rows], marker="o", label=key[:-6])
        axes.set_xticks(x, [r["label"] for r in self.rows], rotation=30, ha="right")
        axes.set_ylabel("GiB")
        axes.legend()
        figure.tight_layout()
        figure.savefig(os.fspath(path))
        plt.close(figure)


# -------------------------------------------------------------------------- OOMRecovery


def logits_bytes(batch: int, seq: int, vocab: int, dtype=torch.float32) -> int:
    """The logits tensor's size: batch × seq × vocab × the element size (4 for float32),
    the formula of the notes gpuctl grew from."""
    if isinstance(dtype, str):
        dtype = getattr(torch, {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}.get(dtype, dtype))
    element = torch.empty((), dtype=dtype).element_size()
    for name, value in (("batch", batch), ("seq", seq), ("vocab", vocab)):
        if int(value) < 0:
            raise gpuctl.UsageError(f"logits_bytes: {name} {value} is negative")
    return int(batch) * int(seq) * int(vocab) * element


_OOM_TEXTS = ("CUDA out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDA error: out of memory",
              "cuDNN error: CUDNN_STATUS_ALLOC_FAILED", "HIP out of memory")


def is_out_of_memory(error: BaseException) -> bool:
    """A CUDA out-of-memory error: ``torch.cuda.OutOfMemoryError``, or a RuntimeError
    whose text is a CUDA, cuBLAS or cuDNN allocation failure."""
    if isinstance(error, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and any(t in str(error) for t in _OOM_TEXTS)


_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def _amount(pattern: str, text: str):
    """Bytes from a figure of torch's OOM message (``2.00 GiB``) that ``pattern`` finds."""
    found = re.search(pattern, text)
    if not found:
        return None
    return int(float(found.group(1)) * _UNITS.get(found.group(2), 1))


def _cuda_index(device, text: str) -> int:
    if device is None:
        found = re.search(r"GPU (\d+) has a total capacity", text)
        if found:
            return int(found.group(1))
        return torch.cuda.current_device() if _cuda_up() else 0
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    parsed = torch.device(device)
    if parsed.type != "cuda":
        raise gpuctl.UsageError(f"explain_oom: device {device!r} is not a CUDA device")
    return parsed.index if parsed.index is not None else (torch.cuda.current_device() if _cuda_up() else 0)


def _nvml_device(index: int, devices):
    """The NVML GPU behind CUDA device ``index``, and how it was found. With CUDA up, by
    the UUID CUDA gives it; without, as CUDA would read CUDA_VISIBLE_DEVICES (indices or
    UUIDs, unique prefixes included, up to its first invalid entry), else NVML's index."""
    if _cuda_up() and index < torch.cuda.device_count():
        uuid = str(torch.cuda.get_device_properties(index).uuid)
        for device in devices:
            ids = [device.uuid or ""] + [m.uuid or "" for m in device.mig_devices]
            if any(i.lower().endswith(uuid.lower()) for i in ids if i):
                return device, f"CUDA's UUID {uuid}"
        return None, f"no GPU NVML lists has the UUID CUDA gives cuda:{index} ({uuid})"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        found = next((d for d in devices if d.index == index), None)
        return found, "NVML's index (CUDA_VISIBLE_DEVICES is not set)" if found else f"NVML has no GPU {index}"
    entries = [e.strip() for e in visible.split(",")] if visible.strip() else []
    if index >= len(entries):
        return None, f"CUDA_VISIBLE_DEVICES={visible} makes no cuda:{index} visible"
    entry = entries[index]
    if entry.isdigit():
        found = next((d for d in devices if d.index == int(entry)), None)
        return found, f"CUDA_VISIBLE_DEVICES={visible}" if found else f"NVML has no GPU {entry} (CUDA_VISIBLE_DEVICES={visible})"
    for device in devices:
        ids = [device.uuid or ""] + [m.uuid or "" for m in device.mig_devices]
        if any(i and i.startswith(entry) for i in ids):
            return device, f"CUDA_VISIBLE_DEVICES={visible}"
    return None, f"no GPU NVML lists matches {entry!r} of CUDA_VISIBLE_DEVICES={visible}"


def _clear_would(index: int) -> dict:
    """What `gpuctl clear` would do on NVML GPU ``index``, by pid: ("frees", reason),
    ("cannot", why not) or ("reports", reason)."""
    document = gpuctl.clear(gpus=[index], dry_run=True).to_dict()
    found = {}
    for outcome in document.get("outcomes", []):
        reason = "; ".join(outcome.get("reasons") or []) or "a leftover"
        if outcome.get("action") == "skip":
            found[outcome["pid"]] = ("cannot", reason, outcome.get("skipped") or "skipped")
        else:
            found[outcome["pid"]] = ("frees", reason, None)
    for finding in document.get("reported", []):
        identity = finding.get("identity") or {}
        if identity.get("pid") is not None and identity["pid"] not in found:
            found[identity["pid"]] = ("reports", finding.get("reason") or finding.get("kind"), None)
    return found


def explain_oom(error, device=None, *, seq_len: int | None = None, vocab_size: int | None = None,
                logits_dtype=torch.float32) -> str:
    """An out-of-memory error turned into what to do, in a few lines.

    ``error`` is the exception (or its text); ``device`` the CUDA device it happened on
    (``0``, ``"cuda:1"``; default: the one torch's message names, else the current one).
    From torch (where CUDA is up): the request, this process's allocated and reserved
    memory and their fragmentation. From gpuctl's snapshot of that GPU (the CUDA device
    mapped to NVML's through its UUID; without CUDA, through CUDA_VISIBLE_DEVICES): every
    other process on it with its pid, user, owner, memory, and what `gpuctl clear` finds of
    it. Then the remedy: `gpuctl clear` for an orphaned or zombie holder, whom to ask for
    another user's live job, OOMRecovery or a smaller micro-batch for this process's own
    size (with one sample's logits where ``seq_len`` and ``vocab_size`` are given), and
    ``expandable_segments`` where the allocator is fragmented. Never raises for what it
    cannot read: it says so in the text.
    """
    text = str(error) if error is not None else ""
    index = _cuda_index(device, text)
    request = _amount(r"Tried to allocate ([\d.]+) (B|KiB|MiB|GiB|TiB)", text)
    lines, todo = [], []
    allocated = reserved = retries = None
    figures = None
    if _cuda_up() and index < torch.cuda.device_count():
        try:
            figures = _allocator(index)
            allocated, reserved, retries = figures["allocated"], figures["reserved"], figures["retries"]
        except RuntimeError:  # CUDA itself in error: what torch's message says, below
            figures = None
    if figures is None:  # torch's own message still says what the allocator held
        allocated = _amount(r"([\d.]+) (B|KiB|MiB|GiB|TiB) is allocated by PyTorch", text)
        idle = _amount(r"([\d.]+) (B|KiB|MiB|GiB|TiB) is reserved by PyTorch but unallocated", text)
        reserved = None if allocated is None or idle is None else allocated + idle
    asked = f": tried to allocate {_gib(request)}" if request is not None else ""
    head = f"out of memory on cuda:{index}{asked}"
    if allocated is not None:
        frag = _fragmentation(allocated, reserved)
        lines.append(f"this process: {_gib(allocated)} allocated by torch, {_gib(reserved)} reserved"
                     + (f" (fragmentation {frag:.0%}" + (f", {retries} allocation retries)" if retries is not None else ")")
                        if frag is not None else ""))
    me = os.getpid()
    mine = 0
    try:
        devices = gpuctl.snapshot().devices
        gpu, how = _nvml_device(index, devices)
    except Exception as failure:  # noqa: BLE001 - an explanation, never a second error
        gpu, how = None, f"gpuctl could not read the GPUs: {failure}"
    if gpu is None:
        head += f" ({how})"
    else:
        head += f" (GPU {gpu.index}, {gpu.name or 'unnamed'}, {gpu.uuid}, found through {how})"
        used, total = gpu.memory_used, gpu.memory_total
        others = [p for p in gpu.processes if p.pid != me]
        mine = sum(p.used_bytes or 0 for p in gpu.processes if p.pid == me)
        lines.append(f"GPU {gpu.index}: {_gib(used)} used of {_gib(total)}; this process holds {_gib(mine)} of it")
        try:
            verdicts = _clear_would(gpu.index)
        except Exception as failure:  # noqa: BLE001 - an explanation, never a second error
            verdicts = {}
            lines.append(f"(gpuctl clear could not judge the processes: {failure})")
        children = set(_children())
        freeable = []
        for p in sorted(others, key=lambda p: -(p.used_bytes or 0)):
            who = p.user or "unknown user"
            owner = f", {p.owner}" if p.owner else ""
            verdict = verdicts.get(p.pid)
            finding = verdict[1] if verdict else ("a child of this process" if p.pid in children else
                                                  f"live ({p.state})" if p.state else "live")
            lines.append(f"  pid {p.pid} {who}{owner} {_gib(p.used_bytes)}: {_command(p.command)} ({finding})")
            size = _gib(p.used_bytes)
            what = ("an orphaned worker of a run that ended" if verdict and "orphan" in verdict[1] else
                    "a zombie holder" if verdict and "zombie" in verdict[1] else "a leftover of a run that ended")
            if verdict and verdict[0] == "frees":
                freeable.append(f"pid {p.pid} ({who}, {size}) is {what}: `gpuctl clear` frees it")
            elif verdict and verdict[0] == "cannot":
                todo.append(f"pid {p.pid} ({who}, {size}) is {what}, which `gpuctl clear` cannot end for you "
                            f"({verdict[2]}): ask {who} or an administrator to run it")
            elif verdict and verdict[0] == "reports":
                todo.append(f"pid {p.pid} ({who}, {size}), which `gpuctl clear` leaves: {verdict[1]}")
            elif p.pid in children:
                todo.append(f"pid {p.pid} ({size}) is this process's own child (a DataLoader worker?): it should "
                            f"not hold GPU memory: keep CUDA out of workers (no .cuda() in the Dataset)")
            elif p.user is not None and p.user == _user_name():
                todo.append(f"pid {p.pid} ({size}) is another live process of yours{owner}: end it if it is done "
                            f"(`gpuctl kill --pid {p.pid}`), or run on another GPU (gpuctl info)")
            else:
                job = f" ({p.owner})" if p.owner else ""
                todo.append(f"pid {p.pid} ({size}) is {who}'s live job{job}: ask {who} before anything, or run on "
                            f"a GPU with room (gpuctl info)")
        todo[:0] = freeable  # what frees memory at once, first
    own = (f"this process's own size ({_gib(allocated if allocated is not None else mine or None)}): "
           f"OOMRecovery(model, batch_size, micro_batch=\"auto\") keeps the effective batch with a smaller "
           f"micro-batch (gpuctl.torch.estimate gives the largest that fits), or lower the micro-batch")
    if seq_len and vocab_size:
        own += (f"; one sample's logits take {_gib(logits_bytes(1, seq_len, vocab_size, logits_dtype))} "
                f"(logits_bytes(1, {seq_len}, {vocab_size}))")
    todo.append(own)
    fragmented = _fragmented(request, allocated, reserved)
    if fragmented:
        todo.insert(0, fragmented)
    return "\n".join([head] + lines + ["what to do:"] + [f"  - {t}" for t in todo])


def _fragmented_in(text: str) -> str:
    """``; `` and the fragmentation sentence where torch's OOM message shows the request
    below the memory it held reserved but unallocated; else nothing."""
    request = _amount(r"Tried to allocate ([\d.]+) (B|KiB|MiB|GiB|TiB)", text)
    allocated = _amount(r"([\d.]+) (B|KiB|MiB|GiB|TiB) is allocated by PyTorch", text)
    idle = _amount(r"([\d.]+) (B|KiB|MiB|GiB|TiB) is reserved by PyTorch but unallocated", text)
    sentence = _fragmented(request, allocated, None if allocated is None or idle is None else allocated + idle)
    return f"; {sentence}" if sentence else ""


def _explained(text: str, **keywords) -> str:
    """explain_oom for an error path: its failure is said, never raised over the OOM."""
    try:
        return explain_oom(text, **keywords)
    except Exception as failure:  # noqa: BLE001
        return f"(gpuctl.torch.explain_oom could not explain it: {type(failure).__name__}: {failure})"


def _command(command) -> str:
    """A process's command on one line: whitespace collapsed, control and bidirectional
    characters shown as ?, cut at 60 characters."""
    if not command:
        return "?"
    text = re.sub(r"[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]", "?", " ".join(command.split()))
    return text if len(text) <= 60 else text[:59] + "…"


def _user_name():
    try:
        import pwd
        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        return None


class OutOfMemoryAtOne(Error):
    """Out of memory at micro-batch 1: one sample does not fit. The message has the figures
    and what to change."""


def _size(batch) -> int:
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    items = batch.values() if isinstance(batch, dict) else batch
    sizes = {t.shape[0] for t in items if isinstance(t, torch.Tensor)}
    if len(sizes) != 1:
        raise gpuctl.UsageError("OOMRecovery.step: the batch needs tensors that all have the same "
                                f"size along dim 0 (found sizes {sorted(sizes)})")
    return sizes.pop()


def _slice(batch, start: int, stop: int):
    if isinstance(batch, torch.Tensor):
        return batch[start:stop]
    if isinstance(batch, dict):
        return {k: v[start:stop] if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    return type(batch)(v[start:stop] if isinstance(v, torch.Tensor) else v for v in batch)


class OOMRecovery:
    """Steps that survive CUDA out-of-memory errors and keep the effective batch.

    :meth:`step` splits the batch (a tensor, or a tuple, list or dict of tensors) along
    dim 0 into micro-batches of ``micro_batch``, scales each micro-loss by its share of the
    batch and calls backward, so the gradients are the whole batch's. On an OOM it drops the
    step's gradients and outputs, empties the cache, halves the micro-batch and redoes the
    step on the same samples: the parameters end where an unconstrained run's do. The
    micro-batch found is kept for later steps (:attr:`micro_batch`). At micro-batch 1 it
    raises :class:`OutOfMemoryAtOne` with the figures and what to change.

    Enter each step with the gradients cleared (``optimizer.zero_grad()``): on an OOM the
    step's gradients are dropped. ``micro_batch="auto"`` starts at the largest micro-batch
    that ``estimate`` (from :func:`estimate`) fits in ``free_bytes`` (default, on a CUDA
    model: the device's free memory plus what torch has reserved), else at the batch size,
    and lets the first OOMs find the largest one that fits. ``seq_len``, ``vocab_size`` and
    ``logits_dtype`` (optional) let the micro-batch-1 message say what one sample's logits
    take. ``inject_oom_above=N`` raises the OOM path for micro-batches above N (after their
    backward, as a real OOM in backward would), so recovery is tested on a CPU.
    """

    def __init__(self, model, batch_size: int, micro_batch="auto", *, estimate: Estimate | None = None,
                 free_bytes: int | None = None, inject_oom_above: int | None = None, seq_len: int | None = None,
                 vocab_size: int | None = None, logits_dtype=torch.float32, log=_log) -> None:
        if int(batch_size) < 1:
            raise gpuctl.UsageError(f"OOMRecovery: batch_size {batch_size} must be at least 1")
        if estimate is not None and not isinstance(estimate, Estimate):
            raise gpuctl.UsageError(f"OOMRecovery: estimate {type(estimate).__name__}: give gpuctl.torch.estimate(...)'s")
        self.estimate = estimate
        if micro_batch == "auto":
            micro_batch = self._from_estimate(model, int(batch_size), free_bytes, log)
        elif not isinstance(micro_batch, int) or isinstance(micro_batch, bool) or micro_batch < 1:
            raise gpuctl.UsageError(f"OOMRecovery: micro_batch {micro_batch!r}: give \"auto\" or a size of at least 1")
        self.model = model
        self.batch_size = int(batch_size)
        self._micro_batch = min(int(micro_batch), self.batch_size)
        self.inject_oom_above = inject_oom_above
        self.seq_len = seq_len
        self.vocab_size = vocab_size
        self.logits_dtype = logits_dtype
        self.recoveries = 0
        self.steps = 0
        self._log = log

    def _from_estimate(self, model, batch_size: int, free_bytes, log) -> int:
        if self.estimate is None:
            return batch_size
        if free_bytes is None:
            device = next((p.device for p in model.parameters()), torch.device("cpu"))
            if device.type != "cuda":
                log(f"micro-batch {batch_size} (the batch): no free memory known on {device} (give free_bytes=)")
                return batch_size
            free_bytes = torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device)
        fits = self.estimate.largest_micro_batch(int(free_bytes))
        micro = max(1, min(batch_size, fits))
        log(f"micro-batch {micro} from the estimate: a step's peak {_gib(self.estimate.peak_bytes(micro))} of "
            f"{_gib(free_bytes)} free ({_bytes_text(self.estimate.activations_per_sample_bytes)} of activations per "
            f"sample); {-(-batch_size // micro)} accumulation steps for the batch of {batch_size}")
        return micro

    @property
    def micro_batch(self) -> int:
        """The micro-batch in use: halved by each OOM."""
        return self._micro_batch

    def _drop_gradients(self) -> None:
        for parameter in self.model.parameters():
            parameter.grad = None

    def step(self, batch, loss_fn):
        """One optimizer step's gradients for ``batch``: ``loss_fn(micro_batch)`` returns a
        micro-batch's mean loss. Returns the batch's mean loss (detached)."""
        samples = _size(batch)
        while True:
            try:
                total = None
                for start in range(0, samples, self._micro_batch):
                    chunk = _slice(batch, start, start + self._micro_batch)
                    share = min(self._micro_batch, samples - start) / samples
                    loss = loss_fn(chunk)
                    (loss * share).backward()
                    if self.inject_oom_above is not None and self._micro_batch > self.inject_oom_above:
                        raise torch.cuda.OutOfMemoryError(
                            f"CUDA out of memory (injected by gpuctl: micro-batch {self._micro_batch} "
                            f"> {self.inject_oom_above})")
                    part = loss.detach() * share
                    total = part if total is None else total + part
                    del loss
                self.steps += 1
                return total
            except Exception as error:  # noqa: BLE001 - only OOMs are handled, the rest re-raised
                if not is_out_of_memory(error):
                    raise
                text = str(error)
                message = text.splitlines()[0] if text else type(error).__name__
                # The step's outputs go with the frame's locals; its gradients are dropped.
                loss = chunk = total = None
                error = None
                self._drop_gradients()
                if torch.cuda.is_available() and torch.cuda.is_initialized():
                    torch.cuda.empty_cache()
                if self._micro_batch == 1:
                    raise OutOfMemoryAtOne(self._unrecoverable(message, text)) from None
                self._micro_batch = max(1, self._micro_batch // 2)
                self.recoveries += 1
                self._log(f"out of memory at step {self.steps} ({message}); micro-batch halved to "
                          f"{self._micro_batch}, {-(-samples // self._micro_batch)} accumulation steps "
                          f"for the same batch of {samples}" + _fragmented_in(text))

    def _unrecoverable(self, message: str, text: str) -> str:
        params = sum(p.numel() * p.element_size() for p in self.model.parameters())
        figures = f"parameters {_gib(params)}, their gradients {_gib(params)}"
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            free, total = torch.cuda.mem_get_info()
            figures += (f", allocated {_gib(torch.cuda.memory_allocated())}, reserved "
                        f"{_gib(torch.cuda.memory_reserved())}, {_gib(free)} free of {_gib(total)}")
        share = None
        try:
            share = gpuctl.fraction()
        except gpuctl.Error:
            pass
        logits = ""
        if self.seq_len and self.vocab_size:
            one = logits_bytes(1, self.seq_len, self.vocab_size, self.logits_dtype)
            logits = (f"; one sample's logits alone take {_gib(one)} (seq {self.seq_len} x vocab "
                      f"{self.vocab_size}): a shorter sequence, or a smaller vocabulary")
        limit = f"; this process may hold only {share:.0%} of a GPU (gpuctl fraction)" if share else ""
        return (f"out of memory at step {self.steps} even with micro-batch 1 ({message}); memory: {figures}. "
                f"One sample does not fit: try mixed precision (torch.autocast with bfloat16 halves "
                f"activations), gradient checkpointing, a smaller model{logits}, or free the GPU of "
                f"other processes (gpuctl info){limit}\n"
                + _explained(text, seq_len=self.seq_len, vocab_size=self.vocab_size, logits_dtype=self.logits_dtype))


# ----------------------------------------------------------------------------- estimate


class Estimate:
    """The memory of one training step, measured at micro-batches 1 and 2.

    The step's live tensor bytes are recorded at each allocation and release, at both
    micro-batches: each moment of the step is a line, ``c + n × d`` bytes at micro-batch
    ``n``, and the step's peak at ``n`` is the highest of those lines (the moment of the
    peak moves with ``n``: the end of backward for a small batch, the start for a large
    one). ``parameters_bytes``, ``gradients_bytes``, ``optimizer_bytes`` (its state),
    ``activations_per_sample_bytes`` (the steepest line's slope: what each sample adds at
    the large-batch peak) and ``fixed_bytes`` (that line's intercept); ``how``: where it was
    measured."""

    __slots__ = ("parameters_bytes", "gradients_bytes", "optimizer_bytes", "activations_per_sample_bytes",
                 "fixed_bytes", "measured", "how", "_lines")

    def __init__(self, parameters, gradients, optimizer, lines, measured, how) -> None:
        self.parameters_bytes = int(parameters)
        self.gradients_bytes = int(gradients)
        self.optimizer_bytes = int(optimizer)
        self._lines = lines
        self.fixed_bytes, self.activations_per_sample_bytes = max(lines, key=lambda line: (line[1], line[0]))
        self.measured = dict(measured)
        self.how = how

    def peak_bytes(self, micro_batch: int) -> int:
        """The step's peak at ``micro_batch`` samples."""
        return max(c + d * int(micro_batch) for c, d in self._lines)

    def largest_micro_batch(self, free_bytes: int) -> int:
        """The largest micro-batch whose step fits in ``free_bytes`` (0: not even one)."""
        if self.peak_bytes(1) > free_bytes:
            return 0
        slopes = [(free_bytes - c) // d for c, d in self._lines if d > 0]
        return max(1, int(min(slopes))) if slopes else 1 << 30

    def __str__(self) -> str:
        return (f"parameters {_gib(self.parameters_bytes)}, gradients {_gib(self.gradients_bytes)}, optimizer state "
                f"{_gib(self.optimizer_bytes)}, activations {_bytes_text(self.activations_per_sample_bytes)} per "
                f"sample; a step's peak {_gib(self.peak_bytes(1))} at micro-batch 1 ({self.how})")

    def __repr__(self) -> str:
        return (f"Estimate(parameters_bytes={self.parameters_bytes}, gradients_bytes={self.gradients_bytes}, "
                f"optimizer_bytes={self.optimizer_bytes}, activations_per_sample_bytes="
                f"{self.activations_per_sample_bytes}, fixed_bytes={self.fixed_bytes})")


def _lines(one: list, two: list) -> list:
    """The (intercept, slope) lines through each moment of the step at micro-batches 1 and
    2, less those another line is above at every micro-batch of 1 and more."""
    if len(one) != len(two):
        # The two steps did not allocate in the same order: their peaks alone.
        one, two = [max(one)], [max(two)]
    lines = sorted({(a - (b - a), b - a) for a, b in zip(one, two)}, key=lambda line: (-line[1], -line[0]))
    kept = []
    for c, d in lines:  # by slope, steepest first: kept only if higher at micro-batch 1
        if not kept or c + d > max(kc + kd for kc, kd in kept):
            kept.append((c, d))
    return kept


def _tensors_in(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors_in(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors_in(item)


class _AllocationCounter:
    """The bytes of tensor storage alive, counted from every operator's outputs (a
    TorchDispatchMode: forward, backward and the optimizer alike) and each storage's
    release (a finalizer), starting from the storages alive before; ``peak`` is the most."""

    def __init__(self, resident) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self
        self.live = 0
        self.peak = 0
        self.timeline: list = []
        self._known: set = set()
        for tensor in resident:
            self._track(tensor, finalize=False)
        self.peak = self.live

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for tensor in _tensors_in(out):
                    counter._track(tensor)
                return out

        self.mode = Mode()

    def _track(self, tensor, finalize: bool = True) -> None:
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError, TypeError):
            return
        key = id(storage)
        if key in self._known:
            return
        nbytes = storage.nbytes()
        self._known.add(key)
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        self.timeline.append(self.live)
        if finalize:
            weakref.finalize(storage, self._release, key, nbytes)

    def _release(self, key, nbytes) -> None:
        self._known.discard(key)
        self.live -= nbytes
        self.timeline.append(self.live)


def _rows(sample, n: int):
    """``n`` rows of a sample batch (repeated where it has fewer), in tensors of their own:
    a view of a larger sample would charge the whole sample's storage to every micro-batch."""
    index = torch.arange(n) % _size(sample)

    def take(t):
        return t.index_select(0, index.to(t.device)) if isinstance(t, torch.Tensor) else t
    if isinstance(sample, torch.Tensor):
        return take(sample)
    if isinstance(sample, dict):
        return {k: take(v) for k, v in sample.items()}
    return type(sample)(take(v) for v in sample)


def _default_loss(model, batch):
    out = model(**batch) if isinstance(batch, dict) else model(*batch) if isinstance(batch, (tuple, list)) else model(batch)
    if hasattr(out, "loss") and isinstance(out.loss, torch.Tensor):
        return out.loss
    tensor = next(_tensors_in(out), None)
    if tensor is None:
        raise gpuctl.UsageError("estimate: the model returned no tensor: give loss_fn=lambda model, batch: ...")
    return tensor.float().mean()


_OPTIMIZERS = {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD"}


def _bytes_of(tensors) -> int:
    seen, total = set(), 0
    for tensor in tensors:
        key, nbytes = _storage(tensor)
        if key not in seen:
            seen.add(key)
            total += nbytes
    return total


def estimate(model, sample, optimizer="adamw", dtype=None, *, loss_fn=None) -> Estimate:
    """The peak memory of one training step, per sample, before a run.

    A copy of ``model`` (cast to ``dtype`` where given: its floating parameters, and the
    sample's floating tensors) takes
    training steps on ``sample`` (a batch, as :class:`OOMRecovery` takes them; a batch of
    one is repeated) at micro-batch 1 and 2 with ``optimizer`` (``"adamw"``, ``"adam"``,
    ``"sgd"``, None, or a callable that makes one from the parameters), after a first step
    that creates the optimizer's state, on the model's device (a model built on the meta
    device is counted without memory or arithmetic), counting the bytes of every
    operator's output storage until it is freed (the CUDA allocator's rounding and cache
    are not in it). Each moment of the step is fitted to a line in the micro-batch
    (:class:`Estimate`). ``loss_fn(model, batch)`` gives the loss (default: the mean of the model's
    output, or its ``.loss``). The model itself is left as it was.
    """
    import copy

    if isinstance(optimizer, str) and optimizer.lower() not in _OPTIMIZERS:
        raise gpuctl.UsageError(f"estimate: optimizer {optimizer!r}: give \"adamw\", \"adam\", \"sgd\", None or a "
                                f"callable that makes one from the parameters")
    _size(sample)  # a batch with one size along dim 0, or a clear error
    work = copy.deepcopy(model)
    if dtype is not None:
        dtype = getattr(torch, {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}.get(dtype, dtype)) \
            if isinstance(dtype, str) else dtype
        for parameter in work.parameters():
            if parameter.is_floating_point():
                parameter.data = parameter.data.to(dtype)
    work.train()
    parameters = [p for p in work.parameters()]
    trained = [p for p in parameters if p.requires_grad]
    if optimizer is None:
        made = None
    elif isinstance(optimizer, str):
        made = getattr(torch.optim, _OPTIMIZERS[optimizer.lower()])(trained, lr=1e-3)
    else:
        made = optimizer(trained)
    loss_of = loss_fn or _default_loss
    device = parameters[0].device if parameters else torch.device("cpu")

    def to(t):
        if not isinstance(t, torch.Tensor):
            return t
        return t.to(device, dtype) if dtype is not None and t.is_floating_point() else t.to(device)

    def moved(batch):
        if isinstance(batch, dict):
            return {k: to(v) for k, v in batch.items()}
        return to(batch) if isinstance(batch, torch.Tensor) else type(batch)(to(v) for v in batch)

    def step(batch):
        loss_of(work, batch).backward()
        if made is not None:
            made.step()
        for p in trained:
            p.grad = None

    step(moved(_rows(sample, 1)))  # the first step creates the optimizer's state
    state = [t for s in (made.state.values() if made is not None else ()) for t in _tensors_in(s)]
    timelines, measured = {}, {}

    def measure(n):
        batch = moved(_rows(sample, n))
        counter = _AllocationCounter(parameters + state + list(_tensors_in(batch)))
        with counter.mode:
            step(batch)
        timelines[n], measured[n] = counter.timeline or [counter.live], counter.peak

    measure(1)
    measure(2)
    first = 1
    if len(timelines[1]) != len(timelines[2]):
        # Micro-batch 1 took another road through the operators (a squeezed batch
        # dimension): the line is fitted from micro-batches 2 and 3.
        measure(3)
        first = 2
    one, two = timelines[first], timelines[first + 1]
    lines = [(c - d * (first - 1), d) for c, d in _lines(one, two)]
    return Estimate(parameters=_bytes_of(parameters), gradients=_bytes_of(trained), optimizer=_bytes_of(state),
                    lines=lines, measured=measured, how=f"tensor storage counted on {device}")

def find_executable_micro_batch(batch_size: int, starting_micro_batch: int | None = None, *,
                                inject_oom_above: int | None = None, log=_log):
    """A decorator in the style of HF Accelerate's ``find_executable_batch_size`` that keeps
    the effective batch: the decorated function is called as ``function(micro_batch,
    accumulation_steps, *args, **kwargs)`` with ``micro_batch * accumulation_steps ==
    batch_size`` (the last accumulation step may be short when the micro-batch does not
    divide the batch); on a CUDA OOM it is called again with the micro-batch halved and the
    accumulation doubled, where Accelerate's halves the batch itself. At micro-batch 1 the
    OOM is raised as a ``torch.cuda.OutOfMemoryError`` whose text adds :func:`explain_oom`'s
    account of the GPU. ``inject_oom_above`` raises the OOM for micro-batches above it (tests)."""
    if int(batch_size) < 1:
        raise gpuctl.UsageError(f"find_executable_micro_batch: batch_size {batch_size} must be at least 1")

    def decorate(function):
        @functools.wraps(function)
        def run(*args, **kwargs):
            micro = min(int(starting_micro_batch or batch_size), int(batch_size))
            while True:
                accumulation = -(-int(batch_size) // micro)
                try:
                    if inject_oom_above is not None and micro > inject_oom_above:
                        raise torch.cuda.OutOfMemoryError(
                            f"CUDA out of memory (injected by gpuctl: micro-batch {micro} > {inject_oom_above})")
                    return function(micro, accumulation, *args, **kwargs)
                except Exception as error:  # noqa: BLE001 - only OOMs are handled
                    if not is_out_of_memory(error):
                        raise
                    if micro == 1:
                        raise torch.cuda.OutOfMemoryError(f"{error}\n{_explained(str(error))}") from error
                    error = None
                    if torch.cuda.is_available() and torch.cuda.is_initialized():
                        torch.cuda.empty_cache()
                    micro //= 2
                    log(f"out of memory: micro-batch halved to {micro}, {-(-int(batch_size) // micro)} "
                        f"accumulation steps, effective batch still {batch_size}")
        return run

    return decorate
