//! Processes: the running-process lists and per-process utilization.

use super::*;

/// The processes a handle lists: all of the GPU's, or a MIG device's own.
pub(super) fn procs_of(
    s: &mut Sim,
    t: Target,
    want: fn(&sim::ProcNow) -> bool,
) -> Vec<sim::ProcNow> {
    let (i, only) = match t {
        Target::Gpu(i) => (i, None),
        Target::Mig { gpu, gi, ci, .. } => (gpu, Some((gi, ci))),
    };
    s.gpu_now(i)
        .procs
        .iter()
        .filter(|p| want(p) && (only.is_none() || p.instance == only))
        .cloned()
        .collect()
}

fn running_v1(
    d: nvmlDevice_t,
    count: Option<&mut c_uint>,
    infos: Buf<nvmlProcessInfo_v1_t>,
    want: fn(&sim::ProcNow) -> bool,
) -> nvmlReturn_t {
    with_target(d, Some(Feature::Processes), |s, t| {
        let items: Vec<nvmlProcessInfo_v1_t> = procs_of(s, t, want)
            .into_iter()
            .map(|p| nvmlProcessInfo_v1_t {
                pid: p.pid,
                usedGpuMemory: p.used_bytes.unwrap_or(NVML_VALUE_NOT_AVAILABLE_ULL),
            })
            .collect();
        put_list(count, infos, &items)
    })
}

fn running_v2(
    d: nvmlDevice_t,
    count: Option<&mut c_uint>,
    infos: Buf<nvmlProcessInfo_t>,
    want: fn(&sim::ProcNow) -> bool,
) -> nvmlReturn_t {
    with_target(d, Some(Feature::Processes), |s, t| {
        let items: Vec<nvmlProcessInfo_t> = procs_of(s, t, want)
            .into_iter()
            .map(|p| nvmlProcessInfo_t {
                pid: p.pid,
                usedGpuMemory: p.used_bytes.unwrap_or(NVML_VALUE_NOT_AVAILABLE_ULL),
                gpuInstanceId: p.instance.map_or(NO_INSTANCE_ID, |i| i.0),
                computeInstanceId: p.instance.map_or(NO_INSTANCE_ID, |i| i.1),
            })
            .collect();
        put_list(count, infos, &items)
    })
}

/// Under MPS (Volta and later) the compute list holds the server and every client, each
/// with its own memory, as a real driver's does; the MPS list holds the clients only, so
/// nvidia-smi shows a client as `M+C` and the server as `C`.
pub(super) fn is_compute(p: &sim::ProcNow) -> bool {
    p.kind.compute()
}
pub(super) fn is_graphics(p: &sim::ProcNow) -> bool {
    p.kind.graphics()
}
pub(super) fn is_any(_: &sim::ProcNow) -> bool {
    true
}
pub(super) fn is_mps(p: &sim::ProcNow) -> bool {
    p.mps == Some(crate::scenario::MpsRole::Client)
}

macro_rules! process_queries {
    ($($v1:ident, $v2:ident, $v3:ident => $want:ident;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $v1(
            d: nvmlDevice_t,
            count: *mut c_uint,
            infos: *mut nvmlProcessInfo_v1_t,
        ) -> nvmlReturn_t {
            guard!(mut count; buf infos => running_v1(d, count, infos, $want))
        }

        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $v2(
            d: nvmlDevice_t,
            count: *mut c_uint,
            infos: *mut nvmlProcessInfo_t,
        ) -> nvmlReturn_t {
            guard!(mut count; buf infos => running_v2(d, count, infos, $want))
        }

        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $v3(
            d: nvmlDevice_t,
            count: *mut c_uint,
            infos: *mut nvmlProcessInfo_t,
        ) -> nvmlReturn_t {
            guard!(mut count; buf infos => running_v2(d, count, infos, $want))
        }
    )*};
}

process_queries! {
    nvmlDeviceGetComputeRunningProcesses, nvmlDeviceGetComputeRunningProcesses_v2,
        nvmlDeviceGetComputeRunningProcesses_v3 => is_compute;
    nvmlDeviceGetGraphicsRunningProcesses, nvmlDeviceGetGraphicsRunningProcesses_v2,
        nvmlDeviceGetGraphicsRunningProcesses_v3 => is_graphics;
    nvmlDeviceGetMPSComputeRunningProcesses, nvmlDeviceGetMPSComputeRunningProcesses_v2,
        nvmlDeviceGetMPSComputeRunningProcesses_v3 => is_mps;
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    d: nvmlDevice_t,
    samples: *mut nvmlProcessUtilizationSample_t,
    count: *mut c_uint,
    last_seen: c_ulonglong,
) -> nvmlReturn_t {
    guard!(mut count; buf samples => with_dev(d, Some(Feature::ProcessUtilization), |s, i| {
        let Some(count) = count else {
            return NVML_ERROR_INVALID_ARGUMENT;
        };
        if s.gpu(i).mig_mode {
            return NVML_ERROR_NOT_SUPPORTED;
        }
        let now = sim::now_unix_us();
        let items: Vec<nvmlProcessUtilizationSample_t> = if last_seen >= now {
            Vec::new()
        } else {
            s.gpu_now(i)
                .procs
                .iter()
                .map(|p| nvmlProcessUtilizationSample_t {
                    pid: p.pid,
                    timeStamp: now,
                    smUtil: p.sm_pct,
                    memUtil: p.mem_pct,
                    encUtil: 0,
                    decUtil: 0,
                })
                .collect()
        };
        if items.is_empty() {
            *count = 0;
            return NVML_ERROR_NOT_FOUND;
        }
        put_list(Some(count), samples, &items)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetProcessesUtilizationInfo(
    d: nvmlDevice_t,
    info: *mut nvmlProcessesUtilizationInfo_t,
) -> nvmlReturn_t {
    guard!(mut info => with_dev(d, Some(Feature::ProcessUtilization), |s, i| {
        let Some(info) = info else {
            return NVML_ERROR_INVALID_ARGUMENT;
        };
        if s.gpu(i).mig_mode {
            return NVML_ERROR_NOT_SUPPORTED;
        }
        if info.version != NVML_PROCESSES_UTILIZATION_INFO_V1 {
            return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        }
        let now = sim::now_unix_us();
        let items: Vec<nvmlProcessUtilizationInfo_v1_t> = if info.lastSeenTimeStamp >= now {
            Vec::new()
        } else {
            s.gpu_now(i)
                .procs
                .iter()
                .map(|p| nvmlProcessUtilizationInfo_v1_t {
                    timeStamp: now,
                    pid: p.pid,
                    smUtil: p.sm_pct,
                    memUtil: p.mem_pct,
                    encUtil: 0,
                    decUtil: 0,
                    jpgUtil: 0,
                    ofaUtil: 0,
                })
                .collect()
        };
        if items.is_empty() {
            info.processSamplesCount = 0;
            return NVML_ERROR_NOT_FOUND;
        }
        // SAFETY: the struct's contract: procUtilArray is null or holds processSamplesCount
        // entries.
        let array = unsafe { Buf::new(info.procUtilArray) };
        put_list(Some(&mut info.processSamplesCount), array, &items)
    }))
}
