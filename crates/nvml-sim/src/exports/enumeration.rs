//! Device enumeration: the count and the handle lookups (index, UUID, serial, PCI bus id).

use super::*;

fn count(out: Option<&mut c_uint>) -> nvmlReturn_t {
    with_sim(|s| {
        s.refresh();
        put(out, s.scenario.gpus.len() as c_uint)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount(out: *mut c_uint) -> nvmlReturn_t {
    guard!(mut out => count(out))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(out: *mut c_uint) -> nvmlReturn_t {
    guard!(mut out => count(out))
}

fn handle_where(
    out: Option<&mut nvmlDevice_t>,
    pick: impl Fn(&crate::scenario::Gpu) -> bool,
) -> nvmlReturn_t {
    with_sim(|s| {
        if out.is_none() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        s.refresh();
        match s.scenario.gpus.iter().find(|g| pick(g)) {
            None => NVML_ERROR_NOT_FOUND,
            Some(g) if g.lost => NVML_ERROR_GPU_IS_LOST,
            Some(g) => put(out, handle_of(g.index as usize)),
        }
    })
}

pub(super) fn by_index(index: c_uint, out: Option<&mut nvmlDevice_t>) -> nvmlReturn_t {
    with_sim(|s| {
        s.refresh();
        if index as usize >= s.scenario.gpus.len() || out.is_none() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        if s.gpu(index as usize).lost {
            return NVML_ERROR_GPU_IS_LOST;
        }
        put(out, handle_of(index as usize))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    out: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard!(mut out => by_index(index, out))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    out: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard!(mut out => by_index(index, out))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    out: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard!(mut out => {
        // SAFETY: the caller passes a NUL-terminated string (or null).
        let Some(uuid) = (unsafe { c_str(uuid) }) else {
            return with_sim(|_| NVML_ERROR_INVALID_ARGUMENT);
        };
        if uuid.len() > 4 && uuid[..4].eq_ignore_ascii_case("MIG-") {
            return mig::by_uuid(uuid, out);
        }
        handle_where(out, |g| g.uuid.eq_ignore_ascii_case(uuid))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleBySerial(
    serial: *const c_char,
    out: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard!(mut out => {
        // SAFETY: the caller passes a NUL-terminated string (or null).
        let Some(serial) = (unsafe { c_str(serial) }) else {
            return with_sim(|_| NVML_ERROR_INVALID_ARGUMENT);
        };
        handle_where(out, |g| g.serial == serial)
    })
}

/// # Safety
///
/// `bus_id` is null or a NUL-terminated string.
unsafe fn by_pci(bus_id: *const c_char, out: Option<&mut nvmlDevice_t>) -> nvmlReturn_t {
    // SAFETY: as this function's contract.
    let parsed = unsafe { c_str(bus_id) }.and_then(PciBusId::parse);
    match parsed {
        None => with_sim(|_| NVML_ERROR_INVALID_ARGUMENT),
        Some(p) => handle_where(out, |g| g.pci == p),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(
    bus_id: *const c_char,
    out: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard!(mut out => {
        // SAFETY: the caller passes a NUL-terminated string (or null).
        unsafe { by_pci(bus_id, out) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus_id: *const c_char,
    out: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard!(mut out => {
        // SAFETY: the caller passes a NUL-terminated string (or null).
        unsafe { by_pci(bus_id, out) }
    })
}
