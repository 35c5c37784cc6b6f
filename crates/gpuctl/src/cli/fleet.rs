//! `gpuctl fleet`'s arguments.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use super::{JsonArg, parse_nonzero_duration, parse_seconds};

#[derive(Debug, Clone, Args)]
pub struct FleetArgs {
    /// The query API's base URL: Prometheus, Thanos, Mimir or VictoriaMetrics (default: the
    /// configuration's [fleet] prometheus).
    #[arg(long, value_name = "URL")]
    pub prometheus: Option<String>,

    /// A file holding the bearer token sent with each query (default: [fleet]
    /// bearer_token_file).
    #[arg(long, value_name = "FILE")]
    pub bearer_token_file: Option<PathBuf>,

    /// PEM certificates of the CAs that sign the server's certificate, in place of the
    /// built-in public roots (default: [fleet] ca_file).
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,

    /// Only the nodes whose name matches PATTERN (a regular expression, matched whole, as
    /// Prometheus matches labels: 'gpu-0[1-4]', 'dgx.*').
    #[arg(long, value_name = "PATTERN")]
    pub node: Option<String>,

    /// Totals across the fleet per user or per owner: memory held now, held idle now, and
    /// GiB-hours held and held idle over --since.
    #[arg(long, value_enum, value_name = "WHAT")]
    pub by: Option<FleetBy>,

    /// The window of --by's GiB-hours.
    #[arg(long, value_name = "DURATION", default_value = "24h", value_parser = parse_nonzero_duration)]
    pub since: Duration,

    /// How old a node's metrics may be before it counts as not reporting (default: three of
    /// its watchdog's intervals, at least 60s).
    #[arg(long, value_name = "DURATION", value_parser = parse_nonzero_duration)]
    pub stale_after: Option<Duration>,

    /// How long a query may take.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_nonzero_duration)]
    pub timeout: Duration,

    /// Redraw every SECONDS (default 5) until interrupted.
    #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "5", value_parser = parse_seconds, conflicts_with_all = ["json", "plan", "exec", "detail"])]
    pub watch: Option<Duration>,

    /// Print, per node, the commands that would reclaim or fix what it found.
    #[arg(long, conflicts_with_all = ["by", "detail"])]
    pub plan: bool,

    /// Carry the plan out through the configured [fleet] exec template, after showing it and
    /// asking (or with --yes).
    #[arg(long, conflicts_with_all = ["by", "detail", "json"])]
    pub exec: bool,

    /// With --exec: do not ask.
    #[arg(long, requires = "exec")]
    pub yes: bool,

    /// With --exec: how many nodes at once (default: [fleet] concurrency, else 8).
    #[arg(long, value_name = "N", requires = "exec", value_parser = clap::value_parser!(u16).range(1..=256))]
    pub concurrency: Option<u16>,

    /// Run `gpuctl info` on NODE through the [fleet] exec template and show its table.
    #[arg(long, value_name = "NODE", conflicts_with_all = ["by", "node"])]
    pub detail: Option<String>,

    #[command(flatten)]
    pub output: JsonArg,
}

/// What `fleet --by` totals by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FleetBy {
    User,
    Owner,
}
