//! What `nvidia-smi -q` reads beyond the figures gpuctl uses: board identity, PCIe link,
//! SRAM ECC counters, thresholds, engine utilization, field values. None of it has a
//! scenario key (the health figures do: see health.rs). Each answers what an HGX H100/H200
//! on driver 535 answers (PCIe Gen5 x16, NVSwitch fabric up), and is traced as a default.
//! Where that driver itself answers NOT_SUPPORTED (nvidia-smi prints N/A), the sim leaves
//! the stub in place; tests/nvidia_smi.rs lists those calls with the reason.

use nvml_wrapper_sys::bindings::{
    nvmlEccSramErrorStatus_v1_t, nvmlFBCStats_t, nvmlFieldValue_t, nvmlGpuFabricInfo_t,
    nvmlSample_t, nvmlValue_t,
};

use super::*;
use crate::trace::{self, Gap};

fn is_h100(s: &Sim, i: usize) -> bool {
    s.gpu(i).name.contains("H100")
}

/// Writes a `u32` answer through `out`.
macro_rules! fixed_uint {
    ($($name:ident => |$s:ident, $i:ident| $value:expr;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(d: nvmlDevice_t, out: *mut c_uint) -> nvmlReturn_t {
            guard!(mut out => fixed(stringify!($name), d, |$s, $i| {
                let _ = (&$s, &$i);
                put(out, $value)
            }))
        }
    )*};
}

fixed_uint! {
    nvmlDeviceGetMultiGpuBoard => |s, i| 0;
    // The board id nvidia-smi shows on HGX boards is the bus number shifted left a byte.
    nvmlDeviceGetBoardId => |s, i| s.gpu(i).pci.bus << 8;
    // HGX module positions count from 1.
    nvmlDeviceGetModuleId => |s, i| i as c_uint + 1;
    nvmlDeviceGetAccountingBufferSize => |s, i| 4000;
    nvmlDeviceGetMaxPcieLinkGeneration => |s, i| 5;
    nvmlDeviceGetGpuMaxPcieLinkGeneration => |s, i| 5;
    nvmlDeviceGetCurrPcieLinkGeneration => |s, i| 5;
    nvmlDeviceGetMaxPcieLinkWidth => |s, i| 16;
    nvmlDeviceGetCurrPcieLinkWidth => |s, i| 16;
    nvmlDeviceGetPcieReplayCounter => |s, i| 0;
}

/// Writes a string answer into a caller buffer of `len` bytes.
macro_rules! fixed_str {
    ($($name:ident => |$s:ident, $i:ident| $value:expr;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            d: nvmlDevice_t,
            buf: *mut c_char,
            len: c_uint,
        ) -> nvmlReturn_t {
            guard!(buf buf => fixed(stringify!($name), d, |$s, $i| put_str(buf, len, $value)))
        }
    )*};
}

fixed_str! {
    nvmlDeviceGetVbiosVersion => |s, i| if is_h100(s, i) { "96.00.74.00.0D" } else { "96.00.A5.00.01" };
    nvmlDeviceGetBoardPartNumber => |s, i| if is_h100(s, i) { "692-2G520-0200-000" } else { "692-2G520-0280-000" };
    nvmlDeviceGetInforomImageVersion => |s, i| if is_h100(s, i) { "G520.0200.00.05" } else { "G520.0280.00.05" };
}

/// The inforom's OEM and ECC objects; Hopper has no power-management object.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetInforomVersion(
    d: nvmlDevice_t,
    object: c_uint,
    buf: *mut c_char,
    len: c_uint,
) -> nvmlReturn_t {
    guard!(buf buf => fixed(
        "nvmlDeviceGetInforomVersion",
        d,
        |_, _| match object {
            0 => put_str(buf, len, "2.1"),
            1 => put_str(buf, len, "7.16"),
            2 => NVML_ERROR_NOT_SUPPORTED,
            _ => NVML_ERROR_INVALID_ARGUMENT,
        }
    ))
}

