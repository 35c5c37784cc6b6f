//! `gpuctl slurm prolog|epilog|healthcheck`: what packaging/slurm's scripts run under
//! slurmd. They walk the same road as `clear`, `kill` and `reset` (the functions of
//! `crate::reclaim` and `crate::reset`); what is Slurm's own here is reading the job from
//! the environment, turning a failure into a drain reason that names the GPU and the
//! process to blame, undraining only what gpuctl drained, and the per-job account.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use gpuctl_core::act::Signal;
use gpuctl_core::config;
use gpuctl_core::nvml::{Gpus, Place};
use gpuctl_core::plan::Outcome;
use gpuctl_core::select::OwnerMatch;
use gpuctl_core::snapshot::peaks::{OwnerPeaks, PeakStore};
use gpuctl_core::units;
use gpuctl_core::verify::{self, GpuState};
use gpuctl_core::{Snapshot, SnapshotOptions};
use serde::Serialize;

use crate::reclaim::{self, Cleared, Killed, Session};
use crate::{Exit, Usage, reset};
use gpuctl::cli::{
    ClearArgs, KillArgs, ResetArgs, SignalArgs, SlurmCommand, SlurmEpilogArgs,
    SlurmHealthcheckArgs, SlurmPrologArgs,
};

/// Every drain reason gpuctl sets starts with this; the health check resumes only nodes
/// whose reason does.
const REASON_PREFIX: &str = "gpuctl:";

/// Slurm shows reasons whole, but `sinfo -R` and admins' eyes do not: past this the reason
/// names the first culprits and how many more there are.
const REASON_MAX_CHARS: usize = 400;

/// Version of the lines of slurm-jobs.jsonl.
pub const ACCOUNT_SCHEMA: u32 = 1;

pub fn run(command: &SlurmCommand) -> Result<Exit> {
    match command {
        SlurmCommand::Prolog(args) => prolog(args),
        SlurmCommand::Epilog(args) => epilog(args),
        SlurmCommand::Healthcheck(args) => healthcheck(args),
    }
}

/// The job slurmd runs a prolog or epilog for, from the environment it gives them.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Job {
    id: u64,
    /// As Slurm names them: GPU indices, or UUIDs (GPU-…, MIG-…).
    gpus: Vec<String>,
    user: Option<String>,
    node: String,
}

impl Job {
    fn from_env() -> Result<Job> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let id = var("SLURM_JOB_ID").ok_or_else(|| {
            anyhow::Error::new(Usage(
                "SLURM_JOB_ID is not set: run this as slurmd's Prolog or Epilog".into(),
            ))
        })?;
        let Ok(id) = id.parse::<u64>() else {
            return Err(Usage(format!("SLURM_JOB_ID '{id}' is not a job id")).into());
        };
        Ok(Job {
            id,
            gpus: job_gpus(
                var("SLURM_JOB_GPUS").as_deref(),
                var("CUDA_VISIBLE_DEVICES").as_deref(),
            ),
            user: var("SLURM_JOB_USER"),
            node: node_name(None),
        })
    }

    /// `slurm:ID`: the job as `--owner` selects it (by cgroup or by SLURM_JOB_ID) and as the
    /// watchdog keys its peaks.
    fn owner_key(&self) -> String {
        format!("slurm:{}", self.id)
    }

    fn owner(&self) -> Result<OwnerMatch> {
        self.owner_key()
            .parse()
            .map_err(|e: String| anyhow::anyhow!(e))
    }
}

/// The job's GPUs: SLURM_JOB_GPUS (GRES indices, as gres.conf lists /dev/nvidia0, 1, …),
/// unless CUDA_VISIBLE_DEVICES names MIG instances, which say more (the slice, not the
/// card); CUDA_VISIBLE_DEVICES alone otherwise. "NoDevFiles" and empty entries are none.
fn job_gpus(slurm_job_gpus: Option<&str>, cuda_visible: Option<&str>) -> Vec<String> {
    let split = |text: &str| -> Vec<String> {
        text.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty() && *s != "NoDevFiles")
            .map(String::from)
            .collect()
    };
    let visible = cuda_visible.map(split).unwrap_or_default();
    if visible.iter().any(|v| v.starts_with("MIG-")) {
        return visible;
    }
    match slurm_job_gpus.map(split) {
        Some(gpus) if !gpus.is_empty() => gpus,
        _ => visible,
    }
}

