//! `gpuctl._gpuctl`: the native half of the Python package. Each function maps Python
//! arguments onto gpuctl-core's requests (`InfoRequest`, `KillRequest`, `ClearRequest`, the
//! run file), walks core's road with the GIL released, and hands back plain data (the same
//! JSON documents the CLI prints, a reclaim's result as the named `Reclaimed`) for
//! `gpuctl/__init__.py` to wrap. Errors become the
//! package's exceptions with the CLI's one-line message, chosen by the exit status the CLI
//! would give; a panic is caught here and becomes `gpuctl.Error`, never a crash.

mod facts;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use gpuctl_core::CoreError;
use gpuctl_core::act::{Ended, Signal};
use gpuctl_core::exit::Exit;
use gpuctl_core::info::{InfoRequest, Survey, document};
use gpuctl_core::owner::Owner;
use gpuctl_core::plan::{Disposition, Outcome};
use gpuctl_core::reclaim::{self, ClearRequest, Ending, KillRequest, Session};
use gpuctl_core::runfile::{self, Record, RunError, RunFile};
use gpuctl_core::select::OwnerMatch;
use gpuctl_core::session::{NvmlNeed, SessionOptions, ShareRequest};
use gpuctl_core::settings::Framework;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    gpuctl,
    Error,
    PyException,
    "A gpuctl operation failed (the CLI's exit status 1, or `.exit_code`)."
);
create_exception!(
    gpuctl,
    NvmlError,
    Error,
    "NVML or the NVIDIA driver is unavailable (the CLI's exit status 3)."
);
create_exception!(
    gpuctl,
    UsageError,
    Error,
    "A bad argument: an unknown GPU, a bad selector or size (the CLI's exit status 2)."
);
create_exception!(
    gpuctl,
    RunningError,
    Error,
    "A live run of this name holds its lock (RunGuard)."
);

/// What failed, as the CLI would say it and with the status it would exit with.
struct Failure {
    exit: Exit,
    message: String,
}

impl Failure {
    fn usage(message: impl Into<String>) -> Failure {
        Failure {
            exit: Exit::Usage,
            message: message.into(),
        }
    }

    fn failed(message: impl Into<String>) -> Failure {
        Failure {
            exit: Exit::Failed,
            message: message.into(),
        }
    }
}

