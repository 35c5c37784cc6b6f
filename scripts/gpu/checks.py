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
    "watchdog-cpu": "what real NVML's calls cost the loop (here the sim's, in a debug build)",
    "nvml-wrapper": "the real driver's pass/fail set",
    "mig": "a card partitioned by its admin (never changed here)",
    "mps": "NVIDIA's server holding a real context, its clients' memory as the driver counts it under MPS (here a "
           "stand-in server; the real control daemon runs without one)",
    "xid": "the driver's own NVRM lines and /dev/kmsg's permissions there (read only; an Xid is never provoked)",
}

ORDER = ["info", "reclaim-kill", "reclaim-clear", "watchdog", "holders", "health", "run", "idle", "py-oom",
         "py-runguard", "py-explain", "py-estimate", "trainer", "top", "metrics", "watchdog-cpu", "nvml-wrapper",
         "mig", "mps", "xid"]

# Seconds each may take (the runner also keeps the whole under its budget).
TIMEOUT = {"info": 60, "reclaim-kill": 45, "reclaim-clear": 60, "watchdog": 60, "holders": 30, "health": 30,
           "run": 45, "idle": 45, "py-oom": 60, "py-runguard": 60, "py-explain": 45, "py-estimate": 60,
           "trainer": 150, "top": 45, "metrics": 30, "watchdog-cpu": 90, "nvml-wrapper": 90, "mig": 30, "mps": 60,
           "xid": 45}


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


