//! `gpuctl run`: lease free, healthy GPUs (core's `pick` on the read road), run the command
//! on them as its parent and child subreaper, end what it leaves behind on the acting road
//! (core's `runfile::end_leftovers`), release the leases, and sum up. `gpuctl pick`: the
//! same candidates, printed, with no lease.

use std::io::{self, Write};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use gpuctl_core::host::tree;
use gpuctl_core::lease::{Lease, LeaseDir};
use gpuctl_core::nvml::Place;
use gpuctl_core::pick::{PickError, PickRequest, Picker, Spot};
use gpuctl_core::report::{RUN_SCHEMA, RunGpu, RunSummary};
use gpuctl_core::runfile::{self, Cleanup, Record, Recorded, RunFile};
use gpuctl_core::session::{Reader, Session};
use gpuctl_core::snapshot::SnapshotOptions;
use gpuctl_core::text;
use nix::sys::signal::{SigSet, Signal};

use crate::{Exit, Usage, policy, render};
use gpuctl::cli::{PickArgs, RunArgs};

/// The signals passed on to the command.
const FORWARDED: [Signal; 4] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
];

/// How often the leased GPUs are sampled while the command runs (the first sample sooner,
/// so a short command has one).
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
const FIRST_SAMPLE: Duration = Duration::from_millis(200);

/// How often a named run's file is brought up to date with the command's processes.
const RECORD_EVERY: Duration = Duration::from_secs(2);

