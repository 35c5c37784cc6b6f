//! C types and constants of the NVML ABI.
//!
//! Everything nvml-wrapper-sys (the bindgen output of nvml.h that nvml-wrapper uses) defines
//! with the driver's layout is taken from there; what it lacks is declared here, each with
//! the reason. Const assertions at the end pin sizes, offsets and values to nvml.h, so a change
//! on either side fails the build.

#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]

use std::os::raw::{c_char, c_uint, c_ulonglong};

use nvml_wrapper_sys::bindings as sys;

pub use sys::{
    nvmlBAR1Memory_t, nvmlDevice_t, nvmlMemory_t, nvmlMemory_v2_t, nvmlPciInfo_t,
    nvmlProcessInfo_t, nvmlProcessInfo_v1_t, nvmlProcessUtilizationInfo_v1_t,
    nvmlProcessUtilizationSample_t, nvmlProcessesUtilizationInfo_t, nvmlReturn_t,
    nvmlUtilization_t,
};
pub use sys::{
    nvmlComputeInstance_t, nvmlComputeInstanceInfo_t, nvmlComputeInstancePlacement_t,
    nvmlComputeInstanceProfileInfo_t, nvmlComputeInstanceProfileInfo_v2_t,
    nvmlComputeInstanceProfileInfo_v3_t, nvmlDeviceAttributes_t, nvmlGpuInstance_t,
    nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t, nvmlGpuInstanceProfileInfo_t,
    nvmlGpuInstanceProfileInfo_v2_t, nvmlGpuInstanceProfileInfo_v3_t,
};

pub const NVML_GPU_INSTANCE_PROFILE_1_SLICE: c_uint = sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE;
pub const NVML_GPU_INSTANCE_PROFILE_2_SLICE: c_uint = sys::NVML_GPU_INSTANCE_PROFILE_2_SLICE;
pub const NVML_GPU_INSTANCE_PROFILE_3_SLICE: c_uint = sys::NVML_GPU_INSTANCE_PROFILE_3_SLICE;
pub const NVML_GPU_INSTANCE_PROFILE_4_SLICE: c_uint = sys::NVML_GPU_INSTANCE_PROFILE_4_SLICE;
pub const NVML_GPU_INSTANCE_PROFILE_7_SLICE: c_uint = sys::NVML_GPU_INSTANCE_PROFILE_7_SLICE;
pub const NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2: c_uint =
    sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2;
pub const NVML_GPU_INSTANCE_PROFILE_COUNT: c_uint = sys::NVML_GPU_INSTANCE_PROFILE_COUNT;
pub const NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE: c_uint =
    sys::NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE;
pub const NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE: c_uint =
    sys::NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE;
pub const NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE: c_uint =
    sys::NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE;
pub const NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE: c_uint =
    sys::NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE;
pub const NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE: c_uint =
    sys::NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE;
pub const NVML_COMPUTE_INSTANCE_PROFILE_COUNT: c_uint = sys::NVML_COMPUTE_INSTANCE_PROFILE_COUNT;
pub const NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED: c_uint =
    sys::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED;

/// `NVML_STRUCT_VERSION(GpuInstanceProfileInfo, 2)` and `, 3)` (function-like macros).
pub const NVML_GPU_INSTANCE_PROFILE_INFO_V2: c_uint =
    (std::mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>() as c_uint) | (2 << 24);
pub const NVML_GPU_INSTANCE_PROFILE_INFO_V3: c_uint =
    (std::mem::size_of::<nvmlGpuInstanceProfileInfo_v3_t>() as c_uint) | (3 << 24);
/// `NVML_STRUCT_VERSION(ComputeInstanceProfileInfo, 2)` and `, 3)`.
pub const NVML_COMPUTE_INSTANCE_PROFILE_INFO_V2: c_uint =
    (std::mem::size_of::<nvmlComputeInstanceProfileInfo_v2_t>() as c_uint) | (2 << 24);
pub const NVML_COMPUTE_INSTANCE_PROFILE_INFO_V3: c_uint =
    (std::mem::size_of::<nvmlComputeInstanceProfileInfo_v3_t>() as c_uint) | (3 << 24);

pub const NVML_SUCCESS: nvmlReturn_t = sys::nvmlReturn_enum_NVML_SUCCESS;
pub const NVML_ERROR_UNINITIALIZED: nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
pub const NVML_ERROR_INVALID_ARGUMENT: nvmlReturn_t =
    sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
pub const NVML_ERROR_NOT_SUPPORTED: nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
pub const NVML_ERROR_NO_PERMISSION: nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION;
pub const NVML_ERROR_ALREADY_INITIALIZED: nvmlReturn_t =
    sys::nvmlReturn_enum_NVML_ERROR_ALREADY_INITIALIZED;
