//! The road every reclaim walks (`gpuctl kill`, `gpuctl clear`, the watchdog): select targets
//! from a snapshot, guard them, plan, act (skipped for a dry run: the same path, one step
//! left out), and verify through NVML that each process left its GPUs and its memory was
//! released.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::act::{self, Ended, Escalation, Identity};
use crate::classify::{Finding, Verdict};
use crate::nvml::Gpus;
use crate::owner::Owner;
use crate::snapshot::{GpuProcess, Snapshot, SnapshotOptions};

/// Processes that keep GPUs and displays working; never signalled. Matched against the
/// kernel's command name (cut to 15 characters) and the basename of argv[0].
pub const DEFAULT_PROTECTED: &[&str] = &[
    "nvidia-persistenced",
    "nv-hostengine",
    "nvidia-fabricmanager",
    "nvidia-powerd",
    "Xorg",
    "X",
    "Xwayland",
    "gnome-shell",
    "kwin_wayland",
    "kwin_x11",
    "weston",
    "sway",
    "Hyprland",
    "gdm-x-session",
    "gdm-wayland-session",
];

/// One process to act on, as selected from a snapshot.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    pub pid: u32,
    pub start_ticks: Option<u64>,
    pub uid: Option<u32>,
    pub user: Option<String>,
    pub command: String,
    /// GPU indices it holds memory on, and how much in all (where known).
    pub gpus: Vec<u32>,
    pub used_bytes: Option<u64>,
    /// Why it was selected: the findings' reasons, or the selectors it matched.
    pub reasons: Vec<String>,
    #[serde(skip)]
    owner: Option<Owner>,
    #[serde(skip)]
    comm: Option<String>,
    #[serde(skip)]
    argv0: Option<String>,
}

impl Target {
    /// The target for a process on the GPUs of `snapshot`.
    fn of(snapshot: &Snapshot, pid: u32) -> Option<Target> {
        let mut target: Option<Target> = None;
        for gpu in &snapshot.devices {
            let Some(process) = gpu.processes.iter().find(|p| p.pid == pid) else {
                continue;
            };
            let target = target.get_or_insert_with(|| Target::new(process));
            target.gpus.push(gpu.index);
            if let (Some(total), Some(used)) = (target.used_bytes, process.used_bytes) {
                target.used_bytes = Some(total + used);
            } else {
                target.used_bytes = None;
            }
        }
        target
    }

    fn new(process: &GpuProcess) -> Target {
        let host = &process.host;
        Target {
            pid: process.pid,
            start_ticks: host.start_ticks,
            uid: host.uid,
            user: host.user.clone(),
            command: host.display_command(),
            gpus: Vec::new(),
            used_bytes: Some(0),
            reasons: Vec::new(),
            owner: host.owner.clone(),
            comm: host.comm.clone(),
            argv0: host
                .argv
                .as_ref()
                .and_then(|argv| argv.first())
                .map(|a| a.rsplit('/').next().unwrap_or(a).to_string()),
        }
    }

    pub fn identity(&self) -> Option<Identity> {
        Some(Identity {
            pid: self.pid,
            start_ticks: self.start_ticks?,
        })
    }

    /// "alice" or "uid 1000".
    pub fn owner_name(&self) -> String {
        match (&self.user, self.uid) {
            (Some(user), _) => user.clone(),
            (None, Some(uid)) => format!("uid {uid}"),
            (None, None) => "an unknown user".into(),
        }
    }
}

/// `gpuctl kill`'s selectors; they combine as AND, repeated values within one as OR.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// GPU indices; `None`: every GPU.
    pub gpus: Option<Vec<u32>>,
    pub pids: Vec<u32>,
    pub uids: Vec<u32>,
    /// Only processes with a reclaim finding.
    pub stale: bool,
    pub min_bytes: Option<u64>,
    pub older_than: Option<Duration>,
    /// Processes of these owners (from their cgroup): a Slurm job, a pod, a container, a unit.
    pub owners: Vec<OwnerMatch>,
}

