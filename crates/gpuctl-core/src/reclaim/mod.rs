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
//! The watchdog reclaims its due findings through a [`FindingsRequest`]. [`Reclaim::run`]
//! is the plan → act → verify part they all share (the trainer's cleanup calls it directly).
//! A dry run is the same call with the act step left out (and so nothing to verify), never a
//! second implementation.

mod clear;
mod found;
mod gpu_reset;
mod kill;
mod mps;
mod reset;

use std::time::Duration;

pub use clear::{ClearRequest, Cleared, clear, clear_saying};
pub use found::{Due, FindingsRequest};
pub use gpu_reset::{GpuReset, GpuResetOutcome, GpuResetRequest, gpu_reset, gpu_reset_failed};
pub use kill::{Consent, KillRequest, Killed, PreparedKill, kill, prepare_kill};
pub use reset::{ResetRequest, Restored, reset};

/// What the road reads before it looks (config and NVML, opened once per command): the read
/// road's [`crate::session::Session`], named here too for the fronts that act.
pub use crate::session::Session;

use crate::act::{self, Escalation, Identity, Signal};
use crate::classify::{Finding, Policy};
use crate::error::Result;
use crate::nvml::Gpus;
use crate::plan::{self, Disposition, Guard, Outcome};
use crate::protect::Protection;
use crate::select::Target;
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
    fn reclaim<'a>(
        &self,
        gpus: &'a Gpus,
        before: &'a Snapshot,
        guard: &'a Guard,
        dry_run: bool,
    ) -> Reclaim<'a> {
        Reclaim {
            guard,
            how: Escalation::then_kill(self.signal, self.timeout),
            verify: Verify::Release {
                gpus,
                before,
                within: self.timeout,
            },
            dry_run,
        }
    }
}

/// How to reclaim: who acts (the guard), how processes are ended, how their release is
/// verified, and whether anything is done at all.
#[derive(Debug, Clone)]
pub struct Reclaim<'a> {
    pub guard: &'a Guard,
    pub how: Escalation,
    pub verify: Verify<'a>,
    pub dry_run: bool,
}

/// How the road checks that what it ended gave its memory back.
#[derive(Debug, Clone, Copy)]
pub enum Verify<'a> {
    /// NVML is read again, for at most `within`, until every ended target has left its
    /// GPUs and their used memory fell by what it held in `before`, the snapshot it was
    /// selected from.
    Release {
        gpus: &'a Gpus,
        before: &'a Snapshot,
        within: Duration,
    },
    /// Nothing to read: the targets are processes NVML does not list (a crashed run's
    /// leftovers that hold no GPU memory, or NVML could not be read), so how each ended is
    /// its whole outcome.
    Unverified,
}

impl Reclaim<'_> {
    /// Plans `targets`, ends those the plan would signal, and verifies their release as
    /// [`Reclaim::verify`] says. Outcomes come in target order.
    pub fn run(&self, targets: Vec<Target>) -> Vec<Outcome> {
        self.carry_out(plan::plan(targets, self.guard))
    }

    /// Carries out a plan already made (what a front showed and its user confirmed): those
    /// it would signal are ended and their release verified; a dry run's plan is returned as
    /// it is.
    pub fn carry_out(&self, mut outcomes: Vec<Outcome>) -> Vec<Outcome> {
        if self.dry_run {
            return outcomes;
        }
        let before = match self.verify {
            Verify::Release { before, .. } => Some(before),
            Verify::Unverified => None,
        };
        end_planned(&mut outcomes, &self.how, before);
        if let Verify::Release {
            gpus,
            before,
            within,
        } = self.verify
        {
            verify::released(gpus, before, &mut outcomes, within);
        }
        outcomes
    }
}

/// Carries out a plan: every target it would signal is ended with `how`, all at once, and
/// is then signalled with how it ended; skipped ones stay as planned.
/// An MPS client is first asked of its control daemon (`mps::end_clients`), the supported
/// way; signals follow where the daemon could not be reached, refused, or did not end it.
fn end_planned(outcomes: &mut [Outcome], how: &Escalation, before: Option<&Snapshot>) {
    let planned: Vec<(usize, Identity)> = outcomes
        .iter()
        .enumerate()
        .filter_map(|(i, outcome)| match outcome.disposition {
            Disposition::WouldSignal { identity } => Some((i, identity)),
            _ => None,
        })
        .collect();
    if planned.is_empty() {
        return;
    }
    let mut asked = match before {
        Some(before) => mps::end_clients(&planned, before, how.timeout),
        None => Default::default(),
    };
    let mut signalled = Vec::new();
    for (i, identity) in planned {
        match asked.remove(&i) {
            Some(mps::Asked::Ended(ended)) => {
                outcomes[i].disposition = Disposition::Signalled {
                    identity,
                    ended,
                    release: None,
                };
            }
            Some(mps::Asked::Signal { why }) => signalled.push((i, identity, Some(why))),
            None => signalled.push((i, identity, None)),
        }
    }
    let identities: Vec<Identity> = signalled.iter().map(|&(_, identity, _)| identity).collect();
    for ((i, identity, why), ended) in signalled.into_iter().zip(act::end_all(&identities, how)) {
        let ended = match why {
            Some(why) => mps::said_signalled(ended, &why),
            None => ended,
        };
        outcomes[i].disposition = Disposition::Signalled {
            identity,
            ended,
            release: None,
        };
    }
}

/// A snapshot with the evidence classification needs, and its findings. `holders`: also
/// scan for device-file holders NVML does not list (`clear --holders`).
fn classified(
    session: &Session,
    policy: &Policy,
    holders: Option<HolderScan>,
    protection: &Protection,
) -> Result<(Snapshot, Vec<Finding>)> {
    // Holders that are protected programs are tools, not suspects.
    let mut reader = session
        .plain_reader(SnapshotOptions::reclaim(holders))
        .marking_holders(protection.clone());
    let look = session.look(&mut reader)?;
    let findings = look.classify(None, policy);
    Ok((look.snapshot, findings))
}
