//! `nvml-sim run SCENARIO [-- COMMAND ARGS...]`: starts the scenario's stand-in processes,
//! points NVML clients at the simulated library and runs COMMAND (see README.md).

use std::ffi::{OsStr, OsString};
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};

use nvml_sim::{devdir, scenario};

mod launch;
use launch::{cgroups, users};

const STANDIN_ENV: &str = "NVML_SIM_STANDIN";
const WORKERS_ENV: &str = "NVML_SIM_STANDIN_WORKERS";
/// Set for a `crashed = true` stand-in: the descriptor of its lifeline, a pipe whose write
/// end only the launcher holds. Its workers, which outlive it, live until that pipe closes.
const LIFELINE_ENV: &str = "NVML_SIM_STANDIN_LIFELINE";
/// Test hook: the stand-in's main thread exits while another thread lives on (a zombie
/// leader that still holds its GPU context).
const ZOMBIE_LEADER_ENV: &str = "NVML_SIM_STANDIN_ZOMBIE_LEADER";

const HELP: &str = "\
nvml-sim: run programs against a simulated NVIDIA driver (libnvidia-ml.so.1)

usage:
  nvml-sim run [--create-users] SCENARIO [-- COMMAND [ARGS...]]
  nvml-sim --help

`run` starts a stand-in process for every [[process]] of SCENARIO that has `spawn = [argv...]`
(its /proc/PID/cmdline reads exactly that argv; `workers = N` adds N forked children), writes
the resolved scenario (real pids) to a temporary file and runs COMMAND with:
  NVML_SIM_SCENARIO  the resolved scenario
  GPUCTL_NVML_LIB    the simulated library (libnvml_sim.so next to this binary)
  LD_LIBRARY_PATH    a directory holding libnvidia-ml.so.1 -> that library (pynvml, nvitop,
                     nvidia-smi)
  PATH               with the nvidia-smi that scripts/fetch-nvidia-smi cached appended, when
                     none is on PATH (~/.cache/gpuctl/nvidia-smi, or $GPUCTL_CACHE/nvidia-smi)
  GPUCTL_DEV_DIR     the absolute path of the simulated GPUs' device files (nvidia<minor>,
                     nvidiactl, nvidia-uvm; character devices when run as root): the
                     scenario's device_dir, else a temporary directory; made before COMMAND
As root, a stand-in with `user` runs as that user (a name, or a uid that needs no account;
--create-users makes a missing name a system account for the run, removed at its end), and
one with `cgroup` runs in that cgroup, made in a private subtree of the host's hierarchies,
with COMMAND in a cgroup namespace rooted there, so /proc/PID/cgroup reads as the manager
would write it (`crashed = true`: the stand-in exits, its workers stay on, orphaned).
Without root, user and cgroup are left out, with one warning.
Without COMMAND it runs $SHELL, for an interactive rehearsal. It exits with COMMAND's status
and stops the stand-ins when COMMAND ends or when it gets SIGTERM/SIGHUP (SIGINT goes to
COMMAND, which decides). Bad usage or a bad scenario: one line on stderr, exit status 2.

The scenario format is documented in crates/nvml-sim/README.md.
";

fn main() {
    if std::env::var_os(STANDIN_ENV).is_some_and(|v| v == "1") {
        standin();
    }
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let code = match args.first().and_then(|a| a.to_str()) {
        None => usage_error("missing a command (try: nvml-sim run SCENARIO -- COMMAND)"),
        Some("-h" | "--help" | "help") => {
            print!("{HELP}");
            0
        }
        Some("run") => {
            let mut rest = &args[1..];
            let create_users = rest.first().is_some_and(|a| a == "--create-users");
            if create_users {
                rest = &rest[1..];
            }
            match rest.first() {
                None => usage_error("run: missing the SCENARIO file"),
                Some(s) if s.to_str().is_some_and(|s| s.starts_with('-') && s != "-") => {
                    usage_error(&format!("run: unknown option {}", s.to_string_lossy()))
                }
                Some(s) => {
                    let cmd = match rest.get(1).map(|a| a.as_os_str()) {
                        None => Vec::new(),
                        Some(a) if a == "--" => rest[2..].to_vec(),
                        Some(_) => rest[1..].to_vec(),
                    };
                    match run(Path::new(s), cmd, create_users) {
                        Ok(code) => code,
                        Err(msg) => {
                            eprintln!("nvml-sim: {msg}");
                            2
                        }
                    }
                }
            }
        }
        Some(other) => usage_error(&format!("unknown command '{other}' (try --help)")),
    };
    std::process::exit(code);
}

