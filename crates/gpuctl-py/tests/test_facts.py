"""The extension's facts from gpuctl-core that gpuctl.torch uses rather than derive again:
the processes below a process (a real tree started here), escaping, memory as gpuctl
writes it, and the NVML GPU behind a CUDA device (against nvml-sim)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import gpuctl
from conftest import GIB, alive, wait_until
from gpuctl import _gpuctl

# A child that starts a grandchild (sleep) and says its pid: a tree two levels deep.
TREE = r"""
import subprocess, sys, time
grandchild = subprocess.Popen(["sleep", "600"])
print(grandchild.pid, flush=True)
time.sleep(600)
"""


def test_descendants_are_the_whole_tree_below_a_process_and_nothing_beside_it(procs, crashed_run):
    child = procs.python(TREE)
    grandchild = procs.stray(int(child.stdout.readline()))
    [gone_parents_worker] = crashed_run(1)  # reparented away when its run was killed

    below_us = _gpuctl.descendants(os.getpid())
    assert child.pid in below_us and grandchild in below_us, below_us
    assert gone_parents_worker not in below_us and os.getpid() not in below_us
    assert below_us == sorted(below_us)
    assert _gpuctl.descendants(child.pid) == [grandchild]
    assert _gpuctl.descendants(grandchild) == []

    # What RunGuard records and explain_oom calls "a child of this process": the same tree.
    from gpuctl.torch._shared import _children
    assert _children() == _gpuctl.descendants(os.getpid())


def test_escape_writes_controls_and_bidirectional_controls_as_escapes():
    chosen = "a\x1b]0;title\x07b\x1b[2Jc\nd\te\r x\x7f\x9b31m\u202egpj.exe \u061c\u2066"
    assert _gpuctl.escape(chosen) == ("a\\e]0;title\\x07b\\e[2Jc\\nd\\te\\r x\\x7f\\u{9b}31m\\u{202e}gpj.exe "
                                      "\\u{61c}\\u{2066}")
    # gpuctl's own text, and a user's unicode, as written.
    assert _gpuctl.escape("python3 train.py ünïcode ✓ 日本 שלום") == "python3 train.py ünïcode ✓ 日本 שלום"


def test_bytes_are_written_as_every_gpuctl_message_writes_them():
    assert [_gpuctl.bytes(n) for n in (0, 1023, 1024, 48 << 20, 3 << 29, 40 * GIB)] == [
        "0 B", "1023 B", "1 KiB", "48 MiB", "1.5 GiB", "40.0 GiB"]
    assert _gpuctl.bytes(3 << 29, 2) == "1.50 GiB" and _gpuctl.bytes(196 << 20, 2) == "196 MiB"
    with pytest.raises(OverflowError):
        _gpuctl.bytes(-1)
    from gpuctl.torch._shared import _bytes
    assert (_bytes(None), _bytes(1536.4), _bytes(-2048), _bytes(GIB)) == ("n/a", "2 KiB", "-2 KiB", "1.00 GiB")


def test_cuda_place_reads_cuda_visible_devices_as_cuda_does_and_names_gpus_as_gpu_does(sim, scenario):
    sim.write(scenario)
    uuid = gpuctl.snapshot().devices[1].uuid
    assert _gpuctl.cuda_place(1, None) == (1, None, "NVML's index (CUDA_VISIBLE_DEVICES is not set)")
    for visible, index in (("1", 0), ("0,1", 1), (" 1 , 0", 0), (uuid, 0), (uuid[:12], 0), (f"0,{uuid.lower()}", 1)):
        assert _gpuctl.cuda_place(index, visible) == (1, None, f"CUDA_VISIBLE_DEVICES={visible}"), visible

    with pytest.raises(gpuctl.UsageError, match=r"^NVML has no GPU 5 \(CUDA_VISIBLE_DEVICES is not set\): "
                                                r"no GPU matches '5'; GPUs present: 0 \(GPU-"):
        _gpuctl.cuda_place(5, None)
    with pytest.raises(gpuctl.UsageError, match=r"^CUDA_VISIBLE_DEVICES=1 makes no cuda:1 visible$"):
        _gpuctl.cuda_place(1, "1")
    with pytest.raises(gpuctl.UsageError, match=r"^CUDA_VISIBLE_DEVICES= makes no cuda:0 visible$"):
        _gpuctl.cuda_place(0, "")
    # CUDA stops at the first entry that names no GPU: the ones after it are not visible.
    with pytest.raises(gpuctl.UsageError, match=r"^CUDA_VISIBLE_DEVICES=7,1 makes no cuda:1 visible: CUDA stops "
                                                r"at '7', which names no GPU \(no GPU matches '7'"):
        _gpuctl.cuda_place(1, "7,1")
    # A prefix shorter than --gpu takes names no GPU; what the user chose is escaped.
    with pytest.raises(gpuctl.UsageError, match=r"^no GPU NVML lists matches 'GPU-' of "):
        _gpuctl.cuda_place(0, "GPU-")
    with pytest.raises(gpuctl.UsageError) as raised:
        _gpuctl.cuda_place(0, "\x1b[2J\u202e")
    assert "'\\e[2J\\u{202e}' of CUDA_VISIBLE_DEVICES=\\e[2J\\u{202e}" in str(raised.value)
    assert raised.value.exit_code == 2


def test_explain_oom_escapes_a_command_as_gpuctls_tables_do(sim, scenario, monkeypatch):
    from gpuctl.torch import explain_oom

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    # A real process whose command line is what its owner chose: a terminal escape and a
    # right-to-left override in argv[0].
    job = subprocess.Popen(["evil\x1b[2J\u202egpj.exe", "600"], executable="/bin/sleep")
    try:
        wait_until(lambda: open(f"/proc/{job.pid}/cmdline").read().startswith("evil"), what="the job's argv")
        sim.write(scenario.process(job.pid, gpu=0, used=2 * GIB))
        text = explain_oom("CUDA out of memory. Tried to allocate 1.00 GiB.", device=0)
        assert f"  pid {job.pid} root 2.00 GiB: evil\\e[2J\\u{{202e}}gpj.exe 600 (a child of this process)" in text, text
        assert "\x1b" not in text and "\u202e" not in text
    finally:
        job.kill()
        job.wait()
    assert not alive(job.pid)


def test_the_facts_need_no_torch():
    done = subprocess.run([sys.executable, "-c", "import sys, os; from gpuctl import _gpuctl; "
                           "_gpuctl.descendants(os.getpid()); _gpuctl.escape('x'); _gpuctl.bytes(1); "
                           "assert 'torch' not in sys.modules"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_clear_says_what_kind_of_finding_selected_each_process(sim, scenario, crashed_run):
    workers = crashed_run(2)
    sim.write(scenario.process(workers[0], gpu=0, used=2 * GIB).process(workers[1], gpu=0, used=GIB))
    document = gpuctl.clear(gpus=[0], dry_run=True).to_dict()
    assert {o["pid"]: o["kinds"] for o in document["outcomes"]} == {workers[0]: ["orphaned"], workers[1]: ["orphaned"]}
    assert all(len(o["kinds"]) == len(o["reasons"]) for o in document["outcomes"])
    assert all(alive(pid) for pid in workers), "a dry run ends nothing"
    # Chosen by a selector, not a finding: no kind.
    planned = gpuctl.kill(pids=[workers[0]], dry_run=True).to_dict()
    assert planned["outcomes"][0]["kinds"] == []


def test_explain_oom_names_a_leftover_by_its_findings_kind_never_by_its_reasons_words(monkeypatch):
    from gpuctl.torch import oom

    # Reasons quote what processes chose (a command, a unit name): their words decide nothing.
    document = {"outcomes": [
        {"pid": 10, "action": "dry_run", "reasons": ["a zombie-like name \x1b[2J"], "kinds": ["orphaned"]},
        {"pid": 11, "action": "skip", "reasons": ["orphaned-looking"], "kinds": ["zombie_holder"],
         "skipped": "permission denied"},
        {"pid": 12, "action": "dry_run", "reasons": ["orphaned, zombie"], "kinds": ["pod_leftover"]}],
        "reported": [{"kind": "orphaned", "reason": "possibly orphaned", "identity": {"pid": 13}}]}
    monkeypatch.setattr(gpuctl, "clear", lambda **_: type("R", (), {"to_dict": lambda self: document})())
    found = oom._clear_would(0)
    assert found[10] == ("frees", "a zombie-like name \\e[2J", None, ("orphaned",))
    assert found[11] == ("cannot", "orphaned-looking", "permission denied", ("zombie_holder",))
    assert found[13] == ("reports", "possibly orphaned", None, ("orphaned",))
    assert [oom._leftover(found[pid][3]) for pid in (10, 11, 12)] == [
        "an orphaned worker of a run that ended", "a zombie holder", "a leftover of a run that ended"]
