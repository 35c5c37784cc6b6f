//! The snapshot: every selected GPU and every process holding memory on it, joined with what
//! the host knows about each process. Every later stage (classify, select, act, verify) reads
//! a snapshot; none queries NVML or /proc on its own.

mod field;
mod health;
pub mod last_known;
pub mod peaks;
pub mod pods;
mod read;
mod steps;
pub mod totals;
pub mod usage;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;

use crate::error::{CoreError, Result};
use crate::host::{FactCache, HostProcess, LeaderState, Lineage, ProcView, Relatives};
use crate::nvml::Gpus;
use crate::pidmap::{PidMap, PidSet};
use read::{Fields, Listing, read_gpus};
use steps::{ask_host_service, join_facts, read_listings, scan_holders};

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
    /// Also read each GPU's health (recovery action, remapped rows, ECC, retired pages,
    /// clock-event reasons) into `GpuSnapshot::health_readings`.
    pub health: bool,
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
            health: true,
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

    /// What the watchdog reads each loop: who holds memory, how active each process is, and
    /// each GPU's health; `activity`: also utilization and power, for the stuck-GPU check.
    pub fn watch(activity: bool) -> SnapshotOptions {
        SnapshotOptions {
            utilization_window: Some(ACTIVITY_WINDOW),
            only_memory_and_processes: true,
            activity,
            // The GPU's health: its verdict, metrics, and whether a reclaim can succeed.
            health: true,
            ..SnapshotOptions::default()
        }
    }

    /// What a launcher reads to pick GPUs (`gpuctl run`, `gpuctl pick`): who holds memory,
    /// utilization (for a utilization limit) and health (the verdict is the gate), of
    /// `gpus` (`None`: every GPU); not the name, clocks or temperature.
    pub fn pick(gpus: Option<Vec<u32>>) -> SnapshotOptions {
        SnapshotOptions {
            gpus,
            only_memory_and_processes: true,
            activity: true,
            health: true,
            ..SnapshotOptions::default()
        }
    }

    /// What `gpuctl run` samples while its command runs, on the leased `gpus` only: memory
    /// and utilization (peak and mean for its summary).
    pub fn sample(gpus: Vec<u32>) -> SnapshotOptions {
        SnapshotOptions {
            gpus: Some(gpus),
            only_memory_and_processes: true,
            activity: true,
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

/// What the `idle` finding says of a process (the watchdog's window, `classify::idle`):
/// since when, the memory, how much of the window was measured, and where its utilization
/// came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct IdleFacts {
    /// Seconds since the epoch.
    pub idle_since: u64,
    pub idle_seconds: u64,
    pub memory_bytes: u64,
    /// Of the window, the share measured (percent): the rest had no utilization known.
    pub measured_pct: u32,
    pub utilization: IdleSource,
}

/// Where a process's utilization came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdleSource {
    /// The driver's per-process samples (`nvmlDeviceGetProcessUtilization`).
    Process,
    /// The driver gives no per-process samples, and the process is its GPU's only holder:
    /// the device's utilization is the process's.
    Device,
    /// No per-process samples and other holders on the GPU: not known.
    Unknown,
}

