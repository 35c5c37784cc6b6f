//! The per-job account: one JSON line per job in slurm-jobs.jsonl (docs/json.md), with the
//! peaks the watchdog saw and what the epilog had to end.

use std::collections::BTreeMap;
use std::time::SystemTime;

use gpuctl_core::nvml::Place;
use gpuctl_core::plan::Outcome;
use gpuctl_core::snapshot::Snapshot;
use gpuctl_core::snapshot::peaks::{OwnerPeaks, PeakStore};
use serde::Serialize;

use super::drain::scontrol;
use super::job::Job;
use super::{Log, append};

/// Version of the lines of slurm-jobs.jsonl.
pub const ACCOUNT_SCHEMA: u32 = 1;

/// One job's GPU memory account, a line of slurm-jobs.jsonl.
#[derive(Debug, Serialize)]
struct AccountLine {
    schema: u32,
    time: String,
    node: String,
    job: u64,
    user: Option<String>,
    gpus: Vec<AccountGpu>,
    /// Where the peaks come from: `watchdog` (it saw the job), or `none` (no watchdog ran,
    /// or the job ended before its first look).
    peaks_from: &'static str,
    leftovers_ended: usize,
    reclaimed_bytes: u64,
    /// `clean`, or `drained` with the reason.
    outcome: &'static str,
    reason: Option<String>,
}

/// One job's peaks from its two keys. Each is the highest sum one look saw; seen apart,
/// the larger per GPU is what is known to have been held at once.
fn merge(a: Option<OwnerPeaks>, b: Option<OwnerPeaks>) -> Option<OwnerPeaks> {
    match (a, b) {
        (Some(mut a), Some(b)) => {
            for (uuid, peak) in b.gpus {
                let mine = a.gpus.entry(uuid).or_default();
                *mine = (*mine).max(peak);
            }
            a.user = a.user.or(b.user);
            a.first_seen_unix = a.first_seen_unix.min(b.first_seen_unix);
            a.last_seen_unix = a.last_seen_unix.max(b.last_seen_unix);
            Some(a)
        }
        (a, b) => a.or(b),
    }
}

#[derive(Debug, Serialize)]
struct AccountGpu {
    index: Option<u32>,
    uuid: String,
    /// The most memory the job's processes held on it at once, as the watchdog saw.
    peak_bytes: Option<u64>,
}

pub struct Account {
    job: Job,
    /// Index and UUID of each GPU the job was given.
    allocated: Vec<(u32, String)>,
    leftovers_ended: usize,
    reclaimed_bytes: u64,
}

impl Account {
    pub fn new(job: &Job) -> Account {
        Account {
            job: job.clone(),
            allocated: Vec::new(),
            leftovers_ended: 0,
            reclaimed_bytes: 0,
        }
    }

    pub fn leftovers(&mut self, outcomes: &[Outcome]) {
        for outcome in outcomes.iter().filter(|o| o.succeeded()) {
            self.leftovers_ended += 1;
            self.reclaimed_bytes += outcome.target.used_bytes.unwrap_or(0);
        }
    }

    /// The job's GPUs, by index and UUID (a MIG instance's own UUID), from `seen`.
    pub fn allocated(&mut self, seen: &Snapshot, places: &[Place]) {
        for place in places {
            let Some(gpu) = seen.devices.iter().find(|d| d.index == place.gpu) else {
                continue;
            };
            let uuid = match place.gpu_instance {
                None => gpu.uuid.clone(),
                Some(gi) => gpu
                    .mig_devices
                    .iter()
                    .find(|m| m.gpu_instance_id == Some(gi))
                    .and_then(|m| m.uuid.clone()),
            };
            if let Some(uuid) = uuid {
                self.allocated.push((place.gpu, uuid));
            }
        }
    }

    /// Takes the job's peaks from the watchdog's store and writes the line: to
    /// slurm-jobs.jsonl in the state directory, and to the job's AdminComment where Slurm
    /// accepts it.
    ///
    /// The job's peaks are those the watchdog kept under `slurm:ID` (processes a job cgroup
    /// names, which only slurmstepd makes) and under `slurm:ID@UID` for the job's own uid
    /// (processes only their environment ties to the job): another user's process that
    /// claims the job by its environment is kept under its own uid and never taken here.
    pub fn finish(self, log: &Log, reason: Option<&str>) {
        let peaks: Option<OwnerPeaks> = log.dir.as_deref().and_then(|dir| {
            let store = PeakStore::in_dir(dir);
            let take = |key: &str| store.take_owner(key).ok().flatten();
            let named = take(&self.job.owner_key());
            let claimed = self.job.claim_key().and_then(|key| take(&key));
            merge(named, claimed)
        });
        let mut by_uuid: BTreeMap<String, u64> =
            peaks.as_ref().map(|p| p.gpus.clone()).unwrap_or_default();
        let mut gpus: Vec<AccountGpu> = self
            .allocated
            .iter()
            .map(|(index, uuid)| AccountGpu {
                index: Some(*index),
                uuid: uuid.clone(),
                peak_bytes: by_uuid.remove(uuid).or(peaks.as_ref().map(|_| 0)),
            })
            .collect();
        // GPUs the job used without being given them (a job that ignored
        // CUDA_VISIBLE_DEVICES): accounted too.
        gpus.extend(by_uuid.into_iter().map(|(uuid, peak)| AccountGpu {
            index: None,
            uuid,
            peak_bytes: Some(peak),
        }));
        let line = AccountLine {
            schema: ACCOUNT_SCHEMA,
            time: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
            node: self.job.node.clone(),
            job: self.job.id,
            user: self
                .job
                .user
                .clone()
                .or_else(|| peaks.as_ref().and_then(|p| p.user.clone())),
            gpus,
            peaks_from: if peaks.is_some() { "watchdog" } else { "none" },
            leftovers_ended: self.leftovers_ended,
            reclaimed_bytes: self.reclaimed_bytes,
            outcome: if reason.is_some() { "drained" } else { "clean" },
            reason: reason.map(String::from),
        };
        let Ok(text) = serde_json::to_string(&line) else {
            return;
        };
        if let Some(dir) = &log.dir {
            let path = dir.join("slurm-jobs.jsonl");
            if let Err(error) = append(&path, &text) {
                log.line(&format!(
                    "job {}: account not written to {}: {error}",
                    self.job.id,
                    path.display()
                ));
            }
        }
        // Slurm 22.05 refuses to update a job that has finished, which an epilog's job
        // has; later versions may take it. The log file is the record either way.
        let comment = format!("AdminComment={text}");
        let _ = scontrol(&["update", &format!("JobId={}", self.job.id), &comment]);
    }
}
