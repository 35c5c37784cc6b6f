//! The watchdog's view of GPU health: an NVML event set for Xid errors and recovery-action
//! changes, drained every loop (and by `--once`); one journal event per Xid naming the
//! processes on the GPU then; the Xid log in the state directory (bounded: what `gpuctl
//! health` and `info` show as the Xids since each GPU's last reset); each GPU's verdict;
//! and what the metrics file says of it.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use gpuctl_core::checkup::Judge;
use gpuctl_core::health::log::{Acks, XidLog};
use gpuctl_core::health::{Action, Catalog, Readings, Verdict, XidProcess, XidRecord, kernel_log};
use gpuctl_core::nvml::Gpus;
use gpuctl_core::owner::OwnerMatch;
use gpuctl_core::snapshot::{GpuSnapshot, GpuStatus, Snapshot};
use gpuctl_core::units;
use gpuctl_core::xid_events::{EventWatch, GpuEvent};

use crate::log::{Logger, Priority};

/// At most this many events are taken a loop: a GPU raising Xids in a storm must not hold
/// the loop up; the rest are taken the next loop.
const MAX_EVENTS_PER_LOOP: usize = 256;

/// One GPU's health series.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuHealthMetrics {
    pub index: u32,
    pub uuid: String,
    pub action: Action,
    /// correctable, uncorrectable, pending, failure
    pub remapped_rows: Option<[u64; 4]>,
    /// volatile corrected, volatile uncorrected, aggregate corrected, aggregate uncorrected
    pub ecc: Option<[u64; 4]>,
    /// Distinct jobs (owners; a process without one counts alone) that hit an app Xid
    /// (`restart_app`) on the GPU in the last [`APP_XID_WINDOW_SECS`]: the catalog's "same
    /// GPU, different apps" hint of hardware.
    pub app_xid_jobs: u64,
}

/// NVML's health readings (cumulative ECC and row-remapping counters, the recovery action
/// the Xid events also announce) change slowly: read at most this often, as each process's
/// stat is, not every loop of a short interval. An Xid makes the next loop read them.
pub const READINGS_EVERY: Duration = Duration::from_secs(1);

/// Each GPU's last health readings (index, UUID, readings), and when they were read.
#[derive(Default)]
struct KeptReadings {
    at: Option<Instant>,
    gpus: Vec<(u32, Option<String>, Option<Readings>)>,
}

/// The window of `app_xid_jobs`.
pub const APP_XID_WINDOW_SECS: u64 = 24 * 3600;

/// The health part of the metrics file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HealthMetrics {
    pub gpus: Vec<GpuHealthMetrics>,
    /// Xids seen since the watchdog started, by (GPU index, UUID, Xid): a counter.
    pub xids: BTreeMap<(u32, String, u32), u64>,
}

#[derive(Default)]
pub struct HealthWatch {
    events: Option<EventWatch>,
    /// Why the event set could not be registered, as last logged.
    unregistered: Option<String>,
    /// What the last registration watched, as logged: a reopened NVML session registers
    /// again, and says so only when that changes.
    watching: Option<String>,
    /// The catalog, the Xid log this watchdog keeps, and the acknowledgements.
    judge: Judge,
    loaded_from: Option<std::path::PathBuf>,
    /// The driver's Xid lines: who an Xid names.
    pub kernel: crate::culprit::KernelLogReader,
    pub metrics: HealthMetrics,
    readings: KeptReadings,
}

impl HealthWatch {
    pub fn new(catalog: Catalog) -> HealthWatch {
        let mut watch = HealthWatch::default();
        watch.judge.set_catalog(catalog);
        watch
    }

    /// Whether this loop's snapshot reads the GPUs' health ([`READINGS_EVERY`]).
    pub fn readings_due(&self) -> bool {
        self.readings
            .at
            .is_none_or(|at| at.elapsed() >= READINGS_EVERY)
    }

    /// Keeps the health `snapshot` read (`read`), or, where it read none, gives each
    /// answering GPU its last readings (the same index and UUID).
    pub fn keep_readings(&mut self, snapshot: &mut Snapshot, read: bool) {
        if read {
            self.readings.at = Some(Instant::now());
            self.readings.gpus = snapshot
                .devices
                .iter()
                .map(|g| (g.index, g.uuid.clone(), g.health_readings.clone()))
                .collect();
            return;
        }
        for gpu in &mut snapshot.devices {
            if gpu.status != GpuStatus::Ok || gpu.health_readings.is_some() {
                continue;
            }
            gpu.health_readings = self
                .readings
                .gpus
                .iter()
                .find(|(index, uuid, _)| *index == gpu.index && *uuid == gpu.uuid)
                .and_then(|(_, _, readings)| readings.clone());
        }
    }