fn usage_error(msg: &str) -> i32 {
    eprintln!("nvml-sim: {msg}");
    2
}

// -------------------------------------------------------------------------------------------
// Stand-in processes

/// The stand-in: names itself after argv[0], forks its workers, reports their pids on
/// stdout, then sleeps until a signal ends it.
fn standin() -> ! {
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let base = Path::new(&argv0)
        .file_name()
        .unwrap_or(OsStr::new("standin"))
        .as_encoded_bytes();
    let mut comm = [0u8; 16];
    for (c, b) in comm.iter_mut().zip(base.iter().take(15)) {
        *c = if *b == 0 { b'?' } else { *b };
    }
    let workers: u32 = std::env::var(WORKERS_ENV)
        .ok()
        .and_then(|w| w.parse().ok())
        .unwrap_or(0);
    let lifeline: Option<libc::c_int> = std::env::var(LIFELINE_ENV)
        .ok()
        .and_then(|fd| fd.parse().ok());
    // SAFETY: plain libc calls; the process is single-threaded here, so fork is sound, and
    // the children only make async-signal-safe calls.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, comm.as_ptr() as libc::c_ulong, 0, 0, 0);
        let devnull = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        let mut pids = String::new();
        for _ in 0..workers {
            match libc::fork() {
                0 if lifeline.is_some() => {
                    // A crashed run's worker: its parent exits at once, so a parent-death
                    // signal would end it with the crash; it lives until the launcher ends
                    // (the lifeline's write end closes) or a signal ends it.
                    let fd = lifeline.unwrap_or(-1);
                    libc::dup2(devnull, 1);
                    let mut byte = 0u8;
                    loop {
                        let n = libc::read(fd, (&raw mut byte).cast(), 1);
                        if n == 0 || (n < 0 && *libc::__errno_location() != libc::EINTR) {
                            libc::_exit(0);
                        }
                    }
                }
                0 => {
                    libc::prctl(
                        libc::PR_SET_PDEATHSIG,
                        libc::SIGKILL as libc::c_ulong,
                        0,
                        0,
                        0,
                    );
                    if libc::getppid() == 1 {
                        libc::_exit(0);
                    }
                    libc::dup2(devnull, 1);
                    loop {
                        libc::pause();
                    }
                }
                pid if pid > 0 => pids.push_str(&format!("{pid}\n")),
                _ => {}
            }
        }
        let _ = std::io::Write::write_all(&mut std::io::stdout(), pids.as_bytes());
        let _ = std::io::Write::flush(&mut std::io::stdout());
        if lifeline.is_some() {
            // The crash: the run's main process is gone, its workers stay.
            libc::_exit(1);
        }
        libc::dup2(devnull, 1);
        if std::env::var_os(ZOMBIE_LEADER_ENV).is_some_and(|v| v == "1") {
            std::thread::spawn(|| {
                loop {
                    libc::pause();
                }
            });
            // Exit only the main thread, without unwinding (pthread_exit would unwind
            // through Rust frames).
            libc::syscall(libc::SYS_exit, 0);
        }
        loop {
            libc::pause();
        }
    }
}

