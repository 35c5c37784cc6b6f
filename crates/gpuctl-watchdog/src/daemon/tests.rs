//! The daemon's judgement over one pass, on a made-up snapshot.

use std::sync::{Arc, Mutex};

use gpuctl_core::classify::{Policy, Remedy};
use gpuctl_core::config::{self, Watchdog};
use gpuctl_core::host::ProcState;
use gpuctl_core::plan::Guard;
use gpuctl_core::protect::Protection;
use gpuctl_core::snapshot::{GpuSnapshot, Memory};

use super::*;

/// A daemon with `grace` and, when given, a fraction policy, acting on nothing real.
fn daemon(grace: Duration, fraction: Option<&str>) -> Daemon {
    logging_daemon(grace, fraction).0
}

/// [`daemon`], and what it logs.
fn logging_daemon(grace: Duration, fraction: Option<&str>) -> (Daemon, Arc<Mutex<Vec<u8>>>) {
    let watchdog = Watchdog {
        grace,
        // No state at all: never this machine's /var/lib/gpuctl.
        state_dir: std::path::PathBuf::new(),
        ..Watchdog::default()
    };
    let fraction = fraction.map(|text| {
        let path = std::path::Path::new("/etc/gpuctl/gpuctl.toml");
        Arc::new(config::Loaded {
            system: Some((
                config::Source::new(config::Origin::System, path),
                config::parse(text, path).unwrap(),
            )),
            user: None,
        })
    });
    let settings = Settings {
        watchdog,
        nvml_timeout: Duration::from_secs(10),
        dry_run: true,
        guard: Guard::for_this_process(Protection::default()),
        policy: Policy {
            fraction,
            ..Policy::default()
        },
        source: "test".into(),
        holders: gpuctl_core::snapshot::HolderScan {
            dev_dir: "/dev".into(),
            above_unattributed: Some(1 << 30),
        },
        xid_catalog: Default::default(),
        idle: Default::default(),
        kubernetes: Default::default(),
    };
    let (logger, logged) = crate::log::Logger::buffered();
    (Daemon::new(settings, logger, Notifier::from_env()), logged)
}

/// One GPU of 80 GiB with two processes: pid 10 a zombie holder, pid 11 holding 50 GiB.
fn seen() -> Seen {
    let process = |pid: u32, state: ProcState, threads: u32, gib: u64| {
        gpuctl_core::fixtures::process(pid)
            .used_gib(gib)
            .sm_pct(0)
            .confirmed()
            .state(state)
            .ppid(1)
            .started(1000 + u64::from(pid))
            .host(|host| {
                host.threads = Some(threads);
                host.pgid = Some(pid);
            })
            .build()
    };
    let gpu = GpuSnapshot {
        memory: Some(Memory {
            total_bytes: 80 << 30,
            used_bytes: 52 << 30,
            free_bytes: 28 << 30,
            reserved_bytes: 0,
            unattributed_bytes: Some(0),
        }),
        processes: vec![
            process(10, ProcState::Zombie, 3, 2),
            process(11, ProcState::Sleeping, 8, 50),
        ],
        ..GpuSnapshot::unread(0)
    };
    Seen {
        look: Look {
            snapshot: Snapshot::of(vec![gpu]),
            lineages: Default::default(),
        },
        holders_scanned: false,
        incomplete: None,
        reopen: false,
        now: Instant::now(),
    }
}

fn due(judged: &Judged) -> Vec<(u32, Kind, Remedy)> {
    judged
        .judgement
        .due
        .iter()
        .map(|(f, remedy)| (f.identity.unwrap().pid, f.kind, *remedy))
        .collect()
}

#[test]
fn judge_holds_findings_for_the_grace_then_names_their_remedy() {
    let (mut waiting, logged) = logging_daemon(
        Duration::from_secs(3600),
        Some("[fraction]\ndefault = 0.5\n"),
    );
    let judged = waiting.judge(&seen(), false);
    let logged = String::from_utf8(logged.lock().unwrap().clone()).unwrap();
    assert!(
        logged.starts_with("PRIORITY=4 MESSAGE=\"pid 10 (?) on GPU 0: zombie holder:")
            && logged
                .contains("report mode leaves it (reclaim mode ends it if it stays so for 1h)"),
        "{logged}"
    );
    assert_eq!(
        judged.judgement.stale.len(),
        1,
        "the zombie holder is stale"
    );
    assert!(judged.judgement.over_ids.iter().any(|id| id.pid == 11));
    assert!(due(&judged).is_empty(), "nothing is due before the grace");

    let mut at_once = daemon(Duration::ZERO, Some("[fraction]\ndefault = 0.5\n"));
    let judged = at_once.judge(&seen(), false);
    assert_eq!(
        due(&judged),
        [
            (10, Kind::ZombieHolder, Remedy::Reclaim),
            (11, Kind::AboveFraction, Remedy::Enforce)
        ]
    );
}

#[test]
fn judge_checks_no_share_without_a_fraction_policy() {
    let mut daemon = daemon(Duration::ZERO, None);
    let judged = daemon.judge(&seen(), true);
    assert!(judged.judgement.over_ids.is_empty());
    assert_eq!(due(&judged), [(10, Kind::ZombieHolder, Remedy::Reclaim)]);
}

#[test]
fn judge_counts_findings_of_every_kind() {
    let mut daemon = daemon(Duration::from_secs(60), None);
    let judged = daemon.judge(&seen(), false);
    let kinds: Vec<&str> = judged.counts.iter().map(|(k, _)| *k).collect();
    let every_kind: Vec<&str> = Kind::ALL.iter().map(|kind| kind.name()).collect();
    assert_eq!(kinds, [every_kind, vec!["impostor"]].concat());
    assert!(
        judged.counts.contains(&("zombie_holder", 1)),
        "{:?}",
        judged.counts
    );
    assert!(
        judged.counts.contains(&("orphaned", 0)),
        "{:?}",
        judged.counts
    );
}
