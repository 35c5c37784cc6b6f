#!/usr/bin/env python3
"""Benchmark: `gpuctl info --json` on a simulated 8-GPU server with N live processes.

Prints, for each process count, the median wall time of a whole `gpuctl info --json`
invocation (exec, NVML load and init, every GPU, /proc facts for every process, JSON out), and
as a reference in the same run, on the same sim: the same query through Python's NVML client
(nvidia-ml-py), both as a fresh `python3` process and warm inside one interpreter. The Python
query reads NVML only (no /proc, no owners), so it does less work than gpuctl.

The stand-in processes belong to a user, as GPU jobs on a shared server do: run as root, the
script starts them as `nobody` (setpriv). `--root-owned` keeps them root's, which costs gpuctl
one more /proc file per process (see docs/performance.md).

Per phase (GPUCTL_TIMINGS, printed by gpuctl itself): opening NVML, the NVML reads, the /proc
reads, peak marks and rendering, medians over the same runs; the rest of the wall time is
exec, dynamic linking and exit. `--baseline PATH` also times another gpuctl binary (an older
build, say), alternating with this one, and prints the ratio.

Leases: every `gpuctl info` runs as on an installed machine, with a lease directory holding two
held leases (GPUs 0 and 1, each root's file locked by a process, as two `gpuctl run`s hold them), and
the same build is timed alternately with no lease directory at all: the ratio is what reading
the leases costs (issue 46: at most 1.05).

Usage: bench/info.py [--runs 50] [--counts 64,128,256,512] [--root-owned] [--baseline PATH] [--mig]
With --mig every GPU is split into 7 MIG instances and the processes are spread over them.

Last, one row on the demo's server (crates/nvml-sim/examples/h200x8.toml inside `nvml-sim
run`: 27 processes, and 9 GiB no process accounts for on GPU 6, above holders_threshold):
`info --json` and the table, each with the phases it paid, so that a device-file scan run
unasked shows (a `holders` phase) and can never hide again.
Needs release builds: cargo build --release -p gpuctl -p nvml-sim
Python reference: PYTHON=.venv/bin/python (scripts/test creates it), else python3 with pynvml.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import bench_state

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.path.join(ROOT, "target", "release")
GPUS = 8

PY_QUERY = r"""
import pynvml as n
def query():
    n.nvmlInit()
    out = []
    for i in range(n.nvmlDeviceGetCount()):
        h = n.nvmlDeviceGetHandleByIndex(i)
        m = n.nvmlDeviceGetMemoryInfo(h)
        try:
            util = n.nvmlDeviceGetUtilizationRates(h).gpu
        except n.NVMLError_NotSupported:  # a MIG-enabled GPU reports none
            util = None
        out.append((n.nvmlDeviceGetName(h), n.nvmlDeviceGetUUID(h), m.total, m.used, m.free,
                    util, n.nvmlDeviceGetTemperature(h, 0), n.nvmlDeviceGetPowerUsage(h),
                    [(p.pid, p.usedGpuMemory) for p in n.nvmlDeviceGetComputeRunningProcesses(h)]))
    n.nvmlShutdown()
    return out
"""


def median_ms(samples):
    return statistics.median(samples) * 1000


def time_command(argv, env, runs):
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=True)
        samples.append(time.perf_counter() - start)
    return samples


def time_gpuctl(binaries, env, runs):
    """Wall times of each (label, binary, extra environment)'s `info --json`, run alternately,
    and the phase times the first one reports (GPUCTL_TIMINGS)."""
    env = dict(env, GPUCTL_TIMINGS="1")
    walls = {label: [] for label, _, _ in binaries}
    phases = {}
    for _ in range(runs):
        for label, binary, extra in binaries:
            start = time.perf_counter()
            done = subprocess.run([binary, "info", "--json"], env=dict(env, **extra),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  check=True)
            walls[label].append(time.perf_counter() - start)
            if label != binaries[0][0]:
                continue
            for line in done.stderr.splitlines():
                if "timings:" not in line:
                    continue
                for part in line.split("timings:", 1)[1].split(","):
                    name, value, _unit = part.split()
                    phases.setdefault(name, []).append(float(value))
    return walls, {name: statistics.median(v) for name, v in phases.items()}


DEMO = os.path.join(ROOT, "crates", "nvml-sim", "examples", "h200x8.toml")

# Runs inside `nvml-sim run`: each binary's `info --json` and `info`, alternating, RUNS times;
# prints wall times (s) and the GPUCTL_TIMINGS phases (ms) of each.
DEMO_INNER = r"""
import json, os, subprocess, sys, time
binaries = json.loads(sys.argv[1]); runs = int(sys.argv[2])
views = {"info --json": ["info", "--json"], "info": ["info"]}
env = dict(os.environ, GPUCTL_TIMINGS="1")
out = {b: {v: {"walls": [], "phases": {}} for v in views} for b in binaries}
for _ in range(runs):
    for b in binaries:
        for name, argv in views.items():
            t = time.perf_counter()
            done = subprocess.run([b] + argv, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True, check=True)
            slot = out[b][name]
            slot["walls"].append(time.perf_counter() - t)
            for line in done.stderr.splitlines():
                if "timings:" in line:
                    for part in line.split("timings:", 1)[1].split(","):
                        key, value, _unit = part.split()
                        slot["phases"].setdefault(key, []).append(float(value))
