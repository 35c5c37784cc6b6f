//! Ending processes safely: the `act` step of the pipeline.
//!
//! Process identity is (pid, start time in boot ticks); nothing is signalled on a pid alone.
//!
//! The preferred mechanism is a pidfd: `pidfd_open(pid)` returns a handle on the process that
//! the pid named at that moment, and `pidfd_send_signal` on it can never reach another process,
//! even if the pid number is recycled later (the kernel answers ESRCH once the process is
//! reaped). Right after opening the pidfd, the start time in /proc/PID/stat is compared with
//! the observed one: if they match, the pidfd was opened on the observed process (a process
//! keeps its pid for life, and it existed before the pidfd was opened), so every later signal
//! through it is safe. A pidfd also becomes readable when its process exits, so one `poll(2)`
//! waits for any number of targets at once.
//!
//! Where pidfds are unavailable (kernels before 5.3, seccomp filters, file-descriptor limits)
//! the fallback re-reads the start time immediately before each `kill(2)` and waits by polling
//! /proc every few milliseconds. That leaves a small window, see [`MethodChoice::Kill`].

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::Pid;
use serde::Serialize;

use crate::sys::{pidfd, procfile};

/// How often the kill(2) fallback looks at /proc while it waits.
const PROC_POLL_INTERVAL: Duration = Duration::from_millis(5);

/// A process as it was observed: pid plus start time in clock ticks since boot (field 22 of
/// /proc/PID/stat).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Identity {
    pub pid: u32,
    pub start_ticks: u64,
}

impl Identity {
    pub fn new(pid: u32, start_ticks: u64) -> Identity {
        Identity { pid, start_ticks }
    }

    /// The identity of the process that `pid` names now, read from /proc/PID/stat.
    pub fn observe(pid: u32) -> io::Result<Identity> {
        let stat = read_stat(pid)?;
        Ok(Identity {
            pid,
            start_ticks: stat.start_ticks,
        })
    }
}

/// A signal by number. Parsed from "TERM", "SIGTERM", "term", "15", "RTMIN+2", ...; shown as
/// "SIGTERM".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Signal(i32);

/// Signal names without the SIG prefix. The first name of a number is the one shown.
const SIGNAL_NAMES: &[(&str, i32)] = &[
    ("HUP", libc::SIGHUP),
    ("INT", libc::SIGINT),
    ("QUIT", libc::SIGQUIT),
    ("ILL", libc::SIGILL),
    ("TRAP", libc::SIGTRAP),
    ("ABRT", libc::SIGABRT),
    ("IOT", libc::SIGABRT),
    ("BUS", libc::SIGBUS),
    ("FPE", libc::SIGFPE),
    ("KILL", libc::SIGKILL),
    ("USR1", libc::SIGUSR1),
    ("SEGV", libc::SIGSEGV),
    ("USR2", libc::SIGUSR2),
    ("PIPE", libc::SIGPIPE),
    ("ALRM", libc::SIGALRM),
    ("TERM", libc::SIGTERM),
    ("CHLD", libc::SIGCHLD),
    ("CLD", libc::SIGCHLD),
    ("CONT", libc::SIGCONT),
    ("STOP", libc::SIGSTOP),
    ("TSTP", libc::SIGTSTP),
    ("TTIN", libc::SIGTTIN),
    ("TTOU", libc::SIGTTOU),
    ("URG", libc::SIGURG),
    ("XCPU", libc::SIGXCPU),
    ("XFSZ", libc::SIGXFSZ),
    ("VTALRM", libc::SIGVTALRM),
    ("PROF", libc::SIGPROF),
    ("WINCH", libc::SIGWINCH),
    ("IO", libc::SIGIO),
    ("POLL", libc::SIGIO),
    ("PWR", libc::SIGPWR),
    ("SYS", libc::SIGSYS),
];

/// The kernel's real-time signal range. glibc reserves the first two for itself and reports a
/// higher SIGRTMIN, but kill(2) accepts every number up to the kernel's SIGRTMAX.
fn rt_range() -> (i32, i32) {
    (libc::SIGRTMIN(), libc::SIGRTMAX())
}

impl Signal {
    pub const HUP: Signal = Signal(libc::SIGHUP);
    pub const INT: Signal = Signal(libc::SIGINT);
    pub const KILL: Signal = Signal(libc::SIGKILL);
    pub const TERM: Signal = Signal(libc::SIGTERM);
    pub const CONT: Signal = Signal(libc::SIGCONT);
    pub const STOP: Signal = Signal(libc::SIGSTOP);
    pub const USR1: Signal = Signal(libc::SIGUSR1);
    pub const USR2: Signal = Signal(libc::SIGUSR2);

