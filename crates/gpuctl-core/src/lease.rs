//! GPU leases: a `flock` on one file per GPU (or MIG instance) UUID in a runtime directory
//! every user shares. The kernel drops a lock when its holder dies, even by SIGKILL, so a
//! lease never outlives its run; the file is named by the UUID, never by an index (which
//! `CUDA_VISIBLE_DEVICES` renumbers). Several leases are taken all or nothing, each without
//! blocking and in UUID order, and all are released when one is missing: two runs asking
//! for two GPUs each can never hold one each and wait for the other.
//!
//! The directory is shared, so what is found in it is checked: it is opened without
//! following links and must be root's or the caller's, sticky where others may write in it
//! (so no user can remove another's lease file); a lease file is opened without following
//! links, without truncating, and must be a regular file with one name. A symbolic link or
//! anything else another user planted at a lease's name is never followed: root removes it
//! (nobody can hold a lease on it), anyone else is told whose it is.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{Mode, fstatat};
use nix::unistd::{UnlinkatFlags, unlinkat};
use serde::{Deserialize, Serialize};

/// The environment variable that names the lease directory (tests, or a site's own place).
pub const DIR_ENV: &str = "GPUCTL_LEASE_DIR";

/// Where leases live unless [`DIR_ENV`] says otherwise: root makes it (mode 1777) on first
/// use, or systemd-tmpfiles at boot.
pub const DEFAULT_DIR: &str = "/run/gpuctl/leases";

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The directory or a lease file cannot be trusted, or was planted by another user.
    #[error("{0}")]
    Unsafe(String),
    /// Said once: the message names the cause itself (`source` would be said again by
    /// a chain-printing caller).
    #[error("{}: {error}", path.display())]
    Io { path: PathBuf, error: io::Error },
}

type Result<T> = std::result::Result<T, LeaseError>;

/// The shared directory of lease files, opened once and checked.
#[derive(Debug)]
pub struct LeaseDir {
    path: PathBuf,
    dir: File,
}

/// A lease held: the GPU is this process's until it is dropped (or the process dies).
#[derive(Debug)]
pub struct Lease {
    pub uuid: String,
    file: File,
}

/// What a lease file says of its holder, written by the holder when it may write there;
/// believed only where the kernel's lock table names the same pid.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Note {
    pub pid: u32,
    /// When the lease was taken, in Unix seconds.
    pub since: u64,
}

/// Who holds a lease, as the kernel's lock table names it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    pub uid: Option<u32>,
    pub user: Option<String>,
    /// Its command line, arguments joined by spaces (`gpuctl run -- python train.py`).
    pub command: Option<String>,
    /// When the lease was taken (Unix seconds): the holder's note, else when the holder
    /// started.
    pub since: Option<u64>,
}

/// The leases not taken, each UUID with why.
pub type Missed = Vec<(String, Taken)>;

/// A lease as readers show it (`info`, `info --json`, `top`): which GPU or MIG instance,
/// and who holds it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Leased {
    pub uuid: String,
    /// The MIG GPU instance leased; `None`: the whole GPU.
    pub gpu_instance: Option<u32>,
    #[serde(flatten)]
    pub holder: Holder,
}

impl Leased {
    /// "leased by bob (pid 42: gpuctl run -- python train.py) since 2026-11-26T12:00:01Z"
    pub fn describe(&self) -> String {
        let mut text = format!("leased by {}", self.holder.describe());
        if let Some(since) = self.holder.since {
            let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(since);
            text.push_str(&format!(" since {}", humantime::format_rfc3339_seconds(at)));
        }
        text
    }
}

impl Holder {
    /// "bob (pid 42: gpuctl run -- python train.py)", the command escaped.
    pub fn describe(&self) -> String {
        let who = self
            .user
            .clone()
            .or_else(|| self.uid.map(|uid| format!("uid {uid}")))
            .unwrap_or_else(|| "someone".into());
        match &self.command {
            Some(command) => format!(
                "{} (pid {}: {})",
                crate::text::escape(&who),
                self.pid,
                crate::text::escape(command)
            ),
            None => format!("{} (pid {})", crate::text::escape(&who), self.pid),
        }
    }
}

/// Whether a lease was taken, and if not, why.
#[derive(Debug)]
pub enum Taken {
    Held(Lease),
    /// Another process holds it.
    Busy,
    /// The lease file cannot be used by this user: why (one line).
    Refused(String),
}

