"""Bad input raises the package's exceptions with the CLI's one-line message, and never
takes the interpreter down."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import gpuctl
from conftest import GIB, Scenario


def one_line(error: BaseException) -> str:
    text = str(error)
    assert text and "\n" not in text, f"not one line: {text!r}"
    assert "panicked" not in text and "Traceback" not in text
    return text


def test_the_exceptions_subclass_gpuctl_error():
    assert issubclass(gpuctl.NvmlError, gpuctl.Error) and issubclass(gpuctl.UsageError, gpuctl.Error)
    assert issubclass(gpuctl.RunningError, gpuctl.Error) and issubclass(gpuctl.Error, Exception)


def test_an_unknown_gpu_is_a_usage_error_with_the_clis_message(sim, scenario):
    with pytest.raises(gpuctl.UsageError) as raised:
        gpuctl.snapshot(gpus=7)
    cli = sim.cli("info", "--gpu", "7", check=False)
    assert cli.returncode == 2 and raised.value.exit_code == 2
    assert cli.stderr.strip() == f"gpuctl: {one_line(raised.value)}"
    with pytest.raises(gpuctl.UsageError):
        gpuctl.kill(gpus="GPU-no-such-uuid")
    with pytest.raises(gpuctl.UsageError):
        gpuctl.clear(gpus=[0, 9])


def test_a_negative_min_memory_or_a_bad_value_is_a_usage_error(sim, scenario, procs):
    p = procs.sleeper()
    sim.write(scenario.process(p.pid, used=GIB))
    with pytest.raises(gpuctl.UsageError, match="min_memory: -1 is not a size"):
        gpuctl.kill(pids=p.pid, min_memory=-1)
    with pytest.raises(gpuctl.UsageError, match="min_memory"):
        gpuctl.kill(pids=p.pid, min_memory="lots")
    with pytest.raises(gpuctl.UsageError, match="pids: -5 is not a process id"):
        gpuctl.kill(pids=[-5])
    with pytest.raises(gpuctl.UsageError, match="signal"):
        gpuctl.kill(pids=p.pid, signal="SIGNOPE")
    with pytest.raises(gpuctl.UsageError, match="no such user"):
        gpuctl.kill(user="no-such-user-gpuctl")
    with pytest.raises(gpuctl.UsageError, match="wait"):
        gpuctl.clear(wait=-1)
    assert p.poll() is None, "nothing was signalled"


def test_a_selector_that_selects_nothing_is_a_usage_error(sim, scenario, procs):
    p = procs.sleeper()
    sim.write(scenario.process(p.pid, used=GIB))
    with pytest.raises(gpuctl.UsageError) as nothing:
        gpuctl.kill()
    assert one_line(nothing.value).startswith("no process selected")
    # In Python's words, the keywords of gpuctl.kill, not the CLI's flags.
    assert one_line(nothing.value) == "no process selected: give pids=, gpus=, user=, owner= or min_memory="
    with pytest.raises(gpuctl.UsageError) as none_match:
        gpuctl.kill(min_memory="1TiB")
    assert one_line(none_match.value) == "no GPU process matches the selection"
    assert p.poll() is None


def test_no_nvml_library_is_an_nvml_error_and_the_interpreter_goes_on(sim, tmp_path):
    code = (
        "import gpuctl\n"
        "try:\n"
        "    gpuctl.snapshot()\n"
        "except gpuctl.NvmlError as e:\n"
        "    print('NvmlError', e.exit_code, e)\n"
        "try:\n"
        "    gpuctl.kill(pids=[1])\n"
        "except gpuctl.NvmlError as e:\n"
        "    print('NvmlError', e.exit_code)\n"
        "print('still running')\n"
    )
    env = {**os.environ, "GPUCTL_NVML_LIB": str(tmp_path / "libnvidia-ml.so.1")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("NvmlError 3 NVML is unavailable") and str(tmp_path) in lines[0]
    assert lines[1:] == ["NvmlError 3", "still running"]
    cli = sim.cli("info", check=False)
    assert cli.returncode == 0  # the session's sim is still there for the others


def test_a_driver_that_fails_to_initialise_is_an_nvml_error(sim, scenario):
    sim.write(Scenario(init_error="DRIVER_NOT_LOADED"))
    with pytest.raises(gpuctl.NvmlError) as raised:
        gpuctl.snapshot()
    cli = sim.cli("info", check=False)
    assert cli.returncode == 3
    assert cli.stderr.strip() == f"gpuctl: {one_line(raised.value)}"
