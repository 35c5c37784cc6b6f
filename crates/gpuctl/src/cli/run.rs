//! `gpuctl run`'s and `gpuctl pick`'s arguments: which GPUs qualify, and how many.

use std::time::Duration;

use clap::Args;
use gpuctl_core::pick::Criteria;
use gpuctl_core::units::Amount;

use super::{JsonArg, parse_amount, parse_duration};

// What `gpuctl run` and `gpuctl pick` require of a GPU beyond health, defined once.
#[derive(Debug, Clone, Default, Args)]
pub struct CandidateArgs {
    /// Qualify GPUs with at least this much free memory, as a size (40GiB) or a percentage
    /// of the GPU's memory (50%), instead of "no process and under 256 MiB in use".
    #[arg(long, value_name = "SIZE", value_parser = parse_amount)]
    pub min_free: Option<Amount>,

    /// Qualify GPUs whose utilization is under PCT percent (1-100); with --min-free too,
    /// both must hold.
    #[arg(long, value_name = "PCT", value_parser = parse_percent)]
    pub max_util: Option<u32>,
}

impl CandidateArgs {
    pub fn criteria(&self) -> Criteria {
        Criteria {
            min_free: self.min_free,
            max_util: self.max_util,
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// How many GPUs to lease (default 1): any that qualify.
    #[arg(long = "gpus", value_name = "N", value_parser = parse_count, conflicts_with = "gpus")]
    pub count: Option<usize>,

    /// Lease exactly this GPU or MIG instance (index, UUID, bus id, or GPU/GI as nvidia-smi
    /// -L shows them); repeat for several. All of them must qualify.
    #[arg(long = "gpu", value_name = "GPU")]
    pub gpus: Vec<String>,

    #[command(flatten)]
    pub candidates: CandidateArgs,

    /// Wait up to DURATION (30s, 10m) for enough GPUs to qualify and be free of leases,
    /// saying who holds what it waits for. Not enough by then: exit status 4.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub wait: Option<Duration>,

    /// Name the run: a crashed earlier run of this name (its run file left behind) has its
    /// leftovers ended first, and a live run of this name is refused.
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,

    /// Do not add `gpuctl enable`'s allocator settings to the command's environment.
    #[arg(long)]
    pub no_enable: bool,

    /// No summary and no waiting notes on stderr (errors, and leftovers that could not be
    /// ended, are still said).
    #[arg(long, short = 'q')]
    pub quiet: bool,

    /// Also write the summary as one JSON document to FILE (docs/json.md).
    #[arg(long, value_name = "FILE")]
    pub json_summary: Option<std::path::PathBuf>,

    /// The command and its arguments (after `--` where an argument starts with `-`).
    #[arg(
        value_name = "COMMAND",
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub command: Vec<std::ffi::OsString>,
}

#[derive(Debug, Clone, Args)]
pub struct PickArgs {
    /// How many GPUs to print.
    #[arg(value_name = "N", value_parser = parse_count, default_value = "1")]
    pub count: usize,

    #[command(flatten)]
    pub candidates: CandidateArgs,

    /// Print each GPU's index (0, or 0/3 for a MIG instance) instead of its UUID.
    #[arg(long)]
    pub index: bool,

    #[command(flatten)]
    pub output: JsonArg,
}

/// A number of GPUs: at least one.
fn parse_count(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(0) => Err("ask for at least one GPU".into()),
        Ok(count) => Ok(count),
        Err(_) => Err(format!("'{text}' is not a number of GPUs")),
    }
}

/// A percentage from 1 to 100.
fn parse_percent(text: &str) -> Result<u32, String> {
    match text.trim().trim_end_matches('%').parse::<u32>() {
        Ok(pct) if (1..=100).contains(&pct) => Ok(pct),
        _ => Err(format!("'{text}': give a percentage from 1 to 100")),
    }
}
