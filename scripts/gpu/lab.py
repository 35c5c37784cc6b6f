"""What the GPU checks share (scripts/gpu/all and the scripts beside it): where the binaries
are, how a CUDA process of ours is started, and how nvidia-smi is asked, on a real GPU or,
in rehearsal, on nvml-sim.

On a real GPU a holder is a Python process that allocates with torch on CUDA; the driver
lists it and maps /dev/nvidia* into it. In rehearsal (GPUCTL_LAB_SIM=1, under `nvml-sim
run`, which sets NVML_SIM_SCENARIO, GPUCTL_NVML_LIB, GPUCTL_DEV_DIR and LD_LIBRARY_PATH) the
same holder registers its own pid in the scenario with the amount it was asked for, opens
the simulated device file, and sleeps: the sim's equivalent of the driver's doing. Standard
library only: it runs where nothing but Python is installed.
"""

import fcntl
import json
import os
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
HOLDER = os.path.join(HERE, "holder.py")
MIB = 2**20


def sim() -> bool:
    return os.environ.get("GPUCTL_LAB_SIM") == "1"


def python() -> str:
    """The Python with torch (GPUCTL_LAB_PYTHON, else this one)."""
    return os.environ.get("GPUCTL_LAB_PYTHON", sys.executable)


def binary(name: str) -> str:
    """A binary of the bundle (GPUCTL_LAB_BIN: the directory of gpuctl, gpuctl-watchdog...)."""
    return os.path.join(os.environ.get("GPUCTL_LAB_BIN", ""), name)


def register(pid: int, mib: int, sm_pct: int = 0, gpu: int = 0, mps: str = None) -> None:
    """Rehearsal only: lists `pid` on GPU `gpu` holding `mib`, as the driver would once the
    process made a CUDA context there (`mps`: "server" or "client" of that GPU's MPS
    server)."""
    entry = f"\n[[process]]\npid = {pid}\ngpu = {gpu}\nused_mib = {mib}\nsm_pct = {sm_pct}\n"
    if mps:
        entry += f'mps = "{mps}"\n'
    edit_scenario(lambda text: text + entry)


def edit_scenario(change) -> None:
    """Rehearsal only: the scenario's text through `change`. It is replaced whole (temp
    file, rename) under a lock of ours, as nvml-sim asks of live edits."""
    scenario = os.environ["NVML_SIM_SCENARIO"]
    with open(scenario + ".gpulab.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        text = change(open(scenario).read())
        tmp = f"{scenario}.gpulab.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(text)
        os.rename(tmp, scenario)


def start_ticks(pid: int):
    """The process's start time (clock ticks since boot), None once it is gone."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def track(pid: int) -> None:
    """Records `pid` with its start time for scripts/gpu/all, which ends it after the check
    if it is still that process (GPUCTL_LAB_TRACK; nothing outside a run of all)."""
    path = os.environ.get("GPUCTL_LAB_TRACK")
    if not path:
        return
    ticks = start_ticks(pid)
    if ticks is None:
        return
    with open(path, "a") as f:
        f.write(f"{pid} {ticks}\n")


def spawn_holder(mib: int, *args: str, env=None, **popen) -> subprocess.Popen:
    """Starts holder.py holding `mib` on CUDA device 0 and waits for its "ready" line; the
    pids of its workers (holder.py --workers) are in `.workers`."""
    child = subprocess.Popen([python(), HOLDER, "--mib", str(mib), *args], stdout=subprocess.PIPE,
                             text=True, env=env, **popen)
    words = child.stdout.readline().split()
    if words[:1] != ["ready"]:
        child.kill()
        child.wait()
        raise RuntimeError(f"the CUDA holder did not start (it said {' '.join(words)!r})")
    child.workers = [int(pid) for pid in words[1:]]
    return child


def end(*children) -> None:
    """Ends processes this check started (Popen objects or pids), by SIGKILL."""
    for child in children:
        pid = child if isinstance(child, int) else child.pid
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if not isinstance(child, int):
            child.wait()


def smi(query: str, kind: str = "gpu", *extra: str) -> list:
    """`nvidia-smi --query-KIND=QUERY` as rows of stripped fields."""
    out = subprocess.run(["nvidia-smi", f"--query-{kind}={query}", "--format=csv,noheader,nounits", *extra],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    return [[f.strip() for f in line.split(",")] for line in out.strip().splitlines() if line.strip()]


def compute_apps() -> dict:
    """pid -> used MiB, as nvidia-smi lists them on every GPU."""
    return {int(pid): int(used) if used.isdigit() else None
            for pid, used in smi("pid,used_memory", "compute-apps")}


def gpuctl_json(*args: str, check: bool = True) -> dict:
    out = subprocess.run([binary("gpuctl"), *args, "--json"], capture_output=True, text=True, timeout=60)
    if check and out.returncode not in (0,):
        raise RuntimeError(f"gpuctl {' '.join(args)} --json: exit {out.returncode}: {out.stderr.strip()[-500:]}")
    return json.loads(out.stdout)


def median_ms(argv, runs: int, env=None) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=env, timeout=30)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1000


def wait_until(predicate, timeout: float, step: float = 0.05):
    """Polls `predicate` until it returns something true or `timeout` seconds pass; returns
    the seconds it took, or None."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(step)
    return None


def foreign_holders(mine=()) -> list:
    """Processes on the GPUs that this run did not start: a check that reclaims refuses to
    run beside them, since gpuctl acts on whatever it finds stale."""
    return sorted(pid for pid in compute_apps() if pid not in set(mine))


def write_json(path: str, value) -> None:
    with open(path, "w") as f:
        json.dump(value, f, indent=2)
        f.write("\n")
