//! `gpuctl run`: lease free, healthy GPUs (core's `pick` on the read road), run the command
//! on them as its parent and child subreaper, end what it leaves behind on the acting road
//! (core's `runfile::end_leftovers`), release the leases, and sum up. `gpuctl pick`: the
//! same candidates, printed, with no lease.

use std::io::{self, Write};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use gpuctl_core::CoreError;
use gpuctl_core::host::tree;
use gpuctl_core::lease::{Lease, LeaseDir};
use gpuctl_core::nvml::Place;
use gpuctl_core::pick::{PickRequest, Picker, Spot};
use gpuctl_core::report::{RUN_SCHEMA, RunGpu, RunSummary};
use gpuctl_core::runfile::{self, Cleanup, Record, Recorded, RunFile};
use gpuctl_core::session::{Reader, Session};
use gpuctl_core::snapshot::SnapshotOptions;
use gpuctl_core::supervise::{Status, Supervisor, Tick};
use gpuctl_core::text;
use nix::sys::signal::Signal;

use crate::{Exit, policy, render};
use gpuctl::cli::{PickArgs, RunArgs};

/// How often the leased GPUs are sampled while the command runs (the first sample sooner,
/// so a short command has one).
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
const FIRST_SAMPLE: Duration = Duration::from_millis(200);

/// How often a named run's file is brought up to date with the command's processes.
const RECORD_EVERY: Duration = Duration::from_secs(2);

/// `gpuctl run`: its status is the command's (128+N for signal N), or a documented one
/// where the command did not run.
pub fn run(args: &RunArgs) -> Result<ExitCode> {
    let started = Instant::now();
    let program = args.command.first().filter(|p| !p.is_empty());
    let Some(program) = program else {
        return Err(CoreError::Usage("the command is empty".into()).into());
    };
    // A mistyped command fails now, not after `--wait` held the user for the GPUs; exec
    // still decides in the end (the file may change meanwhile).
    if let Err(error) = executable(program) {
        return Ok(policy::cannot_run(program, &error).into());
    }
    // Before any thread starts (NVML's workers inherit the signal mask).
    let supervisor = Supervisor::start()?;
    let session = Session::open()?;
    let say = |line: &str| {
        let _ = writeln!(io::stderr().lock(), "gpuctl run: {}", text::escape(line));
    };
    let run_file = match &args.name {
        Some(name) => Some(claim_name(name, &session, &say)?),
        None => None,
    };
    let dir = LeaseDir::open()?;
    let (spots, leases) = lease(args, &session, &dir, &say)?;
    let mut command = command(args, program, &spots, &session)?;
    let launched = Instant::now();
    let child = match supervisor.spawn(&mut command) {
        Ok(child) => child,
        Err(error) => return Ok(policy::cannot_run(program, &error).into()),
    };
    if let Some(file) = &run_file {
        record(file, args, &spots, child);
    }
    let mut sampler = Sampler::new(&spots);
    let status = supervise(
        &supervisor,
        child,
        &mut sampler,
        &session,
        &run_file,
        args,
        &spots,
    );
    let wall = launched.elapsed();

    let (cleanup, lines) = end_leftovers(&supervisor, args, &session);
    release(&dir, leases, run_file, &cleanup, &say);
    let summary = RunSummary {
        schema: RUN_SCHEMA,
        command: args
            .command
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        name: args.name.clone(),
        gpus: sampler.gpus(),
        wall_seconds: wall.as_secs_f64(),
        start_seconds: launched.duration_since(started).as_secs_f64(),
        exit_code: status.code,
        signal: status.signal,
        leftovers: cleanup.leftovers,
        leftover_lines: lines,
        leftovers_failed: cleanup.failures.len(),
        needs_reset: cleanup.needs_reset.clone(),
    };
    sum_up(args, &summary, &spots, &cleanup.failures, &say)?;
    Ok(ExitCode::from(status.exit_status()))
}

