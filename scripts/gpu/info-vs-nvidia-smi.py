#!/usr/bin/env python3
"""On a machine with an NVIDIA GPU: compare `gpuctl info --json` with nvidia-smi while
processes this script starts hold known amounts, and time both side by side (and an
nvidia-ml-py query, where pynvml is importable). scripts/gpu/all runs the same comparison
(its `info` check); on nvml-sim too, in rehearsal.

Changes no card setting; acts only on the processes it starts (scripts/gpu/holder.py,
killed at the end). Prints a report to paste into docs/gpu-validation.md.

Usage: scripts/gpu/info-vs-nvidia-smi.py PATH/TO/gpuctl [--hold-mib 4096 --hold-mib 1024] [--runs 20]
"""

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab  # noqa: E402

PYNVML_QUERY = """
import pynvml
pynvml.nvmlInit()
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    pynvml.nvmlDeviceGetMemoryInfo(h)
    pynvml.nvmlDeviceGetComputeRunningProcesses(h)
pynvml.nvmlShutdown()
"""


def compare(gpuctl: str, holders: list) -> dict:
    """Every figure nvidia-smi and `gpuctl info --json` both show, side by side: devices
    (uuid, name, total, used, free) and processes (pid, GPU, memory). Returns the number of
    figures compared, the differences, and the lines of a report."""
    gpus = lab.smi("index,uuid,name,pci.bus_id,memory.total,memory.used,memory.free,temperature.gpu,"
                   "power.limit,pstate,persistence_mode,compute_mode")
    apps = lab.smi("pid,gpu_uuid,used_memory", "compute-apps")
    doc = json.loads(subprocess.run([gpuctl, "info", "--json"], capture_output=True, text=True, check=True,
                                    timeout=60).stdout)
    mib = lab.MIB
    lines, mismatches, compared = [], [], 0
    by_uuid = {dev["uuid"]: dev for dev in doc["devices"]}
    for index, uuid, name, bus, total, used, free, temp, limit, pstate, persistence, compute in gpus:
        dev = by_uuid.get(uuid)
        if dev is None:
            mismatches.append(f"GPU {index} {uuid} missing from gpuctl")
            continue
        m = dev["memory"]
        lines.append(f"GPU {index} {name}: nvidia-smi total/used/free MiB {total}/{used}/{free}; gpuctl "
                     f"{m['total_bytes'] // mib}/{m['used_bytes'] // mib}/{m['free_bytes'] // mib} "
                     f"(reserved {m['reserved_bytes'] // mib})")
        for key, theirs, ours in (("index", int(index), dev["index"]), ("name", name, dev["name"]),
                                  ("pci bus id", bus.upper(), (dev.get("pci_bus_id") or "").upper()),
                                  ("pstate", pstate, dev.get("pstate")),
                                  ("persistence", persistence == "Enabled", dev.get("persistence_mode")),
                                  ("compute mode", compute.lower(), dev.get("compute_mode")),
                                  ("power limit W", float(limit) if limit.replace(".", "").isdigit() else limit,
                                   dev["power_limit_mw"] / 1000 if dev.get("power_limit_mw") is not None else None)):
            compared += 1
            if theirs != ours:
                mismatches.append(f"GPU {index} {key}: nvidia-smi {theirs!r}, gpuctl {ours!r}")
        if temp.isdigit() and dev.get("temperature_c") is not None:
            compared += 1
            if abs(int(temp) - dev["temperature_c"]) > 2:
                mismatches.append(f"GPU {index} temperature: nvidia-smi {temp} C, gpuctl {dev['temperature_c']} C")
        # Used memory moves between the two reads on a busy GPU: 1 % of the total, or 2 MiB.
        for key, theirs, ours, slack in (("total", int(total), m["total_bytes"] // mib, 1),
                                         ("used", int(used), m["used_bytes"] // mib, max(2, int(total) // 100)),
                                         ("free", int(free), m["free_bytes"] // mib, max(2, int(total) // 100))):
            compared += 1
            if abs(theirs - ours) > slack:
                mismatches.append(f"GPU {index} {key}: nvidia-smi {theirs} MiB, gpuctl {ours} MiB")
    ours_apps = {(p["pid"], d["uuid"]): p for d in doc["devices"] for p in d["processes"]}
    for pid, uuid, used in apps:
        compared += 1
        p = ours_apps.get((int(pid), uuid))
        if p is None:
            mismatches.append(f"pid {pid} on {uuid} missing from gpuctl")
        elif used.isdigit() and (p["used_bytes"] is None or abs(p["used_bytes"] // mib - int(used)) > 1):
            mismatches.append(f"pid {pid}: nvidia-smi {used} MiB, gpuctl {p['used_bytes']}")
    for holder, asked in holders:
        held = [p for p in ours_apps.values() if p["pid"] == holder]
        compared += 1
        if not held:
            mismatches.append(f"holder pid {holder} ({asked} MiB asked) not found by gpuctl")
        else:
            lines.append(f"holder pid {holder}: asked {asked} MiB, gpuctl {held[0]['used_bytes'] // mib} MiB, "
                         f"user {held[0]['user']}, state {held[0]['state']}")
    return {"driver": doc.get("driver_version"), "compared": compared, "mismatches": mismatches, "lines": lines}


def timings(gpuctl: str, runs: int) -> dict:
    """Medians of `runs` runs each, in ms: gpuctl info --json, nvidia-smi --query-compute-apps,
    and a Python process making the same query through nvidia-ml-py (None without pynvml)."""
    result = {
        "gpuctl_info_json_ms": lab.median_ms([gpuctl, "info", "--json"], runs),
        "nvidia_smi_compute_apps_ms": lab.median_ms(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv"], runs),
        "pynvml_ms": None,
    }
    has_pynvml = subprocess.run([sys.executable, "-c", "import pynvml"], capture_output=True).returncode == 0
    if has_pynvml:
        result["pynvml_ms"] = lab.median_ms([sys.executable, "-c", PYNVML_QUERY], runs)
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("gpuctl")
    parser.add_argument("--hold-mib", type=int, action="append")
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()

    amounts = args.hold_mib or [4096, 1024]
    children = []
    try:
        for mib in amounts:
            children.append(lab.spawn_holder(mib))
        time.sleep(1)
        result = compare(args.gpuctl, [(c.pid, mib) for c, mib in zip(children, amounts)])
        print(f"date {time.strftime('%Y-%m-%d')}, driver {result['driver']}")
        print("\n".join(result["lines"]))
        print(f"{result['compared']} figures compared; mismatches:", result["mismatches"] or "none")
        t = timings(args.gpuctl, args.runs)
        print(f"median of {args.runs}: gpuctl info --json {t['gpuctl_info_json_ms']:.2f} ms, "
              f"nvidia-smi --query-compute-apps {t['nvidia_smi_compute_apps_ms']:.2f} ms, "
              + (f"pynvml (a python process) {t['pynvml_ms']:.2f} ms" if t["pynvml_ms"] else "pynvml not importable"))
        print("\n" + subprocess.run([args.gpuctl, "info", "--color", "never"], capture_output=True, text=True).stdout)
    finally:
        lab.end(*children)
    return 1 if result["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
