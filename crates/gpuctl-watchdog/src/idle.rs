//! Idle holders over time: each process's window (core's `IdleTracker`) moved on at every
//! pass and kept in the state directory across restarts (`idle.json`, bounded as
//! peaks.json is); the memory held, and held idle, per user and per owner (counters that only
//! grow); the journal event when an idle process wakes; and `[idle] notify_command`, run
//! once per idle spell. Becoming idle is logged by the finding log, once; reclaim goes
//! through the watcher's rules and the reclaim road like every other due finding.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpuctl_core::act::Identity;
use gpuctl_core::classify::idle::{
    self, Accounted, IdleCriteria, IdleFacts, IdleTracker, Sample, Window,
};
use gpuctl_core::classify::{Finding, Kind};
use gpuctl_core::config::IdleAction;
use gpuctl_core::host;
use gpuctl_core::owner::OwnerMatch;
use gpuctl_core::pidmap::{PidMap, PidSet};
use gpuctl_core::snapshot::usage::{self, JobUsage};
use gpuctl_core::snapshot::{GpuProcess, Snapshot};
use gpuctl_core::units;

use crate::events::fields_of;
use crate::log::{Logger, Priority};
use crate::settings::Settings;

/// The windows file in the state directory.
pub const FILE_NAME: &str = "idle.json";

/// A windows file larger than this is not read (the windows start afresh) and is replaced,
/// bounded, at the next write: `MAX_WINDOWS` windows take well under it.
pub const MAX_FILE_BYTES: u64 = 8 << 20;

/// The windows are written at least this often while they change (and at once when a
/// spell begins or ends), so that a restart loses at most this much of a window.
const SAVE_EVERY: Duration = Duration::from_secs(30);

/// Memory held and held idle, in byte-seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ByteSeconds {
    pub held: f64,
    pub idle: f64,
}

/// The accounting per user and per owner: counters that only grow. At most `max` series
/// each (`watchdog.metrics_max_owners`): a user or owner first seen past the cap counts in
/// `other` from then on, so that no series ever goes down.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Accounts {
    pub users: BTreeMap<Vec<String>, ByteSeconds>,
    pub owners: BTreeMap<Vec<String>, ByteSeconds>,
    /// Per Kubernetes namespace, of the pods the container runtime named (a pod known only
    /// by its UID has no namespace to count in).
    pub namespaces: BTreeMap<Vec<String>, ByteSeconds>,
    /// GPUs given to a Slurm job (its prolog's record) on which none of its processes has
    /// run for `[idle] after`: index, UUID, job.
    pub allocated_unused: Vec<(u32, String, u64)>,
}

impl Accounts {
    /// Counts `add` for `process`'s user, its owner and its pod's namespace (a pod the
    /// runtime named), each series kind capped at `max`.
    fn count(&mut self, process: &GpuProcess, add: ByteSeconds, max: usize) {
        let (user, owner) = labels_of(process);
        // The "other" labels are made only for a new series once the cap is reached.
        let other = || vec!["other".to_string()];
        Accounts::add(&mut self.users, user, other, max, add);
        let other_owner = || vec!["other".to_string(), "other".to_string()];
        Accounts::add(&mut self.owners, owner, other_owner, max, add);
        if let Some(namespace) = namespace_of(process) {
            Accounts::add(&mut self.namespaces, vec![namespace], other, max, add);
        }
    }

    fn add(
        series: &mut BTreeMap<Vec<String>, ByteSeconds>,
        labels: Vec<String>,
        other: impl FnOnce() -> Vec<String>,
        max: usize,
        add: ByteSeconds,
    ) {
        let key = if series.contains_key(&labels) || series.len() < max {
            labels
        } else {
            other()
        };
        let entry = series.entry(key).or_default();
        entry.held += add.held;
        entry.idle += add.idle;
    }
}

