"""What the modules of gpuctl.torch share: the log line, memory as gpuctl writes it, the
processes below this one, tensor storages and batches, and torch's caching allocator's figures."""

from __future__ import annotations

import os
import sys

import torch

import gpuctl
from gpuctl import _gpuctl

_GIB = float(1 << 30)


def _bytes(value) -> str:
    """Memory in a message, as gpuctl-core writes it with the trainer's two decimals:
    ``3.00 GiB``, ``48 MiB``, ``12 B``; ``n/a`` for None."""
    if value is None:
        return "n/a"
    value = round(value)
    return _gpuctl.bytes(value, 2) if value >= 0 else "-" + _gpuctl.bytes(-value, 2)


def _log(line: str) -> None:
    print(f"gpuctl: {line}", file=sys.stderr, flush=True)


def _children() -> list:
    """The processes below this one (the DataLoader's workers, and theirs), sorted: core's
    process tree, as `gpuctl run` finds what is left below it."""
    return _gpuctl.descendants(os.getpid())


def _storage(tensor):
    """(key, bytes) of a tensor's storage; the key dedupes views of one storage."""
    try:
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        # No data (the meta device): the storage object itself is the identity.
        return ((storage.device, pointer) if pointer else id(storage)), storage.nbytes()
    except (RuntimeError, NotImplementedError, TypeError):  # sparse, nested: no plain storage
        return id(tensor), tensor.numel() * tensor.element_size()


def _tensors_in(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors_in(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors_in(item)


def _size(batch) -> int:
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    items = batch.values() if isinstance(batch, dict) else batch
    sizes = {t.shape[0] for t in items if isinstance(t, torch.Tensor)}
    if len(sizes) != 1:
        raise gpuctl.UsageError("OOMRecovery.step: the batch needs tensors that all have the same "
                                f"size along dim 0 (found sizes {sorted(sizes)})")
    return sizes.pop()


def _cuda_up() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def _fragmentation(allocated, reserved):
    """1 − allocated/reserved: the share of what the caching allocator holds that no tensor
    uses (0 when it holds nothing)."""
    if allocated is None or not reserved:
        return None if reserved is None else 0.0
    return max(0.0, 1.0 - allocated / reserved)


def _allocator(device) -> dict:
    """torch's caching allocator on a CUDA ``device``: allocated, reserved and peak bytes,
    fragmentation, allocation retries and the largest free block it holds."""
    stats = torch.cuda.memory_stats(device)
    allocated = stats.get("allocated_bytes.all.current", torch.cuda.memory_allocated(device))
    reserved = stats.get("reserved_bytes.all.current", torch.cuda.memory_reserved(device))
    largest = None
    try:
        index = torch.device("cuda", device).index if isinstance(device, int) else torch.device(device).index
        index = torch.cuda.current_device() if index is None else index
        largest = max((block["size"] for segment in torch.cuda.memory_snapshot() if segment["device"] == index
                       for block in segment["blocks"] if block["state"] == "inactive"), default=0)
    except (RuntimeError, KeyError, TypeError, ValueError):
        pass
    return {
        "allocated": allocated,
        "reserved": reserved,
        "peak": stats.get("allocated_bytes.all.peak", torch.cuda.max_memory_allocated(device)),
        "fragmentation": _fragmentation(allocated, reserved),
        "retries": stats.get("num_alloc_retries"),
        "largest_free_block": largest,
    }


def _fragmented(request, allocated, reserved):
    """The fragmentation sentence, where an allocation of ``request`` bytes failed although
    the allocator held more than that reserved but unallocated; else None."""
    if request is None or allocated is None or reserved is None:
        return None
    idle = reserved - allocated
    if request >= idle:
        return None
    return (f"the allocator is fragmented: it holds {_bytes(idle)} reserved but unallocated, more than the "
            f"{_bytes(request)} asked for, in pieces too small for it. Set "
            f"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before CUDA starts (gpuctl.enable() "
            f"does, keeping your own settings; or start the run with `gpuctl enable python train.py`)")
