#!/usr/bin/env python3
"""Benchmark: `gpuctl fleet` against a Prometheus holding a large fleet's history.

Writes NODES nodes x GPUS GPUs of the families `gpuctl fleet` reads, HOURS of history at
STEP seconds, as OpenMetrics; turns it into TSDB blocks with `promtool tsdb
create-blocks-from openmetrics`; starts Debian's Prometheus on them (loopback, no scraping);
then times, median of RUNS, `gpuctl fleet --json` and `gpuctl fleet --by user --since 24h
--json`, with the number of queries each makes (GPUCTL_TIMINGS) and the rows they return.

Each node: 3 users and 3 owners with their byte-second counters, every finding kind's count,
a health verdict per GPU (one GPU in 50 needs gpu_reset), 1 node in 10 with an orphan's
memory, 1 in 20 with memory no process accounts for. The history ends a few minutes in the
future, so that an instant query now finds every series fresh.

Usage: bench/fleet.py [--nodes 1000] [--gpus 8] [--hours 24] [--step 60] [--runs 7]
Needs a release build: cargo build --release -p gpuctl
"""

import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import bench_state
from schedstat import cpu_seconds

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPUCTL = os.environ.get("GPUCTL_BIN") or os.path.join(ROOT, "target", "release", "gpuctl")
GIB = 1 << 30
KINDS = ["orphaned", "zombie_holder", "stopped", "uninterruptible", "unattributed",
         "above_fraction", "unlisted_holder", "stuck", "idle", "impostor"]
ACTIONS = ["none", "gpu_reset", "node_reboot", "drain_p2p", "drain_and_reset"]


def series_of(node, gpus):
    """(family, type, labels, (a, b)) of one node: its value at t seconds is a + b*t (None:
    the start time plus t, a file's mtime)."""
    inst = f'instance="gpu-{node:04d}:9100",job="node"'
    out = [
        ("up", "gauge", inst, (1, 0)),
        ("gpuctl_watchdog_loops_total", "counter", inst, (0, 0.1)),
        ("node_textfile_mtime_seconds", "gauge",
         inst + ',file="/var/lib/prometheus/node-exporter/gpuctl.prom"', None),
        ("gpuctl_watchdog_interval_seconds", "gauge", inst, (10, 0)),
        ("gpuctl_nvml_up", "gauge", inst, (1, 0)),
    ]
    for g in range(gpus):
        gl = f'{inst},gpu="{g}",uuid="GPU-{node:04d}-{g}"'
        out += [
            ("gpuctl_gpu_up", "gauge", gl, (1, 0)),
            ("gpuctl_gpu_memory_used_bytes", "gauge", gl, ((g + 1) * 8 * GIB, 0)),
            ("gpuctl_gpu_memory_total_bytes", "gauge", gl, (141 * GIB, 0)),
            ("gpuctl_gpu_unattributed_bytes", "gauge", gl,
             (GIB if node % 20 == 0 and g == 0 else 0, 0)),
        ]
        bad = node % 50 == 0 and g == 3
        for a in ACTIONS:
            want = "gpu_reset" if bad else "none"
            out.append(("gpuctl_gpu_health_action", "gauge", f'{gl},action="{a}"',
                        (int(a == want), 0)))
    for k in KINDS:
        out.append(("gpuctl_findings", "gauge", f'{inst},kind="{k}"',
                    (1 if k == "orphaned" and node % 10 == 0 else 0, 0)))
    if node % 10 == 0:
        out.append(("gpuctl_finding_memory_bytes", "gauge",
                    f'{inst},kind="orphaned",gpu="0",uuid="GPU-{node:04d}-0",'
                    f'owner_kind="slurm",owner="slurm:{node}"', (4 * GIB, 0)))
    for u in range(3):
        user = f'user="user{(node + u) % 300}"'
        owner = f'owner_kind="slurm",owner="slurm:{node * 3 + u}"'
        for fam, labels in (("user", user), ("owner", owner)):
            out += [
                (f"gpuctl_{fam}_memory_bytes", "gauge", f"{inst},{labels}", (8 * GIB, 0)),
                (f"gpuctl_{fam}_memory_byte_seconds_total", "counter", f"{inst},{labels}",
                 (0, 8 * GIB)),
                (f"gpuctl_{fam}_idle_memory_byte_seconds_total", "counter", f"{inst},{labels}",
                 (0, 2 * GIB * u)),
            ]
    return out


BLOCK = 7200  # Prometheus' block range, seconds: promtool reads its input once per block.


