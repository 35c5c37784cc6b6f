"""gpuctl.torch's memory checklist with real torch (CPU): the leak census of
MemoryMonitor.step, fragmentation at milestones, explain_oom against nvml-sim with real
processes, and estimate against a counted peak."""

from __future__ import annotations

import collections
import copy
import functools
import os
import pwd
import subprocess
import sys
import types
import warnings

import pytest
import torch

import gpuctl
from conftest import GIB, alive, wait_until
from gpuctl.torch import (MemoryLeakWarning, MemoryMonitor, OOMRecovery, OutOfMemoryAtOne, estimate, explain_oom,
                          find_executable_micro_batch)


class Net(torch.nn.Module):
    """The seeds' model: an encoder whose outputs it keeps as reconstruction targets."""

    def __init__(self, keep: str):
        super().__init__()
        self.encoder = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.GELU(), torch.nn.Linear(128, 32))
        self.keep = keep
        self.reconstruction_targets = []
        self.running_mean = torch.zeros(())

    def forward(self, x):
        h = self.encoder(x)
        if self.keep == "outputs":
            # The bug of the notes gpuctl grew from: a module attribute that keeps each
            # step's outputs, graphs and all.
            self.reconstruction_targets.append(h * 2)
        elif self.keep == "detached":
            self.reconstruction_targets.append((h * 2).detach())
        elif self.keep == "running mean":
            # A running value updated without .detach(): one tensor whose graph grows a
            # link a step.
            self.running_mean = 0.9 * self.running_mean + 0.1 * h.mean()
        return h


