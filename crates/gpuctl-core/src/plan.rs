//! The `plan` step: for each selected target, what will be done and why, before anything is
//! done. The [`Guard`] decides what must never be signalled; a dry run stops after this
//! step and reports the plan.

use std::collections::HashSet;

use serde::Serialize;

use crate::act::{Ended, Identity};
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
    /// Pids named explicitly with `--force`: an MPS server or daemon among them may be ended.
    forced: HashSet<u32>,
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
            forced: HashSet::new(),
        }
    }

    /// The MPS servers and daemons among `pids` may be ended (`kill --pid PID --force`):
    /// the only protected programs an explicit kill may end, with every client they serve.
    pub fn forcing(mut self, pids: &[u32]) -> Guard {
        self.forced.extend(pids.iter().copied());
        self
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
            let forced = self.forced.contains(&pid)
                && [crate::mps::SERVER, crate::mps::CONTROL].contains(&name.as_str());
            if !forced {
                return Some(format!("protected: {name}"));
            }
        }
        if let Some(user) = target
            .user
            .as_ref()
            .filter(|user| self.protection.users.contains(user))
        {
            return Some(format!("protected user: {user}"));
        }
        if let Some(pattern) = self.protection.owner_protected(target.host.owner.as_ref()) {
            return Some(format!("protected owner: {pattern} ([protect] owners)"));
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

/// What is done with one target, from the plan to the verification: the plan decides
/// whether it [`WouldSignal`](Disposition::WouldSignal) or is
/// [`Skipped`](Disposition::Skipped), [`crate::act`] turns the first into
/// [`Signalled`](Disposition::Signalled) with how it ended, and [`crate::verify`] adds
/// whether its memory came back. The target is there in every case, so it is a field; what
/// became of it is the enum, so no impossible combination (a skip without a reason, a
/// signal without an identity) can be written down.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub target: Target,
    pub disposition: Disposition,
}

/// What became of one target.
#[derive(Debug, Clone, PartialEq)]
pub enum Disposition {
    /// Planned to be signalled, and not (yet) signalled: what a dry run reports, and what
    /// a plan shown before a confirmation says.
    WouldSignal { identity: Identity },
    /// Not signalled, and why (the guard's reason, an unknown start time).
    Skipped { why: String },
    /// Signalled by identity: how it ended and, where it ended and NVML was read after,
    /// what verification saw.
    Signalled {
        identity: Identity,
        ended: Ended,
        release: Option<Release>,
    },
}

/// What verification through NVML saw of a target that ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release {
    /// NVML stopped listing it on every GPU.
    pub left_gpu: bool,
    /// Its GPUs' used memory fell by what it held (and it left them).
    pub memory_released: bool,
}

impl Outcome {
    /// The identity it is (or would be) signalled by; `None` for a skipped target.
    pub fn identity(&self) -> Option<Identity> {
        match &self.disposition {
            Disposition::WouldSignal { identity } | Disposition::Signalled { identity, .. } => {
                Some(*identity)
            }
            Disposition::Skipped { .. } => None,
        }
    }

    /// Why it was skipped, if it was.
    pub fn skipped(&self) -> Option<&str> {
        match &self.disposition {
            Disposition::Skipped { why } => Some(why),
            _ => None,
        }
    }

    /// How it ended, if it was signalled.
    pub fn ended(&self) -> Option<&Ended> {
        match &self.disposition {
            Disposition::Signalled { ended, .. } => Some(ended),
            _ => None,
        }
    }

    /// What verification saw, if it ran for this target.
    pub fn release(&self) -> Option<Release> {
        match &self.disposition {
            Disposition::Signalled { release, .. } => *release,
            _ => None,
        }
    }

    /// Whether it was signalled (whatever came of it).
    pub fn is_signalled(&self) -> bool {
        matches!(self.disposition, Disposition::Signalled { .. })
    }

    /// Whether the plan would signal it and nothing was sent (a dry run, a plan shown).
    pub fn would_signal(&self) -> bool {
        matches!(self.disposition, Disposition::WouldSignal { .. })
    }