/// An owner as a selector names it: `slurm:JOBID`, `pod:UID`, `container:ID`, `unit:NAME`,
/// `scope:NAME`. Pod UIDs and container ids may be given by a unique-looking prefix of at
/// least 8 characters, as `docker ps` shows 12.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerMatch {
    SlurmJob(u64),
    Pod(String),
    Container(String),
    Unit(String),
    Scope(String),
}

impl std::str::FromStr for OwnerMatch {
    type Err = String;

    fn from_str(text: &str) -> Result<OwnerMatch, String> {
        let usage = || {
            format!(
                "'{text}' is not an owner: give slurm:JOBID, pod:UID, container:ID, unit:NAME or \
                 scope:NAME"
            )
        };
        let (kind, id) = text.split_once(':').ok_or_else(usage)?;
        let id = id.trim();
        if id.is_empty() {
            return Err(usage());
        }
        let prefix = |id: &str| {
            if id.len() >= 8 {
                Ok(id.to_ascii_lowercase())
            } else {
                Err(format!("'{text}': give at least 8 characters of the id"))
            }
        };
        match kind {
            "slurm" | "slurm-job" => id
                .parse()
                .map(OwnerMatch::SlurmJob)
                .map_err(|_| format!("'{text}': a Slurm job id is a number")),
            "pod" => prefix(id).map(OwnerMatch::Pod),
            "container" => prefix(id).map(OwnerMatch::Container),
            "unit" => Ok(OwnerMatch::Unit(id.to_string())),
            "scope" => Ok(OwnerMatch::Scope(id.to_string())),
            _ => Err(usage()),
        }
    }
}

impl OwnerMatch {
    pub fn matches(&self, owner: &Owner) -> bool {
        match (self, owner) {
            (OwnerMatch::SlurmJob(wanted), Owner::SlurmJob { job_id, .. }) => wanted == job_id,
            (OwnerMatch::Pod(wanted), Owner::KubernetesPod { pod_uid, .. }) => {
                pod_uid.to_ascii_lowercase().starts_with(wanted)
            }
            (OwnerMatch::Container(wanted), Owner::Container { id, .. })
            | (
                OwnerMatch::Container(wanted),
                Owner::KubernetesPod {
                    container_id: Some(id),
                    ..
                },
            ) => id.to_ascii_lowercase().starts_with(wanted),
            (OwnerMatch::Unit(wanted), Owner::SystemdUnit { unit })
            | (OwnerMatch::Unit(wanted), Owner::SystemdUserUnit { unit, .. }) => wanted == unit,
            (OwnerMatch::Scope(wanted), Owner::SystemdScope { scope, .. }) => wanted == scope,
            _ => false,
        }
    }
}

/// Something asked for that will not be acted on, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Refusal {
    pub pid: u32,
    pub reason: String,
}

