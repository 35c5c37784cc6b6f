//! gpuctl-watchdog: the reclaim daemon. The command line is in the library (`cli`), so that
//! xtask can generate the man page from it; the loop and its reporting live here.

mod culprit;
mod daemon;
mod events;
mod health;
mod idle;
mod link;
mod log;
mod metrics;
mod notify;
mod publish;
mod settings;
mod signals;

use clap::Parser;
use gpuctl_watchdog::cli::Cli;

use daemon::Daemon;
use gpuctl_core::exit::Exit;
use settings::Settings;

/// The command line as given (SIGHUP re-reads the configuration it names).
pub(crate) fn cli_args() -> Cli {
    Cli::parse()
}

fn main() {
    let cli = Cli::parse();
    let settings = match Settings::load(&cli) {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!(
                "gpuctl-watchdog: {}",
                gpuctl_core::text::escape(&error.to_string())
            );
            std::process::exit(gpuctl_core::failure::exit_of(&error).code().into());
        }
    };
    // A library root may not load (GPUCTL_NVML_LIB) is a refusal at start, not an NVML
    // outage to retry.
    if let Err(error) = gpuctl_core::nvml::checked_library_path() {
        eprintln!(
            "gpuctl-watchdog: {}",
            gpuctl_core::text::escape(&error.to_string())
        );
        std::process::exit(gpuctl_core::failure::exit_of(&error).code().into());
    }
    if let Err(error) = signals::install() {
        eprintln!("gpuctl-watchdog: cannot install signal handlers: {error}");
        std::process::exit(Exit::Failed.code().into());
    }
    let mut daemon = Daemon::new(
        settings,
        log::Logger::from_env(),
        notify::Notifier::from_env(),
    );
    let code = if cli.once {
        daemon.run_once()
    } else {
        daemon.run()
    };
    std::process::exit(code.code().into());
}
