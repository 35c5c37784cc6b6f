//! A GPU's health: one pure function, [`verdict`], turns what a GPU shows now (its
//! [`Facts`]) into `{action, causes}`. Nothing here reads NVML or a file: the readers
//! (`gpuctl health`, `info`, the watchdog, the Slurm health check) gather the facts and
//! show the verdict.
//!
//! **It clears itself.** The verdict is computed from the GPU's current state and the Xids
//! seen since its last reset, never from a flag someone must lower:
//! - what the GPU shows now always counts: lost, a pending row remap or page retirement,
//!   volatile uncorrected ECC errors (they restart with the GPU);
//! - where the driver reports the recovery-action field (R550 on), its action counts, and
//!   Xids are listed as history without an action of their own: the driver has judged them;
//! - where it lacks the field, an Xid's GPU-level action holds until a reset shows (the
//!   volatile ECC counters read lower than when the Xid was recorded) or an admin
//!   acknowledges the GPU's Xids (`gpuctl health --ack GPU` records the time: Xids up to
//!   it are history). A reset by `gpuctl reset --gpu-reset` empties the GPU's Xid log.
//! - an app-caused Xid (`restart_app`) is listed on its GPU, attributed to the processes
//!   that were on it, while one of them still runs; it never makes the GPU's action more
//!   than `none`.

pub mod catalog;
pub mod kernel_log;
pub mod log;

use serde::{Deserialize, Serialize};

use crate::owner::OwnerMatch;
pub use catalog::{Bucket, Catalog, UNKNOWN_XID_DEFAULT, XID_CATALOG, XidEntry, XidRule};

/// Version of the `gpuctl health --json` document; fields are only added within a version.
pub const HEALTH_SCHEMA: u32 = 1;

/// What a GPU (or the process on it) needs: NVML's recovery actions in snake case, and
/// `restart_app` for an Xid the application caused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    None,
    RestartApp,
    DrainP2p,
    GpuReset,
    DrainAndReset,
    NodeReboot,
}

impl Action {
    pub const ALL: [Action; 6] = [
        Action::None,
        Action::RestartApp,
        Action::DrainP2p,
        Action::GpuReset,
        Action::DrainAndReset,
        Action::NodeReboot,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Action::None => "none",
            Action::RestartApp => "restart_app",
            Action::DrainP2p => "drain_p2p",
            Action::GpuReset => "gpu_reset",
            Action::DrainAndReset => "drain_and_reset",
            Action::NodeReboot => "node_reboot",
        }
    }

    pub fn parse(name: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.name() == name)
    }

    /// NVML's NVML_FI_DEV_GET_GPU_RECOVERY_ACTION value (nvmlDeviceGpuRecoveryAction_t);
    /// `None` for a value this gpuctl does not know.
    pub fn from_nvml(value: u32) -> Option<Action> {
        match value {
            0 => Some(Action::None),
            1 => Some(Action::GpuReset),
            2 => Some(Action::NodeReboot),
            3 => Some(Action::DrainP2p),
            4 => Some(Action::DrainAndReset),
            _ => None,
        }
    }

    /// What the GPU itself needs when a cause asks for this: `restart_app` is the process's
    /// problem, and leaves the GPU fit.
    pub fn for_gpu(self) -> Action {
        match self {
            Action::RestartApp => Action::None,
            other => other,
        }
    }

    /// Order of GPU-level actions, mildest first.
    fn severity(self) -> u8 {
        match self {
            Action::None | Action::RestartApp => 0,
            Action::DrainP2p => 1,
            Action::GpuReset => 2,
            Action::DrainAndReset => 3,
            Action::NodeReboot => 4,
        }
    }

    /// "needs a reset", for drain reasons and the `info` title line.
    pub fn needs(self) -> &'static str {
        match self {
            Action::None => "is healthy",
            Action::RestartApp => "needs its application restarted",
            Action::DrainP2p => "needs its peer-to-peer traffic drained",
            Action::GpuReset => "needs a reset",
            Action::DrainAndReset => "needs draining and a reset",
            Action::NodeReboot => "needs a node reboot",
        }
    }

    /// Whether a scheduler should stop handing the GPU out (Slurm drains the node).
    pub fn drains(self) -> bool {
        self.for_gpu() != Action::None
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a cause is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CauseKind {
    RecoveryAction,
    RowRemapPending,
    RowRemapFailure,
    EccUncorrectedVolatile,
    RetiredPagesPending,
    Lost,
    Xid,
    ClockEvent,
}

/// `nvmlDeviceGetRemappedRows`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemappedRows {
    pub correctable: u32,
    pub uncorrectable: u32,
    pub pending: bool,
    pub failure: bool,
}

