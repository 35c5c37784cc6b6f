//! Ending real processes through `gpuctl_core::act`, with pidfds and with the kill(2)
//! fallback. Every child is reaped after the assertions; until then a child ended by the API is
//! a zombie, which must count as exited.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpuctl_core::act::{
    Ended, Escalation, Identity, Method, MethodChoice, Signal, available_method, end_all,
    end_all_with, send,
};
use nix::sys::signal::{SIGKILL, SIGSTOP, kill};
use nix::unistd::Pid;

/// The methods this machine can exercise: the fallback always, pidfds where the kernel and
/// sandbox allow them.
fn methods() -> Vec<MethodChoice> {
    match available_method() {
        Method::Pidfd => vec![MethodChoice::Pidfd, MethodChoice::Kill],
        Method::Kill => {
            eprintln!("pidfd_open is unavailable here: testing the kill(2) fallback only");
            vec![MethodChoice::Kill]
        }
    }
}

fn escalation(signal: Signal, timeout_ms: u64) -> Escalation {
    Escalation {
        signal,
        timeout: Duration::from_millis(timeout_ms),
        escalate: true,
        kill_timeout: Duration::from_secs(2),
    }
}

/// `sleep 60`, optionally with SIGTERM ignored (SIG_IGN survives exec, so the sleep process
/// itself ignores it; there is no shell in between).
fn sleeper(ignore_term: bool) -> Child {
    let mut command = Command::new("sleep");
    command.arg("60").stdin(Stdio::null());
    if ignore_term {
        // SAFETY: signal(2) is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            command.pre_exec(|| {
                libc::signal(libc::SIGTERM, libc::SIG_IGN);
                Ok(())
            });
        }
    }
    command.spawn().expect("spawn sleep")
}

fn identity(child: &Child) -> Identity {
    Identity::observe(child.id()).expect("read the child's /proc/PID/stat")
}

fn stat_state(pid: u32) -> Option<char> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    text[text.rfind(')')? + 1..]
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

fn status_field(pid: u32, field: &str) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .map(|value| value.trim().to_string())
}

fn signal_bit_set(mask: &str, signal: i32) -> bool {
    u64::from_str_radix(mask, 16).is_ok_and(|bits| bits & (1 << (signal - 1)) != 0)
}

