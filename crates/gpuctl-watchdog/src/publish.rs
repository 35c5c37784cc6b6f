//! What the daemon publishes each pass: systemd's STATUS line, the metrics file for
//! node_exporter's textfile collector, and the findings file that `gpuctl info` shows.

use std::path::Path;
use std::time::{Duration, Instant};

use gpuctl_core::classify::grace::{HistoryTracker, Judgement, Watch};
use gpuctl_core::classify::{Finding, Kind};
use gpuctl_core::config::Watchdog;
use gpuctl_core::host;
use gpuctl_core::owner::OwnerMatch;
use gpuctl_core::pidmap::PidSet;
use gpuctl_core::report::{WatchdogFinding, WatchdogFindings, watchdog_findings_path};
use gpuctl_core::snapshot::totals::{self, Sum};
use gpuctl_core::snapshot::{GpuStatus, Snapshot};
use gpuctl_core::units;

use crate::log::{Logger, Priority};
use crate::metrics::{self, FindingMemory, GpuMetrics, Holding, InstanceMetrics, Metrics};
use crate::notify::Notifier;

/// What was last written, so that a file is not rewritten when nothing changed, and each
/// write error is logged once.
#[derive(Default)]
pub struct Publisher {
    metrics_error: Option<String>,
    /// When the metrics file was last written, and what it said apart from the loop
    /// counter and the poll time.
    metrics_written: Option<(Instant, Metrics)>,
    /// The findings file last written (its content but the time), and when.
    findings_written: Option<(Instant, Vec<WatchdogFinding>)>,
    findings_error: Option<String>,
}

impl Publisher {
    /// STATUS= and the metrics file (at `path`, when one is configured). The file is
    /// replaced each loop, except that loops less than a second apart in which nothing but
    /// the loop counter and the poll time changed are written together: with a sub-second
    /// `interval`, rewriting a file on disk ten times a second (each rename starts a
    /// writeback on ext4) costs more than the loop.
    pub fn publish(
        &mut self,
        notify: &Notifier,
        log: &Logger,
        status: &str,
        metrics: &Metrics,
        path: Option<&Path>,
    ) {
        notify.send(&format!("STATUS={status}"));
        let Some(path) = path else {
            return;
        };
        let now = Instant::now();
        if let Some((at, written)) = &self.metrics_written
            && written.same_but_per_loop(metrics)
            && now.saturating_duration_since(*at) < Duration::from_secs(1)
        {
            return;
        }
        let text = metrics::render(metrics);
        let result = metrics::write_atomic(path, &text);
        // Cloned only when written (the per-user and per-owner rows are a few hundred
        // strings), not each loop.
        self.metrics_written = result.is_ok().then(|| (now, metrics.clone()));
        let error = result.err().map(|e| format!("{}: {e}", path.display()));
        if error != self.metrics_error {
            match &error {
                Some(error) => log.log(
                    Priority::Warning,
                    &format!("cannot write the metrics file: {error}"),
                    &[("ACTION", "metrics".into()), ("REASON", error.clone())],
                ),
                None => log.log(
                    Priority::Info,
                    &format!("metrics file written again: {}", path.display()),
                    &[("ACTION", "metrics".into())],
                ),
            }
            self.metrics_error = error;
        }
    }

    /// The findings file in the state directory `dir`. Written when it changes, and at
    /// least every minute.
    pub fn write_findings(
        &mut self,
        log: &Logger,
        dir: &Path,
        findings: Vec<WatchdogFinding>,
        interval: Duration,
        now: Instant,
    ) {
        if let Some((at, written)) = &self.findings_written
            && *written == findings
            && now.saturating_duration_since(*at) < Duration::from_secs(60)
        {
            return;
        }
        let document = WatchdogFindings {
            written_unix: units::unix_seconds(),
            interval_s: interval.as_secs_f64(),
            findings: findings.clone(),
        };
        let path = watchdog_findings_path(dir);
        let result = serde_json::to_vec_pretty(&document)
            .map_err(std::io::Error::other)
            .and_then(|bytes| {
                std::fs::create_dir_all(dir)?;
                gpuctl_core::files::replace(&path, &bytes, 0o644, false)
            });
        self.findings_written = result.is_ok().then_some((now, findings));
        let error = result.err().map(|e| format!("{}: {e}", path.display()));
        if error != self.findings_error {
            if let Some(error) = &error {
                log.log(
                    Priority::Warning,
                    &format!("cannot write the findings file: {error}"),
                    &[("ACTION", "findings".into()), ("REASON", error.clone())],
                );
            }
            self.findings_error = error;
        }
    }
}

