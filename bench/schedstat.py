"""CPU time of a live process from /proc/PID/task/TID/schedstat: the first field, in
nanoseconds, of every live thread (/proc/PID/stat counts 10 ms ticks, too coarse for a
loop of a millisecond). Shared by the benchmarks that time a daemon from outside."""

import os


def cpu_seconds(pid):
    """CPU seconds of every live thread of `pid` so far."""
    return sum(cpu_seconds_by_thread(pid).values())


def cpu_seconds_by_thread(pid):
    """CPU seconds so far of the live threads of `pid`, summed by thread name (comm)."""
    by_name = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue
        by_name[name] = by_name.get(name, 0) + ns / 1e9
    return by_name
