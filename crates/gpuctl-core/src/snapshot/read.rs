//! Reading the GPUs through NVML: each GPU's figures, its MIG instances and the processes it
//! lists, every call bounded by the session's timeout, before host facts are joined.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nvml_wrapper::Device;
use nvml_wrapper::enum_wrappers::device::{
    Clock, ComputeMode, PerformanceState, TemperatureSensor,
};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;

use crate::error::Result;
use crate::nvml::lists::{self, ProcessList};
use crate::nvml::{Gpus, describe};

use super::field::optional;
use super::*;

/// A process as one GPU lists it, before its host facts are joined.
#[derive(Debug, Clone, Copy)]
pub(super) struct Listed {
    pub(super) pid: u32,
    pub(super) used_bytes: Option<u64>,
    pub(super) kind: ProcessType,
    pub(super) sm_util_pct: Option<u32>,
    pub(super) gpu_instance_id: Option<u32>,
    pub(super) compute_instance_id: Option<u32>,
    /// In the driver's MPS list: a client of the GPU's MPS server.
    pub(super) mps_client: bool,
}

/// What one GPU lists: its processes, and when the list was read.
#[derive(Debug, Default)]
pub(super) struct Listing {
    pub(super) processes: Vec<Listed>,
    /// CLOCK_BOOTTIME just after the list calls returned: every process listed had started
    /// by then (see [`super::as_listed`]). `None` where no list was read, or the clock failed.
    pub(super) at: Option<Duration>,
}

/// Reads one GPU, and the processes it lists (the entry's own list is filled in once their
/// host facts are read). Failures stay inside the returned entry so the other GPUs are
/// still shown.
/// Every GPU of `indices`, within the Gpus' timeout when it has one. One worker reads them
/// all in turn, handing each over as it is read; if some are still missing at half the
/// timeout (a GPU blocks the worker), each of those gets a worker of its own for the other
/// half. A GPU with no answer by the deadline, or still inside a call from an earlier read,
/// is reported as not answering; the others as read.
pub(super) fn read_gpus(
    gpus: &Gpus,
    indices: &[u32],
    since_us: Option<u64>,
    fields: Fields,
    health: bool,
) -> Vec<(GpuSnapshot, Listing)> {
    type Read = (GpuSnapshot, Listing);
    let read = move |nvml: &nvml_wrapper::Nvml, index: u32| {
        read_gpu(nvml, index, since_us, fields, health)
    };
    // The timeout, or less while a step that must end by its own deadline caps the waits.
    let Some(limit) = gpus.wait_limit() else {
        return gpus
            .on_each(indices, read)
            .into_iter()
            .map(|read| read.expect("read in turn"))
            .collect();
    };
    let deadline = Instant::now() + limit;
    // The shared worker fills `done` as it goes and says so once, at the end: one wake-up
    // of this thread a snapshot (waking an idle core costs far more than the hand-over on
    // a VM). If it is not done at half the deadline, what it read so far is taken from
    // `done`, and the rest get a worker each for the other half.
    let done: Arc<std::sync::Mutex<Vec<Option<Read>>>> = Arc::new(std::sync::Mutex::new(
        indices.iter().map(|_| None).collect(),
    ));
    let (finished, finish) = std::sync::mpsc::channel::<()>();
    let all = indices.to_vec();
    let filling = Arc::clone(&done);
    let shared = gpus.run_on(None, move |nvml, release| {
        for (at, index) in all.into_iter().enumerate() {
            let read = read(nvml, index);
            // Gone once the snapshot took what was read by half its deadline.
            if let Some(slot) = filling
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_mut(at)
            {
                *slot = Some(read);
            }
        }
        // Free before saying so: the next snapshot may follow at once.
        release();
        let _ = finished.send(());
    });
    if shared {
        let _ = finish.recv_timeout(limit / 2);
    }
    let mut reads: Vec<Option<Read>> =
        std::mem::take(&mut *done.lock().unwrap_or_else(|e| e.into_inner()));
    let missing: Vec<usize> = (0..indices.len())
        .filter(|&at| reads[at].is_none())
        .collect();
    if !missing.is_empty() {
        let missing_indices: Vec<u32> = missing.iter().map(|&at| indices[at]).collect();
        let late = gpus.on_each_until(&missing_indices, Some(deadline), read);
        for (at, read) in missing.into_iter().zip(late) {
            reads[at] = read;
        }
    }
    reads
        .into_iter()
        .zip(indices)
        .map(|(read, &index)| {
            read.unwrap_or_else(|| (GpuSnapshot::not_answering(index, limit), Listing::default()))
        })
        .collect()
}