/// A UUID as a file name: NVML's `GPU-…` and `MIG-…` UUIDs are letters, digits and dashes.
fn file_name(uuid: &str) -> Result<String> {
    let valid = !uuid.is_empty()
        && uuid.len() <= 96
        && uuid
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !valid {
        return Err(LeaseError::Unsafe(format!(
            "GPU UUID {:?} cannot name a lease file",
            crate::text::escape(uuid)
        )));
    }
    Ok(format!("{uuid}.lease"))
}

impl LeaseDir {
    /// The lease directory in force: [`DIR_ENV`], else [`DEFAULT_DIR`]; made if missing.
    pub fn open() -> Result<LeaseDir> {
        match std::env::var_os(DIR_ENV).filter(|v| !v.is_empty()) {
            Some(path) => LeaseDir::at(Path::new(&path)),
            None => LeaseDir::at(Path::new(DEFAULT_DIR)),
        }
    }

    /// The lease directory in force where it exists (readers make nothing), checked as
    /// [`LeaseDir::at`] checks it.
    pub fn existing() -> Option<LeaseDir> {
        let path = std::env::var_os(DIR_ENV)
            .filter(|v| !v.is_empty())
            .map_or_else(|| PathBuf::from(DEFAULT_DIR), PathBuf::from);
        std::fs::symlink_metadata(&path)
            .is_ok_and(|meta| meta.is_dir())
            .then(|| LeaseDir::at(&path).ok())
            .flatten()
    }

