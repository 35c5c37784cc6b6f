//! `gpuctl kill` and `gpuctl clear` against nvml-sim, with real processes and real signals:
//! crashed runs whose workers live on, healthy runs and background jobs that must be left
//! alone, protected daemons, other users, escalation, stopped and zombie holders, `--wait`.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::util::{
    GIB, Gpu, MIB, Proc, Process, RootOwnedProgram, Scenario, Sim, TrainingRun, alive,
    background_job, h200s, is_root, proc_state,
};

/// The document of `gpuctl ARGS --json` whatever its exit status, which is returned too.
fn json_with_code(sim: &Sim, args: &[&str]) -> (Value, i32, String) {
    let mut all = args.to_vec();
    all.push("--json");
    let run = sim.run(&all);
    let doc = serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("gpuctl {all:?}: invalid JSON ({e}): {run:?}"));
    (doc, run.code, run.stderr)
}

fn outcomes(doc: &Value) -> &Vec<Value> {
    doc["outcomes"].as_array().expect("outcomes array")
}

fn outcome_of(doc: &Value, pid: u32) -> &Value {
    outcomes(doc)
        .iter()
        .find(|o| o["pid"] == pid)
        .unwrap_or_else(|| panic!("no outcome for pid {pid} in {doc:#}"))
}

fn ended(outcome: &Value) -> &str {
    outcome["ended"]["outcome"]
        .as_str()
        .unwrap_or_else(|| panic!("no ended.outcome in {outcome:#}"))
}

fn reported_pids(doc: &Value) -> Vec<u64> {
    doc["reported"]
        .as_array()
        .expect("reported array")
        .iter()
        .filter_map(|f| f["identity"]["pid"].as_u64())
        .collect()
}

/// The fields every reclaim document carries.
fn assert_document(doc: &Value, command: &str, dry_run: bool) {
    assert_eq!(doc["schema"], 1, "{doc:#}");
    assert_eq!(doc["command"], command);
    assert_eq!(doc["dry_run"], dry_run);
    assert_eq!(doc["signal"], "SIGTERM");
    assert_eq!(doc["timeout_ms"], 1000);
    assert!(
        doc["outcomes"].is_array() && doc["refused"].is_array(),
        "{doc:#}"
    );
    assert!(doc["reported"].is_array(), "{doc:#}");
    assert!(doc.get("wait").is_some(), "wait key missing: {doc:#}");
}

