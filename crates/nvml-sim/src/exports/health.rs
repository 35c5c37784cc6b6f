//! A GPU's health, from its scenario entry: the recovery action (field
//! NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, in details.rs's field table), remapped rows, the
//! device-memory ECC counters, retired pages and the clock-event reasons. Without the keys
//! each answers what a healthy HGX H100/H200 answers; `retired_pages` only where the
//! scenario gives it (Hopper remaps rows instead: NOT_SUPPORTED, as the driver answers).

use nvml_wrapper_sys::bindings::{self as sys, nvmlRowRemapperHistogramValues_t};

use super::*;
use crate::scenario::health::GpuHealth;

/// The health GPU `i` shows now: its scenario's, or what a reset left of it while the
/// scenario's keys are as they were at the reset.
pub(super) fn health(s: &mut Sim, i: usize) -> GpuHealth {
    let scenario = s.gpu(i).health.clone();
    // The fingerprint (a Debug rendering) only where a reset was recorded: most GPUs have
    // none, and this runs for every health reading and event wait.
    match s.gpu_state(i).reset_health {
        Some(reset) if reset == scenario.fingerprint() => scenario.after_reset(),
        _ => scenario,
    }
}

/// Fields 226 (reset required), 227 (drain and reset recommended) and 230 (the recovery
/// action): a driver before R550 has none of them, which the sim models as a GPU without
/// `recovery_action`.
pub(super) fn recovery_field(s: &mut Sim, i: usize, id: c_uint) -> Result<c_uint, nvmlReturn_t> {
    let Some(action) = health(s, i).recovery_action else {
        return Err(NVML_ERROR_NOT_SUPPORTED);
    };
    let action = action.to_nvml();
    Ok(match id {
        sys::field_id::NVML_FI_DEV_RESET_STATUS => c_uint::from(
            action == sys::nvmlDeviceGpuRecoveryAction_s_NVML_GPU_RECOVERY_ACTION_GPU_RESET
                || action
                    == sys::nvmlDeviceGpuRecoveryAction_s_NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET,
        ),
        sys::field_id::NVML_FI_DEV_DRAIN_AND_RESET_STATUS => c_uint::from(
            action == sys::nvmlDeviceGpuRecoveryAction_s_NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET,
        ),
        _ => action,
    })
}

const ECC_CORRECTED: c_uint = sys::nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_CORRECTED;
const ECC_UNCORRECTED: c_uint = sys::nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_UNCORRECTED;
const VOLATILE: c_uint = sys::nvmlEccCounterType_enum_NVML_VOLATILE_ECC;
const AGGREGATE: c_uint = sys::nvmlEccCounterType_enum_NVML_AGGREGATE_ECC;

/// The DRAM count of one error type and counter type; `None` for a bad argument.
fn dram_count(h: &GpuHealth, error_type: c_uint, counter_type: c_uint) -> Option<u64> {
    let e = &h.ecc;
    match (error_type, counter_type) {
        (ECC_CORRECTED, VOLATILE) => Some(e.volatile_corrected),
        (ECC_UNCORRECTED, VOLATILE) => Some(e.volatile_uncorrected),
        (ECC_CORRECTED, AGGREGATE) => Some(e.aggregate_corrected),
        (ECC_UNCORRECTED, AGGREGATE) => Some(e.aggregate_uncorrected),
        _ => None,
    }
}

