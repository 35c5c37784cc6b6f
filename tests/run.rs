//! `gpuctl run` and `gpuctl pick` against nvml-sim, with real processes and real signals:
//! which GPU is chosen, leases under concurrency, leftovers ended on the acting road, exit
//! statuses and signals (in a real terminal too), `--name`, and the lease directory against
//! another user's plantings.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::terminal::{Terminal, quote};
use crate::util::{
    GIB, Gpu, Proc, RootOwnedProgram, Run, Scenario, Sim, alive, default_stop_signals, h200s,
    is_root, testproc_bin, wait_exited, wait_until,
};

/// Columns and rows of the terminal the tests that need one run gpuctl in.
const TERMINAL_SIZE: (u16, u16) = (200, 40);

/// The lease directory of a test: its own, in the scratch directory.
pub(crate) fn lease_dir(sim: &Sim) -> PathBuf {
    sim.dir.path().join("leases")
}

/// `gpuctl ARGS` with this test's own lease directory and run-file directory.
pub(crate) fn gpuctl(sim: &Sim, args: &[&str]) -> Command {
    let mut command = sim.gpuctl(args);
    command
        .env("GPUCTL_LEASE_DIR", lease_dir(sim))
        .env("XDG_RUNTIME_DIR", runtime_dir(sim));
    command
}

