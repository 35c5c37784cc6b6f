#!/usr/bin/env python3
"""Benchmark: the cost of MemoryMonitor.step's leak census (gpuctl.torch), as a share of a
training step.

A model of 100 modules (50 blocks of Linear(WIDTH, WIDTH) and GELU), AdamW, batch 32, on
the CPU with one thread. Prints medians over alternated repeats of:
1. a plain training loop (forward, backward, optimizer step) against the same loop calling
   `MemoryMonitor.step()` with check_every=10, the census never spaced out
   (census_share=None) and no sweep (sweep_every=None);
2. that census alone (the walk from the frames): its mean time per census, and that time
   over check_every steps as a share of one step (the figure the 5 % target is about);
3. the sweep through the garbage collector's objects (sweep_every=1, less the walk), and
   what it adds at the default sweep_every=10;
4. the census with a leak in progress (the model keeps every step's output, graph and
   all) after --leak-steps steps.

Run it with the Python of a venv where the wheel is installed and torch importable (the one
scripts/test makes, ~/.cache/gpuctl/py-tests-torch-2.11.0), after scripts/wheel:

    ~/.cache/gpuctl/py-tests-torch-2.11.0/bin/python bench/torch_census.py [--steps 100] [--repeats 5]
"""

import argparse
import statistics
import time
import warnings

import torch

from gpuctl.torch import MemoryLeakWarning, MemoryMonitor
import bench_state

CHECK_EVERY = 10


class Blocks(torch.nn.Module):
    def __init__(self, width: int, keep: bool) -> None:
        super().__init__()
        layers = []
        for _ in range(50):
            layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
        self.layers = torch.nn.Sequential(*layers)
        self.keep = keep
        self.kept = []

    def forward(self, x):
        out = self.layers(x)
        if self.keep:
            self.kept.append(out * 1.0)  # the leak: each step's output, graph and all
        return out


def run(model, optimizer, batches, monitor):
    started = time.perf_counter()
    for x in batches:
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if monitor is not None:
            monitor.step()
    return time.perf_counter() - started


def measure(width, steps, repeats, keep=False, warm_steps=0, sweep_every=None):
    torch.manual_seed(0)
    model = Blocks(width, keep)
    modules = sum(1 for _ in model.modules()) - 1
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batches = [torch.randn(32, width) for _ in range(steps)]
    if warm_steps:
        run(model, optimizer, [batches[0]] * warm_steps, None)
    run(model, optimizer, batches[:CHECK_EVERY], None)  # allocator and caches warm
    plain, monitored, census, census_share = [], [], [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MemoryLeakWarning)
        for _ in range(repeats):
            plain.append(run(model, optimizer, batches, None) / steps)
            monitor = MemoryMonitor(check_every=CHECK_EVERY, census_share=None, sweep_every=sweep_every)
            monitored.append(run(model, optimizer, batches, monitor) / steps)
            censuses = steps // CHECK_EVERY
            per_census = monitor.census_seconds / censuses
            per_step = monitor.step_seconds / max(1, steps - censuses)
            census.append(per_census)
            census_share.append(per_census / CHECK_EVERY / per_step)
    return modules, statistics.median(plain), statistics.median(monitored), statistics.median(census), \
        statistics.median(census_share), len(model.kept)


def main() -> None:
    bench_state.scratch()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--leak-steps", type=int, default=300)
    args = parser.parse_args()
    torch.set_num_threads(1)
    modules, plain, monitored, census, share, _ = measure(args.width, args.steps, args.repeats)
    print(f"leak census, a model of {modules} modules (50 x Linear({args.width}, {args.width}) + GELU), AdamW, "
          f"batch 32, CPU 1 thread, check_every={CHECK_EVERY}, median of {args.repeats} x {args.steps} steps:")
    print(f"  plain loop {plain * 1e3:.2f} ms/step, with MemoryMonitor.step {monitored * 1e3:.2f} ms/step: "
          f"{(monitored / plain - 1) * 100:+.2f} %")
    print(f"  census {census * 1e3:.3f} ms each, {share * 100:.2f} % of a step at check_every={CHECK_EVERY}")
    _, _, _, swept, swept_share, _ = measure(args.width, args.steps, args.repeats, sweep_every=1)
    sweep, sweep_share = swept - census, swept_share - share
    print(f"  sweep through the collector's objects {sweep * 1e3:.3f} ms each; at sweep_every=10 it adds "
          f"{sweep_share / 10 * 100:.2f} % of a step: {(share + sweep_share / 10) * 100:.2f} % in all")
    _, plain, monitored, census, share, kept = measure(args.width, args.steps, args.repeats, keep=True,
                                                       warm_steps=args.leak_steps)
    print(f"  with a leak in progress ({kept} outputs kept, graphs and all): census {census * 1e3:.3f} ms each, "
          f"{share * 100:.2f} % of a step")


if __name__ == "__main__":
    main()
