#!/usr/bin/env python3
"""Benchmark: `gpuctl serve`, the container API, on a simulated 8-GPU server.

A stand-in container (`unshare --pid --fork --mount-proc`) holds --inside of the --count GPU
processes; the rest run on the host as `nobody`. All are spread over 8 GPUs. Prints medians:

- reply: one request and its reply, asked from inside the container (a Python client there),
  spaced past the service's 50 ms snapshot reuse so that each reply reads NVML and /proc
  afresh; and the same asked back to back (a burst, served from one snapshot);
- `gpuctl info --json` inside the container (asking the service) and on the host, each timed
  by a Python loop on its own side of the namespace (no nsenter in the timing), and the ratio;
- the service's memory: its resident set at start (no request yet), after the first reply,
  and after every further reply (growth per request), and its peak (VmHWM). Under socket
  activation (gpuctl-api.socket, --idle-exit) nothing runs at rest: 0.

Needs root (unshare, nsenter, setpriv) and release builds:
    cargo build --release -p gpuctl -p nvml-sim
Usage: bench/serve.py [--count 256] [--inside 128] [--runs 50]
Binaries from $CARGO_TARGET_DIR/release, else target/release.
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
TARGET = os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release")
GPUS = 8

# Runs inside the container: asks the service RUNS times, SPACING seconds apart, and prints
# the median reply time in ms and the number of processes the last reply named.
ASK = r"""
import socket, sys, time, json, statistics
path, runs, spacing = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
samples, named = [], 0
for _ in range(runs):
    t = time.perf_counter()
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.sendall(b'{"schema":1,"request":"processes"}\n')
    s.shutdown(socket.SHUT_WR)
    reply = s.makefile("rb").read()
    samples.append(time.perf_counter() - t)
    s.close()
    named = sum(len(g["processes"]) for g in json.loads(reply)["gpus"])
    time.sleep(spacing)
print(statistics.median(samples) * 1000, named)
"""

# Times `argv` RUNS times on this side of the namespace; prints the median wall time and
# the mean CPU time (user + system, the command's own), in ms.
TIME = r"""
import resource, subprocess, sys, time, statistics
runs, argv = int(sys.argv[1]), sys.argv[2:]
samples = []
before = resource.getrusage(resource.RUSAGE_CHILDREN)
for _ in range(runs):
    t = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    samples.append(time.perf_counter() - t)
after = resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / runs
print(statistics.median(samples) * 1000, cpu * 1000)
"""


def cpu_ms(pid):
    """User + system CPU time of a process (all its threads), in ms."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def rss_kib(pid, field="VmRSS"):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def pids_in_namespace(inode):
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}/ns/pid").st_ino == inode:
                with open(f"/proc/{entry}/comm") as f:
                    if f.read().strip() == "sleep":
                        found.append(int(entry))
        except OSError:
            pass
    return found


