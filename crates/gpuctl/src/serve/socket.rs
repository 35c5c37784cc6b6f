//! The service's socket: the one systemd passed (`LISTEN_FDS`), else one made at the path in
//! force, safely. Every directory on the way must be writable by root alone (or by this
//! service's user), or sticky and root's as /tmp is: a directory another user can write in
//! lets them swap the socket for their own. The path is walked one directory at a time
//! without following links (each opened `O_NOFOLLOW` and checked on its descriptor), missing
//! directories are made relative to their checked parent, and the socket is bound in the
//! checked directory through its descriptor with the umask giving it its mode: nothing is
//! done again by path after a check.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result};
use gpuctl_core::service;
use gpuctl_core::text;
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{Mode, fchmod, fstatat, mkdirat, umask};
use nix::unistd::{UnlinkatFlags, unlinkat};

/// The fd systemd passes first (`SD_LISTEN_FDS_START`).
const LISTEN_FDS_START: i32 = 3;

/// Where the socket was made: its directory (held open) and name, to remove it by.
pub struct Made {
    pub path: PathBuf,
    dir: File,
    name: PathBuf,
}

impl Made {
    /// Removes the socket (the service could not start after all).
    pub fn remove(&self) {
        let _ = unlinkat(&self.dir, self.name.as_path(), UnlinkatFlags::NoRemoveDir);
    }
}

/// The socket systemd passed (LISTEN_PID is this process, LISTEN_FDS at least 1), else one
/// made at `explicit`, GPUCTL_SOCKET or the default path.
pub fn listener(explicit: Option<PathBuf>) -> Result<(UnixListener, Option<Made>)> {
    if let Some(listener) = inherited()? {
        return Ok((listener, None));
    }
    let path = service::socket_path(explicit);
    let (listener, made) = make(&path)?;
    Ok((listener, Some(made)))
}

fn usage(text: String) -> anyhow::Error {
    gpuctl_core::CoreError::Usage(text).into()
}

fn shown(path: &Path) -> String {
    text::escape(&path.display().to_string()).into_owned()
}

/// Makes the socket at `path` (see the module's comment).
fn make(path: &Path) -> Result<(UnixListener, Made)> {
    let name = match path.file_name() {
        Some(name) if path.components().next_back() == Some(Component::Normal(name)) => name,
        _ => {
            return Err(usage(format!(
                "{}: a socket path must end in a file name",
                shown(path)
            )));
        }
    };
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let dir = checked_dir(&resolved(parent)?)?;
    let uid = nix::unistd::geteuid().as_raw();
    match fstatat(&dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(stat) => {
            if stat.st_mode & libc::S_IFMT != libc::S_IFSOCK {
                return Err(usage(format!(
                    "{} exists and is not a socket: not replacing it",
                    shown(path)
                )));
            }
            if UnixStream::connect(through(&dir, name)).is_ok() {
                return Err(usage(format!(
                    "another service already answers on {}",
                    shown(path)
                )));
            }
            // Left by a service that ended: nobody listens on it.
            unlinkat(&dir, name, UnlinkatFlags::NoRemoveDir)
                .with_context(|| format!("cannot remove the stale socket {}", shown(path)))?;
        }
        Err(Errno::ENOENT) => {}
        Err(e) => return Err(e).with_context(|| format!("cannot look at {}", shown(path))),
    }
    // Anyone may ask: what is answered depends on who asks, as the kernel says. A socket's
    // mode is its file's, set at bind(2) from the umask: 0666 without a chmod by path.
    let previous = umask(Mode::from_bits_truncate(0o111));
    let bound = UnixListener::bind(through(&dir, name));
    umask(previous);
    let listener = bound.with_context(|| format!("cannot listen on {}", shown(path)))?;
    let stat = fstatat(&dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
        .with_context(|| format!("cannot look at {}", shown(path)))?;
    if stat.st_mode & libc::S_IFMT != libc::S_IFSOCK || stat.st_uid != uid {
        return Err(anyhow::anyhow!(
            "{} was replaced while it was being made",
            shown(path)
        ));
    }
    let made = Made {
        path: path.to_path_buf(),
        dir,
        name: PathBuf::from(name),
    };
    Ok((listener, made))
}

/// `name` in the directory open as `dir`, by a path that reaches that very directory.
fn through(dir: &File, name: &OsStr) -> PathBuf {
    Path::new("/proc/self/fd")
        .join(dir.as_raw_fd().to_string())
        .join(name)
}

/// `dir` made absolute, with the links in its existing part resolved (where they lead is
/// checked as any directory is) and the part that does not exist yet kept as given.
fn resolved(dir: &Path) -> Result<PathBuf> {
    let absolute = if dir.is_absolute() {
        dir.to_path_buf()
    } else {
        std::env::current_dir()
            .context("cannot read the current directory")?
            .join(dir)
    };
    let mut existing = absolute.as_path();
    let mut missing = Vec::new();
    loop {
        match existing.canonicalize() {
            Ok(real) => {
                let mut full = real;
                for part in missing.iter().rev() {
                    full.push(part);
                }
                return Ok(full);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let (Some(parent), Some(name)) = (existing.parent(), existing.file_name()) else {
                    return Err(e).with_context(|| format!("cannot resolve {}", shown(dir)));
                };
                missing.push(name.to_os_string());
                existing = parent;
            }
            Err(e) => return Err(e).with_context(|| format!("cannot resolve {}", shown(dir))),
        }
    }
}

/// Opens the absolute, resolved `dir` one component at a time without following links,
/// making what is missing (0755, this service's), and checks each directory on its
/// descriptor.
fn checked_dir(dir: &Path) -> Result<File> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut at = PathBuf::from("/");
    let mut current = File::from(
        nix::fcntl::open("/", flags, Mode::empty()).context("cannot open the root directory")?,
    );
    check(&current, &at)?;
    for component in dir.components() {
        let name = match component {
            Component::RootDir => continue,
            Component::Normal(name) => name,
            _ => return Err(usage(format!("{}: not a plain path", shown(dir)))),
        };
        at.push(name);
        let opened = match openat(&current, name, flags, Mode::empty()) {
            Err(Errno::ENOENT) => {
                match mkdirat(&current, name, Mode::from_bits_truncate(0o755)) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => {
                        return Err(e).with_context(|| format!("cannot create {}", shown(&at)));
                    }
                }
                let made = openat(&current, name, flags, Mode::empty());
                if let Ok(fd) = &made {
                    // Readable by all, whatever the umask: containers that mount it reach
                    // the socket. Set on the descriptor, never by path.
                    let _ = fchmod(fd, Mode::from_bits_truncate(0o755));
                }
                made
            }
            other => other,
        };
        let opened = match opened {
            Ok(fd) => File::from(fd),
            Err(Errno::ELOOP | Errno::ENOTDIR) => {
                return Err(usage(format!(
                    "cannot serve under {}: not a directory (a link put there since it was \
                     resolved?)",
                    shown(&at)
                )));
            }
            Err(e) => return Err(e).with_context(|| format!("cannot open {}", shown(&at))),
        };
        check(&opened, &at)?;
        current = opened;
    }
    Ok(current)
}

