//! GPU leases: a POSIX record lock (`fcntl(F_SETLK)`) on one file per GPU (or MIG
//! instance) UUID in a runtime directory. The kernel drops a lock when its holder dies, even
//! by SIGKILL, so a lease never outlives its run; the file is named by the UUID, never by an
//! index (which `CUDA_VISIBLE_DEVICES` renumbers). Several leases are taken all or nothing,
//! each without blocking and in UUID order, and all are released when one is missing: two
//! runs asking for two GPUs each can never hold one each and wait for the other.
//!
//! **The lease files are the directory owner's.** The shared directory (`/run/gpuctl/leases`)
//! is root's, mode 0755, and only root makes its files (mode 0666, so that any user may lock
//! one): no user can remove, replace, `chmod` or plant a lease file, so nobody can take a
//! GPU out from under a run or stop another's. Root's `run` and `pick` make every GPU's file
//! they are missing, as does the root host service on a user's request
//! ([`crate::service::RequestKind::LeaseFiles`]); a directory a user names for themselves
//! (`GPUCTL_LEASE_DIR`) is theirs, and so are its files. Anything at a lease's name that is
//! not the owner's regular file (a link, directory, FIFO, socket, device, another user's
//! file) is never opened: root removes it, anyone else is told whose it is, and the pick goes
//! on with the other GPUs.
//!
//! **The holder is the kernel's word.** A reader asks the lease file which process holds its
//! lock (`F_GETLK`: one file's lock list, no machine-wide lock, nothing that waits; never
//! /proc/locks, which costs every reader milliseconds and stalls every file lock on the
//! machine), then reads that process's user and command. Nothing a user writes names a
//! holder, so a lease cannot be faked or blamed on another; a record lock is never inherited
//! across `fork`, so a holder that forked and exited holds nothing, and a pid is named only
//! while its process holds the lock. The file's content is never read.
//!
//! A record lock belongs to the process, and closing *any* descriptor of the file drops it:
//! a process never opens a lease file it holds (a snapshot taken while `run` supervises its
//! command answers from [`HELD`] instead).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{FchmodatFlags, Mode, fchmodat, fstatat};
use nix::unistd::{UnlinkatFlags, unlinkat};
use serde::Serialize;

/// The environment variable that names the lease directory (tests, or a site's own place).
pub const DIR_ENV: &str = "GPUCTL_LEASE_DIR";

/// Where leases live unless [`DIR_ENV`] says otherwise: root makes it (mode 0755) on first
/// use, or systemd-tmpfiles at boot.
pub const DEFAULT_DIR: &str = "/run/gpuctl/leases";

/// The mode of a lease file in root's shared directory: any user may open it to lock it (a
/// record lock needs a descriptor open for writing); its content is never read.
const SHARED_FILE_MODE: u32 = 0o666;

/// The mode of a lease file in a user's own directory.
const PRIVATE_FILE_MODE: u32 = 0o600;

/// The lease files this process holds a lock on, by (device, inode). Closing any descriptor
/// of a locked file drops a record lock, so no reader in this process may open one of them.
static HELD: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());

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

impl LeaseError {
    /// The documented exit status: a lease that cannot be taken safely is a failure.
    pub fn exit(&self) -> crate::exit::Exit {
        crate::exit::Exit::Failed
    }
}

type Result<T> = std::result::Result<T, LeaseError>;

/// The directory of lease files, opened once and checked.
#[derive(Debug)]
pub struct LeaseDir {
    path: PathBuf,
    /// Shared with each lease taken, which checks its file is still at its name.
    dir: Arc<File>,
    /// The directory's owner: its lease files must be this uid's (root's, in the shared one).
    owner: u32,
    /// Whether the host service was asked for missing lease files, and why it did not help.
    asked: std::sync::atomic::AtomicBool,
    service_said: Mutex<Option<String>>,
}

