#!/usr/bin/env python3
"""gpuctl-trainer on a real GPU: a real OOM forced with --memory-fraction and recovered with
the final parameters of an unconstrained run; step throughput plain vs memory hooks vs
--empty-cache-every 10; peak and reserved memory with and without expandable segments.

The binary is built on the development machine against torch 2.11.0 (scripts/libtorch-env)
and carried here; it runs against this machine's own torch 2.11 libraries. It changes no
card setting and acts only on the processes it starts.

Usage: scripts/gpu/trainer.py PATH/TO/gpuctl-trainer [--device cuda:0] [--oom-only] [--json FILE]
Prints a Markdown section for docs/gpu-validation.md; --json also writes the OOM figures.
scripts/gpu/all runs it with --oom-only; in rehearsal with --device cpu, where the OOM is
the trainer's injected one (--inject-oom-above: the same recovery path) on a small model.
"""

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import torch

MODEL = ["--layers", "8", "--width", "1024", "--heads", "16", "--vocab-size", "32000",
         "--max-length", "1024", "--batch-size", "32", "--dataset-size", "4096"]
# On a CPU (rehearsal): small enough for a few seconds a run.
SMALL = ["--layers", "2", "--width", "64", "--heads", "4", "--vocab-size", "512",
         "--max-length", "64", "--batch-size", "16", "--dataset-size", "256"]


def run(binary, args, env_extra=None, check=True):
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    env = dict(os.environ, LD_LIBRARY_PATH=lib + ":" + os.environ.get("LD_LIBRARY_PATH", ""))
    env.update(env_extra or {})
    out = subprocess.run([binary, *args], env=env, capture_output=True, text=True, check=False)
    if check and out.returncode != 0:
        sys.exit(f"{' '.join(args)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    summary = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None
    return summary, out


def params(checkpoint):
    """The float32 tensors of the latest checkpoint's model.safetensors."""
    latest = open(os.path.join(checkpoint, "latest")).read().strip()
    data = open(os.path.join(checkpoint, latest, "model.safetensors"), "rb").read()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    body = data[8 + length:]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        tensors[name] = torch.frombuffer(bytearray(body[start:end]), dtype=torch.float32)
    return tensors


def relative_difference(a, b):
    diff = sum(float(((a[k].double() - b[k].double()) ** 2).sum()) for k in b)
    norm = sum(float((b[k].double() ** 2).sum()) for k in b)
    return (diff / norm) ** 0.5


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--oom-only", action="store_true", help="only the OOM recovery, not the timings")
    parser.add_argument("--json", help="write the OOM figures here")
    args = parser.parse_args()
    cpu = args.device == "cpu"
    base = ["--device", args.device, "--steps", str(args.steps), "--log-every", "1000", *(SMALL if cpu else MODEL)]
    if cpu:
        print(f"### CPU (rehearsal: the OOM is injected), torch {torch.__version__}\n")
    else:
        props = torch.cuda.get_device_properties(int(args.device.split(":")[-1]))
        print(f"### {props.name}, torch {torch.__version__}, CUDA {torch.version.cuda}\n")

    with tempfile.TemporaryDirectory() as scratch:
        env = {"XDG_RUNTIME_DIR": scratch}
        free = run(args.binary, [*base, "--checkpoint", f"{scratch}/free"], env)[0]
        if cpu:
            cap = ["--inject-oom-above", "4"]
        else:
            # A share that holds micro-batch 8 but not 32: the first step must recover.
            cap = ["--memory-fraction", f"{0.5 * free['peak_memory_bytes'] / props.total_memory:.4f}"]
        capped, out = run(args.binary, [*base, "--checkpoint", f"{scratch}/capped", *cap], env)
        recoveries = [l for l in out.stderr.splitlines() if "out of memory at step" in l]
        diff = relative_difference(params(f"{scratch}/capped"), params(f"{scratch}/free"))
        print(f"- {'Injected' if cpu else 'Real'} OOM: {' '.join(cap)}: {capped['oom_recoveries']} "
              f"recoveries, micro-batch {free['micro_batch']} -> {capped['micro_batch']}; "
              f"parameters vs unconstrained: relative difference {diff:.2e}; final loss "
              f"{capped['final_loss']:.6f} vs {free['final_loss']:.6f}")
        for line in recoveries:
            print(f"  - `{line}`")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"cap": cap, "recoveries": capped["oom_recoveries"], "micro_batch": [
                    free["micro_batch"], capped["micro_batch"]], "relative_difference": diff,
                    "final_loss": [free["final_loss"], capped["final_loss"]]}, f)
        if args.oom_only:
            return

        rates = {}
        for name, extra in [("plain", []), ("hooks", ["--memory-trace", f"{scratch}/t.csv"]),
                            ("empty-cache-every 10", ["--empty-cache-every", "10"])]:
            runs = [run(args.binary, [*base, "--micro-batch", "8", *extra], env)[0]
                    for _ in range(3)]
            rates[name] = sorted(r["samples_per_second"] for r in runs)[1]
        print("- Throughput (median of 3, micro-batch 8 x 4): " + ", ".join(
            f"{k} {v:.1f} samples/s ({v / rates['plain']:.3f})" for k, v in rates.items()))

        for setting in ["expandable_segments:False", "expandable_segments:True"]:
            summary, out = run(args.binary, [*base, "--micro-batch", "8"],
                               {**env, "PYTORCH_ALLOC_CONF": setting,
                                "PYTORCH_CUDA_ALLOC_CONF": setting})
            last = [l for l in out.stderr.splitlines() if "memory [" in l][-1]
            print(f"- {setting}: peak allocated {summary['peak_memory_bytes'] / 2**30:.2f} "
                  f"GiB; last milestone: `{last}`")


if __name__ == "__main__":
    main()
