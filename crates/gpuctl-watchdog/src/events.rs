//! What the daemon tells journald about findings: each finding once when it appears, each
//! impostor of a protected program once, and the structured fields that every event about
//! a process or a GPU carries (GPU_UUID, PID, USER, ...).

use gpuctl_core::act::Identity;
use gpuctl_core::classify::grace::Tried;
use gpuctl_core::classify::{Finding, Kind, Remedy, Verdict};
use gpuctl_core::config::{Watchdog, WatchdogMode};
use gpuctl_core::pidmap::PidSet;
use gpuctl_core::plan::{Disposition, Guard, Outcome};
use gpuctl_core::protect::{Claim, Claimant};
use gpuctl_core::select::Target;
use gpuctl_core::snapshot::Snapshot;
use gpuctl_core::units::{self, bytes};

use crate::Settings;
use crate::log::{Logger, Priority};

/// The findings and claims already logged, so that each is logged once.
#[derive(Debug, Default)]
pub struct FindingLog {
    logged: PidSet<(Option<Identity>, Vec<u32>, Kind, Verdict)>,
    /// Processes whose claim to a protected name was judged (impostors are logged once).
    claims_judged: PidSet<Identity>,
    /// Those of them judged impostors, while they run (the metrics count them).
    impostors: PidSet<Identity>,
    /// The processes looked at this loop (one listed on 8 GPUs is looked at once), and
    /// those of them claiming a protected name: kept, cleared each loop.
    looked_at: PidSet<Identity>,
    seen: PidSet<Identity>,
}

impl FindingLog {
    /// Each process that names itself after a protected program without being it, once: it
    /// is not protected. Judged once per process (its executable cannot change). Returns how
    /// many impostors hold a GPU now.
    pub fn impostors(&mut self, log: &Logger, guard: &Guard, snapshot: &Snapshot) -> usize {
        let protection = guard.protection();
        let (mut seen, mut looked_at) = (
            std::mem::take(&mut self.seen),
            std::mem::take(&mut self.looked_at),
        );
        seen.clear();
        looked_at.clear();
        let mut impostors = Vec::new();
        for process in snapshot.devices.iter().flat_map(|g| &g.processes) {
            let host = &process.host;
            let Some(ticks) = host.start_ticks else {
                continue;
            };
            let id = Identity::new(process.pid, ticks);
            if !looked_at.insert(id) {
                continue;
            }
            let claimant = Claimant::of(process.pid, host);
            if protection.claimed(&claimant).is_none() {
                continue;
            }
            seen.insert(id);
            if self.claims_judged.insert(id)
                && let Claim::Impostor { name, why } = protection.judge(&claimant)
            {
                impostors.push((id, name, why));
            }
        }
        self.claims_judged.retain(|id| seen.contains(id));
        self.impostors.retain(|id| seen.contains(id));
        self.impostors
            .extend(impostors.iter().map(|(id, _, _)| *id));
        (self.seen, self.looked_at) = (seen, looked_at);
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
            log.log(
                Priority::Warning,
                &format!(
                    "pid {} ({user}) claims to be {name} but is not ({why}): not protected",
                    id.pid
                ),
                &fields,
            );
        }
        self.impostors.len()
    }

    /// Each finding once, when it appears (and again if it goes away and comes back). Those
    /// above their share are warned of once they lasted the grace (see `Daemon::judge`).
    /// `once`: `--once`, which has no grace.
    pub fn findings(
        &mut self,
        log: &Logger,
        settings: &Settings,
        snapshot: &Snapshot,
        findings: &[Finding],
        once: bool,
    ) {
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
            if self.logged.contains(&key) {
                continue;
            }
            let (priority, action, note) = how_logged(f, settings, once);
            let (message, mut fields) = finding_line(f, snapshot, &note);
            fields.push(("REASON", f.reason.clone()));
            fields.push(("ACTION", action.into()));
            log.log(priority, &message, &fields);
        }
        self.logged = keys;
    }
}

/// A finding's priority, ACTION and the note its line ends with: idle (reported, then
/// due for reclaim), stale (a kind the watchdog reclaims), or only reported.
fn how_logged(f: &Finding, settings: &Settings, once: bool) -> (Priority, &'static str, String) {
    let watchdog = &settings.watchdog;
    let covered = f
        .kind
        .reclaim_kind()
        .is_some_and(|k| watchdog.reclaim.contains(&k));
    match (f.verdict, covered) {
        // Becoming idle, once; and again when it becomes due for reclaim.
        _ if f.kind == Kind::Idle => match f.verdict {
            Verdict::Report => (Priority::Notice, "idle", String::new()),
            Verdict::Reclaim => (
                Priority::Warning,
                "idle",
                "; idle for idle.reclaim_after: reclaimed (idle.action = reclaim)".into(),
            ),
        },
        (Verdict::Reclaim, true) => (
            Priority::Warning,
            "stale",
            reclaim_note(watchdog, settings.dry_run, once),
        ),
        (Verdict::Reclaim, false) => (
            Priority::Notice,
            "report",
            " (its kind is not in watchdog.reclaim)".to_string(),
        ),
        (Verdict::Report, _) => (Priority::Notice, "report", String::new()),
    }
}

