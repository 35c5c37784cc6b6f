//! Starting the stand-ins where and as whom the scenario says, and stopping them, their
//! workers included, without ever signalling a pid that may have been reused.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use nvml_sim::scenario;

use super::standin::{LIFELINE_ENV, STANDIN_ENV, WORKERS_ENV};
use super::{cgroups, users};

pub(super) struct Standin {
    pub(super) pid: i32,
    pub(super) workers: Vec<i32>,
    /// A crashed stand-in: its main process exited and was reaped; its workers are held by
    /// pidfds (opened while they were certainly its children), and signalled through them.
    crashed: Option<Vec<std::os::fd::OwnedFd>>,
}

/// Where and as whom a stand-in runs (as root); by default, as the launcher, where it is.
#[derive(Default)]
pub(super) struct Placement {
    pub(super) account: Option<users::Account>,
    pub(super) cgroup: Option<cgroups::Entry>,
    /// The read end of the crashed stand-ins' lifeline.
    pub(super) lifeline: Option<libc::c_int>,
}

pub(super) fn spawn_standin(
    exe: &Path,
    spec: &scenario::SpawnSpec,
    at: Placement,
) -> Result<Standin, String> {
    // Another user may not be able to reach the binary's path (a checkout under /root):
    // /proc/self/exe reaches the file itself.
    let program = match at.account {
        Some(_) => Path::new("/proc/self/exe"),
        None => exe,
    };
    let mut cmd = Command::new(program);
    cmd.arg0(&spec.argv[0])
        .args(&spec.argv[1..])
        .env(STANDIN_ENV, "1")
        .env(WORKERS_ENV, spec.workers.to_string())
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let lifeline = at.lifeline.filter(|_| spec.crashed);
    match lifeline {
        Some(fd) => {
            cmd.env(LIFELINE_ENV, fd.to_string());
        }
        // A crashed run leads its own session (setsid in `enter_placement`), as a job started from a shell
        // does: its orphans are then outside the launcher's session too.
        None => {
            cmd.process_group(0);
        }
    }
    let Placement {
        account, cgroup, ..
    } = at;
    // SAFETY: `enter_placement` makes only async-signal-safe calls, on data prepared before
    // the fork.
    unsafe {
        cmd.pre_exec(move || enter_placement(cgroup.as_ref(), lifeline, account.as_ref()));
    }
    let mut child = cmd.spawn().map_err(|e| spawn_failure(spec, &e))?;
    let pid = child.id() as i32;
    let workers = child.stdout.take().map(read_workers).unwrap_or_default();
    let crashed = lifeline.map(|_| make_crash_final(pid, &workers));
    if workers.len() != spec.workers as usize {
        let n = workers.len();
        stop(&[Standin {
            pid,
            workers,
            crashed,
        }]);
        return Err(format!(
            "the stand-in {:?} started {n} of {} workers",
            spec.argv, spec.workers
        ));
    }
    Ok(Standin {
        pid,
        workers,
        crashed,
    })
}

/// In the forked child before exec: the cgroup, a crashed run's own session and lifeline, the
/// account, and death with the launcher. Only async-signal-safe calls (open/write/close,
/// unshare, setgroups/setgid/setuid, setsid, fcntl, prctl).
fn enter_placement(
    cgroup: Option<&cgroups::Entry>,
    lifeline: Option<libc::c_int>,
    account: Option<&users::Account>,
) -> std::io::Result<()> {
    if let Some(cgroup) = cgroup {
        cgroup.enter()?;
    }
    if let Some(fd) = lifeline {
        // SAFETY: setsid and fcntl on a descriptor the launcher passed down open.
        if unsafe { libc::setsid() < 0 || libc::fcntl(fd, libc::F_SETFD, 0) < 0 } {
            return Err(std::io::Error::last_os_error());
        }
    }
    if let Some(account) = account {
        // Groups first: once the uid is not root, they can no longer be changed.
        let groups = [account.gid];
        // SAFETY: plain credential calls on values copied before the fork.
        if unsafe {
            libc::setgroups(1, groups.as_ptr()) != 0
                || libc::setgid(account.gid) != 0
                || libc::setuid(account.uid) != 0
        } {
            return Err(std::io::Error::last_os_error());
        }
    }
    // After setuid, which clears it.
    // SAFETY: prctl with integer arguments only.
    unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    Ok(())
}

