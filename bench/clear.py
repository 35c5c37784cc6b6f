#!/usr/bin/env python3
"""Benchmark: `gpuctl clear` on a crashed run with 64 orphaned workers.

A run (tests/testproc.rs, mode run-with-workers) starts 64 workers in its own process group
and session, and is SIGKILLed: the workers live on, reparented, idle. They are registered in
an nvml-sim scenario spread over 8 GPUs (8 per GPU, 4 GiB each). Each repetition measures,
on fresh runs:

- reference: the workers' own exit time. SIGTERM is sent to all 64 directly (pidfd), and the
  time from the first signal until the last has exited (its pidfd readable) is taken.
- dry run: `gpuctl clear --dry-run --json` on the same workers just before: everything but
  the signals and the verification.
- gpuctl: the wall time of a whole `gpuctl clear --json` invocation: exec, NVML, /proc facts
  and lineage of the 64, classification, SIGTERM through pidfds, waiting for the exits, and
  verification through NVML that every worker left its GPU and its memory was released.

It prints the medians and the difference (gpuctl's cost beyond the workers' own exit time),
and, from gpuctl's JSON, the median of its own first-signal-to-last-exit time.

Usage: bench/clear.py [--runs 7] [--workers 64] [--gpus 8]
Needs release builds: cargo build --release -p gpuctl -p nvml-sim -p gpuctl-e2e
"""

import argparse
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import bench_state

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.path.join(ROOT, "target", "release")


def built(name):
    path = os.path.join(TARGET, name)
    if not os.path.exists(path):
        sys.exit(f"{path} is missing: cargo build --release -p gpuctl -p nvml-sim -p gpuctl-e2e")
    return path


def crashed_run(testproc, workers):
    """Starts a run with `workers` workers, SIGKILLs its parent; returns the workers' pids."""
    parent = subprocess.Popen(
        ["python3", "train.py", "--model", "llama-8b"],
        executable=testproc,
        env={
            "GPUCTL_TESTPROC_MODE": "run-with-workers",
            "GPUCTL_TESTPROC_WORKERS": str(workers),
        },
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        start_new_session=True,
        text=True,
    )
    pids = [int(parent.stdout.readline()) for _ in range(workers)]
    parent.kill()
    parent.wait()
    parent.stdout.close()
    return pids


def wait_exited(pidfds, deadline_s=30):
    """Polls all pidfds until every process has exited; returns when the last one did."""
    poller = select.poll()
    for fd in pidfds:
        poller.register(fd, select.POLLIN)
    left = set(pidfds)
    end = time.monotonic() + deadline_s
    while left:
        timeout_ms = max(0, int((end - time.monotonic()) * 1000))
        if timeout_ms == 0:
            raise RuntimeError(f"{len(left)} workers still alive")
        for fd, _ in poller.poll(timeout_ms):
            poller.unregister(fd)
            left.discard(fd)
    return time.perf_counter()


def reference(testproc, workers):
    """Seconds from the first SIGTERM to the last exit, signals sent directly."""
    pids = crashed_run(testproc, workers)
    fds = [os.pidfd_open(pid) for pid in pids]
    try:
        start = time.perf_counter()
        for fd in fds:
            signal.pidfd_send_signal(fd, signal.SIGTERM)
        return wait_exited(fds) - start
    finally:
        for fd in fds:
            os.close(fd)


def scenario(pids, gpus):
    lines = ['driver_version = "570.133.20"', "cuda_driver_version = 12080", ""]
    lines += ['[[gpu]]\nname = "NVIDIA H200"\n'] * gpus
    for i, pid in enumerate(pids):
        lines.append(f"[[process]]\npid = {pid}\ngpu = {i % gpus}\nused_mib = 4096\nsm_pct = 0\n")
    return "\n".join(lines)


def clear(gpuctl, lib, testproc, workers, gpus, scratch):
    """Seconds of one `gpuctl clear --json`, gpuctl's own signal-to-last-exit seconds, and
    the seconds of a `clear --dry-run --json` just before it (everything but act and verify)."""
    pids = crashed_run(testproc, workers)
    path = os.path.join(scratch, "scenario.toml")
    with open(path + ".tmp", "w") as f:
        f.write(scenario(pids, gpus))
    os.rename(path + ".tmp", path)
    env = dict(
        os.environ,
        GPUCTL_NVML_LIB=lib,
        NVML_SIM_SCENARIO=path,
        NVML_SIM_STATE=os.path.join(scratch, "state.json"),
    )
    start = time.perf_counter()
    subprocess.run([gpuctl, "clear", "--dry-run", "--json"], env=env, check=True,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    dry = time.perf_counter() - start
    start = time.perf_counter()
    done = subprocess.run(
        [gpuctl, "clear", "--json"], env=env, stdin=subprocess.DEVNULL, capture_output=True
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"gpuctl clear failed ({done.returncode}): {done.stderr.decode()}")
    outcomes = json.loads(done.stdout)["outcomes"]
    exited = [o for o in outcomes if (o.get("ended") or {}).get("outcome") == "exited"]
    released = [o for o in exited if o.get("memory_released")]
    if len(released) != workers:
        sys.exit(f"gpuctl clear ended {len(exited)} and released {len(released)} of {workers}")
    still = [pid for pid in pids if alive(pid)]
    if still:
        sys.exit(f"workers still alive after gpuctl clear: {still}")
    own = max(o["ended"]["after_ms"] for o in exited) / 1000
    return wall, own, dry


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def main():
    bench_state.scratch()
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--gpus", type=int, default=8)
    args = parser.parse_args()
    gpuctl, lib = built("gpuctl"), built("libnvml_sim.so")
    testproc = built("gpuctl-testproc")

    ref, walls, owns, drys = [], [], [], []
    with tempfile.TemporaryDirectory() as scratch:
        # One untimed round first: page cache, dynamic linker.
        reference(testproc, args.workers)
        clear(gpuctl, lib, testproc, args.workers, args.gpus, scratch)
        for _ in range(args.runs):
            ref.append(reference(testproc, args.workers))
            wall, own, dry = clear(gpuctl, lib, testproc, args.workers, args.gpus, scratch)
            walls.append(wall)
            owns.append(own)
            drys.append(dry)

    ms = lambda xs: statistics.median(xs) * 1000  # noqa: E731
    print(f"{args.workers} orphaned workers on {args.gpus} GPUs, {args.runs} runs (medians)")
    print(f"  workers' own exit time (SIGTERM sent directly): {ms(ref):8.1f} ms")
    print(f"  gpuctl clear, whole invocation:                 {ms(walls):8.1f} ms")
    print(f"    of which first SIGTERM to last exit:          {ms(owns):8.1f} ms")
    print(f"  gpuctl clear --dry-run (no act, no verify):     {ms(drys):8.1f} ms")
    print(f"  difference (gpuctl beyond the workers' exit):   {ms(walls) - ms(ref):8.1f} ms")
    print(f"  all runs, gpuctl: {', '.join(f'{w * 1000:.0f}' for w in walls)} ms")
    print(f"  all runs, reference: {', '.join(f'{r * 1000:.1f}' for r in ref)} ms")


if __name__ == "__main__":
    main()
