"""gpuctl.torch with real torch (CPU): RunGuard on a crashed run with real DataLoader
workers, OOMRecovery against an unconstrained run, MemoryMonitor against NVML."""

from __future__ import annotations

import copy
import csv
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

import gpuctl
from conftest import GIB, MIB, alive, start_ticks, wait_until
from gpuctl.torch import (MemoryMonitor, OOMRecovery, OutOfMemoryAtOne, RunGuard, RunningError,
                          find_executable_micro_batch, logits_bytes)

# A training script whose DataLoader workers (multiprocessing) hang in __getitem__, as
# workers stuck in I/O or a CUDA call do: they outlive their parent's SIGKILL.
TRAINING = r"""
import os, sys, time
import torch
from torch.utils.data import DataLoader, Dataset
from gpuctl.torch import RunGuard

class Stuck(Dataset):
    def __len__(self):
        return 1000
    def __getitem__(self, i):
        if i >= 4:
            time.sleep(600)
        return torch.tensor([float(i)])

with RunGuard(sys.argv[1], dir=sys.argv[2], watch=0.1) as guard:
    batches = iter(DataLoader(Stuck(), batch_size=2, num_workers=2))
    next(batches)
    guard.record()
    with open(guard.path) as f:
        recorded = f.read()
    print(os.getpid(), " ".join(str(p["pid"]) for p in __import__("json").loads(recorded)["processes"]
                                if p["role"] == "worker"), flush=True)
    time.sleep(600)
"""


def start_training(procs, name, directory):
    run = procs.python(TRAINING, name, str(directory))
    line = run.stdout.readline().split()
    assert line, "the training script did not start"
    parent, workers = int(line[0]), [procs.stray(int(p)) for p in line[1:]]
    assert parent == run.pid and len(workers) == 2
    return run, workers


def test_runguard_cleans_a_crashed_pytorch_runs_dataloader_workers(sim, scenario, procs, tmp_path):
    run, workers = start_training(procs, "llama-ft", tmp_path)
    unrelated = procs.sleeper(new_session=True)
    for pid in workers:
        scenario.process(pid, gpu=0, used=3 * GIB)
    sim.write(scenario.process(unrelated.pid, gpu=0, used=GIB, sm_pct=30))
    before = gpuctl.snapshot().devices[0].memory_used

    # The record is the trainer's format: version, name, device, processes by identity.
    record = json.loads((tmp_path / "llama-ft.run.json").read_text())
    assert record["version"] == 1 and record["name"] == "llama-ft" and record["device"] == "cpu"
    roles = {p["pid"]: (p["role"], p["start_ticks"]) for p in record["processes"]}
    assert roles[run.pid] == ("trainer", start_ticks(run.pid))
    assert all(roles[w] == ("worker", start_ticks(w)) for w in workers)

    # While it lives, its name is taken.
    with pytest.raises(RunningError, match=f'run "llama-ft" is already running as pid {run.pid}') as busy:
        with RunGuard("llama-ft", dir=tmp_path):
            pass
    # In Python's words (RunGuard's name=), not the trainer's --run-name.
    assert str(busy.value).endswith("or give this run another name=")

    run.kill()  # SIGKILL: the crash
    run.wait()
    assert all(alive(w) for w in workers), "the workers outlive their parent"

    with RunGuard("llama-ft", dir=tmp_path, watch=None) as guard:
        assert guard.cleanup.leftovers == 2
        assert guard.cleanup.freed_bytes == 6 * GIB
        assert not any(alive(w) for w in workers)
        after = gpuctl.snapshot().devices[0]
        assert [p.pid for p in after.processes] == [unrelated.pid]
        assert after.memory_used == before - 6 * GIB
        assert alive(unrelated.pid)
        current = json.loads((tmp_path / "llama-ft.run.json").read_text())
        # This run now: this process, recorded as the trainer (its children as workers).
        assert current["processes"][0]["pid"] == os.getpid() and current["processes"][0]["role"] == "trainer"
    # A clean exit leaves nothing for the next run to clean.
    assert not (tmp_path / "llama-ft.run.json").exists()
    with RunGuard("llama-ft", dir=tmp_path, watch=None) as again:
        assert again.cleanup.leftovers == 0


