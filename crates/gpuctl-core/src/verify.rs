//! The `verify` step: re-reads NVML until what was ended has left its GPUs and its memory
//! came back, and "wait until free" for a launcher's pre-run check. Both read only memory
//! and process lists ([`SnapshotOptions::only_memory_and_processes`]).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::act::Ended;
use crate::error::Result;
use crate::nvml::{Gpus, Place};
use crate::plan::{Disposition, Outcome, Release};
use crate::snapshot::{GpuProcess, GpuSnapshot, Snapshot, SnapshotOptions};
use crate::units::Amount;

/// With no minimum free amount, a GPU is free when no process is left and less than this
/// is in use.
pub const CLEAN_USED_BYTES: u64 = 256 << 20;

/// How often NVML is read again while waiting for a GPU to be free.
const FREE_POLL: Duration = Duration::from_millis(100);

/// How often NVML is read again while verifying a release.
const RELEASE_POLL: Duration = Duration::from_millis(20);

/// What the last read of a wait or verification may take past its end, so the GPUs that do
/// answer are still read.
const LAST_READ: Duration = Duration::from_millis(250);

/// Re-reads NVML until every ended target has left its GPUs and their used memory fell by
/// what it held, or until `limit`.
pub fn released(gpus: &Gpus, before: &Snapshot, outcomes: &mut [Outcome], limit: Duration) {
    let ended: Vec<usize> = (0..outcomes.len())
        .filter(|&i| {
            matches!(
                outcomes[i].ended(),
                Some(Ended::Exited { .. } | Ended::Killed { .. } | Ended::Gone)
            )
        })
        .collect();
    if ended.is_empty() {
        return;
    }
    // Used memory each GPU should come down to once the ended targets' memory is free; other
    // processes may allocate meanwhile, so a little slack is allowed.
    let mut expected: HashMap<u32, u64> = HashMap::new();
    for gpu in &before.devices {
        let Some(memory) = gpu.memory else { continue };
        let freed: u64 = ended
            .iter()
            .filter_map(|&i| {
                gpu.processes
                    .iter()
                    .find(|p| p.pid == outcomes[i].target.pid)
                    .and_then(|p| p.used_bytes)
            })
            .sum();
        if freed > 0 {
            let slack = (64 << 20).max(memory.total_bytes / 100);
            expected.insert(gpu.index, memory.used_bytes.saturating_sub(freed) + slack);
        }
    }
    let indices: Vec<u32> = before.devices.iter().map(|g| g.index).collect();
    let options = SnapshotOptions::poll(Some(indices));
    let deadline = Instant::now() + limit;
    // No poll reads a GPU past the verification's end: a GPU that answers each call late
    // would otherwise hold a poll started near the end for the whole NVML timeout.
    let _cap = gpus.cap_waits_at(deadline + LAST_READ);
    while let Ok(now) = Snapshot::take(gpus, &options) {
        let listed: HashSet<u32> = now
            .devices
            .iter()
            .flat_map(|g| g.processes.iter().map(|p| p.pid))
            .collect();
        let released: HashSet<u32> = now
            .devices
            .iter()
            .filter(|g| {
                expected
                    .get(&g.index)
                    .is_none_or(|&limit| g.memory.is_some_and(|m| m.used_bytes <= limit))
            })
            .map(|g| g.index)
            .collect();
        let mut all_done = true;
        for &i in &ended {
            let outcome = &mut outcomes[i];
            let left = !listed.contains(&outcome.target.pid);
            let freed = outcome.target.gpus.iter().all(|g| released.contains(g));
            if let Disposition::Signalled { release, .. } = &mut outcome.disposition {
                *release = Some(Release {
                    left_gpu: left,
                    memory_released: left && freed,
                });
            }
            all_done &= left && freed;
        }
        if all_done || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(RELEASE_POLL);
    }
}

/// The result of waiting for GPUs to be free.
#[derive(Debug, Serialize, Clone)]
pub struct WaitReport {
    pub met: bool,
    pub waited_ms: u64,
    pub gpus: Vec<GpuState>,
}

/// One GPU as the wait last saw it.
#[derive(Debug, Serialize, Clone)]
pub struct GpuState {
    pub index: u32,
    /// The MIG GPU instance, when one was waited for rather than the whole GPU.
    pub gpu_instance: Option<u32>,
    pub free: bool,
    pub used_bytes: Option<u64>,
    pub free_bytes: Option<u64>,
    pub processes: Vec<u32>,
}

impl GpuState {
    /// The GPU, or the MIG instance, waited for.
    pub fn place(&self) -> Place {
        Place {
            gpu: self.index,
            gpu_instance: self.gpu_instance,
        }
    }
}