impl IdleSource {
    pub fn name(self) -> &'static str {
        match self {
            IdleSource::Process => "process",
            IdleSource::Device => "device",
            IdleSource::Unknown => "unknown",
        }
    }
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
    /// How the host service was asked, where gpuctl runs in a PID namespace of its own
    /// (see [`crate::service`]); absent in the host's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_service: Option<crate::service::client::ServiceUse>,
    /// How the container runtime was asked for the names of the pods on the GPUs; absent
    /// where no process of a pod it had not named was there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_runtime: Option<crate::snapshot::pods::RuntimeUse>,
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
    /// Why the scan could not look for this GPU's holders (its device file is not in the
    /// device directory): then `holders` is empty for want of looking.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holders_not_scanned: Option<String>,
    /// The device's minor number (its file is `nvidia<minor>`), read with the full figures.
    #[serde(skip)]
    pub minor: Option<u32>,
    /// Memory held by processes outside this PID namespace, as the host service summed
    /// it (one number: whose it is stays the host's); absent where the service was not
    /// asked or does not know this GPU. Those processes are then not listed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outside_namespace_bytes: Option<u64>,
    /// What NVML says of the GPU's health, read when [`SnapshotOptions::health`] asks.
    #[serde(skip)]
    pub health_readings: Option<crate::health::Readings>,
    /// The GPU's health verdict, where a reader judged it (`info`, `gpuctl health`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health: Option<crate::health::Verdict>,
    /// The `gpuctl run` leases held on it or its MIG instances, where a reader asked
    /// ([`crate::session::Reader::showing_leases`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub leases: Vec<crate::lease::Leased>,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
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
    /// Idle by the watchdog's window, where a reader was shown it (`info`, `top`, Python).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle: Option<IdleFacts>,
    /// What `gpuctl clear` would reclaim it as (its finding: `orphaned`, `zombie_holder`),
    /// where a reader classified it (`info`, Python's `snapshot()`). The kind's name, not
    /// `classify::Kind`: classify reads snapshots, so a snapshot names no classify type.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reclaimable: Option<&'static str>,
    /// The MIG GPU and compute instance it runs in, on a MIG-enabled GPU.
    pub gpu_instance_id: Option<u32>,
    pub compute_instance_id: Option<u32>,
    /// Its part in CUDA MPS on this GPU: the server, or a client of it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mps: Option<crate::mps::Role>,
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
    /// The most processes one GPU lists: at least that many distinct processes, what a
    /// per-process map of a pass is sized by (growing it entry by entry rehashed it
    /// several times a pass in the watchdog).
    pub fn most_listed(&self) -> usize {
        self.devices
            .iter()
            .map(|g| g.processes.len())
            .max()
            .unwrap_or(0)
    }

    /// Takes a snapshot of the selected GPUs, reading /proc for their processes only (and,
    /// in a PID namespace of its own, asking the host service where one answers).
    pub fn take(gpus: &Gpus, options: &SnapshotOptions) -> Result<Snapshot> {
        let view = ProcView::system().map_err(|source| CoreError::Io {
            path: "/proc/uptime".into(),
            source,
        })?;
        Snapshot::take_with(gpus, &view, options)
    }

    pub fn take_with(gpus: &Gpus, view: &ProcView, options: &SnapshotOptions) -> Result<Snapshot> {
        Snapshot::take_from(gpus, view, options, true, None)
    }

    /// The snapshot every reader takes (through [`crate::session::Reader`]): `localize`:
    /// in a PID namespace of its own, ask the host service which processes are this
    /// namespace's (where asking is allowed and one answers); `cache`: host facts kept
    /// across snapshots by a long-running reader (see [`FactCache`]).
    ///
    /// Four steps: read NVML, localise the listings, join each listed process with its host
    /// facts, scan for device-file holders.
    pub fn take_from(
        gpus: &Gpus,
        view: &ProcView,
        options: &SnapshotOptions,
        localize: bool,
        cache: Option<&mut FactCache>,
    ) -> Result<Snapshot> {
        let started = Instant::now();
        let (mut devices, mut listed) = read_listings(gpus, options)?;
        let (host_service, localized) = match localize && !view.host_pid_namespace() {
            true => ask_host_service(&mut devices, &mut listed),
            false => (None, None),
        };
        let nvml_read = started.elapsed();
        join_facts(&mut devices, listed, view, localized.as_ref(), cache);
        let host_read = started.elapsed() - nvml_read;
        let holders_read = match &options.holders {
            Some(scan) if scan.wanted(&devices) => {
                Some(scan_holders(gpus, &mut devices, view, scan)?)
            }
            _ => None,
        };
        let nvml = gpus.nvml();
        Ok(Snapshot {
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
            host_service,
            pod_runtime: None,
            devices,
            read_times: ReadTimes {
                nvml: started.elapsed() - host_read - holders_read.unwrap_or_default(),
                host: host_read,
                holders: holders_read,
            },
        })
    }
}

