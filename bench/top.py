#!/usr/bin/env python3
"""Benchmark: the CPU `gpuctl top` uses, on a simulated 8-GPU server with 256 live processes.

Runs `gpuctl top --interval 1` in a real terminal (a tmux server of its own) for --seconds
(default 60), after a warm-up, and reads the process's CPU time (user + system, every thread)
from /proc/PID/stat at both ends: the share of one core it takes. Repeated --runs times,
median printed. For scale, in the same invocation on the same sim: the CPU time of one whole
`gpuctl info --json` (median over --info-runs runs, from the kernel's rusage of the child),
and the CPU a refresh of the view costs next to it.

The reference: nvitop (nvidia-ml-py, psutil), run the same way at the same interval when it
can be had: installed from PyPI into a cached virtual environment
(~/.cache/gpuctl/nvitop-VERSION, or NVITOP_VENV) on first use. Without it, the row says why.

The stand-in processes belong to a user, as GPU jobs on a shared server do: run as root, the
script starts them as `nobody` (setpriv), as bench/info.py does.

Usage: bench/top.py [--seconds 60] [--runs 3] [--processes 256] [--info-runs 20] [--no-nvitop]
Needs release builds: cargo build --release -p gpuctl -p nvml-sim (CARGO_TARGET_DIR honoured),
and tmux.
"""

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import bench_state

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release")
GPUS = 8
NVITOP_VERSION = "1.7.2"
WARM_UP = 5.0
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """User plus system time of every thread of `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # utime and stime are fields 14 and 15; the split starts at field 3.
    return (int(fields[11]) + int(fields[12])) / TICKS


class Terminal:
    """A tmux server of its own, running one program in a 120x40 window."""

    def __init__(self, argv, env):
        self.dir = tempfile.mkdtemp(prefix="gpuctl-bench-tmux-")
        self.socket = os.path.join(self.dir, "sock")
        assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        command = f"exec env {assignments} {' '.join(shlex.quote(a) for a in argv)}"
        self.tmux("new-session", "-d", "-s", "b", "-x", "120", "-y", "40", command)
        self.pid = int(self.tmux("display-message", "-p", "-t", "b", "#{pane_pid}").strip())

    def tmux(self, *args):
        return subprocess.run(["tmux", "-u", "-f", "/dev/null", "-S", self.socket, *args],
                              check=True, capture_output=True, text=True).stdout

    def screen(self):
        return self.tmux("capture-pane", "-p", "-t", "b")

    def close(self):
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


def measure(argv, env, seconds, ready):
    """The share of one core `argv` takes over `seconds`, once `ready(screen)` and a warm-up
    have passed."""
    term = Terminal(argv, env)
    try:
        deadline = time.monotonic() + 30
        while not ready(term.screen()):
            if time.monotonic() > deadline:
                sys.exit(f"bench/top.py: {argv[0]} did not draw its screen:\n{term.screen()}")
            time.sleep(0.2)
        time.sleep(WARM_UP)
        start_cpu, start = cpu_seconds(term.pid), time.monotonic()
        time.sleep(seconds)
        used, took = cpu_seconds(term.pid) - start_cpu, time.monotonic() - start
        return used / took
    finally:
        term.close()


def info_cpu(gpuctl, env, runs):
    """CPU seconds of one whole `gpuctl info --json` (exec to exit), per run."""
    samples = []
    for _ in range(runs):
        child = subprocess.Popen([gpuctl, "info", "--json"], env=env, stdout=subprocess.DEVNULL)
        _, status, usage = os.wait4(child.pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        samples.append(usage.ru_utime + usage.ru_stime)
    return samples


def nvitop_bin():
    """nvitop from its cached virtual environment, installed on first use; or why not."""
    venv = os.environ.get("NVITOP_VENV",
                          os.path.expanduser(f"~/.cache/gpuctl/nvitop-{NVITOP_VERSION}"))
    binary = os.path.join(venv, "bin", "nvitop")
    if os.path.exists(binary):
        return binary, None
    try:
        subprocess.run([sys.executable, "-m", "venv", venv], check=True, capture_output=True)
        subprocess.run([os.path.join(venv, "bin", "pip"), "install", "-q",
                        f"nvitop=={NVITOP_VERSION}"], check=True, capture_output=True)
    except subprocess.CalledProcessError as error:
        return None, f"nvitop could not be installed: {error.stderr.decode().strip()[-200:]}"
    return binary, None


def main():
    bench_state.scratch()
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--processes", type=int, default=256)
    parser.add_argument("--info-runs", type=int, default=20)
    parser.add_argument("--no-nvitop", action="store_true")
    args = parser.parse_args()
    if shutil.which("tmux") is None:
        sys.exit("bench/top.py: tmux is not installed (apt-get install tmux)")
    gpuctl = os.path.join(TARGET, "gpuctl")
    sim = os.path.join(TARGET, "libnvml_sim.so")
    for path in (gpuctl, sim):
        if not os.path.exists(path):
            sys.exit(f"bench/top.py: {path} missing: cargo build --release -p gpuctl -p nvml-sim")

    scratch = tempfile.mkdtemp(prefix="gpuctl-bench-")
    libdir = os.path.join(scratch, "lib")
    os.mkdir(libdir)
    os.symlink(sim, os.path.join(libdir, "libnvidia-ml.so.1"))
    scenario = os.path.join(scratch, "scenario.toml")
    env = {"GPUCTL_NVML_LIB": sim, "NVML_SIM_SCENARIO": scenario,
           "NVML_SIM_STATE": os.path.join(scratch, "state.json"), "LD_LIBRARY_PATH": libdir,
           "GPUCTL_CONFIG": "/dev/null",
           "GPUCTL_STATE_DIR": os.path.join(scratch, "state"), "LANG": "C.UTF-8",
           "PATH": os.environ.get("PATH", "/usr/bin:/bin")}

    holder = ["sleep", "3600"]
    if os.geteuid() == 0:
        holder = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] + holder
    holders = [subprocess.Popen(holder) for _ in range(args.processes)]
    try:
        lines = ['driver_version = "570.133.20"', "cuda_driver_version = 12080"]
        gpu = ("[[gpu]]\nname = \"NVIDIA H200\"\nutilization_pct = 90\ntemperature_c = 60\n"
               "power_mw = 600000")
        lines += [gpu] * GPUS
        for i, p in enumerate(holders):
            lines.append(f"[[process]]\npid = {p.pid}\ngpu = {i % GPUS}\nused_mib = {1024 + i}\n"
                         "sm_pct = 50")
        with open(scenario, "w") as f:
            f.write("\n".join(lines) + "\n")
        run_env = dict(os.environ, **env)
        check = subprocess.run([gpuctl, "info", "--json"], env=run_env, capture_output=True,
                               text=True, check=True)
        assert check.stdout.count('"pid"') == args.processes, "not every process was reported"

        print(f"{GPUS} simulated GPUs, {args.processes} processes (uid "
              f"{65534 if os.geteuid() == 0 else os.geteuid()}), interval 1 s, "
              f"{args.seconds:.0f} s per run after a {WARM_UP:.0f} s warm-up, median of "
              f"{args.runs} runs, {os.cpu_count()} CPUs")
        info = statistics.median(info_cpu(gpuctl, run_env, args.info_runs))
        print(f"one `gpuctl info --json`, whole process: {info * 1000:.1f} ms CPU "
              f"(median of {args.info_runs})")

        top = [measure([gpuctl, "top", "--interval", "1"], env, args.seconds,
                       lambda s: "GPU 7" in s and "q quit" in s)
               for _ in range(args.runs)]
        share = statistics.median(top)
        per_refresh = share * 1.0  # one refresh a second
        print(f"gpuctl top:  {share * 100:.2f} % of a core (runs: "
              f"{', '.join(f'{s * 100:.2f}' for s in top)}); {per_refresh * 1000:.1f} ms CPU a "
              f"refresh, {per_refresh / info:.2f} of one `info --json`")

        if args.no_nvitop:
            return
        nvitop, why = nvitop_bin()
        if nvitop is None:
            print(f"nvitop:      not measured: {why}")
            return
        theirs = [measure([nvitop, "--interval", "1"], env, args.seconds,
                          lambda s: "NVITOP" in s and "Processes" in s)
                  for _ in range(args.runs)]
        median = statistics.median(theirs)
        print(f"nvitop {NVITOP_VERSION}: {median * 100:.2f} % of a core (runs: "
              f"{', '.join(f'{s * 100:.2f}' for s in theirs)}); gpuctl top / nvitop "
              f"{share / median:.2f}")
    finally:
        for p in holders:
            p.kill()
            p.wait()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
