//! The process at the other end of a Unix socket, as the kernel recorded it at connect(2):
//! its credentials (`SO_PEERCRED`), a pidfd on it (`SO_PEERPIDFD`, Linux 6.5+) that can never
//! reach another process once its pid is reused, and through that pidfd its namespaces
//! (`PIDFD_GET_*_NAMESPACE`, Linux 6.11+) and whether a PID namespace is one of ours or above
//! it (`NS_GET_TGID_IN_PIDNS`, Linux 6.11+).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;

/// `SO_PEERPIDFD` (asm-generic; every architecture gpuctl builds for).
const SO_PEERPIDFD: libc::c_int = 77;
/// `PIDFD_GET_PID_NAMESPACE`: `_IO(0xFF, 5)`.
const PIDFD_GET_PID_NAMESPACE: libc::c_ulong = 0xFF05;
/// `PIDFD_GET_USER_NAMESPACE`: `_IO(0xFF, 9)`.
const PIDFD_GET_USER_NAMESPACE: libc::c_ulong = 0xFF09;
/// `NS_GET_TGID_IN_PIDNS`: `_IOR(0xb7, 0x9, int)`; the argument is a pid of the caller's
/// namespace, passed by value.
const NS_GET_TGID_IN_PIDNS: libc::c_ulong = 0x8004_B709;

/// The inode of the initial user namespace (`USER_NS_INIT_INO`).
pub const INIT_USER_NS_INODE: u64 = 0xEFFF_FFFD;

/// The peer's pid (in the reader's PID namespace: 0 where the peer is outside it), uid and
/// gid (in the reader's user namespace), as `SO_PEERCRED` has them.
pub fn credentials(socket: &impl AsRawFd) -> io::Result<libc::ucred> {
    let mut creds = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED writes one ucred into the struct we own, whose size is passed.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut creds as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(creds)
}

/// A pidfd on the process that connected (for a client: the one that called listen(2)).
/// `ENOPROTOOPT` before Linux 6.5; `ESRCH` on some kernels where that process is gone.
pub fn pidfd(socket: &impl AsRawFd) -> io::Result<OwnedFd> {
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: SO_PEERPIDFD writes one int (a new descriptor) into the int we own.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&mut fd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if fd < 0 {
        return Err(io::Error::other("SO_PEERPIDFD gave no descriptor"));
    }
    // SAFETY: the kernel just gave us this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The pid a pidfd's process has in this process's PID namespace now: `None` once it has
/// exited (fdinfo shows -1) or where it is outside this namespace (0).
pub fn pid_of(pidfd: &OwnedFd) -> io::Result<Option<u32>> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd()))?;
    let pid = info
        .lines()
        .find_map(|line| line.strip_prefix("Pid:"))
        .and_then(|value| value.trim().parse::<i64>().ok())
        .ok_or_else(|| io::Error::other("the pidfd's fdinfo has no Pid line"))?;
    Ok(u32::try_from(pid).ok().filter(|&pid| pid > 0))
}

fn namespace_of(pidfd: &OwnedFd, request: libc::c_ulong) -> io::Result<File> {
    // SAFETY: the PIDFD_GET_*_NAMESPACE ioctls take no argument (0) and return a new
    // descriptor or -1; the pidfd is open for the call's duration.
    let rc = unsafe { libc::ioctl(pidfd.as_raw_fd(), request as _, 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a non-negative return is a new descriptor that we now own.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(rc as RawFd) }))
}

/// The PID namespace of a pidfd's process. `ENOTTY` (or `EINVAL`) before Linux 6.11;
/// `EACCES` where this process may not inspect it (ptrace read access: another uid).
pub fn pid_namespace(pidfd: &OwnedFd) -> io::Result<File> {
    namespace_of(pidfd, PIDFD_GET_PID_NAMESPACE)
}

/// The user namespace of a pidfd's process (errors as [`pid_namespace`]).
pub fn user_namespace(pidfd: &OwnedFd) -> io::Result<File> {
    namespace_of(pidfd, PIDFD_GET_USER_NAMESPACE)
}

/// Whether `namespace` (a PID namespace) is this process's own or one of its ancestors: this
/// process has a pid there exactly then. `ENOTTY` (or `EINVAL`) on kernels without the
/// translation ioctls.
pub fn is_own_or_ancestor(namespace: &File) -> io::Result<bool> {
    let me = std::process::id() as libc::c_ulong;
    // SAFETY: NS_GET_TGID_IN_PIDNS takes a pid by value and returns a pid or -1.
    let rc = unsafe { libc::ioctl(namespace.as_raw_fd(), NS_GET_TGID_IN_PIDNS as _, me) };
    if rc > 0 {
        return Ok(true);
    }
    let error = io::Error::last_os_error();
    match error.raw_os_error() {
        Some(libc::ESRCH) => Ok(false),
        _ if rc == 0 => Ok(false),
        _ => Err(error),
    }
}

/// Whether two namespace descriptors (or paths opened as files) are the same namespace.
pub fn same_namespace(a: &File, b: &File) -> io::Result<bool> {
    let (a, b) = (a.metadata()?, b.metadata()?);
    Ok(a.dev() == b.dev() && a.ino() == b.ino())
}

/// Whether an errno says the kernel lacks a socket option or ioctl (rather than refusing it).
pub fn unsupported(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::ENOPROTOOPT | libc::ENOTTY | libc::EINVAL | libc::EOPNOTSUPP)
    )
}
