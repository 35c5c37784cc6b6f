"""MemoryMonitor: memory at milestones (torch's allocator and NVML), and a leak census
every few steps."""

from __future__ import annotations

import csv
import os
import sys
import time
import warnings

import torch

import gpuctl
from gpuctl import Error

from ._shared import _GIB, _allocator, _bytes, _cuda_up, _log
from .census import Leak, MemoryLeakWarning, _Census, _remedy


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
        line = (f"{label}: allocated {_bytes(row['allocated_bytes'])}, reserved {_bytes(row['reserved_bytes'])}, "
                f"peak {_bytes(row['peak_bytes'])}, NVML {_bytes(row['nvml_bytes'])}")
        if row["fragmentation"] is not None:
            line += (f", fragmentation {row['fragmentation']:.0%} ({row['num_alloc_retries']} allocation retries, "
                     f"largest free block {_bytes(row['largest_free_block_bytes'])})")
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
