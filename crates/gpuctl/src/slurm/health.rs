//! GPU health for Slurm: the health check drains a node whose GPU needs a reset, a reboot or
//! a drain (never for `restart_app`), with a reason naming the GPU, the action and the
//! causes, and knows such a reason again to resume the node once every verdict is `none`;
//! the epilog names the job in slurm.log where an application Xid hit its GPU.

use anyhow::Result;
use gpuctl_core::checkup::Judge;
use gpuctl_core::config::Loaded;
use gpuctl_core::reclaim::Session;
use gpuctl_core::snapshot::SnapshotOptions;

use super::drain::REASON_PREFIX;
use super::job::Job;

/// For each GPU that needs a GPU-level action: "GPU 1 needs a reset: row remap pending;
/// Xid 64 under job 812". Empty when every GPU is fit.
pub fn needs(session: &Session) -> Result<Vec<String>> {
    let mut reader = session
        .plain_reader(SnapshotOptions::info(None))
        .judging_health(session.loaded());
    let snapshot = session.take(&mut reader)?;
    Ok(snapshot
        .devices
        .iter()
        .filter_map(|gpu| {
            let verdict = gpu.health.as_ref().filter(|v| v.action.drains())?;
            Some(format!("GPU {} {}", gpu.index, verdict.summary()?))
        })
        .collect())
}

/// Whether a drain reason is the health check's own ("gpuctl: GPU 1 needs a reset: ..."),
/// as opposed to one for memory a job left held.
pub fn is_health_reason(reason: &str) -> bool {
    let Some(rest) = reason.strip_prefix(REASON_PREFIX) else {
        return false;
    };
    let Some(rest) = rest.trim_start().strip_prefix("GPU ") else {
        return false;
    };
    let digits = rest.chars().take_while(char::is_ascii_digit).count();
    digits > 0 && rest[digits..].starts_with(" needs ")
}

/// The epilog's lines for the application Xids the watchdog saw hit job `job`'s processes
/// on its GPUs: "job 812: Xid 13 (Graphics Engine Exception) on GPU 0 hit pid 4242 (alice,
/// slurm:812, python3 train.py): restart_app". A process only its environment ties to the
/// job is the job's only where it runs as the job's user.
pub fn job_xids(loaded: &Loaded, snapshot_uuids: &[(u32, String)], job: &Job) -> Vec<String> {
    let judge = Judge::load(Some(loaded));
    let mut lines = Vec::new();
    for (index, uuid) in snapshot_uuids {
        for hit in judge.job_xids(uuid, job.id, job.uid) {
            let processes: Vec<String> = hit.processes.iter().map(|p| p.to_string()).collect();
            lines.push(format!(
                "job {}: Xid {} ({}) on GPU {index} hit {}: {}",
                job.id,
                hit.xid,
                hit.meaning,
                processes.join(", "),
                hit.action
            ));
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_reasons_are_told_from_memory_reasons() {
        assert!(is_health_reason(
            "gpuctl: GPU 1 needs a reset: row remap pending; Xid 64 under job 812"
        ));
        assert!(is_health_reason(
            "gpuctl: GPU 12 needs a node reboot: GPU lost"
        ));
        assert!(!is_health_reason(
            "gpuctl: GPU 1 (GPU-ab): 6 GiB held by pid 7 (alice, python3)"
        ));
        assert!(!is_health_reason(
            "GPU 1 needs a reset: an admin wrote this"
        ));
        assert!(!is_health_reason("gpuctl: GPU x needs a reset"));
    }
}
