//! The loop: snapshot, classify (with the history only a daemon has), wait out the grace,
//! act through the same road as `gpuctl clear`, verify, report (journal, STATUS, metrics).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use gpuctl_core::act::Identity;
use gpuctl_core::classify::grace::{Handled, Handling, HistoryTracker, Spells};
use gpuctl_core::classify::{self, Finding, Kind, Remedy, Verdict};
use gpuctl_core::exit::Exit;
use gpuctl_core::host::{FactCache, Lineage, ProcView};
use gpuctl_core::pidmap::{PidMap, PidSet};
use gpuctl_core::plan::{Action, Outcome};
use gpuctl_core::reclaim::Reclaim;
use gpuctl_core::select::{self, Target};
use gpuctl_core::snapshot::peaks::PeakStore;
use gpuctl_core::snapshot::{GpuStatus, Snapshot, SnapshotOptions};
use gpuctl_core::units::{self, bytes};
use nix::time::{ClockId, clock_gettime};

use crate::events::{FindingLog, fields_of, target_fields};
use crate::health::HealthWatch;
use crate::link::Link;
use crate::log::{Logger, Priority};
use crate::metrics::Metrics;
use crate::notify::Notifier;
use crate::publish::{self, Publisher, Status};
use crate::settings::Settings;
use crate::signals;

/// What one pass saw.
struct Seen {
    snapshot: Snapshot,
    lineages: PidMap<u32, Lineage>,
    /// The GPUs that did not answer, when some did not: nothing is acted on.
    incomplete: Option<String>,
    /// NVML is re-opened after this pass.
    reopen: bool,
    now: Instant,
    /// The device-file holder scan ran in this pass.
    holders_scanned: bool,
}

/// What one pass found.
struct Judged {
    /// Leftovers of a kind the watchdog reclaims, due or not yet.
    stale: Vec<Finding>,
    stale_ids: PidSet<Identity>,
    /// Processes above their share, due or not yet.
    over_ids: PidSet<Identity>,
    /// Findings that lasted the grace, with what is done about them.
    due: Vec<(Finding, Remedy)>,
    /// Processes above their share, and stuck GPUs (reported only).
    over: Vec<Finding>,
    stuck: Vec<Finding>,
    /// Current findings per kind, impostors last (the metrics).
    counts: Vec<(&'static str, usize)>,
}

/// The last device-file holder scan: it reads every process's descriptors, so it runs at
/// most once a minute, and its result stands for that minute.
struct HoldersSeen {
    at: Instant,
    /// Unlisted holders per GPU index, for the GPUs scanned.
    per_gpu: Vec<(u32, usize)>,
    /// The unlisted-holder findings it gave.
    findings: usize,
}

/// How often the holder scan may run.
const HOLDER_SCAN_EVERY: Duration = Duration::from_secs(60);

/// The result of one pass, for `--once`.
#[derive(Debug, Default)]
pub struct Pass {
    pub nvml_down: bool,
    pub left: usize,
    pub failed: usize,
}

pub struct Daemon {
    pub settings: Settings,
    log: Logger,
    notify: Notifier,
    link: Link,
    last_incomplete: Option<String>,
    /// Host facts kept across loops: a known process costs one read of its stat.
    facts: FactCache,
    /// The /proc view, kept across passes (its namespace and filesystem checks do not
    /// change); its uptime is read again each pass.
    proc_view: Option<ProcView>,
    // History.
    history: HistoryTracker,
    /// Since when each leftover, and each process above its share, has been seen.
    stale: Spells,
    over: Spells,
    warned: PidSet<Identity>,
    handling: Handling,
    findings_log: FindingLog,
    // Reporting.
    metrics: Metrics,
    publisher: Publisher,
    last_reclaim: Option<String>,
    status: String,
    ready_sent: bool,
    peaks: Option<PeakStore>,
    holders: Option<HoldersSeen>,
    /// Xid events, the Xid log and each GPU's health verdict.
    health: HealthWatch,
}

impl Daemon {
    pub fn new(settings: Settings, log: Logger, notify: Notifier) -> Daemon {
        let peaks = settings.watchdog.state_path().map(PeakStore::in_dir);
        let link = Link::new(settings.watchdog.interval);
        // Findings act only after `grace`, so facts a quarter of it old are fresh enough;
        // each signal still checks the process's start time. Every process is looked at
        // at least every second: no event reports a process turning zombie (Linux notifies
        // a pidfd only once its whole thread group has exited), and the reclaim bound is
        // grace + interval + term_timeout + 1 s. A look is the owner check where it applies
        // (see gpuctl_core::host::FactCache), else a read of its stat; leaders and parents
        // are read as often.
        let health = HealthWatch::new(settings.xid_actions.clone());
        let grace_quarter = settings.watchdog.grace / 4;
        let refresh = grace_quarter.min(Duration::from_secs(1));
        Daemon {
            settings,
            log,
            notify,
            link,
            last_incomplete: None,
            facts: FactCache::refreshing_every(refresh).reading_stat_every(grace_quarter),
            proc_view: None,
            history: HistoryTracker::default(),
            stale: Spells::default(),
            over: Spells::default(),
            warned: PidSet::default(),
            handling: Handling::default(),
            findings_log: FindingLog::default(),
            metrics: Metrics::default(),
            publisher: Publisher::default(),
            last_reclaim: None,
            status: String::new(),
            ready_sent: false,
            peaks,
            holders: None,
            health,
        }
    }