/// The fields of one outcome, for a target of this test's user.
fn assert_outcome_fields(outcome: &Value, pid: u32, gpus: &[u32], used_mib: u64) {
    assert_eq!(outcome["pid"], pid);
    assert_eq!(
        outcome["start_ticks"].as_u64(),
        crate::util::start_ticks(pid).or(outcome["start_ticks"].as_u64()),
        "start_ticks of {pid}"
    );
    assert!(outcome["start_ticks"].as_u64().is_some(), "{outcome:#}");
    assert_eq!(
        outcome["uid"].as_u64(),
        // SAFETY: getuid(2) takes nothing, cannot fail and touches no memory of ours.
        Some(unsafe { libc::getuid() } as u64)
    );
    assert!(outcome["user"].is_string(), "{outcome:#}");
    assert!(outcome["command"].is_string(), "{outcome:#}");
    let listed: Vec<u64> = outcome["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g.as_u64().unwrap())
        .collect();
    assert_eq!(listed, gpus.iter().map(|&g| g as u64).collect::<Vec<_>>());
    assert_eq!(outcome["used_bytes"], used_mib * MIB);
    assert!(outcome["reasons"].is_array(), "{outcome:#}");
    assert!(outcome.get("skipped").is_some() && outcome.get("ended").is_some());
    assert!(outcome.get("left_gpu").is_some() && outcome.get("memory_released").is_some());
}

// 1, 10
#[test]
fn clear_reclaims_the_workers_of_a_crashed_run() {
    let mut run = TrainingRun::start(3, "sleep", "python3", &["train.py", "--model", "llama-8b"]);
    run.crash();
    let workers = &run.workers.pids;
    // Two workers on GPU 0, one on GPU 1; GPU 0 also has 512 MiB nobody accounts for.
    let sim = Sim::new(
        &Scenario::new()
            .gpu(Gpu::h200().leaked(512 * MIB))
            .gpu(Gpu::h200())
            .process(Process::new(workers[0]).used(2 * GIB))
            .process(Process::new(workers[1]).used(2 * GIB))
            .process(Process::new(workers[2]).on(1).used(4 * GIB)),
    );

    let (doc, code, stderr) = json_with_code(&sim, &["clear", "--timeout", "1s"]);
    assert_eq!(code, 0, "{stderr}\n{doc:#}");
    assert_document(&doc, "clear", false);
    assert_eq!(doc["wait"], Value::Null);
    assert_eq!(outcomes(&doc).len(), 3, "{doc:#}");
    for (i, &pid) in workers.iter().enumerate() {
        let outcome = outcome_of(&doc, pid);
        let (gpu, mib) = if i < 2 { (0, 2048) } else { (1, 4096) };
        assert_outcome_fields(outcome, pid, &[gpu], mib);
        assert_eq!(outcome["action"], "signal");
        assert_eq!(outcome["skipped"], Value::Null);
        assert_eq!(ended(outcome), "exited", "{outcome:#}");
        assert_eq!(outcome["ended"]["signal"], "SIGTERM");
        assert!(outcome["ended"]["after_ms"].as_u64().is_some());
        assert_eq!(outcome["left_gpu"], true);
        assert_eq!(outcome["memory_released"], true);
        assert_eq!(outcome["command"], "python3 train.py --model llama-8b");
        let reasons = outcome["reasons"].to_string();
        assert!(reasons.contains("orphaned"), "{reasons}");
        assert!(
            reasons.contains("idle orphans of the same group"),
            "{reasons}"
        );
        // gpuctl waited for the exit: nothing is left running.
        assert!(
            !alive(pid),
            "worker {pid} still alive: {:?}",
            proc_state(pid)
        );
    }

    let info = sim.json(&["info"]);
    for (index, baseline) in [(0, 512 * MIB), (1, 0)] {
        let gpu = &info["devices"][index];
        assert_eq!(gpu["processes"].as_array().unwrap().len(), 0, "{gpu:#}");
        assert_eq!(gpu["memory"]["used_bytes"], baseline, "{gpu:#}");
    }
}

// 2
#[test]
fn healthy_runs_and_background_jobs_are_never_touched() {
    let healthy = TrainingRun::start(2, "sleep", "python3", &["train.py"]);
    let busy_job = background_job("python3", &["serve.py", "--port", "8000"]);
    let idle_job = background_job("python3", &["notebook_job.py"]);
    let sim = Sim::new(
        &h200s(2)
            .process(Process::new(healthy.parent.pid()).used(8 * GIB).sm(40))
            .process(Process::new(healthy.workers.pid(0)).used(512 * MIB))
            .process(Process::new(healthy.workers.pid(1)).used(512 * MIB))
            .process(Process::new(busy_job.pid(0)).on(1).used(16 * GIB).sm(50))
            .process(Process::new(idle_job.pid(0)).on(1).used(GIB)),
    );
    let everyone = [
        healthy.parent.pid(),
        healthy.workers.pid(0),
        healthy.workers.pid(1),
        busy_job.pid(0),
        idle_job.pid(0),
    ];

    let (doc, code, stderr) = json_with_code(&sim, &["clear", "--timeout", "1s"]);
    assert_eq!(code, 0, "{stderr}\n{doc:#}");
    assert!(outcomes(&doc).is_empty(), "{doc:#}");
    // The lone idle orphan is reported (it may be a job between GPU phases); the busy one and
    // the healthy run are not even that.
    assert_eq!(
        reported_pids(&doc),
        vec![u64::from(idle_job.pid(0))],
        "{doc:#}"
    );
    let finding = &doc["reported"][0];
    assert_eq!(finding["verdict"], "report");
    assert!(
        finding["reason"]
            .as_str()
            .unwrap()
            .contains("possibly orphaned"),
        "{finding:#}"
    );

    let text = sim.run(&["clear", "--timeout", "1s", "--color", "never"]);
    assert_eq!(text.code, 0, "{text:?}");
    assert!(
        text.stdout.contains("nothing to reclaim"),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout.contains("reported, not acted on"),
        "{}",
        text.stdout
    );

    let kill = sim.run(&["kill", "--stale", "--yes", "--timeout", "1s"]);
    kill.assert_one_line_error(0, "no GPU process matches the selection");
    for pid in everyone {
        assert!(alive(pid), "pid {pid} was ended");
    }
}

// 3
#[test]
fn protected_daemons_are_skipped() {
    // The real program: a root-owned executable named nvidia-persistenced in root-owned
    // directories (a copy of the test process; only root can make one).
    if !is_root() {
        panic!(
            "cannot run here: needs root to install a root-owned program in a root-owned directory"
        );
    }
    let installed = RootOwnedProgram::install("nvidia-persistenced");
    let daemon = Proc::spawn_program_ready(installed.path(), "sleep", "nvidia-persistenced", &[]);
    let comm = std::fs::read_to_string(format!("/proc/{}/comm", daemon.pid())).unwrap();
    assert_eq!(
        comm.trim(),
        "nvidia-persiste",
        "the kernel keeps 15 bytes of comm"
    );
    let sim = Sim::new(&h200s(1).process(Process::new(daemon.pid()).used(0)));
    let pid = daemon.pid().to_string();

    let run = sim.run(&[
        "kill",
        "--pid",
        &pid,
        "--yes",
        "--timeout",
        "1s",
        "--color",
        "never",
    ]);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(
        run.stdout
            .contains("skipped: protected: nvidia-persistenced"),
        "{}",
        run.stdout
    );

    let (doc, code, _) = json_with_code(&sim, &["kill", "--pid", &pid, "--yes", "--timeout", "1s"]);
    assert_eq!(code, 1);
    assert_document(&doc, "kill", false);
    let outcome = outcome_of(&doc, daemon.pid());
    assert_eq!(outcome["action"], "skip");
    assert_eq!(outcome["skipped"], "protected: nvidia-persistenced");
    assert_eq!(outcome["ended"], Value::Null);
    assert!(alive(daemon.pid()));
    let info = sim.json(&["info"]);
    let shown = &info["devices"][0]["processes"][0];
    assert_eq!(shown["protection"]["name"], "nvidia-persistenced");
    assert_eq!(shown["protection"]["genuine"], true, "{shown}");
}

// 3b
#[test]
fn a_protected_name_alone_buys_no_protection() {
    // argv[0] (exec -a) and comm (prctl PR_SET_NAME) claim every protected name in turn.
    for name in [
        "nvidia-persistenced",
        "nv-hostengine",
        "Xorg",
        "gnome-shell",
    ] {
        let by_argv0 = Proc::spawn_ready("sleep", name, &["--user", name]);
        let by_comm = Proc::spawn_ready_with_comm("sleep", "python3", name);
        let comm = std::fs::read_to_string(format!("/proc/{}/comm", by_comm.pid())).unwrap();
        assert_eq!(comm.trim(), &name[..name.len().min(15)]);
        let sim = Sim::new(
            &h200s(1)
                .process(Process::new(by_argv0.pid()).used(39 * GIB))
                .process(Process::new(by_comm.pid()).used(GIB)),
        );

        let table = sim.run(&["info", "--color", "never"]);
        let claims = format!("[claims to be {name}]");
        assert_eq!(table.stdout.matches(&claims).count(), 2, "{}", table.stdout);
        let info = sim.json(&["info"]);
        for shown in info["devices"][0]["processes"].as_array().unwrap() {
            assert_eq!(shown["protection"]["name"], name, "{shown}");
            assert_eq!(shown["protection"]["genuine"], false, "{shown}");
            assert!(
                shown["protection"]["why"]
                    .as_str()
                    .unwrap()
                    .contains("executable")
            );
        }

        for impostor in [&by_argv0, &by_comm] {
            let pid = impostor.pid().to_string();
            let (doc, code, stderr) =
                json_with_code(&sim, &["kill", "--pid", &pid, "--yes", "--timeout", "2s"]);
            assert_eq!(code, 0, "{name}: {doc} {stderr}");
            let outcome = outcome_of(&doc, impostor.pid());
            assert_eq!(outcome["action"], "signal", "{outcome}");
            assert_eq!(outcome["skipped"], Value::Null);
            assert!(!alive(impostor.pid()));
        }
    }
}

// 5
#[test]
fn other_users_processes_are_skipped_for_a_non_root_caller() {
    if !is_root() || !Path::new("/usr/bin/setpriv").exists() && !Path::new("/bin/setpriv").exists()
    {
        panic!("cannot run here: needs root and setpriv to run processes as other users");
    }
    const OTHER: u32 = 65534;
    const CALLER: u32 = 65533;
    let theirs = Proc::spawn_as(OTHER, "sleep", &["train.py"]);
    let mine = Proc::spawn_as(CALLER, "sleep", &["eval.py"]);
    let sim = Sim::new(
        &h200s(1)
            .process(Process::new(theirs.pid()).used(4 * GIB))
            .process(Process::new(mine.pid()).used(GIB)),
    );
    sim.share();
    let args = [
        "kill",
        "--pid",
        &theirs.pid().to_string(),
        "--pid",
        &mine.pid().to_string(),
        "--yes",
        "--timeout",
        "1s",
        "--color",
        "never",
    ]
    .map(String::from);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = crate::util::Run::from(sim.gpuctl_as(CALLER, &args).output().expect("run gpuctl"));
    assert_eq!(run.code, 1, "{run:?}");
    let needle = format!("permission denied: pid {} belongs to", theirs.pid());
    assert!(run.stdout.contains(&needle), "{run:?}");
    assert!(alive(theirs.pid()), "another user's process was ended");
    crate::util::wait_exited(mine.pid());
    let mine_line = run
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with(&mine.pid().to_string()))
        .unwrap_or_else(|| panic!("no row for {}: {}", mine.pid(), run.stdout));
    assert!(mine_line.contains("ended (SIGTERM)"), "{mine_line}");
}

