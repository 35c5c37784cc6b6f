//! The command line, defined once: help and the man page come from here.

use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use gpuctl_core::exit;

/// What `--help` and the man page print after the options: the exit statuses (from the one
/// table in gpuctl-core), signals and environment.
pub fn after_help() -> String {
    format!(
        "{}\n\n{SIGNALS_AND_ENVIRONMENT}",
        exit::help(exit::WATCHDOG)
    )
}

const SIGNALS_AND_ENVIRONMENT: &str = "\
Signals:
  SIGHUP           reload the configuration; a bad new file is logged and the old one kept
  SIGTERM, SIGINT  stop cleanly

Environment:
  GPUCTL_CONFIG    the configuration file when --config is not given (default
                   /etc/gpuctl/gpuctl.toml; the [watchdog] table holds the daemon's keys)
  GPUCTL_NVML_LIB  NVML library to load (default libnvidia-ml.so.1); as root, only a path
                   that root alone can write, down from /
  GPUCTL_NVML_TIMEOUT  how long NVML may take to answer for one GPU (default 10s, or the
                   file's nvml_timeout); a GPU not answering suspends reclaim
  NOTIFY_SOCKET, WATCHDOG_USEC  set by systemd for a Type=notify unit with WatchdogSec=
  JOURNAL_STREAM   set by systemd: when it names stderr, events go to the journal with
                   structured fields (GPU_UUID, PID, USER, REASON, ACTION, RECLAIMED_BYTES)";

/// Reclaim GPU memory left behind by crashed runs, as a service.
///
/// Every interval, take a snapshot of the GPUs, classify each process as `gpuctl clear`
/// does, and end those that stayed stale for the grace period (SIGTERM, then SIGKILL),
/// verifying through NVML that their memory came back.
///
/// Settings come from the [watchdog] table of the configuration file (interval, grace,
/// term_timeout, mode, reclaim, enforce_fraction, protect_users, protect_commands,
/// metrics_file, state_dir). The default mode is report: nothing is signalled until the
/// file says mode = "reclaim".
#[derive(Debug, Parser)]
#[command(name = "gpuctl-watchdog", version, after_help = after_help())]
pub struct Cli {
    /// Read this configuration file instead of /etc/gpuctl/gpuctl.toml (or GPUCTL_CONFIG).
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,

    /// One pass with no grace period, like `gpuctl clear`; the exit status tells the result.
    #[arg(long)]
    pub once: bool,

    /// Do everything but send signals; what would be reclaimed is logged as would-reclaim.
    #[arg(long)]
    pub dry_run: bool,

    /// Override the file's watchdog.mode: report (log only) or reclaim.
    #[arg(long, value_enum, value_name = "MODE")]
    pub mode: Option<Mode>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Log stale processes and what would be done; signal nothing.
    Report,
    /// End stale processes after the grace period.
    Reclaim,
}
