//! gpuctl-watchdog against nvml-sim, with real processes and real signals: crashed runs
//! reclaimed after the grace, healthy jobs never touched, the share policy, sd_notify,
//! SIGHUP, NVML faults mid-run, the stderr log fields, `--once` and `--dry-run`.

use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::util::{
    Gpu, Proc, Process, Run, Scenario, Sim, TrainingRun, alive, is_root, sim_lib, wait_until,
    watchdog_bin,
};

const MIB: u64 = 1024 * 1024;

/// A scenario of `gpus` H200s (those in `lost` fallen off the bus) and `processes`.
fn scenario(gpus: usize, lost: &[usize], processes: &[Process]) -> Scenario {
    (0..gpus)
        .map(|index| match lost.contains(&index) {
            true => Gpu::h200().lost(),
            false => Gpu::h200(),
        })
        .fold(Scenario::new(), Scenario::gpu)
        .processes(processes.iter().cloned())
}

fn process(pid: u32, gpu: u32, used_mib: u64, sm_pct: u32) -> Process {
    Process::new(pid).on(gpu).used(used_mib * MIB).sm(sm_pct)
}

/// The workers of a crashed run (parent SIGKILLed, workers idle on GPU 0, 4096 MiB each).
fn crashed_run(workers: usize) -> (TrainingRun, Vec<Process>) {
    let mut run = TrainingRun::start(workers, "sleep", "python3", &["train.py", "--lr", "3e-4"]);
    run.crash();
    let entries = run
        .workers
        .pids
        .iter()
        .map(|&pid| process(pid, 0, 4096, 0))
        .collect();
    (run, entries)
}

/// Writes the configuration: fast timings, metrics and state in the scratch directory, then
/// `extra` lines in [watchdog], then `tables` (other tables).
fn configure(sim: &Sim, extra: &str, tables: &str) {
    configure_with_grace(sim, "1s", extra, tables);
}

fn configure_with_grace(sim: &Sim, grace: &str, extra: &str, tables: &str) {
    let dir = sim.dir.path();
    let text = format!(
        "[watchdog]\ninterval = \"200ms\"\ngrace = \"{grace}\"\nterm_timeout = \"1s\"\nmetrics_file = \"{}\"\nstate_dir = \"{}\"\n{extra}\n{tables}\n",
        dir.join("gpuctl.prom").display(),
        dir.join("state").display()
    );
    write_config(&sim.config_path(), &text);
}

