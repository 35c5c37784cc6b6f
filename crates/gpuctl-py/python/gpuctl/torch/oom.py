"""Out-of-memory errors: which errors are one, and explain_oom, which turns one into what
to do, from torch's figures and gpuctl's view of the GPU."""

from __future__ import annotations

import os
import re

import torch

import gpuctl
from gpuctl import _gpuctl

from ._shared import _allocator, _bytes, _children, _cuda_up, _fragmentation, _fragmented


def logits_bytes(batch: int, seq: int, vocab: int, dtype=torch.float32) -> int:
    """The logits tensor's size: batch × seq × vocab × the element size (4 for float32),
    the formula of the notes gpuctl grew from."""
    if isinstance(dtype, str):
        dtype = getattr(torch, {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}.get(dtype, dtype))
    element = torch.empty((), dtype=dtype).element_size()
    for name, value in (("batch", batch), ("seq", seq), ("vocab", vocab)):
        if int(value) < 0:
            raise gpuctl.UsageError(f"logits_bytes: {name} {value} is negative")
    return int(batch) * int(seq) * int(vocab) * element


_OOM_TEXTS = ("CUDA out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDA error: out of memory",
              "cuDNN error: CUDNN_STATUS_ALLOC_FAILED", "HIP out of memory")


def is_out_of_memory(error: BaseException) -> bool:
    """A CUDA out-of-memory error: ``torch.cuda.OutOfMemoryError``, or a RuntimeError
    whose text is a CUDA, cuBLAS or cuDNN allocation failure."""
    if isinstance(error, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and any(t in str(error) for t in _OOM_TEXTS)


_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def _amount(pattern: str, text: str):
    """Bytes from a figure of torch's OOM message (``2.00 GiB``) that ``pattern`` finds."""
    found = re.search(pattern, text)
    if not found:
        return None
    return int(float(found.group(1)) * _UNITS.get(found.group(2), 1))


def _cuda_index(device, text: str) -> int:
    if device is None:
        found = re.search(r"GPU (\d+) has a total capacity", text)
        if found:
            return int(found.group(1))
        return torch.cuda.current_device() if _cuda_up() else 0
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    parsed = torch.device(device)
    if parsed.type != "cuda":
        raise gpuctl.UsageError(f"explain_oom: device {device!r} is not a CUDA device")
    return parsed.index if parsed.index is not None else (torch.cuda.current_device() if _cuda_up() else 0)


def _nvml_device(index: int, devices):
    """The NVML GPU behind CUDA device ``index``, and how it was found. With CUDA up, by
    the UUID CUDA gives it; without, as CUDA reads CUDA_VISIBLE_DEVICES (up to its first
    entry that names no GPU), each entry named as ``--gpu`` names a GPU (gpuctl-core's
    session.places), else NVML's index."""
    if _cuda_up() and index < torch.cuda.device_count():
        uuid = str(torch.cuda.get_device_properties(index).uuid)
        for device in devices:
            ids = [device.uuid or ""] + [m.uuid or "" for m in device.mig_devices]
            if any(i.lower().endswith(uuid.lower()) for i in ids if i):
                return device, f"CUDA's UUID {uuid}"
        return None, f"no GPU NVML lists has the UUID CUDA gives cuda:{index} ({uuid})"
    try:
        gpu, _instance, how = _gpuctl.cuda_place(index, os.environ.get("CUDA_VISIBLE_DEVICES"))
    except gpuctl.Error as why:
        return None, str(why)
    found = next((d for d in devices if d.index == gpu), None)
    return found, how if found else f"{how}: GPU {gpu}, which gpuctl's snapshot does not show"


def _clear_would(index: int) -> dict:
    """What `gpuctl clear` would do on NVML GPU ``index``, by pid: ("frees", reason, None,
    kinds), ("cannot", reason, why not, kinds) or ("reports", reason, None, kinds), with the
    kinds of the findings behind it (``orphaned``, ``zombie_holder``...). The reasons are
    escaped for the terminal; the JSON keeps what processes chose exact."""
    document = gpuctl.clear(gpus=[index], dry_run=True).to_dict()
    found = {}
    for outcome in document.get("outcomes", []):
        reason = _gpuctl.escape("; ".join(outcome.get("reasons") or []) or "a leftover")
        kinds = tuple(outcome.get("kinds") or ())
        if outcome.get("action") == "skip":
            found[outcome["pid"]] = ("cannot", reason, _gpuctl.escape(outcome.get("skipped") or "skipped"), kinds)
        else:
            found[outcome["pid"]] = ("frees", reason, None, kinds)
    for finding in document.get("reported", []):
        identity = finding.get("identity") or {}
        if identity.get("pid") is not None and identity["pid"] not in found:
            reason = _gpuctl.escape(finding.get("reason") or finding.get("kind"))
            found[identity["pid"]] = ("reports", reason, None, (finding.get("kind"),))
    return found


# What a leftover is, by the kind of finding `gpuctl clear` has of it.
_LEFTOVERS = (("orphaned", "an orphaned worker of a run that ended"), ("zombie_holder", "a zombie holder"))


def _leftover(kinds) -> str:
    return next((what for kind, what in _LEFTOVERS if kind in kinds), "a leftover of a run that ended")


def explain_oom(error, device=None, *, seq_len: int | None = None, vocab_size: int | None = None,
                logits_dtype=torch.float32) -> str:
    """An out-of-memory error turned into what to do, in a few lines.

    ``error`` is the exception (or its text); ``device`` the CUDA device it happened on
    (``0``, ``"cuda:1"``; default: the one torch's message names, else the current one).
    From torch (where CUDA is up): the request, this process's allocated and reserved
    memory and their fragmentation. From gpuctl's snapshot of that GPU (the CUDA device
    mapped to NVML's through its UUID; without CUDA, through CUDA_VISIBLE_DEVICES): every
    other process on it with its pid, user, owner, memory, and what `gpuctl clear` finds of
    it. Then the remedy: `gpuctl clear` for an orphaned or zombie holder, whom to ask for
    another user's live job, OOMRecovery or a smaller micro-batch for this process's own
    size (with one sample's logits where ``seq_len`` and ``vocab_size`` are given), and
    ``expandable_segments`` where the allocator is fragmented. Never raises for what it
    cannot read: it says so in the text.
    """
    text = str(error) if error is not None else ""
    index = _cuda_index(device, text)
    request = _amount(r"Tried to allocate ([\d.]+) (B|KiB|MiB|GiB|TiB)", text)
    lines, todo = [], []
    allocated = reserved = retries = None
    figures = None
    if _cuda_up() and index < torch.cuda.device_count():
        try:
            figures = _allocator(index)
            allocated, reserved, retries = figures["allocated"], figures["reserved"], figures["retries"]
        except RuntimeError:  # CUDA itself in error: what torch's message says, below
            figures = None
    if figures is None:  # torch's own message still says what the allocator held
        allocated = _amount(r"([\d.]+) (B|KiB|MiB|GiB|TiB) is allocated by PyTorch", text)
        idle = _amount(r"([\d.]+) (B|KiB|MiB|GiB|TiB) is reserved by PyTorch but unallocated", text)
        reserved = None if allocated is None or idle is None else allocated + idle
    asked = f": tried to allocate {_bytes(request)}" if request is not None else ""
    head = f"out of memory on cuda:{index}{asked}"
    if allocated is not None:
        frag = _fragmentation(allocated, reserved)
        lines.append(f"this process: {_bytes(allocated)} allocated by torch, {_bytes(reserved)} reserved"
                     + (f" (fragmentation {frag:.0%}" + (f", {retries} allocation retries)" if retries is not None else ")")
                        if frag is not None else ""))
    me = os.getpid()
    mine = 0
    try:
        devices = gpuctl.snapshot().devices
        gpu, how = _nvml_device(index, devices)
    except Exception as failure:  # noqa: BLE001 - an explanation, never a second error
        gpu, how = None, f"gpuctl could not read the GPUs: {failure}"
    if gpu is None:
        head += f" ({how})"
    else:
        head += f" (GPU {gpu.index}, {gpu.name or 'unnamed'}, {gpu.uuid}, found through {how})"
        used, total = gpu.memory_used, gpu.memory_total
        others = [p for p in gpu.processes if p.pid != me]
        mine = sum(p.used_bytes or 0 for p in gpu.processes if p.pid == me)
        lines.append(f"GPU {gpu.index}: {_bytes(used)} used of {_bytes(total)}; this process holds {_bytes(mine)} of it")
        try:
            verdicts = _clear_would(gpu.index)
        except Exception as failure:  # noqa: BLE001 - an explanation, never a second error
            verdicts = {}
            lines.append(f"(gpuctl clear could not judge the processes: {failure})")
        children = set(_children())
        freeable = []
        for p in sorted(others, key=lambda p: -(p.used_bytes or 0)):
            who = _gpuctl.escape(p.user) if p.user else "unknown user"
            owner = f", {_gpuctl.escape(p.owner)}" if p.owner else ""
            verdict = verdicts.get(p.pid)
            finding = verdict[1] if verdict else ("a child of this process" if p.pid in children else
                                                  f"live ({p.state})" if p.state else "live")
            lines.append(f"  pid {p.pid} {who}{owner} {_bytes(p.used_bytes)}: {_command(p.command)} ({finding})")
            size = _bytes(p.used_bytes)
            what = _leftover(verdict[3] if verdict else ())
            if verdict and verdict[0] == "frees":
                freeable.append(f"pid {p.pid} ({who}, {size}) is {what}: `gpuctl clear` frees it")
            elif verdict and verdict[0] == "cannot":
                todo.append(f"pid {p.pid} ({who}, {size}) is {what}, which `gpuctl clear` cannot end for you "
                            f"({verdict[2]}): ask {who} or an administrator to run it")
            elif verdict and verdict[0] == "reports":
                todo.append(f"pid {p.pid} ({who}, {size}), which `gpuctl clear` leaves: {verdict[1]}")
            elif p.pid in children:
                todo.append(f"pid {p.pid} ({size}) is this process's own child (a DataLoader worker?): it should "
                            f"not hold GPU memory: keep CUDA out of workers (no .cuda() in the Dataset)")
            elif p.user is not None and p.user == _user_name():
                todo.append(f"pid {p.pid} ({size}) is another live process of yours{owner}: end it if it is done "
                            f"(`gpuctl kill --pid {p.pid}`), or run on another GPU (gpuctl info)")
            else:
                job = f" ({_gpuctl.escape(p.owner)})" if p.owner else ""
                todo.append(f"pid {p.pid} ({size}) is {who}'s live job{job}: ask {who} before anything, or run on "
                            f"a GPU with room (gpuctl info)")
        todo[:0] = freeable  # what frees memory at once, first
    own = (f"this process's own size ({_bytes(allocated if allocated is not None else mine or None)}): "
           f"OOMRecovery(model, batch_size, micro_batch=\"auto\") keeps the effective batch with a smaller "
           f"micro-batch (gpuctl.torch.estimate gives the largest that fits), or lower the micro-batch")
    if seq_len and vocab_size:
        own += (f"; one sample's logits take {_bytes(logits_bytes(1, seq_len, vocab_size, logits_dtype))} "
                f"(logits_bytes(1, {seq_len}, {vocab_size}))")
    todo.append(own)
    fragmented = _fragmented(request, allocated, reserved)
    if fragmented:
        todo.insert(0, fragmented)
    return "\n".join([head] + lines + ["what to do:"] + [f"  - {t}" for t in todo])


def _fragmented_in(text: str) -> str:
    """``; `` and the fragmentation sentence where torch's OOM message shows the request
    below the memory it held reserved but unallocated; else nothing."""
    request = _amount(r"Tried to allocate ([\d.]+) (B|KiB|MiB|GiB|TiB)", text)
    allocated = _amount(r"([\d.]+) (B|KiB|MiB|GiB|TiB) is allocated by PyTorch", text)
    idle = _amount(r"([\d.]+) (B|KiB|MiB|GiB|TiB) is reserved by PyTorch but unallocated", text)
    sentence = _fragmented(request, allocated, None if allocated is None or idle is None else allocated + idle)
    return f"; {sentence}" if sentence else ""


def _explained(text: str, **keywords) -> str:
    """explain_oom for an error path: its failure is said, never raised over the OOM."""
    try:
        return explain_oom(text, **keywords)
    except Exception as failure:  # noqa: BLE001
        return f"(gpuctl.torch.explain_oom could not explain it: {type(failure).__name__}: {failure})"


def _command(command) -> str:
    """A process's command on one line: whitespace collapsed, cut at 60 characters, its
    control and bidirectional characters escaped as gpuctl's tables escape them."""
    if not command:
        return "?"
    text = " ".join(command.split())
    return _gpuctl.escape(text if len(text) <= 60 else text[:59] + "…")


def _user_name():
    try:
        import pwd
        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        return None
