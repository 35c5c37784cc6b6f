//! The run file and startup cleanup. A run records its process tree (pid and start time of
//! the trainer and each data-loader worker) in a run file, and holds a lock next to it for
//! its whole life. A new run of the same name takes the lock (so two live runs of one name
//! cannot both start) and reads what the previous run left: a run file still there means
//! that run did not finish cleanly. Its processes that are still alive, by pid *and* start
//! time, are its leftovers; those holding GPU memory are reclaimed through gpuctl-core's
//! reclaim road (the one `gpuctl clear` walks), and NVML must show their memory released.
//! The others are planned with the same guard before they are ended.
//!
//! Kept in core so that every front that starts runs (the Rust trainer, the Python
//! package's `RunGuard`) reads and writes the same file and lock.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::act::{Ended, Escalation, Identity, Signal};
use crate::config::Protect;
use crate::host::{ProcView, UserNames};
use crate::nvml::{self, Gpus};
use crate::plan::{Disposition, Guard};
use crate::protect::Protection;
use crate::reclaim::{Reclaim, Verify};
use crate::select::{self, Criterion, Selector, Target};
use crate::snapshot::{Snapshot, SnapshotOptions};
use nix::errno::Errno;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::Mode;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recorded {
    pub pid: u32,
    pub start_ticks: u64,
    /// `trainer` or `worker`.
    pub role: String,
}

/// The run file's content (documented in the trainer's README section).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    pub version: u32,
    pub name: String,
    pub device: String,
    pub processes: Vec<Recorded>,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("run name {0:?}: use letters, digits, '.', '_' and '-' only")]
    BadName(String),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{0}")]
    Unsafe(String),
    /// A live run of the name holds its lock. Said in core's words ("give this run another
    /// name"); each front words the run's name as its users give it ([`RunError::worded`]).
    #[error("{}", busy(name, holder, lock, "name"))]
    Busy {
        name: String,
        holder: String,
        lock: PathBuf,
    },
}

impl RunError {
    /// This error in a front's own words: `word` names the run's `name` as the front's users
    /// give it (`--run-name` for the trainer, `name=` in Python); `None` keeps core's.
    pub fn worded(&self, word: impl Fn(&str) -> Option<&'static str>) -> String {
        match self {
            RunError::Busy { name, holder, lock } => {
                busy(name, holder, lock, word("name").unwrap_or("name"))
            }
            other => other.to_string(),
        }
    }
}

fn busy(name: &str, holder: &str, lock: &Path, field: &str) -> String {
    format!(
        "run {name:?} is already running{holder} (its lock {} is held): wait for it, or give \
         this run another {field}",
        lock.display()
    )
}

/// A run's claim on its name: the lock, held until this process exits.
pub struct RunFile {
    path: PathBuf,
    lock: File,
}

/// Where the run file of run `name` lives: in the checkpoint directory when there is one
/// (a resumed run finds it there), else in `$XDG_RUNTIME_DIR/gpuctl-trainer/`, else in a
/// private directory under /tmp.
pub fn location(name: &str, checkpoint: Option<&Path>) -> Result<PathBuf, RunError> {
    let valid = !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        && !name.starts_with('.');
    if !valid {
        return Err(RunError::BadName(name.to_string()));
    }
    if let Some(dir) = checkpoint {
        // Not group-writable whatever the umask (002 is common): a directory others can
        // write in must be sticky to keep the run file (see `open_dir`).
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .map_err(|source| RunError::Io {
                path: dir.to_path_buf(),
                source,
            })?;
        return Ok(dir.join(format!("{name}.run.json")));
    }
    let base = match std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        Some(runtime) => PathBuf::from(runtime).join("gpuctl-trainer"),
        None => PathBuf::from(format!("/tmp/gpuctl-trainer-{}", nix::unistd::getuid())),
    };
    private_dir(&base)?;
    Ok(base.join(format!("{name}.run.json")))
}

/// Creates `dir` with mode 0700, or checks that the existing one is ours and private (under
/// /tmp another user could have made it first).
fn private_dir(dir: &Path) -> Result<(), RunError> {
    let io = |source| RunError::Io {
        path: dir.to_path_buf(),
        source,
    };
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io(e)),
    }
    let meta = fs::symlink_metadata(dir).map_err(io)?;
    let uid = nix::unistd::getuid().as_raw();
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(RunError::Unsafe(format!(
            "{} is not a private directory of uid {uid}: refusing to keep the run file there",
            dir.display()
        )));
    }
    Ok(())
}

