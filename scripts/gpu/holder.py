#!/usr/bin/env python3
"""A CUDA process of the checks' own: holds --mib on the first visible CUDA device (torch),
busy (a matmul loop) or idle, and prints "ready" and its workers' pids once it holds it.

In rehearsal (lab.sim()) it registers itself in nvml-sim's scenario instead of allocating,
on the GPU its CUDA_VISIBLE_DEVICES names (else GPU 0), and opens that GPU's simulated
device file, as the driver maps /dev/nvidia* into a CUDA process; with CUDA_MPS_PIPE_DIRECTORY
set it registers as an MPS client (on a GPU, CUDA makes it one of that daemon's server).

  holder.py --mib 1024 [--busy] [--workers N --worker-mib M] [--detach-workers]
            [--exit-after S] [--report FILE]

With --workers, the process itself holds --mib (0: nothing, a launcher that never touched
CUDA) and starts N workers (its process group, or their own sessions with
--detach-workers) that each hold --worker-mib. --exit-after: exit after S seconds, leaving
the workers behind, as a run that forgot them does.
"""

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab  # noqa: E402


def sim_gpu_index() -> int:
    """The GPU CUDA_VISIBLE_DEVICES names (an index or a GPU UUID), as nvidia-smi numbers it."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if not visible:
        return 0
    if visible.isdigit():
        return int(visible)
    for index, uuid in lab.smi("index,uuid"):
        if uuid == visible:
            return int(index)
    sys.exit(f"holder: CUDA_VISIBLE_DEVICES={visible} names no GPU of the sim")


def hold(mib: int, busy: bool):
    """Takes the memory; returns what keeps it alive and a function doing one unit of work."""
    if lab.sim():
        index = sim_gpu_index()
        keep = open(os.path.join(os.environ["GPUCTL_DEV_DIR"], f"nvidia{index}"), "rb")
        # Started with an MPS pipe directory, CUDA makes it a client of that daemon's server.
        mps = "client" if os.environ.get("CUDA_MPS_PIPE_DIRECTORY") else None
        lab.register(os.getpid(), mib, 60 if busy else 0, index, mps)
        return keep, lambda: sum(range(200000))
    import torch

    keep = torch.empty(mib * lab.MIB, dtype=torch.uint8, device="cuda")
    a = torch.randn(4096, 4096, device="cuda")

    def work():
        (a @ a).sum().item()

    torch.cuda.synchronize()
    return (keep, a), work


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, required=True)
    parser.add_argument("--busy", action="store_true")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--worker-mib", type=int, default=512)
    parser.add_argument("--detach-workers", action="store_true")
    parser.add_argument("--exit-after", type=float)
    parser.add_argument("--report")
    args = parser.parse_args()
    lab.track(os.getpid())

    workers = [subprocess.Popen([sys.executable, __file__, "--mib", str(args.worker_mib)], stdout=subprocess.PIPE,
                                text=True, start_new_session=args.detach_workers) for _ in range(args.workers)]
    for worker in workers:
        if worker.stdout.readline().strip() != "ready":
            sys.exit("holder: a worker did not start")
    kept, work = hold(args.mib, args.busy) if args.mib else (None, None)
    if args.report:
        lab.write_json(args.report, {"pid": os.getpid(), "workers": [w.pid for w in workers],
                                     "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")})
    print("ready", *[w.pid for w in workers], flush=True)
    deadline = time.monotonic() + (args.exit_after if args.exit_after is not None else 3600)
    while time.monotonic() < deadline:
        if args.busy and work:
            work()
        else:
            time.sleep(0.1)
    del kept
    os._exit(0)  # the workers stay, as a run's forgotten ones do


if __name__ == "__main__":
    main()
