#!/usr/bin/env python3
"""The real-GPU checks of gpuctl.torch's memory checklist (issue 38), for a machine with a
CUDA GPU and the real NVML. Each prints its figures and PASS or FAIL; the exit status is
the number of failures (2: no CUDA GPU).

1. A real OOM with another CUDA process of this user on the GPU: `explain_oom` names its pid.
2. Fragmentation on the real caching allocator (a loop of varied sizes, every other freed):
   `MemoryMonitor.milestone` reports it, with retries and the largest free block.
3. `estimate` against `torch.cuda.max_memory_allocated()` of a real step, for an MLP and a
   transformer block, at several micro-batches (within 15 %).

Run it with the Python of a venv where the wheel is installed and CUDA torch importable:

    python bench/torch_gpu_check.py [--device 0]
"""

import argparse
import copy
import os
import subprocess
import sys
import time

import torch

from gpuctl.torch import MemoryMonitor, estimate, explain_oom
import bench_state

HOLDER = r"""
import sys, time, torch
held = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda:" + sys.argv[2])
torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(600)
"""


def check_oom(device: int) -> bool:
    free, total = torch.cuda.mem_get_info(device)
    hold = int(free * 0.4)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(hold), str(device)], stdout=subprocess.PIPE, text=True)
    try:
        if holder.stdout.readline().strip() != "ready":
            print("1. FAIL: the holding process did not start")
            return False
        time.sleep(1.0)  # NVML lists a new context within a second
        try:
            chunks = []
            while True:
                chunks.append(torch.empty(1 << 30, dtype=torch.uint8, device=f"cuda:{device}"))
        except torch.cuda.OutOfMemoryError as error:
            text = explain_oom(error, device=device)
        finally:
            chunks = None
            torch.cuda.empty_cache()
        print(text)
        named = f"pid {holder.pid} " in text
        print(f"1. {'PASS' if named else 'FAIL'}: explain_oom names the other CUDA process (pid {holder.pid}, "
              f"{hold / 2**30:.1f} GiB)")
        return named
    finally:
        holder.kill()
        holder.wait()


def check_fragmentation(device: int) -> bool:
    torch.cuda.empty_cache()
    monitor = MemoryMonitor(device=device)
    kept = []
    for i in range(400):
        block = torch.empty((1 + (i * 7919) % 97) << 20, dtype=torch.uint8, device=f"cuda:{device}")
        if i % 2 == 0:
            kept.append(block)
    row = monitor.milestone("after a loop of varied sizes")
    ok = row["fragmentation"] is not None and row["fragmentation"] > 0 and \
        row["largest_free_block_bytes"] is not None and row["num_alloc_retries"] is not None
    print(f"2. {'PASS' if ok else 'FAIL'}: fragmentation {row['fragmentation']}, retries "
          f"{row['num_alloc_retries']}, largest free block {row['largest_free_block_bytes']}")
    kept = None
    torch.cuda.empty_cache()
    return ok


def real_peak(model, batch, device):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for measured in (False, True):  # the first step makes the optimizer's state
        torch.cuda.synchronize(device)
        if measured:
            torch.cuda.reset_peak_memory_stats(device)
        model(batch).float().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device)


def check_estimate(device: int) -> bool:
    ok = True
    torch.manual_seed(0)
    cases = (
        ("mlp", torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)),
         (1024,), (16, 256, 2048)),
        ("transformer block", torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048,
                                                               batch_first=True, dropout=0.0),
         (256, 512), (2, 16, 64)),
    )
    for name, model, shape, sizes in cases:
        model = model.to(f"cuda:{device}")
        found = estimate(model, torch.randn(2, *shape, device=f"cuda:{device}"))
        for n in sizes:
            torch.cuda.empty_cache()
            work = copy.deepcopy(model)
            # The step's own peak: what else this process holds is taken off.
            base = torch.cuda.memory_allocated(device) - sum(p.numel() * p.element_size() for p in work.parameters())
            batch = torch.randn(n, *shape, device=f"cuda:{device}")
            real = real_peak(work, batch, device) - base
            error = found.peak_bytes(n) / real - 1
            good = abs(error) <= 0.15
            ok &= good
            print(f"3. {'PASS' if good else 'FAIL'}: {name} at {n}: estimated {found.peak_bytes(n)}, "
                  f"max_memory_allocated {real} ({error:+.1%})")
            work = batch = None
    return ok


def main() -> None:
    bench_state.scratch()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", type=int, default=0)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit(print("torch_gpu_check: no CUDA GPU here (torch.cuda.is_available() is False)", file=sys.stderr) or 2)
    torch.cuda.init()
    print(f"{torch.cuda.get_device_name(args.device)}, torch {torch.__version__}, CUDA_VISIBLE_DEVICES="
          f"{os.environ.get('CUDA_VISIBLE_DEVICES')}")
    results = [check_estimate(args.device), check_fragmentation(args.device), check_oom(args.device)]
    sys.exit(results.count(False))


if __name__ == "__main__":
    main()
