"""estimate: the peak memory of one training step, per sample, measured before a run by
counting tensor storage at micro-batches 1 and 2."""

from __future__ import annotations

import weakref

import torch

import gpuctl

from ._shared import _bytes, _size, _storage, _tensors_in


class Estimate:
    """The memory of one training step, measured at micro-batches 1 and 2.

    The step's live tensor bytes are recorded at each allocation and release, at both
    micro-batches: each moment of the step is a line, ``c + n × d`` bytes at micro-batch
    ``n``, and the step's peak at ``n`` is the highest of those lines (the moment of the
    peak moves with ``n``: the end of backward for a small batch, the start for a large
    one). ``parameters_bytes``, ``gradients_bytes``, ``optimizer_bytes`` (its state),
    ``activations_per_sample_bytes`` (the steepest line's slope: what each sample adds at
    the large-batch peak) and ``fixed_bytes`` (that line's intercept); ``how``: where it was
    measured."""

    __slots__ = ("parameters_bytes", "gradients_bytes", "optimizer_bytes", "activations_per_sample_bytes",
                 "fixed_bytes", "measured", "how", "_lines")

    def __init__(self, parameters, gradients, optimizer, lines, measured, how) -> None:
        self.parameters_bytes = int(parameters)
        self.gradients_bytes = int(gradients)
        self.optimizer_bytes = int(optimizer)
        self._lines = lines
        self.fixed_bytes, self.activations_per_sample_bytes = max(lines, key=lambda line: (line[1], line[0]))
        self.measured = dict(measured)
        self.how = how

    def peak_bytes(self, micro_batch: int) -> int:
        """The step's peak at ``micro_batch`` samples."""
        return max(c + d * int(micro_batch) for c, d in self._lines)

    def largest_micro_batch(self, free_bytes: int) -> int:
        """The largest micro-batch whose step fits in ``free_bytes`` (0: not even one)."""
        if self.peak_bytes(1) > free_bytes:
            return 0
        slopes = [(free_bytes - c) // d for c, d in self._lines if d > 0]
        return max(1, int(min(slopes))) if slopes else 1 << 30

    def __str__(self) -> str:
        return (f"parameters {_bytes(self.parameters_bytes)}, gradients {_bytes(self.gradients_bytes)}, optimizer state "
                f"{_bytes(self.optimizer_bytes)}, activations {_bytes(self.activations_per_sample_bytes)} per "
                f"sample; a step's peak {_bytes(self.peak_bytes(1))} at micro-batch 1 ({self.how})")

    def __repr__(self) -> str:
        return (f"Estimate(parameters_bytes={self.parameters_bytes}, gradients_bytes={self.gradients_bytes}, "
                f"optimizer_bytes={self.optimizer_bytes}, activations_per_sample_bytes="
                f"{self.activations_per_sample_bytes}, fixed_bytes={self.fixed_bytes})")


def _lines(one: list, two: list) -> list:
    """The (intercept, slope) lines through each moment of the step at micro-batches 1 and
    2, less those another line is above at every micro-batch of 1 and more."""
    if len(one) != len(two):
        # The two steps did not allocate in the same order: their peaks alone.
        one, two = [max(one)], [max(two)]
    lines = sorted({(a - (b - a), b - a) for a, b in zip(one, two)}, key=lambda line: (-line[1], -line[0]))
    kept = []
    for c, d in lines:  # by slope, steepest first: kept only if higher at micro-batch 1
        if not kept or c + d > max(kc + kd for kc, kd in kept):
            kept.append((c, d))
    return kept


class _AllocationCounter:
    """The bytes of tensor storage alive, counted from every operator's outputs (a
    TorchDispatchMode: forward, backward and the optimizer alike) and each storage's
    release (a finalizer), starting from the storages alive before; ``peak`` is the most."""

    def __init__(self, resident) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self
        self.live = 0
        self.peak = 0
        self.timeline: list = []
        self._known: set = set()
        for tensor in resident:
            self._track(tensor, finalize=False)
        self.peak = self.live

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for tensor in _tensors_in(out):
                    counter._track(tensor)
                return out

        self.mode = Mode()

    def _track(self, tensor, finalize: bool = True) -> None:
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError, TypeError):
            return
        key = id(storage)
        if key in self._known:
            return
        nbytes = storage.nbytes()
        self._known.add(key)
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        self.timeline.append(self.live)
        if finalize:
            weakref.finalize(storage, self._release, key, nbytes)

    def _release(self, key, nbytes) -> None:
        self._known.discard(key)
        self.live -= nbytes
        self.timeline.append(self.live)