impl Failure {
    /// `error` as the CLI says it (`{error:#}`: the error and its causes on one line), with
    /// the status its kind documents.
    fn of(error: &(dyn std::error::Error + 'static)) -> Failure {
        let mut message = error.to_string();
        let mut cause = error.source();
        while let Some(inner) = cause {
            let text = inner.to_string();
            if !message.ends_with(&text) {
                message = format!("{message}: {text}");
            }
            cause = inner.source();
        }
        Failure {
            exit: gpuctl_core::failure::exit_of(error),
            message,
        }
    }
}

impl From<CoreError> for Failure {
    fn from(error: CoreError) -> Failure {
        Failure::of(&error)
    }
}

impl From<Failure> for PyErr {
    fn from(failure: Failure) -> PyErr {
        // One line, escaped as on the CLI's stderr: a message may quote what a user chose.
        let message = gpuctl_core::text::escape(&failure.message.replace('\n', " ")).into_owned();
        let error = match failure.exit {
            Exit::Usage => UsageError::new_err(message),
            Exit::Unavailable => NvmlError::new_err(message),
            _ => Error::new_err(message),
        };
        Python::attach(|py| {
            let _ = error
                .value(py)
                .setattr("exit_code", failure.exit.code() as i32);
        });
        error
    }
}

/// Runs `work` without the GIL; a panic in it becomes `gpuctl.Error`.
fn outside_gil<T: Send>(
    py: Python<'_>,
    work: impl FnOnce() -> Result<T, Failure> + Send,
) -> PyResult<T> {
    let result = py.detach(|| catch_unwind(AssertUnwindSafe(work)));
    match result {
        Ok(done) => done.map_err(PyErr::from),
        Err(panic) => {
            let what = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("unknown cause");
            Err(Failure::failed(format!("internal error in gpuctl (a bug): {what}")).into())
        }
    }
}

fn json<T: serde::Serialize>(value: &T) -> Result<String, Failure> {
    serde_json::to_string(value).map_err(|e| Failure::failed(format!("serializing: {e}")))
}

/// The survey `snapshot()` last used, kept open between calls in this process: NVML is
/// initialised once (on a real driver that takes tens to hundreds of milliseconds), as
/// `gpuctl info --watch` keeps it. Asked for other GPUs, it is opened afresh.
static KEPT_SURVEY: Mutex<Option<KeptSurvey>> = Mutex::new(None);

struct KeptSurvey {
    /// The process that opened it: a forked child opens its own.
    pid: u32,
    gpus: Vec<String>,
    survey: Survey,
}

/// The UUIDs of `n` GPUs or MIG instances that qualify now, as `gpuctl pick` picks them (no
/// lease taken); too few: `gpuctl.Error` with the CLI's exit status 4.
#[pyfunction]
#[pyo3(signature = (n, min_free, max_util))]
fn pick(
    py: Python<'_>,
    n: usize,
    min_free: Option<String>,
    max_util: Option<u32>,
) -> PyResult<Vec<String>> {
    use gpuctl_core::pick::{Criteria, PickRequest, Picker};
    outside_gil(py, || {
        let min_free = min_free
            .map(|text| {
                gpuctl_core::units::parse_amount(&text)
                    .map_err(|why| Failure::usage(format!("min_free: {why}")))
            })
            .transpose()?;
        let session = gpuctl_core::session::Session::open()?;
        let request = PickRequest {
            count: Some(n),
            criteria: Criteria { min_free, max_util },
            ..PickRequest::default()
        };
        let mut picker = Picker::new(&session, request)?;
        match picker.pick(&mut |_| {}) {
            Ok(spots) => Ok(spots.into_iter().filter_map(|s| s.uuid).collect()),
            Err(error) => Err(Failure::of(&error)),
        }
    })
}

/// `gpuctl info --json`'s document, as a JSON string, and each GPU's processes' owners as
/// the CLI's table labels them (None where no owner is known).
#[pyfunction]
#[pyo3(signature = (gpus))]
fn snapshot_json(
    py: Python<'_>,
    gpus: Vec<String>,
) -> PyResult<(String, Vec<Vec<Option<String>>>)> {
    outside_gil(py, || {
        let mut kept = KEPT_SURVEY.lock().unwrap_or_else(|e| e.into_inner());
        let reusable = kept
            .as_ref()
            .is_some_and(|k| k.pid == std::process::id() && k.gpus == gpus);
        if !reusable {
            // Opened in a parent before a fork: the child must not shut the parent's NVML
            // down, so it is forgotten there rather than dropped.
            if let Some(stale) = kept.take()
                && stale.pid != std::process::id()
            {
                std::mem::forget(stale);
            }
            let survey = Survey::open(&InfoRequest {
                gpus: gpus.clone(),
                ..InfoRequest::default()
            })?;
            *kept = Some(KeptSurvey {
                pid: std::process::id(),
                gpus,
                survey,
            });
        }
        let survey = &mut kept.as_mut().expect("kept above").survey;
        let snapshot = match survey.take() {
            Ok(snapshot) => snapshot,
            Err(e) => {
                // A driver that failed may be back next time: opened afresh then.
                *kept = None;
                return Err(e.into());
            }
        };
        let owners = snapshot
            .devices
            .iter()
            .map(|gpu| {
                gpu.processes
                    .iter()
                    .map(|p| match &p.host.owner {
                        Some(owner) if *owner != Owner::None => Some(owner.label()),
                        _ => None,
                    })
                    .collect()
            })
            .collect();
        let document = json(&document(&snapshot, None, survey.watchdog_findings()))?;
        Ok((document, owners))
    })
}

/// What a reclaim did, for `gpuctl.Report` to wrap: the CLI's JSON document, the pids
/// ended, each process not ended with why, the pids a dry run would signal, and whether
/// everything went well.
#[pyclass(module = "gpuctl._gpuctl", frozen, get_all)]
struct Reclaimed {
    document: String,
    ended: Vec<u32>,
    skipped: Vec<(u32, String)>,
    planned: Vec<u32>,
    clean: bool,
}

impl Reclaimed {
    /// The outcomes sorted into ended, skipped (with why) and planned; the document and
    /// whether all went well as the caller found them.
    fn of(document: String, outcomes: &[Outcome], clean: bool) -> Reclaimed {
        let mut reclaimed = Reclaimed {
            document,
            ended: Vec::new(),
            skipped: Vec::new(),
            planned: Vec::new(),
            clean,
        };
        for outcome in outcomes {
            let pid = outcome.target.pid;
            match &outcome.disposition {
                Disposition::WouldSignal { .. } => reclaimed.planned.push(pid),
                Disposition::Skipped { why } => reclaimed.skipped.push((pid, why.clone())),
                Disposition::Signalled {
                    ended: Ended::Exited { .. } | Ended::Killed { .. } | Ended::Gone,
                    ..
                } => reclaimed.ended.push(pid),
                Disposition::Signalled { .. } => reclaimed.skipped.push((pid, outcome.summary())),
            }
        }
        reclaimed
    }
}

/// A `KillRequest` field as the keyword of `gpuctl.kill` that sets it, for core's errors
/// that name fields ("no process selected: give pids=, ...").
fn keyword(field: &str) -> Option<&'static str> {
    Some(match field {
        "pids" => "pids=",
        "gpus" => "gpus=",
        "uids" => "user=",
        "owners" => "owner=",
        "min_bytes" => "min_memory=",
        _ => return None,
    })
}

