//! Board facts and modes that nvidia-smi reads for every GPU. None has a scenario key: each
//! answers what an HGX H100/H200 answers, and is named in `NVML_SIM_TRACE` as a default.
//! (MIG mode has scenario keys: see `mig.rs`.)

use super::*;

const DISABLED: c_uint = 0;
const ENABLED: c_uint = 1;

/// No display is attached to a data-center GPU.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDisplayActive(
    d: nvmlDevice_t,
    active: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut active => fixed("nvmlDeviceGetDisplayActive", d, |_, _| {
        put(active, DISABLED)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDisplayMode(
    d: nvmlDevice_t,
    mode: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut mode => fixed("nvmlDeviceGetDisplayMode", d, |_, _| {
        put(mode, DISABLED)
    }))
}

/// HBM GPUs ship with ECC on, and it cannot be turned off on H100/H200 HBM3.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEccMode(
    d: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut current, pending => fixed("nvmlDeviceGetEccMode", d, |_, _| {
        let (Some(current), Some(pending)) = (current, pending) else {
            return NVML_ERROR_INVALID_ARGUMENT;
        };
        *current = ENABLED;
        *pending = ENABLED;
        NVML_SUCCESS
    }))
}

/// Bare metal: NVML_GPU_VIRTUALIZATION_MODE_NONE.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetVirtualizationMode(
    d: nvmlDevice_t,
    mode: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut mode => fixed("nvmlDeviceGetVirtualizationMode", d, |_, _| {
        put(mode, 0)
    }))
}

/// The inforom checksum is valid.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceValidateInforom(d: nvmlDevice_t) -> nvmlReturn_t {
    guard!(fixed("nvmlDeviceValidateInforom", d, |_, _| NVML_SUCCESS))
}