    /// The configuration changed (a reload).
    pub fn set_catalog(&mut self, catalog: Catalog) {
        self.judge.set_catalog(catalog);
    }

    /// One loop: registers the event set where needed, takes the pending events (each Xid
    /// logged and recorded with the processes `snapshot` shows on its GPU), forgets the
    /// Xids from before a reset, and sets each GPU's verdict in `snapshot`.
    pub fn observe(
        &mut self,
        gpus: &Gpus,
        snapshot: &mut Snapshot,
        state_dir: Option<&Path>,
        logger: &Logger,
    ) {
        if self.loaded_from.as_deref() != state_dir {
            *self.judge.log_mut() = state_dir.map(XidLog::read).unwrap_or_default();
            self.loaded_from = state_dir.map(Path::to_path_buf);
        }
        self.register(gpus, logger);
        self.kernel.begin(state_dir, logger);
        let mut changed = self.take_events(gpus, snapshot, logger);
        self.kernel.end(state_dir);
        self.judge
            .set_acks(state_dir.map(Acks::read).unwrap_or_default());
        changed |= self.forget_resets(snapshot);
        if changed
            && let Some(dir) = state_dir
            && let Err(error) = self.judge.log().write(dir)
        {
            logger.log(
                Priority::Err,
                &format!(
                    "cannot write the Xid log {}: {error}",
                    XidLog::path(dir).display()
                ),
                &[("ACTION", "health-log-failed".into())],
            );
        }
        self.judge.annotate(snapshot);
        let now = units::unix_seconds() as u64;
        self.metrics.gpus = snapshot
            .devices
            .iter()
            .filter_map(|gpu| {
                let mut metrics = gpu_metrics(gpu)?;
                metrics.app_xid_jobs = gpu
                    .uuid
                    .as_deref()
                    .map_or(0, |uuid| self.app_xid_jobs(uuid, now));
                Some(metrics)
            })
            .collect();
    }

    /// The pending events: each Xid logged and recorded, each recovery action logged.
    /// Whether the Xid log changed.
    fn take_events(&mut self, gpus: &Gpus, snapshot: &Snapshot, logger: &Logger) -> bool {
        let events = match &mut self.events {
            Some(watch) => watch.drain(MAX_EVENTS_PER_LOOP),
            None => Vec::new(),
        };
        let mut changed = false;
        // The bus ids the kernel's Xid lines are keyed by (a watch snapshot reads none).
        let buses = match events.iter().any(|e| matches!(e, GpuEvent::Xid { .. })) {
            true => gpus.tables().map(|t| t.buses).unwrap_or_default(),
            false => Vec::new(),
        };
        for event in events {
            match event {
                GpuEvent::Xid { gpu, xid } => {
                    self.readings.at = None;
                    let bus = buses.get(gpu as usize).cloned().flatten();
                    changed |= self.xid(snapshot, (gpu, bus.as_deref()), xid, logger);
                }
                GpuEvent::RecoveryAction { gpu, action } => {
                    let uuid = uuid_of(snapshot, gpu);
                    let action = action.map_or("unknown", Action::name);
                    logger.log(
                        Priority::Warning,
                        &format!("GPU {gpu}: the driver's recovery action is now {action}"),
                        &[
                            ("ACTION", "recovery-action".into()),
                            ("GPU", gpu.to_string()),
                            ("GPU_UUID", uuid),
                            ("HEALTH_ACTION", action.into()),
                        ],
                    );
                }
            }
        }
        changed
    }

    /// Forgets each GPU's Xids from before its last reset (or acknowledgement); whether the
    /// Xid log changed.
    fn forget_resets(&mut self, snapshot: &Snapshot) -> bool {
        let mut changed = false;
        for gpu in &snapshot.devices {
            let (Some(uuid), Some(readings)) = (&gpu.uuid, &gpu.health_readings) else {
                continue;
            };
            let volatile = readings.ecc.map(|e| e.volatile_total());
            let acknowledged = self.judge.acks().get(uuid);
            changed |= self
                .judge
                .log_mut()
                .forget_reset(uuid, volatile, acknowledged);
        }
        changed
    }

    /// How many jobs hit an app Xid on GPU `uuid` in the window before `now`.
    fn app_xid_jobs(&self, uuid: &str, now: u64) -> u64 {
        // An owner, else the process alone (Err sorts after every Ok).
        let mut jobs: Vec<Result<&OwnerMatch, u32>> = self
            .judge
            .log()
            .for_gpu(uuid)
            .iter()
            .filter(|r| r.at_unix + APP_XID_WINDOW_SECS >= now)
            .filter(|r| self.judge.rule(r.xid).action == Action::RestartApp)
            .flat_map(|r| &r.processes)
            .map(|p| p.owner.as_ref().ok_or(p.pid))
            .collect();
        jobs.sort();
        jobs.dedup();
        jobs.len() as u64
    }