    /// A signal by number, 1 to SIGRTMAX. 0 (the "does it exist" probe) is not a signal here.
    pub fn from_number(number: i32) -> Result<Signal, String> {
        let max = rt_range().1;
        if (1..=max).contains(&number) {
            Ok(Signal(number))
        } else {
            Err(format!("signal number {number} is out of range (1-{max})"))
        }
    }

    /// Parses "TERM", "SIGTERM", "term", "15", "RTMIN", "SIGRTMIN+3", "RTMAX-1".
    pub fn parse(text: &str) -> Result<Signal, String> {
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err("empty signal name".to_string());
        }
        if let Ok(number) = trimmed.parse::<i64>() {
            let max = rt_range().1;
            return i32::try_from(number)
                .map_err(|_| format!("signal number {number} is out of range (1-{max})"))
                .and_then(Signal::from_number);
        }
        let upper = trimmed.to_ascii_uppercase();
        let name = upper.strip_prefix("SIG").unwrap_or(&upper);
        if let Some(&(_, number)) = SIGNAL_NAMES.iter().find(|(known, _)| *known == name) {
            return Ok(Signal(number));
        }
        let (rtmin, rtmax) = rt_range();
        let realtime = if name == "RTMIN" {
            Some(rtmin)
        } else if name == "RTMAX" {
            Some(rtmax)
        } else if let Some(offset) = name.strip_prefix("RTMIN+") {
            offset.parse::<i32>().ok().map(|k| rtmin.saturating_add(k))
        } else if let Some(offset) = name.strip_prefix("RTMAX-") {
            offset.parse::<i32>().ok().map(|k| rtmax.saturating_sub(k))
        } else {
            None
        };
        match realtime {
            Some(number) if (rtmin..=rtmax).contains(&number) => Ok(Signal(number)),
            Some(_) => Err(format!(
                "real-time signal {text:?} is out of range (RTMIN-RTMAX, {rtmin}-{rtmax})"
            )),
            None => Err(format!(
                "unknown signal {text:?} (expected a name such as TERM, KILL, INT, HUP, USR1, \
                 or a number 1-{rtmax})"
            )),
        }
    }

    /// The conventional name, e.g. "SIGTERM", "SIGRTMIN+2"; "SIG32" for unnamed numbers.
    pub fn name(self) -> String {
        if let Some((name, _)) = SIGNAL_NAMES.iter().find(|(_, n)| *n == self.0) {
            return format!("SIG{name}");
        }
        let (rtmin, rtmax) = rt_range();
        if (rtmin..=rtmax).contains(&self.0) {
            let from_min = self.0 - rtmin;
            let to_max = rtmax - self.0;
            return if from_min == 0 {
                "SIGRTMIN".to_string()
            } else if to_max == 0 {
                "SIGRTMAX".to_string()
            } else if from_min <= to_max {
                format!("SIGRTMIN+{from_min}")
            } else {
                format!("SIGRTMAX-{to_max}")
            };
        }
        format!("SIG{}", self.0)
    }

    pub fn number(self) -> i32 {
        self.0
    }

    /// Whether a stopped target must also get SIGCONT for this signal to be acted on (as
    /// systemd does): not for KILL (acts on stopped processes), CONT itself, or the stop signals
    /// (continuing would undo them).
    fn needs_cont(self) -> bool {
        ![
            libc::SIGKILL,
            libc::SIGCONT,
            libc::SIGSTOP,
            libc::SIGTSTP,
            libc::SIGTTIN,
            libc::SIGTTOU,
        ]
        .contains(&self.0)
    }
}

impl std::fmt::Display for Signal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

impl std::str::FromStr for Signal {
    type Err = String;

    fn from_str(text: &str) -> Result<Signal, String> {
        Signal::parse(text)
    }
}

/// How a target is ended: `signal` first, wait `timeout` for it to exit, then SIGKILL (unless
/// `signal` is already KILL or `escalate` is false), wait `kill_timeout` again.
#[derive(Debug, Clone)]
pub struct Escalation {
    pub signal: Signal,
    pub timeout: Duration,
    pub escalate: bool,
    pub kill_timeout: Duration,
}

impl Escalation {
    /// How long SIGKILL is given to end a process, unless a caller says otherwise.
    pub const KILL_TIMEOUT: Duration = Duration::from_secs(5);

