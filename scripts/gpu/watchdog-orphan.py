#!/usr/bin/env python3
"""On a machine with an NVIDIA GPU: time gpuctl-watchdog reclaiming a real orphaned CUDA
worker, from its launcher's crash (SIGKILL) to the memory being free again. scripts/gpu/all
runs it (its `watchdog` check) under the shipped unit's capabilities, on nvml-sim too.

A launcher (its own session and process group) starts a worker that allocates --hold-mib
with PyTorch (scripts/gpu/holder.py) and then idles. The watchdog runs in the foreground, in
reclaim mode, with a short grace; with --unit-privileges, under the capabilities the shipped
systemd unit gives it (setpriv, as tests/hostile_protect.rs does). Once it has seen the run
healthy, the launcher is SIGKILLed; the worker is then an orphan whose parent was seen to
die, and is reclaimed after the grace. Reports the time to the watchdog's "reclaimed" line
and to nvidia-smi showing the memory free, against the bound grace + interval +
term_timeout + 1 s.

Changes no card setting. Acts only on the processes it starts: it refuses to run while any
other process holds GPU memory (the watchdog reclaims whatever it finds stale), and checks
afterwards that nothing else was reclaimed. Prints a report for docs/gpu-validation.md.

Usage: scripts/gpu/watchdog-orphan.py PATH/TO/gpuctl-watchdog [--hold-mib 4096] [--grace 3]
           [--unit-privileges]
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab  # noqa: E402

UNIT = os.path.join(lab.HERE, "..", "..", "systemd", "gpuctl-watchdog.service")


def unit_setpriv(path: str = UNIT) -> list:
    """setpriv's arguments for the privileges the unit gives the daemon (root stays root: the
    unit sets no User=). Lists add up; an empty assignment resets, as systemd merges them."""
    bounding, ambient, no_new_privs, securebits = [], [], False, []
    for line in open(path):
        key, _, value = line.strip().partition("=")
        names = [v.lower().removeprefix("cap_") for v in value.split()]
        if key == "CapabilityBoundingSet":
            bounding = bounding + names if names else []
        elif key == "AmbientCapabilities":
            ambient = ambient + names if names else []
        elif key == "NoNewPrivileges":
            no_new_privs = value.strip() in ("yes", "true", "1", "on")
        elif key == "SecureBits":
            securebits = securebits + [v.replace("-", "_") for v in value.split()] if value.split() else []

    def caps(names):
        return ",".join(["-all"] + [f"+{n}" for n in names])

    args = ["setpriv", f"--bounding-set={caps(bounding)}", f"--inh-caps={caps(ambient)}",
            f"--ambient-caps={caps(ambient)}"]
    if no_new_privs:
        args.append("--no-new-privs")
    if securebits:
        args.append("--securebits=" + ",".join(f"+{b}" for b in securebits))
    return args + ["--"]


def reclaimed_pids(log: str) -> list:
    """The pids of the log's "reclaimed" lines (journald fields, in any order)."""
    return [int(m.group(1)) for line in log.splitlines() if re.search(r"\bACTION=reclaimed\b", line)
            for m in [re.search(r"\bPID=(\d+)\b", line)] if m]


def write_config(directory: str, interval: float, grace: float, term_timeout: float, mode: str,
                 extra: str = "") -> str:
    config = os.path.join(directory, "gpuctl.toml")
    with open(config, "w") as f:
        f.write(f'[watchdog]\ninterval = "{int(interval * 1000)}ms"\ngrace = "{int(grace * 1000)}ms"\n'
                f'term_timeout = "{int(term_timeout * 1000)}ms"\nmode = "{mode}"\n'
                f'metrics_file = "{directory}/gpuctl.prom"\nstate_dir = "{directory}/state"\n{extra}')
    return config


