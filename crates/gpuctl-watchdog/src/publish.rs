//! What the daemon publishes each pass: systemd's STATUS line, the metrics file for
//! node_exporter's textfile collector, and the findings file that `gpuctl info` shows.

use std::path::Path;
use std::time::{Duration, Instant};

use gpuctl_core::classify::Finding;
use gpuctl_core::pidmap::PidSet;
use gpuctl_core::report::{WatchdogFinding, WatchdogFindings, watchdog_findings_path};
use gpuctl_core::snapshot::{GpuStatus, Snapshot};
use gpuctl_core::units;

use crate::log::{Logger, Priority};
use crate::metrics::{self, GpuMetrics, InstanceMetrics, Metrics};
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
        // What the file says apart from the two series that change every loop.
        let state = Metrics {
            loops_total: 0,
            last_good_poll: None,
            ..metrics.clone()
        };
        let now = Instant::now();
        if let Some((at, written)) = &self.metrics_written
            && *written == state
            && now.saturating_duration_since(*at) < Duration::from_secs(1)
        {
            return;
        }
        let text = metrics::render(metrics);
        let result = metrics::write_atomic(path, &text);
        self.metrics_written = result.is_ok().then_some((now, state));
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

/// Each GPU's series: `stale` the leftovers found (due or not yet), `stuck` the stuck-GPU
/// findings.
pub fn gpu_metrics(snapshot: &Snapshot, stale: &[Finding], stuck: &[Finding]) -> Vec<GpuMetrics> {
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
            stuck: stuck.iter().any(|f| f.gpus.contains(&g.index)),
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
        .collect()
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
        let processes: PidSet<u32> = snapshot
            .devices
            .iter()
            .flat_map(|g| g.processes.iter().map(|p| p.pid))
            .collect();
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
