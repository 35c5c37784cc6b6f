//! `kill`: end the GPU processes a selector names, whoever holds them (the admin's call:
//! only protected programs and gpuctl's own lineage are spared, and a caller who is not root
//! ends only its own processes).

use std::collections::BTreeSet;
use std::time::Duration;

use super::{Ending, Session, classified};
use crate::act::{Ended, Identity, Signal};
use crate::classify::Policy;
use crate::error::{CoreError, Result};
use crate::nvml::{Gpus, Place};
use crate::plan::{Disposition, Guard, Outcome};
use crate::report::{RECLAIM_SCHEMA, ReclaimReport};
use crate::select::{self, Criterion, OwnerMatch, Refusal, Selector, Target};
use crate::snapshot::Snapshot;

/// Which processes to end, and how. Selectors combine as AND; a list widens its own
/// selector (OR). At least one selector must be given: nothing selects every process.
#[derive(Debug, Clone, Default)]
pub struct KillRequest {
    /// GPUs or MIG instances by name (index, UUID, bus id, MIG UUID, GPU/GI).
    pub gpus: Vec<String>,
    pub pids: Vec<u32>,
    /// Exactly these processes (pid and start time), as a view showed them: a process that
    /// has taken one's pid since is not it (`gpuctl top`'s rows and marks).
    pub processes: Vec<Identity>,
    pub uids: Vec<u32>,
    /// Owners from the cgroup or the job's environment (`slurm:123`, `unit:x.service`, …).
    pub owners: Vec<OwnerMatch>,
    /// Only leftovers of crashed runs, as `clear` finds them.
    pub stale: bool,
    pub min_bytes: Option<u64>,
    pub older_than: Option<Duration>,
    /// Every GPU process the other selectors allow: must be said, never implied.
    pub all: bool,
    pub ending: Ending,
    /// End a CUDA MPS server or control daemon that `pids` names, and with it every client
    /// it serves (never one another selector found).
    pub force: bool,
    /// Plan and report, signal nothing.
    pub dry_run: bool,
}

impl KillRequest {
    /// The fields that select processes, by their names here: at least one must be given.
    pub const SELECTORS: &'static [&'static str] = &[
        "pids",
        "gpus",
        "uids",
        "owners",
        "stale",
        "min_bytes",
        "older_than",
        "all",
    ];

    /// The selector of this request, its GPU names resolved to `places`.
    fn selector(&self, places: Option<Vec<Place>>) -> Result<Selector> {
        let mut criteria = Vec::new();
        if let Some(places) = places {
            criteria.push(Criterion::Gpus(places));
        }
        if !self.pids.is_empty() {
            criteria.push(Criterion::Pids(self.pids.clone()));
        }
        if !self.processes.is_empty() {
            criteria.push(Criterion::Processes(self.processes.clone()));
        }
        if !self.uids.is_empty() {
            criteria.push(Criterion::Uids(self.uids.clone()));
        }
        if !self.owners.is_empty() {
            criteria.push(Criterion::Owners(self.owners.clone()));
        }
        if self.stale {
            criteria.push(Criterion::Stale);
        }
        if let Some(min) = self.min_bytes {
            criteria.push(Criterion::MinBytes(min));
        }
        if let Some(age) = self.older_than {
            criteria.push(Criterion::OlderThan(age));
        }
        if self.all {
            criteria.push(Criterion::All);
        }
        Selector::all_of(criteria).map_err(|_| CoreError::NothingSelected {
            fields: KillRequest::SELECTORS,
        })
    }
}

/// What `kill` did: the road's outcome for each target, and the pids it refused.
#[derive(Debug)]
pub struct Killed {
    pub outcomes: Vec<Outcome>,
    pub refused: Vec<Refusal>,
}

impl Killed {
    /// Every target ended as asked and none refused.
    pub fn clean(&self) -> bool {
        self.outcomes.iter().all(Outcome::succeeded) && self.refused.is_empty()
    }

    /// The `kill --json` document of this run of `request` (the CLI prints it; the Python
    /// package returns it).
    pub fn report<'a>(&'a self, request: &KillRequest) -> ReclaimReport<'a> {
        ReclaimReport {
            schema: RECLAIM_SCHEMA,
            command: "kill",
            dry_run: request.dry_run,
            signal: request.ending.signal.name(),
            timeout_ms: request.ending.timeout.as_millis() as u64,
            outcomes: &self.outcomes,
            refused: &self.refused,
            reported: Vec::new(),
            wait: None,
        }
    }
}

/// A kill selected and guarded but not yet carried out: a front that asks before acting
/// (a terminal prompt, `gpuctl top`'s confirmation) looks at it between the two steps.
pub struct PreparedKill<'s> {
    /// The GPUs the plan was read from, and is verified on.
    gpus: &'s Gpus,
    request: KillRequest,
    snapshot: Snapshot,
    targets: Vec<Target>,
    /// The plan, built once: what is shown before a yes is what is carried out after it.
    planned: Vec<Outcome>,
    refused: Vec<Refusal>,
    guard: Guard,
    all: bool,
}

