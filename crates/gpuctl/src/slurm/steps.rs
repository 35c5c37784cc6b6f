//! What the prolog and epilog do, as gpuctl-core requests: the prolog is `clear --wait` on
//! the job's GPUs; the epilog is `kill --owner slurm:JOB`, a wait for the job's GPUs to be
//! released, and `reset` of their settings. Each returns what went wrong, as the parts of
//! a drain reason.

use std::time::Duration;

use anyhow::Result;
use gpuctl_core::Snapshot;
use gpuctl_core::act::Signal;
use gpuctl_core::nvml::Place;
use gpuctl_core::plan::Outcome;
use gpuctl_core::reclaim::{
    self, ClearRequest, Cleared, Ending, KillRequest, Killed, ResetRequest, Session,
};
use gpuctl_core::select::OwnerMatch;
use gpuctl_core::snapshot::usage;
use gpuctl_core::units;
use gpuctl_core::verify::GpuState;

use super::Log;
use super::account::Account;
use super::drain::{blame, failure, process_label};
use super::job::Job;

/// Leftovers of earlier runs on the job's GPUs ended, then a wait of at most `wait` for the
/// GPUs to be free.
pub fn prolog(job: &Job, wait: Duration, session: &Session, log: &Log) -> Result<Vec<String>> {
    let request = ClearRequest {
        gpus: job.gpus.clone(),
        wait: Some(wait),
        ending: Ending::default(),
        ..ClearRequest::default()
    };
    let Cleared { outcomes, wait, .. } = reclaim::clear(session, &request)?;
    let ended = outcomes.iter().filter(|o| o.succeeded()).count();
    if ended > 0 {
        log.line(&format!(
            "job {}: ended {ended} leftover{} of earlier runs on GPU {}",
            job.id,
            units::plural(ended, "s"),
            job.gpus.join(",")
        ));
    }
    let not_free: Vec<GpuState> = wait
        .map(|w| w.gpus.into_iter().filter(|g| !g.free).collect())
        .unwrap_or_default();
    let seen = held_by(session, &not_free);
    let problems = blame(&not_free, &outcomes, seen.as_ref());
    // Only a job that starts: a failed prolog's job is requeued, and may get other GPUs.
    if problems.is_empty() {
        record_allocation(job, session, log);
    }
    Ok(problems)
}

/// The job's GPUs, recorded for the watchdog: a GPU on which none of the job's processes
/// runs is reported (`gpuctl_gpu_allocated_unused`). Best effort: said in slurm.log.
fn record_allocation(job: &Job, session: &Session, log: &Log) {
    let Some(dir) = &log.dir else { return };
    let recorded = (|| -> Result<()> {
        let places = session.places(&job.gpus)?.unwrap_or_default();
        let uuids = session.gpus()?.uuids()?;
        let seen = session.look_at(&places);
        let gpus = places
            .iter()
            .filter_map(|place| {
                let uuid = match (place.gpu_instance, &seen) {
                    (Some(gi), Some(seen)) => seen
                        .devices
                        .iter()
                        .find(|d| d.index == place.gpu)?
                        .mig_devices
                        .iter()
                        .find(|m| m.gpu_instance_id == Some(gi))?
                        .uuid
                        .clone()?,
                    _ => uuids.get(place.gpu as usize).cloned().flatten()?,
                };
                Some((place.gpu, uuid))
            })
            .collect();
        let allocation = usage::Allocation {
            job: job.id,
            uid: job.uid,
            gpus,
            since_unix: units::unix_seconds() as u64,
        };
        Ok(usage::record_allocation(dir, &allocation)?)
    })();
    if let Err(error) = recorded {
        log.record(&format!("job {}: its GPUs not recorded: {error:#}", job.id));
    }
}

