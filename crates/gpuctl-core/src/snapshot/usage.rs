//! Each Slurm job's GPU usage as the watchdog measured it, for the job's epilog (its summary
//! line and account, as jobstats gives them): memory held and held idle (byte-seconds), the
//! time all its processes were idle, and the mean SM utilization of its processes. Kept per
//! owner key (`slurm:123`, and `slurm:123@UID` for processes only their environment ties to
//! the job, as the peaks are) in the state directory, bounded like peaks.json.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// The file in the state directory.
pub const FILE_NAME: &str = "slurm-usage.json";

/// The most jobs kept: past it, those seen least recently are dropped.
pub const MAX_JOBS: usize = 4096;

/// A job not seen for longer than this is dropped (its epilog never came).
pub const RETENTION_SECS: u64 = 7 * 24 * 3600;

/// A file larger than this is not read (and is replaced, bounded, at the next write).
pub const MAX_FILE_BYTES: u64 = 8 << 20;

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct JobUsage {
    /// GPU memory its processes held, over time.
    pub held_byte_seconds: f64,
    /// Of it, what was held while their SM was measured under `[idle] util_below`.
    pub idle_byte_seconds: f64,
    /// Time in which every process of the job on a GPU was measured idle.
    pub idle_seconds: f64,
    /// SM utilization × time, over the process-time measured: the mean is their ratio.
    pub sm_pct_seconds: f64,
    pub measured_seconds: f64,
    pub last_seen_unix: u64,
}

impl JobUsage {
    /// The mean SM utilization of its processes, where any was measured.
    pub fn mean_sm_pct(&self) -> Option<f64> {
        (self.measured_seconds > 0.0).then(|| self.sm_pct_seconds / self.measured_seconds)
    }

    /// Both keys' usage as one (a job's named processes and its own user's claims).
    pub fn merge(self, other: JobUsage) -> JobUsage {
        JobUsage {
            held_byte_seconds: self.held_byte_seconds + other.held_byte_seconds,
            idle_byte_seconds: self.idle_byte_seconds + other.idle_byte_seconds,
            idle_seconds: self.idle_seconds.max(other.idle_seconds),
            sm_pct_seconds: self.sm_pct_seconds + other.sm_pct_seconds,
            measured_seconds: self.measured_seconds + other.measured_seconds,
            last_seen_unix: self.last_seen_unix.max(other.last_seen_unix),
        }
    }
}

/// The usage kept in `dir` (none for a missing, oversized or unreadable file).
pub fn read(dir: &Path) -> BTreeMap<String, JobUsage> {
    let path = dir.join(FILE_NAME);
    let fits = std::fs::metadata(&path).is_ok_and(|m| m.len() <= MAX_FILE_BYTES);
    if !fits {
        return BTreeMap::new();
    }
    std::fs::read(&path)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

/// Drops the jobs not seen since `now_unix - RETENTION_SECS`, and past [`MAX_JOBS`] those
/// seen least recently.
pub fn bound(jobs: &mut BTreeMap<String, JobUsage>, now_unix: u64) {
    jobs.retain(|_, u| now_unix.saturating_sub(u.last_seen_unix) <= RETENTION_SECS);
    if jobs.len() > MAX_JOBS {
        let mut seen: Vec<u64> = jobs.values().map(|u| u.last_seen_unix).collect();
        seen.sort_unstable_by(|a, b| b.cmp(a));
        let oldest_kept = seen[MAX_JOBS - 1];
        jobs.retain(|_, u| u.last_seen_unix >= oldest_kept);
        while jobs.len() > MAX_JOBS {
            let Some(key) = jobs
                .iter()
                .min_by_key(|(_, u)| u.last_seen_unix)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            jobs.remove(&key);
        }
    }
}

/// Writes `jobs` to `dir`, replacing the file whole.
pub fn write(dir: &Path, jobs: &BTreeMap<String, JobUsage>) -> io::Result<()> {
    let text = serde_json::to_vec(jobs).map_err(io::Error::other)?;
    crate::files::replace(&dir.join(FILE_NAME), &text, 0o644, false)
}

/// The directory of the prologs' records of each job's GPUs, one file per job.
pub const ALLOCATIONS_DIR: &str = "slurm-allocations";

/// The most records read: a node runs a few jobs at once.
pub const MAX_ALLOCATIONS: usize = 4096;

/// A job's GPUs as its prolog recorded them: the watchdog reports each GPU on which none of
/// the job's processes runs (`gpuctl_gpu_allocated_unused`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    pub job: u64,
    /// The job's user: processes of this uid that only their environment ties to the job
    /// count as the job's.
    pub uid: Option<u32>,
    /// Index and UUID of each GPU (a MIG instance's own UUID for a slice).
    pub gpus: Vec<(u32, String)>,
    pub since_unix: u64,
}

