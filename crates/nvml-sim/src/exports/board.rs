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
    guard!(fixed("nvmlDeviceGetDisplayActive", d, |_, _| unsafe {
        put(active, DISABLED)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDisplayMode(
    d: nvmlDevice_t,
    mode: *mut c_uint,
) -> nvmlReturn_t {
    guard!(fixed("nvmlDeviceGetDisplayMode", d, |_, _| unsafe {
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
    guard!(fixed("nvmlDeviceGetEccMode", d, |_, _| {
        if current.is_null() || pending.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        unsafe {
            put(current, ENABLED);
            put(pending, ENABLED)
        }
    }))
}

/// Bare metal: NVML_GPU_VIRTUALIZATION_MODE_NONE.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetVirtualizationMode(
    d: nvmlDevice_t,
    mode: *mut c_uint,
) -> nvmlReturn_t {
    guard!(fixed("nvmlDeviceGetVirtualizationMode", d, |_, _| unsafe {
        put(mode, 0)
    }))
}

/// The inforom checksum is valid.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceValidateInforom(d: nvmlDevice_t) -> nvmlReturn_t {
    guard!(fixed("nvmlDeviceValidateInforom", d, |_, _| NVML_SUCCESS))
}