pub struct IdleWatch {
    tracker: IdleTracker,
    path: Option<PathBuf>,
    /// When the windows were last written, and the tracker's spell changes then.
    saved: Option<(Instant, u64)>,
    /// The processes idle after the last pass.
    idle: PidMap<Identity, IdleFacts>,
    /// The spells (process, since) whose notify_command ran.
    notified: PidSet<(Identity, u64)>,
    pub accounts: Accounts,
    /// Each Slurm job's usage, for its epilog (`slurm-usage.json`).
    jobs: BTreeMap<String, JobUsage>,
    state_dir: Option<PathBuf>,
    /// The allocated-unused GPUs already logged (job, UUID).
    said_unused: std::collections::BTreeSet<(u64, String)>,
}

impl IdleWatch {
    /// The windows kept in `state_dir` (none: they start afresh), as a restart finds them.
    pub fn new(state_dir: Option<&Path>, log: &Logger) -> IdleWatch {
        let path = state_dir.map(|dir| dir.join(FILE_NAME));
        let windows = path.as_deref().map(|p| read(p, log)).unwrap_or_default();
        IdleWatch {
            tracker: IdleTracker::from_windows(windows),
            path,
            saved: None,
            idle: PidMap::default(),
            notified: PidSet::default(),
            accounts: Accounts::default(),
            jobs: state_dir.map(usage::read).unwrap_or_default(),
            state_dir: state_dir.map(Path::to_path_buf),
            said_unused: Default::default(),
        }
    }

    /// A reload's state directory.
    pub fn set_state_dir(&mut self, state_dir: Option<&Path>) {
        self.path = state_dir.map(|dir| dir.join(FILE_NAME));
        self.state_dir = state_dir.map(Path::to_path_buf);
        self.saved = None;
    }

    /// Moves the windows on to `snapshot` (`complete`: every GPU answered), accounts what
    /// each process held since the last pass, logs the processes that woke, and returns the
    /// processes idle now (the history the idle rule reads).
    pub fn observe(
        &mut self,
        snapshot: &Snapshot,
        settings: &Settings,
        complete: bool,
        log: &Logger,
    ) -> PidMap<Identity, IdleFacts> {
        let criteria = IdleCriteria::of(&settings.idle);
        let max_series = settings.watchdog.metrics_max_owners;
        let samples = idle::samples(snapshot);
        let now_ms = (units::unix_seconds() * 1000.0) as u64;
        let covers = settings
            .watch_options()
            .utilization_window
            .unwrap_or_default();
        let clock = (now_ms, covers.as_millis() as u64);
        let accounted = self.tracker.observe(&samples, &criteria, clock, complete);
        if !accounted.is_empty() {
            self.account(snapshot, &accounted, now_ms / 1000, max_series);
        }
        let idle = self.tracker.idle(&criteria, now_ms);
        self.log_woken(&idle, &samples, snapshot, &criteria, log);
        self.idle = idle.clone();
        self.allocated_unused(snapshot, &criteria, log);
        self.save(log);
        idle
    }