fn write_config(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn metrics(sim: &Sim) -> String {
    std::fs::read_to_string(sim.dir.path().join("gpuctl.prom")).unwrap_or_default()
}

/// `gpuctl-watchdog ARGS` against the scenario, with nothing of systemd in its environment.
fn command(sim: &Sim, args: &[&str]) -> Command {
    let mut command = Command::new(watchdog_bin());
    command
        .args(args)
        .env("GPUCTL_NVML_LIB", sim_lib())
        .env("NVML_SIM_SCENARIO", sim.scenario_path())
        .env("NVML_SIM_STATE", sim.state_path())
        .env("GPUCTL_CONFIG", sim.config_path())
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .env_remove("WATCHDOG_PID")
        .env_remove("JOURNAL_STREAM")
        .stdin(Stdio::null());
    command
}

fn once(sim: &Sim, args: &[&str]) -> Run {
    let mut all = vec!["--once"];
    all.extend_from_slice(args);
    Run::from(command(sim, &all).output().expect("run gpuctl-watchdog"))
}

/// A running daemon; its stderr lines are collected as they come. Killed on drop.
struct Daemon {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    started: Instant,
}

impl Daemon {
    fn start(sim: &Sim, args: &[&str]) -> Daemon {
        Daemon::start_with(command(sim, args))
    }

    fn start_with(mut command: Command) -> Daemon {
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start gpuctl-watchdog");
        let stderr = child.stderr.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                sink.lock().unwrap().push(line);
            }
        });
        Daemon {
            child,
            lines,
            started: Instant::now(),
        }
    }

    fn log(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }

    /// The first line containing every needle, waiting up to `limit`.
    fn expect(&self, needles: &[&str], limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(line) = self
                .lines
                .lock()
                .unwrap()
                .iter()
                .find(|line| needles.iter().all(|n| line.contains(n)))
            {
                return line.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no log line with {needles:?} within {limit:?}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn count(&self, needles: &[&str]) -> usize {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|line| needles.iter().all(|n| line.contains(n)))
            .count()
    }

    fn assert_running(&mut self) {
        assert!(
            self.child.try_wait().unwrap().is_none(),
            "the daemon exited; log:\n{}",
            self.log()
        );
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child, not yet reaped.
        unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
    }

    /// SIGTERM, and the exit status within 10 s.
    fn stop(&mut self) -> i32 {
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().unwrap_or(-1);
            }
            assert!(Instant::now() < deadline, "no exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn used_bytes(sim: &Sim, gpu: usize) -> u64 {
    let info = sim.json(&["info"]);
    info["devices"][gpu]["memory"]["used_bytes"]
        .as_u64()
        .unwrap()
}

#[test]
fn a_crashed_run_is_reclaimed_after_the_grace_and_its_memory_shows_free() {
    let (run, entries) = crashed_run(2);
    let sim = Sim::new(&scenario(2, &[], &entries));
    configure(&sim, "mode = \"reclaim\"", "");
    let mut daemon = Daemon::start(&sim, &[]);
    let stale = daemon.expect(&["ACTION=stale"], Duration::from_secs(5));
    assert!(stale.contains("idle orphans of the same group"), "{stale}");
    let stale_at = Instant::now();
    // grace + interval + term_timeout + 1 s.
    let bound = Duration::from_millis(1000 + 200 + 1000 + 1000);
    wait_until(bound, || run.workers.pids.iter().all(|&pid| !alive(pid)));
    let took = daemon.started.elapsed();
    assert!(took <= bound + Duration::from_millis(500), "took {took:?}");
    // Not before the grace.
    assert!(
        stale_at.elapsed() >= Duration::from_millis(700),
        "reclaimed {:?} after it was seen stale",
        stale_at.elapsed()
    );
    for &pid in &run.workers.pids {
        let line = daemon.expect(
            &["ACTION=reclaimed", &format!("PID={pid} ")],
            Duration::from_secs(5),
        );
        // The structured fields, as key=value on stderr.
        for field in [
            "PRIORITY=4 ",
            "MESSAGE=\"reclaimed pid",
            "GPU_UUID=GPU-",
            "USER=",
            "REASON=\"orphaned:",
            &format!("RECLAIMED_BYTES={}", 4096 * MIB),
        ] {
            assert!(line.contains(field), "{field} missing from {line}");
        }
    }
    assert_eq!(used_bytes(&sim, 0), 0);
    wait_until(Duration::from_secs(5), || {
        metrics(&sim).contains("gpuctl_reclaims_total 2\n")
    });
    let text = metrics(&sim);
    assert!(
        text.contains(&format!("gpuctl_reclaimed_bytes_total {}\n", 8192 * MIB)),
        "{text}"
    );
    assert!(text.contains("gpuctl_nvml_up 1\n"), "{text}");
    // Peak marks are kept in the configured state directory.
    assert!(sim.dir.path().join("state/peaks.json").exists());
    daemon.assert_running();
    assert_eq!(daemon.stop(), 0);
}

// The daemon has seen both healthy (and keeps their facts, leaders and parents) when the
// run crashes and the holder's main thread exits: both must be seen afresh in time.
#[test]
fn a_crash_and_a_zombie_holder_seen_while_healthy_are_reclaimed_within_the_bound() {
    let (mut run, mut holder, sim) = healthy_run_and_holder(None);
    configure(&sim, "mode = \"reclaim\"", "");
    let mut daemon = Daemon::start(&sim, &[]);
    wait_for_loops(&sim, 5);
    assert_eq!(daemon.count(&["ACTION=stale"]), 0, "{}", daemon.log());

    crash_both(&mut run, &mut holder);
    let crashed_at = Instant::now();
    // grace + interval + term_timeout + 1 s.
    let bound = Duration::from_millis(1000 + 200 + 1000 + 1000);
    wait_until(bound + Duration::from_secs(5), || {
        used_bytes(&sim, 0) == 0 && used_bytes(&sim, 1) == 0
    });
    let took = crashed_at.elapsed();
    assert!(took <= bound + Duration::from_millis(500), "took {took:?}");
    let line = daemon.expect(
        &["ACTION=reclaimed", &format!("PID={} ", holder.pid())],
        Duration::from_secs(5),
    );
    assert!(line.contains("zombie holder"), "{line}");
    for &pid in &run.workers.pids {
        daemon.expect(
            &["ACTION=reclaimed", &format!("PID={pid} ")],
            Duration::from_secs(5),
        );
    }
    daemon.assert_running();
    assert_eq!(daemon.stop(), 0);
}

// Another user's processes are not read each second but owner-checked (see
// gpuctl_core::host::FactCache): their stat is read every quarter of the grace, 10 s here.
// The crash and the zombie must still be seen within a second and a loop.
#[test]
fn another_users_crash_and_zombie_holder_are_seen_within_a_second() {
    if !is_root() {
        eprintln!("skipped: needs root to run processes as another user");
        return;
    }
    let (mut run, mut holder, sim) = healthy_run_and_holder(Some(65534));
    configure_with_grace(&sim, "40s", "mode = \"reclaim\"", "");
    let mut daemon = Daemon::start(&sim, &[]);
    wait_for_loops(&sim, 5);
    assert_eq!(daemon.count(&["ACTION=stale"]), 0, "{}", daemon.log());

    crash_both(&mut run, &mut holder);
    let crashed_at = Instant::now();
    // refresh (1 s) + interval, and slack for a loaded machine: the suite runs its tests in
    // parallel on two cores, where up to 3.4 s was seen. The bound this guards against is
    // the stat read, every 10 s here (grace / 4): without the owner check and the parent
    // pidfds that is how long it takes, so 6 s still tells the two apart.
    let seen_within = Duration::from_millis(6000);
    for pid in run.workers.pids.iter().chain([&holder.pid()]) {
        daemon.expect(
            &["ACTION=stale", &format!("PID={pid} ")],
            Duration::from_secs(15),
        );
    }
    let took = crashed_at.elapsed();
    assert!(
        took <= seen_within,
        "seen after {took:?}:\n{}",
        daemon.log()
    );
    assert!(daemon.log().contains("zombie holder"), "{}", daemon.log());
    daemon.assert_running();
    assert_eq!(daemon.stop(), 0);
}

/// A training run with two idle workers on GPU 0, and a holder on GPU 1 whose main thread
/// exits on a line from stdin; run by `uid` where given.
fn healthy_run_and_holder(uid: Option<u32>) -> (TrainingRun, Proc, Sim) {
    use std::os::unix::process::CommandExt;

    let argv = ["train.py", "--lr", "3e-4"];
    let run = TrainingRun::start_as(uid, 2, "sleep", "python3", &argv);
    let holder = Proc::spawn_with("zombie-leader", "python3", &["serve.py"], |command| {
        command
            .env("GPUCTL_TESTPROC_ZOMBIE_ON_LINE", "1")
            .stdin(Stdio::piped());
        if let Some(uid) = uid {
            command.uid(uid).gid(uid);
        }
    });
    let mut entries: Vec<Process> = run
        .workers
        .pids
        .iter()
        .map(|&pid| process(pid, 0, 4096, 0))
        .collect();
    entries.push(process(holder.pid(), 1, 4096, 0));
    let sim = Sim::new(&scenario(2, &[], &entries));
    (run, holder, sim)
}

/// The daemon's loop counter in the metrics file (0 before the file is written). The file
/// is written at least once a second, so it may lag the daemon by that much.
fn loops(sim: &Sim) -> u64 {
    metrics(sim)
        .lines()
        .find_map(|line| line.strip_prefix("gpuctl_watchdog_loops_total "))
        .and_then(|n| n.trim().parse::<u64>().ok())
        .unwrap_or(0)
}

/// Waits for `n` loops (the metrics file is written at least once a second).
fn wait_for_loops(sim: &Sim, n: u64) {
    wait_until(Duration::from_secs(10), || loops(sim) >= n);
}

/// Waits until the daemon has run `n` whole loops after this call: what a test then shows
/// did not happen had that many chances to. Loops start at least `interval` apart, so this
/// also lets (n - 1) intervals pass. Counted from the first write of the metrics file after
/// the call, as the counter read now may lag the daemon.
fn wait_more_loops(sim: &Sim, n: u64) {
    let before = loops(sim);
    let mut from = before;
    wait_until(Duration::from_secs(10), || {
        from = loops(sim);
        from > before
    });
    wait_until(Duration::from_secs(10), || loops(sim) >= from + n);
}

/// SIGKILLs the run's parent and has the holder's main thread exit.
fn crash_both(run: &mut TrainingRun, holder: &mut Proc) {
    use std::io::Write;
    run.crash();
    let stdin = holder.child.stdin.as_mut().expect("piped stdin");
    stdin.write_all(b"exit the main thread\n").unwrap();
}

#[test]
fn a_soak_with_healthy_jobs_coming_and_going_kills_nothing() {
    let busy = crate::util::background_job("python3", &["serve.py", "--port", "8000"]);
    let sim = Sim::new(&scenario(2, &[], &[process(busy.pid(0), 1, 16384, 50)]));
    configure(&sim, "mode = \"reclaim\"", "");
    let mut daemon = Daemon::start(&sim, &[]);
    let mut runs: Vec<TrainingRun> = Vec::new();
    let soak = Instant::now();
    let mut round = 0;
    // At least 8 rounds (as many as 6 s of fixed sleeps gave): a round lasts as long as
    // the daemon takes to loop over it.
    while round < 8 || soak.elapsed() < Duration::from_secs(6) {
        round += 1;
        runs.push(TrainingRun::start(2, "sleep", "python3", &["train.py"]));
        if runs.len() > 2 {
            // Stop the oldest as a job ends: out of the scenario first, then workers, parent.
            let oldest = runs.remove(0);
            write_scenario(&sim, &busy, &runs);
            let TrainingRun { parent, workers } = oldest;
            drop(workers);
            drop(parent);
        } else {
            write_scenario(&sim, &busy, &runs);
        }
        // Everything still registered is alive, a few loops after the daemon saw it.
        wait_more_loops(&sim, 3);
        assert!(
            alive(busy.pid(0)),
            "the busy job was killed:\n{}",
            daemon.log()
        );
        for run in &runs {
            assert!(alive(run.parent.pid()), "round {round}:\n{}", daemon.log());
            for &pid in &run.workers.pids {
                assert!(
                    alive(pid),
                    "worker {pid} killed (round {round}):\n{}",
                    daemon.log()
                );
            }
        }
    }
    for action in [
        "ACTION=reclaimed",
        "ACTION=failed",
        "ACTION=terminated",
        "ACTION=stale",
    ] {
        assert_eq!(daemon.count(&[action]), 0, "{action}:\n{}", daemon.log());
    }
    daemon.assert_running();
    assert_eq!(daemon.stop(), 0);
}

fn write_scenario(sim: &Sim, busy: &crate::util::Strays, runs: &[TrainingRun]) {
    let mut entries = vec![process(busy.pid(0), 1, 16384, 50)];
    for run in runs {
        entries.push(process(run.parent.pid(), 0, 8192, 40));
        for &pid in &run.workers.pids {
            entries.push(process(pid, 0, 512, 0));
        }
    }
    sim.write(&scenario(2, &[], &entries));
}

#[test]
fn a_process_above_its_share_is_warned_then_terminated_or_only_warned_in_report_mode() {
    for (mode, enforced) in [("reclaim", true), ("report", false)] {
        // 20000 MiB of 143771: above a 10% share. Busy, so not stale.
        let hog = Proc::spawn_ready("sleep", "python3", &["big_model.py"]);
        let sim = Sim::new(&scenario(1, &[], &[process(hog.pid(), 0, 20000, 80)]));
        configure(
            &sim,
            &format!("mode = \"{mode}\"\nenforce_fraction = true"),
            "[fraction]\ndefault = 0.1",
        );
        let mut daemon = Daemon::start(&sim, &[]);
        let pid = format!("PID={} ", hog.pid());
        let warned = daemon.expect(&["ACTION=warn", &pid], Duration::from_secs(5));
        assert!(warned.contains("above its share 0.1"), "{warned}");
        assert!(warned.contains("fraction.default"), "{warned}");
        if enforced {
            daemon.expect(&["ACTION=terminated", &pid], Duration::from_secs(5));
            wait_until(Duration::from_secs(5), || !alive(hog.pid()));
        } else {
            daemon.expect(
                &["ACTION=left", &pid, "report mode"],
                Duration::from_secs(5),
            );
            // A few more loops: still alive, warned once.
            wait_more_loops(&sim, 3);
            assert!(alive(hog.pid()), "{}", daemon.log());
            assert_eq!(daemon.count(&["ACTION=warn", &pid]), 1, "{}", daemon.log());
            assert_eq!(daemon.count(&["ACTION=terminated"]), 0, "{}", daemon.log());
        }
        daemon.assert_running();
        assert_eq!(daemon.stop(), 0);
    }
}

#[test]
fn sd_notify_ready_watchdog_status_and_stopping() {
    let sim = Sim::new(&scenario(2, &[], &[]));
    configure(&sim, "interval = \"5s\"", "");
    // The [watchdog] table above sets interval twice otherwise: write it whole.
    let dir = sim.dir.path();
    write_config(
        &sim.config_path(),
        &format!(
            "[watchdog]\ninterval = \"5s\"\nmetrics_file = \"\"\nstate_dir = \"{}\"\n",
            dir.join("state").display()
        ),
    );
    let socket_path: PathBuf = dir.join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut command = command(&sim, &[]);
    command
        .env("NOTIFY_SOCKET", &socket_path)
        .env("WATCHDOG_USEC", "1000000");
    let mut daemon = Daemon::start_with(command);
    let mut messages: Vec<(Instant, String)> = Vec::new();
    let mut buffer = [0u8; 4096];
    let listen = |messages: &mut Vec<(Instant, String)>, buffer: &mut [u8], until: Instant| {
        while Instant::now() < until {
            if let Ok(n) = socket.recv(buffer) {
                // sd_notify(3) takes newline-separated assignments; the sd-notify crate ends
                // the last one with a newline too, which systemd ignores: so do we.
                let text = String::from_utf8_lossy(&buffer[..n]);
                messages.push((
                    Instant::now(),
                    text.strip_suffix('\n').unwrap_or(&text).to_owned(),
                ));
            }
        }
    };
    listen(
        &mut messages,
        &mut buffer,
        Instant::now() + Duration::from_millis(2500),
    );
    let texts: Vec<&str> = messages.iter().map(|(_, m)| m.as_str()).collect();
    assert!(texts.contains(&"READY=1"), "{texts:?}");
    let status = texts
        .iter()
        .find(|m| m.starts_with("STATUS="))
        .unwrap_or_else(|| panic!("no STATUS: {texts:?}"));
    assert!(status.contains("2 GPUs, 0 processes, 0 stale"), "{status}");
    let pings: Vec<Instant> = messages
        .iter()
        .filter(|(_, m)| m == "WATCHDOG=1")
        .map(|(at, _)| *at)
        .collect();
    assert!(pings.len() >= 4, "{texts:?}");
    for pair in pings.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(gap <= Duration::from_millis(500), "WATCHDOG=1 gap {gap:?}");
    }
    // Interval 5 s: only the first loop has run, yet pings came all along.
    assert_eq!(daemon.count(&["ACTION=start"]), 1);
    daemon.signal(libc::SIGTERM);
    listen(
        &mut messages,
        &mut buffer,
        Instant::now() + Duration::from_millis(500),
    );
    assert!(
        messages.iter().any(|(_, m)| m == "STOPPING=1"),
        "{:?}",
        messages.iter().map(|(_, m)| m).collect::<Vec<_>>()
    );
    assert_eq!(daemon.stop(), 0);
}

