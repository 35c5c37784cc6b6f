#!/usr/bin/env python3
"""Benchmark: NVIDIA's nvidia-smi 535 on nvml-sim, next to `gpuctl info --json`.

On the repository's 8xH200 example scenario (crates/nvml-sim/examples/h200x8.toml: 8 GPUs,
27 processes), inside one `nvml-sim run`, times whole invocations (exec, library load, NVML
init, every GPU, output) of each nvidia-smi view the tests run and of `gpuctl info --json`,
alternating them run by run, and prints each one's median and its ratio to gpuctl's.

`gpuctl info` (the table) is timed too; `--baseline PATH` also times another gpuctl binary's
`info --json` and `info` (an older build, say) in the same alternation.

Usage: bench/nvidia_smi.py [--runs 50] [--baseline PATH]
Needs release builds (cargo build --release -p gpuctl -p nvml-sim) and the cached
nvidia-smi (scripts/fetch-nvidia-smi).
"""

import argparse
import os
import statistics
import subprocess
import sys
import bench_state

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.path.join(ROOT, "target", "release")
SCENARIO = os.path.join(ROOT, "crates", "nvml-sim", "examples", "h200x8.toml")

QUERY_GPU = ("index,uuid,name,pci.bus_id,memory.total,memory.used,memory.free,"
             "utilization.gpu,utilization.memory,temperature.gpu,power.draw,power.limit,"
             "clocks.sm,clocks.mem,pstate,compute_mode,persistence_mode")
VIEWS = [
    ("gpuctl info --json", ["{gpuctl}", "info", "--json"]),
    ("gpuctl info", ["{gpuctl}", "info"]),
    ("nvidia-smi", ["{smi}"]),
    ("nvidia-smi -L", ["{smi}", "-L"]),
    ("nvidia-smi -q", ["{smi}", "-q"]),
    ("nvidia-smi --query-gpu (17 fields)",
     ["{smi}", "--query-gpu=" + QUERY_GPU, "--format=csv,noheader,nounits"]),
    ("nvidia-smi --query-compute-apps",
     ["{smi}", "--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
      "--format=csv"]),
]

# Runs inside `nvml-sim run`: times each command RUNS times, alternating, prints ns per run.
INNER = r"""
import subprocess, sys, time, json
views = json.loads(sys.argv[1]); runs = int(sys.argv[2])
times = {name: [] for name, _ in views}
for _ in range(runs):
    for name, argv in views:
        t = time.perf_counter_ns()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times[name].append(time.perf_counter_ns() - t)
print(json.dumps(times))
"""


def main():
    bench_state.scratch()
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--baseline", help="another gpuctl binary to time alongside")
    args = parser.parse_args()
    gpuctl = os.path.join(TARGET, "gpuctl")
    sim = os.path.join(TARGET, "nvml-sim")
    for path in (gpuctl, sim):
        if not os.path.exists(path):
            sys.exit(f"{path} is missing: cargo build --release -p gpuctl -p nvml-sim")
    fetched = subprocess.run([os.path.join(ROOT, "scripts", "fetch-nvidia-smi")],
                             capture_output=True, text=True)
    if fetched.returncode != 0:
        sys.exit(fetched.stderr.strip())
    smi = fetched.stdout.strip()
    import json
    views = [(name, [a.format(gpuctl=gpuctl, smi=smi) for a in argv]) for name, argv in VIEWS]
    if args.baseline:
        views += [("baseline info --json", [args.baseline, "info", "--json"]),
                  ("baseline info", [args.baseline, "info"])]
    env = dict(os.environ, GPUCTL_CONFIG="/dev/null")
    env.pop("NVML_SIM_TRACE", None)
    out = subprocess.run([sim, "run", SCENARIO, "--", sys.executable, "-c", INNER,
                          json.dumps(views), str(args.runs)],
                         capture_output=True, text=True, env=env, check=True)
    times = json.loads(out.stdout)
    base = statistics.median(times["gpuctl info --json"])
    print(f"8 GPUs, 27 processes (h200x8.toml), {args.runs} runs each, release build")
    print(f"{'command':40} {'median':>10} {'vs gpuctl info':>15}")
    for name, _ in views:
        m = statistics.median(times[name])
        print(f"{name:40} {m / 1e6:8.2f}ms {m / base:14.2f}x")


if __name__ == "__main__":
    main()