/// A lease held: the GPU is this process's until it is dropped (or the process dies).
#[derive(Debug)]
pub struct Lease {
    pub uuid: String,
    file: File,
    /// The file's (device, inode), registered in [`HELD`] while held.
    id: (u64, u64),
}

/// How often a lease found locked is tried again before it counts as busy: a lock is
/// sometimes held a moment by a run that is giving up a set it could not complete.
const BUSY_TRIES: u32 = 4;

/// Who holds a lease, as the kernel names it; every field `None` where the lease is held by
/// a process this reader cannot see (another PID namespace's).
#[derive(Debug, Clone, Serialize, PartialEq, Eq, Default)]
pub struct Holder {
    pub pid: Option<u32>,
    pub uid: Option<u32>,
    pub user: Option<String>,
    /// Its command line, arguments joined by spaces (`gpuctl run -- python train.py`).
    pub command: Option<String>,
    /// When the lease was taken (Unix seconds): the time the holder marked on the file as it
    /// took the lease, never before the holder started.
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
            return "a process gpuctl cannot name (another PID namespace's, or one holding an \
                    open-file lock)"
                .into();
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

fn me() -> u32 {
    nix::unistd::geteuid().as_raw()
}

impl LeaseDir {
    /// The lease directory in force: [`DIR_ENV`], else [`DEFAULT_DIR`]; made if missing.
    pub fn open() -> Result<LeaseDir> {
        LeaseDir::at(&dir_in_force())
    }

    /// The lease directory in force where it exists (readers make nothing), checked as
    /// [`LeaseDir::at`] checks it.
    pub fn existing() -> Option<LeaseDir> {
        let path = dir_in_force();
        std::fs::symlink_metadata(&path)
            .is_ok_and(|meta| meta.is_dir())
            .then(|| LeaseDir::at(&path).ok())
            .flatten()
    }

