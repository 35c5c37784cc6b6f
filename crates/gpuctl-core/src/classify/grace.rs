//! What only a process that watches over time knows (the watchdog): since when each
//! finding has held, whether it has lasted its grace, what was done about it, and the
//! [`History`] that rules read (parents that died, stopped spells, stuck GPUs).
//!
//! Pure: every call takes the pass's `now`, and the one fact from outside (which process now
//! holds a pid) is a function passed in, so each rule here is tested with an explicit clock.

use std::time::{Duration, Instant};

use super::stuck::{StuckCriteria, StuckTracker};
use super::{Finding, History, Remedy, Verdict};
use crate::act::Identity;
use crate::config::ReclaimKind;
use crate::host::ProcState;
use crate::pidmap::{PidMap, PidSet};
use crate::snapshot::Snapshot;

/// Since when each process has held a finding, across passes. A process is one identity
/// (pid and start ticks): a pid taken by a new process starts its own spell.
#[derive(Debug, Default, Clone)]
pub struct Spells {
    since: PidMap<Identity, Instant>,
}

impl Spells {
    /// One pass's holders, each with since when it counts when it is new (`now`; a stopped
    /// process counts from when it stopped). A spell already under way keeps its start.
    /// `listed`: for an incomplete read, the pids the snapshot lists. A GPU that failed
    /// the read lists no processes, so one it does not list may still be there and keeps
    /// its spell (a driver erring now and then must not restart a grace forever). `None`:
    /// a complete read, which ends the spell of each process it does not show.
    pub fn observe(
        &mut self,
        holders: impl IntoIterator<Item = (Identity, Instant)>,
        listed: Option<&PidSet<u32>>,
    ) {
        // A process in several findings counts from its first.
        let mut first: PidMap<Identity, Instant> = PidMap::default();
        for (id, since) in holders {
            first.entry(id).or_insert(since);
        }
        let holders = first;
        self.since.retain(|id, _| {
            holders.contains_key(id) || listed.is_some_and(|listed| !listed.contains(&id.pid))
        });
        for (id, since) in holders {
            self.since.entry(id).or_insert(since);
        }
    }

    /// Since when `id` has held its finding.
    pub fn since(&self, id: &Identity) -> Option<Instant> {
        self.since.get(id).copied()
    }

    /// Whether `id` has held its finding for `grace` at `now` (due exactly at the grace).
    pub fn is_due(&self, id: &Identity, grace: Duration, now: Instant) -> bool {
        self.since(id)
            .is_some_and(|since| now.saturating_duration_since(since) >= grace)
    }

    /// Ends `id`'s spell (it was reclaimed): if it shows again, it starts over.
    pub fn end(&mut self, id: &Identity) {
        self.since.remove(id);
    }
}

/// What was last done about a due process, so that each is logged once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    /// Logged as left (report mode, incomplete snapshot): acted on once that changes.
    Left,
    /// Logged as would-reclaim (dry run) or skipped by the guard: not tried again.
    Logged,
    /// A reclaim failed; tried again at this time.
    RetryAt(Instant),
}

/// [`Handled`] for each due process and remedy.
#[derive(Debug, Default, Clone)]
pub struct Handling {
    handled: PidMap<(Identity, Remedy), Handled>,
}

impl Handling {
    /// Forgets what is no longer due: if it is due again, it is handled afresh.
    pub fn keep_due(&mut self, due: &PidSet<(Identity, Remedy)>) {
        self.handled.retain(|key, _| due.contains(key));
    }

    pub fn get(&self, id: Identity, remedy: Remedy) -> Option<Handled> {
        self.handled.get(&(id, remedy)).copied()
    }

    /// Records `handled`; returns what was recorded before.
    pub fn set(&mut self, id: Identity, remedy: Remedy, handled: Handled) -> Option<Handled> {
        self.handled.insert((id, remedy), handled)
    }

    /// A failed reclaim at `now`: tried again after the grace (or the interval, when it is
    /// longer), not at every pass.
    pub fn failed(
        &mut self,
        id: Identity,
        remedy: Remedy,
        now: Instant,
        grace: Duration,
        interval: Duration,
    ) {
        self.set(id, remedy, Handled::RetryAt(now + grace.max(interval)));
    }

