//! What only a process that watches over time knows (the watchdog): since when each
//! finding has held, whether it has lasted its grace, what was done about it, and the
//! [`History`] that rules read (parents that died, stopped spells, stuck GPUs).
//!
//! Pure: every call takes the pass's `now`, and the one fact from outside (which process now
//! holds a pid) is a function passed in, so each rule here is tested with an explicit clock.

use std::time::{Duration, Instant};

use super::stuck::{StuckCriteria, StuckTracker};
use super::{History, Remedy};
use crate::act::Identity;
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
        let mut seen: PidSet<Identity> = PidSet::default();
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
mod tests {
    use super::*;
    use crate::fixtures;
    use crate::snapshot::GpuProcess;

    const GRACE: Duration = Duration::from_secs(30);

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn id(pid: u32, ticks: u64) -> Identity {
        Identity::new(pid, ticks)
    }

    fn listed(pids: &[u32]) -> PidSet<u32> {
        pids.iter().copied().collect()
    }

    #[test]
    fn a_spell_is_due_exactly_at_the_grace_not_before() {
        let t0 = Instant::now();
        let mut spells = Spells::default();
        let a = id(10, 1000);
        spells.observe([(a, t0)], None);
        assert!(!spells.is_due(&a, GRACE, t0));
        spells.observe([(a, t0 + secs(29))], None);
        assert_eq!(spells.since(&a), Some(t0), "a spell keeps its start");
        assert!(!spells.is_due(&a, GRACE, t0 + GRACE - Duration::from_millis(1)));
        assert!(spells.is_due(&a, GRACE, t0 + GRACE));
        assert!(
            spells.is_due(&a, Duration::ZERO, t0),
            "no grace: due at once"
        );
    }

    #[test]
    fn a_failed_read_does_not_restart_a_leftovers_grace() {
        let t0 = Instant::now();
        let mut spells = Spells::default();
        let a = id(10, 1000);
        spells.observe([(a, t0)], None);
        // Its GPU failed the read: not listed, not a holder, yet not gone.
        spells.observe([], Some(&listed(&[11])));
        assert_eq!(spells.since(&a), Some(t0));
        spells.observe([(a, t0 + secs(20))], None);
        assert!(spells.is_due(&a, GRACE, t0 + GRACE));
        // Listed by an incomplete read and no longer a holder: it is over.
        spells.observe([], Some(&listed(&[10])));
        assert_eq!(spells.since(&a), None);
    }

    #[test]
    fn a_process_that_goes_away_and_comes_back_starts_its_grace_again() {
        let t0 = Instant::now();
        let mut spells = Spells::default();
        let a = id(10, 1000);
        spells.observe([(a, t0)], None);
        spells.observe([], None);
        assert_eq!(spells.since(&a), None, "a complete read without it ends it");
        let back = t0 + secs(25);
        spells.observe([(a, back)], None);
        assert!(!spells.is_due(&a, GRACE, t0 + GRACE));
        assert!(spells.is_due(&a, GRACE, back + GRACE));
        // Reclaimed: it starts over too.
        spells.end(&a);
        assert_eq!(spells.since(&a), None);
    }

    #[test]
    fn a_reused_pid_is_a_new_identity_with_its_own_grace() {
        let t0 = Instant::now();
        let mut spells = Spells::default();
        let old = id(10, 1000);
        let new = id(10, 5000);
        spells.observe([(old, t0)], None);
        let later = t0 + secs(20);
        spells.observe([(new, later)], None);
        assert_eq!(spells.since(&old), None);
        assert!(!spells.is_due(&new, GRACE, t0 + GRACE));
        assert!(spells.is_due(&new, GRACE, later + GRACE));
        // Under an incomplete read that lists the pid, the old one is gone as well.
        let mut spells = Spells::default();
        spells.observe([(old, t0)], None);
        spells.observe([(new, later)], Some(&listed(&[10])));
        assert_eq!(spells.since(&old), None);
        assert_eq!(spells.since(&new), Some(later));
    }

    #[test]
    fn a_failed_reclaim_is_retried_after_the_grace_or_the_interval() {
        let t0 = Instant::now();
        let a = id(10, 1000);
        let mut handling = Handling::default();
        assert!(!handling.waits(a, Remedy::Reclaim, t0));
        handling.failed(a, Remedy::Reclaim, t0, GRACE, secs(5));
        assert!(handling.waits(a, Remedy::Reclaim, t0 + GRACE - Duration::from_millis(1)));
        assert!(!handling.waits(a, Remedy::Reclaim, t0 + GRACE));
        assert!(!handling.waits(a, Remedy::Enforce, t0), "by remedy");
        // An interval longer than the grace: not before the next pass.
        handling.failed(a, Remedy::Reclaim, t0, secs(1), secs(5));
        assert_eq!(
            handling.get(a, Remedy::Reclaim),
            Some(Handled::RetryAt(t0 + secs(5)))
        );
        // No longer due: forgotten.
        handling.keep_due(&PidSet::default());
        assert_eq!(handling.get(a, Remedy::Reclaim), None);
        assert_eq!(handling.set(a, Remedy::Reclaim, Handled::Left), None);
        assert_eq!(
            handling.set(a, Remedy::Reclaim, Handled::Left),
            Some(Handled::Left)
        );
    }

