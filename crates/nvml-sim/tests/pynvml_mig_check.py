"""pynvml (nvidia-ml-py) reading the MIG devices of a scenario, run by tests/pynvml.rs under
`nvml-sim run SCENARIO -- python pynvml_mig_check.py SCENARIO`: everything pynvml reads must
agree with the scenario file. Prints CHECK-OK on success."""
import sys
import tomllib
from ctypes import byref, c_uint

try:
    import pynvml
except ImportError as e:
    print(f"PYNVML-MISSING: cannot import pynvml ({e}); pip install nvidia-ml-py", file=sys.stderr)
    sys.exit(3)

MiB = 1024 * 1024
# The sim's profile table for H100 80GB: name -> (driver profile id, MiB, slices).
H100 = {"1g.10gb": (19, 9984, 1), "1g.20gb": (15, 20096, 1), "2g.20gb": (14, 20096, 2),
        "3g.40gb": (9, 40448, 3), "4g.40gb": (5, 40448, 4), "7g.80gb": (0, 81152, 7)}

scenario = tomllib.load(open(sys.argv[1], "rb"))
pynvml.nvmlInit()
for index, gpu in enumerate(scenario["gpu"]):
    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    name = pynvml.nvmlDeviceGetName(h)
    want = sorted(gpu.get("mig", []), key=lambda m: m["gpu_instance"])
    current, pending = pynvml.nvmlDeviceGetMigMode(h)
    assert (current, pending) == ((1, 1) if want else (0, 0)), (current, pending)
    if not want:
        assert pynvml.nvmlDeviceGetMaxMigDeviceCount(h) == 0
        continue
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(h) == 7
    try:
        pynvml.nvmlDeviceGetUtilizationRates(h)
        raise AssertionError("utilization of a MIG-enabled GPU should be unsupported")
    except pynvml.NVMLError_NotSupported:
        pass
    procs = scenario.get("process", [])
    parent = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    assert len(parent) == sum(1 for p in procs if p["gpu"] == index), parent
    for k in range(7):
        if k >= len(want):
            try:
                pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
                raise AssertionError(f"MIG slot {k} should be empty")
            except pynvml.NVMLError_NotFound:
                continue
        m = want[k]
        gi = m["gpu_instance"]
        pid_, mib, slices = H100[m["profile"]]
        d = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
        # Some nvidia-ml-py versions return the c_uint itself.
        is_mig = pynvml.nvmlDeviceIsMigDeviceHandle(d)
        assert getattr(is_mig, "value", is_mig) == 1
        assert pynvml.nvmlDeviceGetName(d) == f"{name} MIG {m['profile']}", pynvml.nvmlDeviceGetName(d)
        uuid = pynvml.nvmlDeviceGetUUID(d)
        assert uuid.startswith("MIG-") and len(uuid) == 40, uuid
        same = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        assert pynvml.nvmlDeviceGetUUID(same) == uuid
        assert pynvml.nvmlDeviceGetGpuInstanceId(d) == gi
        assert pynvml.nvmlDeviceGetComputeInstanceId(d) == m.get("compute_instance", 0)
        parent_h = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(d)
        assert pynvml.nvmlDeviceGetUUID(parent_h) == pynvml.nvmlDeviceGetUUID(h)
        used = sum(p.get("used_mib", 0) for p in procs if p["gpu"] == index and p.get("gpu_instance") == gi)
        mem = pynvml.nvmlDeviceGetMemoryInfo(d)
        assert (mem.total, mem.used, mem.free) == (mib * MiB, used * MiB, (mib - used) * MiB), (mem.total, mem.used)
        mine = pynvml.nvmlDeviceGetComputeRunningProcesses(d)
        assert [p.gpuInstanceId for p in mine] == [gi] * sum(
            1 for p in procs if p["gpu"] == index and p.get("gpu_instance") == gi), mine
        assert sorted(p.usedGpuMemory for p in mine) == sorted(
            p["used_mib"] * MiB for p in procs if p["gpu"] == index and p.get("gpu_instance") == gi)
        attrs = pynvml.nvmlDeviceGetAttributes(d)
        assert (attrs.gpuInstanceSliceCount, attrs.memorySizeMB) == (slices, mib)
        try:
            pynvml.nvmlDeviceGetTemperature(d, pynvml.NVML_TEMPERATURE_GPU)
            raise AssertionError("temperature of a MIG device should be unsupported")
        except pynvml.NVMLError_NotSupported:
            pass
        # The GPU instance and its compute instance.
        info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, {
            1: pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 2: pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE,
            3: pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 4: pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE,
            7: pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE}[slices])
        if m["profile"] != "1g.20gb":
            assert (info.id, info.memorySizeMB, info.sliceCount) == (pid_, mib, slices), (info.id, info.memorySizeMB)
        arr = (pynvml.c_nvmlGpuInstance_t * 7)()
        count = c_uint()
        pynvml.nvmlDeviceGetGpuInstances(h, pid_, arr, byref(count))
        assert count.value == sum(1 for x in want if x["profile"] == m["profile"])
        g = pynvml.nvmlDeviceGetGpuInstanceById(h, gi)
        ginfo = pynvml.nvmlGpuInstanceGetInfo(g)
        assert (ginfo.id, ginfo.profileId) == (gi, pid_)
        cis = (pynvml.c_nvmlComputeInstance_t * 8)()
        pynvml.nvmlGpuInstanceGetComputeInstances(g, {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}[slices], cis, byref(count))
        assert count.value == 1
        cinfo = pynvml.nvmlComputeInstanceGetInfo(cis[0])
        assert (cinfo.id, cinfo.placement.size) == (m.get("compute_instance", 0), slices)
pynvml.nvmlShutdown()
print("CHECK-OK")
