//! Startup cleanup: the previous run's processes that are still alive, by pid and start
//! time, ended on the reclaim road (those on a GPU verified through NVML, the rest unverified).

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::Duration;

use super::{Record, Recorded};
use crate::act::{Ended, Escalation, Identity, Signal};
use crate::config::Protect;
use crate::host::{ProcView, UserNames};
use crate::nvml::{self, Gpus};
use crate::plan::{Disposition, Guard};
use crate::protect::Protection;
use crate::reclaim::{Reclaim, Verify};
use crate::select::{self, Criterion, Selector, Target};
use crate::snapshot::{Snapshot, SnapshotOptions};

/// This process and the given children, as the run file records them.
pub fn processes(workers: &[u32]) -> Vec<Recorded> {
    let observe = |pid: u32, role: &str| {
        Identity::observe(pid).ok().map(|id| Recorded {
            pid,
            start_ticks: id.start_ticks,
            role: role.to_string(),
        })
    };
    std::iter::once(observe(std::process::id(), "trainer"))
        .chain(workers.iter().map(|&pid| observe(pid, "worker")))
        .flatten()
        .collect()
}

/// What startup cleanup did.
#[derive(Debug, Default)]
pub struct Cleanup {
    /// Leftovers found alive.
    pub leftovers: usize,
    /// GPU memory the reclaimed leftovers held, as NVML reported it.
    pub freed_bytes: u64,
    /// Leftovers that could not be ended or whose memory was not released.
    pub failures: Vec<String>,
    /// Leftovers that outlived SIGKILL in uninterruptible sleep (D state): stuck in the
    /// driver, so their GPU needs a reset.
    pub needs_reset: Vec<u32>,
}

/// Ends the previous run's processes that are still alive, each planned with the guard of
/// `gpuctl clear`: through the reclaim road for those NVML lists on a GPU (signal, then
/// verify the memory came back), and by the same plan and TERM-then-KILL for the rest.
/// `log` gets one line per thing done.
pub fn clean_up(previous: &Record, protect: &Protect, log: &mut dyn FnMut(String)) -> Cleanup {
    end(&previous.name, &previous.processes, true, protect, log)
}

/// Ends what a run left behind when its main process exited (`gpuctl run`: every
/// descendant still alive), by the same road as [`clean_up`]: `processes` as observed
/// (pid and start time), planned with the guard of `gpuctl clear` (protected programs and
/// other users' processes are left and said), those on a GPU verified released through
/// NVML. `run` names the run in each target's reason.
pub fn end_leftovers(
    run: &str,
    processes: &[Recorded],
    protect: &Protect,
    log: &mut dyn FnMut(String),
) -> Cleanup {
    end(run, processes, false, protect, log)
}

/// `crashed`: `processes` are a previous run's, found by its run file.
fn end(
    run: &str,
    processes: &[Recorded],
    crashed: bool,
    protect: &Protect,
    log: &mut dyn FnMut(String),
) -> Cleanup {
    let mut cleanup = Cleanup::default();
    let own = std::process::id();
    let alive: Vec<&Recorded> = processes
        .iter()
        .filter(|p| p.pid != own)
        .filter(|p| Identity::observe(p.pid).is_ok_and(|id| id.start_ticks == p.start_ticks))
        .filter(|p| !finished(p.pid))
        .collect();
    // Only this user's processes: a run file names pids, and even root acts only on its own
    // (a forged run file cannot point it at anyone else's).
    let uid = nix::unistd::geteuid().as_raw();
    let (alive, foreign): (Vec<&Recorded>, Vec<&Recorded>) = alive
        .into_iter()
        .partition(|p| fs::metadata(format!("/proc/{}", p.pid)).is_ok_and(|m| m.uid() == uid));
    for p in foreign {
        let line = format!(
            "pid {} ({}) is listed in the run file but belongs to another user: not signalled",
            p.pid, p.role
        );
        cleanup.failures.push(line.clone());
        log(line);
    }
    cleanup.leftovers = alive.len();
    if alive.is_empty() {
        if cleanup.failures.is_empty() && crashed {
            log(format!(
                "the previous run of {run:?} did not finish cleanly; none of its {} processes \
                 is left",
                processes.len()
            ));
        }
        return cleanup;
    }
    let listed = alive
        .iter()
        .map(|p| format!("pid {} ({})", p.pid, p.role))
        .collect::<Vec<_>>()
        .join(", ");
    let plural = if alive.len() == 1 { "" } else { "es" };
    log(if crashed {
        format!(
            "the previous run of {run:?} crashed and left {} process{plural} alive: {listed}",
            alive.len()
        )
    } else {
        format!(
            "the command left {} process{plural} behind: {listed}",
            alive.len()
        )
    });
    let how = Escalation::then_kill(Signal::TERM, Duration::from_secs(5));
    // The same guard as `gpuctl clear`: the built-in and configured protected commands and
    // users are never signalled, nor another user's process unless this is root.
    let guard = Guard::for_this_process(Protection::configured(protect));
    let on_gpu = reclaim_on_gpu(run, &alive, &guard, &how, &mut cleanup, log);
    // The rest hold no GPU memory (or NVML could not tell): ended all the same, as they are
    // this run name's own processes, identified by pid and start time.
    let rest: Vec<&Recorded> = alive
        .iter()
        .copied()
        .filter(|p| !on_gpu.contains(&p.pid))
        .collect();
    end_off_gpu(run, &rest, &guard, &how, &mut cleanup, log);
    cleanup
}

