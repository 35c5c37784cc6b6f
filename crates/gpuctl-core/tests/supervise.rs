//! The supervisor with real children and real signals. Each test runs in a process of its
//! own (this test binary run again for that test alone): a subreaper reaps every child of
//! its process, and another test's children must not be among them.

use std::process::Command;
use std::time::Duration;

use gpuctl_core::supervise::{Status, Supervisor, Tick};

/// Whether this is the test's own process; in the harness's, runs the test there and
/// checks it passed.
fn alone(name: &str) -> bool {
    const INNER: &str = "GPUCTL_SUPERVISE_TEST";
    if std::env::var(INNER).as_deref() == Ok(name) {
        return true;
    }
    let run = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(INNER, name)
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&run.stdout).into_owned() + &String::from_utf8_lossy(&run.stderr);
    // It ran, and passed: a name that matched no test would pass nothing.
    assert!(
        run.status.success() && said.contains("test result: ok. 1 passed"),
        "{name} in its own process: {}\n{said}",
        run.status
    );
    false
}

fn sh(script: &str) -> Command {
    let mut command = Command::new("sh");
    command.args(["-c", script]);
    command
}

fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn the_commands_exit_status_is_returned() {
    if !alone("the_commands_exit_status_is_returned") {
        return;
    }
    let supervisor = Supervisor::start().unwrap();
    let child = supervisor.spawn(&mut sh("exit 3")).unwrap();
    let status = supervisor.wait(child, &mut []);
    assert_eq!(
        status,
        Status {
            code: Some(3),
            signal: None
        }
    );
    assert_eq!(status.exit_status(), 3);
    assert!(!alive(child), "the command was reaped");
}

#[test]
fn a_signal_the_launcher_gets_ends_the_command_with_it() {
    if !alone("a_signal_the_launcher_gets_ends_the_command_with_it") {
        return;
    }
    let supervisor = Supervisor::start().unwrap();
    let child = supervisor.spawn(Command::new("sleep").arg("30")).unwrap();
    // To this thread, which blocks it: it waits for the supervisor, as a signal from
    // another process would.
    // SAFETY: tgkill with this process's and this thread's own ids.
    let sent = unsafe {
        libc::syscall(
            libc::SYS_tgkill,
            libc::getpid(),
            libc::gettid(),
            libc::SIGTERM,
        )
    };
    assert_eq!(sent, 0);
    let status = supervisor.wait(child, &mut []);
    assert_eq!(status.signal, Some(libc::SIGTERM));
    assert_eq!(status.exit_status(), 143);
}

#[test]
fn the_command_starts_with_no_signal_blocked() {
    if !alone("the_command_starts_with_no_signal_blocked") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("status");
    let supervisor = Supervisor::start().unwrap();
    let script = format!("grep SigBlk /proc/self/status > {}", out.display());
    let child = supervisor.spawn(&mut sh(&script)).unwrap();
    assert_eq!(supervisor.wait(child, &mut []).code, Some(0));
    let line = std::fs::read_to_string(&out).unwrap();
    assert_eq!(line.trim(), "SigBlk:\t0000000000000000");
}

#[test]
fn what_the_command_leaves_behind_stays_below_and_is_reaped() {
    if !alone("what_the_command_leaves_behind_stays_below_and_is_reaped") {
        return;
    }
    let supervisor = Supervisor::start().unwrap();
    // The worker outlives the command, orphaned: it comes to this subreaper.
    let child = supervisor.spawn(&mut sh("sleep 30 & exit 0")).unwrap();
    assert_eq!(supervisor.wait(child, &mut []).code, Some(0));
    let mut left = supervisor.leftovers();
    // The shell forks the worker, which is named `sh` until it has exec'd sleep: on a
    // loaded machine it can be found in between.
    for _ in 0..250 {
        if left.iter().any(|l| l.role == "sleep") {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
        left = supervisor.leftovers();
    }
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].role, "sleep");
    let pid = left[0].pid;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    for _ in 0..100 {
        supervisor.reap_all();
        if !alive(pid) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!alive(pid), "the leftover was reaped, not left a zombie");
}

#[test]
fn ticks_fall_due_while_the_command_runs() {
    if !alone("ticks_fall_due_while_the_command_runs") {
        return;
    }
    let supervisor = Supervisor::start().unwrap();
    let child = supervisor.spawn(Command::new("sleep").arg("0.6")).unwrap();
    let (mut fast, mut slow) = (0, 0);
    let mut count_fast = || fast += 1;
    let mut count_slow = || slow += 1;
    let mut ticks = [
        Tick {
            first: Duration::ZERO,
            every: Duration::from_millis(100),
            work: &mut count_fast,
        },
        Tick {
            first: Duration::from_secs(60),
            every: Duration::from_secs(60),
            work: &mut count_slow,
        },
    ];
    assert_eq!(supervisor.wait(child, &mut ticks).code, Some(0));
    assert!((4..=8).contains(&fast), "{fast} ticks in 0.6 s at 100 ms");
    assert_eq!(slow, 0);
}