def bench_watchdog():
    """bench/watchdog.py as a module: its reading of the daemon's CPU a loop is the one this
    check takes (the whole tree is carried to the GPU machine)."""
    bench = os.path.join(lab.HERE, os.pardir, os.pardir, "bench")
    sys.path.insert(0, bench)  # for its bench_state
    spec = importlib.util.spec_from_file_location("bench_watchdog", os.path.join(bench, "watchdog.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def watchdog_cpu_per_loop(seconds: float):
    """The watchdog in the foreground at a 100 ms interval, reporting only, with the shipped
    defaults (health readings and idle accounting on): its CPU time a loop over `seconds`
    after its first second, read as bench/watchdog.py reads it on the sim. None if it wrote
    no metrics."""
    bench, orphan = bench_watchdog(), script("watchdog-orphan.py")
    with tempfile.TemporaryDirectory() as tmp:
        config = orphan.write_config(tmp, 0.1, 3600, 2, "report")
        daemon = orphan.start_watchdog(lab.binary("gpuctl-watchdog"), config, os.path.join(tmp, "log"))
        prom = os.path.join(tmp, "gpuctl.prom")
        try:
            if lab.wait_until(lambda: bench.loops(prom) >= 1, 15, 0.1) is None:
                return None
            time.sleep(1)
            (loops0, cpu0, nvml0), at0 = bench.next_loops(prom, daemon.pid), time.monotonic()
            time.sleep(seconds)
            (loops1, cpu1, nvml1), at1 = bench.next_loops(prom, daemon.pid), time.monotonic()
        finally:
            orphan.stop(daemon)
    loops = loops1 - loops0
    return {"loops": loops, "cpu_ms_per_loop": (cpu1 - cpu0) * 1000 / loops,
            "nvml_ms_per_loop": (nvml1 - nvml0) * 1000 / loops, "pace": loops / ((at1 - at0) / 0.1)}


def check_watchdog_cpu() -> dict:
    """The watchdog's CPU a loop with no process of ours and with 8 CUDA workers on GPU 0:
    what the driver's calls cost (the NVML thread's CPU), against the same shape on the sim
    (bench/watchdog.py prints the sim's share of the loop the same way)."""
    seconds, workers = 5, 8
    empty = watchdog_cpu_per_loop(seconds)
    launcher = lab.spawn_holder(0, "--workers", str(workers), "--worker-mib", "256")
    try:
        held = watchdog_cpu_per_loop(seconds)
    finally:
        lab.end(launcher, *launcher.workers)
    if empty is None or held is None:
        return result(False, "the watchdog wrote no metrics file, or counted no loop, within the check")
    gpus = len(lab.smi("index"))
    pace = min(empty["pace"], held["pace"])
    per_process = (held["cpu_ms_per_loop"] - empty["cpu_ms_per_loop"]) / workers * 1000
    # A loop that cannot keep its 100 ms interval on the driver is a finding in itself.
    return result(pace >= 0.8, f"CPU a loop at 100 ms, {gpus} GPU(s): {empty['cpu_ms_per_loop']:.2f} ms with no "
                               f"process of ours, {held['cpu_ms_per_loop']:.2f} ms with {workers} CUDA workers on GPU 0 "
                               f"({per_process:.0f} µs a process); of them the NVML thread (the driver's "
                               f"calls) {empty['nvml_ms_per_loop']:.2f} and {held['nvml_ms_per_loop']:.2f} ms; "
                               f"{pace:.0%} of the loops the interval asks",
                  empty=empty, held=held)


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


def mps_control():
    """NVIDIA's control daemon: the machine's (it must match the driver); in rehearsal the
    535 one scripts/fetch-mps caches. Returns (path or None, why not)."""
    if not lab.sim():
        found = shutil.which("nvidia-cuda-mps-control")
        return found, None if found else "no nvidia-cuda-mps-control on PATH"
    try:
        out = subprocess.run([os.path.join(lab.HERE, "..", "fetch-mps")], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return None, "scripts/fetch-mps took over 20 s"
    return (out.stdout.strip(), None) if out.returncode == 0 else (None, out.stderr.strip()[-200:])


class MpsDaemon:
    """nvidia-cuda-mps-control -f, a child of ours: its pipe directory in a scratch directory
    of its own (the control socket's path must stay short), its log in the run's output.
    Nothing of the machine's MPS (/tmp/nvidia-mps) is touched, nor the compute mode."""

    def __init__(self, program: str):
        self.program = program
        self.pipe = tempfile.mkdtemp(prefix="gpulab-mps-")
        self.log = os.path.join(os.environ.get("GPUCTL_LAB_OUT", self.pipe), "mps-log")
        os.makedirs(self.log, exist_ok=True)
        self.env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CUDA_MPS_PIPE_DIRECTORY": self.pipe,
                    "CUDA_MPS_LOG_DIRECTORY": self.log}
        with open(os.path.join(self.log, "foreground.log"), "w") as out:
            self.child = subprocess.Popen([program, "-f"], env=self.env, stdin=subprocess.DEVNULL, stdout=out,
                                          stderr=subprocess.STDOUT)
        lab.track(self.child.pid)
        if lab.wait_until(lambda: os.path.exists(os.path.join(self.pipe, "control")), 10) is None:
            self.quit()
            raise RuntimeError(f"{program} -f made no control pipe in 10 s: {self.log_text()[-300:]!r}")

    def servers(self) -> dict:
        """The servers it started (its children): pid -> start time, each tracked for the
        runner's cleanup."""
        found = {}
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                fields = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[1]) == self.child.pid:
                found[int(entry)] = fields[19]
                lab.track(int(entry))
        return found

    def quit(self) -> str:
        """`echo quit | nvidia-cuda-mps-control`, as docs/guide/mps.md says; whatever of it is
        left after 15 s is ended by pid (a server only while it is still the same process).
        Says how it went."""
        servers = self.servers()
        try:
            subprocess.run([self.program], input="quit\n", env=self.env, capture_output=True, text=True, timeout=10)
            self.child.wait(15)
            how = "quit cleanly"
        except subprocess.TimeoutExpired:
            how = "did not quit in 15 s: SIGKILLed"
            lab.end(self.child)
        for pid, ticks in servers.items():
            if lab.start_ticks(pid) == ticks:
                lab.end(pid)
                how += f"; its server {pid} SIGKILLed"
        shutil.rmtree(self.pipe, ignore_errors=True)
        return how

    def log_text(self) -> str:
        paths = [os.path.join(self.log, name) for name in ("control.log", "foreground.log")]
        return "".join(open(p, errors="replace").read() for p in paths if os.path.exists(p))


def sim_mps_server(directory: str) -> subprocess.Popen:
    """Rehearsal: a stand-in named nvidia-cuda-mps-server (NVIDIA's needs a GPU), listed as
    GPU 0's MPS server holding 300 MiB of its own."""
    name = os.path.join(directory, "nvidia-cuda-mps-server")
    os.symlink(shutil.which("sleep"), name)
    server = subprocess.Popen([name, "3600"])
    lab.track(server.pid)
    lab.register(server.pid, 300, mps="server")
    return server


def compare_mps(expected: dict) -> list:
    """`gpuctl info --json` next to nvidia-smi's compute apps for {pid: role}: each of them
    a row with its MPS role and the memory nvidia-smi gives it, and marked so in the table."""
    doc = lab.gpuctl_json("info", "--gpu", "0")
    rows = {p["pid"]: p for d in doc["devices"] for p in d["processes"]}
    apps = lab.compute_apps()
    problems = []
    for pid, role in expected.items():
        row = rows.get(pid)
        if row is None:
            problems.append(f"{role} {pid} not in gpuctl info")
            continue
        if row.get("mps") != role:
            problems.append(f"{role} {pid} has mps {row.get('mps')!r}")
        used = row.get("used_bytes")
        if apps.get(pid) is None or used is None or used // lab.MIB != apps[pid]:
            problems.append(f"{role} {pid}: gpuctl {used and used // lab.MIB} MiB, nvidia-smi {apps.get(pid)} MiB")
    table = subprocess.run([lab.binary("gpuctl"), "info", "--gpu", "0"], capture_output=True, text=True,
                           timeout=60).stdout
    marked = sum(line.split()[:1] == [str(pid)] and f"[MPS {role}]" in line
                 for line in table.splitlines() for pid, role in expected.items())
    if marked != len(expected):
        problems.append(f"{marked}/{len(expected)} table rows marked [MPS server]/[MPS client]")
    return problems


def check_mps() -> dict:
    program, why = mps_control()
    if program is None and not lab.sim():
        return {"status": NA, "figure": f"{why}: MPS is not installed here"}
    scratch = tempfile.mkdtemp(prefix="gpulab-mps-server-")
    daemon = MpsDaemon(program) if program else None
    started, quit_how = [], None
    try:
        pipe = daemon.pipe if daemon else scratch
        env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=pipe, CUDA_MPS_LOG_DIRECTORY=daemon.log if daemon else pipe)
        server = sim_mps_server(scratch) if lab.sim() else None
        started += [server] if server else []
        clients = [lab.spawn_holder(mib, env=env) for mib in (1024, 512)]
        started += clients
        servers = [server.pid] if server else list(daemon.servers())
        time.sleep(1)
        expected = {**{pid: "server" for pid in servers}, **{c.pid: "client" for c in clients}}
        problems = compare_mps(expected) if servers else ["the daemon started no server for its clients"]
    finally:
        lab.end(*started)
        quit_how = daemon.quit() if daemon else None
        shutil.rmtree(scratch, ignore_errors=True)
    control = f"control daemon {program} -f {quit_how}" if daemon else f"no control daemon here ({why})"
    figure = (f"{len(servers)} server + {len(clients)} clients: {len(expected) - len(problems)}/{len(expected)} rows "
              f"with their MPS role and nvidia-smi's memory; {control}" + "".join(f"; {p}" for p in problems))
    return result(not problems and (daemon is None or quit_how == "quit cleanly"), figure,
                  daemon_log=daemon.log_text()[-4000:] if daemon else None)


