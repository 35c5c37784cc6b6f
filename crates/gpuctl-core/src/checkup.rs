//! GPU health as the readers show it (`gpuctl health`, `info`, Python): a snapshot's health
//! readings joined with the watchdog's Xid log, the admins' acknowledgements and the
//! configuration's Xid catalog, judged by [`crate::health::verdict`], and the
//! `gpuctl health --json` document.

use serde::Serialize;

use crate::config::{self, Loaded};
use crate::error::{CoreError, Result};
use crate::health::log::{Acks, XidLog};
use crate::health::{
    Action, Catalog, Cause, Facts, HEALTH_SCHEMA, Readings, Verdict, XidProcess, XidRule, verdict,
};
use crate::snapshot::{GpuSnapshot, GpuStatus, Snapshot};

/// What a verdict is judged with besides the GPU's own readings: the Xid catalog in force,
/// the watchdog's Xid log and the admins' acknowledgements. The one place the three are put
/// together: `info`, `health`, the Slurm health check and epilog, and the watchdog ask it.
#[derive(Debug, Clone, Default)]
pub struct Judge {
    catalog: Catalog,
    log: XidLog,
    acks: Acks,
}

/// An application Xid (`restart_app`) that hit a job's processes, for the epilog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobXid {
    pub xid: u32,
    pub meaning: String,
    pub action: Action,
    /// The job's processes on the GPU then; never another user's claim on the job.
    pub processes: Vec<XidProcess>,
}

impl Judge {
    /// The system configuration's Xid catalog (`[health]`), and the Xid log and
    /// acknowledgements in the watchdog's state directory (where it is readable).
    pub fn load(loaded: Option<&Loaded>) -> Judge {
        let catalog = loaded.map(Loaded::xid_catalog).unwrap_or_default();
        let (log, acks) = config::watchdog_state_dir(loaded)
            .map(|dir| (XidLog::read(&dir), Acks::read(&dir)))
            .unwrap_or_default();
        Judge { catalog, log, acks }
    }

    /// The catalog's rule for `xid` (the configuration's override, else NVIDIA's).
    pub fn rule(&self, xid: u32) -> XidRule {
        self.catalog.rule(xid)
    }

    /// The configuration changed (the watchdog's reload).
    pub fn set_catalog(&mut self, catalog: Catalog) {
        self.catalog = catalog;
    }

    /// The acknowledgements as last read (the watchdog reads them every loop).
    pub fn set_acks(&mut self, acks: Acks) {
        self.acks = acks;
    }

    pub fn acks(&self) -> &Acks {
        &self.acks
    }

    pub fn log(&self) -> &XidLog {
        &self.log
    }

    /// The log, for the watchdog, which records the Xids and forgets those before a reset.
    pub fn log_mut(&mut self) -> &mut XidLog {
        &mut self.log
    }

    /// The application Xids on GPU `uuid` that hit job `job_id`'s processes (its cgroup,
    /// or an environment claim of its user `job_uid`), oldest first.
    pub fn job_xids(&self, uuid: &str, job_id: u64, job_uid: Option<u32>) -> Vec<JobXid> {
        self.log
            .for_gpu(uuid)
            .iter()
            .filter_map(|record| {
                let rule = self.rule(record.xid);
                if rule.action != Action::RestartApp {
                    return None;
                }
                let processes: Vec<XidProcess> = record
                    .processes
                    .iter()
                    .filter(|p| p.is_of_job(job_id, job_uid))
                    .cloned()
                    .collect();
                (!processes.is_empty()).then_some(JobXid {
                    xid: record.xid,
                    meaning: rule.meaning,
                    action: rule.action,
                    processes,
                })
            })
            .collect()
    }

    /// The verdict of one GPU: a lost GPU needs a node reboot; one whose health was not
    /// read (not answering, or not asked) has none.
    pub fn verdict_of(&self, gpu: &GpuSnapshot) -> Option<Verdict> {
        if gpu.status == GpuStatus::Lost {
            return Some(Verdict::lost());
        }
        let readings = gpu.health_readings.as_ref()?;
        let mut facts = Facts::from_readings(readings);
        if let Some(uuid) = gpu.uuid.as_deref() {
            facts.xids = self.log.for_gpu(uuid).to_vec();
            facts.acknowledged_unix = self.acks.get(uuid);
        }
        facts.running = running(&facts);
        Some(verdict(&facts, &self.catalog))
    }