pub(super) fn read_gpu(
    nvml: &nvml_wrapper::Nvml,
    index: u32,
    since_us: Option<u64>,
    fields: Fields,
    health: bool,
) -> (GpuSnapshot, Listing) {
    let mut gpu = GpuSnapshot::unread(index);
    let device = match nvml.device_by_index(index) {
        Ok(device) => device,
        Err(error) => {
            gpu.fail(&error, "cannot open the GPU");
            return (gpu, Listing::default());
        }
    };
    let mut listing = Listing::default();
    if let Err(error) = read_gpu_fields(&device, &mut gpu, &mut listing, since_us, fields) {
        gpu.fail(&error, "query failed");
    }
    // In the same job as the rest (one hand-over a snapshot, not a worker a GPU), where the
    // GPU is not lost: what NVML says of its health.
    if health && gpu.status != GpuStatus::Lost {
        match super::health::read_health(&device) {
            Ok(readings) => gpu.health_readings = Some(readings),
            Err(error @ NvmlError::GpuLost) => gpu.fail(&error, "health query failed"),
            // Nothing known of its health.
            Err(_) => {}
        }
    }
    (gpu, listing)
}

/// Fields a GPU does not support stay `None`; a lost GPU stops the reading.
pub(super) fn read_gpu_fields(
    device: &Device<'_>,
    gpu: &mut GpuSnapshot,
    listing: &mut Listing,
    since_us: Option<u64>,
    fields: Fields,
) -> Result<(), NvmlError> {
    gpu.uuid = optional(device.uuid())?;
    let memory = optional(device.memory_info())?;
    if fields == Fields::Activity {
        gpu.utilization = optional(device.utilization_rates())?.map(|u| Utilization {
            gpu_pct: u.gpu,
            memory_pct: u.memory,
        });
        gpu.power_mw = optional(device.power_usage())?;
        gpu.power_limit_mw = optional(device.enforced_power_limit())?;
    }
    if fields == Fields::All {
        gpu.name = optional(device.name())?;
        gpu.pci_bus_id = optional(device.pci_info())?.map(|pci| pci.bus_id);
        gpu.utilization = optional(device.utilization_rates())?.map(|u| Utilization {
            gpu_pct: u.gpu,
            memory_pct: u.memory,
        });
        gpu.temperature_c = optional(device.temperature(TemperatureSensor::Gpu))?;
        gpu.power_mw = optional(device.power_usage())?;
        gpu.power_limit_mw = optional(device.enforced_power_limit())?;
        let sm = optional(device.clock_info(Clock::SM))?;
        let memory = optional(device.clock_info(Clock::Memory))?;
        gpu.clocks = sm
            .zip(memory)
            .map(|(sm_mhz, memory_mhz)| Clocks { sm_mhz, memory_mhz });
        gpu.pstate = optional(device.performance_state())?.and_then(pstate_name);
        gpu.minor = optional(device.minor_number())?;
        gpu.persistence_mode = optional(device.is_in_persistent_mode())?;
        gpu.compute_mode = optional(device.compute_mode())?.map(compute_mode_name);
    }
    // Every reader needs the MIG instances: who holds what is per instance there.
    gpu.mig_enabled = optional(device.mig_mode())?.map(|mode| mode.current == 1);
    if gpu.mig_enabled == Some(true) {
        gpu.mig_devices = read_mig_devices(device)?;
    }

    let compute = process_list(lists::processes(device, ProcessList::Compute));
    let graphics = process_list(lists::processes(device, ProcessList::Graphics));
    // After both lists answered: no process they name started later than this.
    listing.at = crate::host::boot_clock().ok();
    let (compute, graphics) = match (compute, graphics) {
        (Err(error), _) | (_, Err(error)) if matches!(error, NvmlError::GpuLost) => {
            return Err(error);
        }
        (Err(error), _) | (_, Err(error)) => {
            gpu.status = GpuStatus::Error;
            gpu.error = Some(format!("cannot list processes: {}", describe(&error)));
            (Vec::new(), Vec::new())
        }
        (Ok(compute), Ok(graphics)) => (compute, graphics),
    };
    let utilization = sm_utilization(device, since_us);
    listing.processes = merge_processes(compute, graphics, &utilization);
    mark_mps_clients(
        &mut listing.processes,
        lists::processes(device, ProcessList::Mps),
    );
    gpu.memory = memory.map(|m| Memory {
        total_bytes: m.total,
        used_bytes: m.used,
        free_bytes: m.free,
        reserved_bytes: m.reserved,
        unattributed_bytes: (gpu.status == GpuStatus::Ok)
            .then(|| unattributed(m.used, &listing.processes))
            .flatten(),
    });
    Ok(())
}