def nvrm_lines(last: int = 5):
    """The kernel log's last NVRM lines: /dev/kmsg read to its end without blocking, else
    `dmesg`. Returns (lines, where from), or (None, why neither could be read)."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError as error:
        kmsg_error = f"/dev/kmsg: {error.strerror}"
    else:
        records = []
        try:
            while True:
                try:
                    records.append(os.read(fd, 8192).decode(errors="replace"))
                except BlockingIOError:
                    break
                except BrokenPipeError:  # a record overwritten as we read: read on
                    continue
        finally:
            os.close(fd)
        lines = [r.split(";", 1)[-1].splitlines()[0] for r in records if "NVRM" in r]
        return lines[-last:], "/dev/kmsg"
    out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10)
    if out.returncode != 0:
        return None, f"{kmsg_error}; dmesg: {out.stderr.strip()[-200:]}"
    return [line for line in out.stdout.splitlines() if "NVRM" in line][-last:], "dmesg"


def watch_xids(directory: str, kernel_log=None) -> tuple:
    """The watchdog in the foreground, reporting only, its kernel-log reader on `kernel_log`
    (None: its default, /dev/kmsg). Returns (daemon, config, log path) once it watches Xids."""
    orphan = script("watchdog-orphan.py")
    config = orphan.write_config(directory, 0.2, 3600, 2, "report")
    log_path = os.path.join(directory, "watchdog.log")
    env = {k: v for k, v in os.environ.items() if k != "GPUCTL_KERNEL_LOG"}
    if kernel_log:
        env.update(GPUCTL_KERNEL_LOG=kernel_log, NVML_SIM_KERNEL_LOG=kernel_log)
    with open(log_path, "w") as log:
        daemon = subprocess.Popen([lab.binary("gpuctl-watchdog"), "--config", config], stderr=log,
                                  stdin=subprocess.DEVNULL, env=env)
    lab.track(daemon.pid)
    if lab.wait_until(lambda: "watching Xid events" in open(log_path).read(), 15, 0.1) is None:
        orphan.stop(daemon)
        raise RuntimeError(f"the watchdog never watched Xid events: {open(log_path).read()[-500:]!r}")
    return daemon, config, log_path


def check_xid_hardware() -> dict:
    """Read only: what the driver's NVRM lines look like here, and the watchdog's reader
    opening /dev/kmsg without error. Never provokes an Xid."""
    lines, source = nvrm_lines()
    with tempfile.TemporaryDirectory() as tmp:
        daemon, _, log_path = watch_xids(tmp)
        time.sleep(2)  # some loops, each reading the kernel log
        script("watchdog-orphan.py").stop(daemon)
        log = open(log_path).read()
    refused = [line for line in log.splitlines() if "cannot read the kernel log" in line]
    seen = (f"last {len(lines)} NVRM line(s) of {source} recorded" if lines is not None
            else f"the kernel log is not readable here ({source})")
    reader = "started without error" if not refused else f"failed: {refused[0][-200:]}"
    return result(not refused, f"{seen}; the watchdog's kernel-log reader on /dev/kmsg {reader}", nvrm_lines=lines,
                  watchdog_log=log[-4000:])


XID_ENTRY = "\n[[xid]]\ngpu = 0\nxid = 13\npid = {pid}\n"


def check_xid_sim() -> dict:
    """Xid 13 (an application's) on GPU 0 with two processes on it: the sim writes the
    driver's line naming one to a scratch kernel log, which the watchdog reads."""
    culprit, neighbour = lab.spawn_holder(512), lab.spawn_holder(512)
    entry = XID_ENTRY.format(pid=culprit.pid)
    daemon = None
    with tempfile.TemporaryDirectory() as tmp:
        kernel_log = os.path.join(tmp, "kmsg")
        open(kernel_log, "w").close()
        try:
            daemon, config, log_path = watch_xids(tmp, kernel_log)
            lab.edit_scenario(lambda text: text + entry)
            lab.wait_until(lambda: "Xid 13" in open(log_path).read(), 15, 0.1)
            health = subprocess.run([lab.binary("gpuctl"), "health", "--gpu", "0", "--json"], capture_output=True,
                                    env=dict(os.environ, GPUCTL_CONFIG=config), text=True, timeout=30)
        finally:
            if daemon:
                script("watchdog-orphan.py").stop(daemon)
            lab.edit_scenario(lambda text: text.replace(entry, ""))
            lab.end(culprit, neighbour)
        line = next((x for x in open(log_path).read().splitlines() if "Xid 13" in x), "(no Xid 13 line)")
        written = open(kernel_log).read().strip()
    doc = json.loads(health.stdout or "{}")
    causes = [c for g in doc.get("gpus", []) for c in g.get("causes", []) if c.get("xid") == 13]
    named = sorted({p["pid"] for c in causes for p in c.get("processes", [])})
    in_line = f"CULPRIT={culprit.pid}" in line and not re.search(rf"\b{neighbour.pid}\b", line)
    ok = in_line and named == [culprit.pid]
    return result(ok, f"Xid 13, 2 processes on GPU 0, the sim's NVRM line in a scratch kernel log: the watchdog's "
                      f"line names {'the culprit only' if in_line else 'NOT the culprit alone'}, gpuctl health names "
                      f"{named} (culprit {culprit.pid})", kernel_line=written, watchdog_line=line)


def check_xid() -> dict:
    return check_xid_sim() if lab.sim() else check_xid_hardware()


CHECKS = {
    "info": check_info, "reclaim-kill": check_reclaim_kill, "reclaim-clear": check_reclaim_clear,
    "watchdog": check_watchdog, "holders": check_holders, "health": check_health, "run": check_run,
    "idle": check_idle, "py-oom": lambda: wheel("oom"), "py-runguard": lambda: wheel("runguard"),
    "py-explain": lambda: wheel("explain"), "py-estimate": lambda: wheel("estimate"), "trainer": check_trainer,
    "top": check_top, "metrics": check_metrics, "watchdog-cpu": check_watchdog_cpu,
    "nvml-wrapper": check_nvml_wrapper, "mig": check_mig,
    "mps": check_mps, "xid": check_xid,
}
assert list(CHECKS) == ORDER