impl Snapshot {
    /// A snapshot of `devices` in the host PID namespace, no driver versions: for tests of
    /// the stages that read snapshots, in this crate and in the binaries.
    pub fn of(devices: Vec<GpuSnapshot>) -> Snapshot {
        Snapshot {
            taken_at: SystemTime::now(),
            driver_version: None,
            cuda_driver_version: None,
            nvml_version: None,
            host_pid_namespace: true,
            host_service: None,
            pod_runtime: None,
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
        gpu.holders_not_scanned = crate::host::devfiles::not_scannable(dev_dir, gpu.minor);
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

#[cfg(test)]
mod tests {
    use super::steps::as_listed;
    use super::*;

    fn started_at(ticks: u64) -> Arc<HostProcess> {
        Arc::new(HostProcess {
            confirmed: true,
            unconfirmed_reason: None,
            start_ticks: Some(ticks),
            ..HostProcess::unconfirmed("")
        })
    }

    #[test]
    fn a_process_started_after_its_listing_is_not_the_one_listed() {
        let newcomer = as_listed(42, started_at(1001), Some(1000));
        assert!(!newcomer.confirmed);
        assert_eq!(newcomer.start_ticks, None, "nothing of it is attributed");
        assert_eq!(
            newcomer.unconfirmed_reason.as_deref(),
            Some(
                "pid 42 started after NVML listed it: the listed process is gone and another \
                 now has its pid"
            )
        );
    }

    /// Both sides are rounded down to whole ticks: a process started within the listing's
    /// tick, before or after the moment, compares equal and is kept (the one-tick window).
    #[test]
    fn a_process_started_up_to_its_listing_tick_is_kept_as_read() {
        for started in [0, 999, 1000] {
            let fact = started_at(started);
            assert!(Arc::ptr_eq(
                &as_listed(42, Arc::clone(&fact), Some(1000)),
                &fact
            ));
        }
        // No moment (a fixture tree, the clock failed), or facts without a start time.
        let fact = started_at(5000);
        assert!(Arc::ptr_eq(&as_listed(42, Arc::clone(&fact), None), &fact));
        let unread = Arc::new(HostProcess::unconfirmed("not read"));
        assert!(Arc::ptr_eq(
            &as_listed(42, Arc::clone(&unread), Some(1)),
            &unread
        ));
    }

    /// Against the real clock and /proc, read fresh or through the watchdog's cache: a
    /// process that ran before the moment is kept, one started after it is not.
    #[test]
    fn the_boot_clock_tells_a_newcomer_from_a_listed_process_in_both_reads() {
        let view = ProcView::system().unwrap();
        if !view.host_pid_namespace() {
            eprintln!("skipped: not in the host PID namespace");
            return;
        }
        let me = std::process::id();
        let listed_at = view.boot_ticks(crate::host::boot_clock().unwrap());
        // Past the listing's tick, so the newcomer's start time is a later one.
        std::thread::sleep(Duration::from_millis(25));
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let newcomer = child.id();
        let fresh = view.processes(&[me, newcomer]);
        let mut cache = FactCache::refreshing_every(Duration::ZERO);
        let cached = view.processes_cached(&[me, newcomer], &mut cache);
        let judged = |fact: &Arc<HostProcess>, pid| as_listed(pid, Arc::clone(fact), listed_at);
        let (fresh_me, fresh_new) = (
            judged(&Arc::new(fresh[&me].clone()), me),
            judged(&Arc::new(fresh[&newcomer].clone()), newcomer),
        );
        let (cached_me, cached_new) = (
            judged(&cached[&me], me),
            judged(&cached[&newcomer], newcomer),
        );
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(fresh_me.confirmed && cached_me.confirmed);
        assert!(!fresh_new.confirmed, "{fresh_new:?}");
        assert!(!cached_new.confirmed, "{cached_new:?}");
    }
}
