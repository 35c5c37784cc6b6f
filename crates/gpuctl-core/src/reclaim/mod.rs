//! The road every reclaim walks, whoever asks (`gpuctl kill`, `clear` and `reset`, the Slurm
//! prolog and epilog, the watchdog, the trainer's startup cleanup, and every front to come):
//!
//! [`snapshot`](crate::snapshot) → [`classify`](crate::classify) (findings) →
//! [`select`](crate::select) (targets) → [`plan`](crate::plan) (guarded) →
//! [`act`](crate::act) (signals by identity) → [`verify`](crate::verify) (memory back) →
//! [`report`](crate::report).
//!
//! A front maps its own input (clap arguments, a Slurm environment, Python keywords, a key
//! press) onto a request, calls [`kill()`], [`clear()`] or [`reset()`] with a [`Session`],
//! and renders the plain outcome it gets back; it never assembles the stages itself.
//! [`Reclaim::run`] is the plan → act → verify part they share with the watchdog. A dry run
//! is the same call with the act step left out (and so nothing to verify), never a second
//! implementation.

mod clear;
mod kill;
mod reset;

use std::time::Duration;

pub use clear::{ClearRequest, Cleared, clear};
pub use kill::{Consent, KillRequest, Killed, PreparedKill, kill, prepare_kill};
pub use reset::{ResetRequest, failed as reset_failed, reset};

/// What the road reads before it looks (config and NVML, opened once per command): the read
/// road's [`crate::session::Session`], named here too for the fronts that act.
pub use crate::session::Session;

use crate::act::{self, Escalation, Identity, Signal};
use crate::classify::{Finding, Policy};
use crate::error::Result;
use crate::nvml::Gpus;
use crate::plan::{self, Action, Guard, Outcome};
use crate::protect::Protection;
use crate::select::Target;
use crate::session::Reader;
use crate::snapshot::{HolderScan, Snapshot, SnapshotOptions};
use crate::verify;

/// How a process is ended: `signal` first, SIGKILL after `timeout`; and how long NVML may
/// take after that to show its memory released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ending {
    pub signal: Signal,
    pub timeout: Duration,
}

impl Default for Ending {
    /// SIGTERM, then SIGKILL after 10 s: what `kill` and `clear` do unless told otherwise.
    fn default() -> Ending {
        Ending {
            signal: Signal::TERM,
            timeout: Duration::from_secs(10),
        }
    }
}

impl Ending {
    fn reclaim<'a>(&self, gpus: &'a Gpus, guard: &'a Guard, dry_run: bool) -> Reclaim<'a> {
        Reclaim {
            gpus,
            guard,
            how: Escalation::then_kill(self.signal, self.timeout),
            verify_for: self.timeout,
            dry_run,
        }
    }
}

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
        self.carry_out(before, plan::plan(targets, self.guard, self.dry_run))
    }

    /// Carries out a plan already made (of targets selected from `before`): those it
    /// signals are ended and their release verified; a dry run's plan is returned as it is.
    pub fn carry_out(&self, before: &Snapshot, mut outcomes: Vec<Outcome>) -> Vec<Outcome> {
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

/// A snapshot with the evidence classification needs, and its findings. `holders`: also
/// scan for device-file holders NVML does not list (`clear --holders`).
fn classified(
    gpus: &Gpus,
    policy: &Policy,
    holders: Option<HolderScan>,
    protection: &Protection,
) -> Result<(Snapshot, Vec<Finding>)> {
    // Holders that are protected programs are tools, not suspects.
    let look = Reader::new(SnapshotOptions::reclaim(holders))
        .marking_holders(protection.clone())
        .look(gpus)?;
    let findings = look.classify(None, policy);
    Ok((look.snapshot, findings))
}