/// Reclaims the leftovers NVML lists on a GPU through the reclaim road (plan with the
/// guard, signal, verify the memory came back); returns their pids.
fn reclaim_on_gpu(
    run: &str,
    alive: &[&Recorded],
    guard: &Guard,
    how: &Escalation,
    cleanup: &mut Cleanup,
    log: &mut dyn FnMut(String),
) -> Vec<u32> {
    // Under the CLI's deadline (GPUCTL_NVML_TIMEOUT, else 10 s): a hung driver must not hang
    // a training script's start.
    let gpus = match nvml::timeout(None, None).and_then(Gpus::open_within) {
        Ok(gpus) => gpus,
        Err(e) => {
            log(format!(
                "{e}; the leftovers are ended without checking their GPU memory"
            ));
            return Vec::new();
        }
    };
    let snapshot = match Snapshot::take(&gpus, &SnapshotOptions::info(None)) {
        Ok(snapshot) => snapshot,
        Err(e) => {
            log(format!(
                "NVML could not list GPU processes ({e}); the leftovers are ended without \
                 checking their GPU memory"
            ));
            return Vec::new();
        }
    };
    // The same processes, not new ones that reused their pids.
    let selector = Selector::by(Criterion::Processes(
        alive
            .iter()
            .map(|p| Identity::new(p.pid, p.start_ticks))
            .collect(),
    ));
    let (mut targets, _not_on_gpu) = select::select(&snapshot, &[], &selector);
    for target in &mut targets {
        target.reasons = vec![format!("leftover of run {run:?}")];
    }
    let on_gpu = targets.iter().map(|t| t.pid).collect();
    let outcomes = Reclaim {
        guard,
        how: how.clone(),
        verify: Verify::Release {
            gpus: &gpus,
            before: &snapshot,
            within: Duration::from_secs(10),
        },
        dry_run: false,
    }
    .run(targets);
    for outcome in outcomes {
        let held = outcome.target.used_bytes.unwrap_or(0);
        let line = format!(
            "pid {} held {} on GPU {}: {}",
            outcome.target.pid,
            crate::units::bytes_to(held, 2),
            outcome
                .target
                .gpus
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(","),
            outcome
                .skipped()
                .map_or_else(|| outcome.summary(), str::to_string)
        );
        let line = stuck(outcome.target.pid, line, &mut cleanup.needs_reset);
        if outcome.succeeded() {
            cleanup.freed_bytes += held;
        } else {
            cleanup.failures.push(line.clone());
        }
        log(line);
    }
    on_gpu
}

