//! Classification: a pure function from snapshot facts to findings, each with a reason a
//! person can read. Nothing here reads /proc or NVML or acts.
//!
//! Each finding [`Kind`] is defined once: its rule (one module below: the facts it reads,
//! the verdict and the sentence it gives) and its [`Remedy`], what a consumer does about
//! it. Adding a rule is adding a kind, its module with its tests, and a line in [`RULES`].
//!
//! Ancestry alone does not prove a run died: `nohup python train.py &` in a launcher script
//! leaves a process whose parent is init and whose group leader (the script) is gone, yet it
//! is the run itself. So activity counts as evidence of life (busy on the GPU in the sampling
//! window, or live children of its own), and an orphan is reclaimed only with positive
//! evidence that its run died. Without that evidence it is reported, not reclaimed.

mod above_fraction;
pub mod grace;
pub mod holders;
pub mod idle;
pub mod mps_wedged;
mod orphaned;
mod pod_leftover;
mod state;
pub mod stuck;
mod unattributed;

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::act::Identity;
use crate::config::{Loaded, ReclaimKind};
use crate::host::Lineage;
use crate::pidmap::{PidMap, PidSet};
use crate::snapshot::{GpuProcess, GpuSnapshot, Snapshot};

/// In JSON (reports, the watchdog's findings file) its [`Kind::name`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Its run died: group leader gone and reparented out of the run.
    Orphaned,
    /// A zombie still listed on a GPU.
    ZombieHolder,
    /// Stopped (state T).
    Stopped,
    /// In uninterruptible sleep (D): signals cannot end it.
    Uninterruptible,
    /// GPU memory in use that no process accounts for.
    Unattributed,
    /// Holds more of a GPU than the `[fraction]` policy gives it.
    AboveFraction,
    /// Holds a GPU's device file without NVML listing it there (found only when the
    /// device-file scan ran: `info --holders`, `clear --holders`).
    UnlistedHolder,
    /// A GPU busy at low power with steady memory for long: a job hung in a collective
    /// (the watchdog's history only).
    Stuck,
    /// Holds at least `[idle] min_memory` with SM under `util_below` for the whole of
    /// `after` (the watchdog's history only): a live process doing nothing with its memory.
    Idle,
    /// A CUDA MPS server with no client left that holds more than its own overhead.
    MpsWedged,
    /// A process of a Kubernetes pod the node's container runtime answered it no longer
    /// has: a deleted or crashed pod's leftover.
    PodLeftover,
}

/// What is done about a finding of a kind, when its verdict is [`Verdict::Reclaim`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Remedy {
    /// The leftover of a run that is gone: `gpuctl clear` ends it, and the watchdog does
    /// after its grace when the kind is in `watchdog.reclaim`.
    Reclaim,
    /// A breach of the share policy: the watchdog warns once it lasted its grace and, with
    /// `watchdog.enforce_fraction`, ends the process.
    Enforce,
    /// Nothing a signal fixes: shown, never acted on.
    Report,
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Kind {
    pub const ALL: [Kind; 11] = [
        Kind::Orphaned,
        Kind::ZombieHolder,
        Kind::Stopped,
        Kind::Uninterruptible,
        Kind::Unattributed,
        Kind::AboveFraction,
        Kind::UnlistedHolder,
        Kind::Stuck,
        Kind::Idle,
        Kind::MpsWedged,
        Kind::PodLeftover,
    ];

    /// Its name in JSON, the journal and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Orphaned => "orphaned",
            Kind::ZombieHolder => "zombie_holder",
            Kind::Stopped => "stopped",
            Kind::Uninterruptible => "uninterruptible",
            Kind::Unattributed => "unattributed",
            Kind::AboveFraction => "above_fraction",
            Kind::UnlistedHolder => "unlisted_holder",
            Kind::Stuck => "stuck",
            Kind::Idle => "idle",
            Kind::MpsWedged => "mps_wedged",
            Kind::PodLeftover => "pod_leftover",
        }
    }

    pub fn remedy(self) -> Remedy {
        match self {
            // An unlisted holder is ended only by `clear --holders`: the scan that finds it
            // runs only when asked, and the watchdog has no reclaim kind for it.
            Kind::Orphaned
            | Kind::ZombieHolder
            | Kind::Stopped
            | Kind::UnlistedHolder
            | Kind::PodLeftover => Remedy::Reclaim,
            Kind::AboveFraction => Remedy::Enforce,
            // The `[idle]` ladder (report, notify, reclaim) is the watchdog's own.
            Kind::Uninterruptible | Kind::Unattributed | Kind::Stuck | Kind::Idle => Remedy::Report,
            // Ending the server ends every client of every user: MPS's daemon does it.
            Kind::MpsWedged => Remedy::Report,
        }
    }

    /// The `watchdog.reclaim` entry that lets the watchdog end a finding of this kind.
    pub fn reclaim_kind(self) -> Option<ReclaimKind> {
        match self {
            // A pod's leftover is a crashed run's: `reclaim = ["orphaned"]` covers both.
            Kind::Orphaned | Kind::PodLeftover => Some(ReclaimKind::Orphaned),
            Kind::ZombieHolder => Some(ReclaimKind::Zombie),
            Kind::Stopped => Some(ReclaimKind::Stopped),
            Kind::Uninterruptible
            | Kind::Unattributed
            | Kind::AboveFraction
            | Kind::UnlistedHolder
            | Kind::Stuck
            | Kind::Idle
            | Kind::MpsWedged => None,
        }
    }
}