    fn process(pid: u32, ticks: u64, ppid: u32, state: ProcState) -> GpuProcess {
        fixtures::process(pid)
            .used_gib(1)
            .sm_pct(0)
            .state(state)
            .ppid(ppid)
            .started(ticks)
            .build()
    }

    fn snapshot(processes: Vec<GpuProcess>) -> Snapshot {
        fixtures::one_gpu(processes)
    }

    #[test]
    fn a_stopped_process_counts_from_when_it_stopped() {
        let t0 = Instant::now();
        let a = id(10, 1000);
        let mut history = HistoryTracker::default();
        let running = snapshot(vec![process(10, 1000, 1, ProcState::Sleeping)]);
        let stopped = snapshot(vec![process(10, 1000, 1, ProcState::Stopped)]);
        let none = |_| None;
        history.update(&running, t0, false, None, none);
        let h = history.update(&stopped, t0 + secs(5), false, None, none);
        assert_eq!(h.stopped_for.get(&a), Some(&Duration::ZERO));
        let h = history.update(&stopped, t0 + secs(40), false, None, none);
        assert_eq!(h.stopped_for.get(&a), Some(&secs(35)));
        assert_eq!(history.stopped_since(&a), Some(t0 + secs(5)));
        // The leftover's spell starts when it stopped, so it is due 30 s after that.
        let mut spells = Spells::default();
        spells.observe([(a, history.stopped_since(&a).unwrap())], None);
        assert!(!spells.is_due(&a, GRACE, t0 + secs(34)));
        assert!(spells.is_due(&a, GRACE, t0 + secs(35)));
        // Continued: its stop spell ends, and a later stop starts a new one.
        history.update(&running, t0 + secs(41), false, None, none);
        assert_eq!(history.stopped_since(&a), None);
        let h = history.update(&stopped, t0 + secs(50), false, None, none);
        assert_eq!(h.stopped_for.get(&a), Some(&Duration::ZERO));
    }

    #[test]
    fn a_failed_read_keeps_the_history_of_what_it_does_not_list() {
        let t0 = Instant::now();
        let a = id(10, 1000);
        let mut history = HistoryTracker::default();
        let stopped = snapshot(vec![process(10, 1000, 1, ProcState::Stopped)]);
        history.update(&stopped, t0, false, None, |_| None);
        let h = history.update(&snapshot(vec![]), t0 + secs(5), true, None, |_| None);
        assert_eq!(h.stopped_for.get(&a), Some(&secs(5)));
        let h = history.update(&snapshot(vec![]), t0 + secs(6), false, None, |_| None);
        assert!(h.stopped_for.is_empty(), "a complete read without it");
    }

    #[test]
    fn a_parent_that_is_gone_is_noted_one_still_there_is_not() {
        let t0 = Instant::now();
        let child = id(10, 1000);
        let parent = id(7, 500);
        let mut history = HistoryTracker::default();
        let under_parent = snapshot(vec![process(10, 1000, 7, ProcState::Sleeping)]);
        let reparented = snapshot(vec![process(10, 1000, 1, ProcState::Sleeping)]);
        history.update(&under_parent, t0, false, None, |pid| {
            (pid == 7).then_some(parent)
        });
        // Reparented while its old parent is still there (it was moved, not orphaned).
        let h = history.update(&reparented, t0 + secs(1), false, None, |pid| {
            (pid == 7).then_some(parent)
        });
        assert!(h.parent_died.is_empty());

        let mut history = HistoryTracker::default();
        history.update(&under_parent, t0, false, None, |pid| {
            (pid == 7).then_some(parent)
        });
        // Pid 7 now belongs to another process: the parent seen before died.
        let h = history.update(&reparented, t0 + secs(1), false, None, |pid| {
            (pid == 7).then_some(id(7, 9000))
        });
        assert!(h.parent_died.contains(&child));
        let h = history.update(&reparented, t0 + secs(2), false, None, |_| None);
        assert!(h.parent_died.contains(&child), "remembered while it stays");
        let h = history.update(&snapshot(vec![]), t0 + secs(3), false, None, |_| None);
        assert!(h.parent_died.is_empty());
    }
}