    fn event(&self, priority: Priority, message: &str, fields: &[(&str, String)]) {
        self.log.log(priority, message, fields);
    }

    /// `--once`: one pass with no grace and no history, like `gpuctl clear`.
    pub fn run_once(&mut self) -> Exit {
        let pass = self.pass(true);
        if pass.nvml_down {
            Exit::Unavailable
        } else if pass.failed > 0 {
            Exit::Failed
        } else if pass.left > 0 {
            Exit::NotClean
        } else {
            Exit::Ok
        }
    }

    /// The daemon: loops until SIGTERM or SIGINT; always exits 0.
    pub fn run(&mut self) -> Exit {
        self.event(
            Priority::Info,
            &format!(
                "started: {}; configuration {}",
                self.settings.summary(),
                self.settings.source
            ),
            &[("ACTION", "start".into())],
        );
        if self.settings.acts() && !self.settings.guard.is_root() {
            self.event(
                Priority::Warning,
                "not running as root: only this user's own processes can be reclaimed",
                &[("ACTION", "start".into())],
            );
        }
        let mut next_loop = Instant::now();
        let mut last_ping = Instant::now();
        loop {
            if signals::stop_requested() {
                break;
            }
            if signals::take_reload() {
                self.reload();
            }
            let now = Instant::now();
            if now >= next_loop {
                self.pass(false);
                self.ping();
                last_ping = Instant::now();
                let interval = self.settings.watchdog.interval;
                next_loop += interval;
                // After a long pass (a reclaim), start again from now, not in a burst.
                if next_loop < Instant::now() {
                    next_loop = Instant::now() + interval;
                }
                continue;
            }
            let mut wake = next_loop;
            if let Some(every) = self.notify.ping_every() {
                if now >= last_ping + every {
                    self.ping();
                    last_ping = now;
                }
                wake = wake.min(last_ping + every);
            }
            signals::sleep(wake.saturating_duration_since(Instant::now()));
        }
        self.notify.send("STOPPING=1");
        self.event(Priority::Info, "stopping", &[("ACTION", "stop".into())]);
        Exit::Ok
    }

    fn ping(&self) {
        if self.notify.watchdog.is_some() {
            self.notify.send("WATCHDOG=1");
        }
    }

