"""gpuctl for PyTorch training scripts: startup cleanup of a crashed run, memory at
milestones, and OOM recovery that keeps the effective batch.

Imported only where torch is installed (``import gpuctl`` never imports torch)::

    from gpuctl.torch import RunGuard, MemoryMonitor, OOMRecovery, logits_bytes

    with RunGuard("llama-ft", dir=checkpoint_dir):
        rec = OOMRecovery(model, batch_size=64, micro_batch=64)
        for batch in loader:
            loss = rec.step(batch, lambda mb: loss_fn(model(mb["x"]), mb["y"]))
            optimizer.step(); optimizer.zero_grad()

The adapter is :func:`find_executable_micro_batch`, in the style of HF Accelerate's
``find_executable_batch_size`` (the decorator users of hand-written loops already reach
for, and the loop the people gpuctl grew from write), chosen over a Lightning callback
because Lightning users already get accumulation from the Trainer, while Accelerate's
decorator halves the batch and so changes the effective batch (and the learning dynamics)
on every OOM. This one halves the micro-batch and doubles the accumulation instead.

The package's modules, by concern: ``guard`` (RunGuard), ``census`` and ``monitor``
(MemoryMonitor and its leak census), ``sizing`` (estimate), ``oom`` (explain_oom) and
``recovery`` (OOMRecovery, find_executable_micro_batch); every public name is here.
"""

from __future__ import annotations

from gpuctl import RunningError

from .census import Leak, MemoryLeakWarning
from .guard import Cleanup, RunGuard  # noqa: F401 - Cleanup: RunGuard.cleanup's type
from .monitor import MemoryMonitor
from .oom import explain_oom, is_out_of_memory, logits_bytes
from .recovery import OOMRecovery, OutOfMemoryAtOne, find_executable_micro_batch
from .sizing import Estimate, estimate

__all__ = [
    "Estimate",
    "Leak",
    "MemoryLeakWarning",
    "MemoryMonitor",
    "OOMRecovery",
    "OutOfMemoryAtOne",
    "RunGuard",
    "RunningError",
    "estimate",
    "explain_oom",
    "find_executable_micro_batch",
    "is_out_of_memory",
    "logits_bytes",
]