/// Ends the leftovers on no GPU by the same road as those on one, with nothing on a GPU to
/// verify ([`Verify::Unverified`]): each is a target planned with the guard (so a protected
/// program or user named in the run file is skipped with the guard's reason), then ended by
/// identity.
fn end_off_gpu(
    run: &str,
    rest: &[&Recorded],
    guard: &Guard,
    how: &Escalation,
    cleanup: &mut Cleanup,
    log: &mut dyn FnMut(String),
) {
    if rest.is_empty() {
        return;
    }
    // These pids are the ones the previous run recorded in this PID namespace, not NVML's
    // host pids, so they are read here whatever namespace this is.
    let view = ProcView::at(PathBuf::from("/proc"), true, UserNames::Nss);
    let pids: Vec<u32> = rest.iter().map(|p| p.pid).collect();
    let mut facts = view
        .as_ref()
        .map(|view| view.processes(&pids))
        .unwrap_or_default();
    // What became of each, in run-file order: what to say, and whether it is done.
    let mut said: Vec<Option<(String, bool)>> = vec![None; rest.len()];
    let mut targets = Vec::new();
    let mut planned = Vec::new();
    for (i, p) in rest.iter().enumerate() {
        let identity = Identity::new(p.pid, p.start_ticks);
        match facts
            .remove(&p.pid)
            .and_then(|host| Target::off_gpu(identity, host))
        {
            Some(mut target) => {
                target.reasons = vec![format!("leftover of run {run:?}")];
                targets.push(target);
                planned.push(i);
            }
            None => {
                let ended = unread(p, view.as_ref().err());
                said[i] = Some((describe(&ended), done(&ended)));
            }
        }
    }
    let outcomes = Reclaim {
        guard,
        how: how.clone(),
        verify: Verify::Unverified,
        dry_run: false,
    }
    .run(targets);
    for (outcome, i) in outcomes.into_iter().zip(planned) {
        said[i] = Some(match &outcome.disposition {
            Disposition::Signalled { ended, .. } => (describe(ended), done(ended)),
            Disposition::Skipped { why } => (format!("not signalled ({why})"), false),
            // Not a dry run: a plan carried out signals all it would.
            Disposition::WouldSignal { .. } => ("not signalled".into(), false),
        });
    }
    for (recorded, said) in rest.iter().zip(said) {
        let (what, done) = said.expect("each leftover is planned, or said why not");
        let line = format!(
            "pid {} ({}), not on a GPU: {what}",
            recorded.pid, recorded.role
        );
        let line = if done {
            line
        } else {
            stuck(recorded.pid, line, &mut cleanup.needs_reset)
        };
        if !done {
            cleanup.failures.push(line.clone());
        }
        log(line);
    }
}

/// What became of a leftover whose facts are not of the recorded process: it is gone or its
/// pid reused since it was found alive (nothing is sent), or /proc could not be read
/// (`proc_error`, when the whole of it could not).
fn unread(p: &Recorded, proc_error: Option<&std::io::Error>) -> Ended {
    match Identity::observe(p.pid) {
        Err(_) => Ended::Gone,
        Ok(now) if now.start_ticks != p.start_ticks => Ended::Reused {
            now_start_ticks: now.start_ticks,
        },
        Ok(_) => Ended::Failed {
            error: match proc_error {
                Some(e) => format!("/proc could not be read ({e}): not signalled"),
                None => "its /proc facts could not be read: not signalled".into(),
            },
        },
    }
}

/// `line`, and why, where `pid` is still alive in uninterruptible sleep (D state): a process
/// stuck in the driver that SIGKILL cannot end holds its GPU until the GPU is reset.
fn stuck(pid: u32, line: String, needs_reset: &mut Vec<u32>) -> String {
    let state = fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let after = stat.rsplit_once(')')?.1;
            after.split_whitespace().next().map(str::to_string)
        });
    if state.as_deref() == Some("D") {
        needs_reset.push(pid);
        format!("{line}; it is in D state (uninterruptible, in the driver): its GPU needs a reset")
    } else {
        line
    }
}

/// Whether a leftover is no longer running: ended, or not the run's process any more.
fn done(ended: &Ended) -> bool {
    matches!(
        ended,
        Ended::Exited { .. } | Ended::Killed { .. } | Ended::Gone | Ended::Reused { .. }
    )
}

/// A zombie whose threads have all exited: it holds nothing, and only its parent can reap
/// it. A zombie leader with live threads (which can still hold a CUDA context) is not.
fn finished(pid: u32) -> bool {
    let Ok(status) = fs::read_to_string(format!("/proc/{pid}/status")) else {
        return true;
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .map(str::trim)
            .unwrap_or("")
            .to_string()
    };
    field("State:").starts_with('Z') && field("Threads:").parse::<u32>().unwrap_or(0) <= 1
}

fn describe(ended: &Ended) -> String {
    match ended {
        Ended::Exited { signal, after_ms } => format!("ended by {signal} after {after_ms} ms"),
        Ended::Killed { after_ms } => format!("killed (SIGKILL) after {after_ms} ms"),
        Ended::Gone => "already gone".into(),
        Ended::Reused { .. } => "its pid now names another process: not signalled".into(),
        Ended::StillAlive { signals } => format!("still running after {}", signals.join(", ")),
        Ended::Failed { error } => format!("failed: {error}"),
    }
}