/// The line for a stand-in that could not start, naming as whom and where it was to run.
fn spawn_failure(spec: &scenario::SpawnSpec, e: &std::io::Error) -> String {
    let mut how = Vec::new();
    if let Some(user) = &spec.user {
        how.push(format!("as {user}"));
    }
    if let Some(path) = &spec.cgroup {
        how.push(format!("in the cgroup {path}"));
    }
    let how = if how.is_empty() {
        String::new()
    } else {
        format!(" {}", how.join(" "))
    };
    format!("cannot start the stand-in {:?}{how}: {e}", spec.argv)
}

/// The worker pids a stand-in prints, one a line, until it closes its stdout.
fn read_workers(out: std::process::ChildStdout) -> Vec<i32> {
    let mut workers = Vec::new();
    for line in BufReader::new(out).lines() {
        let Ok(line) = line else { break };
        if let Ok(p) = line.trim().parse::<i32>() {
            workers.push(p);
        }
    }
    workers
}

/// A crashed stand-in's workers held by pidfds, then its main process reaped. The workers are
/// alive (only a signal or the launcher's end stops them), so each pid is still theirs.
fn make_crash_final(pid: i32, workers: &[i32]) -> Vec<std::os::fd::OwnedFd> {
    let fds = workers.iter().filter_map(|w| pidfd_open(*w)).collect();
    let mut status = 0;
    // SAFETY: reaping our own child, which exits right after naming its workers.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    fds
}

fn pidfd_open(pid: i32) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    // SAFETY: a descriptor just returned to us, owned by nothing else.
    (fd >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// Stops the stand-ins and their workers (which share the stand-in's process group) and reaps
/// the stand-ins. Every signal goes to a group whose leader is our unreaped child: until it is
/// reaped its pid, and so the group id, cannot be reused, so nothing else can be hit. Worker
/// pids are never signalled one by one: one that exited may have been reused already. The
/// workers of a crashed stand-in, whose leader is reaped, are signalled through their
/// pidfds, which name them and nothing else.
pub(super) fn stop(standins: &[Standin]) {
    use std::os::fd::AsRawFd;
    let signal_all = |sig: libc::c_int| {
        for s in standins {
            match &s.crashed {
                // Without pidfds (an old kernel): the group, whose id its live workers keep
                // from being reused.
                Some(fds) if fds.len() < s.workers.len() => {
                    // SAFETY: signalling the crashed stand-in's own process group.
                    unsafe { libc::kill(-s.pid, sig) };
                }
                Some(fds) => {
                    for fd in fds {
                        // SAFETY: pidfd_send_signal on a pidfd we hold.
                        unsafe {
                            libc::syscall(
                                libc::SYS_pidfd_send_signal,
                                fd.as_raw_fd(),
                                sig,
                                std::ptr::null::<libc::siginfo_t>(),
                                0,
                            )
                        };
                    }
                }
                // SAFETY: signalling a process group we created, whose leader we have not
                // reaped.
                None => unsafe {
                    libc::kill(-s.pid, sig);
                },
            }
        }
    };
    signal_all(libc::SIGTERM);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    for s in standins {
        let ended = || match &s.crashed {
            // SAFETY: signal 0 only asks whether the group still has a process.
            Some(fds) if fds.len() < s.workers.len() => unsafe { libc::kill(-s.pid, 0) != 0 },
            Some(fds) => fds.iter().all(|fd| pidfd_exited(fd.as_raw_fd())),
            None => leader_exited(s.pid),
        };
        while !ended() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
    // Workers that ignored TERM, and a leader that did: the group still exists.
    signal_all(libc::SIGKILL);
    for s in standins.iter().filter(|s| s.crashed.is_none()) {
        let mut status = 0;
        // SAFETY: reaping our own child.
        unsafe { libc::waitpid(s.pid, &mut status, 0) };
    }
}

/// Whether the process a pidfd names has exited (the pidfd is readable then).
fn pidfd_exited(fd: libc::c_int) -> bool {
    let mut poll = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: polling one pollfd we own, without waiting.
    let r = unsafe { libc::poll(&mut poll, 1, 0) };
    r != 0
}

/// Whether our child `pid` has exited, leaving it unreaped (WNOWAIT).
fn leader_exited(pid: i32) -> bool {
    // SAFETY: siginfo_t is plain data that waitid fills in.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
    // SAFETY: waitid on our own child, writing into `info` which we own.
    let r = unsafe { libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, flags) };
    // With WNOHANG, si_pid stays 0 while the child runs; an error means there is nothing to
    // wait for.
    // SAFETY: waitid filled `info` in for a child-state event (or left it zeroed), which is
    // when si_pid is the field to read.
    r != 0 || unsafe { info.si_pid() } != 0
}