/// SLURMD_NODENAME (slurmd's name for this node, which may differ from the host's), else
/// the short host name.
fn node_name(given: Option<&str>) -> String {
    if let Some(name) = given {
        return name.to_string();
    }
    if let Some(name) = std::env::var("SLURMD_NODENAME")
        .ok()
        .filter(|n| !n.is_empty())
    {
        return name;
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().split('.').next().unwrap_or_default().to_string())
        .unwrap_or_default()
}

fn prolog(args: &SlurmPrologArgs) -> Result<Exit> {
    let job = Job::from_env()?;
    if job.gpus.is_empty() {
        return Ok(Exit::Ok);
    }
    let (log, session) = open("prolog");
    match session.and_then(|session| prolog_steps(&job, args, &session, &log)) {
        Ok(problems) if problems.is_empty() => Ok(Exit::Ok),
        Ok(problems) => {
            drain_or_log(&log, &job.node, &drain_reason(&problems), args.no_drain);
            Ok(Exit::Failed)
        }
        Err(error) => {
            let reason = drain_reason(&[format!("prolog of job {}: {error:#}", job.id)]);
            drain_or_log(&log, &job.node, &reason, args.no_drain);
            Err(error)
        }
    }
}

/// `clear --wait` on the job's GPUs. Returns what is wrong, the parts of the drain reason.
fn prolog_steps(
    job: &Job,
    args: &SlurmPrologArgs,
    session: &Session,
    log: &Log,
) -> Result<Vec<String>> {
    let clear = ClearArgs {
        gpus: job.gpus.clone(),
        include_stopped: false,
        holders: false,
        wait: Some(args.wait),
        min_free: None,
        how: SignalArgs {
            signal: Signal::TERM,
            timeout: Duration::from_secs(10),
        },
        dry_run: false,
        json: false,
    };
    let Cleared { outcomes, wait, .. } = reclaim::clear(&clear, session)?;
    let ended = outcomes.iter().filter(|o| o.succeeded()).count();
    if ended > 0 {
        log.line(&format!(
            "job {}: ended {ended} leftover{} of earlier runs on GPU {}",
            job.id,
            plural(ended),
            job.gpus.join(",")
        ));
    }
    let not_free: Vec<GpuState> = wait
        .map(|w| w.gpus.into_iter().filter(|g| !g.free).collect())
        .unwrap_or_default();
    let seen = held_by(&session.gpus, &not_free);
    Ok(blame(&not_free, &outcomes, seen.as_ref()))
}

fn epilog(args: &SlurmEpilogArgs) -> Result<Exit> {
    let job = Job::from_env()?;
    let (log, session) = open("epilog");
    let mut account = Account::new(&job);
    match session.and_then(|session| epilog_steps(&job, args, &session, &mut account)) {
        Ok(problems) if problems.is_empty() => {
            account.finish(&log, None);
            Ok(Exit::Ok)
        }
        Ok(problems) => {
            let reason = drain_reason(&problems);
            account.finish(&log, Some(&reason));
            drain_or_log(&log, &job.node, &reason, args.no_drain);
            Ok(Exit::Failed)
        }
        Err(error) => {
            let reason = drain_reason(&[format!("epilog of job {}: {error:#}", job.id)]);
            account.finish(&log, Some(&reason));
            drain_or_log(&log, &job.node, &reason, args.no_drain);
            Err(error)
        }
    }
}