/// Ends everything still below gpuctl: the command's workers, and whatever left its
/// session (orphans come to this subreaper). What was done, and the lines saying so.
fn end_leftovers(
    supervisor: &Supervisor,
    args: &RunArgs,
    session: &Session,
) -> (Cleanup, Vec<String>) {
    let left = supervisor.leftovers();
    let mut lines = Vec::new();
    let label = args.name.clone().unwrap_or_else(|| "gpuctl run".into());
    let cleanup = if left.is_empty() {
        Cleanup::default()
    } else {
        runfile::end_leftovers(&label, &left, &session.loaded().protect(), &mut |line| {
            lines.push(line)
        })
    };
    supervisor.reap_all();
    (cleanup, lines)
}

/// Releases the leases (saying, even with --quiet, any lost meanwhile: the GPU may have
/// been shared against the user's will), then the run's name, which is kept where a
/// leftover survived: the next run of the name tries it again.
fn release(
    dir: &LeaseDir,
    leases: Vec<Lease>,
    run_file: Option<RunFile>,
    cleanup: &Cleanup,
    say: &dyn Fn(&str),
) {
    for lease in &leases {
        if let Some(why) = dir.lost(lease) {
            say(&why);
        }
    }
    // Only now may another run have these GPUs.
    drop(leases);
    if let Some(file) = run_file
        && cleanup.failures.is_empty()
    {
        file.finish();
    }
}

/// Picks and leases the GPUs the run asks for (waiting, with `--wait`, saying for what).
fn lease(
    args: &RunArgs,
    session: &Session,
    dir: &LeaseDir,
    say: &dyn Fn(&str),
) -> Result<(Vec<Spot>, Vec<Lease>)> {
    let request = PickRequest {
        gpus: args.gpus.clone(),
        count: args.gpus.is_empty().then(|| args.count.unwrap_or(1)),
        criteria: args.candidates.criteria(),
        wait: args.wait,
    };
    let mut picker = Picker::new(session, request)?;
    let leased = picker.lease(dir, &mut |line| {
        if !args.quiet {
            say(line)
        }
    })?;
    Ok(leased.into_iter().unzip())
}

/// The command as it runs on `spots`: their variables, and `gpuctl enable`'s settings
/// unless `--no-enable`.
fn command(
    args: &RunArgs,
    program: &std::ffi::OsStr,
    spots: &[Spot],
    session: &Session,
) -> Result<Command> {
    let mut command = Command::new(program);
    command.args(&args.command[1..]);
    for (name, value) in environment(spots) {
        command.env(name, value);
    }
    if !args.no_enable {
        let named: Vec<String> = spots.iter().map(|s| s.place.gpu.to_string()).collect();
        let (settings, _) = session.allocator_env(&named, &|name| std::env::var(name).ok())?;
        command.envs(
            settings
                .iter()
                .filter(|s| !s.kept)
                .map(|s| (s.name, &s.value)),
        );
    }
    Ok(command)
}

/// The summary: said (only failures with `--quiet`), and written with `--json-summary`.
fn sum_up(
    args: &RunArgs,
    summary: &RunSummary,
    spots: &[Spot],
    failures: &[String],
    say: &dyn Fn(&str),
) -> Result<()> {
    if !args.quiet {
        for line in summary_lines(summary, spots) {
            say(&line);
        }
    } else {
        for line in failures {
            say(line);
        }
    }
    if let Some(path) = &args.json_summary {
        let mut json = serde_json::to_vec_pretty(summary)?;
        json.push(b'\n');
        // Replaced whole, never written through a link planted at the path (root's run may
        // write where another user can).
        if let Err(error) = gpuctl_core::files::replace(path, &json, 0o644, false) {
            say(&format!("cannot write {}: {error}", path.display()));
        }
    }
    let _ = io::stderr().flush();
    Ok(())
}

/// The command's variables: the leased UUIDs as CUDA numbers them (PCI bus order, as
/// nvidia-smi), and their names for the command's own logs.
fn environment(spots: &[Spot]) -> Vec<(&'static str, String)> {
    let uuids: Vec<&str> = spots.iter().filter_map(|s| s.uuid.as_deref()).collect();
    let names: Vec<String> = spots.iter().map(Spot::name).collect();
    vec![
        ("CUDA_VISIBLE_DEVICES", uuids.join(",")),
        ("CUDA_DEVICE_ORDER", "PCI_BUS_ID".into()),
        ("GPUCTL_RUN_GPUS", names.join(",")),
    ]
}

