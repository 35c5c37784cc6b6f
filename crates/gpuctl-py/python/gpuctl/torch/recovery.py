"""OOM recovery that keeps the effective batch: OOMRecovery, and the decorator
find_executable_micro_batch in the style of HF Accelerate's find_executable_batch_size."""

from __future__ import annotations

import functools

import torch

import gpuctl
from gpuctl import Error

from ._shared import _bytes, _log, _size
from .oom import _explained, _fragmented_in, is_out_of_memory, logits_bytes
from .sizing import Estimate


class OutOfMemoryAtOne(Error):
    """Out of memory at micro-batch 1: one sample does not fit. The message has the figures
    and what to change."""


def _slice(batch, start: int, stop: int):
    if isinstance(batch, torch.Tensor):
        return batch[start:stop]
    if isinstance(batch, dict):
        return {k: v[start:stop] if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    return type(batch)(v[start:stop] if isinstance(v, torch.Tensor) else v for v in batch)


class OOMRecovery:
    """Steps that survive CUDA out-of-memory errors and keep the effective batch.

    :meth:`step` splits the batch (a tensor, or a tuple, list or dict of tensors) along
    dim 0 into micro-batches of ``micro_batch``, scales each micro-loss by its share of the
    batch and calls backward, so the gradients are the whole batch's. On an OOM it drops the
    step's gradients and outputs, empties the cache, halves the micro-batch and redoes the
    step on the same samples: the parameters end where an unconstrained run's do. The
    micro-batch found is kept for later steps (:attr:`micro_batch`). At micro-batch 1 it
    raises :class:`OutOfMemoryAtOne` with the figures and what to change.

    Enter each step with the gradients cleared (``optimizer.zero_grad()``): on an OOM the
    step's gradients are dropped. ``micro_batch="auto"`` starts at the largest micro-batch
    that ``estimate`` (from :func:`estimate`) fits in ``free_bytes`` (default, on a CUDA
    model: the device's free memory plus what torch has reserved), else at the batch size,
    and lets the first OOMs find the largest one that fits. ``seq_len``, ``vocab_size`` and
    ``logits_dtype`` (optional) let the micro-batch-1 message say what one sample's logits
    take. ``inject_oom_above=N`` raises the OOM path for micro-batches above N (after their
    backward, as a real OOM in backward would), so recovery is tested on a CPU.
    """

    def __init__(self, model, batch_size: int, micro_batch="auto", *, estimate: Estimate | None = None,
                 free_bytes: int | None = None, inject_oom_above: int | None = None, seq_len: int | None = None,
                 vocab_size: int | None = None, logits_dtype=torch.float32, log=_log) -> None:
        if int(batch_size) < 1:
            raise gpuctl.UsageError(f"OOMRecovery: batch_size {batch_size} must be at least 1")
        if estimate is not None and not isinstance(estimate, Estimate):
            raise gpuctl.UsageError(f"OOMRecovery: estimate {type(estimate).__name__}: give gpuctl.torch.estimate(...)'s")
        self.estimate = estimate
        if micro_batch == "auto":
            micro_batch = self._from_estimate(model, int(batch_size), free_bytes, log)
        elif not isinstance(micro_batch, int) or isinstance(micro_batch, bool) or micro_batch < 1:
            raise gpuctl.UsageError(f"OOMRecovery: micro_batch {micro_batch!r}: give \"auto\" or a size of at least 1")
        self.model = model
        self.batch_size = int(batch_size)
        self._micro_batch = min(int(micro_batch), self.batch_size)
        self.inject_oom_above = inject_oom_above
        self.seq_len = seq_len
        self.vocab_size = vocab_size
        self.logits_dtype = logits_dtype
        self.recoveries = 0
        self.steps = 0
        self._log = log

    def _from_estimate(self, model, batch_size: int, free_bytes, log) -> int:
        if self.estimate is None:
            return batch_size
        if free_bytes is None:
            device = next((p.device for p in model.parameters()), torch.device("cpu"))
            if device.type != "cuda":
                log(f"micro-batch {batch_size} (the batch): no free memory known on {device} (give free_bytes=)")
                return batch_size
            free_bytes = torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device)
        fits = self.estimate.largest_micro_batch(int(free_bytes))
        micro = max(1, min(batch_size, fits))
        log(f"micro-batch {micro} from the estimate: a step's peak {_bytes(self.estimate.peak_bytes(micro))} of "
            f"{_bytes(free_bytes)} free ({_bytes(self.estimate.activations_per_sample_bytes)} of activations per "
            f"sample); {-(-batch_size // micro)} accumulation steps for the batch of {batch_size}")
        return micro

    @property
    def micro_batch(self) -> int:
        """The micro-batch in use: halved by each OOM."""
        return self._micro_batch

    def _drop_gradients(self) -> None:
        for parameter in self.model.parameters():
            parameter.grad = None

    def step(self, batch, loss_fn):
        """One optimizer step's gradients for ``batch``: ``loss_fn(micro_batch)`` returns a
        micro-batch's mean loss. Returns the batch's mean loss (detached)."""
        samples = _size(batch)
        while True:
            try:
                total = None
                for start in range(0, samples, self._micro_batch):
                    chunk = _slice(batch, start, start + self._micro_batch)
                    share = min(self._micro_batch, samples - start) / samples
                    loss = loss_fn(chunk)
                    (loss * share).backward()
                    if self.inject_oom_above is not None and self._micro_batch > self.inject_oom_above:
                        raise torch.cuda.OutOfMemoryError(
                            f"CUDA out of memory (injected by gpuctl: micro-batch {self._micro_batch} "
                            f"> {self.inject_oom_above})")
                    part = loss.detach() * share
                    total = part if total is None else total + part
                    del loss
                self.steps += 1
                return total
            except Exception as error:  # noqa: BLE001 - only OOMs are handled, the rest re-raised
                if not is_out_of_memory(error):
                    raise
                text = str(error)
                message = text.splitlines()[0] if text else type(error).__name__
                # The step's outputs go with the frame's locals; its gradients are dropped.
                loss = chunk = total = None
                error = None
                self._drop_gradients()
                if torch.cuda.is_available() and torch.cuda.is_initialized():
                    torch.cuda.empty_cache()
                if self._micro_batch == 1:
                    raise OutOfMemoryAtOne(self._unrecoverable(message, text)) from None
                self._micro_batch = max(1, self._micro_batch // 2)
                self.recoveries += 1
                self._log(f"out of memory at step {self.steps} ({message}); micro-batch halved to "
                          f"{self._micro_batch}, {-(-samples // self._micro_batch)} accumulation steps "
                          f"for the same batch of {samples}" + _fragmented_in(text))

    def _unrecoverable(self, message: str, text: str) -> str:
        params = sum(p.numel() * p.element_size() for p in self.model.parameters())
        figures = f"parameters {_bytes(params)}, their gradients {_bytes(params)}"
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            free, total = torch.cuda.mem_get_info()
            figures += (f", allocated {_bytes(torch.cuda.memory_allocated())}, reserved "
                        f"{_bytes(torch.cuda.memory_reserved())}, {_bytes(free)} free of {_bytes(total)}")
        share = None
        try:
            share = gpuctl.fraction()
        except gpuctl.Error:
            pass
        logits = ""
        if self.seq_len and self.vocab_size:
            one = logits_bytes(1, self.seq_len, self.vocab_size, self.logits_dtype)
            logits = (f"; one sample's logits alone take {_bytes(one)} (seq {self.seq_len} x vocab "
                      f"{self.vocab_size}): a shorter sequence, or a smaller vocabulary")
        limit = f"; this process may hold only {share:.0%} of a GPU (gpuctl fraction)" if share else ""
        return (f"out of memory at step {self.steps} even with micro-batch 1 ({message}); memory: {figures}. "
                f"One sample does not fit: try mixed precision (torch.autocast with bfloat16 halves "
                f"activations), gradient checkpointing, a smaller model{logits}, or free the GPU of "
                f"other processes (gpuctl info){limit}\n"
                + _explained(text, seq_len=self.seq_len, vocab_size=self.vocab_size, logits_dtype=self.logits_dtype))


def find_executable_micro_batch(batch_size: int, starting_micro_batch: int | None = None, *,
                                inject_oom_above: int | None = None, log=_log):
    """A decorator in the style of HF Accelerate's ``find_executable_batch_size`` that keeps
    the effective batch: the decorated function is called as ``function(micro_batch,
    accumulation_steps, *args, **kwargs)`` with ``micro_batch * accumulation_steps ==
    batch_size`` (the last accumulation step may be short when the micro-batch does not
    divide the batch); on a CUDA OOM it is called again with the micro-batch halved and the
    accumulation doubled, where Accelerate's halves the batch itself. At micro-batch 1 the
    OOM is raised as a ``torch.cuda.OutOfMemoryError`` whose text adds :func:`explain_oom`'s
    account of the GPU. ``inject_oom_above`` raises the OOM for micro-batches above it (tests)."""
    if int(batch_size) < 1:
        raise gpuctl.UsageError(f"find_executable_micro_batch: batch_size {batch_size} must be at least 1")

    def decorate(function):
        @functools.wraps(function)
        def run(*args, **kwargs):
            micro = min(int(starting_micro_batch or batch_size), int(batch_size))
            while True:
                accumulation = -(-int(batch_size) // micro)
                try:
                    if inject_oom_above is not None and micro > inject_oom_above:
                        raise torch.cuda.OutOfMemoryError(
                            f"CUDA out of memory (injected by gpuctl: micro-batch {micro} > {inject_oom_above})")
                    return function(micro, accumulation, *args, **kwargs)
                except Exception as error:  # noqa: BLE001 - only OOMs are handled
                    if not is_out_of_memory(error):
                        raise
                    if micro == 1:
                        raise torch.cuda.OutOfMemoryError(f"{error}\n{_explained(str(error))}") from error
                    error = None
                    if torch.cuda.is_available() and torch.cuda.is_initialized():
                        torch.cuda.empty_cache()
                    micro //= 2
                    log(f"out of memory: micro-batch halved to {micro}, {-(-int(batch_size) // micro)} "
                        f"accumulation steps, effective batch still {batch_size}")
        return run

    return decorate
