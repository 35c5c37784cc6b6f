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

use crate::act::{self, Ended, Escalation, Identity, Signal};
use crate::config::Protect;
use crate::host::{ProcView, UserNames};
use crate::nvml::{self, Gpus};
use crate::plan::{self, Action, Guard};
use crate::protect::Protection;
use crate::reclaim::Reclaim;
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
    #[error(
        "run {name:?} is already running{holder} (its lock {lock} is held): wait for it, \
         or give this run another --run-name"
    )]
    Busy {
        name: String,
        holder: String,
        lock: PathBuf,
    },
}

/// A run's claim on its name: the lock, held until this process exits.
pub struct RunFile {
    path: PathBuf,
    lock: File,
    /// What was stepped around to hold the name (another user's directory or lock where the
    /// run file would have been), one line each, for the run to report.
    notices: Vec<String>,
}

/// Where the run file of run `name` lives: in the checkpoint directory when there is one
/// (a resumed run finds it there), else in this user's private run-file directory
/// ([`private_base`]). What had to be stepped around to find it is kept for [`acquire`] to
/// report.
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
    Ok(private_base()?.join(format!("{name}.run.json")))
}

/// What was stepped around on the way to a run file, reported by the next [`acquire`].
static NOTICES: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn notice(text: String) {
    NOTICES.lock().unwrap_or_else(|e| e.into_inner()).push(text);
}

/// This user's private directory for run files: `$XDG_RUNTIME_DIR/gpuctl-trainer`, else
/// under `/run/user/UID` where that is the user's own (logind makes it; nobody else can),
/// else under the temporary directory (`$TMPDIR`, /tmp), where another user may have made
/// the predictable name first: then it is reported and stepped around (see [`private_in`]).
pub fn private_base() -> Result<PathBuf, RunError> {
    let uid = nix::unistd::geteuid().as_raw();
    if let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        let base = PathBuf::from(runtime).join("gpuctl-trainer");
        private_dir(&base)?;
        return Ok(base);
    }
    let run_user = PathBuf::from(format!("/run/user/{uid}"));
    if is_private_of(&run_user, uid) {
        let base = run_user.join("gpuctl-trainer");
        if private_dir(&base).is_ok() {
            return Ok(base);
        }
    }
    let (base, stepped) = private_in(&std::env::temp_dir(), uid)?;
    if let Some(stepped) = stepped {
        notice(stepped);
    }
    Ok(base)
}

/// Whether `dir` is a directory of `uid` that nobody else may write in or read.
fn is_private_of(dir: &Path, uid: u32) -> bool {
    fs::symlink_metadata(dir)
        .is_ok_and(|meta| meta.is_dir() && meta.uid() == uid && meta.mode() & 0o077 == 0)
}

/// `tmp/gpuctl-trainer-UID` where it is `uid`'s private directory (or can be made so).
/// Where another user made that name first, the run files go to a private directory of an
/// unpredictable name, `tmp/gpuctl-trainer-UID.XXXXXX`, made once and found again by the
/// next run by its owner (only `uid`, or root, can own a directory of `uid`): the second
/// value says what was stepped around, for the run to report.
fn private_in(tmp: &Path, uid: u32) -> Result<(PathBuf, Option<String>), RunError> {
    let predictable = tmp.join(format!("gpuctl-trainer-{uid}"));
    let why = match private_dir_of(&predictable, uid) {
        Ok(()) => return Ok((predictable, None)),
        Err(RunError::Unsafe(why)) => why,
        Err(other) => return Err(other),
    };
    let prefix = format!("gpuctl-trainer-{uid}.");
    let found = fs::read_dir(tmp)
        .map_err(|source| RunError::Io {
            path: tmp.to_path_buf(),
            source,
        })?
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().starts_with(&prefix))
        .map(|entry| entry.path())
        .filter(|path| is_private_of(path, uid))
        .min();
    let base = match found {
        Some(base) => base,
        // mkdtemp(3): an unpredictable name, made 0700; kept, the next run finds it by its
        // owner.
        None => nix::unistd::mkdtemp(&tmp.join(format!("{prefix}XXXXXX"))).map_err(|errno| {
            RunError::Io {
                path: tmp.to_path_buf(),
                source: errno.into(),
            }
        })?,
    };
    Ok((
        base.clone(),
        Some(format!(
            "{why}; this run keeps its run file in {} instead",
            base.display()
        )),
    ))
}

