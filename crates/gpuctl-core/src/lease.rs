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
//! anything else another user planted at a lease's name (a directory, FIFO, socket, device,
//! a file with another name) is never opened: root removes it (nobody can hold a lease on
//! it), anyone else is told whose it is, and the pick goes on with the other GPUs.
//!
//! Who holds a lease is read without the kernel's lock table (/proc/locks costs every
//! reader milliseconds and stalls every file lock on the machine while it is read): a reader
//! asks the lease file itself whether it is locked (a shared lock tried without waiting and
//! given back at once), and names the holder from the note the holder wrote into it, a few
//! bytes read bounded, believed only where the process it names is alive with the start time
//! it names and is the file's owner (or the file is root's, so root wrote it). A pid read back
//! later, or a note another user wrote, never names anyone.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

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
    /// Shared with each lease taken, which removes its file from it on release.
    dir: Arc<File>,
}

/// A lease held: the GPU is this process's until it is dropped (or the process dies).
#[derive(Debug)]
pub struct Lease {
    pub uuid: String,
    file: File,
    dir: Arc<File>,
    /// Whether this process wrote its note into the file (cleared again on release).
    noted: bool,
}

/// The most of a lease file a reader reads: a note is some 60 bytes; anything larger was not
/// written by gpuctl, and a sparse terabyte must cost nothing.
const NOTE_MAX: u64 = 4096;

/// How often a lease found locked is tried again before it counts as busy: a reader's probe
/// holds a shared lock for microseconds, which must not turn a run away.
const BUSY_TRIES: u32 = 4;

/// What a lease file says of its holder, written by the holder when it may write there;
/// believed only where the process it names lives with that start time and owns the file
/// (or the file is root's).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Note {
    pub pid: u32,
    /// The holder's start time (clock ticks after boot): with the pid, its identity.
    pub start_ticks: u64,
    /// When the lease was taken, in Unix seconds.
    pub since: u64,
}

