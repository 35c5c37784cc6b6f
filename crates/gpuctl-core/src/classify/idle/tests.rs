use super::*;
use crate::classify::{History, Kind, Policy, classify};
use crate::fixtures;
use crate::host::ProcState;
use crate::snapshot::{GpuSnapshot, Utilization};

const GIB: u64 = 1 << 30;
const MIN: u64 = 60_000;

const CRITERIA: IdleCriteria = IdleCriteria {
    after: Duration::from_secs(3600),
    min_memory: GIB,
    util_below: 1,
};

fn id(pid: u32, ticks: u64) -> Identity {
    Identity::new(pid, ticks)
}

fn sample(identity: Identity, gib: u64, sm: Option<u32>) -> Sample {
    Sample {
        identity,
        bytes: gib * GIB,
        sm_pct: sm,
        source: if sm.is_some() {
            IdleSource::Process
        } else {
            IdleSource::Unknown
        },
    }
}

/// Samples `samples` every minute from `from_min` to `to_min` (inclusive).
fn run(tracker: &mut IdleTracker, from_min: u64, to_min: u64, samples: &[Sample]) {
    for minute in from_min..=to_min {
        tracker.observe(samples, &CRITERIA, (minute * MIN, MIN), true);
    }
}

#[test]
fn idle_is_reached_after_the_window_and_not_before() {
    let a = id(10, 500);
    let mut tracker = IdleTracker::default();
    run(&mut tracker, 0, 59, &[sample(a, 4, Some(0))]);
    assert!(tracker.idle(&CRITERIA, 59 * MIN).is_empty(), "59 min < 1 h");
    run(&mut tracker, 60, 60, &[sample(a, 4, Some(0))]);
    let idle = tracker.idle(&CRITERIA, 60 * MIN);
    let facts = idle.get(&a).expect("idle after an hour");
    assert_eq!(facts.idle_since, 0);
    assert_eq!(facts.idle_seconds, 3600);
    assert_eq!(facts.memory_bytes, 4 * GIB);
    assert_eq!(facts.measured_pct, 100);
    assert_eq!(facts.utilization, IdleSource::Process);
}

#[test]
fn a_single_busy_sample_ends_the_spell_and_the_next_one_starts_over() {
    let a = id(10, 500);
    let mut tracker = IdleTracker::default();
    run(&mut tracker, 0, 70, &[sample(a, 4, Some(0))]);
    assert!(tracker.idle(&CRITERIA, 70 * MIN).contains_key(&a));
    run(&mut tracker, 71, 71, &[sample(a, 4, Some(35))]);
    assert!(tracker.idle(&CRITERIA, 71 * MIN).is_empty(), "busy ends it");
    run(&mut tracker, 72, 131, &[sample(a, 4, Some(0))]);
    assert!(
        tracker.idle(&CRITERIA, 131 * MIN).is_empty(),
        "59 min since"
    );
    run(&mut tracker, 132, 132, &[sample(a, 4, Some(0))]);
    let facts = tracker.idle(&CRITERIA, 132 * MIN)[&a];
    assert_eq!(facts.idle_since, 72 * 60);
}

#[test]
fn memory_under_min_memory_is_not_idle() {
    let a = id(10, 500);
    let mut tracker = IdleTracker::default();
    let small = Sample {
        bytes: GIB - 1,
        ..sample(a, 0, Some(0))
    };
    run(&mut tracker, 0, 120, &[small]);
    assert!(tracker.idle(&CRITERIA, 120 * MIN).is_empty());
}

#[test]
fn a_pid_reused_with_a_new_start_time_starts_its_own_window() {
    let old = id(10, 500);
    let new = id(10, 9000);
    let mut tracker = IdleTracker::default();
    run(&mut tracker, 0, 50, &[sample(old, 4, Some(0))]);
    // The old process exits; its pid is taken by a new one.
    run(&mut tracker, 51, 70, &[sample(new, 4, Some(0))]);
    assert!(tracker.idle(&CRITERIA, 70 * MIN).is_empty(), "new: 19 min");
    assert_eq!(tracker.windows().len(), 1, "the old window is gone");
    run(&mut tracker, 71, 111, &[sample(new, 4, Some(0))]);
    let idle = tracker.idle(&CRITERIA, 111 * MIN);
    assert_eq!(idle[&new].idle_since, 51 * 60);
    assert!(!idle.contains_key(&old));
}