// 6
#[test]
fn kill_usage_errors_and_refusals() {
    let a = Proc::sleeper("python3", &["a.py"]);
    let b = Proc::sleeper("python3", &["b.py"]);
    let stranger = Proc::sleeper("python3", &["not-on-a-gpu.py"]);
    let sim = Sim::new(
        &h200s(2)
            .process(Process::new(a.pid()).used(GIB))
            .process(Process::new(b.pid()).on(1).used(GIB)),
    );

    sim.run(&["kill"])
        .assert_one_line_error(2, "no process selected");
    sim.run(&["kill", "--user", "no-such-user-gpuctl"])
        .assert_one_line_error(2, "no such user 'no-such-user-gpuctl'");
    // stdin is null: there is no terminal to confirm on.
    sim.run(&["kill", "--all", "--timeout", "1s"])
        .assert_one_line_error(2, "without --yes");
    assert!(alive(a.pid()) && alive(b.pid()), "signalled without --yes");

    let dry = sim.run(&["kill", "--all", "--yes", "--dry-run", "--color", "never"]);
    assert_eq!(dry.code, 0, "{dry:?}");
    for pid in [a.pid(), b.pid()] {
        let row = dry
            .stdout
            .lines()
            .find(|l| l.trim_start().starts_with(&pid.to_string()))
            .unwrap_or_else(|| panic!("pid {pid} not listed: {}", dry.stdout));
        assert!(row.contains("would signal"), "{row}");
    }
    assert!(alive(a.pid()) && alive(b.pid()), "a dry run signalled");

    let pid = stranger.pid().to_string();
    let run = sim.run(&["kill", "--pid", &pid, "--yes", "--timeout", "1s"]);
    assert_eq!(run.code, 1, "{run:?}");
    let needle = format!("pid {pid} is not using a GPU");
    assert!(
        run.stdout.contains(&needle) || run.stderr.contains(&needle),
        "{run:?}"
    );
    let (doc, code, _) = json_with_code(&sim, &["kill", "--pid", &pid, "--yes", "--timeout", "1s"]);
    assert_eq!(code, 1);
    assert_document(&doc, "kill", false);
    assert_eq!(doc["refused"][0]["pid"], stranger.pid());
    assert_eq!(doc["refused"][0]["reason"], needle);
    assert!(alive(stranger.pid()));
}

