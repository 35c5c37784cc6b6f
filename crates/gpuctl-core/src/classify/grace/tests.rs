//! The rules over time, each with an explicit clock.

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

fn finding(kind: super::super::Kind, id: Option<Identity>) -> Finding {
    Finding {
        kind,
        verdict: if kind.remedy() == Remedy::Report {
            Verdict::Report
        } else {
            Verdict::Reclaim
        },
        identity: id,
        gpus: vec![0],
        bytes: Some(1 << 30),
        reason: kind.name().to_string(),
        idle: None,
    }
}

fn due_of(judgement: &Judgement) -> Vec<(u32, Remedy)> {
    judgement
        .due
        .iter()
        .map(|(f, remedy)| (f.identity.unwrap().pid, *remedy))
        .collect()
}

const RECLAIM_ZOMBIES: &[ReclaimKind] = &[ReclaimKind::Zombie];

fn rules(once: bool) -> Rules<'static> {
    Rules {
        grace: GRACE,
        interval: secs(5),
        reclaim: RECLAIM_ZOMBIES,
        once,
    }
}

#[test]
fn a_leftover_and_one_above_its_share_are_due_after_the_grace_and_warned_of_once() {
    use super::super::Kind;
    let t0 = Instant::now();
    let (zombie, greedy) = (id(10, 1000), id(11, 1100));
    let findings = [
        finding(Kind::ZombieHolder, Some(zombie)),
        finding(Kind::AboveFraction, Some(greedy)),
        finding(Kind::Unattributed, None),
    ];
    let mut watch = Watch::default();
    let never_stopped = |_: &Identity| None;
    let first = watch.judge(&findings, &rules(false), never_stopped, None, t0);
    assert_eq!(first.stale.len(), 1);
    assert!(first.stale_ids.contains(&zombie) && first.over_ids.contains(&greedy));
    assert!(first.due.is_empty() && first.warn.is_empty(), "{first:?}");
    let before = t0 + GRACE - Duration::from_millis(1);
    assert!(
        watch
            .judge(&findings, &rules(false), never_stopped, None, before)
            .due
            .is_empty()
    );
    let due = watch.judge(&findings, &rules(false), never_stopped, None, t0 + GRACE);
    assert_eq!(due_of(&due), [(10, Remedy::Reclaim), (11, Remedy::Enforce)]);
    assert_eq!(due.warn.len(), 1, "warned of as its grace runs out");
    let again = watch.judge(&findings, &rules(false), never_stopped, None, t0 + secs(31));
    assert_eq!(due_of(&again).len(), 2);
    assert!(again.warn.is_empty(), "warned of once");
    // A kind watchdog.reclaim does not name is not a leftover to reclaim.
    let report_only = Rules {
        reclaim: &[],
        ..rules(true)
    };
    let judged = Watch::default().judge(&findings, &report_only, never_stopped, None, t0);
    assert!(judged.stale.is_empty());
    assert_eq!(due_of(&judged), [(11, Remedy::Enforce)]);
}

#[test]
fn once_everything_found_is_due_at_once() {
    use super::super::Kind;
    let t0 = Instant::now();
    let findings = [finding(Kind::ZombieHolder, Some(id(10, 1000)))];
    let judged = Watch::default().judge(&findings, &rules(true), |_| None, None, t0);
    assert_eq!(due_of(&judged), [(10, Remedy::Reclaim)]);
}

#[test]
fn a_stopped_leftover_is_due_a_grace_after_it_stopped() {
    use super::super::Kind;
    let t0 = Instant::now();
    let a = id(10, 1000);
    let findings = [finding(Kind::Stopped, Some(a))];
    let stopped_rules = Rules {
        reclaim: &[ReclaimKind::Stopped],
        ..rules(false)
    };
    let stopped_at = |_: &Identity| Some(t0);
    let mut watch = Watch::default();
    // First found 20 s after it stopped: due 10 s later, not 30.
    let found = t0 + secs(20);
    assert!(
        watch
            .judge(&findings, &stopped_rules, stopped_at, None, found)
            .due
            .is_empty()
    );
    let due = watch.judge(&findings, &stopped_rules, stopped_at, None, t0 + GRACE);
    assert_eq!(due_of(&due), [(10, Remedy::Reclaim)]);
}

#[test]
fn a_due_process_is_acted_on_said_once_or_retried_after_the_grace() {
    use super::super::Kind;
    let t0 = Instant::now();
    let a = id(10, 1000);
    let rules = rules(false);
    let mut watch = Watch::default();
    // Left alone: said the first time only.
    assert_eq!(
        watch.decide(a, Remedy::Reclaim, true, false, t0),
        Decision::Left { first: true }
    );
    assert_eq!(
        watch.decide(a, Remedy::Reclaim, true, false, t0 + secs(1)),
        Decision::Left { first: false }
    );
    assert_eq!(
        watch.decide(a, Remedy::Reclaim, false, false, t0 + secs(2)),
        Decision::Act
    );
    // Failed: it waits out the grace (longer than the interval), unless once.
    watch.settle(a, Remedy::Reclaim, Tried::Failed, &rules, t0);
    let before = t0 + GRACE - Duration::from_millis(1);
    assert_eq!(
        watch.decide(a, Remedy::Reclaim, false, false, before),
        Decision::Waits
    );
    assert_eq!(
        watch.decide(a, Remedy::Reclaim, false, true, before),
        Decision::Act
    );
    assert_eq!(
        watch.decide(a, Remedy::Reclaim, false, false, t0 + GRACE),
        Decision::Act
    );
    assert_eq!(
        watch.decide(a, Remedy::Enforce, false, false, t0),
        Decision::Act,
        "by remedy"
    );
    // A dry run's would-reclaim is said once, then only counted, until no longer due.
    watch.settle(a, Remedy::Reclaim, Tried::WouldSignal, &rules, t0);
    assert_eq!(
        watch.decide(a, Remedy::Reclaim, false, false, t0 + secs(90)),
        Decision::Said
    );
    watch.judge(&[], &rules, |_| None, None, t0 + secs(91));
    assert_eq!(
        watch.decide(a, Remedy::Reclaim, false, false, t0 + secs(92)),
        Decision::Act,
        "forgotten once no longer due"
    );
    // Reclaimed: its spell is over, so if it shows again its grace starts again.
    let findings = [finding(Kind::ZombieHolder, Some(a))];
    watch.judge(&findings, &rules, |_| None, None, t0);
    assert_eq!(watch.stale.since(&a), Some(t0));
    watch.settle(a, Remedy::Reclaim, Tried::Reclaimed, &rules, t0 + GRACE);
    assert_eq!(watch.stale.since(&a), None);
}
