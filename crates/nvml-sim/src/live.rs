//! Process liveness, as the driver sees it: a process that no longer exists, or a zombie
//! whose threads have all exited, holds no GPU context.
//!
//! A pidfd answers exactly the driver's question in three cheap syscalls: it becomes readable
//! when the whole thread group has exited (a zombie leader with live threads is not). Where
//! pidfds are refused (old kernel, seccomp, a thread id, a client in a child PID namespace
//! that still sees the host's /proc), `/proc/PID/stat` is read instead, and for a zombie
//! leader `/proc/PID/task/*/stat` (any task not a zombie keeps the context).
//! Each answer is cached for at most [`TTL`] within one process.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long one liveness answer is reused within one process.
pub const TTL: Duration = Duration::from_millis(20);

#[derive(Debug, Default)]
pub struct LiveCache {
    map: HashMap<u32, (Instant, bool)>,
}

impl LiveCache {
    pub fn is_alive(&mut self, pid: u32, now: Instant) -> bool {
        if let Some((at, alive)) = self.map.get(&pid)
            && now.duration_since(*at) < TTL
        {
            return *alive;
        }
        let alive = probe(pid);
        if self.map.len() > 16384 {
            self.map.retain(|_, (at, _)| now.duration_since(*at) < TTL);
        }
        self.map.insert(pid, (now, alive));
        alive
    }

    pub fn clear(&mut self) {
        self.map.clear();
    }
}

/// The state letter of `/proc/<path>/stat` (the field after the command name).
fn stat_state(path: &str) -> Option<u8> {
    let bytes = std::fs::read(path).ok()?;
    let close = bytes.iter().rposition(|b| *b == b')')?;
    bytes.get(close + 2).copied()
}

fn is_dead_state(s: u8) -> bool {
    matches!(s, b'Z' | b'X' | b'x')
}

/// Whether `pid` holds a GPU context now (uncached).
pub fn probe(pid: u32) -> bool {
    if pid == 0 || pid > i32::MAX as u32 {
        return false;
    }
    if let Some(exited) = pidfd_exited(pid) {
        return !exited;
    }
    match stat_state(&format!("/proc/{pid}/stat")) {
        None => false,
        Some(s) if is_dead_state(s) => any_live_task(pid),
        Some(_) => true,
    }
}

/// `Some(true)` when the thread group has exited; `None` when no pidfd could be had.
fn pidfd_exited(pid: u32) -> Option<bool> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1; nothing is borrowed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return None;
    }
    let fd = fd as libc::c_int;
    let mut poll = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd that we own, zero timeout; the fd is ours and closed right after.
    let ready = unsafe { libc::poll(&mut poll, 1, 0) };
    unsafe { libc::close(fd) };
    (ready >= 0).then_some(ready > 0 && poll.revents & libc::POLLIN != 0)
}

fn any_live_task(pid: u32) -> bool {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    dir.flatten().any(|entry| {
        let tid = entry.file_name();
        let tid = tid.to_string_lossy();
        matches!(stat_state(&format!("/proc/{pid}/task/{tid}/stat")), Some(s) if !is_dead_state(s))
    })
}