// 7
#[test]
fn clear_wait_times_out_while_memory_is_still_held() {
    let mut holder = Proc::sleeper("python3", &["finetune.py"]);
    let sim = Sim::new(
        &h200s(1).process(
            Process::new(holder.pid())
                .used(20 * GIB)
                .teardown(Duration::from_secs(60)),
        ),
    );
    holder.kill();

    let run = sim.run(&["clear", "--wait=1s", "--timeout", "1s", "--color", "never"]);
    waited_then_not_free(
        &run,
        "gpuctl clear: waiting up to 1s for GPU 0: 20.0 GiB in use, held by no process",
        "GPU 0",
    );
    assert!(run.stderr.contains("not free after 1s"), "{}", run.stderr);
    assert!(run.stderr.contains("20.0 GiB in use"), "{}", run.stderr);
    assert!(run.stderr.contains("held by no process"), "{}", run.stderr);
    // Said once, on stderr, with the figure given: stdout does not say it again with the
    // time measured.
    assert!(!run.stdout.contains("not free"), "{}", run.stdout);
    let run = sim.run(&["clear", "--wait=2s", "--timeout", "1s", "--color", "never"]);
    waited_then_not_free(
        &run,
        "waiting up to 2s",
        "GPUs not free after 2s: GPU 0: 20.0 GiB in use",
    );
    assert!(!run.stdout.contains("after"), "{}", run.stdout);

    let (doc, code, _) = json_with_code(&sim, &["clear", "--wait=1s", "--timeout", "1s"]);
    assert_eq!(code, 4);
    assert_document(&doc, "clear", false);
    let wait = &doc["wait"];
    assert_eq!(wait["met"], false, "{wait:#}");
    assert!(wait["waited_ms"].as_u64().unwrap() >= 1000, "{wait:#}");
    assert_eq!(wait["gpus"][0]["index"], 0);
    assert_eq!(wait["gpus"][0]["free"], false);
    assert_eq!(wait["gpus"][0]["used_bytes"], 20480 * MIB);

    // 20 GiB of 140.4 GiB held: 85.8% free.
    let run = sim.run(&["clear", "--wait=1s", "--min-free", "90%", "--timeout", "1s"]);
    waited_then_not_free(&run, "waiting up to 1s for GPU 0", "GPU 0");
    let run = sim.run(&[
        "clear",
        "--wait=1s",
        "--min-free",
        "100GiB",
        "--timeout",
        "1s",
    ]);
    assert_eq!(run.code, 0, "{run:?}");
}

