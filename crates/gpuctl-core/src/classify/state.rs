//! Rules read from a process's state alone: uninterruptible sleep, zombies, stopped.

use super::{Facts, Held, Verdict};
use crate::host::ProcState;
use crate::units;

/// D: no signal ends it until its kernel call returns.
pub(super) fn uninterruptible(_: &Facts, h: &Held) -> Option<(Verdict, String)> {
    (h.process.host.state? == ProcState::DiskSleep).then(|| {
        (
            Verdict::Report,
            "in uninterruptible sleep (D): no signal can end it until the kernel call \
             returns; if it never does, reset the GPU once nothing else uses it"
                .into(),
        )
    })
}

/// A zombie leader whose other threads still hold the GPU context is reclaimed; a plain
/// zombie only its parent can reap.
pub(super) fn zombie(_: &Facts, h: &Held) -> Option<(Verdict, String)> {
    let host = &h.process.host;
    if !matches!(host.state?, ProcState::Zombie | ProcState::Dead) {
        return None;
    }
    let threads = host.threads.unwrap_or(1);
    Some(if threads > 1 {
        (
            Verdict::Reclaim,
            format!(
                "zombie holder: its main thread exited but {} other thread{} still hold the \
                 GPU context",
                threads - 1,
                units::plural((threads - 1) as usize, "s")
            ),
        )
    } else {
        let parent = host
            .ppid
            .map_or("its parent".to_string(), |p| format!("pid {p}"));
        (
            Verdict::Report,
            format!(
                "zombie: exited but not yet reaped by {parent}; signals cannot reach it, the \
                 driver frees its memory once it is reaped"
            ),
        )
    })
}

/// Stopped (T, t): reclaimed only when asked for, and with history only once stopped for
/// the policy's time.
pub(super) fn stopped(facts: &Facts, h: &Held) -> Option<(Verdict, String)> {
    if !matches!(
        h.process.host.state?,
        ProcState::Stopped | ProcState::TracingStop
    ) {
        return None;
    }
    let policy = facts.policy;
    let history = facts.history;
    let stopped_for = history.and_then(|history| history.stopped_for.get(&h.identity).copied());
    Some(match (policy.include_stopped, history, stopped_for) {
        (false, _, _) => (
            Verdict::Report,
            "stopped (SIGSTOP or job control); stopped processes are reclaimed only when \
             asked (clear --include-stopped)"
                .to_string(),
        ),
        (true, Some(_), Some(d)) if d >= policy.stopped_after => {
            (Verdict::Reclaim, format!("stopped for {}s", d.as_secs()))
        }
        (true, Some(_), _) => (
            Verdict::Report,
            format!(
                "stopped for less than {}s so far",
                policy.stopped_after.as_secs()
            ),
        ),
        (true, None, _) => (
            Verdict::Reclaim,
            "stopped, and stopped processes were asked for".to_string(),
        ),
    })
}