/// End the job's leftovers, check its GPUs are released, restore their settings. Returns
/// what went wrong, the parts of the drain reason.
fn epilog_steps(
    job: &Job,
    args: &SlurmEpilogArgs,
    session: &Session,
    account: &mut Account,
) -> Result<Vec<String>> {
    let kill = KillArgs {
        gpus: Vec::new(),
        pids: Vec::new(),
        users: Vec::new(),
        owners: vec![job.owner()?],
        stale: false,
        min_mem: None,
        older_than: None,
        all: false,
        how: SignalArgs {
            signal: Signal::TERM,
            timeout: args.timeout,
        },
        yes: true,
        dry_run: false,
        json: false,
    };
    let mut problems = Vec::new();
    let (outcomes, refused) = match reclaim::kill(&kill, session)? {
        Some(Killed { outcomes, refused }) => (outcomes, refused),
        None => (Vec::new(), Vec::new()),
    };
    account.leftovers(&outcomes);
    for refusal in &refused {
        problems.push(format!("pid {}: {}", refusal.pid, refusal.reason));
    }

    let gpus = &session.gpus;
    let places = if job.gpus.is_empty() {
        Vec::new()
    } else {
        gpus.resolve_places(&job.gpus)?
    };
    let not_free: Vec<GpuState> = if places.is_empty() {
        Vec::new()
    } else {
        verify::wait_until_free(gpus, Some(&places), args.timeout, None)?
            .gpus
            .into_iter()
            .filter(|g| !g.free)
            .collect()
    };
    let seen = look(gpus, &places);
    if let Some(seen) = &seen {
        account.allocated(seen, &places);
    }
    problems.extend(blame(&not_free, &outcomes, seen.as_ref()));
    // A leftover that would not die, on a GPU the job was not given (or with none).
    for outcome in outcomes.iter().filter(|o| !o.succeeded()) {
        let on_reported = outcome
            .target
            .gpus
            .iter()
            .any(|g| not_free.iter().any(|s| s.index == *g));
        if !on_reported {
            problems.push(format!(
                "GPU {}: {} {}",
                join(&outcome.target.gpus),
                process_label(
                    outcome.target.pid,
                    &outcome.target.owner_name(),
                    &outcome.target.command
                ),
                failure(outcome)
            ));
        }
    }

    if !job.gpus.is_empty() {
        let results = reset::reset(
            &ResetArgs {
                gpus: job.gpus.clone(),
                application_clocks: false,
                locked_clocks: false,
                memory_locked_clocks: false,
                compute_mode: false,
                accounting: false,
                peaks: false,
                dry_run: false,
                json: false,
            },
            gpus,
        )?;
        for gpu in &results {
            for item in gpu.items.iter().filter(|i| i.outcome.is_failure()) {
                problems.push(format!(
                    "GPU {}: {} not restored ({})",
                    gpu.index,
                    item.item.label(),
                    item.outcome.label()
                ));
            }
        }
    }
    Ok(problems)
}

/// The configuration, the log it places, and NVML: read once per command.
fn open(command: &'static str) -> (Log, Result<Session>) {
    match config::load() {
        Ok(loaded) => (Log::new(command, Some(&loaded)), Session::with(loaded)),
        Err(error) => (Log::new(command, None), Err(error.into())),
    }
}

/// One look at the GPUs that are not free, for who holds them; none when all are.
fn held_by(gpus: &Gpus, not_free: &[GpuState]) -> Option<Snapshot> {
    let places: Vec<Place> = not_free.iter().map(|g| Place::whole(g.index)).collect();
    look(gpus, &places)
}

/// One look at `places`' GPUs: their UUIDs, MIG instances and processes.
fn look(gpus: &Gpus, places: &[Place]) -> Option<Snapshot> {
    let mut indices = Place::gpus(places);
    indices.dedup();
    if indices.is_empty() {
        return None;
    }
    Snapshot::take(
        gpus,
        &SnapshotOptions {
            gpus: Some(indices),
            utilization_window: None,
            only_memory_and_processes: false,
            activity: false,
            holders: None,
        },
    )
    .ok()
}

/// "gpuctl: " and the parts, `; `-separated, at most [`REASON_MAX_CHARS`].
fn drain_reason(parts: &[String]) -> String {
    cap(&format!("{REASON_PREFIX} {}", parts.join("; ")))
}

