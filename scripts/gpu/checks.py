"""The checks of scripts/gpu/all, one function each: `check_NAME()` returns a dict with
`status` ("passed", "failed", "not applicable"), `figure` (one line) and whatever else is
worth keeping. Each runs in a process of its own (scripts/gpu/all --check NAME), under a
timeout; every process it starts is one of its own (lab.spawn_holder, the daemons it
starts), ended before it returns. None changes a card setting.

In rehearsal the same functions run against nvml-sim; SIM_ONLY says, per check, what only
hardware can show.
"""

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import lab

PASSED, FAILED, NA = "passed", "failed", "not applicable"

# What the rehearsal cannot show, per check: the summary says it after the figure.
SIM_ONLY = {
    "info": "real NVML's figures and timings, CUDA contexts' own memory",
    "reclaim-kill": "how long the driver takes to free a real context",
    "reclaim-clear": "how long the driver takes to free real contexts",
    "watchdog": "a real orphan's empty utilization samples; the driver's release time",
    "holders": "the driver mapping /dev/nvidia* into CUDA processes (here: plain files held open)",
    "health": "what a real driver answers for the recovery-action field and Xid registration",
    "run": "CUDA honouring CUDA_VISIBLE_DEVICES=UUID (here the holder registers on the GPU it names)",
    "idle": "what nvmlDeviceGetProcessUtilization returns for real busy and idle contexts",
    "py-oom": "a real CUDA OOM (here OOMRecovery's injected one)",
    "py-runguard": "real CUDA workers' memory coming back",
    "py-explain": "torch's real OOM message and allocator figures",
    "py-estimate": "max_memory_allocated (CUDA only)",
    "trainer": "a real CUDA OOM under --memory-fraction (here --inject-oom-above)",
    "top": "a real context's memory coming back after the view ends it",
    "metrics": "real NVML's figures in the textfile",
    "nvml-wrapper": "the real driver's pass/fail set",
    "mig": "a card partitioned by its admin (never changed here)",
}

ORDER = ["info", "reclaim-kill", "reclaim-clear", "watchdog", "holders", "health", "run", "idle", "py-oom",
         "py-runguard", "py-explain", "py-estimate", "trainer", "top", "metrics", "nvml-wrapper", "mig", "mps", "xid"]

# Seconds each may take (the runner also keeps the whole under its budget).
TIMEOUT = {"info": 60, "reclaim-kill": 45, "reclaim-clear": 60, "watchdog": 60, "holders": 30, "health": 30,
           "run": 45, "idle": 45, "py-oom": 60, "py-runguard": 60, "py-explain": 45, "py-estimate": 60,
           "trainer": 150, "top": 45, "metrics": 30, "nvml-wrapper": 90, "mig": 30, "mps": 5, "xid": 5}


def result(ok: bool, figure: str, **more) -> dict:
    return {"status": PASSED if ok else FAILED, "figure": figure, **more}