print(json.dumps(out))
"""


def demo_row(gpuctl, baseline, runs):
    """`info --json` and `info` on the demo's server, with the phases each paid."""
    sim = os.path.join(TARGET, "nvml-sim")
    if not os.path.exists(sim):
        sys.exit(f"bench/info.py: {sim} missing: cargo build --release -p nvml-sim")
    binaries = [gpuctl] + ([baseline] if baseline else [])
    env = dict(os.environ, GPUCTL_CONFIG="/dev/null")
    for key in ("GPUCTL_NVML_LIB", "NVML_SIM_SCENARIO", "NVML_SIM_STATE", "NVML_SIM_TRACE"):
        env.pop(key, None)
    done = subprocess.run([sim, "run", DEMO, "--", sys.executable, "-c", DEMO_INNER,
                           json.dumps(binaries), str(runs)],
                          capture_output=True, text=True, env=env, check=True)
    times = json.loads(done.stdout)
    print(f"demo server (h200x8.toml: 27 processes, GPU 6 with 9 GiB unattributed), median of {runs} runs")
    for view in ("info --json", "info"):
        for binary in binaries:
            slot = times[binary][view]
            phases = {k: statistics.median(v) for k, v in slot["phases"].items()}
            scan = f"holders {phases['holders']:.2f} ms" if "holders" in phases else "no holder scan"
            label = "this build" if binary == gpuctl else "baseline"
            print(f"  {view:12} {label:10} {median_ms(slot['walls']):7.2f}ms  ({scan}; phases: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()) + ")")


def hold_leases(directory, uuids):
    """Two leases held as `gpuctl run` holds them: the lease file of each UUID (root's, 0666,
    as root's run makes it) locked with a POSIX record lock by this process. Returns the open
    files (closing one releases its lease)."""
    import fcntl
    os.makedirs(directory, exist_ok=True)
    os.chmod(directory, 0o755)
    held = []
    for uuid in uuids:
        path = os.path.join(directory, f"{uuid}.lease")
        f = open(path, "a+")
        os.chmod(path, 0o666)
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.append(f)
    return held


def proc_floor_ms(pids, runs):
    """The kernel's share: reading stat, cmdline and cgroup of every pid once, one thread,
    with bare os.open/os.read (gpuctl reads the same files, spread over the cores)."""
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        for pid in pids:
            for name in ("stat", "cmdline", "cgroup"):
                fd = os.open(f"/proc/{pid}/{name}", os.O_RDONLY)
                while os.read(fd, 4096):
                    pass
                os.close(fd)
        samples.append(time.perf_counter() - start)
    return median_ms(samples)