    fn reload(&mut self) {
        // systemd wants the reload's start on CLOCK_MONOTONIC, which Instant does not expose.
        let monotonic = clock_gettime(ClockId::CLOCK_MONOTONIC).map_or(0, |ts| {
            ts.tv_sec() as u64 * 1_000_000 + ts.tv_nsec() as u64 / 1000
        });
        self.notify
            .send(&format!("RELOADING=1\nMONOTONIC_USEC={monotonic}"));
        match Settings::load(&crate::cli_args()) {
            Ok(settings) => {
                self.peaks = settings.watchdog.state_path().map(PeakStore::in_dir);
                self.health.set_catalog(settings.xid_actions.clone());
                self.settings = settings;
                self.event(
                    Priority::Notice,
                    &format!(
                        "configuration reloaded: {}; {}",
                        self.settings.summary(),
                        self.settings.source
                    ),
                    &[("ACTION", "reload".into())],
                );
            }
            Err(error) => self.event(
                Priority::Err,
                &format!("configuration not reloaded, the old one is kept: {error}"),
                &[
                    ("ACTION", "reload-failed".into()),
                    ("REASON", error.to_string()),
                ],
            ),
        }
        self.notify.send("READY=1");
    }

    /// One loop: observe → judge → act → report. `once`: no grace, no history.
    pub fn pass(&mut self, once: bool) -> Pass {
        let mut pass = Pass::default();
        self.metrics.loops_total += 1;
        if let Some(status) = self
            .link
            .ensure(self.settings.nvml_timeout, once, &self.log)
        {
            self.status = status;
        }
        let Some(seen) = self.observe(once) else {
            self.finish_down();
            pass.nvml_down = true;
            return pass;
        };
        let judged = self.judge(&seen, once);
        self.act(&seen, &judged, once, &mut pass);
        self.report(&seen, &judged);
        if seen.reopen {
            self.link.reopen(&self.log);
        }
        pass
    }

    /// Observe: a snapshot and the lineages of its processes, and whether every GPU
    /// answered. `None` when NVML is down or the snapshot failed (the session is closed to
    /// be reopened).
    fn observe(&mut self, once: bool) -> Option<Seen> {
        let gpus = self.link.gpus()?;
        let view = match self.proc_view.take() {
            Some(mut view) => view.refresh_uptime().map(|()| view),
            None => ProcView::system(),
        };
        let holders_due = self
            .holders
            .as_ref()
            .is_none_or(|h| h.at.elapsed() >= HOLDER_SCAN_EVERY);
        let options = SnapshotOptions {
            // Only when some GPU has holders_threshold unattributed (checked by the snapshot).
            holders: holders_due.then(|| self.settings.holders.clone()),
            // Utilization and power too, for the stuck-GPU check.
            ..SnapshotOptions::watch(self.settings.policy.stuck.is_some())
        };
        let taken = view.map_err(|e| e.to_string()).and_then(|view| {
            Snapshot::take_cached(gpus, &view, &options, &mut self.facts)
                .map(|snapshot| {
                    let lineages = snapshot.lineages_cached(&view, &mut self.facts);
                    self.proc_view = Some(view);
                    (snapshot, lineages)
                })
                .map_err(|e| e.to_string())
        });
        let (mut snapshot, lineages) = match taken {
            Ok(taken) => taken,
            Err(reason) => {
                // The session is broken (driver reload, library error): close it and reopen.
                self.status = self
                    .link
                    .down(format!("snapshot failed: {reason}"), &self.log);
                return None;
            }
        };
        let state_dir = self.settings.watchdog.state_path();
        self.health
            .observe(gpus, &mut snapshot, state_dir, &self.log);
        let now = Instant::now();
        let holders_scanned = snapshot.read_times.holders.is_some();
        if holders_scanned {
            self.holders = Some(HoldersSeen {
                at: now,
                per_gpu: snapshot
                    .devices
                    .iter()
                    .filter_map(|g| Some((g.index, g.holders.as_ref()?.len())))
                    .collect(),
                findings: 0,
            });
        } else if holders_due {
            // Due but not wanted: no GPU has holders_threshold unattributed any more.
            self.holders = None;
        }
        let incomplete = self.note_incomplete(&snapshot);
        // A GPU lost or failing may be a driver reload, which a new NVML session sees past.
        let reopen_may_help = snapshot
            .devices
            .iter()
            .any(|g| matches!(g.status, GpuStatus::Lost | GpuStatus::Error));
        let reopen = self.link.after_read(
            incomplete.is_some(),
            reopen_may_help,
            once,
            now,
            self.settings.watchdog.interval,
        );
        if !self.ready_sent {
            self.notify.send("READY=1");
            self.ready_sent = true;
        }
        if let Some(peaks) = &self.peaks {
            peaks.observe(&snapshot);
        }
        Some(Seen {
            snapshot,
            lineages,
            incomplete,
            reopen,
            now,
            holders_scanned,
        })
    }

