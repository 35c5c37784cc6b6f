//! The `select` step: which processes of a snapshot a request names. A [`Selector`] is
//! never empty, so "no criterion" (which would read as "every process") cannot be written;
//! every process chosen is a [`Target`] carrying why it was chosen.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::act::Identity;
use crate::classify::{Finding, Kind, Remedy, Verdict};
use crate::host::HostProcess;
use crate::nvml::Place;
pub use crate::owner::OwnerMatch;
use crate::snapshot::Snapshot;

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
    /// The kinds of the findings that selected it, in the order of their reasons (none when
    /// selectors chose it): what a consumer decides by, never the reasons' words.
    pub kinds: Vec<Kind>,
    /// What the host knows of it (owner, command name, argv[0]), shared with the snapshot.
    #[serde(skip)]
    pub(crate) host: Arc<HostProcess>,
    /// Each GPU it is on, with its MIG GPU instance there.
    #[serde(skip)]
    pub places: Vec<(u32, Option<u32>)>,
}

impl Target {
    /// The target for a process on the GPUs of `snapshot`.
    pub fn of(snapshot: &Snapshot, pid: u32) -> Option<Target> {
        let mut target: Option<Target> = None;
        for gpu in &snapshot.devices {
            let Some(process) = gpu.processes.iter().find(|p| p.pid == pid) else {
                continue;
            };
            let target = target.get_or_insert_with(|| Target::new(process.pid, &process.host));
            target.gpus.push(gpu.index);
            target.places.push((gpu.index, process.gpu_instance_id));
            if let (Some(total), Some(used)) = (target.used_bytes, process.used_bytes) {
                target.used_bytes = Some(total + used);
            } else {
                target.used_bytes = None;
            }
        }
        if target.is_some() {
            return target;
        }
        // A device-file holder NVML does not list: what it holds is not known.
        for gpu in &snapshot.devices {
            let Some(holder) = gpu.holders.iter().flatten().find(|h| h.pid == pid) else {
                continue;
            };
            let target = target.get_or_insert_with(|| {
                let mut target = Target::new(pid, &holder.host);
                target.used_bytes = None;
                target
            });
            target.gpus.push(gpu.index);
            target.places.push((gpu.index, None));
        }
        target
    }

    /// The target for process `identity` that is on no GPU (a crashed run's leftover that
    /// holds no GPU memory), from its host facts, so the plan guards it like any other;
    /// there is nothing for verification to check on a GPU. `None` when the facts are not
    /// of that process (its pid reused, or it could not be read), as nothing may be done to
    /// a process other than the one named.
    pub fn off_gpu(identity: Identity, host: HostProcess) -> Option<Target> {
        if host.start_ticks != Some(identity.start_ticks) {
            return None;
        }
        Some(Target::new(identity.pid, &Arc::new(host)))
    }

    /// Whether it is on one of `places` (a GPU, or a MIG instance of one).
    pub fn in_places(&self, places: &[Place]) -> bool {
        self.places
            .iter()
            .any(|(gpu, gi)| places.iter().any(|p| p.holds(*gpu, *gi)))
    }

    pub(crate) fn new(pid: u32, host: &Arc<HostProcess>) -> Target {
        Target {
            pid,
            start_ticks: host.start_ticks,
            uid: host.uid,
            user: host.user.clone(),
            command: host.display_command(),
            gpus: Vec::new(),
            used_bytes: Some(0),
            reasons: Vec::new(),
            kinds: Vec::new(),
            host: Arc::clone(host),
            places: Vec::new(),
        }
    }

    /// The command as a table shows it: bytes that are not UTF-8 as `\xNN` (`command`, in
    /// JSON, has U+FFFD in their place).
    pub fn shown_command(&self) -> String {
        self.host.shown_command()
    }

    pub fn identity(&self) -> Option<Identity> {
        Some(Identity {
            pid: self.pid,
            start_ticks: self.start_ticks?,
        })
    }