fn ending(signal: &str) -> Result<Ending, Failure> {
    let signal = Signal::parse(signal).map_err(|e| Failure::usage(format!("signal: {e}")))?;
    Ok(Ending {
        signal,
        ..Ending::default()
    })
}

#[pyfunction]
#[pyo3(signature = (gpus, wait, dry_run))]
fn clear(
    py: Python<'_>,
    gpus: Vec<String>,
    wait: Option<f64>,
    dry_run: bool,
) -> PyResult<Reclaimed> {
    let wait = match wait {
        Some(seconds) if !(seconds.is_finite() && seconds >= 0.0) => {
            return Err(Failure::usage(format!(
                "wait: {seconds} is not a number of seconds (give 0 or more)"
            ))
            .into());
        }
        other => other.map(Duration::from_secs_f64),
    };
    outside_gil(py, || {
        let request = ClearRequest {
            gpus,
            wait,
            dry_run,
            ..ClearRequest::default()
        };
        let cleared = reclaim::clear(&Session::open()?, &request)?;
        let document = json(&cleared.report(&request))?;
        let mut reclaimed = Reclaimed::of(document, &cleared.outcomes, cleared.clean());
        reclaimed
            .skipped
            .extend(cleared.reported.iter().filter_map(|finding| {
                finding
                    .identity
                    .map(|identity| (identity.pid, finding.reason.clone()))
            }));
        Ok(reclaimed)
    })
}

/// `min_memory`: bytes as an int, or a size as the CLI takes it ("512MiB", "40GiB").
fn min_bytes(value: Option<&Bound<'_, PyAny>>) -> Result<Option<u64>, Failure> {
    let Some(value) = value else {
        return Ok(None);
    };
    if let Ok(number) = value.extract::<i128>() {
        return u64::try_from(number).map(Some).map_err(|_| {
            Failure::usage(format!(
                "min_memory: {number} is not a size (give 0 or more bytes, or \"512MiB\")"
            ))
        });
    }
    if let Ok(text) = value.extract::<String>() {
        return gpuctl_core::units::parse_size(&text)
            .map(Some)
            .map_err(|e| Failure::usage(format!("min_memory: {e}")));
    }
    Err(Failure::usage(
        "min_memory: give a number of bytes or a size such as \"512MiB\"",
    ))
}

#[pyfunction]
#[pyo3(signature = (pids, users, owners, gpus, min_memory, signal, dry_run))]
#[allow(clippy::too_many_arguments)]
fn kill(
    py: Python<'_>,
    pids: Vec<i64>,
    users: Vec<String>,
    owners: Vec<String>,
    gpus: Vec<String>,
    min_memory: Option<&Bound<'_, PyAny>>,
    signal: &str,
    dry_run: bool,
) -> PyResult<Reclaimed> {
    let pids = pids
        .into_iter()
        .map(|pid| {
            u32::try_from(pid)
                .ok()
                .filter(|&pid| pid > 0)
                .ok_or_else(|| Failure::usage(format!("pids: {pid} is not a process id")))
        })
        .collect::<Result<Vec<u32>, Failure>>()?;
    let uids = users
        .iter()
        .map(|user| {
            gpuctl_core::host::uid_of(user).map_err(|e| Failure::usage(format!("user: {e}")))
        })
        .collect::<Result<Vec<u32>, Failure>>()?;
    let owners = owners
        .iter()
        .map(|owner| {
            owner
                .parse::<OwnerMatch>()
                .map_err(|e| Failure::usage(format!("owner: {e}")))
        })
        .collect::<Result<Vec<OwnerMatch>, Failure>>()?;
    let request = KillRequest {
        gpus,
        pids,
        uids,
        owners,
        min_bytes: min_bytes(min_memory)?,
        ending: ending(signal)?,
        dry_run,
        ..KillRequest::default()
    };
    outside_gil(py, move || {
        let session = Session::open()?;
        let killed = reclaim::kill(&session, &request).map_err(|error| error.worded(keyword))?;
        let Some(killed) = killed else {
            return Err(Failure::usage("no GPU process matches the selection"));
        };
        let document = json(&killed.report(&request))?;
        let mut reclaimed = Reclaimed::of(document, &killed.outcomes, killed.clean());
        reclaimed
            .skipped
            .extend(killed.refused.iter().map(|r| (r.pid, r.reason.clone())));
        Ok(reclaimed)
    })
}