    /// What each process held since the last pass, counted for its user, owner and pod's
    /// namespace (at most `max_series` each) and for its Slurm job's usage.
    fn account(
        &mut self,
        snapshot: &Snapshot,
        accounted: &[Accounted],
        now_unix: u64,
        max_series: usize,
    ) {
        let processes = processes_of(snapshot);
        // Per Slurm job this pass: the longest interval, and whether all was idle.
        let mut pass_jobs: BTreeMap<String, (f64, bool)> = BTreeMap::new();
        // The processes of one user and owner, summed this pass, so that their labels are
        // made and looked up once, not per process (the watchdog accounts every loop). The
        // first of each group stands for it.
        const MAX_GROUPS: usize = 64;
        let mut groups: Vec<(&GpuProcess, ByteSeconds)> = Vec::new();
        for held in accounted {
            let Some(process) = processes.get(&held.identity) else {
                continue;
            };
            let job = process.host.owner.as_ref().and_then(OwnerMatch::of);
            if let Some(key) = job.filter(|o| o.kind() == "slurm").map(|o| o.to_string()) {
                let usage = self.jobs.entry(key.clone()).or_default();
                usage.held_byte_seconds += held.byte_seconds;
                if held.idle {
                    usage.idle_byte_seconds += held.byte_seconds;
                }
                if let Some(pct) = held.sm_pct {
                    usage.sm_pct_seconds += f64::from(pct) * held.seconds;
                    usage.measured_seconds += held.seconds;
                }
                usage.last_seen_unix = now_unix;
                let entry = pass_jobs.entry(key).or_insert((0.0, true));
                entry.0 = entry.0.max(held.seconds);
                entry.1 &= held.idle;
            }
            let add = ByteSeconds {
                held: held.byte_seconds,
                idle: if held.idle { held.byte_seconds } else { 0.0 },
            };
            match groups
                .iter()
                .position(|(first, _)| same_labels(first, process))
            {
                Some(at) => {
                    groups[at].1.held += add.held;
                    groups[at].1.idle += add.idle;
                }
                None => {
                    if groups.len() == MAX_GROUPS {
                        // Counted in the order first met: which series the cap admits
                        // depends on it.
                        for (first, sum) in groups.drain(..) {
                            self.accounts.count(first, sum, max_series);
                        }
                    }
                    groups.push((process, add));
                }
            }
        }
        for (process, add) in groups {
            self.accounts.count(process, add, max_series);
        }
        for (key, (seconds, all_idle)) in pass_jobs {
            if let Some(usage) = self.jobs.get_mut(&key).filter(|_| all_idle) {
                usage.idle_seconds += seconds;
            }
        }
    }

    /// Logs each process idle after the last pass, still on the GPUs and not idle now
    /// (`idle`), with what woke it.
    fn log_woken(
        &self,
        idle: &PidMap<Identity, IdleFacts>,
        samples: &[Sample],
        snapshot: &Snapshot,
        criteria: &IdleCriteria,
        log: &Logger,
    ) {
        for (id, was) in &self.idle {
            if idle.contains_key(id) {
                continue;
            }
            // Gone from the GPUs: nothing woke.
            let Some(sample) = samples.iter().find(|s| s.identity == *id) else {
                continue;
            };
            let why = if sample.bytes < criteria.min_memory {
                format!("holds {} now", units::bytes(sample.bytes))
            } else {
                match sample.sm_pct {
                    Some(pct) if pct >= criteria.util_below => format!("SM at {pct}%"),
                    _ => "its window is no longer measured enough".to_string(),
                }
            };
            let fields = [("ACTION", "woke".to_string()), ("REASON", why.clone())];
            let fields = fields_of(snapshot, *id, &fields);
            let user = fields
                .iter()
                .find(|(k, _)| *k == "USER")
                .map(|(_, v)| v.as_str());
            let message = format!(
                "pid {} ({}) is no longer idle after {}: {why}",
                id.pid,
                user.unwrap_or("?"),
                idle::short_duration(was.idle_seconds)
            );
            log.log(Priority::Info, &message, &fields);
        }
    }