/// Takes run `name`'s lock and reads what its previous run left, if anything.
pub fn acquire(name: &str, path: &Path) -> Result<(RunFile, Option<Record>), RunError> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    let dir = open_dir(dir.unwrap_or(Path::new(".")))?;
    let lock_path = path.with_extension("lock");
    let lock = open_lock(&dir, &lock_path)?;
    // SAFETY: flock on a descriptor this function owns.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let error = io::Error::last_os_error();
        if error.raw_os_error() == Some(libc::EWOULDBLOCK) {
            let holder = read_record(&dir, path)
                .ok()
                .flatten()
                .and_then(|r| r.processes.into_iter().find(|p| p.role == "trainer"))
                .map_or(String::new(), |p| format!(" as pid {}", p.pid));
            return Err(RunError::Busy {
                name: name.to_string(),
                holder,
                lock: lock_path,
            });
        }
        return Err(RunError::Io {
            path: lock_path,
            source: error,
        });
    }
    let previous = read_record(&dir, path).map_err(|source| RunError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Ok((
        RunFile {
            path: path.to_path_buf(),
            lock,
        },
        previous,
    ))
}

/// The directory of the run file and its lock, opened once: both are opened relative to
/// it, so they are found where it was checked. It must be this user's or root's, and sticky
/// where group or others may write in it (a checkpoint directory shared by a team, as /tmp
/// is): without the sticky bit another user could rename this run's lock away while it runs
/// (and start a second run of the name, which would end the first as its leftovers), or put
/// their file at the run file's name; with it, only a file's owner and the directory's
/// can. A directory another user owns is refused for the same reason, sticky or not.
fn open_dir(dir: &Path) -> Result<File, RunError> {
    let io = |source| RunError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir)
        .map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    let uid = nix::unistd::geteuid().as_raw();
    let shared = meta.mode() & 0o022 != 0;
    let sticky = meta.mode() & libc::S_ISVTX != 0;
    if (meta.uid() != uid && meta.uid() != 0) || (shared && !sticky) {
        return Err(RunError::Unsafe(format!(
            "{}: a run file's directory must be owned by uid {uid} or root, and sticky if \
             group or others can write in it (as /tmp is: chmod +t): refusing to keep the run \
             file and its lock there",
            dir.display()
        )));
    }
    Ok(file)
}

/// Opens, or creates, the lock in `dir`. Never through a link (a planted one would have this
/// process, root perhaps, create or open any file it can): opened with `O_NOFOLLOW`, created
/// with `O_EXCL`, and the opened file checked to be this user's own.
fn open_lock(dir: &File, path: &Path) -> Result<File, RunError> {
    let name = path.file_name().unwrap_or_default();
    let io = |source: io::Error| RunError::Io {
        path: path.to_path_buf(),
        source,
    };
    let flags = OFlag::O_RDWR | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut opened = Err(Errno::ENOENT);
    // Bounded: another process removing and creating it in a loop gets a refusal, not a hang.
    for _ in 0..3 {
        opened = match openat(dir, name, flags, Mode::empty()) {
            Err(Errno::ENOENT) => openat(
                dir,
                name,
                flags | OFlag::O_CREAT | OFlag::O_EXCL,
                Mode::from_bits_truncate(0o600),
            ),
            other => other,
        };
        // EEXIST: created by another run since it was found missing: open that one.
        if !matches!(opened, Err(Errno::EEXIST)) {
            break;
        }
    }
    let lock = match opened {
        Ok(fd) => File::from(fd),
        Err(Errno::ELOOP) => {
            return Err(RunError::Unsafe(format!(
                "{}: a symbolic link, not a lock file: refusing to follow it (remove it if \
                 this run's name is yours)",
                path.display()
            )));
        }
        Err(errno) => return Err(io(errno.into())),
    };
    let meta = lock.metadata().map_err(io)?;
    let uid = nix::unistd::geteuid().as_raw();
    if !meta.is_file() || meta.uid() != uid || meta.nlink() != 1 {
        return Err(RunError::Unsafe(format!(
            "{}: not a regular file of uid {uid} with one name: refusing to use it as the \
             run's lock (remove it if this run's name is yours)",
            path.display()
        )));
    }
    Ok(lock)
}

