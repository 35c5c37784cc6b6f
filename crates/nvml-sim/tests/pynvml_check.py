"""pynvml (nvidia-ml-py) against nvml-sim. Run by tests/pynvml.rs with LD_LIBRARY_PATH
holding a libnvidia-ml.so.1 symlink and NVML_SIM_SCENARIO naming the scenario; argv[1] is
the pid of the one listed process. Prints CHECK-OK on success."""
import sys

try:
    import pynvml
except ImportError as e:
    print(f"PYNVML-MISSING: cannot import pynvml ({e}); pip install nvidia-ml-py", file=sys.stderr)
    sys.exit(3)

pid = int(sys.argv[1])
MiB = 1024 * 1024

pynvml.nvmlInit()
assert pynvml.nvmlSystemGetDriverVersion() == "570.133.20", pynvml.nvmlSystemGetDriverVersion()
assert pynvml.nvmlSystemGetCudaDriverVersion() == 12080
assert pynvml.nvmlDeviceGetCount() == 2
h = pynvml.nvmlDeviceGetHandleByIndex(0)
assert pynvml.nvmlDeviceGetName(h) == "NVIDIA H200"
uuid = pynvml.nvmlDeviceGetUUID(h)
assert uuid.startswith("GPU-") and len(uuid) == 40, uuid
assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(uuid)) == 0

mem = pynvml.nvmlDeviceGetMemoryInfo(h)  # v1: used includes the reserved memory
assert mem.total == 143771 * MiB, mem.total
assert mem.used == (1000 + 512) * MiB and mem.free == mem.total - mem.used, (mem.used, mem.free)
mem2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
assert mem2.reserved == 512 * MiB and mem2.used == 1000 * MiB, (mem2.reserved, mem2.used)
assert mem2.free == mem2.total - mem2.reserved - mem2.used

util = pynvml.nvmlDeviceGetUtilizationRates(h)
assert util.gpu == 77 and util.memory == 30, (util.gpu, util.memory)
assert pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) == 61
assert pynvml.nvmlDeviceGetPowerUsage(h) == 412000
assert pynvml.nvmlDeviceGetEnforcedPowerLimit(h) == 700000

pci = pynvml.nvmlDeviceGetPciInfo(h)
bus_id = pci.busId.decode() if isinstance(pci.busId, bytes) else pci.busId
assert bus_id == "00000000:18:00.0", bus_id
assert pci.bus == 0x18

procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
assert [(p.pid, p.usedGpuMemory) for p in procs] == [(pid, 1000 * MiB)], procs
assert procs[0].gpuInstanceId == 0xFFFFFFFF
samples = pynvml.nvmlDeviceGetProcessUtilization(h, 0)
assert [(s.pid, s.smUtil) for s in samples] == [(pid, 77)]

h1 = pynvml.nvmlDeviceGetHandleByIndex(1)
assert pynvml.nvmlDeviceGetComputeRunningProcesses(h1) == []
try:
    pynvml.nvmlDeviceGetTemperature(h1, pynvml.NVML_TEMPERATURE_GPU)
    raise AssertionError("temperature should be unsupported on GPU 1")
except pynvml.NVMLError_NotSupported as e:
    assert str(e) == "Not Supported", str(e)
try:
    pynvml.nvmlDeviceGetFanSpeed(h)
    raise AssertionError("fan should be unsupported")
except pynvml.NVMLError_NotSupported:
    pass

pynvml.nvmlShutdown()
print("CHECK-OK")
