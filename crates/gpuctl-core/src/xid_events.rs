//! NVML event sets for what the health verdict needs as it happens: Xid critical errors and
//! (R550 on) recovery-action changes. nvml-wrapper drops the recovery-action event (its
//! event types do not name it), so the set is driven through the C functions.
//!
//! A set is registered once per NVML session and drained without waiting: a reader (the
//! watchdog, each loop) takes what is pending and goes on.

use std::sync::Arc;

use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings::{nvmlEventData_t, nvmlEventSet_t};

use crate::health::Action;
use crate::nvml::Gpus;

const XID: u64 = nvml_wrapper_sys::bindings::nvmlEventTypeXidCriticalError as u64;
const RECOVERY_ACTION: u64 = nvml_wrapper_sys::bindings::nvmlEventTypeGpuRecoveryAction as u64;
const SUCCESS: u32 = 0;

/// One event, by GPU index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuEvent {
    Xid {
        gpu: u32,
        xid: u32,
    },
    /// The recovery action changed to this (`None`: a value this gpuctl does not know).
    RecoveryAction {
        gpu: u32,
        action: Option<Action>,
    },
}

/// A registered event set. It keeps its NVML session alive until it is freed.
pub struct EventWatch {
    nvml: Arc<Nvml>,
    set: usize,
    /// (device handle, GPU index) of each registered GPU.
    devices: Vec<(usize, u32)>,
    /// GPUs that also raise recovery-action events.
    recovery: Vec<u32>,
    /// A GPU that did not answer in time may still be registering with the set.
    set_may_be_in_use: bool,
}

impl std::fmt::Debug for EventWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventWatch")
            .field("gpus", &self.gpus())
            .field("recovery", &self.recovery)
            .finish()
    }
}

// SAFETY: the set and device handles are opaque NVML handles, which NVML allows to be used
// from any thread; the set is only waited on through `&mut self`.
unsafe impl Send for EventWatch {}

impl EventWatch {
    /// Creates a set and registers every GPU of `gpus` that raises Xid events (with
    /// recovery-action events where it raises those too). `Err` says why none could be.
    pub fn register(gpus: &Gpus) -> Result<EventWatch, String> {
        let nvml = gpus.shared_nvml();
        let lib = nvml.lib();
        let (Ok(create), Ok(_), Ok(_)) = (
            lib.nvmlEventSetCreate.as_ref(),
            lib.nvmlDeviceRegisterEvents.as_ref(),
            lib.nvmlDeviceGetSupportedEventTypes.as_ref(),
        ) else {
            return Err("the driver's NVML has no event sets".into());
        };
        let mut set: nvmlEventSet_t = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local handle, as nvml.h says.
        let code = unsafe { create(&mut set) };
        if code != SUCCESS {
            return Err(format!("nvmlEventSetCreate failed (NVML error {code})"));
        }
        let mut watch = EventWatch {
            nvml: Arc::clone(&nvml),
            set: set as usize,
            devices: Vec::new(),
            recovery: Vec::new(),
            set_may_be_in_use: false,
        };
        let indices: Vec<u32> = (0..nvml.device_count().unwrap_or(0)).collect();
        // Each GPU on its own worker, within the NVML deadline: a GPU that does not answer
        // never holds the loop (it raises no events until a later session registers it).
        let set_addr = watch.set;
        let answers = gpus.on_each(&indices, move |nvml, index| {
            register_gpu(nvml, index, set_addr)
        });
        for (&index, answer) in indices.iter().zip(answers) {
            match answer {
                Some(Some((handle, recovery))) => {
                    watch.devices.push((handle, index));
                    if recovery {
                        watch.recovery.push(index);
                    }
                }
                Some(None) => {}
                // Still inside its registration: it may yet use the set, so the set is
                // never freed (a small leak, against a use after free in the driver).
                None => watch.set_may_be_in_use = true,
            }
        }
        if watch.devices.is_empty() {
            return Err("no GPU raises Xid events".into());
        }
        Ok(watch)
    }

    /// Whether the set belongs to `gpus`' NVML session (a reopened session needs a new one).
    pub fn same_session(&self, gpus: &Gpus) -> bool {
        Arc::ptr_eq(&self.nvml, &gpus.shared_nvml())
    }

    /// The GPUs registered, by index.
    pub fn gpus(&self) -> Vec<u32> {
        self.devices.iter().map(|(_, index)| *index).collect()
    }

    /// The GPUs that raise recovery-action events.
    pub fn recovery_gpus(&self) -> &[u32] {
        &self.recovery
    }

    /// Takes the pending events, at most `max`, without waiting.
    pub fn drain(&mut self, max: usize) -> Vec<GpuEvent> {
        let Ok(wait) = self.nvml.lib().nvmlEventSetWait_v2.as_ref() else {
            return Vec::new();
        };
        let mut events = Vec::new();
        while events.len() < max {
            // SAFETY: plain C data, all-zero is a valid value.
            let mut data: nvmlEventData_t = unsafe { std::mem::zeroed() };
            // SAFETY: the live set and an out-pointer to local data.
            let code = unsafe { wait(self.set as nvmlEventSet_t, &mut data, 0) };
            if code != SUCCESS {
                // TIMEOUT: nothing pending; anything else ends this drain too.
                break;
            }
            let handle = data.device as usize;
            let Some(&(_, gpu)) = self.devices.iter().find(|(h, _)| *h == handle) else {
                continue;
            };
            if data.eventType & XID != 0 {
                events.push(GpuEvent::Xid {
                    gpu,
                    xid: u32::try_from(data.eventData).unwrap_or(u32::MAX),
                });
            } else if data.eventType & RECOVERY_ACTION != 0 {
                events.push(GpuEvent::RecoveryAction {
                    gpu,
                    action: u32::try_from(data.eventData)
                        .ok()
                        .and_then(Action::from_nvml),
                });
            }
        }
        events
    }
}

impl Drop for EventWatch {
    fn drop(&mut self) {
        if self.set_may_be_in_use {
            return;
        }
        if let Ok(free) = self.nvml.lib().nvmlEventSetFree.as_ref() {
            // SAFETY: the set was created by this watch and is freed once, while its NVML
            // session (held by `self.nvml`) is alive.
            unsafe {
                free(self.set as nvmlEventSet_t);
            }
        }
    }
}

/// Registers GPU `index` with the event set at `set` for Xid events (and recovery-action
/// events where it raises those): its device handle and whether it raises the latter, or
/// `None` where it raises no Xid events or cannot be registered.
fn register_gpu(nvml: &Nvml, index: u32, set: usize) -> Option<(usize, bool)> {
    let lib = nvml.lib();
    let supported = lib.nvmlDeviceGetSupportedEventTypes.as_ref().ok()?;
    let register = lib.nvmlDeviceRegisterEvents.as_ref().ok()?;
    let device = nvml.device_by_index(index).ok()?;
    // SAFETY: the handle is used only while the session (held by the watch) lives.
    let handle = unsafe { device.handle() };
    let mut types = 0u64;
    // SAFETY: a valid device handle and an out-pointer to a local integer.
    if unsafe { supported(handle, &mut types) } != SUCCESS || types & XID == 0 {
        return None;
    }
    let wanted = types & (XID | RECOVERY_ACTION);
    // SAFETY: a valid device handle and the live set the watch made (never freed while a
    // registration may still be running).
    let code = unsafe { register(handle, wanted, set as nvmlEventSet_t) };
    (code == SUCCESS).then_some((handle as usize, wanted & RECOVERY_ACTION != 0))
}
