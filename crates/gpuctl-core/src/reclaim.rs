//! The road every reclaim walks, whoever asks (`gpuctl kill` and `clear`, the watchdog, the
//! trainer's startup cleanup):
//!
//! [`snapshot`](crate::snapshot) → [`classify`](crate::classify) (findings) →
//! [`select`](crate::select) (targets) → [`plan`](crate::plan) (guarded) →
//! [`act`](crate::act) (signals by identity) → [`verify`](crate::verify) (memory back) →
//! [`report`](crate::report).
//!
//! [`Reclaim::run`] is the plan → act → verify part. A dry run is the same call with the
//! act step left out (and so nothing to verify), never a second implementation.

use std::time::Duration;

use crate::act::{self, Escalation, Identity};
use crate::nvml::Gpus;
use crate::plan::{self, Action, Guard, Outcome};
use crate::select::Target;
use crate::snapshot::Snapshot;
use crate::verify;

/// How to reclaim: who acts (the guard), how processes are ended, how long their release is
/// verified, and whether anything is done at all.
#[derive(Debug, Clone)]
pub struct Reclaim<'a> {
    pub gpus: &'a Gpus,
    pub guard: &'a Guard,
    pub how: Escalation,
    pub verify_for: Duration,
    pub dry_run: bool,
}

impl Reclaim<'_> {
    /// Plans `targets` (selected from `before`), ends those the plan signals, and verifies
    /// through NVML that they left their GPUs and their memory came back. Outcomes come in
    /// target order.
    pub fn run(&self, before: &Snapshot, targets: Vec<Target>) -> Vec<Outcome> {
        let mut outcomes = plan::plan(targets, self.guard, self.dry_run);
        if self.dry_run {
            return outcomes;
        }
        carry_out(&mut outcomes, &self.how);
        verify::released(self.gpus, before, &mut outcomes, self.verify_for);
        outcomes
    }
}

/// Carries out a plan: every target planned to be signalled is ended with `how`, all at
/// once; the others are left as planned.
fn carry_out(outcomes: &mut [Outcome], how: &Escalation) {
    let signalled: Vec<usize> = (0..outcomes.len())
        .filter(|&i| outcomes[i].action == Action::Signal)
        .collect();
    if signalled.is_empty() {
        return;
    }
    // The plan signals only targets with an identity, so the results line up.
    let identities: Vec<Identity> = signalled
        .iter()
        .filter_map(|&i| outcomes[i].target.identity())
        .collect();
    debug_assert_eq!(identities.len(), signalled.len());
    for (&i, ended) in signalled.iter().zip(act::end_all(&identities, how)) {
        outcomes[i].ended = Some(ended);
    }
}