    /// The link is about to close its NVML session: the event set goes first, as it holds
    /// that session (a session kept alive would let the next open succeed on a driver that
    /// is gone, as NVML counts its opens).
    pub fn session_closed(&mut self) {
        self.events = None;
        self.readings = KeptReadings::default();
    }

    fn register(&mut self, gpus: &Gpus, logger: &Logger) {
        // A set lives as long as its NVML session: a reopened session gets a new one.
        if self.events.as_ref().is_some_and(|w| !w.same_session(gpus)) {
            self.events = None;
        }
        if self.events.is_some() {
            return;
        }
        match EventWatch::register(gpus) {
            Ok(watch) => {
                let watching = format!(
                    "watching Xid events on GPUs {}{}",
                    list(&watch.gpus()),
                    match watch.recovery_gpus() {
                        [] => String::new(),
                        some => format!(", recovery-action events on GPUs {}", list(some)),
                    }
                );
                if self.watching.as_deref() != Some(&watching) {
                    logger.log(
                        Priority::Info,
                        &watching,
                        &[("ACTION", "xid-events".into())],
                    );
                    self.watching = Some(watching);
                }
                self.events = Some(watch);
                self.unregistered = None;
            }
            Err(why) => {
                if self.unregistered.as_deref() != Some(&why) {
                    logger.log(
                        Priority::Warning,
                        &format!("not watching Xid events: {why}"),
                        &[("ACTION", "xid-events".into()), ("REASON", why.clone())],
                    );
                }
                self.unregistered = Some(why);
            }
        }
    }

    /// One Xid: logged with the processes on its GPU, recorded, counted.
    fn xid(
        &mut self,
        snapshot: &Snapshot,
        (gpu, bus_id): (u32, Option<&str>),
        xid: u32,
        logger: &Logger,
    ) -> bool {
        let device = snapshot.devices.iter().find(|g| g.index == gpu);
        let uuid = uuid_of(snapshot, gpu);
        let rule = self.judge.rule(xid);
        let app = rule.action == Action::RestartApp;
        let line = self.kernel.line_for(bus_id, xid, app);
        let on_gpu = device.map(processes_on).unwrap_or_default();
        let processes = kernel_log::culprits(on_gpu, line.as_ref(), app);
        let named = line.as_ref().is_some_and(|l| l.pid.is_some());
        let on = culprit_phrase(&processes, app, named);
        let mut fields = vec![
            ("ACTION", "xid".to_string()),
            ("GPU", gpu.to_string()),
            ("GPU_UUID", uuid.clone()),
            ("XID", xid.to_string()),
            ("XID_MEANING", rule.meaning.clone()),
            ("HEALTH_ACTION", rule.action.name().to_string()),
        ];
        fields.extend(culprit_fields(&processes, app, named));
        logger.log(
            Priority::Err,
            &format!(
                "GPU {gpu}: Xid {xid} ({}): action {}; {on}",
                rule.meaning,
                rule.action.name()
            ),
            &fields,
        );
        *self
            .metrics
            .xids
            .entry((gpu, uuid.clone(), xid))
            .or_insert(0) += 1;
        let Some(uuid) = device.and_then(|d| d.uuid.clone()) else {
            return false;
        };
        let volatile_ecc = device
            .and_then(|d| d.health_readings.as_ref())
            .and_then(|r| r.ecc)
            .map(|e| e.volatile_total());
        self.judge.log_mut().record(
            &uuid,
            XidRecord {
                xid,
                at_unix: units::unix_seconds() as u64,
                processes,
                volatile_ecc,
            },
        );
        true
    }
}

