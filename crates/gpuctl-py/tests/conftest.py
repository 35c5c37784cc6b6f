"""The harness for the wheel's tests: nvml-sim as the NVML library, scenarios written as the
sim reads them, and real processes (ended by pidfd, never by a bare pid, at teardown).

The tests run against the *installed* wheel (scripts/test installs it into a venv that also
sees torch) and the built nvml-sim: GPUCTL_TEST_SIM names libnvml_sim.so (scripts/test sets
it; else target/debug/ under CARGO_TARGET_DIR or the repository is searched).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
MIB = 1 << 20
GIB = 1 << 30


def _sim_library() -> str:
    named = os.environ.get("GPUCTL_TEST_SIM")
    candidates = [named] if named else [
        os.path.join(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"), "debug", "libnvml_sim.so")]
    for candidate in candidates:
        if candidate and os.path.exists(candidate):
            return str(candidate)
    pytest.fail(f"nvml-sim is not built ({candidates[0]}): cargo build -p nvml-sim, or set GPUCTL_TEST_SIM",
                pytrace=False)


def _toml_string(text: str) -> str:
    return json.dumps(text)  # a JSON string is a valid TOML basic string


class Scenario:
    """An nvml-sim scenario (crates/nvml-sim/src/scenario.rs): GPUs and the processes on
    them, written only with what a test sets."""

    def __init__(self, gpus: int = 2, *, init_error: str | None = None, memory_total_mib: int = 81920) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.memory_total_mib = memory_total_mib
        self.processes: list[dict] = []
        # Extra keys per GPU index (nvml-sim's health keys), as TOML text.
        self.gpu_keys: dict[int, list[str]] = {}

    def process(self, pid: int, gpu: int = 0, used: int = GIB, sm_pct: int = 0) -> "Scenario":
        assert used % MIB == 0, "the sim counts memory in whole MiB"
        self.processes.append({"pid": pid, "gpu": gpu, "used_mib": used // MIB, "sm_pct": sm_pct})
        return self

    def remap_pending(self, gpu: int) -> "Scenario":
        """GPU `gpu` has a row remap waiting for a reset."""
        self.gpu_keys.setdefault(gpu, []).append(
            "remapped_rows = { correctable = 0, uncorrectable = 1, pending = true, failure = false }")
        return self

    def __str__(self) -> str:
        lines = ['driver_version = "570.133.20"', "cuda_driver_version = 12080"]
        if self.init_error:
            lines.append(f"init_error = {_toml_string(self.init_error)}")
        for index in range(self.gpus):
            lines += ["", "[[gpu]]", 'name = "NVIDIA H100 80GB HBM3"', f"memory_total_mib = {self.memory_total_mib}"]
            lines += self.gpu_keys.get(index, [])
        for p in self.processes:
            lines += ["", "[[process]]"] + [f"{k} = {v}" for k, v in p.items()]
        return "\n".join(lines) + "\n"


class Sim:
    """One scratch directory for the session: the scenario (rewritten whole by each test;
    the sim re-reads it when it changes), the sim's state, gpuctl's state and config."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.scenario_path = directory / "scenario.toml"
        self.config_path = directory / "gpuctl.toml"
        # A named configuration must exist: empty (the built-in policy) until a test writes one.
        self.config_path.write_text("")
        self.env = {
            "GPUCTL_NVML_LIB": _sim_library(),
            "NVML_SIM_SCENARIO": str(self.scenario_path),
            "NVML_SIM_STATE": str(directory / "state.json"),
            "GPUCTL_STATE_DIR": str(directory / "gpuctl-state"),
            "GPUCTL_CONFIG": str(self.config_path),
            "GPUCTL_DEV_DIR": str(directory / "dev"),
        }

    def write(self, scenario: Scenario) -> None:
        tmp = self.scenario_path.with_suffix(".tmp")
        tmp.write_text(str(scenario))
        os.replace(tmp, self.scenario_path)
        # The sim keys a file version by its mtime too: a rewrite within the same clock tick
        # must still be seen as new.
        time.sleep(0.01)

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """The installed `gpuctl` command (the wheel's), against this sim."""
        gpuctl = shutil.which("gpuctl", path=os.path.dirname(sys.executable))
        assert gpuctl, f"the wheel's gpuctl command is not beside {sys.executable}"
        done = subprocess.run([gpuctl, *args], env={**os.environ, **self.env}, capture_output=True, text=True)
        if check:
            assert done.returncode == 0, f"gpuctl {' '.join(args)} exited {done.returncode}: {done.stderr}"
        return done


@pytest.fixture(scope="session")
def sim():
    directory = Path(tempfile.mkdtemp(prefix="gpuctl-py-tests-"))
    made = Sim(directory)
    saved = {k: os.environ.get(k) for k in made.env}
    os.environ.update(made.env)
    made.write(Scenario())
    yield made
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def scenario(sim):
    """Writes a scenario for this test; the test adds processes and calls sim.write()."""
    yield Scenario()
    sim.write(Scenario())
    sim.config_path.write_text("")


def start_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def alive(pid: int) -> bool:
    """Running, not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_until(done, limit: float = 10.0, what: str = "the condition") -> None:
    deadline = time.monotonic() + limit
    while not done():
        assert time.monotonic() < deadline, f"{what} did not hold within {limit}s"
        time.sleep(0.02)


class Strays:
    """Processes that are not our children, killed at teardown by identity: a pidfd opened
    while the recorded start time still matches, so a reused pid is never hit."""

    def __init__(self) -> None:
        self.known: list[tuple[int, int]] = []

    def add(self, pid: int) -> int:
        ticks = start_ticks(pid)
        assert ticks is not None, f"pid {pid} is gone before it could be recorded"
        self.known.append((pid, ticks))
        return pid

    def kill_all(self) -> None:
        for pid, ticks in self.known:
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue
            try:
                if start_ticks(pid) == ticks:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
            except OSError:
                pass
            finally:
                os.close(fd)


@pytest.fixture
def procs():
    """Real processes for a test: children (sleep) and strays; all killed at teardown."""
    children: list[subprocess.Popen] = []
    strays = Strays()

    class Procs:
        def sleeper(self, *, new_session: bool = False) -> subprocess.Popen:
            child = subprocess.Popen(["sleep", "600"], start_new_session=new_session)
            children.append(child)
            return child

        def python(self, code: str, *args: str) -> subprocess.Popen:
            child = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True,
                                     start_new_session=True)
            children.append(child)
            return child

        def stray(self, pid: int) -> int:
            return strays.add(pid)

    yield Procs()
    for child in children:
        if child.poll() is None:
            child.kill()
        child.wait()
    strays.kill_all()


CRASHED_RUN = r"""
import os, sys, time
n = int(sys.argv[1])
workers = []
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        time.sleep(600)
        os._exit(0)
    workers.append(pid)
print(" ".join(map(str, workers)), flush=True)
time.sleep(600)
"""


@pytest.fixture
def crashed_run(procs):
    """Starts a run (its own process group) with `n` idle workers, SIGKILLs its parent as a
    crash would, and returns the workers' pids: they live on, reparented out of the run."""

    def start(n: int = 2) -> list[int]:
        parent = procs.python(CRASHED_RUN, str(n))
        workers = [procs.stray(int(p)) for p in parent.stdout.readline().split()]
        assert len(workers) == n, "the run did not report its workers"
        parent.kill()
        parent.wait()
        return workers

    return start
