#!/usr/bin/env python3
"""The Python wheel's PyTorch side on a real GPU (scripts/gpu/all's py-* checks), each
printing one JSON line: {"ok": bool, "figure": str, ...}.

  wheel_checks.py oom        OOMRecovery on a real OOM (set_per_process_memory_fraction),
                             the parameters against an unconstrained step's
  wheel_checks.py runguard   RunGuard ending a crashed run's CUDA workers at the next start
  wheel_checks.py explain    explain_oom naming another CUDA process of ours on the GPU
  wheel_checks.py estimate   estimate() against torch.cuda.max_memory_allocated

Run with the Python that has torch, the wheel importable (scripts/gpu/all unpacks it onto
PYTHONPATH). In rehearsal (lab.sim()) the model is on the CPU: the OOM is OOMRecovery's
injected one (the same recovery path), the workers are registered in nvml-sim, and the
OOM text is torch's message written out; what only CUDA can show is said in the figure.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab  # noqa: E402

import torch  # noqa: E402
from gpuctl.torch import OOMRecovery, RunGuard, estimate, explain_oom  # noqa: E402

DEVICE = "cpu" if lab.sim() else "cuda"
# On the GPU the activations dominate (hundreds of MiB at the full batch); on the CPU, small.
BATCH, WIDTH = (64, 64) if lab.sim() else (8192, 4096)


def model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH),
                               torch.nn.ReLU(), torch.nn.Linear(WIDTH, 1)).to(DEVICE)


def batch(size: int = BATCH):
    torch.manual_seed(1)
    return torch.randn(size, WIDTH, device=DEVICE), torch.randn(size, 1, device=DEVICE)


def loss_of(m):
    return lambda mb: ((m(mb[0]) - mb[1]) ** 2).mean()


def sgd_step(m, rec, data) -> None:
    rec.step(data, loss_of(m))
    with torch.no_grad():
        for p in m.parameters():
            p -= 0.01 * p.grad


def check_oom() -> dict:
    data = batch()
    free = model()
    if DEVICE == "cuda":
        torch.cuda.reset_peak_memory_stats()
    sgd_step(free, OOMRecovery(free, batch_size=BATCH, micro_batch=BATCH), data)
    reference = [p.detach().cpu() for p in free.parameters()]
    if DEVICE == "cuda":
        peak = torch.cuda.max_memory_allocated()
        del free
        torch.cuda.empty_cache()
        total = torch.cuda.get_device_properties(0).total_memory
        fraction = 0.5 * peak / total
        torch.cuda.set_per_process_memory_fraction(fraction)
        how = f"set_per_process_memory_fraction({fraction:.5f}): half the unconstrained peak {peak / 2**20:.0f} MiB"
        rec_kw = {}
    else:
        how = f"injected above micro-batch {BATCH // 4} (CPU)"
        rec_kw = {"inject_oom_above": BATCH // 4}
    capped = model()
    rec = OOMRecovery(capped, batch_size=BATCH, micro_batch=BATCH, log=lambda line: None, **rec_kw)
    sgd_step(capped, rec, data)
    num = sum(float(((p.detach().cpu().double() - r.double()) ** 2).sum()) for p, r in zip(capped.parameters(), reference))
    den = sum(float((r.double() ** 2).sum()) for r in reference)
    diff = (num / den) ** 0.5
    ok = rec.recoveries >= 1 and diff < 1e-4
    return {"ok": ok, "recoveries": rec.recoveries, "micro_batch": rec.micro_batch, "relative_difference": diff,
            "figure": f"{rec.recoveries} recoveries, micro-batch {BATCH} -> {rec.micro_batch}, parameters vs "
                      f"unconstrained {diff:.1e} ({how})"}


GUARDED = """
import sys, time
sys.path.insert(0, sys.argv[2])
import lab
from gpuctl.torch import RunGuard
with RunGuard("gpulab-runguard", dir=sys.argv[1], watch=None) as guard:
    workers = [lab.spawn_holder(512) for _ in range(2)]
    guard.record([w.pid for w in workers])
    print("ready", *[w.pid for w in workers], flush=True)
    time.sleep(3600)