def main():
    bench_state.scratch()
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=256)
    parser.add_argument("--inside", type=int, default=128)
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/serve.py: needs root (unshare, nsenter)")
    gpuctl = os.path.join(TARGET, "gpuctl")
    sim = os.path.join(TARGET, "libnvml_sim.so")
    for path in (gpuctl, sim):
        if not os.path.exists(path):
            sys.exit(f"bench/serve.py: {path} missing: cargo build --release -p gpuctl -p nvml-sim")

    scratch = tempfile.mkdtemp(prefix="gpuctl-bench-serve-")
    scenario = os.path.join(scratch, "scenario.toml")
    socket_path = os.path.join(scratch, "api.sock")
    env = dict(os.environ, GPUCTL_NVML_LIB=sim, NVML_SIM_SCENARIO=scenario,
               NVML_SIM_STATE=os.path.join(scratch, "state.json"), GPUCTL_SOCKET=socket_path,
               GPUCTL_CONFIG="/dev/null",
               GPUCTL_STATE_DIR=os.path.join(scratch, "state"))

    # The container: its init sleeps; a shell inside starts the processes and waits.
    container = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "--", "sleep", "100000"])
    service = None
    outside = []
    try:
        init = None
        for _ in range(500):
            children = subprocess.run(["pgrep", "-P", str(container.pid)], capture_output=True, text=True).stdout.split()
            if children:
                init = int(children[0])
                break
            time.sleep(0.01)
        inode = os.stat(f"/proc/{init}/ns/pid").st_ino
        enter = ["nsenter", "--target", str(init), "--pid", "--mount", "--"]
        subprocess.Popen(enter + ["sh", "-c", f"for i in $(seq {args.inside}); do sleep 3600 & done; wait"])
        inside = []
        for _ in range(1000):
            inside = pids_in_namespace(inode)
            inside = [p for p in inside if p != init]
            if len(inside) >= args.inside:
                break
            time.sleep(0.01)
        assert len(inside) == args.inside, f"{len(inside)} of {args.inside} started inside"
        holder = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sleep", "3600"]
        outside = [subprocess.Popen(holder) for _ in range(args.count - args.inside)]
        pids = inside + [p.pid for p in outside]
        lines = ['driver_version = "570.133.20"', "cuda_driver_version = 12080"]
        lines += ["[[gpu]]\nname = \"NVIDIA H200\"\nutilization_pct = 90"] * GPUS
        for i, pid in enumerate(pids):
            lines.append(f"[[process]]\npid = {pid}\ngpu = {i % GPUS}\nused_mib = {1024 + i}\nsm_pct = 50")
        with open(scenario, "w") as f:
            f.write("\n".join(lines) + "\n")

        service = subprocess.Popen([gpuctl, "serve", "--socket", socket_path], env=env, stderr=subprocess.DEVNULL)
        for _ in range(500):
            if os.path.exists(socket_path):
                break
            time.sleep(0.01)
        time.sleep(0.2)
        at_start = rss_kib(service.pid)

        def ask(runs, spacing):
            out = subprocess.run(enter + ["python3", "-c", ASK, socket_path, str(runs), str(spacing)],
                                 env=env, capture_output=True, text=True, check=True).stdout.split()
            return float(out[0]), int(out[1])

        _, named = ask(1, 0)
        assert named == args.inside, f"the reply named {named} processes, not {args.inside}"
        after_first = rss_kib(service.pid)
        cpu_before = cpu_ms(service.pid)
        fresh, _ = ask(args.runs, 0.06)
        cpu_per_reply = (cpu_ms(service.pid) - cpu_before) / args.runs
        burst, _ = ask(args.runs, 0)
        after_all = rss_kib(service.pid)
        requests = 1 + 2 * args.runs
        peak = rss_kib(service.pid, "VmHWM")

        inside_info, inside_cpu = map(float, subprocess.run(
            enter + ["python3", "-c", TIME, str(args.runs), gpuctl, "info", "--json"],
            env=env, capture_output=True, text=True, check=True).stdout.split())
        host_info, host_cpu = map(float, subprocess.run(
            ["python3", "-c", TIME, str(args.runs), gpuctl, "info", "--json"],
            env=env, capture_output=True, text=True, check=True).stdout.split())
        check = json.loads(subprocess.run(enter + [gpuctl, "info", "--json"], env=env,
                                          capture_output=True, text=True, check=True).stdout)
        confirmed = sum(1 for d in check["devices"] for p in d["processes"] if p.get("confirmed_by"))
        assert confirmed == args.inside, f"info inside confirmed {confirmed} of {args.inside}"

        print(f"gpuctl serve, {GPUS} simulated GPUs, {args.count} processes ({args.inside} in the "
              f"caller's PID namespace), median of {args.runs}, {os.cpu_count()} CPUs")
        print(f"  reply, fresh snapshot each     {fresh:8.2f} ms   (target <= 10 ms)")
        print(f"    service CPU per fresh reply  {cpu_per_reply:8.2f} ms   (USER_HZ resolution, mean)")
        print(f"  reply, back to back (burst)    {burst:8.2f} ms")
        print(f"  gpuctl info --json inside      {inside_info:8.2f} ms")
        print(f"  gpuctl info --json on the host {host_info:8.2f} ms")
        print(f"  inside / host                  {inside_info / host_info:8.2f} x   (target <= 2x)")
        print(f"  CPU: inside {inside_cpu:.2f} ms (the service's share not counted), host {host_cpu:.2f} ms, "
              f"inside + one reply's service CPU / host {(inside_cpu + cpu_per_reply) / host_cpu:.2f} x")
        print(f"  load average at the end        {os.getloadavg()[0]:8.2f}")
        print(f"  service RSS at start           {at_start / 1024:8.2f} MiB (socket activation at rest: 0)")
        print(f"  service RSS after 1 reply      {after_first / 1024:8.2f} MiB")
        print(f"  service RSS after {requests} replies  {after_all / 1024:8.2f} MiB "
              f"({(after_all - after_first) / max(1, requests - 1):.1f} KiB per request after the first)")
        print(f"  service peak RSS (VmHWM)       {peak / 1024:8.2f} MiB")
    finally:
        if service:
            service.kill()
            service.wait()
        for p in outside:
            p.kill()
            p.wait()
        # The init's death ends every process of the container.
        for child in subprocess.run(["pgrep", "-P", str(container.pid)], capture_output=True, text=True).stdout.split():
            os.kill(int(child), 9)
        container.kill()
        container.wait()


if __name__ == "__main__":
    main()