    /// One word or phrase for a table.
    pub fn summary(&self) -> String {
        match &self.disposition {
            Disposition::WouldSignal { .. } => "would signal".into(),
            Disposition::Skipped { .. } => "skipped".into(),
            Disposition::Signalled { ended, release, .. } => match ended {
                Ended::Exited { signal, .. } => after_exit(signal, *release),
                Ended::Killed { .. } => after_exit("SIGKILL", *release),
                Ended::Gone => "already gone".into(),
                Ended::Reused { .. } => "refused: pid reused".into(),
                Ended::StillAlive { .. } => "still running".into(),
                Ended::Failed { error } => format!("failed: {error}"),
            },
        }
    }

    /// Whether this target is what the caller asked for: ended and its memory back, or a
    /// dry run's would-signal. Skips count as not done.
    pub fn succeeded(&self) -> bool {
        match &self.disposition {
            Disposition::WouldSignal { .. } => true,
            Disposition::Skipped { .. } => false,
            Disposition::Signalled { ended, release, .. } => {
                matches!(
                    ended,
                    Ended::Exited { .. } | Ended::Killed { .. } | Ended::Gone
                ) && release.is_none_or(|r| r.left_gpu && r.memory_released)
            }
        }
    }
}

fn after_exit(signal: &str, release: Option<Release>) -> String {
    let verb = if signal == "SIGKILL" {
        "killed"
    } else {
        "ended"
    };
    match release {
        Some(Release {
            left_gpu: false, ..
        }) => format!("{verb}, still listed on the GPU"),
        Some(Release {
            memory_released: false,
            ..
        }) => format!("{verb}, memory still held"),
        _ => format!("{verb} ({signal})"),
    }
}

/// The `kill --json`/`clear --json` shape of an outcome (docs/schema/reclaim-v1.schema.json):
/// the target's fields, then `action` (`signal`, `skip`, or `dry_run` for would signal),
/// `skipped`, `ended`, `left_gpu` and `memory_released`, each null where it does not apply.
impl Serialize for Outcome {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        #[serde(rename_all = "snake_case")]
        enum Action {
            Signal,
            Skip,
            DryRun,
        }
        #[derive(Serialize)]
        struct Wire<'a> {
            #[serde(flatten)]
            target: &'a Target,
            action: Action,
            skipped: Option<&'a str>,
            ended: Option<&'a Ended>,
            left_gpu: Option<bool>,
            memory_released: Option<bool>,
        }
        let release = self.release();
        Wire {
            target: &self.target,
            action: match self.disposition {
                Disposition::WouldSignal { .. } => Action::DryRun,
                Disposition::Skipped { .. } => Action::Skip,
                Disposition::Signalled { .. } => Action::Signal,
            },
            skipped: self.skipped(),
            ended: self.ended(),
            left_gpu: release.map(|r| r.left_gpu),
            memory_released: release.map(|r| r.memory_released),
        }
        .serialize(serializer)
    }
}