"""


def check_runguard() -> dict:
    with tempfile.TemporaryDirectory() as directory:
        run = subprocess.Popen([sys.executable, "-c", GUARDED, directory, lab.HERE], stdout=subprocess.PIPE, text=True)
        words = run.stdout.readline().split()
        if words[:1] != ["ready"]:
            run.kill()
            return {"ok": False, "figure": f"the guarded run did not start ({' '.join(words)!r})"}
        workers = [int(w) for w in words[1:]]
        held = lab.compute_apps()
        try:
            os.kill(run.pid, signal.SIGKILL)  # the crash: its workers stay on the GPU
            run.wait()
            start = time.monotonic()
            with RunGuard("gpulab-runguard", dir=directory, watch=None) as guard:
                cleanup = guard.cleanup
            took = time.monotonic() - start
        finally:
            lab.end(*workers)
        left = [pid for pid in workers if pid in lab.compute_apps()]
    ok = cleanup.leftovers == 2 and not left and cleanup.freed_bytes > 0
    return {"ok": ok, "leftovers": cleanup.leftovers, "freed_bytes": cleanup.freed_bytes, "seconds": took,
            "held_mib": [held.get(pid) for pid in workers], "log": cleanup.log,
            "figure": f"next start ended {cleanup.leftovers} leftover workers, {cleanup.freed_bytes / 2**20:.0f} MiB "
                      f"freed in {took:.2f} s" + (f"; still on the GPU: {left}" if left else "")}


def check_explain() -> dict:
    other = lab.spawn_holder(1024)
    try:
        time.sleep(0.5)
        if DEVICE == "cuda":
            try:
                torch.empty(2 * torch.cuda.get_device_properties(0).total_memory, dtype=torch.uint8, device="cuda")
                return {"ok": False, "figure": "allocating twice the GPU's memory did not fail"}
            except torch.OutOfMemoryError as error:
                text = explain_oom(error)
        else:
            text = explain_oom("CUDA out of memory. Tried to allocate 280.00 GiB. GPU 0 has a total capacity of "
                               "139.81 GiB of which 138.81 GiB is free.", device=0)
    finally:
        lab.end(other)
    ok = str(other.pid) in text
    return {"ok": ok, "text": text, "figure": text.splitlines()[0] + ("" if ok else f"; pid {other.pid} not named")}


def check_estimate() -> dict:
    m = model()
    data = batch()
    est = estimate(m, (data[0][:2], data[1][:2]), "adamw", loss_fn=lambda mm, b: ((mm(b[0]) - b[1]) ** 2).mean())
    predicted = est.peak_bytes(BATCH)
    if DEVICE != "cuda":
        return {"ok": predicted > 0, "predicted_bytes": predicted,
                "figure": f"estimate: peak {predicted / 2**20:.2f} MiB at micro-batch {BATCH} ({est.how}); "
                          "max_memory_allocated needs CUDA"}
    optimizer = torch.optim.AdamW(m.parameters())
    for _ in range(2):  # the first creates the optimizer's state, as estimate's does
        torch.cuda.reset_peak_memory_stats()
        loss_of(m)(data).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    measured = torch.cuda.max_memory_allocated() - data[0].nbytes - data[1].nbytes
    ratio = predicted / measured
    return {"ok": 0.8 <= ratio <= 1.25, "predicted_bytes": predicted, "measured_bytes": measured,
            "figure": f"estimate {predicted / 2**20:.0f} MiB vs max_memory_allocated {measured / 2**20:.0f} MiB at "
                      f"micro-batch {BATCH} (ratio {ratio:.3f})"}


if __name__ == "__main__":
    checks = {"oom": check_oom, "runguard": check_runguard, "explain": check_explain, "estimate": check_estimate}
    print(json.dumps(checks[sys.argv[1]]()))
