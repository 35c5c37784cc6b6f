//! A GPU's health from the scenario, as NVML clients read it: the recovery-action field,
//! remapped rows, ECC counters, retired pages, clock-event reasons, and Xid and
//! recovery-action events through event sets.

mod common;

use std::ffi::{c_uint, c_void};

use common::*;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, MemoryLocation};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings as b;

const SICK: &str = r#"
[[gpu]]
[[gpu]]
recovery_action = "gpu_reset"
remapped_rows = { correctable = 3, uncorrectable = 1, pending = true, failure = false }
ecc = { volatile_corrected = 0, volatile_uncorrected = 2, aggregate_corrected = 10, aggregate_uncorrected = 2 }
retired_pages = { single_bit = 0, double_bit = 1, pending = true }
clock_event_reasons = ["hw_slowdown"]
"#;

type Dev = b::nvmlDevice_t;

fn field(dev: &nvml_wrapper::Device<'_>, id: u32) -> Result<u32, NvmlError> {
    let values = dev
        .field_values_for(&[nvml_wrapper::structs::device::FieldId(id)])
        .unwrap();
    match values.into_iter().next().unwrap() {
        Ok(sample) => match sample.value {
            Ok(nvml_wrapper::enums::device::SampleValue::U32(v)) => Ok(v),
            Err(e) => Err(e),
            other => panic!("field {id}: {other:?}"),
        },
        Err(e) => Err(e),
    }
}

/// Where the scenario says so, or its driver predates R550, the recovery-action field is
/// not supported.
#[test]
fn the_recovery_action_field_is_missing_only_where_the_scenario_or_its_driver_says() {
    for text in [
        "[[gpu]]\nrecovery_action = \"not_supported\"\n",
        "driver_version = \"535.183.01\"\n[[gpu]]\n",
    ] {
        let sim = Sim::new(text);
        let nvml = sim.nvml();
        let gpu = nvml.device_by_index(0).unwrap();
        let recovery = b::field_id::NVML_FI_DEV_GET_GPU_RECOVERY_ACTION;
        assert!(
            matches!(field(&gpu, recovery), Err(NvmlError::NotSupported)),
            "{text}"
        );
    }
}

#[test]
fn the_scenarios_health_keys_answer_through_nvml() {
    let sim = Sim::new(SICK);
    let nvml = sim.nvml();
    let healthy = nvml.device_by_index(0).unwrap();
    let sick = nvml.device_by_index(1).unwrap();
    const RECOVERY: u32 = b::field_id::NVML_FI_DEV_GET_GPU_RECOVERY_ACTION;
    // No `recovery_action` on a driver with the field (the default, 570): none, as a
    // healthy H100/H200 answers.
    assert_eq!(field(&healthy, RECOVERY).unwrap(), 0, "NONE");
    assert_eq!(
        field(&healthy, b::field_id::NVML_FI_DEV_RESET_STATUS).unwrap(),
        0
    );

    assert_eq!(field(&sick, RECOVERY).unwrap(), 1, "GPU_RESET");
    assert_eq!(
        field(&sick, b::field_id::NVML_FI_DEV_RESET_STATUS).unwrap(),
        1
    );
    assert_eq!(
        field(&sick, b::field_id::NVML_FI_DEV_DRAIN_AND_RESET_STATUS).unwrap(),
        0
    );

    let ecc = |d: &nvml_wrapper::Device<'_>, e: MemoryError, c: EccCounter| {
        d.total_ecc_errors(e, c).unwrap()
    };
    assert_eq!(
        ecc(&sick, MemoryError::Uncorrected, EccCounter::Volatile),
        2
    );
    assert_eq!(ecc(&sick, MemoryError::Corrected, EccCounter::Volatile), 0);
    assert_eq!(
        ecc(&sick, MemoryError::Corrected, EccCounter::Aggregate),
        10
    );
    assert_eq!(
        ecc(&sick, MemoryError::Uncorrected, EccCounter::Aggregate),
        2
    );
    assert_eq!(
        ecc(&healthy, MemoryError::Uncorrected, EccCounter::Aggregate),
        0
    );
    let dram = sick
        .memory_error_counter(
            MemoryError::Uncorrected,
            EccCounter::Volatile,
            MemoryLocation::Device,
        )
        .unwrap();
    assert_eq!(dram, 2);
    let l2 = sick
        .memory_error_counter(
            MemoryError::Uncorrected,
            EccCounter::Volatile,
            MemoryLocation::L2Cache,
        )
        .unwrap();
    assert_eq!(l2, 0);

    assert!(sick.are_pages_pending_retired().unwrap());
    let double = sick
        .retired_pages(nvml_wrapper::enum_wrappers::device::RetirementCause::DoubleBitEccError)
        .unwrap();
    assert_eq!(double.len(), 1);
    assert!(matches!(
        healthy.are_pages_pending_retired(),
        Err(NvmlError::NotSupported)
    ));

    let reasons = sick.current_throttle_reasons().unwrap();
    assert_eq!(
        reasons,
        nvml_wrapper::bitmasks::device::ThrottleReasons::HW_SLOWDOWN
    );

    // Remapped rows: nvml-wrapper has no call, so the C function.
    let raw = Raw::open();
    type Rows =
        unsafe extern "C" fn(Dev, *mut c_uint, *mut c_uint, *mut c_uint, *mut c_uint) -> u32;
    let rows: Rows = raw.f("nvmlDeviceGetRemappedRows");
    let mut out = [9 as c_uint; 4];
    // SAFETY: a live device handle and four out-pointers.
    let code = unsafe {
        let [a, bb, c, d] = &mut out;
        rows(sick.handle(), a, bb, c, d)
    };
    assert_eq!(code, 0);
    assert_eq!(out, [3, 1, 1, 0]);
    // SAFETY: as above.
    let code = unsafe {
        let [a, bb, c, d] = &mut out;
        rows(healthy.handle(), a, bb, c, d)
    };
    assert_eq!(code, 0);
    assert_eq!(out, [0, 0, 0, 0]);
}