    /// Which GPUs did not answer, logged when that changes. A snapshot with a GPU missing
    /// is never acted on.
    fn note_incomplete(&mut self, snapshot: &Snapshot) -> Option<String> {
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
        let incomplete = (!broken.is_empty()).then(|| broken.join(", "));
        if incomplete != self.last_incomplete {
            match &incomplete {
                Some(what) => self.event(
                    Priority::Err,
                    &format!(
                        "incomplete snapshot ({what}): findings are reported, nothing is reclaimed until every GPU answers"
                    ),
                    &[("ACTION", "suspended".into()), ("REASON", what.clone())],
                ),
                None => self.event(
                    Priority::Notice,
                    "every GPU answers again: reclaim resumed",
                    &[("ACTION", "resumed".into())],
                ),
            }
            self.last_incomplete = incomplete.clone();
        }
        incomplete
    }

    /// Judge: the findings (with the history only a daemon has), each logged once, and
    /// those due: held for the grace by the same process.
    fn judge(&mut self, seen: &Seen, once: bool) -> Judged {
        let (snapshot, now) = (&seen.snapshot, seen.now);
        let history = if once {
            None
        } else {
            Some(self.history.update(
                snapshot,
                now,
                seen.incomplete.is_some(),
                self.settings.policy.stuck.as_ref(),
                |pid| Identity::observe(pid).ok(),
            ))
        };
        let findings = classify::classify(
            snapshot,
            &seen.lineages,
            history.as_ref(),
            &self.settings.policy,
        );
        self.findings_log
            .findings(&self.log, &self.settings.watchdog, snapshot, &findings);
        let impostors = self
            .findings_log
            .impostors(&self.log, &self.settings.guard, snapshot);
        let mut counts = publish::finding_counts(&findings, impostors);
        // Unlisted holders are found only by the scan: its count stands until the next one.
        if let Some(holders) = &mut self.holders
            && let Some((_, n)) = counts
                .iter_mut()
                .find(|(k, _)| *k == Kind::UnlistedHolder.name())
        {
            if seen.holders_scanned {
                holders.findings = *n;
            } else {
                *n = holders.findings;
            }
        }
        let grace = self.settings.watchdog.grace;

        // Leftovers: a reclaim verdict of a kind the watchdog reclaims.
        let reclaim = &self.settings.watchdog.reclaim;
        let stale: Vec<Finding> = findings
            .iter()
            .filter(|f| f.verdict == Verdict::Reclaim && f.kind.remedy() == Remedy::Reclaim)
            .filter(|f| f.kind.reclaim_kind().is_some_and(|k| reclaim.contains(&k)))
            .cloned()
            .collect();
        let stale_ids: PidSet<Identity> = stale.iter().filter_map(|f| f.identity).collect();
        // A GPU that failed this read lists no processes: its leftovers are not gone, so
        // their grace goes on (a driver erring now and then must not restart it forever).
        // A complete snapshot forgets what it does not show.
        let listed: Option<PidSet<u32>> = seen.incomplete.is_some().then(|| {
            snapshot
                .devices
                .iter()
                .flat_map(|g| g.processes.iter().map(|p| p.pid))
                .collect()
        });
        // A stopped process's grace counts from when it stopped.
        let holders = stale.iter().filter_map(|f| {
            let id = f.identity?;
            let since = match f.kind {
                Kind::Stopped => self.history.stopped_since(&id).unwrap_or(now),
                _ => now,
            };
            Some((id, since))
        });
        self.stale.observe(holders, listed.as_ref());
        let mut due: Vec<(Finding, Remedy)> = stale
            .iter()
            .filter(|f| {
                once || f
                    .identity
                    .is_some_and(|id| self.stale.is_due(&id, grace, now))
            })
            .map(|f| (f.clone(), Remedy::Reclaim))
            .collect();

        // Above its share: warned once it lasted the grace, ended with enforce_fraction.
        let over: Vec<&Finding> = findings
            .iter()
            .filter(|f| f.verdict == Verdict::Reclaim && f.kind.remedy() == Remedy::Enforce)
            .collect();
        let over_ids: PidSet<Identity> = over.iter().filter_map(|f| f.identity).collect();
        self.over
            .observe(over_ids.iter().map(|&id| (id, now)), None);
        self.warned.retain(|id| over_ids.contains(id));
        for f in over {
            let Some(id) = f.identity else { continue };
            if once || self.over.is_due(&id, grace, now) {
                if self.warned.insert(id) {
                    self.event(
                        Priority::Warning,
                        &format!("pid {} {}", id.pid, f.reason),
                        &fields_of(
                            snapshot,
                            id,
                            &[("ACTION", "warn".into()), ("REASON", f.reason.clone())],
                        ),
                    );
                }
                due.push((f.clone(), Remedy::Enforce));
            }
        }
        let all_due: PidSet<(Identity, Remedy)> = due
            .iter()
            .filter_map(|(f, remedy)| f.identity.map(|id| (id, *remedy)))
            .collect();
        self.handling.keep_due(&all_due);
        let over = findings
            .iter()
            .filter(|f| f.verdict == Verdict::Reclaim && f.kind.remedy() == Remedy::Enforce)
            .cloned()
            .collect();
        let stuck = findings
            .iter()
            .filter(|f| f.kind == Kind::Stuck)
            .cloned()
            .collect();
        Judged {
            stale,
            stale_ids,
            over_ids,
            due,
            over,
            stuck,
            counts,
        }
    }