/// Takes the run name: a live run of it is refused; a crashed one's leftovers are ended
/// first (so its GPUs can be leased).
fn claim_name(name: &str, session: &Session, say: &dyn Fn(&str)) -> Result<RunFile> {
    let path = runfile::location(name, None)?;
    let (file, previous) = runfile::acquire(name, &path).map_err(|error| match error {
        runfile::RunError::BadName(_) => anyhow!(error),
        other => anyhow!(other.worded(|field| (field == "name").then_some("--name"))),
    })?;
    for notice in file.notices() {
        say(notice);
    }
    if let Some(previous) = previous {
        let cleanup = runfile::clean_up(&previous, &session.loaded().protect(), &mut |line| {
            say(&line)
        });
        if !cleanup.failures.is_empty() {
            say(&format!(
                "{} leftover{} of the previous run of {name:?} could not be ended",
                cleanup.failures.len(),
                gpuctl_core::units::plural(cleanup.failures.len(), "s")
            ));
        }
    }
    Ok(file)
}

/// Records gpuctl and the command's processes in the run's file, so that a later run of
/// the name ends them if this one is killed.
fn record(file: &RunFile, args: &RunArgs, spots: &[Spot], child: u32) {
    let mut processes = runfile::processes(&[]);
    for role in &mut processes {
        role.role = "launcher".into();
    }
    processes.extend(
        tree::descendants(std::process::id())
            .into_iter()
            .map(|stat| Recorded {
                pid: stat.pid,
                start_ticks: stat.starttime,
                role: if stat.pid == child {
                    "command".into()
                } else {
                    "worker".into()
                },
            }),
    );
    let record = Record {
        version: 1,
        name: args.name.clone().unwrap_or_default(),
        device: environment(spots)[0].1.clone(),
        processes,
    };
    let _ = file.record(&record);
}

/// Waits for the command's main process (the supervisor forwarding signals), sampling the
/// GPUs and keeping a named run's file up to date.
fn supervise(
    supervisor: &Supervisor,
    child: u32,
    sampler: &mut Sampler,
    session: &Session,
    run_file: &Option<RunFile>,
    args: &RunArgs,
    spots: &[Spot],
) -> Status {
    let mut sample = || sampler.sample(session);
    let mut keep_record = || {
        if let Some(file) = run_file {
            record(file, args, spots, child);
        }
    };
    let mut ticks = [
        Tick {
            first: FIRST_SAMPLE,
            every: SAMPLE_EVERY,
            work: &mut sample,
        },
        Tick {
            first: RECORD_EVERY,
            every: RECORD_EVERY,
            work: &mut keep_record,
        },
    ];
    let ticks = match run_file {
        Some(_) => &mut ticks[..],
        None => &mut ticks[..1],
    };
    supervisor.wait(child, ticks)
}

/// Whether `program` can be executed as exec would find it: a path as it is, a bare name
/// on `PATH`. `NotFound` where nothing is there, `PermissionDenied` where what is there
/// cannot be executed.
fn executable(program: &std::ffi::OsStr) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let runnable = |path: &std::path::Path| -> io::Result<()> {
        let metadata = std::fs::metadata(path)?;
        if metadata.is_dir() {
            return Err(io::Error::from(io::ErrorKind::PermissionDenied));
        }
        nix::unistd::access(path, nix::unistd::AccessFlags::X_OK).map_err(io::Error::from)
    };
    if program.as_bytes().contains(&b'/') {
        return runnable(std::path::Path::new(program));
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    let mut found = io::Error::from(io::ErrorKind::NotFound);
    for dir in std::env::split_paths(&path) {
        match runnable(&dir.join(program)) {
            Ok(()) => return Ok(()),
            Err(error) if error.kind() != io::ErrorKind::NotFound => found = error,
            Err(_) => {}
        }
    }
    Err(found)
}

/// Peak memory and mean utilization of each leased place, sampled while the command runs.
struct Sampler {
    places: Vec<(Spot, Figures)>,
    reader: Option<Reader>,
}

#[derive(Default, Clone, Copy)]
struct Figures {
    peak_used: Option<u64>,
    util_sum: u64,
    util_samples: u64,
    samples: u64,
}

