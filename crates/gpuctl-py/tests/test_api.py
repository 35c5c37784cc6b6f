"""gpuctl's module against nvml-sim with real processes: snapshot, clear, kill, enable,
fraction, and the wheel itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import gpuctl
from conftest import GIB, MIB, Scenario, alive, wait_until


def test_the_wheel_installs_into_an_empty_venv_with_the_command_and_a_module_that_needs_no_torch():
    wheel = os.environ.get("GPUCTL_TEST_WHEEL")
    assert wheel and os.path.exists(wheel), "GPUCTL_TEST_WHEEL must name the built wheel (scripts/test sets it)"
    with tempfile.TemporaryDirectory(prefix="gpuctl-empty-venv-") as venv:
        # Made by the machine's own python3, not the test venv's: nothing of torch in reach.
        # No pip of its own (ensurepip is slow): this venv's pip installs into it.
        subprocess.run(["python3", "-m", "venv", "--without-pip", venv], check=True)
        subprocess.run([sys.executable, "-m", "pip", "--python", os.path.join(venv, "bin", "python"), "install",
                        "--quiet", "--disable-pip-version-check", "--no-deps", "--no-index", wheel], check=True)
        version = subprocess.run([os.path.join(venv, "bin", "gpuctl"), "--version"], capture_output=True,
                                 text=True, check=True)
        assert version.stdout.strip() == f"gpuctl {gpuctl.__version__}"
        # Nor `typing`: with what it imports it was most of the module's own import time.
        site = subprocess.run([os.path.join(venv, "bin", "python"), "-c",
                               "import gpuctl, sys; print(gpuctl.__version__, 'torch' in sys.modules, "
                               "'typing' in sys.modules)"],
                              capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"})
        assert site.stdout.split() == [gpuctl.__version__, "False", "False"]


def _without_times(document):
    """The info document less what changes from one reading to the next: the timestamp and
    the processes' ages."""
    if isinstance(document, dict):
        return {k: _without_times(v) for k, v in document.items() if k not in ("timestamp", "age_seconds")}
    if isinstance(document, list):
        return [_without_times(v) for v in document]
    return document


def test_snapshot_to_dict_is_the_document_of_gpuctl_info_json(sim, scenario, procs):
    a, b = procs.sleeper(), procs.sleeper()
    sim.write(scenario.process(a.pid, gpu=0, used=2 * GIB, sm_pct=40).process(b.pid, gpu=1, used=512 * MIB))
    s = gpuctl.snapshot()
    cli = json.loads(sim.cli("info", "--json").stdout)
    assert _without_times(s.to_dict()) == _without_times(cli)
    assert [d.index for d in s.devices] == [0, 1]
    gpu0 = s.devices[0]
    assert gpu0.name == "NVIDIA H100 80GB HBM3" and gpu0.uuid.startswith("GPU-")
    assert gpu0.memory_total == 80 * GIB and gpu0.memory_used >= 2 * GIB
    assert gpu0.mig_devices == []
    (p,) = gpu0.processes
    assert (p.pid, p.used_bytes, p.state) == (a.pid, 2 * GIB, "sleeping")
    assert p.user == "root" and p.command.startswith("sleep 600") and p.age_seconds >= 0
    assert p.owner is None or isinstance(p.owner, str)
    # One GPU by name: the CLI's --gpu.
    only = gpuctl.snapshot(gpus=1)
    assert [d.index for d in only.devices] == [1]
    assert [p.pid for p in only.devices[0].processes] == [b.pid]


def test_a_process_the_watchdog_finds_idle_carries_what_it_found(sim, scenario, procs):
    """Process.idle comes from the watchdog's findings file (the same process: pid and start
    time), so a snapshot taken by a program that has just started shows it."""
    from conftest import start_ticks
    idle, busy = procs.sleeper(), procs.sleeper()
    sim.write(scenario.process(idle.pid, used=4 * GIB).process(busy.pid, used=GIB, sm_pct=40))
    state = sim.dir / "watchdog-state"
    state.mkdir(exist_ok=True)
    sim.config_path.write_text(f'[watchdog]\nstate_dir = "{state}"\n')
    facts = {"idle_since": int(time.time()) - 7200, "idle_seconds": 7200, "memory_bytes": 4 * GIB,
             "measured_pct": 100, "utilization": "process"}
    finding = {"kind": "idle", "gpus": [0], "uuids": [""], "pid": idle.pid, "start_ticks": start_ticks(idle.pid),
               "since_unix": facts["idle_since"], "reason": "idle for 2h00m", "idle": facts}
    # The same pid with another start time is another process: not marked.
    stale = dict(finding, pid=busy.pid, start_ticks=start_ticks(busy.pid) + 1)
    (state / "findings.json").write_text(json.dumps(
        {"written_unix": time.time(), "interval_s": 5.0, "findings": [finding, stale]}))
    try:
        # Other GPUs than the kept survey's: opened afresh, with this configuration.
        by_pid = {p.pid: p for p in gpuctl.snapshot(gpus=[0, 1]).devices[0].processes}
        assert by_pid[idle.pid].idle == facts
        assert by_pid[busy.pid].idle is None
    finally:
        sim.config_path.unlink()


def test_device_health_is_gpuctl_healths_verdict(sim, scenario):
    sim.write(scenario.remap_pending(1))
    s = gpuctl.snapshot()
    healthy, sick = s.devices
    assert healthy.health.ok and healthy.health.action == "none" and healthy.health.causes == []
    assert not sick.health.ok and sick.health.action == "gpu_reset"
    assert [c["kind"] for c in sick.health.causes] == ["row_remap_pending"]
    cli = json.loads(sim.cli("health", "--json", check=False).stdout)
    assert sick.health.to_dict()["causes"] == cli["gpus"][1]["causes"]


