//! C types and constants of the NVML ABI (layouts as in nvml.h / nvml-wrapper-sys).

#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]

use std::os::raw::{c_char, c_uint, c_ulonglong};

pub type nvmlReturn_t = c_uint;
pub type nvmlDevice_t = *mut std::ffi::c_void;

pub const NVML_SUCCESS: nvmlReturn_t = 0;
pub const NVML_ERROR_UNINITIALIZED: nvmlReturn_t = 1;
pub const NVML_ERROR_INVALID_ARGUMENT: nvmlReturn_t = 2;
pub const NVML_ERROR_NOT_SUPPORTED: nvmlReturn_t = 3;
pub const NVML_ERROR_NO_PERMISSION: nvmlReturn_t = 4;
pub const NVML_ERROR_ALREADY_INITIALIZED: nvmlReturn_t = 5;
pub const NVML_ERROR_NOT_FOUND: nvmlReturn_t = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: nvmlReturn_t = 7;
pub const NVML_ERROR_INSUFFICIENT_POWER: nvmlReturn_t = 8;
pub const NVML_ERROR_DRIVER_NOT_LOADED: nvmlReturn_t = 9;
pub const NVML_ERROR_TIMEOUT: nvmlReturn_t = 10;
pub const NVML_ERROR_IRQ_ISSUE: nvmlReturn_t = 11;
pub const NVML_ERROR_LIBRARY_NOT_FOUND: nvmlReturn_t = 12;
pub const NVML_ERROR_FUNCTION_NOT_FOUND: nvmlReturn_t = 13;
pub const NVML_ERROR_CORRUPTED_INFOROM: nvmlReturn_t = 14;
pub const NVML_ERROR_GPU_IS_LOST: nvmlReturn_t = 15;
pub const NVML_ERROR_RESET_REQUIRED: nvmlReturn_t = 16;
pub const NVML_ERROR_OPERATING_SYSTEM: nvmlReturn_t = 17;
pub const NVML_ERROR_LIB_RM_VERSION_MISMATCH: nvmlReturn_t = 18;
pub const NVML_ERROR_IN_USE: nvmlReturn_t = 19;
pub const NVML_ERROR_MEMORY: nvmlReturn_t = 20;
pub const NVML_ERROR_NO_DATA: nvmlReturn_t = 21;
pub const NVML_ERROR_VGPU_ECC_NOT_SUPPORTED: nvmlReturn_t = 22;
pub const NVML_ERROR_INSUFFICIENT_RESOURCES: nvmlReturn_t = 23;
pub const NVML_ERROR_FREQ_NOT_SUPPORTED: nvmlReturn_t = 24;
pub const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: nvmlReturn_t = 25;
pub const NVML_ERROR_DEPRECATED: nvmlReturn_t = 26;
pub const NVML_ERROR_NOT_READY: nvmlReturn_t = 27;
pub const NVML_ERROR_GPU_NOT_FOUND: nvmlReturn_t = 28;
pub const NVML_ERROR_INVALID_STATE: nvmlReturn_t = 29;
pub const NVML_ERROR_UNKNOWN: nvmlReturn_t = 999;

