//! The configuration in force: the system file's `[watchdog]` table (or the file that
//! `--config` names) with the command line's overrides, and what follows from it.

use std::time::Duration;

use gpuctl_core::CoreError;
use gpuctl_core::act::{Escalation, Signal};
use gpuctl_core::classify::grace::Rules;
use gpuctl_core::classify::idle::IdleReclaim;
use gpuctl_core::classify::stuck::StuckCriteria;
use gpuctl_core::classify::{Finding, Policy, Remedy};
use gpuctl_core::config::{self, IdlePolicy, ReclaimKind, Watchdog, WatchdogMode};
use gpuctl_core::plan::Guard;
use gpuctl_core::protect::Protection;
use gpuctl_core::reclaim::FindingsRequest;
use gpuctl_core::snapshot::HolderScan;
use gpuctl_core::snapshot::{ACTIVITY_WINDOW, SnapshotOptions};
use gpuctl_watchdog::cli::{Cli, Mode};

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
    /// Where the device files are, and the unattributed memory from which the loop scans
    /// for processes holding them (at most once a minute: the scan reads every process's
    /// descriptors).
    pub holders: HolderScan,
    /// NVIDIA's Xid catalog with `[health] xid_actions` and `unknown_xid_action`.
    pub xid_catalog: gpuctl_core::health::Catalog,
    /// `[idle]`: the window and the ladder.
    pub idle: IdlePolicy,
    /// `[kubernetes]`: where pods are named.
    pub kubernetes: config::Kubernetes,
}

impl Settings {
    pub fn load(cli: &Cli) -> Result<Settings, CoreError> {
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
            // then counted from when it stopped (see `Daemon::judge`).
            stopped_after: watchdog.grace,
            fraction: loaded
                .has_fraction_policy()
                .then(|| std::sync::Arc::new(loaded.clone())),
            stuck: (!watchdog.stuck_after.is_zero()).then_some(StuckCriteria {
                after: watchdog.stuck_after,
                util_pct: watchdog.stuck_util_pct,
                power_fraction: watchdog.stuck_power_fraction,
            }),
            idle_reclaim: IdleReclaim::of(&loaded.idle()),
            ..Policy::default()
        };
        let nvml_timeout = gpuctl_core::nvml::timeout(None, loaded.nvml_timeout())?;
        let holders = HolderScan {
            dev_dir: config::device_dir(Some(&loaded))?,
            // The system file's, as for [watchdog]: a user file does not steer the daemon.
            above_unattributed: Some(
                loaded
                    .system
                    .as_ref()
                    .and_then(|(_, config)| config.holders_threshold)
                    .unwrap_or(config::DEFAULT_HOLDERS_THRESHOLD),
            ),
        };
        Ok(Settings {
            nvml_timeout,
            watchdog,
            dry_run: cli.dry_run,
            guard,
            policy,
            source,
            holders,
            xid_catalog: loaded.xid_catalog(),
            idle: loaded.idle(),
            kubernetes: loaded.kubernetes(),
        })
    }

    /// What each pass reads: who holds memory, each process's SM utilization since the
    /// last pass (at least over the activity window, the evidence of life orphans are
    /// judged by), and each GPU's utilization (the stuck check, and an idle process that is
    /// its GPU's only holder where the driver gives no per-process samples).
    pub fn watch_options(&self) -> SnapshotOptions {
        SnapshotOptions {
            utilization_window: Some(self.watchdog.interval.max(ACTIVITY_WINDOW)),
            ..SnapshotOptions::watch(true)
        }
    }

    pub fn acts(&self) -> bool {
        self.watchdog.mode == WatchdogMode::Reclaim
    }

    pub fn escalation(&self) -> Escalation {
        let term_timeout = self.watchdog.term_timeout;
        Escalation::then_kill(Signal::TERM, term_timeout).with_kill_timeout(
            Escalation::KILL_TIMEOUT.min(term_timeout.max(Duration::from_secs(1))),
        )
    }

    /// Why due processes are left alone in a pass, if they are: report mode, or an
    /// incomplete snapshot (`incomplete`: the GPUs that did not answer).
    pub fn leaves_alone(&self, incomplete: Option<&str>) -> Option<String> {
        if !self.acts() {
            return Some("report mode".into());
        }
        incomplete.map(|what| format!("incomplete snapshot: {what}"))
    }

    /// The rules over time in force; `once`: no grace (`--once`).
    pub fn rules(&self, once: bool) -> Rules<'_> {
        Rules {
            grace: self.watchdog.grace,
            interval: self.watchdog.interval,
            reclaim: &self.watchdog.reclaim,
            once,
        }
    }

    /// The reclaim of `due` findings as configured: ending processes above their share only
    /// with enforce_fraction, the escalation, the verification, a dry run.
    pub fn findings_request(&self, due: Vec<(Finding, Remedy)>) -> FindingsRequest {
        FindingsRequest {
            due,
            enforce: self.watchdog.enforce_fraction,
            how: self.escalation(),
            verify_for: self.watchdog.term_timeout,
            dry_run: self.dry_run,
        }
    }

    pub fn summary(&self) -> String {
        let w = &self.watchdog;
        format!(
            "mode {}{}, interval {}, grace {}, term_timeout {}, reclaim [{}], enforce_fraction {}, \
             idle {} after {}",
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
            w.enforce_fraction,
            self.idle.action.as_str(),
            humantime::format_duration(self.idle.after)
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