/// The GSP firmware ships with the driver and carries its version. The buffer is
/// NVML_GSP_FIRMWARE_VERSION_BUF_SIZE (64) bytes; the call takes no length.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGspFirmwareVersion(
    d: nvmlDevice_t,
    buf: *mut c_char,
) -> nvmlReturn_t {
    guard!(buf buf => fixed("nvmlDeviceGetGspFirmwareVersion", d, |s, _| {
        put_str(buf, 64, &s.scenario.driver_version)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPcieThroughput(
    d: nvmlDevice_t,
    counter: c_uint,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut out => fixed(
        "nvmlDeviceGetPcieThroughput",
        d,
        |_, _| match counter {
            0 | 1 => put(out, 0),
            _ => NVML_ERROR_INVALID_ARGUMENT,
        }
    ))
}

/// The video, JPEG and optical-flow engines are idle: 0 % over the driver's sampling period.
macro_rules! idle_engine {
    ($($name:ident)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            d: nvmlDevice_t,
            util: *mut c_uint,
            period_us: *mut c_uint,
        ) -> nvmlReturn_t {
            guard!(mut util, period_us => fixed(stringify!($name), d, |_, _| {
                let (Some(util), Some(period_us)) = (util, period_us) else {
                    return NVML_ERROR_INVALID_ARGUMENT;
                };
                *util = 0;
                *period_us = 167_000;
                NVML_SUCCESS
            }))
        }
    )*};
}

idle_engine! {
    nvmlDeviceGetEncoderUtilization
    nvmlDeviceGetDecoderUtilization
    nvmlDeviceGetJpgUtilization
    nvmlDeviceGetOfaUtilization
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEncoderStats(
    d: nvmlDevice_t,
    sessions: *mut c_uint,
    fps: *mut c_uint,
    latency_us: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut sessions, fps, latency_us => fixed("nvmlDeviceGetEncoderStats", d, |_, _| {
        let (Some(sessions), Some(fps), Some(latency_us)) = (sessions, fps, latency_us) else {
            return NVML_ERROR_INVALID_ARGUMENT;
        };
        *sessions = 0;
        *fps = 0;
        *latency_us = 0;
        NVML_SUCCESS
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFBCStats(
    d: nvmlDevice_t,
    out: *mut nvmlFBCStats_t,
) -> nvmlReturn_t {
    guard!(mut out => fixed("nvmlDeviceGetFBCStats", d, |_, _| {
        put(
            out,
            nvmlFBCStats_t {
                sessionsCount: 0,
                averageFPS: 0,
                averageLatency: 0,
            },
        )
    }))
}

/// Confidential computing is off: the protected region is empty.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetConfComputeProtectedMemoryUsage(
    d: nvmlDevice_t,
    out: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    guard!(mut out => fixed(
        "nvmlDeviceGetConfComputeProtectedMemoryUsage",
        d,
        |_, _| {
            put(
                out,
                nvmlMemory_t {
                    total: 0,
                    free: 0,
                    used: 0,
                },
            )
        }
    ))
}

// ---------------------------------------------------------------------------------------
// ECC (the DRAM counters and remapped rows are in health.rs): the SRAM counts no errors.

/// nvmlEccSramErrorStatus_v1: size of the struct | 1 << 24 (NVML_STRUCT_VERSION).
pub(super) const ECC_SRAM_ERROR_STATUS_V1: c_uint =
    std::mem::size_of::<nvmlEccSramErrorStatus_v1_t>() as c_uint | (1 << 24);

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSramEccErrorStatus(
    d: nvmlDevice_t,
    out: *mut nvmlEccSramErrorStatus_v1_t,
) -> nvmlReturn_t {
    guard!(mut out => fixed("nvmlDeviceGetSramEccErrorStatus", d, |_, _| {
        let Some(out) = out else {
            return NVML_ERROR_INVALID_ARGUMENT;
        };
        let version = out.version;
        if version != ECC_SRAM_ERROR_STATUS_V1 {
            return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        }
        put(
            Some(out),
            nvmlEccSramErrorStatus_v1_t {
                version,
                aggregateUncParity: 0,
                aggregateUncSecDed: 0,
                aggregateCor: 0,
                volatileUncParity: 0,
                volatileUncSecDed: 0,
                volatileCor: 0,
                aggregateUncBucketL2: 0,
                aggregateUncBucketSm: 0,
                aggregateUncBucketPcie: 0,
                aggregateUncBucketMcu: 0,
                aggregateUncBucketOther: 0,
                bThresholdExceeded: 0,
            },
        )
    }))
}

// ---------------------------------------------------------------------------------------
// Temperatures and clocks

pub(super) const SHUTDOWN_C: c_uint = 92;
pub(super) const SLOWDOWN_C: c_uint = 89;
pub(super) const MEMORY_MAX_OPERATING_C: c_uint = 95;
pub(super) const GPU_MAX_OPERATING_C: c_uint = 87;

/// HBM runs a few degrees below the GPU core.
fn memory_temperature(s: &mut Sim, i: usize) -> c_uint {
    temperature(s, i).saturating_sub(4)
}

/// HGX H100/H200 thresholds (°C): shutdown, slowdown, memory max, GPU max operating. The
/// acoustic thresholds are for boards with fans.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureThreshold(
    d: nvmlDevice_t,
    threshold: c_uint,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut out => fixed("nvmlDeviceGetTemperatureThreshold", d, |_, _| {
        let value = match threshold {
            0 => SHUTDOWN_C,
            1 => SLOWDOWN_C,
            2 => MEMORY_MAX_OPERATING_C,
            3 => GPU_MAX_OPERATING_C,
            4..=6 => return NVML_ERROR_NOT_SUPPORTED,
            _ => return NVML_ERROR_INVALID_ARGUMENT,
        };
        put(out, value)
    }))
}

/// nvmlClocksEventReasonAll: every reason is reported on Hopper.
const CLOCK_EVENT_REASONS_ALL: c_ulonglong = 0x1ff;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedClocksThrottleReasons(
    d: nvmlDevice_t,
    out: *mut c_ulonglong,
) -> nvmlReturn_t {
    guard!(mut out => fixed(
        "nvmlDeviceGetSupportedClocksThrottleReasons",
        d,
        |_, _| put(out, CLOCK_EVENT_REASONS_ALL)
    ))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedClocksEventReasons(
    d: nvmlDevice_t,
    out: *mut c_ulonglong,
) -> nvmlReturn_t {
    guard!(mut out => fixed(
        "nvmlDeviceGetSupportedClocksEventReasons",
        d,
        |_, _| put(out, CLOCK_EVENT_REASONS_ALL)
    ))
}

/// `nvmlDeviceGetClock(device, type, id)`: the current clock, the applications clock target
/// and default, and the customer boost maximum, from the same model as the clock queries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetClock(
    d: nvmlDevice_t,
    kind: c_uint,
    id: c_uint,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut out => with_dev(d, Some(Feature::Clocks), |s, i| {
        let mhz = match id {
            0 => current_clock(s, i, kind),
            1 => app_clock(s, i, kind, false),
            2 => app_clock(s, i, kind, true),
            3 => max_clock(s, i, kind),
            _ => None,
        };
        match mhz {
            None => NVML_ERROR_INVALID_ARGUMENT,
            Some(mhz) => put(out, mhz),
        }
    }))
}

/// The NVLink fabric of an HGX board (NVSwitch) has been set up: state COMPLETED.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfo(
    d: nvmlDevice_t,
    out: *mut nvmlGpuFabricInfo_t,
) -> nvmlReturn_t {
    guard!(mut out => fixed("nvmlDeviceGetGpuFabricInfo", d, |_, _| {
        put(
            out,
            nvmlGpuFabricInfo_t {
                clusterUuid: [0; 16],
                status: NVML_SUCCESS,
                cliqueId: 0,
                state: 3,
            },
        )
    }))
}