/// `clear --wait` that ran out: first what it waited for (said once: it did not change),
/// then the one error line.
fn waited_then_not_free(run: &crate::util::Run, waiting: &str, error: &str) {
    assert_eq!(run.code, 4, "{}", run.stderr);
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{}", run.stderr);
    assert!(lines[0].starts_with("gpuctl clear: "), "{}", run.stderr);
    assert!(lines[0].contains(waiting), "{}", run.stderr);
    assert!(lines[1].starts_with("gpuctl: "), "{}", run.stderr);
    assert!(lines[1].contains(error), "{}", run.stderr);
}

// 7
#[test]
fn clear_wait_succeeds_once_teardown_ends() {
    let mut holder = Proc::sleeper("python3", &["finetune.py"]);
    let sim = Sim::new(
        &h200s(1).process(
            Process::new(holder.pid())
                .used(20 * GIB)
                .teardown(Duration::from_millis(300)),
        ),
    );
    holder.kill();
    let (doc, code, stderr) = json_with_code(&sim, &["clear", "--wait=5s", "--timeout", "1s"]);
    assert_eq!(code, 0, "{stderr}\n{doc:#}");
    // What it waited for, said once on stderr; nothing else.
    assert_eq!(
        stderr.trim_end(),
        "gpuctl clear: waiting up to 5s for GPU 0: 20.0 GiB in use, held by no process (unattributed)"
    );
    let wait = &doc["wait"];
    assert_eq!(wait["met"], true, "{wait:#}");
    assert!(wait["waited_ms"].as_u64().unwrap() < 5000, "{wait:#}");
    assert_eq!(wait["gpus"][0]["free"], true);
    assert_eq!(wait["gpus"][0]["used_bytes"], 0);
}