/// A pass's judgement, its reported findings (stuck, idle), the counts per kind and the
/// memory findings hold.
pub type Found<'a> = (
    &'a Judgement,
    &'a [Finding],
    &'a [(&'static str, usize)],
    &'a [FindingMemory],
);

/// What a pass that read NVML shows in the metrics: each GPU's series (with the holder
/// scan's counts per GPU, which stand until the next scan), who holds what, per user and per
/// owner (at most `metrics_max_owners` rows each), and the findings per kind (`counts`).
pub fn observed(
    metrics: &mut Metrics,
    snapshot: &Snapshot,
    (judgement, reported, counts, held): Found<'_>,
    holders: Option<&[(u32, usize)]>,
    watchdog: &Watchdog,
) {
    metrics.nvml_up = true;
    metrics.gpus = gpu_metrics(snapshot, &judgement.stale, reported);
    if let Some(holders) = holders {
        for gpu in &mut metrics.gpus {
            gpu.holders = holders
                .iter()
                .find(|(i, _)| *i == gpu.index)
                .map(|(_, n)| *n);
        }
    }
    let max = watchdog.metrics_max_owners;
    metrics.users = user_holdings(snapshot, max);
    metrics.owners = owner_holdings(snapshot, max);
    metrics.pods = pod_holdings(snapshot, max);
    metrics.findings = counts.to_vec();
    metrics.finding_memory = capped_finding_memory(held, &metrics.owners);
}

/// A pass that could not read NVML: nothing is known of who holds what, so no GPU, user
/// or owner rows, and no findings.
pub fn down(metrics: &mut Metrics) {
    metrics.nvml_up = false;
    metrics.gpus.clear();
    metrics.users.clear();
    metrics.owners.clear();
    metrics.findings = finding_counts(&[], 0);
    metrics.finding_memory.clear();
}

/// Which GPUs did not answer this read ("GPU 1 lost, GPU 3 Unknown Error"); `None` when
/// every one did. A snapshot with a GPU missing is never acted on.
pub fn unanswered(snapshot: &Snapshot) -> Option<String> {
    let broken: Vec<String> = snapshot
        .devices
        .iter()
        .filter(|g| g.status != GpuStatus::Ok)
        .map(|g| {
            format!(
                "GPU {} {}",
                g.index,
                match g.status {
                    GpuStatus::Lost => "lost".to_string(),
                    _ => g.error.clone().unwrap_or_else(|| "failing".into()),
                }
            )
        })
        .collect();
    (!broken.is_empty()).then(|| broken.join(", "))
}

/// The findings file's entries (`gpuctl info` shows them): leftovers and processes above
/// their share with since when their spell began, stuck GPUs with since when they looked
/// stuck, idle processes with since when they were idle.
pub fn finding_entries(
    snapshot: &Snapshot,
    (judgement, reported): (&Judgement, &[Finding]),
    watch: &Watch,
    history: &HistoryTracker,
    now: Instant,
) -> Vec<WatchdogFinding> {
    let unix_at = |since: Option<Instant>| {
        units::unix_seconds()
            - now
                .saturating_duration_since(since.unwrap_or(now))
                .as_secs_f64()
    };
    let mut findings = Vec::new();
    for f in &judgement.stale {
        let since = f.identity.and_then(|id| watch.stale.since(&id));
        findings.push(finding_entry(snapshot, f, unix_at(since)));
    }
    for f in &judgement.over {
        let since = f.identity.and_then(|id| watch.over.since(&id));
        findings.push(finding_entry(snapshot, f, unix_at(since)));
    }
    for f in reported.iter().filter(|f| f.kind == Kind::Idle) {
        let since = f
            .idle
            .map_or(units::unix_seconds(), |i| i.idle_since as f64);
        findings.push(finding_entry(snapshot, f, since));
    }
    for f in reported.iter().filter(|f| f.kind == Kind::Stuck) {
        let lasted = f
            .gpus
            .first()
            .and_then(|&i| history.stuck_for(i))
            .unwrap_or_default();
        let since_unix = units::unix_seconds() - lasted.as_secs_f64();
        findings.push(finding_entry(snapshot, f, since_unix));
    }
    findings
}