pub const NVML_ERROR_NOT_FOUND: nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
pub const NVML_ERROR_INSUFFICIENT_SIZE: nvmlReturn_t =
    sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
pub const NVML_ERROR_INSUFFICIENT_POWER: nvmlReturn_t =
    sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_POWER;
pub const NVML_ERROR_DRIVER_NOT_LOADED: nvmlReturn_t =
    sys::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED;
pub const NVML_ERROR_TIMEOUT: nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT;
pub const NVML_ERROR_IRQ_ISSUE: nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_IRQ_ISSUE;
pub const NVML_ERROR_LIBRARY_NOT_FOUND: nvmlReturn_t =
    sys::nvmlReturn_enum_NVML_ERROR_LIBRARY_NOT_FOUND;
pub const NVML_ERROR_FUNCTION_NOT_FOUND: nvmlReturn_t =
    sys::nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND;
pub const NVML_ERROR_CORRUPTED_INFOROM: nvmlReturn_t =
    sys::nvmlReturn_enum_NVML_ERROR_CORRUPTED_INFOROM;
pub const NVML_ERROR_GPU_IS_LOST: nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST;
pub const NVML_ERROR_RESET_REQUIRED: nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED;
pub const NVML_ERROR_OPERATING_SYSTEM: nvmlReturn_t =
    sys::nvmlReturn_enum_NVML_ERROR_OPERATING_SYSTEM;
pub const NVML_ERROR_LIB_RM_VERSION_MISMATCH: nvmlReturn_t =
    sys::nvmlReturn_enum_NVML_ERROR_LIB_RM_VERSION_MISMATCH;
pub const NVML_ERROR_IN_USE: nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_IN_USE;
pub const NVML_ERROR_MEMORY: nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_MEMORY;
pub const NVML_ERROR_NO_DATA: nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_NO_DATA;
pub const NVML_ERROR_VGPU_ECC_NOT_SUPPORTED: nvmlReturn_t =
    sys::nvmlReturn_enum_NVML_ERROR_VGPU_ECC_NOT_SUPPORTED;
pub const NVML_ERROR_INSUFFICIENT_RESOURCES: nvmlReturn_t =
    sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES;
pub const NVML_ERROR_FREQ_NOT_SUPPORTED: nvmlReturn_t =
    sys::nvmlReturn_enum_NVML_ERROR_FREQ_NOT_SUPPORTED;
pub const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: nvmlReturn_t =
    sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
pub const NVML_ERROR_DEPRECATED: nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_DEPRECATED;
pub const NVML_ERROR_NOT_READY: nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_NOT_READY;
pub const NVML_ERROR_GPU_NOT_FOUND: nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_GPU_NOT_FOUND;
pub const NVML_ERROR_INVALID_STATE: nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_INVALID_STATE;
pub const NVML_ERROR_UNKNOWN: nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_UNKNOWN;

/// Every return code: (symbolic name without the `NVML_ERROR_` prefix, code, NVIDIA's wording).
/// The wording is libnvidia-ml's `nvmlErrorString`, which the bindings do not carry.
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

/// nvml.h documents "not available" for the `unsigned long long` fields (e.g.
/// `usedGpuMemory`) as `NVML_VALUE_NOT_AVAILABLE`, the int -1; C converts it to all ones.
pub const NVML_VALUE_NOT_AVAILABLE_ULL: c_ulonglong = sys::NVML_VALUE_NOT_AVAILABLE as c_ulonglong;
/// `gpuInstanceId`/`computeInstanceId` without MIG: nvml.h gives 0xFFFFFFFF in prose only
/// (no macro, so nothing for bindgen to carry).
pub const NO_INSTANCE_ID: c_uint = 0xFFFF_FFFF;

pub const NVML_CLOCK_GRAPHICS: c_uint = sys::nvmlClockType_enum_NVML_CLOCK_GRAPHICS;
pub const NVML_CLOCK_SM: c_uint = sys::nvmlClockType_enum_NVML_CLOCK_SM;
pub const NVML_CLOCK_MEM: c_uint = sys::nvmlClockType_enum_NVML_CLOCK_MEM;
pub const NVML_CLOCK_VIDEO: c_uint = sys::nvmlClockType_enum_NVML_CLOCK_VIDEO;

pub const NVML_TEMPERATURE_GPU: c_uint = sys::nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU;