/// Records `allocation` (the prolog): one file per job, replaced whole.
pub fn record_allocation(dir: &Path, allocation: &Allocation) -> io::Result<()> {
    let dir = dir.join(ALLOCATIONS_DIR);
    std::fs::create_dir_all(&dir)?;
    let text = serde_json::to_vec(allocation).map_err(io::Error::other)?;
    crate::files::replace(
        &dir.join(format!("{}.json", allocation.job)),
        &text,
        0o644,
        false,
    )
}

/// Removes job `job`'s record (the epilog); a missing one is no error.
pub fn remove_allocation(dir: &Path, job: u64) -> io::Result<()> {
    match std::fs::remove_file(dir.join(ALLOCATIONS_DIR).join(format!("{job}.json"))) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
}

/// The records in `dir` (at most [`MAX_ALLOCATIONS`]; a file that is not a record is
/// skipped).
pub fn allocations(dir: &Path) -> Vec<Allocation> {
    let Ok(entries) = std::fs::read_dir(dir.join(ALLOCATIONS_DIR)) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
        .take(MAX_ALLOCATIONS)
        .filter(|e| {
            e.metadata()
                .is_ok_and(|m| m.is_file() && m.len() <= 64 << 10)
        })
        .filter_map(|e| serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jobs_allocation_is_recorded_read_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let allocation = Allocation {
            job: 12,
            uid: Some(1000),
            gpus: vec![(0, "GPU-a".into()), (3, "MIG-b".into())],
            since_unix: 5,
        };
        assert!(allocations(dir.path()).is_empty());
        record_allocation(dir.path(), &allocation).unwrap();
        std::fs::write(dir.path().join(ALLOCATIONS_DIR).join("junk.json"), "x").unwrap();
        assert_eq!(allocations(dir.path()), vec![allocation]);
        remove_allocation(dir.path(), 12).unwrap();
        remove_allocation(dir.path(), 12).unwrap();
        assert!(allocations(dir.path()).is_empty());
    }

    fn seen(at: u64) -> JobUsage {
        JobUsage {
            last_seen_unix: at,
            ..JobUsage::default()
        }
    }

    #[test]
    fn the_file_is_bounded_in_age_and_count_and_read_back() {
        let now = 10 * RETENTION_SECS;
        let mut jobs: BTreeMap<String, JobUsage> = (0..MAX_JOBS as u64 + 10)
            .map(|i| (format!("slurm:{i}"), seen(now - i)))
            .collect();
        jobs.insert("slurm:old".into(), seen(now - RETENTION_SECS - 1));
        bound(&mut jobs, now);
        assert_eq!(jobs.len(), MAX_JOBS);
        assert!(jobs.contains_key("slurm:0") && !jobs.contains_key("slurm:old"));
        assert!(!jobs.contains_key(&format!("slurm:{}", MAX_JOBS + 5)));
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &jobs).unwrap();
        assert_eq!(read(dir.path()), jobs);
        std::fs::write(dir.path().join(FILE_NAME), "{broken").unwrap();
        assert!(read(dir.path()).is_empty());
    }

    #[test]
    fn a_jobs_two_keys_merge_and_the_mean_is_over_the_time_measured() {
        let named = JobUsage {
            held_byte_seconds: 100.0,
            idle_byte_seconds: 40.0,
            idle_seconds: 30.0,
            sm_pct_seconds: 500.0,
            measured_seconds: 10.0,
            last_seen_unix: 5,
        };
        let claimed = JobUsage {
            held_byte_seconds: 50.0,
            idle_byte_seconds: 50.0,
            idle_seconds: 10.0,
            sm_pct_seconds: 0.0,
            measured_seconds: 10.0,
            last_seen_unix: 7,
        };
        let both = named.merge(claimed);
        assert_eq!(both.held_byte_seconds, 150.0);
        assert_eq!(both.idle_byte_seconds, 90.0);
        assert_eq!(both.idle_seconds, 30.0);
        assert_eq!(both.mean_sm_pct(), Some(25.0));
        assert_eq!(both.last_seen_unix, 7);
        assert_eq!(JobUsage::default().mean_sm_pct(), None);
    }
}
