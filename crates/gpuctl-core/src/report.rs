//! The `report` step's documents, every JSON document gpuctl prints and its schema version:
//! what a reclaim did (`kill --json`, `clear --json`), what a reset did (`reset --json`),
//! what `info --json` shows, and the watchdog's findings file. Tables, journald and
//! metrics render from the same values in their binaries.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::cardset::{self, GpuItems};
use crate::classify::Finding;
use crate::plan::Outcome;
use crate::select::Refusal;
use crate::settings::EnvSetting;
use crate::snapshot::Snapshot;
use crate::snapshot::totals::{By, Total, totals};
use crate::verify::WaitReport;

/// Version of the `kill --json` and `clear --json` documents.
pub const RECLAIM_SCHEMA: u32 = 1;

/// One `kill` or `clear` run.
#[derive(Debug, Serialize)]
pub struct ReclaimReport<'a> {
    pub schema: u32,
    pub command: &'static str,
    pub dry_run: bool,
    pub signal: String,
    pub timeout_ms: u64,
    pub outcomes: &'a [Outcome],
    pub refused: &'a [Refusal],
    /// Findings shown but not acted on (clear).
    pub reported: Vec<&'a Finding>,
    pub wait: Option<WaitReport>,
}

/// Version of the `reset --json` document.
pub const RESET_SCHEMA: u32 = 1;

/// One `reset` run: each GPU's items and how each ended.
#[derive(Debug, Serialize)]
pub struct ResetReport<'a> {
    pub schema: u32,
    pub dry_run: bool,
    pub gpus: &'a [GpuItems],
    /// With `--gpu-reset` only: each GPU's reset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_reset: Option<&'a [GpuReset]>,
}

/// How one GPU's reset ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum GpuResetOutcome {
    /// Reset, through `via` (`nvml` or `nvidia-smi`).
    Done {
        via: String,
    },
    /// `--dry-run`: nothing holds it; it would be reset through `via`.
    WouldReset {
        via: String,
    },
    /// Something still uses it: each holder, named.
    Refused {
        holders: Vec<String>,
    },
    Failed {
        error: String,
    },
    /// A MIG instance was named: a reset is the whole GPU's.
    Skipped {
        why: String,
    },
}

impl GpuResetOutcome {
    pub fn is_failure(&self) -> bool {
        matches!(
            self,
            GpuResetOutcome::Refused { .. } | GpuResetOutcome::Failed { .. }
        )
    }
}

/// One GPU's reset.
#[derive(Debug, Clone, Serialize)]
pub struct GpuReset {
    pub index: u32,
    pub uuid: Option<String>,
    pub pci_bus_id: Option<String>,
    #[serde(flatten)]
    pub outcome: GpuResetOutcome,
}

/// Version of the `gpuctl info --json` document; fields are only added within a version.
pub const INFO_SCHEMA: u32 = 1;

/// The `gpuctl info --json` document.
#[derive(Serialize)]
pub struct InfoDocument<'a> {
    pub schema: u32,
    pub timestamp: String,
    #[serde(flatten)]
    pub snapshot: &'a Snapshot,
    /// With `--by` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub totals: Option<Vec<Total>>,
    /// The watchdog's current findings, where its state directory is readable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watchdog: Option<WatchdogFindings>,
}

pub fn document(
    snapshot: &Snapshot,
    by: Option<By>,
    watchdog: Option<WatchdogFindings>,
) -> InfoDocument<'_> {
    InfoDocument {
        schema: INFO_SCHEMA,
        timestamp: humantime::format_rfc3339_seconds(snapshot.taken_at).to_string(),
        snapshot,
        totals: by.map(|by| totals(snapshot, by)),
        watchdog,
    }
}

/// Version of the `fraction --json` and `enable --json` documents.
pub const POLICY_SCHEMA: u32 = 1;

/// The `fraction --json` document: the share in force for a user on each GPU, and the
/// files it comes from.
#[derive(Debug, Serialize)]
pub struct FractionDocument {
    pub schema: u32,
    pub user: Option<String>,
    pub files: Vec<FileEntry>,
    pub gpus: Vec<ShareEntry>,
}

/// A configuration file the share may come from.
#[derive(Debug, Serialize)]
pub struct FileEntry {
    pub origin: String,
    pub path: String,
    pub present: bool,
}

