#!/usr/bin/env python3
"""Benchmark: the Python package (crates/gpuctl-py), next to its references.

Prints medians of repeated runs:
1. `import gpuctl` in a fresh interpreter (the import alone, timed inside it), next to a
   bare interpreter's start;
2. `gpuctl.snapshot()` in a warm interpreter on 8 simulated GPUs with N live processes,
   next to the CLI's `gpuctl info --json` less its exec cost (the sum of the phases the CLI
   times itself: GPUCTL_TIMINGS), the CLI's whole wall time, and nvidia-ml-py's bare NVML
   query (bench/info.py's) in the same interpreter;
3. `OOMRecovery.step`'s overhead against a plain accumulation loop on the CPU, with the
   trainer's default model (2 layers, width 128, vocabulary 512, length 64, 4 heads; batch
   16 as micro-batch 4 x 4), the two alternated, in CPU time; and its own cost, the same two
   loops on one linear layer, as a share of the trainer model's step;
4. the wheel's size, and its two big parts.

Run it with the Python of a venv where the wheel is installed and torch importable (the one
scripts/test makes, ~/.cache/gpuctl/py-tests-torch-2.11.0), after scripts/wheel and
`cargo build --release -p nvml-sim`:

    ~/.cache/gpuctl/py-tests-torch-2.11.0/bin/python bench/python.py [--runs 50] [--processes 256]

nvidia-ml-py is taken from PYTHON's interpreter (scripts/test's .venv) where this one lacks it.
"""

import argparse
import glob
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
import bench_state

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
GPUS = 8


def median_ms(samples):
    return statistics.median(samples) * 1000


def fresh(code, runs, env=None):
    """Medians over fresh interpreters of the float `code` prints."""
    values = []
    for _ in range(runs):
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        values.append(float(done.stdout))
    return statistics.median(values) * 1000


def bench_import(runs):
    start = "import time; t = time.perf_counter(); {}; print(time.perf_counter() - t)"
    imported = fresh(start.format("import gpuctl"), runs)
    json_only = fresh(start.format("import json"), runs)
    walls = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        walls.append(time.perf_counter() - t)
    print(f"import gpuctl: {imported:.2f} ms (import json alone {json_only:.2f} ms; a bare interpreter "
          f"starts in {median_ms(walls):.1f} ms), median of {runs} fresh interpreters")


def pynvml_query():
    try:
        import pynvml  # noqa: F401
    except ImportError:
        python = os.environ.get("PYTHON", os.path.join(ROOT, ".venv", "bin", "python"))
        where = subprocess.run([python, "-c", "import os, pynvml; print(os.path.dirname(pynvml.__file__))"],
                               capture_output=True, text=True)
        if where.returncode != 0:
            sys.exit("bench/python.py: nvidia-ml-py not found: set PYTHON to a Python that has it "
                     "(scripts/test's .venv)")
        sys.path.append(where.stdout.strip())
    import ctypes

    import pynvml as n

    # pynvml dlopens libnvidia-ml.so.1 by name, and the library path is read at process
    # start: hand it the sim, loaded by path.
    n.nvmlLib = ctypes.CDLL(os.environ["GPUCTL_NVML_LIB"])

    def query():
        n.nvmlInit()
        out = []
        for i in range(n.nvmlDeviceGetCount()):
            h = n.nvmlDeviceGetHandleByIndex(i)
            m = n.nvmlDeviceGetMemoryInfo(h)
            out.append((n.nvmlDeviceGetName(h), n.nvmlDeviceGetUUID(h), m.total, m.used, m.free,
                        n.nvmlDeviceGetUtilizationRates(h).gpu, n.nvmlDeviceGetTemperature(h, 0),
                        n.nvmlDeviceGetPowerUsage(h),
                        [(p.pid, p.usedGpuMemory) for p in n.nvmlDeviceGetComputeRunningProcesses(h)]))
        n.nvmlShutdown()
        return out

    return query


