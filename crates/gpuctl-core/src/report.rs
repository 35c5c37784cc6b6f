//! The `report` step's documents: what a reclaim did, as `kill --json` and `clear --json`
//! print it. Tables, journald and metrics render from the same values in their binaries.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::classify::Finding;
use crate::plan::Outcome;
use crate::select::Refusal;
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
    /// `orphaned`, `zombie_holder`, `stopped`, `above_fraction`, `stuck` (see
    /// [`crate::classify::Kind::name`]).
    pub kind: String,
    pub gpus: Vec<u32>,
    /// The GPUs' UUIDs, in the order of `gpus`.
    pub uuids: Vec<String>,
    /// The process, for process findings.
    pub pid: Option<u32>,
    /// Unix time the watchdog first saw it so.
    pub since_unix: f64,
    pub reason: String,
}