def test_clear_ends_a_crashed_runs_workers_and_reports_what_it_leaves(sim, scenario, procs, crashed_run):
    workers = crashed_run(2)
    live = procs.sleeper()
    stopped = procs.sleeper(new_session=True)
    os.kill(stopped.pid, signal.SIGSTOP)
    wait_until(lambda: open(f"/proc/{stopped.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "T",
               what="the process to stop")
    for pid in workers:
        scenario.process(pid, gpu=0, used=GIB, sm_pct=0)
    sim.write(scenario.process(live.pid, gpu=0, used=GIB, sm_pct=60).process(stopped.pid, gpu=1, used=GIB))

    dry = gpuctl.clear(dry_run=True)
    assert sorted(dry.planned) == sorted(workers) and dry.ended == []
    assert all(alive(pid) for pid in workers)

    report = gpuctl.clear(wait=5)
    assert sorted(report.ended) == sorted(workers)
    assert (stopped.pid in [pid for pid, _ in report.skipped]) and report.free is False
    why = dict(report.skipped)[stopped.pid]
    assert "stopped" in why
    # Each skip is named, and still unpacks as the (pid, why) pair it was.
    entry = next(s for s in report.skipped if s.pid == stopped.pid)
    assert isinstance(entry, gpuctl.Skipped) and entry.why == why and tuple(entry) == (stopped.pid, why)
    assert not any(alive(pid) for pid in workers)
    assert alive(live.pid) and alive(stopped.pid)
    assert report.to_dict()["command"] == "clear" and report.to_dict()["schema"] == 1


def test_kill_ends_the_selected_processes_and_reports_the_ones_skipped(sim, scenario, procs):
    big, small, elsewhere, off_gpu = procs.sleeper(), procs.sleeper(), procs.sleeper(), procs.sleeper()
    sim.write(scenario.process(big.pid, gpu=0, used=4 * GIB, sm_pct=50)
              .process(small.pid, gpu=0, used=256 * MIB, sm_pct=50)
              .process(elsewhere.pid, gpu=1, used=4 * GIB, sm_pct=50))

    planned = gpuctl.kill(gpus=0, min_memory="1GiB", dry_run=True)
    assert planned.planned == [big.pid] and alive(big.pid)

    report = gpuctl.kill(gpus=[0], min_memory=GIB)
    assert report.ended == [big.pid] and report.free
    assert big.wait(timeout=10) == -signal.SIGTERM
    assert alive(small.pid) and alive(elsewhere.pid)

    # A pid that holds no GPU memory is refused, and said so; the other one is ended.
    mixed = gpuctl.kill(pids=[small.pid, off_gpu.pid], signal="KILL")
    assert mixed.ended == [small.pid]
    assert [pid for pid, _ in mixed.skipped] == [off_gpu.pid] and not mixed.free
    assert small.wait(timeout=10) == -signal.SIGKILL
    assert alive(elsewhere.pid) and alive(off_gpu.pid)
    assert mixed.to_dict()["refused"][0]["pid"] == off_gpu.pid


def test_enable_applies_the_clis_settings_and_keeps_the_users(sim, scenario, monkeypatch):
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
    monkeypatch.delenv("CUDA_MODULE_LOADING", raising=False)
    expected = {e["name"]: e["value"] for e in json.loads(sim.cli("enable", "--json").stdout)["env"]}
    applied = gpuctl.enable()
    assert applied == {"PYTORCH_ALLOC_CONF": "expandable_segments:True", "CUDA_MODULE_LOADING": "LAZY",
                       "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:True"}
    for name, value in applied.items():
        assert os.environ[name] == value == expected[name]
    # Nothing of other frameworks' for a PyTorch program.
    assert "XLA_PYTHON_CLIENT_PREALLOCATE" not in applied
    try:
        gpuctl.enable("caffe")
    except gpuctl.UsageError as error:
        assert str(error) == 'framework: unknown framework "caffe": use "pytorch", "jax" or "tensorflow"'
    else:
        raise AssertionError("an unknown framework was accepted")


def test_fraction_is_the_share_the_cli_reports(sim, scenario):
    assert gpuctl.fraction() is None
    sim.config_path.write_text('[fraction]\ndefault = 0.5\n[fraction.gpu]\n"1" = 0.25\n')
    assert gpuctl.fraction() == 0.5
    assert gpuctl.fraction(gpu=1) == 0.25
    shown = json.loads(sim.cli("fraction", "--gpu", "1", "--json").stdout)
    assert shown["gpus"][0]["fraction"] == 0.25


def test_pick_returns_the_free_healthy_devices_and_takes_no_lease(sim, scenario, procs):
    busy = procs.sleeper()
    sim.write(Scenario(gpus=3).process(busy.pid, gpu=0, used=2 * GIB).remap_pending(1))
    (device,) = gpuctl.pick(1)
    assert isinstance(device, gpuctl.Device) and device.index == 2
    assert device.uuid == sim.cli("pick", "1").stdout.strip()
    # Nothing is held: picked again, the same GPU.
    assert [d.index for d in gpuctl.pick()] == [2]
    # With room enough asked for instead, the busy GPU qualifies; the broken one never.
    assert [d.index for d in gpuctl.pick(2, min_free="40GiB")] == [0, 2]
    try:
        gpuctl.pick(2)
        raise AssertionError("two GPUs picked where one qualifies")
    except gpuctl.Error as error:
        assert error.exit_code == 4 and "2 GPUs wanted, 1 free and healthy" in str(error)
    for bad in [dict(n=0), dict(n=1, max_util=0), dict(n=1, min_free="200GiB"), dict(n="1")]:
        try:
            gpuctl.pick(**bad)
            raise AssertionError(f"{bad} accepted")
        except gpuctl.UsageError:
            pass
