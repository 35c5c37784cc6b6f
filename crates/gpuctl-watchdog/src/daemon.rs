//! The loop: snapshot, classify (with the history only a daemon has), wait out the grace,
//! act through the same road as `gpuctl clear`, verify, report (journal, STATUS, metrics).

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gpuctl_core::act::{Escalation, Identity, Signal};
use gpuctl_core::classify::stuck::{StuckCriteria, StuckTracker};
use gpuctl_core::classify::{self, Finding, History, Kind, Policy, Remedy, Verdict};
use gpuctl_core::config::{self, ConfigError, ReclaimKind, Watchdog, WatchdogMode};
use gpuctl_core::exit::Exit;
use gpuctl_core::host::{FactCache, Lineage, ProcState, ProcView};
use gpuctl_core::nvml::Gpus;
use gpuctl_core::pidmap::{PidMap, PidSet};
use gpuctl_core::plan::{Action, Guard, Outcome};
use gpuctl_core::protect::{Claim, Claimant, Protection};
use gpuctl_core::reclaim::Reclaim;
use gpuctl_core::report::{WatchdogFinding, WatchdogFindings, watchdog_findings_path};
use gpuctl_core::select::{self, Target};
use gpuctl_core::snapshot::peaks::PeakStore;
use gpuctl_core::snapshot::{GpuStatus, Snapshot, SnapshotOptions};
use gpuctl_core::units::bytes;

use crate::log::{Logger, Priority};
use crate::metrics::{self, GpuMetrics, InstanceMetrics, Metrics};
use crate::notify::Notifier;
use crate::signals;
use gpuctl_watchdog::cli::{Cli, Mode};

/// Per-process utilization is read over this window, as `gpuctl clear` does.
const ACTIVITY_WINDOW: Duration = Duration::from_secs(10);
/// The longest wait between two attempts to reach NVML.
const BACKOFF_CAP: Duration = Duration::from_secs(60);

/// The configuration in force, with the command line's overrides applied.
pub struct Settings {
    pub watchdog: Watchdog,
    /// How long NVML may take to answer for one GPU.
    pub nvml_timeout: Duration,
    pub dry_run: bool,
    pub guard: Guard,
    pub policy: Policy,
    /// The file the settings came from, for messages.
    pub source: String,
}

impl Settings {
    pub fn load(cli: &Cli) -> Result<Settings, ConfigError> {
        let loaded = match &cli.config {
            Some(path) => config::load_explicit(path)?,
            None => config::load()?,
        };
        // The daemon's own table comes from the system file (or the one file --config or
        // GPUCTL_CONFIG names); a user file does not steer a root daemon.
        let (source, mut watchdog) = match &loaded.system {
            Some((source, config)) => (source.to_string(), config.watchdog.clone()),
            None => {
                let (system, _) = config::paths();
                let path = cli.config.clone().unwrap_or(system.path);
                (
                    format!("{} (absent: defaults)", path.display()),
                    Watchdog::default(),
                )
            }
        };
        if let Some(mode) = cli.mode {
            watchdog.mode = match mode {
                Mode::Report => WatchdogMode::Report,
                Mode::Reclaim => WatchdogMode::Reclaim,
            };
        }
        let protection = Protection::configured(&loaded.protect())
            .with(&watchdog.protect_commands, &watchdog.protect_users);
        let guard = Guard::for_this_process(protection);
        let policy = Policy {
            include_stopped: watchdog.reclaim.contains(&ReclaimKind::Stopped),
            // A stopped process becomes a finding once stopped for the grace; the grace is
            // then counted from when it stopped (see `Daemon::stale_since`).
            stopped_after: watchdog.grace,
            fraction: loaded
                .has_fraction_policy()
                .then(|| std::sync::Arc::new(loaded.clone())),
            stuck: (!watchdog.stuck_after.is_zero()).then_some(StuckCriteria {
                after: watchdog.stuck_after,
                util_pct: watchdog.stuck_util_pct,
                power_fraction: watchdog.stuck_power_fraction,
            }),
            ..Policy::default()
        };
        let nvml_timeout = gpuctl_core::nvml::timeout(None, loaded.nvml_timeout())
            .map_err(|e| ConfigError::Value(e.to_string()))?;
        Ok(Settings {
            nvml_timeout,
            watchdog,
            dry_run: cli.dry_run,
            guard,
            policy,
            source,
        })
    }

    fn acts(&self) -> bool {
        self.watchdog.mode == WatchdogMode::Reclaim
    }

    fn escalation(&self) -> Escalation {
        let term_timeout = self.watchdog.term_timeout;
        Escalation::then_kill(Signal::TERM, term_timeout).with_kill_timeout(
            Escalation::KILL_TIMEOUT.min(term_timeout.max(Duration::from_secs(1))),
        )
    }