type Create = unsafe extern "C" fn(*mut *mut c_void) -> u32;
type Register = unsafe extern "C" fn(Dev, u64, *mut c_void) -> u32;
type Wait = unsafe extern "C" fn(*mut c_void, *mut b::nvmlEventData_t, c_uint) -> u32;
type Free = unsafe extern "C" fn(*mut c_void) -> u32;
type Supported = unsafe extern "C" fn(Dev, *mut u64) -> u32;

const XID: u64 = b::nvmlEventTypeXidCriticalError as u64;
const RECOVERY: u64 = b::nvmlEventTypeGpuRecoveryAction as u64;

/// Waits on `set` until it times out, returning (GPU index, type, data) of each event.
fn drain(raw: &Raw, set: *mut c_void, nvml: &nvml_wrapper::Nvml) -> Vec<(u32, u64, u64)> {
    let wait: Wait = raw.f("nvmlEventSetWait_v2");
    let mut got = Vec::new();
    loop {
        // SAFETY: zeroed plain C data.
        let mut data: b::nvmlEventData_t = unsafe { std::mem::zeroed() };
        // SAFETY: a live set and an out-pointer to local data.
        match unsafe { wait(set, &mut data, 50) } {
            0 => {
                // SAFETY: the handle the sim wrote is one of its device handles.
                let index = unsafe { nvml_wrapper::Device::new(data.device, nvml) }
                    .index()
                    .unwrap();
                assert_eq!(data.gpuInstanceId, u32::MAX);
                got.push((index, data.eventType, data.eventData));
            }
            10 => return got,
            other => panic!("nvmlEventSetWait_v2: {other}"),
        }
    }
}

