//! The loop: snapshot, classify (with the history only a daemon has), wait out the grace,
//! act through the same road as `gpuctl clear`, verify, report (journal, STATUS, metrics).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use gpuctl_core::act::Identity;
use gpuctl_core::classify::grace::{self, Decision, HistoryTracker, Judgement, Tried, Watch};
use gpuctl_core::classify::{Finding, Kind};
use gpuctl_core::exit::Exit;
use gpuctl_core::host::FactCache;
use gpuctl_core::plan::Outcome;
use gpuctl_core::reclaim::{Due, FindingsRequest};
use gpuctl_core::select::Target;
use gpuctl_core::session::{Look, Reader};
use gpuctl_core::snapshot::peaks::PeakStore;
use gpuctl_core::snapshot::{GpuStatus, Snapshot, SnapshotOptions};
use gpuctl_core::units::{self, bytes};

use crate::events::{self, FindingLog, fields_of};
use crate::health::HealthWatch;
use crate::idle::IdleWatch;
use crate::link::Link;
use crate::log::{Logger, Priority};
use crate::metrics::Metrics;
use crate::notify::Notifier;
use crate::publish::{self, Publisher, Status};
use crate::settings::Settings;
use crate::signals;

/// What one pass saw.
struct Seen {
    /// The snapshot and the lineages classification reads.
    look: Look,
    /// The GPUs that did not answer, when some did not: nothing is acted on.
    incomplete: Option<String>,
    /// NVML is re-opened after this pass.
    reopen: bool,
    now: Instant,
    /// The device-file holder scan ran in this pass.
    holders_scanned: bool,
}