impl GpuSnapshot {
    /// GPU `index` with nothing read yet.
    pub fn unread(index: u32) -> GpuSnapshot {
        GpuSnapshot {
            index,
            uuid: None,
            name: None,
            pci_bus_id: None,
            status: GpuStatus::Ok,
            error: None,
            memory: None,
            utilization: None,
            temperature_c: None,
            power_mw: None,
            power_limit_mw: None,
            clocks: None,
            pstate: None,
            persistence_mode: None,
            compute_mode: None,
            peak: None,
            processes: Vec::new(),
            mig_enabled: None,
            mig_devices: Vec::new(),
            holders: None,
            holders_not_scanned: None,
            minor: None,
            outside_namespace_bytes: None,
            health_readings: None,
            health: None,
            leases: Vec::new(),
        }
    }

    /// A GPU whose read did not finish within `limit`: nothing of it is known.
    pub fn not_answering(index: u32, limit: Duration) -> GpuSnapshot {
        GpuSnapshot {
            status: GpuStatus::NotAnswering,
            error: Some(format!(
                "not answering after {}",
                humantime::format_duration(limit)
            )),
            ..GpuSnapshot::unread(index)
        }
    }

    fn fail(&mut self, error: &NvmlError, what: &str) {
        if matches!(error, NvmlError::GpuLost) {
            self.status = GpuStatus::Lost;
            self.error = Some("GPU is lost (fallen off the bus or inaccessible)".to_string());
        } else {
            self.status = GpuStatus::Error;
            self.error = Some(format!("{what}: {}", describe(error)));
        }
    }
}

pub(super) fn process_list(
    result: Result<Vec<ProcessInfo>, NvmlError>,
) -> Result<Vec<ProcessInfo>, NvmlError> {
    match result {
        // Graphics lists are unsupported on many datacenter GPUs: that means "none".
        Err(NvmlError::NotSupported) => Ok(Vec::new()),
        other => other,
    }
}

/// Highest SM sample per pid since `since_us`, sorted by pid. `Some(empty)`: the driver keeps
/// samples and has none, so every process was idle; `None`: this GPU or driver does not
/// report them.
pub(super) fn sm_utilization(
    device: &Device<'_>,
    since_us: Option<u64>,
) -> Option<Vec<(u32, u32)>> {
    let samples = match device.process_utilization_stats(since_us) {
        Ok(samples) => samples,
        Err(NvmlError::NotFound) => Vec::new(),
        Err(_) => return None,
    };
    let mut highest: Vec<(u32, u32)> = samples.iter().map(|s| (s.pid, s.sm_util)).collect();
    // Sorted by pid, highest sample first, then one entry per pid.
    highest.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    highest.dedup_by_key(|sample| sample.0);
    Some(highest)
}

/// One entry per pid from the compute and graphics lists (a process with both contexts is
/// listed in each, with the same memory), largest first.
pub(super) fn merge_processes(
    compute: Vec<ProcessInfo>,
    graphics: Vec<ProcessInfo>,
    utilization: &Option<Vec<(u32, u32)>>,
) -> Vec<Listed> {
    let used_of = |info: &ProcessInfo| match info.used_gpu_memory {
        UsedGpuMemory::Used(bytes) => Some(bytes),
        UsedGpuMemory::Unavailable => None,
    };
    let mut listed: Vec<(ProcessType, &ProcessInfo)> = compute
        .iter()
        .map(|info| (ProcessType::Compute, info))
        .chain(graphics.iter().map(|info| (ProcessType::Graphics, info)))
        .collect();
    // Stable: a pid's compute entry stays ahead of its graphics entry.
    listed.sort_by_key(|(_, info)| info.pid);
    let mut processes: Vec<Listed> = Vec::with_capacity(listed.len());
    for (kind, info) in listed {
        let used = used_of(info);
        if let Some(existing) = processes.last_mut().filter(|p| p.pid == info.pid) {
            existing.kind = ProcessType::ComputeAndGraphics;
            existing.used_bytes = existing.used_bytes.max(used);
            continue;
        }
        processes.push(Listed {
            pid: info.pid,
            used_bytes: used,
            kind,
            gpu_instance_id: info.gpu_instance_id,
            compute_instance_id: info.compute_instance_id,
            mps_client: false,
            sm_util_pct: utilization.as_ref().map(|samples| {
                samples
                    .binary_search_by_key(&info.pid, |sample| sample.0)
                    .map_or(0, |at| samples[at].1)
            }),
        });
    }
    processes.sort_by(|a, b| b.used_bytes.cmp(&a.used_bytes).then(a.pid.cmp(&b.pid)));
    processes
}

