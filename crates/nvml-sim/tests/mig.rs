//! MIG through nvml-wrapper (and raw calls for the GPU/compute-instance API it lacks).

mod common;

use std::ffi::c_uint;
use std::path::Path;

use common::*;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::{
    nvmlComputeInstance_t, nvmlComputeInstanceInfo_t, nvmlDevice_t, nvmlGpuInstance_t,
    nvmlGpuInstanceInfo_t, nvmlGpuInstanceProfileInfo_t,
};

const MIB: u64 = 1024 * 1024;

fn scenario(a: u32, b: u32) -> String {
    format!(
        r#"
[[gpu]]
name = "NVIDIA H100 80GB HBM3"
[[gpu.mig]]
profile = "3g.40gb"
[[gpu.mig]]
profile = "2g.20gb"
[[gpu.mig]]
profile = "1g.10gb"
[[gpu.mig]]
profile = "1g.10gb"
[[gpu]]
[[process]]
pid = {a}
gpu = 0
gpu_instance = 1
used_mib = 1000
sm_pct = 50
[[process]]
pid = {b}
gpu = 0
gpu_instance = 2
used_mib = 300
"#
    )
}

#[test]
fn mig_devices_through_nvml_wrapper() {
    let mut a = sleeper();
    let mut b = sleeper();
    let sim = Sim::new(&scenario(a.id(), b.id()));
    let nvml = sim.nvml();
    let gpu = nvml.device_by_index(0).unwrap();
    let mode = gpu.mig_mode().unwrap();
    assert_eq!((mode.current, mode.pending), (1, 1));
    assert_eq!(gpu.mig_device_count().unwrap(), 7);
    assert!(!gpu.mig_is_mig_device_handle().unwrap());
    let whole = nvml.device_by_index(1).unwrap();
    assert_eq!(whole.mig_mode().unwrap().current, 0);
    assert_eq!(whole.mig_device_count().unwrap(), 0);
    assert!(matches!(
        whole.mig_device_by_index(0),
        Err(NvmlError::InvalidArg)
    ));

    // Sparse slots: 4 devices by GI id, then NOT_FOUND up to 6, then INVALID_ARGUMENT.
    let migs: Vec<_> = (0..4)
        .map(|k| gpu.mig_device_by_index(k).unwrap())
        .collect();
    for k in 4..7 {
        assert!(matches!(
            gpu.mig_device_by_index(k),
            Err(NvmlError::NotFound)
        ));
    }
    assert!(matches!(
        gpu.mig_device_by_index(7),
        Err(NvmlError::InvalidArg)
    ));
    let names: Vec<_> = migs.iter().map(|m| m.name().unwrap()).collect();
    assert_eq!(
        names,
        [
            "NVIDIA H100 80GB HBM3 MIG 3g.40gb",
            "NVIDIA H100 80GB HBM3 MIG 2g.20gb",
            "NVIDIA H100 80GB HBM3 MIG 1g.10gb",
            "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
        ]
    );
    let m0 = &migs[0];
    assert!(m0.mig_is_mig_device_handle().unwrap());
    assert_eq!(m0.index().unwrap(), 0);
    assert_eq!(migs[3].index().unwrap(), 3);
    assert_eq!(
        m0.mig_parent_device().unwrap().uuid().unwrap(),
        gpu.uuid().unwrap()
    );
    let uuid = m0.uuid().unwrap();
    assert!(uuid.starts_with("MIG-") && uuid.len() == 40, "{uuid}");
    assert_ne!(uuid, migs[1].uuid().unwrap());
    assert_eq!(
        nvml.device_by_uuid(uuid.as_str()).unwrap().name().unwrap(),
        names[0]
    );

    // Memory: each instance its profile's size and its processes' use; the parent all.
    let mem = m0.memory_info().unwrap();
    assert_eq!((mem.total, mem.used), (40448 * MIB, 1000 * MIB));
    assert_eq!(mem.free, mem.total - mem.used);
    assert_eq!(migs[2].memory_info().unwrap().used, 0);
    let parent = gpu.memory_info().unwrap();
    assert_eq!((parent.total, parent.used), (81559 * MIB, 1300 * MIB));

    // Processes: per instance on a MIG handle, all (with ids) on the parent.
    let own = m0.running_compute_processes().unwrap();
    assert_eq!(own.len(), 1);
    assert_eq!(own[0].pid, a.id());
    assert_eq!(own[0].used_gpu_memory, UsedGpuMemory::Used(1000 * MIB));
    assert_eq!(
        (own[0].gpu_instance_id, own[0].compute_instance_id),
        (Some(1), Some(0))
    );
    assert_eq!(migs[1].running_compute_processes().unwrap()[0].pid, b.id());
    assert!(migs[2].running_compute_processes().unwrap().is_empty());
    let all = gpu.running_compute_processes().unwrap();
    let ids: Vec<_> = all.iter().map(|p| (p.pid, p.gpu_instance_id)).collect();
    assert_eq!(ids, [(a.id(), Some(1)), (b.id(), Some(2))]);

    // What a MIG GPU does not answer.
    assert!(matches!(
        gpu.utilization_rates(),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(
        m0.utilization_rates(),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(
        gpu.process_utilization_stats(0),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(m0.power_usage(), Err(NvmlError::NotSupported)));
    assert!(whole.utilization_rates().is_ok());

    // Live edit: one 1g.10gb fewer; its old handle is stale, GI 3 is still there.
    sim.replace(&scenario(a.id(), b.id()).replacen("[[gpu.mig]]\nprofile = \"1g.10gb\"\n", "", 1));
    assert!(matches!(
        gpu.mig_device_by_index(3),
        Err(NvmlError::NotFound)
    ));
    assert!(matches!(migs[3].name(), Err(NvmlError::InvalidArg)));
    assert_eq!(migs[2].name().unwrap(), names[2]);
    // Shut the library down before the next test's scenario takes the lock.
    drop(nvml);
    drop(sim);
    kill_and_reap(&mut a);
    kill_and_reap(&mut b);
}

type ProfileInfoFn =
    unsafe extern "C" fn(nvmlDevice_t, c_uint, *mut nvmlGpuInstanceProfileInfo_t) -> u32;
type InstancesFn =
    unsafe extern "C" fn(nvmlDevice_t, c_uint, *mut nvmlGpuInstance_t, *mut c_uint) -> u32;
type GiInfoFn = unsafe extern "C" fn(nvmlGpuInstance_t, *mut nvmlGpuInstanceInfo_t) -> u32;
type CisFn =
    unsafe extern "C" fn(nvmlGpuInstance_t, c_uint, *mut nvmlComputeInstance_t, *mut c_uint) -> u32;
type CiInfoFn = unsafe extern "C" fn(nvmlComputeInstance_t, *mut nvmlComputeInstanceInfo_t) -> u32;

#[test]
fn gpu_and_compute_instances() {
    let mut a = sleeper();
    let mut b = sleeper();
    let sim = Sim::new(&scenario(a.id(), b.id()));
    let nvml = sim.nvml();
    let gpu = nvml.device_by_index(0).unwrap();
    // SAFETY: the handle stays valid while `nvml` lives.
    let h = unsafe { gpu.handle() };
    // SAFETY: the sim's library runs no code at load that could misbehave.
    let lib = unsafe { libloading::Library::new(lib_path()) }.unwrap();
    // SAFETY: each symbol is typed as nvml.h declares it, and every pointer passed points to
    // a zeroed struct or array of the size the call writes, owned here.
    unsafe {
        let profile_info = lib
            .get::<ProfileInfoFn>(b"nvmlDeviceGetGpuInstanceProfileInfo")
            .unwrap();
        let instances = lib
            .get::<InstancesFn>(b"nvmlDeviceGetGpuInstances")
            .unwrap();
        let gi_info = lib.get::<GiInfoFn>(b"nvmlGpuInstanceGetInfo").unwrap();
        let cis = lib
            .get::<CisFn>(b"nvmlGpuInstanceGetComputeInstances")
            .unwrap();
        let ci_info = lib
            .get::<CiInfoFn>(b"nvmlComputeInstanceGetInfo_v2")
            .unwrap();

        let mut info: nvmlGpuInstanceProfileInfo_t = std::mem::zeroed();
        assert_eq!(profile_info(h, 0, &mut info), 0); // NVML_GPU_INSTANCE_PROFILE_1_SLICE
        assert_eq!((info.id, info.sliceCount, info.instanceCount), (19, 1, 7));
        assert_eq!((info.memorySizeMB, info.multiprocessorCount), (9984, 16));
        assert_eq!(profile_info(h, 2, &mut info), 0); // 3 slices
        assert_eq!((info.id, info.memorySizeMB), (9, 40448));
        assert_eq!(profile_info(h, 5, &mut info), 3, "8 slices: NOT_SUPPORTED");

        let mut gis = [std::ptr::null_mut(); 7];
        let mut count = 0;
        assert_eq!(instances(h, 19, gis.as_mut_ptr(), &mut count), 0);
        assert_eq!(count, 2);
        let mut gi: nvmlGpuInstanceInfo_t = std::mem::zeroed();
        assert_eq!(gi_info(gis[0], &mut gi), 0);
        assert_eq!((gi.id, gi.profileId), (3, 19));
        assert_eq!(instances(h, 9, gis.as_mut_ptr(), &mut count), 0);
        assert_eq!(count, 1);
        assert_eq!(gi_info(gis[0], &mut gi), 0);
        assert_eq!((gi.id, gi.profileId, gi.device), (1, 9, h));
        // The balanced layout places 3g.40gb on the upper half.
        assert_eq!((gi.placement.start, gi.placement.size), (4, 4));

        let mut ci = [std::ptr::null_mut(); 4];
        assert_eq!(cis(gis[0], 2, ci.as_mut_ptr(), &mut count), 0); // CI profile 3 slices
        assert_eq!(count, 1);
        assert_eq!(cis(gis[0], 1, ci.as_mut_ptr(), &mut count), 0);
        assert_eq!(count, 0, "no 2-slice compute instance");
        assert_eq!(cis(gis[0], 2, ci.as_mut_ptr(), &mut count), 0);
        let mut c: nvmlComputeInstanceInfo_t = std::mem::zeroed();
        assert_eq!(ci_info(ci[0], &mut c), 0);
        assert_eq!(
            (c.id, c.profileId, c.gpuInstance, c.placement.size),
            (0, 2, gis[0], 3)
        );
    }
    drop(nvml);
    drop(sim);
    kill_and_reap(&mut a);
    kill_and_reap(&mut b);
}

#[test]
fn bad_mig_scenarios_are_one_line_errors() {
    let err = |text: &str| {
        let e = nvml_sim::scenario::parse(Path::new("/tmp/x.toml"), text).unwrap_err();
        assert!(e.starts_with("/tmp/x.toml: ") && !e.contains('\n'), "{e}");
        e
    };
    let h100 = "[[gpu]]\nname = \"NVIDIA H100 80GB HBM3\"\n";
    let e = err(&format!("{h100}[[gpu.mig]]\nprofile = \"1g.18gb\"\n"));
    assert!(
        e.contains("gpu[0]: mig[0]: unknown profile '1g.18gb'"),
        "{e}"
    );
    let e = err(&format!(
        "{h100}[[gpu.mig]]\nprofile = \"4g.40gb\"\n[[gpu.mig]]\nprofile = \"4g.40gb\"\n"
    ));
    assert!(e.contains("8 compute slices"), "{e}");
    let e = err(&format!(
        "{h100}[[gpu.mig]]\nprofile = \"3g.40gb\"\n[[gpu.mig]]\nprofile = \"3g.40gb\"\n[[gpu.mig]]\nprofile = \"1g.10gb\"\n"
    ));
    assert!(e.contains("do not fit"), "{e}");
    let one = format!("{h100}[[gpu.mig]]\nprofile = \"7g.80gb\"\n");
    let e = err(&format!("{one}[[process]]\npid = 5\ngpu = 0\n"));
    assert!(
        e.contains("process[0] (pid 5): gpu 0 is in MIG mode: gpu_instance"),
        "{e}"
    );
    let e = err(&format!(
        "{one}[[process]]\npid = 5\ngpu = 0\ngpu_instance = 2\n"
    ));
    assert!(e.contains("gpu_instance 2 does not exist on gpu 0"), "{e}");
    let e = err("[[gpu]]\n[[process]]\npid = 5\ngpu = 0\ngpu_instance = 1\n");
    assert!(e.contains("need a GPU in MIG mode"), "{e}");
    let e = err(&format!(
        "{h100}mig_mode = false\n[[gpu.mig]]\nprofile = \"7g.80gb\"\n"
    ));
    assert!(e.contains("mig_mode = false contradicts"), "{e}");
    let e = err("[[gpu]]\nname = \"NVIDIA A100\"\nmig_mode = true\n");
    assert!(
        e.contains("MIG is modelled on H100 80GB and H200 only"),
        "{e}"
    );
    let e = err(&format!(
        "{h100}[[gpu.mig]]\nprofile = \"1g.10gb\"\nbogus = 1\n"
    ));
    assert!(e.contains("unknown field 'bogus'"), "{e}");
    // Both examples load.
    for ex in ["h100-mig.toml", "h200x8-mig.toml"] {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("examples")
            .join(ex);
        nvml_sim::scenario::load(&p).unwrap();
    }
}