#[test]
fn sighup_with_a_bad_config_keeps_the_old_one() {
    let sim = Sim::new(&scenario(1, &[], &[]));
    configure(&sim, "", "");
    let mut daemon = Daemon::start(&sim, &[]);
    daemon.expect(&["ACTION=start", "mode report"], Duration::from_secs(5));
    let good = std::fs::read_to_string(sim.config_path()).unwrap();
    write_config(&sim.config_path(), &good.replace("grace", "graec"));
    daemon.signal(libc::SIGHUP);
    let failed = daemon.expect(&["ACTION=reload-failed"], Duration::from_secs(5));
    let file = sim.config_path().display().to_string();
    assert!(failed.contains(&file), "{failed}");
    assert!(failed.contains("line 3"), "{failed}");
    assert!(failed.contains("unknown key 'watchdog.graec'"), "{failed}");
    assert!(failed.contains("old one is kept"), "{failed}");
    daemon.assert_running();
    write_config(
        &sim.config_path(),
        &good.replace("[watchdog]", "[watchdog]\nmode = \"reclaim\""),
    );
    daemon.signal(libc::SIGHUP);
    let reloaded = daemon.expect(
        &["ACTION=reload", "configuration reloaded"],
        Duration::from_secs(5),
    );
    assert!(reloaded.contains("mode reclaim"), "{reloaded}");
    daemon.assert_running();
    assert_eq!(daemon.stop(), 0);
}