    fn summary(&self) -> String {
        let w = &self.watchdog;
        format!(
            "mode {}{}, interval {}, grace {}, term_timeout {}, reclaim [{}], enforce_fraction {}",
            w.mode.as_str(),
            if self.dry_run { " (dry run)" } else { "" },
            humantime::format_duration(w.interval),
            humantime::format_duration(w.grace),
            humantime::format_duration(w.term_timeout),
            w.reclaim
                .iter()
                .map(|k| kind_name(*k))
                .collect::<Vec<_>>()
                .join(", "),
            w.enforce_fraction
        )
    }
}

fn kind_name(kind: ReclaimKind) -> &'static str {
    match kind {
        ReclaimKind::Orphaned => "orphaned",
        ReclaimKind::Zombie => "zombie",
        ReclaimKind::Stopped => "stopped",
    }
}

/// Whether NVML can be reached, and when to try again.
enum Nvml {
    Up(Box<Gpus>),
    Down { retry_at: Instant },
}

/// What was last done about a process that is due, so that each is logged once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handled {
    /// Logged as left (report mode, incomplete snapshot): acted on once that changes.
    Left,
    /// Logged as would-reclaim (dry run) or skipped by the guard: not tried again.
    Logged,
    /// A reclaim failed; tried again at this time.
    RetryAt(Instant),
}

/// What one pass saw.
struct Seen {
    snapshot: Snapshot,
    lineages: PidMap<u32, Lineage>,
    /// The GPUs that did not answer, when some did not: nothing is acted on.
    incomplete: Option<String>,
    /// NVML is re-opened after this pass.
    reopen: bool,
    now: Instant,
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
    nvml: Nvml,
    /// Doubles with each failed attempt to reach NVML (or to re-open it after an incomplete
    /// snapshot), up to BACKOFF_CAP; reset by a complete snapshot.
    backoff: Duration,
    /// When NVML is re-opened next while snapshots stay incomplete (driver reload).
    reopen_at: Option<Instant>,
    last_incomplete: Option<String>,
    last_nvml_down: Option<String>,
    /// Host facts kept across loops: a known process costs one read of its stat.
    facts: FactCache,
    /// The /proc view, kept across passes (its namespace and filesystem checks do not
    /// change); its uptime is read again each pass.
    proc_view: Option<ProcView>,
    // History.
    parents: PidMap<Identity, Identity>,
    parent_died: PidSet<Identity>,
    stopped_since: PidMap<Identity, Instant>,
    stale_since: PidMap<Identity, Instant>,
    over_since: PidMap<Identity, Instant>,
    warned: PidSet<Identity>,
    handled: PidMap<(Identity, Remedy), Handled>,
    logged_findings: PidSet<(Option<Identity>, Vec<u32>, Kind, Verdict)>,
    /// Processes whose claim to a protected name was judged (impostors are logged once).
    claims_judged: PidSet<Identity>,
    /// Each GPU's spell of looking stuck, and how long each has lasted (by index).
    stuck: StuckTracker,
    stuck_for: PidMap<u32, Duration>,
    // Reporting.
    metrics: Metrics,
    metrics_error: Option<String>,
    /// When the metrics file was last written, and what it said apart from the loop
    /// counter and the poll time.
    metrics_written: Option<(Instant, Metrics)>,
    last_reclaim: Option<String>,
    status: String,
    ready_sent: bool,
    peaks: Option<PeakStore>,
    /// The findings file last written (its content but the time), and when.
    findings_written: Option<(Instant, Vec<WatchdogFinding>)>,
    findings_error: Option<String>,
}