    /// The lease directory at `path`, made (mode 1777: anyone may take a free GPU's lease)
    /// if missing.
    pub fn at(path: &Path) -> Result<LeaseDir> {
        let io = |error: io::Error| {
            if error.kind() == io::ErrorKind::PermissionDenied {
                return LeaseError::Unsafe(format!(
                    "cannot make or open the lease directory {}: {error}; root makes it on \
                     first use (or systemd-tmpfiles at boot, mode 1777), or name another with \
                     {DIR_ENV}",
                    path.display()
                ));
            }
            LeaseError::Io {
                path: path.to_path_buf(),
                error,
            }
        };
        let made = match std::fs::DirBuilder::new().mode(0o755).create(path) {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // Its parent (/run/gpuctl) is missing: made private to root's programs.
                if let Some(parent) = path.parent() {
                    std::fs::DirBuilder::new()
                        .recursive(true)
                        .mode(0o755)
                        .create(parent)
                        .map_err(io)?;
                }
                match std::fs::DirBuilder::new().mode(0o755).create(path) {
                    Ok(()) => true,
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
                    Err(e) => return Err(io(e)),
                }
            }
            Err(e) => return Err(io(e)),
        };
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let dir = match nix::fcntl::open(path, flags, Mode::empty()) {
            Ok(fd) => File::from(fd),
            Err(Errno::ELOOP | Errno::ENOTDIR) => {
                return Err(LeaseError::Unsafe(format!(
                    "{} is not a directory (a symbolic link or a file is there): not followed; \
                     remove it, or name another with {DIR_ENV}",
                    path.display()
                )));
            }
            Err(errno) => return Err(io(errno.into())),
        };
        if made {
            // Not left to the umask: every user must be able to make a lease file here.
            dir.set_permissions(std::fs::Permissions::from_mode(0o1777))
                .map_err(io)?;
        }
        let meta = dir.metadata().map_err(io)?;
        check_dir(path, meta.uid(), meta.mode())?;
        Ok(LeaseDir {
            path: path.to_path_buf(),
            dir,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Takes `uuid`'s lease without waiting.
    pub fn try_take(&self, uuid: &str) -> Result<Taken> {
        let name = file_name(uuid)?;
        let file = match self.open_file(&name)? {
            Ok(file) => file,
            Err(why) => return Ok(Taken::Refused(why)),
        };
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let error = io::Error::last_os_error();
            if error.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Ok(Taken::Busy);
            }
            return Err(LeaseError::Io {
                path: self.path.join(&name),
                error,
            });
        }
        // The name must still be this file: had its owner (or root) replaced it meanwhile,
        // another run could lock the new one.
        let same = fstatat(&self.dir, name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
            .ok()
            .zip(file.metadata().ok())
            .is_some_and(|(at, held)| at.st_ino == held.ino() && at.st_dev == held.dev());
        if !same {
            return Ok(Taken::Busy);
        }
        let mut lease = Lease {
            uuid: uuid.to_string(),
            file,
        };
        lease.write_note();
        Ok(Taken::Held(lease))
    }

    /// Takes the leases of `count` of `uuids` (all of them for `None`), all or nothing:
    /// tried in UUID order, none waited for, and every one taken released when too few
    /// were. The second value says, for each UUID not taken, why.
    pub fn take(
        &self,
        uuids: &[String],
        count: Option<usize>,
    ) -> Result<(Option<Vec<Lease>>, Missed)> {
        let wanted = count.unwrap_or(uuids.len());
        let mut order: Vec<&String> = uuids.iter().collect();
        order.sort();
        order.dedup();
        let mut held = Vec::new();
        let mut missed = Vec::new();
        for uuid in order {
            if held.len() == wanted {
                break;
            }
            match self.try_take(uuid)? {
                Taken::Held(lease) => held.push(lease),
                other => {
                    missed.push((uuid.clone(), other));
                    if count.is_none() {
                        // Every one is needed: the rest need not be tried.
                        break;
                    }
                }
            }
        }
        if held.len() < wanted {
            drop(held);
            return Ok((None, missed));
        }
        Ok((Some(held), missed))
    }

    /// Who holds `uuid`'s lease, if anyone (the kernel's lock table, /proc/locks).
    pub fn holder(&self, uuid: &str) -> Option<Holder> {
        let locks = std::fs::read_to_string("/proc/locks").ok()?;
        self.holder_in(uuid, &locks)
    }

    /// Who holds each of `uuids`' leases, reading the lock table once.
    pub fn holders(&self, uuids: &[String]) -> Vec<(String, Holder)> {
        let Ok(locks) = std::fs::read_to_string("/proc/locks") else {
            return Vec::new();
        };
        uuids
            .iter()
            .filter_map(|uuid| Some((uuid.clone(), self.holder_in(uuid, &locks)?)))
            .collect()
    }

    fn holder_in(&self, uuid: &str, locks: &str) -> Option<Holder> {
        let name = file_name(uuid).ok()?;
        let stat = fstatat(&self.dir, name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW).ok()?;
        let device = (libc::major(stat.st_dev), libc::minor(stat.st_dev));
        let pid = flock_holder(locks, device, stat.st_ino)?;
        let note = self.read_note(&name);
        Some(describe_holder(pid, note))
    }

    fn read_note(&self, name: &str) -> Option<Note> {
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        let file = File::from(openat(&self.dir, name, flags, Mode::empty()).ok()?);
        if !file.metadata().ok()?.is_file() {
            return None;
        }
        let bytes = crate::sys::procfile::pread_all(&file).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Opens (or makes) the lease file `name`; `Err(why)` where this user cannot use it.
    fn open_file(&self, name: &str) -> Result<std::result::Result<File, String>> {
        let path = self.path.join(name);
        let io = |errno: Errno| LeaseError::Io {
            path: path.clone(),
            error: errno.into(),
        };
        // O_NONBLOCK: a FIFO planted at the name must not hang the open. No O_TRUNC ever.
        let base = OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        for _ in 0..8 {
            // An existing file first, without O_CREAT: protected_regular refuses O_CREAT on
            // another user's file in a sticky directory, even to root.
            // Read-only where it is another user's, or the directory is mounted read-only
            // (a container given the host's /run/gpuctl): a lock needs no write access.
            let opened = match openat(&self.dir, name, base | OFlag::O_RDWR, Mode::empty()) {
                Err(Errno::EACCES | Errno::EPERM | Errno::EROFS) => {
                    openat(&self.dir, name, base | OFlag::O_RDONLY, Mode::empty())
                }
                other => other,
            };
            let file = match opened {
                Ok(fd) => File::from(fd),
                Err(Errno::ENOENT) => {
                    let create = base | OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_EXCL;
                    match openat(&self.dir, name, create, Mode::from_bits_truncate(0o644)) {
                        Ok(fd) => {
                            let file = File::from(fd);
                            // Readable by every user whatever the umask: anyone may lock it.
                            let _ = file.set_permissions(std::fs::Permissions::from_mode(0o644));
                            return Ok(Ok(file));
                        }
                        // Made by another run meanwhile: open that one.
                        Err(Errno::EEXIST) => continue,
                        Err(errno) => return Err(io(errno)),
                    }
                }
                Err(Errno::ELOOP) => return Ok(self.planted(name, "a symbolic link")),
                Err(Errno::EACCES | Errno::EPERM) => {
                    return Ok(Err(format!(
                        "{}: {}, unreadable to this user: ask its owner or root to remove it",
                        path.display(),
                        owner_of(&self.dir, name)
                    )));
                }
                Err(Errno::ENXIO) => return Ok(self.planted(name, "not a regular file")),
                Err(errno) => return Err(io(errno)),
            };
            let meta = file.metadata().map_err(|error| LeaseError::Io {
                path: path.clone(),
                error,
            })?;
            if !meta.is_file() {
                return Ok(self.planted(name, "not a regular file"));
            }
            if meta.nlink() != 1 {
                return Ok(self.planted(name, "a file with another name too (a hard link)"));
            }
            return Ok(Ok(file));
        }
        Ok(Err(format!(
            "{}: replaced again and again while being opened",
            path.display()
        )))
    }

    /// Something that is no lease file at a lease's name: never followed. Root removes it
    /// (nobody can hold a lease on it), then the next try makes the lease file; anyone else
    /// is told whose it is.
    fn planted(&self, name: &str, what: &str) -> std::result::Result<File, String> {
        let path = self.path.join(name);
        let owner = owner_of(&self.dir, name);
        if nix::unistd::geteuid().is_root()
            && unlinkat(&self.dir, name, UnlinkatFlags::NoRemoveDir).is_ok()
        {
            return self
                .open_file(name)
                .ok()
                .and_then(std::result::Result::ok)
                .ok_or_else(|| format!("{}: {what} ({owner}) was removed", path.display()));
        }
        Err(format!(
            "{}: {what} ({owner}), not followed: ask its owner or root to remove it",
            path.display()
        ))
    }
}

/// "uid 1000's" for the entry `name` in `dir`.
fn owner_of(dir: &File, name: &str) -> String {
    match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(stat) => format!("uid {}'s", stat.st_uid),
        Err(_) => "gone".to_string(),
    }
}

/// A lease directory must be root's or this user's, and sticky where others may write in
/// it: in a directory others may write in without the sticky bit, any user could remove
/// another's lease file and lock a new one while the first run holds the old.
fn check_dir(path: &Path, uid: u32, mode: u32) -> Result<()> {
    let me = nix::unistd::geteuid().as_raw();
    if uid != 0 && uid != me {
        return Err(LeaseError::Unsafe(format!(
            "{} is uid {uid}'s directory, not root's or this user's: its leases cannot be \
             trusted; remove it, or name another with {DIR_ENV}",
            path.display()
        )));
    }
    if mode & 0o022 != 0 && mode & libc::S_ISVTX == 0 {
        return Err(LeaseError::Unsafe(format!(
            "{} may be written by others but is not sticky (mode {:o}): anyone could remove \
             a lease; make it mode 1777",
            path.display(),
            mode & 0o7777
        )));
    }
    Ok(())
}

/// The pid holding a `FLOCK` write lock on the file (`device`, `inode`), in /proc/locks
/// lines such as `1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF` (waiters, `->`, are not
/// holders).
fn flock_holder(locks: &str, device: (u32, u32), inode: u64) -> Option<u32> {
    let wanted = format!("{:02x}:{:02x}:{inode}", device.0, device.1);
    locks.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.get(1) == Some(&"->") || fields.get(1) != Some(&"FLOCK") {
            return None;
        }
        (fields.get(5) == Some(&wanted.as_str()))
            .then(|| fields.get(4)?.parse().ok())
            .flatten()
    })
}