/// End the job's leftovers (each given `timeout` after SIGTERM), check its GPUs are
/// released, restore their settings.
///
/// A leftover is a process the job names (its cgroup, or its environment) that runs as the
/// job's user: anyone can set SLURM_JOB_ID, and a cgroup in a user's own delegated subtree
/// is not the job's, so another user's process is never ended (nor accounted) as the job's.
pub fn epilog(
    job: &Job,
    timeout: Duration,
    session: &Session,
    account: &mut Account,
) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    let Killed { outcomes, refused } = end_leftovers(job, timeout, session, &mut problems)?;
    account.leftovers(&outcomes);
    for refusal in &refused {
        problems.push(format!("pid {}: {}", refusal.pid, refusal.reason));
    }

    // Resolved once: the reset below names the same GPUs and gets these places back.
    let places = session.places(&job.gpus)?.unwrap_or_default();
    let not_free: Vec<GpuState> = if places.is_empty() {
        Vec::new()
    } else {
        session
            .wait_for_free(Some(&places), timeout, None)?
            .gpus
            .into_iter()
            .filter(|g| !g.free)
            .collect()
    };
    let seen = session.look_at(&places);
    if let Some(seen) = &seen {
        account.allocated(seen, &places);
    }
    problems.extend(blame(&not_free, &outcomes, seen.as_ref()));
    problems.extend(survivors_elsewhere(&outcomes, &not_free));
    if !job.gpus.is_empty() {
        problems.extend(restore_settings(job, session)?);
    }
    Ok(problems)
}

/// The job's leftovers, each given `timeout` after SIGTERM; none, with the reason in
/// `problems`, when the job's user is unknown.
fn end_leftovers(
    job: &Job,
    timeout: Duration,
    session: &Session,
    problems: &mut Vec<String>,
) -> Result<Killed> {
    let killed = match job.uid {
        Some(uid) => {
            let request = KillRequest {
                // The job's cgroups, and its user's environment claims (linuxproc).
                owners: OwnerMatch::job(job.id, Some(uid)),
                uids: vec![uid],
                ending: Ending {
                    signal: Signal::TERM,
                    timeout,
                },
                ..KillRequest::default()
            };
            reclaim::kill(session, &request)?
        }
        None => {
            // slurmd always gives SLURM_JOB_UID: without it, whose processes are the job's
            // cannot be told, and none is ended on a guess.
            problems.push(format!(
                "job {}: its user is unknown (no SLURM_JOB_UID, no SLURM_JOB_USER that \
                 resolves): no process ended",
                job.id
            ));
            None
        }
    };
    Ok(killed.unwrap_or(Killed {
        outcomes: Vec::new(),
        refused: Vec::new(),
    }))
}

/// A leftover that would not die, on a GPU the job was not given (or with none): the GPUs
/// not free are blamed already.
fn survivors_elsewhere(outcomes: &[Outcome], not_free: &[GpuState]) -> Vec<String> {
    let mut problems = Vec::new();
    for outcome in outcomes.iter().filter(|o| !o.succeeded()) {
        let on_reported = outcome
            .target
            .gpus
            .iter()
            .any(|g| not_free.iter().any(|s| s.index == *g));
        if !on_reported {
            problems.push(format!(
                "GPU {}: {} {}",
                units::gpu_list(&outcome.target.gpus),
                process_label(
                    outcome.target.pid,
                    &outcome.target.owner_name(),
                    &outcome.target.command
                ),
                failure(outcome)
            ));
        }
    }
    problems
}

/// The job's GPUs' settings reset; each one not restored.
fn restore_settings(job: &Job, session: &Session) -> Result<Vec<String>> {
    let request = ResetRequest {
        gpus: job.gpus.clone(),
        ..ResetRequest::default()
    };
    let mut problems = Vec::new();
    for gpu in &reclaim::reset(session, &request)?.gpus {
        for item in gpu.items.iter().filter(|i| i.outcome.is_failure()) {
            problems.push(format!(
                "GPU {}: {} not restored ({})",
                gpu.index,
                item.item.label(),
                item.outcome.label()
            ));
        }
    }
    Ok(problems)
}

/// One look at the GPUs that are not free, for who holds them; none when all are.
pub fn held_by(session: &Session, not_free: &[GpuState]) -> Option<Snapshot> {
    let places: Vec<Place> = not_free.iter().map(|g| Place::whole(g.index)).collect();
    session.look_at(&places)
}