/// Device-memory ECC error counts (`nvmlDeviceGetTotalEccErrors`). Volatile counts restart
/// with the driver or a GPU reset; aggregate counts last the board's life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EccCounts {
    pub volatile_corrected: u64,
    pub volatile_uncorrected: u64,
    pub aggregate_corrected: u64,
    pub aggregate_uncorrected: u64,
}

impl EccCounts {
    /// Both volatile counts: what a reset sets back to zero.
    pub fn volatile_total(&self) -> u64 {
        self.volatile_corrected
            .saturating_add(self.volatile_uncorrected)
    }
}

/// Retired pages (GPUs before Ampere: later ones remap rows instead).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetiredPages {
    pub single_bit: u32,
    pub double_bit: u32,
    pub pending: bool,
}

/// The clock-event reasons (nvmlClocksEventReason*) that say the hardware slowed the GPU
/// down: a warning, never an action.
pub const SLOWDOWN_REASONS: &[(u64, &str)] = &[
    (0x8, "hw_slowdown"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
];

/// Every clock-event reason NVML names (nvmlClocksEventReason*), by bit, in snake case.
pub const CLOCK_EVENT_REASONS: &[(u64, &str)] = &[
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
];

/// The names of the reasons set in `mask`.
pub fn clock_event_reason_names(mask: u64) -> Vec<&'static str> {
    CLOCK_EVENT_REASONS
        .iter()
        .filter(|(bit, _)| mask & bit != 0)
        .map(|(_, name)| *name)
        .collect()
}

/// What NVML says of a GPU's health now; `None` for what the GPU or driver does not
/// report (the recovery-action field before R550, retired pages on Ampere and later).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Readings {
    pub recovery_action: Option<Action>,
    pub remapped_rows: Option<RemappedRows>,
    pub ecc: Option<EccCounts>,
    pub retired_pages: Option<RetiredPages>,
    #[serde(serialize_with = "reason_names")]
    pub clock_event_reasons: Option<u64>,
}

fn reason_names<S: serde::Serializer>(mask: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
    match mask {
        None => s.serialize_none(),
        Some(mask) => s.collect_seq(clock_event_reason_names(*mask)),
    }
}

impl Facts {
    /// The facts of a GPU that answered with `readings`; the Xids, the running processes
    /// and the acknowledgement are the reader's to add.
    pub fn from_readings(readings: &Readings) -> Facts {
        Facts {
            recovery_action: readings.recovery_action,
            remapped_rows: readings.remapped_rows,
            ecc: readings.ecc,
            retired_pages: readings.retired_pages,
            clock_event_reasons: readings.clock_event_reasons,
            ..Facts::default()
        }
    }
}

/// A process that was on the GPU when an Xid was raised.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct XidProcess {
    pub pid: u32,
    /// Its start time (boot ticks): with the pid, its identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_ticks: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Its owner as a selector (`slurm:812`; `slurm:812@1000` for a job only its
    /// environment names, that uid's claim; `unit:…`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::owner::lenient"
    )]
    pub owner: Option<OwnerMatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
}

/// `pid 4242 (alice, slurm:812, python3 train.py)`: what is known of it. Not escaped:
/// the user chose the command, and each writer escapes for its reader.
impl std::fmt::Display for XidProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {}", self.pid)?;
        let owner = self.owner.as_ref().map(OwnerMatch::to_string);
        let facts: Vec<&str> = [
            self.user.as_deref(),
            owner.as_deref(),
            self.command.as_deref(),
        ]
        .into_iter()
        .flatten()
        .collect();
        if !facts.is_empty() {
            write!(f, " ({})", facts.join(", "))?;
        }
        Ok(())
    }
}

