//! `gpuctl slurm prolog|epilog|healthcheck`: what packaging/slurm's scripts run under
//! slurmd. They walk the same road as `clear`, `kill` and `reset`, through gpuctl-core's
//! requests (`steps.rs`); what is Slurm's own here is reading the job from the environment
//! (`job.rs`), turning a failure into a drain reason that names the GPU and the process to
//! blame and undraining only what gpuctl drained (`drain.rs`), and the per-job account
//! (`account.rs`). Nothing here uses the CLI's argument types past [`run`].

mod account;
mod drain;
mod health;
mod job;
mod steps;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use gpuctl_core::config;
use gpuctl_core::session::{Session, SessionOptions};
use gpuctl_core::verify::GpuState;

use crate::Exit;
use account::Account;
use drain::{NodeState, REASON_PREFIX, blame, drain_or_log, drain_reason, named_gpus, scontrol};
use gpuctl::cli::SlurmCommand;
use job::{Job, node_name};

pub fn run(command: &SlurmCommand) -> Result<Exit> {
    match command {
        SlurmCommand::Prolog(args) => prolog(args.wait, args.no_drain),
        SlurmCommand::Epilog(args) => epilog(args.timeout, args.no_drain),
        SlurmCommand::Healthcheck(args) => healthcheck(args.node.as_deref(), args.plan.dry_run),
        SlurmCommand::Account(args) => account::show(args.job, args.output.json),
    }
}

/// `wait`: how long the job's GPUs may take to be free. `no_drain`: fail without draining.
fn prolog(wait: Duration, no_drain: bool) -> Result<Exit> {
    let job = Job::from_env()?;
    if job.gpus.is_empty() {
        return Ok(Exit::Ok);
    }
    let (log, session) = open("prolog");
    match session.and_then(|session| steps::prolog(&job, wait, &session, &log)) {
        Ok(problems) if problems.is_empty() => Ok(Exit::Ok),
        Ok(problems) => {
            drain_or_log(&log, &job.node, &drain_reason(&problems), no_drain);
            Ok(Exit::Failed)
        }
        Err(error) => {
            let reason = drain_reason(&[format!("prolog of job {}: {error:#}", job.id)]);
            drain_or_log(&log, &job.node, &reason, no_drain);
            Err(error)
        }
    }
}

/// `timeout`: how long a leftover gets after SIGTERM, and its memory to be released.
fn epilog(timeout: Duration, no_drain: bool) -> Result<Exit> {
    let job = Job::from_env()?;
    let (log, session) = open("epilog");
    let mut account = Account::new(&job);
    let epilog = |session: Session| -> Result<Vec<String>> {
        let problems = steps::epilog(&job, timeout, &session, &mut account)?;
        // The application Xids the watchdog saw hit this job's processes, by name.
        let uuids: Vec<(u32, String)> = session
            .gpus()?
            .uuids()?
            .into_iter()
            .enumerate()
            .filter_map(|(index, uuid)| Some((index as u32, uuid?)))
            .collect();
        for line in health::job_xids(session.loaded(), &uuids, &job) {
            log.line(&line);
        }
        Ok(problems)
    };
    match session.and_then(epilog) {
        Ok(problems) if problems.is_empty() => {
            account.finish(&log, None);
            Ok(Exit::Ok)
        }
        Ok(problems) => {
            let reason = drain_reason(&problems);
            account.finish(&log, Some(&reason));
            drain_or_log(&log, &job.node, &reason, no_drain);
            Ok(Exit::Failed)
        }
        Err(error) => {
            let reason = drain_reason(&[format!("epilog of job {}: {error:#}", job.id)]);
            account.finish(&log, Some(&reason));
            drain_or_log(&log, &job.node, &reason, no_drain);
            Err(error)
        }
    }
}

/// Resumes `node` (default: this one) if gpuctl drained it and the GPUs its reason names
/// are free; `dry_run`: only says so. A check that fails says why in slurm.log too: slurmd
/// discards its stderr, and a drained node would otherwise stay so with no record of why.
fn healthcheck(node: Option<&str>, dry_run: bool) -> Result<Exit> {
    let node = node_name(node);
    let configured = Session::open_with(&SessionOptions::config_only());
    let log = Log::new("healthcheck", configured.as_ref().ok().map(Session::loaded));
    let checked = configured
        .map_err(anyhow::Error::from)
        .and_then(|configured| check_node(&node, configured, &log, dry_run));
    if let Err(error) = &checked {
        // Only to the file: the error itself goes to stderr as every command's does.
        log.record(&format!(
            "health check of {node} failed, its state is left as it is: {error:#}"
        ));
    }
    checked
}