    /// The GPUs the prologs recorded for a job, given at least `after` ago, on which no
    /// process of the job runs: in the metrics, and logged once each.
    fn allocated_unused(&mut self, snapshot: &Snapshot, criteria: &IdleCriteria, log: &Logger) {
        let Some(dir) = &self.state_dir else { return };
        let now = units::unix_seconds() as u64;
        let mut unused = Vec::new();
        for allocation in usage::allocations(dir) {
            if now.saturating_sub(allocation.since_unix) < criteria.after.as_secs() {
                continue;
            }
            // The job's cgroups, and its user's environment claims.
            let job = OwnerMatch::job(allocation.job, allocation.uid);
            for (index, uuid) in &allocation.gpus {
                let on_it = snapshot.devices.iter().flat_map(|g| {
                    let whole = (g.uuid.as_deref() == Some(uuid.as_str())).then_some(&g.processes);
                    let slice = g
                        .mig_devices
                        .iter()
                        .find(|m| m.uuid.as_deref() == Some(uuid));
                    whole
                        .into_iter()
                        .chain(slice.map(|m| &m.processes))
                        .flatten()
                });
                let used = on_it.into_iter().any(|p| {
                    p.host
                        .owner
                        .as_ref()
                        .is_some_and(|owner| job.iter().any(|m| m.matches(owner)))
                });
                if !used {
                    unused.push((*index, uuid.clone(), allocation.job));
                }
            }
        }
        self.said_unused
            .retain(|(job, uuid)| unused.iter().any(|(_, u, j)| j == job && u == uuid));
        for (index, uuid, job) in &unused {
            if self.said_unused.insert((*job, uuid.clone())) {
                let message = format!(
                    "GPU {index} ({uuid}) is allocated to Slurm job {job} and none of its \
                     processes has run on it for {}",
                    humantime::format_duration(criteria.after)
                );
                let fields = [
                    ("ACTION", "allocated-unused".to_string()),
                    ("GPU_UUID", uuid.clone()),
                    ("SLURM_JOB_ID", job.to_string()),
                ];
                log.log(Priority::Notice, &message, &fields);
            }
        }
        self.accounts.allocated_unused = unused;
    }

    /// With `action = "notify"` (or `"reclaim"` with a command): `notify_command` once per
    /// idle spell, the finding in its environment.
    pub fn notify(
        &mut self,
        snapshot: &Snapshot,
        findings: &[Finding],
        settings: &Settings,
        log: &Logger,
    ) {
        let policy = &settings.idle;
        let spells: PidSet<(Identity, u64)> = findings
            .iter()
            .filter(|f| f.kind == Kind::Idle)
            .filter_map(|f| Some((f.identity?, f.idle?.idle_since)))
            .collect();
        self.notified.retain(|spell| spells.contains(spell));
        if policy.notify_command.is_empty() || policy.action == IdleAction::Report {
            return;
        }
        let processes = processes_of(snapshot);
        for f in findings.iter().filter(|f| f.kind == Kind::Idle) {
            let (Some(id), Some(facts)) = (f.identity, f.idle) else {
                continue;
            };
            if !self.notified.insert((id, facts.idle_since)) {
                continue;
            }
            let (user, owner) = processes.get(&id).map(|p| labels_of(p)).unwrap_or_default();
            let env = [
                ("GPUCTL_IDLE_PID", id.pid.to_string()),
                (
                    "GPUCTL_IDLE_USER",
                    user.first().cloned().unwrap_or_default(),
                ),
                (
                    "GPUCTL_IDLE_OWNER",
                    owner.get(1).cloned().unwrap_or_default(),
                ),
                ("GPUCTL_IDLE_GPUS", units::gpu_list(&f.gpus)),
                ("GPUCTL_IDLE_BYTES", facts.memory_bytes.to_string()),
                ("GPUCTL_IDLE_SINCE", facts.idle_since.to_string()),
                ("GPUCTL_IDLE_SECONDS", facts.idle_seconds.to_string()),
                ("GPUCTL_IDLE_MEASURED_PCT", facts.measured_pct.to_string()),
                ("GPUCTL_IDLE_UTILIZATION", facts.utilization.name().into()),
                ("GPUCTL_IDLE_REASON", f.reason.clone()),
            ];
            let program = &policy.notify_command[0];
            let spawned = Command::new(program)
                .args(&policy.notify_command[1..])
                .envs(env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::null())
                .spawn();
            let (priority, message, action) = match spawned {
                Ok(mut child) => {
                    // Reaped off the loop: a slow command never holds the watchdog up.
                    std::thread::spawn(move || child.wait());
                    (
                        Priority::Info,
                        format!("ran {program} about pid {}", id.pid),
                        "notify",
                    )
                }
                Err(error) => (
                    Priority::Err,
                    format!("cannot run idle.notify_command {program}: {error}"),
                    "notify-failed",
                ),
            };
            let fields = [("ACTION", action.to_string()), ("REASON", f.reason.clone())];
            log.log(priority, &message, &fields_of(snapshot, id, &fields));
        }
    }

