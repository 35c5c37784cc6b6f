//! SIGTERM, SIGINT and SIGHUP as flags: the handlers only store to atomics and write one byte
//! to a non-blocking self-pipe, which the daemon's sleep polls, so a signal wakes it at once.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::Duration;

static STOP: AtomicBool = AtomicBool::new(false);
static RELOAD: AtomicBool = AtomicBool::new(false);
static PIPE_WRITE: AtomicI32 = AtomicI32::new(-1);
static PIPE_READ: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(signal: libc::c_int) {
    match signal {
        libc::SIGHUP => RELOAD.store(true, Ordering::SeqCst),
        _ => STOP.store(true, Ordering::SeqCst),
    }
    let fd = PIPE_WRITE.load(Ordering::SeqCst);
    if fd >= 0 {
        let byte = 1u8;
        // SAFETY: write(2) is async-signal-safe; errno is saved and restored around it.
        unsafe {
            let errno = *libc::__errno_location();
            libc::write(fd, (&byte as *const u8).cast(), 1);
            *libc::__errno_location() = errno;
        }
    }
}

/// Installs the handlers. Call once, before any other thread starts.
pub fn install() -> std::io::Result<()> {
    let mut fds = [-1; 2];
    // SAFETY: pipe2 writes two descriptors into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    PIPE_READ.store(fds[0], Ordering::SeqCst);
    PIPE_WRITE.store(fds[1], Ordering::SeqCst);
    for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        // SAFETY: a zeroed sigaction with our handler, an empty mask and SA_RESTART.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(signal, &action, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// Whether SIGHUP came since the last call.
pub fn take_reload() -> bool {
    RELOAD.swap(false, Ordering::SeqCst)
}

/// Sleeps up to `limit`, waking early when a signal arrives.
pub fn sleep(limit: Duration) {
    let fd = PIPE_READ.load(Ordering::SeqCst);
    if fd < 0 {
        std::thread::sleep(limit);
        return;
    }
    let mut poll = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = limit.as_millis().min(i32::MAX as u128) as i32;
    // A sub-millisecond remainder rounds up, so the caller never spins.
    let ms = if ms == 0 && !limit.is_zero() { 1 } else { ms };
    // SAFETY: one valid pollfd.
    let ready = unsafe { libc::poll(&mut poll, 1, ms) };
    if ready > 0 {
        let mut buffer = [0u8; 64];
        // SAFETY: reading into a local buffer from our non-blocking pipe, until empty.
        while unsafe { libc::read(fd, buffer.as_mut_ptr().cast(), buffer.len()) } > 0 {}
    }
}