/// What may be done about a finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The evidence is strong: its [`Remedy`] applies.
    Reclaim,
    /// Shown, never acted on automatically; a person may still `gpuctl kill --pid` it.
    Report,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub kind: Kind,
    pub verdict: Verdict,
    /// The process, for process findings; `None` for unattributed memory.
    pub identity: Option<Identity>,
    /// GPU indices it concerns.
    pub gpus: Vec<u32>,
    /// GPU memory it holds (summed over its GPUs), where known.
    pub bytes: Option<u64>,
    pub reason: String,
    /// For an `idle` finding: since when, the memory, how much of the window was measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle: Option<idle::IdleFacts>,
}

/// What the watchdog has seen over time; the CLI has none.
#[derive(Debug, Clone, Default)]
pub struct History {
    /// Processes whose parent was seen alive and then gone while they stayed on a GPU.
    pub parent_died: PidSet<Identity>,
    /// How long each process has been seen stopped.
    pub stopped_for: PidMap<Identity, Duration>,
    /// How long each GPU (by index) has looked stuck ([`stuck::StuckTracker`]).
    pub stuck_for: PidMap<u32, Duration>,
    /// The processes idle by their window ([`idle::IdleTracker`]).
    pub idle: PidMap<Identity, idle::IdleFacts>,
}

#[derive(Debug, Clone)]
pub struct Policy {
    /// Stopped processes are reclaimable: `clear --include-stopped`, or the watchdog's
    /// `reclaim = ["stopped"]`.
    pub include_stopped: bool,
    /// With history, a process must have been stopped this long to be reclaimed.
    pub stopped_after: Duration,
    /// Unattributed memory below this is noise (driver bookkeeping), not a finding.
    pub unattributed_min_bytes: u64,
    /// The configuration whose `[fraction]` shares are checked; `None`: no share check.
    pub fraction: Option<Arc<Loaded>>,
    /// The stuck-GPU check's thresholds; `None`: no check.
    pub stuck: Option<stuck::StuckCriteria>,
    /// `[idle] action = "reclaim"`: which idle processes get a reclaim verdict; `None`:
    /// idle processes are only reported.
    pub idle_reclaim: Option<idle::IdleReclaim>,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            include_stopped: false,
            stopped_after: Duration::from_secs(300),
            unattributed_min_bytes: 256 * 1024 * 1024,
            fraction: None,
            stuck: None,
            idle_reclaim: None,
        }
    }
}

