//! `k`: ending processes from the view, on the same road as `gpuctl kill --pid`: the kill
//! names the rows' processes by identity (pid and start time, as the screen showed them),
//! is prepared once (selected from a fresh snapshot, guarded, planned), its plan shown, and
//! only a `y` carries out exactly that plan: through a pidfd, SIGTERM then SIGKILL, then
//! NVML checked until the memory is back. A process replaced meanwhile by another with its
//! pid is skipped as "not the process you confirmed", never signalled.

use gpuctl_core::act::Identity;
use gpuctl_core::plan::Outcome;
use gpuctl_core::reclaim::{KillRequest, Killed, PreparedKill, Session, prepare_kill};
use gpuctl_core::text;
use gpuctl_core::units;

use super::model::ProcessKey;

/// A kill prepared for the `chosen` rows' processes, and its plan as lines to show. `None`
/// when none of them holds GPU memory any more.
pub fn prepare<'s>(
    session: &'s Session,
    chosen: &[ProcessKey],
) -> gpuctl_core::error::Result<(Option<PreparedKill<'s>>, Vec<String>)> {
    let request = KillRequest {
        // A row not tied to a local process has no start time: named with none (0), no
        // process matches it, and the refusal says why it cannot be tied.
        processes: chosen
            .iter()
            .map(|&(pid, start)| Identity::new(pid, start.unwrap_or(0)))
            .collect(),
        ..KillRequest::default()
    };
    let pids: Vec<u32> = chosen.iter().map(|&(pid, _)| pid).collect();
    let Some(prepared) = prepare_kill(session, &request)? else {
        let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
        return Ok((
            None,
            vec![format!(
                "pid {}: no longer on a GPU; nothing to end",
                pids.join(", ")
            )],
        ));
    };
    let plan = plan_lines(&prepared);
    Ok((Some(prepared), plan))
}

/// What the confirmation shows: how processes are ended, then each one and what would be
/// done to it, or why it is skipped.
fn plan_lines(prepared: &PreparedKill<'_>) -> Vec<String> {
    let ending = prepared.ending();
    let mut lines = vec![format!(
        "{}, then SIGKILL after {} if still running; then NVML is checked until its memory is back",
        ending.signal,
        humantime::format_duration(ending.timeout)
    )];
    let plan = prepared.plan();
    for outcome in &plan {
        lines.push(plan_line(outcome));
    }
    if let Some(consent) = prepared.consent() {
        lines.push(format!(
            "processes of {} users: {}",
            consent.users.len(),
            consent
                .users
                .iter()
                .map(|u| text::escape(u).into_owned())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if !prepared.is_root() {
        lines.push("not root: only your own processes can be ended".into());
    }
    if !plan.iter().any(Outcome::would_signal) {
        lines.push("nothing here can be ended".into());
    }
    lines
}

fn plan_line(outcome: &Outcome) -> String {
    let target = &outcome.target;
    let what = format!(
        "pid {} {} {} on GPU {}: {}",
        target.pid,
        text::escape(&target.owner_name()),
        target.used_bytes.map_or_else(|| "n/a".into(), units::bytes),
        units::gpu_list(&target.gpus),
        text::safe(&target.shown_command())
    );
    match outcome.skipped() {
        Some(why) => format!("skip {what}: {}", text::escape(why)),
        None => format!("end  {what}"),
    }
}

/// Carries out the prepared kill; the line that says what ended and how much memory came
/// back.
pub fn carry_out(prepared: PreparedKill<'_>) -> String {
    summary(&prepared.run())
}

fn summary(killed: &Killed) -> String {
    let mut parts: Vec<String> = killed
        .outcomes
        .iter()
        .map(|o| match o.skipped() {
            Some(why) => format!("pid {}: skipped: {}", o.target.pid, text::escape(why)),
            None => format!("pid {}: {}", o.target.pid, o.summary()),
        })
        .collect();
    parts.extend(
        killed
            .refused
            .iter()
            .map(|r| format!("pid {}: {}", r.pid, text::escape(&r.reason))),
    );
    let back: u64 = killed
        .outcomes
        .iter()
        .filter(|o| o.release().is_some_and(|r| r.memory_released))
        .filter_map(|o| o.target.used_bytes)
        .sum();
    let signalled = killed.outcomes.iter().any(Outcome::is_signalled);
    if signalled {
        parts.push(format!("{} of GPU memory back", units::bytes(back)));
    }
    parts.join("; ")
}