    /// Sets each GPU's `health`.
    pub fn annotate(&self, snapshot: &mut Snapshot) {
        for gpu in &mut snapshot.devices {
            gpu.health = self.verdict_of(gpu);
        }
    }
}

/// Which of the processes the Xids name still run, by pid and start time.
fn running(facts: &Facts) -> Vec<(u32, Option<u64>)> {
    let mut pids: Vec<u32> = facts
        .xids
        .iter()
        .flat_map(|x| x.processes.iter().map(|p| p.pid))
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids.into_iter()
        .filter_map(|pid| Some((pid, Some(crate::host::start_ticks(pid)?))))
        .collect()
}

/// One GPU in the `gpuctl health --json` document.
#[derive(Debug, Clone, Serialize)]
pub struct GpuHealth {
    pub index: u32,
    pub uuid: Option<String>,
    /// `null` where the GPU could not be read (see `error`).
    pub action: Option<Action>,
    pub causes: Vec<Cause>,
    /// What NVML said (absent for a lost GPU or one not read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub readings: Option<Readings>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The `gpuctl health --json` document.
#[derive(Debug, Clone, Serialize)]
pub struct HealthDocument {
    pub schema: u32,
    pub timestamp: String,
    pub gpus: Vec<GpuHealth>,
}

impl HealthDocument {
    /// Whether some GPU needs an action (its action is not `none`).
    pub fn needs_action(&self) -> bool {
        self.gpus
            .iter()
            .any(|g| g.action.is_some_and(|a| a != Action::None))
    }

    /// The GPUs that could not be read, with why.
    pub fn unread(&self) -> impl Iterator<Item = &GpuHealth> {
        self.gpus.iter().filter(|g| g.action.is_none())
    }
}

/// Records an acknowledgement of the Xids of GPUs `indices` (what `--ack` names, resolved
/// by the session), now, in the watchdog's state directory (`gpuctl health --ack`).
pub fn acknowledge(loaded: Option<&Loaded>, indices: &[u32], snapshot: &Snapshot) -> Result<()> {
    let dir = config::watchdog_state_dir(loaded).ok_or_else(|| {
        CoreError::BadSetting(
            "--ack needs the watchdog's state directory, which the configuration disables \
             (watchdog.state_dir = \"\")"
                .into(),
        )
    })?;
    let now = crate::units::unix_whole_seconds();
    for &index in indices {
        let uuid = snapshot
            .devices
            .iter()
            .find(|g| g.index == index)
            .and_then(|g| g.uuid.clone())
            .ok_or_else(|| {
                CoreError::BadSetting(format!(
                    "GPU {index} cannot be acknowledged: its UUID cannot be read"
                ))
            })?;
        Acks::acknowledge(&dir, &uuid, now).map_err(|source| CoreError::Write {
            path: Acks::path(&dir),
            hint: match source.kind() {
                std::io::ErrorKind::PermissionDenied => {
                    " (the watchdog's state directory is root's: run as root)"
                }
                _ => "",
            },
            source,
        })?;
    }
    Ok(())
}

/// The document of a snapshot whose GPUs were judged.
pub fn document(snapshot: &Snapshot) -> HealthDocument {
    let gpus = snapshot
        .devices
        .iter()
        .map(|gpu| {
            let (action, causes) = match &gpu.health {
                Some(v) => (Some(v.action), v.causes.clone()),
                None => (None, Vec::new()),
            };
            GpuHealth {
                index: gpu.index,
                uuid: gpu.uuid.clone(),
                action,
                causes,
                readings: gpu.health_readings.clone(),
                error: match gpu.status {
                    GpuStatus::Ok => None,
                    _ => gpu.error.clone(),
                },
            }
        })
        .collect();
    HealthDocument {
        schema: HEALTH_SCHEMA,
        timestamp: humantime::format_rfc3339_seconds(snapshot.taken_at).to_string(),
        gpus,
    }
}