    /// Act: the due findings' processes, through the road `gpuctl clear` takes, each once
    /// (or again after a failed try), unless in report mode or the snapshot is incomplete.
    fn act(&mut self, seen: &Seen, judged: &Judged, once: bool, pass: &mut Pass) {
        let (snapshot, now) = (&seen.snapshot, seen.now);
        let stale: Vec<Finding> = judged
            .due
            .iter()
            .filter(|(_, remedy)| *remedy == Remedy::Reclaim)
            .map(|(f, _)| f.clone())
            .collect();
        let mut targets: Vec<(Target, Remedy)> = select::from_findings(snapshot, &stale, None)
            .into_iter()
            .map(|t| (t, Remedy::Reclaim))
            .collect();
        if self.settings.watchdog.enforce_fraction {
            let over: Vec<Finding> = judged
                .due
                .iter()
                .filter(|(_, remedy)| *remedy == Remedy::Enforce)
                .map(|(f, _)| f.clone())
                .collect();
            for target in select::from_findings(snapshot, &over, None) {
                if !targets.iter().any(|(t, _)| t.pid == target.pid) {
                    targets.push((target, Remedy::Enforce));
                }
            }
        }
        // Same identity as observed, or nothing.
        targets.retain(|(t, remedy)| {
            t.identity().is_some_and(|id| match remedy {
                Remedy::Enforce => judged.over_ids.contains(&id),
                _ => judged.stale_ids.contains(&id),
            })
        });
        let mut to_run: Vec<(Target, Remedy)> = Vec::new();
        for (target, remedy) in targets {
            let Some(id) = target.identity() else {
                continue;
            };
            let why_left = if !self.settings.acts() {
                Some("report mode".to_string())
            } else {
                seen.incomplete
                    .as_ref()
                    .map(|what| format!("incomplete snapshot: {what}"))
            };
            if let Some(why) = why_left {
                pass.left += 1;
                if self.handling.set(id, remedy, Handled::Left) != Some(Handled::Left) {
                    self.event(
                        Priority::Notice,
                        &format!(
                            "pid {} ({}) is {}, left alone ({why}): {}",
                            target.pid,
                            target.owner_name(),
                            match remedy {
                                Remedy::Enforce => "above its share",
                                _ => "stale",
                            },
                            target.reasons.join("; ")
                        ),
                        &target_fields(snapshot, &target, "left", remedy),
                    );
                }
                continue;
            }
            if self.handling.get(id, remedy) == Some(Handled::Logged) {
                if self.settings.dry_run {
                    pass.left += 1;
                } else {
                    pass.failed += 1;
                }
                continue;
            }
            if self.handling.waits(id, remedy, now) && !once {
                continue;
            }
            to_run.push((target, remedy));
        }
        if !to_run.is_empty() {
            let outcomes = self.execute(snapshot, &to_run);
            for (outcome, (_, remedy)) in outcomes.iter().zip(&to_run) {
                self.report_outcome(snapshot, outcome, *remedy, pass, now);
            }
        }
    }

