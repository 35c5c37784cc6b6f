//! Orphaned: the worker of a run that died, its group leader gone and reparented out of
//! its run, idle, childless, and with positive evidence that the run died.

use super::{Facts, Held, Verdict};
use crate::host::{LeaderState, Lineage, ProcState};
use crate::pidmap::PidMap;
use crate::snapshot::GpuProcess;

/// Idle, childless reparented orphans per process group: several of them are the workers
/// of one run that died.
pub(super) fn idle_per_group(held: &[Held], lineages: &PidMap<u32, Lineage>) -> PidMap<u32, usize> {
    let mut idle: PidMap<u32, usize> = PidMap::default();
    for h in held {
        let Some(lineage) = lineages.get(&h.process.pid) else {
            continue;
        };
        if is_reparented_orphan(h.process, lineage)
            && h.busy_pct == Some(0)
            && lineage.live_children == Some(0)
        {
            *idle.entry(h.process.host.pgid.unwrap_or(0)).or_default() += 1;
        }
    }
    idle
}

/// The ancestry of a leftover: its group's leader is gone and it was reparented out of its
/// run, to init or to a process outside its group and session (a subreaper).
fn is_reparented_orphan(process: &GpuProcess, lineage: &Lineage) -> bool {
    let leader_gone = matches!(lineage.leader, LeaderState::Gone | LeaderState::Zombie);
    let (pgid, sid) = (process.host.pgid, process.host.sid);
    let reparented = process.host.ppid == Some(1)
        || lineage
            .parent
            .as_ref()
            .is_some_and(|parent| Some(parent.pgid) != pgid && Some(parent.sid) != sid);
    leader_gone && reparented
}

/// Whether the process's pod has a ready sandbox in the node's container runtime: then it
/// is a restarted container's, and the pod lives, whatever its ancestry says.
fn pod_still_runs(facts: &Facts, process: &GpuProcess) -> bool {
    let Some(crate::owner::Owner::KubernetesPod { pod_uid, .. }) = &process.host.owner else {
        return false;
    };
    facts.snapshot.pod_runtime.as_ref().is_some_and(|runtime| {
        runtime
            .ready_pod_uids
            .contains(&pod_uid.to_ascii_lowercase())
    })
}

/// Evidence of life clears an orphan; positive evidence of a dead run makes it reclaimable.
pub(super) fn judge(facts: &Facts, h: &Held) -> Option<(Verdict, String)> {
    // Stopped, zombie and D-state processes are judged by their state's rules.
    if matches!(
        h.process.host.state?,
        ProcState::DiskSleep
            | ProcState::Zombie
            | ProcState::Dead
            | ProcState::Stopped
            | ProcState::TracingStop
    ) {
        return None;
    }
    let lineage = facts.lineages.get(&h.process.pid)?;
    if !is_reparented_orphan(h.process, lineage) || pod_still_runs(facts, h.process) {
        return None;
    }
    let identity = h.identity;
    let ancestry = ancestry(lineage, &h.process.host);
    match h.busy_pct {
        Some(pct) if pct > 0 => return None, // busy on the GPU: alive
        _ => {}
    }
    if lineage.live_children.is_some_and(|n| n > 0) {
        return None; // it runs workers of its own: alive
    }
    if h.busy_pct.is_none() {
        return Some((
            Verdict::Report,
            format!(
                "looks orphaned ({ancestry}), but the driver does not report per-process \
                 utilization, so activity cannot be ruled out"
            ),
        ));
    }
    if lineage.live_children.is_none() {
        return Some((
            Verdict::Report,
            format!("looks orphaned ({ancestry}), but its children cannot be listed"),
        ));
    }
    let evidence = evidence_of_dead_run(facts, h);
    Some(match evidence {
        Some(evidence) => (
            Verdict::Reclaim,
            format!("orphaned: {ancestry}; idle on the GPU, no children; {evidence}"),
        ),
        None => (
            Verdict::Report,
            format!(
                "possibly orphaned: {ancestry}; idle, no children; alone in its group, it \
                 may be a background job between GPU phases, so it is not reclaimed \
                 (end it with: gpuctl kill --pid {})",
                identity.pid
            ),
        ),
    })
}

/// "its process group leader (pid N) is gone and it was reparented to pid P (comm)".
fn ancestry(lineage: &Lineage, host: &crate::host::HostProcess) -> String {
    let pgid = host.pgid.unwrap_or(0);
    let parent = match (&lineage.parent, host.ppid) {
        (Some(parent), _) => format!("pid {} ({})", parent.pid, parent.comm),
        (None, Some(ppid)) => format!("pid {ppid}"),
        (None, None) => "another process".into(),
    };
    format!(
        "its process group leader (pid {pgid}) is {} and it was reparented to {parent}",
        if lineage.leader == LeaderState::Zombie {
            "a zombie"
        } else {
            "gone"
        }
    )
}

/// Positive evidence that an idle, childless orphan's run is dead: its parent seen to die,
/// idle orphan siblings, or a multiprocessing worker's command line.
fn evidence_of_dead_run(facts: &Facts, h: &Held) -> Option<String> {
    let host = &h.process.host;
    let pgid = host.pgid.unwrap_or(0);
    let parent_died = facts
        .history
        .is_some_and(|history| history.parent_died.contains(&h.identity));
    let siblings = facts
        .idle_orphans_per_group
        .get(&pgid)
        .copied()
        .unwrap_or(0);
    let worker = host
        .argv
        .as_deref()
        .is_some_and(|argv| argv.iter().any(|arg| is_multiprocessing_worker(arg)));
    if parent_died {
        Some("its parent was seen to die while it held the GPU".to_string())
    } else if siblings >= 2 {
        Some(format!(
            "{siblings} idle orphans of the same group: the workers of a run that crashed"
        ))
    } else if worker {
        Some("it is a multiprocessing worker, which lives only for its parent".to_string())
    } else {
        None
    }
}

/// Command lines of Python multiprocessing children (spawn and forkserver start methods).
fn is_multiprocessing_worker(arg: &str) -> bool {
    arg.contains("multiprocessing.spawn")
        || arg.contains("multiprocessing.forkserver")
        || arg == "--multiprocessing-fork"
}