/// Who holds a lease, from a note the reader can believe; every field `None` where the lease
/// is held but no such note names its holder.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, Default)]
pub struct Holder {
    pub pid: Option<u32>,
    pub uid: Option<u32>,
    pub user: Option<String>,
    /// Its command line, arguments joined by spaces (`gpuctl run -- python train.py`).
    pub command: Option<String>,
    /// When the lease was taken (Unix seconds), as the holder's note says.
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
        let Some(pid) = self.pid else {
            return "a process that left no note gpuctl can believe".into();
        };
        let who = self
            .user
            .clone()
            .or_else(|| self.uid.map(|uid| format!("uid {uid}")))
            .unwrap_or_else(|| "someone".into());
        match &self.command {
            Some(command) => format!(
                "{} (pid {}: {})",
                crate::text::escape(&who),
                pid,
                crate::text::escape(command)
            ),
            None => format!("{} (pid {pid})", crate::text::escape(&who)),
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
            dir: Arc::new(dir),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Takes `uuid`'s lease without waiting.
    pub fn try_take(&self, uuid: &str) -> Result<Taken> {
        let name = file_name(uuid)?;
        // Again where the file locked is no longer at its name: its holder removed it as it
        // gave the lease back (or its owner replaced it), so the lease is free in a new file.
        for _ in 0..8 {
            let file = match self.open_file(&name) {
                Ok(file) => file,
                Err(why) => return Ok(Taken::Refused(why)),
            };
            match lock_exclusive(&file) {
                Ok(true) => {}
                Ok(false) => return Ok(Taken::Busy),
                Err(error) => {
                    return Ok(Taken::Refused(format!(
                        "{}: cannot be locked: {error}",
                        self.path.join(&name).display()
                    )));
                }
            }
            if self.names(&name, &file) {
                return Ok(Taken::Held(self.held(uuid, file)));
            }
        }
        Ok(Taken::Busy)
    }

    /// Whether `name` is still the file `file` is.
    fn names(&self, name: &str, file: &File) -> bool {
        fstatat(&*self.dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
            .ok()
            .zip(file.metadata().ok())
            .is_some_and(|(at, held)| at.st_ino == held.ino() && at.st_dev == held.dev())
    }

    fn held(&self, uuid: &str, file: File) -> Lease {
        let mut lease = Lease {
            uuid: uuid.to_string(),
            file,
            dir: self.dir.clone(),
            noted: false,
        };
        lease.write_note();
        lease
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

    /// Why `lease` is no longer the file at its name, if it is not: its file was removed or
    /// replaced while held (its owner may, in a shared directory), so another run may have
    /// leased the same GPU meanwhile. `None` while the lease is what its name holds.
    pub fn lost(&self, lease: &Lease) -> Option<String> {
        let name = file_name(&lease.uuid).ok()?;
        let held = lease.file.metadata().ok()?;
        let at = fstatat(&*self.dir, name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW);
        if at.is_ok_and(|at| at.st_ino == held.ino() && at.st_dev == held.dev()) {
            return None;
        }
        Some(format!(
            "the lease file {} (uid {}'s) was removed or replaced while this run held it: \
             another run may have had {} meanwhile; only root's or your own lease files \
             cannot be removed by others",
            self.path.join(&name).display(),
            held.uid(),
            lease.uuid
        ))
    }

    /// Who holds `uuid`'s lease, if anyone: asked of the lease file itself, never of the
    /// machine's lock table.
    pub fn holder(&self, uuid: &str) -> Option<Holder> {
        let name = file_name(uuid).ok()?;
        let file = self.open_existing(&name, OFlag::O_RDONLY).ok()?;
        if !locked_by_another(&file) {
            return None;
        }
        let owner = file.metadata().ok()?.uid();
        Some(describe_holder(read_note(&file), owner))
    }

    /// Who holds each of `uuids`' leases.
    pub fn holders(&self, uuids: &[String]) -> Vec<(String, Holder)> {
        uuids
            .iter()
            .filter_map(|uuid| Some((uuid.clone(), self.holder(uuid)?)))
            .collect()
    }

    /// Opens the regular file at `name`, looked at before it is opened (a FIFO, socket or
    /// device is never opened) and after (it must be the file looked at, with one name).
    /// `Err(None)`: nothing is there; `Err(Some(why))`: something that is no lease file.
    fn open_existing(
        &self,
        name: &str,
        access: OFlag,
    ) -> std::result::Result<File, Option<Planted>> {
        let before = match fstatat(&*self.dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(stat) => stat,
            Err(Errno::ENOENT) => return Err(None),
            Err(errno) => return Err(Some(Planted::Unusable(errno))),
        };
        if let Some(what) = not_a_lease_file(before.st_mode, before.st_nlink as u64) {
            return Err(Some(Planted::Entry(what)));
        }
        // O_NONBLOCK: were a FIFO swapped in meanwhile, the open must not hang. No O_TRUNC.
        let flags = access | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        let file = match openat(&*self.dir, name, flags, Mode::empty()) {
            Ok(fd) => File::from(fd),
            Err(Errno::ENOENT) => return Err(None),
            Err(Errno::ELOOP) => return Err(Some(Planted::Entry("a symbolic link"))),
            Err(errno) => return Err(Some(Planted::Unusable(errno))),
        };
        let meta = file.metadata().map_err(|e| {
            Some(Planted::Unusable(Errno::from_raw(
                e.raw_os_error().unwrap_or(0),
            )))
        })?;
        if let Some(what) = not_a_lease_file(meta.mode(), meta.nlink()) {
            return Err(Some(Planted::Entry(what)));
        }
        if meta.ino() != before.st_ino {
            return Err(Some(Planted::Entry("a file replaced while being opened")));
        }
        Ok(file)
    }

    /// Opens (or makes) the lease file `name`; `Err(why)` where this user cannot use it.
    /// Nothing found at the name is an error for the whole pick: it is this GPU's alone.
    fn open_file(&self, name: &str) -> std::result::Result<File, String> {
        for _ in 0..8 {
            // An existing file first, without O_CREAT: protected_regular refuses O_CREAT on
            // another user's file in a sticky directory, even to root.
            // Read-only where it is another user's, or the directory is mounted read-only
            // (a container given the host's /run/gpuctl): a lock needs no write access.
            let opened = match self.open_existing(name, OFlag::O_RDWR) {
                Err(Some(Planted::Unusable(Errno::EACCES | Errno::EPERM | Errno::EROFS))) => {
                    self.open_existing(name, OFlag::O_RDONLY)
                }
                other => other,
            };
            match opened {
                Ok(file) => return Ok(file),
                Err(None) => match self.create(name) {
                    Ok(Some(file)) => return Ok(file),
                    // Made by another run meanwhile: open that one.
                    Ok(None) => continue,
                    Err(errno) => return Err(self.refused(name, &errno.desc().to_lowercase())),
                },
                Err(Some(Planted::Unusable(Errno::EACCES | Errno::EPERM))) => {
                    return Err(format!(
                        "{}: {}, unreadable to this user: ask its owner or root to remove it",
                        self.path.join(name).display(),
                        owner_of(&self.dir, name)
                    ));
                }
                Err(Some(Planted::Unusable(errno))) => {
                    return Err(self.refused(name, &errno.desc().to_lowercase()));
                }
                Err(Some(Planted::Entry(what))) => return self.planted(name, what),
            }
        }
        Err(format!(
            "{}: replaced again and again while being opened",
            self.path.join(name).display()
        ))
    }

    /// Makes the lease file `name`; `Ok(None)` where another run made it first.
    fn create(&self, name: &str) -> std::result::Result<Option<File>, Errno> {
        let flags = OFlag::O_RDWR
            | OFlag::O_CREAT
            | OFlag::O_EXCL
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_CLOEXEC;
        match openat(&*self.dir, name, flags, Mode::from_bits_truncate(0o644)) {
            Ok(fd) => {
                let file = File::from(fd);
                // Readable by every user whatever the umask: anyone may lock it.
                let _ = file.set_permissions(std::fs::Permissions::from_mode(0o644));
                Ok(Some(file))
            }
            Err(Errno::EEXIST) => Ok(None),
            Err(errno) => Err(errno),
        }
    }

    /// "PATH: cannot be used (WHY; uid N's)": the GPU is stepped around.
    fn refused(&self, name: &str, why: &str) -> String {
        format!(
            "{}: cannot be used ({why}; {})",
            self.path.join(name).display(),
            owner_of(&self.dir, name)
        )
    }

    /// Something that is no lease file at a lease's name: never followed. Root removes it
    /// (nobody can hold a lease on it), then the next try makes the lease file; anyone else
    /// is told whose it is.
    fn planted(&self, name: &str, what: &str) -> std::result::Result<File, String> {
        let path = self.path.join(name);
        let owner = owner_of(&self.dir, name);
        if nix::unistd::geteuid().is_root() {
            let is_dir = fstatat(&*self.dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
                .is_ok_and(|stat| stat.st_mode & libc::S_IFMT == libc::S_IFDIR);
            let how = if is_dir {
                UnlinkatFlags::RemoveDir
            } else {
                UnlinkatFlags::NoRemoveDir
            };
            return match unlinkat(&*self.dir, name, how) {
                Ok(()) => self
                    .open_file(name)
                    .map_err(|_| format!("{}: {what} ({owner}) was removed", path.display())),
                Err(errno) => Err(format!(
                    "{}: {what} ({owner}), not followed, and it cannot be removed: {}",
                    path.display(),
                    errno.desc().to_lowercase()
                )),
            };
        }
        Err(format!(
            "{}: {what} ({owner}), not followed: ask its owner or root to remove it",
            path.display()
        ))
    }
}

/// Why an entry at a lease's name cannot be opened.
enum Planted {
    /// No lease file: a directory, FIFO, socket, device, link, or a file with two names.
    Entry(&'static str),
    /// The open or the look at it failed so.
    Unusable(Errno),
}

/// What the entry of this mode and link count is, where it is no lease file.
fn not_a_lease_file(mode: u32, links: u64) -> Option<&'static str> {
    match mode & libc::S_IFMT {
        libc::S_IFREG if links == 1 => None,
        libc::S_IFREG => Some("a file with another name too (a hard link)"),
        libc::S_IFDIR => Some("a directory"),
        libc::S_IFLNK => Some("a symbolic link"),
        libc::S_IFIFO => Some("a FIFO"),
        libc::S_IFSOCK => Some("a socket"),
        libc::S_IFCHR | libc::S_IFBLK => Some("a device"),
        _ => Some("not a regular file"),
    }
}

/// Takes the exclusive lock without waiting: `Ok(false)` where another holds it. Tried a few
/// times a millisecond apart: a reader's probe ([`locked_by_another`]) holds a shared lock
/// for microseconds.
fn lock_exclusive(file: &File) -> io::Result<bool> {
    for attempt in 0..BUSY_TRIES {
        if attempt > 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // SAFETY: flock on a descriptor the caller owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(true);
        }
        let error = io::Error::last_os_error();
        if error.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(error);
        }
    }
    Ok(false)
}

/// Whether another open file holds the lease: a shared lock tried without waiting, and
/// given back at once where it was had. Only this file's lock list is touched: no machine-
/// wide lock, nothing that waits.
fn locked_by_another(file: &File) -> bool {
    // SAFETY: flock on a descriptor the caller owns.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } == 0 {
        // SAFETY: as above; releases the probe's lock at once.
        unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
        return false;
    }
    io::Error::last_os_error().raw_os_error() == Some(libc::EWOULDBLOCK)
}

/// The note in an opened lease file: at most [`NOTE_MAX`] bytes, read once (a regular file:
/// never blocks); `None` for a larger file (a sparse terabyte costs one fstat).
fn read_note(file: &File) -> Option<Note> {
    use std::os::unix::fs::FileExt;
    let size = file.metadata().ok()?.len();
    if size == 0 || size > NOTE_MAX {
        return None;
    }
    let mut bytes = [0u8; NOTE_MAX as usize];
    let len = file.read_at(&mut bytes, 0).ok()?;
    serde_json::from_slice(&bytes[..len]).ok()
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

/// The holder a note names, where the reader can believe it: the process it names lives
/// with the start time it names (a reused pid is another process), and is the lease file's
/// owner, or the file is root's (then only root wrote it). Otherwise the lease is held by
/// someone gpuctl does not name.
fn describe_holder(note: Option<Note>, file_owner: u32) -> Holder {
    let Some(note) = note else {
        return Holder::default();
    };
    // The note's pids are this namespace's own: read as local processes.
    let Some(facts) = holder_facts(note.pid) else {
        return Holder::default();
    };
    let same_process = facts.start_ticks == note.start_ticks;
    let owner_wrote_it = file_owner == 0 || facts.uid == file_owner;
    if !same_process || !owner_wrote_it {
        return Holder::default();
    }
    Holder {
        pid: Some(note.pid),
        uid: Some(facts.uid),
        user: nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(facts.uid))
            .ok()
            .flatten()
            .map(|user| user.name),
        command: facts.command,
        since: Some(note.since),
    }
}

/// What naming a note's process needs, and no more (a reader pays for it on every read):
/// its start time, its effective uid (the owner procfs gives its stat file) and its command
/// line, all read through one descriptor on /proc/PID, so that they are one process's.
struct HolderFacts {
    start_ticks: u64,
    uid: u32,
    command: Option<String>,
}

fn holder_facts(pid: u32) -> Option<HolderFacts> {
    use std::os::unix::fs::FileExt;
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let process = nix::fcntl::open(format!("/proc/{pid}").as_str(), flags, Mode::empty()).ok()?;
    let read = OFlag::O_RDONLY | OFlag::O_CLOEXEC;
    let stat = File::from(openat(&process, "stat", read, Mode::empty()).ok()?);
    let start_ticks = crate::sys::procfile::read_stat_line(&stat).ok()?.starttime;
    let uid = crate::sys::procfile::owner_uid(&stat)?;
    let mut bytes = [0u8; 4096];
    let command = openat(&process, "cmdline", read, Mode::empty())
        .ok()
        .map(File::from)
        .and_then(|file| file.read_at(&mut bytes, 0).ok())
        .map(|len| {
            bytes[..len]
                .split(|&byte| byte == 0)
                .filter(|arg| !arg.is_empty())
                .map(String::from_utf8_lossy)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .filter(|command| !command.is_empty());
    Some(HolderFacts {
        start_ticks,
        uid,
        command,
    })
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// This process's start time in clock ticks after boot (/proc/self/stat).
fn own_start_ticks() -> Option<u64> {
    let stat = File::open("/proc/self/stat").ok()?;
    crate::sys::procfile::read_stat_line(&stat)
        .ok()
        .map(|line| line.starttime)
}

impl Lease {
    /// Writes who holds it and since when, where this user may write the file (otherwise
    /// readers see the lease held by someone they cannot name).
    fn write_note(&mut self) {
        let Some(start_ticks) = own_start_ticks() else {
            return;
        };
        let note = Note {
            pid: std::process::id(),
            start_ticks,
            since: unix_now(),
        };
        let json = serde_json::to_vec(&note).expect("a note serializes");
        use std::os::unix::fs::FileExt;
        // Opened read-only where it is another user's: then nothing is written.
        if self.file.write_at(&json, 0).is_ok() {
            let _ = self.file.set_len(json.len() as u64);
            self.noted = true;
        }
    }
}

impl Drop for Lease {
    /// The note goes before the lock: a reader never names a holder that gave the lease back.
    /// The file goes too where it is this user's and still at its name, so that the next run
    /// makes its own (one it can write its note in) rather than another user's being kept for
    /// good; a run that opened it meanwhile finds it gone and tries again.
    fn drop(&mut self) {
        if self.noted {
            let _ = self.file.set_len(0);
        }
        let Ok(name) = file_name(&self.uuid) else {
            return;
        };
        let Ok(held) = self.file.metadata() else {
            return;
        };
        let mine = held.uid() == nix::unistd::geteuid().as_raw();
        let at = fstatat(&*self.dir, name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW);
        if mine && at.is_ok_and(|at| at.st_ino == held.ino() && at.st_dev == held.dev()) {
            let _ = unlinkat(&*self.dir, name.as_str(), UnlinkatFlags::NoRemoveDir);
        }
    }
}

#[cfg(test)]
mod tests;