/// The plan: each target guarded, in target order: it would be signalled, or is skipped
/// with why. Nothing is signalled on a pid alone, nor anything the guard refuses. Carrying
/// the plan out (the reclaim road's act step) is a separate step, left out by a dry run.
pub fn plan(targets: Vec<Target>, guard: &Guard) -> Vec<Outcome> {
    targets
        .into_iter()
        .map(|target| {
            let disposition = match target.identity() {
                None => Disposition::Skipped {
                    why: format!("pid {}: its start time is unknown", target.pid),
                },
                Some(identity) => match guard.check(&target) {
                    Some(why) => Disposition::Skipped { why },
                    None => Disposition::WouldSignal { identity },
                },
            };
            Outcome {
                target,
                disposition,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::host::HostProcess;
    use crate::protect::Protection;

    /// A target on GPU 0 with 1 GiB, its start time known or not.
    fn target(pid: u32, start_ticks: Option<u64>) -> Target {
        let host = HostProcess {
            confirmed: true,
            uid: Some(nix::unistd::getuid().as_raw()),
            user: Some("alice".into()),
            start_ticks,
            ..HostProcess::unconfirmed("")
        };
        let mut target = Target::new(pid, &Arc::new(host));
        target.gpus = vec![0];
        target.used_bytes = Some(1 << 30);
        target
    }

    fn signalled(ended: Ended, release: Option<Release>) -> Outcome {
        Outcome {
            target: target(4_000_001, Some(7)),
            disposition: Disposition::Signalled {
                identity: Identity::new(4_000_001, 7),
                ended,
                release,
            },
        }
    }

    fn released(left_gpu: bool, memory_released: bool) -> Option<Release> {
        Some(Release {
            left_gpu,
            memory_released,
        })
    }

    #[test]
    fn the_plan_would_signal_by_identity_or_skips_with_why() {
        let guard = Guard::for_this_process(Protection::default());
        let plan = plan(
            vec![
                target(4_000_001, Some(7)),
                target(4_000_002, None),
                target(std::process::id(), Some(1)),
            ],
            &guard,
        );
        assert_eq!(
            plan[0].disposition,
            Disposition::WouldSignal {
                identity: Identity::new(4_000_001, 7)
            }
        );
        assert_eq!(plan[0].identity(), Some(Identity::new(4_000_001, 7)));
        assert!(plan[0].would_signal() && plan[0].succeeded());
        assert_eq!(plan[0].summary(), "would signal");
        assert_eq!(
            plan[1].skipped(),
            Some("pid 4000002: its start time is unknown")
        );
        assert_eq!(plan[1].identity(), None, "a skip has no identity to signal");
        assert_eq!(plan[2].skipped(), Some("that is gpuctl itself"));
        assert!(
            plan.iter()
                .skip(1)
                .all(|o| !o.succeeded() && !o.is_signalled())
        );
    }

    #[test]
    fn a_signalled_target_succeeds_only_ended_with_its_memory_back() {
        let exited = || Ended::Exited {
            signal: "SIGTERM".into(),
            after_ms: 5,
        };
        let done = signalled(exited(), released(true, true));
        assert!(done.succeeded());
        assert_eq!(done.summary(), "ended (SIGTERM)");
        let listed = signalled(exited(), released(false, false));
        assert!(!listed.succeeded());
        assert_eq!(listed.summary(), "ended, still listed on the GPU");
        let held = signalled(Ended::Killed { after_ms: 9 }, released(true, false));
        assert!(!held.succeeded());
        assert_eq!(held.summary(), "killed, memory still held");
        // Not verified (nothing on a GPU to read): how it ended decides.
        assert!(signalled(Ended::Gone, None).succeeded());
        let alive = signalled(
            Ended::StillAlive {
                signals: vec!["SIGTERM".into(), "SIGKILL".into()],
            },
            None,
        );
        assert!(!alive.succeeded());
        assert_eq!(alive.summary(), "still running");
        let reused = signalled(
            Ended::Reused {
                now_start_ticks: 99,
            },
            None,
        );
        assert!(!reused.succeeded());
        assert_eq!(reused.summary(), "refused: pid reused");
    }

    #[test]
    fn the_json_keeps_the_reclaim_schemas_shape() {
        let json = |outcome: &Outcome| serde_json::to_value(outcome).unwrap();
        let keys = |value: &serde_json::Value| {
            let mut keys: Vec<String> = value.as_object().unwrap().keys().cloned().collect();
            keys.sort();
            keys
        };
        let planned = Outcome {
            target: target(4_000_001, Some(7)),
            disposition: Disposition::WouldSignal {
                identity: Identity::new(4_000_001, 7),
            },
        };
        let would = json(&planned);
        assert_eq!(would["action"], "dry_run");
        assert_eq!(would["pid"], 4_000_001);
        for absent in ["skipped", "ended", "left_gpu", "memory_released"] {
            assert!(would[absent].is_null(), "{absent}: {would}");
        }
        let skip = json(&Outcome {
            target: target(4_000_002, None),
            disposition: Disposition::Skipped {
                why: "protected: sshd".into(),
            },
        });
        assert_eq!(skip["action"], "skip");
        assert_eq!(skip["skipped"], "protected: sshd");
        let done = json(&signalled(
            Ended::Killed { after_ms: 9 },
            released(true, false),
        ));
        assert_eq!(done["action"], "signal");
        assert_eq!(done["ended"]["outcome"], "killed");
        assert_eq!(done["left_gpu"], true);
        assert_eq!(done["memory_released"], false);
        // Every key in every case, as docs/schema/reclaim-v1.schema.json requires.
        let expected = [
            "action",
            "command",
            "ended",
            "gpus",
            "kinds",
            "left_gpu",
            "memory_released",
            "pid",
            "reasons",
            "skipped",
            "start_ticks",
            "uid",
            "used_bytes",
            "user",
        ];
        for value in [&would, &skip, &done] {
            assert_eq!(keys(value), expected, "{value}");
        }
    }
}
