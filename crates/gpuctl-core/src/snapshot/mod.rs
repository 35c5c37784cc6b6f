//! The snapshot: every selected GPU and every process holding memory on it, joined with what
//! the host knows about each process. Every later stage (classify, select, act, verify) reads
//! a snapshot; none queries NVML or /proc on its own.

pub mod peaks;
pub mod totals;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use nvml_wrapper::Device;
use nvml_wrapper::enum_wrappers::device::{
    Clock, ComputeMode, PerformanceState, TemperatureSensor,
};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use serde::Serialize;

use crate::error::{CoreError, Result};
use crate::host::{FactCache, HostProcess, LeaderState, Lineage, ProcView, Relatives};
use crate::nvml::{Gpus, describe};
use crate::pidmap::{PidMap, PidSet};

/// What to take. `gpus: None` takes every GPU.
#[derive(Debug, Clone, Default)]
pub struct SnapshotOptions {
    pub gpus: Option<Vec<u32>>,
    /// Per-process utilization is the highest sample in this window before now (activity is
    /// evidence of life); `None` reads whatever the driver still buffers.
    pub utilization_window: Option<std::time::Duration>,
    /// Reads only what says who holds memory (UUID, memory, processes and their
    /// utilization, MIG instances): not the name, PCI bus id, utilization, temperature, power, persistence
    /// or compute mode. For readers that poll (the watchdog each loop, the wait for memory
    /// to be released), each NVML query saved is one fewer driver call per GPU.
    pub only_memory_and_processes: bool,
    /// With `only_memory_and_processes`: also utilization, power draw and limit, what the
    /// watchdog's stuck-GPU check reads.
    pub activity: bool,
    /// Whether to look for the processes holding a GPU's device file that NVML does not
    /// list on it (`None`: never). The scan reads every process's descriptors.
    pub holders: Option<HolderScan>,
}

/// Per-process utilization is read over this window by whatever judges a process idle:
/// activity in it is evidence of life.
pub const ACTIVITY_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);

/// One constructor per purpose, so that every reader of the same kind reads the same facts.
impl SnapshotOptions {
    /// What a person is shown (`info`, a Slurm drain reason, the trainer's look): every fact
    /// of `gpus` (`None`: every GPU), no activity window, no holder scan.
    pub fn info(gpus: Option<Vec<u32>>) -> SnapshotOptions {
        SnapshotOptions {
            gpus,
            ..SnapshotOptions::default()
        }
    }

    /// What a reclaim classifies (`kill`, `clear`): every GPU, with each process's activity
    /// over [`ACTIVITY_WINDOW`]; `holders`: also the unlisted device-file holders.
    pub fn reclaim(holders: Option<HolderScan>) -> SnapshotOptions {
        SnapshotOptions {
            utilization_window: Some(ACTIVITY_WINDOW),
            holders,
            ..SnapshotOptions::default()
        }
    }

    /// What the watchdog reads each loop: who holds memory and how active each process is;
    /// `activity`: also utilization and power, for the stuck-GPU check.
    pub fn watch(activity: bool) -> SnapshotOptions {
        SnapshotOptions {
            utilization_window: Some(ACTIVITY_WINDOW),
            only_memory_and_processes: true,
            activity,
            ..SnapshotOptions::default()
        }
    }

    /// What a poll for released memory reads, as often as it can: memory and processes of
    /// `gpus` (`None`: every GPU), nothing else.
    pub fn poll(gpus: Option<Vec<u32>>) -> SnapshotOptions {
        SnapshotOptions {
            gpus,
            only_memory_and_processes: true,
            ..SnapshotOptions::default()
        }
    }
}

/// When to scan for device-file holders, and where the device files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderScan {
    /// `/dev`, or where the host's /dev is mounted (`GPUCTL_DEV_DIR`, `dev_dir`).
    pub dev_dir: PathBuf,
    /// Scan only when some GPU has at least this much memory no listed process accounts
    /// for; `None`: always.
    pub above_unattributed: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    #[serde(skip)]
    pub taken_at: SystemTime,
    pub driver_version: Option<String>,
    pub cuda_driver_version: Option<String>,
    pub nvml_version: Option<String>,
    /// False when gpuctl runs in a PID namespace other than the host's; every process is then
    /// unconfirmed.
    pub host_pid_namespace: bool,
    pub devices: Vec<GpuSnapshot>,
    /// How long its reads took, for benchmarks.
    #[serde(skip)]
    pub read_times: ReadTimes,
}

