//! The per-job account: one JSON line per job in slurm-jobs.jsonl (docs/json.md), with the
//! peaks the watchdog saw and what the epilog had to end.

use std::collections::BTreeMap;
use std::time::SystemTime;

use gpuctl_core::classify::idle::short_duration;
use gpuctl_core::nvml::Place;
use gpuctl_core::plan::Outcome;
use gpuctl_core::snapshot::Snapshot;
use gpuctl_core::snapshot::peaks::{OwnerPeaks, PeakStore};
use gpuctl_core::snapshot::usage::{self, JobUsage};
use gpuctl_core::units;
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
    /// What the watchdog measured of the job's use of its GPUs, where it saw the job.
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<AccountUsage>,
}

/// The job's use of its GPUs as the watchdog measured it (slurm-usage.json), as jobstats
/// summarizes a job.
#[derive(Debug, Serialize)]
struct AccountUsage {
    /// Mean SM utilization of its processes over the time it was measured.
    mean_sm_pct: Option<f64>,
    /// Time in which every process of the job was idle (SM under `[idle] util_below`).
    idle_seconds: u64,
    held_gib_hours: f64,
    idle_gib_hours: f64,
}

impl AccountUsage {
    fn of(usage: &JobUsage) -> AccountUsage {
        let gib_hours = |byte_seconds: f64| {
            let value = byte_seconds / 3600.0 / (1u64 << 30) as f64;
            (value * 1000.0).round() / 1000.0
        };
        AccountUsage {
            mean_sm_pct: usage.mean_sm_pct().map(|pct| (pct * 10.0).round() / 10.0),
            idle_seconds: usage.idle_seconds as u64,
            held_gib_hours: gib_hours(usage.held_byte_seconds),
            idle_gib_hours: gib_hours(usage.idle_byte_seconds),
        }
    }
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
        let peaks = self.take_peaks(log);
        let usage = self.usage(log);
        let gpus = self.gpus(peaks.as_ref());
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
            usage: usage.as_ref().map(AccountUsage::of),
        };
        log.record(&summary(&line));
        if let Some(dir) = &log.dir
            && let Err(error) = usage::remove_allocation(dir, self.job.id)
        {
            log.record(&format!(
                "job {}: its GPUs' record not removed: {error}",
                self.job.id
            ));
        }
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

    /// The job's peaks, taken from the watchdog's store (see [`Account::finish`]).
    fn take_peaks(&self, log: &Log) -> Option<OwnerPeaks> {
        log.dir.as_deref().and_then(|dir| {
            let store = PeakStore::in_dir(dir);
            let take = |key: &str| store.take_owner(key).ok().flatten();
            let named = take(&self.job.owner_key());
            let claimed = self.job.claim_key().and_then(|key| take(&key));
            merge(named, claimed)
        })
    }

    /// The same two keys' usage, as the watchdog measured it.
    fn usage(&self, log: &Log) -> Option<JobUsage> {
        log.dir.as_deref().and_then(|dir| {
            let jobs = usage::read(dir);
            let named = jobs.get(&self.job.owner_key()).copied();
            let claimed = (self.job.claim_key()).and_then(|key| jobs.get(&key).copied());
            match (named, claimed) {
                (Some(a), Some(b)) => Some(a.merge(b)),
                (a, b) => a.or(b),
            }
        })
    }

    /// The GPUs given to the job, each with its peak where the watchdog kept peaks, then
    /// those it used without being given them.
    fn gpus(&self, peaks: Option<&OwnerPeaks>) -> Vec<AccountGpu> {
        let mut by_uuid: BTreeMap<String, u64> = peaks.map(|p| p.gpus.clone()).unwrap_or_default();
        let mut gpus: Vec<AccountGpu> = self
            .allocated
            .iter()
            .map(|(index, uuid)| AccountGpu {
                index: Some(*index),
                uuid: uuid.clone(),
                peak_bytes: by_uuid.remove(uuid).or(peaks.map(|_| 0)),
            })
            .collect();
        // GPUs the job used without being given them (a job that ignored
        // CUDA_VISIBLE_DEVICES): accounted too.
        gpus.extend(by_uuid.into_iter().map(|(uuid, peak)| AccountGpu {
            index: None,
            uuid,
            peak_bytes: Some(peak),
        }));
        gpus
    }
}

