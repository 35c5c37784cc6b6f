//! `cargo run -p xtask -- man [--check]`: writes man/ and man/completions/ from the clap
//! definitions (`--check` fails when the committed files differ, as CI runs it).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::CommandFactory;
use clap_complete::Shell;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let check = args.iter().any(|a| a == "--check");
    match args.first().map(String::as_str) {
        Some("man") => {}
        _ => {
            eprintln!("usage: cargo run -p xtask -- man [--check]");
            return ExitCode::from(2);
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let files = match generate() {
        Ok(files) => files,
        Err(error) => {
            eprintln!("xtask: {error}");
            return ExitCode::from(1);
        }
    };
    let mut stale = Vec::new();
    for (path, content) in &files {
        let target = root.join(path);
        if check {
            if std::fs::read(&target).ok().as_deref() != Some(content.as_slice()) {
                stale.push(path.display().to_string());
            }
        } else if let Err(error) = std::fs::create_dir_all(target.parent().unwrap())
            .and_then(|()| std::fs::write(&target, content))
        {
            eprintln!("xtask: cannot write {}: {error}", target.display());
            return ExitCode::from(1);
        }
    }
    if !stale.is_empty() {
        eprintln!(
            "xtask: stale generated files (run `cargo run -p xtask -- man`): {}",
            stale.join(", ")
        );
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}

/// gpuctl-SUBCOMMAND(1) for each subcommand of `parent` (named `prefix`), and for theirs in
/// turn: gpuctl-slurm(1), gpuctl-slurm-prolog(1), ...
fn pages(
    parent: &clap::Command,
    prefix: &str,
    files: &mut Vec<(PathBuf, Vec<u8>)>,
) -> std::io::Result<()> {
    for sub in parent
        .get_subcommands()
        .filter(|sub| sub.get_name() != "help")
    {
        let name = format!("{prefix}-{}", sub.get_name());
        let page_of = sub
            .clone()
            .name(name.clone())
            .after_help(gpuctl::cli::after_help());
        let mut page = Vec::new();
        clap_mangen::Man::new(page_of).render(&mut page)?;
        files.push((PathBuf::from(format!("man/{name}.1")), page));
        pages(sub, &name, files)?;
    }
    Ok(())
}

/// Every generated file: gpuctl(1), gpuctl-SUBCOMMAND(1) (and their subcommands' pages), gpuctl-watchdog(8), gpuctl.toml(5)
/// and bash/zsh/fish completions.
fn generate() -> std::io::Result<Vec<(PathBuf, Vec<u8>)>> {
    let mut command = gpuctl::cli::Cli::command();
    // Building propagates global options (--color) into each subcommand's page.
    command.build();
    let mut files = Vec::new();
    let mut page = Vec::new();
    clap_mangen::Man::new(command.clone()).render(&mut page)?;
    files.push((PathBuf::from("man/gpuctl.1"), page));
    pages(&command, "gpuctl", &mut files)?;
    let mut watchdog = gpuctl_watchdog::cli::Cli::command();
    watchdog.build();
    let mut page = Vec::new();
    clap_mangen::Man::new(watchdog)
        .section("8")
        .render(&mut page)?;
    files.push((PathBuf::from("man/gpuctl-watchdog.8"), page));
    // The configuration file has no clap definition: its page is written by hand, kept
    // beside this generator so the check covers it too.
    files.push((
        PathBuf::from("man/gpuctl.toml.5"),
        include_bytes!("gpuctl_toml.5").to_vec(),
    ));
    for (shell, file) in [
        (Shell::Bash, "gpuctl.bash"),
        (Shell::Zsh, "_gpuctl"),
        (Shell::Fish, "gpuctl.fish"),
    ] {
        let mut out = Vec::new();
        clap_complete::generate(shell, &mut command.clone(), "gpuctl", &mut out);
        files.push((PathBuf::from("man/completions").join(file), out));
    }
    Ok(files)
}
