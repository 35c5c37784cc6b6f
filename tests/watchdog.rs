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
    Gpu, Proc, Process, Run, Scenario, Sim, TrainingRun, alive, counted_finding_kinds, is_root,
    process_in, sim_lib, user_name, wait_until, watchdog_bin,
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

pub(crate) fn metrics(sim: &Sim) -> String {
    std::fs::read_to_string(sim.dir.path().join("gpuctl.prom")).unwrap_or_default()
}

/// `gpuctl-watchdog ARGS` against the scenario, with nothing of systemd in its environment.
pub(crate) fn command(sim: &Sim, args: &[&str]) -> Command {
    let mut command = Command::new(watchdog_bin());
    sim.watchdog_env(command.args(args));
    command
}

fn once(sim: &Sim, args: &[&str]) -> Run {
    let mut all = vec!["--once"];
    all.extend_from_slice(args);
    Run::from(command(sim, &all).output().expect("run gpuctl-watchdog"))
}

/// What starts a test's own note in a [`Daemon`]'s log.
const TEST_NOTE: &str = "---- test: ";

/// A running daemon; its stderr lines are collected as they come. Killed on drop.
pub(crate) struct Daemon {
    child: Child,
    /// Its stderr lines, each with when it arrived (since the start), and the test's own
    /// notes among them: a failing test's log shows what the daemon did when.
    lines: Arc<Mutex<Vec<(Duration, String)>>>,
    started: Instant,
}

impl Daemon {
    pub(crate) fn start(sim: &Sim, args: &[&str]) -> Daemon {
        Daemon::start_with(command(sim, args))
    }