/// Every return code: (symbolic name without the `NVML_ERROR_` prefix, code, NVIDIA's wording).
pub const RETURN_CODES: &[(&str, nvmlReturn_t, &std::ffi::CStr)] = &[
    ("SUCCESS", NVML_SUCCESS, c"Success"),
    ("UNINITIALIZED", NVML_ERROR_UNINITIALIZED, c"Uninitialized"),
    (
        "INVALID_ARGUMENT",
        NVML_ERROR_INVALID_ARGUMENT,
        c"Invalid Argument",
    ),
    ("NOT_SUPPORTED", NVML_ERROR_NOT_SUPPORTED, c"Not Supported"),
    (
        "NO_PERMISSION",
        NVML_ERROR_NO_PERMISSION,
        c"Insufficient Permissions",
    ),
    (
        "ALREADY_INITIALIZED",
        NVML_ERROR_ALREADY_INITIALIZED,
        c"Already Initialized",
    ),
    ("NOT_FOUND", NVML_ERROR_NOT_FOUND, c"Not Found"),
    (
        "INSUFFICIENT_SIZE",
        NVML_ERROR_INSUFFICIENT_SIZE,
        c"Insufficient Size",
    ),
    (
        "INSUFFICIENT_POWER",
        NVML_ERROR_INSUFFICIENT_POWER,
        c"Insufficient External Power",
    ),
    (
        "DRIVER_NOT_LOADED",
        NVML_ERROR_DRIVER_NOT_LOADED,
        c"Driver Not Loaded",
    ),
    ("TIMEOUT", NVML_ERROR_TIMEOUT, c"Timeout"),
    (
        "IRQ_ISSUE",
        NVML_ERROR_IRQ_ISSUE,
        c"Interrupt Request Issue",
    ),
    (
        "LIBRARY_NOT_FOUND",
        NVML_ERROR_LIBRARY_NOT_FOUND,
        c"NVML Shared Library Not Found",
    ),
    (
        "FUNCTION_NOT_FOUND",
        NVML_ERROR_FUNCTION_NOT_FOUND,
        c"Function Not Found",
    ),
    (
        "CORRUPTED_INFOROM",
        NVML_ERROR_CORRUPTED_INFOROM,
        c"Corrupted infoROM",
    ),
    ("GPU_IS_LOST", NVML_ERROR_GPU_IS_LOST, c"GPU is lost"),
    (
        "RESET_REQUIRED",
        NVML_ERROR_RESET_REQUIRED,
        c"GPU requires restart",
    ),
    (
        "OPERATING_SYSTEM",
        NVML_ERROR_OPERATING_SYSTEM,
        c"The operating system has blocked the request.",
    ),
    (
        "LIB_RM_VERSION_MISMATCH",
        NVML_ERROR_LIB_RM_VERSION_MISMATCH,
        c"RM has detected an NVML/RM version mismatch.",
    ),
    ("IN_USE", NVML_ERROR_IN_USE, c"In use by another client"),
    ("MEMORY", NVML_ERROR_MEMORY, c"Insufficient Memory"),
    ("NO_DATA", NVML_ERROR_NO_DATA, c"No data"),
    (
        "VGPU_ECC_NOT_SUPPORTED",
        NVML_ERROR_VGPU_ECC_NOT_SUPPORTED,
        c"The requested vgpu operation is not available on target device, becasue ECC is enabled",
    ),
    (
        "INSUFFICIENT_RESOURCES",
        NVML_ERROR_INSUFFICIENT_RESOURCES,
        c"Ran out of critical resources, other than memory",
    ),
    (
        "FREQ_NOT_SUPPORTED",
        NVML_ERROR_FREQ_NOT_SUPPORTED,
        c"The requested frequency is not supported",
    ),
    (
        "ARGUMENT_VERSION_MISMATCH",
        NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
        c"Version mismatch between passed in argument and what is expected",
    ),
    (
        "DEPRECATED",
        NVML_ERROR_DEPRECATED,
        c"The requested functionality has been deprecated",
    ),
    (
        "NOT_READY",
        NVML_ERROR_NOT_READY,
        c"The system is not ready for the request",
    ),
    (
        "GPU_NOT_FOUND",
        NVML_ERROR_GPU_NOT_FOUND,
        c"No GPUs were found",
    ),
    (
        "INVALID_STATE",
        NVML_ERROR_INVALID_STATE,
        c"Resource not in correct state to perform requested operation",
    ),
    ("UNKNOWN", NVML_ERROR_UNKNOWN, c"Unknown Error"),
];

pub const NVML_VALUE_NOT_AVAILABLE_ULL: u64 = u64::MAX;
pub const NO_INSTANCE_ID: u32 = 0xFFFF_FFFF;

pub const NVML_CLOCK_GRAPHICS: c_uint = 0;
pub const NVML_CLOCK_SM: c_uint = 1;
pub const NVML_CLOCK_MEM: c_uint = 2;
pub const NVML_CLOCK_VIDEO: c_uint = 3;

pub const NVML_TEMPERATURE_GPU: c_uint = 0;

pub const NVML_COMPUTEMODE_DEFAULT: c_uint = 0;
pub const NVML_COMPUTEMODE_EXCLUSIVE_THREAD: c_uint = 1;
pub const NVML_COMPUTEMODE_PROHIBITED: c_uint = 2;
pub const NVML_COMPUTEMODE_EXCLUSIVE_PROCESS: c_uint = 3;

pub const NVML_BRAND_NVIDIA: c_uint = 14;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlPciInfo_v1_t {
    pub busId: [c_char; 16],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pciDeviceId: c_uint,
    pub pciSubSystemId: c_uint,
    pub reserved: [c_uint; 4],
}

