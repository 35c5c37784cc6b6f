//! A pid reused while gpuctl waits for a slow GPU: the process NVML listed exits after the
//! listing, and another process is given its pid before /proc is read. The new process is
//! not the one NVML listed, and nothing is done to it (hostile users, round three, item 3).

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::util::{
    GIB, Gpu, PidReuser, Proc, Process, Run, Scenario, Sim, alive, proc_state, wait_until,
    wait_until_listed_by,
};

/// What the refusal or report says of a process that took a listed pid.
const STARTED_AFTER: &str = "started after NVML listed it";

/// GPU 0 lists `pid`; GPU 1 blocks every call for a minute, so a snapshot waits out its
/// NVML timeout on it before reading /proc.
fn one_job_and_a_hanging_gpu(pid: u32) -> Scenario {
    Scenario::new()
        .gpu(Gpu::h200())
        .gpu(Gpu::h200().hang(Duration::from_secs(60)))
        .process(Process::new(pid).on(0).used(GIB).sm(50))
}

/// Starts `gpuctl args --json` with a 3 s NVML timeout, waits until it has listed `target`'s
/// pid, then ends `target`, gives its pid to a new sleeping process (argv[0] `python3`) and
/// hands that pid to `then`. `None` where the kernel does not let a test choose a pid.
fn reuse_while_gpuctl_waits(
    sim: &Sim,
    args: &[&str],
    target: &mut Proc,
    then: impl FnOnce(u32),
) -> Option<(Run, PidReuser)> {
    let pid = target.pid();
    let mut all = args.to_vec();
    all.push("--json");
    let child = sim
        .gpuctl(&all)
        .env("GPUCTL_NVML_TIMEOUT", "3s")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run gpuctl");
    wait_until_listed_by(child.id(), pid);
    // Within the snapshot's wait on GPU 1: the listed process exits and is reaped, and a
    // new one is put at its pid (ns_last_pid or clone3's set_tid; in the wild, a fork loop
    // that wraps the pid space within the NVML timeout).
    target.kill();
    let Some(reuser) = PidReuser::spawn(pid, "sleep", "python3") else {
        let _ = child.wait_with_output();
        panic!("cannot run here: the kernel does not let this test choose a pid (clone3 set_tid)");
    };
    then(reuser.pid);
    let run = Run::from(child.wait_with_output().expect("gpuctl output"));
    Some((run, reuser))
}

fn document(run: &Run) -> Value {
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("invalid JSON ({e}): {run:?}"))
}

#[test]
fn kill_by_pid_spares_a_process_that_took_the_listed_pid_while_a_gpu_hung() {
    let mut target = Proc::sleeper("python3", &["train.py"]);
    let pid = target.pid();
    let sim = Sim::new(&one_job_and_a_hanging_gpu(pid));
    let pid_arg = pid.to_string();
    let Some((run, reuser)) = reuse_while_gpuctl_waits(
        &sim,
        &["kill", "--pid", &pid_arg, "--yes", "--timeout", "1s"],
        &mut target,
        |_| {},
    ) else {
        return;
    };
    assert!(
        alive(reuser.pid),
        "the new process at pid {pid} was signalled: {run:?}"
    );
    assert_eq!(run.code, 1, "{run:?}");
    let doc = document(&run);
    assert_eq!(doc["outcomes"], Value::Array(vec![]), "{doc:#}");
    assert_eq!(doc["refused"][0]["pid"], pid, "{doc:#}");
    let reason = doc["refused"][0]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains(STARTED_AFTER), "{reason}");
}

#[test]
fn clear_spares_a_stopped_process_that_took_the_listed_pid_while_a_gpu_hung() {
    let mut target = Proc::sleeper("python3", &["train.py"]);
    let pid = target.pid();
    let sim = Sim::new(&one_job_and_a_hanging_gpu(pid));
    // The newcomer is a leftover by every rule `clear --include-stopped` applies: stopped.
    let Some((run, reuser)) = reuse_while_gpuctl_waits(
        &sim,
        &["clear", "--include-stopped", "--timeout", "1s"],
        &mut target,
        |pid| {
            // SAFETY: kill(2) on the test's own child, just started at that pid.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) };
            wait_until(Duration::from_secs(5), || proc_state(pid) == Some('T'));
        },
    ) else {
        return;
    };
    assert!(
        alive(reuser.pid) && proc_state(reuser.pid) == Some('T'),
        "the new process at pid {pid} was signalled: {run:?}"
    );
    let doc = document(&run);
    assert_eq!(doc["outcomes"], Value::Array(vec![]), "{doc:#}");
}

#[test]
fn info_shows_a_process_that_took_the_listed_pid_as_not_the_listed_one() {
    let mut target = Proc::sleeper("python3", &["train.py"]);
    let pid = target.pid();
    let sim = Sim::new(&one_job_and_a_hanging_gpu(pid));
    let Some((run, _reuser)) = reuse_while_gpuctl_waits(&sim, &["info"], &mut target, |_| {})
    else {
        return;
    };
    // GPU 1 did not answer.
    assert_eq!(run.code, 1, "{run:?}");
    let doc = document(&run);
    let entry = &doc["devices"][0]["processes"][0];
    assert_eq!(entry["pid"], pid, "{doc:#}");
    assert_eq!(entry["confirmed"], false, "{entry:#}");
    assert_eq!(entry["user"], Value::Null, "{entry:#}");
    assert_eq!(entry["command"], Value::Null, "{entry:#}");
    let reason = entry["unconfirmed_reason"].as_str().unwrap_or_default();
    assert!(reason.contains(STARTED_AFTER), "{reason}");
}