/// The job's summary line in slurm.log: "job 77: 2 GPUs, mean SM 34.0%, peak 40.0 GiB on a
/// GPU, idle 3h12m, 12.300 GiB-h held idle of 40.100 GiB-h held".
fn summary(line: &AccountLine) -> String {
    let gpus = line.gpus.len();
    let mut text = format!("job {}: {gpus} GPU{}", line.job, units::plural(gpus, "s"));
    match line.gpus.iter().filter_map(|g| g.peak_bytes).max() {
        Some(peak) => text.push_str(&format!(", peak {} on a GPU", units::bytes(peak))),
        None => text.push_str(", peak not seen (no watchdog look)"),
    }
    match &line.usage {
        Some(usage) => {
            if let Some(pct) = usage.mean_sm_pct {
                text.push_str(&format!(", mean SM {pct:.1}%"));
            }
            text.push_str(&format!(
                ", idle {}, {:.3} GiB-h held idle of {:.3} GiB-h held",
                short_duration(usage.idle_seconds),
                usage.idle_gib_hours,
                usage.held_gib_hours
            ));
        }
        None => text.push_str(", usage not measured (no watchdog look)"),
    }
    text
}

/// `gpuctl slurm account`: the accounts in slurm-jobs.jsonl (`job`: only that job's), as a
/// table or, with `json`, one document `{"schema": 1, "jobs": [line, ...]}`.
pub fn show(job: Option<u64>, json: bool) -> anyhow::Result<crate::Exit> {
    use gpuctl_core::session::{Session, SessionOptions};
    let session = Session::open_with(&SessionOptions::config_only())?;
    let Some(dir) = gpuctl_core::config::watchdog_state_dir(Some(session.loaded())) else {
        anyhow::bail!("watchdog.state_dir is \"\": no job accounts are kept");
    };
    let path = dir.join("slurm-jobs.jsonl");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(error) => anyhow::bail!("cannot read {}: {error}", path.display()),
    };
    let lines: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|line| job.is_none_or(|job| line["job"] == job))
        .collect();
    if let Some(job) = job.filter(|_| lines.is_empty()) {
        eprintln!(
            "gpuctl: no account for job {job} in {} (its epilog has not run here)",
            path.display()
        );
        return Ok(crate::Exit::Failed);
    }
    if json {
        let doc = serde_json::json!({ "schema": ACCOUNT_SCHEMA, "jobs": lines });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(crate::Exit::Ok);
    }
    let header = [
        "JOB",
        "USER",
        "NODE",
        "ENDED",
        "GPUS",
        "PEAK",
        "MEAN SM",
        "IDLE",
        "IDLE GiB-h",
        "HELD GiB-h",
        "OUTCOME",
    ];
    let rows: Vec<Vec<String>> = lines.iter().map(account_row).collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        padded.join("  ").trim_end().to_string()
    };
    println!("{}", line(header.map(String::from).to_vec()));
    for row in rows {
        println!("{}", line(row));
    }
    Ok(crate::Exit::Ok)
}

/// One account line as a table row; what the line lacks is "-".
fn account_row(line: &serde_json::Value) -> Vec<String> {
    let dash = || "-".to_string();
    let text = |v: &serde_json::Value| {
        v.as_str()
            .map(|s| gpuctl_core::text::safe(s).into_owned())
            .unwrap_or_else(dash)
    };
    let gpus = line["gpus"].as_array().map_or(0, Vec::len);
    let peak = line["gpus"]
        .as_array()
        .and_then(|gpus| gpus.iter().filter_map(|g| g["peak_bytes"].as_u64()).max())
        .map_or_else(dash, units::bytes);
    let usage = &line["usage"];
    let number = |v: &serde_json::Value, decimals: usize| {
        v.as_f64().map_or_else(dash, |n| format!("{n:.decimals$}"))
    };
    vec![
        line["job"].to_string(),
        text(&line["user"]),
        text(&line["node"]),
        text(&line["time"]),
        gpus.to_string(),
        peak,
        usage["mean_sm_pct"]
            .as_f64()
            .map_or_else(dash, |pct| format!("{pct:.1}%")),
        usage["idle_seconds"]
            .as_u64()
            .map_or_else(dash, short_duration),
        number(&usage["idle_gib_hours"], 3),
        number(&usage["held_gib_hours"], 3),
        match line["reason"].as_str() {
            Some(reason) => format!(
                "{}: {}",
                text(&line["outcome"]),
                gpuctl_core::text::safe(reason)
            ),
            None => text(&line["outcome"]),
        },
    ]
}