/// Creates `dir` with mode 0700, or checks that the existing one is ours and private.
fn private_dir(dir: &Path) -> Result<(), RunError> {
    private_dir_of(dir, nix::unistd::geteuid().as_raw())
}

fn private_dir_of(dir: &Path, uid: u32) -> Result<(), RunError> {
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
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(RunError::Unsafe(format!(
            "{} is not a private directory of uid {uid} (uid {}'s, mode {:o})",
            dir.display(),
            meta.uid(),
            meta.mode() & 0o7777
        )));
    }
    Ok(())
}

/// Takes run `name`'s lock and reads what its previous run left, if anything. A lock, run
/// file or directory another user planted where the run file would be (a shared checkpoint
/// directory, /tmp) is stepped around, never a refusal: the run keeps its file in this
/// user's private directory instead, under a name of its own for that place, where the
/// next run finds it the same way. [`RunFile::notices`] says what was stepped around.
pub fn acquire(name: &str, path: &Path) -> Result<(RunFile, Option<Record>), RunError> {
    acquire_with(name, path, &private_base)
}

/// [`acquire`] with the private directory given (tests).
fn acquire_with(
    name: &str,
    path: &Path,
    private: &dyn Fn() -> Result<PathBuf, RunError>,
) -> Result<(RunFile, Option<Record>), RunError> {
    let mut notices: Vec<String> =
        std::mem::take(&mut *NOTICES.lock().unwrap_or_else(|e| e.into_inner()));
    let (mut file, previous) = match acquire_at(name, path) {
        Ok(taken) => taken,
        Err(Attempt::Failed(error)) => return Err(error),
        Err(Attempt::Planted(why)) => {
            let dir = path.parent().unwrap_or(Path::new("."));
            let elsewhere = private()?.join(format!(
                "{name}.{:016x}.run.json",
                fnv1a(dir.as_os_str().as_encoded_bytes())
            ));
            notices.extend(std::mem::take(
                &mut *NOTICES.lock().unwrap_or_else(|e| e.into_inner()),
            ));
            notices.push(format!(
                "{why}: put there by another user, so this run keeps its run file at {} \
                 instead",
                elsewhere.display()
            ));
            acquire_at(name, &elsewhere).map_err(|attempt| match attempt {
                Attempt::Failed(error) => error,
                Attempt::Planted(why) => RunError::Unsafe(why),
            })?
        }
    };
    file.notices = notices;
    Ok((file, previous))
}

/// Why a place could not hold the run file: another user's doing there (stepped around),
/// or anything else (an error).
enum Attempt {
    Planted(String),
    Failed(RunError),
}

impl From<RunError> for Attempt {
    fn from(error: RunError) -> Attempt {
        Attempt::Failed(error)
    }
}