// 8
#[test]
fn workers_that_ignore_sigterm_are_killed_after_the_timeout() {
    let mut run = TrainingRun::start(2, "ignore-term", "python3", &["train.py"]);
    run.crash();
    let sim = Sim::new(
        &h200s(1)
            .process(Process::new(run.workers.pid(0)).used(GIB))
            .process(Process::new(run.workers.pid(1)).used(GIB)),
    );
    let (doc, code, stderr) = json_with_code(&sim, &["clear", "--timeout", "1s"]);
    assert_eq!(code, 0, "{stderr}\n{doc:#}");
    for &pid in &run.workers.pids {
        let outcome = outcome_of(&doc, pid);
        assert_eq!(ended(outcome), "killed", "{outcome:#}");
        assert!(
            outcome["ended"]["after_ms"].as_u64().unwrap() >= 1000,
            "{outcome:#}"
        );
        assert_eq!(outcome["memory_released"], true);
        assert!(!alive(pid));
    }

    // The same through kill --pid.
    let stubborn = Proc::spawn_ready("ignore-term", "python3", &["stubborn.py"]);
    let sim = Sim::new(&h200s(1).process(Process::new(stubborn.pid()).used(GIB)));
    let pid = stubborn.pid().to_string();
    let (doc, code, _) = json_with_code(&sim, &["kill", "--pid", &pid, "--timeout", "1s"]);
    assert_eq!(code, 0, "{doc:#}");
    assert_eq!(ended(outcome_of(&doc, stubborn.pid())), "killed");
    assert!(!alive(stubborn.pid()));
}

