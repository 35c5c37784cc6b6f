//! Process liveness, as the driver sees it: a process that no longer exists, or a zombie
//! whose threads have all exited, holds no GPU context.
//!
//! A pidfd answers exactly the driver's question: it becomes readable when the whole thread
//! group has exited (a zombie leader with live threads is not). One is kept per live process,
//! all in one epoll set, so bringing every answer up to date is one `epoll_wait`. Where
//! pidfds are refused (old kernel, seccomp, a thread id, a client in a child PID namespace
//! that still sees the host's /proc), `/proc/PID/stat` is read instead, and for a zombie
//! leader `/proc/PID/task/*/stat` (any task not a zombie keeps the context).
//! Each answer is cached for at most [`TTL`] within one process.
//!
//! Inside a PID namespace of its own (a container without the host's), the scenario's pids
//! are the host's, which this namespace cannot see, and the driver still lists them: each
//! listed process is then reported alive unless an instance on the host shared its death
//! ([`crate::deaths`]); `Sim` asks that file, not this cache, there.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// How long one liveness answer is reused within one process.
pub const TTL: Duration = Duration::from_millis(20);

/// At most this many pidfds are kept open (one per live listed process): a quarter of the
/// process's open-file limit, so that the program the library is loaded into keeps plenty.
fn max_held() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
        limit.rlim_cur as usize
    } else {
        1024
    };
    (soft / 4).min(4096)
}

#[derive(Debug, Default)]
pub struct LiveCache {
    map: HashMap<u32, (Instant, bool)>,
    /// A pidfd per live process seen, kept so that the next check is one poll, not
    /// open + poll + close. Pidfds are close-on-exec, so none leak into exec'd programs.
    held: HashMap<u32, OwnedFd>,
    /// An epoll set holding every held pidfd, so that one `epoll_wait` names the processes
    /// that exited since the last look, at a cost that does not grow with the processes
    /// held (a `poll` over them all does). `None` until first needed, or where epoll fails
    /// (each held pidfd is then polled).
    exits: Option<Option<OwnedFd>>,
    max_held: Option<usize>,
}

impl LiveCache {
    pub fn is_alive(&mut self, pid: u32, now: Instant) -> bool {
        if let Some((at, alive)) = self.map.get(&pid)
            && now.duration_since(*at) < TTL
        {
            return *alive;
        }
        let alive = self.check(pid);
        if self.map.len() > 16384 {
            self.map.retain(|_, (at, _)| now.duration_since(*at) < TTL);
        }
        self.map.insert(pid, (now, alive));
        alive
    }

