//! `gpuctl run` leases against another user (issue 46): lease files are root's alone, so no
//! user removes, replaces, `chmod`s or plants one; what a user writes into one (a sparse
//! terabyte, a note naming someone) is never read; the holder is the process the kernel
//! names, so a holder that forked and exited, or a reused pid, is never named; a user's run
//! that finds no lease file asks the root host service for them; `--json-summary` never
//! writes through a link; and no reader reads the kernel's lock table.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::run::{Background, KillOnDrop, gpuctl, lease_dir, pid_in, run, uuids};
use crate::terminal::quote;
use crate::util::{PidReuser, Run, Sim, h200s, is_root, setpriv, wait_until};

/// The user who plants things (nobody) and another who only runs.
const MALLORY: u32 = 65534;
const VICTIM: u32 = 65533;

fn needs_root() {
    assert!(
        is_root(),
        "cannot run here: needs root (files and processes of other users)"
    );
}

/// A scenario of `count` GPUs other users may read, with its lease directory made as root's
/// first run makes it (root's, mode 0755, with the lease file of each GPU it saw, 0666); the
/// UUIDs in the order leases are tried, and by index.
fn shared(count: usize) -> (Sim, Vec<String>, Vec<String>) {
    needs_root();
    let sim = Sim::new(&h200s(count));
    let by_index = uuids(&sim);
    sim.share();
    assert_eq!(root(&sim, &["run", "--", "true"]).code, 0);
    let mut sorted = by_index.clone();
    sorted.sort();
    (sim, sorted, by_index)
}

/// The index of the GPU with `uuid`.
fn index_of(by_index: &[String], uuid: &str) -> String {
    by_index
        .iter()
        .position(|u| u == uuid)
        .expect("a GPU of that UUID")
        .to_string()
}

/// Root's `gpuctl ARGS` with the test's lease directory, in a scratch directory shared with
/// other users (where root uses no device directory of the test's: it is not root's alone).
fn root(sim: &Sim, args: &[&str]) -> Run {
    let mut command = gpuctl(sim, args);
    command.env_remove("GPUCTL_DEV_DIR");
    Run::from(command.output().expect("run gpuctl"))
}

fn lease_file(sim: &Sim, uuid: &str) -> PathBuf {
    lease_dir(sim).join(format!("{uuid}.lease"))
}

/// `gpuctl ARGS` as `uid`, with the test's lease directory.
fn run_as(sim: &Sim, uid: u32, args: &[&str]) -> Run {
    let mut command = sim.gpuctl_as(uid, args);
    command.env("GPUCTL_LEASE_DIR", lease_dir(sim));
    Run::from(command.output().expect("run gpuctl"))
}

/// Root's `gpuctl ARGS` under a 4 GiB address-space limit, as a memory-capped job runs.
fn run_capped(sim: &Sim, args: &[&str]) -> Run {
    let mut command = gpuctl(sim, args);
    command.env_remove("GPUCTL_DEV_DIR");
    // SAFETY: setrlimit is async-signal-safe and touches no memory of the parent.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 4 << 30,
                rlim_max: 4 << 30,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Run::from(command.output().expect("run gpuctl"))
}