def script(name: str):
    """One of the scripts beside this file (their names have dashes) as a module."""
    path = os.path.join(lab.HERE, name)
    spec = importlib.util.spec_from_file_location(name.replace("-", "_").removesuffix(".py"), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gpu0_uuid() -> str:
    return lab.smi("index,uuid")[0][1]


def check_info() -> dict:
    compare = script("info-vs-nvidia-smi.py")
    amounts = [4096, 1024]
    holders = [lab.spawn_holder(mib) for mib in amounts]
    try:
        time.sleep(1)
        r = compare.compare(lab.binary("gpuctl"), [(h.pid, mib) for h, mib in zip(holders, amounts)])
        t = compare.timings(lab.binary("gpuctl"), 20)
    finally:
        lab.end(*holders)
    pynvml = f"{t['pynvml_ms']:.1f}" if t["pynvml_ms"] else "n/a"
    figure = (f"{r['compared'] - len(r['mismatches'])}/{r['compared']} figures agree; median of 20: info --json "
              f"{t['gpuctl_info_json_ms']:.1f} ms, nvidia-smi --query-compute-apps "
              f"{t['nvidia_smi_compute_apps_ms']:.1f} ms, pynvml (a python process) {pynvml} ms")
    return result(not r["mismatches"], figure, mismatches=r["mismatches"], lines=r["lines"], timings=t)


def crashed_run(workers: int = 2, mib: int = 1024):
    """A launcher (own session) with `workers` CUDA workers, SIGKILLed: the workers are
    orphans of a crashed run. Returns (worker pids, monotonic time of the crash)."""
    others = lab.foreign_holders()
    if others:
        raise RuntimeError(f"other processes hold GPU memory ({others}): this check acts only on its own")
    launcher = lab.spawn_holder(0, "--workers", str(workers), "--worker-mib", str(mib), start_new_session=True)
    time.sleep(0.5)
    crashed = time.monotonic()
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    return launcher.workers, crashed


def freed(pids) -> bool:
    apps = lab.compute_apps()
    return not any(pid in apps for pid in pids)


def check_reclaim_kill() -> dict:
    workers, crashed = crashed_run()
    try:
        argv = [lab.binary("gpuctl"), "kill", "--json", "--timeout", "5s"]
        for pid in workers:
            argv += ["--pid", str(pid)]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        exited = time.monotonic() - crashed
        free_at = lab.wait_until(lambda: freed(workers), 15)
    finally:
        lab.end(*workers)
    ok = out.returncode == 0 and free_at is not None
    return result(ok, f"kill --pid x2: exit {out.returncode}, crash -> kill done {exited:.2f} s, memory free in "
                      f"nvidia-smi {exited + (free_at or 0):.2f} s", stderr=out.stderr[-2000:], stdout=out.stdout[-4000:])


def check_reclaim_clear() -> dict:
    workers, crashed = crashed_run()
    try:
        out = subprocess.run([lab.binary("gpuctl"), "clear", "--wait=30s", "--gpu", "0", "--json", "--timeout", "5s"],
                             capture_output=True, text=True, timeout=50)
        exited = time.monotonic() - crashed
        free_at = lab.wait_until(lambda: freed(workers), 15)
    finally:
        lab.end(*workers)
    acted = sorted({int(p) for p in re.findall(r'"pid":\s*(\d+)', out.stdout)})
    foreign = [pid for pid in acted if pid not in workers]
    ok = out.returncode == 0 and free_at is not None and not foreign
    figure = f"clear --wait: exit {out.returncode}, crash -> GPU free (clear returned) {exited:.2f} s"
    if foreign:
        figure += f"; named processes it did not start: {foreign}"
    return result(ok, figure, stderr=out.stderr[-2000:], stdout=out.stdout[-4000:])


def check_watchdog() -> dict:
    orphan = script("watchdog-orphan.py")
    if os.geteuid() != 0:
        return {"status": FAILED, "figure": "not root: setpriv cannot give the unit's capabilities"}
    r = orphan.reclaim(lab.binary("gpuctl-watchdog"), hold_mib=2048, wrapper=orphan.unit_setpriv())
    seen = lambda v: "not seen" if v is None else f"{v:.2f} s"  # noqa: E731
    return result(r["ok"], f"under the unit's capabilities: crash -> 'reclaimed' {seen(r['reclaimed_s'])}, -> memory "
                           f"free {seen(r['freed_s'])} (bound {r['bound_s']:.1f} s)", log=r["log"][-4000:])


OPENER = "import os, sys, time; f = open(sys.argv[1], 'rb'); print('ready', flush=True); time.sleep(3600)"


def check_holders() -> dict:
    dev = os.environ.get("GPUCTL_DEV_DIR", "/dev")
    holder = lab.spawn_holder(1024)
    # A process that opens the device file without a context: what NVML does not list.
    opener = subprocess.Popen([sys.executable, "-c", OPENER, os.path.join(dev, "nvidia0")], stdout=subprocess.PIPE,
                              text=True)
    try:
        opener.stdout.readline()
        doc = lab.gpuctl_json("info", "--holders", "--gpu", "0")
    finally:
        lab.end(holder, opener)
    dev0 = doc["devices"][0]
    held = {h["pid"]: h for h in dev0.get("holders", [])}
    listed = {p["pid"] for p in dev0["processes"]}
    problems = []
    if "holders" not in dev0:
        problems.append(f"no scan: {dev0.get('holders_not_scanned')}")
    if opener.pid not in held:
        problems.append(f"the plain opener {opener.pid} not found")
    if holder.pid in held:
        problems.append(f"the CUDA holder {holder.pid}, listed by NVML, reported as an unlisted holder")
    if holder.pid not in listed:
        problems.append(f"the CUDA holder {holder.pid} not listed")
    suspect = held.get(opener.pid, {}).get("suspect")
    return result(not problems, f"CUDA holder listed (not an unlisted holder), plain opener of nvidia0 found "
                                f"({suspect}); {len(held)} unlisted holder(s) in all" + "".join(f"; {p}" for p in problems),
                  holders=list(held.values()))


def smi_q(sections: str) -> dict:
    """`nvidia-smi -q -d SECTIONS -i 0` as {"Section/Key": value} (two levels of indentation)."""
    out = subprocess.run(["nvidia-smi", "-q", "-d", sections, "-i", "0"], capture_output=True, text=True,
                         timeout=30).stdout
    fields, path = {}, []
    for line in out.splitlines():
        if not line.strip() or ":" not in line and not line.startswith(" "):
            continue
        depth = (len(line) - len(line.lstrip())) // 4
        key, _, value = line.strip().partition(":")
        path = path[:depth] + [key.strip()]
        if value.strip():
            fields["/".join(path)] = value.strip()
    return fields, out


def check_health() -> dict:
    doc = lab.gpuctl_json("health", "--gpu", "0", check=False)
    gpu = doc["gpus"][0] if "gpus" in doc else doc["devices"][0]
    readings = gpu.get("readings") or {}
    fields, text = smi_q("ECC,ROW_REMAPPER,PERFORMANCE")
    pairs = []
    rows = readings.get("remapped_rows") or {}

    def smi_field(*names):
        for key, value in fields.items():
            if all(n.lower() in key.lower() for n in names):
                return value
        return None

    for ours, theirs in ((rows.get("correctable"), smi_field("Remapped Rows", "Correctable Error")),
                         (rows.get("uncorrectable"), smi_field("Remapped Rows", "Uncorrectable Error")),
                         ((readings.get("ecc") or {}).get("volatile_corrected"), smi_field("Volatile", "DRAM Correctable")),
                         ((readings.get("ecc") or {}).get("volatile_uncorrected"),
                          smi_field("Volatile", "DRAM Uncorrectable"))):
        if ours is not None and theirs is not None and theirs.isdigit():
            pairs.append((ours, int(theirs)))
    differ = [p for p in pairs if p[0] != p[1]]
    ok = gpu.get("action") is not None and not differ
    return result(ok, f"action {gpu.get('action')}; {len(pairs) - len(differ)}/{len(pairs)} ECC/remap counts agree "
                      f"with nvidia-smi -q; recovery-action field: {readings.get('recovery_action')!r}",
                  health=gpu, nvidia_smi=text[-6000:])


def check_run() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        env = dict(os.environ, GPUCTL_LEASE_DIR=os.path.join(tmp, "leases"))
        run = subprocess.Popen([lab.binary("gpuctl"), "run", "--gpus", "1", "--", lab.python(), lab.HOLDER, "--mib",
                                "1024", "--workers", "1", "--worker-mib", "512", "--detach-workers", "--exit-after",
                                "3", "--report", report], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
        if lab.wait_until(lambda: os.path.exists(report), 30) is None:
            run.kill()
            return result(False, "the command under gpuctl run never started")
        time.sleep(0.3)
        facts = json.load(open(report))
        placed = {int(pid): uuid for pid, uuid in lab.smi("pid,gpu_uuid", "compute-apps")}
        out, err = run.communicate(timeout=30)
        ours = [facts["pid"], *facts["workers"]]
        left = [pid for pid in facts["workers"] if os.path.exists(f"/proc/{pid}")]
        lab.end(*left)
    leased = facts["cuda_visible_devices"]
    where = {pid: placed.get(pid) for pid in ours}
    problems = [f"pid {pid} on {uuid}" for pid, uuid in where.items() if uuid != leased]
    if left:
        problems.append(f"worker {left} left alive")
    ok = run.returncode == 0 and not problems
    return result(ok, f"exit {run.returncode}; command and worker on the leased {leased} only; the detached worker "
                      f"{'ended' if not left else 'NOT ended'}" + "".join(f"; {p}" for p in problems), stderr=err[-3000:])


UTILIZATION = """
import json, sys
try:
    import pynvml
except ImportError as error:
    sys.exit(f"pynvml (nvidia-ml-py) not importable: {error}")
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
try:
    samples = pynvml.nvmlDeviceGetProcessUtilization(h, 0)
    print(json.dumps({str(s.pid): s.smUtil for s in samples}))
except pynvml.NVMLError as error:
    print(json.dumps({"error": str(error)}))
"""


def check_idle() -> dict:
    orphan = script("watchdog-orphan.py")
    with tempfile.TemporaryDirectory() as tmp:
        config = orphan.write_config(tmp, 0.5, 3600, 2, "report", '[idle]\nafter = "2s"\nmin_memory = "256MiB"\n'
                                                                     'util_below = 1\naction = "report"\n')
        daemon = orphan.start_watchdog(lab.binary("gpuctl-watchdog"), config, os.path.join(tmp, "log"))
        busy = lab.spawn_holder(1024, "--busy")
        idle = lab.spawn_holder(1024)
        try:
            env = dict(os.environ, GPUCTL_CONFIG=config)

            def idle_pids():
                doc = json.loads(subprocess.run([lab.binary("gpuctl"), "info", "--idle", "--json"], env=env,
                                                capture_output=True, text=True, timeout=30).stdout)
                return {p["pid"] for d in doc["devices"] for p in d["processes"]}

            found = lab.wait_until(lambda: idle.pid in idle_pids(), 20, 0.5)
            marked = idle_pids()
            query = subprocess.run([lab.python(), "-c", UTILIZATION], capture_output=True, text=True, timeout=30)
            samples = json.loads(query.stdout) if query.returncode == 0 else {"error": query.stderr.strip()[-300:]}
        finally:
            lab.end(busy, idle)
            orphan.stop(daemon)
    util = {"busy": samples.get(str(busy.pid)), "idle": samples.get(str(idle.pid))}
    ok = found is not None and busy.pid not in marked and "error" not in samples
    if "error" in samples:
        return result(False, f"nvmlDeviceGetProcessUtilization: {samples['error']}")
    return result(ok, f"process utilization: busy {util['busy']}%, idle {util['idle'] if util['idle'] is not None else 'no sample'}"
                      f"; idle one found {'after %.1f s' % found if found is not None else 'NOT'}"
                      f"{', busy one marked too' if busy.pid in marked else ''}", samples=samples)


def wheel(name: str) -> dict:
    out = subprocess.run([lab.python(), os.path.join(lab.HERE, "wheel_checks.py"), name], capture_output=True,
                         text=True, timeout=300)
    if out.returncode != 0 or not out.stdout.strip():
        return result(False, f"exit {out.returncode}: {(out.stderr.strip().splitlines() or ['no output'])[-1]}",
                      stderr=out.stderr[-3000:])
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return result(r.pop("ok"), r.pop("figure"), **r)


def check_trainer() -> dict:
    binary = lab.binary("gpuctl-trainer")
    if not os.path.exists(binary):
        return result(False, f"{binary} is missing (scripts/gpu/bundle builds it)")
    with tempfile.TemporaryDirectory() as tmp:
        figures = os.path.join(tmp, "oom.json")
        argv = [lab.python(), os.path.join(lab.HERE, "trainer.py"), binary, "--oom-only", "--json", figures]
        if lab.sim():
            argv += ["--device", "cpu", "--steps", "4"]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        if out.returncode != 0 or not os.path.exists(figures):
            return result(False, f"exit {out.returncode}: {(out.stderr.strip().splitlines() or ['no output'])[-1]}",
                          stderr=out.stderr[-3000:])
        r = json.load(open(figures))
    ok = r["recoveries"] >= 1 and r["relative_difference"] < 1e-4
    return result(ok, f"{' '.join(r['cap'])}: {r['recoveries']} recoveries, micro-batch {r['micro_batch'][0]} -> "
                      f"{r['micro_batch'][1]}, parameters vs unconstrained {r['relative_difference']:.1e}", report=out.stdout)


class Tmux:
    """A tmux server of our own (its socket in a temp directory)."""

    def __init__(self, directory: str):
        self.tmux = shutil.which("tmux") or lab.binary("tmux")
        self.socket = os.path.join(directory, "tmux.sock")
        self.env = dict(os.environ, LANG="C.UTF-8")
        if not shutil.which("tmux"):  # the bundle's, with the libraries it carries
            bundled = os.path.join(lab.binary(""), "..", "lib")
            self.env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (bundled, os.environ.get("LD_LIBRARY_PATH")) if p)

    def __call__(self, *args) -> str:
        return subprocess.run([self.tmux, "-u", "-S", self.socket, *args], capture_output=True, text=True,
                              timeout=10, env=self.env).stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "top")

    def wait_text(self, text: str, timeout: float = 10):
        return lab.wait_until(lambda: text in self.screen(), timeout, 0.1)