/// Reads the run file in `dir`, if there is one. It decides what is signalled, so it must be
/// this user's, writable by no one else and under no other name (another run's record
/// linked here is not this run's): checked on the descriptor it is read from, as a check by
/// path and a read by path may meet two files (a link swapped in between, or a file that
/// was missing when checked), and opened without following a link.
fn read_record(dir: &File, path: &Path) -> io::Result<Option<Record>> {
    let uid = nix::unistd::geteuid().as_raw();
    let refused = |what: &str| {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{what}not a regular file of uid {uid} writable only by it and with one name: \
                 refusing to act on it (remove it if this run's name is yours)"
            ),
        )
    };
    let name = path.file_name().unwrap_or_default();
    // O_NONBLOCK: a FIFO planted at the name must not hang the open; it is refused below.
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    let mut file = match openat(dir, name, flags, Mode::empty()) {
        Ok(fd) => File::from(fd),
        Err(Errno::ENOENT) => return Ok(None),
        Err(Errno::ELOOP) => return Err(refused("a symbolic link, ")),
        Err(errno) => return Err(errno.into()),
    };
    let meta = file.metadata()?;
    if !meta.is_file() || meta.uid() != uid || meta.mode() & 0o022 != 0 || meta.nlink() != 1 {
        return Err(refused(""));
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

impl RunFile {
    /// Records this run's processes (replacing the file atomically).
    pub fn record(&self, record: &Record) -> Result<(), RunError> {
        let json = serde_json::to_vec_pretty(record).expect("the record serializes");
        crate::files::replace(&self.path, &json, 0o644, true).map_err(|source| RunError::Io {
            path: self.path.clone(),
            source,
        })
    }

    /// The lock's descriptor. A front whose workers are forked without exec (Python's
    /// DataLoader) drops it in each child: a lock shared with workers that outlive a
    /// crashed run would keep the name taken by its own leftovers.
    pub fn lock_fd(&self) -> std::os::fd::RawFd {
        self.lock.as_raw_fd()
    }

    /// A clean end: nothing is left for the next run to clean up.
    pub fn finish(self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// This process and the given children, as the run file records them.
pub fn processes(workers: &[u32]) -> Vec<Recorded> {
    let observe = |pid: u32, role: &str| {
        Identity::observe(pid).ok().map(|id| Recorded {
            pid,
            start_ticks: id.start_ticks,
            role: role.to_string(),
        })
    };
    std::iter::once(observe(std::process::id(), "trainer"))
        .chain(workers.iter().map(|&pid| observe(pid, "worker")))
        .flatten()
        .collect()
}

/// What startup cleanup did.
#[derive(Debug, Default)]
pub struct Cleanup {
    /// Leftovers found alive.
    pub leftovers: usize,
    /// GPU memory the reclaimed leftovers held, as NVML reported it.
    pub freed_bytes: u64,
    /// Leftovers that could not be ended or whose memory was not released.
    pub failures: Vec<String>,
}

/// Ends the previous run's processes that are still alive, each planned with the guard of
/// `gpuctl clear`: through the reclaim road for those NVML lists on a GPU (signal, then
/// verify the memory came back), and by the same plan and TERM-then-KILL for the rest.
/// `log` gets one line per thing done.
pub fn clean_up(previous: &Record, protect: &Protect, log: &mut dyn FnMut(String)) -> Cleanup {
    let mut cleanup = Cleanup::default();
    let own = std::process::id();
    let alive: Vec<&Recorded> = previous
        .processes
        .iter()
        .filter(|p| p.pid != own)
        .filter(|p| Identity::observe(p.pid).is_ok_and(|id| id.start_ticks == p.start_ticks))
        .filter(|p| !finished(p.pid))
        .collect();
    // Only this user's processes: a run file names pids, and even root acts only on its own
    // (a forged run file cannot point it at anyone else's).
    let uid = nix::unistd::geteuid().as_raw();
    let (alive, foreign): (Vec<&Recorded>, Vec<&Recorded>) = alive
        .into_iter()
        .partition(|p| fs::metadata(format!("/proc/{}", p.pid)).is_ok_and(|m| m.uid() == uid));
    for p in foreign {
        let line = format!(
            "pid {} ({}) is listed in the run file but belongs to another user: not signalled",
            p.pid, p.role
        );
        cleanup.failures.push(line.clone());
        log(line);
    }
    cleanup.leftovers = alive.len();
    if alive.is_empty() {
        if cleanup.failures.is_empty() {
            log(format!(
                "the previous run of {:?} did not finish cleanly; none of its {} processes is \
                 left",
                previous.name,
                previous.processes.len()
            ));
        }
        return cleanup;
    }
    log(format!(
        "the previous run of {:?} crashed and left {} process{} alive: {}",
        previous.name,
        alive.len(),
        if alive.len() == 1 { "" } else { "es" },
        alive
            .iter()
            .map(|p| format!("pid {} ({})", p.pid, p.role))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let how = Escalation::then_kill(Signal::TERM, Duration::from_secs(5));
    // The same guard as `gpuctl clear`: the built-in and configured protected commands and
    // users are never signalled, nor another user's process unless this is root.
    let guard = Guard::for_this_process(Protection::configured(protect));
    let on_gpu = reclaim_on_gpu(&previous.name, &alive, &guard, &how, &mut cleanup, log);
    // The rest hold no GPU memory (or NVML could not tell): ended all the same, as they are
    // this run name's own processes, identified by pid and start time.
    let rest: Vec<&Recorded> = alive
        .iter()
        .copied()
        .filter(|p| !on_gpu.contains(&p.pid))
        .collect();
    end_off_gpu(&previous.name, &rest, &guard, &how, &mut cleanup, log);
    cleanup
}

/// Reclaims the leftovers NVML lists on a GPU through the reclaim road (plan with the
/// guard, signal, verify the memory came back); returns their pids.
fn reclaim_on_gpu(
    run: &str,
    alive: &[&Recorded],
    guard: &Guard,
    how: &Escalation,
    cleanup: &mut Cleanup,
    log: &mut dyn FnMut(String),
) -> Vec<u32> {
    // Under the CLI's deadline (GPUCTL_NVML_TIMEOUT, else 10 s): a hung driver must not hang
    // a training script's start.
    let gpus = match nvml::timeout(None, None).and_then(Gpus::open_within) {
        Ok(gpus) => gpus,
        Err(e) => {
            log(format!(
                "{e}; the leftovers are ended without checking their GPU memory"
            ));
            return Vec::new();
        }
    };
    let snapshot = match Snapshot::take(&gpus, &SnapshotOptions::info(None)) {
        Ok(snapshot) => snapshot,
        Err(e) => {
            log(format!(
                "NVML could not list GPU processes ({e}); the leftovers are ended without \
                 checking their GPU memory"
            ));
            return Vec::new();
        }
    };
    // The same processes, not new ones that reused their pids.
    let selector = Selector::by(Criterion::Processes(
        alive
            .iter()
            .map(|p| Identity::new(p.pid, p.start_ticks))
            .collect(),
    ));
    let (mut targets, _not_on_gpu) = select::select(&snapshot, &[], &selector);
    for target in &mut targets {
        target.reasons = vec![format!("leftover of run {run:?}")];
    }
    let on_gpu = targets.iter().map(|t| t.pid).collect();
    let outcomes = Reclaim {
        guard,
        how: how.clone(),
        verify: Verify::Release {
            gpus: &gpus,
            before: &snapshot,
            within: Duration::from_secs(10),
        },
        dry_run: false,
    }
    .run(targets);
    for outcome in outcomes {
        let held = outcome.target.used_bytes.unwrap_or(0);
        let line = format!(
            "pid {} held {} on GPU {}: {}",
            outcome.target.pid,
            crate::units::bytes_to(held, 2),
            outcome
                .target
                .gpus
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(","),
            outcome
                .skipped()
                .map_or_else(|| outcome.summary(), str::to_string)
        );
        if outcome.succeeded() {
            cleanup.freed_bytes += held;
        } else {
            cleanup.failures.push(line.clone());
        }
        log(line);
    }
    on_gpu
}

/// Ends the leftovers on no GPU by the same road as those on one, with nothing on a GPU to
/// verify ([`Verify::Unverified`]): each is a target planned with the guard (so a protected
/// program or user named in the run file is skipped with the guard's reason), then ended by
/// identity.
fn end_off_gpu(
    run: &str,
    rest: &[&Recorded],
    guard: &Guard,
    how: &Escalation,
    cleanup: &mut Cleanup,
    log: &mut dyn FnMut(String),
) {
    if rest.is_empty() {
        return;
    }
    // These pids are the ones the previous run recorded in this PID namespace, not NVML's
    // host pids, so they are read here whatever namespace this is.
    let view = ProcView::at(PathBuf::from("/proc"), true, UserNames::Nss);
    let pids: Vec<u32> = rest.iter().map(|p| p.pid).collect();
    let mut facts = view
        .as_ref()
        .map(|view| view.processes(&pids))
        .unwrap_or_default();
    // What became of each, in run-file order: what to say, and whether it is done.
    let mut said: Vec<Option<(String, bool)>> = vec![None; rest.len()];
    let mut targets = Vec::new();
    let mut planned = Vec::new();
    for (i, p) in rest.iter().enumerate() {
        let identity = Identity::new(p.pid, p.start_ticks);
        match facts
            .remove(&p.pid)
            .and_then(|host| Target::off_gpu(identity, host))
        {
            Some(mut target) => {
                target.reasons = vec![format!("leftover of run {run:?}")];
                targets.push(target);
                planned.push(i);
            }
            None => {
                // Its facts are not of the recorded process: it is gone or its pid reused
                // since it was found alive (nothing is sent), or /proc could not be read.
                let ended = match Identity::observe(p.pid) {
                    Err(_) => Ended::Gone,
                    Ok(now) if now.start_ticks != p.start_ticks => Ended::Reused {
                        now_start_ticks: now.start_ticks,
                    },
                    Ok(_) => Ended::Failed {
                        error: match &view {
                            Err(e) => format!("/proc could not be read ({e}): not signalled"),
                            Ok(_) => "its /proc facts could not be read: not signalled".into(),
                        },
                    },
                };
                said[i] = Some((describe(&ended), done(&ended)));
            }
        }
    }
    let outcomes = Reclaim {
        guard,
        how: how.clone(),
        verify: Verify::Unverified,
        dry_run: false,
    }
    .run(targets);
    for (outcome, i) in outcomes.into_iter().zip(planned) {
        said[i] = Some(match &outcome.disposition {
            Disposition::Signalled { ended, .. } => (describe(ended), done(ended)),
            Disposition::Skipped { why } => (format!("not signalled ({why})"), false),
            // Not a dry run: a plan carried out signals all it would.
            Disposition::WouldSignal { .. } => ("not signalled".into(), false),
        });
    }
    for (recorded, said) in rest.iter().zip(said) {
        let (what, done) = said.expect("each leftover is planned, or said why not");
        let line = format!(
            "pid {} ({}), not on a GPU: {what}",
            recorded.pid, recorded.role
        );
        if !done {
            cleanup.failures.push(line.clone());
        }
        log(line);
    }
}

/// Whether a leftover is no longer running: ended, or not the run's process any more.
fn done(ended: &Ended) -> bool {
    matches!(
        ended,
        Ended::Exited { .. } | Ended::Killed { .. } | Ended::Gone | Ended::Reused { .. }
    )
}

/// A zombie whose threads have all exited: it holds nothing, and only its parent can reap
/// it. A zombie leader with live threads (which can still hold a CUDA context) is not.
fn finished(pid: u32) -> bool {
    let Ok(status) = fs::read_to_string(format!("/proc/{pid}/status")) else {
        return true;
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .map(str::trim)
            .unwrap_or("")
            .to_string()
    };
    field("State:").starts_with('Z') && field("Threads:").parse::<u32>().unwrap_or(0) <= 1
}

fn describe(ended: &Ended) -> String {
    match ended {
        Ended::Exited { signal, after_ms } => format!("ended by {signal} after {after_ms} ms"),
        Ended::Killed { after_ms } => format!("killed (SIGKILL) after {after_ms} ms"),
        Ended::Gone => "already gone".into(),
        Ended::Reused { .. } => "its pid now names another process: not signalled".into(),
        Ended::StillAlive { signals } => format!("still running after {}", signals.join(", ")),
        Ended::Failed { error } => format!("failed: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_run_is_said_in_cores_words_or_the_fronts() {
        let busy = RunError::Busy {
            name: "llama".into(),
            holder: " as pid 42".into(),
            lock: PathBuf::from("/run/llama.run.lock"),
        };
        assert_eq!(
            busy.to_string(),
            "run \"llama\" is already running as pid 42 (its lock /run/llama.run.lock is \
             held): wait for it, or give this run another name"
        );
        let flag = |field: &str| (field == "name").then_some("--run-name");
        assert!(
            busy.worded(flag)
                .ends_with("or give this run another --run-name")
        );
        let bad = RunError::BadName("../x".into());
        assert_eq!(bad.worded(flag), bad.to_string());
    }
}
