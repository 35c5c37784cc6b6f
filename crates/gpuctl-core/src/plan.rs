//! The `plan` step: for each selected target, what will be done and why, before anything is
//! done. The [`Guard`] decides what must never be signalled; a dry run stops after this
//! step and reports the plan.

use std::collections::HashSet;

use serde::Serialize;

use crate::act::Ended;
use crate::classify::{Finding, Verdict};
use crate::protect::{Claim, Claimant, Protection};
use crate::select::Target;
use crate::sys::procfile;

/// Who is acting, and what must never be signalled.
#[derive(Debug, Clone)]
pub struct Guard {
    root: bool,
    caller_uid: u32,
    own_pid: u32,
    ancestors: HashSet<u32>,
    protection: Protection,
}

impl Guard {
    /// The guard for this process: its privileges, its own pid and ancestors, and what
    /// `protection` names.
    pub fn for_this_process(protection: Protection) -> Guard {
        Guard {
            root: nix::unistd::geteuid().is_root(),
            caller_uid: nix::unistd::getuid().as_raw(),
            own_pid: std::process::id(),
            ancestors: ancestors(),
            protection,
        }
    }

    pub fn is_root(&self) -> bool {
        self.root
    }

    pub fn caller_uid(&self) -> u32 {
        self.caller_uid
    }

    /// What it never signals.
    pub fn protection(&self) -> &Protection {
        &self.protection
    }

    /// Why `target` must not be signalled, if it must not.
    pub fn check(&self, target: &Target) -> Option<String> {
        let pid = target.pid;
        if pid <= 1 {
            return Some(format!("pid {pid} is the system's init"));
        }
        if pid == self.own_pid {
            return Some("that is gpuctl itself".into());
        }
        if self.ancestors.contains(&pid) {
            return Some(format!(
                "pid {pid} is an ancestor of gpuctl (the shell or launcher running it)"
            ));
        }
        // Protected by what it is, not by the name it gives itself (see crate::protect).
        let claimant = Claimant::of(pid, &target.host);
        if let Claim::Genuine(name) = self.protection.judge(&claimant) {
            return Some(format!("protected: {name}"));
        }
        if let Some(user) = target
            .user
            .as_ref()
            .filter(|user| self.protection.users.contains(user))
        {
            return Some(format!("protected user: {user}"));
        }
        if !self.root && target.uid != Some(self.caller_uid) {
            return Some(format!(
                "permission denied: pid {pid} belongs to {}",
                target.owner_name()
            ));
        }
        None
    }

    /// Automatic reclaim by a caller who is not root keeps only the caller's own targets;
    /// each finding of another user's target comes back as a report saying so.
    pub fn keep_callers_own(
        &self,
        targets: &mut Vec<Target>,
        findings: &[Finding],
    ) -> Vec<Finding> {
        let mut others = Vec::new();
        if self.root {
            return others;
        }
        targets.retain(|target| {
            let own = target.uid == Some(self.caller_uid);
            if !own {
                others.extend(
                    findings
                        .iter()
                        .filter(|f| f.identity.map(|i| i.pid) == Some(target.pid))
                        .map(|f| Finding {
                            verdict: Verdict::Report,
                            reason: format!(
                                "{} (belongs to {}: only root reclaims other users' processes)",
                                f.reason,
                                target.owner_name()
                            ),
                            ..f.clone()
                        }),
                );
            }
            own
        });
        others
    }
}

/// gpuctl's parent, its parent, ... up to init. They are what runs gpuctl.
fn ancestors() -> HashSet<u32> {
    let mut found = HashSet::new();
    let mut pid = std::os::unix::process::parent_id();
    while pid > 1 && found.insert(pid) {
        let stat = std::fs::File::open(format!("/proc/{pid}/stat"))
            .and_then(|file| procfile::read_stat_line(&file));
        pid = match stat {
            Ok(stat) => stat.ppid.max(0) as u32,
            Err(_) => break,
        };
    }
    found
}

/// What is done with one target, from the plan to the verification: the plan fills in the
/// action, [`crate::act`] how it ended, [`crate::verify`] whether its memory came back.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    #[serde(flatten)]
    pub target: Target,
    /// `signal`, `skip`, or `dry_run` (would signal).
    pub action: Action,
    /// Why it was skipped.
    pub skipped: Option<String>,
    /// How it ended, for a signalled target.
    pub ended: Option<Ended>,
    /// Whether NVML stopped listing it on every GPU; `None` when not signalled.
    pub left_gpu: Option<bool>,
    /// Whether its GPUs' used memory fell by what it held; `None` when not signalled or unknown.
    pub memory_released: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Signal,
    Skip,
    DryRun,
}

impl Outcome {
    /// One word or phrase for a table.
    pub fn summary(&self) -> String {
        match (&self.action, &self.ended) {
            (Action::DryRun, _) => "would signal".into(),
            (Action::Skip, _) => "skipped".into(),
            (Action::Signal, Some(Ended::Exited { signal, .. })) => self.after_exit(signal),
            (Action::Signal, Some(Ended::Killed { .. })) => self.after_exit("SIGKILL"),
            (Action::Signal, Some(Ended::Gone)) => "already gone".into(),
            (Action::Signal, Some(Ended::Reused { .. })) => "refused: pid reused".into(),
            (Action::Signal, Some(Ended::StillAlive { .. })) => "still running".into(),
            (Action::Signal, Some(Ended::Failed { error })) => format!("failed: {error}"),
            (Action::Signal, None) => "not signalled".into(),
        }
    }

    fn after_exit(&self, signal: &str) -> String {
        let verb = if signal == "SIGKILL" {
            "killed"
        } else {
            "ended"
        };
        match (self.left_gpu, self.memory_released) {
            (Some(false), _) => format!("{verb}, still listed on the GPU"),
            (_, Some(false)) => format!("{verb}, memory still held"),
            _ => format!("{verb} ({signal})"),
        }
    }

    /// Whether this target is what the caller asked for: ended and its memory back, or a
    /// dry run. Skips count as not done.
    pub fn succeeded(&self) -> bool {
        match self.action {
            Action::DryRun => true,
            Action::Skip => false,
            Action::Signal => {
                matches!(
                    self.ended,
                    Some(Ended::Exited { .. } | Ended::Killed { .. } | Ended::Gone)
                ) && self.left_gpu != Some(false)
                    && self.memory_released != Some(false)
            }
        }
    }
}

/// The plan: each target guarded, in target order. Nothing is signalled on a pid alone, nor
/// anything the guard refuses; with `dry_run` nothing at all.
pub fn plan(targets: Vec<Target>, guard: &Guard, dry_run: bool) -> Vec<Outcome> {
    targets
        .into_iter()
        .map(|target| {
            let skipped = match target.identity() {
                None => Some(format!("pid {}: its start time is unknown", target.pid)),
                Some(_) => guard.check(&target),
            };
            let action = match (&skipped, dry_run) {
                (Some(_), _) => Action::Skip,
                (None, true) => Action::DryRun,
                (None, false) => Action::Signal,
            };
            Outcome {
                target,
                action,
                skipped,
                ended: None,
                left_gpu: None,
                memory_released: None,
            }
        })
        .collect()
}
