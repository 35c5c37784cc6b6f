#!/usr/bin/env python3
"""On a machine with an NVIDIA GPU: time gpuctl-watchdog reclaiming a real orphaned CUDA
worker, from its launcher's crash (SIGKILL) to the memory being free again.

A launcher (its own session and process group) starts a worker that allocates --hold-gib
with PyTorch and then idles. The watchdog runs in the foreground, in reclaim mode, with a
short grace. Once it has seen the run healthy, the launcher is SIGKILLed; the worker is
then an orphan whose parent was seen to die, and is reclaimed after the grace. Reports the
time to the watchdog's "reclaimed" line and to nvidia-smi showing the memory free, against
the bound grace + interval + term_timeout + 1 s.

Changes no card setting. Acts only on the processes it starts: it refuses to run while any
other process holds GPU memory (the watchdog reclaims whatever it finds stale), and checks
afterwards that nothing else was reclaimed. Prints a report for docs/gpu-validation.md.

Usage: scripts/gpu/watchdog-orphan.py PATH/TO/gpuctl-watchdog [--hold-gib 4] [--grace 3]
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

LAUNCHER = r"""
import os, subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], stdout=subprocess.PIPE, text=True)
print(worker.pid, flush=True)
print(worker.stdout.readline().strip(), flush=True)
time.sleep(3600)
"""

WORKER = r"""
import sys, time, torch
x = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(3600)
"""


def compute_apps():
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    return {int(line.split(",")[0]): int(line.split(",")[1]) for line in out.strip().splitlines() if line.strip()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("watchdog")
    parser.add_argument("--hold-gib", type=float, default=4)
    parser.add_argument("--grace", type=float, default=3, help="seconds")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds")
    parser.add_argument("--term-timeout", type=float, default=2, help="seconds")
    args = parser.parse_args()

    others = compute_apps()
    if others:
        sys.exit(f"other processes hold GPU memory ({sorted(others)}): this check acts only on its own")
    driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                            capture_output=True, text=True, check=True).stdout.split()[0]

    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "gpuctl.toml")
        with open(config, "w") as f:
            f.write(f'[watchdog]\ninterval = "{int(args.interval * 1000)}ms"\ngrace = "{int(args.grace * 1000)}ms"\n'
                    f'term_timeout = "{int(args.term_timeout * 1000)}ms"\nmode = "reclaim"\n'
                    f'metrics_file = "{tmp}/gpuctl.prom"\nstate_dir = "{tmp}/state"\n')
        log_path = os.path.join(tmp, "watchdog.log")
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "JOURNAL_STREAM")}
        with open(log_path, "w") as log:
            daemon = subprocess.Popen([args.watchdog, "--config", config], stderr=log, stdin=subprocess.DEVNULL, env=env)
        launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, WORKER, str(args.hold_gib)],
                                    stdout=subprocess.PIPE, text=True, start_new_session=True)
        worker = int(launcher.stdout.readline())
        try:
            if launcher.stdout.readline().strip() != "ready":
                sys.exit("the CUDA worker did not start")
            held = compute_apps().get(worker)
            time.sleep(max(2 * args.interval, 1.5))  # seen healthy, parent alive
            crashed = time.monotonic()
            os.kill(launcher.pid, signal.SIGKILL)
            launcher.wait()
            bound = args.grace + args.interval + args.term_timeout + 1
            reclaimed_at = freed_at = None
            while time.monotonic() - crashed < bound + 30 and freed_at is None:
                text = open(log_path).read()
                if reclaimed_at is None and re.search(rf"ACTION=reclaimed.*PID={worker} ", text):
                    reclaimed_at = time.monotonic() - crashed
                if worker not in compute_apps():
                    freed_at = time.monotonic() - crashed
                time.sleep(0.05)
        finally:
            for pid in (worker, launcher.pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            daemon.terminate()
            daemon.wait()
        text = open(log_path).read()
        foreign = [pid for pid in re.findall(r"ACTION=reclaimed.*?PID=(\d+) ", text) if int(pid) != worker]

    print(f"date {time.strftime('%Y-%m-%d')}, driver {driver}")
    print(f"worker pid {worker} held {held} MiB (nvidia-smi); grace {args.grace}s, interval {args.interval}s, "
          f"term_timeout {args.term_timeout}s: bound {bound:.1f}s")
    print(f"crash -> watchdog 'reclaimed' line: {reclaimed_at if reclaimed_at is None else f'{reclaimed_at:.2f}s'}")
    print(f"crash -> memory free in nvidia-smi: {freed_at if freed_at is None else f'{freed_at:.2f}s'}")
    if foreign:
        print(f"WARNING: the watchdog reclaimed processes this script did not start: {foreign}")
    print("watchdog log:")
    print(text)
    return 0 if freed_at is not None and freed_at <= bound and not foreign else 1


if __name__ == "__main__":
    sys.exit(main())