/// A directory on the socket's path may be written in only by root (or this service's
/// user), unless it is sticky and root's (/tmp): there others cannot remove what is not
/// theirs.
fn check(dir: &File, at: &Path) -> Result<()> {
    let meta = dir
        .metadata()
        .with_context(|| format!("cannot look at {}", shown(at)))?;
    let me = nix::unistd::geteuid().as_raw();
    let owner_ok = meta.uid() == 0 || meta.uid() == me;
    let shared = meta.mode() & 0o022 != 0;
    let sticky_roots = meta.mode() & libc::S_ISVTX != 0 && meta.uid() == 0;
    if owner_ok && (!shared || sticky_roots) {
        return Ok(());
    }
    let who = if owner_ok {
        format!(
            "group or others (mode {:o}, not sticky)",
            meta.mode() & 0o7777
        )
    } else {
        format!("uid {}", meta.uid())
    };
    Err(usage(format!(
        "refusing to serve under {}: it is writable by {who}, who could replace the socket; \
         the socket's directory and every one above it must be writable by root alone (or \
         sticky and root's, as /tmp)",
        shown(at)
    )))
}

/// The first socket systemd passed this process, if it passed any.
fn inherited() -> Result<Option<UnixListener>> {
    let for_us = std::env::var("LISTEN_PID")
        .ok()
        .and_then(|pid| pid.parse::<u32>().ok())
        == Some(std::process::id());
    let count = std::env::var("LISTEN_FDS")
        .ok()
        .and_then(|n| n.parse::<i32>().ok())
        .unwrap_or(0);
    if !for_us || count < 1 {
        return Ok(None);
    }
    // SAFETY: removing variables before any other thread of ours runs (this is the
    // service's start), so nothing reads the environment meanwhile.
    unsafe {
        std::env::remove_var("LISTEN_PID");
        std::env::remove_var("LISTEN_FDS");
        std::env::remove_var("LISTEN_FDNAMES");
    }
    let fd = LISTEN_FDS_START;
    // A passed descriptor must be a listening Unix stream socket.
    // SAFETY: fstat writes into a stat we own.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd 3 is ours by the LISTEN_FDS protocol; stat is a valid out-pointer.
    if unsafe { libc::fstat(fd, &mut stat) } != 0 || stat.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(usage(
            "LISTEN_FDS is set for this process but fd 3 is not a socket".into(),
        ));
    }
    // SAFETY: fd 3 is a socket systemd handed to this process alone; we take ownership.
    let listener = unsafe { UnixListener::from_raw_fd(fd) };
    // Close-on-exec, as every other descriptor of ours.
    // SAFETY: fcntl on a descriptor we own.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    Ok(Some(listener))
}