/// v2 and v3 share this layout (`nvmlPciInfo_t`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlPciInfo_t {
    pub busIdLegacy: [c_char; 16],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pciDeviceId: c_uint,
    pub pciSubSystemId: c_uint,
    pub busId: [c_char; 32],
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlMemory_t {
    pub total: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlMemory_v2_t {
    pub version: c_uint,
    pub total: c_ulonglong,
    pub reserved: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

pub const NVML_MEMORY_V2: c_uint = (std::mem::size_of::<nvmlMemory_v2_t>() as c_uint) | (2 << 24);

#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlBAR1Memory_t {
    pub bar1Total: c_ulonglong,
    pub bar1Free: c_ulonglong,
    pub bar1Used: c_ulonglong,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlUtilization_t {
    pub gpu: c_uint,
    pub memory: c_uint,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlProcessInfo_v1_t {
    pub pid: c_uint,
    pub usedGpuMemory: c_ulonglong,
}

/// The struct of the `_v2` and `_v3` process queries.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlProcessInfo_t {
    pub pid: c_uint,
    pub usedGpuMemory: c_ulonglong,
    pub gpuInstanceId: c_uint,
    pub computeInstanceId: c_uint,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlProcessUtilizationSample_t {
    pub pid: c_uint,
    pub timeStamp: c_ulonglong,
    pub smUtil: c_uint,
    pub memUtil: c_uint,
    pub encUtil: c_uint,
    pub decUtil: c_uint,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlProcessUtilizationInfo_v1_t {
    pub timeStamp: c_ulonglong,
    pub pid: c_uint,
    pub smUtil: c_uint,
    pub memUtil: c_uint,
    pub encUtil: c_uint,
    pub decUtil: c_uint,
    pub jpgUtil: c_uint,
    pub ofaUtil: c_uint,
}

#[repr(C)]
pub struct nvmlProcessesUtilizationInfo_t {
    pub version: c_uint,
    pub processSamplesCount: c_uint,
    pub lastSeenTimeStamp: c_ulonglong,
    pub procUtilArray: *mut nvmlProcessUtilizationInfo_v1_t,
}

pub const NVML_PROCESSES_UTILIZATION_INFO_V1: c_uint =
    (std::mem::size_of::<nvmlProcessesUtilizationInfo_t>() as c_uint) | (1 << 24);

#[cfg(test)]
mod layout {
    use super::*;
    use nvml_wrapper_sys::bindings as b;
    use std::mem::{align_of, size_of};

    macro_rules! same {
        ($($ours:ty => $theirs:ty),* $(,)?) => {$(
            assert_eq!(size_of::<$ours>(), size_of::<$theirs>(), stringify!($ours));
            assert_eq!(align_of::<$ours>(), align_of::<$theirs>(), stringify!($ours));
        )*};
    }

    #[test]
    fn layouts_match_nvml_wrapper_sys() {
        same! {
            nvmlPciInfo_t => b::nvmlPciInfo_t,
            nvmlMemory_t => b::nvmlMemory_t,
            nvmlMemory_v2_t => b::nvmlMemory_v2_t,
            nvmlBAR1Memory_t => b::nvmlBAR1Memory_t,
            nvmlUtilization_t => b::nvmlUtilization_t,
            nvmlProcessInfo_v1_t => b::nvmlProcessInfo_v1_t,
            nvmlProcessInfo_t => b::nvmlProcessInfo_t,
            nvmlProcessUtilizationSample_t => b::nvmlProcessUtilizationSample_t,
            nvmlProcessUtilizationInfo_v1_t => b::nvmlProcessUtilizationInfo_v1_t,
            nvmlProcessesUtilizationInfo_t => b::nvmlProcessesUtilizationInfo_t,
        }
        // nvml.h v1 nvmlPciInfo_t: busId[16], five uints, four reserved uints.
        assert_eq!(size_of::<nvmlPciInfo_v1_t>(), 52);
        assert_eq!(
            b::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST,
            NVML_ERROR_GPU_IS_LOST
        );
        assert_eq!(b::nvmlReturn_enum_NVML_ERROR_UNKNOWN, NVML_ERROR_UNKNOWN);
        assert_eq!(
            b::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
            NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        );
        assert_eq!(b::nvmlBrandType_enum_NVML_BRAND_NVIDIA, NVML_BRAND_NVIDIA);
    }
}
