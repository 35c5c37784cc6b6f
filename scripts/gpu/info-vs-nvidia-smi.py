#!/usr/bin/env python3
"""On a machine with an NVIDIA GPU: compare `gpuctl info --json` with nvidia-smi while a
process this script starts holds memory, and time both side by side.

Changes no card setting; acts only on the process it starts (a PyTorch allocation of
--hold-gib, killed at the end). Prints a report to paste into docs/gpu-validation.md.

Usage: scripts/gpu/info-vs-nvidia-smi.py PATH/TO/gpuctl [--hold-gib 4] [--runs 20]
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

HOLDER = r"""
import sys, time, torch
x = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(3600)
"""


def smi(query, kind):
    out = subprocess.run(["nvidia-smi", f"--query-{kind}={query}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    return [[f.strip() for f in line.split(",")] for line in out.strip().splitlines() if line.strip()]


def median_ms(argv, runs):
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, check=True)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1000


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("gpuctl")
    parser.add_argument("--hold-gib", type=float, default=4)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()

    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(args.hold_gib)], stdout=subprocess.PIPE, text=True)
    try:
        if holder.stdout.readline().strip() != "ready":
            sys.exit("the CUDA holder did not start")
        time.sleep(1)
        driver = smi("driver_version", "gpu")[0][0]
        gpus = smi("index,uuid,name,pci.bus_id,memory.total,memory.used,memory.free,utilization.gpu,temperature.gpu,power.draw", "gpu")
        apps = smi("pid,gpu_uuid,used_memory", "compute-apps")
        doc = json.loads(subprocess.run([args.gpuctl, "info", "--json"], capture_output=True, text=True, check=True).stdout)
        table = subprocess.run([args.gpuctl, "info", "--color", "never"], capture_output=True, text=True).stdout

        print(f"date {time.strftime('%Y-%m-%d')}, driver {driver}, gpuctl driver_version {doc['driver_version']}")
        mismatches = []
        mib = 2**20
        for row, dev in zip(gpus, doc["devices"]):
            index, uuid, name, bus, total, used, free = row[:7]
            m = dev["memory"]
            print(f"GPU {index} {name}: nvidia-smi total/used/free MiB {total}/{used}/{free}; "
                  f"gpuctl {m['total_bytes'] // mib}/{m['used_bytes'] // mib}/{m['free_bytes'] // mib} "
                  f"(reserved {m['reserved_bytes'] // mib}, unattributed {m['unattributed_bytes']})")
            for key, smi_value, ours in (("uuid", uuid, dev["uuid"]), ("name", name, dev["name"])):
                if smi_value != ours:
                    mismatches.append(f"GPU {index} {key}: nvidia-smi {smi_value!r}, gpuctl {ours!r}")
            if abs(int(total) - m["total_bytes"] // mib) > 1:
                mismatches.append(f"GPU {index} total differs")
        ours_apps = {(p["pid"], d["uuid"]): p for d in doc["devices"] for p in d["processes"]}
        for pid, uuid, used in apps:
            p = ours_apps.get((int(pid), uuid))
            if p is None:
                mismatches.append(f"pid {pid} on {uuid} missing from gpuctl")
            elif p["used_bytes"] is not None and abs(p["used_bytes"] // mib - int(used)) > 1:
                mismatches.append(f"pid {pid}: nvidia-smi {used} MiB, gpuctl {p['used_bytes'] // mib} MiB")
        held = [p for p in ours_apps.values() if p["pid"] == holder.pid]
        print(f"holder pid {holder.pid}: {'found' if held else 'NOT found'} by gpuctl"
              + (f", {held[0]['used_bytes'] // mib} MiB, user {held[0]['user']}, state {held[0]['state']}" if held else ""))
        print("mismatches:", mismatches or "none")
        print(f"median of {args.runs}: gpuctl info --json {median_ms([args.gpuctl, 'info', '--json'], args.runs):.2f} ms, "
              f"nvidia-smi --query-gpu {median_ms(['nvidia-smi', '--query-gpu=index,memory.used', '--format=csv'], args.runs):.2f} ms, "
              f"nvidia-smi --query-compute-apps {median_ms(['nvidia-smi', '--query-compute-apps=pid,used_memory', '--format=csv'], args.runs):.2f} ms")
        print("\n" + table)
    finally:
        holder.kill()
        holder.wait()


if __name__ == "__main__":
    main()