    pub(crate) fn start_with(mut command: Command) -> Daemon {
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start gpuctl-watchdog");
        let stderr = child.stderr.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        let started = Instant::now();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                sink.lock().unwrap().push((started.elapsed(), line));
            }
        });
        Daemon {
            child,
            lines,
            started,
        }
    }

    /// Every line, each after the seconds since the start at which it arrived.
    fn log(&self) -> String {
        let lines = self.lines.lock().unwrap();
        let timed: Vec<String> = lines
            .iter()
            .map(|(at, line)| format!("{:8.3}s {line}", at.as_secs_f64()))
            .collect();
        timed.join("\n")
    }

    /// Puts the test's own step into the log, at its time, so that a failure shows what the
    /// daemon did before and after it. Marked as the test's: no needle of a daemon line
    /// matches it.
    fn note(&self, step: &str) {
        let at = self.started.elapsed();
        self.lines
            .lock()
            .unwrap()
            .push((at, format!("{TEST_NOTE}{step}")));
    }

    /// The daemon's lines (not the test's notes) holding every needle.
    fn matching(&self, needles: &[&str]) -> Vec<String> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .map(|(_, line)| line)
            .filter(|line| !line.starts_with(TEST_NOTE))
            .filter(|line| needles.iter().all(|n| line.contains(n)))
            .cloned()
            .collect()
    }

    /// The first line containing every needle, waiting up to `limit`.
    fn expect(&self, needles: &[&str], limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(line) = self.matching(needles).into_iter().next() {
                return line;
            }
            assert!(
                Instant::now() < deadline,
                "no log line with {needles:?} within {limit:?}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits up to 10 s until `count` lines hold every needle; returns the last of them.
    pub(crate) fn expect_count(&self, needles: &[&str], count: usize) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let found = self.matching(needles);
            if found.len() >= count {
                return found.last().cloned().unwrap_or_default();
            }
            assert!(
                Instant::now() < deadline,
                "fewer than {count} log lines with {needles:?}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub(crate) fn count(&self, needles: &[&str]) -> usize {
        self.matching(needles).len()
    }

    fn assert_running(&mut self) {
        assert!(
            self.child.try_wait().unwrap().is_none(),
            "the daemon exited; log:\n{}",
            self.log()
        );
    }

    /// SIGHUP: the configuration read again.
    pub(crate) fn reload(&self) {
        self.signal(libc::SIGHUP);
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child, not yet reaped.
        unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
    }

    /// SIGTERM, and the exit status within 10 s.
    pub(crate) fn stop(&mut self) -> i32 {
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

// A process's stat is read every quarter of the grace, 10 s here; each second a look reads
// its statm and its parent's (see gpuctl_core::host::FactCache). The crash and the zombie
// must still be seen within a second and a loop, whoever runs them.
#[test]
fn another_users_crash_and_zombie_holder_are_seen_within_a_second() {
    if !is_root() {
        panic!("cannot run here: needs root to run processes as another user");
    }
    crash_and_zombie_holder_are_seen_within_a_second(Some(65534));
}

#[test]
fn a_crash_and_zombie_holder_of_the_watchdogs_own_user_are_seen_within_a_second() {
    crash_and_zombie_holder_are_seen_within_a_second(None);
}

fn crash_and_zombie_holder_are_seen_within_a_second(uid: Option<u32>) {
    let (mut run, mut holder, sim) = healthy_run_and_holder(uid);
    configure_with_grace(&sim, "40s", "mode = \"reclaim\"", "");
    let mut daemon = Daemon::start(&sim, &[]);
    wait_for_loops(&sim, 5);
    assert_eq!(daemon.count(&["ACTION=stale"]), 0, "{}", daemon.log());

    crash_both(&mut run, &mut holder);
    let crashed_at = Instant::now();
    // refresh (1 s) + interval, and slack for a loaded machine: the suite runs its tests in
    // parallel on two cores, where up to 3.4 s was seen. What this guards against is facts
    // as old as they may be for acting (grace / 4: 10 s here) standing for the look that
    // must come every second, so 6 s still tells the two apart.
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
pub(crate) fn wait_more_loops(sim: &Sim, n: u64) {
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
    // One story in one pass: left, never "reclaimed if it stays so" as well.
    assert!(
        run.stderr.contains("report mode leaves it (exit status 4)"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("reclaimed if"), "{}", run.stderr);
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

/// RssAnon of `pid`, in KiB: the process's own memory, without the file pages it maps.
fn rss_anon_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("RssAnon:"))
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
            rss_early = Some((rss_kib(daemon_pid), rss_anon_kib(daemon_pid)));
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
    let rss_late = (rss_kib(daemon_pid), rss_anon_kib(daemon_pid));
    let (rss_early, anon_early) = rss_early.unwrap_or(rss_late);
    let (rss_late, anon_late) = rss_late;
    eprintln!(
        "soak: {seconds}s, {round} rounds, {reclaimed} crashes reclaimed, 0 healthy killed, \
         RSS {rss_early} -> {rss_late} KiB, anonymous {anon_early} -> {anon_late} KiB"
    );
    // The daemon's own memory (heap, stacks), not its RSS: most of the RSS is the binary's
    // file pages, which the page cache may drop and bring back mid-soak (seen at 600 s: a
    // 3.6 MiB swing with RssAnon flat).
    assert!(
        anon_late <= anon_early + 2048,
        "the daemon's own memory grew from {anon_early} to {anon_late} KiB"
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
    // Only the GPUs shown: GPU 1 has nothing.
    let other = sim.json(&["info", "--gpu", "1"]);
    assert_eq!(
        other["watchdog"]["findings"],
        serde_json::json!([]),
        "{other}"
    );
    let table = sim.run(&["info", "--gpu", "1"]);
    assert!(
        table.stdout.contains("watchdog: nothing found"),
        "{}",
        table.stdout
    );

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
    for kind in counted_finding_kinds() {
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

/// The victim and the attacker of the attack soak (the uids of tests/hostile_owner.rs).
const ALICE: u32 = 1000;
const MALLORY: u32 = 1001;
/// The attack soak's second attacker, whose idle process claims the exempt job.
const IDLER: u32 = 1002;

/// Forks and reaps short-lived children, about `per_second` a second, until dropped: the
/// pid counter wraps pid_max every few tens of seconds, so the pids of ended processes come
/// back to new ones soon, as a user's fork loop makes them.
struct PidCycler {
    stop: Arc<std::sync::atomic::AtomicBool>,
    forks: Arc<std::sync::atomic::AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PidCycler {
    fn start(per_second: u64) -> PidCycler {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let stop = Arc::new(AtomicBool::new(false));
        let forks = Arc::new(AtomicU64::new(0));
        let (halt, count) = (Arc::clone(&stop), Arc::clone(&forks));
        let thread = std::thread::spawn(move || {
            while !halt.load(Ordering::Relaxed) {
                for _ in 0..(per_second / 100).max(1) {
                    // SAFETY: the child of this multi-threaded process calls only _exit,
                    // which is async-signal-safe.
                    let pid = unsafe { libc::fork() };
                    if pid == 0 {
                        // SAFETY: see above; no destructor or atexit handler runs.
                        unsafe { libc::_exit(0) };
                    }
                    if pid > 0 {
                        // SAFETY: reaps this child only, by pid: the test's other children
                        // are their owners' (Child, PidReuser) to reap.
                        unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        PidCycler {
            stop,
            forks,
            thread: Some(thread),
        }
    }

    fn forks(&self) -> u64 {
        self.forks.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for PidCycler {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A reclaimed worker's pid, still listed (NVML lags), given to a new process of the test's
/// once the kernel frees it.
struct Lingering {
    pid: u32,
    since: Instant,
    reuser: Option<crate::util::PidReuser>,
}

/// The entries `gpuctl info --json` shows for `pid`, on any GPU.
fn shown_entry(doc: &serde_json::Value, pid: u32) -> Option<serde_json::Value> {
    process_in(doc, pid).cloned()
}

/// Whether the owner shown for mallory's forger credits her process to alice's job `job`
/// (or to a container): an environment claim of her own (`from_environ`, her uid) is hers.
fn credits_forgery(owner: &serde_json::Value, job: u64) -> bool {
    match owner["kind"].as_str().unwrap_or("") {
        "slurm_job" => {
            owner["from_environ"] != true
                || owner["uid"] != MALLORY
                || owner["job_id"].as_u64() != Some(job)
        }
        "container" | "kubernetes_pod" => true,
        _ => false,
    }
}

/// What is wrong in the watchdog's peaks.json for alice's job `job`: its `slurm:JOB` entry
/// holding a GPU other than alice's, more than alice's memory, or mallory's name; or an
/// environment claim under alice's uid (her runs set no SLURM_JOB_ID).
fn forged_peaks(sim: &Sim, job: u64, alices_gpu: &str, alices_bytes: u64) -> Vec<String> {
    let Ok(bytes) = std::fs::read(sim.dir.path().join("state/peaks.json")) else {
        return Vec::new();
    };
    let peaks: serde_json::Value = match serde_json::from_slice(&bytes) {
        Ok(peaks) => peaks,
        Err(e) => return vec![format!("peaks.json unreadable: {e}")],
    };
    let mut wrong = Vec::new();
    let entry = &peaks["owners"][format!("slurm:{job}")];
    if let Some(gpus) = entry["gpus"].as_object() {
        for (uuid, used) in gpus {
            if uuid != alices_gpu || used.as_u64().is_none_or(|b| b > alices_bytes) {
                wrong.push(format!("slurm:{job} holds {used} on {uuid}: {entry}"));
            }
        }
        let mallorys = [MALLORY.to_string(), user_name(MALLORY)];
        if entry["user"]
            .as_str()
            .is_some_and(|u| !u.is_empty() && mallorys.iter().any(|m| m == u))
        {
            wrong.push(format!("slurm:{job} is mallory's: {entry}"));
        }
    }
    let alices_claim = &peaks["owners"][format!("slurm:{job}@{ALICE}")];
    if !alices_claim.is_null() {
        wrong.push(format!("slurm:{job}@{ALICE} exists: {alices_claim}"));
    }
    wrong
}

/// The attack soak, test-sized (GPUCTL_SOAK_SECONDS, default 20; bench/soak.sh runs it for
/// 10 minutes). The daemon reclaims throughout, among alice's runs (healthy ones coming and
/// going, crashes to reclaim, one in Slurm job N's cgroup) and a genuine protected program's
/// idle orphans, while mallory attacks each round the ways round three closed:
/// - a claimant: the root-owned nvidia-persistenced run by her with her library preloaded,
///   and idle orphans of the root-owned nvidia-smi with it preloaded (run by root or by
///   her): root's `gpuctl kill --user` must end the one, the daemon reclaim the others;
/// - a forger: her process claiming job N (SLURM_JOB_ID, in a `slurm/job_N/step_0` or a
///   docker-like cgroup made under her user@ service): never shown, nor put in peaks.json,
///   as alice's job;
/// - pid reuse: a fork loop wraps pid_max, and reclaimed workers' pids, still listed, are
///   given to new processes: none of which may be ended;
/// - an idle claim: with `[idle] action = "reclaim"`, job N exempt (`slurm:N`) and alice's
///   own environment claims on her job M (`slurm:M@1000`), an idle process of another
///   attacker (uid 1002, whom root's kill of mallory's does not end) sets SLURM_JOB_ID to
///   N or M: the daemon must reclaim it, and never alice's idle process claiming M.
///
/// Victims ended, attackers shielded and forgeries accepted stay 0, every crash is
/// reclaimed, the daemon never restarts and its memory stays flat.
#[test]
fn a_soak_under_attack_ends_no_victim_and_shields_no_attacker() {
    use crate::util::{PidReuser, RootOwnedProgram, Strays, TestCgroup, background_workers_of};
    use crate::util::{background_workers_of_env, start_ticks};
    if !is_root() {
        panic!("cannot run here: needs root (root-owned programs, other users' processes)");
    }
    let seconds: u64 = std::env::var("GPUCTL_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let persistenced = RootOwnedProgram::install("nvidia-persistenced");
    let smi = RootOwnedProgram::install("nvidia-smi");
    let (_library_dir, library) = crate::hostile_protect::user_writable_library();
    let preload = [("LD_PRELOAD", library.as_os_str())];

    // Alice's job N in Slurm's own cgroup, and where mallory forges it: under her user@
    // service, as a Slurm job's and as a container's name. Job ids of this run's own.
    let job = 9_000_000 + u64::from(std::process::id()) % 1_000_000;
    let job_text = job.to_string();
    let alices_cgroup = TestCgroup::create(
        Path::new("/sys/fs/cgroup/freezer"),
        &format!("/slurm/uid_{ALICE}/job_{job}/step_0"),
    );
    let unified = Path::new("/sys/fs/cgroup/unified");
    let delegated = format!("/user.slice/user-{MALLORY}.slice/user@{MALLORY}.service/app.slice");
    let forged_job = TestCgroup::create(unified, &format!("{delegated}/slurm/job_{job}/step_0"));
    let forged_docker =
        TestCgroup::create(unified, &format!("{delegated}/docker-{job:064x}.scope"));
    if alices_cgroup.is_none() || forged_job.is_none() || forged_docker.is_none() {
        eprintln!("note: cgroups cannot be made here: the forger claims by environment only");
    }

    let sim = Sim::new(&scenario(2, &[], &[]));
    // Alice's job M, whose only tie is her notebook's environment (linuxproc).
    let notebook_job = (job + 1).to_string();
    // Idle holders are those of 3 GiB and more: alice's runs (busy parents, 512 MiB
    // workers) never are; her exempt idle process and the attacker's idle claims are.
    let idle = format!(
        "[idle]\nafter = \"1s\"\naction = \"reclaim\"\nreclaim_after = \"1s\"\n\
         min_memory = \"3GiB\"\nexempt_owners = [\"slurm:{job}\", \"slurm:{notebook_job}@{ALICE}\"]"
    );
    configure(&sim, "mode = \"reclaim\"", &idle);
    let mut daemon = Daemon::start(&sim, &[]);
    daemon.expect(&["ACTION=start"], Duration::from_secs(5));
    let daemon_pid = daemon.child.id();
    let info = sim.json(&["info"]);
    let alices_gpu = info["devices"][0]["uuid"].as_str().unwrap().to_string();

    let alices_job = TrainingRun::start_as(Some(ALICE), 2, "sleep", "python3", &["train.py"]);
    if let Some(cgroup) = &alices_cgroup {
        for pid in std::iter::once(alices_job.parent.pid()).chain(alices_job.workers.pids.clone()) {
            cgroup.add(pid);
        }
    }
    // The job's most on GPU 0 at one look: its parent and two workers (see `entries`).
    let alices_bytes = (8192 + 2 * 512) * MIB;
    let claims = [
        [("SLURM_JOB_ID", job_text.as_str())],
        [("SLURM_JOB_ID", notebook_job.as_str())],
    ];
    // Alice's own idle process claiming her job M: exempt, never reclaimed.
    let alices_idle = Proc::spawn_as_with_env(ALICE, "sleep", &["notebook.py"], &claims[1]);
    let mut idle_claims: Vec<(Proc, Instant)> = Vec::new();
    let mut idle_claim_pids: Vec<u32> = Vec::new();
    // The genuine program, run by root, idle orphans: protected, never reclaimed.
    let genuine = background_workers_of(persistenced.path(), None, 2);
    // Started once the programs are installed: a fork while a copy is written open would
    // hold it and make its exec fail (ETXTBSY).
    let cycler = PidCycler::start(1000);

    let mut healthy: Vec<TrainingRun> = Vec::new();
    let mut crashed: Vec<(TrainingRun, Instant)> = Vec::new();
    let mut orphans: Vec<(Strays, Instant)> = Vec::new();
    let mut orphan_pids: Vec<u32> = Vec::new();
    let mut lingering: Vec<Lingering> = Vec::new();
    let mut findings: Vec<String> = Vec::new();
    let mut counted: std::collections::HashSet<(u32, u64)> = std::collections::HashSet::new();
    let (mut victims_ended, mut shielded, mut forgeries) = (0u32, 0u32, 0u32);
    let (mut reclaimed, mut claimants_ended, mut reused) = (0u32, 0u32, 0u32);
    let mut idle_reclaimed = 0u32;
    let mut rss_early = None;
    let mut anon_early = None;

    // Everything listed, first entry per pid: a pid given anew is listed as what it is now.
    let entries = |healthy: &[TrainingRun],
                   crashed: &[(TrainingRun, Instant)],
                   orphans: &[(Strays, Instant)],
                   lingering: &[Lingering],
                   idle_claims: &[(Proc, Instant)],
                   mallorys: &[(u32, u64, u32)]| {
        let mut seen = std::collections::HashSet::new();
        let mut list = Vec::new();
        let mut add = |process: Process, pid: u32| {
            if seen.insert(pid) {
                list.push(process);
            }
        };
        for run in std::iter::once(&alices_job).chain(healthy) {
            add(process(run.parent.pid(), 0, 8192, 40), run.parent.pid());
            for &pid in &run.workers.pids {
                add(process(pid, 0, 512, 0), pid);
            }
        }
        for &(pid, mib, sm) in mallorys {
            add(process(pid, 1, mib, sm), pid);
        }
        for &pid in &genuine.pids {
            add(process(pid, 1, 1024, 0), pid);
        }
        add(process(alices_idle.pid(), 1, 4096, 0), alices_idle.pid());
        for (claim, _) in idle_claims {
            add(process(claim.pid(), 1, 4096, 0), claim.pid());
        }
        for (strays, _) in orphans {
            for &pid in &strays.pids {
                add(process(pid, 1, 1024, 0), pid);
            }
        }
        for (run, _) in crashed {
            for &pid in &run.workers.pids {
                add(process(pid, 0, 512, 0), pid);
            }
        }
        // A pid still free, or given to our process: one another test's process took
        // meanwhile is not listed (this daemon would reclaim it, were it an idle orphan).
        for entry in lingering {
            if entry.reuser.is_some() || !alive(entry.pid) {
                add(process(entry.pid, 0, 512, 0), entry.pid);
            }
        }
        scenario(2, &[], &list)
    };

    let soak = Instant::now();
    let mut round = 0u32;
    while soak.elapsed() < Duration::from_secs(seconds) {
        round += 1;
        daemon.note(&format!("round {round}"));
        healthy.push(TrainingRun::start_as(
            Some(ALICE),
            2,
            "sleep",
            "python3",
            &["train.py"],
        ));
        if healthy.len() > 3 {
            // A job ends: out of the scenario first, then its processes.
            let done = healthy.remove(0);
            sim.write(&entries(
                &healthy,
                &crashed,
                &orphans,
                &lingering,
                &idle_claims,
                &[],
            ));
            drop(done);
        }
        if round.is_multiple_of(3) {
            let mut run = healthy.remove(0);
            run.crash();
            crashed.push((run, Instant::now()));
        }

        // Mallory's claimant and forger, both busy (not leftovers): root's kill ends them.
        let claimant = Proc::spawn_program_as_env(MALLORY, persistenced.path(), &preload);
        let env = [("SLURM_JOB_ID", job_text.as_str()), ("SLURM_STEP_ID", "0")];
        let forger = Proc::spawn_as_with_env(MALLORY, "sleep", &["train.py"], &env);
        let forged_in = match round % 3 {
            0 => forged_job.as_ref(),
            1 => forged_docker.as_ref(),
            _ => None,
        };
        if let Some(cgroup) = forged_in {
            cgroup.add(forger.pid());
        }
        let mallorys = [(claimant.pid(), 2048, 30), (forger.pid(), 30000, 90)];
        // A pid the kernel freed again goes to a new process, while it is still listed.
        for entry in lingering.iter_mut().filter(|e| e.reuser.is_none()) {
            if !Path::new(&format!("/proc/{}", entry.pid)).exists()
                && let Some(reuser) = PidReuser::spawn(entry.pid, "sleep", "python3")
            {
                entry.reuser = Some(reuser);
                reused += 1;
            }
        }
        sim.write(&entries(
            &healthy,
            &crashed,
            &orphans,
            &lingering,
            &idle_claims,
            &mallorys,
        ));
        wait_more_loops(&sim, 3);

        // What gpuctl shows, and the daemon accounts, of them.
        let run = sim.run(&["info", "--json"]);
        match serde_json::from_str::<serde_json::Value>(&run.stdout) {
            Ok(doc) => {
                if let Some(entry) = shown_entry(&doc, forger.pid())
                    && credits_forgery(&entry["owner"], job)
                {
                    forgeries += 1;
                    findings.push(format!(
                        "round {round}: forger {} shown as {} (cgroup {})",
                        forger.pid(),
                        entry["owner"],
                        entry["cgroup"]
                    ));
                }
                if let Some(entry) = shown_entry(&doc, claimant.pid())
                    && entry["protection"]["genuine"] != false
                {
                    forgeries += 1;
                    findings.push(format!(
                        "round {round}: claimant {} shown as {}",
                        claimant.pid(),
                        entry["protection"]
                    ));
                }
            }
            Err(e) => findings.push(format!("round {round}: info --json: {e}: {run:?}")),
        }
        for wrong in forged_peaks(&sim, job, &alices_gpu, alices_bytes) {
            forgeries += 1;
            findings.push(format!("round {round}: {wrong}"));
        }

        // Root ends mallory's processes: none may be spared.
        let kill = sim.run(&[
            "kill",
            "--user",
            "1001",
            "--yes",
            "--timeout",
            "2s",
            "--json",
        ]);
        for (what, pid) in [("claimant", claimant.pid()), ("forger", forger.pid())] {
            if alive(pid) {
                shielded += 1;
                findings.push(format!(
                    "round {round}: mallory's {what} {pid} survived kill --user: {}",
                    kill.stdout
                ));
            }
        }
        drop((claimant, forger));

        // Idle orphans of nvidia-smi with mallory's library preloaded, run by root or by
        // her: leftovers the daemon must reclaim, protected name or not.
        let uid = if round.is_multiple_of(2) {
            None
        } else {
            Some(MALLORY)
        };
        let strays = background_workers_of_env(smi.path(), uid, 2, &preload);
        orphan_pids.extend(&strays.pids);
        orphans.push((strays, Instant::now()));
        // Another attacker's idle process claiming an exempt job.
        let claim = &claims[round as usize % 2];
        let idle_claim = Proc::spawn_as_with_env(IDLER, "sleep", &["notebook.py"], claim);
        idle_claim_pids.push(idle_claim.pid());
        idle_claims.push((idle_claim, Instant::now()));
        sim.write(&entries(
            &healthy,
            &crashed,
            &orphans,
            &lingering,
            &idle_claims,
            &[],
        ));
        wait_more_loops(&sim, 5);

        // Victims: alice's runs, the genuine program, the processes given reclaimed pids.
        let mut victims: Vec<(&str, u32)> = Vec::new();
        for run in std::iter::once(&alices_job).chain(&healthy) {
            victims.push(("alice's run", run.parent.pid()));
            victims.extend(run.workers.pids.iter().map(|&p| ("alice's worker", p)));
        }
        victims.push(("alice's exempt idle process", alices_idle.pid()));
        victims.extend(
            genuine
                .pids
                .iter()
                .map(|&p| ("genuine nvidia-persistenced", p)),
        );
        victims.extend(
            lingering
                .iter()
                .filter_map(|e| e.reuser.as_ref())
                .map(|r| ("new process at a reclaimed pid", r.pid)),
        );
        for (what, pid) in victims {
            // Counted once per process (pid and start time).
            if !alive(pid) && counted.insert((pid, start_ticks(pid).unwrap_or(0))) {
                victims_ended += 1;
                findings.push(format!("round {round}: {what} {pid} was ended"));
            }
        }
        // Crashes and claimant orphans end within grace + interval + term_timeout and
        // slack for a loaded machine; a reclaimed worker's pid stays listed a while.
        let bound = Duration::from_secs(12);
        crashed.retain(|(run, at)| {
            if run.workers.pids.iter().all(|&pid| !alive(pid)) {
                reclaimed += 1;
                lingering.extend(run.workers.pids.iter().map(|&pid| Lingering {
                    pid,
                    since: Instant::now(),
                    reuser: None,
                }));
                return false;
            }
            assert!(
                at.elapsed() < bound,
                "alice's crash left for {:?}:\n{}",
                at.elapsed(),
                daemon.log()
            );
            true
        });
        orphans.retain(|(strays, at)| {
            if strays.pids.iter().all(|&pid| !alive(pid)) {
                claimants_ended += 1;
                return false;
            }
            if at.elapsed() < bound {
                return true;
            }
            shielded += 1;
            findings.push(format!(
                "round {round}: claimant orphans {:?} left for {:?}",
                strays.pids,
                at.elapsed()
            ));
            false
        });
        let mut idle_left = Vec::new();
        idle_claims.retain(|(claim, at)| {
            if !alive(claim.pid()) {
                idle_reclaimed += 1;
                return false;
            }
            if at.elapsed() >= bound {
                idle_left.push(format!(
                    "round {round}: idle claim {} on an exempt job left for {:?}",
                    claim.pid(),
                    at.elapsed()
                ));
                return false;
            }
            true
        });
        shielded += idle_left.len() as u32;
        findings.extend(idle_left);
        // A few given pids at a time: the oldest go, and pids never freed are given up.
        lingering.retain(|e| e.reuser.is_some() || e.since.elapsed() < Duration::from_secs(10));
        while lingering.iter().filter(|e| e.reuser.is_some()).count() > 6 {
            let oldest = lingering.iter().position(|e| e.reuser.is_some()).unwrap();
            lingering.remove(oldest);
        }

        assert_eq!(daemon.child.id(), daemon_pid);
        daemon.assert_running();
        if rss_early.is_none() && soak.elapsed() > Duration::from_secs(seconds / 3) {
            rss_early = Some(rss_kib(daemon_pid));
            anon_early = Some(rss_anon_kib(daemon_pid));
        }
    }
    let forks = cycler.forks();
    drop(cycler);

    // Every crash and every claimant orphan ends.
    sim.write(&entries(
        &healthy,
        &crashed,
        &orphans,
        &lingering,
        &idle_claims,
        &[],
    ));
    let left = || -> Vec<u32> {
        crashed
            .iter()
            .map(|(run, _)| &run.workers.pids)
            .chain(orphans.iter().map(|(strays, _)| &strays.pids))
            .flatten()
            .copied()
            .chain(idle_claims.iter().map(|(claim, _)| claim.pid()))
            .filter(|&pid| alive(pid))
            .collect()
    };
    daemon.note(&format!(
        "soak over: waiting up to 15 s for {:?} to end",
        left()
    ));
    wait_until(Duration::from_secs(15), || left().is_empty());
    daemon.note(&format!("wait over: still alive {:?}", left()));
    idle_reclaimed += idle_claims.len() as u32;
    // The daemon logs a pass's reclaims once all its targets have been signalled and waited
    // for, so the last round's processes are gone before its lines are written: wait for
    // the lines of both its idle claims and its orphans (a loaded machine once took longer
    // than the check right after the wait above).
    let by_daemon = |pids: &[u32]| {
        pids.iter()
            .filter(|&&pid| daemon.count(&["ACTION=reclaimed", &format!("PID={pid} ")]) > 0)
            .count()
    };
    let all_said = || {
        by_daemon(&idle_claim_pids) == idle_claim_pids.len()
            && by_daemon(&orphan_pids) == orphan_pids.len()
    };
    let said = Instant::now() + Duration::from_secs(10);
    while !all_said() && Instant::now() < said {
        std::thread::sleep(Duration::from_millis(20));
    }
    let idle_by_watchdog = by_daemon(&idle_claim_pids);
    if !alive(alices_idle.pid()) {
        victims_ended += 1;
        findings.push("alice's exempt idle process was ended".into());
    }
    reclaimed += crashed.len() as u32;
    claimants_ended += orphans.len() as u32;
    let by_watchdog = by_daemon(&orphan_pids);
    if alices_cgroup.is_some() {
        // The peaks checked above were the daemon's: it did account alice's job.
        let peaks =
            std::fs::read_to_string(sim.dir.path().join("state/peaks.json")).unwrap_or_default();
        assert!(peaks.contains(&format!("\"slurm:{job}\"")), "{peaks}");
    }
    let restarts = daemon.count(&["ACTION=start"]) - 1;
    let (rss_late, anon_late) = (rss_kib(daemon_pid), rss_anon_kib(daemon_pid));
    let rss_early = rss_early.unwrap_or(rss_late);
    let anon_early = anon_early.unwrap_or(anon_late);
    eprintln!(
        "soak: attack {seconds}s, {round} rounds, victims ended {victims_ended}, attackers \
         shielded {shielded}, forgeries accepted {forgeries}, crashes reclaimed {reclaimed}, \
         claimant orphans ended {claimants_ended} ({by_watchdog} of {} processes reclaimed by \
         the daemon), idle claims on exempt jobs reclaimed {idle_reclaimed} \
         ({idle_by_watchdog} of {} by the daemon), pids given anew {reused} ({forks} forks), daemon restarts {restarts}, \
         RSS {rss_early} -> {rss_late} KiB ({:+} KiB), anonymous {anon_early} -> {anon_late} \
         KiB ({:+} KiB)",
        orphan_pids.len(),
        idle_claim_pids.len(),
        rss_late as i64 - rss_early as i64,
        anon_late as i64 - anon_early as i64
    );
    assert!(
        findings.is_empty(),
        "{}\n--- daemon log:\n{}",
        findings.join("\n"),
        daemon.log()
    );
    assert_eq!((victims_ended, shielded, forgeries, restarts), (0, 0, 0, 0));
    assert_eq!(
        idle_by_watchdog,
        idle_claim_pids.len(),
        "idle claims not reclaimed by the daemon:\n{}",
        daemon.log()
    );
    assert!(
        reclaimed >= round / 3,
        "{reclaimed} of {} crashes",
        round / 3
    );
    // The daemon's own memory (heap, stacks): the file-backed rest of its RSS, its binary's
    // pages, comes and goes with the page cache however steady the daemon is.
    assert!(
        anon_late <= anon_early + 2048,
        "anonymous RSS grew from {anon_early} to {anon_late} KiB"
    );
    daemon.assert_running();
    assert_eq!(daemon.stop(), 0);
    drop((alices_job, genuine));
    drop((forged_docker, forged_job, alices_cgroup));
}