/// Marks the clients of the GPU's MPS server: the MPS list's pids. A driver that lists a
/// client there only (not in the compute list) still has it hold its memory: it is added.
/// A GPU without MPS, or a driver without the list, answers nothing or an error: no client.
pub(super) fn mark_mps_clients(
    processes: &mut Vec<Listed>,
    mps: Result<Vec<ProcessInfo>, NvmlError>,
) {
    for info in mps.unwrap_or_default() {
        match processes.iter_mut().find(|p| p.pid == info.pid) {
            Some(listed) => listed.mps_client = true,
            None => processes.push(Listed {
                pid: info.pid,
                used_bytes: match info.used_gpu_memory {
                    UsedGpuMemory::Used(bytes) => Some(bytes),
                    UsedGpuMemory::Unavailable => None,
                },
                kind: ProcessType::Compute,
                sm_util_pct: None,
                gpu_instance_id: info.gpu_instance_id,
                compute_instance_id: info.compute_instance_id,
                mps_client: true,
            }),
        }
    }
    processes.sort_by(|a, b| b.used_bytes.cmp(&a.used_bytes).then(a.pid.cmp(&b.pid)));
}

pub(super) fn unattributed(used: u64, processes: &[Listed]) -> Option<u64> {
    let mut attributed: u64 = 0;
    for process in processes {
        attributed = attributed.saturating_add(process.used_bytes?);
    }
    Some(used.saturating_sub(attributed))
}

/// The MIG devices of a MIG-enabled GPU: the handle slots are sparse (NOT_FOUND for an
/// empty one), as on real drivers.
pub(super) fn read_mig_devices(device: &Device<'_>) -> Result<Vec<MigDevice>, NvmlError> {
    let slots = optional(device.mig_device_count())?.unwrap_or(0);
    let mut out = Vec::new();
    for slot in 0..slots {
        let mig = match device.mig_device_by_index(slot) {
            Ok(mig) => mig,
            Err(NvmlError::NotFound) => continue,
            Err(error) => return Err(error),
        };
        let profile = optional(mig.name())?.and_then(|name| {
            name.split_once(" MIG ")
                .map(|(_, profile)| profile.trim().to_string())
        });
        let (gpu_instance_id, compute_instance_id) = crate::nvml::mig_instance_ids(&mig);
        out.push(MigDevice {
            uuid: optional(mig.uuid())?,
            gpu_instance_id,
            compute_instance_id,
            profile,
            memory: optional(mig.memory_info())?.map(|m| MigMemory {
                total_bytes: m.total,
                used_bytes: m.used,
                unattributed_bytes: None,
            }),
            processes: Vec::new(),
        });
    }
    out.sort_by_key(|m| (m.gpu_instance_id, m.compute_instance_id));
    Ok(out)
}

impl GpuSnapshot {
    /// Lists each MIG device's processes (the parent's, by instance id) and the memory no
    /// process of the instance accounts for.
    pub(super) fn fill_mig_processes(&mut self) {
        for mig in &mut self.mig_devices {
            mig.processes = self
                .processes
                .iter()
                .filter(|p| {
                    p.gpu_instance_id.is_some()
                        && p.gpu_instance_id == mig.gpu_instance_id
                        && (p.compute_instance_id.is_none()
                            || mig.compute_instance_id.is_none()
                            || p.compute_instance_id == mig.compute_instance_id)
                })
                .cloned()
                .collect();
            if let Some(memory) = &mut mig.memory {
                let mut attributed = Some(0u64);
                for p in &mig.processes {
                    attributed = attributed.zip(p.used_bytes).map(|(a, b)| a + b);
                }
                memory.unattributed_bytes = attributed.map(|a| memory.used_bytes.saturating_sub(a));
            }
        }
    }
}