impl Sampler {
    fn new(spots: &[Spot]) -> Sampler {
        let gpus = Place::gpus(&spots.iter().map(|s| s.place).collect::<Vec<_>>());
        Sampler {
            places: spots
                .iter()
                .map(|s| (s.clone(), Figures::default()))
                .collect(),
            reader: Some(Reader::new(SnapshotOptions::sample(gpus)).host_only()),
        }
    }

    fn sample(&mut self, session: &Session) {
        let Some(reader) = &mut self.reader else {
            return;
        };
        let Ok(snapshot) = session.take(reader) else {
            return;
        };
        for (spot, figures) in &mut self.places {
            let Some(gpu) = snapshot.devices.iter().find(|g| g.index == spot.place.gpu) else {
                continue;
            };
            let used = match spot.place.gpu_instance {
                Some(gi) => gpu
                    .mig_devices
                    .iter()
                    .find(|m| m.gpu_instance_id == Some(gi))
                    .and_then(|m| m.memory)
                    .map(|m| m.used_bytes),
                None => gpu.memory.map(|m| m.used_bytes),
            };
            if let Some(used) = used {
                figures.peak_used = Some(figures.peak_used.unwrap_or(0).max(used));
            }
            if let Some(util) = gpu.utilization {
                figures.util_sum += u64::from(util.gpu_pct);
                figures.util_samples += 1;
            }
            figures.samples += 1;
        }
    }

    fn gpus(&self) -> Vec<RunGpu> {
        self.places
            .iter()
            .map(|(spot, figures)| RunGpu {
                index: spot.place.gpu,
                gpu_instance: spot.place.gpu_instance,
                uuid: spot.uuid.clone(),
                peak_used_bytes: figures.peak_used,
                mean_utilization_pct: (figures.util_samples > 0)
                    .then(|| figures.util_sum as f64 / figures.util_samples as f64),
                samples: figures.samples,
            })
            .collect()
    }
}

/// The summary for people: one line for the run, one per GPU, then the leftovers.
fn summary_lines(summary: &RunSummary, spots: &[Spot]) -> Vec<String> {
    let gpus: Vec<String> = spots.iter().map(Spot::describe).collect();
    let ended = match (summary.exit_code, summary.signal) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!(
            "killed by {}",
            Signal::try_from(signal).map_or_else(|_| format!("signal {signal}"), |s| s.to_string())
        ),
        (None, None) => "ended".into(),
    };
    let mut lines = vec![format!(
        "{} for {:.1} s, {ended}",
        gpus.join(", "),
        summary.wall_seconds
    )];
    for (gpu, spot) in summary.gpus.iter().zip(spots) {
        let place = spot.short();
        let peak = gpu
            .peak_used_bytes
            .map_or("not sampled".into(), gpuctl_core::units::bytes);
        let util = gpu
            .mean_utilization_pct
            .map_or("not sampled".into(), |u| format!("{u:.0} %"));
        lines.push(format!(
            "{place}: peak memory {peak}, mean utilization {util}"
        ));
    }
    if summary.leftovers == 0 {
        lines.push("no leftovers".into());
    }
    lines.extend(summary.leftover_lines.iter().cloned());
    lines
}

/// `gpuctl pick`.
pub fn pick(args: &PickArgs) -> Result<Exit> {
    let session = Session::open()?;
    let request = PickRequest {
        gpus: Vec::new(),
        count: Some(args.count),
        criteria: args.candidates.criteria(),
        wait: None,
    };
    let mut picker = Picker::new(&session, request)?;
    let spots = picker.pick(&mut |_| {})?;
    let document = gpuctl_core::report::PickDocument {
        schema: gpuctl_core::report::PICK_SCHEMA,
        gpus: spots
            .iter()
            .map(|s| gpuctl_core::report::Picked {
                index: s.place.gpu,
                gpu_instance: s.place.gpu_instance,
                name: s.name(),
                uuid: s.uuid.clone(),
            })
            .collect(),
    };
    render::emit(args.output.json, &document, || {
        spots
            .iter()
            .map(|s| {
                let shown = if args.index {
                    s.name()
                } else {
                    s.uuid.clone().unwrap_or_default()
                };
                format!("{shown}\n")
            })
            .collect()
    })?;
    Ok(Exit::Ok)
}