/// The leases `info --json` shows on GPU `index`.
fn leases_on(sim: &Sim, index: &str) -> Vec<serde_json::Value> {
    let shown = root(sim, &["info", "--json"]);
    assert_eq!(shown.code, 0, "{}", shown.stderr);
    let doc: serde_json::Value = serde_json::from_str(&shown.stdout).unwrap();
    let index: usize = index.parse().unwrap();
    doc["devices"][index]["leases"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// `uid`'s process holding a POSIX record lock on `path`, as `gpuctl run` holds a lease and
/// as anyone could; with `fork_and_exit` it forks and exits at once, its child keeping the
/// descriptor (never the lock). The process forked, and the pid of the one that keeps
/// running (killed on drop by the caller).
fn locker(uid: u32, path: &Path, fork_and_exit: bool) -> (libc::pid_t, u32) {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut fds = [0; 2];
    // SAFETY: pipe(2) into a local array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the child calls only async-signal-safe functions (the runner has threads).
    let forked = unsafe { libc::fork() };
    if forked == 0 {
        // SAFETY: as above: setgroups, setgid, setuid, open, fcntl, fork, getpid, write,
        // pause and _exit only.
        unsafe {
            let dropped =
                libc::setgroups(0, std::ptr::null()) | libc::setgid(uid) | libc::setuid(uid);
            let fd = libc::open(path.as_ptr(), libc::O_RDWR);
            let lock = libc::flock {
                l_type: libc::F_WRLCK as libc::c_short,
                l_whence: libc::SEEK_SET as libc::c_short,
                l_start: 0,
                l_len: 0,
                l_pid: 0,
            };
            let ok = dropped == 0 && fd >= 0 && libc::fcntl(fd, libc::F_SETLK, &lock) == 0;
            if fork_and_exit && ok && libc::fork() != 0 {
                libc::_exit(0);
            }
            let pid: libc::pid_t = if ok { libc::getpid() } else { 0 };
            libc::write(fds[1], (&pid as *const libc::pid_t).cast(), 4);
            loop {
                libc::pause();
            }
        }
    }
    // SAFETY: the write end is the child's; the read end is read once, 4 bytes.
    let pid = unsafe {
        libc::close(fds[1]);
        let mut pid: libc::pid_t = 0;
        let got = libc::read(fds[0], (&mut pid as *mut libc::pid_t).cast(), 4);
        libc::close(fds[0]);
        assert_eq!(got, 4, "the locker said nothing");
        pid
    };
    assert!(
        pid > 0,
        "uid {uid} could not lock {}",
        path.to_string_lossy()
    );
    (forked, pid as u32)
}

/// The locker forked and the holder that kept running, ended by pid (and the first reaped)
/// on drop, whatever the test's outcome.
struct Lockers(libc::pid_t, u32);

impl Drop for Lockers {
    fn drop(&mut self) {
        // SAFETY: kill and waitpid on processes this test forked.
        unsafe {
            libc::kill(self.1 as libc::pid_t, libc::SIGKILL);
            libc::kill(self.0, libc::SIGKILL);
            libc::waitpid(self.0, std::ptr::null_mut(), 0);
        }
    }
}

/// `uid`'s `gpuctl run ARGS` in the background, with the test's lease directory.
fn background_as(sim: &Sim, uid: u32, args: &[&str]) -> Child {
    let mut command = sim.gpuctl_as(uid, args);
    command
        .env("GPUCTL_LEASE_DIR", lease_dir(sim))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    command.spawn().expect("start gpuctl run")
}

/// `sh -c SCRIPT` as `uid`: whether it succeeded.
fn as_user(uid: u32, script: &str) -> bool {
    setpriv(uid)
        .args(["sh", "-c", script])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run sh")
        .success()
}

/// Finding 3: whoever made a lease file first owned it, and could remove it under another's
/// run and lease the GPU too, or `chmod` it so that no run could lease it.
#[test]
fn no_user_can_remove_replace_chmod_or_plant_a_lease_file() {
    let (sim, uuids, by_index) = shared(1);
    let dir = lease_dir(&sim);
    let path = lease_file(&sim, &uuids[0]);
    let meta = std::fs::metadata(&dir).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o7777), (0, 0o755));
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o7777), (0, 0o666));

    // The victim's run holds the GPU.
    let stop = sim.dir.path().join("stop");
    let pidfile = sim.dir.path().join("command.pid");
    let script = format!(
        "echo $$ > {}; while [ ! -e {} ]; do sleep 0.05; done",
        quote(&pidfile.to_string_lossy()),
        quote(&stop.to_string_lossy())
    );
    let gpu = index_of(&by_index, &uuids[0]);
    let victims = background_as(
        &sim,
        VICTIM,
        &["run", "--gpu", &gpu, "--", "sh", "-c", &script],
    );
    let _command = KillOnDrop::new(pid_in(&pidfile));

    let file = quote(&path.to_string_lossy());
    let other = quote(&dir.join("GPU-planted.lease").to_string_lossy());
    for attack in [
        format!("rm -f {file}"),
        format!("mv {file} {file}.x"),
        format!("chmod 000 {file}"),
        format!("ln -s /etc/shadow {other}"),
        format!(": > {other}"),
    ] {
        assert!(!as_user(MALLORY, &attack), "mallory could: {attack}");
    }
    assert!(std::fs::symlink_metadata(dir.join("GPU-planted.lease")).is_err());
    // Her own run is refused, naming who holds it: the victim's run, as the kernel says.
    let refused = run_as(&sim, MALLORY, &["run", "--gpu", &gpu, "--", "true"]);
    refused.assert_one_line_error(4, &format!("pid {}", victims.id()));
    let shown = leases_on(&sim, &gpu);
    assert_eq!(shown[0]["pid"], victims.id(), "{shown:?}");
    assert_eq!(shown[0]["uid"], VICTIM, "{shown:?}");

    std::fs::write(&stop, "").unwrap();
    let done = Run::from(victims.wait_with_output().unwrap());
    assert_eq!(done.code, 0, "{}", done.stderr);
    assert!(
        !done.stderr.contains("removed or replaced"),
        "{}",
        done.stderr
    );
}

