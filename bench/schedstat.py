"""CPU time of a live process from /proc/PID/task/TID/schedstat: the first field, in
nanoseconds, of every live thread (/proc/PID/stat counts 10 ms ticks, too coarse for a
loop of a millisecond). Shared by the benchmarks that time a daemon from outside."""

import os


def cpu_seconds(pid):
    """CPU seconds of every live thread of `pid` so far."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total / 1e9