/// Polls `condition` until it holds or `limit` passes.
fn wait_until(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn kill_and_reap(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

fn reap_signal(mut child: Child) -> Option<i32> {
    child.wait().expect("wait for child").signal()
}

#[test]
fn sleep_ends_with_sigterm() {
    for method in methods() {
        let child = sleeper(false);
        let results = end_all_with(&[identity(&child)], &escalation(Signal::TERM, 2000), method);
        match &results[..] {
            [Ended::Exited { signal, after_ms }] => {
                assert_eq!(signal, "SIGTERM", "{method:?}");
                assert!(*after_ms < 2000, "{method:?}: {after_ms} ms");
            }
            other => panic!("{method:?}: {other:?}"),
        }
        assert_eq!(reap_signal(child), Some(libc::SIGTERM), "{method:?}");
    }
}

#[test]
fn a_process_ignoring_sigterm_is_killed_after_the_timeout() {
    for method in methods() {
        let child = sleeper(true);
        let results = end_all_with(&[identity(&child)], &escalation(Signal::TERM, 300), method);
        match &results[..] {
            [Ended::Killed { after_ms }] => {
                assert!(
                    *after_ms >= 300,
                    "{method:?}: killed after only {after_ms} ms"
                );
            }
            other => panic!("{method:?}: {other:?}"),
        }
        assert_eq!(reap_signal(child), Some(libc::SIGKILL), "{method:?}");
    }
}

#[test]
fn without_escalation_a_survivor_is_still_alive() {
    for method in methods() {
        let child = sleeper(true);
        let how = Escalation {
            escalate: false,
            ..escalation(Signal::TERM, 300)
        };
        let results = end_all_with(&[identity(&child)], &how, method);
        assert_eq!(
            results,
            vec![Ended::StillAlive {
                signals: vec!["SIGTERM".to_string()]
            }],
            "{method:?}"
        );
        assert_ne!(stat_state(child.id()), Some('Z'), "{method:?}");
        kill_and_reap(child);
    }
}

#[test]
fn a_start_time_mismatch_is_reuse_and_nothing_is_sent() {
    for method in methods() {
        let mut child = sleeper(false);
        let real = identity(&child);
        let stale = Identity::new(real.pid, real.start_ticks - 1);
        let results = end_all_with(&[stale], &escalation(Signal::TERM, 300), method);
        assert_eq!(
            results,
            vec![Ended::Reused {
                now_start_ticks: real.start_ticks
            }],
            "{method:?}"
        );
        // A fatal signal would be pending (or the process already dying) by the time kill(2)
        // or pidfd_send_signal(2) returned.
        for field in ["SigPnd", "ShdPnd"] {
            let mask = status_field(real.pid, field).expect("child is visible");
            assert!(
                !signal_bit_set(&mask, libc::SIGTERM),
                "{method:?}: {field} {mask}"
            );
        }
        assert!(
            !wait_until(Duration::from_millis(100), || {
                child.try_wait().expect("try_wait").is_some()
            }),
            "{method:?}: the child died although nothing should have been sent"
        );
        assert_eq!(
            send(stale, Signal::TERM),
            Err(Ended::Reused {
                now_start_ticks: real.start_ticks
            })
        );
        assert_eq!(child.try_wait().expect("try_wait"), None, "{method:?}");
        kill_and_reap(child);
    }
}

#[test]
fn a_pid_that_does_not_exist_is_gone() {
    let pid_max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .expect("pid_max")
        .trim()
        .parse()
        .expect("pid_max is a number");
    // Pids are allocated below pid_max, so pid_max itself never names a process.
    let never = Identity::new(pid_max, 12345);

    let mut reaped = Command::new("true").spawn().expect("spawn true");
    let reaped_identity = identity(&reaped);
    reaped.wait().expect("wait for true");

    for method in methods() {
        let results = end_all_with(
            &[never, reaped_identity],
            &escalation(Signal::TERM, 300),
            method,
        );
        assert_eq!(results, vec![Ended::Gone, Ended::Gone], "{method:?}");
    }
    assert_eq!(send(never, Signal::TERM), Err(Ended::Gone));
}

#[test]
fn an_unreaped_zombie_is_gone() {
    for method in methods() {
        let child = sleeper(false);
        let target = identity(&child);
        assert_eq!(
            kill(Pid::from_raw(target.pid as libc::pid_t), SIGKILL),
            Ok(())
        );
        assert!(wait_until(Duration::from_secs(5), || stat_state(
            target.pid
        ) == Some('Z')));
        let results = end_all_with(&[target], &escalation(Signal::TERM, 300), method);
        assert_eq!(results, vec![Ended::Gone], "{method:?}");
        assert_eq!(reap_signal(child), Some(libc::SIGKILL), "{method:?}");
    }
}

#[test]
fn a_stopped_process_with_a_term_handler_gets_sigcont() {
    for method in methods() {
        // The shell handles TERM, so (unlike a default-action TERM, which the kernel applies
        // even to a stopped process) it only acts on it once continued.
        let child = Command::new("sh")
            .args(["-c", "trap 'exit 7' TERM; while :; do sleep 0.05; done"])
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn sh");
        let pid = child.id();
        assert!(
            wait_until(Duration::from_secs(5), || {
                status_field(pid, "SigCgt").is_some_and(|mask| signal_bit_set(&mask, libc::SIGTERM))
            }),
            "the shell never installed its TERM trap"
        );
        assert_eq!(kill(Pid::from_raw(pid as libc::pid_t), SIGSTOP), Ok(()));
        assert!(wait_until(Duration::from_secs(5), || stat_state(pid) == Some('T')));

        let results = end_all_with(&[identity(&child)], &escalation(Signal::TERM, 2000), method);
        match &results[..] {
            [Ended::Exited { signal, .. }] => assert_eq!(signal, "SIGTERM", "{method:?}"),
            other => panic!("{method:?}: {other:?}"),
        }
        let mut child = child;
        assert_eq!(child.wait().expect("wait").code(), Some(7), "{method:?}");
    }
}

#[test]
fn thirty_two_targets_cost_one_timeout() {
    for method in methods() {
        let children: Vec<Child> = (0..32).map(|_| sleeper(true)).collect();
        let targets: Vec<Identity> = children.iter().map(identity).collect();
        let how = escalation(Signal::TERM, 1000);
        let started = Instant::now();
        let results = end_all_with(&targets, &how, method);
        let took = started.elapsed();
        assert!(took < Duration::from_secs(5), "{method:?}: took {took:?}");
        for (result, target) in results.iter().zip(&targets) {
            assert!(
                matches!(result, Ended::Killed { after_ms } if *after_ms >= 1000),
                "{method:?}: pid {}: {result:?}",
                target.pid
            );
        }
        for child in children {
            assert_eq!(reap_signal(child), Some(libc::SIGKILL), "{method:?}");
        }
    }
}

#[test]
fn results_keep_the_order_of_targets() {
    for method in methods() {
        let alive = sleeper(false);
        let reused_child = sleeper(false);
        let reused = identity(&reused_child);
        let stale = Identity::new(reused.pid, reused.start_ticks + 1);
        let own = Identity::observe(std::process::id()).unwrap();
        let results = end_all_with(
            &[stale, identity(&alive), own],
            &escalation(Signal::TERM, 2000),
            method,
        );
        assert_eq!(results.len(), 3);
        assert_eq!(
            results[0],
            Ended::Reused {
                now_start_ticks: reused.start_ticks
            }
        );
        assert!(
            matches!(&results[1], Ended::Exited { signal, .. } if signal == "SIGTERM"),
            "{method:?}: {:?}",
            results[1]
        );
        assert!(matches!(&results[2], Ended::Failed { .. }));
        assert_eq!(reap_signal(alive), Some(libc::SIGTERM));
        kill_and_reap(reused_child);
    }
}

#[test]
fn pid_0_1_and_our_own_pid_are_refused() {
    let own = std::process::id();
    for (pid, start_ticks) in [
        (0, 0),
        (1, Identity::observe(1).map(|i| i.start_ticks).unwrap_or(0)),
        (own, Identity::observe(own).unwrap().start_ticks),
    ] {
        let expected = Ended::Failed {
            error: format!("refusing to signal pid {pid}"),
        };
        let target = Identity::new(pid, start_ticks);
        for method in methods() {
            let results = end_all_with(&[target], &escalation(Signal::TERM, 300), method);
            assert_eq!(results, vec![expected.clone()], "{method:?}");
        }
        assert_eq!(
            end_all(&[target], &escalation(Signal::KILL, 300)),
            vec![expected.clone()]
        );
        assert_eq!(send(target, Signal::KILL), Err(expected));
    }
}

#[test]
fn send_delivers_one_signal_without_waiting() {
    let child = sleeper(false);
    assert_eq!(send(identity(&child), Signal::USR1), Ok(()));
    assert_eq!(reap_signal(child), Some(libc::SIGUSR1));
}

#[test]
fn kill_as_the_first_signal_is_reported_as_exited() {
    for method in methods() {
        let child = sleeper(true);
        let results = end_all_with(&[identity(&child)], &escalation(Signal::KILL, 2000), method);
        match &results[..] {
            [Ended::Exited { signal, .. }] => assert_eq!(signal, "SIGKILL"),
            other => panic!("{method:?}: {other:?}"),
        }
        assert_eq!(reap_signal(child), Some(libc::SIGKILL));
    }
}

/// A python3 whose main thread has exited while another thread runs: the leader is a zombie
/// but the process still lives (and on a GPU server would still hold its context).
#[test]
fn a_zombie_leader_with_live_threads_is_signalled_and_awaited() {
    let script = "import ctypes, threading, time\n\
                  threading.Thread(target=lambda: time.sleep(60)).start()\n\
                  ctypes.CDLL(None).pthread_exit(None)\n";
    let python = ["/usr/bin/python3", "python3"].into_iter().find(|python| {
        Command::new(python)
            .args(["-c", "import ctypes, threading"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    });
    let Some(python) = python else {
        eprintln!("skipped: no python3 with ctypes to build a zombie leader");
        return;
    };
    for method in methods() {
        let child = Command::new(python)
            .args(["-c", script])
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn python3");
        let pid = child.id();
        let zombie_leader = wait_until(Duration::from_secs(10), || {
            stat_state(pid) == Some('Z')
                && std::fs::read_dir(format!("/proc/{pid}/task")).is_ok_and(|tasks| {
                    tasks.flatten().any(|task| {
                        let tid: u32 = task.file_name().to_string_lossy().parse().unwrap_or(0);
                        tid != pid && stat_state_of_task(pid, tid).is_some_and(|s| s != 'Z')
                    })
                })
        });
        if !zombie_leader {
            kill_and_reap(child);
            panic!("{python} never reached the zombie-leader state (pid {pid})");
        }
        let results = end_all_with(&[identity(&child)], &escalation(Signal::TERM, 2000), method);
        match &results[..] {
            [Ended::Exited { signal, .. }] => assert_eq!(signal, "SIGTERM", "{method:?}"),
            other => panic!("{method:?}: {other:?}"),
        }
        assert_eq!(reap_signal(child), Some(libc::SIGTERM), "{method:?}");
    }
}

fn stat_state_of_task(pid: u32, tid: u32) -> Option<char> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    text[text.rfind(')')? + 1..]
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

#[test]
fn signal_parse_table() {
    let ok = [
        ("TERM", libc::SIGTERM),
        ("SIGTERM", libc::SIGTERM),
        ("term", libc::SIGTERM),
        ("sigterm", libc::SIGTERM),
        (" TERM ", libc::SIGTERM),
        ("15", libc::SIGTERM),
        ("KILL", libc::SIGKILL),
        ("9", libc::SIGKILL),
        ("INT", libc::SIGINT),
        ("HUP", libc::SIGHUP),
        ("USR1", libc::SIGUSR1),
        ("SIGUSR2", libc::SIGUSR2),
        ("CONT", libc::SIGCONT),
        ("SIGRTMIN", libc::SIGRTMIN()),
        ("RTMIN+2", libc::SIGRTMIN() + 2),
        ("SIGRTMAX", libc::SIGRTMAX()),
        ("rtmax-1", libc::SIGRTMAX() - 1),
    ];
    for (text, number) in ok {
        assert_eq!(
            Signal::parse(text).map(Signal::number),
            Ok(number),
            "{text:?}"
        );
    }
    for text in [
        "",
        "  ",
        "FOO",
        "SIG",
        "0",
        "-1",
        "99999",
        "65",
        "RTMIN+999",
        "TERM9",
    ] {
        assert!(Signal::parse(text).is_err(), "{text:?} should not parse");
    }
    assert_eq!(Signal::TERM.name(), "SIGTERM");
    assert_eq!(Signal::KILL.name(), "SIGKILL");
    assert_eq!(Signal::CONT.number(), libc::SIGCONT);
    assert_eq!(Signal::parse("6").unwrap().name(), "SIGABRT");
    assert_eq!(Signal::parse("RTMIN+1").unwrap().name(), "SIGRTMIN+1");
    assert_eq!(Signal::parse("usr1").unwrap().to_string(), "SIGUSR1");
}

#[test]
fn outcomes_serialize_with_an_outcome_tag() {
    let json = serde_json::to_value(Ended::Exited {
        signal: "SIGTERM".to_string(),
        after_ms: 12,
    })
    .unwrap();
    assert_eq!(
        json,
        serde_json::json!({"outcome": "exited", "signal": "SIGTERM", "after_ms": 12})
    );
    assert_eq!(
        serde_json::to_value(Ended::StillAlive {
            signals: vec!["SIGTERM".into(), "SIGKILL".into()]
        })
        .unwrap(),
        serde_json::json!({"outcome": "still_alive", "signals": ["SIGTERM", "SIGKILL"]})
    );
}