    /// "alice" or "uid 1000".
    pub fn owner_name(&self) -> String {
        crate::host::user_label(self.user.as_deref(), self.uid)
            .unwrap_or_else(|| "an unknown user".into())
    }
}

/// One thing a request may select by. Criteria combine as AND; repeating one widens it (OR
/// within it). An empty list inside a criterion matches nothing.
#[derive(Debug, Clone, PartialEq)]
pub enum Criterion {
    /// Processes on these GPUs, or in these MIG instances.
    Gpus(Vec<Place>),
    Pids(Vec<u32>),
    /// Exactly these processes: pid and start time, so a reused pid is not one of them.
    Processes(Vec<Identity>),
    Uids(Vec<u32>),
    /// Processes of these owners (from their cgroup): a Slurm job, a pod, a container, a unit.
    Owners(Vec<OwnerMatch>),
    /// Only processes with a reclaim finding.
    Stale,
    MinBytes(u64),
    OlderThan(Duration),
    /// Every process: must be said, never implied.
    All,
}

/// What a request selects: at least one [`Criterion`], so an empty selection (which would
/// read as "every process") cannot be expressed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selector {
    gpus: Option<Vec<Place>>,
    pids: Option<Vec<u32>>,
    processes: Option<Vec<Identity>>,
    uids: Option<Vec<u32>>,
    owners: Option<Vec<OwnerMatch>>,
    stale: bool,
    min_bytes: Option<u64>,
    older_than: Option<Duration>,
    all: bool,
}

/// A selector was asked for with no criterion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoCriterion;

impl std::fmt::Display for NoCriterion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("no process selected: give at least one selector")
    }
}

impl std::error::Error for NoCriterion {}

impl Selector {
    pub fn by(criterion: Criterion) -> Selector {
        Selector::default().and(criterion)
    }

    /// The selector of all of `criteria`; an error when there are none.
    pub fn all_of(criteria: impl IntoIterator<Item = Criterion>) -> Result<Selector, NoCriterion> {
        let mut criteria = criteria.into_iter();
        let first = criteria.next().ok_or(NoCriterion)?;
        Ok(criteria.fold(Selector::by(first), Selector::and))
    }

    /// Adds a criterion (AND); a kind given again widens it (OR).
    pub fn and(mut self, criterion: Criterion) -> Selector {
        fn widen<T>(slot: &mut Option<Vec<T>>, more: Vec<T>) {
            slot.get_or_insert_with(Vec::new).extend(more);
        }
        match criterion {
            Criterion::Gpus(gpus) => widen(&mut self.gpus, gpus),
            Criterion::Pids(pids) => widen(&mut self.pids, pids),
            Criterion::Processes(ids) => widen(&mut self.processes, ids),
            Criterion::Uids(uids) => widen(&mut self.uids, uids),
            Criterion::Owners(owners) => widen(&mut self.owners, owners),
            Criterion::Stale => self.stale = true,
            Criterion::MinBytes(min) => {
                self.min_bytes = Some(self.min_bytes.map_or(min, |m| m.min(min)))
            }
            Criterion::OlderThan(age) => {
                self.older_than = Some(self.older_than.map_or(age, |a| a.min(age)))
            }
            Criterion::All => self.all = true,
        }
        self
    }

    /// Whether it names every process (--all), or processes of several users may match.
    pub fn is_all(&self) -> bool {
        self.all
    }