    /// Writes the windows now (the daemon stops: nothing of them is lost).
    pub fn save_now(&mut self, log: &Logger) {
        self.saved = None;
        self.save(log);
    }

    /// Writes the windows when a spell began or ended since the last write, or every
    /// [`SAVE_EVERY`] while they change.
    fn save(&mut self, log: &Logger) {
        let Some(path) = &self.path else { return };
        let spells = self.tracker.spell_changes();
        let due = match &self.saved {
            None => true,
            Some((at, saved)) => *saved != spells || at.elapsed() >= SAVE_EVERY,
        };
        if !due {
            return;
        }
        let windows = self.tracker.windows();
        if let Some(dir) = &self.state_dir {
            usage::bound(&mut self.jobs, units::unix_seconds() as u64);
            // Best effort: an epilog without it says only what the peaks say.
            let _ = usage::write(dir, &self.jobs);
        }
        let text =
            serde_json::to_vec(&serde_json::json!({ "windows": windows })).unwrap_or_default();
        if let Err(error) = gpuctl_core::files::replace(path, &text, 0o644, false) {
            // Said once per failure spell: `saved` stays as it was, so it is retried.
            if self
                .saved
                .as_ref()
                .is_none_or(|(at, _)| at.elapsed() >= SAVE_EVERY)
            {
                log.log(
                    Priority::Warning,
                    &format!(
                        "cannot keep the idle windows in {}: {error}",
                        path.display()
                    ),
                    &[("ACTION", "state".into())],
                );
            }
            self.saved = Some((Instant::now(), spells));
            return;
        }
        self.saved = Some((Instant::now(), spells));
    }
}

/// The windows kept in `path`: none for a missing, oversized or unreadable file (said).
fn read(path: &Path, log: &Logger) -> Vec<Window> {
    let Ok(meta) = std::fs::metadata(path) else {
        return Vec::new();
    };
    let problem = if meta.len() > MAX_FILE_BYTES {
        format!("{} bytes, over the limit of {MAX_FILE_BYTES}", meta.len())
    } else {
        let parsed = std::fs::read(path).map(|bytes| {
            serde_json::from_slice::<serde_json::Value>(&bytes)
                .and_then(|mut file| serde_json::from_value::<Vec<Window>>(file["windows"].take()))
        });
        match parsed {
            Ok(Ok(windows)) => return windows,
            Ok(Err(error)) => error.to_string(),
            Err(error) => error.to_string(),
        }
    };
    log.log(
        Priority::Warning,
        &format!(
            "idle windows in {} not read ({problem}): they start afresh",
            path.display()
        ),
        &[("ACTION", "state".into())],
    );
    Vec::new()
}

fn processes_of(snapshot: &Snapshot) -> PidMap<Identity, &GpuProcess> {
    let mut processes =
        PidMap::with_capacity_and_hasher(snapshot.most_listed(), Default::default());
    processes.extend(
        snapshot
            .devices
            .iter()
            .flat_map(|g| &g.processes)
            .filter_map(|p| Some((Identity::new(p.pid, p.host.start_ticks?), p))),
    );
    processes
}

/// The Kubernetes namespace of a process's pod, where the runtime named the pod.
fn namespace_of(process: &GpuProcess) -> Option<String> {
    match &process.host.owner {
        Some(gpuctl_core::owner::Owner::KubernetesPod { pod: Some(pod), .. }) => {
            Some(pod.namespace.clone())
        }
        _ => None,
    }
}