def train_loop(keep: str, steps: int = 80, **monitor_options):
    """A training loop in the seeds' style; `keep` says what it keeps across steps."""
    torch.manual_seed(0)
    model = Net(keep)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    monitor = MemoryMonitor(**monitor_options)
    losses = []
    recent = collections.deque(maxlen=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(steps):
            # A batch that grows each step (a variable sequence length at its worst): the
            # loop's own tensors grow with it, and are no leak.
            out = model(torch.randn(16 + step if keep == "growing batch" else 16, 32))
            loss = out.pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if keep == "losses":
                losses.append(loss)  # a logged loss, autograd history and all
            elif keep == "recent":
                recent.append(out)  # a bounded buffer
            elif keep == "detached":
                losses.append(loss.item())
            monitor.step()
    return monitor, [w for w in caught if issubclass(w.category, MemoryLeakWarning)]


def test_the_seeds_leak_is_named_with_its_attribute_and_detach():
    monitor, warned = train_loop("outputs")
    assert len(warned) == 1, "one warning per source, however long the leak goes on"
    assert warned[0].filename == __file__, "the warning points at the line that called step()"
    message = str(warned[0].message)
    assert message.startswith("Net.reconstruction_targets (list, "), message
    assert "/step)" in message and ".detach()" in message and "torch.no_grad()" in message
    (leak,) = monitor.leaks
    assert leak.source == "Net.reconstruction_targets" and leak.kind == "list"
    # Each step keeps one 16 x 32 float32 output (and the scalar its graph saved).
    assert leak.tensors == leak.step and 16 * 32 * 4 <= leak.bytes_per_step <= 16 * 32 * 4 + 64
    assert issubclass(MemoryLeakWarning, UserWarning)


def test_a_logged_loss_kept_in_a_list_is_named_with_item():
    monitor, warned = train_loop("losses")
    assert len(warned) == 1
    message = str(warned[0].message)
    assert message.startswith("losses in train_loop() (list, "), message
    assert "losses.append(loss.item())" in message
    assert [leak.source for leak in monitor.leaks] == ["losses in train_loop()"]


def test_a_running_value_kept_with_its_graph_is_named_by_its_growing_graph():
    monitor, warned = train_loop("running mean")
    assert len(warned) == 1
    message = str(warned[0].message)
    assert message.startswith("Net.running_mean (tensor, 1 tensor, +"), message
    # Each step adds 0.9 * previous, 0.1 * h.mean() and their sum to the chain: 16 bytes of
    # scalars, and four graph nodes.
    assert message.startswith("Net.running_mean (tensor, 1 tensor, +16 B/step, +4 graph nodes/step)"), message
    assert "(running_mean = value.item()), or store value.detach()" in message
    (leak,) = monitor.leaks
    assert leak.tensors == 1 and leak.nodes_per_step >= 1


@pytest.mark.parametrize("keep", ["detached", "recent", "nothing", "growing batch"])
def test_a_detached_loop_and_a_bounded_buffer_get_no_warning(keep):
    monitor, warned = train_loop(keep)
    assert warned == [] and monitor.leaks == []
    assert monitor.steps == 80 and monitor.census_seconds > 0


def make_history():
    """A logger whose history lives in a closure: no frame or global names the list."""
    history = []

    def record(output):
        history.append(output)

    return record


def test_a_leak_in_a_closure_is_found_by_the_sweep_through_gc_referrers():
    torch.manual_seed(0)
    model = Net("nothing")
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    monitor = MemoryMonitor(check_every=5, sweep_every=1, census_share=None, census_limit_s=30)
    record = make_history()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(20):
            out = model(torch.randn(8, 32))
            out.pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            record(out * 1.0)
            monitor.step()
    warned = [str(w.message) for w in caught if issubclass(w.category, MemoryLeakWarning)]
    assert len(warned) == 1 and warned[0].startswith(
        "history (closure of make_history.<locals>.record) (list, 15 tensors, +1 KiB/step)"), warned
    assert "(history.append(x.detach())" in warned[0]
    # Without the sweep the census does not look inside closures: nothing is said.
    monitor = MemoryMonitor(check_every=5, sweep_every=None, census_share=None)
    record = make_history()
    for _ in range(20):
        record(model(torch.randn(8, 32)) * 1.0)
        monitor.step()
    assert monitor.leaks == []


def test_the_sweep_names_a_global_of_a_module_no_frame_is_in(monkeypatch):
    cache = types.ModuleType("leaky_cache")
    cache.HISTORY = []
    monkeypatch.setitem(sys.modules, "leaky_cache", cache)
    model = torch.nn.Linear(4, 4)
    monitor = MemoryMonitor(check_every=2, sweep_every=1, census_share=None, census_limit_s=30)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(8):
            sys.modules["leaky_cache"].HISTORY.append(model(torch.randn(2, 4)))
            monitor.step()
    assert [leak.source for leak in monitor.leaks] == ["leaky_cache.HISTORY"]
    assert [str(w.message).split(" keeps ")[0] for w in caught] == [
        "leaky_cache.HISTORY (list, 6 tensors, +64 B/step, +2 graph nodes/step)"]  # output and saved input


def test_a_sweep_cut_off_by_the_limit_is_not_taken_again(capfd):
    model = torch.nn.Linear(4, 4)
    monitor = MemoryMonitor(check_every=1, sweep_every=1, census_share=None, census_limit_s=1e-9)
    record = make_history()
    for _ in range(3):
        record(model(torch.randn(2, 4)))
        monitor.step()
    assert monitor.sweep_every is None and monitor.leaks == []
    assert "sweep through every object stopped at its limit (1e-09 s) at step 1: no more sweeps" in capfd.readouterr().err


class Hostile:
    """An object of the user's whose attributes cannot be read."""

    @property
    def __dict__(self):
        raise RuntimeError("attributes are not for reading")


def test_a_census_that_fails_never_ends_the_training_run(capfd):
    hostile = Hostile()  # noqa: F841 - a local of the loop, where the census looks
    monitor = MemoryMonitor(check_every=2)
    for _ in range(6):
        assert monitor.step() == []
    assert monitor.steps == 6
    err = capfd.readouterr().err
    assert err.count("the leak census failed at step 2 (RuntimeError: attributes are not for reading): "
                     "no more censuses in this run") == 1, err


def test_the_census_runs_every_check_every_steps_and_refuses_a_bad_interval():
    monitor, _ = train_loop("nothing", steps=30, check_every=7, census_share=None)
    assert monitor._next_census == 35  # censuses at 7, 14, 21 and 28
    with pytest.raises(gpuctl.UsageError, match="check_every 0 must be a whole number of at least 1"):
        MemoryMonitor(check_every=0)


# torch 2.11's message for an allocation that failed, as a CUDA run prints it.
TORCH_OOM = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
             "1.50 GiB is free. Including non-PyTorch memory, this process has 66.50 GiB memory in use. Of the "
             "allocated memory 60.00 GiB is allocated by PyTorch, and 6.00 GiB is reserved by PyTorch but "
             "unallocated. If reserved but unallocated memory is large try setting "
             "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")


