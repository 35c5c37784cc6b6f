//! `clear`: reclaim what crashed runs left behind (orphaned workers, zombie holders, with
//! `include_stopped` stopped processes, with `holders` unlisted device-file holders), then
//! optionally wait until the GPUs are really free: the pre-run step of a job launcher.

use std::collections::BTreeSet;
use std::time::Duration;

use super::{Ending, Session, classified};
use crate::classify::{Finding, Policy, Remedy, Verdict};
use crate::error::Result;
use crate::plan::{Guard, Outcome};
use crate::report::{RECLAIM_SCHEMA, ReclaimReport};
use crate::select;
use crate::units::Amount;
use crate::verify::WaitReport;

/// What to clear, and what to wait for.
#[derive(Debug, Clone, Default)]
pub struct ClearRequest {
    /// GPUs or MIG instances by name; empty: every GPU.
    pub gpus: Vec<String>,
    /// Also reclaim stopped processes (state T).
    pub include_stopped: bool,
    /// Also end unlisted device-file holders that no live job claims.
    pub holders: bool,
    /// Then wait at most this long for the GPUs to be free.
    pub wait: Option<Duration>,
    /// What the wait waits for; `None`: no process left and almost no memory in use.
    pub min_free: Option<Amount>,
    pub ending: Ending,
    pub dry_run: bool,
}

/// What `clear` did: the road's outcome for each leftover, what it only reported, and with
/// a wait, how the wait ended.
#[derive(Debug)]
pub struct Cleared {
    pub outcomes: Vec<Outcome>,
    pub reported: Vec<Finding>,
    pub wait: Option<WaitReport>,
}

impl Cleared {
    /// The `clear --json` document of this run of `request` (the CLI prints it; the Python
    /// package returns it).
    pub fn report<'a>(&'a self, request: &ClearRequest) -> ReclaimReport<'a> {
        ReclaimReport {
            schema: RECLAIM_SCHEMA,
            command: "clear",
            dry_run: request.dry_run,
            signal: request.ending.signal.name(),
            timeout_ms: request.ending.timeout.as_millis() as u64,
            outcomes: &self.outcomes,
            refused: &[],
            reported: self.reported.iter().collect(),
            wait: self.wait.clone(),
        }
    }

    /// Every reclaim succeeded and, where one was asked for, the wait was met.
    pub fn clean(&self) -> bool {
        match &self.wait {
            Some(wait) => wait.met,
            None => self.outcomes.iter().all(Outcome::succeeded),
        }
    }
}

pub fn clear(session: &Session, request: &ClearRequest) -> Result<Cleared> {
    clear_saying(session, request, &mut |_| {})
}

/// [`clear`], calling `waiting` with the places not yet free while `--wait` waits (see
/// [`crate::verify::wait_until_free_saying`]).
pub fn clear_saying(
    session: &Session,
    request: &ClearRequest,
    waiting: &mut dyn FnMut(&[crate::verify::GpuState]),
) -> Result<Cleared> {
    let gpus = session.gpus()?;
    let places = session.places(&request.gpus)?;
    let policy = Policy {
        include_stopped: request.include_stopped,
        ..Policy::default()
    };
    let protection = session.protection().clone();
    let holders = match request.holders {
        true => Some(session.holder_scan(true)?),
        false => None,
    };
    let (snapshot, findings) = classified(session, &policy, holders, &protection)?;
    let guard = Guard::for_this_process(protection);
    // Leftovers of dead runs; clear enforces no policy.
    let leftovers: Vec<Finding> = findings
        .iter()
        .filter(|f| f.kind.remedy() == Remedy::Reclaim)
        .cloned()
        .collect();
    let mut targets = select::from_findings(&snapshot, &leftovers, places.as_deref());
    // Only root reclaims other users' leftovers; the caller's others are reported.
    let others = guard.keep_callers_own(&mut targets, &findings);
    let targeted: BTreeSet<u32> = targets.iter().map(|t| t.pid).collect();
    let on_selected = |finding: &&Finding| {
        places
            .as_deref()
            .is_none_or(|places| select::concerns(&snapshot, finding, places))
    };
    let reported: Vec<Finding> = findings
        .iter()
        .filter(|f| f.verdict == Verdict::Report)
        .chain(others.iter())
        .filter(on_selected)
        .filter(|f| !f.identity.is_some_and(|i| targeted.contains(&i.pid)))
        .cloned()
        .collect();

    let outcomes = request
        .ending
        .reclaim(gpus, &snapshot, &guard, request.dry_run)
        .run(targets);
    let wait = match (request.wait, request.dry_run) {
        (Some(limit), false) => Some(session.wait_for_free_saying(
            places.as_deref(),
            limit,
            request.min_free,
            waiting,
        )?),
        _ => None,
    };
    Ok(Cleared {
        outcomes,
        reported,
        wait,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_is_the_wait_when_one_was_asked_for_else_every_reclaim() {
        let wait = |met| WaitReport {
            met,
            waited_ms: 0,
            gpus: Vec::new(),
        };
        let nothing = Cleared {
            outcomes: Vec::new(),
            reported: Vec::new(),
            wait: None,
        };
        assert!(nothing.clean());
        let met = Cleared {
            wait: Some(wait(true)),
            ..nothing
        };
        assert!(met.clean());
        let missed = Cleared {
            wait: Some(wait(false)),
            ..met
        };
        assert!(!missed.clean());
    }

    #[test]
    fn the_default_request_clears_every_gpu_with_term_then_kill_after_10s() {
        let request = ClearRequest::default();
        assert!(request.gpus.is_empty() && request.wait.is_none() && !request.dry_run);
        assert_eq!(request.ending.signal, crate::act::Signal::TERM);
        assert_eq!(request.ending.timeout, Duration::from_secs(10));
    }
}
