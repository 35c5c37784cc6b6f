//! Processes holding a GPU's device file that NVML does not list on it: what each is
//! suspected to be, and whether `clear --holders` may end it.
//!
//! Every CUDA context and every NVML client opens the device files, so most such holders
//! are innocent: monitoring tools (nvidia-smi, DCGM, exporters), and processes NVML lists
//! on another GPU (CUDA opens every visible GPU's file). What is left is where memory no
//! listed process accounts for may be: a process of a job that NVML should have listed (a
//! zombie whose context is being torn down, a process in a container's PID namespace), or
//! one nobody can place.

use super::{Facts, Finding, Kind, Verdict};
use crate::act::Identity;
use crate::host::ProcState;
use crate::snapshot::totals::{By, group_of};
use crate::snapshot::{GpuSnapshot, Holder, Snapshot};

/// What a holder is suspected to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Suspect {
    /// A monitoring or management client of the protect list: holds the file, not memory.
    Tool,
    /// NVML lists it on another GPU.
    ListedElsewhere,
    /// A process of a job that NVML should have listed: a zombie or exiting, or in a
    /// container's PID namespace.
    JobProcess,
    /// Nothing places it.
    Unknown,
}

impl Suspect {
    pub fn name(self) -> &'static str {
        match self {
            Suspect::Tool => "tool",
            Suspect::ListedElsewhere => "listed_elsewhere",
            Suspect::JobProcess => "job_process",
            Suspect::Unknown => "unknown",
        }
    }
}

/// What `holder` on `gpu` is suspected to be, whether it may be ended, and why.
pub fn suspect(
    snapshot: &Snapshot,
    gpu: &GpuSnapshot,
    holder: &Holder,
) -> (Suspect, Verdict, String) {
    let host = &holder.host;
    let file = match gpu.minor {
        Some(minor) => format!("nvidia{minor}"),
        None => "the GPU's device file".to_string(),
    };
    if let Some(claim) = &host.protection {
        return claimed(claim, &file);
    }
    let elsewhere: Vec<u32> = snapshot
        .devices
        .iter()
        .filter(|other| other.processes.iter().any(|p| p.pid == holder.pid))
        .map(|other| other.index)
        .collect();
    if !elsewhere.is_empty() {
        return (
            Suspect::ListedElsewhere,
            Verdict::Report,
            format!(
                "NVML lists it on GPU {}; CUDA opens every visible GPU's device file",
                join(&elsewhere)
            ),
        );
    }
    if !host.confirmed {
        return (
            Suspect::Unknown,
            Verdict::Report,
            format!(
                "holds {file} open; nothing more is known ({})",
                host.unconfirmed_reason.as_deref().unwrap_or("unread")
            ),
        );
    }
    let (suspect, why) = unlisted(host, &file);
    match live_job(snapshot, holder) {
        Some(job) => (
            suspect,
            Verdict::Report,
            format!("{why}; part of a live job ({job})"),
        ),
        None => (suspect, Verdict::Reclaim, why),
    }
}

/// A holder that claims to be a known tool: a monitoring client if the claim is genuine.
fn claimed(claim: &crate::host::Claimed, file: &str) -> (Suspect, Verdict, String) {
    if claim.genuine {
        (
            Suspect::Tool,
            Verdict::Report,
            format!(
                "{}, a monitoring or management client: it holds {file} open, not memory",
                claim.name
            ),
        )
    } else {
        (
            Suspect::Unknown,
            Verdict::Report,
            format!(
                "claims to be {} but is not ({}); holds {file} open, NVML does not list it",
                claim.name,
                claim.why.as_deref().unwrap_or("not the program")
            ),
        )
    }
}

/// What an unlisted, confirmed holder is suspected to be (an exiting process, a job's process
/// in another PID namespace, or unknown), and why.
fn unlisted(host: &crate::host::HostProcess, file: &str) -> (Suspect, String) {
    match (host.state, &host.owner) {
        (Some(ProcState::Zombie | ProcState::Dead), _) => (
            Suspect::JobProcess,
            format!("exiting: holds {file} while its GPU context is torn down, no longer listed"),
        ),
        (
            _,
            Some(
                owner @ (crate::owner::Owner::Container { .. }
                | crate::owner::Owner::KubernetesPod { .. }),
            ),
        ) => (
            Suspect::JobProcess,
            format!(
                "in {} (another PID namespace): holds {file}, NVML does not list it",
                owner.label()
            ),
        ),
        _ => (
            Suspect::Unknown,
            format!("holds {file} open; NVML does not list it"),
        ),
    }
}

/// The live job `holder` belongs to, if any: a listed, living process shares its owner
/// (the Slurm job, unit, container or pod) or its process group.
fn live_job(snapshot: &Snapshot, holder: &Holder) -> Option<String> {
    let host = &holder.host;
    let owner = host
        .owner
        .as_ref()
        .filter(|o| !matches!(o, crate::owner::Owner::None))
        .map(|_| group_of(host, By::Owner));
    snapshot
        .devices
        .iter()
        .flat_map(|gpu| &gpu.processes)
        .filter(|p| {
            p.host.confirmed
                && !matches!(
                    p.host.state,
                    Some(ProcState::Zombie | ProcState::Dead) | None
                )
        })
        .find_map(|p| {
            if owner.is_some() && owner.as_deref() == Some(group_of(&p.host, By::Owner).as_str()) {
                return Some(format!("{}: NVML lists its pid {}", owner.clone()?, p.pid));
            }
            let pgid = host.pgid?;
            (p.host.pgid == Some(pgid))
                .then(|| format!("process group {pgid}: NVML lists its pid {}", p.pid))
        })
}

fn join(gpus: &[u32]) -> String {
    gpus.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The rule: a finding per suspected holder and GPU (a job process or an unknown holder;
/// tools and processes listed elsewhere are explained, not findings), `Reclaim` only for
/// one outside every live job.
pub(super) fn judge(facts: &Facts, gpu: &GpuSnapshot) -> Vec<Finding> {
    let Some(holders) = &gpu.holders else {
        return Vec::new();
    };
    holders
        .iter()
        .filter_map(|holder| {
            let (suspect, verdict, reason) = suspect(facts.snapshot, gpu, holder);
            if matches!(suspect, Suspect::Tool | Suspect::ListedElsewhere) {
                return None;
            }
            let verdict = match holder.host.start_ticks {
                Some(_) => verdict,
                // Without its start time it cannot be told from a successor on its pid.
                None => Verdict::Report,
            };
            Some(Finding {
                kind: Kind::UnlistedHolder,
                verdict,
                identity: holder
                    .host
                    .start_ticks
                    .map(|ticks| Identity::new(holder.pid, ticks)),
                gpus: vec![gpu.index],
                bytes: None,
                reason,
                idle: None,
            })
        })
        .collect()
}

/// Writes each holder's suspicion and reason into the snapshot, for display.
pub fn annotate(snapshot: &mut Snapshot) {
    let judged: Vec<Vec<(Suspect, String)>> = snapshot
        .devices
        .iter()
        .map(|gpu| {
            gpu.holders
                .iter()
                .flatten()
                .map(|holder| {
                    let (suspect, _, reason) = suspect(snapshot, gpu, holder);
                    (suspect, reason)
                })
                .collect()
        })
        .collect();
    for (gpu, judged) in snapshot.devices.iter_mut().zip(judged) {
        for (holder, (suspect, reason)) in gpu.holders.iter_mut().flatten().zip(judged) {
            holder.suspect = Some(suspect.name());
            holder.reason = Some(reason);
        }
    }
}