fn runtime_dir(sim: &Sim) -> PathBuf {
    let dir = sim.dir.path().join("runtime");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

pub(crate) fn run(sim: &Sim, args: &[&str]) -> Run {
    Run::from(gpuctl(sim, args).output().expect("run gpuctl"))
}

/// A `gpuctl run` left running in the background: killed and reaped on drop.
pub(crate) struct Background {
    child: Child,
}

impl Background {
    pub(crate) fn start(sim: &Sim, args: &[&str]) -> Background {
        let child = default_stop_signals(&mut gpuctl(sim, args))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start gpuctl run");
        Background { child }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on a child this test started and has not reaped.
        unsafe { libc::kill(self.pid() as i32, signal) };
    }

    pub(crate) fn wait(mut self) -> Run {
        let output = std::mem::replace(
            &mut self.child,
            Command::new("true").spawn().expect("spawn true"),
        )
        .wait_with_output()
        .expect("wait for gpuctl run");
        Run::from(output)
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Each GPU's UUID, by index, as `gpuctl info --json` shows them.
pub(crate) fn uuids(sim: &Sim) -> Vec<String> {
    sim.json(&["info"])["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|gpu| gpu["uuid"].as_str().unwrap().to_string())
        .collect()
}

/// Waits for a file a command writes, and reads the pid in it.
pub(crate) fn pid_in(path: &Path) -> u32 {
    wait_until(Duration::from_secs(10), || {
        std::fs::read_to_string(path).is_ok_and(|text| text.ends_with('\n'))
    });
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn sigkill(pid: u32) {
    // SAFETY: kill(2) on a process this test started (by pid, read back from it).
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
}

/// A process the test started through a command (known by the pid it wrote), killed on
/// drop whatever the test's outcome: only while its pid still names it (its start time).
pub(crate) struct KillOnDrop {
    pid: u32,
    start_ticks: Option<u64>,
}

impl KillOnDrop {
    pub(crate) fn new(pid: u32) -> KillOnDrop {
        KillOnDrop {
            pid,
            start_ticks: crate::util::start_ticks(pid),
        }
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if self.start_ticks.is_some() && crate::util::start_ticks(self.pid) == self.start_ticks {
            sigkill(self.pid);
        }
    }
}

/// `doc` against the published schema `name` (docs/schema/).
fn assert_conforms(name: &str, doc: &serde_json::Value) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs/schema")
        .join(name);
    let schema = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    crate::schema::conforms(&schema, doc).unwrap_or_else(|e| panic!("{name}: {e}\n{doc}"));
}

#[test]
fn the_free_healthy_gpu_is_chosen_by_uuid() {
    let busy = Proc::sleeper("python3", &["train.py"]);
    let sim = Sim::new(
        &Scenario::new()
            .gpu(Gpu::h200())
            .gpu(Gpu::h200().remapped_rows(0, 1, true, false))
            .gpu(Gpu::h200())
            .process(crate::util::Process::new(busy.pid()).on(0).used(4 * GIB)),
    );
    let uuids = uuids(&sim);
    let shown = run(
        &sim,
        &[
            "run",
            "--",
            "sh",
            "-c",
            "echo \"$CUDA_VISIBLE_DEVICES $CUDA_DEVICE_ORDER $GPUCTL_RUN_GPUS\"",
        ],
    );
    assert_eq!(shown.code, 0, "{}", shown.stderr);
    assert_eq!(shown.stdout.trim(), format!("{} PCI_BUS_ID 2", uuids[2]));
    assert!(
        shown.stderr.contains(&format!("GPU 2 ({})", uuids[2])),
        "{}",
        shown.stderr
    );

    let picked = run(&sim, &["pick", "1"]);
    assert_eq!(picked.code, 0, "{}", picked.stderr);
    assert_eq!(picked.stdout, format!("{}\n", uuids[2]));
    assert_eq!(run(&sim, &["pick", "1", "--index"]).stdout, "2\n");
    let json: serde_json::Value =
        serde_json::from_str(&run(&sim, &["pick", "--json"]).stdout).unwrap();
    assert_eq!(json["gpus"][0]["uuid"], uuids[2].as_str());
    assert_conforms("pick-v1.schema.json", &json);

    // Two wanted, one qualifies: refused at once, saying why each other GPU does not.
    let refused = run(&sim, &["run", "--gpus", "2", "--", "true"]);
    refused.assert_one_line_error(4, "2 GPUs wanted, 1 free and healthy");
    assert!(refused.stderr.contains("GPU 0"), "{}", refused.stderr);
    assert!(
        refused.stderr.contains("busy: 1 process"),
        "{}",
        refused.stderr
    );
    assert!(
        refused.stderr.contains("needs a reset"),
        "{}",
        refused.stderr
    );
    run(&sim, &["pick", "2"]).assert_one_line_error(4, "2 GPUs wanted, 1 free and healthy");

    // With --min-free, the busy GPU has room enough.
    let roomy = run(&sim, &["pick", "2", "--min-free", "100GiB", "--index"]);
    assert_eq!(roomy.stdout, "0\n2\n", "{}", roomy.stderr);
}

#[test]
fn a_split_gpu_is_leased_by_its_mig_instances() {
    let sim = Sim::new(&Scenario::new().gpu(Gpu::h100().mig("3g.40gb", 1).mig("3g.40gb", 2)));
    let shown = run(
        &sim,
        &[
            "run",
            "--gpus",
            "2",
            "--",
            "sh",
            "-c",
            "echo \"$CUDA_VISIBLE_DEVICES $GPUCTL_RUN_GPUS\"",
        ],
    );
    assert_eq!(shown.code, 0, "{}", shown.stderr);
    let (visible, names) = shown.stdout.trim().split_once(' ').unwrap();
    let uuids: Vec<&str> = visible.split(',').collect();
    assert_eq!(uuids.len(), 2);
    assert!(uuids.iter().all(|u| u.starts_with("MIG-")), "{visible}");
    assert_eq!(names, "0/1,0/2");
}

#[test]
fn six_concurrent_runs_on_two_gpus_never_share_one_and_all_run() {
    let sim = Sim::new(&h200s(2));
    let marks = sim.dir.path().join("marks");
    std::fs::create_dir(&marks).unwrap();
    // mkdir is atomic: a GPU held by two runs at once makes the second fail with 99.
    let script = format!(
        "mkdir {0}/gpu-$GPUCTL_RUN_GPUS || exit 99; sleep 0.3; rmdir {0}/gpu-$GPUCTL_RUN_GPUS; \
         echo $GPUCTL_RUN_GPUS",
        quote(&marks.to_string_lossy())
    );
    let runs: Vec<Background> = (0..6)
        .map(|_| Background::start(&sim, &["run", "--wait", "60s", "--", "sh", "-c", &script]))
        .collect();
    for started in runs {
        let done = started.wait();
        assert_eq!(done.code, 0, "{}", done.stderr);
    }
}

#[test]
fn two_runs_of_two_gpus_on_three_do_not_deadlock() {
    let sim = Sim::new(&h200s(3));
    let marks = sim.dir.path().join("marks");
    std::fs::create_dir(&marks).unwrap();
    let script = format!(
        "for g in $(echo $GPUCTL_RUN_GPUS | tr , ' '); do mkdir {0}/gpu-$g || exit 99; done; \
         sleep 0.2; for g in $(echo $GPUCTL_RUN_GPUS | tr , ' '); do rmdir {0}/gpu-$g; done",
        quote(&marks.to_string_lossy())
    );
    let started = Instant::now();
    for _ in 0..3 {
        let pair: Vec<Background> = (0..2)
            .map(|_| {
                Background::start(
                    &sim,
                    &[
                        "run", "--gpus", "2", "--wait", "60s", "--", "sh", "-c", &script,
                    ],
                )
            })
            .collect();
        for one in pair {
            let done = one.wait();
            assert_eq!(done.code, 0, "{}", done.stderr);
        }
    }
    // Six runs of 0.2 s, two at most at a time on disjoint pairs: far from the waits' 60 s.
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn a_leftover_that_left_the_session_is_ended_and_its_memory_verified() {
    let sim = Sim::new(&h200s(1));
    let pidfile = sim.dir.path().join("worker.pid");
    let go = sim.dir.path().join("go");
    let script = format!(
        "GPUCTL_TESTPROC_MODE=sleep setsid {} dataloader-worker & echo $! > {}; \
         while [ ! -e {} ]; do sleep 0.05; done",
        quote(&testproc_bin().to_string_lossy()),
        quote(&pidfile.to_string_lossy()),
        quote(&go.to_string_lossy())
    );
    let summary = sim.dir.path().join("summary.json");
    let launched = Background::start(
        &sim,
        &[
            "run",
            "--json-summary",
            &summary.to_string_lossy(),
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    let worker = pid_in(&pidfile);
    // The worker holds 2 GiB on the leased GPU.
    sim.write(&h200s(1).process(crate::util::Process::new(worker).on(0).used(2 * GIB)));
    wait_until(Duration::from_secs(10), || {
        std::fs::read_to_string(format!("/proc/{worker}/stat"))
            .is_ok_and(|stat| stat.split_whitespace().nth(5) == Some(&worker.to_string()))
    });
    std::fs::write(&go, "").unwrap();
    let done = launched.wait();
    assert_eq!(done.code, 0, "{}", done.stderr);
    assert!(!alive(worker), "the leftover is still alive");
    assert!(
        done.stderr.contains("the command left 1 process behind"),
        "{}",
        done.stderr
    );
    assert!(
        done.stderr
            .contains(&format!("pid {worker} held 2.00 GiB on GPU 0")),
        "{}",
        done.stderr
    );
    let document: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    assert_eq!(document["leftovers"], 1);
    assert_eq!(document["leftovers_failed"], 0, "{document}");
    assert_eq!(document["exit_code"], 0);
    assert_conforms("run-summary-v1.schema.json", &document);
}

#[test]
fn a_protected_program_the_command_started_is_left_and_reported() {
    if !is_root() {
        eprintln!("skipped: needs root to install a root-owned program in a root-owned directory");
        return;
    }
    let installed = RootOwnedProgram::install("nvidia-persistenced");
    let sim = Sim::new(&h200s(1));
    let pidfile = sim.dir.path().join("daemon.pid");
    let script = format!(
        "GPUCTL_TESTPROC_MODE=sleep {} >/dev/null 2>&1 & echo $! > {}; sleep 0.3",
        quote(&installed.path().to_string_lossy()),
        quote(&pidfile.to_string_lossy())
    );
    let done = run(&sim, &["run", "--", "sh", "-c", &script]);
    let daemon = pid_in(&pidfile);
    let still = alive(daemon);
    sigkill(daemon);
    assert_eq!(done.code, 0, "{}", done.stderr);
    assert!(still, "the protected program was ended: {}", done.stderr);
    assert!(
        done.stderr
            .contains("not signalled (protected: nvidia-persistenced)"),
        "{}",
        done.stderr
    );
}

#[test]
fn the_exit_status_is_the_commands_and_signals_are_forwarded() {
    let sim = Sim::new(&h200s(1));
    assert_eq!(
        run(&sim, &["run", "-q", "--", "sh", "-c", "exit 3"]).code,
        3
    );
    let killed = run(&sim, &["run", "--", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(killed.code, 143, "{}", killed.stderr);
    assert!(
        killed.stderr.contains("killed by SIGTERM"),
        "{}",
        killed.stderr
    );
    for (signal, code) in [
        (libc::SIGTERM, 143),
        (libc::SIGINT, 130),
        (libc::SIGHUP, 129),
        (libc::SIGQUIT, 131),
    ] {
        let pidfile = sim.dir.path().join(format!("sleep-{signal}.pid"));
        let script = format!(
            "echo $$ > {}; exec sleep 60",
            quote(&pidfile.to_string_lossy())
        );
        let started = Background::start(&sim, &["run", "-q", "--", "sh", "-c", &script]);
        let sleeper = pid_in(&pidfile);
        let began = Instant::now();
        started.signal(signal);
        let done = started.wait();
        assert_eq!(done.code, code, "signal {signal}: {}", done.stderr);
        assert!(began.elapsed() < Duration::from_secs(10));
        wait_exited(sleeper);
    }
}

#[test]
fn ctrl_c_in_a_terminal_ends_the_command_and_gpuctl_reports_it() {
    let sim = Sim::new(&h200s(1));
    let term = Terminal::start(
        &gpuctl(&sim, &["run", "--", "sh", "-c", "echo started; sleep 60"]),
        TERMINAL_SIZE,
    );
    term.wait_text("started");
    term.keys(&["C-c"]);
    let screen = term.wait_text("gpuctl exited 130");
    assert!(screen.contains("killed by SIGINT"), "{screen}");
}

#[test]
fn top_shows_who_holds_a_lease() {
    let sim = Sim::new(&h200s(2));
    let pidfile = sim.dir.path().join("sleep.pid");
    let script = format!(
        "echo $$ > {}; exec sleep 60",
        quote(&pidfile.to_string_lossy())
    );
    let holder = Background::start(&sim, &["run", "--gpu", "1", "--", "sh", "-c", &script]);
    let _sleeper = KillOnDrop::new(pid_in(&pidfile));
    let top = Terminal::start(&gpuctl(&sim, &["top"]), TERMINAL_SIZE);
    let screen = top.wait_text(&format!("[leased by root, pid {}]", holder.pid()));
    let line = screen
        .lines()
        .find(|l| l.contains("leased by"))
        .unwrap_or_default();
    assert!(line.trim_start().starts_with("GPU 1"), "{screen}");
    top.keys(&["q"]);
    top.wait_text("gpuctl exited 0");
}

#[test]
fn name_ends_the_workers_of_an_earlier_run_that_was_sigkilled() {
    let sim = Sim::new(&h200s(1));
    let pidfile = sim.dir.path().join("worker.pid");
    let shellfile = sim.dir.path().join("command.pid");
    // The command becomes `sleep 60` (exec): gpuctl's child, recorded from the start.
    let script = format!(
        "GPUCTL_TESTPROC_MODE=sleep {} dataloader-worker & echo $! > {}; echo $$ > {}; \
         exec sleep 60",
        quote(&testproc_bin().to_string_lossy()),
        quote(&pidfile.to_string_lossy()),
        quote(&shellfile.to_string_lossy())
    );
    let first = Background::start(&sim, &["run", "--name", "job", "--", "sh", "-c", &script]);
    let worker = pid_in(&pidfile);
    let command = pid_in(&shellfile);
    let _left = [KillOnDrop::new(worker), KillOnDrop::new(command)];
    let record = runtime_dir(&sim).join("gpuctl-trainer/job.run.json");
    wait_until(Duration::from_secs(10), || {
        std::fs::read_to_string(&record).is_ok_and(|text| text.contains(&worker.to_string()))
    });
    // A live run of the name is refused.
    run(&sim, &["run", "--name", "job", "--", "true"])
        .assert_one_line_error(1, "run \"job\" is already running");
    sigkill(first.pid());
    drop(first);
    assert!(alive(worker), "the worker died with gpuctl");
    assert!(alive(command), "the command died with gpuctl");
    let second = run(&sim, &["run", "--name", "job", "--", "true"]);
    assert_eq!(second.code, 0, "{}", second.stderr);
    assert!(
        second
            .stderr
            .contains("the previous run of \"job\" crashed and left 2 processes alive"),
        "{}",
        second.stderr
    );
    wait_exited(worker);
    wait_exited(command);
    assert!(
        !second.stderr.contains("could not be ended"),
        "{}",
        second.stderr
    );
}

#[test]
fn the_lease_is_released_when_gpuctl_run_is_sigkilled() {
    let sim = Sim::new(&h200s(1));
    let pidfile = sim.dir.path().join("sleep.pid");
    let script = format!(
        "echo $$ > {}; exec sleep 60",
        quote(&pidfile.to_string_lossy())
    );
    let holder = Background::start(&sim, &["run", "--", "sh", "-c", &script]);
    let sleeper = pid_in(&pidfile);
    let refused = run(&sim, &["run", "--", "true"]);
    refused.assert_one_line_error(4, &format!("leased by root (pid {}", holder.pid()));
    let _sleeper = KillOnDrop::new(sleeper);
    // Shown on the GPU's title line, and in info --json.
    let shown = run(&sim, &["info"]);
    let title = shown
        .stdout
        .lines()
        .find(|l| l.starts_with("GPU 0"))
        .unwrap_or("");
    assert!(
        title.contains(&format!("leased by root (pid {}: ", holder.pid()))
            && title.contains("since "),
        "{}",
        shown.stdout
    );
    let json: serde_json::Value =
        serde_json::from_str(&run(&sim, &["info", "--json"]).stdout).unwrap();
    assert_conforms("info-v1.schema.json", &json);
    let lease = &json["devices"][0]["leases"][0];
    assert_eq!(lease["pid"], holder.pid());
    assert_eq!(lease["user"], "root");
    assert!(
        lease["command"].as_str().unwrap().contains("run -- sh -c"),
        "{lease}"
    );
    sigkill(holder.pid());
    drop(holder);
    let after = run(&sim, &["run", "--", "true"]);
    assert_eq!(after.code, 0, "{}", after.stderr);
}

#[test]
fn the_lease_directory_resists_another_users_plantings() {
    assert!(
        is_root(),
        "cannot run here: needs root to plant files as another user"
    );
    const NOBODY: u32 = 65534;
    let sim = Sim::new(&h200s(2));
    let uuids = uuids(&sim);
    sim.share();
    // The directory gpuctl makes: root's alone, with a lease file for each GPU, root's, that
    // every user may open to lock.
    assert_eq!(run(&sim, &["run", "--", "true"]).code, 0);
    let dir = lease_dir(&sim);
    assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o7777, 0o755);
    for uuid in &uuids {
        let meta = std::fs::metadata(dir.join(format!("{uuid}.lease"))).unwrap();
        assert_eq!((meta.uid(), meta.mode() & 0o7777), (0, 0o666), "{uuid}");
    }

    // Another user's symbolic link at GPU 0's lease (left from when the directory was 1777):
    // never followed; root's run replaces it with a lease file of its own.
    let victim = sim.dir.path().join("victim");
    let link = dir.join(format!("{}.lease", uuids[0]));
    std::fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    std::os::unix::fs::lchown(&link, Some(NOBODY), Some(NOBODY)).unwrap();
    let done = run(&sim, &["run", "--gpu", "0", "--", "true"]);
    assert_eq!(done.code, 0, "{}", done.stderr);
    assert!(!victim.exists(), "the planted link was followed");
    let meta = std::fs::symlink_metadata(&link).unwrap();
    assert!(meta.is_file() && meta.uid() == 0, "the link is replaced");

    // Another user's file, readable only by them, at GPU 1's lease: a third user is told
    // whose it is and refused; root's run replaces it, and then the third user leases it.
    let planted = dir.join(format!("{}.lease", uuids[1]));
    std::fs::remove_file(&planted).unwrap();
    std::fs::write(&planted, "").unwrap();
    std::os::unix::fs::chown(&planted, Some(NOBODY), Some(NOBODY)).unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o600)).unwrap();
    let third = || {
        let mut other = sim.gpuctl_as(NOBODY - 1, &["run", "--gpu", "1", "--", "true"]);
        other.env("GPUCTL_LEASE_DIR", &dir);
        Run::from(other.output().unwrap())
    };
    third().assert_one_line_error(4, "a file root did not make (uid 65534's), not followed");
    let root_run = run(&sim, &["run", "--gpu", "1", "--", "true"]);
    assert_eq!(root_run.code, 0, "{}", root_run.stderr);
    let after = third();
    assert_eq!(after.code, 0, "{}", after.stderr);

    // Where a user may not make the directory, one line says who does.
    let closed = sim.dir.path().join("closed");
    std::fs::create_dir(&closed).unwrap();
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut cannot = sim.gpuctl_as(NOBODY - 1, &["run", "--", "true"]);
    cannot.env("GPUCTL_LEASE_DIR", closed.join("leases"));
    Run::from(cannot.output().unwrap()).assert_one_line_error(1, "root makes it on first use");

    // A lease directory another user owns is not trusted.
    let theirs = sim.dir.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(NOBODY), Some(NOBODY)).unwrap();
    let mut untrusted = sim.gpuctl(&["run", "--", "true"]);
    untrusted.env("GPUCTL_LEASE_DIR", &theirs);
    Run::from(untrusted.output().unwrap())
        .assert_one_line_error(1, "is uid 65534's directory, not root's or this user's");
}

#[test]
fn every_bad_input_is_one_line_and_exit_status_2() {
    let sim = Sim::new(&h200s(2));
    let cases: &[(&[&str], &str)] = &[
        (
            &["run", "--gpus", "0", "--", "true"],
            "ask for at least one GPU",
        ),
        (&["run", "--gpu", "9", "--", "true"], "no GPU matches '9'"),
        (
            &["run", "--min-free", "1TiB", "--", "true"],
            "a minimum free of 1024.0 GiB is more than",
        ),
        (&["run", "--"], "required arguments were not provided"),
        (&["run", "--", ""], "the command is empty"),
        (
            &["run", "--gpus", "1", "--gpu", "0", "--", "true"],
            "cannot be used with",
        ),
        (
            &["run", "--gpus", "3", "--", "true"],
            "3 GPUs asked for, but only 2 are here",
        ),
        (
            &["run", "--max-util", "0", "--", "true"],
            "give a percentage from 1 to 100",
        ),
        (&["pick", "0"], "ask for at least one GPU"),
    ];
    for (args, needle) in cases {
        run(&sim, args).assert_one_line_error(2, needle);
    }
    let not_executable = sim.dir.path().join("scenario.toml");
    run(&sim, &["run", "--", &not_executable.to_string_lossy()])
        .assert_one_line_error(126, "cannot run");
    run(&sim, &["run", "--", "no-such-command-here"])
        .assert_one_line_error(127, "no-such-command-here: command not found");
}

#[test]
fn a_missing_command_fails_at_once_rather_than_after_waiting_for_gpus() {
    let holder = Proc::sleeper("python3", &["train.py"]);
    let sim = Sim::new(
        &Scenario::new()
            .gpu(Gpu::h200())
            .process(crate::util::Process::new(holder.pid()).on(0).used(4 * GIB)),
    );
    let started = Instant::now();
    run(
        &sim,
        &["run", "--wait", "60s", "--", "no-such-command-here"],
    )
    .assert_one_line_error(127, "no-such-command-here: command not found");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "gpuctl run waited {:?} for a GPU before finding its command missing",
        started.elapsed()
    );
}