    /// `signal`, `timeout` to exit, then SIGKILL and [`Escalation::KILL_TIMEOUT`]: how every
    /// reclaim ends a process.
    pub fn then_kill(signal: Signal, timeout: Duration) -> Escalation {
        Escalation {
            signal,
            timeout,
            escalate: true,
            kill_timeout: Escalation::KILL_TIMEOUT,
        }
    }

    pub fn with_kill_timeout(self, kill_timeout: Duration) -> Escalation {
        Escalation {
            kill_timeout,
            ..self
        }
    }
}

/// What became of one target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Ended {
    /// Exited after the first signal.
    Exited { signal: String, after_ms: u64 },
    /// Exited only after SIGKILL.
    Killed { after_ms: u64 },
    /// Was already gone (exited, or a zombie whose whole thread group exited) before anything
    /// was sent: nothing sent.
    Gone,
    /// The pid now names a process with another start time: pid reuse. Nothing sent.
    Reused { now_start_ticks: u64 },
    /// Still alive after everything (e.g. uninterruptible sleep, D state).
    StillAlive { signals: Vec<String> },
    /// The kernel refused (EPERM), or another error; also the refusal to signal pid 0, 1 or
    /// the caller itself.
    Failed { error: String },
}

/// Which mechanism is available, for tests and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// pidfd_open + pidfd_send_signal + poll (Linux 5.3+).
    Pidfd,
    /// /proc start-time check immediately before kill(2); waiting polls /proc.
    Kill,
}

/// Which mechanism [`end_all_with`] uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MethodChoice {
    /// A pidfd where `pidfd_open` works, else (ENOSYS, EPERM from seccomp, EMFILE, EINVAL...)
    /// the kill(2) fallback for that target.
    #[default]
    Auto,
    /// Pidfds only; a target whose pidfd cannot be opened is `Failed`.
    Pidfd,
    /// The kill(2) fallback only. Residual race: between the /proc start-time check and
    /// kill(2) the target could exit, be reaped, and its pid be handed to a new process, which
    /// would then get the signal. The window is a few microseconds, and pids are allocated
    /// cyclically, so the pid space would have to wrap around within it.
    Kill,
}

/// The mechanism this kernel and sandbox allow (probed once, on our own pid).
pub fn available_method() -> Method {
    static METHOD: OnceLock<Method> = OnceLock::new();
    *METHOD.get_or_init(|| match pidfd::open(std::process::id() as libc::pid_t) {
        Ok(_fd) => Method::Pidfd,
        Err(_) => Method::Kill,
    })
}

/// Ends every target concurrently: all first signals are sent, then all are awaited together
/// (one poll over all pidfds), the survivors get SIGKILL together and are awaited again. Any
/// number of targets costs about one timeout. Results are in the order of `targets`.
pub fn end_all(targets: &[Identity], how: &Escalation) -> Vec<Ended> {
    end_all_with(targets, how, MethodChoice::Auto)
}

/// [`end_all`] with the mechanism chosen by the caller (tests exercise both paths).
pub fn end_all_with(targets: &[Identity], how: &Escalation, method: MethodChoice) -> Vec<Ended> {
    let first = how.signal;
    let mut results: Vec<Option<Ended>> = vec![None; targets.len()];
    let (mut live, first_sent) = send_first(targets, first, method, &mut results);

    let t0 = first_sent.unwrap_or_else(Instant::now);
    let elapsed = |at: Instant| {
        u64::try_from(at.saturating_duration_since(t0).as_millis()).unwrap_or(u64::MAX)
    };

    if !live.is_empty() {
        let deadline = Instant::now() + how.timeout;
        for (pending, at) in wait_all(&mut live, deadline) {
            results[pending.index] = Some(Ended::Exited {
                signal: first.name(),
                after_ms: elapsed(at),
            });
        }
    }

    if !live.is_empty() && how.escalate && first != Signal::KILL {
        kill_survivors(&mut live, &mut results, first, &elapsed);
        if !live.is_empty() {
            let deadline = Instant::now() + how.kill_timeout;
            for (pending, at) in wait_all(&mut live, deadline) {
                results[pending.index] = Some(Ended::Killed {
                    after_ms: elapsed(at),
                });
            }
        }
    }

    for pending in live {
        results[pending.index] = Some(Ended::StillAlive {
            signals: pending.signals,
        });
    }

    results
        .into_iter()
        .map(|result| {
            result.unwrap_or_else(|| Ended::Failed {
                error: "internal error: no outcome recorded".to_string(),
            })
        })
        .collect()
}

