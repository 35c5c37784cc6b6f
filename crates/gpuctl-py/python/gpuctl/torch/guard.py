"""RunGuard: a run's claim on its name, with startup cleanup of the previous run of that
name (the Rust trainer's run file and lock, through gpuctl-core's ``runfile``)."""

from __future__ import annotations

import os
import threading

import torch

from gpuctl import Error, _gpuctl

from ._shared import _children, _log


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
    run lives, the processes below it (the DataLoader's workers, a forkserver's among them),
    as gpuctl-core's process tree finds them; :meth:`record` does so at once. A clean exit removes the run file; an exception keeps it, so the next start cleans
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
        """Records this process and ``workers`` (pids; default: the processes below it now)."""
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
