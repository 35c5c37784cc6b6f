//! What `gpuctl info` shows, gathered once for every front that shows it (the CLI's `info`
//! and the Python package's `gpuctl.snapshot()`): NVML joined with /proc, protected
//! programs marked, device-file holders named when asked, peak marks, and the `info --json`
//! document.
//! A front opens a [`Survey`] from an [`InfoRequest`], [`Survey::take`]s snapshots, and
//! serializes [`document`]; the same snapshot gives the same document whoever asked.

use std::time::Duration;

use crate::act::Identity;
use crate::classify::{Finding, Policy, Remedy, Verdict};
use crate::config;
use crate::error::Result;
use crate::nvml::Gpus;
use crate::report::{WatchdogFindings, watchdog_findings_path};
use crate::session::{Reader, Session, SessionOptions};
use crate::snapshot::peaks::PeakStore;
use crate::snapshot::{GpuProcess, Snapshot, SnapshotOptions};

pub use crate::report::{INFO_SCHEMA, InfoDocument, document};

/// What to show.
#[derive(Debug, Clone, Default)]
pub struct InfoRequest {
    /// GPUs or MIG instances by name; empty: every GPU.
    pub gpus: Vec<String>,
    /// Look for the device-file holders NVML does not list, on every GPU (`--holders`);
    /// without it, none is looked for (the scan reads every process's descriptors).
    pub all_holders: bool,
    /// The NVML deadline asked for (`--timeout`); else the environment's, the
    /// configuration's, or 10 s.
    pub timeout: Option<Duration>,
    /// Refuse a configuration that cannot be read (`gpuctl health` judges by its Xid
    /// actions); without it, `info` shows the GPUs under built-in defaults.
    pub config_required: bool,
}

/// NVML opened and everything a snapshot for `info` needs decided once: taken again and
/// again by `--watch`, or by a Python program. `info` reads through the same
/// [`Session`] and [`Reader`] as every other reader.
pub struct Survey {
    /// The configuration (empty where it cannot be read: `info` still shows the GPUs with
    /// one that cannot be; `kill` and `clear` refuse to run then) and NVML.
    session: Session,
    reader: Reader,
    /// The device-file scan runs only when asked for (`--holders`): it reads every
    /// process's descriptors, which a launcher polling `info --json` would pay each call.
    holders_asked: bool,
    peaks: Option<PeakStore>,
    /// The watchdog's findings as the last [`Survey::take`] read them: the same read marks
    /// the idle processes and feeds the view, so the file is read once a snapshot.
    findings: Option<WatchdogFindings>,
}

impl Survey {
    pub fn open(request: &InfoRequest) -> Result<Survey> {
        let session = Session::open_with(&SessionOptions {
            timeout: request.timeout,
            config_optional: !request.config_required,
            holders: true,
            ..SessionOptions::default()
        })?;
        // MIG instances may be named: their GPU is read, and only those instances shown.
        let places = session.places(&request.gpus)?;
        let holders = request
            .all_holders
            .then(|| session.holder_scan(true))
            .transpose()?;
        let reader = session
            .reader(SnapshotOptions::info(None))
            .showing_leases()
            .judging_health(session.loaded())
            .places(places)
            .holders(holders);
        Ok(Survey {
            session,
            reader,
            holders_asked: request.all_holders,
            peaks: PeakStore::default_location(),
            findings: None,
        })
    }

    /// One snapshot as `info` shows it (peak marks observed and recorded, the processes
    /// `clear` would reclaim and those the watchdog finds idle marked).
    pub fn take(&mut self) -> Result<Snapshot> {
        let mut snapshot = take_marking_reclaimable(&mut self.reader, self.session.gpus()?)?;
        self.findings = watchdog_findings(Some(self.session.loaded()));
        if let Some(findings) = &mut self.findings {
            mark_idle(&mut snapshot, findings);
            keep_shown(findings, &snapshot);
        }
        if let Some(store) = &self.peaks {
            let marks = store.observe(&snapshot);
            for gpu in &mut snapshot.devices {
                gpu.peak = gpu.uuid.as_ref().and_then(|uuid| marks.get(uuid).copied());
            }
        }
        Ok(snapshot)
    }

    /// Where the device files were not scanned for holders (no `--holders`): the memory no
    /// listed process accounts for above which a view says how to look (the configuration's
    /// `holders_threshold`, 1 GiB by default). `None` when the scan runs.
    pub fn unscanned_above(&self) -> Option<u64> {
        (!self.holders_asked).then(|| self.session.holders_threshold())
    }

    /// The peak store's warning that its file is too large, if it is.
    pub fn peaks_warning(&self) -> Option<String> {
        self.peaks.as_ref()?.oversized_warning()
    }

    /// The configuration and NVML this survey reads through.
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// The watchdog's findings as the last [`Survey::take`] read them ([`watchdog_findings`]).
    pub fn watchdog_findings(&self) -> Option<WatchdogFindings> {
        self.findings.clone()
    }
}