pub const NVML_COMPUTEMODE_DEFAULT: c_uint = sys::nvmlComputeMode_enum_NVML_COMPUTEMODE_DEFAULT;
pub const NVML_COMPUTEMODE_EXCLUSIVE_THREAD: c_uint =
    sys::nvmlComputeMode_enum_NVML_COMPUTEMODE_EXCLUSIVE_THREAD;
pub const NVML_COMPUTEMODE_PROHIBITED: c_uint =
    sys::nvmlComputeMode_enum_NVML_COMPUTEMODE_PROHIBITED;
pub const NVML_COMPUTEMODE_EXCLUSIVE_PROCESS: c_uint =
    sys::nvmlComputeMode_enum_NVML_COMPUTEMODE_EXCLUSIVE_PROCESS;

pub const NVML_BRAND_NVIDIA: c_uint = sys::nvmlBrandType_enum_NVML_BRAND_NVIDIA;

/// The `nvmlPciInfo_t` of `nvmlDeviceGetPciInfo` (v1): `reserved[4]` where v2/v3 have the
/// 32-byte `busId`. The bindings keep only the current layout (v2/v3, `nvmlPciInfo_t`), and
/// old clients still call the unversioned symbol with this smaller struct.
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

/// `NVML_STRUCT_VERSION(Memory, 2)`: a function-like macro, which bindgen does not translate.
pub const NVML_MEMORY_V2: c_uint = (std::mem::size_of::<nvmlMemory_v2_t>() as c_uint) | (2 << 24);

/// `NVML_STRUCT_VERSION(ProcessesUtilizationInfo, 1)` (a function-like macro, as above).
pub const NVML_PROCESSES_UTILIZATION_INFO_V1: c_uint =
    (std::mem::size_of::<nvmlProcessesUtilizationInfo_t>() as c_uint) | (1 << 24);

/// The layouts nvml.h gives on LP64 Linux (x86_64, aarch64), pinned: a drift in
/// nvml-wrapper-sys (or in the types kept here) fails the build instead of corrupting a
/// client's memory.
#[cfg(target_pointer_width = "64")]
const _: () = {
    use std::mem::{align_of, offset_of, size_of};

    macro_rules! layout {
        ($($t:ty: size $size:literal, align $align:literal { $($f:ident @ $off:literal),* })*) => {$(
            assert!(size_of::<$t>() == $size);
            assert!(align_of::<$t>() == $align);
            $(assert!(offset_of!($t, $f) == $off);)*
        )*};
    }

    layout! {
        nvmlPciInfo_v1_t: size 52, align 4 {
            busId @ 0, domain @ 16, bus @ 20, device @ 24, pciDeviceId @ 28,
            pciSubSystemId @ 32, reserved @ 36
        }
        nvmlPciInfo_t: size 68, align 4 {
            busIdLegacy @ 0, domain @ 16, bus @ 20, device @ 24, pciDeviceId @ 28,
            pciSubSystemId @ 32, busId @ 36
        }
        nvmlMemory_t: size 24, align 8 { total @ 0, free @ 8, used @ 16 }
        nvmlMemory_v2_t: size 40, align 8 {
            version @ 0, total @ 8, reserved @ 16, free @ 24, used @ 32
        }
        nvmlBAR1Memory_t: size 24, align 8 { bar1Total @ 0, bar1Free @ 8, bar1Used @ 16 }
        nvmlUtilization_t: size 8, align 4 { gpu @ 0, memory @ 4 }
        nvmlProcessInfo_v1_t: size 16, align 8 { pid @ 0, usedGpuMemory @ 8 }
        nvmlProcessInfo_t: size 24, align 8 {
            pid @ 0, usedGpuMemory @ 8, gpuInstanceId @ 16, computeInstanceId @ 20
        }
        nvmlProcessUtilizationSample_t: size 32, align 8 {
            pid @ 0, timeStamp @ 8, smUtil @ 16, memUtil @ 20, encUtil @ 24, decUtil @ 28
        }
        nvmlProcessUtilizationInfo_v1_t: size 40, align 8 {
            timeStamp @ 0, pid @ 8, smUtil @ 12, memUtil @ 16, encUtil @ 20, decUtil @ 24,
            jpgUtil @ 28, ofaUtil @ 32
        }
        nvmlProcessesUtilizationInfo_t: size 24, align 8 {
            version @ 0, processSamplesCount @ 4, lastSeenTimeStamp @ 8, procUtilArray @ 16
        }
        nvmlDevice_t: size 8, align 8 {}
        nvmlGpuInstancePlacement_t: size 8, align 4 { start @ 0, size @ 4 }
        nvmlGpuInstanceProfileInfo_t: size 48, align 8 {
            id @ 0, isP2pSupported @ 4, sliceCount @ 8, instanceCount @ 12,
            multiprocessorCount @ 16, copyEngineCount @ 20, decoderCount @ 24,
            encoderCount @ 28, jpegCount @ 32, ofaCount @ 36, memorySizeMB @ 40
        }
        nvmlGpuInstanceProfileInfo_v2_t: size 152, align 8 {
            version @ 0, id @ 4, memorySizeMB @ 48, name @ 56
        }
        nvmlGpuInstanceProfileInfo_v3_t: size 152, align 8 {
            version @ 0, id @ 4, sliceCount @ 8, memorySizeMB @ 40, name @ 48,
            capabilities @ 144
        }
        nvmlGpuInstanceInfo_t: size 24, align 8 { device @ 0, id @ 8, profileId @ 12, placement @ 16 }
        nvmlComputeInstanceProfileInfo_t: size 36, align 4 {
            id @ 0, sliceCount @ 4, instanceCount @ 8, multiprocessorCount @ 12,
            sharedCopyEngineCount @ 16, sharedDecoderCount @ 20, sharedEncoderCount @ 24,
            sharedJpegCount @ 28, sharedOfaCount @ 32
        }
        nvmlComputeInstanceProfileInfo_v2_t: size 136, align 4 { version @ 0, id @ 4, name @ 40 }
        nvmlComputeInstanceProfileInfo_v3_t: size 140, align 4 {
            version @ 0, id @ 4, name @ 40, capabilities @ 136
        }
        nvmlComputeInstanceInfo_t: size 32, align 8 {
            device @ 0, gpuInstance @ 8, id @ 16, profileId @ 20, placement @ 24
        }
        nvmlDeviceAttributes_t: size 40, align 8 {
            multiprocessorCount @ 0, sharedCopyEngineCount @ 4, sharedDecoderCount @ 8,
            sharedEncoderCount @ 12, sharedJpegCount @ 16, sharedOfaCount @ 20,
            gpuInstanceSliceCount @ 24, computeInstanceSliceCount @ 28, memorySizeMB @ 32
        }
        nvmlReturn_t: size 4, align 4 {}
    }

    // The versions pynvml (nvidia-ml-py) sends.
    assert!(NVML_MEMORY_V2 == 0x0200_0028);
    assert!(NVML_PROCESSES_UTILIZATION_INFO_V1 == 0x0100_0018);
    assert!(NVML_VALUE_NOT_AVAILABLE_ULL == u64::MAX);
};