    /// Brings the answers for `pids` up to date with one look at the epoll set (or one
    /// poll over their held pidfds): a GPU lists hundreds of processes. Pids without a held
    /// pidfd are left to `is_alive`.
    pub fn refresh(&mut self, pids: impl Iterator<Item = u32>, now: Instant) {
        let due: Vec<u32> = pids
            .filter(|pid| {
                self.held.contains_key(pid)
                    && self
                        .map
                        .get(pid)
                        .is_none_or(|(at, _)| now.duration_since(*at) >= TTL)
            })
            .collect();
        if due.len() < 2 {
            return;
        }
        let exited = match self.exits.as_ref().and_then(Option::as_ref) {
            Some(epoll) => match exited_in(epoll.as_raw_fd()) {
                Some(exited) => exited,
                None => return,
            },
            None => {
                let mut polls: Vec<libc::pollfd> = due
                    .iter()
                    .map(|pid| libc::pollfd {
                        fd: self.held[pid].as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    })
                    .collect();
                // SAFETY: `polls` is a live array of pollfds that we own; zero timeout.
                let ready =
                    unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, 0) };
                if ready < 0 {
                    return;
                }
                due.iter()
                    .zip(&polls)
                    .filter(|(_, poll)| poll.revents & libc::POLLIN != 0)
                    .map(|(pid, _)| *pid)
                    .collect()
            }
        };
        for pid in &exited {
            // Left for `is_alive` to look at afresh: its pid may name a new process by now.
            // Closing the pidfd takes it out of the epoll set.
            self.held.remove(pid);
            self.map.remove(pid);
        }
        for pid in due {
            if self.held.contains_key(&pid) {
                self.map.insert(pid, (now, true));
            }
        }
    }

    /// Keeps a live process's pidfd, registered in the epoll set where there is one.
    fn hold(&mut self, pid: u32, fd: OwnedFd) {
        let exits = self.exits.get_or_insert_with(new_epoll);
        if let Some(epoll) = exits {
            let mut event = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: u64::from(pid),
            };
            // SAFETY: both descriptors are open and ours; `event` is read during the call.
            let added = unsafe {
                libc::epoll_ctl(
                    epoll.as_raw_fd(),
                    libc::EPOLL_CTL_ADD,
                    fd.as_raw_fd(),
                    &mut event,
                )
            };
            if added != 0 {
                // Not in the set: it would never be reported. Fall back to polling each.
                *exits = None;
            }
        }
        self.held.insert(pid, fd);
    }

    pub fn clear(&mut self) {
        self.map.clear();
    }

    fn check(&mut self, pid: u32) -> bool {
        if in_child_pid_namespace() {
            // A host pid: a pidfd or /proc here would name another process, or none.
            return true;
        }
        if let Some(fd) = self.held.get(&pid) {
            if readable(fd.as_raw_fd()) == Some(false) {
                return true;
            }
            // That process exited; the pid may belong to a new one now: look afresh.
            self.held.remove(&pid);
        }
        if pid == 0 || pid > i32::MAX as u32 {
            return false;
        }
        match open_pidfd(pid) {
            Some(fd) => match readable(fd.as_raw_fd()) {
                Some(false) => {
                    if self.held.len() < *self.max_held.get_or_insert_with(max_held) {
                        self.hold(pid, fd);
                    }
                    true
                }
                Some(true) => false,
                None => alive_in_proc(pid),
            },
            None => alive_in_proc(pid),
        }
    }
}

/// `PROC_PID_INIT_INO`: the inode of the host's (initial) PID namespace.
const INIT_PID_NS_INODE: u64 = 0xEFFF_FFFC;

/// Whether this process runs in a PID namespace other than the host's, where the pids the
/// driver reports (the host's) name nothing, or something else. Read once.
pub fn in_child_pid_namespace() -> bool {
    static CHILD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CHILD.get_or_init(|| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self/ns/pid").is_ok_and(|meta| meta.ino() != INIT_PID_NS_INODE)
    })
}

fn new_epoll() -> Option<OwnedFd> {
    // SAFETY: epoll_create1 takes flags and returns a new fd or -1.
    let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    // SAFETY: a non-negative return is a new descriptor that we now own.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The pids (event data) of readable pidfds in the epoll set: processes that exited. At
/// most 256 a call; the set is level-triggered, so any beyond are named by the next one.
/// `None` if epoll_wait fails.
fn exited_in(epoll: libc::c_int) -> Option<Vec<u32>> {
    const BATCH: usize = 256;
    let mut events = [libc::epoll_event { events: 0, u64: 0 }; BATCH];
    // SAFETY: `events` is a live array of BATCH events that we own; zero timeout.
    let n = unsafe { libc::epoll_wait(epoll, events.as_mut_ptr(), BATCH as i32, 0) };
    let n = usize::try_from(n).ok()?;
    Some(events[..n].iter().map(|event| event.u64 as u32).collect())
}

fn open_pidfd(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1; nothing is borrowed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    // SAFETY: a non-negative return is a new descriptor that we now own.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// Whether a pidfd is readable (its thread group has exited); `None` if poll fails.
fn readable(fd: libc::c_int) -> Option<bool> {
    let mut poll = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd that we own, zero timeout.
    let ready = unsafe { libc::poll(&mut poll, 1, 0) };
    (ready >= 0).then_some(ready > 0 && poll.revents & libc::POLLIN != 0)
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

/// Whether `pid` holds a GPU context, from /proc: where no pidfd can be had.
fn alive_in_proc(pid: u32) -> bool {
    match stat_state(&format!("/proc/{pid}/stat")) {
        None => false,
        Some(s) if is_dead_state(s) => any_live_task(pid),
        Some(_) => true,
    }
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