/// The watchdog's findings file in its state directory (the system configuration's
/// `watchdog.state_dir`, else /var/lib/gpuctl), where it exists and can be read.
pub fn watchdog_findings(loaded: Option<&config::Loaded>) -> Option<WatchdogFindings> {
    let dir = config::watchdog_state_dir(loaded)?;
    let bytes = std::fs::read(watchdog_findings_path(&dir)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Marks each process the watchdog finds idle (the same process: pid and start time) with
/// what it found, so that every reader shows idleness the watchdog's window measured, even
/// one that has just started.
pub fn mark_idle(snapshot: &mut Snapshot, findings: &WatchdogFindings) {
    for f in findings
        .findings
        .iter()
        .filter(|f| f.kind == crate::classify::Kind::Idle)
    {
        let (Some(pid), Some(ticks), Some(idle)) = (f.pid, f.start_ticks, f.idle) else {
            continue;
        };
        for process in every_process(snapshot) {
            if process.pid == pid && process.host.start_ticks == Some(ticks) {
                process.idle = Some(idle);
            }
        }
    }
}

/// One read of `reader` with each process `clear` would reclaim marked (`info`, `top`).
pub fn take_marking_reclaimable(reader: &mut Reader, gpus: &Gpus) -> Result<Snapshot> {
    let look = reader.look(gpus)?;
    // The rules `clear` judges by, on the same evidence: what it would reclaim is shown
    // before anyone runs it. Lineages cost a read of each leader and parent (once each),
    // and children are listed only where a group leader is gone.
    let findings = look.classify(None, &Policy::default());
    let mut snapshot = look.snapshot;
    mark_reclaimable(&mut snapshot, &findings);
    Ok(snapshot)
}

/// Marks each process `clear` would reclaim (a finding whose verdict and remedy are both
/// reclaim, of the same process: pid and start time) with its finding's kind. Who may
/// reclaim it is not judged here: `clear` run by another user reports it instead.
pub fn mark_reclaimable(snapshot: &mut Snapshot, findings: &[Finding]) {
    let reclaimable = findings
        .iter()
        .filter(|f| f.verdict == Verdict::Reclaim && f.kind.remedy() == Remedy::Reclaim);
    for finding in reclaimable {
        let Some(identity) = finding.identity else {
            continue;
        };
        for process in every_process(snapshot) {
            let same = process.pid == identity.pid
                && process.host.start_ticks == Some(identity.start_ticks);
            // The first finding of a process is the one shown (rules list state first).
            if same && process.reclaimable.is_none() {
                process.reclaimable = Some(finding.kind.name());
            }
        }
    }
}

/// Every process entry of `snapshot`: each GPU's, and each MIG instance's.
fn every_process(snapshot: &mut Snapshot) -> impl Iterator<Item = &mut GpuProcess> {
    snapshot.devices.iter_mut().flat_map(|g| {
        g.processes.iter_mut().chain(
            g.mig_devices
                .iter_mut()
                .flat_map(|m| m.processes.iter_mut()),
        )
    })
}

/// Keeps the findings about what `snapshot` shows: a GPU it lists, and for a process
/// finding, a process that is still the one found (pid and start time). The file may be up
/// to a loop old and covers every GPU; `info --gpu 0` is about GPU 0.
fn keep_shown(findings: &mut WatchdogFindings, snapshot: &Snapshot) {
    let shown: Vec<u32> = snapshot.devices.iter().map(|gpu| gpu.index).collect();
    findings.findings.retain(|finding| {
        finding.gpus.iter().any(|gpu| shown.contains(gpu))
            && finding.pid.is_none_or(|pid| {
                Identity::observe(pid).is_ok_and(|now| {
                    finding
                        .start_ticks
                        .is_none_or(|ticks| now.start_ticks == ticks)
                })
            })
    });
}

/// The processes `snapshot` shows idle, once each (a process on two GPUs is one), longest
/// idle first: what `gpuctl info --idle` lists.
pub fn idle_processes(snapshot: &Snapshot) -> Vec<(&crate::snapshot::GpuProcess, Vec<u32>)> {
    let mut out: Vec<(&crate::snapshot::GpuProcess, Vec<u32>)> = Vec::new();
    for gpu in &snapshot.devices {
        for process in gpu.processes.iter().filter(|p| p.idle.is_some()) {
            match out.iter_mut().find(|(p, _)| p.pid == process.pid) {
                Some((_, gpus)) => gpus.push(gpu.index),
                None => out.push((process, vec![gpu.index])),
            }
        }
    }
    out.sort_by_key(|(p, _)| (p.idle.map(|i| i.idle_since), p.pid));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::Kind;
    use crate::snapshot::GpuSnapshot;

    fn finding(kind: Kind, verdict: Verdict, pid: u32, ticks: u64) -> Finding {
        Finding {
            kind,
            verdict,
            identity: Some(Identity::new(pid, ticks)),
            gpus: vec![0],
            bytes: None,
            reason: String::new(),
            idle: None,
        }
    }

    #[test]
    fn only_what_clear_would_reclaim_of_the_same_process_is_marked() {
        let process = |pid: u32| {
            crate::fixtures::process(pid)
                .confirmed()
                .started(1000 + pid as u64)
                .build()
        };
        let mut snapshot = Snapshot::of(vec![GpuSnapshot {
            processes: (10..=14).map(process).collect(),
            ..GpuSnapshot::unread(0)
        }]);
        let findings = [
            finding(Kind::ZombieHolder, Verdict::Reclaim, 10, 1010),
            finding(Kind::Orphaned, Verdict::Reclaim, 10, 1010),
            // A lone idle orphan is only reported; so is what no signal fixes.
            finding(Kind::Orphaned, Verdict::Report, 11, 1011),
            finding(Kind::AboveFraction, Verdict::Reclaim, 12, 1012),
            // Its pid, another process (start time).
            finding(Kind::Orphaned, Verdict::Reclaim, 13, 99),
        ];
        mark_reclaimable(&mut snapshot, &findings);
        let marks: Vec<Option<&str>> = snapshot.devices[0]
            .processes
            .iter()
            .map(|p| p.reclaimable)
            .collect();
        assert_eq!(
            marks,
            [Some(Kind::ZombieHolder.name()), None, None, None, None]
        );
    }
}
