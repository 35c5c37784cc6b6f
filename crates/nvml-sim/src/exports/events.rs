//! Event sets. nvidia-smi creates one and registers each GPU before it prints anything
//! (and gives up on the whole view if that fails). The sim raises no events: a wait times
//! out, as it does on a healthy GPU.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use nvml_wrapper_sys::bindings::{nvmlEventData_t, nvmlEventSet_t};

use super::*;

/// What a Hopper data-center GPU supports on Linux (`nvmlDeviceGetSupportedEventTypes` on an
/// H100/H200: ECC single/double bit, XID critical errors; P-state and clock events are not
/// reported on Linux).
pub(super) const SUPPORTED_EVENTS: c_ulonglong = 0x1 | 0x2 | 0x8;

/// Live sets, by address: a freed or foreign pointer is INVALID_ARGUMENT, never a deref.
static SETS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

#[derive(Default)]
struct EventSet {
    registered: Mutex<Vec<(usize, c_ulonglong)>>,
}

fn live(set: nvmlEventSet_t) -> bool {
    SETS.lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .is_some_and(|s| s.contains(&(set as usize)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    guard!(mut set => with_sim(|_| {
        let Some(set) = set else {
            return NVML_ERROR_INVALID_ARGUMENT;
        };
        let p = Box::into_raw(Box::<EventSet>::default()) as nvmlEventSet_t;
        SETS.lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(HashSet::new)
            .insert(p as usize);
        *set = p;
        NVML_SUCCESS
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    guard!({
        let removed = SETS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
            .is_some_and(|s| s.remove(&(set as usize)));
        if !removed {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: the address was made by Box::into_raw in nvmlEventSetCreate and was
        // still registered, so it is freed exactly once.
        drop(unsafe { Box::from_raw(set.cast::<EventSet>()) });
        NVML_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: nvmlDevice_t,
    types: *mut c_ulonglong,
) -> nvmlReturn_t {
    guard!(mut types => with_dev(device, None, |_, _| {
        put(types, SUPPORTED_EVENTS)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    types: c_ulonglong,
    set: nvmlEventSet_t,
) -> nvmlReturn_t {
    guard!(with_dev(device, None, |_, index| {
        if !live(set) {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        if types & !SUPPORTED_EVENTS != 0 {
            return NVML_ERROR_NOT_SUPPORTED;
        }
        // SAFETY: `set` is a live EventSet (checked above).
        let set = unsafe { &*set.cast::<EventSet>() };
        set.registered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((index, types));
        NVML_SUCCESS
    }))
}

/// No event is ever pending: waits `timeout_ms` (at most a second a call, so a client that
/// passes a huge timeout still gets TIMEOUT back and can be stopped) and times out.
fn wait(
    set: nvmlEventSet_t,
    data: Option<&mut nvmlEventData_t>,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    if crate::sim::INIT_COUNT.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        return NVML_ERROR_UNINITIALIZED;
    }
    if !live(set) || data.is_none() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    std::thread::sleep(Duration::from_millis(u64::from(timeout_ms).min(1000)));
    NVML_ERROR_TIMEOUT
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    guard!(mut data => wait(set, data, timeout_ms))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    guard!(mut data => wait(set, data, timeout_ms))
}