/// The settings `gpuctl enable` gives a program of `framework`, given its environment:
/// (name, value, kept, why) each; the caller sets those not kept.
#[pyfunction]
fn enable_settings(
    framework: &str,
    environ: std::collections::HashMap<String, String>,
) -> PyResult<Vec<(String, String, bool, String)>> {
    let framework =
        Framework::parse(framework).map_err(|e| Failure::usage(format!("framework: {e}")))?;
    let (env, _) = Session::open_with(&SessionOptions::config_only())
        .and_then(|session| session.allocator_env(&[], &|name| environ.get(name).cloned()))
        .map_err(Failure::from)?;
    Ok(env
        .into_iter()
        .filter(|setting| framework.wants(setting))
        .map(|s| (s.name.to_string(), s.value, s.kept, s.why.to_string()))
        .collect())
}

/// The share policy for this process's user: on GPU `gpu` (a name NVML resolves) or, with
/// none, the user or default entry. (value, where it comes from, a note) or None.
#[pyfunction]
#[pyo3(signature = (gpu))]
fn fraction(
    py: Python<'_>,
    gpu: Option<String>,
) -> PyResult<Option<(f64, String, Option<String>)>> {
    outside_gil(py, move || {
        let session = Session::open_with(&SessionOptions {
            nvml: match gpu {
                Some(_) => NvmlNeed::Required,
                None => NvmlNeed::Never,
            },
            ..SessionOptions::default()
        })?;
        let request = ShareRequest {
            gpus: gpu.iter().cloned().collect(),
            ..ShareRequest::for_caller()
        };
        let found = session
            .shares(&request)?
            .into_iter()
            .next()
            .ok_or_else(|| Failure::usage(format!("gpu: {gpu:?} names no GPU")))?;
        Ok(found.share.map(|s| (s.value, s.describe(), s.note)))
    })
}

impl From<RunError> for Failure {
    fn from(error: RunError) -> Failure {
        Failure::of(&error)
    }
}

/// A run's claim on its name (the trainer's run file and lock): held until released.
#[pyclass(module = "gpuctl._gpuctl")]
struct RunLock {
    name: String,
    path: PathBuf,
    file: Mutex<Option<RunFile>>,
}

#[pymethods]
impl RunLock {
    /// The run file's path.
    #[getter]
    fn path(&self) -> String {
        self.path.display().to_string()
    }

    /// The lock's descriptor (-1 once released), for the fork hook that drops it in forked
    /// children.
    /// What was stepped around to hold the name (another user's directory or lock where
    /// the run file would have been), one escaped line each.
    fn notices(&self) -> Vec<String> {
        self.file
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or_else(Vec::new, |file| {
                file.notices()
                    .iter()
                    .map(|n| gpuctl_core::text::escape(n).into_owned())
                    .collect()
            })
    }

    fn fileno(&self) -> i32 {
        self.file
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or(-1, RunFile::lock_fd)
    }

    /// Records this process and `workers` (pids) on `device`, replacing the file.
    fn record(&self, py: Python<'_>, device: String, workers: Vec<u32>) -> PyResult<()> {
        let name = self.name.clone();
        let file = &self.file;
        outside_gil(py, move || {
            let held = file.lock().unwrap_or_else(|e| e.into_inner());
            let Some(run_file) = held.as_ref() else {
                return Err(Failure::failed(format!(
                    "run {name:?} was already finished"
                )));
            };
            let record = Record {
                version: 1,
                name,
                device,
                processes: runfile::processes(&workers),
            };
            Ok(run_file.record(&record)?)
        })
    }

