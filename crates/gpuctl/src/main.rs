//! gpuctl: see who holds GPU memory on shared NVIDIA servers, and get it back safely.

mod fleet;
mod health;
mod info;
mod policy;
mod reclaim;
mod render;
mod reset;
mod run;
mod serve;
mod slurm;
mod top;

use std::io::{self, Write};
use std::process::ExitCode;

use clap::Parser;
use gpuctl_core::exit::Exit;

use gpuctl::cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) if !error.use_stderr() => {
            // --help and --version.
            let _ = error.print();
            return ExitCode::from(Exit::Ok);
        }
        Err(error) => {
            let _ = writeln!(io::stderr().lock(), "gpuctl: {}", one_line(&error));
            return ExitCode::from(Exit::Usage);
        }
    };
    let color = render::Style::choose(cli.color);
    // `run`'s status is its command's; every other command's is a documented one.
    let result: anyhow::Result<ExitCode> =
        match cli.command.unwrap_or(Command::Info(Default::default())) {
            Command::Info(args) => info::run(&args, color).map(ExitCode::from),
            Command::Kill(args) => reclaim::run_kill(&args, color).map(ExitCode::from),
            Command::Clear(args) => reclaim::run_clear(&args, color).map(ExitCode::from),
            Command::Reset(args) => reset::run(&args, color).map(ExitCode::from),
            Command::Health(args) => health::run(&args, color).map(ExitCode::from),
            Command::Fleet(args) => fleet::run(&args, color).map(ExitCode::from),
            Command::Fraction(args) => policy::run_fraction(&args, color).map(ExitCode::from),
            Command::Enable(args) => policy::run_enable(&args).map(ExitCode::from),
            Command::Top(args) => top::run(&args, color).map(ExitCode::from),
            Command::Slurm(command) => slurm::run(&command).map(ExitCode::from),
            Command::Serve(args) => serve::run(&args).map(ExitCode::from),
            Command::Run(args) => run::run(&args),
            Command::Pick(args) => run::pick(&args).map(ExitCode::from),
        };
    // In a container whose host service could not be asked: one line naming what to mount,
    // escaped (it quotes GPUCTL_SOCKET and what the service said).
    if let Some(hint) = gpuctl_core::service::client::hint() {
        let hint = gpuctl_core::text::escape(&hint);
        let _ = writeln!(io::stderr().lock(), "gpuctl: {hint}");
    }
    match result {
        Ok(exit) => exit,
        Err(error) => report(&error),
    }
}

/// A write to stdout failed because its reader closed it, directly or inside serde_json.
fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        let kind = cause
            .downcast_ref::<io::Error>()
            .map(io::Error::kind)
            .or_else(|| cause.downcast_ref::<serde_json::Error>()?.io_error_kind());
        kind == Some(io::ErrorKind::BrokenPipe)
    })
}

/// Clap's message and its tips ("a similar argument exists: '--gpu'") folded onto one line,
/// without the usage block; the valid values it lists stay.
fn one_line(error: &clap::Error) -> String {
    let text = error.render().to_string();
    let mut lines = text.lines().map(str::trim);
    let message: Vec<&str> = lines
        .by_ref()
        .take_while(|line| !line.is_empty() && !line.starts_with("Usage:"))
        .collect();
    let tips: Vec<&str> = lines.filter(|line| line.starts_with("tip: ")).collect();
    let joined = message.join(" ");
    let mut line = joined
        .strip_prefix("error: ")
        .unwrap_or(&joined)
        .to_string();
    for tip in tips {
        line.push_str("; ");
        line.push_str(tip);
    }
    line
}

/// The error and its causes joined by ": ", each cause said once: an error whose message
/// already says its cause's ("cannot write X: Permission denied (os error 13) (hint)") is
/// not followed by it again.
fn folded(error: &anyhow::Error) -> String {
    let mut message = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if message.contains(&text) {
            continue;
        }
        if !message.is_empty() {
            message.push_str(": ");
        }
        message.push_str(&text);
    }
    message
}

/// One line on stderr, and the exit status that the error's kind documents.
fn report(error: &anyhow::Error) -> ExitCode {
    if is_broken_pipe(error) {
        // The reader (head, less) went away: that is how piped output ends, not a failure.
        return ExitCode::from(Exit::Ok);
    }
    let exit = gpuctl_core::failure::exit_of(error.as_ref());
    // Folded onto one line, then escaped: an error may quote what a user chose.
    let message = folded(error).replace('\n', " ");
    let message = gpuctl_core::text::escape(&message);
    let _ = writeln!(io::stderr().lock(), "gpuctl: {message}");
    ExitCode::from(exit)
}