#[test]
fn unknown_utilization_neither_ends_a_spell_nor_counts_as_measured() {
    let a = id(10, 500);
    let mut tracker = IdleTracker::default();
    run(&mut tracker, 0, 40, &[sample(a, 4, Some(0))]);
    run(&mut tracker, 41, 60, &[sample(a, 4, None)]);
    let facts = tracker.idle(&CRITERIA, 60 * MIN)[&a];
    assert_eq!(facts.measured_pct, 66, "40 of 60 minutes measured");
    assert_eq!(facts.utilization, IdleSource::Unknown);
    // Mostly unknown: nothing shows it idle.
    run(&mut tracker, 61, 130, &[sample(a, 4, None)]);
    assert!(tracker.idle(&CRITERIA, 130 * MIN).is_empty());
    // Only unknown from the start: never idle.
    let b = id(11, 600);
    let mut unknown = IdleTracker::default();
    run(&mut unknown, 0, 300, &[sample(b, 4, None)]);
    assert!(unknown.idle(&CRITERIA, 300 * MIN).is_empty());
}

#[test]
fn a_restart_keeps_the_window_and_the_unseen_gap_is_not_measured() {
    let a = id(10, 500);
    let mut before = IdleTracker::default();
    run(&mut before, 0, 40, &[sample(a, 4, Some(0))]);
    let kept = serde_json::to_string(&before.windows()).unwrap();
    let windows: Vec<Window> = serde_json::from_str(&kept).unwrap();
    let mut after = IdleTracker::from_windows(windows);
    // Down for 5 minutes, then sampled again.
    let accounted = after.observe(&[sample(a, 4, Some(0))], &CRITERIA, (45 * MIN, MIN), true);
    assert_eq!(accounted.len(), 1, "a 5-minute gap is still accounted");
    run(&mut after, 46, 60, &[sample(a, 4, Some(0))]);
    let facts = after.idle(&CRITERIA, 60 * MIN)[&a];
    assert_eq!(facts.idle_since, 0, "the spell survived the restart");
    // The first sample after the gap reaches back one minute: 4 of 60 minutes unmeasured.
    assert_eq!(facts.measured_pct, 93);
    // A gap longer than MAX_ACCOUNTED_GAP_MS adds nothing to the accounting.
    let late = after.observe(&[sample(a, 4, Some(0))], &CRITERIA, (80 * MIN, MIN), true);
    assert!(late.is_empty());
}

#[test]
fn accounting_counts_held_and_idle_byte_seconds_since_the_last_sample() {
    let (a, b) = (id(10, 500), id(11, 600));
    let mut tracker = IdleTracker::default();
    let first = tracker.observe(
        &[sample(a, 2, Some(0)), sample(b, 1, Some(80))],
        &CRITERIA,
        (0, MIN),
        true,
    );
    assert!(first.is_empty(), "nothing before the first sample");
    let second = tracker.observe(
        &[sample(a, 2, Some(0)), sample(b, 1, Some(80))],
        &CRITERIA,
        (10_000, MIN),
        true,
    );
    let of = |who: Identity| *second.iter().find(|h| h.identity == who).unwrap();
    assert_eq!(of(a).byte_seconds, (20 * GIB) as f64);
    assert!(of(a).idle);
    assert_eq!(of(b).byte_seconds, (10 * GIB) as f64);
    assert!(!of(b).idle);
}

#[test]
fn an_incomplete_read_keeps_the_windows_it_does_not_list() {
    let (a, b) = (id(10, 500), id(11, 600));
    let mut tracker = IdleTracker::default();
    tracker.observe(
        &[sample(a, 2, Some(0)), sample(b, 2, Some(0))],
        &CRITERIA,
        (0, MIN),
        true,
    );
    tracker.observe(&[sample(a, 2, Some(0))], &CRITERIA, (MIN, MIN), false);
    assert_eq!(tracker.windows().len(), 2);
    tracker.observe(&[sample(a, 2, Some(0))], &CRITERIA, (2 * MIN, MIN), true);
    assert_eq!(tracker.windows().len(), 1);
}