// 9
#[test]
fn dry_runs_print_reasons_and_signal_nothing() {
    let mut run = TrainingRun::start(2, "sleep", "python3", &["train.py"]);
    run.crash();
    let sim = Sim::new(
        &h200s(1)
            .process(Process::new(run.workers.pid(0)).used(GIB))
            .process(Process::new(run.workers.pid(1)).used(GIB)),
    );
    for args in [
        &["clear", "--dry-run", "--color", "never"][..],
        &["kill", "--stale", "--dry-run", "--color", "never"][..],
    ] {
        let out = sim.run(args);
        assert_eq!(out.code, 0, "{args:?}: {out:?}");
        for &pid in &run.workers.pids {
            let row = out
                .stdout
                .lines()
                .find(|l| l.trim_start().starts_with(&pid.to_string()))
                .unwrap_or_else(|| panic!("{args:?}: pid {pid} not listed: {}", out.stdout));
            assert!(row.contains("would signal"), "{row}");
        }
        assert!(
            out.stdout.contains("2 idle orphans of the same group"),
            "{args:?}: no reason in {}",
            out.stdout
        );
    }
    let (doc, code, _) = json_with_code(&sim, &["clear", "--dry-run", "--timeout", "1s"]);
    assert_eq!(code, 0);
    assert_document(&doc, "clear", true);
    for &pid in &run.workers.pids {
        let outcome = outcome_of(&doc, pid);
        assert_eq!(outcome["action"], "dry_run");
        assert_eq!(outcome["ended"], Value::Null);
        assert!(
            !outcome["reasons"].as_array().unwrap().is_empty(),
            "{outcome:#}"
        );
    }
    let pid = run.workers.pid(0).to_string();
    let (doc, code, _) = json_with_code(
        &sim,
        &["kill", "--pid", &pid, "--dry-run", "--timeout", "1s"],
    );
    assert_eq!(code, 0);
    assert_document(&doc, "kill", true);
    assert_eq!(outcome_of(&doc, run.workers.pid(0))["action"], "dry_run");
    // --wait is not waited for in a dry run.
    let (doc, code, _) = json_with_code(
        &sim,
        &["clear", "--dry-run", "--wait=5s", "--timeout", "1s"],
    );
    assert_eq!(code, 0);
    assert_eq!(doc["wait"], Value::Null);
    for &pid in &run.workers.pids {
        assert!(alive(pid), "a dry run ended {pid}");
    }
}

// 11
#[test]
fn stopped_processes_are_reclaimed_only_with_include_stopped() {
    let stopped = Proc::spawn_ready("sleep", "python3", &["eval.py"]);
    stopped.signal(libc::SIGSTOP);
    stopped.wait_for_state('T');
    let sim = Sim::new(&h200s(1).process(Process::new(stopped.pid()).used(2 * GIB)));

    let (doc, code, _) = json_with_code(&sim, &["clear", "--timeout", "1s"]);
    assert_eq!(code, 0, "{doc:#}");
    assert!(outcomes(&doc).is_empty(), "{doc:#}");
    assert_eq!(reported_pids(&doc), vec![u64::from(stopped.pid())]);
    assert_eq!(doc["reported"][0]["kind"], "stopped");
    assert_eq!(proc_state(stopped.pid()), Some('T'));

    let (doc, code, _) = json_with_code(&sim, &["clear", "--include-stopped", "--timeout", "1s"]);
    assert_eq!(code, 0, "{doc:#}");
    let outcome = outcome_of(&doc, stopped.pid());
    assert_eq!(
        outcome["kinds"],
        serde_json::json!(["stopped"]),
        "{outcome:#}"
    );
    // SIGTERM stays pending on a stopped process; the SIGCONT after it lets it act.
    assert_eq!(ended(outcome), "exited", "{outcome:#}");
    assert_eq!(outcome["ended"]["signal"], "SIGTERM");
    assert!(!alive(stopped.pid()));
}

#[test]
fn clear_reclaims_a_zombie_holder() {
    let holder = Proc::spawn("zombie-leader", "python3", &["serve.py"]);
    holder.wait_for_state('Z');
    let sim = Sim::new(&h200s(1).process(Process::new(holder.pid()).used(4 * GIB)));
    let (doc, code, _) = json_with_code(&sim, &["clear", "--timeout", "1s"]);
    assert_eq!(code, 0, "{doc:#}");
    let outcome = outcome_of(&doc, holder.pid());
    assert!(
        outcome["reasons"].to_string().contains("zombie holder"),
        "{outcome:#}"
    );
    // What it was selected for, as a kind a consumer decides by (Python's explain_oom).
    assert_eq!(
        outcome["kinds"],
        serde_json::json!(["zombie_holder"]),
        "{outcome:#}"
    );
    assert_eq!(ended(outcome), "exited", "{outcome:#}");
    assert_eq!(outcome["memory_released"], true);
    let info = sim.json(&["info"]);
    assert_eq!(info["devices"][0]["memory"]["used_bytes"], 0, "{info:#}");
}