    /// Whether a failed reclaim waits still at `now` (it is not tried in this pass).
    pub fn waits(&self, id: Identity, remedy: Remedy, now: Instant) -> bool {
        matches!(self.get(id, remedy), Some(Handled::RetryAt(at)) if now < at)
    }
}

/// The watchdog's rules over time, as in force for one pass.
#[derive(Debug, Clone, Copy)]
pub struct Rules<'a> {
    /// How long a finding must hold, by the same process, before it is acted on.
    pub grace: Duration,
    /// The pass interval: a failed reclaim is not tried again before the next pass.
    pub interval: Duration,
    /// The kinds of leftover that are reclaimed (`watchdog.reclaim`); the others are only
    /// reported.
    pub reclaim: &'a [ReclaimKind],
    /// One pass with no grace (`--once`): everything found is due at once.
    pub once: bool,
}

/// What [`Watch::judge`] makes of one pass's findings.
#[derive(Debug, Clone, Default)]
pub struct Judgement {
    /// Leftovers of a kind that is reclaimed, due or not yet.
    pub stale: Vec<Finding>,
    pub stale_ids: PidSet<Identity>,
    /// Processes above their share, due or not yet.
    pub over: Vec<Finding>,
    pub over_ids: PidSet<Identity>,
    /// Findings that lasted the grace, each with what is done about it.
    pub due: Vec<(Finding, Remedy)>,
    /// Processes above their share whose grace ran out: each warned of once, in the pass
    /// it first did.
    pub warn: Vec<Finding>,
}

/// What to do, in one pass, with a process that is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Left alone (report mode, an incomplete snapshot); `first`: it was not left in the
    /// pass before, so it is said now, once.
    Left { first: bool },
    /// Said before and not tried again (a dry run's would-reclaim, a guard's skip).
    Said,
    /// A reclaim of it failed, and its retry is not due yet.
    Waits,
    /// Act on it now.
    Act,
}

/// How an attempt on a due process went, as [`Watch::settle`] records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tried {
    /// A dry run: it would have been signalled.
    WouldSignal,
    /// The guard skipped it.
    Skipped,
    /// Ended, and its memory came back.
    Reclaimed,
    /// Signalled but not ended, or its memory not released.
    Failed,
}

/// What a watcher keeps across passes to apply its [`Rules`]: since when each leftover and
/// each process above its share has been seen, who was warned of, and what was done about
/// each due process. Every call takes the pass's `now`.
#[derive(Debug, Default, Clone)]
pub struct Watch {
    /// Since when each leftover has been seen.
    pub stale: Spells,
    /// Since when each process above its share has been seen.
    pub over: Spells,
    warned: PidSet<Identity>,
    handling: Handling,
}

/// Whether `f` is a reclaim verdict of a kind that `remedy` acts on.
fn acted_on(f: &Finding, remedy: Remedy) -> bool {
    f.verdict == Verdict::Reclaim && f.kind.remedy() == remedy
}

/// Whether `f` is due: held through the grace by the same process (at once with `once`).
fn due_now(spells: &Spells, f: &Finding, rules: &Rules, now: Instant) -> bool {
    rules.once
        || f.identity
            .is_some_and(|id| spells.is_due(&id, rules.grace, now))
}