#[test]
fn a_gpu_lost_mid_run_suspends_reclaim_until_it_answers_again() {
    let sim = Sim::new(&scenario(2, &[], &[]));
    configure(&sim, "mode = \"reclaim\"", "");
    let mut daemon = Daemon::start(&sim, &[]);
    daemon.expect(&["ACTION=start"], Duration::from_secs(5));
    wait_until(Duration::from_secs(5), || {
        metrics(&sim).contains("gpuctl_nvml_up 1")
    });
    let (run, entries) = crashed_run(2);
    sim.write(&scenario(2, &[1], &entries));
    daemon.expect(&["ACTION=suspended", "GPU 1 lost"], Duration::from_secs(5));
    daemon.expect(
        &["ACTION=left", "incomplete snapshot"],
        Duration::from_secs(5),
    );
    // Well past grace + interval (8 loops of 200ms: 1.4 s at least): nothing reclaimed from
    // the incomplete snapshot.
    wait_more_loops(&sim, 8);
    for &pid in &run.workers.pids {
        assert!(alive(pid), "{}", daemon.log());
    }
    assert_eq!(daemon.count(&["ACTION=reclaimed"]), 0, "{}", daemon.log());
    assert!(
        metrics(&sim).contains("gpuctl_gpu_up{gpu=\"1\""),
        "{}",
        metrics(&sim)
    );
    sim.write(&scenario(2, &[], &entries));
    daemon.expect(&["ACTION=resumed"], Duration::from_secs(10));
    wait_until(Duration::from_secs(10), || {
        run.workers.pids.iter().all(|&pid| !alive(pid))
    });
    daemon.assert_running();
    assert_eq!(daemon.stop(), 0);
}

#[test]
fn nvml_failing_mid_run_and_a_missing_library_keep_the_daemon_alive() {
    // NVML fails mid-run: a GPU is lost and re-opening NVML fails (driver unloaded).
    let sim = Sim::new(&scenario(2, &[], &[]));
    configure(&sim, "mode = \"reclaim\"", "");
    let mut daemon = Daemon::start(&sim, &[]);
    wait_until(Duration::from_secs(5), || {
        metrics(&sim).contains("gpuctl_nvml_up 1")
    });
    let (run, entries) = crashed_run(2);
    sim.write(&scenario(2, &[1], &entries).init_error("DRIVER_NOT_LOADED"));
    let down = daemon.expect(&["ACTION=nvml-down"], Duration::from_secs(10));
    assert!(down.contains("driver is not loaded"), "{down}");
    wait_until(Duration::from_secs(5), || {
        metrics(&sim).contains("gpuctl_nvml_up 0")
    });
    // Loops go on while NVML is down; 8 of them (1.4 s at least) see retries at 200ms,
    // 400ms and 800ms of backoff.
    wait_more_loops(&sim, 8);
    daemon.assert_running();
    for &pid in &run.workers.pids {
        assert!(alive(pid), "{}", daemon.log());
    }
    // Logged once per change, not every retry.
    assert_eq!(daemon.count(&["ACTION=nvml-down"]), 1, "{}", daemon.log());
    sim.write(&scenario(2, &[], &entries));
    daemon.expect(&["ACTION=nvml-up"], Duration::from_secs(10));
    wait_until(Duration::from_secs(10), || {
        run.workers.pids.iter().all(|&pid| !alive(pid))
    });
    assert_eq!(daemon.stop(), 0);

    // The library is missing at start, and appears later.
    let lib_dir = tempfile::tempdir().unwrap();
    let lib = lib_dir.path().join("libnvidia-ml.so.1");
    let mut command = command(&sim, &[]);
    command.env("GPUCTL_NVML_LIB", &lib);
    let mut daemon = Daemon::start_with(command);
    let down = daemon.expect(&["ACTION=nvml-down"], Duration::from_secs(5));
    assert!(down.contains("could not be loaded"), "{down}");
    std::fs::copy(sim_lib(), &lib).unwrap();
    daemon.expect(&["ACTION=nvml-up"], Duration::from_secs(10));
    daemon.assert_running();
    assert_eq!(daemon.stop(), 0);
}