/// FNV-1a: a stable name for a directory's stepped-around run file.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn acquire_at(name: &str, path: &Path) -> Result<(RunFile, Option<Record>), Attempt> {
    let dir_path = path.parent().filter(|d| !d.as_os_str().is_empty());
    let dir_path = dir_path.unwrap_or(Path::new("."));
    let dir = open_dir(dir_path)?;
    // In a directory others may write in (sticky, or open_dir refused it), what is at the
    // lock's or the run file's name and not this user's was put there by another.
    let shared = dir.metadata().is_ok_and(|meta| meta.mode() & 0o022 != 0);
    let lock_path = path.with_extension("lock");
    let lock = match open_lock(&dir, &lock_path) {
        Ok(lock) => lock,
        Err(RunError::Unsafe(why)) if shared => return Err(Attempt::Planted(why)),
        Err(error) => return Err(error.into()),
    };
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
            }
            .into());
        }
        return Err(RunError::Io {
            path: lock_path,
            source: error,
        }
        .into());
    }
    let previous = match read_record(&dir, path) {
        Ok(previous) => previous,
        Err(e) if shared && e.kind() == io::ErrorKind::PermissionDenied => {
            return Err(Attempt::Planted(format!("{}: {e}", path.display())));
        }
        Err(source) => {
            return Err(RunError::Io {
                path: path.to_path_buf(),
                source,
            }
            .into());
        }
    };
    Ok((
        RunFile {
            path: path.to_path_buf(),
            lock,
            notices: Vec::new(),
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
/// can. A directory another user owns is theirs to fill: it is stepped around ([`acquire`]).
fn open_dir(dir: &Path) -> Result<File, Attempt> {
    let io = |source| {
        Attempt::Failed(RunError::Io {
            path: dir.to_path_buf(),
            source,
        })
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
    if meta.uid() != uid && meta.uid() != 0 {
        return Err(Attempt::Planted(format!(
            "{} is uid {}'s directory, not this user's",
            dir.display(),
            meta.uid()
        )));
    }
    if shared && !sticky {
        return Err(Attempt::Failed(RunError::Unsafe(format!(
            "{}: a run file's directory must be owned by uid {uid} or root, and sticky if \
             group or others can write in it (as /tmp is: chmod +t): refusing to keep the run \
             file and its lock there",
            dir.display()
        ))));
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

    /// Where the run file is (elsewhere than asked where something was stepped around).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What was stepped around to hold the name, one line each.
    pub fn notices(&self) -> &[String] {
        &self.notices
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
        gpus: &gpus,
        guard,
        how: how.clone(),
        verify_for: Duration::from_secs(10),
        dry_run: false,
    }
    .run(&snapshot, targets);
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
            outcome.skipped.clone().unwrap_or_else(|| outcome.summary())
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

/// Ends the leftovers on no GPU by the same road as those on one, with nothing to verify
/// on a GPU: each is a target planned with the guard (so a protected program or user named
/// in the run file is skipped with the guard's reason), then ended by identity.
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
    let mut signalled = Vec::new();
    let mut identities = Vec::new();
    for (outcome, i) in plan::plan(targets, guard, false).into_iter().zip(planned) {
        match (outcome.action, outcome.target.identity()) {
            (Action::Signal, Some(identity)) => {
                signalled.push(i);
                identities.push(identity);
            }
            _ => {
                let why = outcome.skipped.clone().unwrap_or_else(|| outcome.summary());
                said[i] = Some((format!("not signalled ({why})"), false));
            }
        }
    }
    for (i, ended) in signalled.into_iter().zip(act::end_all(&identities, how)) {
        said[i] = Some((describe(&ended), done(&ended)));
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
    use std::os::unix::fs::PermissionsExt;

    fn is_root() -> bool {
        nix::unistd::geteuid().is_root()
    }

    /// A directory everyone may write in, sticky, as /tmp and a team's checkpoint directory.
    fn shared_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o1777)).unwrap();
        dir
    }

    /// Another user (65534) made this user's predictable /tmp directory first (finding 6):
    /// reported and stepped around, and the next run finds the same place.
    #[test]
    fn a_directory_planted_at_the_predictable_name_is_stepped_around_and_found_again() {
        assert!(
            is_root(),
            "this test plants a directory as another user: run it as root"
        );
        let tmp = shared_dir();
        let me = nix::unistd::geteuid().as_raw();
        let planted = tmp.path().join(format!("gpuctl-trainer-{me}"));
        fs::DirBuilder::new().mode(0o700).create(&planted).unwrap();
        std::os::unix::fs::chown(&planted, Some(65534), Some(65534)).unwrap();

        let (base, stepped) = private_in(tmp.path(), me).unwrap();
        assert_ne!(base, planted);
        assert!(base.starts_with(tmp.path()), "{}", base.display());
        assert!(is_private_of(&base, me), "{}", base.display());
        let stepped = stepped.expect("the planted directory is reported");
        assert!(
            stepped.contains("is not a private directory of uid")
                && stepped.contains(&base.display().to_string()),
            "{stepped}"
        );
        // The next run: the same place, found by its owner, not a new one each time.
        let (again, _) = private_in(tmp.path(), me).unwrap();
        assert_eq!(again, base);
        // Another user's directory of the unpredictable form is never taken for ours.
        let decoy = tmp.path().join(format!("gpuctl-trainer-{me}.AAAAAA"));
        fs::DirBuilder::new().mode(0o700).create(&decoy).unwrap();
        std::os::unix::fs::chown(&decoy, Some(65534), Some(65534)).unwrap();
        assert_eq!(private_in(tmp.path(), me).unwrap().0, base);
        // Without anything planted, the predictable name, and nothing to report.
        let clean = shared_dir();
        let (plain, none) = private_in(clean.path(), me).unwrap();
        assert_eq!(plain, clean.path().join(format!("gpuctl-trainer-{me}")));
        assert!(none.is_none());
    }

    /// Another user put a lock (or a link, or a run file) at the run's names in a shared
    /// checkpoint directory first: the run goes on elsewhere and says so, and the next run of
    /// the name finds its file there.
    #[test]
    fn a_lock_or_run_file_planted_in_a_shared_directory_is_stepped_around() {
        assert!(
            is_root(),
            "this test plants files as another user: run it as root"
        );
        let private = tempfile::tempdir().unwrap();
        let base = || Ok(private.path().to_path_buf());
        for plant in ["lock", "link", "record"] {
            let shared = shared_dir();
            let path = shared.path().join("job.run.json");
            match plant {
                "lock" => {
                    let lock = shared.path().join("job.run.lock");
                    fs::write(&lock, "").unwrap();
                    std::os::unix::fs::chown(&lock, Some(65534), Some(65534)).unwrap();
                }
                "link" => {
                    std::os::unix::fs::symlink("/etc/passwd", shared.path().join("job.run.lock"))
                        .unwrap()
                }
                _ => {
                    fs::write(&path, "{}").unwrap();
                    std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
                }
            }
            let (file, previous) = acquire_with("job", &path, &base).unwrap();
            assert!(previous.is_none(), "{plant}");
            assert!(
                file.path().starts_with(private.path()),
                "{plant}: {}",
                file.path().display()
            );
            assert_eq!(file.notices().len(), 1, "{plant}: {:?}", file.notices());
            assert!(
                file.notices()[0].contains("put there by another user"),
                "{plant}: {:?}",
                file.notices()
            );
            // The record is kept where the next run of the name looks.
            let record = Record {
                version: 1,
                name: "job".into(),
                device: "cpu".into(),
                processes: Vec::new(),
            };
            file.record(&record).unwrap();
            let elsewhere = file.path().to_path_buf();
            drop(file);
            let (again, previous) = acquire_with("job", &path, &base).unwrap();
            assert_eq!(again.path(), elsewhere, "{plant}");
            assert_eq!(previous.map(|r| r.name), Some("job".to_string()), "{plant}");
        }
    }

    /// In a directory of this user's own, nobody else could have put anything there: a link
    /// at the lock's name is refused as before.
    #[test]
    fn a_link_in_a_private_directory_is_still_refused() {
        let own = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc/passwd", own.path().join("job.run.lock")).unwrap();
        let error = acquire_with("job", &own.path().join("job.run.json"), &|| {
            panic!("stepped around in a private directory")
        })
        .err()
        .expect("refused");
        assert!(error.to_string().contains("a symbolic link"), "{error}");
    }
}
