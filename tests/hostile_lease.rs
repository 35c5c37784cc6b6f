//! `gpuctl run` leases against another user (issue 46): what another user plants at a lease's
//! name (a directory, a sparse terabyte) costs readers nothing and steps only that GPU aside;
//! a holder is never named by a pid read back later (a holder that forked and exited, a
//! reused pid, a note naming another user's process); `--json-summary` never writes through
//! a link; and no reader reads the kernel's lock table.

use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::run::{Background, KillOnDrop, gpuctl, h200s, lease_dir, pid_in, run, uuids};
use crate::terminal::quote;
use crate::util::{PidReuser, Run, Sim, is_root, start_ticks};

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
/// first run makes it (mode 1777; the run's lease file goes with its lease); the UUIDs in the
/// order leases are tried, and by index.
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

/// Finding 2: a directory at one lease's name stopped every run, root's too.
#[test]
fn a_planted_directory_steps_only_its_gpu_aside_and_root_removes_it() {
    let (sim, uuids, by_index) = shared(2);
    let planted = lease_file(&sim, &uuids[0]);
    std::fs::create_dir(&planted).unwrap();
    std::os::unix::fs::chown(&planted, Some(MALLORY), Some(MALLORY)).unwrap();

    // Tried first (UUID order), stepped around: the other GPU is leased.
    let other = run_as(&sim, VICTIM, &["run", "--gpus", "1", "--", "true"]);
    assert_eq!(other.code, 0, "{}", other.stderr);
    // Asked for by name: refused in one line saying what and whose it is.
    let gpu = index_of(&by_index, &uuids[0]);
    run_as(&sim, VICTIM, &["run", "--gpu", &gpu, "--", "true"])
        .assert_one_line_error(4, "a directory (uid 65534's)");
    assert!(leases_on(&sim, &gpu).is_empty());
    // Root removes it and takes the lease.
    let removed = root(&sim, &["run", "--gpu", &gpu, "--", "true"]);
    assert_eq!(removed.code, 0, "{}", removed.stderr);
    assert!(
        std::fs::symlink_metadata(&planted).is_err(),
        "the directory is gone (and the lease file, given back)"
    );
}

/// Finding 1: a sparse terabyte at a lease's name, locked, was read whole by every reader.
#[test]
fn a_locked_sparse_terabyte_costs_readers_and_runs_nothing() {
    let (sim, uuids, by_index) = shared(2);
    let path = lease_file(&sim, &uuids[0]);
    let planted = std::fs::File::create(&path).unwrap();
    planted.set_len(1 << 40).unwrap();
    std::os::unix::fs::chown(&path, Some(MALLORY), Some(MALLORY)).unwrap();
    // Held as another user's process would hold it (another open file).
    // SAFETY: flock on a descriptor this test owns.
    let locked = unsafe { libc::flock(planted.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(locked, 0);

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
    refused.assert_one_line_error(4, "leased by a process that left no note");
    let shown = leases_on(&sim, &gpu);
    assert_eq!(shown.len(), 1, "{shown:?}");
    assert!(shown[0]["pid"].is_null(), "{shown:?}");
    drop(planted);
}

/// Finding 4: the holder was the pid the lock table named, read back later: a holder that
/// forked and exited left its pid to whoever got it next.
#[test]
fn a_holder_that_forked_and_exited_is_never_named_nor_its_pid_reused() {
    let (sim, uuids, by_index) = shared(2);
    let path = lease_file(&sim, &uuids[1]);
    let pidfile = sim.dir.path().join("child.pid");
    let script = format!(
        "echo $$ > {}; exec sleep 60",
        quote(&pidfile.to_string_lossy())
    );
    let id = MALLORY.to_string();
    // flock(1) locks, then forks the command, which keeps the lock: then the locker dies.
    let mut locker = Command::new("setpriv")
        .args(["--reuid", &id, "--regid", &id, "--clear-groups", "--"])
        .args(["flock", "-n"])
        .arg(&path)
        .args(["sh", "-c", &script])
        .stdin(Stdio::null())
        .spawn()
        .expect("start flock");
    let child = pid_in(&pidfile);
    let _child = KillOnDrop::new(child);
    let locker_pid = locker.id();
    locker.kill().unwrap();
    locker.wait().unwrap();

    let gpu = index_of(&by_index, &uuids[1]);
    let unnamed = |sim: &Sim| {
        let shown = leases_on(sim, &gpu);
        assert_eq!(shown.len(), 1, "the lease is still held: {shown:?}");
        assert!(shown[0]["pid"].is_null(), "named: {shown:?}");
        assert!(shown[0]["user"].is_null(), "named: {shown:?}");
    };
    unnamed(&sim);

    // Its pid taken by root's process, and a note in the file naming that process exactly:
    // still nobody is named (the note is not the file owner's process).
    let reuser = PidReuser::spawn(locker_pid, "sleep", "reuser").unwrap_or_else(|| {
        panic!("cannot run here: the kernel does not let this test choose a pid (clone3 set_tid)")
    });
    let ticks = start_ticks(reuser.pid).expect("the reuser's start time");
    // Without O_CREAT: protected_regular refuses it on another user's file here, even to root.
    let note = format!(
        r#"{{"pid":{},"start_ticks":{ticks},"since":1}}"#,
        reuser.pid
    );
    std::io::Write::write_all(
        &mut std::fs::OpenOptions::new().write(true).open(&path).unwrap(),
        note.as_bytes(),
    )
    .unwrap();
    unnamed(&sim);
    let refused = run_as(&sim, VICTIM, &["run", "--gpu", &gpu, "--", "true"]);
    refused.assert_one_line_error(4, "leased by a process that left no note");
    assert!(!refused.stderr.contains(&reuser.pid.to_string()));
    let table = root(&sim, &["info"]);
    assert!(!table.stdout.contains("reuser"), "{}", table.stdout);
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

/// Finding 3, what is said (not yet prevented: only lease files root makes would prevent
/// it): the owner of a lease file removed it while another user's run held that GPU, and
/// could then lease the GPU too. The run says so when it ends.
#[test]
fn a_lease_file_removed_under_a_run_is_said_when_the_run_ends() {
    let (sim, uuids, by_index) = shared(1);
    let path = lease_file(&sim, &uuids[0]);
    // Mallory's file, made before anyone leased the GPU.
    std::fs::write(&path, "").unwrap();
    std::os::unix::fs::chown(&path, Some(MALLORY), Some(MALLORY)).unwrap();
    let pidfile = sim.dir.path().join("command.pid");
    let stop = sim.dir.path().join("stop");
    let script = format!(
        "echo $$ > {}; while [ ! -e {} ]; do sleep 0.05; done",
        quote(&pidfile.to_string_lossy()),
        quote(&stop.to_string_lossy())
    );
    let gpu = index_of(&by_index, &uuids[0]);
    let holder = Background::start(&sim, &["run", "--gpu", &gpu, "--", "sh", "-c", &script]);
    let _command = KillOnDrop::new(pid_in(&pidfile));
    // She removes it and leases the GPU in a new file of hers.
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, "").unwrap();
    std::fs::write(&stop, "").unwrap();
    let done = holder.wait();
    assert_eq!(done.code, 0, "{}", done.stderr);
    assert!(
        done.stderr
            .contains("was removed or replaced while this run held it"),
        "{}",
        done.stderr
    );
}