#[test]
fn once_exit_statuses_and_dry_run() {
    // Nothing stale: 0.
    let healthy = Proc::spawn_ready("sleep", "python3", &["serve.py"]);
    let sim = Sim::new(&scenario(1, &[], &[process(healthy.pid(), 0, 1024, 30)]));
    configure(&sim, "", "");
    let run = once(&sim, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);

    // Stale in report mode: 4, left alone.
    let (crashed, entries) = crashed_run(2);
    sim.write(&scenario(1, &[], &entries));
    let run = once(&sim, &[]);
    assert_eq!(run.code, 4, "{}", run.stderr);
    assert!(run.stderr.contains("ACTION=left"), "{}", run.stderr);
    // --dry-run: 4, nothing signalled, logged as would-reclaim.
    let run = once(&sim, &["--mode", "reclaim", "--dry-run"]);
    assert_eq!(run.code, 4, "{}", run.stderr);
    assert!(
        run.stderr.contains("ACTION=would-reclaim"),
        "{}",
        run.stderr
    );
    for &pid in &crashed.workers.pids {
        assert!(alive(pid));
    }
    // A reclaim the guard refuses (a protected user, the one the workers run as; a command
    // name alone protects nothing, see tests/kill_clear.rs): 1.
    // SAFETY: geteuid(2) takes nothing, cannot fail and touches no memory of ours.
    let user = user_name(unsafe { libc::geteuid() });
    configure(&sim, &format!("protect_users = [\"{user}\"]"), "");
    let run = once(&sim, &["--mode", "reclaim"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(run.stderr.contains("ACTION=skipped"), "{}", run.stderr);
    assert!(
        run.stderr.contains(&format!("protected user: {user}")),
        "{}",
        run.stderr
    );
    // Reclaimed: 0, with no grace.
    configure(&sim, "", "");
    let run = once(&sim, &["--mode", "reclaim"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        run.stderr.matches("ACTION=reclaimed").count(),
        2,
        "{}",
        run.stderr
    );
    for &pid in &crashed.workers.pids {
        assert!(!alive(pid));
    }

    // NVML unavailable: 3.
    sim.write(&scenario(1, &[], &[]).init_error("DRIVER_NOT_LOADED"));
    let run = once(&sim, &[]);
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert!(run.stderr.contains("ACTION=nvml-down"), "{}", run.stderr);

    // Bad configuration and bad usage: 2, one line naming the file, line and key.
    write_config(
        &sim.config_path(),
        "[watchdog]\nmode = \"reclaim\"\nintervall = \"5s\"\n",
    );
    let run = once(&sim, &[]);
    run.assert_one_line_error(2, "line 3: unknown key 'watchdog.intervall'");
    assert!(
        run.stderr
            .contains(&sim.config_path().display().to_string())
    );
    write_config(&sim.config_path(), "[watchdog]\nmode = \"always\"\n");
    once(&sim, &[]).assert_one_line_error(2, "watchdog.mode");
    write_config(&sim.config_path(), "[watchdog]\ngrace = \"soon\"\n");
    once(&sim, &[]).assert_one_line_error(2, "watchdog.grace");
    let explicit = sim.dir.path().join("other.toml");
    write_config(&explicit, "[watchdog]\nreclaim = [\"everything\"]\n");
    let run = Run::from(
        command(&sim, &["--once", "--config", explicit.to_str().unwrap()])
            .output()
            .unwrap(),
    );
    run.assert_one_line_error(2, "watchdog.reclaim");
    let run = Run::from(command(&sim, &["--mode", "sometimes"]).output().unwrap());
    assert_eq!(run.code, 2, "{}", run.stderr);
    let run = Run::from(command(&sim, &["--version"]).output().unwrap());
    assert_eq!(run.code, 0);
    assert!(run.stdout.starts_with("gpuctl-watchdog "), "{}", run.stdout);
}

#[test]
fn the_daemon_in_dry_run_reclaims_nothing() {
    let (run, entries) = crashed_run(2);
    let sim = Sim::new(&scenario(1, &[], &entries));
    configure(&sim, "mode = \"reclaim\"", "");
    let mut daemon = Daemon::start(&sim, &["--dry-run"]);
    for &pid in &run.workers.pids {
        daemon.expect(
            &["ACTION=would-reclaim", &format!("PID={pid} ")],
            Duration::from_secs(5),
        );
    }
    wait_more_loops(&sim, 3);
    for &pid in &run.workers.pids {
        assert!(alive(pid), "{}", daemon.log());
    }
    // Once per process, not every loop.
    assert_eq!(
        daemon.count(&["ACTION=would-reclaim"]),
        2,
        "{}",
        daemon.log()
    );
    assert_eq!(daemon.stop(), 0);
}

/// The policy in packaging/k8s/gpuctl-watchdog.yaml's ConfigMap: every key must be one the
/// daemon accepts, so the example cannot drift from the code.
#[test]
fn the_kubernetes_configmap_policy_is_accepted() {
    let manifest = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/k8s/gpuctl-watchdog.yaml"),
    )
    .unwrap();
    // The block scalar under `gpuctl.toml: |`, de-indented.
    let mut lines = manifest
        .lines()
        .skip_while(|l| l.trim() != "gpuctl.toml: |");
    lines.next().expect("the ConfigMap holds gpuctl.toml");
    let block: Vec<&str> = lines
        .take_while(|l| l.starts_with("    ") || l.trim().is_empty())
        .collect();
    let indent = block
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap();
    let policy: String = block
        .iter()
        .map(|l| l.get(indent..).unwrap_or("").to_string() + "\n")
        .collect();
    assert!(policy.contains("[watchdog]"), "{policy}");
    let sim = Sim::new(&scenario(1, &[], &[]));
    // The paths it names are the pod's; here they point into the scratch directory.
    let policy = policy
        .replace(
            "/var/lib/node-exporter/textfile",
            &sim.dir.path().display().to_string(),
        )
        .replace(
            "/var/lib/gpuctl",
            &sim.dir.path().join("state").display().to_string(),
        );
    write_config(&sim.config_path(), &policy);
    let run = once(&sim, &["--dry-run"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        sim.dir.path().join("gpuctl.prom").exists(),
        "metrics_file was honoured"
    );
}

/// The name /etc/passwd (or NSS) gives `uid`.
fn user_name(uid: u32) -> String {
    let out = Command::new("id")
        .args(["-nu", &uid.to_string()])
        .output()
        .expect("run id");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[test]
fn a_process_claiming_a_protected_name_is_logged_once_as_an_impostor() {
    let impostor = Proc::spawn_ready("sleep", "nvidia-persistenced", &[]);
    let sim = Sim::new(&scenario(1, &[], &[process(impostor.pid(), 0, 4096, 30)]));
    configure(&sim, "", "");
    let mut daemon = Daemon::start(&sim, &[]);
    let line = daemon.expect(&["ACTION=impostor"], Duration::from_secs(5));
    assert!(
        line.contains(&format!("pid {} ", impostor.pid()))
            && line.contains("claims to be nvidia-persistenced but is not"),
        "{line}"
    );
    // Several loops later, still once.
    wait_more_loops(&sim, 4);
    assert_eq!(daemon.count(&["ACTION=impostor"]), 1, "{}", daemon.log());
    daemon.assert_running();
}

#[test]
fn a_gpu_that_stops_answering_suspends_reclaim_and_the_daemon_keeps_going() {
    let gpus = |hang: Duration| Scenario::new().gpu(Gpu::h200()).gpu(Gpu::h200().hang(hang));
    let sim = Sim::new(&gpus(Duration::ZERO));
    configure(&sim, "mode = \"reclaim\"", "");
    let mut command = command(&sim, &[]);
    command.env("GPUCTL_NVML_TIMEOUT", "1s");
    let mut daemon = Daemon::start_with(command);
    daemon.expect(&["ACTION=start"], Duration::from_secs(5));
    wait_until(Duration::from_secs(5), || {
        metrics(&sim).contains("gpuctl_nvml_up 1")
    });
    let (run, entries) = crashed_run(2);
    let with_jobs = |hang: Duration| gpus(hang).processes(entries.iter().cloned());
    sim.write(&with_jobs(Duration::from_secs(600)));
    daemon.expect(
        &["ACTION=suspended", "GPU 1 not answering after 1s"],
        Duration::from_secs(10),
    );
    // Loops go on (no wait behind the blocked call) well past grace + interval (8 loops of
    // 200ms: 1.4 s at least), and nothing is reclaimed from the incomplete snapshot.
    wait_more_loops(&sim, 8);
    for &pid in &run.workers.pids {
        assert!(alive(pid), "{}", daemon.log());
    }
    assert_eq!(daemon.count(&["ACTION=reclaimed"]), 0, "{}", daemon.log());
    daemon.assert_running();

    // It answers again: reclaim resumes.
    sim.write(&with_jobs(Duration::ZERO));
    daemon.expect(&["ACTION=resumed"], Duration::from_secs(10));
    wait_until(Duration::from_secs(10), || {
        run.workers.pids.iter().all(|&pid| !alive(pid))
    });
    daemon.assert_running();
    assert_eq!(daemon.stop(), 0);
}

/// VmRSS of `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The reliability soak, test-sized (GPUCTL_SOAK_SECONDS, default 30; bench/soak.sh runs it
/// for 10 minutes): NVML errs at random (2% of calls: UNKNOWN, TIMEOUT, GPU_IS_LOST,
/// NOT_FOUND), GPU 1 stops answering now and then, healthy runs start and stop, and runs
/// crash. Nothing healthy is killed, the daemon never dies, every crash is reclaimed once
/// its GPUs answer, and its memory stays flat.
#[test]
fn a_soak_under_injected_faults_and_hangs_kills_nothing_healthy_and_reclaims_every_crash() {
    let seconds: u64 = std::env::var("GPUCTL_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let scenario_of = |hang: bool, runs: &[(&TrainingRun, u32)]| {
        let hang = Duration::from_secs(if hang { 600 } else { 0 });
        let mut scenario = Scenario::new()
            .faults(
                0.02,
                42,
                &["UNKNOWN", "TIMEOUT", "GPU_IS_LOST", "NOT_FOUND"],
            )
            .gpu(Gpu::h200())
            .gpu(Gpu::h200().hang(hang));
        for (run, gpu) in runs {
            scenario = scenario.process(process(run.parent.pid(), *gpu, 8192, 40));
            for &pid in &run.workers.pids {
                scenario = scenario.process(process(pid, *gpu, 512, 0));
            }
        }
        scenario
    };
    let sim = Sim::new(&scenario_of(false, &[]));
    configure(&sim, "mode = \"reclaim\"", "");
    let mut command = command(&sim, &[]);
    command.env("GPUCTL_NVML_TIMEOUT", "500ms");
    let mut daemon = Daemon::start_with(command);
    daemon.expect(&["ACTION=start"], Duration::from_secs(5));
    let daemon_pid = daemon.child.id();

    let mut healthy: Vec<(TrainingRun, u32)> = Vec::new();
    let mut crashed: Vec<(TrainingRun, u32, Instant)> = Vec::new();
    let mut reclaimed = 0;
    let mut rss_early = None;
    let soak = Instant::now();
    let mut round = 0u32;
    let mut hang_since: Option<Instant> = None;
    let mut answered_at = Instant::now();
    while soak.elapsed() < Duration::from_secs(seconds) {
        round += 1;
        let gpu = round % 2;
        healthy.push((
            TrainingRun::start(2, "sleep", "python3", &["train.py"]),
            gpu,
        ));
        if healthy.len() > 3 {
            // A job ends: out of the scenario first, then its processes.
            let (done, _) = healthy.remove(0);
            let all: Vec<(&TrainingRun, u32)> = healthy
                .iter()
                .map(|(r, g)| (r, *g))
                .chain(crashed.iter().map(|(r, g, _)| (r, *g)))
                .collect();
            sim.write(&scenario_of(hang_since.is_some(), &all));
            drop(done);
        }
        if round.is_multiple_of(3) {
            let (mut run, gpu) = healthy.remove(0);
            run.crash();
            crashed.push((run, gpu, Instant::now()));
        }
        // GPU 1 stops answering every fourth round, for one round.
        let hang = round.is_multiple_of(4);
        if hang_since.is_some() && !hang {
            answered_at = Instant::now();
        }
        hang_since = if hang {
            hang_since.or(Some(Instant::now()))
        } else {
            None
        };
        let all: Vec<(&TrainingRun, u32)> = healthy
            .iter()
            .map(|(r, g)| (r, *g))
            .chain(crashed.iter().map(|(r, g, _)| (r, *g)))
            .collect();
        sim.write(&scenario_of(hang, &all));
        // As long as 1.5 s of loops at least.
        wait_more_loops(&sim, 8);

        for (run, _) in &healthy {
            assert!(alive(run.parent.pid()), "round {round}:\n{}", daemon.log());
            for &pid in &run.workers.pids {
                assert!(
                    alive(pid),
                    "healthy worker {pid} killed (round {round}):\n{}",
                    daemon.log()
                );
            }
        }
        // A crash is reclaimed within grace + interval + term_timeout and slack, counted
        // from when it crashed or GPU 1 last answered, whichever is later.
        crashed.retain(|(run, gpu, at)| {
            let gone = run.workers.pids.iter().all(|&pid| !alive(pid));
            if gone {
                reclaimed += 1;
                return false;
            }
            let since = if *gpu == 1 {
                (*at).max(answered_at)
            } else {
                *at
            };
            assert!(
                *gpu == 1 && hang_since.is_some() || since.elapsed() < Duration::from_secs(12),
                "a crash on GPU {gpu} left for {:?}:\n{}",
                since.elapsed(),
                daemon.log()
            );
            true
        });
        daemon.assert_running();
        if rss_early.is_none() && soak.elapsed() > Duration::from_secs(seconds / 3) {
            rss_early = Some(rss_kib(daemon_pid));
        }
    }
    // Every crash is reclaimed once GPU 1 answers.
    let all: Vec<(&TrainingRun, u32)> = healthy
        .iter()
        .map(|(r, g)| (r, *g))
        .chain(crashed.iter().map(|(r, g, _)| (r, *g)))
        .collect();
    sim.write(&scenario_of(false, &all));
    wait_until(Duration::from_secs(15), || {
        crashed
            .iter()
            .all(|(run, _, _)| run.workers.pids.iter().all(|&pid| !alive(pid)))
    });
    reclaimed += crashed.len();
    for (run, _) in &healthy {
        for &pid in &run.workers.pids {
            assert!(alive(pid), "healthy worker {pid} killed:\n{}", daemon.log());
        }
    }
    assert!(
        reclaimed >= (round / 3) as usize,
        "{reclaimed} of {} crashes",
        round / 3
    );
    assert!(
        daemon.count(&["ACTION=suspended"]) > 0,
        "no fault was felt:\n{}",
        daemon.log()
    );
    let rss_late = rss_kib(daemon_pid);
    let rss_early = rss_early.unwrap_or(rss_late);
    eprintln!(
        "soak: {seconds}s, {round} rounds, {reclaimed} crashes reclaimed, 0 healthy killed, \
         RSS {rss_early} -> {rss_late} KiB"
    );
    assert!(
        rss_late <= rss_early + 2048,
        "RSS grew from {rss_early} to {rss_late} KiB"
    );
    daemon.assert_running();
    assert_eq!(daemon.stop(), 0);
}

/// A job hung in a collective: GPU 0 at 100 % utilization, low power, steady memory. It is
/// reported once as stuck after `stuck_after` (journal line with "stuck", the index and the
/// UUID; `gpuctl_gpu_stuck` 1), `gpuctl info` shows it from the state directory, nothing is
/// killed; a GPU drawing real power, or whose memory moves, is not stuck.
#[test]
fn a_gpu_busy_at_low_power_with_steady_memory_is_reported_stuck_never_killed() {
    let job = Proc::spawn_ready("sleep", "python3", &["train.py", "--backend", "nccl"]);
    let at = |power_mw: u32, used_mib: u64| {
        Scenario::new()
            .gpu(Gpu::new().utilization(100).power_mw(power_mw))
            .gpu(Gpu::new())
            .process(Process::new(job.pid()).used(used_mib * MIB))
    };
    let sim = Sim::new(&at(650_000, 40960));
    let uuid = sim.json(&["info"])["devices"][0]["uuid"]
        .as_str()
        .unwrap()
        .to_string();
    configure(
        &sim,
        "mode = \"reclaim\"\nstuck_after = \"1s\"\nstuck_util_pct = 95\nstuck_power_fraction = 0.4",
        "",
    );
    let stuck_metric = |value: u8| format!("gpuctl_gpu_stuck{{gpu=\"0\",uuid=\"{uuid}\"}} {value}");
    let mut daemon = Daemon::start(&sim, &[]);
    wait_until(Duration::from_secs(5), || {
        metrics(&sim).contains(&stuck_metric(0))
    });

    // Busy at 650 W of 700: working, not stuck, however long (8 loops: past stuck_after).
    wait_more_loops(&sim, 8);
    assert_eq!(daemon.count(&["stuck"]), 0, "{}", daemon.log());

    // Power falls to 100 W (14 %): reported within stuck_after and a loop or two.
    sim.write(&at(100_000, 40960));
    let line = daemon.expect(&["stuck for", "GPU 0", &uuid], Duration::from_secs(5));
    assert!(line.contains(&format!("pid {}", job.pid())), "{line}");
    wait_until(Duration::from_secs(3), || {
        metrics(&sim).contains(&stuck_metric(1))
    });
    wait_more_loops(&sim, 4);
    assert_eq!(
        daemon.count(&["stuck for"]),
        1,
        "reported once: {}",
        daemon.log()
    );
    assert!(alive(job.pid()), "nothing is killed for being stuck");

    // gpuctl info shows what the watchdog finds, with since when.
    let table = sim.run(&["info"]);
    assert!(table.stdout.contains("watchdog:"), "{}", table.stdout);
    assert!(
        table.stdout.contains("GPU 0: stuck since "),
        "{}",
        table.stdout
    );
    let doc = sim.json(&["info"]);
    let findings = doc["watchdog"]["findings"].as_array().expect("findings");
    assert_eq!(findings.len(), 1, "{findings:?}");
    assert_eq!(findings[0]["kind"], "stuck");
    assert_eq!(findings[0]["uuids"][0], uuid.as_str());
    assert!(findings[0]["pid"].is_null());

    // Memory moving by more than 1 % each loop: a working job, the spell starts over.
    sim.write(&at(650_000, 40960));
    wait_until(Duration::from_secs(3), || {
        metrics(&sim).contains(&stuck_metric(0))
    });
    let reported = daemon.count(&["stuck for"]);
    let used = |sim: &Sim| {
        metrics(sim)
            .lines()
            .find(|l| l.starts_with("gpuctl_gpu_memory_used_bytes{gpu=\"0\""))
            .map(str::to_string)
    };
    let mut seen = used(&sim);
    for step in 0..12u64 {
        sim.write(&at(100_000, 40960 + (step % 2) * 4096));
        // The next step once a loop saw this one's memory (the first step's is the same).
        if step > 0 {
            wait_until(Duration::from_secs(3), || used(&sim) != seen);
            seen = used(&sim);
        }
    }
    assert_eq!(daemon.count(&["stuck for"]), reported, "{}", daemon.log());
    assert!(
        metrics(&sim).contains(&stuck_metric(0)),
        "{}",
        metrics(&sim)
    );
    daemon.assert_running();
}

/// On a MIG-partitioned card the watchdog reclaims a leftover in one instance (a zombie
/// holder: a crashed run's leader whose threads hold the context) while the job in the
/// neighbouring instance lives, and its metrics carry each instance.
#[test]
fn a_leftover_in_one_mig_instance_is_reclaimed_and_the_neighbour_lives() {
    let live = Proc::spawn_ready("sleep", "python3", &["train.py"]);
    let zombie = Proc::spawn("zombie-leader", "python3", &["finetune.py"]);
    zombie.wait_for_state('Z');
    let sim = Sim::new(
        &Scenario::new()
            .gpu(Gpu::h100().mig("3g.40gb", 1).mig("1g.10gb", 9))
            .process(Process::new(live.pid()).instance(1).used(8192 * MIB))
            .process(Process::new(zombie.pid()).instance(9).used(4096 * MIB)),
    );
    configure(&sim, "mode = \"reclaim\"", "");
    let daemon = Daemon::start(&sim, &[]);
    let reclaimed = daemon.expect(
        &["ACTION=reclaimed", &format!("PID={}", zombie.pid())],
        Duration::from_secs(10),
    );
    assert!(reclaimed.contains("GPU_UUID="), "{reclaimed}");
    crate::util::wait_exited(zombie.pid());
    assert!(alive(live.pid()), "the neighbouring instance's job lives");
    wait_until(Duration::from_secs(5), || {
        let text = metrics(&sim);
        text.contains("gpuctl_mig_memory_used_bytes{gpu=\"0\"")
            && text.lines().any(|l| {
                l.starts_with("gpuctl_mig_memory_used_bytes")
                    && l.contains("gpu_instance=\"9\"")
                    && l.ends_with(" 0")
            })
            && text.lines().any(|l| {
                l.starts_with("gpuctl_mig_memory_used_bytes")
                    && l.contains("gpu_instance=\"1\"")
                    && l.ends_with(&format!(" {}", 8192 * MIB))
            })
    });
}

/// promtool, which the fleet families are checked with: a missing one fails the test (a
/// check skipped in silence passes nothing).
fn promtool() -> PathBuf {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join("promtool"))
        .find(|path| path.is_file())
        .expect("promtool is missing: run scripts/fetch-prometheus")
}

fn promtool_check(text: &str) {
    use std::io::Write;
    let mut check = Command::new(promtool())
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    check
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = check.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The sample of `series` (name and labels as written) in `text`.
fn sample<'a>(text: &'a str, series: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
}

#[test]
fn the_fleet_families_pass_promtool_and_follow_a_reload() {
    promtool();
    let sim = Sim::new("");
    let dev = sim.dev_dir();
    let gpus = || {
        Scenario::new()
            .device_dir(&dev)
            .gpu(Gpu::h200().leaked(2 * crate::util::GIB))
            .gpu(Gpu::h200())
    };
    // The device files, created by a first NVML client, for the holder to open.
    sim.write(&gpus());
    let first = sim.run(&["info"]);
    assert_eq!(first.code, 0, "{}", first.stderr);
    let impostor = Proc::spawn_ready("sleep", "nvidia-persistenced", &[]);
    let hidden = Proc::spawn_holding("python3", &["infer.py"], &[&dev.join("nvidia1")]);
    let mut processes = vec![process(impostor.pid(), 0, 4096, 30)];
    let other = is_root().then(|| Proc::spawn_as(65534, "sleep", &[]));
    if let Some(other) = &other {
        processes.push(process(other.pid(), 1, 1024, 30));
    }
    sim.write(&gpus().processes(processes));
    configure(&sim, "", "");
    let mut daemon = Daemon::start_with({
        let mut command = command(&sim, &[]);
        command.env("GPUCTL_DEV_DIR", &dev);
        command
    });
    let mut text = String::new();
    wait_until(Duration::from_secs(10), || {
        text = metrics(&sim);
        text.contains("gpuctl_findings{kind=\"impostor\"} 1")
    });
    promtool_check(&text);
    for kind in [
        "orphaned",
        "zombie_holder",
        "stopped",
        "uninterruptible",
        "unattributed",
        "above_fraction",
        "unlisted_holder",
        "stuck",
        "impostor",
    ] {
        assert!(
            sample(&text, &format!("gpuctl_findings{{kind=\"{kind}\"}}")).is_some(),
            "{kind}: {text}"
        );
    }
    let gpu = |index: u32| {
        let uuid = text
            .lines()
            .find_map(|l| {
                l.strip_prefix(&format!("gpuctl_gpu_up{{gpu=\"{index}\",uuid=\""))?
                    .split('"')
                    .next()
            })
            .unwrap_or_else(|| panic!("GPU {index}: {text}"));
        format!("{{gpu=\"{index}\",uuid=\"{uuid}\"}}")
    };
    let (gpu0, gpu1) = (gpu(0), gpu(1));
    assert_eq!(
        sample(&text, &format!("gpuctl_gpu_unattributed_bytes{gpu0}")),
        Some("2147483648"),
        "{text}"
    );
    // 2 GiB unattributed on GPU 0: the holder scan ran, and saw the unlisted one on GPU 1.
    assert_eq!(
        sample(&text, &format!("gpuctl_holders{gpu1}")),
        Some("1"),
        "{text}"
    );
    assert_eq!(
        sample(&text, &format!("gpuctl_holders{gpu0}")),
        Some("0"),
        "{text}"
    );
    // SAFETY: geteuid(2) takes nothing, cannot fail and touches no memory of ours.
    let me = user_name(unsafe { libc::geteuid() });
    assert_eq!(
        sample(&text, &format!("gpuctl_user_memory_bytes{{user=\"{me}\"}}")),
        Some("4294967296"),
        "{text}"
    );
    assert_eq!(
        sample(&text, &format!("gpuctl_user_processes{{user=\"{me}\"}}")),
        Some("1"),
        "{text}"
    );
    assert!(
        text.contains("\ngpuctl_owner_memory_bytes{owner_kind=\""),
        "{text}"
    );
    assert_eq!(
        sample(&text, "gpuctl_watchdog_interval_seconds"),
        Some("0.2"),
        "{text}"
    );

    // A reload: the new interval, and the cap (two users, one series and "other").
    let good = std::fs::read_to_string(sim.config_path()).unwrap();
    write_config(
        &sim.config_path(),
        &good
            .replace("interval = \"200ms\"", "interval = \"300ms\"")
            .replace("[watchdog]", "[watchdog]\nmetrics_max_owners = 1"),
    );
    daemon.signal(libc::SIGHUP);
    daemon.expect(&["ACTION=reload"], Duration::from_secs(5));
    wait_until(Duration::from_secs(10), || {
        text = metrics(&sim);
        sample(&text, "gpuctl_watchdog_interval_seconds") == Some("0.3")
    });
    promtool_check(&text);
    if other.is_some() {
        assert_eq!(
            sample(&text, "gpuctl_user_memory_bytes{user=\"other\"}"),
            Some("1073741824"),
            "{text}"
        );
        assert_eq!(
            text.matches("\ngpuctl_user_memory_bytes{").count(),
            2,
            "{text}"
        );
    }
    drop(hidden);
    daemon.assert_running();
    assert_eq!(daemon.stop(), 0);
}