/// Who an Xid is on, for its log line: the process the kernel names, else the processes on
/// the GPU (an application Xid that no kernel line pins on a process has no culprit).
fn culprit_phrase(processes: &[XidProcess], app: bool, named: bool) -> String {
    if app && !named {
        "culprit unknown (no kernel log line named a process)".to_string()
    } else if processes.is_empty() {
        "no process on the GPU".to_string()
    } else if named {
        format!("the kernel names {}", processes[0])
    } else {
        format!(
            "on the GPU: {}",
            processes
                .iter()
                .map(XidProcess::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

/// The journal fields naming an Xid's processes: its culprit (where one is looked for),
/// the pids and the owners.
fn culprit_fields(processes: &[XidProcess], app: bool, named: bool) -> Vec<(&'static str, String)> {
    let mut fields = Vec::new();
    if app || named {
        let culprit = match (named, processes.first()) {
            (true, Some(p)) => p.pid.to_string(),
            _ => "unknown".to_string(),
        };
        fields.push(("CULPRIT", culprit));
    }
    let pids: Vec<String> = processes.iter().map(|p| p.pid.to_string()).collect();
    if !pids.is_empty() {
        fields.push(("PIDS", pids.join(",")));
    }
    let owners: Vec<String> = processes
        .iter()
        .filter_map(|p| Some(p.owner.as_ref()?.to_string()))
        .collect();
    if !owners.is_empty() {
        fields.push(("OWNERS", owners.join(",")));
    }
    fields
}

/// What a needs-action GPU's reclaim failure says instead of a retry: "GPU 1 needs a reset:
/// row remap pending", for the first GPU of `gpus` whose action is not `none`.
pub fn needs_action(snapshot: &Snapshot, gpus: &[u32]) -> Option<String> {
    gpus.iter().find_map(|index| {
        let gpu = snapshot.devices.iter().find(|g| g.index == *index)?;
        let summary = gpu.health.as_ref().and_then(Verdict::summary)?;
        Some(format!("GPU {index} {summary}"))
    })
}

fn uuid_of(snapshot: &Snapshot, gpu: u32) -> String {
    snapshot
        .devices
        .iter()
        .find(|g| g.index == gpu)
        .and_then(|g| g.uuid.clone())
        .unwrap_or_else(|| format!("index {gpu}"))
}

fn processes_on(gpu: &GpuSnapshot) -> Vec<XidProcess> {
    gpu.processes
        .iter()
        .map(|p| XidProcess {
            pid: p.pid,
            start_ticks: p.host.start_ticks,
            user: p.host.user_name(),
            owner: p.host.owner.as_ref().and_then(OwnerMatch::of),
            command: p.host.command.clone(),
        })
        .collect()
}

fn list(gpus: &[u32]) -> String {
    gpus.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn gpu_metrics(gpu: &GpuSnapshot) -> Option<GpuHealthMetrics> {
    let verdict = gpu.health.as_ref()?;
    let readings = gpu.health_readings.as_ref();
    Some(GpuHealthMetrics {
        index: gpu.index,
        uuid: gpu
            .uuid
            .clone()
            .unwrap_or_else(|| format!("index {}", gpu.index)),
        action: verdict.action,
        remapped_rows: readings.and_then(|r| r.remapped_rows).map(|r| {
            [
                u64::from(r.correctable),
                u64::from(r.uncorrectable),
                u64::from(r.pending),
                u64::from(r.failure),
            ]
        }),
        ecc: readings.and_then(|r| r.ecc).map(|e| {
            [
                e.volatile_corrected,
                e.volatile_uncorrected,
                e.aggregate_corrected,
                e.aggregate_uncorrected,
            ]
        }),
        app_xid_jobs: 0,
    })
}

#[cfg(test)]
mod kept_readings_tests {
    use super::*;

    fn gpu(index: u32, uuid: &str, readings: Option<Readings>) -> GpuSnapshot {
        GpuSnapshot {
            uuid: Some(uuid.to_string()),
            status: GpuStatus::Ok,
            health_readings: readings,
            ..GpuSnapshot::unread(index)
        }
    }

    fn read(ecc_mask: u64) -> Option<Readings> {
        Some(Readings {
            clock_event_reasons: Some(ecc_mask),
            ..Readings::default()
        })
    }

    #[test]
    fn a_loop_that_reads_no_health_carries_each_gpus_last_readings_to_the_same_gpu_only() {
        let mut watch = HealthWatch::default();
        assert!(watch.readings_due(), "the first loop reads");
        let mut first = Snapshot::of(vec![gpu(0, "GPU-a", read(1)), gpu(1, "GPU-b", read(2))]);
        watch.keep_readings(&mut first, true);
        assert!(!watch.readings_due(), "not again within READINGS_EVERY");

        let mut lost = gpu(1, "GPU-b", None);
        lost.status = GpuStatus::Lost;
        // GPU 0 is another card now (a new UUID at its index): nothing is carried to it.
        let mut next = Snapshot::of(vec![gpu(0, "GPU-c", None), lost]);
        watch.keep_readings(&mut next, false);
        assert_eq!(next.devices[0].health_readings, None);
        assert_eq!(
            next.devices[1].health_readings, None,
            "a lost GPU gets none"
        );

        let mut same = Snapshot::of(vec![gpu(0, "GPU-a", None), gpu(1, "GPU-b", None)]);
        watch.keep_readings(&mut same, false);
        assert_eq!(same.devices[0].health_readings, read(1));
        assert_eq!(same.devices[1].health_readings, read(2));

        watch.session_closed();
        assert!(watch.readings_due(), "a reopened session reads afresh");
    }
}
