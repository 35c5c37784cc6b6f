#!/usr/bin/env python3
"""gpuctl-trainer on a real GPU: a real OOM forced with --memory-fraction and recovered with
the final parameters of an unconstrained run; step throughput plain vs memory hooks vs
--empty-cache-every 10; peak and reserved memory with and without expandable segments.

The binary is built on the development machine against torch 2.11.0 (scripts/libtorch-env)
and carried here; it runs against this machine's own torch 2.11 libraries. It changes no
card setting and acts only on the processes it starts.

Usage: scripts/gpu/trainer.py PATH/TO/gpuctl-trainer [--device cuda:0]
Prints a Markdown section for docs/gpu-validation.md.
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
    args = parser.parse_args()
    base = ["--device", args.device, "--steps", str(args.steps), "--log-every", "1000", *MODEL]
    props = torch.cuda.get_device_properties(int(args.device.split(":")[-1]))
    print(f"### {props.name}, torch {torch.__version__}, CUDA {torch.version.cuda}\n")

    with tempfile.TemporaryDirectory() as scratch:
        env = {"XDG_RUNTIME_DIR": scratch}
        free = run(args.binary, [*base, "--checkpoint", f"{scratch}/free"], env)[0]
        # A share that holds micro-batch 8 but not 32: the first step must recover.
        fraction = 0.5 * free["peak_memory_bytes"] / props.total_memory
        capped, out = run(args.binary, [*base, "--checkpoint", f"{scratch}/capped",
                                        "--memory-fraction", f"{fraction:.4f}"], env)
        recoveries = [l for l in out.stderr.splitlines() if "out of memory at step" in l]
        diff = relative_difference(params(f"{scratch}/capped"), params(f"{scratch}/free"))
        print(f"- Real OOM: --memory-fraction {fraction:.4f}: {capped['oom_recoveries']} "
              f"recoveries, micro-batch {free['micro_batch']} -> {capped['micro_batch']}; "
              f"parameters vs unconstrained: relative difference {diff:.2e}; final loss "
              f"{capped['final_loss']:.6f} vs {free['final_loss']:.6f}")
        for line in recoveries:
            print(f"  - `{line}`")

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
