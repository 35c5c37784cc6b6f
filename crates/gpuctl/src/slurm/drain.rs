//! When a prolog or epilog fails: a drain reason that names the GPU, the memory held and
//! the processes to blame; the drain itself through scontrol; and, for the health check,
//! reading back what gpuctl drained.

use std::process::Command;

use gpuctl_core::plan::Outcome;
use gpuctl_core::snapshot::Snapshot;
use gpuctl_core::units;
use gpuctl_core::verify::GpuState;

use super::Log;

/// Every drain reason gpuctl sets starts with this; the health check resumes only nodes
/// whose reason does.
pub const REASON_PREFIX: &str = "gpuctl:";

/// Slurm shows reasons whole, but `sinfo -R` and admins' eyes do not: past this the reason
/// names the first culprits and how many more there are.
const REASON_MAX_CHARS: usize = 400;

/// "gpuctl: " and the parts, `; `-separated, escaped (a part quotes command names that users
/// chose, and `sinfo -R` prints the reason raw), at most [`REASON_MAX_CHARS`].
pub fn drain_reason(parts: &[String]) -> String {
    cap(&gpuctl_core::text::escape(&format!(
        "{REASON_PREFIX} {}",
        parts.join("; ")
    )))
}

/// For each GPU that is not free, a part of a drain reason naming its UUID, the memory held
/// and the processes holding it, each marked if gpuctl signalled it and it did not exit:
/// "GPU 1 (GPU-…): 6 GiB held, pid 4242 (alice, python3) did not exit".
pub fn blame(not_free: &[GpuState], outcomes: &[Outcome], seen: Option<&Snapshot>) -> Vec<String> {
    not_free
        .iter()
        .map(|state| {
            let device = seen.and_then(|s| s.devices.iter().find(|d| d.index == state.index));
            let instance = state.gpu_instance.and_then(|gi| {
                device?
                    .mig_devices
                    .iter()
                    .find(|m| m.gpu_instance_id == Some(gi))
            });
            let uuid = match state.gpu_instance {
                Some(_) => instance.and_then(|m| m.uuid.clone()),
                None => device.and_then(|d| d.uuid.clone()),
            };
            let place = format!("GPU {}", state.place());
            let place = match uuid {
                Some(uuid) => format!("{place} ({uuid})"),
                None => place,
            };
            let held = state.used_bytes.map_or("memory unknown".into(), |b| {
                format!("{} held", units::bytes(b))
            });
            let holders: Vec<String> = state
                .processes
                .iter()
                .map(|&pid| {
                    let host = device
                        .and_then(|d| d.processes.iter().find(|p| p.pid == pid))
                        .map(|p| &p.host);
                    let user = host
                        .and_then(|h| h.user_name())
                        .unwrap_or_else(|| "unknown user".into());
                    let command = host
                        .and_then(|h| h.comm.clone().or_else(|| h.command.clone()))
                        .unwrap_or_else(|| "?".into());
                    let label = process_label(pid, &user, &command);
                    match outcomes.iter().find(|o| o.target.pid == pid) {
                        Some(outcome) if !outcome.succeeded() => {
                            format!("{label} {}", failure(outcome))
                        }
                        _ => label,
                    }
                })
                .collect();
            match holders.as_slice() {
                [] => format!("{place}: {held} by no listed process"),
                _ => format!("{place}: {held}, {}", holders.join(", ")),
            }
        })
        .collect()
}

pub fn process_label(pid: u32, user: &str, command: &str) -> String {
    let command = command.split_whitespace().next().unwrap_or("?");
    let command = command.rsplit('/').next().unwrap_or(command);
    format!("pid {pid} ({user}, {command})")
}

/// How a signalled leftover failed, for a reason.
pub fn failure(outcome: &Outcome) -> &'static str {
    match (outcome.skipped().is_some(), outcome.release()) {
        (true, _) => "could not be signalled",
        (false, Some(release)) if release.left_gpu => {
            "left the GPU but its memory was not released"
        }
        _ => "did not exit",
    }
}

/// At most [`REASON_MAX_CHARS`], cut at a `; ` with how many parts were left out.
fn cap(reason: &str) -> String {
    if reason.chars().count() <= REASON_MAX_CHARS {
        return reason.to_string();
    }
    let parts: Vec<&str> = reason.split("; ").collect();
    let mut kept = String::new();
    for (i, part) in parts.iter().enumerate() {
        let more = format!("; and {} more", parts.len() - i);
        let next = if kept.is_empty() {
            part.to_string()
        } else {
            format!("{kept}; {part}")
        };
        if next.chars().count() + more.len() > REASON_MAX_CHARS {
            if kept.is_empty() {
                return next.chars().take(REASON_MAX_CHARS).collect();
            }
            return format!("{kept}{more}");
        }
        kept = next;
    }
    kept
}

/// Drains the node with `reason` through scontrol (unless `no_drain`), and logs it.
pub fn drain_or_log(log: &Log, node: &str, reason: &str, no_drain: bool) {
    if no_drain {
        log.line(&format!("failed (node not drained: --no-drain): {reason}"));
        return;
    }
    match scontrol(&[
        "update",
        &format!("NodeName={node}"),
        "State=DRAIN",
        &format!("Reason={reason}"),
    ]) {
        Ok(_) => log.line(&format!("drained {node}: {reason}")),
        Err(error) => log.line(&format!(
            "could not drain {node} ({error}); Slurm drains it on the exit status: {reason}"
        )),
    }
}