/// The processes `selection` matches in `snapshot`, and a refusal for each `--pid` that is not
/// a confirmed GPU process on the selected GPUs.
pub fn select(
    snapshot: &Snapshot,
    findings: &[Finding],
    selection: &Selection,
) -> (Vec<Target>, Vec<Refusal>) {
    let reclaimable: HashMap<u32, Vec<&Finding>> = findings
        .iter()
        .filter(|f| f.verdict == Verdict::Reclaim)
        .filter_map(|f| Some((f.identity?.pid, f)))
        .fold(HashMap::new(), |mut map, (pid, f)| {
            map.entry(pid).or_default().push(f);
            map
        });
    let on_selected_gpu = |gpus: &[u32]| {
        selection
            .gpus
            .as_ref()
            .is_none_or(|wanted| gpus.iter().any(|g| wanted.contains(g)))
    };
    let mut pids: Vec<u32> = snapshot
        .devices
        .iter()
        .flat_map(|gpu| gpu.processes.iter().map(|p| p.pid))
        .collect();
    pids.sort_unstable();
    pids.dedup();

    let mut refusals = Vec::new();
    for &pid in &selection.pids {
        let reason = match Target::of(snapshot, pid) {
            None => format!("pid {pid} is not using a GPU"),
            Some(t) if !on_selected_gpu(&t.gpus) => {
                format!("pid {pid} is not on the selected GPUs")
            }
            Some(t) if t.start_ticks.is_none() => format!(
                "pid {pid} cannot be tied to a local process: {}",
                unconfirmed_reason(snapshot, pid)
            ),
            Some(_) => continue,
        };
        refusals.push(Refusal { pid, reason });
    }

    let mut targets = Vec::new();
    for pid in pids {
        let Some(mut target) = Target::of(snapshot, pid) else {
            continue;
        };
        // Nothing is done to a process whose identity is not confirmed.
        if target.start_ticks.is_none() || !on_selected_gpu(&target.gpus) {
            continue;
        }
        if !selection.pids.is_empty() && !selection.pids.contains(&pid) {
            continue;
        }
        if !selection.uids.is_empty() && !target.uid.is_some_and(|u| selection.uids.contains(&u)) {
            continue;
        }
        if !selection.owners.is_empty()
            && !target
                .owner
                .as_ref()
                .is_some_and(|owner| selection.owners.iter().any(|m| m.matches(owner)))
        {
            continue;
        }
        if let Some(min) = selection.min_bytes
            && target.used_bytes.is_none_or(|used| used < min)
        {
            continue;
        }
        if let Some(older) = selection.older_than
            && age_of(snapshot, pid).is_none_or(|age| age < older.as_secs())
        {
            continue;
        }
        if selection.stale {
            match reclaimable.get(&pid) {
                Some(found) => target
                    .reasons
                    .extend(found.iter().map(|f| f.reason.clone())),
                None => continue,
            }
        }
        target
            .reasons
            .extend(matched_selectors(selection, &target, age_of(snapshot, pid)));
        targets.push(target);
    }
    (targets, refusals)
}

/// Why a target was selected, in the selectors' own terms (a dry run prints them).
fn matched_selectors(selection: &Selection, target: &Target, age: Option<u64>) -> Vec<String> {
    let mut matched = Vec::new();
    if selection.pids.contains(&target.pid) {
        matched.push(format!("selected: --pid {}", target.pid));
    }
    if let Some(gpus) = &selection.gpus {
        let on: Vec<String> = target
            .gpus
            .iter()
            .filter(|g| gpus.contains(g))
            .map(u32::to_string)
            .collect();
        matched.push(format!("selected: on GPU {}", on.join(", ")));
    }
    if !selection.uids.is_empty() {
        matched.push(format!("selected: --user {}", target.owner_name()));
    }
    if let (Some(min), Some(used)) = (selection.min_bytes, target.used_bytes) {
        matched.push(format!(
            "selected: holds {} MiB, at least --min-mem {} MiB",
            used >> 20,
            min >> 20
        ));
    }
    if let (Some(older), Some(age)) = (selection.older_than, age) {
        matched.push(format!(
            "selected: running {age}s, at least --older-than {}s",
            older.as_secs()
        ));
    }
    if let (false, Some(owner)) = (selection.owners.is_empty(), &target.owner) {
        matched.push(format!("selected: owner {}", owner.label()));
    }
    if matched.is_empty() && !selection.stale {
        matched.push("selected: --all".into());
    }
    matched
}