pub fn run(args: &RunArgs) -> Result<Exit> {
    let started = Instant::now();
    let program = args.command.first().filter(|p| !p.is_empty());
    let Some(program) = program else {
        return Err(Usage("the command is empty".into()).into());
    };
    // A mistyped command fails now, not after `--wait` held the user for the GPUs; exec
    // still decides in the end (the file may change meanwhile).
    if let Err(error) = executable(program) {
        return Ok(policy::cannot_run(program, &error));
    }
    // Before any thread starts (NVML's workers inherit the mask): these signals wait for
    // the loop below, never ending gpuctl before it has ended what its command left.
    let mut mask = SigSet::empty();
    for signal in FORWARDED.iter().copied().chain([Signal::SIGCHLD]) {
        mask.add(signal);
    }
    mask.thread_block()?;
    // SAFETY: prctl with an integer argument, no pointers.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(anyhow!(
            "cannot become a child subreaper: {}",
            io::Error::last_os_error()
        ));
    }
    let session = Session::open()?;
    let quiet = args.quiet;
    let say = |line: &str| {
        let _ = writeln!(io::stderr().lock(), "gpuctl run: {}", text::escape(line));
    };

    let run_file = match &args.name {
        Some(name) => Some(claim_name(name, &session, &say)?),
        None => None,
    };

    let request = PickRequest {
        gpus: args.gpus.clone(),
        count: args.gpus.is_empty().then(|| args.count.unwrap_or(1)),
        criteria: args.candidates.criteria(),
        wait: args.wait,
    };
    let mut picker = Picker::new(&session, request)?;
    let dir = LeaseDir::open()?;
    let leased = match picker.lease(&dir, &mut |line| {
        if !quiet {
            say(line)
        }
    }) {
        Ok(leased) => leased,
        Err(error) => return too_few(error),
    };
    let (spots, leases): (Vec<Spot>, Vec<Lease>) = leased.into_iter().unzip();

    let mut command = Command::new(program);
    command.args(&args.command[1..]);
    for (name, value) in environment(&spots) {
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
    // The command starts with no signal blocked (gpuctl's own mask is inherited across
    // exec): it must die of a SIGTERM, and its workers too.
    let unblock = mask;
    // SAFETY: between fork and exec only pthread_sigmask runs, which is async-signal-safe
    // and touches no memory shared with the parent.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
            unblock.thread_unblock().map_err(io::Error::from)
        });
    }
    let launched = Instant::now();
    let child = match command.spawn() {
        Ok(child) => child,
        Err(error) => return Ok(policy::cannot_run(program, &error)),
    };
    let child_pid = child.id();
    // Reaped below by waitpid, with every orphan handed to this subreaper: never by std.
    drop(child);
    if let Some(file) = &run_file {
        record(file, args, &spots, child_pid);
    }

    let mut sampler = Sampler::new(&spots);
    let status = watch(
        &mask,
        child_pid,
        &mut sampler,
        &session,
        &run_file,
        args,
        &spots,
    );
    let wall = launched.elapsed();

    // Everything still below gpuctl is a leftover: the command's workers, and whatever left
    // its session (orphans come to this subreaper).
    let left: Vec<Recorded> = tree::descendants(std::process::id())
        .into_iter()
        .map(|stat| Recorded {
            pid: stat.pid,
            start_ticks: stat.starttime,
            role: stat.comm,
        })
        .collect();
    let mut lines = Vec::new();
    let label = args.name.clone().unwrap_or_else(|| "gpuctl run".into());
    let cleanup = if left.is_empty() {
        Cleanup::default()
    } else {
        runfile::end_leftovers(&label, &left, &session.loaded().protect(), &mut |line| {
            lines.push(line)
        })
    };
    reap_all();
    // Said even with --quiet: the GPU may have been shared against the user's will.
    for lease in &leases {
        if let Some(why) = dir.lost(lease) {
            say(&why);
        }
    }
    // Only now may another run have these GPUs.
    drop(leases);
    // Kept where a leftover survived: the next run of the name tries it again.
    if let Some(file) = run_file
        && cleanup.failures.is_empty()
    {
        file.finish();
    }

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
        leftover_lines: lines.clone(),
        leftovers_failed: cleanup.failures.len(),
        needs_reset: cleanup.needs_reset.clone(),
    };
    if !quiet {
        for line in summary_lines(&summary, &spots) {
            say(&line);
        }
    } else {
        for line in &cleanup.failures {
            say(line);
        }
    }
    if let Some(path) = &args.json_summary {
        let mut json = serde_json::to_vec_pretty(&summary)?;
        json.push(b'\n');
        // Replaced whole, never written through a link planted at the path (root's run may
        // write where another user can).
        if let Err(error) = gpuctl_core::files::replace(path, &json, 0o644, false) {
            say(&format!("cannot write {}: {error}", path.display()));
        }
    }
    let _ = io::stderr().flush();
    std::process::exit(status.exit_status());
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
    let path = runfile::location(name, None).map_err(|e| Usage(e.to_string()))?;
    let (file, previous) = runfile::acquire(name, &path).map_err(|error| match error {
        runfile::RunError::BadName(_) => anyhow!(Usage(error.to_string())),
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

/// How the command ended.
#[derive(Debug, Clone, Copy)]
struct Status {
    code: Option<i32>,
    signal: Option<i32>,
}

impl Status {
    /// gpuctl's own exit status: the command's, 128+N for signal N.
    fn exit_status(self) -> i32 {
        match (self.code, self.signal) {
            (Some(code), _) => code,
            (None, Some(signal)) => 128 + signal,
            (None, None) => 1,
        }
    }
}

/// Waits for the command's main process, forwarding signals and sampling the GPUs.
fn watch(
    mask: &SigSet,
    child: u32,
    sampler: &mut Sampler,
    session: &Session,
    run_file: &Option<RunFile>,
    args: &RunArgs,
    spots: &[Spot],
) -> Status {
    let launched = Instant::now();
    let mut next_sample = launched + FIRST_SAMPLE;
    let mut next_record = launched + RECORD_EVERY;
    loop {
        if let Some(status) = reap(child) {
            return status;
        }
        let now = Instant::now();
        if now >= next_sample {
            sampler.sample(session);
            next_sample = now + SAMPLE_EVERY;
        }
        if let Some(file) = run_file
            && now >= next_record
        {
            record(file, args, spots, child);
            next_record = now + RECORD_EVERY;
        }
        let until = next_sample.min(if run_file.is_some() {
            next_record
        } else {
            next_sample
        });
        if let Some(info) = wait_signal(mask, until.saturating_duration_since(Instant::now()))
            && info.si_signo != libc::SIGCHLD
        {
            forward(&info, child);
        }
    }
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

/// One of `mask`'s signals, or none within `timeout`.
fn wait_signal(mask: &SigSet, timeout: Duration) -> Option<libc::siginfo_t> {
    let timeout = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: an all-zero siginfo_t is a valid value for the kernel to fill in.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: the set, siginfo and timespec are valid for the call; the signals are blocked
    // in this thread, as sigtimedwait requires.
    let signal = unsafe { libc::sigtimedwait(mask.as_ref(), &mut info, &timeout) };
    (signal > 0).then_some(info)
}

/// Passes a signal on to the command, unless the terminal sent it: a terminal's Ctrl-C,
/// Ctrl-\ or hangup goes to its whole foreground process group, the command's too.
fn forward(info: &libc::siginfo_t, child: u32) {
    if info.si_code == libc::SI_KERNEL {
        return;
    }
    if let Ok(signal) = Signal::try_from(info.si_signo) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child as i32), signal);
    }
}

/// Reaps every child that has ended (orphans handed to this subreaper included); the
/// command's status once its main process has.
fn reap(child: u32) -> Option<Status> {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    let mut found = None;
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) if pid.as_raw() as u32 == child => {
                found = Some(Status {
                    code: Some(code),
                    signal: None,
                });
            }
            Ok(WaitStatus::Signaled(pid, signal, _)) if pid.as_raw() as u32 == child => {
                found = Some(Status {
                    code: None,
                    signal: Some(signal as i32),
                });
            }
            Ok(WaitStatus::StillAlive) | Err(_) => return found,
            Ok(_) => {}
        }
    }
}

/// Reaps the leftovers ended (they were this subreaper's children).
fn reap_all() {
    let _ = reap(0);
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

/// How `run` and `pick` end when no pick was made: too few places is exit 4 with its one
/// line; anything else is an error with its own exit status.
fn too_few(error: PickError) -> Result<Exit> {
    match error {
        PickError::TooFew(why) => {
            let _ = writeln!(io::stderr().lock(), "gpuctl: {}", text::escape(&why));
            Ok(Exit::NotClean)
        }
        PickError::Core(error) => Err(error.into()),
        PickError::Lease(error) => Err(error.into()),
    }
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
    let spots = match picker.pick(&mut |_| {}) {
        Ok(spots) => spots,
        Err(error) => return too_few(error),
    };
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