// ---------------------------------------------------------------------------------------
// Samples and field values

const VALUE_TYPE_UNSIGNED_INT: c_uint = 1;
const VALUE_TYPE_SIGNED_INT: c_uint = 5;

/// One sample, now, of what the matching query answers; none newer than `last_seen`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSamples(
    d: nvmlDevice_t,
    kind: c_uint,
    last_seen: c_ulonglong,
    value_type: *mut c_uint,
    count: *mut c_uint,
    samples: *mut nvmlSample_t,
) -> nvmlReturn_t {
    guard!(mut value_type, count; buf samples => with_dev(d, None, |s, i| {
        let (Some(value_type), Some(count)) = (value_type, count) else {
            return NVML_ERROR_INVALID_ARGUMENT;
        };
        let value = match kind {
            0 => power_usage(s, i),
            // No whole-GPU utilization counters in MIG mode (as nvmlDeviceGetUtilizationRates).
            1 | 2 if s.gpu(i).mig_mode => return NVML_ERROR_NOT_SUPPORTED,
            1 => s.utilization(i).0,
            2 => s.utilization(i).1,
            3 | 4 | 8 | 9 => 0,
            5 => current_clock(s, i, NVML_CLOCK_GRAPHICS).unwrap_or(0),
            6 => current_clock(s, i, NVML_CLOCK_MEM).unwrap_or(0),
            7 => return NVML_ERROR_NOT_SUPPORTED,
            _ => return NVML_ERROR_INVALID_ARGUMENT,
        };
        let now = sim::now_unix_us();
        *value_type = VALUE_TYPE_UNSIGNED_INT;
        if last_seen >= now {
            *count = 0;
            return NVML_ERROR_NOT_FOUND;
        }
        let sample = nvmlSample_t {
            timeStamp: now,
            sampleValue: nvmlValue_t { uiVal: value },
        };
        put_list(Some(count), samples, &[sample])
    }))
}

