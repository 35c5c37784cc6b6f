//! pidfds (Linux 5.3+): a handle on one process that can never reach another, even once its
//! pid number is reused, and that becomes readable when its whole thread group has exited.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `pidfd_open(2)` on the process `pid` names now.
pub fn open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new descriptor or -1.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_open,
            libc::c_long::from(pid),
            0 as libc::c_long,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let Ok(raw) = RawFd::try_from(rc) else {
        return Err(io::Error::other(
            "pidfd_open returned an invalid descriptor",
        ));
    };
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// `pidfd_send_signal(2)`.
pub fn send_signal(fd: &OwnedFd, signal: i32) -> io::Result<()> {
    // SAFETY: pidfd_send_signal(2) with a descriptor we own, a NULL siginfo (the kernel fills
    // it in as kill(2) would) and no flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            libc::c_long::from(fd.as_raw_fd()),
            libc::c_long::from(signal),
            std::ptr::null::<libc::siginfo_t>(),
            0 as libc::c_long,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Whether a pidfd is readable now, i.e. its whole thread group has exited.
pub fn exited(fd: &OwnedFd) -> io::Result<bool> {
    let mut pollfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one valid pollfd, zero timeout.
        let rc = unsafe { libc::poll(&mut pollfd, 1, 0) };
        if rc >= 0 {
            return Ok(pollfd.revents & libc::POLLIN != 0);
        }
        let error = io::Error::last_os_error();
        if error.raw_os_error() != Some(libc::EINTR) {
            return Err(error);
        }
    }
}