    /// Whether `target`, whose identity is confirmed, meets every criterion but --stale.
    fn admits(&self, snapshot: &Snapshot, target: &Target, identity: &Identity) -> bool {
        if !self.on_gpus(target) {
            return false;
        }
        if self.pids.as_ref().is_some_and(|p| !p.contains(&target.pid)) {
            return false;
        }
        if self
            .processes
            .as_ref()
            .is_some_and(|ids| !ids.contains(identity))
        {
            return false;
        }
        if self
            .uids
            .as_ref()
            .is_some_and(|uids| !target.uid.is_some_and(|u| uids.contains(&u)))
        {
            return false;
        }
        if self.owners.as_ref().is_some_and(|owners| {
            !target
                .host
                .owner
                .as_ref()
                .is_some_and(|owner| owners.iter().any(|m| m.matches(owner)))
        }) {
            return false;
        }
        if let Some(min) = self.min_bytes
            && target.used_bytes.is_none_or(|used| used < min)
        {
            return false;
        }
        if let Some(older) = self.older_than
            && age_of(snapshot, target.pid).is_none_or(|age| age < older.as_secs())
        {
            return false;
        }
        true
    }

    fn on_gpus(&self, target: &Target) -> bool {
        self.gpus
            .as_ref()
            .is_none_or(|wanted| target.in_places(wanted))
    }
}

/// Something asked for that will not be acted on, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Refusal {
    pub pid: u32,
    pub reason: String,
}

/// The processes `selector` matches in `snapshot`, and a refusal for each pid it names that
/// is not a confirmed GPU process on the selected GPUs.
pub fn select(
    snapshot: &Snapshot,
    findings: &[Finding],
    selector: &Selector,
) -> (Vec<Target>, Vec<Refusal>) {
    // Stale: a leftover's finding, not a policy breach.
    let reclaimable: HashMap<u32, Vec<&Finding>> = findings
        .iter()
        .filter(|f| f.verdict == Verdict::Reclaim && f.kind.remedy() == Remedy::Reclaim)
        .filter_map(|f| Some((f.identity?.pid, f)))
        .fold(HashMap::new(), |mut map, (pid, f)| {
            map.entry(pid).or_default().push(f);
            map
        });
    let mut pids: Vec<u32> = snapshot
        .devices
        .iter()
        .flat_map(|gpu| gpu.processes.iter().map(|p| p.pid))
        .collect();
    pids.sort_unstable();
    pids.dedup();

    let refusals = refusals(snapshot, selector);
    let mut targets = Vec::new();
    for pid in pids {
        let Some(mut target) = Target::of(snapshot, pid) else {
            continue;
        };
        // Nothing is done to a process whose identity is not confirmed.
        let Some(identity) = target.identity() else {
            continue;
        };
        if !selector.admits(snapshot, &target, &identity) {
            continue;
        }
        if selector.stale {
            match reclaimable.get(&pid) {
                Some(found) => target
                    .reasons
                    .extend(found.iter().map(|f| f.reason.clone())),
                None => continue,
            }
        }
        target
            .reasons
            .extend(matched_criteria(selector, &target, age_of(snapshot, pid)));
        targets.push(target);
    }
    (targets, refusals)
}