def write_openmetrics(path, nodes, gpus, start, steps, step):
    """One OpenMetrics file per 2-hour block (path.N), so that promtool reads each sample
    once rather than once per block of the whole history."""
    windows = {}
    for i in range(steps):
        windows.setdefault((start + i * step) // BLOCK, []).append(i)
    total, per_node, files = 0, 0, []
    for n, (_, indices) in enumerate(sorted(windows.items())):
        name = f"{path}.{n}"
        written, per_node = write_window(name, nodes, gpus, start, indices, step)
        total += written
        files.append(name)
    return total, per_node, files


def write_window(path, nodes, gpus, start, indices, step):
    families = {}
    for n in range(nodes):
        for fam, typ, labels, value in series_of(n, gpus):
            families.setdefault((fam, typ), []).append((labels, value))
    total = 0
    with open(path, "w") as f:
        for (fam, typ), members in families.items():
            name = fam[:-len("_total")] if typ == "counter" else fam
            f.write(f"# TYPE {name} {typ}\n")
            for labels, value in members:
                head = f"{fam}{{{labels}}} "
                a, b = value if value else (start, 1)
                if b == 0:
                    lines = [f"{head}{a} {start + i * step}\n" for i in indices]
                else:
                    lines = [f"{head}{a + b * i * step} {start + i * step}\n"
                             for i in indices]
                f.write("".join(lines))
                total += len(indices)
        f.write("# EOF\n")
    per_node = sum(len(m) for m in families.values()) // nodes
    return total, per_node


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(args, env, prom_pid):
    """Wall seconds of one `gpuctl fleet ARGS`, its answer and query count, and the CPU
    seconds it and Prometheus spent on it: the split between the query's evaluation and
    gpuctl's own work on the answer."""
    prom_before = cpu_seconds(prom_pid)
    ours_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    run = subprocess.run([GPUCTL, "fleet", *args], env=env, capture_output=True, text=True)
    took = time.monotonic() - started
    ours_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    prom_cpu = cpu_seconds(prom_pid) - prom_before
    ours_cpu = (ours_after.ru_utime - ours_before.ru_utime) + (ours_after.ru_stime - ours_before.ru_stime)
    if run.returncode != 0:
        sys.exit(f"gpuctl fleet {args}: exit {run.returncode}: {run.stderr}")
    queries = [l for l in run.stderr.splitlines() if "queries" in l]
    return took, json.loads(run.stdout), queries[-1] if queries else "?", ours_cpu, prom_cpu


def main():
    bench_state.scratch()
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--hours", type=float, default=24)
    ap.add_argument("--step", type=int, default=60,
                    help="seconds between samples; at most 300 (Prometheus' lookback)")
    ap.add_argument("--runs", type=int, default=7)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="gpuctl-bench-fleet-")
    prom = None
    try:
        steps = int(a.hours * 3600 // a.step)
        start = int(time.time()) + 600 - steps * a.step
        om = os.path.join(work, "fleet.om")
        t0 = time.monotonic()
        samples, per_node, files = write_openmetrics(om, a.nodes, a.gpus, start, steps, a.step)
        t1 = time.monotonic()
        data = os.path.join(work, "data")
        for name in files:
            subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q",
                            name, data], check=True, capture_output=True)
            os.remove(name)
        t2 = time.monotonic()
        print(f"{a.nodes} nodes x {a.gpus} GPUs, {a.hours:g} h at {a.step} s: "
              f"{per_node} series per node, {samples / 1e6:.1f} M samples "
              f"(written in {t1 - t0:.0f} s, blocks in {t2 - t1:.0f} s)")
        if not os.access(GPUCTL, os.X_OK):
            sys.exit("bench/fleet.py: no release gpuctl: cargo build --release -p gpuctl")
        port = free_port()
        config = os.path.join(work, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 1h\n")
        prom = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={data}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=30d"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "prometheus.log"), "w"))
        url = f"http://127.0.0.1:{port}"
        env = dict(os.environ, GPUCTL_TIMINGS="1", GPUCTL_CONFIG="/dev/null")
        for _ in range(600):
            try:
                subprocess.run(["curl", "-sf", f"{url}/-/ready"], check=True,
                               capture_output=True)
                break
            except subprocess.CalledProcessError:
                time.sleep(0.5)
        for args in (["--json"], ["--by", "user", "--since", "24h", "--json"]):
            timed(["--prometheus", url, *args], env, prom.pid)  # warm the page cache once
            times, ours, theirs, last, queries = [], [], [], None, "?"
            for _ in range(a.runs):
                took, last, queries, our_cpu, prom_cpu = timed(["--prometheus", url, *args], env, prom.pid)
                times.append(took)
                ours.append(our_cpu)
                theirs.append(prom_cpu)
            rows = len(last.get("nodes", last.get("rows", [])))
            reporting = sum(n["status"] == "reporting" for n in last.get("nodes", []))
            if "nodes" in last:
                rows = f"{rows} ({reporting} reporting)"
            print(f"gpuctl fleet {' '.join(args)}: median {statistics.median(times):.3f} s "
                  f"(min {min(times):.3f}, max {max(times):.3f}; {a.runs} runs), "
                  f"{rows} rows, {queries.split(': ')[-1]}; CPU: gpuctl "
                  f"{statistics.median(ours):.3f} s, Prometheus {statistics.median(theirs):.3f} s")
    finally:
        if prom:
            prom.terminate()
            prom.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