/// Everything a rule may read.
pub(crate) struct Facts<'a> {
    pub snapshot: &'a Snapshot,
    pub lineages: &'a PidMap<u32, Lineage>,
    pub history: Option<&'a History>,
    pub policy: &'a Policy,
    /// Idle orphans per process group: several workers of one dead run look alike.
    pub idle_orphans_per_group: PidMap<u32, usize>,
}

/// One confirmed process across the GPUs it is on.
pub(crate) struct Held<'a> {
    pub process: &'a GpuProcess,
    pub identity: Identity,
    pub gpus: Vec<u32>,
    pub bytes: Option<u64>,
    /// Highest SM utilization on any of its GPUs; `None` if some GPU does not report it.
    pub busy_pct: Option<u32>,
}

impl Held<'_> {
    fn finding(&self, kind: Kind, verdict: Verdict, reason: String) -> Finding {
        Finding {
            kind,
            verdict,
            identity: Some(self.identity),
            gpus: self.gpus.clone(),
            bytes: self.bytes,
            reason,
            idle: None,
        }
    }
}

/// A rule: the facts of one process (or one GPU) in, at most one finding out.
enum Rule {
    Process(Kind, fn(&Facts, &Held) -> Option<(Verdict, String)>),
    Gpu(fn(&Facts, &GpuSnapshot) -> Option<Finding>),
    /// Several findings for one GPU (one per device-file holder).
    GpuMany(fn(&Facts, &GpuSnapshot) -> Vec<Finding>),
}

/// Every rule, in the order their findings are listed for a process.
const RULES: &[Rule] = &[
    Rule::Process(Kind::Uninterruptible, state::uninterruptible),
    Rule::Process(Kind::ZombieHolder, state::zombie),
    Rule::Process(Kind::Stopped, state::stopped),
    Rule::Process(Kind::Orphaned, orphaned::judge),
    Rule::Process(Kind::PodLeftover, pod_leftover::judge),
    Rule::Process(Kind::AboveFraction, above_fraction::judge),
    Rule::Process(Kind::Idle, idle::judge),
    Rule::Process(Kind::MpsWedged, mps_wedged::judge),
    Rule::Gpu(unattributed::judge),
    Rule::GpuMany(holders::judge),
    Rule::Gpu(stuck::judge),
];

/// Findings for every process and GPU of `snapshot`: each confirmed process by ascending
/// pid, then the GPUs. `lineages` holds the lineage of each confirmed process (children
/// counted for those whose group leader is gone).
pub fn classify(
    snapshot: &Snapshot,
    lineages: &PidMap<u32, Lineage>,
    history: Option<&History>,
    policy: &Policy,
) -> Vec<Finding> {
    let held = holders(snapshot);
    let facts = Facts {
        snapshot,
        lineages,
        history,
        policy,
        idle_orphans_per_group: orphaned::idle_per_group(&held, lineages),
    };
    let mut findings = Vec::new();
    for h in &held {
        for rule in RULES {
            if let Rule::Process(kind, judge) = rule
                && let Some((verdict, reason)) = judge(&facts, h)
            {
                let mut finding = h.finding(*kind, verdict, reason);
                if *kind == Kind::Idle {
                    finding.idle = history.and_then(|h| h.idle.get(&finding.identity?).copied());
                }
                findings.push(finding);
            }
        }
    }
    for gpu in &snapshot.devices {
        for rule in RULES {
            match rule {
                Rule::Gpu(judge) => findings.extend(judge(&facts, gpu)),
                Rule::GpuMany(judge) => findings.extend(judge(&facts, gpu)),
                Rule::Process(..) => {}
            }
        }
    }
    findings
}