/// Opens each target and sends it the first signal (and SIGCONT to a stopped one that needs
/// it); those that cannot be signalled get their outcome in `results`. The targets signalled,
/// and when the first signal went.
fn send_first(
    targets: &[Identity],
    first: Signal,
    method: MethodChoice,
    results: &mut [Option<Ended>],
) -> (Vec<Pending>, Option<Instant>) {
    let mut live: Vec<Pending> = Vec::with_capacity(targets.len());
    let mut first_sent: Option<Instant> = None;
    for (index, target) in targets.iter().enumerate() {
        let (handle, stat) = match Handle::open(*target, method) {
            Ok(opened) => opened,
            Err(ended) => {
                results[index] = Some(ended);
                continue;
            }
        };
        first_sent.get_or_insert_with(Instant::now);
        match handle.signal(first) {
            Ok(()) => {
                let mut signals = vec![first.name()];
                if first.needs_cont() && stat.is_stopped() && handle.signal(Signal::CONT).is_ok() {
                    signals.push(Signal::CONT.name());
                }
                live.push(Pending {
                    index,
                    handle,
                    signals,
                });
            }
            Err(ended) => results[index] = Some(ended),
        }
    }
    (live, first_sent)
}

/// SIGKILL to each survivor of the first signal; one that exited meanwhile was ended by the
/// first signal.
fn kill_survivors(
    live: &mut Vec<Pending>,
    results: &mut [Option<Ended>],
    first: Signal,
    elapsed: &impl Fn(Instant) -> u64,
) {
    let survivors = std::mem::take(live);
    for mut pending in survivors {
        match pending.handle.signal(Signal::KILL) {
            Ok(()) => {
                pending.signals.push(Signal::KILL.name());
                live.push(pending);
            }
            // It exited between the last look and SIGKILL: the first signal did it.
            Err(Ended::Gone | Ended::Reused { .. }) => {
                results[pending.index] = Some(Ended::Exited {
                    signal: first.name(),
                    after_ms: elapsed(Instant::now()),
                });
            }
            Err(ended) => results[pending.index] = Some(ended),
        }
    }
}

/// Sends one signal to one identity safely, without waiting (e.g. `--signal USR1`). A stopped
/// target also gets SIGCONT unless the signal is KILL, CONT or a stop signal.
pub fn send(target: Identity, signal: Signal) -> Result<(), Ended> {
    let (handle, stat) = Handle::open(target, MethodChoice::Auto)?;
    handle.signal(signal)?;
    if signal.needs_cont() && stat.is_stopped() {
        // Best effort: the signal itself was delivered.
        let _ = handle.signal(Signal::CONT);
    }
    Ok(())
}

/// A target that has been signalled and not yet seen to exit.
struct Pending {
    index: usize,
    handle: Handle,
    signals: Vec<String>,
}

/// A verified target: its identity, and the pidfd on it when that mechanism is used. The
/// pidfd is closed when the handle is dropped.
struct Handle {
    pid: u32,
    start_ticks: u64,
    fd: Option<OwnedFd>,
}

impl Handle {
    /// Opens and verifies a target: refuses pid 0, 1 and ourselves; ESRCH from pidfd_open or a
    /// missing /proc entry is `Gone`; another start time is `Reused`; an exited thread group
    /// (zombie) is `Gone`.
    fn open(target: Identity, method: MethodChoice) -> Result<(Handle, Stat), Ended> {
        let pid = target.pid;
        if pid == 0 || pid == 1 || pid == std::process::id() {
            return Err(Ended::Failed {
                error: format!("refusing to signal pid {pid}"),
            });
        }
        let Ok(raw_pid) = libc::pid_t::try_from(pid) else {
            return Err(Ended::Failed {
                error: format!("invalid pid {pid}"),
            });
        };
        let fd = match method {
            MethodChoice::Kill => None,
            MethodChoice::Auto | MethodChoice::Pidfd => match pidfd::open(raw_pid) {
                Ok(fd) => Some(fd),
                Err(error) if error.raw_os_error() == Some(libc::ESRCH) => return Err(Ended::Gone),
                Err(error) if method == MethodChoice::Pidfd => {
                    return Err(Ended::Failed {
                        error: format!("pidfd_open: {error}"),
                    });
                }
                // ENOSYS, EPERM (seccomp), EMFILE, EINVAL (not a thread-group leader): fall back.
                Err(_) => None,
            },
        };
        let handle = Handle {
            pid,
            start_ticks: target.start_ticks,
            fd,
        };
        let stat = handle.verify()?;
        Ok((handle, stat))
    }