impl XidProcess {
    /// Whether the process is job `job_id`'s, whose user is `job_uid`: the job's cgroup,
    /// or an environment claim of the job's own user ([`OwnerMatch::job`]).
    pub fn is_of_job(&self, job_id: u64, job_uid: Option<u32>) -> bool {
        self.owner.as_ref().is_some_and(|owner| match owner {
            OwnerMatch::SlurmJob(id) => *id == job_id,
            OwnerMatch::SlurmClaim { job_id: id, uid } => *id == job_id && job_uid == Some(*uid),
            _ => false,
        })
    }

    /// Whether the running process (pid, start ticks) is this one: the same pid, and the
    /// same start time where both are known.
    fn is(&self, (pid, start_ticks): (u32, Option<u64>)) -> bool {
        self.pid == pid
            && match (self.start_ticks, start_ticks) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            }
    }
}

/// An Xid as the watchdog recorded it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct XidRecord {
    pub xid: u32,
    /// When it was seen (Unix seconds).
    pub at_unix: u64,
    /// The processes on the GPU then.
    #[serde(default)]
    pub processes: Vec<XidProcess>,
    /// The GPU's volatile ECC count (corrected + uncorrected) then: a lower count later
    /// shows a reset since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volatile_ecc: Option<u64>,
}

/// Everything the verdict of one GPU is computed from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    /// NVML_ERROR_GPU_IS_LOST: fallen off the bus.
    pub lost: bool,
    /// NVML_FI_DEV_GET_GPU_RECOVERY_ACTION; `None` where the driver lacks the field.
    pub recovery_action: Option<Action>,
    pub remapped_rows: Option<RemappedRows>,
    pub ecc: Option<EccCounts>,
    pub retired_pages: Option<RetiredPages>,
    /// nvmlDeviceGetCurrentClocksEventReasons' mask.
    pub clock_event_reasons: Option<u64>,
    /// The Xids recorded since the GPU's last known reset, oldest first.
    pub xids: Vec<XidRecord>,
    /// The processes running now (pid, start ticks), for the app-caused Xids: such a cause
    /// lasts while one of its processes does.
    pub running: Vec<(u32, Option<u64>)>,
    /// An admin acknowledged the GPU's Xids up to this time (Unix seconds).
    pub acknowledged_unix: Option<u64>,
}

/// Why an Xid holds no action now; in JSON its snake-case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum History {
    /// The catalog gives it no action.
    Catalog,
    /// The driver's recovery-action field judged it.
    RecoveryAction,
    /// An admin acknowledged the GPU's Xids since.
    Acknowledged,
    /// The GPU was reset since.
    Reset,
}

impl History {
    pub const ALL: [History; 4] = [
        History::Catalog,
        History::RecoveryAction,
        History::Acknowledged,
        History::Reset,
    ];

    /// What a cause's message adds: " (history: acknowledged)".
    fn why(self) -> &'static str {
        match self {
            History::Catalog => "",
            History::RecoveryAction => " (history: the driver's recovery action decides)",
            History::Acknowledged => " (history: acknowledged)",
            History::Reset => " (history: the GPU was reset since)",
        }
    }
}

/// One reason for a verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cause {
    pub kind: CauseKind,
    /// What this cause asks for; the GPU's action is the most severe GPU-level one.
    pub action: Action,
    /// One line, for people.
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xid: Option<u32>,
    /// The Xid's meaning in NVIDIA's catalog.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meaning: Option<String>,
    /// When the Xid was seen (Unix seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_unix: Option<u64>,
    /// The processes on the GPU when the Xid was seen.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<XidProcess>,
    /// The count behind the cause (ECC errors, remapped rows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// NVIDIA replaces a GPU in this state (a row-remap failure).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rma: bool,
    /// Why an Xid holds no action now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<History>,
    /// The slowdown reasons of a `clock_event` cause.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
}

impl Cause {
    pub(crate) fn new(kind: CauseKind, action: Action, message: String) -> Cause {
        Cause {
            kind,
            action,
            message,
            xid: None,
            meaning: None,
            at_unix: None,
            processes: Vec::new(),
            count: None,
            rma: false,
            history: None,
            reasons: Vec::new(),
        }
    }

