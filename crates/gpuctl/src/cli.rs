//! The command line, defined once: help, man pages and completions come from here.

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

pub const EXIT_CODES: &str = "\
Exit status:
  0  success
  1  the operation failed (info: a GPU is lost or cannot be read; the others are shown)
  2  usage error (bad option, bad value, unknown GPU)
  3  NVML or the NVIDIA driver is unavailable

Environment:
  GPUCTL_NVML_LIB  NVML library to load (default libnvidia-ml.so.1; nvml-sim for rehearsals)
  NO_COLOR         when set and not empty, --color auto does not color";

/// See who holds GPU memory on shared NVIDIA servers, and get it back safely.
#[derive(Debug, Parser)]
#[command(name = "gpuctl", version, after_help = EXIT_CODES)]
pub struct Cli {
    /// When to color the output: auto (on a terminal, unless NO_COLOR is set), always, never.
    #[arg(long, value_enum, value_name = "WHEN", default_value_t = ColorChoice::Auto, global = true)]
    pub color: ColorChoice,

    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ColorChoice {
    Auto,
    Always,
    Never,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show every GPU and every process holding memory on it (the default command).
    ///
    /// For each GPU: memory in use (and how much of it no process accounts for),
    /// utilization, temperature and power. For each process: pid, user, GPU memory, age,
    /// state, owner (systemd unit or scope, container, Kubernetes pod, Slurm job) and
    /// command. A process that cannot be tied to a local process (another PID namespace,
    /// hidden /proc) is shown as unconfirmed, never attributed to another process.
    Info(InfoArgs),
}

#[derive(Debug, Clone, Default, Args)]
pub struct InfoArgs {
    /// Only this GPU: an index, a UUID (or a unique prefix of one) or a PCI bus id.
    /// Repeat for several.
    #[arg(long = "gpu", value_name = "GPU")]
    pub gpus: Vec<String>,

    /// Print one JSON document (schema version in its `schema` field; see docs/json.md).
    /// With --watch, one document per line at each refresh.
    #[arg(long)]
    pub json: bool,

    /// Refresh every SECONDS (fractions allowed) until interrupted.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds, allow_negative_numbers = true)]
    pub watch: Option<Duration>,
}

/// A positive, finite number of seconds, at least 0.1.
fn parse_seconds(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a number of seconds"))?;
    if !seconds.is_finite() || seconds < 0.1 {
        return Err(format!(
            "'{text}' is out of range: give at least 0.1 seconds"
        ));
    }
    Duration::try_from_secs_f64(seconds).map_err(|_| format!("'{text}' is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_seconds_validation() {
        assert_eq!(parse_seconds("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_seconds("0.5").unwrap(), Duration::from_millis(500));
        for bad in ["0", "-1", "0.05", "NaN", "inf", "abc", "", "1e400"] {
            assert!(parse_seconds(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