    /// The lease directory at `path`, made (mode 0755) if missing. [`DEFAULT_DIR`] where
    /// others may write in it (mode 1777, as gpuctl made it before its lease files were
    /// root's alone) is made 0755 by root's first use.
    pub fn at(path: &Path) -> Result<LeaseDir> {
        let io = |error: io::Error| {
            if error.kind() == io::ErrorKind::PermissionDenied {
                return LeaseError::Unsafe(format!(
                    "cannot make or open the lease directory {}: {error}; root makes it on \
                     first use (or systemd-tmpfiles at boot), or name a directory of your own \
                     with {DIR_ENV}",
                    path.display()
                ));
            }
            LeaseError::Io {
                path: path.to_path_buf(),
                error,
            }
        };
        make_dir(path).map_err(io)?;
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
        let mut meta = dir.metadata().map_err(io)?;
        // Only gpuctl's own directory: a root-owned 1777 directory named otherwise (/tmp)
        // is someone else's to keep so.
        let ours = path == Path::new(DEFAULT_DIR);
        if ours && me() == 0 && meta.uid() == 0 && meta.mode() & 0o022 != 0 {
            dir.set_permissions(std::fs::Permissions::from_mode(0o755))
                .map_err(io)?;
            meta = dir.metadata().map_err(io)?;
        }
        check_dir(path, meta.uid(), meta.mode())?;
        Ok(LeaseDir {
            path: path.to_path_buf(),
            dir: Arc::new(dir),
            owner: meta.uid(),
            asked: std::sync::atomic::AtomicBool::new(false),
            service_said: Mutex::new(None),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether this process may make lease files here (it owns the directory).
    pub fn makes_files(&self) -> bool {
        me() == self.owner
    }

    /// Makes the lease file of each of `uuids` that has none, as the directory's owner
    /// (others cannot: nothing happens): mode 0666 in root's directory. What another user
    /// left at a lease's name, or a file of the wrong mode, is put right. No lease file is
    /// opened (this process may hold some): the number made or put right.
    pub fn provide(&self, uuids: &[String]) -> usize {
        if !self.makes_files() {
            return 0;
        }
        let mut done = 0;
        for uuid in uuids {
            let Ok(name) = file_name(uuid) else {
                continue;
            };
            done += usize::from(self.provide_one(&name));
        }
        done
    }

    /// Sees that each of `uuids` has its lease file: made here by the directory's owner,
    /// else, where one is missing, asked of the root host service ([`crate::service`]) once
    /// per directory opened. Where neither can, the lease is refused with why.
    pub fn ensure(&self, uuids: &[String]) {
        if self.makes_files() {
            self.provide(uuids);
            return;
        }
        let missing = uuids.iter().any(|uuid| {
            file_name(uuid).is_ok_and(|name| {
                fstatat(&*self.dir, name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                    .is_err_and(|errno| errno == Errno::ENOENT)
            })
        });
        if !missing || self.asked.swap(true, std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let socket = crate::service::socket_path(None);
        let answer = crate::service::client::ask_lease_files(&socket);
        *self.service_said.lock().unwrap_or_else(|e| e.into_inner()) = match answer {
            Ok(made) if made.directory == self.path => None,
            Ok(made) => Some(format!(
                "the host service keeps its leases in {}, not here",
                made.directory.display()
            )),
            Err(error) => Some(error.message().to_string()),
        };
    }

    fn provide_one(&self, name: &str) -> bool {
        let mode = self.file_mode();
        match fstatat(&*self.dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Err(Errno::ENOENT) => self.create(name).is_ok_and(|made| made.is_some()),
            Ok(stat) if self.is_lease_file(stat.st_mode, stat.st_nlink, stat.st_uid) => {
                if stat.st_mode & 0o7777 == mode {
                    return false;
                }
                fchmodat(
                    &*self.dir,
                    name,
                    Mode::from_bits_truncate(mode),
                    FchmodatFlags::NoFollowSymlink,
                )
                .is_ok()
            }
            Ok(_) => {
                self.remove(name).is_ok() && self.create(name).is_ok_and(|made| made.is_some())
            }
            Err(_) => false,
        }
    }

    fn file_mode(&self) -> u32 {
        if self.owner == 0 {
            SHARED_FILE_MODE
        } else {
            PRIVATE_FILE_MODE
        }
    }

    /// A lease file: a regular file with one name, the directory owner's.
    fn is_lease_file(&self, mode: u32, links: u64, uid: u32) -> bool {
        not_a_lease_file(mode, links).is_none() && uid == self.owner
    }

    /// Takes `uuid`'s lease without waiting.
    pub fn try_take(&self, uuid: &str) -> Result<Taken> {
        let name = file_name(uuid)?;
        // Held from the open to the lock: no other thread of this process opens and closes
        // the file meanwhile, which would drop the lock.
        let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
        let mine = fstatat(&*self.dir, name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
            .is_ok_and(|stat| held.contains(&(stat.st_dev, stat.st_ino)));
        if mine {
            // This process's own lock would be granted again, and a close would drop it.
            return Ok(Taken::Busy);
        }
        let file = match self.open_file(&name) {
            Ok(file) => file,
            Err(why) => return Ok(Taken::Refused(why)),
        };
        let Ok(meta) = file.metadata() else {
            return Ok(Taken::Busy);
        };
        let id = (meta.dev(), meta.ino());
        match lock_exclusive(&file) {
            Ok(true) => held.push(id),
            Ok(false) => return Ok(Taken::Busy),
            Err(error) => {
                return Ok(Taken::Refused(format!(
                    "{}: cannot be locked: {error}",
                    self.path.join(&name).display()
                )));
            }
        }
        drop(held);
        // When it was taken, for readers; clamped by each reader to the holder's start.
        let _ = nix::sys::stat::futimens(
            &file,
            &nix::sys::time::TimeSpec::UTIME_NOW,
            &nix::sys::time::TimeSpec::UTIME_NOW,
        );
        Ok(Taken::Held(Lease {
            uuid: uuid.to_string(),
            file,
            id,
        }))
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

    /// Why `lease` is no longer the file at its name, if it is not. Only the directory's
    /// owner can remove a lease file, so this says the owner (root) did, while it was held.
    pub fn lost(&self, lease: &Lease) -> Option<String> {
        let name = file_name(&lease.uuid).ok()?;
        let at = fstatat(&*self.dir, name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW);
        if at.is_ok_and(|at| (at.st_dev, at.st_ino) == lease.id) {
            return None;
        }
        Some(format!(
            "the lease file {} was removed or replaced while this run held it (only uid {} \
             can): another run may have had {} meanwhile",
            self.path.join(&name).display(),
            self.owner,
            lease.uuid
        ))
    }

    /// Who holds `uuid`'s lease, if anyone: asked of the lease file itself (the kernel names
    /// the process holding its lock), never of the machine's lock table.
    pub fn holder(&self, uuid: &str) -> Option<Holder> {
        let name = file_name(uuid).ok()?;
        let stat = fstatat(&*self.dir, name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW).ok()?;
        if !self.is_lease_file(stat.st_mode, stat.st_nlink, stat.st_uid) {
            return None;
        }
        let mtime = u64::try_from(stat.st_mtime).ok();
        let pid = {
            // Held across the open and close: no thread of this process takes the lease in
            // between, whose lock the close would drop.
            let held = HELD.lock().unwrap_or_else(|e| e.into_inner());
            if held.contains(&(stat.st_dev, stat.st_ino)) {
                return Some(describe_holder(std::process::id(), mtime));
            }
            let file = self.open_existing(&name, OFlag::O_RDONLY).ok()?;
            lock_holder(&file)?
        };
        if pid <= 0 {
            // Held by a process of another PID namespace (0), or through an open-file lock
            // (-1), neither of which the kernel names here.
            return Some(Holder::default());
        }
        let holder = describe_holder(pid as u32, mtime);
        // Still that process's: the facts read are the holder's, not a pid's next owner's.
        let again = {
            let _held = HELD.lock().unwrap_or_else(|e| e.into_inner());
            let file = self.open_existing(&name, OFlag::O_RDONLY).ok()?;
            lock_holder(&file)
        };
        (again == Some(pid)).then_some(holder)
    }

    /// Who holds each of `uuids`' leases.
    pub fn holders(&self, uuids: &[String]) -> Vec<(String, Holder)> {
        uuids
            .iter()
            .filter_map(|uuid| Some((uuid.clone(), self.holder(uuid)?)))
            .collect()
    }

    /// Opens the regular file at `name`, looked at before it is opened (a FIFO, socket or
    /// device is never opened) and after (it must be the file looked at, with one name, the
    /// directory owner's). `Err(None)`: nothing is there; `Err(Some(why))`: something that
    /// is no lease file.
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
        if let Some(what) = self.not_ours(before.st_mode, before.st_nlink, before.st_uid) {
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
        if let Some(what) = self.not_ours(meta.mode(), meta.nlink(), meta.uid()) {
            return Err(Some(Planted::Entry(what)));
        }
        if meta.ino() != before.st_ino {
            return Err(Some(Planted::Entry("a file replaced while being opened")));
        }
        Ok(file)
    }

    /// What the entry is, where it is not a lease file of this directory's owner.
    fn not_ours(&self, mode: u32, links: u64, uid: u32) -> Option<&'static str> {
        not_a_lease_file(mode, links).or((uid != self.owner).then_some(if self.owner == 0 {
            "a file root did not make"
        } else {
            "a file the directory's owner did not make"
        }))
    }

    /// Opens (or, as the directory's owner, makes) the lease file `name` for locking;
    /// `Err(why)` where this user cannot use it. Nothing found at the name is an error for
    /// the whole pick: it is this GPU's alone.
    fn open_file(&self, name: &str) -> std::result::Result<File, String> {
        for _ in 0..8 {
            match self.open_existing(name, OFlag::O_RDWR) {
                Ok(file) => return Ok(file),
                Err(None) if self.makes_files() => match self.create(name) {
                    Ok(Some(file)) => return Ok(file),
                    // Made by another run meanwhile: open that one.
                    Ok(None) => continue,
                    Err(errno) => return Err(self.refused(name, &errno.desc().to_lowercase())),
                },
                Err(None) => {
                    let service = self
                        .service_said
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .clone()
                        .map(|why| format!(" ({why})"))
                        .unwrap_or_default();
                    return Err(format!(
                        "{}: no lease file yet, and only uid {} makes them: root's gpuctl run, \
                         or the gpuctl host service (gpuctl-api.socket) asked for them{service}",
                        self.path.join(name).display(),
                        self.owner
                    ));
                }
                Err(Some(Planted::Unusable(Errno::EACCES | Errno::EPERM))) => {
                    return Err(format!(
                        "{}: not writable by this user ({}): a lease needs it open for writing; \
                         root's gpuctl run or pick puts its mode right",
                        self.path.join(name).display(),
                        owner_of(&self.dir, name)
                    ));
                }
                Err(Some(Planted::Unusable(Errno::EROFS))) => {
                    return Err(self.refused(name, "the lease directory is mounted read-only"));
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
        let mode = self.file_mode();
        match openat(&*self.dir, name, flags, Mode::from_bits_truncate(mode)) {
            Ok(fd) => {
                let file = File::from(fd);
                // Whatever the umask: in root's directory, anyone may lock it.
                let _ = file.set_permissions(std::fs::Permissions::from_mode(mode));
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

    /// Removes what is at `name`, a directory too (only an empty one), never following it.
    fn remove(&self, name: &str) -> std::result::Result<(), Errno> {
        let is_dir = fstatat(&*self.dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
            .is_ok_and(|stat| stat.st_mode & libc::S_IFMT == libc::S_IFDIR);
        let how = if is_dir {
            UnlinkatFlags::RemoveDir
        } else {
            UnlinkatFlags::NoRemoveDir
        };
        unlinkat(&*self.dir, name, how)
    }

    /// Something that is no lease file at a lease's name: never followed. The directory's
    /// owner removes it (nobody can hold a lease on it), then the next try makes the lease
    /// file; anyone else is told whose it is.
    fn planted(&self, name: &str, what: &str) -> std::result::Result<File, String> {
        let path = self.path.join(name);
        let owner = owner_of(&self.dir, name);
        if self.makes_files() {
            return match self.remove(name) {
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
            "{}: {what} ({owner}), not followed: ask root to remove it",
            path.display()
        ))
    }
}

/// [`DIR_ENV`], else [`DEFAULT_DIR`].
fn dir_in_force() -> PathBuf {
    std::env::var_os(DIR_ENV)
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_DIR), PathBuf::from)
}

/// Makes the directory `path` (mode 0755) where it is missing, and its parent (/run/gpuctl,
/// private to root's programs) where that is.
fn make_dir(path: &Path) -> io::Result<()> {
    let make = |path: &Path| match std::fs::DirBuilder::new().mode(0o755).create(path) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        other => other,
    };
    match make(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(parent) = path.parent() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(parent)?;
            }
            make(path)
        }
        other => other,
    }
}

/// Why an entry at a lease's name cannot be opened.
enum Planted {
    /// No lease file: a directory, FIFO, socket, device, link, a file with two names, or
    /// one someone other than the directory's owner made.
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

/// A write lock on the whole file, as `fcntl` takes it.
fn whole_file(kind: libc::c_int) -> libc::flock {
    libc::flock {
        l_type: kind as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    }
}

/// Takes the write lock without waiting: `Ok(false)` where another process holds it. Tried
/// a few times a millisecond apart: a run that could not complete its set gives back what
/// it took at once.
fn lock_exclusive(file: &File) -> io::Result<bool> {
    for attempt in 0..BUSY_TRIES {
        if attempt > 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let lock = whole_file(libc::F_WRLCK);
        // SAFETY: fcntl on a descriptor the caller owns, with a valid flock.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &lock) } == 0 {
            return Ok(true);
        }
        let error = io::Error::last_os_error();
        if !matches!(error.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) {
            return Err(error);
        }
    }
    Ok(false)
}

/// The pid of the process holding a lock on `file` (as this PID namespace numbers it: 0 for
/// one it cannot see), or `None` where nothing holds one. Only this file's lock list is
/// read: no machine-wide lock, nothing that waits.
fn lock_holder(file: &File) -> Option<libc::pid_t> {
    let mut lock = whole_file(libc::F_WRLCK);
    // SAFETY: fcntl on a descriptor the caller owns, writing into a local flock.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETLK, &mut lock) } != 0 {
        return None;
    }
    (lock.l_type != libc::F_UNLCK as libc::c_short).then_some(lock.l_pid)
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
/// a lease file and lock a new one while a run holds the old.
fn check_dir(path: &Path, uid: u32, mode: u32) -> Result<()> {
    if uid != 0 && uid != me() {
        return Err(LeaseError::Unsafe(format!(
            "{} is uid {uid}'s directory, not root's or this user's: its leases cannot be \
             trusted; remove it, or name another with {DIR_ENV}",
            path.display()
        )));
    }
    if mode & 0o022 != 0 && mode & libc::S_ISVTX == 0 {
        return Err(LeaseError::Unsafe(format!(
            "{} may be written by others but is not sticky (mode {:o}): anyone could remove \
             a lease; make it mode 0755",
            path.display(),
            mode & 0o7777
        )));
    }
    Ok(())
}

/// The holder the kernel named: its user and command (read through one descriptor on
/// /proc/PID, so that they are one process's), and since when, from the time it marked on
/// the lease file, never before it started.
fn describe_holder(pid: u32, marked: Option<u64>) -> Holder {
    let Some(facts) = holder_facts(pid) else {
        return Holder {
            pid: Some(pid),
            ..Holder::default()
        };
    };
    let started = started_unix(facts.start_ticks);
    Holder {
        pid: Some(pid),
        uid: Some(facts.uid),
        user: nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(facts.uid))
            .ok()
            .flatten()
            .map(|user| user.name),
        command: facts.command,
        since: match (marked, started) {
            (Some(marked), Some(started)) => Some(marked.max(started)),
            (marked, started) => marked.or(started),
        },
    }
}

/// A process's start, in Unix seconds, from its start time in clock ticks after boot.
fn started_unix(start_ticks: u64) -> Option<u64> {
    // SAFETY: sysconf has no preconditions.
    let per_second = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).ok()?;
    let up = crate::host::boot_clock().ok()?.as_secs();
    let age = up.checked_sub(start_ticks / per_second.max(1))?;
    crate::units::unix_whole_seconds().checked_sub(age)
}

/// What naming a holder needs, and no more (a reader pays for it on every read): its start
/// time, its effective uid (the owner of its /proc/PID directory, which procfs keeps the
/// process's even where it cannot be dumped and its files turn root's) and its command line.
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
    let uid = nix::sys::stat::fstat(&process).ok()?.st_uid;
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

impl Drop for Lease {
    /// The lock goes with the descriptor; the file stays, the directory owner's, for the
    /// next run.
    fn drop(&mut self) {
        let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
        let lock = whole_file(libc::F_UNLCK);
        // SAFETY: fcntl on the descriptor this lease owns. Released under HELD's lock, so
        // that a try_take of this process never sees the file free and still registered.
        unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_SETLK, &lock) };
        held.retain(|id| *id != self.id);
    }
}

#[cfg(test)]
mod tests;