impl Daemon {
    pub fn new(settings: Settings, log: Logger, notify: Notifier) -> Daemon {
        let peaks = settings.watchdog.state_path().map(PeakStore::in_dir);
        let backoff = settings.watchdog.interval;
        // Findings act only after `grace`, so facts a quarter of it old are fresh enough;
        // each signal still checks the process's start time. Every process is looked at
        // at least every second: no event reports a process turning zombie (Linux notifies
        // a pidfd only once its whole thread group has exited), and the reclaim bound is
        // grace + interval + term_timeout + 1 s. A look is the owner check where it applies
        // (see gpuctl_core::host::FactCache), else a read of its stat; leaders and parents
        // are read as often.
        let grace_quarter = settings.watchdog.grace / 4;
        let refresh = grace_quarter.min(Duration::from_secs(1));
        Daemon {
            settings,
            log,
            notify,
            nvml: Nvml::Down {
                retry_at: Instant::now(),
            },
            backoff,
            reopen_at: None,
            last_incomplete: None,
            last_nvml_down: None,
            facts: FactCache::refreshing_every(refresh).reading_stat_every(grace_quarter),
            proc_view: None,
            parents: PidMap::default(),
            parent_died: PidSet::default(),
            stopped_since: PidMap::default(),
            stale_since: PidMap::default(),
            over_since: PidMap::default(),
            warned: PidSet::default(),
            handled: PidMap::default(),
            logged_findings: PidSet::default(),
            claims_judged: PidSet::default(),
            stuck: StuckTracker::default(),
            stuck_for: PidMap::default(),
            metrics: Metrics::default(),
            metrics_error: None,
            metrics_written: None,
            last_reclaim: None,
            status: String::new(),
            ready_sent: false,
            findings_written: None,
            findings_error: None,
            peaks,
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
        let monotonic = {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: clock_gettime writes one timespec.
            unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
            ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000
        };
        self.notify
            .send(&format!("RELOADING=1\nMONOTONIC_USEC={monotonic}"));
        match Settings::load(&crate::cli_args()) {
            Ok(settings) => {
                self.peaks = settings.watchdog.state_path().map(PeakStore::in_dir);
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

    /// Reaches NVML if it is down and the retry time has come.
    fn ensure_nvml(&mut self, once: bool) {
        let Nvml::Down { retry_at, .. } = &self.nvml else {
            return;
        };
        if Instant::now() < *retry_at && !once {
            return;
        }
        match Gpus::open_within(self.settings.nvml_timeout) {
            Ok(gpus) => {
                if let Some(reason) = self.last_nvml_down.take() {
                    self.event(
                        Priority::Notice,
                        &format!("NVML is available again (it was not: {reason})"),
                        &[("ACTION", "nvml-up".into())],
                    );
                }
                self.nvml = Nvml::Up(Box::new(gpus));
            }
            Err(error) => self.nvml_down(error.to_string()),
        }
    }

    fn nvml_down(&mut self, reason: String) {
        let retry_at = Instant::now() + self.backoff;
        if self.last_nvml_down.as_deref() != Some(reason.as_str()) {
            self.event(
                Priority::Err,
                &format!(
                    "NVML is unavailable, nothing is reclaimed; retrying with backoff (up to {}): {reason}",
                    humantime::format_duration(BACKOFF_CAP)
                ),
                &[("ACTION", "nvml-down".into()), ("REASON", reason.clone())],
            );
            self.last_nvml_down = Some(reason.clone());
        }
        self.status = format!(
            "NVML unavailable: {}; retrying in {}",
            first_sentence(&reason),
            humantime::format_duration(Duration::from_millis(self.backoff.as_millis() as u64))
        );
        self.backoff = (self.backoff * 2).min(BACKOFF_CAP);
        self.nvml = Nvml::Down { retry_at };
    }

    /// One loop: observe → judge → act → report. `once`: no grace, no history.
    pub fn pass(&mut self, once: bool) -> Pass {
        let mut pass = Pass::default();
        self.metrics.loops_total += 1;
        self.ensure_nvml(once);
        let Some(seen) = self.observe(once) else {
            self.finish_down();
            pass.nvml_down = true;
            return pass;
        };
        let judged = self.judge(&seen, once);
        self.act(&seen, &judged, once, &mut pass);
        self.report(&seen, &judged);
        if seen.reopen {
            self.event(
                Priority::Notice,
                "re-opening NVML while a GPU does not answer",
                &[("ACTION", "nvml-reopen".into())],
            );
            self.nvml = Nvml::Down {
                retry_at: Instant::now(),
            };
            self.backoff = (self.backoff * 2).min(BACKOFF_CAP);
        }
        pass
    }

    /// Observe: a snapshot and the lineages of its processes, and whether every GPU
    /// answered. `None` when NVML is down or the snapshot failed (the session is closed to
    /// be reopened).
    fn observe(&mut self, once: bool) -> Option<Seen> {
        let Nvml::Up(gpus) = &self.nvml else {
            return None;
        };
        let view = match self.proc_view.take() {
            Some(mut view) => view.refresh_uptime().map(|()| view),
            None => ProcView::system(),
        };
        let taken = view.map_err(|e| e.to_string()).and_then(|view| {
            Snapshot::take_cached(
                gpus,
                &view,
                &SnapshotOptions {
                    gpus: None,
                    utilization_window: Some(ACTIVITY_WINDOW),
                    only_memory_and_processes: true,
                    // Utilization and power, for the stuck-GPU check.
                    activity: self.settings.policy.stuck.is_some(),
                    holders: None,
                },
                &mut self.facts,
            )
            .map(|snapshot| {
                let lineages = snapshot.lineages_cached(&view, &mut self.facts);
                self.proc_view = Some(view);
                (snapshot, lineages)
            })
            .map_err(|e| e.to_string())
        });
        let (snapshot, lineages) = match taken {
            Ok(taken) => taken,
            Err(reason) => {
                // The session is broken (driver reload, library error): close it and reopen.
                self.nvml = Nvml::Down {
                    retry_at: Instant::now(),
                };
                self.nvml_down(format!("snapshot failed: {reason}"));
                return None;
            }
        };
        let now = Instant::now();
        let incomplete = self.note_incomplete(&snapshot);
        // A GPU lost or failing may be a driver reload, which a new NVML session sees past;
        // one that does not answer is not helped by one (its calls would block again).
        let reopen_may_help = snapshot
            .devices
            .iter()
            .any(|g| matches!(g.status, GpuStatus::Lost | GpuStatus::Error));
        match &incomplete {
            None => {
                self.backoff = self.settings.watchdog.interval;
                self.reopen_at = None;
            }
            Some(_) if !reopen_may_help => self.reopen_at = None,
            Some(_) if !once => {
                let at = *self.reopen_at.get_or_insert(now + self.backoff);
                if now >= at {
                    // Re-open NVML after this pass: a driver reload leaves the old session
                    // unable to see the GPUs again.
                    self.reopen_at = None;
                }
            }
            Some(_) => {}
        }
        let reopen = reopen_may_help && !once && self.reopen_at.is_none();
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
            Some(self.update_history(snapshot, now, seen.incomplete.is_some()))
        };
        let findings = classify::classify(
            snapshot,
            &seen.lineages,
            history.as_ref(),
            &self.settings.policy,
        );
        self.log_findings(snapshot, &findings);
        self.log_impostors(snapshot);
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
        if seen.incomplete.is_some() {
            let listed: PidSet<u32> = snapshot
                .devices
                .iter()
                .flat_map(|g| g.processes.iter().map(|p| p.pid))
                .collect();
            self.stale_since
                .retain(|id, _| stale_ids.contains(id) || !listed.contains(&id.pid));
        } else {
            self.stale_since.retain(|id, _| stale_ids.contains(id));
        }
        for f in &stale {
            let Some(id) = f.identity else { continue };
            let since = match f.kind {
                Kind::Stopped => self.stopped_since.get(&id).copied().unwrap_or(now),
                _ => now,
            };
            self.stale_since.entry(id).or_insert(since);
        }
        let mut due: Vec<(Finding, Remedy)> = stale
            .iter()
            .filter(|f| {
                once || f.identity.is_some_and(|id| {
                    self.stale_since
                        .get(&id)
                        .is_some_and(|&since| now.saturating_duration_since(since) >= grace)
                })
            })
            .map(|f| (f.clone(), Remedy::Reclaim))
            .collect();

        // Above its share: warned once it lasted the grace, ended with enforce_fraction.
        let over: Vec<&Finding> = findings
            .iter()
            .filter(|f| f.verdict == Verdict::Reclaim && f.kind.remedy() == Remedy::Enforce)
            .collect();
        let over_ids: PidSet<Identity> = over.iter().filter_map(|f| f.identity).collect();
        self.over_since.retain(|id, _| over_ids.contains(id));
        self.warned.retain(|id| over_ids.contains(id));
        for f in over {
            let Some(id) = f.identity else { continue };
            let since = *self.over_since.entry(id).or_insert(now);
            if once || now.saturating_duration_since(since) >= grace {
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
        self.handled.retain(|key, _| all_due.contains(key));
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
                if self.handled.insert((id, remedy), Handled::Left) != Some(Handled::Left) {
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
            match self.handled.get(&(id, remedy)) {
                Some(Handled::Logged) => {
                    if self.settings.dry_run {
                        pass.left += 1;
                    } else {
                        pass.failed += 1;
                    }
                    continue;
                }
                Some(Handled::RetryAt(at)) if now < *at && !once => continue,
                _ => {}
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

    /// Report: the metrics and systemd's STATUS line.
    fn report(&mut self, seen: &Seen, judged: &Judged) {
        let snapshot = &seen.snapshot;
        let stale_per_gpu = |index: u32| {
            judged
                .stale
                .iter()
                .filter(|f| f.gpus.contains(&index))
                .count()
        };
        self.metrics.nvml_up = true;
        self.metrics.gpus = snapshot
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
                stuck: judged.stuck.iter().any(|f| f.gpus.contains(&g.index)),
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
                        })
                    })
                    .collect(),
            })
            .collect();
        if seen.incomplete.is_none() {
            self.metrics.last_good_poll = Some(unix_now());
        }
        let processes: PidSet<u32> = snapshot
            .devices
            .iter()
            .flat_map(|g| g.processes.iter().map(|p| p.pid))
            .collect();
        let mut status = format!(
            "{} GPU{}, {} process{}, {} stale",
            snapshot.devices.len(),
            if snapshot.devices.len() == 1 { "" } else { "s" },
            processes.len(),
            if processes.len() == 1 { "" } else { "es" },
            judged.stale_ids.len()
        );
        if let Some(what) = &seen.incomplete {
            status.push_str(&format!("; reclaim suspended: {what}"));
        } else if !self.settings.acts() {
            status.push_str("; report mode");
        } else if self.settings.dry_run {
            status.push_str("; dry run");
        }
        if let Some(last) = &self.last_reclaim {
            status.push_str(&format!("; last reclaim {last}"));
        }
        self.status = status;
        self.publish();
        self.write_findings(seen, judged);
    }

    /// The findings file in the state directory (`gpuctl info` shows it): stale processes,
    /// processes above their share and stuck GPUs, each with since when. Written when it
    /// changes, and at least every minute.
    fn write_findings(&mut self, seen: &Seen, judged: &Judged) {
        let Some(dir) = self.settings.watchdog.state_path().map(PathBuf::from) else {
            return;
        };
        let (snapshot, now) = (&seen.snapshot, seen.now);
        let unix_at =
            |since: Instant| unix_now() - now.saturating_duration_since(since).as_secs_f64();
        let entry = |f: &Finding, since_unix: f64| WatchdogFinding {
            kind: f.kind.name().to_string(),
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
            // Seconds are enough, and keep the file unchanged while nothing changes.
            since_unix: since_unix.floor(),
            reason: f.reason.clone(),
        };
        let mut findings: Vec<WatchdogFinding> = Vec::new();
        for f in &judged.stale {
            let since = f.identity.and_then(|id| self.stale_since.get(&id).copied());
            findings.push(entry(f, unix_at(since.unwrap_or(now))));
        }
        for f in &judged.over {
            let since = f.identity.and_then(|id| self.over_since.get(&id).copied());
            findings.push(entry(f, unix_at(since.unwrap_or(now))));
        }
        for f in &judged.stuck {
            let lasted = f
                .gpus
                .first()
                .and_then(|i| self.stuck_for.get(i).copied())
                .unwrap_or_default();
            findings.push(entry(f, unix_now() - lasted.as_secs_f64()));
        }
        if let Some((at, written)) = &self.findings_written
            && *written == findings
            && now.saturating_duration_since(*at) < Duration::from_secs(60)
        {
            return;
        }
        let document = WatchdogFindings {
            written_unix: unix_now(),
            interval_s: self.settings.watchdog.interval.as_secs_f64(),
            findings: findings.clone(),
        };
        let path = watchdog_findings_path(&dir);
        let result = serde_json::to_vec_pretty(&document)
            .map_err(std::io::Error::other)
            .and_then(|bytes| {
                std::fs::create_dir_all(&dir)?;
                gpuctl_core::files::replace(&path, &bytes, 0o644, false)
            });
        self.findings_written = result.is_ok().then_some((now, findings));
        let error = result.err().map(|e| format!("{}: {e}", path.display()));
        if error != self.findings_error {
            if let Some(error) = &error {
                self.event(
                    Priority::Warning,
                    &format!("cannot write the findings file: {error}"),
                    &[("ACTION", "findings".into()), ("REASON", error.clone())],
                );
            }
            self.findings_error = error;
        }
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
        self.publish();
    }

    /// STATUS= and the metrics file. The file is replaced each loop, except that loops less
    /// than a second apart in which nothing but the loop counter and the poll time changed
    /// are written together: with a sub-second `interval`, rewriting a file on disk ten
    /// times a second (each rename starts a writeback on ext4) costs more than the loop.
    fn publish(&mut self) {
        self.notify.send(&format!("STATUS={}", self.status));
        let Some(path) = self.settings.watchdog.metrics_path().map(PathBuf::from) else {
            return;
        };
        // What the file says apart from the two series that change every loop.
        let state = Metrics {
            loops_total: 0,
            last_good_poll: None,
            ..self.metrics.clone()
        };
        let now = Instant::now();
        if let Some((at, written)) = &self.metrics_written
            && *written == state
            && now.saturating_duration_since(*at) < Duration::from_secs(1)
        {
            return;
        }
        let text = metrics::render(&self.metrics);
        let result = metrics::write_atomic(&path, &text);
        self.metrics_written = result.is_ok().then_some((now, state));
        let error = result.err().map(|e| format!("{}: {e}", path.display()));
        if error != self.metrics_error {
            match &error {
                Some(error) => self.event(
                    Priority::Warning,
                    &format!("cannot write the metrics file: {error}"),
                    &[("ACTION", "metrics".into()), ("REASON", error.clone())],
                ),
                None => self.event(
                    Priority::Info,
                    &format!("metrics file written again: {}", path.display()),
                    &[("ACTION", "metrics".into())],
                ),
            }
            self.metrics_error = error;
        }
    }

    /// Signals (or, in a dry run, plans) through the reclaim road, pinging systemd's
    /// watchdog from a helper thread while the escalation waits.
    fn execute(&self, snapshot: &Snapshot, to_run: &[(Target, Remedy)]) -> Vec<Outcome> {
        let Nvml::Up(gpus) = &self.nvml else {
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
                self.handled.insert((id, remedy), Handled::Logged);
                self.event(
                    Priority::Notice,
                    &format!("dry run: would reclaim {who}, {held}: {reasons}"),
                    &target_fields(snapshot, target, "would-reclaim", remedy),
                );
            }
            Action::Skip => {
                pass.failed += 1;
                self.handled.insert((id, remedy), Handled::Logged);
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
                self.last_reclaim = Some(format!("{}: {who} {held}", clock_time()));
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
                self.stale_since.remove(&id);
                self.over_since.remove(&id);
            }
            Action::Signal => {
                pass.failed += 1;
                self.metrics.reclaim_failures_total += 1;
                self.handled.insert(
                    (id, remedy),
                    Handled::RetryAt(
                        now + self
                            .settings
                            .watchdog
                            .grace
                            .max(self.settings.watchdog.interval),
                    ),
                );
                self.event(
                    Priority::Err,
                    &format!("reclaim of {who} failed: {}; {reasons}", outcome.summary()),
                    &target_fields(snapshot, target, "failed", remedy),
                );
            }
        }
    }

    /// What the daemon has seen over time: parents that died under a GPU process, and how
    /// long processes have been stopped.
    /// `incomplete`: some GPU failed this read, so a process it does not list may still be
    /// there; what was seen of those is kept.
    fn update_history(&mut self, snapshot: &Snapshot, now: Instant, incomplete: bool) -> History {
        let mut seen: PidSet<Identity> = PidSet::default();
        for process in snapshot.devices.iter().flat_map(|g| &g.processes) {
            let host = &process.host;
            let (Some(ticks), Some(ppid)) = (host.start_ticks, host.ppid) else {
                continue;
            };
            let id = Identity::new(process.pid, ticks);
            if !seen.insert(id) {
                continue;
            }
            match self.parents.get(&id).copied() {
                // Its parent changed: the one seen before is gone (a process is reparented
                // only when its parent exits), unless it is still there with that identity.
                Some(parent) if parent.pid != ppid => {
                    let alive = Identity::observe(parent.pid).is_ok_and(|now| now == parent);
                    if !alive {
                        self.parent_died.insert(id);
                    }
                    self.parents.remove(&id);
                }
                Some(_) => {}
                None if ppid > 1 => {
                    if let Ok(parent) = Identity::observe(ppid) {
                        self.parents.insert(id, parent);
                    }
                }
                None => {}
            }
            if matches!(
                host.state,
                Some(ProcState::Stopped | ProcState::TracingStop)
            ) {
                self.stopped_since.entry(id).or_insert(now);
            } else {
                self.stopped_since.remove(&id);
            }
        }
        // Only a complete snapshot shows that a process is gone (the pid set only then).
        let listed: Option<PidSet<u32>> =
            incomplete.then(|| seen.iter().map(|id| id.pid).collect());
        let kept = |id: &Identity| {
            seen.contains(id)
                || listed
                    .as_ref()
                    .is_some_and(|listed| !listed.contains(&id.pid))
        };
        self.parents.retain(|id, _| kept(id));
        self.parent_died.retain(|id| kept(id));
        self.stopped_since.retain(|id, _| kept(id));
        self.stuck_for = match &self.settings.policy.stuck {
            Some(criteria) => self
                .stuck
                .observe(snapshot, criteria, now)
                .into_iter()
                .collect(),
            None => PidMap::default(),
        };
        History {
            parent_died: self.parent_died.clone(),
            stopped_for: self
                .stopped_since
                .iter()
                .map(|(id, since)| (*id, now.saturating_duration_since(*since)))
                .collect(),
            stuck_for: self.stuck_for.clone(),
        }
    }

    /// Each process that names itself after a protected program without being it, once: it
    /// is not protected. Judged once per process (its executable cannot change).
    fn log_impostors(&mut self, snapshot: &Snapshot) {
        let protection = self.settings.guard.protection();
        let mut seen: PidSet<Identity> = PidSet::default();
        let mut impostors = Vec::new();
        for process in snapshot.devices.iter().flat_map(|g| &g.processes) {
            let host = &process.host;
            let Some(ticks) = host.start_ticks else {
                continue;
            };
            let claimant = Claimant::of(process.pid, host);
            if protection.claimed(&claimant).is_none() {
                continue;
            }
            let id = Identity::new(process.pid, ticks);
            seen.insert(id);
            if self.claims_judged.insert(id)
                && let Claim::Impostor { name, why } = protection.judge(&claimant)
            {
                impostors.push((id, name, why));
            }
        }
        self.claims_judged.retain(|id| seen.contains(id));
        for (id, name, why) in impostors {
            let fields = fields_of(
                snapshot,
                id,
                &[("ACTION", "impostor".into()), ("REASON", why.clone())],
            );
            let user = fields
                .iter()
                .find(|(k, _)| *k == "USER")
                .map_or("?".to_string(), |(_, v)| v.clone());
            self.event(
                Priority::Warning,
                &format!(
                    "pid {} ({user}) claims to be {name} but is not ({why}): not protected",
                    id.pid
                ),
                &fields,
            );
        }
    }

    /// Each finding once, when it appears (and again if it goes away and comes back). Those
    /// above their share are warned of once they lasted the grace (see `judge`).
    fn log_findings(&mut self, snapshot: &Snapshot, findings: &[Finding]) {
        let logged = || {
            findings
                .iter()
                .filter(|f| f.kind.remedy() != Remedy::Enforce)
        };
        let keys: PidSet<(Option<Identity>, Vec<u32>, Kind, Verdict)> = logged()
            .map(|f| (f.identity, f.gpus.clone(), f.kind, f.verdict))
            .collect();
        for f in logged() {
            let key = (f.identity, f.gpus.clone(), f.kind, f.verdict);
            if self.logged_findings.contains(&key) {
                continue;
            }
            let covered = f
                .kind
                .reclaim_kind()
                .is_some_and(|k| self.settings.watchdog.reclaim.contains(&k));
            let (priority, action, note) = match (f.verdict, covered) {
                (Verdict::Reclaim, true) => (
                    Priority::Warning,
                    "stale",
                    format!(
                        "; reclaimed if it stays so for {}",
                        humantime::format_duration(self.settings.watchdog.grace)
                    ),
                ),
                (Verdict::Reclaim, false) => (
                    Priority::Notice,
                    "report",
                    " (its kind is not in watchdog.reclaim)".to_string(),
                ),
                (Verdict::Report, _) => (Priority::Notice, "report", String::new()),
            };
            let gpus = f
                .gpus
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",");
            let (message, mut fields) = match f.identity {
                Some(id) => {
                    let fields = fields_of(snapshot, id, &[]);
                    let user = fields
                        .iter()
                        .find(|(k, _)| *k == "USER")
                        .map_or("?".to_string(), |(_, v)| v.clone());
                    (
                        format!("pid {} ({user}) on GPU {gpus}: {}{note}", id.pid, f.reason),
                        fields,
                    )
                }
                // A GPU finding: the GPU by index and UUID, and the memory it concerns when
                // the finding counts some (unattributed memory).
                None => {
                    let fields = gpu_uuid_fields(snapshot, &f.gpus);
                    let uuid = fields
                        .iter()
                        .find(|(k, _)| *k == "GPU_UUID")
                        .map_or("?".to_string(), |(_, v)| v.clone());
                    let amount = f
                        .bytes
                        .map(|b| format!("{} ", bytes(b)))
                        .unwrap_or_default();
                    (format!("GPU {gpus} ({uuid}): {amount}{}", f.reason), fields)
                }
            };
            fields.push(("REASON", f.reason.clone()));
            fields.push(("ACTION", action.into()));
            self.event(priority, &message, &fields);
        }
        self.logged_findings = keys;
    }
}

