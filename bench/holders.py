#!/usr/bin/env python3
"""Benchmark: the device-file holder scan of `gpuctl info --holders`.

Starts N processes that each hold F descriptors open (/dev/null; the scan must read every
one to find the few that are GPU device files), and 8 of them also hold a simulated GPU's
device file. Then times `gpuctl info --holders --json` on a simulated 8-GPU server and
prints the median of the scan phase (GPUCTL_TIMINGS' "holders") and of the whole command,
and as a reference the same command without the scan (`info --json`, nothing unattributed).

Usage: bench/holders.py [--processes 2000] [--fds 100] [--runs 20]
Needs release builds: cargo build --release -p gpuctl -p nvml-sim
"""

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import bench_state

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.path.join(ROOT, "target", "release")


def start_holders(count, fds, dev):
    """Forks `count` children holding `fds` descriptors each; returns their pids."""
    pids = []
    for i in range(count):
        pid = os.fork()
        if pid == 0:
            try:
                for _ in range(fds):
                    os.open("/dev/null", os.O_RDONLY)
                if i < 8:
                    os.open(os.path.join(dev, f"nvidia{i}"), os.O_RDONLY)
                signal.pause()
            finally:
                os._exit(0)
        pids.append(pid)
    return pids


def main():
    bench_state.scratch()
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", type=int, default=2000)
    parser.add_argument("--fds", type=int, default=100)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    gpuctl = os.path.join(TARGET, "gpuctl")
    lib = os.path.join(TARGET, "libnvml_sim.so")
    for path in (gpuctl, lib):
        if not os.path.exists(path):
            sys.exit(f"{path} is missing: cargo build --release -p gpuctl -p nvml-sim")
    with tempfile.TemporaryDirectory() as tmp:
        dev = os.path.join(tmp, "dev")
        scenario = os.path.join(tmp, "scenario.toml")
        with open(scenario, "w") as f:
            f.write(f'device_dir = "{dev}"\n' + "[[gpu]]\n" * 8)
        env = dict(os.environ, GPUCTL_NVML_LIB=lib, NVML_SIM_SCENARIO=scenario,
                   NVML_SIM_STATE=os.path.join(tmp, "state.json"),
                   GPUCTL_STATE_DIR=os.path.join(tmp, "state"),
                   GPUCTL_CONFIG="/dev/null", GPUCTL_TIMINGS="1")
        subprocess.run([gpuctl, "info"], env=env, check=True, capture_output=True)
        pids = start_holders(args.processes, args.fds, dev)
        try:
            time.sleep(1.0)
            total = len([p for p in os.listdir("/proc") if p.isdigit()])

            def timed(argv):
                walls, scans = [], []
                for _ in range(args.runs):
                    t = time.perf_counter()
                    out = subprocess.run(argv, env=env, capture_output=True, text=True,
                                         check=True)
                    walls.append(time.perf_counter() - t)
                    m = re.search(r"holders ([0-9.]+) ms", out.stderr)
                    if m:
                        scans.append(float(m.group(1)))
                return statistics.median(walls) * 1000, (
                    statistics.median(scans) if scans else None)

            with_scan, scan = timed([gpuctl, "info", "--holders", "--json"])
            without, _ = timed([gpuctl, "info", "--json"])
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            for pid in pids:
                os.waitpid(pid, 0)
    print(f"{total} processes on the host ({args.processes} started, {args.fds} "
          f"descriptors each), 8 simulated GPUs, {args.runs} runs, release build")
    print(f"holder scan (GPUCTL_TIMINGS):      {scan:8.2f} ms")
    print(f"info --holders --json, whole:      {with_scan:8.2f} ms")
    print(f"info --json (no scan), whole:      {without:8.2f} ms")


if __name__ == "__main__":
    main()
