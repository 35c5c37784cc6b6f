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
mod gpu_reset;
mod kill;
mod reset;

use std::time::Duration;

pub use clear::{ClearRequest, Cleared, clear};
pub use gpu_reset::{GpuReset, GpuResetOutcome, GpuResetRequest, gpu_reset, gpu_reset_failed};
pub use kill::{Consent, KillRequest, Killed, PreparedKill, kill, prepare_kill};
pub use reset::{ResetRequest, failed as reset_failed, reset};

use crate::act::{self, Escalation, Identity, Signal};
use crate::classify::{self, Finding, Policy};
use crate::config;
use crate::error::{CoreError, Result};
use crate::host::ProcView;
use crate::nvml::{self, Gpus, Place};
use crate::plan::{self, Action, Guard, Outcome};
use crate::protect::{self, Protection};
use crate::select::Target;
use crate::snapshot::{HolderScan, Snapshot, SnapshotOptions};
use crate::verify;

/// What the road reads before it looks: the configuration, and NVML with every per-GPU
/// call bounded by the timeout in force (GPUCTL_NVML_TIMEOUT, the configuration's
/// nvml_timeout, 10 s). Opened once per command, whatever walks the road after.
pub struct Session {
    pub loaded: config::Loaded,
    pub gpus: Gpus,
}

impl Session {
    pub fn open() -> Result<Session> {
        Session::with(config::load()?)
    }

    /// NVML opened under the configuration already read.
    pub fn with(loaded: config::Loaded) -> Result<Session> {
        let gpus = Gpus::open_within(nvml::timeout(None, loaded.nvml_timeout())?)?;
        Ok(Session { loaded, gpus })
    }

    /// The GPUs and MIG instances `names` name; `None` for no names (every GPU).
    fn places(&self, names: &[String]) -> Result<Option<Vec<Place>>> {
        (!names.is_empty())
            .then(|| self.gpus.resolve_places(names))
            .transpose()
    }
}

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

/// A snapshot with the evidence classification needs, and its findings. `holders`: also
/// scan for device-file holders NVML does not list (`clear --holders`).
fn classified(
    gpus: &Gpus,
    policy: &Policy,
    holders: Option<HolderScan>,
    protection: &Protection,
) -> Result<(Snapshot, Vec<Finding>)> {
    let view = ProcView::system().map_err(|source| CoreError::Io {
        path: "/proc".into(),
        source,
    })?;
    let mut snapshot = Snapshot::take_with(gpus, &view, &SnapshotOptions::reclaim(holders))?;
    // Holders that are protected programs are tools, not suspects.
    if snapshot.devices.iter().any(|gpu| gpu.holders.is_some()) {
        protect::mark_claims(&mut snapshot, protection);
    }
    let lineages = snapshot.lineages(&view);
    let findings = classify::classify(&snapshot, &lineages, None, policy);
    Ok((snapshot, findings))
}