/// For each GPU that is not free, a part of a drain reason naming its UUID, the memory held
/// and the processes holding it, each marked if gpuctl signalled it and it did not exit:
/// "GPU 1 (GPU-…): 6 GiB held, pid 4242 (alice, python3) did not exit".
fn blame(not_free: &[GpuState], outcomes: &[Outcome], seen: Option<&Snapshot>) -> Vec<String> {
    not_free
        .iter()
        .map(|state| {
            let device = seen.and_then(|s| s.devices.iter().find(|d| d.index == state.index));
            let instance = state.gpu_instance.and_then(|gi| {
                device?
                    .mig_devices
                    .iter()
                    .find(|m| m.gpu_instance_id == Some(gi))
            });
            let uuid = match state.gpu_instance {
                Some(_) => instance.and_then(|m| m.uuid.clone()),
                None => device.and_then(|d| d.uuid.clone()),
            };
            let place = match state.gpu_instance {
                Some(gi) => format!("GPU {}/{gi}", state.index),
                None => format!("GPU {}", state.index),
            };
            let place = match uuid {
                Some(uuid) => format!("{place} ({uuid})"),
                None => place,
            };
            let held = state.used_bytes.map_or("memory unknown".into(), |b| {
                format!("{} held", units::bytes(b))
            });
            let holders: Vec<String> = state
                .processes
                .iter()
                .map(|&pid| {
                    let host = device
                        .and_then(|d| d.processes.iter().find(|p| p.pid == pid))
                        .map(|p| &p.host);
                    let user = host
                        .and_then(|h| h.user_name())
                        .unwrap_or_else(|| "unknown user".into());
                    let command = host
                        .and_then(|h| h.comm.clone().or_else(|| h.command.clone()))
                        .unwrap_or_else(|| "?".into());
                    let label = process_label(pid, &user, &command);
                    match outcomes.iter().find(|o| o.target.pid == pid) {
                        Some(outcome) if !outcome.succeeded() => {
                            format!("{label} {}", failure(outcome))
                        }
                        _ => label,
                    }
                })
                .collect();
            match holders.as_slice() {
                [] => format!("{place}: {held} by no listed process"),
                _ => format!("{place}: {held}, {}", holders.join(", ")),
            }
        })
        .collect()
}

fn process_label(pid: u32, user: &str, command: &str) -> String {
    let command = command.split_whitespace().next().unwrap_or("?");
    let command = command.rsplit('/').next().unwrap_or(command);
    format!("pid {pid} ({user}, {command})")
}

/// How a signalled leftover failed, for a reason.
fn failure(outcome: &Outcome) -> &'static str {
    match (outcome.skipped.is_some(), outcome.left_gpu) {
        (true, _) => "could not be signalled",
        (false, Some(true)) => "left the GPU but its memory was not released",
        _ => "did not exit",
    }
}

/// At most [`REASON_MAX_CHARS`], cut at a `; ` with how many parts were left out.
fn cap(reason: &str) -> String {
    if reason.chars().count() <= REASON_MAX_CHARS {
        return reason.to_string();
    }
    let parts: Vec<&str> = reason.split("; ").collect();
    let mut kept = String::new();
    for (i, part) in parts.iter().enumerate() {
        let more = format!("; and {} more", parts.len() - i);
        let next = if kept.is_empty() {
            part.to_string()
        } else {
            format!("{kept}; {part}")
        };
        if next.chars().count() + more.len() > REASON_MAX_CHARS {
            if kept.is_empty() {
                return next.chars().take(REASON_MAX_CHARS).collect();
            }
            return format!("{kept}{more}");
        }
        kept = next;
    }
    kept
}

