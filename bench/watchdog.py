#!/usr/bin/env python3
"""Benchmark: gpuctl-watchdog's memory and CPU per loop on 8 simulated GPUs.

N stand-in processes (tests/testproc.rs, mode sleep, owned by uid 65534 as GPU jobs are on a
shared server) are each registered on all 8 GPUs of an nvml-sim scenario (so every GPU lists
N processes: 8 x N entries), 1 GiB each, busy (so they are healthy, as most jobs are). The
daemon runs in report mode with --interval (100ms) for --seconds. While it runs, VmRSS is sampled
from /proc/PID/status every 100 ms; at the end VmHWM (peak RSS) is read, and the CPU time
(from /proc/PID/task/*/schedstat) over the loops after the first second, divided by the
loops counted in the metrics file (gpuctl_watchdog_loops_total), is the CPU per loop. The
daemon rewrites the file at least once a second (each loop where anything else changed), so
both readings are taken the moment the file changes.

The same run with no processes is the reference: the fixed cost of 8 GPUs through NVML,
the metrics file and the peak marks.

With --owners N each stand-in names a Slurm job in its environment (SLURM_JOB_ID, N jobs in
turn), so that the per-owner metrics have N owners to sum and cap.

Usage: bench/watchdog.py [--processes 256] [--seconds 10] [--owners 200] [--repeat 5]
Needs release builds: cargo build --release -p gpuctl-watchdog -p nvml-sim -p gpuctl-e2e
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import bench_state
from schedstat import cpu_seconds_by_thread

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.path.join(ROOT, "target", "release")  # --target replaces it (A/B comparisons)


def built(name):
    path = os.path.join(TARGET, name)
    if not os.path.exists(path):
        sys.exit(f"{path} is missing: cargo build --release -p gpuctl-watchdog -p nvml-sim -p gpuctl-e2e")
    return path


def status_kib(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def loops(metrics_file):
    try:
        with open(metrics_file) as f:
            m = re.search(r"^gpuctl_watchdog_loops_total (\d+)$", f.read(), re.M)
            return int(m.group(1)) if m else 0
    except FileNotFoundError:
        return 0


# The thread that makes every NVML call (gpuctl_core::nvml), and converts the lists they
# return: here nvml-sim's work, on a real GPU the driver's.
NVML_THREAD = "nvml-gpus"


def next_loops(metrics_file, pid):
    """Waits for the metrics file to be rewritten (at least once a second), then returns its
    loop count, the daemon's CPU time and its NVML thread's at that moment: the readings of
    one instant."""
    before = loops(metrics_file)
    while True:
        now = loops(metrics_file)
        if now != before:
            threads = cpu_seconds_by_thread(pid)
            return now, sum(threads.values()), threads.get(NVML_THREAD, 0.0)
        time.sleep(0.002)


def measure(processes, seconds, interval, gpus=8, spread=False, stuck_after=None, owners=0):
    testproc = built("gpuctl-testproc")
    stand_ins = []
    for i in range(processes):
        kwargs = {"user": 65534, "group": 65534} if os.geteuid() == 0 else {}
        env = {"GPUCTL_TESTPROC_MODE": "sleep"}
        if owners:
            # Its own job (in turn over `owners`), named by the environment as Slurm's
            # proctrack/linuxproc leaves it: owner slurm:JOB@UID, one metrics series each.
            env["SLURM_JOB_ID"] = str(1000 + i % owners)
        stand_ins.append(
            subprocess.Popen(
                ["python3", "train.py", "--rank", str(i)],
                executable=testproc,
                env=env,
                stdin=subprocess.DEVNULL,
                **kwargs,
            )
        )
    with tempfile.TemporaryDirectory() as tmp:
        scenario = os.path.join(tmp, "scenario.toml")
        gpu_list = ", ".join(str(g) for g in range(gpus))
        with open(scenario, "w") as f:
            f.write('driver_version = "570.133.20"\n')
            for _ in range(gpus):
                f.write('\n[[gpu]]\nname = "NVIDIA H200"\n')
            for i, p in enumerate(stand_ins):
                # Every process on every GPU (the heaviest reading of "8 GPUs x N"), or,
                # with --spread, each on one GPU in turn.
                on = str(i % gpus) if spread else f"[{gpu_list}]"
                f.write(f"\n[[process]]\npid = {p.pid}\ngpu = {on}\nused_mib = 1024\nsm_pct = 10\n")
        metrics_file = os.path.join(tmp, "gpuctl.prom")
        config = os.path.join(tmp, "gpuctl.toml")
        with open(config, "w") as f:
            f.write(
                f'[watchdog]\ninterval = "{interval}"\nmode = "report"\n'
                f'metrics_file = "{metrics_file}"\nstate_dir = "{tmp}/state"\n'
                + (f'stuck_after = "{stuck_after}"\n' if stuck_after else "")
            )
        os.chmod(config, 0o644)
        env = dict(os.environ)
        for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "JOURNAL_STREAM"):
            env.pop(key, None)
        env.update(
            GPUCTL_NVML_LIB=built("libnvml_sim.so"),
            NVML_SIM_SCENARIO=scenario,
            NVML_SIM_STATE=os.path.join(tmp, "state.json"),
        )
        daemon = subprocess.Popen(
            [built("gpuctl-watchdog"), "--config", config],
            env=env,
            stdin=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            start = time.monotonic()
            while loops(metrics_file) < 1:
                if time.monotonic() - start > 10:
                    raise RuntimeError("the daemon wrote no metrics")
                time.sleep(0.01)
            time.sleep(1.0)
            loops0, cpu0, nvml0 = next_loops(metrics_file, daemon.pid)
            rss = []
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                rss.append(status_kib(daemon.pid, "VmRSS"))
                time.sleep(0.1)
            loops1, cpu1, nvml1 = next_loops(metrics_file, daemon.pid)
            hwm = status_kib(daemon.pid, "VmHWM")
            size = os.path.getsize(metrics_file)
        finally:
            daemon.terminate()
            daemon.wait()
            for p in stand_ins:
                p.kill()
                p.wait()
    n = loops1 - loops0
    return {
        "metrics_bytes": size,
        "median_rss_mib": statistics.median(rss) / 1024,
        "peak_rss_mib": hwm / 1024,
        "loops": n,
        "cpu_ms_per_loop": (cpu1 - cpu0) * 1000 / n if n else float("nan"),
        "nvml_ms_per_loop": (nvml1 - nvml0) * 1000 / n if n else float("nan"),
    }


def main():
    bench_state.scratch()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--spread", action="store_true",
                        help="each process on one GPU (round robin) instead of on all 8")
    parser.add_argument("--stuck-after", default=None,
                        help='watchdog.stuck_after; "0s" turns the stuck-GPU check (and its '
                             'utilization and power reads) off')
    parser.add_argument("--interval", default="100ms",
                        help="the watchdog's interval; from 1s on, every loop reads every "
                        "process's stat again (the refresh period is at most a second)")
    parser.add_argument("--owners", type=int, default=0,
                        help="give the processes this many distinct owners (Slurm jobs named "
                        "by their environment) instead of one: the per-owner metrics' cost")
    parser.add_argument("--repeat", type=int, default=1,
                        help="measure the processes this many times (the median is the figure)")
    parser.add_argument("--target", help="the release build directory to measure "
                        "(default target/release)")
    args = parser.parse_args()
    if args.target:
        global TARGET
        TARGET = os.path.abspath(args.target)
    print(f"{'processes':>9} {'loops':>6} {'median RSS':>11} {'peak RSS':>9} {'CPU/loop':>9}"
          f" {'of it NVML':>10} {'metrics':>9}")
    runs = [0] + [args.processes] * args.repeat
    cpu = []
    for processes in runs:
        r = measure(processes, args.seconds, args.interval, spread=args.spread,
                    stuck_after=args.stuck_after, owners=args.owners)
        if processes:
            cpu.append(r["cpu_ms_per_loop"])
        print(
            f"{processes:>9} {r['loops']:>6} {r['median_rss_mib']:>7.1f} MiB"
            f" {r['peak_rss_mib']:>5.1f} MiB {r['cpu_ms_per_loop']:>6.2f} ms"
            f" {r['nvml_ms_per_loop']:>7.2f} ms {r['metrics_bytes']:>7} B"
        )
    if len(cpu) > 1:
        print(f"median CPU/loop over {len(cpu)} runs: {statistics.median(cpu):.3f} ms")


if __name__ == "__main__":
    main()
