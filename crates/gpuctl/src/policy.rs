//! `gpuctl fraction` (the memory-share policy) and `gpuctl enable` (allocator settings).

use std::io::{self, Write};
use std::os::unix::process::CommandExt;

use anyhow::Result;
use gpuctl_core::cardset;
use gpuctl_core::config::{self, FractionInForce, FractionScope, Origin};
use gpuctl_core::report::{
    EnableDocument, FileEntry, FractionDocument, POLICY_SCHEMA, PersistenceEntry, ShareEntry,
};
use gpuctl_core::session::{NvmlNeed, Session, SessionOptions, ShareRequest};
use gpuctl_core::settings::{self, Shell};

use crate::Exit;
use crate::render::{self, Color, Style};
use gpuctl::cli::{EnableArgs, FractionArgs, ShellKind};
use gpuctl_core::CoreError;

pub fn run_fraction(args: &FractionArgs, style: Style) -> Result<Exit> {
    match &args.value {
        Some(value) => set_fraction(args, value),
        None => show_fraction(args, style),
    }
}

fn set_fraction(args: &FractionArgs, text: &str) -> Result<Exit> {
    let value = config::parse_fraction(text).map_err(CoreError::Usage)?;
    let (system, user_file) = config::paths();
    let root = nix::unistd::geteuid().is_root();
    // Root sets policy; anyone else keeps their own defaults (which may only lower it).
    let target = match user_file {
        Some(user_file) if !root => user_file,
        _ => system,
    };
    let scope = match (&args.gpu, &args.user) {
        (Some(gpu), _) => FractionScope::Gpu(gpu.clone()),
        (None, Some(user)) => FractionScope::User(user.clone()),
        (None, None) => FractionScope::Default,
    };
    let key = scope.key();
    config::set_fraction(&target, scope, value)?;
    let mut out = io::stdout().lock();
    writeln!(out, "{key} = {value} in {target}")?;
    if target.origin == Origin::User {
        let session = Session::open_with(&SessionOptions::config_only())?;
        let every_gpu = session.shares(&ShareRequest::for_caller())?;
        if let Some(note) = every_gpu.into_iter().find_map(|s| s.share?.note) {
            writeln!(out, "note: {note}")?;
        }
    }
    Ok(Exit::Ok)
}

fn show_fraction(args: &FractionArgs, style: Style) -> Result<Exit> {
    // Per GPU where NVML answers; without it, the entries that apply to every GPU (a GPU
    // named needs NVML to be found).
    let session = Session::open_with(&SessionOptions {
        nvml: match args.gpu {
            Some(_) => NvmlNeed::Required,
            None => NvmlNeed::IfAvailable,
        },
        ..SessionOptions::default()
    })?;
    let loaded = session.loaded();
    let user = args.user.clone().or_else(config::caller_name);
    let (system, user_file) = config::paths();
    let files: Vec<FileEntry> = std::iter::once((system, loaded.system.is_some()))
        .chain(user_file.map(|s| (s, loaded.user.is_some())))
        .map(|(source, present)| FileEntry {
            origin: source.origin.to_string(),
            path: source.path.display().to_string(),
            present,
        })
        .collect();
    let request = ShareRequest {
        user: user.clone(),
        gpus: args.gpu.iter().cloned().collect(),
    };
    let shares: Vec<ShareEntry> = session
        .shares(&request)?
        .into_iter()
        .map(|found| ShareEntry {
            index: found.index,
            uuid: found.uuid,
            fraction: found.share.as_ref().map(|f| f.value),
            source: found.share.as_ref().map(FractionInForce::describe),
            note: found.share.and_then(|f| f.note),
        })
        .collect();
    let document = FractionDocument {
        schema: POLICY_SCHEMA,
        user,
        files,
        gpus: shares,
    };
    render::emit(args.output.json, &document, || {
        fraction_table(&document, &style)
    })?;
    Ok(Exit::Ok)
}