fn join(values: &[u32]) -> String {
    values
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// Drains the node with `reason` through scontrol (unless `no_drain`), and logs it.
fn drain_or_log(log: &Log, node: &str, reason: &str, no_drain: bool) {
    if no_drain {
        log.line(&format!("failed (node not drained: --no-drain): {reason}"));
        return;
    }
    match scontrol(&[
        "update",
        &format!("NodeName={node}"),
        "State=DRAIN",
        &format!("Reason={reason}"),
    ]) {
        Ok(_) => log.line(&format!("drained {node}: {reason}")),
        Err(error) => log.line(&format!(
            "could not drain {node} ({error}); Slurm drains it on the exit status: {reason}"
        )),
    }
}

/// `scontrol ARGS`: its output, or one line saying why it failed.
fn scontrol(args: &[&str]) -> Result<String, String> {
    let output = Command::new("scontrol")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run scontrol: {e}"))?;
    if output.status.success() {
        return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    let said = String::from_utf8_lossy(&output.stderr);
    let said = said.trim().replace('\n', " ");
    Err(format!(
        "scontrol {} failed ({}): {said}",
        args.first().unwrap_or(&""),
        output.status
    ))
}

fn healthcheck(args: &SlurmHealthcheckArgs) -> Result<Exit> {
    let loaded = config::load()?;
    let log = Log::new("healthcheck", Some(&loaded));
    let node = node_name(args.node.as_deref());
    let shown = scontrol(&["show", "node", &node]).map_err(anyhow::Error::msg)?;
    let state = NodeState::parse(&shown)
        .with_context(|| format!("scontrol show node {node}: no State= in its answer"))?;
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
    // NVML only for a node gpuctl drained: most checks end above.
    let Session { gpus, .. } = Session::with(loaded)?;
    let named = named_gpus(reason);
    // The GPUs the reason names, where they still resolve; every GPU otherwise.
    let places: Option<Vec<Place>> = match gpus.resolve_places(&named) {
        Ok(places) if !named.is_empty() => Some(places),
        _ => None,
    };
    let look = verify::wait_until_free(&gpus, places.as_deref(), Duration::ZERO, None)?;
    if !look.met {
        let busy: Vec<GpuState> = look.gpus.into_iter().filter(|g| !g.free).collect();
        let seen = held_by(&gpus, &busy);
        log.line(&format!(
            "{node} stays drained: {}",
            blame(&busy, &[], seen.as_ref()).join("; ")
        ));
        return Ok(Exit::Ok);
    }
    if args.dry_run {
        log.line(&format!(
            "{node} would be resumed: its GPUs are free (drained for: {reason})"
        ));
        return Ok(Exit::Ok);
    }
    scontrol(&["update", &format!("NodeName={node}"), "State=RESUME"])
        .map_err(anyhow::Error::msg)?;
    log.line(&format!(
        "resumed {node}: its GPUs are free (drained for: {reason})"
    ));
    Ok(Exit::Ok)
}

/// The GPU and MIG UUIDs a drain reason names, in order.
fn named_gpus(reason: &str) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    for word in reason.split(|c: char| c.is_whitespace() || "(),;:".contains(c)) {
        if (word.starts_with("GPU-") || word.starts_with("MIG-"))
            && word.len() > 4
            && !found.iter().any(|f| f == word)
        {
            found.push(word.to_string());
        }
    }
    found
}

/// A node as `scontrol show node` describes it.
#[derive(Debug, PartialEq, Eq)]
struct NodeState {
    /// `IDLE+DRAIN`, `MIXED+DRAIN`, `DOWN`, …
    state: String,
    /// Without the ` [user@time]` Slurm appends.
    reason: Option<String>,
}

impl NodeState {
    fn parse(text: &str) -> Option<NodeState> {
        let mut state = None;
        let mut reason = None;
        for line in text.lines().map(str::trim_start) {
            if let Some(rest) = line.strip_prefix("State=") {
                state = rest.split_whitespace().next().map(String::from);
            } else if let Some(rest) = line.strip_prefix("Reason=") {
                let rest = rest.trim_end();
                let text = match rest.rfind(" [") {
                    Some(at) if rest.ends_with(']') && rest[at..].contains('@') => &rest[..at],
                    _ => rest,
                };
                reason = Some(text.to_string()).filter(|r| !r.is_empty() && r != "(null)");
            }
        }
        Some(NodeState {
            state: state?,
            reason,
        })
    }

    fn drained(&self) -> bool {
        self.state
            .split('+')
            .any(|s| s == "DRAIN" || s == "DRAINED" || s == "DRAINING")
    }
}

/// One job's GPU memory account, a line of slurm-jobs.jsonl.
#[derive(Debug, Serialize)]
struct AccountLine {
    schema: u32,
    time: String,
    node: String,
    job: u64,
    user: Option<String>,
    gpus: Vec<AccountGpu>,
    /// Where the peaks come from: `watchdog` (it saw the job), or `none` (no watchdog ran,
    /// or the job ended before its first look).
    peaks_from: &'static str,
    leftovers_ended: usize,
    reclaimed_bytes: u64,
    /// `clean`, or `drained` with the reason.
    outcome: &'static str,
    reason: Option<String>,
}

#[derive(Debug, Serialize)]
struct AccountGpu {
    index: Option<u32>,
    uuid: String,
    /// The most memory the job's processes held on it at once, as the watchdog saw.
    peak_bytes: Option<u64>,
}

struct Account {
    job: Job,
    /// Index and UUID of each GPU the job was given.
    allocated: Vec<(u32, String)>,
    leftovers_ended: usize,
    reclaimed_bytes: u64,
}

impl Account {
    fn new(job: &Job) -> Account {
        Account {
            job: job.clone(),
            allocated: Vec::new(),
            leftovers_ended: 0,
            reclaimed_bytes: 0,
        }
    }

    fn leftovers(&mut self, outcomes: &[Outcome]) {
        for outcome in outcomes.iter().filter(|o| o.succeeded()) {
            self.leftovers_ended += 1;
            self.reclaimed_bytes += outcome.target.used_bytes.unwrap_or(0);
        }
    }

    /// The job's GPUs, by index and UUID (a MIG instance's own UUID), from `seen`.
    fn allocated(&mut self, seen: &Snapshot, places: &[Place]) {
        for place in places {
            let Some(gpu) = seen.devices.iter().find(|d| d.index == place.gpu) else {
                continue;
            };
            let uuid = match place.gpu_instance {
                None => gpu.uuid.clone(),
                Some(gi) => gpu
                    .mig_devices
                    .iter()
                    .find(|m| m.gpu_instance_id == Some(gi))
                    .and_then(|m| m.uuid.clone()),
            };
            if let Some(uuid) = uuid {
                self.allocated.push((place.gpu, uuid));
            }
        }
    }

    /// Takes the job's peaks from the watchdog's store and writes the line: to
    /// slurm-jobs.jsonl in the state directory, and to the job's AdminComment where Slurm
    /// accepts it.
    fn finish(self, log: &Log, reason: Option<&str>) {
        let peaks: Option<OwnerPeaks> = log.dir.as_deref().and_then(|dir| {
            PeakStore::in_dir(dir)
                .take_owner(&self.job.owner_key())
                .ok()
                .flatten()
        });
        let mut by_uuid: BTreeMap<String, u64> =
            peaks.as_ref().map(|p| p.gpus.clone()).unwrap_or_default();
        let mut gpus: Vec<AccountGpu> = self
            .allocated
            .iter()
            .map(|(index, uuid)| AccountGpu {
                index: Some(*index),
                uuid: uuid.clone(),
                peak_bytes: by_uuid.remove(uuid).or(peaks.as_ref().map(|_| 0)),
            })
            .collect();
        // GPUs the job used without being given them (a job that ignored
        // CUDA_VISIBLE_DEVICES): accounted too.
        gpus.extend(by_uuid.into_iter().map(|(uuid, peak)| AccountGpu {
            index: None,
            uuid,
            peak_bytes: Some(peak),
        }));
        let line = AccountLine {
            schema: ACCOUNT_SCHEMA,
            time: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
            node: self.job.node.clone(),
            job: self.job.id,
            user: self
                .job
                .user
                .clone()
                .or_else(|| peaks.as_ref().and_then(|p| p.user.clone())),
            gpus,
            peaks_from: if peaks.is_some() { "watchdog" } else { "none" },
            leftovers_ended: self.leftovers_ended,
            reclaimed_bytes: self.reclaimed_bytes,
            outcome: if reason.is_some() { "drained" } else { "clean" },
            reason: reason.map(String::from),
        };
        let Ok(text) = serde_json::to_string(&line) else {
            return;
        };
        if let Some(dir) = &log.dir {
            let path = dir.join("slurm-jobs.jsonl");
            if let Err(error) = append(&path, &text) {
                log.line(&format!(
                    "job {}: account not written to {}: {error}",
                    self.job.id,
                    path.display()
                ));
            }
        }
        // Slurm 22.05 refuses to update a job that has finished, which an epilog's job
        // has; later versions may take it. The log file is the record either way.
        let comment = format!("AdminComment={text}");
        let _ = scontrol(&["update", &format!("JobId={}", self.job.id), &comment]);
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

    fn line(&self, text: &str) {
        eprintln!("gpuctl slurm {}: {text}", self.command);
        if let Some(dir) = &self.dir {
            let stamp = humantime::format_rfc3339_seconds(SystemTime::now());
            let _ = append(
                &dir.join("slurm.log"),
                &format!("{stamp} {}: {text}", self.command),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_gpus_prefers_slurm_and_mig_instances() {
        assert_eq!(job_gpus(Some("0,1"), Some("0,1")), ["0", "1"]);
        assert_eq!(job_gpus(None, Some("2")), ["2"]);
        assert_eq!(job_gpus(Some(""), Some("3")), ["3"]);
        assert_eq!(
            job_gpus(Some("0"), Some("MIG-aaaa-bbbb")),
            ["MIG-aaaa-bbbb"]
        );
        assert!(job_gpus(None, Some("NoDevFiles")).is_empty());
        assert!(job_gpus(None, None).is_empty());
        assert_eq!(job_gpus(Some(" 1 , ,2"), None), ["1", "2"]);
    }

    // As Slurm 22.05's `scontrol show node` prints it.
    const SHOWN: &str = "NodeName=vm Arch=x86_64 CoresPerSocket=1 \n\
       CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.31\n\
       Gres=gpu:2\n\
       State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A\n\
       Partitions=debug \n\
       Reason=gpuctl: GPU 1 (GPU-abc): 6 GiB held, pid 4242 (root, sleep) did not exit [root@2026-11-23T15:49:44]\n";

    #[test]
    fn node_state_and_reason_without_the_stamp() {
        let state = NodeState::parse(SHOWN).unwrap();
        assert_eq!(state.state, "IDLE+DRAIN");
        assert!(state.drained());
        assert_eq!(
            state.reason.as_deref(),
            Some("gpuctl: GPU 1 (GPU-abc): 6 GiB held, pid 4242 (root, sleep) did not exit")
        );
        let idle = NodeState::parse("NodeName=vm\n   State=IDLE ThreadsPerCore=1\n").unwrap();
        assert!(!idle.drained() && idle.reason.is_none());
        assert!(NodeState::parse("NodeName=vm\n").is_none());
        let admin =
            NodeState::parse("   State=MIXED+DRAIN x\n   Reason=maintenance [alice@2026]\n")
                .unwrap();
        assert_eq!(admin.reason.as_deref(), Some("maintenance"));
    }

    #[test]
    fn named_gpus_reads_uuids_back_from_a_reason() {
        assert_eq!(
            named_gpus("gpuctl: GPU 1 (GPU-ab-12): 6 GiB held; GPU 0/1 (MIG-cd): x; GPU-ab-12"),
            ["GPU-ab-12", "MIG-cd"]
        );
        assert!(named_gpus("gpuctl: epilog of job 3: NVML is not available").is_empty());
    }

    #[test]
    fn long_reasons_keep_whole_parts_and_count_the_rest() {
        let part = "GPU 1 (GPU-0123456789): 6.0 GiB held, pid 4242 (alice, python3) did not exit";
        let many = [part; 10].join("; ");
        let capped = cap(&many);
        assert!(capped.chars().count() <= REASON_MAX_CHARS, "{capped}");
        assert!(capped.starts_with(part));
        assert!(capped.ends_with("more"), "{capped}");
        assert_eq!(cap(part), part);
    }

    #[test]
    fn process_label_is_short() {
        assert_eq!(
            process_label(7, "alice", "/usr/bin/python3 train.py --x"),
            "pid 7 (alice, python3)"
        );
    }
}