    /// Checks that the pid still names our process and that its thread group has not exited.
    /// With a pidfd held, a match means the pidfd is on our process; without one, it holds
    /// only for the moment of the read.
    fn verify(&self) -> Result<Stat, Ended> {
        let stat = match read_stat(self.pid) {
            Ok(stat) => stat,
            Err(error) if is_missing(&error) => return Err(Ended::Gone),
            Err(error) => {
                return Err(Ended::Failed {
                    error: format!("cannot read /proc/{}/stat: {error}", self.pid),
                });
            }
        };
        if stat.start_ticks != self.start_ticks {
            return Err(Ended::Reused {
                now_start_ticks: stat.start_ticks,
            });
        }
        let exited = match &self.fd {
            Some(fd) => pidfd::exited(fd).unwrap_or_else(|_| group_exited(self.pid, &stat)),
            None => group_exited(self.pid, &stat),
        };
        if exited {
            return Err(Ended::Gone);
        }
        Ok(stat)
    }

    /// Sends a signal. Through the pidfd it cannot reach another process; without one, the
    /// identity is re-checked immediately before kill(2) (see [`MethodChoice::Kill`]).
    fn signal(&self, signal: Signal) -> Result<(), Ended> {
        let outcome = match &self.fd {
            Some(fd) => pidfd::send_signal(fd, signal.0),
            None => {
                self.verify()?;
                // libc, not nix: nix's Signal has no real-time signals, which --signal takes.
                // SAFETY: kill(2) takes two integers and touches no memory of ours.
                let rc = unsafe { libc::kill(self.pid as libc::pid_t, signal.0) };
                if rc == 0 {
                    Ok(())
                } else {
                    Err(io::Error::last_os_error())
                }
            }
        };
        outcome.map_err(|error| match error.raw_os_error() {
            Some(libc::ESRCH) => Ended::Gone,
            Some(libc::EPERM) => Ended::Failed {
                error: "permission denied".to_string(),
            },
            _ => Ended::Failed {
                error: format!("sending {} to pid {}: {error}", signal.name(), self.pid),
            },
        })
    }

    /// Whether the process has exited, judged from /proc: its entry is gone, the pid names
    /// another process, or it is a zombie whose whole thread group has exited.
    fn exited_by_proc(&self) -> bool {
        match read_stat(self.pid) {
            Ok(stat) => stat.start_ticks != self.start_ticks || group_exited(self.pid, &stat),
            Err(error) if is_missing(&error) => true,
            Err(_) => {
                // /proc unreadable (hidepid?): ask the kernel whether the pid exists at all.
                // Signal 0 (None) sends nothing.
                kill(Pid::from_raw(self.pid as libc::pid_t), None) == Err(Errno::ESRCH)
            }
        }
    }
}

/// Waits until `deadline` for the pending targets to exit: one poll(2) over all pidfds, and a
/// /proc check every few milliseconds for targets without one. Returns the ones that exited,
/// with when they were seen to; the survivors stay in `live`.
fn wait_all(live: &mut Vec<Pending>, deadline: Instant) -> Vec<(Pending, Instant)> {
    let mut exited = Vec::new();
    // Set if poll(2) itself fails: from then on pidfd targets are watched through /proc too.
    let mut watch_proc_only = false;
    loop {
        let now = Instant::now();
        let mut done = vec![false; live.len()];
        let mut pollfds = Vec::new();
        let mut polled = Vec::new();
        for (slot, pending) in live.iter().enumerate() {
            match &pending.handle.fd {
                Some(fd) if !watch_proc_only => {
                    pollfds.push(libc::pollfd {
                        fd: fd.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    });
                    polled.push(slot);
                }
                _ => done[slot] = pending.handle.exited_by_proc(),
            }
        }
        take_done(live, &done, now, &mut exited);
        if live.is_empty() {
            break;
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            break;
        }
        // `polled` indexes refer to `live` before take_done; rebuild if anything was removed.
        if done.iter().any(|&d| d) {
            continue;
        }
        let watching_proc = live
            .iter()
            .any(|p| watch_proc_only || p.handle.fd.is_none());
        let wait = if watching_proc {
            remaining.min(PROC_POLL_INTERVAL)
        } else {
            remaining
        };
        if pollfds.is_empty() {
            std::thread::sleep(wait);
            continue;
        }
        let timeout_ms = i32::try_from(wait.as_micros().div_ceil(1000)).unwrap_or(i32::MAX);
        // SAFETY: `pollfds` is a valid, exclusively borrowed array of `pollfds.len()` entries,
        // and every fd in it is owned by a handle in `live` that outlives the call.
        let rc = unsafe {
            libc::poll(
                pollfds.as_mut_ptr(),
                pollfds.len() as libc::nfds_t,
                timeout_ms,
            )
        };
        let seen = Instant::now();
        if rc < 0 {
            if io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                watch_proc_only = true;
            }
            continue;
        }
        let mut done = vec![false; live.len()];
        for (pollfd, &slot) in pollfds.iter().zip(&polled) {
            // POLLIN: the thread group exited (zombie or reaped). POLLERR/POLLHUP/POLLNVAL
            // should not happen on a pidfd; /proc decides then.
            if pollfd.revents & libc::POLLIN != 0 {
                done[slot] = true;
            } else if pollfd.revents != 0 {
                done[slot] = live[slot].handle.exited_by_proc();
            }
        }
        take_done(live, &done, seen, &mut exited);
    }
    exited
}