/// GPU_UUID (comma-separated for several), PID, USER of a process in the snapshot, then
/// `extra`.
fn fields_of(
    snapshot: &Snapshot,
    id: Identity,
    extra: &[(&'static str, String)],
) -> Vec<(&'static str, String)> {
    let gpus: Vec<u32> = snapshot
        .devices
        .iter()
        .filter(|g| g.processes.iter().any(|p| p.pid == id.pid))
        .map(|g| g.index)
        .collect();
    let mut fields = gpu_uuid_fields(snapshot, &gpus);
    fields.push(("PID", id.pid.to_string()));
    let host = snapshot
        .devices
        .iter()
        .flat_map(|g| &g.processes)
        .find(|p| p.pid == id.pid)
        .map(|p| &p.host);
    let user = host
        .and_then(|h| h.user_name())
        .unwrap_or_else(|| "?".into());
    fields.push(("USER", user));
    fields.extend(extra.iter().cloned());
    fields
}

fn gpu_uuid_fields(snapshot: &Snapshot, gpus: &[u32]) -> Vec<(&'static str, String)> {
    let uuids: Vec<String> = gpus
        .iter()
        .filter_map(|i| snapshot.devices.iter().find(|g| g.index == *i))
        .map(|g| {
            g.uuid
                .clone()
                .unwrap_or_else(|| format!("index {}", g.index))
        })
        .collect();
    vec![("GPU_UUID", uuids.join(","))]
}

fn target_fields(
    snapshot: &Snapshot,
    target: &Target,
    action: &str,
    remedy: Remedy,
) -> Vec<(&'static str, String)> {
    let mut fields = gpu_uuid_fields(snapshot, &target.gpus);
    fields.push(("PID", target.pid.to_string()));
    fields.push(("USER", target.owner_name()));
    fields.push(("REASON", target.reasons.join("; ")));
    fields.push(("ACTION", action.to_string()));
    fields.push((
        "CAUSE",
        match remedy {
            Remedy::Enforce => "fraction",
            _ => "stale",
        }
        .into(),
    ));
    if let Some(used) = target.used_bytes {
        fields.push(("GPU_MEMORY_BYTES", used.to_string()));
    }
    fields
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The local time of day, "12:03:04".
fn clock_time() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as libc::time_t;
    // SAFETY: localtime_r fills the zeroed tm from a valid time_t.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    unsafe { libc::localtime_r(&now, &mut tm) };
    format!("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec)
}

/// The first sentence of an error, for a one-line status.
fn first_sentence(text: &str) -> &str {
    text.split(". ").next().unwrap_or(text)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use gpuctl_core::host::HostProcess;
    use gpuctl_core::snapshot::{GpuProcess, GpuSnapshot, Memory, ProcessType, ReadTimes};

    use super::*;

    /// A daemon with `grace` and, when given, a fraction policy, acting on nothing real.
    fn daemon(grace: Duration, fraction: Option<&str>) -> Daemon {
        let watchdog = Watchdog {
            grace,
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
        };
        Daemon::new(
            settings,
            crate::log::Logger::from_env(),
            Notifier::from_env(),
        )
    }

    /// One GPU of 80 GiB with two processes: pid 10 a zombie holder, pid 11 holding 50 GiB.
    fn seen() -> Seen {
        let process = |pid: u32, state: ProcState, threads: u32, gib: u64| {
            let mut host = HostProcess::unconfirmed("test");
            host.confirmed = true;
            host.unconfirmed_reason = None;
            host.state = Some(state);
            host.threads = Some(threads);
            host.ppid = Some(1);
            host.pgid = Some(pid);
            host.start_ticks = Some(1000 + u64::from(pid));
            GpuProcess {
                pid,
                used_bytes: Some(gib << 30),
                kind: ProcessType::Compute,
                sm_util_pct: Some(0),
                gpu_instance_id: None,
                compute_instance_id: None,
                host: Arc::new(host),
            }
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
            snapshot: Snapshot {
                taken_at: SystemTime::now(),
                driver_version: None,
                cuda_driver_version: None,
                nvml_version: None,
                host_pid_namespace: true,
                devices: vec![gpu],
                read_times: ReadTimes::default(),
            },
            lineages: PidMap::default(),
            incomplete: None,
            reopen: false,
            now: Instant::now(),
        }
    }

    fn due(judged: &Judged) -> Vec<(u32, Kind, Remedy)> {
        judged
            .due
            .iter()
            .map(|(f, remedy)| (f.identity.unwrap().pid, f.kind, *remedy))
            .collect()
    }

    #[test]
    fn judge_holds_findings_for_the_grace_then_names_their_remedy() {
        let mut waiting = daemon(
            Duration::from_secs(3600),
            Some("[fraction]\ndefault = 0.5\n"),
        );
        let judged = waiting.judge(&seen(), false);
        assert_eq!(judged.stale.len(), 1, "the zombie holder is stale");
        assert!(judged.over_ids.iter().any(|id| id.pid == 11));
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
        assert!(judged.over_ids.is_empty());
        assert_eq!(due(&judged), [(10, Kind::ZombieHolder, Remedy::Reclaim)]);
    }
}