/// Why a process named by identity is not signalled: its pid now names another process
/// (the one asked for exited, and the pid was given to a newcomer).
pub const NOT_CONFIRMED: &str = "not the process you confirmed";

/// What a kill needs the caller's yes for: processes of several users, or `all`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consent {
    pub all: bool,
    /// The users whose processes would be signalled ("alice", "uid 1002").
    pub users: Vec<String>,
    /// How many processes would be signalled.
    pub processes: usize,
    pub signal: Signal,
}

/// Selects and guards what `request` names. `None` when no GPU process matches it.
pub fn prepare_kill<'s>(
    session: &'s Session,
    request: &KillRequest,
) -> Result<Option<PreparedKill<'s>>> {
    let selector = request.selector(session.places(&request.gpus)?)?;
    // An explicit kill is the admin's call: only protected commands are spared, not users.
    let protection = session.protection().clone().programs_only();
    let (snapshot, findings) = classified(session, &Policy::default(), None, &protection)?;
    let (targets, mut refused) = select::select(&snapshot, &findings, &selector);
    refused.extend(replaced(&snapshot, &request.processes));
    if targets.is_empty() && refused.is_empty() {
        return Ok(None);
    }
    let forced = match request.force {
        true => request.pids.as_slice(),
        false => &[],
    };
    let guard = Guard::for_this_process(protection).forcing(forced);
    let mut planned = crate::plan::plan(targets.clone(), &guard);
    super::mps::name_the_clients(&mut planned, &snapshot);
    Ok(Some(PreparedKill {
        gpus: session.gpus()?,
        request: request.clone(),
        snapshot,
        targets,
        planned,
        refused,
        guard,
        all: selector.is_all(),
    }))
}

/// Selects, guards, signals and verifies: [`prepare_kill`] and [`PreparedKill::run`] with
/// no one to ask. `None` when no GPU process matches.
pub fn kill(session: &Session, request: &KillRequest) -> Result<Option<Killed>> {
    Ok(prepare_kill(session, request)?.map(PreparedKill::run))
}

/// The identities asked for whose pid a GPU process of `snapshot` now has with another start
/// time: refused, as not the process asked for.
fn replaced(snapshot: &Snapshot, asked: &[Identity]) -> Vec<Refusal> {
    asked
        .iter()
        .filter(|identity| {
            Target::of(snapshot, identity.pid)
                .and_then(|target| target.identity())
                .is_some_and(|now| now != **identity)
        })
        .map(|identity| Refusal {
            pid: identity.pid,
            reason: format!("{NOT_CONFIRMED}: its pid now names a later process"),
        })
        .collect()
}

/// The consent signalling `targets` needs: with `all`, or for processes of several users
/// (those the guard skips do not count).
fn consent(targets: &[Target], guard: &Guard, all: bool, signal: Signal) -> Option<Consent> {
    let acting: Vec<&Target> = targets
        .iter()
        .filter(|t| guard.check(t).is_none())
        .collect();
    let users: BTreeSet<String> = acting.iter().map(|t| t.owner_name()).collect();
    if acting.is_empty() || (!all && users.len() <= 1) {
        return None;
    }
    Some(Consent {
        all,
        users: users.into_iter().collect(),
        processes: acting.len(),
        signal,
    })
}

