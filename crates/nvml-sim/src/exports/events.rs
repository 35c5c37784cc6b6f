//! Event sets. nvidia-smi creates one and registers each GPU before it prints anything
//! (and gives up on the whole view if that fails). The sim raises the scenario's `[[xid]]`
//! errors and a change of a GPU's `recovery_action` (nvmlEventTypeGpuRecoveryAction). With
//! nothing pending a wait times out, as it does on a healthy GPU.
//!
//! An `[[xid]]` happens once, as on a real driver: it is raised when a set registered for
//! Xid events on its GPU first waits after it is in the file (those already there when the
//! first set registered included), and delivered to every set that existed then; a set
//! created later (a restarted client, a re-opened NVML) never sees it. When it was raised
//! is kept in the state file, so every client process agrees.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nvml_wrapper_sys::bindings::{self as sys, nvmlEventData_t, nvmlEventSet_t};

use super::*;

const XID: c_ulonglong = sys::nvmlEventTypeXidCriticalError as c_ulonglong;
const RECOVERY_ACTION: c_ulonglong = sys::nvmlEventTypeGpuRecoveryAction as c_ulonglong;

/// What a Hopper data-center GPU supports on Linux (`nvmlDeviceGetSupportedEventTypes` on an
/// H100/H200: ECC single/double bit, XID critical errors; P-state and clock events are not
/// reported on Linux); a driver with the recovery-action field (R550 on) also raises its
/// change as an event.
pub(super) const SUPPORTED_EVENTS: c_ulonglong = 0x1 | 0x2 | XID;

fn supported_events(s: &mut Sim, index: usize) -> c_ulonglong {
    if super::health::health(s, index).recovery_action.is_some() {
        SUPPORTED_EVENTS | RECOVERY_ACTION
    } else {
        SUPPORTED_EVENTS
    }
}

/// Live sets, by address: a freed or foreign pointer is INVALID_ARGUMENT, never a deref.
static SETS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