    /// A clean end: the run file is removed and the lock released.
    fn finish(&self) {
        if let Some(run_file) = self.file.lock().unwrap_or_else(|e| e.into_inner()).take() {
            run_file.finish();
        }
    }

    /// Releases the lock and keeps the run file: the next run treats this one as crashed.
    fn release(&self) {
        drop(self.file.lock().unwrap_or_else(|e| e.into_inner()).take());
    }
}

/// Takes run `name`'s lock (in `dir`, or the trainer's default place) and returns it with
/// the previous run's record as JSON, if that run did not finish.
#[pyfunction]
#[pyo3(signature = (name, dir))]
fn run_acquire(
    py: Python<'_>,
    name: String,
    dir: Option<PathBuf>,
) -> PyResult<(RunLock, Option<String>)> {
    let taken = outside_gil(py, || {
        let path = runfile::location(&name, dir.as_deref())?;
        match runfile::acquire(&name, &path) {
            Ok((file, previous)) => {
                let previous = previous.map(|p| json(&p)).transpose()?;
                // Elsewhere than `path` where another user's lock or directory was there.
                let path = file.path().to_path_buf();
                Ok(Ok((path, file, previous)))
            }
            // In Python's words: RunGuard's `name=`, not the trainer's --run-name.
            Err(busy @ RunError::Busy { .. }) => Ok(Err(
                busy.worded(|field| (field == "name").then_some("name="))
            )),
            Err(other) => Err(other.into()),
        }
    })?;
    match taken {
        Ok((path, file, previous)) => Ok((
            RunLock {
                name,
                path,
                file: Mutex::new(Some(file)),
            },
            previous,
        )),
        Err(busy) => {
            let error = RunningError::new_err(gpuctl_core::text::escape(&busy).into_owned());
            let _ = error
                .value(py)
                .setattr("exit_code", Exit::Failed.code() as i32);
            Err(error)
        }
    }
}

/// Startup cleanup of a crashed previous run (its record as JSON), through core's guarded
/// road: (leftovers found alive, GPU bytes freed, failures, the log lines).
#[pyfunction]
fn run_clean_up(
    py: Python<'_>,
    previous: String,
) -> PyResult<(usize, u64, Vec<String>, Vec<String>)> {
    outside_gil(py, move || {
        let previous: Record = serde_json::from_str(&previous)
            .map_err(|e| Failure::usage(format!("previous run record: {e}")))?;
        let session = Session::open_with(&SessionOptions::config_only())?;
        let mut lines = Vec::new();
        let cleanup = runfile::clean_up(&previous, &session.loaded().protect(), &mut |line| {
            lines.push(line)
        });
        Ok((
            cleanup.leftovers,
            cleanup.freed_bytes,
            cleanup.failures,
            lines,
        ))
    })
}

/// Where run `name`'s file lives, given `dir` (for messages and tests).
#[pyfunction]
#[pyo3(signature = (name, dir))]
fn run_location(name: &str, dir: Option<PathBuf>) -> PyResult<String> {
    Ok(runfile::location(name, dir.as_deref().map(Path::new))
        .map_err(Failure::from)?
        .display()
        .to_string())
}

#[pymodule]
fn _gpuctl(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Error", py.get_type::<Error>())?;
    m.add("NvmlError", py.get_type::<NvmlError>())?;
    m.add("UsageError", py.get_type::<UsageError>())?;
    m.add("RunningError", py.get_type::<RunningError>())?;
    m.add("VERSION", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<RunLock>()?;
    m.add_class::<Reclaimed>()?;
    m.add_function(wrap_pyfunction!(snapshot_json, m)?)?;
    m.add_function(wrap_pyfunction!(pick, m)?)?;
    m.add_function(wrap_pyfunction!(clear, m)?)?;
    m.add_function(wrap_pyfunction!(kill, m)?)?;
    m.add_function(wrap_pyfunction!(enable_settings, m)?)?;
    m.add_function(wrap_pyfunction!(fraction, m)?)?;
    m.add_function(wrap_pyfunction!(run_acquire, m)?)?;
    m.add_function(wrap_pyfunction!(run_clean_up, m)?)?;
    m.add_function(wrap_pyfunction!(run_location, m)?)?;
    facts::register(m)?;
    Ok(())
}