def start_watchdog(watchdog: str, config: str, log_path: str, wrapper=()) -> subprocess.Popen:
    """The daemon in the foreground, not under systemd (no notify socket), its log in a file."""
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "JOURNAL_STREAM")}
    with open(log_path, "w") as log:
        return subprocess.Popen([*wrapper, watchdog, "--config", config], stderr=log, stdin=subprocess.DEVNULL,
                                env=env)


def stop(daemon: subprocess.Popen) -> None:
    daemon.terminate()
    try:
        daemon.wait(10)
    except subprocess.TimeoutExpired:
        daemon.kill()
        daemon.wait()


def reclaim(watchdog: str, hold_mib: int = 4096, grace: float = 3, interval: float = 0.5,
            term_timeout: float = 2, wrapper=()) -> dict:
    """Runs the orphan through the watchdog; returns the figures (seconds; None: not seen)."""
    others = lab.foreign_holders()
    if others:
        raise RuntimeError(f"other processes hold GPU memory ({others}): this check acts only on its own")
    with tempfile.TemporaryDirectory() as tmp:
        config = write_config(tmp, interval, grace, term_timeout, "reclaim")
        log_path = os.path.join(tmp, "watchdog.log")
        daemon = start_watchdog(watchdog, config, log_path, wrapper)
        launcher = lab.spawn_holder(0, "--workers", "1", "--worker-mib", str(hold_mib), start_new_session=True)
        worker = launcher.workers[0]
        bound = grace + interval + term_timeout + 1
        reclaimed_at = freed_at = None
        try:
            held = lab.compute_apps().get(worker)
            time.sleep(max(2 * interval, 1.5))  # seen healthy, parent alive
            crashed = time.monotonic()
            os.kill(launcher.pid, signal.SIGKILL)
            launcher.wait()
            # The "reclaimed" line comes once the daemon saw the memory back: wait for both.
            while time.monotonic() - crashed < bound + 30 and (freed_at is None or reclaimed_at is None):
                text = open(log_path).read()
                if reclaimed_at is None and worker in reclaimed_pids(text):
                    reclaimed_at = time.monotonic() - crashed
                if freed_at is None and worker not in lab.compute_apps():
                    freed_at = time.monotonic() - crashed
                time.sleep(0.05)
        finally:
            lab.end(worker, launcher)
            stop(daemon)
        text = open(log_path).read()
    foreign = [pid for pid in reclaimed_pids(text) if pid != worker]
    return {"worker": worker, "held_mib": held, "bound_s": bound, "reclaimed_s": reclaimed_at,
            "freed_s": freed_at, "foreign": foreign, "log": text,
            "ok": freed_at is not None and freed_at <= bound and not foreign}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("watchdog")
    parser.add_argument("--hold-mib", type=int, default=4096)
    parser.add_argument("--grace", type=float, default=3, help="seconds")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds")
    parser.add_argument("--term-timeout", type=float, default=2, help="seconds")
    parser.add_argument("--unit-privileges", action="store_true",
                        help="run the watchdog under the shipped unit's capabilities (setpriv; root only)")
    args = parser.parse_args()
    wrapper = unit_setpriv() if args.unit_privileges else []
    r = reclaim(args.watchdog, args.hold_mib, args.grace, args.interval, args.term_timeout, wrapper)

    def seconds(value):
        return "not seen" if value is None else f"{value:.2f}s"

    print(f"date {time.strftime('%Y-%m-%d')}, privileges: {' '.join(wrapper) or 'the caller’s'}")
    print(f"worker pid {r['worker']} held {r['held_mib']} MiB (nvidia-smi); grace {args.grace}s, interval "
          f"{args.interval}s, term_timeout {args.term_timeout}s: bound {r['bound_s']:.1f}s")
    print(f"crash -> watchdog 'reclaimed' line: {seconds(r['reclaimed_s'])}")
    print(f"crash -> memory free in nvidia-smi: {seconds(r['freed_s'])}")
    if r["foreign"]:
        print(f"WARNING: the watchdog reclaimed processes this script did not start: {r['foreign']}")
    print("watchdog log:")
    print(r["log"])
    return 0 if r["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