impl Watch {
    /// Sorts `findings` into leftovers and processes above their share, moves their spells
    /// on, and names those due: held for the grace by the same process (a stopped one
    /// counts from when it stopped: `stopped_since`). `listed`: for an incomplete read, the
    /// pids it lists (see [`Spells::observe`]); `None` for a complete one.
    pub fn judge(
        &mut self,
        findings: &[Finding],
        rules: &Rules,
        stopped_since: impl Fn(&Identity) -> Option<Instant>,
        listed: Option<&PidSet<u32>>,
        now: Instant,
    ) -> Judgement {
        // Leftovers: a reclaim verdict of a kind that is reclaimed.
        let stale: Vec<Finding> = findings
            .iter()
            .filter(|f| acted_on(f, Remedy::Reclaim))
            .filter(|f| {
                f.kind
                    .reclaim_kind()
                    .is_some_and(|k| rules.reclaim.contains(&k))
            })
            .cloned()
            .collect();
        let stale_ids: PidSet<Identity> = stale.iter().filter_map(|f| f.identity).collect();
        let holders = stale.iter().filter_map(|f| {
            let id = f.identity?;
            let since = match f.kind {
                super::Kind::Stopped => stopped_since(&id).unwrap_or(now),
                _ => now,
            };
            Some((id, since))
        });
        self.stale.observe(holders, listed);
        let mut due: Vec<(Finding, Remedy)> = stale
            .iter()
            .filter(|f| due_now(&self.stale, f, rules, now))
            .map(|f| (f.clone(), Remedy::Reclaim))
            .collect();
        // An idle process with a reclaim verdict waited out its `reclaim_after` already.
        due.extend(
            findings
                .iter()
                .filter(|f| f.kind == super::Kind::Idle && f.verdict == Verdict::Reclaim)
                .map(|f| (f.clone(), Remedy::Reclaim)),
        );

        let (over, over_ids, warn) = self.judge_over(findings, rules, now, &mut due);
        let all_due: PidSet<(Identity, Remedy)> = due
            .iter()
            .filter_map(|(f, remedy)| f.identity.map(|id| (id, *remedy)))
            .collect();
        self.handling.keep_due(&all_due);
        Judgement {
            stale,
            stale_ids,
            over,
            over_ids,
            due,
            warn,
        }
    }

    /// Moves on the spells of processes above their share; names those to warn of and adds
    /// the due ones to `due`.
    fn judge_over(
        &mut self,
        findings: &[Finding],
        rules: &Rules,
        now: Instant,
        due: &mut Vec<(Finding, Remedy)>,
    ) -> (Vec<Finding>, PidSet<Identity>, Vec<Finding>) {
        // Above its share: warned of once it lasted the grace, and due (ended only where
        // the fraction is enforced, which the caller decides).
        let over: Vec<Finding> = findings
            .iter()
            .filter(|f| acted_on(f, Remedy::Enforce))
            .cloned()
            .collect();
        let over_ids: PidSet<Identity> = over.iter().filter_map(|f| f.identity).collect();
        self.over
            .observe(over_ids.iter().map(|&id| (id, now)), None);
        self.warned.retain(|id| over_ids.contains(id));
        let mut warn = Vec::new();
        for f in &over {
            let Some(id) = f.identity else { continue };
            if due_now(&self.over, f, rules, now) {
                if self.warned.insert(id) {
                    warn.push(f.clone());
                }
                due.push((f.clone(), Remedy::Enforce));
            }
        }
        (over, over_ids, warn)
    }

    /// What to do with due process `id` in this pass. `left`: it is to be left alone (report
    /// mode, an incomplete snapshot).
    pub fn decide(
        &mut self,
        id: Identity,
        remedy: Remedy,
        left: bool,
        once: bool,
        now: Instant,
    ) -> Decision {
        if left {
            let before = self.handling.set(id, remedy, Handled::Left);
            return Decision::Left {
                first: before != Some(Handled::Left),
            };
        }
        if self.handling.get(id, remedy) == Some(Handled::Logged) {
            return Decision::Said;
        }
        if self.handling.waits(id, remedy, now) && !once {
            return Decision::Waits;
        }
        Decision::Act
    }

    /// Records how the attempt on `id` at `now` went: a would-reclaim or a skip is not
    /// tried again, a reclaimed process starts its spells over if it shows again, and a
    /// failed one is retried after the grace (or the interval, when that is longer).
    pub fn settle(
        &mut self,
        id: Identity,
        remedy: Remedy,
        tried: Tried,
        rules: &Rules,
        now: Instant,
    ) {
        match tried {
            Tried::WouldSignal | Tried::Skipped => {
                self.handling.set(id, remedy, Handled::Logged);
            }
            Tried::Reclaimed => {
                self.stale.end(&id);
                self.over.end(&id);
            }
            Tried::Failed => self
                .handling
                .failed(id, remedy, now, rules.grace, rules.interval),
        }
    }
}

impl Watch {
    /// A failed reclaim that no retry can mend (its GPU needs a reset first): logged once,
    /// not tried again.
    pub fn give_up(&mut self, id: Identity, remedy: Remedy) {
        self.handling.set(id, remedy, Handled::Logged);
    }
}