/// `scontrol ARGS`: its output, or one line saying why it failed.
pub fn scontrol(args: &[&str]) -> Result<String, String> {
    let output = Command::new("scontrol")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run scontrol: {e}"))?;
    if output.status.success() {
        return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    let said = String::from_utf8_lossy(&output.stderr);
    let said = said.trim().replace('\n', " ");
    Err(format!(
        "scontrol {} failed ({}): {said}",
        args.first().unwrap_or(&""),
        output.status
    ))
}

/// The GPU and MIG UUIDs a drain reason names, in order.
pub fn named_gpus(reason: &str) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    for word in reason.split(|c: char| c.is_whitespace() || "(),;:".contains(c)) {
        if (word.starts_with("GPU-") || word.starts_with("MIG-"))
            && word.len() > 4
            && !found.iter().any(|f| f == word)
        {
            found.push(word.to_string());
        }
    }
    found
}

/// A node as `scontrol show node` describes it.
#[derive(Debug, PartialEq, Eq)]
pub struct NodeState {
    /// `IDLE+DRAIN`, `MIXED+DRAIN`, `DOWN`, …
    pub state: String,
    /// Without the ` [user@time]` Slurm appends.
    pub reason: Option<String>,
}

impl NodeState {
    pub fn parse(text: &str) -> Option<NodeState> {
        let mut state = None;
        let mut reason = None;
        for line in text.lines().map(str::trim_start) {
            if let Some(rest) = line.strip_prefix("State=") {
                state = rest.split_whitespace().next().map(String::from);
            } else if let Some(rest) = line.strip_prefix("Reason=") {
                let rest = rest.trim_end();
                let text = match rest.rfind(" [") {
                    Some(at) if rest.ends_with(']') && rest[at..].contains('@') => &rest[..at],
                    _ => rest,
                };
                reason = Some(text.to_string()).filter(|r| !r.is_empty() && r != "(null)");
            }
        }
        Some(NodeState {
            state: state?,
            reason,
        })
    }

    pub fn drained(&self) -> bool {
        self.state
            .split('+')
            .any(|s| s == "DRAIN" || s == "DRAINED" || s == "DRAINING")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // As Slurm 22.05's `scontrol show node` prints it.
    const SHOWN: &str = "NodeName=vm Arch=x86_64 CoresPerSocket=1 \n\
       CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.31\n\
       Gres=gpu:2\n\
       State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A\n\
       Partitions=debug \n\
       Reason=gpuctl: GPU 1 (GPU-abc): 6 GiB held, pid 4242 (root, sleep) did not exit [root@2026-11-23T15:49:44]\n";

    #[test]
    fn node_state_and_reason_without_the_stamp() {
        let state = NodeState::parse(SHOWN).unwrap();
        assert_eq!(state.state, "IDLE+DRAIN");
        assert!(state.drained());
        assert_eq!(
            state.reason.as_deref(),
            Some("gpuctl: GPU 1 (GPU-abc): 6 GiB held, pid 4242 (root, sleep) did not exit")
        );
        let idle = NodeState::parse("NodeName=vm\n   State=IDLE ThreadsPerCore=1\n").unwrap();
        assert!(!idle.drained() && idle.reason.is_none());
        assert!(NodeState::parse("NodeName=vm\n").is_none());
        let admin =
            NodeState::parse("   State=MIXED+DRAIN x\n   Reason=maintenance [alice@2026]\n")
                .unwrap();
        assert_eq!(admin.reason.as_deref(), Some("maintenance"));
    }

    #[test]
    fn named_gpus_reads_uuids_back_from_a_reason() {
        assert_eq!(
            named_gpus("gpuctl: GPU 1 (GPU-ab-12): 6 GiB held; GPU 0/1 (MIG-cd): x; GPU-ab-12"),
            ["GPU-ab-12", "MIG-cd"]
        );
        assert!(named_gpus("gpuctl: epilog of job 3: NVML is not available").is_empty());
    }

    #[test]
    fn long_reasons_keep_whole_parts_and_count_the_rest() {
        let part = "GPU 1 (GPU-0123456789): 6.0 GiB held, pid 4242 (alice, python3) did not exit";
        let many = [part; 10].join("; ");
        let capped = cap(&many);
        assert!(capped.chars().count() <= REASON_MAX_CHARS, "{capped}");
        assert!(capped.starts_with(part));
        assert!(capped.ends_with("more"), "{capped}");
        assert_eq!(cap(part), part);
    }

    #[test]
    fn reasons_hold_no_terminal_controls() {
        let reason = drain_reason(&[process_label(
            7,
            "mallory",
            "\x1b]0;PWN\x07\x1b[2J\u{202e}x",
        )]);
        assert_eq!(
            reason,
            "gpuctl: pid 7 (mallory, \\e]0;PWN\\x07\\e[2J\\u{202e}x)"
        );
    }

    #[test]
    fn process_label_is_short() {
        assert_eq!(
            process_label(7, "alice", "/usr/bin/python3 train.py --x"),
            "pid 7 (alice, python3)"
        );
    }
}