/// A refusal for each pid the selector names (by --pid or --process) that is not a
/// confirmed GPU process on the selected GPUs.
fn refusals(snapshot: &Snapshot, selector: &Selector) -> Vec<Refusal> {
    let named = selector.pids.iter().flatten().copied();
    let named_processes = selector.processes.iter().flatten().map(|id| id.pid);
    let mut refusals = Vec::new();
    for pid in named.chain(named_processes) {
        let reason = match Target::of(snapshot, pid) {
            None => format!("pid {pid} is not using a GPU"),
            Some(t) if !selector.on_gpus(&t) => {
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
    refusals
}

/// Why a target was selected, in the selectors' own terms (a dry run prints them).
fn matched_criteria(selector: &Selector, target: &Target, age: Option<u64>) -> Vec<String> {
    let mut matched = Vec::new();
    if selector
        .pids
        .as_ref()
        .is_some_and(|p| p.contains(&target.pid))
    {
        matched.push(format!("selected: --pid {}", target.pid));
    }
    if let Some(places) = &selector.gpus {
        let on: Vec<String> = target
            .places
            .iter()
            .filter(|(gpu, gi)| places.iter().any(|p| p.holds(*gpu, *gi)))
            .map(|&(gpu, gi)| {
                // Instances are named only where the selector named instances.
                let named = places.iter().any(|p| p.gpu_instance.is_some());
                Place {
                    gpu,
                    gpu_instance: gi.filter(|_| named),
                }
                .to_string()
            })
            .collect();
        matched.push(format!("selected: on GPU {}", on.join(", ")));
    }
    if selector.uids.is_some() {
        matched.push(format!("selected: --user {}", target.owner_name()));
    }
    if let (Some(min), Some(used)) = (selector.min_bytes, target.used_bytes) {
        // In the tables' units, so the reason reads like the MEMORY column beside it.
        matched.push(format!(
            "selected: holds {}, at least --min-mem {}",
            crate::units::bytes(used),
            crate::units::bytes(min)
        ));
    }
    if let (Some(older), Some(age)) = (selector.older_than, age) {
        matched.push(format!(
            "selected: running {age}s, at least --older-than {}s",
            older.as_secs()
        ));
    }
    if let (true, Some(owner)) = (selector.owners.is_some(), &target.host.owner) {
        matched.push(format!("selected: owner {}", owner.label()));
    }
    if matched.is_empty() && !selector.stale && selector.all {
        matched.push("selected: --all".into());
    }
    matched
}

/// A target for each process with a reclaim finding (on `gpus`, when given), carrying the
/// findings' reasons: what `clear`, the watchdog and its policy rules act on.
pub fn from_findings(
    snapshot: &Snapshot,
    findings: &[Finding],
    places: Option<&[Place]>,
) -> Vec<Target> {
    let mut targets: Vec<Target> = Vec::new();
    for finding in findings.iter().filter(|f| f.verdict == Verdict::Reclaim) {
        let Some(identity) = finding.identity else {
            continue;
        };
        if places.is_some_and(|places| !concerns(snapshot, finding, places)) {
            continue;
        }
        if let Some(existing) = targets.iter_mut().find(|t| t.pid == identity.pid) {
            existing.reasons.push(finding.reason.clone());
            existing.kinds.push(finding.kind);
        } else if let Some(mut target) = Target::of(snapshot, identity.pid) {
            target.reasons.push(finding.reason.clone());
            target.kinds.push(finding.kind);
            targets.push(target);
        }
    }
    targets
}

/// Whether `finding` concerns one of `places`: one of its GPUs is selected and, for a
/// process, so is its MIG instance there (an instance named leaves the card's others out;
/// a device-file holder, in no instance, counts only for its whole GPU).
pub fn concerns(snapshot: &Snapshot, finding: &Finding, places: &[Place]) -> bool {
    finding.gpus.iter().any(|&gpu| match finding.identity {
        None => places.iter().any(|p| p.gpu == gpu),
        Some(id) => {
            let instance = snapshot
                .devices
                .iter()
                .find(|g| g.index == gpu)
                .and_then(|g| g.processes.iter().find(|p| p.pid == id.pid))
                .and_then(|p| p.gpu_instance_id);
            places.iter().any(|p| p.holds(gpu, instance))
        }
    })
}

fn age_of(snapshot: &Snapshot, pid: u32) -> Option<u64> {
    snapshot
        .devices
        .iter()
        .flat_map(|gpu| &gpu.processes)
        .find(|p| p.pid == pid)?
        .host
        .age_seconds()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;
    use crate::snapshot::GpuProcess;

    fn process(pid: u32, uid: u32, used_mib: u64, confirmed: bool) -> GpuProcess {
        let process = fixtures::process(pid).used_mib(used_mib).sm_pct(0);
        match confirmed {
            true => process
                .confirmed()
                .uid(uid)
                .started(1000 + u64::from(pid))
                .host(|host| host.age = Some(crate::host::Age::fixed(60))),
            false => process,
        }
        .build()
    }

    fn two_gpus() -> Snapshot {
        Snapshot::of(vec![
            fixtures::gpu(
                0,
                vec![process(10, 1000, 512, true), process(11, 1001, 2048, true)],
            ),
            fixtures::gpu(
                1,
                vec![process(12, 1000, 4096, true), process(13, 1000, 64, false)],
            ),
        ])
    }

    fn pids(targets: &[Target]) -> Vec<u32> {
        targets.iter().map(|t| t.pid).collect()
    }

    #[test]
    fn a_selector_cannot_be_empty() {
        assert_eq!(Selector::all_of([]), Err(NoCriterion));
        assert!(Selector::all_of([Criterion::Stale]).is_ok());
    }

    #[test]
    fn criteria_combine_as_and_and_widen_when_repeated() {
        let snapshot = two_gpus();
        let on_gpu0 = Selector::by(Criterion::Gpus(vec![Place::whole(0)]));
        assert_eq!(pids(&select(&snapshot, &[], &on_gpu0).0), vec![10, 11]);
        let widened = on_gpu0.clone().and(Criterion::Gpus(vec![Place::whole(1)]));
        assert_eq!(pids(&select(&snapshot, &[], &widened).0), vec![10, 11, 12]);
        let narrowed = widened.and(Criterion::Uids(vec![1000]));
        assert_eq!(pids(&select(&snapshot, &[], &narrowed).0), vec![10, 12]);
        let big = narrowed.and(Criterion::MinBytes(1 << 30));
        let (targets, _) = select(&snapshot, &[], &big);
        assert_eq!(pids(&targets), vec![12]);
        // Sizes in the tables' units (units::bytes), never raw MiB.
        assert!(
            targets[0]
                .reasons
                .contains(&"selected: holds 4.0 GiB, at least --min-mem 1.0 GiB".to_string()),
            "{:?}",
            targets[0].reasons
        );
    }

    #[test]
    fn an_empty_list_matches_nothing_and_unconfirmed_processes_are_never_targets() {
        let snapshot = two_gpus();
        let nothing = Selector::by(Criterion::Pids(Vec::new()));
        assert!(select(&snapshot, &[], &nothing).0.is_empty());
        let all = Selector::by(Criterion::All);
        let (targets, _) = select(&snapshot, &[], &all);
        assert_eq!(pids(&targets), vec![10, 11, 12], "13 is unconfirmed");
        assert_eq!(targets[0].reasons, vec!["selected: --all".to_string()]);
        let (_, refused) = select(&snapshot, &[], &Selector::by(Criterion::Pids(vec![13, 99])));
        let reasons: Vec<&str> = refused.iter().map(|r| r.reason.as_str()).collect();
        assert!(
            reasons[0].starts_with("pid 13 cannot be tied"),
            "{reasons:?}"
        );
        assert_eq!(reasons[1], "pid 99 is not using a GPU");
    }

    #[test]
    fn a_target_off_gpu_is_only_of_the_process_named() {
        let host = process(20, 1000, 0, true).host.as_ref().clone();
        let target = Target::off_gpu(Identity::new(20, 1020), host.clone()).expect("same");
        assert_eq!(target.identity(), Some(Identity::new(20, 1020)));
        assert!(target.gpus.is_empty() && target.places.is_empty());
        assert_eq!(target.uid, Some(1000));
        assert!(
            Target::off_gpu(Identity::new(20, 5), host).is_none(),
            "pid reused"
        );
        let unread = crate::host::HostProcess::unconfirmed("test");
        assert!(Target::off_gpu(Identity::new(20, 1020), unread).is_none());
    }

    #[test]
    fn a_process_criterion_skips_a_reused_pid() {
        let snapshot = two_gpus();
        let same = Selector::by(Criterion::Processes(vec![Identity::new(10, 1010)]));
        assert_eq!(pids(&select(&snapshot, &[], &same).0), vec![10]);
        let reused = Selector::by(Criterion::Processes(vec![Identity::new(10, 5)]));
        assert!(select(&snapshot, &[], &reused).0.is_empty());
    }
}
