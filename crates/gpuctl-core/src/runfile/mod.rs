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

use nix::errno::Errno;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::Mode;
use serde::{Deserialize, Serialize};

use crate::exit::Exit;

mod cleanup;
pub use cleanup::{Cleanup, clean_up, end_leftovers, processes};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recorded {
    pub pid: u32,
    pub start_ticks: u64,
    /// `trainer` or `worker`.
    pub role: String,
}

/// The run file's content (documented in docs/guide/trainer.md).
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
    /// The documented exit status: a bad name is bad input; anything else a failure.
    pub fn exit(&self) -> Exit {
        match self {
            RunError::BadName(_) => Exit::Usage,
            _ => Exit::Failed,
        }
    }

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

#[cfg(test)]
mod tests;