/// `configured`: the configuration read, NVML not yet opened.
fn check_node(node: &str, configured: Session, log: &Log, dry_run: bool) -> Result<Exit> {
    let node = node.to_string();
    let shown = scontrol(&["show", "node", &node]).map_err(anyhow::Error::msg)?;
    let state = NodeState::parse(&shown)
        .with_context(|| format!("scontrol show node {node}: no State= in its answer"))?;
    // Every check reads the GPUs' health: a GPU that needs a reset, a reboot or a drain
    // drains the node (an admin's drain is left as it is).
    let opened = configured.with_nvml().map_err(anyhow::Error::from);
    let read = opened.and_then(|session| {
        let needs = health::needs(&session)?;
        Ok((session, needs))
    });
    let (session, needs) = match read {
        Ok(read) => read,
        // A node gpuctl did not drain is left as it is, as before the health check read
        // the GPUs; the reason is in slurm.log.
        Err(error)
            if !(state.drained()
                && state
                    .reason
                    .as_deref()
                    .is_some_and(|r| r.starts_with(REASON_PREFIX))) =>
        {
            log.record(&format!("cannot read the GPUs' health: {error:#}"));
            return Ok(Exit::Ok);
        }
        Err(error) => return Err(error),
    };
    if !needs.is_empty() {
        if !state.drained() {
            let reason = drain_reason(&needs);
            if dry_run {
                log.line(&format!("{node} would be drained: {reason}"));
            } else {
                drain_or_log(log, &node, &reason, false);
            }
        }
        return Ok(Exit::Ok);
    }
    if !state.drained() {
        return Ok(Exit::Ok);
    }
    let Some(reason) = state
        .reason
        .as_deref()
        .filter(|r| r.starts_with(REASON_PREFIX))
    else {
        // An admin's drain (or Slurm's own): theirs to lift.
        return Ok(Exit::Ok);
    };
    resume_when_fit(&node, reason, &session, log, dry_run)
}

/// `node`, drained by gpuctl for `reason`, resumed if what it was drained for is over: the
/// GPUs' health (whatever jobs still run), or the GPUs the reason names being held.
fn resume_when_fit(
    node: &str,
    reason: &str,
    session: &Session,
    log: &Log,
    dry_run: bool,
) -> Result<Exit> {
    if health::is_health_reason(reason) {
        return resume(node, "every GPU is healthy again", reason, log, dry_run);
    }
    // The GPUs the reason names, where they still resolve; every GPU otherwise.
    let places = session.places(&named_gpus(reason)).ok().flatten();
    let look = session.wait_for_free(places.as_deref(), Duration::ZERO, None)?;
    if !look.met {
        let busy: Vec<GpuState> = look.gpus.into_iter().filter(|g| !g.free).collect();
        let seen = steps::held_by(session, &busy);
        log.line(&format!(
            "{node} stays drained: {}",
            blame(&busy, &[], seen.as_ref()).join("; ")
        ));
        return Ok(Exit::Ok);
    }
    resume(node, "its GPUs are free", reason, log, dry_run)
}

/// Resumes `node` (`dry_run`: says it would), saying `because` and what it was drained for.
fn resume(node: &str, because: &str, reason: &str, log: &Log, dry_run: bool) -> Result<Exit> {
    if dry_run {
        log.line(&format!(
            "{node} would be resumed: {because} (drained for: {reason})"
        ));
        return Ok(Exit::Ok);
    }
    scontrol(&["update", &format!("NodeName={node}"), "State=RESUME"])
        .map_err(anyhow::Error::msg)?;
    log.line(&format!(
        "resumed {node}: {because} (drained for: {reason})"
    ));
    Ok(Exit::Ok)
}

/// The configuration, the log it places, and NVML: read once per command.
fn open(command: &'static str) -> (Log, Result<Session>) {
    match Session::open_with(&SessionOptions::config_only()) {
        Ok(configured) => (
            Log::new(command, Some(configured.loaded())),
            configured.with_nvml().map_err(Into::into),
        ),
        Err(error) => (Log::new(command, None), Err(error.into())),
    }
}

/// What the Slurm commands did, for admins: to stderr and, with a time, to slurm.log in the
/// watchdog's state directory (slurmd keeps no prolog or epilog output).
struct Log {
    command: &'static str,
    dir: Option<PathBuf>,
}

impl Log {
    fn new(command: &'static str, loaded: Option<&config::Loaded>) -> Log {
        Log {
            command,
            dir: config::watchdog_state_dir(loaded),
        }
    }

    /// `text` escaped (it quotes command names and errors that users chose): a line of
    /// slurm.log or stderr cannot retitle or repaint the terminal that reads it.
    fn line(&self, text: &str) {
        eprintln!(
            "gpuctl slurm {}: {}",
            self.command,
            gpuctl_core::text::escape(text)
        );
        self.record(text);
    }

    /// `text`, escaped, to slurm.log only.
    fn record(&self, text: &str) {
        let text = gpuctl_core::text::escape(text);
        if let Some(dir) = &self.dir {
            let stamp = humantime::format_rfc3339_seconds(SystemTime::now());
            let _ = append(
                &dir.join("slurm.log"),
                &format!("{stamp} {}: {text}", self.command),
            );
        }
    }
}

/// Appends one line in one write (O_APPEND), so concurrent epilogs' lines do not interleave.
fn append(path: &Path, line: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    file.write_all(format!("{line}\n").as_bytes())
}