/// Only root makes lease files: a user's run that finds none asks the root host service,
/// which makes one for each GPU it sees; without the service, one line says who makes them.
#[test]
fn a_users_run_without_lease_files_asks_the_host_service() {
    needs_root();
    let sim = Sim::new(&h200s(1));
    sim.share();
    let dir = lease_dir(&sim);
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    run_as(&sim, VICTIM, &["run", "--", "true"])
        .assert_one_line_error(4, "no lease file yet, and only uid 0 makes them");

    // Where only root may write (not the shared scratch directory): the service refuses a
    // socket others could swap.
    let private = tempfile::tempdir().unwrap();
    let socket = private.path().join("api.sock");
    let mut service = gpuctl(&sim, &["serve", "--socket", socket.to_str().unwrap()])
        .stderr(Stdio::null())
        .spawn()
        .expect("start gpuctl serve");
    wait_until(Duration::from_secs(10), || {
        UnixStream::connect(&socket).is_ok()
    });
    let mut asked = sim.gpuctl_as(VICTIM, &["run", "--", "true"]);
    asked
        .env("GPUCTL_LEASE_DIR", &dir)
        .env("GPUCTL_SOCKET", &socket);
    let done = Run::from(asked.output().unwrap());
    let _ = service.kill();
    let _ = service.wait();
    assert_eq!(done.code, 0, "{}", done.stderr);
    let made: Vec<std::fs::Metadata> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().metadata().unwrap())
        .collect();
    assert_eq!(made.len(), 1);
    assert_eq!((made[0].uid(), made[0].mode() & 0o7777), (0, 0o666));
}

/// Finding 2: a directory at one lease's name stopped every run, root's too. Users cannot
/// plant one any more; one left from before (the directory was 1777) steps only its GPU
/// aside, and root removes it.
#[test]
fn a_planted_directory_steps_only_its_gpu_aside_and_root_removes_it() {
    let (sim, uuids, by_index) = shared(2);
    let planted = lease_file(&sim, &uuids[0]);
    std::fs::remove_file(&planted).unwrap();
    std::fs::create_dir(&planted).unwrap();
    std::os::unix::fs::chown(&planted, Some(MALLORY), Some(MALLORY)).unwrap();

    // Tried first (UUID order), stepped around: the other GPU is leased.
    let other = run_as(&sim, VICTIM, &["run", "--gpus", "1", "--", "true"]);
    assert_eq!(other.code, 0, "{}", other.stderr);
    // Asked for by name: refused in one line saying what and whose it is.
    let gpu = index_of(&by_index, &uuids[0]);
    run_as(&sim, VICTIM, &["run", "--gpu", &gpu, "--", "true"])
        .assert_one_line_error(4, "a directory (uid 65534's), not followed: ask root");
    assert!(leases_on(&sim, &gpu).is_empty());
    // Root removes it and takes the lease in a lease file of its own.
    let removed = root(&sim, &["run", "--gpu", &gpu, "--", "true"]);
    assert_eq!(removed.code, 0, "{}", removed.stderr);
    let meta = std::fs::symlink_metadata(&planted).unwrap();
    assert!(meta.is_file() && meta.uid() == 0);
}

/// Finding 1: a sparse terabyte at a lease's name, locked, was read whole by every reader.
/// Anyone may write root's lease file (it is 0666, so that anyone may lock it): what is in
/// it is never read, and whoever locks it is named by the kernel.
#[test]
fn a_locked_sparse_terabyte_costs_readers_and_runs_nothing() {
    let (sim, uuids, by_index) = shared(2);
    let path = lease_file(&sim, &uuids[0]);
    let grow = format!(
        "printf '{{\"pid\":1,\"start_ticks\":1,\"since\":1}}' > {0} && truncate -s 1T {0}",
        quote(&path.to_string_lossy())
    );
    assert!(as_user(MALLORY, &grow), "mallory could not write the file");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 1 << 40);
    let (forked, mallorys) = locker(MALLORY, &path, false);
    let _lockers = Lockers(forked, mallorys);

    let gpu = index_of(&by_index, &uuids[0]);
    for args in [
        &["info", "--json"][..],
        &["info"],
        &["health"],
        &["run", "--gpus", "1", "--", "true"],
    ] {
        let done = run_capped(&sim, args);
        assert_eq!(done.code, 0, "gpuctl {args:?}: {}", done.stderr);
    }
    let refused = run_capped(&sim, &["run", "--gpu", &gpu, "--", "true"]);
    refused.assert_one_line_error(4, &format!("leased by nobody (pid {mallorys}: "));
    let shown = leases_on(&sim, &gpu);
    assert_eq!(shown.len(), 1, "{shown:?}");
    assert_eq!(shown[0]["pid"], mallorys, "{shown:?}");
}

