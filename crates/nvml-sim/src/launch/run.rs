//! `nvml-sim run`: the stand-ins started, the simulated library and device files set up,
//! COMMAND run with them, and everything stopped and removed when it ends.

use std::ffi::{OsStr, OsString};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicI32, Ordering};

use nvml_sim::{devdir, scenario};

use super::resolve::resolve;
use super::spawn::{Placement, Standin, spawn_standin, stop};
use super::{cgroups, users};

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
    let nanos = super::clock_nanos();
    let dir = base.join(format!("nvml-sim-run-{}-{nanos:08x}", std::process::id()));
    std::fs::create_dir(&dir)
        .map_err(|e| format!("cannot create a temporary directory {}: {e}", dir.display()))?;
    Ok(TempDir(dir))
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

/// Runs COMMAND (or $SHELL) against the scenario at `path`, with its stand-ins started, and
/// returns the status to exit with.
pub fn run(path: &Path, command: Vec<OsString>, create_users: bool) -> Result<i32, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{}: cannot read the scenario: {e}", path.display()))?;
    let sc = scenario::parse(path, &text)?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let lib = library_next_to(&exe)?;
    let tmp = make_temp_dir()?;
    std::os::unix::fs::symlink(&lib, tmp.0.join("libnvidia-ml.so.1"))
        .map_err(|e| format!("cannot create the libnvidia-ml.so.1 link: {e}"))?;
    let dev_dir = device_files(&sc, &tmp)?;
    install_handlers();
    let (users, subtree) = prepare_placement(&sc, create_users)?;
    let (lifeline_read, _lifeline_write) = lifeline()?;
    let started = start_standins(&exe, &sc, users.as_ref(), subtree.as_ref(), &lifeline_read)?;
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
    let command = match command.is_empty() {
        true => interactive_shell(&sc, &started, &scenario_file, &lib, &ld, &dev_dir),
        false => command,
    };
    // A signal during the setup: nothing to forward it to yet; stop here.
    let sig = SIGNALLED.swap(0, Ordering::SeqCst);
    if sig == libc::SIGTERM || sig == libc::SIGHUP {
        stop(&standins_of(started));
        return Ok(128 + sig);
    }
    let state_dir = tmp.0.join("gpuctl-state");
    let env: [(&str, &OsStr); 5] = [
        ("NVML_SIM_SCENARIO", scenario_file.as_os_str()),
        ("GPUCTL_NVML_LIB", lib.as_os_str()),
        ("LD_LIBRARY_PATH", &ld),
        // gpuctl keeps per-GPU state (peak marks) by UUID; simulated GPUs' state must not
        // land in the machine's real state directory.
        ("GPUCTL_STATE_DIR", state_dir.as_os_str()),
        ("GPUCTL_DEV_DIR", dev_dir.as_os_str()),
    ];
    let child = match start_command(&command, subtree.as_ref(), &env) {
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
    let code = wait_for(child.id() as i32);
    stop(&standins_of(started));
    drop(tmp);
    Ok(code)
}

/// $SHELL (else /bin/sh), for an interactive rehearsal, after one line that says what it
/// is given.
fn interactive_shell(
    sc: &scenario::Scenario,
    started: &[(usize, Standin)],
    scenario_file: &Path,
    lib: &Path,
    ld: &OsStr,
    dev_dir: &Path,
) -> Vec<OsString> {
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
}

/// Starts COMMAND with `env` (and, where the scenario has cgroups, in a cgroup namespace
/// rooted at their subtree).
fn start_command(
    command: &[OsString],
    subtree: Option<&cgroups::Subtree>,
    env: &[(&str, &OsStr)],
) -> std::io::Result<std::process::Child> {
    let mut child = Command::new(&command[0]);
    if let Some(path) = path_with_cached_nvidia_smi() {
        child.env("PATH", path);
    }
    if let Some(subtree) = subtree {
        // COMMAND reads the stand-ins' /proc/PID/cgroup relative to its own cgroup
        // namespace: rooted at the subtree, they read as their managers would write them.
        let entry = subtree.entry(None);
        // SAFETY: Entry::enter makes only async-signal-safe calls on prepared data.
        unsafe {
            child.pre_exec(move || entry.enter());
        }
    }
    child.args(&command[1..]).envs(env.iter().copied()).spawn()
}

/// The simulated library, built next to this binary.
fn library_next_to(exe: &Path) -> Result<PathBuf, String> {
    exe.parent()
        .map(|d| d.join("libnvml_sim.so"))
        .filter(|l| l.exists())
        .ok_or_else(|| {
            format!(
                "cannot find libnvml_sim.so next to {} (build it: cargo build -p nvml-sim)",
                exe.display()
            )
        })
}

/// Makes the simulated GPUs' device files (the scenario's `device_dir`, else one in `tmp`)
/// and returns their directory, absolute.
fn device_files(sc: &scenario::Scenario, tmp: &TempDir) -> Result<PathBuf, String> {
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
    Ok(dev_dir)
}

/// Starts every `spawn` entry's stand-in, each with its scenario entry's index; if one
/// cannot start, those already started are stopped.
fn start_standins(
    exe: &Path,
    sc: &scenario::Scenario,
    users: Option<&users::Users>,
    subtree: Option<&cgroups::Subtree>,
    lifeline_read: &std::os::fd::OwnedFd,
) -> Result<Vec<(usize, Standin)>, String> {
    let mut started: Vec<(usize, Standin)> = Vec::new();
    for spec in &sc.spawns {
        let placement = Placement {
            account: users
                .zip(spec.user.as_ref())
                .and_then(|(users, user)| users.account(user)),
            cgroup: subtree.map(|subtree| subtree.entry(spec.cgroup.as_deref())),
            lifeline: Some(std::os::fd::AsRawFd::as_raw_fd(lifeline_read)),
        };
        match spawn_standin(exe, spec, placement) {
            Ok(s) => started.push((spec.entry, s)),
            Err(e) => {
                let all: Vec<Standin> = started.into_iter().map(|(_, s)| s).collect();
                stop(&all);
                return Err(e);
            }
        }
    }
    Ok(started)
}

/// Waits for COMMAND (our child `cpid`), forwarding SIGTERM and SIGHUP to it, and returns
/// the status to exit with: its own, or 128 + the signal that ended it.
fn wait_for(cpid: i32) -> i32 {
    let mut status = 0;
    loop {
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
    }
}