/// Each GPU's series: `stale` the leftovers found (due or not yet), `reported` the stuck-GPU
/// findings (and idle ones, which concern processes).
pub fn gpu_metrics(
    snapshot: &Snapshot,
    stale: &[Finding],
    reported: &[Finding],
) -> Vec<GpuMetrics> {
    let stuck = |index: u32| {
        reported
            .iter()
            .any(|f| f.kind == Kind::Stuck && f.gpus.contains(&index))
    };
    let stale_per_gpu = |index: u32| stale.iter().filter(|f| f.gpus.contains(&index)).count();
    snapshot
        .devices
        .iter()
        .map(|g| GpuMetrics {
            index: g.index,
            uuid: g.uuid.clone().unwrap_or_default(),
            ok: g.status == GpuStatus::Ok,
            used_bytes: g.memory.map(|m| m.used_bytes),
            total_bytes: g.memory.map(|m| m.total_bytes),
            processes: g.processes.len(),
            stale: stale_per_gpu(g.index),
            stuck: stuck(g.index),
            unattributed_bytes: g.memory.and_then(|m| m.unattributed_bytes),
            // Filled by the daemon, which keeps a scan's result for a minute.
            holders: None,
            instances: g
                .mig_devices
                .iter()
                .filter_map(|m| {
                    Some(InstanceMetrics {
                        gpu_instance: m.gpu_instance_id?,
                        mig_uuid: m.uuid.clone().unwrap_or_default(),
                        used_bytes: m.memory.map(|mem| mem.used_bytes),
                        total_bytes: m.memory.map(|mem| mem.total_bytes),
                        processes: m.processes.len(),
                        unattributed_bytes: m.memory.and_then(|mem| mem.unattributed_bytes),
                    })
                })
                .collect(),
        })
        .collect()
}

/// Per-user rows: the name, else "uid N" (else "?"), through core's totals.
pub fn user_holdings(snapshot: &Snapshot, max: usize) -> Vec<Holding> {
    let sums = totals::sums(snapshot, |host| {
        host::user_label(host.user.as_deref(), host.uid).unwrap_or_else(|| "?".into())
    });
    capped(sums, max, |user| vec![user], || vec!["other".into()])
}

/// Per-owner rows, keyed as `gpuctl kill --owner` names owners (`slurm:812`); a process
/// with no owner, or one whose owner cannot be read or named, is owner "none".
pub fn owner_holdings(snapshot: &Snapshot, max: usize) -> Vec<Holding> {
    let sums = totals::sums(snapshot, |host| {
        host.owner.as_ref().and_then(OwnerMatch::of)
    });
    capped(
        sums,
        max,
        |owner| match owner {
            Some(owner) => vec![owner.kind().to_string(), owner.to_string()],
            None => vec!["none".into(), "none".into()],
        },
        || vec!["other".into(), "other".into()],
    )
}

/// Per-pod rows (namespace, pod) of the pods the runtime named: one series a pod, never
/// one a pid or a container.
pub fn pod_holdings(snapshot: &Snapshot, max: usize) -> Vec<Holding> {
    let sums = totals::sums(snapshot, |host| match &host.owner {
        Some(gpuctl_core::owner::Owner::KubernetesPod { pod: Some(pod), .. }) => {
            Some((pod.namespace.clone(), pod.name.clone()))
        }
        _ => None,
    });
    let named: Vec<_> = sums.into_iter().filter(|sum| sum.key.is_some()).collect();
    capped(
        named,
        max,
        |pod| {
            let (namespace, name) = pod.unwrap_or_default();
            vec![namespace, name]
        },
        || vec!["other".into(), "other".into()],
    )
}

