//! GPU health for Slurm: the health check drains a node whose GPU needs a reset, a reboot or
//! a drain (never for `restart_app`), with a reason naming the GPU, the action and the
//! causes, and knows such a reason again to resume the node once every verdict is `none`;
//! the epilog names the job in slurm.log where an application Xid hit its GPU.

use anyhow::Result;
use gpuctl_core::config::{self, Loaded};
use gpuctl_core::health::Action;
use gpuctl_core::health::log::XidLog;
use gpuctl_core::reclaim::Session;
use gpuctl_core::session::Reader;
use gpuctl_core::snapshot::SnapshotOptions;

use super::drain::REASON_PREFIX;

/// For each GPU that needs a GPU-level action: "GPU 1 needs a reset: row remap pending;
/// Xid 64 under job 812". Empty when every GPU is fit.
pub fn needs(session: &Session) -> Result<Vec<String>> {
    let snapshot = Reader::new(SnapshotOptions::info(None))
        .judging_health(&session.loaded)
        .take(&session.gpus)?;
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

/// The epilog's lines for the application Xids the watchdog saw hit job `job_id`'s
/// processes on its GPUs: "job 812: Xid 13 (Graphics Engine Exception) on GPU 0 hit pid
/// 4242 (python3 train.py): restart_app".
pub fn job_xids(
    loaded: Option<&Loaded>,
    snapshot_uuids: &[(u32, String)],
    job_id: u64,
) -> Vec<String> {
    let Some(dir) = config::watchdog_state_dir(loaded) else {
        return Vec::new();
    };
    let log = XidLog::read(&dir);
    let catalog = loaded.map(Loaded::xid_catalog).unwrap_or_default();
    let mut lines = Vec::new();
    for (index, uuid) in snapshot_uuids {
        for record in log.for_gpu(uuid) {
            let hit: Vec<String> = record
                .processes
                .iter()
                .filter(|p| p.owner.as_deref().is_some_and(|o| is_job(o, job_id)))
                .map(|p| match &p.command {
                    Some(command) => format!("pid {} ({command})", p.pid),
                    None => format!("pid {}", p.pid),
                })
                .collect();
            if hit.is_empty() {
                continue;
            }
            let rule = catalog.rule(record.xid);
            if rule.action != Action::RestartApp {
                continue;
            }
            lines.push(format!(
                "job {job_id}: Xid {} ({}) on GPU {index} hit {}: {}",
                record.xid,
                rule.meaning,
                hit.join(", "),
                rule.action
            ));
        }
    }
    lines
}

/// `slurm:812` or `slurm:812@1000` (a job only the environment names) is job 812.
fn is_job(owner: &str, job_id: u64) -> bool {
    owner
        .strip_prefix("slurm:")
        .and_then(|rest| rest.split('@').next())
        .is_some_and(|id| id == job_id.to_string())
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

    #[test]
    fn owners_name_their_job() {
        assert!(is_job("slurm:812", 812));
        assert!(is_job("slurm:812@1000", 812));
        assert!(!is_job("slurm:8120", 812));
        assert!(!is_job("unit:slurm:812", 812));
    }
}