/// Targets from the reclaim findings of `clear` (and the watchdog).
pub fn stale_targets(
    snapshot: &Snapshot,
    findings: &[Finding],
    gpus: Option<&[u32]>,
) -> Vec<Target> {
    let mut targets: Vec<Target> = Vec::new();
    for finding in findings.iter().filter(|f| f.verdict == Verdict::Reclaim) {
        let Some(identity) = finding.identity else {
            continue;
        };
        if gpus.is_some_and(|wanted| !finding.gpus.iter().any(|g| wanted.contains(g))) {
            continue;
        }
        if let Some(existing) = targets.iter_mut().find(|t| t.pid == identity.pid) {
            existing.reasons.push(finding.reason.clone());
        } else if let Some(mut target) = Target::of(snapshot, identity.pid) {
            target.reasons.push(finding.reason.clone());
            targets.push(target);
        }
    }
    targets
}

fn age_of(snapshot: &Snapshot, pid: u32) -> Option<u64> {
    snapshot
        .devices
        .iter()
        .flat_map(|gpu| &gpu.processes)
        .find(|p| p.pid == pid)?
        .host
        .age_seconds
}

fn unconfirmed_reason(snapshot: &Snapshot, pid: u32) -> String {
    snapshot
        .devices
        .iter()
        .flat_map(|gpu| &gpu.processes)
        .find(|p| p.pid == pid)
        .and_then(|p| p.host.unconfirmed_reason.clone())
        .unwrap_or_else(|| "unknown".into())
}

/// Who is acting, and what must never be signalled.
#[derive(Debug, Clone)]
pub struct Guard {
    root: bool,
    caller_uid: u32,
    own_pid: u32,
    ancestors: HashSet<u32>,
    protected: Vec<String>,
    protected_users: Vec<String>,
}

impl Guard {
    /// The guard for this process: its privileges, its own pid and ancestors. `protected`
    /// names commands never signalled; `protected_users` names users whose processes are
    /// never signalled (automatic reclaim: clear and the watchdog).
    pub fn for_this_process(protected: &[String], protected_users: &[String]) -> Guard {
        Guard {
            root: nix::unistd::geteuid().is_root(),
            caller_uid: nix::unistd::getuid().as_raw(),
            own_pid: std::process::id(),
            ancestors: ancestors(),
            protected: protected.to_vec(),
            protected_users: protected_users.to_vec(),
        }
    }

    pub fn is_root(&self) -> bool {
        self.root
    }

    pub fn caller_uid(&self) -> u32 {
        self.caller_uid
    }

    /// Why `target` must not be signalled, if it must not.
    pub fn check(&self, target: &Target) -> Option<String> {
        let pid = target.pid;
        if pid <= 1 {
            return Some(format!("pid {pid} is the system's init"));
        }
        if pid == self.own_pid {
            return Some("that is gpuctl itself".into());
        }
        if self.ancestors.contains(&pid) {
            return Some(format!(
                "pid {pid} is an ancestor of gpuctl (the shell or launcher running it)"
            ));
        }
        let names = [target.comm.as_deref(), target.argv0.as_deref()];
        if let Some(name) = self.protected.iter().find(|protected| {
            names.iter().flatten().any(|name| {
                // The kernel keeps 15 characters of a command name.
                *name == protected.as_str() || (name.len() == 15 && protected.starts_with(name))
            })
        }) {
            return Some(format!("protected: {name}"));
        }
        if let Some(user) = target
            .user
            .as_ref()
            .filter(|user| self.protected_users.contains(user))
        {
            return Some(format!("protected user: {user}"));
        }
        if !self.root && target.uid != Some(self.caller_uid) {
            return Some(format!(
                "permission denied: pid {pid} belongs to {}",
                target.owner_name()
            ));
        }
        None
    }
}

/// gpuctl's parent, its parent, ... up to init. They are what runs gpuctl.
fn ancestors() -> HashSet<u32> {
    let mut found = HashSet::new();
    let mut pid = std::os::unix::process::parent_id();
    while pid > 1 && found.insert(pid) {
        pid = match procfs::process::Process::new(pid as i32).and_then(|p| p.stat()) {
            Ok(stat) => stat.ppid.max(0) as u32,
            Err(_) => break,
        };
    }
    found
}

