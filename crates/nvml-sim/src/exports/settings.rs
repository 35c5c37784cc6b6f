//! Settings kept in the state file: persistence and compute mode, applications and locked
//! clocks, accounting.

use super::*;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(
    d: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut out => with_dev(d, Some(Feature::PersistenceMode), |s, i| {
        let on = s
            .gpu_state(i)
            .persistence_mode
            .unwrap_or(s.gpu(i).persistence_mode);
        put(out, on as c_uint)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetPersistenceMode(
    d: nvmlDevice_t,
    mode: c_uint,
) -> nvmlReturn_t {
    guard!(with_dev(d, None, |s, i| {
        if let Err(e) = s.setting_allowed(i, Feature::PersistenceMode) {
            return e;
        }
        if mode > 1 {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        s.update_gpu_state(i, |g| g.persistence_mode = Some(mode == 1))
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeMode(
    d: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut out => with_dev(d, Some(Feature::ComputeMode), |s, i| {
        let mode = s
            .gpu_state(i)
            .compute_mode
            .as_deref()
            .and_then(ComputeMode::parse)
            .unwrap_or(s.gpu(i).compute_mode);
        put(out, mode.to_nvml())
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetComputeMode(d: nvmlDevice_t, mode: c_uint) -> nvmlReturn_t {
    guard!(with_dev(d, None, |s, i| {
        if let Err(e) = s.setting_allowed(i, Feature::ComputeMode) {
            return e;
        }
        let Some(mode) = ComputeMode::from_nvml(mode) else {
            return NVML_ERROR_INVALID_ARGUMENT;
        };
        s.update_gpu_state(i, |g| g.compute_mode = Some(mode.as_str().to_string()))
    }))
}

pub(super) fn app_clock(s: &mut Sim, i: usize, kind: c_uint, default: bool) -> Option<u32> {
    let set = if default {
        None
    } else {
        s.gpu_state(i).applications_clocks
    };
    let g = s.gpu(i);
    match kind {
        NVML_CLOCK_GRAPHICS | NVML_CLOCK_SM => {
            Some(set.map(|a| a.graphics_mhz).unwrap_or(g.max_graphics_mhz))
        }
        NVML_CLOCK_MEM => Some(set.map(|a| a.mem_mhz).unwrap_or(g.max_memory_mhz)),
        NVML_CLOCK_VIDEO => Some(g.max_video_mhz),
        _ => None,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetApplicationsClock(
    d: nvmlDevice_t,
    kind: c_uint,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut out => with_dev(d, Some(Feature::ApplicationsClocks), |s, i| {
        match app_clock(s, i, kind, false) {
            None => NVML_ERROR_INVALID_ARGUMENT,
            Some(c) => put(out, c),
        }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDefaultApplicationsClock(
    d: nvmlDevice_t,
    kind: c_uint,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut out => with_dev(d, Some(Feature::ApplicationsClocks), |s, i| {
        match app_clock(s, i, kind, true) {
            None => NVML_ERROR_INVALID_ARGUMENT,
            Some(c) => put(out, c),
        }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetApplicationsClocks(
    d: nvmlDevice_t,
    mem_mhz: c_uint,
    graphics_mhz: c_uint,
) -> nvmlReturn_t {
    guard!(with_dev(d, None, |s, i| {
        if let Err(e) = s.setting_allowed(i, Feature::ApplicationsClocks) {
            return e;
        }
        let g = s.gpu(i);
        if mem_mhz == 0
            || graphics_mhz == 0
            || mem_mhz > g.max_memory_mhz
            || graphics_mhz > g.max_graphics_mhz
        {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        s.update_gpu_state(i, |g| {
            g.applications_clocks = Some(AppClocks {
                mem_mhz,
                graphics_mhz,
            })
        })
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceResetApplicationsClocks(d: nvmlDevice_t) -> nvmlReturn_t {
    guard!(with_dev(d, None, |s, i| {
        if let Err(e) = s.setting_allowed(i, Feature::ApplicationsClocks) {
            return e;
        }
        s.update_gpu_state(i, |g| g.applications_clocks = None)
    }))
}

fn set_range(
    d: nvmlDevice_t,
    feature: Feature,
    min: c_uint,
    max: c_uint,
    store: fn(&mut crate::state::GpuState, Option<ClockRange>),
) -> nvmlReturn_t {
    with_dev(d, None, |s, i| {
        if let Err(e) = s.setting_allowed(i, feature) {
            return e;
        }
        // Symbolic limits (NVML_CLOCK_LIMIT_ID_*) sit at the top of the range.
        if min > max && max < 0xFFFF_FF00 {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        s.update_gpu_state(i, |g| {
            store(
                g,
                Some(ClockRange {
                    min_mhz: min,
                    max_mhz: max,
                }),
            )
        })
    })
}

fn reset_range(
    d: nvmlDevice_t,
    feature: Feature,
    store: fn(&mut crate::state::GpuState, Option<ClockRange>),
) -> nvmlReturn_t {
    with_dev(d, None, |s, i| {
        if let Err(e) = s.setting_allowed(i, feature) {
            return e;
        }
        s.update_gpu_state(i, |g| store(g, None))
    })
}

fn store_gpu_locked(g: &mut crate::state::GpuState, r: Option<ClockRange>) {
    g.locked_clocks = r;
}

fn store_mem_locked(g: &mut crate::state::GpuState, r: Option<ClockRange>) {
    g.memory_locked_clocks = r;
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceSetGpuLockedClocks(
    d: nvmlDevice_t,
    min_mhz: c_uint,
    max_mhz: c_uint,
) -> nvmlReturn_t {
    guard!(set_range(
        d,
        Feature::LockedClocks,
        min_mhz,
        max_mhz,
        store_gpu_locked
    ))
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceResetGpuLockedClocks(d: nvmlDevice_t) -> nvmlReturn_t {
    guard!(reset_range(d, Feature::LockedClocks, store_gpu_locked))
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceSetMemoryLockedClocks(
    d: nvmlDevice_t,
    min_mhz: c_uint,
    max_mhz: c_uint,
) -> nvmlReturn_t {
    guard!(set_range(
        d,
        Feature::MemoryLockedClocks,
        min_mhz,
        max_mhz,
        store_mem_locked
    ))
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceResetMemoryLockedClocks(d: nvmlDevice_t) -> nvmlReturn_t {
    guard!(reset_range(
        d,
        Feature::MemoryLockedClocks,
        store_mem_locked
    ))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAccountingMode(
    d: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut out => with_dev(d, Some(Feature::Accounting), |s, i| {
        let on = s.gpu_state(i).accounting_mode.unwrap_or(false);
        put(out, on as c_uint)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetAccountingMode(
    d: nvmlDevice_t,
    mode: c_uint,
) -> nvmlReturn_t {
    guard!(with_dev(d, None, |s, i| {
        if let Err(e) = s.setting_allowed(i, Feature::Accounting) {
            return e;
        }
        if mode > 1 {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        s.update_gpu_state(i, |g| g.accounting_mode = Some(mode == 1))
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceClearAccountingPids(d: nvmlDevice_t) -> nvmlReturn_t {
    guard!(with_dev(d, None, |s, i| {
        if let Err(e) = s.setting_allowed(i, Feature::Accounting) {
            return e;
        }
        s.update_gpu_state(i, |g| g.accounting_pids.clear())
    }))
}

/// With accounting enabled: the recorded pids (kept after the processes end, until
/// cleared) plus the processes running now, which get recorded.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAccountingPids(
    d: nvmlDevice_t,
    count: *mut c_uint,
    pids: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut count; buf pids => with_dev(d, Some(Feature::Accounting), |s, i| {
        if count.is_none() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let st = s.gpu_state(i);
        if !st.accounting_mode.unwrap_or(false) {
            return NVML_ERROR_NOT_SUPPORTED;
        }
        let mut list = st.accounting_pids.clone();
        for p in &s.gpu_now(i).procs {
            if !list.contains(&p.pid) {
                list.push(p.pid);
            }
        }
        if list != st.accounting_pids {
            let recorded = list.clone();
            let _ = s.update_gpu_state(i, |g| g.accounting_pids = recorded);
        }
        put_list(count, pids, &list)
    }))
}