def check_top() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tmux = Tmux(tmp)
        if not os.path.exists(tmux.tmux):
            return result(False, "no tmux here (nor in the bundle)")
        holder = lab.spawn_holder(1024)
        try:
            tmux("new-session", "-d", "-s", "top", "-x", "120", "-y", "32", lab.binary("gpuctl"), "top")
            steps = []
            if tmux.wait_text(str(holder.pid)) is None:
                steps.append("its row never showed")
            else:
                tmux("send-keys", "-t", "top", "/")
                tmux("send-keys", "-t", "top", "-l", str(holder.pid))
                tmux("send-keys", "-t", "top", "Enter")
                tmux.wait_text(f"filter: {holder.pid}")
                tmux("send-keys", "-t", "top", "k")
                if tmux.wait_text("end processes: the plan") is None or f"pid {holder.pid} " not in tmux.screen():
                    steps.append("no plan naming it")
                tmux("send-keys", "-t", "top", "y")
                start = time.monotonic()
                back = tmux.wait_text("of GPU memory back", 20)
                gone = lab.wait_until(lambda: holder.pid not in lab.compute_apps(), 15)
                took = time.monotonic() - start
                if back is None:
                    steps.append("no 'memory back' line")
                if gone is None:
                    steps.append("still on the GPU")
            last = tmux.screen()
            tmux("send-keys", "-t", "top", "q")
        finally:
            tmux("kill-server")
            lab.end(holder)
    ok = not steps
    return result(ok, (f"filtered, k, y: ended, its memory back in {took:.2f} s" if ok else "; ".join(steps)),
                  screen=last)