#[derive(Default)]
struct EventSet {
    /// When the set was created (Unix ms): an Xid raised before then is not its to see.
    created_unix_ms: u64,
    /// (GPU index, event types) per registration.
    registered: Mutex<Vec<(usize, c_ulonglong)>>,
    /// The `[[xid]]` entries this set has delivered, by position and content: an entry
    /// rewritten in place with other values (a rehearsal's next scenario) is a new Xid.
    delivered: Mutex<HashSet<(usize, XidEntry)>>,
    /// Per GPU registered for recovery-action events: the action last delivered (or seen
    /// at registration).
    actions: Mutex<Vec<(usize, u32)>>,
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
        let created = EventSet {
            created_unix_ms: crate::sim::now_unix_ms(),
            ..EventSet::default()
        };
        let p = Box::into_raw(Box::new(created)) as nvmlEventSet_t;
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
        // Freed under the sim's lock: a register or a wait uses a set only while holding it.
        let _sim = crate::sim::lock();
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
    guard!(mut types => with_dev(device, None, |s, index| {
        put(types, supported_events(s, index))
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    types: c_ulonglong,
    set: nvmlEventSet_t,
) -> nvmlReturn_t {
    guard!(with_dev(device, None, |s, index| {
        if !live(set) {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        if types & !supported_events(s, index) != 0 {
            return NVML_ERROR_NOT_SUPPORTED;
        }
        // SAFETY: `set` is a live EventSet (checked above), and sets are freed only under
        // the sim's lock, which this call holds.
        let set = unsafe { &*set.cast::<EventSet>() };
        set.registered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((index, types));
        if types & RECOVERY_ACTION != 0
            && let Some(action) = super::health::health(s, index).recovery_action
        {
            let mut actions = set.actions.lock().unwrap_or_else(|e| e.into_inner());
            if !actions.iter().any(|(gpu, _)| *gpu == index) {
                actions.push((index, action.to_nvml()));
            }
        }
        NVML_SUCCESS
    }))
}

/// The next event pending for `set`, if any: Xids first, in file order, then changed
/// recovery actions.
fn next_event(s: &mut Sim, set: &EventSet) -> Option<nvmlEventData_t> {
    s.refresh();
    let registered = set
        .registered
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let wants = |gpu: usize, kind: c_ulonglong| {
        registered
            .iter()
            .any(|(g, types)| *g == gpu && types & kind != 0)
    };
    let event = |gpu: usize, kind: c_ulonglong, data: c_ulonglong| nvmlEventData_t {
        device: handle_of(gpu),
        eventType: kind,
        eventData: data,
        // Not attributable to a MIG instance.
        gpuInstanceId: c_uint::MAX,
        computeInstanceId: c_uint::MAX,
    };
    let scenario = std::sync::Arc::clone(&s.scenario);
    {
        let mut delivered = set.delivered.lock().unwrap_or_else(|e| e.into_inner());
        for (k, x) in scenario.xids.iter().enumerate() {
            let gpu = x.gpu as usize;
            if wants(gpu, XID) && delivered.insert((k, XidEntry::of(x))) && raised_for(s, set, k, x)
            {
                return Some(event(gpu, XID, c_ulonglong::from(x.xid)));
            }
        }
    }
    let mut actions = set.actions.lock().unwrap_or_else(|e| e.into_inner());
    for (gpu, _) in registered.iter().filter(|(_, t)| t & RECOVERY_ACTION != 0) {
        let Some(now) = scenario
            .gpus
            .get(*gpu)
            .and_then(|_| super::health::health(s, *gpu).recovery_action)
            .map(|a| a.to_nvml())
        else {
            continue;
        };
        match actions.iter_mut().find(|(g, _)| g == gpu) {
            Some((_, last)) if *last == now => {}
            Some((_, last)) => {
                *last = now;
                return Some(event(*gpu, RECOVERY_ACTION, c_ulonglong::from(now)));
            }
            None => actions.push((*gpu, now)),
        }
    }
    None
}

/// What makes an `[[xid]]` entry the same one across scenario writes, beside its position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct XidEntry {
    gpu: u32,
    xid: u32,
    pid: Option<u32>,
}

impl XidEntry {
    fn of(x: &crate::scenario::health::Xid) -> XidEntry {
        XidEntry {
            gpu: x.gpu,
            xid: x.xid,
            pid: x.pid,
        }
    }

    fn of_raised(r: &crate::state::RaisedXid) -> XidEntry {
        XidEntry {
            gpu: r.gpu,
            xid: r.xid,
            pid: r.pid,
        }
    }
}

/// Whether `[[xid]]` entry `k` is for `set`: not raised yet (it is now, for every process),
/// or raised after the set was created.
fn raised_for(s: &mut Sim, set: &EventSet, k: usize, x: &crate::scenario::health::Xid) -> bool {
    let key = k.to_string();
    let raised = s
        .state
        .refresh()
        .xids_raised
        .get(&key)
        .filter(|r| XidEntry::of_raised(r) == XidEntry::of(x))
        .copied();
    if let Some(raised) = raised {
        return raised.at_unix_ms >= set.created_unix_ms;
    }
    let raised = crate::state::RaisedXid {
        gpu: x.gpu,
        xid: x.xid,
        pid: x.pid,
        at_unix_ms: crate::sim::now_unix_ms(),
    };
    // Unwritable state: the change is kept in this process, which still delivers it once.
    let _ = s.state.update(|state| {
        state.xids_raised.insert(key, raised);
    });
    if let Some(path) = std::env::var_os(KERNEL_LOG_ENV).filter(|p| !p.is_empty())
        && let Some(gpu) = s.scenario.gpus.get(x.gpu as usize)
    {
        // The kernel's spelling: 0000:18:00.
        let pci = &gpu.pci;
        let address = format!("{:04x}:{:02x}:{:02x}", pci.domain, pci.bus, pci.device);
        write_kernel_line(std::path::Path::new(&path), &address, x);
    }
    true
}

/// Where the sim writes the driver's Xid line for each `[[xid]]` it raises, in kmsg's
/// record format, as the kernel's log has it (`/dev/kmsg` is the machine's, not the sim's).
pub const KERNEL_LOG_ENV: &str = "NVML_SIM_KERNEL_LOG";

/// Appends `NVRM: Xid (PCI:0000:18:00): 13, pid=8202, name=python3, ...` for `x`: its pid
/// and the process's name, or `'<unknown>'` as the driver writes for none. The sequence
/// number is the time in microseconds: increasing, as kmsg's.
fn write_kernel_line(path: &std::path::Path, address: &str, x: &crate::scenario::health::Xid) {
    use std::io::Write;
    let (pid, name) = match x.pid {
        Some(pid) => {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|c| c.trim().to_string())
                .unwrap_or_else(|_| "<unknown>".into());
            (pid.to_string(), comm)
        }
        None => ("'<unknown>'".to_string(), "<unknown>".to_string()),
    };
    let micros = crate::sim::now_unix_us();
    let line = format!(
        "3,{micros},{micros},-;NVRM: Xid (PCI:{address}): {}, pid={pid}, name={name}, simulated by nvml-sim\n",
        x.xid
    );
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        eprintln!(
            "nvml-sim: {}: cannot write the Xid line: {e}",
            path.display()
        );
    }
}

/// Answers the next pending event; with none, waits up to `timeout_ms` (at most a second a
/// call, so a client that passes a huge timeout still gets TIMEOUT back and can be
/// stopped), looking again as the scenario file changes, and times out.
fn wait(
    set: nvmlEventSet_t,
    data: Option<&mut nvmlEventData_t>,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    if crate::sim::INIT_COUNT.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        return NVML_ERROR_UNINITIALIZED;
    }
    let Some(data) = data else {
        return NVML_ERROR_INVALID_ARGUMENT;
    };
    let until = Instant::now() + Duration::from_millis(u64::from(timeout_ms).min(1000));
    loop {
        let mut found = None;
        let code = with_sim(|s| {
            if !live(set) {
                return NVML_ERROR_INVALID_ARGUMENT;
            }
            // SAFETY: `set` is live (checked above) and sets are freed only under the
            // sim's lock, which this closure holds.
            let set = unsafe { &*set.cast::<EventSet>() };
            found = next_event(s, set);
            NVML_SUCCESS
        });
        if code != NVML_SUCCESS {
            return code;
        }
        if let Some(event) = found {
            *data = event;
            return NVML_SUCCESS;
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return NVML_ERROR_TIMEOUT;
        }
        std::thread::sleep(left.min(crate::sim::RECHECK));
    }
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