/// Polls NVML until every selected GPU or MIG instance (`None`: every GPU) is free, or
/// `limit` passes. Free: at least `min_free` free (of the instance's memory, for an
/// instance), or with none given, no process left and under [`CLEAN_USED_BYTES`] in use.
pub fn wait_until_free(
    gpus: &Gpus,
    selected: Option<&[Place]>,
    limit: Duration,
    min_free: Option<Amount>,
) -> Result<WaitReport> {
    wait_until_free_saying(gpus, selected, limit, min_free, &mut |_| {})
}

/// A place not free, as said to `waiting`: GPU, MIG instance, processes.
type Busy = (u32, Option<u32>, Vec<u32>);

/// [`wait_until_free`], calling `waiting` with the places not yet free before it sleeps,
/// whenever they (or their processes) differ from the last call: a front says what it
/// waits for.
pub fn wait_until_free_saying(
    gpus: &Gpus,
    selected: Option<&[Place]>,
    limit: Duration,
    min_free: Option<Amount>,
    waiting: &mut dyn FnMut(&[GpuState]),
) -> Result<WaitReport> {
    // What was last said: each busy place and its processes.
    let mut said: Option<Vec<Busy>> = None;
    let start = Instant::now();
    let options = SnapshotOptions::poll(selected.map(Place::gpus));
    // As in [`released`]: the wait ends by its limit whatever the GPUs do.
    let _cap = gpus.cap_waits_at(start + limit + LAST_READ);
    loop {
        let snapshot = Snapshot::take(gpus, &options)?;
        let states: Vec<GpuState> = match selected {
            None => snapshot
                .devices
                .iter()
                .map(|gpu| gpu_state(gpu, min_free))
                .collect(),
            Some(places) => places
                .iter()
                .filter_map(|place| {
                    let gpu = snapshot.devices.iter().find(|g| g.index == place.gpu)?;
                    Some(match place.gpu_instance {
                        None => gpu_state(gpu, min_free),
                        Some(instance) => instance_state(gpu, instance, min_free),
                    })
                })
                .collect(),
        };
        let met = states.iter().all(|s| s.free);
        if met || start.elapsed() >= limit {
            return Ok(WaitReport {
                met,
                waited_ms: start.elapsed().as_millis() as u64,
                gpus: states,
            });
        }
        let busy: Vec<GpuState> = states.into_iter().filter(|s| !s.free).collect();
        let now: Vec<_> = busy
            .iter()
            .map(|s| (s.index, s.gpu_instance, s.processes.clone()))
            .collect();
        if said.as_ref() != Some(&now) {
            waiting(&busy);
            said = Some(now);
        }
        std::thread::sleep(FREE_POLL);
    }
}

/// A MIG instance of `gpu`: free as a GPU is, on the instance's memory and processes. An
/// instance that is not there (the layout changed) is not free.
pub fn instance_state(gpu: &GpuSnapshot, instance: u32, min_free: Option<Amount>) -> GpuState {
    let mig = gpu
        .mig_devices
        .iter()
        .find(|m| m.gpu_instance_id == Some(instance));
    let processes = mig.map_or(&[][..], |m| m.processes.as_slice());
    let memory = mig.and_then(|m| m.memory).map(|m| Room {
        total: m.total_bytes,
        used: m.used_bytes,
        free: m.total_bytes.saturating_sub(m.used_bytes),
        outside: 0,
    });
    state(gpu.index, Some(instance), processes, memory, min_free)
}

pub fn gpu_state(gpu: &GpuSnapshot, min_free: Option<Amount>) -> GpuState {
    let memory = gpu.memory.map(|m| Room {
        total: m.total_bytes,
        used: m.used_bytes,
        free: m.free_bytes,
        outside: gpu.outside_namespace_bytes.unwrap_or(0),
    });
    state(gpu.index, None, &gpu.processes, memory, min_free)
}

/// Memory, in bytes, of a GPU or MIG instance.
#[derive(Clone, Copy)]
struct Room {
    total: u64,
    used: u64,
    free: u64,
    /// Held outside this PID namespace (the host service's sum): another container's,
    /// which a launcher here neither waits for nor could end.
    outside: u64,
}

/// Free: at least `min_free` free, or with none given, no process left and under
/// [`CLEAN_USED_BYTES`] in use besides what is held outside this PID namespace. Unknown
/// memory is not free.
fn state(
    index: u32,
    gpu_instance: Option<u32>,
    processes: &[GpuProcess],
    memory: Option<Room>,
    min_free: Option<Amount>,
) -> GpuState {
    let free = match (memory, min_free) {
        (Some(room), Some(amount)) => room.free >= amount.bytes_of(room.total),
        (Some(room), None) => {
            processes.is_empty() && room.used.saturating_sub(room.outside) < CLEAN_USED_BYTES
        }
        (None, _) => false,
    };
    GpuState {
        index,
        gpu_instance,
        free,
        used_bytes: memory.map(|room| room.used),
        free_bytes: memory.map(|room| room.free),
        processes: processes.iter().map(|p| p.pid).collect(),
    }
}