def test_runguard_refuses_a_bad_name_and_keeps_the_file_after_an_exception(tmp_path):
    with pytest.raises(gpuctl.UsageError, match="run name"):
        with RunGuard("../etc", dir=tmp_path):
            pass
    with pytest.raises(ZeroDivisionError):
        with RunGuard("crashy", dir=tmp_path, watch=None):
            1 / 0
    assert (tmp_path / "crashy.run.json").exists(), "a run that raised is treated as crashed next time"
    with RunGuard("crashy", dir=tmp_path, watch=None) as guard:
        assert guard.cleanup.leftovers == 0 and guard.cleanup.log


def test_runguard_steps_around_a_lock_another_user_planted(tmp_path, monkeypatch, capfd):
    # A team's checkpoint directory, sticky as /tmp: another user made the run's lock first.
    assert os.geteuid() == 0, "this test plants a file as another user (uid 65534): run it as root"
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    planted = shared / "llama-ft.run.lock"
    planted.write_text("")
    os.chown(planted, 65534, 65534)
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    with RunGuard("llama-ft", dir=shared, watch=None) as guard:
        first = guard.path
        assert first.startswith(str(runtime / "gpuctl-trainer")), first
        assert os.path.exists(first)
    err = capfd.readouterr().err
    assert "put there by another user" in err and str(planted) in err, err
    # The next run of the name finds its file there again, and says so again.
    with RunGuard("llama-ft", dir=shared, watch=None) as again:
        assert again.path == first


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))

    def forward(self, x):
        return self.layers(x)


def batches(steps, size=64):
    generator = torch.Generator().manual_seed(7)
    return [(torch.randn(size, 16, generator=generator), torch.randint(0, 4, (size,), generator=generator))
            for _ in range(steps)]


def train(model, data, step):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for batch in data:
        step(batch)
        optimizer.step()
        optimizer.zero_grad()
    return model


def test_oom_recovery_ends_where_an_unconstrained_run_does():
    torch.manual_seed(0)
    reference, recovered = Net(), None
    recovered = copy.deepcopy(reference)
    data = batches(8)
    loss_fn = torch.nn.functional.cross_entropy

    def plain(batch):
        x, y = batch
        loss_fn(reference(x), y).backward()

    train(reference, data, plain)
    logged = []
    rec = OOMRecovery(recovered, batch_size=64, micro_batch=64, inject_oom_above=8, log=logged.append)
    losses = []
    train(recovered, data, lambda batch: losses.append(rec.step(batch, lambda mb: loss_fn(recovered(mb[0]), mb[1]))))
    assert rec.micro_batch == 8 and rec.recoveries == 3 and rec.steps == 8
    assert "micro-batch halved to 8, 8 accumulation steps for the same batch of 64" in logged[-1]
    for (name, a), b in zip(reference.named_parameters(), recovered.parameters()):
        rel = ((a - b).norm() / a.norm()).item()
        assert rel <= 1e-5, f"{name}: relative difference {rel}"
    assert all(loss.requires_grad is False for loss in losses)


def test_oom_recovery_splits_dicts_and_tuples_and_leaves_other_errors_alone():
    torch.manual_seed(1)
    model = Net()
    x, y = torch.randn(10, 16), torch.randint(0, 4, (10,))
    seen = []

    def loss(mb):
        seen.append(mb["x"].shape[0])
        assert mb["tag"] == "kept"
        return torch.nn.functional.cross_entropy(model(mb["x"]), mb["y"])

    rec = OOMRecovery(model, batch_size=10, micro_batch=4)
    rec.step({"x": x, "y": y, "tag": "kept"}, loss)
    assert seen == [4, 4, 2]
    with pytest.raises(gpuctl.UsageError, match="same size along dim 0"):
        rec.step((x, y[:3]), lambda mb: model(mb[0]).sum())
    with pytest.raises(RuntimeError, match="not an OOM"):
        rec.step(x, lambda mb: (_ for _ in ()).throw(RuntimeError("not an OOM")))
    assert rec.micro_batch == 4


