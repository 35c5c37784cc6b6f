//! The `report` step's documents: what a reclaim did, as `kill --json` and `clear --json`
//! print it. Tables, journald and metrics render from the same values in their binaries.

use serde::Serialize;

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
