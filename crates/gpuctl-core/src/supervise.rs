//! Running a command as its parent and child subreaper (`gpuctl run`): the signals a
//! launcher gets are passed on to the command, whatever the command leaves behind (its
//! workers, and what left its session) stays below this process to be found and ended,
//! work is done on a tick while it runs, and every child is reaped here, never by std.
//!
//! ```text
//! Supervisor::start() -> spawn(command) -> wait(child, ticks) -> leftovers() -> reap_all()
//! ```

use std::io;
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::{SigSet, Signal};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};

use crate::host::tree;
use crate::runfile::Recorded;

/// The signals passed on to the command.
pub const FORWARDED: [Signal; 4] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
];

/// How the command's main process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

impl Status {
    /// The launcher's own exit status, as a shell gives it: the command's, 128+N for
    /// signal N.
    pub fn exit_status(self) -> u8 {
        match (self.code, self.signal) {
            (Some(code), _) => code as u8,
            (None, Some(signal)) => (128 + signal) as u8,
            (None, None) => 1,
        }
    }
}

/// Work done while the command runs: first after `first`, then every `every`.
pub struct Tick<'a> {
    pub first: Duration,
    pub every: Duration,
    pub work: &'a mut dyn FnMut(),
}

/// This process as a command's supervisor: the forwarded signals and SIGCHLD are blocked
/// in the thread that made it (they wait for [`Supervisor::wait`]), and the process is a
/// child subreaper.
pub struct Supervisor {
    mask: SigSet,
}

impl Supervisor {
    /// Before any other thread starts (threads inherit the mask): until [`Supervisor::wait`]
    /// takes them, the forwarded signals never end this process before it has ended what
    /// its command left.
    pub fn start() -> io::Result<Supervisor> {
        let mut mask = SigSet::empty();
        for signal in FORWARDED.iter().copied().chain([Signal::SIGCHLD]) {
            mask.add(signal);
        }
        mask.thread_block()?;
        // SAFETY: prctl with integer arguments, no pointers.
        if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
            return Err(io::Error::other(format!(
                "cannot become a child subreaper: {}",
                io::Error::last_os_error()
            )));
        }
        Ok(Supervisor { mask })
    }

    /// Starts `command` with no signal blocked (this process's mask is inherited across
    /// exec: the command must die of a SIGTERM, and its workers too). Its pid; it is reaped
    /// by [`Supervisor::wait`].
    pub fn spawn(&self, command: &mut Command) -> io::Result<u32> {
        let unblock = self.mask;
        // SAFETY: between fork and exec only pthread_sigmask runs, which is
        // async-signal-safe and touches no memory shared with the parent.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(command, move || {
                unblock.thread_unblock().map_err(io::Error::from)
            });
        }
        let child = command.spawn()?;
        Ok(child.id())
    }

    /// Waits for the command's main process `child`, passing on the signals this process
    /// gets (not those a terminal sent its whole foreground group) and doing `ticks` as
    /// they fall due; reaps every child that ends meanwhile.
    pub fn wait(&self, child: u32, ticks: &mut [Tick<'_>]) -> Status {
        let started = Instant::now();
        let mut due: Vec<Instant> = ticks.iter().map(|t| started + t.first).collect();
        loop {
            if let Some(status) = reap(Some(child)) {
                return status;
            }
            let now = Instant::now();
            for (tick, at) in ticks.iter_mut().zip(&mut due) {
                if now >= *at {
                    (tick.work)();
                    *at = Instant::now() + tick.every;
                }
            }
            // No tick: the command's end or a signal wakes the wait, checked each second.
            let until = due
                .iter()
                .min()
                .copied()
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(1));
            let timeout = until.saturating_duration_since(Instant::now());
            if let Some(info) = wait_signal(&self.mask, timeout)
                && info.si_signo != libc::SIGCHLD
            {
                forward(&info, child);
            }
        }
    }

    /// Every process still below this one, parents first: the command's workers, and the
    /// orphans handed to this subreaper.
    pub fn leftovers(&self) -> Vec<Recorded> {
        tree::descendants(std::process::id())
            .into_iter()
            .map(|stat| Recorded {
                pid: stat.pid,
                start_ticks: stat.starttime,
                role: stat.comm,
            })
            .collect()
    }

    /// Reaps every child that has ended (the leftovers ended are this subreaper's).
    pub fn reap_all(&self) {
        let _ = reap(None);
    }
}

/// One of `mask`'s signals, or none within `timeout`.
fn wait_signal(mask: &SigSet, timeout: Duration) -> Option<libc::siginfo_t> {
    let timeout = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: an all-zero siginfo_t is a valid value for the kernel to fill in.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: the set, siginfo and timespec are valid for the call; the signals are blocked
    // in this thread, as sigtimedwait requires.
    let signal = unsafe { libc::sigtimedwait(mask.as_ref(), &mut info, &timeout) };
    (signal > 0).then_some(info)
}

/// Passes a signal on to the command, unless the terminal sent it: a terminal's Ctrl-C,
/// Ctrl-\ or hangup goes to its whole foreground process group, the command's too.
fn forward(info: &libc::siginfo_t, child: u32) {
    if info.si_code == libc::SI_KERNEL {
        return;
    }
    if let Ok(signal) = Signal::try_from(info.si_signo) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child as i32), signal);
    }
}

/// Reaps every child that has ended (orphans handed to this subreaper included); the
/// status of `child` once it has.
fn reap(child: Option<u32>) -> Option<Status> {
    let mine = |pid: nix::unistd::Pid| Some(pid.as_raw() as u32) == child;
    let mut found = None;
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) if mine(pid) => {
                found = Some(Status {
                    code: Some(code),
                    signal: None,
                });
            }
            Ok(WaitStatus::Signaled(pid, signal, _)) if mine(pid) => {
                found = Some(Status {
                    code: None,
                    signal: Some(signal as i32),
                });
            }
            Ok(WaitStatus::StillAlive) | Err(_) => return found,
            Ok(_) => {}
        }
    }
}
