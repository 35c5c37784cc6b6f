#!/usr/bin/env python3
"""Benchmark: `gpuctl run`'s start (to the command's exec) next to a bare exec, and the cost
of its sampling while the command runs.

An nvml-sim scenario of 8 H200s with 256 real processes (test processes, 32 per GPU, 1 GiB
each) registered on them: `gpuctl run --min-free 50%` reads every GPU and the 256 processes'
/proc facts, judges health and freedom, takes a lease, and starts the command. The command
is `/bin/sh -c 'echo > FIFO'`; the time from starting the program (Popen) to the byte
arriving in the FIFO is taken, for:

- reference: `/bin/sh -c 'echo > FIFO'` started directly (a bare exec);
- gpuctl run: `gpuctl run -q --min-free 50% -- /bin/sh -c 'echo > FIFO'`.

The difference is gpuctl's start: its own exec, NVML, /proc, health, the lease. Its own
account (`start_seconds` of --json-summary, from its start to the command's spawn) is shown
too. Then the sampling: `gpuctl run -- sleep S` and gpuctl's CPU time (utime + stime from
/proc) over S seconds while the command sleeps, as a share of one core.

Usage: bench/run.py [--runs 21] [--processes 256] [--gpus 8] [--sample-seconds 20]
Needs release builds of gpuctl and nvml-sim (cargo build --release -p gpuctl -p nvml-sim),
and the test process (cargo build -p gpuctl-e2e: the stand-ins only sleep).
"""

import argparse
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
import bench_state

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.path.join(ROOT, "target", "release")


def built(name, target=TARGET):
    path = os.path.join(target, name)
    if not os.path.exists(path):
        sys.exit(f"{path} is missing: cargo build --release -p gpuctl -p nvml-sim; cargo build -p gpuctl-e2e")
    return path


def scenario(pids, gpus):
    lines = ['driver_version = "570.133.20"', "cuda_driver_version = 12080", ""]
    lines += ['[[gpu]]\nname = "NVIDIA H200"\n'] * gpus
    for i, pid in enumerate(pids):
        lines.append(f"[[process]]\npid = {pid}\ngpu = {i % gpus}\nused_mib = 1024\nsm_pct = 10\n")
    return "\n".join(lines)


def to_exec(argv, fifo, env):
    """Seconds from starting `argv` to the byte its command writes into `fifo`."""
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        poller = select.poll()
        poller.register(reader, select.POLLIN)
        start = time.perf_counter()
        child = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE)
        if not poller.poll(30_000):
            child.kill()
            sys.exit(f"{argv[0]} never started its command: {child.communicate()[1].decode()}")
        took = time.perf_counter() - start
        _, err = child.communicate()
        if child.returncode != 0:
            sys.exit(f"{' '.join(argv)} exited {child.returncode}: {err.decode()}")
        return took
    finally:
        os.close(reader)


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def main():
    bench_state.scratch()
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--processes", type=int, default=256)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--sample-seconds", type=float, default=20)
    args = parser.parse_args()
    gpuctl, lib = built("gpuctl"), built("libnvml_sim.so")
    # The stand-ins only sleep: the debug build serves.
    testproc = built("gpuctl-testproc", os.path.join(ROOT, "target", "debug"))

    procs = [subprocess.Popen(["python3", "train.py"], executable=testproc, stdin=subprocess.DEVNULL,
                              env={"GPUCTL_TESTPROC_MODE": "sleep"}) for _ in range(args.processes)]
    try:
        with tempfile.TemporaryDirectory() as scratch:
            path = os.path.join(scratch, "scenario.toml")
            with open(path, "w") as f:
                f.write(scenario([p.pid for p in procs], args.gpus))
            fifo = os.path.join(scratch, "started")
            os.mkfifo(fifo)
            summary = os.path.join(scratch, "summary.json")
            env = dict(os.environ, GPUCTL_NVML_LIB=lib, NVML_SIM_SCENARIO=path,
                       NVML_SIM_STATE=os.path.join(scratch, "state.json"),
                       GPUCTL_CONFIG="/dev/null",
                       GPUCTL_LEASE_DIR=os.path.join(scratch, "leases"))
            command = ["/bin/sh", "-c", f"echo > {fifo}"]
            run = [gpuctl, "run", "-q", "--min-free", "50%", "--json-summary", summary, "--", *command]
            # One untimed round of each first: page cache, dynamic linker.
            to_exec(command, fifo, env)
            to_exec(run, fifo, env)
            bare, wrapped, own = [], [], []
            for _ in range(args.runs):
                bare.append(to_exec(command, fifo, env))
                wrapped.append(to_exec(run, fifo, env))
                with open(summary) as f:
                    own.append(json.load(f)["start_seconds"])

            sleeper = subprocess.Popen([gpuctl, "run", "-q", "--min-free", "50%", "--json-summary", summary,
                                        "--", "sleep", str(args.sample_seconds + 2)], env=env,
                                       stdin=subprocess.DEVNULL)
            time.sleep(1)
            before, at = cpu_ticks(sleeper.pid), time.perf_counter()
            time.sleep(args.sample_seconds)
            after, until = cpu_ticks(sleeper.pid), time.perf_counter()
            sleeper.wait()
            with open(summary) as f:
                samples = json.load(f)["gpus"][0]["samples"]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()

    ms = lambda xs: statistics.median(xs) * 1000  # noqa: E731
    hz = os.sysconf("SC_CLK_TCK")
    share = (after - before) / hz / (until - at) * 100
    print(f"gpuctl run on {args.gpus} simulated GPUs x {args.processes} processes, {args.runs} runs (medians)")
    print(f"  bare exec (sh -c 'echo > fifo'):          {ms(bare):7.2f} ms")
    print(f"  gpuctl run -- the same, start to exec:    {ms(wrapped):7.2f} ms")
    print(f"  difference (gpuctl's start):              {ms(wrapped) - ms(bare):7.2f} ms")
    print(f"  gpuctl's own account (start to spawn):    {ms(own):7.2f} ms")
    print(f"sampling while the command runs: {after - before} ticks of CPU in {until - at:.1f} s "
          f"= {share:.3f} % of a core ({samples} samples in the run)")


if __name__ == "__main__":
    main()