# Another user's job: a process of uid 65534 whose parent (a shell of that job, here a
# Python process) lives on. It is not this test's child, as another user's job is not.
ANOTHER_USERS_JOB = r"""
import os, sys, time
# Forked twice, the job is reparented away: another user's job, not a process below this one.
if os.fork() == 0:
    pid = os.fork()
    if pid:
        print(pid, flush=True)
        os._exit(0)
    os.setgid(65534)
    os.setuid(65534)
    os.execv("/bin/sleep", ["sleep", "600"])
os.wait()
time.sleep(600)
"""


@pytest.fixture
def another_users_job(procs):
    assert os.geteuid() == 0, "this test starts a process as another user (uid 65534): run it as root"
    shell = procs.python(ANOTHER_USERS_JOB)
    pid = procs.stray(int(shell.stdout.readline()))
    wait_until(lambda: "\nUid:\t65534\t" in open(f"/proc/{pid}/status").read() and
               open(f"/proc/{pid}/comm").read().strip() == "sleep", what="the other user's job to start")
    return pid


def test_explain_oom_names_another_users_job_and_an_orphaned_worker(sim, scenario, crashed_run, another_users_job,
                                                                    monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    worker, sibling = crashed_run(2)  # a crashed run's DataLoader workers, still on the GPU
    other = another_users_job
    sim.write(scenario.process(os.getpid(), gpu=0, used=60 * GIB, sm_pct=90)
              .process(worker, gpu=0, used=8 * GIB, sm_pct=0)
              .process(sibling, gpu=0, used=1 * GIB, sm_pct=0)
              .process(other, gpu=0, used=10 * GIB, sm_pct=50))
    other_user = pwd.getpwuid(65534).pw_name

    text = explain_oom(torch.cuda.OutOfMemoryError(TORCH_OOM))
    lines = text.splitlines()
    assert lines[0].startswith("out of memory on cuda:0: tried to allocate 2.00 GiB (GPU 0, NVIDIA H100 80GB HBM3, GPU-")
    assert lines[0].endswith("found through NVML's index (CUDA_VISIBLE_DEVICES is not set))"), lines[0]
    # torch's figures, read from its message where CUDA is not up here.
    assert "this process: 60.00 GiB allocated by torch, 66.00 GiB reserved (fragmentation 9%)" in text
    assert "this process holds 60.00 GiB of it" in text
    # Every other process, largest first, with its user and what gpuctl clear finds of it.
    listed = [line for line in lines if line.startswith("  pid ")]
    assert listed[0].startswith(f"  pid {other} {other_user} 10.00 GiB: sleep 600 (live (sleeping))"), listed
    assert listed[1].startswith(f"  pid {worker} root 8.00 GiB: ") and "(orphaned: " in listed[1], listed
    assert listed[2].startswith(f"  pid {sibling} root 1.00 GiB: ") and len(listed) == 3, listed
    # The remedies: clear frees the orphan, the other user is asked, this process's own
    # size, and the fragmentation: 2 GiB asked for, 6 GiB reserved but unallocated.
    remedies = text.split("what to do:\n")[1]
    assert f"pid {worker} (root, 8.00 GiB) is an orphaned worker of a run that ended: `gpuctl clear` frees it" in remedies
    assert f"pid {other} (10.00 GiB) is {other_user}'s live job: ask {other_user} before anything" in remedies
    assert "the allocator is fragmented: it holds 6.00 GiB reserved but unallocated" in remedies
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in remedies and "gpuctl.enable()" in remedies
    assert "OOMRecovery(model, batch_size, micro_batch=\"auto\")" in remedies
    assert alive(worker) and alive(sibling), "explaining ends nothing"

    # A request larger than the reserved-but-unallocated memory is no fragmentation.
    assert f"pid {sibling} (root, 1.00 GiB) is an orphaned worker" in remedies
    assert "fragmented" not in explain_oom(TORCH_OOM.replace("allocate 2.00 GiB", "allocate 8.00 GiB"))

    # What OOMRecovery and the decorator raise at micro-batch 1 carries the same account.
    model = torch.nn.Linear(4, 4)
    rec = OOMRecovery(model, batch_size=2, micro_batch=1, inject_oom_above=0, log=lambda line: None)
    with pytest.raises(OutOfMemoryAtOne) as raised:
        rec.step(torch.randn(2, 4), lambda mb: model(mb).sum())
    assert f"pid {worker} (root, 8.00 GiB) is an orphaned worker" in str(raised.value)

    @find_executable_micro_batch(batch_size=4, inject_oom_above=0, log=lambda line: None)
    def never_fits(micro_batch, accumulation):
        return None

    with pytest.raises(torch.cuda.OutOfMemoryError) as final:
        never_fits()
    assert "injected by gpuctl" in str(final.value) and f"is {other_user}'s live job" in str(final.value)


def test_oom_recovery_says_when_the_allocator_was_fragmented():
    model = torch.nn.Linear(4, 4)
    failures = [torch.cuda.OutOfMemoryError(TORCH_OOM)]

    def loss(mb):
        if failures:
            raise failures.pop()
        return model(mb).sum()

    logged = []
    rec = OOMRecovery(model, batch_size=8, micro_batch=8, log=logged.append)
    rec.step(torch.randn(8, 4), loss)
    assert rec.micro_batch == 4 and len(logged) == 1
    assert logged[0].startswith("out of memory at step 0 (CUDA out of memory. Tried to allocate 2.00 GiB.")
    assert "for the same batch of 8; the allocator is fragmented: it holds 6.00 GiB reserved but unallocated" in logged[0]
    assert "expandable_segments:True" in logged[0]


def test_explain_oom_maps_the_cuda_device_through_cuda_visible_devices(sim, scenario, procs, monkeypatch):
    job = procs.sleeper()
    sim.write(scenario.process(job.pid, gpu=1, used=4 * GIB, sm_pct=50))
    uuid = gpuctl.snapshot().devices[1].uuid
    for visible, device in (("1", 0), ("0,1", "cuda:1"), (uuid[:12], 0), (f"{uuid},0", torch.device("cuda", 0))):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        text = explain_oom("CUDA out of memory. Tried to allocate 1.00 GiB.", device=device)
        assert f"(GPU 1, NVIDIA H100 80GB HBM3, {uuid}, found through CUDA_VISIBLE_DEVICES={visible})" in text, text
        assert f"  pid {job.pid} root 4.00 GiB: sleep 600" in text
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert "(CUDA_VISIBLE_DEVICES=1 makes no cuda:1 visible)" in explain_oom(TORCH_OOM, device=1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-nothing-like-it")
    assert "no GPU NVML lists matches 'GPU-nothing-like-it'" in explain_oom(TORCH_OOM)
    with pytest.raises(gpuctl.UsageError, match="explain_oom: device 'cpu' is not a CUDA device"):
        explain_oom(TORCH_OOM, device="cpu")


def counted_peak(model, batch, optimizer, loss_fn):
    """A real training step's peak on the CPU, counted from the CPU allocator's own
    allocation and release events (torch's profiler), on top of what was allocated
    before it: parameters, optimizer state (a first step made it) and the batch."""
    loss_fn(model, batch).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    before = sum(t.untyped_storage().nbytes() for t in [*model.parameters(), *state, batch])
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as profiler:
        loss_fn(model, batch).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    events = sorted((e for e in profiler.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    assert events, "the profiler recorded no allocation"
    live = peak = 0
    for event in events:
        live += event.nbytes()
        peak = max(peak, live)
    return before + peak


def mean_output(model, batch):
    return model(batch).float().mean()


@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events")
@pytest.mark.parametrize("name", ["mlp", "transformer block"])
def test_estimate_is_within_15_percent_of_a_counted_peak(name):
    torch.manual_seed(0)
    if name == "mlp":
        model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1024),
                                    torch.nn.GELU(), torch.nn.Linear(1024, 256))
        shape, sizes = (256,), (4, 512, 2048)
    else:
        model = torch.nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=512, batch_first=True,
                                                 dropout=0.0)
        shape, sizes = (64, 128), (4, 32, 96)
    before = [p.detach().clone() for p in model.parameters()]
    found = estimate(model, torch.randn(2, *shape), optimizer="adamw")
    params = sum(p.numel() * 4 for p in model.parameters())
    assert found.parameters_bytes == found.gradients_bytes == params
    assert found.optimizer_bytes >= 2 * params  # AdamW: two moments per parameter
    assert found.activations_per_sample_bytes > 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters())), "the model is left as it was"
    assert all(p.grad is None for p in model.parameters())
    for n in sizes:
        work = copy.deepcopy(model)
        real = counted_peak(work, torch.randn(n, *shape), torch.optim.AdamW(work.parameters(), lr=1e-3), mean_output)
        assert abs(found.peak_bytes(n) / real - 1) <= 0.15, f"{name} at {n}: estimated {found.peak_bytes(n)}, counted {real}"
    # The largest micro-batch that fits is the last whose peak does.
    budget = found.peak_bytes(sizes[-1])
    fits = found.largest_micro_batch(budget)
    assert fits >= sizes[-1] and found.peak_bytes(fits) <= budget < found.peak_bytes(fits + 1)
    assert found.largest_micro_batch(found.peak_bytes(1) - 1) == 0