// 4: the pid names another process by the time gpuctl acts. gpuctl is held at its
// confirmation prompt (kill --all, on a terminal) after it took its snapshot; meanwhile the
// target exits and a new process is started with the same pid.
#[test]
fn a_pid_reused_after_the_snapshot_is_refused() {
    use std::io::Write;
    use std::process::Stdio;

    use crate::util::{PidReuser, Pty, expect_text};

    let mut target = Proc::sleeper("python3", &["train.py"]);
    let pid = target.pid();
    let sim = Sim::new(&h200s(1).process(Process::new(pid).used(GIB)));
    let pty = Pty::open();
    let received = pty.reader();
    let mut gpuctl = sim.gpuctl(&["kill", "--all", "--timeout", "1s", "--json"]);
    gpuctl
        .stdin(pty.slave.try_clone().unwrap())
        .stderr(pty.slave.try_clone().unwrap())
        .stdout(Stdio::piped());
    let child = gpuctl.spawn().expect("run gpuctl");
    let Pty { mut master, slave } = pty;
    drop(slave);
    expect_text(&received, "[y/N]");

    // Identity is (pid, start time in 10 ms ticks): a process placed at the same pid within
    // the same tick would be indistinguishable. In the wild that takes the whole pid space
    // wrapping within one tick; here it would take only a fast machine, so wait a tick out.
    let started = crate::util::start_ticks(pid).expect("target start time");
    crate::util::wait_until(std::time::Duration::from_secs(5), || {
        boot_ticks() > started + 1
    });
    target.kill();
    let Some(reuser) = PidReuser::spawn(pid, "sleep", "python3") else {
        master.write_all(b"n\n").unwrap();
        let _ = child.wait_with_output();
        panic!("cannot run here: the kernel does not let this test choose a pid (clone3 set_tid)");
    };
    master.write_all(b"y\n").unwrap();
    let output = child.wait_with_output().expect("gpuctl output");
    let run = crate::util::Run::from(output);
    assert_eq!(run.code, 1, "{run:?}");
    let doc: Value = serde_json::from_str(&run.stdout).expect("JSON");
    let outcome = outcome_of(&doc, pid);
    assert_eq!(ended(outcome), "reused", "{outcome:#}");
    assert_eq!(
        outcome["ended"]["now_start_ticks"].as_u64(),
        crate::util::start_ticks(reuser.pid)
    );
    assert!(
        alive(reuser.pid),
        "the new process at pid {pid} was signalled"
    );
}

/// Clock ticks since boot now, in the unit of /proc/PID/stat's start time (USER_HZ = 100).
fn boot_ticks() -> u64 {
    let uptime = std::fs::read_to_string("/proc/uptime").unwrap();
    let seconds: f64 = uptime.split_whitespace().next().unwrap().parse().unwrap();
    (seconds * 100.0) as u64
}

#[test]
fn clear_wait_takes_its_timeout_either_way_and_a_misspelling_gets_clap_s_suggestion() {
    let sim = Sim::new(&Scenario::new().gpu(Gpu::new()));
    for args in [
        &["clear", "--wait", "2s"][..],
        &["clear", "--wait=2s"],
        &["clear", "--wait"],
    ] {
        let run = sim.run(args);
        assert_eq!(run.code, 0, "{args:?}: {}", run.stderr);
    }
    sim.run(&["inf"]).assert_one_line_error(
        2,
        "unrecognized subcommand 'inf'; tip: a similar subcommand exists: 'info'",
    );
    sim.run(&["info", "--gpus", "0"])
        .assert_one_line_error(2, "tip: a similar argument exists: '--gpu'");
}