def check_metrics() -> dict:
    orphan = script("watchdog-orphan.py")
    holder = lab.spawn_holder(2048)
    with tempfile.TemporaryDirectory() as tmp:
        config = orphan.write_config(tmp, 0.5, 3600, 2, "report")
        daemon = orphan.start_watchdog(lab.binary("gpuctl-watchdog"), config, os.path.join(tmp, "log"))
        prom = os.path.join(tmp, "gpuctl.prom")
        try:
            lab.wait_until(lambda: os.path.exists(prom), 15, 0.2)
            time.sleep(1.2)  # a poll with the holder in it
            text = open(prom).read() if os.path.exists(prom) else ""
            smi = {uuid: int(used) for uuid, used in lab.smi("uuid,memory.used")}
        finally:
            lab.end(holder)
            orphan.stop(daemon)
    used = {m.group(1): int(float(m.group(2))) // lab.MIB for m in
            re.finditer(r'^gpuctl_gpu_memory_used_bytes\{[^}]*uuid="([^"]+)"[^}]*\} (\S+)', text, re.M)}
    differ = {u: (used.get(u), v) for u, v in smi.items() if used.get(u) is None or abs(used[u] - v) > max(2, v // 100)}
    names = sorted({line.split("{")[0].split()[0] for line in text.splitlines() if line and not line.startswith("#")})
    ok = bool(text) and not differ
    return result(ok, f"{len(names)} metric families; gpuctl_gpu_memory_used_bytes agrees with nvidia-smi on "
                      f"{len(smi) - len(differ)}/{len(smi)} GPUs" + (f"; differ: {differ}" if differ else ""),
                  metrics=text[-6000:])


# nvml-wrapper's tests that change a setting (MIG mode, thresholds, LEDs, NvLink counters,
# vGPU): never run, on any machine.
SETTING_TESTS = re.compile(r"(^|::)(set_|reset|clear|enable|disable)|error_counter|utilization_control|"
                           r"encoder_capacity|^unit::test::info$")


def check_nvml_wrapper() -> dict:
    binary = os.environ.get("GPUCTL_LAB_NVML_WRAPPER_TESTS", "")
    if not os.path.exists(binary):
        return result(False, f"nvml-wrapper's test binary {binary!r} is missing (scripts/gpu/bundle builds it)")
    listed = subprocess.run([binary, "--list", "--include-ignored"], capture_output=True, text=True, timeout=30).stdout
    names = [line.removesuffix(": test") for line in listed.splitlines() if line.endswith(": test")]
    run = [n for n in names if not SETTING_TESTS.search(n)]
    out = subprocess.run([binary, "--include-ignored", "--exact", "--test-threads", "4", *run], capture_output=True,
                         text=True, timeout=80, env=dict(os.environ, RUST_BACKTRACE="0"))
    outcome = dict(re.findall(r"^test (\S+)(?: - should panic)? \.\.\. (ok|FAILED|ignored)", out.stdout, re.M))
    passed = sorted(n for n, o in outcome.items() if o == "ok")
    failed = sorted(n for n, o in outcome.items() if o == "FAILED")
    record = os.path.join(os.environ["GPUCTL_LAB_OUT"], "nvml-wrapper-tests.txt")
    with open(record, "w") as f:
        for name in names:
            f.write(f"{name} {outcome.get(name, 'not-run-changes-a-setting' if name not in run else 'no-result')}\n")
    # The suite's failures are the record (what this driver answers), not the check's.
    complete = len(outcome) == len(run)
    return result(complete, f"{len(passed)} passed, {len(failed)} failed, {len(names) - len(run)} not run (they change "
                            f"a setting) of {len(names)}; each in nvml-wrapper-tests.txt"
                            + ("" if complete else f"; only {len(outcome)} of {len(run)} reported"), failed=failed)


def check_mig() -> dict:
    rows = lab.smi("index,uuid,mig.mode.current")
    enabled = [(index, uuid) for index, uuid, mode in rows if mode == "Enabled"]
    if not enabled:
        return {"status": NA, "figure": "no GPU has MIG enabled (its mode is never changed here)"}
    listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    theirs = set(re.findall(r"UUID: (MIG-[0-9a-f-]+)", listing))
    doc = lab.gpuctl_json("info")
    ours = {m["uuid"] for d in doc["devices"] for m in d.get("mig_devices", [])}
    ok = theirs == ours
    return result(ok, f"{len(enabled)} MIG GPU(s): {len(ours & theirs)}/{len(theirs)} MIG devices of nvidia-smi -L "
                      f"in gpuctl info" + ("" if ok else f"; nvidia-smi only {sorted(theirs - ours)}, gpuctl only "
                                                         f"{sorted(ours - theirs)}"))


def check_mps() -> dict:
    return {"status": NA, "figure": "not run: waits for issue 49 (MPS) to land"}


def check_xid() -> dict:
    return {"status": NA, "figure": "not run: waits for issue 48 (Xid culprit) to land"}


CHECKS = {
    "info": check_info, "reclaim-kill": check_reclaim_kill, "reclaim-clear": check_reclaim_clear,
    "watchdog": check_watchdog, "holders": check_holders, "health": check_health, "run": check_run,
    "idle": check_idle, "py-oom": lambda: wheel("oom"), "py-runguard": lambda: wheel("runguard"),
    "py-explain": lambda: wheel("explain"), "py-estimate": lambda: wheel("estimate"), "trainer": check_trainer,
    "top": check_top, "metrics": check_metrics, "nvml-wrapper": check_nvml_wrapper, "mig": check_mig,
    "mps": check_mps, "xid": check_xid,
}
assert list(CHECKS) == ORDER