    /// Report: the metrics, systemd's STATUS line and the findings file.
    fn report(&mut self, seen: &Seen, judged: &Judged) {
        let snapshot = &seen.snapshot;
        self.metrics.nvml_up = true;
        self.metrics.gpus = publish::gpu_metrics(snapshot, &judged.stale, &judged.stuck);
        if let Some(holders) = &self.holders {
            for gpu in &mut self.metrics.gpus {
                gpu.holders = holders
                    .per_gpu
                    .iter()
                    .find(|(i, _)| *i == gpu.index)
                    .map(|(_, n)| *n);
            }
        }
        let max = self.settings.watchdog.metrics_max_owners;
        self.metrics.users = publish::user_holdings(snapshot, max);
        self.metrics.owners = publish::owner_holdings(snapshot, max);
        self.metrics.findings = judged.counts.clone();
        self.metrics.health = self.health.metrics.clone();
        if seen.incomplete.is_none() {
            self.metrics.last_good_poll = Some(units::unix_seconds());
        }
        self.status = Status {
            stale: judged.stale_ids.len(),
            incomplete: seen.incomplete.as_deref(),
            acts: self.settings.acts(),
            dry_run: self.settings.dry_run,
            last_reclaim: self.last_reclaim.as_deref(),
        }
        .line(snapshot);
        self.publish();
        self.write_findings(seen, judged);
    }

    /// The findings file in the state directory (`gpuctl info` shows it): stale processes,
    /// processes above their share and stuck GPUs, each with since when.
    fn write_findings(&mut self, seen: &Seen, judged: &Judged) {
        let Some(dir) = self.settings.watchdog.state_path().map(PathBuf::from) else {
            return;
        };
        let (snapshot, now) = (&seen.snapshot, seen.now);
        let unix_at = |since: Option<Instant>| {
            units::unix_seconds()
                - now
                    .saturating_duration_since(since.unwrap_or(now))
                    .as_secs_f64()
        };
        let mut findings = Vec::new();
        for f in &judged.stale {
            let since = f.identity.and_then(|id| self.stale.since(&id));
            findings.push(publish::finding_entry(snapshot, f, unix_at(since)));
        }
        for f in &judged.over {
            let since = f.identity.and_then(|id| self.over.since(&id));
            findings.push(publish::finding_entry(snapshot, f, unix_at(since)));
        }
        for f in &judged.stuck {
            let lasted = f
                .gpus
                .first()
                .and_then(|&i| self.history.stuck_for(i))
                .unwrap_or_default();
            let since_unix = units::unix_seconds() - lasted.as_secs_f64();
            findings.push(publish::finding_entry(snapshot, f, since_unix));
        }
        let interval = self.settings.watchdog.interval;
        self.publisher
            .write_findings(&self.log, &dir, findings, interval, now);
    }

    fn finish_down(&mut self) {
        // Up and retrying is a started service: systemd must not fail the unit (and restart
        // it in a loop) because the driver is not there yet. STATUS says what is missing.
        if !self.ready_sent {
            self.notify.send("READY=1");
            self.ready_sent = true;
        }
        self.metrics.nvml_up = false;
        self.metrics.gpus.clear();
        // Nothing is known of who holds what: no rows, and no findings.
        self.metrics.users.clear();
        self.metrics.owners.clear();
        self.metrics.findings = publish::finding_counts(&[], 0);
        self.publish();
    }

    /// STATUS= and the metrics file.
    fn publish(&mut self) {
        // Read here so that a reload's interval shows at once.
        self.metrics.interval_seconds = self.settings.watchdog.interval.as_secs_f64();
        let path = self.settings.watchdog.metrics_path().map(PathBuf::from);
        self.publisher.publish(
            &self.notify,
            &self.log,
            &self.status,
            &self.metrics,
            path.as_deref(),
        );
    }