def _rows(sample, n: int):
    """``n`` rows of a sample batch (repeated where it has fewer), in tensors of their own:
    a view of a larger sample would charge the whole sample's storage to every micro-batch."""
    index = torch.arange(n) % _size(sample)

    def take(t):
        return t.index_select(0, index.to(t.device)) if isinstance(t, torch.Tensor) else t
    if isinstance(sample, torch.Tensor):
        return take(sample)
    if isinstance(sample, dict):
        return {k: take(v) for k, v in sample.items()}
    return type(sample)(take(v) for v in sample)


def _default_loss(model, batch):
    out = model(**batch) if isinstance(batch, dict) else model(*batch) if isinstance(batch, (tuple, list)) else model(batch)
    if hasattr(out, "loss") and isinstance(out.loss, torch.Tensor):
        return out.loss
    tensor = next(_tensors_in(out), None)
    if tensor is None:
        raise gpuctl.UsageError("estimate: the model returned no tensor: give loss_fn=lambda model, batch: ...")
    return tensor.float().mean()


_OPTIMIZERS = {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD"}


def _bytes_of(tensors) -> int:
    seen, total = set(), 0
    for tensor in tensors:
        key, nbytes = _storage(tensor)
        if key not in seen:
            seen.add(key)
            total += nbytes
    return total


def estimate(model, sample, optimizer="adamw", dtype=None, *, loss_fn=None) -> Estimate:
    """The peak memory of one training step, per sample, before a run.

    A copy of ``model`` (cast to ``dtype`` where given: its floating parameters, and the
    sample's floating tensors) takes
    training steps on ``sample`` (a batch, as :class:`OOMRecovery` takes them; a batch of
    one is repeated) at micro-batch 1 and 2 with ``optimizer`` (``"adamw"``, ``"adam"``,
    ``"sgd"``, None, or a callable that makes one from the parameters), after a first step
    that creates the optimizer's state, on the model's device (a model built on the meta
    device is counted without memory or arithmetic), counting the bytes of every
    operator's output storage until it is freed (the CUDA allocator's rounding and cache
    are not in it). Each moment of the step is fitted to a line in the micro-batch
    (:class:`Estimate`). ``loss_fn(model, batch)`` gives the loss (default: the mean of the model's
    output, or its ``.loss``). The model itself is left as it was.
    """
    import copy

    if isinstance(optimizer, str) and optimizer.lower() not in _OPTIMIZERS:
        raise gpuctl.UsageError(f"estimate: optimizer {optimizer!r}: give \"adamw\", \"adam\", \"sgd\", None or a "
                                f"callable that makes one from the parameters")
    _size(sample)  # a batch with one size along dim 0, or a clear error
    work = copy.deepcopy(model)
    if dtype is not None:
        dtype = getattr(torch, {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}.get(dtype, dtype)) \
            if isinstance(dtype, str) else dtype
        for parameter in work.parameters():
            if parameter.is_floating_point():
                parameter.data = parameter.data.to(dtype)
    work.train()
    parameters = [p for p in work.parameters()]
    trained = [p for p in parameters if p.requires_grad]
    if optimizer is None:
        made = None
    elif isinstance(optimizer, str):
        made = getattr(torch.optim, _OPTIMIZERS[optimizer.lower()])(trained, lr=1e-3)
    else:
        made = optimizer(trained)
    loss_of = loss_fn or _default_loss
    device = parameters[0].device if parameters else torch.device("cpu")

    def to(t):
        if not isinstance(t, torch.Tensor):
            return t
        return t.to(device, dtype) if dtype is not None and t.is_floating_point() else t.to(device)

    def moved(batch):
        if isinstance(batch, dict):
            return {k: to(v) for k, v in batch.items()}
        return to(batch) if isinstance(batch, torch.Tensor) else type(batch)(to(v) for v in batch)

    def step(batch):
        loss_of(work, batch).backward()
        if made is not None:
            made.step()
        for p in trained:
            p.grad = None

    step(moved(_rows(sample, 1)))  # the first step creates the optimizer's state
    state = [t for s in (made.state.values() if made is not None else ()) for t in _tensors_in(s)]
    timelines, measured = {}, {}

    def measure(n):
        batch = moved(_rows(sample, n))
        counter = _AllocationCounter(parameters + state + list(_tensors_in(batch)))
        with counter.mode:
            step(batch)
        timelines[n], measured[n] = counter.timeline or [counter.live], counter.peak

    measure(1)
    measure(2)
    first = 1
    if len(timelines[1]) != len(timelines[2]):
        # Micro-batch 1 took another road through the operators (a squeezed batch
        # dimension): the line is fitted from micro-batches 2 and 3.
        measure(3)
        first = 2
    one, two = timelines[first], timelines[first + 1]
    lines = [(c - d * (first - 1), d) for c, d in _lines(one, two)]
    return Estimate(parameters=_bytes_of(parameters), gradients=_bytes_of(trained), optimizer=_bytes_of(state),
                    lines=lines, measured=measured, how=f"tensor storage counted on {device}")