/// What one pass found: the rules' judgement over time, the stuck GPUs and idle processes
/// (reported; idle ones due by `[idle]` are in the judgement), and the current findings per
/// kind, impostors last (the metrics).
struct Judged {
    judgement: Judgement,
    reported: Vec<Finding>,
    counts: Vec<(&'static str, usize)>,
    /// The memory the findings hold, per kind, GPU and owner.
    held: Vec<crate::metrics::FindingMemory>,
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

/// How often a process is looked at, and how often its stat is read whole (see
/// [`Daemon::new`]).
fn fact_periods(settings: &Settings) -> (Duration, Duration) {
    let grace_quarter = settings.watchdog.grace / 4;
    (grace_quarter.min(Duration::from_secs(1)), grace_quarter)
}

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
    /// What each pass reads: host facts kept across loops (a known process costs one read
    /// of its stat) and the /proc view (its namespace and filesystem checks do not change;
    /// its uptime is read again each pass).
    reader: Reader,
    // History, and the rules over time: spells, warnings, what was done about each.
    history: HistoryTracker,
    watch: Watch,
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
    idle: IdleWatch,
}

impl Daemon {
    pub fn new(settings: Settings, log: Logger, notify: Notifier) -> Daemon {
        let peaks = settings.watchdog.state_path().map(PeakStore::in_dir);
        let link = Link::new(settings.watchdog.interval);
        // Findings act only after `grace`, so facts a quarter of it old are fresh enough;
        // each signal still checks the process's start time. Every process is looked at
        // at least every second: no event reports a process turning zombie (Linux notifies
        // a pidfd only once its whole thread group has exited), and the reclaim bound is
        // grace + interval + term_timeout + 1 s. A look reads the process's statm, which
        // shows its main thread's exit, and its parent's, which shows the exit that makes it
        // an orphan; its stat is read every quarter of the grace (see
        // gpuctl_core::host::FactCache). Leaders and parents are read as often.
        let mut health = HealthWatch::new(settings.xid_catalog.clone());
        health.kernel.set_path(settings.watchdog.kernel_log());
        let idle = IdleWatch::new(settings.watchdog.state_path(), &log);
        let (refresh, whole) = fact_periods(&settings);
        let kubernetes = settings.kubernetes.clone();
        Daemon {
            settings,
            log,
            notify,
            link,
            last_incomplete: None,
            // NVML's pids are the host's: the watchdog runs in the host's PID namespace (or
            // beside a host service it does not ask).
            reader: Reader::new(SnapshotOptions::watch(false))
                .naming_pods(&kubernetes)
                .keeping_facts(FactCache::refreshing_every(refresh).reading_whole_every(whole))
                .host_only(),
            history: HistoryTracker::default(),
            watch: Watch::default(),
            findings_log: FindingLog::default(),
            metrics: Metrics::default(),
            publisher: Publisher::default(),
            last_reclaim: None,
            status: String::new(),
            ready_sent: false,
            peaks,
            holders: None,
            health,
            idle,
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
        self.idle.save_now(&self.log);
        self.event(Priority::Info, "stopping", &[("ACTION", "stop".into())]);
        Exit::Ok
    }

    fn ping(&self) {
        if self.notify.watchdog.is_some() {
            self.notify.send("WATCHDOG=1");
        }
    }

    fn reload(&mut self) {
        self.notify.reloading();
        match Settings::load(&crate::cli_args()) {
            Ok(settings) => {
                self.peaks = settings.watchdog.state_path().map(PeakStore::in_dir);
                self.health.set_catalog(settings.xid_catalog.clone());
                self.health.kernel.set_path(settings.watchdog.kernel_log());
                self.idle.set_state_dir(settings.watchdog.state_path());
                let (refresh, whole) = fact_periods(&settings);
                self.reader.retime_facts(refresh, whole);
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
            self.health.session_closed();
            self.link.reopen(&self.log);
        }
        pass
    }

    /// Observe: a snapshot and the lineages of its processes, and whether every GPU
    /// answered. `None` when NVML is down or the snapshot failed (the session is closed to
    /// be reopened).
    fn observe(&mut self, once: bool) -> Option<Seen> {
        let gpus = self.link.gpus()?;
        let holders_due = self
            .holders
            .as_ref()
            .is_none_or(|h| h.at.elapsed() >= HOLDER_SCAN_EVERY);
        let health_due = self.health.readings_due();
        self.reader.set_purpose(SnapshotOptions {
            // Only when some GPU has holders_threshold unattributed (checked by the snapshot).
            holders: holders_due.then(|| self.settings.holders.clone()),
            health: health_due,
            // SM per process since the last pass; utilization and power: stuck and idle.
            ..self.settings.watch_options()
        });
        let mut look = match self.reader.look(gpus) {
            Ok(look) => look,
            Err(reason) => {
                // The session is broken (driver reload, library error): close it and reopen.
                self.health.session_closed();
                self.status = self
                    .link
                    .down(format!("snapshot failed: {reason}"), &self.log);
                return None;
            }
        };
        let state_dir = self.settings.watchdog.state_path();
        self.health.keep_readings(&mut look.snapshot, health_due);
        self.health
            .observe(gpus, &mut look.snapshot, state_dir, &self.log);
        let now = Instant::now();
        let snapshot = &look.snapshot;
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
        let incomplete = self.note_incomplete(snapshot);
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
            peaks.observe(snapshot);
        }
        Some(Seen {
            look,
            incomplete,
            reopen,
            now,
            holders_scanned,
        })
    }

    /// Which GPUs did not answer, logged when that changes. A snapshot with a GPU missing
    /// is never acted on.
    fn note_incomplete(&mut self, snapshot: &Snapshot) -> Option<String> {
        let incomplete = publish::unanswered(snapshot);
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
    /// those due by the rules over time (`classify::grace`).
    fn judge(&mut self, seen: &Seen, once: bool) -> Judged {
        let (snapshot, now) = (&seen.look.snapshot, seen.now);
        let (settings, complete, log) = (&self.settings, seen.incomplete.is_none(), &self.log);
        let history = (!once).then(|| {
            let mut history = self.history.update(
                snapshot,
                now,
                !complete,
                settings.policy.stuck.as_ref(),
                |pid| Identity::observe(pid).ok(),
            );
            history.idle = self.idle.observe(snapshot, settings, complete, log);
            history
        });
        let findings = seen.look.classify(history.as_ref(), &settings.policy);
        self.findings_log
            .findings(log, settings, snapshot, &findings, once);
        self.idle.notify(snapshot, &findings, settings, log);
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
        // A GPU that failed this read lists no processes: what it held is not gone.
        let listed = seen.incomplete.is_some().then(|| grace::listed(snapshot));
        let history = &self.history;
        let judgement = self.watch.judge(
            &findings,
            &self.settings.rules(once),
            |id| history.stopped_since(id),
            listed.as_ref(),
            now,
        );
        for f in &judgement.warn {
            let Some(id) = f.identity else { continue };
            let fields = [("ACTION", "warn".into()), ("REASON", f.reason.clone())];
            self.event(
                Priority::Warning,
                &format!("pid {} {}", id.pid, f.reason),
                &fields_of(snapshot, id, &fields),
            );
        }
        let held = publish::finding_memory(snapshot, &findings);
        let reported = findings
            .into_iter()
            .filter(|f| matches!(f.kind, Kind::Stuck | Kind::Idle))
            .collect();
        Judged {
            judgement,
            reported,
            counts,
            held,
        }
    }

    /// Act: the due findings' processes, through a request built from them on the road
    /// `gpuctl clear` takes, each once (or again after a failed try), unless in report mode
    /// or the snapshot is incomplete.
    fn act(&mut self, seen: &Seen, judged: &Judged, once: bool, pass: &mut Pass) {
        let (snapshot, now) = (&seen.look.snapshot, seen.now);
        let request = self.settings.findings_request(judged.judgement.due.clone());
        let why_left = self.settings.leaves_alone(seen.incomplete.as_deref());
        let mut to_run: Vec<Due> = Vec::new();
        for due in request.targets(snapshot) {
            let (target, remedy) = (&due.target, due.remedy);
            match self
                .watch
                .decide(due.identity, remedy, why_left.is_some(), once, now)
            {
                Decision::Act => to_run.push(due),
                Decision::Waits => {}
                Decision::Said if self.settings.dry_run => pass.left += 1,
                Decision::Said => pass.failed += 1,
                Decision::Left { first } => {
                    pass.left += 1;
                    if first {
                        let why = why_left.as_deref().unwrap_or_default();
                        let (message, fields) = events::left(snapshot, target, remedy, why);
                        self.event(Priority::Notice, &message, &fields);
                    }
                }
            }
        }
        if !to_run.is_empty() {
            let outcomes = self.execute(&request, snapshot, &to_run);
            for (outcome, due) in outcomes.iter().zip(&to_run) {
                self.report_outcome(snapshot, outcome, due, once, pass, now);
            }
        }
    }

    /// Report: the metrics, systemd's STATUS line and the findings file (`gpuctl info`
    /// shows it).
    fn report(&mut self, seen: &Seen, judged: &Judged) {
        let (snapshot, now) = (&seen.look.snapshot, seen.now);
        let holders = self.holders.as_ref().map(|h| h.per_gpu.as_slice());
        let found = (
            &judged.judgement,
            &judged.reported[..],
            &judged.counts[..],
            &judged.held[..],
        );
        publish::observed(
            &mut self.metrics,
            snapshot,
            found,
            holders,
            &self.settings.watchdog,
        );
        self.metrics.health = self.health.metrics.clone();
        self.metrics.idle = self.idle.accounts.clone();
        if seen.incomplete.is_none() {
            self.metrics.last_good_poll = Some(units::unix_seconds());
        }
        self.status = Status {
            stale: judged.judgement.stale_ids.len(),
            incomplete: seen.incomplete.as_deref(),
            acts: self.settings.acts(),
            dry_run: self.settings.dry_run,
            last_reclaim: self.last_reclaim.as_deref(),
        }
        .line(snapshot);
        self.publish();
        let Some(dir) = self.settings.watchdog.state_path().map(PathBuf::from) else {
            return;
        };
        let found = (&judged.judgement, judged.reported.as_slice());
        let findings = publish::finding_entries(snapshot, found, &self.watch, &self.history, now);
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
        publish::down(&mut self.metrics);
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
    fn execute(&self, request: &FindingsRequest, snapshot: &Snapshot, due: &[Due]) -> Vec<Outcome> {
        let Some(gpus) = self.link.gpus() else {
            return Vec::new();
        };
        let targets: Vec<Target> = due.iter().map(|d| d.target.clone()).collect();
        self.notify
            .pinging_while(|| request.run(gpus, snapshot, &self.settings.guard, targets))
    }

    /// What came of one due process: its journal event, the pass's counts and the metrics,
    /// and what the rules over time remember of it.
    fn report_outcome(
        &mut self,
        snapshot: &Snapshot,
        outcome: &Outcome,
        due: &Due,
        once: bool,
        pass: &mut Pass,
        now: Instant,
    ) {
        let (target, remedy) = (&outcome.target, due.remedy);
        let tried = events::tried(outcome);
        self.watch
            .settle(due.identity, remedy, tried, &self.settings.rules(once), now);
        match tried {
            Tried::WouldSignal => pass.left += 1,
            Tried::Skipped => pass.failed += 1,
            Tried::Reclaimed => {
                let freed = target.used_bytes.unwrap_or(0);
                self.metrics.reclaims_total += 1;
                self.metrics.reclaimed_bytes_total += freed;
                let held = target.used_bytes.map_or("memory unknown".into(), bytes);
                let who = format!("pid {} ({})", target.pid, target.owner_name());
                self.last_reclaim = Some(format!("{}: {who} {held}", publish::clock_time()));
            }
            Tried::Failed => {
                pass.failed += 1;
                self.metrics.reclaim_failures_total += 1;
            }
        }
        // Memory on a GPU that needs a reset comes back only with the reset: not retried.
        let needs = matches!(tried, Tried::Failed)
            .then(|| crate::health::needs_action(snapshot, &target.gpus))
            .flatten();
        let (priority, message, fields) = match needs {
            Some(needs) => {
                self.watch.give_up(due.identity, remedy);
                events::not_retried(snapshot, outcome, remedy, &needs)
            }
            None => events::outcome(snapshot, outcome, remedy, tried),
        };
        self.event(priority, &message, &fields);
    }
}

#[cfg(test)]
mod tests;