/// Whether two processes count in the same user, owner and namespace series: the facts
/// [`labels_of`] and [`namespace_of`] read are equal (one process's, by address, on
/// several GPUs).
fn same_labels(a: &GpuProcess, b: &GpuProcess) -> bool {
    let (a, b) = (&a.host, &b.host);
    std::sync::Arc::ptr_eq(a, b) || (a.uid == b.uid && a.user == b.user && a.owner == b.owner)
}

/// A process's user label and owner labels (kind, key), as the memory series name them.
fn labels_of(process: &GpuProcess) -> (Vec<String>, Vec<String>) {
    let host = &process.host;
    let user = host::user_label(host.user.as_deref(), host.uid).unwrap_or_else(|| "?".into());
    let owner = match host.owner.as_ref().and_then(OwnerMatch::of) {
        Some(owner) => vec![owner.kind().to_string(), owner.to_string()],
        None => vec!["none".into(), "none".into()],
    };
    (vec![user], owner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(name: &str) -> Vec<String> {
        vec![name.to_string()]
    }

    #[test]
    fn named_pods_count_per_namespace_capped_as_the_other_series() {
        use gpuctl_core::owner::{Owner, PodName};
        let pod = |pid: u32, uid: &str, namespace: Option<&str>| {
            let named = namespace.map(|namespace| PodName {
                namespace: namespace.into(),
                name: format!("p{pid}"),
                container: None,
            });
            gpuctl_core::fixtures::process(pid)
                .owner(Some(Owner::KubernetesPod {
                    pod_uid: uid.into(),
                    qos: None,
                    container_id: None,
                    runtime: None,
                    pod: named,
                }))
                .build()
        };
        let add = |held: f64, idle: f64| ByteSeconds { held, idle };
        let mut accounts = Accounts::default();
        accounts.count(&pod(1, "aaaa-1", Some("ml")), add(10.0, 10.0), 2);
        accounts.count(&pod(2, "aaaa-2", Some("ml")), add(5.0, 0.0), 2);
        accounts.count(&pod(3, "bbbb-1", Some("prod")), add(1.0, 0.0), 2);
        // Past the cap of 2: in namespace "other" from then on.
        accounts.count(&pod(4, "cccc-1", Some("batch")), add(7.0, 7.0), 2);
        // A pod the runtime did not name has no namespace to count in.
        accounts.count(&pod(5, "dddd-1", None), add(100.0, 0.0), 2);
        assert_eq!(accounts.namespaces.len(), 3, "{:?}", accounts.namespaces);
        assert_eq!(accounts.namespaces[&labels("ml")], add(15.0, 10.0));
        assert_eq!(accounts.namespaces[&labels("prod")], add(1.0, 0.0));
        assert_eq!(accounts.namespaces[&labels("other")], add(7.0, 7.0));
        let held: f64 = accounts.owners.values().map(|v| v.held).sum();
        assert_eq!(held, 123.0, "every pod still counts per owner");
    }

    #[test]
    fn series_past_the_cap_count_in_other_and_none_ever_goes_down() {
        let mut users = BTreeMap::new();
        let add = |held: f64, idle: f64| ByteSeconds { held, idle };
        let other = || labels("other");
        Accounts::add(&mut users, labels("alice"), other, 2, add(10.0, 4.0));
        Accounts::add(&mut users, labels("bob"), other, 2, add(5.0, 0.0));
        // The cap is reached: carol counts in "other", and stays there.
        Accounts::add(&mut users, labels("carol"), other, 2, add(7.0, 7.0));
        Accounts::add(&mut users, labels("carol"), other, 2, add(1.0, 1.0));
        // Known series keep growing past the cap.
        Accounts::add(&mut users, labels("alice"), other, 2, add(2.0, 0.0));
        assert_eq!(users.len(), 3, "{users:?}");
        assert_eq!(users[&labels("alice")], add(12.0, 4.0));
        assert_eq!(users[&labels("other")], add(8.0, 8.0));
        assert!(!users.contains_key(&labels("carol")));
        assert!(users.values().all(|v| v.idle <= v.held));
    }

    #[test]
    fn a_pass_counts_each_user_once_and_past_the_groups_kept_in_the_order_first_met() {
        use gpuctl_core::act::Identity;
        use gpuctl_core::owner::Owner;
        // 70 users (more than a pass groups at once), each with two processes, the second
        // of each on GPU 1 and listed after every first; plus one user's process that is
        // listed on both GPUs (one set of facts).
        let user = |pid: u32, n: u32| {
            gpuctl_core::fixtures::process(pid)
                .confirmed()
                .started(1000 + u64::from(pid))
                .uid(n)
                .user(&format!("u{n:02}"))
                .owner(Some(Owner::None))
                .build()
        };
        let firsts: Vec<_> = (0..70).map(|n| user(100 + n, n)).collect();
        let seconds: Vec<_> = (0..70).map(|n| user(200 + n, n)).collect();
        let both = user(300, 0);
        let mut gpu0 = firsts;
        gpu0.push(both.clone());
        let mut gpu1 = seconds;
        gpu1.push(both);
        let snapshot = Snapshot::of(vec![
            gpuctl_core::fixtures::gpu(0, gpu0),
            gpuctl_core::fixtures::gpu(1, gpu1),
        ]);
        let accounted: Vec<Accounted> = snapshot
            .devices
            .iter()
            .flat_map(|g| &g.processes)
            .map(|p| Accounted {
                identity: Identity::new(p.pid, p.host.start_ticks.unwrap()),
                seconds: 1.0,
                byte_seconds: 2.0,
                idle: p.pid % 2 == 0,
                sm_pct: None,
            })
            .collect();
        let (log, _) = Logger::buffered();
        let mut watch = IdleWatch::new(None, &log);
        // The process on both GPUs is accounted once per listing, as the tracker gives it.
        watch.account(&snapshot, &accounted, 5, 60);
        let users = &watch.accounts.users;
        assert_eq!(users.len(), 61, "60 users and other: {:?}", users.keys());
        assert_eq!(
            users[&labels("u00")],
            ByteSeconds {
                held: 8.0,
                idle: 8.0
            }
        );
        assert_eq!(
            users[&labels("u01")],
            ByteSeconds {
                held: 4.0,
                idle: 0.0
            }
        );
        // The first 60 users met (by their first processes) hold the series, not the
        // last ones met before a group was counted.
        assert!(users.contains_key(&labels("u59")));
        assert!(!users.contains_key(&labels("u60")));
        assert_eq!(users[&labels("other")].held, 10.0 * 4.0);
        let held: f64 = users.values().map(|v| v.held).sum();
        assert_eq!(held, 2.0 * 142.0, "every listing counts once");
        assert_eq!(
            watch.accounts.owners.len(),
            1,
            "{:?}",
            watch.accounts.owners
        );
    }

    #[test]
    fn the_windows_file_is_read_back_and_an_oversized_or_broken_one_starts_afresh() {
        let dir = tempfile::tempdir().unwrap();
        let (log, logged) = Logger::buffered();
        let window = Window {
            pid: 10,
            start_ticks: 500,
            since_ms: Some(1_000),
            measured_ms: 60_000,
            last_ms: 61_000,
            bytes: 4 << 30,
            source: idle::IdleSource::Process,
        };
        let path = dir.path().join(FILE_NAME);
        let text = serde_json::json!({ "windows": [window] }).to_string();
        std::fs::write(&path, text).unwrap();
        assert_eq!(read(&path, &log), vec![window]);
        std::fs::write(&path, "{not json").unwrap();
        assert!(read(&path, &log).is_empty());
        let big = vec![b' '; MAX_FILE_BYTES as usize + 1];
        std::fs::write(&path, big).unwrap();
        assert!(read(&path, &log).is_empty());
        let said = String::from_utf8(logged.lock().unwrap().clone()).unwrap();
        assert!(said.contains("over the limit"), "{said}");
        assert_eq!(said.matches("start afresh").count(), 2, "{said}");
    }
}