/// The holder `pid` as /proc shows it; its note's time where the note is its own.
fn describe_holder(pid: u32, note: Option<Note>) -> Holder {
    // The lock table's pids are this namespace's own: read as local processes.
    let facts =
        crate::host::ProcView::at(PathBuf::from("/proc"), true, crate::host::UserNames::Nss)
            .ok()
            .and_then(|view| view.processes(&[pid]).remove(&pid));
    let now = unix_now();
    let started = facts
        .as_ref()
        .and_then(|f| f.age_seconds)
        .map(|age| now.saturating_sub(age));
    let since = note.filter(|n| n.pid == pid).map(|n| n.since).or(started);
    Holder {
        pid,
        uid: facts.as_ref().and_then(|f| f.uid),
        user: facts.as_ref().and_then(|f| f.user.clone()),
        command: facts.and_then(|f| f.command).filter(|c| !c.is_empty()),
        since,
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Lease {
    /// Writes who holds it and since when, where this user may write the file (otherwise
    /// readers fall back to the holder's start time).
    fn write_note(&mut self) {
        let note = Note {
            pid: std::process::id(),
            since: unix_now(),
        };
        let json = serde_json::to_vec(&note).expect("a note serializes");
        use std::os::unix::fs::FileExt;
        // Opened read-only where it is another user's: then nothing is written.
        if self.file.write_at(&json, 0).is_ok() {
            let _ = self.file.set_len(json.len() as u64);
        }
    }
}

#[cfg(test)]
mod tests;