/// The pids `snapshot` lists on any GPU: for an incomplete read, what [`Spells::observe`]
/// and [`Watch::judge`] take as `listed`.
pub fn listed(snapshot: &Snapshot) -> PidSet<u32> {
    snapshot
        .devices
        .iter()
        .flat_map(|g| g.processes.iter().map(|p| p.pid))
        .collect()
}

/// The history kept across passes: each GPU process's parent, those whose parent died,
/// since when each has been stopped, and each GPU's stuck spell.
#[derive(Debug, Default)]
pub struct HistoryTracker {
    parents: PidMap<Identity, Identity>,
    parent_died: PidSet<Identity>,
    stopped_since: PidMap<Identity, Instant>,
    stuck: StuckTracker,
    stuck_for: PidMap<u32, Duration>,
}

impl HistoryTracker {
    /// Updates the history from `snapshot` at `now` and returns it.
    /// `incomplete`: some GPU failed this read, so a process it does not list may still be
    /// there; what was seen of those is kept. `identity_of(pid)`: the process that holds
    /// `pid` now, if any (`Identity::observe`), to tell whether a parent is still there.
    pub fn update(
        &mut self,
        snapshot: &Snapshot,
        now: Instant,
        incomplete: bool,
        stuck: Option<&StuckCriteria>,
        mut identity_of: impl FnMut(u32) -> Option<Identity>,
    ) -> History {
        let mut seen: PidSet<Identity> =
            PidSet::with_capacity_and_hasher(snapshot.most_listed(), Default::default());
        for process in snapshot.devices.iter().flat_map(|g| &g.processes) {
            let host = &process.host;
            let (Some(ticks), Some(ppid)) = (host.start_ticks, host.ppid) else {
                continue;
            };
            let id = Identity::new(process.pid, ticks);
            if !seen.insert(id) {
                continue;
            }
            match self.parents.get(&id).copied() {
                // Its parent changed: the one seen before is gone (a process is reparented
                // only when its parent exits), unless it is still there with that identity.
                Some(parent) if parent.pid != ppid => {
                    if identity_of(parent.pid) != Some(parent) {
                        self.parent_died.insert(id);
                    }
                    self.parents.remove(&id);
                }
                Some(_) => {}
                None if ppid > 1 => {
                    if let Some(parent) = identity_of(ppid) {
                        self.parents.insert(id, parent);
                    }
                }
                None => {}
            }
            if matches!(
                host.state,
                Some(ProcState::Stopped | ProcState::TracingStop)
            ) {
                self.stopped_since.entry(id).or_insert(now);
            } else {
                self.stopped_since.remove(&id);
            }
        }
        // Only a complete snapshot shows that a process is gone (the pid set only then).
        let listed: Option<PidSet<u32>> =
            incomplete.then(|| seen.iter().map(|id| id.pid).collect());
        let kept = |id: &Identity| {
            seen.contains(id)
                || listed
                    .as_ref()
                    .is_some_and(|listed| !listed.contains(&id.pid))
        };
        self.parents.retain(|id, _| kept(id));
        self.parent_died.retain(|id| kept(id));
        self.stopped_since.retain(|id, _| kept(id));
        self.stuck_for = match stuck {
            Some(criteria) => self
                .stuck
                .observe(snapshot, criteria, now)
                .into_iter()
                .collect(),
            None => PidMap::default(),
        };
        History {
            parent_died: self.parent_died.clone(),
            stopped_for: self
                .stopped_since
                .iter()
                .map(|(id, since)| (*id, now.saturating_duration_since(*since)))
                .collect(),
            stuck_for: self.stuck_for.clone(),
            idle: PidMap::default(),
        }
    }

    /// Since when `id` has been seen stopped.
    pub fn stopped_since(&self, id: &Identity) -> Option<Instant> {
        self.stopped_since.get(id).copied()
    }

    /// How long GPU `index` has looked stuck, as of the last update.
    pub fn stuck_for(&self, index: u32) -> Option<Duration> {
        self.stuck_for.get(&index).copied()
    }
}

#[cfg(test)]
mod tests;