fn take_done(
    live: &mut Vec<Pending>,
    done: &[bool],
    at: Instant,
    exited: &mut Vec<(Pending, Instant)>,
) {
    if !done.iter().any(|&d| d) {
        return;
    }
    for (pending, &is_done) in std::mem::take(live).into_iter().zip(done) {
        if is_done {
            exited.push((pending, at));
        } else {
            live.push(pending);
        }
    }
}

/// The fields of /proc/PID/stat this module needs.
#[derive(Debug, Clone, Copy)]
struct Stat {
    state: char,
    start_ticks: u64,
}

impl Stat {
    fn is_stopped(&self) -> bool {
        matches!(self.state, 'T' | 't')
    }

    fn is_zombie(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

fn read_stat(pid: u32) -> io::Result<Stat> {
    read_stat_at(&format!("/proc/{pid}/stat"))
}

fn read_stat_at(path: &str) -> io::Result<Stat> {
    procfile::read_stat_line(&fs::File::open(path)?).map(Stat::from)
}

impl From<procfile::StatLine> for Stat {
    fn from(stat: procfile::StatLine) -> Stat {
        Stat {
            state: stat.state,
            start_ticks: stat.starttime,
        }
    }
}

/// A stat line as `read_stat` parses it (the tests' way in, without a file).
#[cfg(test)]
fn parse_stat(bytes: &[u8]) -> io::Result<Stat> {
    procfile::StatLine::parse(bytes)
        .map(Stat::from)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed stat line"))
}

/// Whether a process whose leader is in `stat` has exited as a whole: the leader is a zombie
/// and so is every other thread. A zombie leader whose threads still run still holds its GPU
/// context and is not gone.
fn group_exited(pid: u32, stat: &Stat) -> bool {
    if !stat.is_zombie() {
        return false;
    }
    let tasks = match fs::read_dir(format!("/proc/{pid}/task")) {
        Ok(tasks) => tasks,
        Err(error) => return is_missing(&error),
    };
    for task in tasks.flatten() {
        let name = task.file_name();
        let Some(tid) = name.to_str() else { continue };
        if tid == pid.to_string() {
            continue;
        }
        // A thread whose stat cannot be read has just exited: it does not keep the group.
        let thread = read_stat_at(&format!("/proc/{pid}/task/{tid}/stat"));
        if thread.is_ok_and(|thread| !thread.is_zombie()) {
            return false;
        }
    }
    true
}

fn is_missing(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::NotFound || error.raw_os_error() == Some(libc::ESRCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        let line = b"4242 (a (b) c) T 1 4242 4242 0 -1 4194304 100 0 0 0 5 3 0 0 20 0 1 0 987654 \
                     1000 10 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n";
        let stat = parse_stat(line).unwrap();
        assert_eq!(stat.state, 'T');
        assert_eq!(stat.start_ticks, 987654);
        assert!(stat.is_stopped());
        assert!(parse_stat(b"12 (x) S 1").is_err());
        assert!(parse_stat(b"garbage").is_err());
    }

    #[test]
    fn signal_names_round_trip() {
        for number in 1..=rt_range().1 {
            let signal = Signal::from_number(number).unwrap();
            if number >= rt_range().0 || SIGNAL_NAMES.iter().any(|(_, n)| *n == number) {
                assert_eq!(
                    Signal::parse(&signal.name()),
                    Ok(signal),
                    "{}",
                    signal.name()
                );
            }
        }
    }
}