struct Standin {
    pid: i32,
    workers: Vec<i32>,
    /// A crashed stand-in: its main process exited and was reaped; its workers are held by
    /// pidfds (opened while they were certainly its children), and signalled through them.
    crashed: Option<Vec<std::os::fd::OwnedFd>>,
}

/// Where and as whom a stand-in runs (as root); by default, as the launcher, where it is.
#[derive(Default)]
struct Placement {
    account: Option<users::Account>,
    cgroup: Option<cgroups::Entry>,
    /// The read end of the crashed stand-ins' lifeline.
    lifeline: Option<libc::c_int>,
}

fn spawn_standin(exe: &Path, spec: &scenario::SpawnSpec, at: Placement) -> Result<Standin, String> {
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
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let lifeline = at.lifeline.filter(|_| spec.crashed);
    match lifeline {
        Some(fd) => {
            cmd.env(LIFELINE_ENV, fd.to_string());
        }
        // A crashed run leads its own session (setsid below), as a job started from a shell
        // does: its orphans are then outside the launcher's session too.
        None => {
            cmd.process_group(0);
        }
    }
    let Placement {
        account, cgroup, ..
    } = at;
    // SAFETY: only async-signal-safe calls (open/write/close, unshare, setgroups/setgid/
    // setuid, setsid, fcntl, prctl) on data prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(cgroup) = &cgroup {
                cgroup.enter()?;
            }
            if let Some(fd) = lifeline
                && (libc::setsid() < 0 || libc::fcntl(fd, libc::F_SETFD, 0) < 0)
            {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(account) = account {
                // Groups first: once the uid is not root, they can no longer be changed.
                let groups = [account.gid];
                if libc::setgroups(1, groups.as_ptr()) != 0
                    || libc::setgid(account.gid) != 0
                    || libc::setuid(account.uid) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            // After setuid, which clears it.
            libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            );
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| {
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
    })?;
    let pid = child.id() as i32;
    let mut workers = Vec::new();
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if let Ok(p) = line.trim().parse::<i32>() {
                workers.push(p);
            }
        }
    }
    let crashed = lifeline.map(|_| {
        // The workers are alive (only a signal or the launcher's end stops them), so each
        // pid is still theirs. Then the crash is made final: the main process is reaped.
        let fds = workers.iter().filter_map(|w| pidfd_open(*w)).collect();
        let mut status = 0;
        // SAFETY: reaping our own child, which exits right after naming its workers.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        fds
    });
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
fn stop(standins: &[Standin]) {
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

// -------------------------------------------------------------------------------------------
// run

static SIGNALLED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNALLED.store(sig, Ordering::SeqCst);
}