/// The `max` largest groups (`sums` comes largest first), and the rest summed into one
/// `other` row, so that a host with thousands of jobs cannot flood Prometheus.
fn capped<K>(
    sums: Vec<Sum<K>>,
    max: usize,
    labels: impl Fn(K) -> Vec<String>,
    other: impl FnOnce() -> Vec<String>,
) -> Vec<Holding> {
    let mut rows = Vec::with_capacity(sums.len().min(max) + 1);
    let mut rest: Option<Holding> = None;
    for (i, sum) in sums.into_iter().enumerate() {
        if i < max {
            rows.push(Holding {
                labels: labels(sum.key),
                used_bytes: sum.used_bytes,
                processes: sum.processes,
            });
        } else {
            let rest = rest.get_or_insert_with(|| Holding {
                labels: Vec::new(),
                used_bytes: 0,
                processes: 0,
            });
            rest.used_bytes = rest.used_bytes.saturating_add(sum.used_bytes);
            // A process is in one group only, so distinct counts add up.
            rest.processes += sum.processes;
        }
    }
    if let Some(mut rest) = rest {
        rest.labels = other();
        rows.push(rest);
    }
    rows
}

/// The owner labels of a process, as [`owner_holdings`] gives them.
fn owner_labels(host: &host::HostProcess) -> [String; 2] {
    match host.owner.as_ref().and_then(OwnerMatch::of) {
        Some(owner) => [owner.kind().to_string(), owner.to_string()],
        None => ["none".into(), "none".into()],
    }
}