    /// Signals (or, in a dry run, plans) through the reclaim road, pinging systemd's
    /// watchdog from a helper thread while the escalation waits.
    fn execute(&self, snapshot: &Snapshot, to_run: &[(Target, Remedy)]) -> Vec<Outcome> {
        let Some(gpus) = self.link.gpus() else {
            return Vec::new();
        };
        let targets: Vec<Target> = to_run.iter().map(|(t, _)| t.clone()).collect();
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            if let Some(every) = self.notify.ping_every() {
                let done = &done;
                let notify = &self.notify;
                scope.spawn(move || {
                    while !done.load(std::sync::atomic::Ordering::SeqCst) {
                        notify.send("WATCHDOG=1");
                        std::thread::park_timeout(every);
                    }
                });
            }
            let outcomes = Reclaim {
                gpus,
                guard: &self.settings.guard,
                how: self.settings.escalation(),
                verify_for: self.settings.watchdog.term_timeout,
                dry_run: self.settings.dry_run,
            }
            .run(snapshot, targets);
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            outcomes
        })
    }

    fn report_outcome(
        &mut self,
        snapshot: &Snapshot,
        outcome: &Outcome,
        remedy: Remedy,
        pass: &mut Pass,
        now: Instant,
    ) {
        let target = &outcome.target;
        let Some(id) = target.identity() else { return };
        let who = format!("pid {} ({})", target.pid, target.owner_name());
        let held = target.used_bytes.map_or("memory unknown".into(), bytes);
        let reasons = target.reasons.join("; ");
        match outcome.action {
            Action::DryRun => {
                pass.left += 1;
                self.handling.set(id, remedy, Handled::Logged);
                self.event(
                    Priority::Notice,
                    &format!("dry run: would reclaim {who}, {held}: {reasons}"),
                    &target_fields(snapshot, target, "would-reclaim", remedy),
                );
            }
            Action::Skip => {
                pass.failed += 1;
                self.handling.set(id, remedy, Handled::Logged);
                let why = outcome.skipped.clone().unwrap_or_default();
                let mut fields = target_fields(snapshot, target, "skipped", remedy);
                fields.push(("SKIPPED", why.clone()));
                self.event(
                    Priority::Warning,
                    &format!("not reclaiming {who}: {why}"),
                    &fields,
                );
            }
            Action::Signal if outcome.succeeded() => {
                let freed = target.used_bytes.unwrap_or(0);
                self.metrics.reclaims_total += 1;
                self.metrics.reclaimed_bytes_total += freed;
                self.last_reclaim = Some(format!("{}: {who} {held}", publish::clock_time()));
                let action = match remedy {
                    Remedy::Enforce => "terminated",
                    _ => "reclaimed",
                };
                let mut fields = target_fields(snapshot, target, action, remedy);
                fields.push(("RECLAIMED_BYTES", freed.to_string()));
                self.event(
                    Priority::Warning,
                    &format!(
                        "{action} {who}: {}, {held} released; {reasons}",
                        outcome.summary()
                    ),
                    &fields,
                );
                self.stale.end(&id);
                self.over.end(&id);
            }
            Action::Signal => {
                pass.failed += 1;
                self.metrics.reclaim_failures_total += 1;
                // Memory on a GPU that needs a reset comes back only with the reset.
                if let Some(needs) = crate::health::needs_action(snapshot, &target.gpus) {
                    self.handling.set(id, remedy, Handled::Logged);
                    self.event(
                        Priority::Err,
                        &format!(
                            "reclaim of {who}: {held} not got back, and not retried: {needs}; {}",
                            outcome.summary()
                        ),
                        &target_fields(snapshot, target, "needs-gpu-reset", remedy),
                    );
                    return;
                }
                let watchdog = &self.settings.watchdog;
                self.handling
                    .failed(id, remedy, now, watchdog.grace, watchdog.interval);
                self.event(
                    Priority::Err,
                    &format!("reclaim of {who} failed: {}; {reasons}", outcome.summary()),
                    &target_fields(snapshot, target, "failed", remedy),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests;
