//! What a watcher found and waited out (the watchdog): the processes of its due findings,
//! reclaimed on the snapshot it found them in, with its own guard and ending. Which of them
//! are acted on in a pass is the watcher's rule over time (`classify::grace`); selecting
//! them from the findings, and the road from the plan on, are here.

use std::time::Duration;

use super::{Reclaim, Verify};
use crate::act::{Escalation, Identity};
use crate::classify::{Finding, Remedy};
use crate::nvml::Gpus;
use crate::plan::{Guard, Outcome};
use crate::select::{self, Target};
use crate::snapshot::Snapshot;

/// A reclaim of what findings name.
#[derive(Debug, Clone)]
pub struct FindingsRequest {
    /// The findings due for action, each with its remedy: leftovers to reclaim
    /// ([`Remedy::Reclaim`]), processes above their share to end ([`Remedy::Enforce`]).
    pub due: Vec<(Finding, Remedy)>,
    /// Whether processes above their share are ended (`enforce_fraction`); if not, they are
    /// only reported.
    pub enforce: bool,
    pub how: Escalation,
    /// How long NVML may take to show an ended process's memory released.
    pub verify_for: Duration,
    /// Plan and report, signal nothing.
    pub dry_run: bool,
}

/// One process a [`FindingsRequest`] acts on, and what for.
#[derive(Debug, Clone)]
pub struct Due {
    pub target: Target,
    /// The process the findings saw: the target is that process, not one that has its pid.
    pub identity: Identity,
    pub remedy: Remedy,
}

impl FindingsRequest {
    /// One target per process on `snapshot` (the one the findings came from), with the
    /// findings' reasons: leftovers first, then processes above their share that are not
    /// also leftovers. A finding whose process `snapshot` shows with another start time,
    /// or not at all, gives none.
    pub fn targets(&self, snapshot: &Snapshot) -> Vec<Due> {
        let of = |remedy: Remedy| -> Vec<Finding> {
            self.due
                .iter()
                .filter(|(_, r)| *r == remedy)
                .map(|(f, _)| f.clone())
                .collect()
        };
        let mut remedies = vec![Remedy::Reclaim];
        if self.enforce {
            remedies.push(Remedy::Enforce);
        }
        let mut chosen: Vec<Due> = Vec::new();
        for remedy in remedies {
            let findings = of(remedy);
            for target in select::from_findings(snapshot, &findings, None) {
                let found = findings
                    .iter()
                    .any(|f| f.identity.is_some() && f.identity == target.identity());
                let Some(identity) = target.identity().filter(|_| found) else {
                    continue;
                };
                if !chosen.iter().any(|d| d.target.pid == target.pid) {
                    chosen.push(Due {
                        target,
                        identity,
                        remedy,
                    });
                }
            }
        }
        chosen
    }

    /// The road from the plan on for `targets` (chosen from [`FindingsRequest::targets`]
    /// of `before`): guarded by `guard`, signalled unless a dry run, verified through
    /// NVML. Outcomes come in target order.
    pub fn run(
        &self,
        gpus: &Gpus,
        before: &Snapshot,
        guard: &Guard,
        targets: Vec<Target>,
    ) -> Vec<Outcome> {
        Reclaim {
            guard,
            how: self.how.clone(),
            verify: Verify::Release {
                gpus,
                before,
                within: self.verify_for,
            },
            dry_run: self.dry_run,
        }
        .run(targets)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::act::Signal;
    use crate::classify::{Kind, Verdict};
    use crate::snapshot::{GpuProcess, GpuSnapshot};

    fn process(pid: u32, ticks: u64) -> GpuProcess {
        crate::fixtures::process(pid)
            .used_gib(1)
            .sm_pct(0)
            .confirmed()
            .started(ticks)
            .build()
    }

    fn finding(kind: Kind, pid: u32, ticks: u64) -> Finding {
        Finding {
            kind,
            verdict: Verdict::Reclaim,
            identity: Some(Identity::new(pid, ticks)),
            gpus: vec![0],
            bytes: Some(1 << 30),
            reason: format!("{} {pid}", kind.name()),
            idle: None,
        }
    }

    fn request(due: Vec<(Finding, Remedy)>, enforce: bool) -> FindingsRequest {
        FindingsRequest {
            due,
            enforce,
            how: Escalation::then_kill(Signal::TERM, Duration::from_secs(1)),
            verify_for: Duration::from_secs(1),
            dry_run: true,
        }
    }

    fn chosen(due: &[Due]) -> Vec<(u32, Remedy)> {
        due.iter().map(|d| (d.target.pid, d.remedy)).collect()
    }

    #[test]
    fn leftovers_come_first_and_a_process_is_targeted_once() {
        let snapshot = Snapshot::of(vec![GpuSnapshot {
            processes: vec![process(10, 1010), process(11, 1011)],
            ..GpuSnapshot::unread(0)
        }]);
        let due = vec![
            (finding(Kind::AboveFraction, 11, 1011), Remedy::Enforce),
            (finding(Kind::AboveFraction, 10, 1010), Remedy::Enforce),
            (finding(Kind::ZombieHolder, 10, 1010), Remedy::Reclaim),
        ];
        let targets = request(due.clone(), true).targets(&snapshot);
        assert_eq!(
            chosen(&targets),
            [(10, Remedy::Reclaim), (11, Remedy::Enforce)]
        );
        assert_eq!(targets[0].identity, Identity::new(10, 1010));
        assert_eq!(targets[0].target.reasons, ["zombie_holder 10"]);
        // Without enforce_fraction, a process above its share is only reported.
        assert_eq!(
            chosen(&request(due, false).targets(&snapshot)),
            [(10, Remedy::Reclaim)]
        );
    }

    #[test]
    fn a_pid_now_held_by_another_process_or_gone_is_no_target() {
        let snapshot = Snapshot::of(vec![GpuSnapshot {
            processes: vec![process(10, 5000)],
            ..GpuSnapshot::unread(0)
        }]);
        let due = vec![
            (finding(Kind::Orphaned, 10, 1010), Remedy::Reclaim),
            (finding(Kind::Orphaned, 12, 1012), Remedy::Reclaim),
        ];
        assert!(request(due, false).targets(&snapshot).is_empty());
    }
}