def bench_snapshot(runs, count):
    import gpuctl

    sim = os.path.join(TARGET, "release", "libnvml_sim.so")
    if not os.path.exists(sim):
        sys.exit(f"bench/python.py: {sim} missing: cargo build --release -p nvml-sim")
    cli = os.path.join(os.path.dirname(sys.executable), "gpuctl")
    scratch = tempfile.mkdtemp(prefix="gpuctl-bench-py-")
    libdir = os.path.join(scratch, "lib")
    os.mkdir(libdir)
    os.symlink(sim, os.path.join(libdir, "libnvidia-ml.so.1"))
    scenario = os.path.join(scratch, "scenario.toml")
    env = {"GPUCTL_NVML_LIB": sim, "NVML_SIM_SCENARIO": scenario,
           "NVML_SIM_STATE": os.path.join(scratch, "state.json"),
           "GPUCTL_STATE_DIR": os.path.join(scratch, "state"), "GPUCTL_CONFIG": "/dev/null"}
    os.environ.update(env)
    # pynvml loads libnvidia-ml.so.1 by name: the sim, through the library path of this
    # process (set before its first load, which is below).
    os.environ["LD_LIBRARY_PATH"] = libdir + ":" + os.environ.get("LD_LIBRARY_PATH", "")
    holder = ["sleep", "3600"]
    if os.geteuid() == 0:
        holder = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] + holder
    holders = [subprocess.Popen(holder) for _ in range(count)]
    try:
        lines = ['driver_version = "570.133.20"', "cuda_driver_version = 12080"]
        lines += ["[[gpu]]\nname = \"NVIDIA H200\"\nutilization_pct = 90\ntemperature_c = 60\npower_mw = 600000"] * GPUS
        for i, p in enumerate(holders):
            lines.append(f"[[process]]\npid = {p.pid}\ngpu = {i % GPUS}\nused_mib = {1024 + i}\nsm_pct = 50")
        with open(scenario, "w") as f:
            f.write("\n".join(lines) + "\n")
        listed = sum(len(d.processes) for d in gpuctl.snapshot().devices)
        assert listed == count, f"snapshot listed {listed} of {count} processes"

        cli_env = dict(os.environ, GPUCTL_TIMINGS="1")
        walls, inside = [], []
        for _ in range(runs):
            t = time.perf_counter()
            done = subprocess.run([cli, "info", "--json"], env=cli_env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True, check=True)
            walls.append(time.perf_counter() - t)
            line = next(l for l in done.stderr.splitlines() if "timings:" in l)
            inside.append(sum(float(part.split()[1]) for part in line.split("timings:", 1)[1].split(",")) / 1000)

        snaps = []
        for _ in range(runs):
            t = time.perf_counter()
            gpuctl.snapshot()
            snaps.append(time.perf_counter() - t)

        query = pynvml_query()
        query()
        bare = []
        for _ in range(runs):
            t = time.perf_counter()
            query()
            bare.append(time.perf_counter() - t)
        s, c, w, b = median_ms(snaps), median_ms(inside), median_ms(walls), median_ms(bare)
        print(f"snapshot(), {GPUS} simulated GPUs x {count} processes, warm interpreter, median of {runs}:")
        print(f"  gpuctl.snapshot()                  {s:8.2f} ms")
        print(f"  gpuctl info --json less exec       {c:8.2f} ms  (snapshot / this: {s / c:.2f})")
        print(f"  gpuctl info --json, whole          {w:8.2f} ms")
        print(f"  nvidia-ml-py bare NVML query       {b:8.2f} ms  (NVML only: no /proc, no owners)")
    finally:
        for p in holders:
            p.kill()
            p.wait()