def main():
    bench_state.scratch()
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--counts", default="64,128,256,512")
    parser.add_argument("--root-owned", action="store_true")
    parser.add_argument("--baseline", help="another gpuctl binary to time alongside")
    parser.add_argument("--mig", action="store_true",
                        help="split every GPU into 7 MIG instances (1g.18gb) and spread the "
                             "processes over them")
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    python = os.environ.get("PYTHON", "python3")
    gpuctl = os.path.join(TARGET, "gpuctl")
    sim = os.path.join(TARGET, "libnvml_sim.so")
    for path in (gpuctl, sim):
        if not os.path.exists(path):
            sys.exit(f"bench/info.py: {path} missing: cargo build --release -p gpuctl -p nvml-sim")

    scratch = tempfile.mkdtemp(prefix="gpuctl-bench-")
    libdir = os.path.join(scratch, "lib")
    os.mkdir(libdir)
    os.symlink(sim, os.path.join(libdir, "libnvidia-ml.so.1"))
    scenario = os.path.join(scratch, "scenario.toml")
    leases = os.path.join(scratch, "leases")
    env = dict(os.environ, GPUCTL_NVML_LIB=sim, NVML_SIM_SCENARIO=scenario,
               NVML_SIM_STATE=os.path.join(scratch, "state.json"), LD_LIBRARY_PATH=libdir,
               GPUCTL_LEASE_DIR=leases)
    no_leases = {"GPUCTL_LEASE_DIR": os.path.join(scratch, "no-lease-directory")}

    if args.root_owned or os.geteuid() != 0:
        owner = f"uid {os.geteuid()}"
    else:
        owner = "uid 65534 (nobody)"
    print(f"gpuctl info --json, {GPUS} simulated GPUs, processes owned by {owner}, two leases held, median of {args.runs} runs, {os.cpu_count()} CPUs")
    print(f"{'processes':>9}  {'gpuctl':>9}  {'µs/proc':>8}  {'/proc floor':>11}  {'py fresh':>9}  {'py warm':>8}  gpuctl/py-fresh")
    results = {}
    for count in counts:
        holder = ["sleep", "3600"]
        if os.geteuid() == 0 and not args.root_owned:
            holder = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] + holder
        holders = [subprocess.Popen(holder) for _ in range(count)]
        try:
            lines = ['driver_version = "570.133.20"', "cuda_driver_version = 12080"]
            gpu = "[[gpu]]\nname = \"NVIDIA H200\"\nutilization_pct = 90\ntemperature_c = 60\npower_mw = 600000"
            if args.mig:
                gpu += "".join(f"\n[[gpu.mig]]\nprofile = \"1g.18gb\"\ngpu_instance = {gi}" for gi in range(1, 8))
            lines += [gpu] * GPUS
            for i, p in enumerate(holders):
                instance = f"\ngpu_instance = {(i // GPUS) % 7 + 1}" if args.mig else ""
                lines.append(f"[[process]]\npid = {p.pid}\ngpu = {i % GPUS}{instance}\nused_mib = {1024 + i}\nsm_pct = 50")
            with open(scenario, "w") as f:
                f.write("\n".join(lines) + "\n")
            check = subprocess.run([gpuctl, "info", "--json"], env=env, capture_output=True, text=True, check=True)
            # On MIG GPUs each process is also listed under its instance.
            listed = count * (2 if args.mig else 1)
            assert check.stdout.count('"pid"') == listed, "not every process was reported"
            uuids = [d["uuid"] for d in json.loads(check.stdout)["devices"]][:2]
            held = hold_leases(leases, uuids)
            shown = json.loads(subprocess.run([gpuctl, "info", "--json"], env=env, capture_output=True,
                                              text=True, check=True).stdout)
            assert all(d.get("leases") for d in shown["devices"][:2]), "the held leases are not shown"
            binaries = [("ours", gpuctl, {}), ("ours, no lease directory", gpuctl, no_leases)]
            if args.baseline:
                binaries += [("baseline", args.baseline, {}),
                             ("baseline, no lease directory", args.baseline, no_leases)]
            walls, phases = time_gpuctl(binaries, env, args.runs)
            for f in held:
                f.close()
            ours = median_ms(walls["ours"])
            bare = median_ms(walls["ours, no lease directory"])
            fresh = median_ms(time_command([python, "-c", PY_QUERY + "query()"], env, max(10, args.runs // 5)))
            warm_script = PY_QUERY + (
                "import time,statistics\nquery()\ns=[]\n"
                f"for _ in range({args.runs}):\n t=time.perf_counter(); query(); s.append(time.perf_counter()-t)\n"
                "print(statistics.median(s))")
            warm = float(subprocess.run([python, "-c", warm_script], env=env, capture_output=True,
                                        text=True, check=True).stdout) * 1000
            floor = proc_floor_ms([p.pid for p in holders], 10)
            results[count] = ours
            print(f"{count:>9}  {ours:>7.2f}ms  {ours * 1000 / count:>8.1f}  {floor:>9.2f}ms  {fresh:>7.2f}ms  {warm:>6.2f}ms  {ours / fresh:>6.2f}")
            if phases:
                named = sum(phases.values())
                print("           phases (median ms): " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items())
                      + f"; exec, linking and exit {max(0.0, ours - named):.2f}")
            print(f"           two leases held: {ours:.2f}ms; no lease directory: {bare:.2f}ms; "
                  f"leases / none {ours / bare:.3f}")
            if args.baseline:
                base = median_ms(walls["baseline"])
                base_bare = median_ms(walls["baseline, no lease directory"])
                print(f"           baseline {args.baseline}: {base:.2f}ms (no lease directory "
                      f"{base_bare:.2f}ms, leases / none {base / base_bare:.3f}), {base / fresh:.2f} of py fresh; "
                      f"this build / baseline {ours / base:.2f}")
        finally:
            for p in holders:
                p.kill()
                p.wait()
    if len(results) > 1:
        lo, hi = min(results), max(results)
        growth = (results[hi] / results[lo]) / (hi / lo)
        print(f"cost growth {lo}->{hi} processes: x{results[hi] / results[lo]:.2f} for x{hi / lo:.0f} processes "
              f"({'sub-linear' if growth < 1 else 'super-linear'}: {growth:.2f} of linear)")
    demo_row(gpuctl, args.baseline, args.runs)


if __name__ == "__main__":
    main()