/// A finding's message and the fields naming its process (or its GPU), `note` ending the
/// message of a process's.
fn finding_line(
    f: &Finding,
    snapshot: &Snapshot,
    note: &str,
) -> (String, Vec<(&'static str, String)>) {
    let gpus = units::gpu_list(&f.gpus);
    match f.identity {
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
    }
}

/// GPU_UUID (comma-separated for several), PID, USER of a process in the snapshot, then
/// `extra`.
pub fn fields_of(
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

pub fn gpu_uuid_fields(snapshot: &Snapshot, gpus: &[u32]) -> Vec<(&'static str, String)> {
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

/// A due process left alone (report mode, an incomplete snapshot: `why`), said once.
pub fn left(
    snapshot: &Snapshot,
    target: &Target,
    remedy: Remedy,
    why: &str,
) -> (String, Vec<(&'static str, String)>) {
    let message = format!(
        "pid {} ({}) is {}, left alone ({why}): {}",
        target.pid,
        target.owner_name(),
        match remedy {
            Remedy::Enforce => "above its share",
            _ => "stale",
        },
        target.reasons.join("; ")
    );
    (message, target_fields(snapshot, target, "left", remedy))
}

/// How an attempt on a due process went, as the rules over time record it.
pub fn tried(outcome: &Outcome) -> Tried {
    match &outcome.disposition {
        Disposition::WouldSignal { .. } => Tried::WouldSignal,
        Disposition::Skipped { .. } => Tried::Skipped,
        Disposition::Signalled { .. } if outcome.succeeded() => Tried::Reclaimed,
        Disposition::Signalled { .. } => Tried::Failed,
    }
}

/// What came of an attempt on a due process, as its event: a dry run's would-reclaim, a
/// guard's skip, a reclaim (or an enforced end), or a failure.
pub fn outcome(
    snapshot: &Snapshot,
    outcome: &Outcome,
    remedy: Remedy,
    tried: Tried,
) -> (Priority, String, Vec<(&'static str, String)>) {
    let target = &outcome.target;
    let who = format!("pid {} ({})", target.pid, target.owner_name());
    let held = target.used_bytes.map_or("memory unknown".into(), bytes);
    let reasons = target.reasons.join("; ");
    match tried {
        Tried::WouldSignal => (
            Priority::Notice,
            format!("dry run: would reclaim {who}, {held}: {reasons}"),
            target_fields(snapshot, target, "would-reclaim", remedy),
        ),
        Tried::Skipped => {
            let why = outcome.skipped().unwrap_or_default().to_string();
            let mut fields = target_fields(snapshot, target, "skipped", remedy);
            fields.push(("SKIPPED", why.clone()));
            (
                Priority::Warning,
                format!("not reclaiming {who}: {why}"),
                fields,
            )
        }
        Tried::Reclaimed => {
            let action = match remedy {
                Remedy::Enforce => "terminated",
                _ => "reclaimed",
            };
            let mut fields = target_fields(snapshot, target, action, remedy);
            let freed = target.used_bytes.unwrap_or(0);
            fields.push(("RECLAIMED_BYTES", freed.to_string()));
            let message = format!(
                "{action} {who}: {}, {held} released; {reasons}",
                outcome.summary()
            );
            (Priority::Warning, message, fields)
        }
        Tried::Failed => (
            Priority::Err,
            format!("reclaim of {who} failed: {}; {reasons}", outcome.summary()),
            target_fields(snapshot, target, "failed", remedy),
        ),
    }
}

/// A failed reclaim on a GPU that needs an action (`needs`, e.g. "GPU 1 needs a reset"):
/// its memory comes back only with that, so it is said once and not retried.
pub fn not_retried(
    snapshot: &Snapshot,
    outcome: &Outcome,
    remedy: Remedy,
    needs: &str,
) -> (Priority, String, Vec<(&'static str, String)>) {
    let target = &outcome.target;
    let who = format!("pid {} ({})", target.pid, target.owner_name());
    let held = target.used_bytes.map_or("memory unknown".into(), bytes);
    (
        Priority::Err,
        format!(
            "reclaim of {who}: {held} not got back, and not retried: {needs}; {}",
            outcome.summary()
        ),
        target_fields(snapshot, target, "needs-gpu-reset", remedy),
    )
}

pub fn target_fields(
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

/// What will become of a stale process whose kind `watchdog.reclaim` names, as this pass
/// will do it: one story per pass, never "reclaimed" and then "left alone".
fn reclaim_note(watchdog: &Watchdog, dry_run: bool, once: bool) -> String {
    let grace = humantime::format_duration(watchdog.grace);
    if dry_run && watchdog.mode == WatchdogMode::Reclaim {
        return "; would be reclaimed (--dry-run)".into();
    }
    match (watchdog.mode, once) {
        (WatchdogMode::Report, true) => "; report mode leaves it (exit status 4)".into(),
        (WatchdogMode::Report, false) => {
            format!("; report mode leaves it (reclaim mode ends it if it stays so for {grace})")
        }
        (WatchdogMode::Reclaim, true) => "; reclaimed now (--once: no grace)".into(),
        (WatchdogMode::Reclaim, false) => format!("; reclaimed if it stays so for {grace}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_process_is_told_one_fate_per_mode_and_pass() {
        let mut watchdog = Watchdog {
            grace: std::time::Duration::from_secs(2),
            ..Watchdog::default()
        };
        assert_eq!(
            reclaim_note(&watchdog, false, true),
            "; report mode leaves it (exit status 4)"
        );
        assert!(reclaim_note(&watchdog, false, false).starts_with("; report mode leaves it"));
        watchdog.mode = WatchdogMode::Reclaim;
        assert_eq!(
            reclaim_note(&watchdog, false, true),
            "; reclaimed now (--once: no grace)"
        );
        assert_eq!(
            reclaim_note(&watchdog, false, false),
            "; reclaimed if it stays so for 2s"
        );
        assert_eq!(
            reclaim_note(&watchdog, true, true),
            "; would be reclaimed (--dry-run)"
        );
    }
}