fn fraction_table(document: &FractionDocument, style: &Style) -> String {
    let mut out = format!(
        "{}\n",
        style.paint(
            Color::Bold,
            &format!(
                "memory share per process, for {}",
                document.user.as_deref().unwrap_or("this user")
            )
        )
    );
    for share in &document.gpus {
        let gpu = match (share.index, &share.uuid) {
            (Some(index), Some(uuid)) => format!("GPU {index} ({uuid})"),
            (Some(index), None) => format!("GPU {index}"),
            (None, _) => "every GPU".to_string(),
        };
        let value = match (share.fraction, &share.source) {
            (Some(value), Some(source)) => format!("{value}  from {source}"),
            _ => "no limit".to_string(),
        };
        out.push_str(&format!("  {gpu}: {value}\n"));
        if let Some(note) = &share.note {
            out.push_str(&format!("    {}\n", style.paint(Color::Yellow, note)));
        }
    }
    for file in &document.files {
        out.push_str(&style.paint(
            Color::Dim,
            &format!(
                "  {} file {}{}\n",
                file.origin,
                file.path,
                if file.present { "" } else { " (absent)" }
            ),
        ));
    }
    out
}

/// A command that could not be started (`enable -- COMMAND`, `run`): said on one line, and
/// the shells' status: 127 when it was not found, else 126.
pub fn cannot_run(program: &std::ffi::OsStr, error: &io::Error) -> Exit {
    let name = program.to_string_lossy();
    let shown = gpuctl_core::text::escape(&name);
    if error.kind() != io::ErrorKind::NotFound {
        eprintln!("gpuctl: cannot run {shown}: {error}");
        return Exit::CommandNotExecutable;
    }
    // As the shells word it: a name is looked for in PATH, a path is taken as it is.
    if program.as_encoded_bytes().contains(&b'/') {
        eprintln!("gpuctl: {shown}: no such file");
    } else {
        eprintln!("gpuctl: {shown}: command not found (not in PATH)");
    }
    Exit::CommandNotFound
}

pub fn run_enable(args: &EnableArgs) -> Result<Exit> {
    let session = Session::open_with(&SessionOptions {
        nvml: match args.persistence || !args.gpus.is_empty() {
            true => NvmlNeed::Required,
            false => NvmlNeed::Never,
        },
        ..SessionOptions::default()
    })?;
    let (env, fraction) = session.allocator_env(&args.gpus, &|name| std::env::var(name).ok())?;

    let persistence = match args.persistence {
        true => Some(cardset::enable_persistence(
            session.gpus()?,
            &session.gpu_indices(&args.gpus)?,
        )),
        false => None,
    };
    let mut failed = false;
    if let Some(results) = &persistence {
        let mut err = io::stderr().lock();
        for (index, outcome) in results {
            failed |= outcome.is_failure() || *outcome == cardset::ItemOutcome::NotSupported;
            let _ = writeln!(
                err,
                "gpuctl: GPU {index}: persistence mode: {}",
                outcome.label()
            );
        }
    }
    if failed && !args.command.is_empty() {
        // Asked for and not done: the command is not run on a card in an unexpected state.
        return Ok(Exit::Failed);
    }

    if !args.command.is_empty() {
        let program = &args.command[0];
        let error = std::process::Command::new(program)
            .args(&args.command[1..])
            .envs(env.iter().filter(|s| !s.kept).map(|s| (s.name, &s.value)))
            .exec();
        return Ok(cannot_run(program, &error));
    }

    let document = EnableDocument {
        schema: POLICY_SCHEMA,
        env: &env,
        fraction: fraction.as_ref().map(|f| f.value),
        fraction_source: fraction.as_ref().map(FractionInForce::describe),
        persistence: persistence.map(|results| {
            results
                .into_iter()
                .map(|(index, outcome)| PersistenceEntry { index, outcome })
                .collect()
        }),
    };
    let shell = match args.shell {
        ShellKind::Fish => Shell::Fish,
        ShellKind::Sh | ShellKind::Bash | ShellKind::Zsh => Shell::Posix,
    };
    render::emit(args.output.json, &document, || {
        settings::shell_exports(&env, shell)
    })?;
    // The settings are printed either way; the status says persistence was not done.
    Ok(if failed { Exit::Failed } else { Exit::Ok })
}