def test_oom_at_micro_batch_one_says_what_to_change():
    model = Net()
    rec = OOMRecovery(model, batch_size=4, micro_batch=2, inject_oom_above=0, seq_len=1024, vocab_size=50257,
                      log=lambda line: None)
    with pytest.raises(OutOfMemoryAtOne) as raised:
        rec.step(torch.randn(4, 16), lambda mb: model(mb).sum())
    message = str(raised.value)
    assert "even with micro-batch 1" in message and "mixed precision" in message
    assert "one sample's logits alone take 196 MiB (seq 1024 x vocab 50257)" in message
    assert all(p.grad is None for p in model.parameters()), "the failed step's gradients are dropped"
    assert isinstance(raised.value, gpuctl.Error)


def test_logits_bytes_is_the_seeds_formula():
    assert logits_bytes(64, 256, 50257) == 64 * 256 * 50257 * 4
    assert round(logits_bytes(64, 256, 50257) / 2**30, 2) == 3.07  # the notes' table rounds up: 3.08
    assert logits_bytes(8, 128, 32000, torch.bfloat16) == 8 * 128 * 32000 * 2
    assert logits_bytes(8, 128, 32000, "fp16") == 8 * 128 * 32000 * 2


def test_the_accelerate_style_decorator_keeps_the_effective_batch():
    calls = []

    @find_executable_micro_batch(batch_size=64, inject_oom_above=8, log=lambda line: None)
    def loop(micro_batch, accumulation, tag):
        calls.append((micro_batch, accumulation, tag))
        return micro_batch * accumulation

    assert loop("run") == 64
    assert calls == [(8, 8, "run")]

    @find_executable_micro_batch(batch_size=4, inject_oom_above=0, log=lambda line: None)
    def never_fits(micro_batch, accumulation):
        return None

    with pytest.raises(torch.cuda.OutOfMemoryError):
        never_fits()


def test_memory_monitor_logs_what_nvml_says_this_process_holds(sim, scenario, tmp_path):
    sim.write(scenario.process(os.getpid(), gpu=1, used=512 * MIB))
    monitor = MemoryMonitor(trace=tmp_path / "mem.csv")
    row = monitor.milestone("epoch 3")
    assert row["label"] == "epoch 3" and row["nvml_bytes"] == 512 * MIB
    # A CPU run: torch's CUDA allocator holds nothing to report.
    assert row["allocated_bytes"] is None and row["reserved_bytes"] is None
    with open(tmp_path / "mem.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows == [{"time": str(row["time"]), "label": "epoch 3", "allocated_bytes": "",
                     "reserved_bytes": "", "peak_bytes": "", "nvml_bytes": str(512 * MIB), "fragmentation": "",
                     "num_alloc_retries": "", "largest_free_block_bytes": ""}]
    if importlib.util.find_spec("matplotlib") is None:
        with pytest.raises(gpuctl.Error, match="needs matplotlib"):
            monitor.plot(tmp_path / "mem.png")
    else:
        monitor.plot(tmp_path / "mem.png")
        assert (tmp_path / "mem.png").stat().st_size > 0


# Every public name of gpuctl.torch when it was one module (torch.py): the package keeps
# each, importable from gpuctl.torch as before.
PUBLIC_NAMES = ["Cleanup", "Estimate", "Leak", "MemoryLeakWarning", "MemoryMonitor", "OOMRecovery",
                "OutOfMemoryAtOne", "RunGuard", "RunningError", "estimate", "explain_oom",
                "find_executable_micro_batch", "is_out_of_memory", "logits_bytes"]


def test_the_package_keeps_every_public_name_of_the_module_it_was():
    import gpuctl.torch as package

    assert sorted(package.__all__) == sorted(set(PUBLIC_NAMES) - {"Cleanup"})
    for name in PUBLIC_NAMES:
        scope = {}
        exec(f"from gpuctl.torch import {name}", scope)
        assert scope[name] is getattr(package, name), name
        # Defined in the package (RunningError is gpuctl's own), never a submodule's name.
        assert getattr(scope[name], "__module__", "").startswith("gpuctl"), name
    assert package.RunningError is gpuctl.RunningError
    assert callable(package.estimate) and callable(package.explain_oom)


def test_no_module_of_the_package_is_over_600_lines():
    import gpuctl.torch as package

    directory = os.path.dirname(package.__file__)
    sizes = {name: sum(1 for _ in open(os.path.join(directory, name)))
             for name in os.listdir(directory) if name.endswith(".py")}
    assert len(sizes) > 1 and all(lines <= 600 for lines in sizes.values()), sizes