fn gpu_with(processes: Vec<crate::snapshot::GpuProcess>, util: Option<u32>) -> GpuSnapshot {
    GpuSnapshot {
        utilization: util.map(|gpu_pct| Utilization {
            gpu_pct,
            memory_pct: 0,
        }),
        ..fixtures::gpu(0, processes)
    }
}

fn confirmed(pid: u32, sm: Option<u32>) -> crate::snapshot::GpuProcess {
    fixtures::process(pid)
        .used_gib(2)
        .sm_pct(sm)
        .confirmed()
        .state(ProcState::Sleeping)
        .started(1000 + pid as u64)
        .build()
}

#[test]
fn without_per_process_samples_the_only_holder_takes_the_gpus_utilization() {
    let alone = Snapshot::of(vec![gpu_with(vec![confirmed(10, None)], Some(0))]);
    let s = samples(&alone);
    assert_eq!((s[0].sm_pct, s[0].source), (Some(0), IdleSource::Device));
    assert_eq!(s[0].low(1), Some(true));
    let shared = Snapshot::of(vec![gpu_with(
        vec![confirmed(10, None), confirmed(11, None)],
        Some(0),
    )]);
    let s = samples(&shared);
    assert_eq!(s[0].source, IdleSource::Unknown);
    assert_eq!(s[0].low(1), None);
    let measured = Snapshot::of(vec![gpu_with(vec![confirmed(10, Some(7))], Some(50))]);
    let s = samples(&measured);
    assert_eq!((s[0].sm_pct, s[0].source), (Some(7), IdleSource::Process));
    assert_eq!(s[0].low(1), Some(false));
}

#[test]
fn a_process_on_two_gpus_is_one_sample_and_busy_on_either_is_busy() {
    let snapshot = Snapshot::of(vec![
        gpu_with(vec![confirmed(10, Some(0))], None),
        GpuSnapshot {
            index: 1,
            ..gpu_with(vec![confirmed(10, Some(40))], None)
        },
    ]);
    let s = samples(&snapshot);
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].bytes, 4 * GIB);
    assert_eq!(s[0].low(1), Some(false));
}

#[test]
fn the_idle_finding_comes_from_the_history_and_says_what_it_knows() {
    let snapshot = Snapshot::of(vec![gpu_with(
        vec![confirmed(10, Some(0)), confirmed(11, Some(0))],
        None,
    )]);
    let facts = IdleFacts {
        idle_since: 1_700_000_000,
        idle_seconds: 3 * 3600 + 12 * 60,
        memory_bytes: 2 * GIB,
        measured_pct: 100,
        utilization: IdleSource::Process,
    };
    let history = History {
        idle: [(Identity::new(10, 1010), facts)].into_iter().collect(),
        ..History::default()
    };
    let findings = classify(
        &snapshot,
        &Default::default(),
        Some(&history),
        &Policy::default(),
    );
    let idle: Vec<_> = findings.iter().filter(|f| f.kind == Kind::Idle).collect();
    assert_eq!(idle.len(), 1, "{findings:?}");
    assert_eq!(idle[0].identity, Some(Identity::new(10, 1010)));
    assert_eq!(idle[0].idle, Some(facts));
    assert!(
        idle[0].reason.starts_with("idle for 3h12m: holds 2.0 GiB"),
        "{}",
        idle[0].reason
    );
    assert_eq!(Kind::Idle.remedy(), crate::classify::Remedy::Report);
    // Without history (the CLI), nothing is idle.
    let none = classify(&snapshot, &Default::default(), None, &Policy::default());
    assert!(none.iter().all(|f| f.kind != Kind::Idle));
}

#[test]
fn short_durations_read_as_info_shows_them() {
    assert_eq!(short_duration(11_520), "3h12m");
    assert_eq!(short_duration(2_700), "45m");
    assert_eq!(short_duration(20), "20s");
    assert_eq!(short_duration(7_200), "2h00m");
}