/// How long a snapshot's two reads took: NVML (every GPU, its processes, the driver's
/// versions) and /proc (every process's facts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadTimes {
    pub nvml: Duration,
    pub host: Duration,
    /// The device-file scan, when it ran.
    pub holders: Option<Duration>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuStatus {
    Ok,
    /// Fell off the bus or otherwise inaccessible (NVML_ERROR_GPU_IS_LOST).
    Lost,
    /// Some query this GPU needs failed; what was read is still shown.
    Error,
    /// Its queries did not answer within the NVML timeout: nothing of it is shown.
    NotAnswering,
}

#[derive(Debug, Clone, Serialize)]
pub struct GpuSnapshot {
    pub index: u32,
    pub uuid: Option<String>,
    pub name: Option<String>,
    pub pci_bus_id: Option<String>,
    pub status: GpuStatus,
    pub error: Option<String>,
    pub memory: Option<Memory>,
    pub utilization: Option<Utilization>,
    pub temperature_c: Option<u32>,
    pub power_mw: Option<u32>,
    pub power_limit_mw: Option<u32>,
    /// Current SM and memory clocks.
    pub clocks: Option<Clocks>,
    /// Performance state, as nvidia-smi names it: "P0" (maximum) … "P15" (minimum).
    pub pstate: Option<String>,
    pub persistence_mode: Option<bool>,
    pub compute_mode: Option<&'static str>,
    /// gpuctl's own "peak since reset" mark for this GPU (see [`peaks`]); filled in by
    /// callers that keep marks, `None` otherwise.
    pub peak: Option<peaks::Peak>,
    pub processes: Vec<GpuProcess>,
    /// MIG mode is on (`None`: not known, or not a MIG-capable GPU).
    pub mig_enabled: Option<bool>,
    /// Its MIG devices, by GPU instance id; empty unless MIG mode is on.
    pub mig_devices: Vec<MigDevice>,
    /// Processes holding this GPU's device file (`/dev/nvidia<minor>`) that NVML does not
    /// list on it; present only when the scan ran ([`SnapshotOptions::holders`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holders: Option<Vec<Holder>>,
    /// The device's minor number (its file is `nvidia<minor>`), read with the full figures.
    #[serde(skip)]
    pub minor: Option<u32>,
}