/// Each confirmed process once, with what it holds across its GPUs, by ascending pid. An
/// unconfirmed process is not judged: nothing is known of it.
fn holders(snapshot: &Snapshot) -> Vec<Held<'_>> {
    let most = snapshot.most_listed();
    let mut at: PidMap<u32, usize> = PidMap::with_capacity_and_hasher(most, Default::default());
    let mut held: Vec<Held> = Vec::with_capacity(most);
    for gpu in &snapshot.devices {
        for process in &gpu.processes {
            let (Some(_), Some(start_ticks)) = (process.host.state, process.host.start_ticks)
            else {
                continue;
            };
            let index = *at.entry(process.pid).or_insert_with(|| {
                held.push(Held {
                    process,
                    identity: Identity::new(process.pid, start_ticks),
                    gpus: Vec::with_capacity(snapshot.devices.len()),
                    bytes: Some(0),
                    busy_pct: Some(0),
                });
                held.len() - 1
            });
            let entry = &mut held[index];
            entry.gpus.push(gpu.index);
            entry.bytes = entry.bytes.zip(process.used_bytes).map(|(a, b)| a + b);
            entry.busy_pct = entry
                .busy_pct
                .zip(process.sm_util_pct)
                .map(|(a, b)| a.max(b));
        }
    }
    held.sort_unstable_by_key(|h| h.process.pid);
    held
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;
    use crate::host::{HostProcess, LeaderState, ProcState, Relative};
    use crate::snapshot::GpuSnapshot;

    /// A process as a test describes it.
    #[derive(Clone)]
    struct P {
        pid: u32,
        ppid: u32,
        pgid: u32,
        sid: u32,
        state: ProcState,
        threads: u32,
        sm: Option<u32>,
        argv: &'static [&'static str],
        leader: LeaderState,
        parent: Option<(u32, u32, u32)>, // parent's pid, pgid, sid
        children: Option<u32>,
        confirmed: bool,
    }

    impl P {
        /// A healthy worker: parent and leader alive, idle.
        fn new(pid: u32) -> P {
            P {
                pid,
                ppid: 100,
                pgid: 100,
                sid: 50,
                state: ProcState::Sleeping,
                threads: 4,
                sm: Some(0),
                argv: &["python3", "train.py"],
                leader: LeaderState::Alive,
                parent: Some((100, 100, 50)),
                children: Some(0),
                confirmed: true,
            }
        }

        /// The worker of a crashed run: leader gone, reparented to init.
        fn orphan(pid: u32) -> P {
            P {
                ppid: 1,
                leader: LeaderState::Gone,
                parent: Some((1, 1, 1)),
                ..P::new(pid)
            }
        }
    }

    fn run(processes: &[P], history: Option<&History>, policy: &Policy) -> Vec<Finding> {
        run_in(processes, history, policy, |_| {})
    }

    /// As [`run`], with the snapshot changed by `edit` before it is classified.
    fn run_in(
        processes: &[P],
        history: Option<&History>,
        policy: &Policy,
        edit: impl FnOnce(&mut Snapshot),
    ) -> Vec<Finding> {
        let gpu_processes = processes
            .iter()
            .map(|p| {
                let process = fixtures::process(p.pid).used_gib(1).sm_pct(p.sm);
                match p.confirmed {
                    true => process
                        .confirmed()
                        .uid(1000)
                        .user("alice")
                        .state(p.state)
                        .ppid(p.ppid)
                        .started(1000 + p.pid as u64)
                        .host(|host| {
                            host.comm = Some("python3".into());
                            host.argv = Some(p.argv.iter().map(|a| a.to_string()).collect());
                            host.command = Some(p.argv.join(" "));
                            host.pgid = Some(p.pgid);
                            host.sid = Some(p.sid);
                            host.threads = Some(p.threads);
                            host.age = Some(crate::host::Age::fixed(60));
                        }),
                    false => {
                        process.host(|host| *host = HostProcess::unconfirmed("other namespace"))
                    }
                }
                .build()
            })
            .collect();
        let mut snapshot = Snapshot::of(vec![GpuSnapshot {
            memory: Some(fixtures::memory(100 << 30, 50 << 30)),
            processes: gpu_processes,
            ..GpuSnapshot::unread(0)
        }]);
        edit(&mut snapshot);
        let lineages = processes
            .iter()
            .filter(|p| p.confirmed)
            .map(|p| {
                let lineage = Lineage {
                    leader: if p.pgid == p.pid {
                        LeaderState::Itself
                    } else {
                        p.leader
                    },
                    parent: p.parent.map(|(pid, pgid, sid)| Relative {
                        pid,
                        pgid,
                        sid,
                        comm: if pid == 1 {
                            "systemd".into()
                        } else {
                            "bash".into()
                        },
                        state: ProcState::Sleeping,
                    }),
                    live_children: p.children,
                };
                (p.pid, lineage)
            })
            .collect();
        classify(&snapshot, &lineages, history, policy)
    }

    fn verdicts(processes: &[P]) -> Vec<(u32, Kind, Verdict)> {
        verdicts_with(processes, None, &Policy::default())
    }

    fn verdicts_with(
        processes: &[P],
        history: Option<&History>,
        policy: &Policy,
    ) -> Vec<(u32, Kind, Verdict)> {
        run(processes, history, policy)
            .into_iter()
            .map(|f| (f.identity.map_or(0, |i| i.pid), f.kind, f.verdict))
            .collect()
    }

    #[test]
    fn never_flagged() {
        let cases: Vec<(&str, Vec<P>)> = vec![
            (
                "a healthy run: workers whose parent (the group leader) is alive",
                vec![P::new(101), P::new(102), P::new(103)],
            ),
            (
                "a background job whose launcher script exited, busy on the GPU",
                vec![P {
                    sm: Some(87),
                    ..P::orphan(200)
                }],
            ),
            (
                "the same background job, idle, but with live DataLoader workers of its own",
                vec![P {
                    children: Some(4),
                    ..P::orphan(200)
                }],
            ),
            (
                "the same job with its workers (children), all busy or parented",
                vec![
                    P {
                        sm: Some(60),
                        children: Some(2),
                        ..P::orphan(200)
                    },
                    P {
                        ppid: 200,
                        parent: Some((200, 100, 50)),
                        ..P::orphan(201)
                    },
                ],
            ),
            (
                "a daemonised service: parent init, its own group and session leader alive",
                vec![P {
                    pid: 300,
                    ppid: 1,
                    pgid: 300,
                    sid: 300,
                    parent: Some((1, 1, 1)),
                    leader: LeaderState::Itself,
                    ..P::new(300)
                }],
            ),
            (
                "a process in another PID namespace (unconfirmed)",
                vec![P {
                    confirmed: false,
                    ..P::orphan(400)
                }],
            ),
            (
                "a leader that is gone but the parent (same session) still runs it",
                vec![P {
                    ppid: 77,
                    leader: LeaderState::Gone,
                    parent: Some((77, 77, 50)),
                    ..P::new(500)
                }],
            ),
            (
                "an orphan whose sibling worker is busy: the run is alive",
                vec![
                    P {
                        sm: Some(40),
                        ..P::orphan(601)
                    },
                    P::orphan(602),
                ],
            ),
        ];
        for (name, processes) in cases {
            let reclaimable: Vec<_> = verdicts(&processes)
                .into_iter()
                .filter(|(_, _, v)| *v == Verdict::Reclaim)
                .collect();
            assert!(reclaimable.is_empty(), "{name}: {reclaimable:?}");
        }
    }

    #[test]
    fn the_lone_idle_orphan_is_reported_not_reclaimed() {
        // An idle background job between GPU phases looks like this; nothing proves its run died.
        let found = run(&[P::orphan(200)], None, &Policy::default());
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].verdict, Verdict::Report);
        assert!(
            found[0].reason.contains("gpuctl kill --pid 200"),
            "{}",
            found[0].reason
        );
    }

    #[test]
    fn crashed_run_workers_are_reclaimed() {
        let found = run(
            &[P::orphan(101), P::orphan(102), P::orphan(103)],
            None,
            &Policy::default(),
        );
        assert_eq!(found.len(), 3);
        for f in &found {
            assert_eq!((f.kind, f.verdict), (Kind::Orphaned, Verdict::Reclaim));
            assert!(
                f.reason.contains("3 idle orphans of the same group"),
                "{}",
                f.reason
            );
            assert!(f.reason.contains("pid 1 (systemd)"), "{}", f.reason);
        }
    }

    #[test]
    fn a_pod_the_runtime_still_runs_has_no_orphans() {
        let worker = P {
            argv: &["python3", "-c", "x", "--multiprocessing-fork"],
            ..P::orphan(200)
        };
        let in_pod = |snapshot: &mut Snapshot, ready: &[&str]| {
            let process = &mut snapshot.devices[0].processes[0];
            Arc::make_mut(&mut process.host).owner = Some(crate::owner::Owner::KubernetesPod {
                pod_uid: "AAAA-1".into(),
                qos: None,
                container_id: None,
                runtime: None,
                pod: None,
            });
            snapshot.pod_runtime = Some(crate::snapshot::pods::RuntimeUse {
                socket: None,
                error: None,
                ready_pod_uids: ready.iter().map(|uid| uid.to_string()).collect(),
                // It has the pod either way: ready, or stopped and not yet removed.
                known_pod_uids: ["aaaa-1".to_string()].into(),
                gone_pods: Default::default(),
            });
        };
        let kinds = |ready: &[&str]| -> Vec<(u32, Kind, Verdict)> {
            run_in(
                std::slice::from_ref(&worker),
                None,
                &Policy::default(),
                |s| in_pod(s, ready),
            )
            .into_iter()
            .map(|f| (f.identity.map_or(0, |i| i.pid), f.kind, f.verdict))
            .collect()
        };
        // Its container restarted and it was reparented, but the pod's sandbox is ready.
        assert_eq!(kinds(&["aaaa-1"]), vec![]);
        // The pod's sandbox is not ready: the worker of a crashed run, as before.
        assert_eq!(
            kinds(&["bbbb-2"]),
            vec![(200, Kind::Orphaned, Verdict::Reclaim)]
        );
    }

    #[test]
    fn a_pod_the_runtime_answered_it_no_longer_has_leaves_a_reclaimable_leftover() {
        use crate::snapshot::pods::RuntimeUse;
        let answered = |known: &[&str], gone_named: bool| RuntimeUse {
            socket: Some("/run/containerd/containerd.sock".into()),
            error: None,
            ready_pod_uids: known.iter().map(|uid| uid.to_string()).collect(),
            known_pod_uids: known.iter().map(|uid| uid.to_string()).collect(),
            gone_pods: match gone_named {
                true => [("aaaa-1".into(), ("ml".into(), "trainer-0".into()))].into(),
                false => Default::default(),
            },
        };
        let found = |runtime: RuntimeUse| -> Vec<(Kind, Verdict, String)> {
            // A healthy, busy process: nothing in its ancestry says its run died.
            let healthy = P {
                sm: Some(50),
                ..P::new(200)
            };
            run_in(&[healthy], None, &Policy::default(), |snapshot| {
                let process = &mut snapshot.devices[0].processes[0];
                Arc::make_mut(&mut process.host).owner = Some(crate::owner::Owner::KubernetesPod {
                    pod_uid: "AAAA-1".into(),
                    qos: None,
                    container_id: Some("c1".into()),
                    runtime: None,
                    pod: None,
                });
                snapshot.pod_runtime = Some(runtime);
            })
            .into_iter()
            .map(|f| (f.kind, f.verdict, f.reason))
            .collect()
        };
        let leftover = found(answered(&["bbbb-2"], true));
        assert_eq!(leftover.len(), 1, "{leftover:?}");
        assert_eq!(
            (leftover[0].0, leftover[0].1),
            (Kind::PodLeftover, Verdict::Reclaim)
        );
        assert!(
            leftover[0].2.contains("leftover of pod ml/trainer-0"),
            "{}",
            leftover[0].2
        );
        // Gone, but never seen named through this socket: shown, not reclaimed.
        let unnamed = found(answered(&["bbbb-2"], false));
        assert_eq!(
            (unnamed[0].0, unnamed[0].1),
            (Kind::PodLeftover, Verdict::Report)
        );
        assert!(unnamed[0].2.contains("gpuctl kill --pid 200"));
        // The runtime has it: nothing.
        assert_eq!(found(answered(&["aaaa-1"], false)), vec![]);
        // The runtime did not answer: it has lost no pod, whatever it was last known as.
        let down = RuntimeUse {
            error: Some("cannot connect".into()),
            ..answered(&[], true)
        };
        assert_eq!(found(down), vec![]);
        let no_runtime = RuntimeUse {
            socket: None,
            error: Some("no container runtime socket".into()),
            ..answered(&[], true)
        };
        assert_eq!(found(no_runtime), vec![]);
    }

    #[test]
    fn a_lone_orphan_is_reclaimed_with_positive_evidence() {
        let worker = P {
            argv: &[
                "python3",
                "-c",
                "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5)",
                "--multiprocessing-fork",
            ],
            ..P::orphan(200)
        };
        assert_eq!(
            verdicts(&[worker]),
            vec![(200, Kind::Orphaned, Verdict::Reclaim)]
        );
        let history = History {
            parent_died: [Identity {
                pid: 200,
                start_ticks: 1200,
            }]
            .into_iter()
            .collect(),
            ..History::default()
        };
        assert_eq!(
            verdicts_with(&[P::orphan(200)], Some(&history), &Policy::default()),
            vec![(200, Kind::Orphaned, Verdict::Reclaim)]
        );
    }

    #[test]
    fn reparented_to_a_subreaper_counts_and_a_zombie_leader_counts_as_gone() {
        // systemd --user or a container's init adopted the workers: a parent outside their
        // group and session.
        let adopted = |pid| P {
            ppid: 900,
            parent: Some((900, 900, 900)),
            leader: LeaderState::Zombie,
            ..P::orphan(pid)
        };
        let found = verdicts(&[adopted(101), adopted(102)]);
        assert_eq!(
            found,
            vec![
                (101, Kind::Orphaned, Verdict::Reclaim),
                (102, Kind::Orphaned, Verdict::Reclaim)
            ]
        );
    }

    #[test]
    fn unknown_activity_or_children_is_weak_evidence() {
        let no_utilization = P {
            sm: None,
            ..P::orphan(101)
        };
        let no_children_list = P {
            children: None,
            ..P::orphan(102)
        };
        let found = verdicts(&[no_utilization, no_children_list, P::orphan(103)]);
        assert!(
            found
                .iter()
                .all(|(pid, _, v)| *pid == 103 || *v == Verdict::Report),
            "{found:?}"
        );
    }

    #[test]
    fn zombies_stopped_and_uninterruptible() {
        let zombie_leader = P {
            state: ProcState::Zombie,
            threads: 3,
            ..P::new(101)
        };
        let zombie = P {
            state: ProcState::Zombie,
            threads: 1,
            ..P::new(102)
        };
        let stopped = P {
            state: ProcState::Stopped,
            ..P::new(103)
        };
        let stuck = P {
            state: ProcState::DiskSleep,
            ..P::new(104)
        };
        let all = [zombie_leader, zombie, stopped, stuck];
        assert_eq!(
            verdicts(&all),
            vec![
                (101, Kind::ZombieHolder, Verdict::Reclaim),
                (102, Kind::ZombieHolder, Verdict::Report),
                (103, Kind::Stopped, Verdict::Report),
                (104, Kind::Uninterruptible, Verdict::Report),
            ]
        );
        let asked = Policy {
            include_stopped: true,
            ..Policy::default()
        };
        assert!(verdicts_with(&all, None, &asked).contains(&(
            103,
            Kind::Stopped,
            Verdict::Reclaim
        )));
        // With history, only after the threshold.
        let mut history = History::default();
        let identity = Identity {
            pid: 103,
            start_ticks: 1103,
        };
        history
            .stopped_for
            .insert(identity, Duration::from_secs(10));
        assert!(verdicts_with(&all, Some(&history), &asked).contains(&(
            103,
            Kind::Stopped,
            Verdict::Report
        )));
        history
            .stopped_for
            .insert(identity, Duration::from_secs(600));
        assert!(verdicts_with(&all, Some(&history), &asked).contains(&(
            103,
            Kind::Stopped,
            Verdict::Reclaim
        )));
    }
}