impl PreparedKill<'_> {
    /// What the plan would signal, in target order.
    pub fn targets(&self) -> &[Target] {
        &self.targets
    }

    /// Whether a yes is needed before signalling: with `all`, or when processes of more than
    /// one user would be signalled (targets the guard skips do not count). Never for a dry
    /// run, which signals nothing.
    pub fn consent(&self) -> Option<Consent> {
        if self.request.dry_run {
            return None;
        }
        consent(
            &self.targets,
            &self.guard,
            self.all,
            self.request.ending.signal,
        )
    }

    /// The plan [`PreparedKill::run`] would carry out, without carrying it out: each target
    /// would be signalled, or is skipped with why. A front that asks before acting (`gpuctl
    /// top`) shows this; `run` then acts on the same targets.
    pub fn plan(&self) -> Vec<Outcome> {
        self.planned.clone()
    }

    /// How the targets would be ended: the first signal, then SIGKILL after the timeout.
    pub fn ending(&self) -> Ending {
        self.request.ending
    }

    /// Whether the caller may signal other users' processes (root).
    pub fn is_root(&self) -> bool {
        self.guard.is_root()
    }

    /// The road from the plan on: exactly the plan built when this kill was prepared,
    /// signalled (unless a dry run) and verified. A process named by identity that has
    /// been replaced since (its pid now another process's) is skipped, as
    /// [`NOT_CONFIRMED`], with nothing sent to it.
    pub fn run(self) -> Killed {
        let mut outcomes = self
            .request
            .ending
            .reclaim(self.gpus, &self.snapshot, &self.guard, self.request.dry_run)
            .carry_out(self.planned);
        if !self.request.processes.is_empty() {
            for outcome in &mut outcomes {
                if matches!(outcome.ended(), Some(Ended::Reused { .. })) {
                    outcome.disposition = Disposition::Skipped {
                        why: NOT_CONFIRMED.to_string(),
                    };
                }
            }
        }
        Killed {
            outcomes,
            refused: self.refused,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::host::HostProcess;
    use crate::protect::Protection;

    #[test]
    fn a_request_without_a_selector_is_a_usage_error() {
        let error = KillRequest::default().selector(None).unwrap_err();
        assert!(
            matches!(error, CoreError::NothingSelected { .. }),
            "{error}"
        );
        // Named as the request names them: each front words them its own way.
        assert_eq!(
            error.to_string(),
            "no process selected: give pids, gpus, uids, owners, stale, min_bytes, \
             older_than or all"
        );
        // Ending and dry run select nothing on their own either.
        let request = KillRequest {
            dry_run: true,
            ending: Ending {
                signal: Signal::KILL,
                timeout: Duration::ZERO,
            },
            ..KillRequest::default()
        };
        assert!(request.selector(None).is_err());
    }

    #[test]
    fn each_field_is_a_criterion_and_gpus_come_resolved() {
        let request = KillRequest {
            pids: vec![7],
            ..KillRequest::default()
        };
        let expected = Selector::by(Criterion::Pids(vec![7]));
        assert_eq!(request.selector(None).unwrap(), expected);
        let places = vec![Place::whole(1)];
        assert_eq!(
            request.selector(Some(places.clone())).unwrap(),
            Selector::by(Criterion::Gpus(places)).and(Criterion::Pids(vec![7]))
        );
        let all = KillRequest {
            all: true,
            min_bytes: Some(1 << 30),
            ..KillRequest::default()
        };
        let selector = all.selector(None).unwrap();
        assert!(selector.is_all());
        assert_eq!(
            selector,
            Selector::by(Criterion::MinBytes(1 << 30)).and(Criterion::All)
        );
    }

    fn target(pid: u32, uid: u32, user: &str) -> Target {
        let host = HostProcess {
            confirmed: true,
            uid: Some(uid),
            user: Some(user.into()),
            start_ticks: Some(1),
            ..HostProcess::unconfirmed("")
        };
        let mut target = Target::new(pid, &Arc::new(host));
        target.gpus = vec![0];
        target
    }

    #[test]
    fn an_identity_whose_pid_now_has_another_start_time_is_refused_as_not_confirmed() {
        use crate::snapshot::GpuSnapshot;
        let process = |pid: u32, start: u64| {
            crate::fixtures::process(pid)
                .used_gib(1)
                .confirmed()
                .started(start)
                .build()
        };
        let mut gpu = GpuSnapshot::unread(0);
        gpu.processes = vec![process(10, 500), process(20, 700)];
        let snapshot = Snapshot::of(vec![gpu]);
        let asked = [
            Identity::new(10, 500),
            Identity::new(20, 600),
            Identity::new(30, 1),
        ];
        let refused = replaced(&snapshot, &asked);
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert_eq!(refused[0].pid, 20);
        assert!(refused[0].reason.starts_with(NOT_CONFIRMED), "{refused:?}");
        // Asked for by identity: only the same process is selected.
        let selector = KillRequest {
            processes: asked.to_vec(),
            ..KillRequest::default()
        }
        .selector(None)
        .unwrap();
        let (targets, _) = select::select(&snapshot, &[], &selector);
        let pids: Vec<u32> = targets.iter().map(|t| t.pid).collect();
        assert_eq!(pids, [10]);
    }

    #[test]
    fn consent_is_asked_for_several_users_or_all_but_not_for_one() {
        let guard = Guard::for_this_process(Protection::built_in());
        // Pids that are neither this process nor its ancestors (nor init).
        let alice = target(4_000_001, 1001, "alice");
        let alice2 = target(4_000_002, 1001, "alice");
        let bob = target(4_000_003, 1002, "bob");
        let one_user = [alice.clone(), alice2];
        if guard.is_root() {
            assert_eq!(consent(&one_user, &guard, false, Signal::TERM), None);
            let asked = consent(&[alice.clone(), bob], &guard, false, Signal::TERM).unwrap();
            assert_eq!(asked.users, ["alice", "bob"]);
            assert_eq!((asked.processes, asked.all), (2, false));
            let all = consent(&[alice], &guard, true, Signal::KILL).unwrap();
            assert!(all.all && all.processes == 1 && all.signal == Signal::KILL);
        } else {
            // Another user's processes are skipped by the guard: nothing to ask about.
            assert_eq!(consent(&[alice, bob], &guard, true, Signal::TERM), None);
        }
        assert_eq!(consent(&[], &guard, true, Signal::TERM), None);
    }
}