/// What was done with one target, from the plan to the verification.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    #[serde(flatten)]
    pub target: Target,
    /// `signal`, `skip`, or `dry_run` (would signal).
    pub action: Action,
    /// Why it was skipped.
    pub skipped: Option<String>,
    /// How it ended, for a signalled target.
    pub ended: Option<Ended>,
    /// Whether NVML stopped listing it on every GPU; `None` when not signalled.
    pub left_gpu: Option<bool>,
    /// Whether its GPUs' used memory fell by what it held; `None` when not signalled or unknown.
    pub memory_released: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Signal,
    Skip,
    DryRun,
}

impl Outcome {
    /// One word or phrase for a table.
    pub fn summary(&self) -> String {
        match (&self.action, &self.ended) {
            (Action::DryRun, _) => "would signal".into(),
            (Action::Skip, _) => "skipped".into(),
            (Action::Signal, Some(Ended::Exited { signal, .. })) => self.after_exit(signal),
            (Action::Signal, Some(Ended::Killed { .. })) => self.after_exit("SIGKILL"),
            (Action::Signal, Some(Ended::Gone)) => "already gone".into(),
            (Action::Signal, Some(Ended::Reused { .. })) => "refused: pid reused".into(),
            (Action::Signal, Some(Ended::StillAlive { .. })) => "still running".into(),
            (Action::Signal, Some(Ended::Failed { error })) => format!("failed: {error}"),
            (Action::Signal, None) => "not signalled".into(),
        }
    }

    fn after_exit(&self, signal: &str) -> String {
        let verb = if signal == "SIGKILL" {
            "killed"
        } else {
            "ended"
        };
        match (self.left_gpu, self.memory_released) {
            (Some(false), _) => format!("{verb}, still listed on the GPU"),
            (_, Some(false)) => format!("{verb}, memory still held"),
            _ => format!("{verb} ({signal})"),
        }
    }

    /// Whether this target is what the caller asked for: ended and its memory back, or a
    /// dry run. Skips count as not done.
    pub fn succeeded(&self) -> bool {
        match self.action {
            Action::DryRun => true,
            Action::Skip => false,
            Action::Signal => {
                matches!(
                    self.ended,
                    Some(Ended::Exited { .. } | Ended::Killed { .. } | Ended::Gone)
                ) && self.left_gpu != Some(false)
                    && self.memory_released != Some(false)
            }
        }
    }
}

/// Runs the plan: guards every target, signals (unless `dry_run`) with `how`, and verifies
/// through NVML for up to `verify_for`. Outcomes come in target order.
pub fn execute(
    gpus: &Gpus,
    before: &Snapshot,
    targets: Vec<Target>,
    guard: &Guard,
    how: &Escalation,
    verify_for: Duration,
    dry_run: bool,
) -> Vec<Outcome> {
    let mut outcomes: Vec<Outcome> = targets
        .into_iter()
        .map(|target| {
            // Nothing is signalled on a pid alone.
            let skipped = match target.identity() {
                None => Some(format!("pid {}: its start time is unknown", target.pid)),
                Some(_) => guard.check(&target),
            };
            let action = match (&skipped, dry_run) {
                (Some(_), _) => Action::Skip,
                (None, true) => Action::DryRun,
                (None, false) => Action::Signal,
            };
            Outcome {
                target,
                action,
                skipped,
                ended: None,
                left_gpu: None,
                memory_released: None,
            }
        })
        .collect();
    let signalled: Vec<usize> = (0..outcomes.len())
        .filter(|&i| outcomes[i].action == Action::Signal)
        .collect();
    if signalled.is_empty() {
        return outcomes;
    }
    // Every signalled target has an identity (checked above), so the results line up.
    let identities: Vec<Identity> = signalled
        .iter()
        .filter_map(|&i| outcomes[i].target.identity())
        .collect();
    debug_assert_eq!(identities.len(), signalled.len());
    for (&i, ended) in signalled.iter().zip(act::end_all(&identities, how)) {
        outcomes[i].ended = Some(ended);
    }
    verify(gpus, before, &mut outcomes, verify_for);
    outcomes
}