#[test]
fn with_action_reclaim_an_idle_process_is_due_after_reclaim_after_unless_exempt() {
    use crate::classify::grace::{Rules, Watch};
    use crate::owner::Owner;
    let unit = |pid: u32, user: &str, unit: &str| {
        fixtures::process(pid)
            .used_gib(2)
            .sm_pct(0)
            .confirmed()
            .user(user)
            .state(ProcState::Sleeping)
            .started(1000 + pid as u64)
            .owner(Some(Owner::SystemdUnit { unit: unit.into() }))
            .build()
    };
    let snapshot = Snapshot::of(vec![gpu_with(
        vec![
            unit(10, "alice", "notebook.service"),
            unit(11, "bob", "notebook.service"),
            unit(12, "alice", "vllm.service"),
        ],
        None,
    )]);
    let idle_for = |seconds: u64| IdleFacts {
        idle_since: 1_700_000_000,
        idle_seconds: seconds,
        memory_bytes: 2 * GIB,
        measured_pct: 100,
        utilization: IdleSource::Process,
    };
    let history = |seconds: u64| History {
        idle: [10, 11, 12]
            .map(|pid| (Identity::new(pid, 1000 + pid as u64), idle_for(seconds)))
            .into_iter()
            .collect(),
        ..History::default()
    };
    let policy = Policy {
        idle_reclaim: Some(IdleReclaim {
            after: Duration::from_secs(8 * 3600),
            exempt_users: vec!["bob".into()],
            exempt_owners: vec!["unit:vllm.service".parse().unwrap()],
        }),
        ..Policy::default()
    };
    let rules = Rules {
        grace: Duration::from_secs(60),
        interval: Duration::from_secs(5),
        reclaim: &[],
        once: false,
    };
    let due_of = |seconds: u64, policy: &Policy| {
        let findings = classify(
            &snapshot,
            &Default::default(),
            Some(&history(seconds)),
            policy,
        );
        let judged =
            Watch::default().judge(&findings, &rules, |_| None, None, std::time::Instant::now());
        let due: Vec<u32> = judged
            .due
            .iter()
            .map(|(f, _)| f.identity.unwrap().pid)
            .collect();
        (findings, due)
    };
    let (_, early) = due_of(8 * 3600 - 1, &policy);
    assert!(early.is_empty(), "not before reclaim_after: {early:?}");
    let (findings, due) = due_of(8 * 3600, &policy);
    assert_eq!(due, [10], "bob is exempt, and so is vllm.service");
    let reason = |pid: u32| {
        findings
            .iter()
            .find(|f| f.identity.map(|i| i.pid) == Some(pid))
            .unwrap()
            .reason
            .clone()
    };
    assert!(reason(11).contains("user bob is exempt"), "{}", reason(11));
    assert!(
        reason(12).contains("owner unit:vllm.service is exempt"),
        "{}",
        reason(12)
    );
    // Report (no reclaim rule): nothing is ever due.
    let (_, none) = due_of(100 * 3600, &Policy::default());
    assert!(none.is_empty());
}

#[test]
fn spell_changes_grow_when_a_window_comes_or_goes_or_a_spell_begins_or_ends() {
    let (a, b) = (id(10, 500), id(11, 500));
    let mut tracker = IdleTracker::default();
    run(&mut tracker, 0, 0, &[sample(a, 4, Some(0))]);
    let first = tracker.spell_changes();
    assert_eq!(first, 1, "a new window, in its spell");
    run(&mut tracker, 1, 5, &[sample(a, 4, Some(0))]);
    assert_eq!(
        tracker.spell_changes(),
        first,
        "the same spell, sampled again"
    );
    run(&mut tracker, 6, 6, &[sample(a, 4, Some(50))]);
    assert_eq!(tracker.spell_changes(), first + 1, "busy: the spell ended");
    run(
        &mut tracker,
        7,
        7,
        &[sample(a, 4, Some(60)), sample(b, 4, Some(60))],
    );
    assert_eq!(
        tracker.spell_changes(),
        first + 2,
        "b's window came (no spell)"
    );
    run(&mut tracker, 8, 8, &[sample(a, 4, Some(60))]);
    assert_eq!(tracker.spell_changes(), first + 3, "b's window went");
}