/// The share in force on one GPU.
#[derive(Debug, Serialize)]
pub struct ShareEntry {
    /// `None`: no GPU (NVML unavailable): the user and default entries.
    pub index: Option<u32>,
    pub uuid: Option<String>,
    /// `None`: no limit.
    pub fraction: Option<f64>,
    pub source: Option<String>,
    pub note: Option<String>,
}

/// The `enable --json` document: the allocator settings, the share in force, and with
/// `--persistence` how enabling persistence mode went on each GPU.
#[derive(Debug, Serialize)]
pub struct EnableDocument<'a> {
    pub schema: u32,
    pub env: &'a [EnvSetting],
    pub fraction: Option<f64>,
    pub fraction_source: Option<String>,
    pub persistence: Option<Vec<PersistenceEntry>>,
}

/// How enabling persistence mode went on one GPU.
#[derive(Debug, Serialize)]
pub struct PersistenceEntry {
    pub index: u32,
    #[serde(flatten)]
    pub outcome: cardset::ItemOutcome,
}

/// The file in the watchdog's state directory that holds its current findings, for
/// `gpuctl info` to show.
pub fn watchdog_findings_path(state_dir: &Path) -> PathBuf {
    state_dir.join("findings.json")
}

/// What the watchdog currently finds, with since when: rewritten (whole, renamed over the
/// old one) when it changes, and at least every minute so a reader can tell a stopped
/// watchdog from a quiet one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WatchdogFindings {
    /// Unix time it was written.
    pub written_unix: f64,
    /// The watchdog's loop interval, in seconds.
    pub interval_s: f64,
    pub findings: Vec<WatchdogFinding>,
}

/// One finding the watchdog holds: a leftover in its grace or due, a process above its
/// share, a stuck GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WatchdogFinding {
    /// `orphaned`, `zombie_holder`, `stopped`, `above_fraction`, `stuck`, `idle` (see
    /// [`crate::classify::Kind::name`]).
    pub kind: crate::classify::Kind,
    pub gpus: Vec<u32>,
    /// The GPUs' UUIDs, in the order of `gpus`.
    pub uuids: Vec<String>,
    /// The process, for process findings.
    pub pid: Option<u32>,
    /// The process's start time (clock ticks since boot): with `pid`, its identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_ticks: Option<u64>,
    /// Unix time the watchdog first saw it so.
    pub since_unix: f64,
    pub reason: String,
    /// For an `idle` finding: since when, the memory, how much of the window was measured
    /// and where the utilization came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle: Option<crate::snapshot::IdleFacts>,
}

/// Version of `gpuctl run --json-summary`'s document.
pub const RUN_SCHEMA: u32 = 1;

/// What `gpuctl run` did: its GPUs and what was seen of them while the command ran, how the
/// command ended, and the leftovers ended after it.
#[derive(Debug, Serialize)]
pub struct RunSummary {
    pub schema: u32,
    pub command: Vec<String>,
    pub name: Option<String>,
    pub gpus: Vec<RunGpu>,
    /// From the command's start to its main process's end.
    pub wall_seconds: f64,
    /// From gpuctl's start to the command's start (reading, judging, leasing).
    pub start_seconds: f64,
    /// Its exit code, or `None` where a signal ended it (`signal`).
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// Descendants found alive when the command's main process ended.
    pub leftovers: usize,
    /// What was done with each, one line each.
    pub leftover_lines: Vec<String>,
    /// How many could not be ended or their memory was not seen released.
    pub leftovers_failed: usize,
    /// Pids of leftovers stuck in D state: their GPU needs a reset.
    pub needs_reset: Vec<u32>,
}

/// One leased GPU or MIG instance of a run.
#[derive(Debug, Serialize)]
pub struct RunGpu {
    pub index: u32,
    pub gpu_instance: Option<u32>,
    pub uuid: Option<String>,
    /// The most memory seen in use on it while the command ran.
    pub peak_used_bytes: Option<u64>,
    pub mean_utilization_pct: Option<f64>,
    pub samples: u64,
}

/// Version of `gpuctl pick --json`'s document.
pub const PICK_SCHEMA: u32 = 1;

/// `gpuctl pick --json`: the GPUs that qualify, none leased.
#[derive(Debug, Serialize)]
pub struct PickDocument {
    pub schema: u32,
    pub gpus: Vec<Picked>,
}

#[derive(Debug, Serialize)]
pub struct Picked {
    pub index: u32,
    pub gpu_instance: Option<u32>,
    /// "0", or "0/3" for a MIG instance.
    pub name: String,
    pub uuid: Option<String>,
}