    /// A few words for a drain reason: "row remap pending", "Xid 64 under job 812".
    pub fn short(&self) -> String {
        match self.kind {
            CauseKind::RecoveryAction => format!("driver recovery action {}", self.action),
            CauseKind::RowRemapPending => "row remap pending".into(),
            CauseKind::RowRemapFailure => "row remap failure (RMA)".into(),
            CauseKind::EccUncorrectedVolatile => "uncorrected ECC errors".into(),
            CauseKind::RetiredPagesPending => "page retirement pending".into(),
            CauseKind::Lost => "GPU lost".into(),
            CauseKind::ClockEvent => format!("clocks slowed ({})", self.reasons.join(", ")),
            CauseKind::Xid => {
                let xid = self.xid.unwrap_or(0);
                // A claim from the environment names no job here: the job's user is not
                // known to a verdict, and another user's claim must not name it.
                let jobs: Vec<String> = self
                    .processes
                    .iter()
                    .filter_map(|p| match p.owner.as_ref()? {
                        OwnerMatch::SlurmJob(job) => Some(format!("job {job}")),
                        OwnerMatch::SlurmClaim { .. } => None,
                        other => Some(other.to_string()),
                    })
                    .fold(Vec::new(), |mut seen, job| {
                        if !seen.contains(&job) {
                            seen.push(job);
                        }
                        seen
                    });
                let unknown = self
                    .meaning
                    .as_deref()
                    .is_some_and(|m| m.starts_with(catalog::UNKNOWN_XID));
                let name = if unknown { catalog::UNKNOWN_XID } else { "Xid" };
                if jobs.is_empty() {
                    format!("{name} {xid}")
                } else {
                    format!("{name} {xid} under {}", jobs.join(", "))
                }
            }
        }
    }
}

/// A GPU's health: the most severe GPU-level action of its causes, and the causes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    pub action: Action,
    pub causes: Vec<Cause>,
}

impl Verdict {
    /// "needs a reset: row remap pending; Xid 64 under job 812": the action and the causes
    /// that ask for it (or for any GPU-level action); `None` when the action is `none`.
    pub fn summary(&self) -> Option<String> {
        if self.action == Action::None {
            return None;
        }
        let causes: Vec<String> = self
            .causes
            .iter()
            .filter(|c| c.action.for_gpu() != Action::None)
            .map(Cause::short)
            .collect();
        Some(format!("{}: {}", self.action.needs(), causes.join("; ")))
    }

    /// The verdict of a GPU that has fallen off the bus.
    pub fn lost() -> Verdict {
        verdict(
            &Facts {
                lost: true,
                ..Facts::default()
            },
            &Catalog::default(),
        )
    }
}

/// The verdict of one GPU from its facts, under the Xid catalog in force.
pub fn verdict(facts: &Facts, catalog: &Catalog) -> Verdict {
    let mut causes = Vec::new();
    if facts.lost {
        causes.push(Cause::new(
            CauseKind::Lost,
            Action::NodeReboot,
            "the GPU has fallen off the bus (NVML: GPU is lost); the node needs a reboot".into(),
        ));
    }
    if let Some(action) = facts.recovery_action.filter(|a| *a != Action::None) {
        causes.push(Cause::new(
            CauseKind::RecoveryAction,
            action,
            format!("the driver's recovery action is {action}"),
        ));
    }
    memory_causes(facts, &mut causes);
    let volatile_now = facts.ecc.map(|e| e.volatile_total());
    for record in &facts.xids {
        if let Some(cause) = xid_cause(record, facts, volatile_now, catalog) {
            causes.push(cause);
        }
    }
    causes.extend(facts.clock_event_reasons.and_then(clock_cause));
    let action = causes
        .iter()
        .map(|c| c.action.for_gpu())
        .max_by_key(|a| a.severity())
        .unwrap_or(Action::None);
    Verdict { action, causes }
}