/// Which of a GPU's figures a snapshot reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fields {
    All,
    MemoryAndProcesses,
    /// Memory, processes, utilization and power.
    Activity,
}

impl Fields {
    pub(super) fn of(options: &SnapshotOptions) -> Fields {
        match (options.only_memory_and_processes, options.activity) {
            (false, _) => Fields::All,
            (true, false) => Fields::MemoryAndProcesses,
            (true, true) => Fields::Activity,
        }
    }
}

/// "P0" … "P15"; NVML's "unknown" state is no state.
pub(super) fn pstate_name(state: PerformanceState) -> Option<String> {
    match state {
        PerformanceState::Unknown => None,
        known => Some(format!("P{}", known.as_c())),
    }
}

pub(super) fn compute_mode_name(mode: ComputeMode) -> &'static str {
    match mode {
        ComputeMode::Default => "default",
        ComputeMode::ExclusiveThread => "exclusive_thread",
        ComputeMode::Prohibited => "prohibited",
        ComputeMode::ExclusiveProcess => "exclusive_process",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(pid: u32, used: Option<u64>) -> ProcessInfo {
        ProcessInfo {
            pid,
            used_gpu_memory: used.map_or(UsedGpuMemory::Unavailable, UsedGpuMemory::Used),
            gpu_instance_id: None,
            compute_instance_id: None,
        }
    }

    #[test]
    fn merges_compute_and_graphics_by_pid() {
        let utilization = Some(vec![(7, 55)]);
        let merged = merge_processes(
            vec![info(7, Some(100)), info(9, Some(300))],
            vec![info(7, Some(100)), info(11, None)],
            &utilization,
        );
        let summary: Vec<_> = merged
            .iter()
            .map(|p| (p.pid, p.used_bytes, p.kind, p.sm_util_pct))
            .collect();
        assert_eq!(
            summary,
            vec![
                (9, Some(300), ProcessType::Compute, Some(0)),
                (7, Some(100), ProcessType::ComputeAndGraphics, Some(55)),
                (11, None, ProcessType::Graphics, Some(0)),
            ]
        );
        // A pid's entries merge in the order listed, compute first: the merged entry is its
        // first compute entry's, instance included.
        let in_instance = |pid: u32, gi: u32| ProcessInfo {
            gpu_instance_id: Some(gi),
            ..info(pid, Some(100))
        };
        let graphics = vec![in_instance(7, 2), in_instance(3, 4)];
        let compute = vec![in_instance(7, 1), in_instance(3, 5), in_instance(3, 6)];
        let merged = merge_processes(compute, graphics, &None);
        let instances: Vec<_> = merged.iter().map(|p| (p.pid, p.gpu_instance_id)).collect();
        assert_eq!(instances, vec![(3, Some(5)), (7, Some(1))]);
    }

    #[test]
    fn the_mps_list_marks_its_clients_and_adds_one_the_compute_list_lacks() {
        let mut listed =
            merge_processes(vec![info(5, Some(300)), info(7, Some(800))], vec![], &None);
        mark_mps_clients(
            &mut listed,
            Ok(vec![info(7, Some(800)), info(9, Some(200))]),
        );
        let summary: Vec<_> = listed
            .iter()
            .map(|p| (p.pid, p.used_bytes, p.mps_client))
            .collect();
        assert_eq!(
            summary,
            vec![
                (7, Some(800), true),
                (5, Some(300), false),
                (9, Some(200), true)
            ]
        );
        // A GPU without MPS, or a driver without the list: nobody is a client.
        mark_mps_clients(&mut listed, Err(NvmlError::NotSupported));
        assert_eq!(listed.iter().filter(|p| p.mps_client).count(), 2);
        let mut plain = merge_processes(vec![info(5, Some(300))], vec![], &None);
        mark_mps_clients(&mut plain, Err(NvmlError::NotSupported));
        assert!(!plain[0].mps_client);
    }

    #[test]
    fn unattributed_is_used_minus_processes_and_unknown_when_a_size_is() {
        let known = merge_processes(vec![info(1, Some(100)), info(2, Some(50))], vec![], &None);
        assert_eq!(unattributed(1000, &known), Some(850));
        assert_eq!(unattributed(100, &known), Some(0));
        let unknown = merge_processes(vec![info(1, None)], vec![], &None);
        assert_eq!(unattributed(1000, &unknown), None);
    }
}