#[test]
fn xids_are_raised_once_to_the_sets_there_and_new_ones_when_the_file_is_read_again() {
    let with_xids = |extra: &str| {
        format!(
            "[[gpu]]\n[[gpu]]\n[[xid]]\ngpu = 1\nxid = 48\npid = 4242\n[[xid]]\ngpu = 0\nxid = 13\n{extra}"
        )
    };
    let sim = Sim::new(&with_xids(""));
    let nvml = sim.nvml();
    let raw = Raw::open();
    let create: Create = raw.f("nvmlEventSetCreate");
    let register: Register = raw.f("nvmlDeviceRegisterEvents");
    let free: Free = raw.f("nvmlEventSetFree");
    let d0 = nvml.device_by_index(0).unwrap();
    let d1 = nvml.device_by_index(1).unwrap();
    // SAFETY: the sim's C functions with their signatures; live handles and sets.
    unsafe {
        let (mut a, mut only_gpu1) = (std::ptr::null_mut(), std::ptr::null_mut());
        assert_eq!(create(&mut a), 0);
        assert_eq!(create(&mut only_gpu1), 0);
        assert_eq!(register(d0.handle(), XID, a), 0);
        assert_eq!(register(d1.handle(), XID, a), 0);
        assert_eq!(register(d1.handle(), XID, only_gpu1), 0);
        // The entries already in the file, each once, in file order.
        assert_eq!(drain(&raw, a, &nvml), [(1, XID, 48), (0, XID, 13)]);
        assert_eq!(drain(&raw, a, &nvml), []);
        assert_eq!(drain(&raw, only_gpu1, &nvml), [(1, XID, 48)]);
        // Appended: delivered when the file is read again.
        sim.replace(&with_xids("[[xid]]\ngpu = 1\nxid = 79\n"));
        assert_eq!(drain(&raw, a, &nvml), [(1, XID, 79)]);
        assert_eq!(drain(&raw, only_gpu1, &nvml), [(1, XID, 79)]);
        // A set created later (a restarted client, a re-opened NVML) gets none of the
        // Xids raised before it, as a real driver does not replay them: only new ones.
        let mut late = std::ptr::null_mut();
        assert_eq!(create(&mut late), 0);
        assert_eq!(register(d0.handle(), XID, late), 0);
        assert_eq!(drain(&raw, late, &nvml), []);
        sim.replace(&with_xids(
            "[[xid]]\ngpu = 1\nxid = 79\n[[xid]]\ngpu = 0\nxid = 31\n",
        ));
        assert_eq!(drain(&raw, late, &nvml), [(0, XID, 31)]);
        assert_eq!(drain(&raw, a, &nvml), [(0, XID, 31)]);
        // A rehearsal's next scenario rewrites the last entry in place: another Xid, so a new
        // one, raised to the sets already waiting; written again unchanged, nothing.
        let rewritten = with_xids("[[xid]]\ngpu = 1\nxid = 79\n[[xid]]\ngpu = 0\nxid = 43\n");
        sim.replace(&rewritten);
        assert_eq!(drain(&raw, late, &nvml), [(0, XID, 43)]);
        assert_eq!(drain(&raw, a, &nvml), [(0, XID, 43)]);
        // Another culprit for the same Xid is another event too.
        sim.replace(&with_xids(
            "[[xid]]\ngpu = 1\nxid = 79\n[[xid]]\ngpu = 0\nxid = 43\npid = 7\n",
        ));
        assert_eq!(drain(&raw, a, &nvml), [(0, XID, 43)]);
        sim.replace(&with_xids(
            "[[xid]]\ngpu = 1\nxid = 79\n[[xid]]\ngpu = 0\nxid = 43\npid = 7\n",
        ));
        assert_eq!(drain(&raw, a, &nvml), []);
        for set in [a, only_gpu1, late] {
            assert_eq!(free(set), 0);
        }
    }
}

#[test]
fn recovery_action_changes_are_events_where_the_driver_has_the_field() {
    let gpu = |action: &str| {
        format!(
            "[[gpu]]\nrecovery_action = \"not_supported\"\n[[gpu]]\nrecovery_action = \"{action}\"\n"
        )
    };
    let sim = Sim::new(&gpu("none"));
    let nvml = sim.nvml();
    let raw = Raw::open();
    let create: Create = raw.f("nvmlEventSetCreate");
    let register: Register = raw.f("nvmlDeviceRegisterEvents");
    let supported: Supported = raw.f("nvmlDeviceGetSupportedEventTypes");
    let free: Free = raw.f("nvmlEventSetFree");
    let d0 = nvml.device_by_index(0).unwrap();
    let d1 = nvml.device_by_index(1).unwrap();
    // SAFETY: the sim's C functions with their signatures; live handles and sets.
    unsafe {
        let mut types = 0u64;
        assert_eq!(supported(d0.handle(), &mut types), 0);
        assert_eq!(types & RECOVERY, 0, "no field, no event");
        assert_eq!(supported(d1.handle(), &mut types), 0);
        assert_ne!(types & RECOVERY, 0);
        let mut set = std::ptr::null_mut();
        assert_eq!(create(&mut set), 0);
        assert_eq!(register(d0.handle(), RECOVERY, set), 3, "NOT_SUPPORTED");
        assert_eq!(register(d1.handle(), XID | RECOVERY, set), 0);
        // The value at registration is no event.
        assert_eq!(drain(&raw, set, &nvml), []);
        sim.replace(&gpu("node_reboot"));
        assert_eq!(drain(&raw, set, &nvml), [(1, RECOVERY, 2)]);
        sim.replace(&gpu("none"));
        assert_eq!(drain(&raw, set, &nvml), [(1, RECOVERY, 0)]);
        assert_eq!(free(set), 0);
    }
}