/// A process holding a GPU's device file without NVML listing it on that GPU.
#[derive(Debug, Clone, Serialize)]
pub struct Holder {
    pub pid: u32,
    /// What it is suspected to be (`classify::holders` names it): `tool`,
    /// `listed_elsewhere`, `job_process` or `unknown`; `None` until classified.
    pub suspect: Option<&'static str>,
    /// Why, in a sentence; `None` until classified.
    pub reason: Option<String>,
    #[serde(flatten)]
    pub host: Arc<HostProcess>,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Memory {
    pub total_bytes: u64,
    pub used_bytes: u64,
    pub free_bytes: u64,
    pub reserved_bytes: u64,
    /// Used memory that no listed process accounts for: leaked by dead contexts, or held by
    /// processes NVML does not list to us. `None` when a process's usage is not reported.
    pub unattributed_bytes: Option<u64>,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Clocks {
    pub sm_mhz: u32,
    pub memory_mhz: u32,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Utilization {
    pub gpu_pct: u32,
    pub memory_pct: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessType {
    Compute,
    Graphics,
    #[serde(rename = "compute+graphics")]
    ComputeAndGraphics,
}

#[derive(Debug, Clone, Serialize)]
pub struct GpuProcess {
    pub pid: u32,
    /// `None` where the driver does not report it (NVML_VALUE_NOT_AVAILABLE).
    pub used_bytes: Option<u64>,
    #[serde(rename = "type")]
    pub kind: ProcessType,
    /// Highest per-process SM utilization sampled in the window; 0 when the driver has no
    /// sample for it, `None` where the driver does not report per-process utilization.
    pub sm_util_pct: Option<u32>,
    /// The MIG GPU and compute instance it runs in, on a MIG-enabled GPU.
    pub gpu_instance_id: Option<u32>,
    pub compute_instance_id: Option<u32>,
    /// Shared by the process's entries on each of its GPUs.
    #[serde(flatten)]
    pub host: Arc<HostProcess>,
}

/// A MIG device: one GPU instance (with its compute instance) of a MIG-enabled GPU.
#[derive(Debug, Clone, Serialize)]
pub struct MigDevice {
    /// `MIG-…`
    pub uuid: Option<String>,
    pub gpu_instance_id: Option<u32>,
    pub compute_instance_id: Option<u32>,
    /// The profile, as in the device's name: `1g.10gb`, `3g.40gb`, …
    pub profile: Option<String>,
    pub memory: Option<MigMemory>,
    /// The parent's processes that run in this instance.
    pub processes: Vec<GpuProcess>,
}

/// A MIG device's memory.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct MigMemory {
    pub total_bytes: u64,
    pub used_bytes: u64,
    /// Used memory that no listed process of the instance accounts for.
    pub unattributed_bytes: Option<u64>,
}

impl Snapshot {
    /// Takes a snapshot of the selected GPUs, reading /proc for their processes only.
    pub fn take(gpus: &Gpus, options: &SnapshotOptions) -> Result<Snapshot> {
        let view = ProcView::system().map_err(|source| CoreError::Io {
            path: "/proc/uptime".into(),
            source,
        })?;
        Snapshot::take_with(gpus, &view, options)
    }

    pub fn take_with(gpus: &Gpus, view: &ProcView, options: &SnapshotOptions) -> Result<Snapshot> {
        Snapshot::take_inner(gpus, view, options, None)
    }

    /// [`Snapshot::take_with`] for a long-running reader that keeps host facts across
    /// snapshots (see [`FactCache`]).
    pub fn take_cached(
        gpus: &Gpus,
        view: &ProcView,
        options: &SnapshotOptions,
        cache: &mut FactCache,
    ) -> Result<Snapshot> {
        Snapshot::take_inner(gpus, view, options, Some(cache))
    }

    fn take_inner(
        gpus: &Gpus,
        view: &ProcView,
        options: &SnapshotOptions,
        cache: Option<&mut FactCache>,
    ) -> Result<Snapshot> {
        let started = Instant::now();
        let nvml = gpus.nvml();
        let indices = match &options.gpus {
            Some(indices) => indices.clone(),
            None => (0..gpus.count()?).collect(),
        };
        let since_us = options.utilization_window.map(|window| {
            let now = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default();
            now.saturating_sub(window).as_micros() as u64
        });
        let (mut devices, listed): (Vec<GpuSnapshot>, Vec<Vec<Listed>>) =
            read_gpus(gpus, &indices, since_us, Fields::of(options))
                .into_iter()
                .unzip();

        // Each pid once (a process is listed by every GPU it is on).
        let mut seen = PidSet::default();
        let pids: Vec<u32> = listed
            .iter()
            .flatten()
            .map(|p| p.pid)
            .filter(|&pid| seen.insert(pid))
            .collect();
        // Each entry gets its process's facts (shared by its entries on every GPU) once
        // they are read; one placeholder stands for any that could not be.
        let unread = Arc::new(HostProcess::unconfirmed("not read"));
        let join = |devices: &mut Vec<GpuSnapshot>,
                    fact_of: &dyn Fn(u32) -> Option<Arc<HostProcess>>| {
            for (gpu, listed) in devices.iter_mut().zip(listed) {
                gpu.processes = listed
                    .into_iter()
                    .map(|p| GpuProcess {
                        pid: p.pid,
                        used_bytes: p.used_bytes,
                        kind: p.kind,
                        sm_util_pct: p.sm_util_pct,
                        gpu_instance_id: p.gpu_instance_id,
                        compute_instance_id: p.compute_instance_id,
                        host: fact_of(p.pid).unwrap_or_else(|| Arc::clone(&unread)),
                    })
                    .collect();
                gpu.fill_mig_processes();
            }
        };
        let nvml_read = started.elapsed();
        match cache {
            Some(cache) => {
                let facts = view.processes_cached(&pids, cache);
                join(&mut devices, &|pid| facts.get(pid).cloned());
            }
            None => {
                let facts: HashMap<u32, Arc<HostProcess>> = view
                    .processes(&pids)
                    .into_iter()
                    .map(|(pid, fact)| (pid, Arc::new(fact)))
                    .collect();
                join(&mut devices, &|pid| facts.get(&pid).cloned());
            }
        }

        let host_read = started.elapsed() - nvml_read;
        let holders_read = match &options.holders {
            Some(scan) if scan.wanted(&devices) => {
                let scanning = Instant::now();
                find_holders(&mut devices, view, &scan.dev_dir)?;
                Some(scanning.elapsed())
            }
            _ => None,
        };
        let mut snapshot = Snapshot {
            taken_at: SystemTime::now(),
            driver_version: nvml.sys_driver_version().ok(),
            cuda_driver_version: nvml.sys_cuda_driver_version().ok().map(|v| {
                format!(
                    "{}.{}",
                    nvml_wrapper::cuda_driver_version_major(v),
                    nvml_wrapper::cuda_driver_version_minor(v)
                )
            }),
            nvml_version: nvml.sys_nvml_version().ok(),
            host_pid_namespace: view.host_pid_namespace(),
            devices,
            read_times: ReadTimes::default(),
        };
        let holders_took = holders_read.unwrap_or_default();
        snapshot.read_times = ReadTimes {
            nvml: started.elapsed() - host_read - holders_took,
            host: host_read,
            holders: holders_read,
        };
        Ok(snapshot)
    }
}

impl Snapshot {
    /// A snapshot of `devices` in the host PID namespace, no driver versions: for tests of
    /// the stages that read snapshots.
    #[cfg(test)]
    pub(crate) fn of(devices: Vec<GpuSnapshot>) -> Snapshot {
        Snapshot {
            taken_at: SystemTime::now(),
            driver_version: None,
            cuda_driver_version: None,
            nvml_version: None,
            host_pid_namespace: true,
            devices,
            read_times: ReadTimes::default(),
        }
    }

    /// The lineage of every confirmed process, the evidence classification reads. Children
    /// are counted only where the group leader is gone: a healthy run costs one read of its
    /// leader and parent.
    pub fn lineages(&self, view: &ProcView) -> PidMap<u32, Lineage> {
        self.lineages_with(view, &mut Relatives::default())
    }

    /// [`Snapshot::lineages`] for a long-running reader: leaders and parents are kept in
    /// `cache` and read again as often as its known processes are.
    pub fn lineages_cached(&self, view: &ProcView, cache: &mut FactCache) -> PidMap<u32, Lineage> {
        cache.with_relatives(|relatives| self.lineages_with(view, relatives))
    }

    fn lineages_with(&self, view: &ProcView, seen: &mut Relatives) -> PidMap<u32, Lineage> {
        let mut lineages = PidMap::with_capacity_and_hasher(
            self.devices.first().map_or(0, |gpu| gpu.processes.len()),
            Default::default(),
        );
        for process in self.devices.iter().flat_map(|gpu| &gpu.processes) {
            if lineages.contains_key(&process.pid) {
                continue;
            }
            let Some(mut lineage) = view.lineage(process.pid, &process.host, false, seen) else {
                continue;
            };
            if matches!(lineage.leader, LeaderState::Gone | LeaderState::Zombie) {
                lineage = view
                    .lineage(process.pid, &process.host, true, seen)
                    .unwrap_or(lineage);
            }
            lineages.insert(process.pid, lineage);
        }
        lineages
    }
}

/// A process as one GPU lists it, before its host facts are joined.
#[derive(Debug, Clone, Copy)]
struct Listed {
    pid: u32,
    used_bytes: Option<u64>,
    kind: ProcessType,
    sm_util_pct: Option<u32>,
    gpu_instance_id: Option<u32>,
    compute_instance_id: Option<u32>,
}

/// Reads one GPU, and the processes it lists (the entry's own list is filled in once their
/// host facts are read). Failures stay inside the returned entry so the other GPUs are
/// still shown.
/// Every GPU of `indices`, within the Gpus' timeout when it has one. One worker reads them
/// all in turn, handing each over as it is read; if some are still missing at half the
/// timeout (a GPU blocks the worker), each of those gets a worker of its own for the other
/// half. A GPU with no answer by the deadline, or still inside a call from an earlier read,
/// is reported as not answering; the others as read.
fn read_gpus(
    gpus: &Gpus,
    indices: &[u32],
    since_us: Option<u64>,
    fields: Fields,
) -> Vec<(GpuSnapshot, Vec<Listed>)> {
    type Read = (GpuSnapshot, Vec<Listed>);
    let read = move |nvml: &nvml_wrapper::Nvml, index: u32| read_gpu(nvml, index, since_us, fields);
    let Some(limit) = gpus.timeout() else {
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
            read.unwrap_or_else(|| (GpuSnapshot::not_answering(index, limit), Vec::new()))
        })
        .collect()
}

fn read_gpu(
    nvml: &nvml_wrapper::Nvml,
    index: u32,
    since_us: Option<u64>,
    fields: Fields,
) -> (GpuSnapshot, Vec<Listed>) {
    let mut gpu = GpuSnapshot::unread(index);
    let device = match nvml.device_by_index(index) {
        Ok(device) => device,
        Err(error) => {
            gpu.fail(&error, "cannot open the GPU");
            return (gpu, Vec::new());
        }
    };
    let mut listed = Vec::new();
    if let Err(error) = read_gpu_fields(&device, &mut gpu, &mut listed, since_us, fields) {
        gpu.fail(&error, "query failed");
    }
    (gpu, listed)
}

/// Fields a GPU does not support stay `None`; a lost GPU stops the reading.
fn read_gpu_fields(
    device: &Device<'_>,
    gpu: &mut GpuSnapshot,
    listed: &mut Vec<Listed>,
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

    let compute = process_list(device.running_compute_processes());
    let graphics = process_list(device.running_graphics_processes());
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
    *listed = merge_processes(compute, graphics, &utilization);
    gpu.memory = memory.map(|m| Memory {
        total_bytes: m.total,
        used_bytes: m.used,
        free_bytes: m.free,
        reserved_bytes: m.reserved,
        unattributed_bytes: (gpu.status == GpuStatus::Ok)
            .then(|| unattributed(m.used, listed))
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
            minor: None,
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

/// `Ok(None)` for a field this GPU or driver does not offer; `Err` only for a lost GPU.
fn optional<T>(result: Result<T, NvmlError>) -> Result<Option<T>, NvmlError> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(NvmlError::GpuLost) => Err(NvmlError::GpuLost),
        Err(_) => Ok(None),
    }
}

fn process_list(
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
fn sm_utilization(device: &Device<'_>, since_us: Option<u64>) -> Option<Vec<(u32, u32)>> {
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
fn merge_processes(
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

fn unattributed(used: u64, processes: &[Listed]) -> Option<u64> {
    let mut attributed: u64 = 0;
    for process in processes {
        attributed = attributed.saturating_add(process.used_bytes?);
    }
    Some(used.saturating_sub(attributed))
}

/// The MIG devices of a MIG-enabled GPU: the handle slots are sparse (NOT_FOUND for an
/// empty one), as on real drivers.
fn read_mig_devices(device: &Device<'_>) -> Result<Vec<MigDevice>, NvmlError> {
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
    fn fill_mig_processes(&mut self) {
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
enum Fields {
    All,
    MemoryAndProcesses,
    /// Memory, processes, utilization and power.
    Activity,
}

impl Fields {
    fn of(options: &SnapshotOptions) -> Fields {
        match (options.only_memory_and_processes, options.activity) {
            (false, _) => Fields::All,
            (true, false) => Fields::MemoryAndProcesses,
            (true, true) => Fields::Activity,
        }
    }
}

impl HolderScan {
    fn wanted(&self, devices: &[GpuSnapshot]) -> bool {
        match self.above_unattributed {
            None => true,
            Some(threshold) => devices.iter().any(|gpu| {
                gpu.memory
                    .and_then(|m| m.unattributed_bytes)
                    .is_some_and(|bytes| bytes >= threshold)
            }),
        }
    }
}

/// Fills each GPU's `holders`: the processes with its device file open that NVML does not
/// list on it, this process excepted (gpuctl itself opens every GPU's file through NVML).
/// A GPU whose minor number is unknown gets none.
fn find_holders(devices: &mut [GpuSnapshot], view: &ProcView, dev_dir: &Path) -> Result<()> {
    let found = crate::host::devfiles::scan(dev_dir).map_err(|source| CoreError::Io {
        path: "/proc".into(),
        source,
    })?;
    let me = std::process::id();
    let per_gpu: Vec<Vec<u32>> = devices
        .iter()
        .map(|gpu| match gpu.minor {
            None => Vec::new(),
            Some(minor) => found
                .of_gpu(minor)
                .iter()
                .copied()
                .filter(|&pid| pid != me && !gpu.processes.iter().any(|p| p.pid == pid))
                .collect(),
        })
        .collect();
    let mut seen = PidSet::default();
    let pids: Vec<u32> = per_gpu
        .iter()
        .flatten()
        .copied()
        .filter(|&pid| seen.insert(pid))
        .collect();
    let facts: HashMap<u32, Arc<HostProcess>> = view
        .processes(&pids)
        .into_iter()
        .map(|(pid, fact)| (pid, Arc::new(fact)))
        .collect();
    for (gpu, pids) in devices.iter_mut().zip(per_gpu) {
        gpu.holders = Some(
            pids.into_iter()
                .map(|pid| Holder {
                    pid,
                    suspect: None,
                    reason: None,
                    host: facts.get(&pid).cloned().unwrap_or_else(|| {
                        Arc::new(HostProcess::unconfirmed("gone before it was read"))
                    }),
                })
                .collect(),
        );
    }
    Ok(())
}

/// "P0" … "P15"; NVML's "unknown" state is no state.
fn pstate_name(state: PerformanceState) -> Option<String> {
    match state {
        PerformanceState::Unknown => None,
        known => Some(format!("P{}", known.as_c())),
    }
}

fn compute_mode_name(mode: ComputeMode) -> &'static str {
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