/// The memory each finding holds, per kind, GPU and owner (owners not yet capped): a
/// process finding's memory on each of its GPUs, a stuck GPU's processes' memory. Findings
/// with no memory NVML lists (unattributed memory has its own family; unlisted holders)
/// give no row.
pub fn finding_memory(snapshot: &Snapshot, findings: &[Finding]) -> Vec<FindingMemory> {
    let mut sums: std::collections::BTreeMap<(&'static str, u32, [String; 2]), u64> =
        Default::default();
    for f in findings.iter().filter(|f| f.kind != Kind::Unattributed) {
        for gpu in snapshot
            .devices
            .iter()
            .filter(|g| f.gpus.contains(&g.index))
        {
            let held = gpu.processes.iter().filter(|p| match f.identity {
                Some(id) => p.pid == id.pid,
                None => f.kind == Kind::Stuck,
            });
            for p in held {
                let key = (f.kind.name(), gpu.index, owner_labels(&p.host));
                let sum = sums.entry(key).or_default();
                *sum = sum.saturating_add(p.used_bytes.unwrap_or(0));
            }
        }
    }
    let uuid = |index: u32| {
        snapshot
            .devices
            .iter()
            .find(|g| g.index == index)
            .and_then(|g| g.uuid.clone())
            .unwrap_or_default()
    };
    sums.into_iter()
        .map(|((kind, gpu, owner), bytes)| FindingMemory {
            kind,
            gpu,
            uuid: uuid(gpu),
            owner,
            bytes,
        })
        .collect()
}

/// `rows` with the owners that `owners` (the capped owner rows) does not name summed into
/// owner "other", so the family has no more owners than `gpuctl_owner_memory_bytes`.
pub fn capped_finding_memory(rows: &[FindingMemory], owners: &[Holding]) -> Vec<FindingMemory> {
    let named = |owner: &[String; 2]| owners.iter().any(|h| h.labels[..] == owner[..]);
    let mut sums: std::collections::BTreeMap<(&'static str, u32, String, [String; 2]), u64> =
        Default::default();
    for row in rows {
        let owner = if named(&row.owner) {
            row.owner.clone()
        } else {
            ["other".into(), "other".into()]
        };
        let sum = sums
            .entry((row.kind, row.gpu, row.uuid.clone(), owner))
            .or_default();
        *sum = sum.saturating_add(row.bytes);
    }
    sums.into_iter()
        .map(|((kind, gpu, uuid, owner), bytes)| FindingMemory {
            kind,
            gpu,
            uuid,
            owner,
            bytes,
        })
        .collect()
}

/// How many of each kind of finding there are now, every kind listed, then the impostors.
pub fn finding_counts(findings: &[Finding], impostors: usize) -> Vec<(&'static str, usize)> {
    let mut counts: Vec<(&'static str, usize)> = Kind::ALL
        .iter()
        .map(|&kind| {
            (
                kind.name(),
                findings.iter().filter(|f| f.kind == kind).count(),
            )
        })
        .collect();
    counts.push(("impostor", impostors));
    counts
}

/// What the daemon is doing, for systemd's STATUS line.
pub struct Status<'a> {
    pub stale: usize,
    /// The GPUs that did not answer, when some did not.
    pub incomplete: Option<&'a str>,
    pub acts: bool,
    pub dry_run: bool,
    pub last_reclaim: Option<&'a str>,
}

impl Status<'_> {
    /// "2 GPUs, 3 processes, 1 stale; dry run; last reclaim ...".
    pub fn line(&self, snapshot: &Snapshot) -> String {
        // Sized once (every loop, one entry per listing): not grown and rehashed.
        let mut processes: PidSet<u32> =
            PidSet::with_capacity_and_hasher(snapshot.most_listed(), Default::default());
        processes.extend(
            snapshot
                .devices
                .iter()
                .flat_map(|g| g.processes.iter().map(|p| p.pid)),
        );
        let mut status = format!(
            "{} GPU{}, {} process{}, {} stale",
            snapshot.devices.len(),
            units::plural(snapshot.devices.len(), "s"),
            processes.len(),
            units::plural(processes.len(), "es"),
            self.stale
        );
        if let Some(what) = self.incomplete {
            status.push_str(&format!("; reclaim suspended: {what}"));
        } else if !self.acts {
            status.push_str("; report mode");
        } else if self.dry_run {
            status.push_str("; dry run");
        }
        if let Some(last) = self.last_reclaim {
            status.push_str(&format!("; last reclaim {last}"));
        }
        status
    }
}

/// One entry of the findings file: `since_unix` when the finding began.
pub fn finding_entry(snapshot: &Snapshot, f: &Finding, since_unix: f64) -> WatchdogFinding {
    WatchdogFinding {
        kind: f.kind,
        gpus: f.gpus.clone(),
        uuids: f
            .gpus
            .iter()
            .map(|&i| {
                snapshot
                    .devices
                    .iter()
                    .find(|g| g.index == i)
                    .and_then(|g| g.uuid.clone())
                    .unwrap_or_default()
            })
            .collect(),
        pid: f.identity.map(|id| id.pid),
        start_ticks: f.identity.map(|id| id.start_ticks),
        // Seconds are enough, and keep the file unchanged while nothing changes.
        since_unix: since_unix.floor(),
        reason: f.reason.clone(),
        idle: f.idle,
    }
}

/// The local time of day, "12:03:04".
pub fn clock_time() -> String {
    let now = units::unix_seconds() as libc::time_t;
    // SAFETY: libc::tm is plain integers (and a pointer that may be null), so all zeroes
    // is a valid value.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are to live locals of the right types; localtime_r (unlike
    // localtime) writes only to `tm`, so it is safe beside other threads. nix has no
    // wrapper for it.
    unsafe { libc::localtime_r(&now, &mut tm) };
    format!("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec)
}

#[cfg(test)]
mod tests {
    use gpuctl_core::fixtures;
    use gpuctl_core::owner::Owner;
    use gpuctl_core::snapshot::GpuProcess;

    use super::*;

    fn process(pid: u32, gib: u64, user: Option<&str>, owner: Option<Owner>) -> GpuProcess {
        fixtures::process(pid)
            .used_gib(gib)
            .confirmed()
            .uid(1000 + pid)
            .owner(owner)
            .host(|host| host.user = user.map(str::to_string))
            .build()
    }

    fn snapshot(processes: Vec<GpuProcess>) -> Snapshot {
        fixtures::one_gpu(processes)
    }

    fn job(job_id: u64, uid: Option<u32>, from_environ: bool) -> Option<Owner> {
        Some(Owner::SlurmJob {
            job_id,
            step: Some("0".into()),
            uid,
            from_environ,
        })
    }

    fn finding(kind: Kind, pid: Option<u32>, gpus: &[u32]) -> Finding {
        Finding {
            kind,
            verdict: gpuctl_core::classify::Verdict::Report,
            identity: pid.map(|pid| gpuctl_core::act::Identity::new(pid, 1)),
            gpus: gpus.to_vec(),
            bytes: None,
            reason: String::new(),
            idle: None,
        }
    }

    /// Per kind, GPU and owner, never per process: two orphans of one job are one row, a
    /// stuck GPU holds its processes' memory, and owners the owner rows leave out are
    /// "other".
    #[test]
    fn finding_memory_is_per_kind_gpu_and_owner() {
        let snapshot = Snapshot::of(vec![
            fixtures::gpu(
                0,
                vec![
                    process(1, 2, None, job(7, None, false)),
                    process(2, 3, None, job(7, None, false)),
                    process(3, 5, None, job(8, None, false)),
                ],
            ),
            fixtures::gpu(1, vec![process(4, 4, None, job(9, None, false))]),
        ]);
        let findings = [
            finding(Kind::Orphaned, Some(1), &[0]),
            finding(Kind::Orphaned, Some(2), &[0]),
            finding(Kind::Idle, Some(3), &[0]),
            finding(Kind::Stuck, None, &[1]),
            finding(Kind::Unattributed, None, &[0]),
        ];
        let rows = finding_memory(&snapshot, &findings);
        let seen: Vec<(&str, u32, &str, u64)> = rows
            .iter()
            .map(|r| (r.kind, r.gpu, r.owner[1].as_str(), r.bytes >> 30))
            .collect();
        assert_eq!(
            seen,
            [
                ("idle", 0, "slurm:8", 5),
                ("orphaned", 0, "slurm:7", 5),
                ("stuck", 1, "slurm:9", 4),
            ]
        );
        // Only job 7 among the owner rows: 8 and 9 become "other".
        let owners = [Holding {
            labels: vec!["slurm".into(), "slurm:7".into()],
            used_bytes: 1,
            processes: 1,
        }];
        let capped = capped_finding_memory(&rows, &owners);
        let owners: Vec<&str> = capped.iter().map(|r| r.owner[1].as_str()).collect();
        assert_eq!(owners, ["other", "slurm:7", "other"]);
    }

    fn pod(namespace: &str, name: &str, container: &str) -> Option<Owner> {
        Some(Owner::KubernetesPod {
            pod_uid: format!("{namespace}-{name}-uid"),
            qos: None,
            container_id: Some(format!("{name}-{container}")),
            runtime: None,
            pod: Some(gpuctl_core::owner::PodName {
                namespace: namespace.into(),
                name: name.into(),
                container: Some(container.into()),
            }),
        })
    }

    #[test]
    fn pods_are_one_series_each_whatever_their_containers_and_capped() {
        let snapshot = snapshot(vec![
            process(1, 4, None, pod("ml", "trainer-0", "trainer")),
            process(2, 3, None, pod("ml", "trainer-0", "sidecar")),
            process(3, 2, None, pod("ml", "notebook-7", "jupyter")),
            process(4, 1, None, pod("dev", "scratch", "main")),
            process(5, 8, None, Some(Owner::None)),
        ]);
        let rows = |max| -> Vec<(Vec<String>, u64, usize)> {
            pod_holdings(&snapshot, max)
                .into_iter()
                .map(|h| (h.labels, h.used_bytes >> 30, h.processes))
                .collect()
        };
        let row = |namespace: &str, name: &str, gib, processes| {
            (
                vec![namespace.to_string(), name.to_string()],
                gib,
                processes,
            )
        };
        assert_eq!(
            rows(50),
            [
                row("ml", "trainer-0", 7, 2),
                row("ml", "notebook-7", 2, 1),
                row("dev", "scratch", 1, 1)
            ]
        );
        assert_eq!(
            rows(1),
            [row("ml", "trainer-0", 7, 2), row("other", "other", 3, 2)]
        );
    }

    #[test]
    fn owners_are_keyed_as_kill_owner_takes_them() {
        let snapshot = snapshot(vec![
            process(1, 4, Some("alice"), job(812, None, false)),
            process(2, 3, None, job(813, Some(1000), true)),
            process(
                3,
                2,
                Some("bob"),
                Some(Owner::SystemdUnit {
                    unit: "nginx.service".into(),
                }),
            ),
            process(4, 1, Some("bob"), Some(Owner::None)),
        ]);
        let owners: Vec<(Vec<String>, u64)> = owner_holdings(&snapshot, 50)
            .into_iter()
            .map(|h| (h.labels, h.used_bytes >> 30))
            .collect();
        let row = |kind: &str, owner: &str, gib| (vec![kind.to_string(), owner.to_string()], gib);
        assert_eq!(
            owners,
            vec![
                row("slurm", "slurm:812", 4),
                row("slurm", "slurm:813@1000", 3),
                row("unit", "unit:nginx.service", 2),
                row("none", "none", 1),
            ]
        );
        let users: Vec<(Vec<String>, u64, usize)> = user_holdings(&snapshot, 50)
            .into_iter()
            .map(|h| (h.labels, h.used_bytes >> 30, h.processes))
            .collect();
        assert_eq!(
            users,
            vec![
                (vec!["alice".to_string()], 4, 1),
                // Equal memory: by name.
                (vec!["bob".to_string()], 3, 2),
                (vec!["uid 1002".to_string()], 3, 1),
            ]
        );
    }

    #[test]
    fn owners_beyond_the_cap_are_summed_into_other() {
        // 200 jobs of 1..=200 GiB: the 50 largest kept, the rest one row, nothing lost.
        let snapshot = snapshot(
            (1..=200)
                .map(|n| {
                    process(
                        n,
                        u64::from(n),
                        Some("alice"),
                        job(u64::from(n), None, false),
                    )
                })
                .collect(),
        );
        let owners = owner_holdings(&snapshot, 50);
        assert_eq!(owners.len(), 51);
        assert_eq!(owners[0].labels, ["slurm", "slurm:200"]);
        assert_eq!(owners[49].labels, ["slurm", "slurm:151"]);
        let other = &owners[50];
        assert_eq!(other.labels, ["other", "other"]);
        assert_eq!(other.processes, 150);
        assert_eq!(other.used_bytes >> 30, (1..=150).sum::<u64>());
        let total: u64 = owners.iter().map(|h| h.used_bytes).sum();
        assert_eq!(total >> 30, (1..=200).sum::<u64>());
        assert_eq!(owners.iter().map(|h| h.processes).sum::<usize>(), 200);
        // Within the cap: no "other" row.
        assert_eq!(owner_holdings(&snapshot, 200).len(), 200);
    }
}

#[cfg(test)]
mod timing {
    use std::sync::Arc;
    use std::time::Instant;

    use gpuctl_core::host::HostProcess;
    use gpuctl_core::owner::Owner;
    use gpuctl_core::snapshot::{GpuProcess, GpuSnapshot, ProcessType};

    use super::*;

    /// The per-loop cost of the fleet rows at 8 GPUs x 256 processes, 200 owners:
    /// `cargo test --release -p gpuctl-watchdog -- --ignored --nocapture fleet_rows`.
    #[test]
    #[ignore = "a measurement, run by hand in release"]
    fn fleet_rows_cost() {
        let hosts: Vec<Arc<HostProcess>> = (0..256u32)
            .map(|i| {
                let mut host = HostProcess::unconfirmed("t");
                host.confirmed = true;
                host.user = Some("nobody".into());
                host.uid = Some(65534);
                host.owner = Some(Owner::SlurmJob {
                    job_id: 1000 + u64::from(i % 200),
                    step: None,
                    uid: Some(65534),
                    from_environ: true,
                });
                Arc::new(host)
            })
            .collect();
        let devices = (0..8)
            .map(|g| GpuSnapshot {
                processes: hosts
                    .iter()
                    .enumerate()
                    .map(|(i, host)| GpuProcess {
                        pid: 100 + i as u32,
                        used_bytes: Some(1 << 30),
                        kind: ProcessType::Compute,
                        sm_util_pct: None,
                        idle: None,
                        reclaimable: None,
                        gpu_instance_id: None,
                        compute_instance_id: None,
                        mps: None,
                        host: host.clone(),
                    })
                    .collect(),
                ..GpuSnapshot::unread(g)
            })
            .collect();
        let snapshot = Snapshot::of(devices);
        let mut written = Metrics::default();
        let rounds = 2000;
        let started = Instant::now();
        for _ in 0..rounds {
            let m = Metrics {
                users: user_holdings(&snapshot, 50),
                owners: owner_holdings(&snapshot, 50),
                findings: finding_counts(&[], 0),
                ..Metrics::default()
            };
            if !written.same_but_per_loop(&m) {
                written = m;
            }
        }
        let per = started.elapsed() / rounds;
        println!("fleet rows per loop: {per:?}");
        let started = Instant::now();
        for _ in 0..rounds {
            std::hint::black_box(user_holdings(&snapshot, 50));
        }
        println!("users: {:?}", started.elapsed() / rounds);
        let started = Instant::now();
        for _ in 0..rounds {
            std::hint::black_box(totals::sums(&snapshot, |host| {
                host.owner.as_ref().and_then(OwnerMatch::of)
            }));
        }
        println!("owner sums: {:?}", started.elapsed() / rounds);
    }
}