/// All ECC errors of a type: the scenario's counts are the device memory's, and the SRAM
/// counts none (details.rs). A MIG device reports its parent's counters.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    d: nvmlDevice_t,
    error_type: c_uint,
    counter_type: c_uint,
    out: *mut c_ulonglong,
) -> nvmlReturn_t {
    guard!(mut out => with_target(d, None, |s, t| {
        let (Target::Gpu(i) | Target::Mig { gpu: i, .. }) = t;
        match dram_count(&health(s, i), error_type, counter_type) {
            None => NVML_ERROR_INVALID_ARGUMENT,
            Some(n) => put(out, n),
        }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryErrorCounter(
    d: nvmlDevice_t,
    error_type: c_uint,
    counter_type: c_uint,
    location: c_uint,
    out: *mut c_ulonglong,
) -> nvmlReturn_t {
    guard!(mut out => with_target(d, None, |s, t| {
        let (Target::Gpu(i) | Target::Mig { gpu: i, .. }) = t;
        if location >= sys::nvmlMemoryLocation_enum_NVML_MEMORY_LOCATION_COUNT {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        match dram_count(&health(s, i), error_type, counter_type) {
            None => NVML_ERROR_INVALID_ARGUMENT,
            Some(n) if location == sys::nvmlMemoryLocation_enum_NVML_MEMORY_LOCATION_DRAM => {
                put(out, n)
            }
            Some(_) => put(out, 0),
        }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    d: nvmlDevice_t,
    corrected: *mut c_uint,
    uncorrected: *mut c_uint,
    pending: *mut c_uint,
    failed: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut corrected, uncorrected, pending, failed => with_dev(d, None, |s, i| {
        let (Some(corrected), Some(uncorrected), Some(pending), Some(failed)) =
            (corrected, uncorrected, pending, failed)
        else {
            return NVML_ERROR_INVALID_ARGUMENT;
        };
        let rows = health(s, i).remapped_rows;
        *corrected = rows.correctable;
        *uncorrected = rows.uncorrectable;
        *pending = c_uint::from(rows.pending);
        *failed = c_uint::from(rows.failure);
        NVML_SUCCESS
    }))
}

/// H100/H200 HBM3 has 2560 banks, each with its spare rows. Each remap uses a spare of a
/// bank of its own (`high`: most spares left); a remapping failure leaves a bank with none.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRowRemapperHistogram(
    d: nvmlDevice_t,
    out: *mut nvmlRowRemapperHistogramValues_t,
) -> nvmlReturn_t {
    const BANKS: c_uint = 2560;
    guard!(mut out => with_dev(d, None, |s, i| {
        let rows = health(s, i).remapped_rows;
        let none = c_uint::from(rows.failure);
        let high = (rows.correctable + rows.uncorrectable).min(BANKS - none);
        put(
            out,
            nvmlRowRemapperHistogramValues_t {
                max: BANKS - none - high,
                high,
                partial: 0,
                low: 0,
                none,
            },
        )
    }))
}

/// The scenario's `clock_event_reasons` where it gives them; else an idle GPU lowers its
/// clocks for being idle (GpuIdle) and a busy one runs unthrottled.
fn clock_event_reasons(s: &mut Sim, i: usize) -> c_ulonglong {
    if let Some(bits) = health(s, i).clock_event_reasons {
        return bits;
    }
    if s.utilization(i).0 == 0 {
        c_ulonglong::from(sys::nvmlClocksEventReasonGpuIdle)
    } else {
        0
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    d: nvmlDevice_t,
    out: *mut c_ulonglong,
) -> nvmlReturn_t {
    guard!(mut out => with_dev(d, Some(Feature::Clocks), |s, i| {
        put(out, clock_event_reasons(s, i))
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksEventReasons(
    d: nvmlDevice_t,
    out: *mut c_ulonglong,
) -> nvmlReturn_t {
    guard!(mut out => with_dev(d, Some(Feature::Clocks), |s, i| {
        put(out, clock_event_reasons(s, i))
    }))
}

/// The retired pages of one cause, where the scenario gives `retired_pages`: page
/// addresses (4 KiB pages, distinct per GPU and cause) and when each was retired.
fn retired_pages(
    s: &mut Sim,
    i: usize,
    cause: c_uint,
    export: &str,
) -> Result<Vec<(c_ulonglong, c_ulonglong)>, nvmlReturn_t> {
    let Some(pages) = health(s, i).retired_pages else {
        crate::trace::gap(export, crate::trace::Gap::NotModelled);
        return Err(NVML_ERROR_NOT_SUPPORTED);
    };
    let count = match cause {
        sys::nvmlPageRetirementCause_enum_NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS => {
            pages.single_bit
        }
        sys::nvmlPageRetirementCause_enum_NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR => {
            pages.double_bit
        }
        _ => return Err(NVML_ERROR_INVALID_ARGUMENT),
    };
    // A fixed retirement time (2026-01-01), so that every client sees the same list.
    const RETIRED_AT_US: c_ulonglong = 1_767_225_600_000_000;
    Ok((0..count)
        .map(|k| {
            let page = 0x10_0000
                + (i as c_ulonglong) * 0x1000
                + c_ulonglong::from(cause) * 0x100
                + c_ulonglong::from(k);
            (page, RETIRED_AT_US)
        })
        .collect())
}

/// Writes `pages` the NVML list way (see [`put_list`]).
fn put_pages(
    count: Option<&mut c_uint>,
    addresses: Buf<c_ulonglong>,
    timestamps: Option<Buf<c_ulonglong>>,
    pages: &[(c_ulonglong, c_ulonglong)],
) -> nvmlReturn_t {
    let addrs: Vec<c_ulonglong> = pages.iter().map(|(a, _)| *a).collect();
    let Some(count) = count else {
        return NVML_ERROR_INVALID_ARGUMENT;
    };
    let cap = *count;
    let code = put_list(Some(count), addresses, &addrs);
    if code != NVML_SUCCESS || pages.is_empty() {
        return code;
    }
    if let Some(timestamps) = timestamps {
        let times: Vec<c_ulonglong> = pages.iter().map(|(_, t)| *t).collect();
        let mut cap = cap;
        return put_list(Some(&mut cap), timestamps, &times);
    }
    NVML_SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages(
    d: nvmlDevice_t,
    cause: c_uint,
    count: *mut c_uint,
    addresses: *mut c_ulonglong,
) -> nvmlReturn_t {
    guard!(mut count; buf addresses => with_dev(d, None, |s, i| {
        match retired_pages(s, i, cause, "nvmlDeviceGetRetiredPages") {
            Err(code) => code,
            Ok(pages) => put_pages(count, addresses, None, &pages),
        }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages_v2(
    d: nvmlDevice_t,
    cause: c_uint,
    count: *mut c_uint,
    addresses: *mut c_ulonglong,
    timestamps: *mut c_ulonglong,
) -> nvmlReturn_t {
    guard!(mut count; buf addresses, timestamps => with_dev(d, None, |s, i| {
        match retired_pages(s, i, cause, "nvmlDeviceGetRetiredPages_v2") {
            Err(code) => code,
            Ok(pages) => put_pages(count, addresses, Some(timestamps), &pages),
        }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPagesPendingStatus(
    d: nvmlDevice_t,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut pending => with_dev(d, None, |s, i| {
        match health(s, i).retired_pages {
            None => {
                crate::trace::gap(
                    "nvmlDeviceGetRetiredPagesPendingStatus",
                    crate::trace::Gap::NotModelled,
                );
                NVML_ERROR_NOT_SUPPORTED
            }
            Some(pages) => put(pending, c_uint::from(pages.pending)),
        }
    }))
}

// ---------------------------------------------------------------------------------------
// The GPU reset NVML offers: drain the GPU, remove it from the driver's view, rediscover it
// (a PCIe remove and rescan). Removing a GPU a process still uses is IN_USE.

/// The GPU at `pci`'s domain, bus and device, by index.
fn gpu_at(s: &Sim, pci: &nvmlPciInfo_t) -> Option<usize> {
    s.scenario.gpus.iter().position(|g| {
        g.pci.domain == pci.domain && g.pci.bus == pci.bus && g.pci.device == pci.device
    })
}

/// GPUs being drained (nvmlDeviceModifyDrainState), by index, in this process.
static DRAINING: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());

fn draining() -> std::sync::MutexGuard<'static, Vec<usize>> {
    DRAINING.lock().unwrap_or_else(|e| e.into_inner())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceModifyDrainState(
    pci: *mut nvmlPciInfo_t,
    state: c_uint,
) -> nvmlReturn_t {
    guard!(mut pci => with_sim(|s| {
        let Some(pci) = pci else {
            return NVML_ERROR_INVALID_ARGUMENT;
        };
        s.refresh();
        let Some(i) = gpu_at(s, pci) else {
            return NVML_ERROR_NOT_FOUND;
        };
        let mut draining = draining();
        draining.retain(|g| *g != i);
        if state != 0 {
            draining.push(i);
        }
        NVML_SUCCESS
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceQueryDrainState(
    pci: *mut nvmlPciInfo_t,
    state: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut pci, state => with_sim(|s| {
        let Some(pci) = pci else {
            return NVML_ERROR_INVALID_ARGUMENT;
        };
        s.refresh();
        let Some(i) = gpu_at(s, pci) else {
            return NVML_ERROR_NOT_FOUND;
        };
        put(state, c_uint::from(draining().contains(&i)))
    }))
}

/// Removes the GPU: refused while a process holds a context on it; otherwise the GPU is
/// reset, which the state file records for every client.
fn remove(pci: Option<&mut nvmlPciInfo_t>) -> nvmlReturn_t {
    with_sim(|s| {
        let Some(pci) = pci else {
            return NVML_ERROR_INVALID_ARGUMENT;
        };
        s.refresh();
        let Some(i) = gpu_at(s, pci) else {
            return NVML_ERROR_NOT_FOUND;
        };
        if !s.gpu_now(i).procs.is_empty() {
            return NVML_ERROR_IN_USE;
        }
        let fingerprint = s.gpu(i).health.fingerprint();
        draining().retain(|g| *g != i);
        s.update_gpu_state(i, |state| state.reset_health = Some(fingerprint))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceRemoveGpu(pci: *mut nvmlPciInfo_t) -> nvmlReturn_t {
    guard!(mut pci => remove(pci))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceRemoveGpu_v2(
    pci: *mut nvmlPciInfo_t,
    _gpu_state: c_uint,
    _link_state: c_uint,
) -> nvmlReturn_t {
    guard!(mut pci => remove(pci))
}

/// The removed GPU comes back (the sim never hides it: a removal is the reset itself).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceDiscoverGpus(pci: *mut nvmlPciInfo_t) -> nvmlReturn_t {
    guard!(mut pci => with_sim(|_| match pci {
        None => NVML_ERROR_INVALID_ARGUMENT,
        Some(_) => NVML_SUCCESS,
    }))
}