def bench_oom_step(steps, repeats):
    import torch

    from gpuctl.torch import OOMRecovery

    torch.set_num_threads(1)
    vocab, width, layers, heads, length, batch, micro = 512, 128, 2, 4, 64, 16, 4

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(vocab, width)
            block = torch.nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True,
                                                     norm_first=True)
            self.blocks = torch.nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
            self.head = torch.nn.Linear(width, vocab)

        def forward(self, tokens):
            return self.head(self.blocks(self.embed(tokens)))

    torch.manual_seed(0)
    model = Model()
    params = sum(p.numel() for p in model.parameters())
    data = [torch.randint(0, vocab, (batch, length + 1)) for _ in range(steps)]

    def alternated(net, loss_fn, rounds):
        """Per-step CPU seconds of a plain accumulation loop and of OOMRecovery.step over
        `data` with `net` and AdamW, alternated `rounds` times: {"plain": [...], "rec": [...]}."""
        optimizer = torch.optim.AdamW(net.parameters(), lr=3e-4)
        rec = OOMRecovery(net, batch_size=batch, micro_batch=micro)

        def plain():
            for tokens in data:
                for start in range(0, batch, micro):
                    (loss_fn(tokens[start:start + micro]) * (micro / batch)).backward()
                optimizer.step()
                optimizer.zero_grad()

        def recovered():
            for tokens in data:
                rec.step(tokens, loss_fn)
                optimizer.step()
                optimizer.zero_grad()

        plain()
        recovered()
        # CPU time of this process (torch on one thread): a step's cost is all CPU, and it
        # leaves out waits for a core. On this VM it still moves pair to pair as much as wall
        # time does, hence the pairs' quartiles and the own cost below.
        times = {"plain": [], "rec": []}
        for _ in range(rounds):
            for name, run in (("plain", plain), ("rec", recovered)):
                t = time.process_time()
                run()
                times[name].append((time.process_time() - t) / steps)
        return times

    def model_loss(tokens):
        logits = model(tokens[:, :-1])
        return torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))

    times = alternated(model, model_loss, repeats)
    p, r = median_ms(times["plain"]), median_ms(times["rec"])
    # Each pair's overhead, run beside each other: the quartiles say how far one pair moves
    # by noise alone (a few percent here, more than the 1 % target).
    paired = sorted((rec / plain - 1) * 100 for plain, rec in zip(times["plain"], times["rec"]))
    low, _, high = statistics.quantiles(paired, n=4)
    print(f"OOMRecovery.step on the CPU (1 thread), the trainer's model ({params} parameters), batch {batch} "
          f"as {micro} x {batch // micro}, CPU time, median of {repeats} x {steps} steps:")
    print(f"  plain accumulation {p:.2f} ms/step, OOMRecovery.step {r:.2f} ms/step: overhead "
          f"{(r - p) / p * 100:+.2f} % (pairs' quartiles {low:+.2f} % to {high:+.2f} %)")

    # Its own cost, apart from the model's: the same loops on one linear layer, whose
    # compute is too small to hide a difference, so what the two loops differ by is the
    # wrapper's work (slicing the batch, summing the detached loss), read in microseconds
    # instead of as a few percent of noise around the trainer model's step.
    tiny = torch.nn.Linear(length + 1, 1)
    tiny_times = alternated(tiny, lambda tokens: tiny(tokens.float()).mean(), 5 * repeats)
    tp, tr = median_ms(tiny_times["plain"]), median_ms(tiny_times["rec"])
    print(f"  its own cost: {(tr - tp) * 1000:.0f} µs/step (one linear layer: plain {tp:.3f} ms/step, "
          f"OOMRecovery.step {tr:.3f} ms/step, median of {5 * repeats} x {steps} steps), "
          f"{(tr - tp) / p * 100:.3f} % of the plain step above")


def bench_wheel():
    wheels = glob.glob(os.path.join(TARGET, "wheels", "gpuctl-*.whl"))
    if not wheels:
        print("wheel: none built (scripts/wheel)")
        return
    wheel = wheels[0]
    with zipfile.ZipFile(wheel) as z:
        parts = {os.path.basename(i.filename): (i.file_size, i.compress_size) for i in z.infolist()}
    module = next(v for k, v in parts.items() if k.endswith(".so"))
    command = parts.get("gpuctl", (0, 0))
    print(f"wheel {os.path.basename(wheel)}: {os.path.getsize(wheel) / 2**20:.2f} MiB "
          f"(module {module[0] / 2**20:.2f} MiB, command {command[0] / 2**20:.2f} MiB uncompressed)")


def main():
    bench_state.scratch()
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--processes", type=int, default=256)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    bench_import(max(10, args.runs // 2))
    bench_snapshot(args.runs, args.processes)
    bench_oom_step(args.steps, args.repeats)
    bench_wheel()


if __name__ == "__main__":
    main()