/// Enum values as nvml.h numbers them (the return codes are pinned by the test below).
const _: () = {
    assert!(NVML_CLOCK_GRAPHICS == 0);
    assert!(NVML_CLOCK_SM == 1);
    assert!(NVML_CLOCK_MEM == 2);
    assert!(NVML_CLOCK_VIDEO == 3);
    assert!(NVML_TEMPERATURE_GPU == 0);
    assert!(NVML_COMPUTEMODE_DEFAULT == 0);
    assert!(NVML_COMPUTEMODE_EXCLUSIVE_THREAD == 1);
    assert!(NVML_COMPUTEMODE_PROHIBITED == 2);
    assert!(NVML_COMPUTEMODE_EXCLUSIVE_PROCESS == 3);
    assert!(NVML_BRAND_NVIDIA == 14);
    assert!(NVML_GPU_INSTANCE_PROFILE_1_SLICE == 0);
    assert!(NVML_GPU_INSTANCE_PROFILE_2_SLICE == 1);
    assert!(NVML_GPU_INSTANCE_PROFILE_3_SLICE == 2);
    assert!(NVML_GPU_INSTANCE_PROFILE_4_SLICE == 3);
    assert!(NVML_GPU_INSTANCE_PROFILE_7_SLICE == 4);
    assert!(NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2 == 9);
    assert!(NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE == 4);
    // The versions pynvml sends for the V calls.
    assert!(NVML_GPU_INSTANCE_PROFILE_INFO_V2 == 0x0200_0098);
    assert!(NVML_COMPUTE_INSTANCE_PROFILE_INFO_V2 == 0x0200_0088);
};

#[cfg(test)]
mod tests {
    use super::*;

    /// nvml.h numbers the return codes 0..=29 in the order of `RETURN_CODES`, then
    /// UNKNOWN = 999.
    #[test]
    fn return_codes_have_nvml_h_values() {
        let (unknown, numbered) = RETURN_CODES.split_last().unwrap();
        for (i, (name, code, _)) in numbered.iter().enumerate() {
            assert_eq!(*code as usize, i, "NVML_ERROR_{name}");
        }
        assert_eq!(unknown.0, "UNKNOWN");
        assert_eq!(unknown.1, 999);
        assert_eq!(numbered.len(), 30);
    }
}
