"""gpuctl.torch's memory checklist with real torch (CPU): the leak census of
MemoryMonitor.step, fragmentation at milestones, explain_oom against nvml-sim with real
processes, and estimate against a counted peak."""

from __future__ import annotations

import collections
import warnings

import pytest
import torch

import gpuctl
from gpuctl.torch import MemoryLeakWarning, MemoryMonitor


class Net(torch.nn.Module):
    """The seeds' model: an encoder whose outputs it keeps as reconstruction targets."""

    def __init__(self, keep: str):
        super().__init__()
        self.encoder = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.GELU(), torch.nn.Linear(128, 32))
        self.keep = keep
        self.reconstruction_targets = []

    def forward(self, x):
        h = self.encoder(x)
        if self.keep == "outputs":
            # The bug of the notes gpuctl grew from: a module attribute that keeps each
            # step's outputs, graphs and all.
            self.reconstruction_targets.append(h * 2)
        elif self.keep == "detached":
            self.reconstruction_targets.append((h * 2).detach())
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
        for _ in range(steps):
            out = model(torch.randn(16, 32))
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


@pytest.mark.parametrize("keep", ["detached", "recent", "nothing"])
def test_a_detached_loop_and_a_bounded_buffer_get_no_warning(keep):
    monitor, warned = train_loop(keep)
    assert warned == [] and monitor.leaks == []
    assert monitor.steps == 80 and monitor.census_seconds > 0


def test_the_census_runs_every_check_every_steps_and_refuses_a_bad_interval():
    monitor, _ = train_loop("nothing", steps=30, check_every=7, census_share=None)
    assert monitor._next_census == 35  # censuses at 7, 14, 21 and 28
    with pytest.raises(gpuctl.UsageError, match="check_every 0 must be a whole number of at least 1"):
        MemoryMonitor(check_every=0)
