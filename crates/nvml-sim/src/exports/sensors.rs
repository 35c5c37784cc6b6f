//! Memory, utilization and sensors: memory and BAR1, utilization, temperature, power, fan,
//! performance state, clocks.

use super::*;

/// (total, reserved, free, used) in bytes: of the GPU, or of a MIG device's GPU instance.
fn memory_of(s: &mut Sim, t: Target) -> (u64, u64, u64, u64) {
    match t {
        Target::Gpu(i) => s.memory_bytes(i),
        Target::Mig { gpu, gi, .. } => s.mig_memory_bytes(gpu, gi),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    d: nvmlDevice_t,
    out: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    guard!(mut out => with_target(d, Some(Feature::Memory), |s, t| {
        if out.is_none() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let (total, _reserved, free, _used) = memory_of(s, t);
        // v1 folds the reserved memory into `used`.
        put(
            out,
            nvmlMemory_t {
                total,
                free,
                used: total - free,
            },
        )
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    d: nvmlDevice_t,
    out: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    guard!(mut out => with_target(d, Some(Feature::Memory), |s, t| {
        let Some(out) = out else {
            return NVML_ERROR_INVALID_ARGUMENT;
        };
        let version = out.version;
        if version != NVML_MEMORY_V2 {
            return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        }
        let (total, reserved, free, used) = memory_of(s, t);
        put(
            Some(out),
            nvmlMemory_v2_t {
                version,
                total,
                reserved,
                free,
                used,
            },
        )
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBAR1MemoryInfo(
    d: nvmlDevice_t,
    out: *mut nvmlBAR1Memory_t,
) -> nvmlReturn_t {
    guard!(mut out => with_target(d, Some(Feature::Bar1Memory), |s, t| {
        if out.is_none() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // A MIG device maps its share of the BAR1 aperture: its memory slices of eight.
        let (procs, total) = match t {
            Target::Gpu(_) => (procs_of(s, t, is_any).len() as u64, 262_144 * MIB),
            Target::Mig { gpu, index, .. } => (
                procs_of(s, t, is_any).len() as u64,
                262_144 / 8 * u64::from(s.gpu(gpu).mig[index].profile.mem_slices) * MIB,
            ),
        };
        let used = (1 + 2 * procs) * MIB;
        put(
            out,
            nvmlBAR1Memory_t {
                bar1Total: total,
                bar1Free: total - used,
                bar1Used: used,
            },
        )
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    d: nvmlDevice_t,
    out: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    guard!(mut out => with_dev(d, Some(Feature::Utilization), |s, i| {
        if out.is_none() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // A MIG-enabled GPU has no whole-GPU utilization counters (nor do its MIG devices).
        if s.gpu(i).mig_mode {
            return NVML_ERROR_NOT_SUPPORTED;
        }
        let (gpu, memory) = s.utilization(i);
        put(out, nvmlUtilization_t { gpu, memory })
    }))
}

/// The GPU's core temperature (°C): the scenario's, else rising with utilization.
pub(super) fn temperature(s: &mut Sim, i: usize) -> c_uint {
    match s.gpu(i).temperature_c {
        Some(t) => t,
        None => 30 + s.utilization(i).0 * 2 / 5,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    d: nvmlDevice_t,
    sensor: c_uint,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut out => with_dev(d, Some(Feature::Temperature), |s, i| {
        if sensor != NVML_TEMPERATURE_GPU || out.is_none() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let t = temperature(s, i);
        put(out, t)
    }))
}

pub(super) fn power_usage(s: &mut Sim, i: usize) -> u32 {
    match s.gpu(i).power_mw {
        Some(p) => p,
        None => {
            let util = s.utilization(i).0;
            (72_000 + util * 6_000).min(s.gpu(i).power_limit_mw)
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    d: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut out => with_dev(d, Some(Feature::Power), |s, i| {
        if out.is_none() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let p = power_usage(s, i);
        put(out, p)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimit(
    d: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut out => with_dev(d, Some(Feature::Power), |s, i| {
        put(out, s.gpu(i).power_limit_mw)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementDefaultLimit(
    d: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut out => with_dev(d, Some(Feature::Power), |s, i| {
        put(out, s.gpu(i).power_limit_mw)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEnforcedPowerLimit(
    d: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut out => with_dev(d, Some(Feature::Power), |s, i| {
        put(out, s.gpu(i).power_limit_mw)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFanSpeed(d: nvmlDevice_t, out: *mut c_uint) -> nvmlReturn_t {
    guard!(mut out => with_dev(d, Some(Feature::Fan), |s, i| {
        match s.gpu(i).fan_pct {
            None => NVML_ERROR_NOT_SUPPORTED,
            Some(f) => put(out, f),
        }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFanSpeed_v2(
    d: nvmlDevice_t,
    fan: c_uint,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut out => with_dev(d, Some(Feature::Fan), |s, i| {
        match s.gpu(i).fan_pct {
            None => NVML_ERROR_NOT_SUPPORTED,
            Some(_) if fan != 0 => NVML_ERROR_INVALID_ARGUMENT,
            Some(f) => put(out, f),
        }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPerformanceState(
    d: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut out => with_dev(
        d,
        Some(Feature::PerformanceState),
        |_, _| put(out, 0)
    ))
}

pub(super) fn current_clock(s: &mut Sim, i: usize, kind: c_uint) -> Option<u32> {
    let busy = s.utilization(i).0 > 0;
    let st = s.gpu_state(i);
    let g = s.gpu(i);
    match kind {
        NVML_CLOCK_GRAPHICS | NVML_CLOCK_SM => {
            let mut c = if busy {
                st.applications_clocks
                    .map(|a| a.graphics_mhz)
                    .unwrap_or(g.max_graphics_mhz)
            } else {
                345
            };
            if let Some(r) = st.locked_clocks {
                c = c.clamp(r.min_mhz.min(r.max_mhz), r.max_mhz);
            }
            Some(c)
        }
        NVML_CLOCK_MEM => {
            let mut c = st
                .applications_clocks
                .map(|a| a.mem_mhz)
                .unwrap_or(g.max_memory_mhz);
            if let Some(r) = st.memory_locked_clocks {
                c = c.clamp(r.min_mhz.min(r.max_mhz), r.max_mhz);
            }
            Some(c)
        }
        NVML_CLOCK_VIDEO => Some(if busy { g.max_video_mhz } else { 765 }),
        _ => None,
    }
}

pub(super) fn max_clock(s: &Sim, i: usize, kind: c_uint) -> Option<u32> {
    let g = s.gpu(i);
    match kind {
        NVML_CLOCK_GRAPHICS | NVML_CLOCK_SM => Some(g.max_graphics_mhz),
        NVML_CLOCK_MEM => Some(g.max_memory_mhz),
        NVML_CLOCK_VIDEO => Some(g.max_video_mhz),
        _ => None,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    d: nvmlDevice_t,
    kind: c_uint,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut out => with_dev(
        d,
        Some(Feature::Clocks),
        |s, i| match current_clock(s, i, kind) {
            None => NVML_ERROR_INVALID_ARGUMENT,
            Some(c) => put(out, c),
        }
    ))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(
    d: nvmlDevice_t,
    kind: c_uint,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut out => with_dev(d, Some(Feature::Clocks), |s, i| {
        match max_clock(s, i, kind) {
            None => NVML_ERROR_INVALID_ARGUMENT,
            Some(c) => put(out, c),
        }
    }))
}