/// A field's value, typed as the driver types it.
enum FieldValue {
    Unsigned(c_uint),
    Signed(c_int),
}

/// A field's answer: its value, or the per-field error a real driver gives.
fn field(s: &mut Sim, i: usize, id: c_uint, scope: c_uint) -> Result<FieldValue, nvmlReturn_t> {
    use FieldValue::{Signed, Unsigned};
    const GPU_SCOPE: c_uint = 0;
    let limit = s.gpu(i).power_limit_mw;
    let gpu_only = |v: c_uint| {
        if scope == GPU_SCOPE {
            Ok(Unsigned(v))
        } else {
            // Module power (a Grace Hopper module) is not reported on an HGX board.
            Err(NVML_ERROR_NOT_SUPPORTED)
        }
    };
    // T.Limit fields: how far each threshold lies from the maximum operating temperature.
    let below_max = |c: c_uint| Ok(Signed(GPU_MAX_OPERATING_C as c_int - c as c_int));
    match id {
        82 => Ok(Unsigned(memory_temperature(s, i))),
        95 => Ok(Unsigned(0)), // PCIe replay rollovers
        185 | 186 => gpu_only(power_usage(s, i)),
        187 => gpu_only(200_000), // minimum power limit, 200 W on H100/H200 SXM
        188..=190 | 192 => gpu_only(limit),
        193 => below_max(SHUTDOWN_C),
        194 => below_max(SLOWDOWN_C),
        195 | 196 => Ok(Signed(0)),
        226..=227 | 230 => super::health::recovery_field(s, i, id).map(Unsigned),
        228 | 229 => Ok(Unsigned(0)), // PCIe atomics masks
        _ => {
            trace::gap(
                format_args!("nvmlDeviceGetFieldValues field {id}"),
                Gap::NotModelled,
            );
            Err(NVML_ERROR_NOT_SUPPORTED)
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    d: nvmlDevice_t,
    count: c_int,
    values: *mut nvmlFieldValue_t,
) -> nvmlReturn_t {
    guard!(buf values => with_dev(d, None, |s, i| {
        if values.is_null() || count < 0 {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let Some(values) = values.slice(count as usize) else {
            return NVML_ERROR_INVALID_ARGUMENT;
        };
        let now = sim::now_unix_us() as i64;
        for v in values {
            v.timestamp = now;
            v.latencyUsec = 0;
            match field(s, i, v.fieldId, v.scopeId) {
                Ok(value) => {
                    v.nvmlReturn = NVML_SUCCESS;
                    v.value = nvmlValue_t { ullVal: 0 };
                    match value {
                        FieldValue::Unsigned(u) => {
                            v.valueType = VALUE_TYPE_UNSIGNED_INT;
                            v.value.uiVal = u;
                        }
                        FieldValue::Signed(i) => {
                            v.valueType = VALUE_TYPE_SIGNED_INT;
                            v.value.siVal = i;
                        }
                    }
                }
                Err(code) => v.nvmlReturn = code,
            }
        }
        NVML_SUCCESS
    }))
}