/// Finding 4: the holder was the pid the lock table named, read back later: a holder that
/// forked and exited left its pid to whoever got it next. A record lock is never inherited:
/// the lease is free the moment its locker exits, and nobody is named.
#[test]
fn a_holder_that_forked_and_exited_is_never_named_nor_its_pid_reused() {
    let (sim, uuids, by_index) = shared(2);
    let path = lease_file(&sim, &uuids[1]);
    let (forked, child) = locker(MALLORY, &path, true);
    let _child = KillOnDrop::new(child);
    // SAFETY: waitpid on the process this test forked, which exits at once.
    unsafe { libc::waitpid(forked, std::ptr::null_mut(), 0) };
    // Reaped: the pid may be anyone's now, and only the child is ended by the guard.
    let locker_pid = forked as u32;

    let gpu = index_of(&by_index, &uuids[1]);
    assert!(
        leases_on(&sim, &gpu).is_empty(),
        "the exited locker still holds it"
    );
    // Its pid taken by root's process: still nobody is named.
    let reuser = PidReuser::spawn(locker_pid, "sleep", "reuser").unwrap_or_else(|| {
        panic!("cannot run here: the kernel does not let this test choose a pid (clone3 set_tid)")
    });
    assert!(leases_on(&sim, &gpu).is_empty());
    let table = root(&sim, &["info"]);
    assert!(!table.stdout.contains("reuser"), "{}", table.stdout);
    drop(reuser);
    let taken = run_as(&sim, VICTIM, &["run", "--gpu", &gpu, "--", "true"]);
    assert_eq!(taken.code, 0, "{}", taken.stderr);
}

/// Finding 5: `--json-summary` wrote through a link another user planted.
#[test]
fn the_json_summary_never_writes_through_a_planted_link() {
    needs_root();
    let sim = Sim::new(&h200s(1));
    let victim = sim.dir.path().join("victim");
    std::fs::write(&victim, "root's own\n").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    let link = sim.dir.path().join("summary.json");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    std::os::unix::fs::lchown(&link, Some(MALLORY), Some(MALLORY)).unwrap();
    let link_arg = link.to_string_lossy().into_owned();
    let done = run(&sim, &["run", "--json-summary", &link_arg, "--", "true"]);
    assert_eq!(done.code, 0, "{}", done.stderr);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root's own\n");
    let written = std::fs::symlink_metadata(&link).unwrap();
    assert!(written.is_file() && written.uid() == 0);
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&link).unwrap()).unwrap();
    assert_eq!(summary["exit_code"], 0);
}

/// Finding 6: reading /proc/locks took the kernel's file-lock semaphore, stalling every
/// lock on the machine, in every `info` where a lease directory exists.
#[test]
fn no_reader_reads_the_kernels_lock_table() {
    let strace = ["/usr/bin/strace", "/bin/strace"]
        .into_iter()
        .find(|path| Path::new(path).exists())
        .expect("strace is not installed: scripts/test installs it (apt-get install strace)");
    let sim = Sim::new(&h200s(2));
    let pidfile = sim.dir.path().join("sleep.pid");
    let script = format!(
        "echo $$ > {}; exec sleep 60",
        quote(&pidfile.to_string_lossy())
    );
    let holder = Background::start(&sim, &["run", "--gpu", "0", "--", "sh", "-c", &script]);
    let _sleeper = KillOnDrop::new(pid_in(&pidfile));
    let trace = sim.dir.path().join("trace");
    for args in [
        &["info"][..],
        &["info", "--json"],
        &["health"],
        &["pick"],
        &["run", "--gpu", "0", "--", "true"],
    ] {
        let inner = gpuctl(&sim, args);
        let mut traced = Command::new(strace);
        traced
            .args(["-f", "-e", "trace=open,openat,openat2", "-o"])
            .arg(&trace)
            .arg(inner.get_program())
            .args(inner.get_args())
            .envs(inner.get_envs().filter_map(|(k, v)| Some((k, v?))))
            .stdin(Stdio::null());
        let done = Run::from(traced.output().expect("run strace"));
        assert!(
            done.code == 0 || args[0] == "run",
            "{args:?}: {}",
            done.stderr
        );
        let opened = std::fs::read_to_string(&trace).unwrap();
        assert!(opened.contains("/proc/"), "nothing traced: {opened}");
        assert!(
            !opened.contains("/proc/locks"),
            "gpuctl {args:?} read /proc/locks"
        );
    }
    let shown = leases_on(&sim, "0");
    assert_eq!(shown[0]["pid"], holder.pid(), "{shown:?}");
}