fn install_handlers() {
    for sig in [libc::SIGTERM, libc::SIGHUP, libc::SIGINT] {
        // SAFETY: installing a handler that only stores to an atomic; no SA_RESTART, so a
        // blocked waitpid returns EINTR.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            sa.sa_flags = 0;
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn make_temp_dir() -> Result<TempDir, String> {
    let base = std::env::var_os("TMPDIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir = base.join(format!("nvml-sim-run-{}-{nanos:08x}", std::process::id()));
    std::fs::create_dir(&dir)
        .map_err(|e| format!("cannot create a temporary directory {}: {e}", dir.display()))?;
    Ok(TempDir(dir))
}

/// The scenario with every `spawn` entry given its real pid and its workers appended, and
/// `device_dir` set to `dev_dir` (absolute: the resolved file lives elsewhere).
fn resolve(
    path: &Path,
    text: &str,
    sc: &scenario::Scenario,
    started: &[(usize, Standin)],
    dev_dir: &Path,
) -> Result<String, String> {
    let mut table: toml::Table =
        toml::from_str(text).map_err(|e| format!("{}: {}", path.display(), e.message()))?;
    table.insert(
        "device_dir".into(),
        toml::Value::String(dev_dir.to_string_lossy().into_owned()),
    );
    if let Some(sf) = &sc.state_file {
        let abs = std::path::absolute(sf).unwrap_or_else(|_| sf.clone());
        table.insert(
            "state_file".into(),
            toml::Value::String(abs.to_string_lossy().into_owned()),
        );
    }
    if let Some(toml::Value::Array(procs)) = table.get_mut("process") {
        let mut extra = Vec::new();
        for (entry, standin) in started {
            let Some(toml::Value::Table(p)) = procs.get_mut(*entry) else {
                continue;
            };
            let spec = sc
                .spawns
                .iter()
                .find(|s| s.entry == *entry)
                .expect("spawn entry");
            for key in [
                "spawn",
                "workers",
                "worker_used_mib",
                "worker_sm_pct",
                "user",
                "cgroup",
                "crashed",
            ] {
                p.remove(key);
            }
            p.insert("pid".into(), toml::Value::Integer(standin.pid.into()));
            for w in &standin.workers {
                let mut wt = toml::Table::new();
                wt.insert("pid".into(), toml::Value::Integer((*w).into()));
                if let Some(g) = p.get("gpu") {
                    wt.insert("gpu".into(), g.clone());
                }
                // Workers share their leader's fate in NVML's eyes: hidden with it, in its
                // MIG instance. Not its listed_pid: each has its own pid in any namespace.
                for key in ["type", "unlisted", "gpu_instance", "compute_instance"] {
                    if let Some(v) = p.get(key) {
                        wt.insert(key.into(), v.clone());
                    }
                }
                if let Some(m) = spec.worker_used_mib {
                    wt.insert("used_mib".into(), toml::Value::Integer(m as i64));
                }
                wt.insert(
                    "sm_pct".into(),
                    toml::Value::Integer(spec.worker_sm_pct.into()),
                );
                extra.push(toml::Value::Table(wt));
            }
        }
        // A crashed run's main process is gone: only its workers are listed.
        let mut k = 0;
        procs.retain(|_| {
            k += 1;
            !sc.spawns.iter().any(|s| s.entry == k - 1 && s.crashed)
        });
        procs.extend(extra);
    }
    toml::to_string(&table).map_err(|e| format!("cannot write the resolved scenario: {e}"))
}

/// Where scripts/fetch-nvidia-smi keeps NVIDIA's nvidia-smi.
fn cached_nvidia_smi_dir() -> Option<PathBuf> {
    let cache = std::env::var_os("GPUCTL_CACHE")
        .filter(|c| !c.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/gpuctl")))?;
    Some(cache.join("nvidia-smi"))
}

/// The PATH for COMMAND: the caller's, with the cached nvidia-smi's directory appended when no
/// nvidia-smi is on it, so `nvml-sim run S -- nvidia-smi` and a script that calls nvidia-smi
/// work as typed on a machine without the driver. `None`: PATH unchanged.
fn path_with_cached_nvidia_smi() -> Option<OsString> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let on_path = std::env::split_paths(&path).any(|dir| dir.join("nvidia-smi").is_file());
    let cached = cached_nvidia_smi_dir()?;
    if on_path || !cached.join("nvidia-smi").is_file() {
        return None;
    }
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    dirs.push(cached);
    std::env::join_paths(dirs).ok()
}

/// What running the stand-ins as the scenario's users, in its cgroups, takes: as root, the
/// accounts and the cgroup subtree (both removed on drop); otherwise one warning, and the
/// stand-ins run as the launcher, where it is.
fn prepare_placement(
    sc: &scenario::Scenario,
    create_users: bool,
) -> Result<(Option<users::Users>, Option<cgroups::Subtree>), String> {
    let with_user = sc.spawns.iter().any(|s| s.user.is_some());
    let cgroup_paths: Vec<&str> = sc
        .spawns
        .iter()
        .filter_map(|s| s.cgroup.as_deref())
        .collect();
    if !with_user && cgroup_paths.is_empty() {
        return Ok((None, None));
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!(
            "nvml-sim: not root: the stand-ins run as you, in your cgroup (the scenario's user and cgroup keys need root)"
        );
        return Ok((None, None));
    }
    let users = users::Users::resolve(
        sc.spawns.iter().filter_map(|s| s.user.as_ref()),
        create_users,
    )?;
    if !users.missing.is_empty() {
        eprintln!(
            "nvml-sim: no user {} here: {} stand-ins run as root (--create-users makes system accounts for the run)",
            users.missing.join(", "),
            if users.missing.len() == 1 {
                "its"
            } else {
                "their"
            }
        );
    }
    let subtree = match cgroup_paths.is_empty() {
        true => None,
        false => match cgroups::Subtree::create(&cgroup_paths) {
            Ok(subtree) => Some(subtree),
            Err(e) => {
                eprintln!("nvml-sim: {e}: the stand-ins run in your cgroup");
                None
            }
        },
    };
    Ok((Some(users), subtree))
}

/// A pipe whose write end only the launcher holds (close-on-exec): the read end, for the
/// workers of crashed stand-ins, sees end-of-file when the launcher ends, however it ends.
fn lifeline() -> Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd), String> {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!(
            "cannot make a pipe: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: both were just returned to us and are owned by nothing else.
    Ok(unsafe {
        (
            std::os::fd::OwnedFd::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        )
    })
}

fn run(path: &Path, command: Vec<OsString>, create_users: bool) -> Result<i32, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{}: cannot read the scenario: {e}", path.display()))?;
    let sc = scenario::parse(path, &text)?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let lib = exe
        .parent()
        .map(|d| d.join("libnvml_sim.so"))
        .filter(|l| l.exists())
        .ok_or_else(|| {
            format!(
                "cannot find libnvml_sim.so next to {} (build it: cargo build -p nvml-sim)",
                exe.display()
            )
        })?;
    let tmp = make_temp_dir()?;
    std::os::unix::fs::symlink(&lib, tmp.0.join("libnvidia-ml.so.1"))
        .map_err(|e| format!("cannot create the libnvidia-ml.so.1 link: {e}"))?;
    // COMMAND is told where the device files are, so there always are some.
    let dev_dir = sc.device_dir.clone().unwrap_or_else(|| tmp.0.join("dev"));
    let dev_dir = std::path::absolute(&dev_dir).unwrap_or(dev_dir);
    let with_dev_dir = scenario::Scenario {
        device_dir: Some(dev_dir.clone()),
        ..sc.clone()
    };
    if let Err(e) = devdir::create_device_dir(&with_dev_dir) {
        if !dev_dir.is_dir() {
            return Err(e);
        }
        // Some files are missing or not devices: COMMAND may still get by.
        eprintln!("nvml-sim: {e}");
    }
    install_handlers();
    let (users, subtree) = prepare_placement(&sc, create_users)?;
    let (lifeline_read, _lifeline_write) = lifeline()?;

    let mut started: Vec<(usize, Standin)> = Vec::new();
    for spec in &sc.spawns {
        let placement = Placement {
            account: users
                .as_ref()
                .zip(spec.user.as_ref())
                .and_then(|(users, user)| users.account(user)),
            cgroup: subtree
                .as_ref()
                .map(|subtree| subtree.entry(spec.cgroup.as_deref())),
            lifeline: Some(std::os::fd::AsRawFd::as_raw_fd(&lifeline_read)),
        };
        match spawn_standin(&exe, spec, placement) {
            Ok(s) => started.push((spec.entry, s)),
            Err(e) => {
                let all: Vec<Standin> = started.into_iter().map(|(_, s)| s).collect();
                stop(&all);
                return Err(e);
            }
        }
    }
    let standins_of = |started: Vec<(usize, Standin)>| -> Vec<Standin> {
        started.into_iter().map(|(_, s)| s).collect()
    };
    let resolved = match resolve(path, &text, &sc, &started, &dev_dir) {
        Ok(r) => r,
        Err(e) => {
            stop(&standins_of(started));
            return Err(e);
        }
    };
    let scenario_file = tmp.0.join("scenario.toml");
    if let Err(e) = std::fs::write(&scenario_file, resolved) {
        stop(&standins_of(started));
        return Err(format!("cannot write {}: {e}", scenario_file.display()));
    }

    let mut ld = tmp.0.clone().into_os_string();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|o| !o.is_empty()) {
        ld.push(":");
        ld.push(old);
    }
    let command = if command.is_empty() {
        let shell = std::env::var_os("SHELL")
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "/bin/sh".into());
        let pids: Vec<String> = started
            .iter()
            .flat_map(|(_, s)| std::iter::once(s.pid).chain(s.workers.iter().copied()))
            .map(|p| p.to_string())
            .collect();
        eprintln!(
            "nvml-sim: NVML_SIM_SCENARIO={} GPUCTL_NVML_LIB={} LD_LIBRARY_PATH={} GPUCTL_DEV_DIR={} ({} GPUs, stand-in pids: [{}]); exit the shell to stop",
            scenario_file.display(),
            lib.display(),
            ld.to_string_lossy(),
            dev_dir.display(),
            sc.gpus.len(),
            pids.join(" ")
        );
        vec![shell]
    } else {
        command
    };
    // A signal during the setup: nothing to forward it to yet; stop here.
    let sig = SIGNALLED.swap(0, Ordering::SeqCst);
    if sig == libc::SIGTERM || sig == libc::SIGHUP {
        stop(&standins_of(started));
        return Ok(128 + sig);
    }
    let mut child = Command::new(&command[0]);
    if let Some(path) = path_with_cached_nvidia_smi() {
        child.env("PATH", path);
    }
    if let Some(subtree) = &subtree {
        // COMMAND reads the stand-ins' /proc/PID/cgroup relative to its own cgroup
        // namespace: rooted at the subtree, they read as their managers would write them.
        let entry = subtree.entry(None);
        // SAFETY: Entry::enter makes only async-signal-safe calls on prepared data.
        unsafe {
            child.pre_exec(move || entry.enter());
        }
    }
    let child = child
        .args(&command[1..])
        .env("NVML_SIM_SCENARIO", &scenario_file)
        .env("GPUCTL_NVML_LIB", &lib)
        .env("LD_LIBRARY_PATH", &ld)
        // gpuctl keeps per-GPU state (peak marks) by UUID; simulated GPUs' state must not
        // land in the machine's real state directory.
        .env("GPUCTL_STATE_DIR", tmp.0.join("gpuctl-state"))
        .env("GPUCTL_DEV_DIR", &dev_dir)
        .spawn();
    let child = match child {
        Ok(c) => c,
        Err(e) => {
            stop(&standins_of(started));
            let hint = if command[0] == "nvidia-smi" {
                " (none on PATH or in the cache: fetch NVIDIA's with scripts/fetch-nvidia-smi)"
            } else {
                ""
            };
            return Err(format!(
                "cannot run {}: {e}{hint}",
                command[0].to_string_lossy()
            ));
        }
    };
    let cpid = child.id() as i32;
    let mut status = 0;
    let code = loop {
        // SAFETY: waiting for our own child.
        let r = unsafe { libc::waitpid(cpid, &mut status, 0) };
        if r == cpid {
            if libc::WIFEXITED(status) {
                break libc::WEXITSTATUS(status);
            }
            if libc::WIFSIGNALED(status) {
                break 128 + libc::WTERMSIG(status);
            }
            continue;
        }
        let sig = SIGNALLED.swap(0, Ordering::SeqCst);
        if sig == libc::SIGTERM || sig == libc::SIGHUP {
            // SAFETY: forwarding the signal to our child.
            unsafe { libc::kill(cpid, sig) };
        } else if r < 0 && sig == 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EINTR) {
                break 1;
            }
        }
    };
    stop(&standins_of(started));
    drop(tmp);
    Ok(code)
}