/// Re-reads NVML until every ended target has left its GPUs and their used memory fell by
/// what it held, or until `limit`.
fn verify(gpus: &Gpus, before: &Snapshot, outcomes: &mut [Outcome], limit: Duration) {
    let ended: Vec<usize> = (0..outcomes.len())
        .filter(|&i| {
            matches!(
                outcomes[i].ended,
                Some(Ended::Exited { .. } | Ended::Killed { .. } | Ended::Gone)
            )
        })
        .collect();
    if ended.is_empty() {
        return;
    }
    // Used memory each GPU should come down to once the ended targets' memory is free; other
    // processes may allocate meanwhile, so a little slack is allowed.
    let mut expected: HashMap<u32, u64> = HashMap::new();
    for gpu in &before.devices {
        let Some(memory) = gpu.memory else { continue };
        let freed: u64 = ended
            .iter()
            .filter_map(|&i| {
                gpu.processes
                    .iter()
                    .find(|p| p.pid == outcomes[i].target.pid)
                    .and_then(|p| p.used_bytes)
            })
            .sum();
        if freed > 0 {
            let slack = (64 << 20).max(memory.total_bytes / 100);
            expected.insert(gpu.index, memory.used_bytes.saturating_sub(freed) + slack);
        }
    }
    let indices: Vec<u32> = before.devices.iter().map(|g| g.index).collect();
    let options = SnapshotOptions {
        gpus: Some(indices),
        utilization_window: None,
        only_memory_and_processes: true,
    };
    let deadline = Instant::now() + limit;
    while let Ok(now) = Snapshot::take(gpus, &options) {
        let listed: HashSet<u32> = now
            .devices
            .iter()
            .flat_map(|g| g.processes.iter().map(|p| p.pid))
            .collect();
        let released: HashSet<u32> = now
            .devices
            .iter()
            .filter(|g| {
                expected
                    .get(&g.index)
                    .is_none_or(|&limit| g.memory.is_some_and(|m| m.used_bytes <= limit))
            })
            .map(|g| g.index)
            .collect();
        let mut all_done = true;
        for &i in &ended {
            let outcome = &mut outcomes[i];
            let left = !listed.contains(&outcome.target.pid);
            let freed = outcome.target.gpus.iter().all(|g| released.contains(g));
            outcome.left_gpu = Some(left);
            outcome.memory_released = Some(left && freed);
            all_done &= left && freed;
        }
        if all_done || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::owner::ContainerRuntime;

    #[test]
    fn owner_selectors_parse_and_match() {
        let job: OwnerMatch = "slurm:42".parse().unwrap();
        let slurm = Owner::SlurmJob {
            job_id: 42,
            step: Some("0".into()),
            uid: Some(1000),
        };
        assert!(job.matches(&slurm));
        assert!(!"slurm:43".parse::<OwnerMatch>().unwrap().matches(&slurm));
        let container = Owner::Container {
            runtime: ContainerRuntime::Docker,
            id: "9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d".into(),
        };
        assert!(
            "container:9EC39B91F3D7"
                .parse::<OwnerMatch>()
                .unwrap()
                .matches(&container)
        );
        assert!(!job.matches(&container));
        let unit = Owner::SystemdUnit {
            unit: "jupyter.service".into(),
        };
        assert!(
            "unit:jupyter.service"
                .parse::<OwnerMatch>()
                .unwrap()
                .matches(&unit)
        );
        for bad in [
            "",
            "slurm",
            "slurm:",
            "slurm:abc",
            "pod:1234",
            "vm:x",
            ":42",
        ] {
            assert!(bad.parse::<OwnerMatch>().is_err(), "{bad} accepted");
        }
    }
}
