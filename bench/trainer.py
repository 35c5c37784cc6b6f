#!/usr/bin/env python3
"""Benchmark: gpuctl-trainer's step throughput plain, with the memory hooks, and with
--empty-cache-every 10, side by side in one run.

Each variant trains the same model on the same data for --steps steps; the variants are run
in turn, --repeats times (interleaved, so drift in the machine's speed falls on all of them
alike). Reported per variant: the median samples/s over the repeats and its ratio to the plain
run's median. The hooks are the per-micro-step memory readings (--memory-trace): their cost
is also measured inside the trainer (memory_hook_seconds in its summary), which resolves far
below the run-to-run noise of whole-run timings.

On a machine without a GPU the device is cpu: there the hooks read the trainer's counting
CPU allocator (in-process counters), and --empty-cache-every has no cache to empty (the trainer says so); on
CUDA they read the caching allocator's statistics and empty_cache returns blocks to the
driver, which later steps must take back (scripts/gpu/trainer.py).

Usage: bench/trainer.py [--device cpu] [--steps 60] [--repeats 5] [-- TRAINER OPTIONS]
Needs a release build: . scripts/libtorch-env && cargo build --release -p gpuctl-trainer
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import bench_state

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINER = os.path.join(ROOT, "target", "release", "gpuctl-trainer")


def run(extra, scratch):
    env = dict(os.environ, XDG_RUNTIME_DIR=scratch)
    out = subprocess.run([TRAINER, *extra], env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.exit(f"gpuctl-trainer {' '.join(extra)} failed ({out.returncode}):\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    bench_state.scratch()
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("rest", nargs="*", help="more trainer options, after --")
    args = parser.parse_args()
    if not os.path.exists(TRAINER):
        sys.exit(f"{TRAINER} is missing: . scripts/libtorch-env && cargo build --release -p gpuctl-trainer")

    base = [
        "--device", args.device, "--steps", str(args.steps), "--batch-size", "16",
        "--micro-batch", "4", "--log-every", "1000000", "--workers", "2", *args.rest,
    ]
    with tempfile.TemporaryDirectory() as scratch:
        trace = os.path.join(scratch, "trace.csv")
        variants = {
            "plain": [],
            "hooks": ["--memory-trace", trace],
            "empty-cache-every 10": ["--empty-cache-every", "10"],
        }
        results = {name: [] for name in variants}
        run([*base, "--steps", "3"], scratch)  # warm the page cache: libtorch is large
        names = list(variants)
        for repeat in range(args.repeats):
            # Each round starts with another variant: no variant always runs first.
            for name in names[repeat % len(names):] + names[:repeat % len(names)]:
                results[name].append(run([*base, *variants[name]], scratch))

    print(f"gpuctl-trainer on {args.device}: {args.steps} steps of batch 16 as micro-batch 4 x 4, "
          f"median of {args.repeats} interleaved runs")
    plain = statistics.median(r["samples_per_second"] for r in results["plain"])
    print(f"{'variant':<22} {'samples/s':>10} {'vs plain':>9}  {'in hooks':>9}  each run")
    for name, runs in results.items():
        rate = statistics.median(r["samples_per_second"] for r in runs)
        share = statistics.median(r["memory_hook_seconds"] / r["seconds"] for r in runs)
        hooks = f"{100 * share:.3f}%" if name == "hooks" else "-"
        each = " ".join(f"{r['samples_per_second']:.0f}" for r in runs)
        print(f"{name:<22} {rate:>10.1f} {rate / plain:>9.3f}  {hooks:>9}  {each}")
    hooks = results["hooks"]
    per_reading = statistics.median(
        r["memory_hook_seconds"] / (r["steps_this_run"] * 9) for r in hooks)
    print(f"one reading: {per_reading * 1e6:.1f} us (9 per step: forward and backward of 4 "
          f"micro-batches, and the optimizer step)")


if __name__ == "__main__":
    main()
