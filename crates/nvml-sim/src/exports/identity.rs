//! A device's identity: index, minor number, name, UUID, serial, brand, architecture, compute
//! capability, PCI info.

use super::*;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(d: nvmlDevice_t, out: *mut c_uint) -> nvmlReturn_t {
    // A MIG device answers its index under its parent: nvidia-smi prints it as "MIG Dev"
    // (found by answering a marker and reading where it landed) and lists no MIG device
    // whose index fails.
    guard!(mut out => with_target(d, None, |_, t| match t {
        Target::Gpu(i) => put(out, i as c_uint),
        Target::Mig { index, .. } => put(out, index as c_uint),
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    d: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut out => with_dev(d, Some(Feature::MinorNumber), |s, i| {
        put(out, s.gpu(i).minor)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    d: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard!(buf name => with_target(d, None, |s, t| {
        let n = match t {
            Target::Gpu(i) => s.gpu(i).name.clone(),
            Target::Mig { gpu, index, .. } => {
                let g = s.gpu(gpu);
                format!("{} MIG {}", g.name, g.mig[index].profile.name)
            }
        };
        put_str(name, length, &n)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    d: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard!(buf uuid => with_target(d, None, |s, t| {
        let u = match t {
            Target::Gpu(i) => s.gpu(i).uuid.clone(),
            Target::Mig { gpu, gi, ci, .. } => crate::mig::mig_uuid(&s.gpu(gpu).uuid, gi, ci),
        };
        put_str(uuid, length, &u)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSerial(
    d: nvmlDevice_t,
    serial: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard!(buf serial => with_dev(d, Some(Feature::Serial), |s, i| {
        put_str(serial, length, &s.gpu(i).serial)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBrand(d: nvmlDevice_t, out: *mut c_uint) -> nvmlReturn_t {
    guard!(mut out => with_dev(d, Some(Feature::Brand), |_, _| {
        put(out, NVML_BRAND_NVIDIA)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetArchitecture(
    d: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut out => with_dev(d, Some(Feature::Architecture), |s, i| {
        put(out, s.gpu(i).architecture)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    d: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> nvmlReturn_t {
    guard!(mut major, minor => with_dev(d, Some(Feature::CudaComputeCapability), |s, i| {
        let (Some(major), Some(minor)) = (major, minor) else {
            return NVML_ERROR_INVALID_ARGUMENT;
        };
        let (a, b) = s.gpu(i).cuda_cc;
        *major = a;
        *minor = b;
        NVML_SUCCESS
    }))
}

fn pci_info(s: &Sim, i: usize) -> nvmlPciInfo_t {
    let g = s.gpu(i);
    nvmlPciInfo_t {
        busIdLegacy: fill_chars(&g.pci.legacy()),
        domain: g.pci.domain,
        bus: g.pci.bus,
        device: g.pci.device,
        pciDeviceId: g.pci_device_id,
        pciSubSystemId: g.pci_subsystem_id,
        busId: fill_chars(&g.pci.long()),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo(
    d: nvmlDevice_t,
    out: *mut nvmlPciInfo_v1_t,
) -> nvmlReturn_t {
    guard!(mut out => with_dev(d, Some(Feature::PciInfo), |s, i| {
        let g = s.gpu(i);
        let v1 = nvmlPciInfo_v1_t {
            busId: fill_chars(&g.pci.legacy()),
            domain: g.pci.domain,
            bus: g.pci.bus,
            device: g.pci.device,
            pciDeviceId: g.pci_device_id,
            pciSubSystemId: g.pci_subsystem_id,
            reserved: [0; 4],
        };
        put(out, v1)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v2(
    d: nvmlDevice_t,
    out: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    guard!(mut out => with_dev(d, Some(Feature::PciInfo), |s, i| {
        put(out, pci_info(s, i))
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    d: nvmlDevice_t,
    out: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    guard!(mut out => with_dev(d, Some(Feature::PciInfo), |s, i| {
        put(out, pci_info(s, i))
    }))
}