/// The memory's causes: a row remap pending or failed, uncorrected ECC errors since the
/// last reset, a page retirement pending.
fn memory_causes(facts: &Facts, causes: &mut Vec<Cause>) {
    if let Some(rows) = facts.remapped_rows {
        if rows.pending {
            let mut cause = Cause::new(
                CauseKind::RowRemapPending,
                Action::GpuReset,
                "a row remap is pending: a GPU reset applies it".into(),
            );
            cause.count = Some(u64::from(rows.correctable) + u64::from(rows.uncorrectable));
            causes.push(cause);
        }
        if rows.failure {
            let mut cause = Cause::new(
                CauseKind::RowRemapFailure,
                Action::GpuReset,
                "row remapping failed (a bank ran out of spare rows): an RMA criterion, the GPU should be replaced".into(),
            );
            cause.rma = true;
            causes.push(cause);
        }
    }
    if let Some(ecc) = facts.ecc.filter(|e| e.volatile_uncorrected > 0) {
        let mut cause = Cause::new(
            CauseKind::EccUncorrectedVolatile,
            Action::GpuReset,
            format!(
                "{} uncorrected ECC error{} since the last reset",
                ecc.volatile_uncorrected,
                if ecc.volatile_uncorrected == 1 {
                    ""
                } else {
                    "s"
                }
            ),
        );
        cause.count = Some(ecc.volatile_uncorrected);
        causes.push(cause);
    }
    if facts.retired_pages.is_some_and(|p| p.pending) {
        causes.push(Cause::new(
            CauseKind::RetiredPagesPending,
            Action::GpuReset,
            "a page retirement is pending: a GPU reset applies it".into(),
        ));
    }
}

/// The hardware's clock slowdown reasons in `mask` as one cause, if any is set.
fn clock_cause(mask: u64) -> Option<Cause> {
    let reasons: Vec<String> = SLOWDOWN_REASONS
        .iter()
        .filter(|(bit, _)| mask & bit != 0)
        .map(|(_, name)| name.to_string())
        .collect();
    if reasons.is_empty() {
        return None;
    }
    let mut cause = Cause::new(
        CauseKind::ClockEvent,
        Action::None,
        format!("the hardware is slowing the clocks: {}", reasons.join(", ")),
    );
    cause.reasons = reasons;
    Some(cause)
}

/// An Xid as a cause, or `None` where it has expired (an app-caused Xid whose processes
/// are gone).
fn xid_cause(
    record: &XidRecord,
    facts: &Facts,
    volatile_now: Option<u64>,
    catalog: &Catalog,
) -> Option<Cause> {
    let rule = catalog.rule(record.xid);
    let (action, history) = if rule.action == Action::RestartApp {
        let still_running = record
            .processes
            .iter()
            .any(|p| facts.running.iter().any(|&r| p.is(r)));
        if !still_running {
            return None;
        }
        (Action::RestartApp, None)
    } else if rule.action == Action::None {
        (Action::None, Some(History::Catalog))
    } else if facts.recovery_action.is_some() {
        (Action::None, Some(History::RecoveryAction))
    } else if facts
        .acknowledged_unix
        .is_some_and(|ack| ack >= record.at_unix)
    {
        (Action::None, Some(History::Acknowledged))
    } else if record
        .volatile_ecc
        .zip(volatile_now)
        .is_some_and(|(then, now)| now < then)
    {
        (Action::None, Some(History::Reset))
    } else {
        (rule.action, None)
    };
    let why = match history {
        Some(history) if history != History::Catalog => history.why(),
        _ if rule.workflow => " (a multi-step workflow: the GPU's remap and ECC state decide)",
        _ => "",
    };
    let message = if rule.known || rule.overridden {
        format!("Xid {}: {}{why}", record.xid, rule.meaning)
    } else {
        format!(
            "{}: not in NVIDIA's Xid catalog as gpuctl has it, so {} by `[health] unknown_xid_action`{why}",
            rule.meaning, rule.action
        )
    };
    let mut cause = Cause::new(CauseKind::Xid, action, message);
    cause.xid = Some(record.xid);
    cause.meaning = Some(rule.meaning);
    cause.at_unix = Some(record.at_unix);
    cause.processes = record.processes.clone();
    cause.history = history;
    Some(cause)
}

#[cfg(test)]
mod tests;