def test_estimate_on_the_meta_device_counts_what_the_cpu_does_without_the_memory():
    def mlp():
        return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))

    torch.manual_seed(0)
    on_cpu = estimate(mlp(), torch.randn(2, 256))
    with torch.device("meta"):
        model = mlp()  # built where no memory is taken: a model too large for this machine would be too
    on_meta = estimate(model, torch.randn(1, 256, device="meta"))
    assert repr(on_meta) == repr(on_cpu)
    assert [on_meta.peak_bytes(n) for n in (1, 64, 4096)] == [on_cpu.peak_bytes(n) for n in (1, 64, 4096)]
    assert on_meta.how == "tensor storage counted on meta"


def test_estimate_in_bfloat16_halves_the_parameters_and_refuses_an_unknown_optimizer():
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    full = estimate(model, torch.randn(1, 64), optimizer="sgd")
    half = estimate(model, torch.randn(1, 64), optimizer=None, dtype="bf16")
    assert half.parameters_bytes * 2 == full.parameters_bytes and full.optimizer_bytes == 0
    assert next(model.parameters()).dtype == torch.float32
    with pytest.raises(gpuctl.UsageError, match="estimate: optimizer 'lion'"):
        estimate(model, torch.randn(2, 64), optimizer="lion")


def test_oom_recovery_auto_starts_at_the_estimate():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))
    found = estimate(model, torch.randn(2, 256))
    # Room for 400 samples' activations and a half.
    free = found.peak_bytes(400) + found.activations_per_sample_bytes // 2
    logged = []
    rec = OOMRecovery(model, batch_size=1024, micro_batch="auto", estimate=found, free_bytes=free, log=logged.append)
    assert rec.micro_batch == found.largest_micro_batch(free) == 400
    # Memory as gpuctl-core writes it (the trainer's two decimals from GiB up).
    size = functools.partial(gpuctl._gpuctl.bytes, decimals=2)
    assert logged == [f"micro-batch 400 from the estimate: a step's peak {size(found.peak_bytes(400))} of "
                      f"{size(free)} free ({found.activations_per_sample_bytes // 1024} KiB of activations "
                      f"per sample); 3 accumulation steps for the batch of 1024"]
    # A step goes on from there, in micro-batches of 400.
    seen = []
    rec.step(torch.randn(1024, 256), lambda mb: seen.append(mb.shape[0]) or model(mb).mean())
    assert seen == [400, 400, 224]
    # Without an estimate, "auto" is the whole batch, as before; a batch smaller than the
    # estimate's micro-batch is the micro-batch.
    assert OOMRecovery(model, batch_size=64).micro_batch == 64
    assert OOMRecovery(model, batch_size=16, estimate=found, free_bytes=free, log=logged.append).micro_batch == 16


def test_the_type_stub_declares_every_public_name_with_its_parameters():
    import ast
    import inspect

    import gpuctl.torch as module

    stub = ast.parse(open(os.path.join(os.path.dirname(module.__file__), "__init__.pyi")).read())
    declared = {}
    for node in stub.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            declared[node.name] = node
        elif isinstance(node, ast.ImportFrom):
            declared.update({alias.asname or alias.name: node for alias in node.names})
    missing = [name for name in module.__all__ if name not in declared]
    assert missing == [], f"gpuctl/torch/__init__.pyi lacks {missing}"

    def parameters(function):
        args = function.args
        return [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs if a.arg != "self"]

    for name in module.__all__:
        node, runtime = declared[name], getattr(module, name)
        if isinstance(node, ast.ClassDef):
            init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
            if init is None or runtime.__init__ is object.__init__:
                continue
            node, runtime = init, runtime.__init__
        elif not isinstance(node, ast.FunctionDef):
            continue
        expected = [p for p in inspect.signature(runtime).parameters if p != "self"]
        assert parameters(node) == expected, f"gpuctl/torch/__init__.pyi's {name}: {parameters(node)} != {expected}"
