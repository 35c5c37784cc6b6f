//! Idle holders end to end: gpuctl-watchdog against nvml-sim with real processes, their SM
//! utilization set in the scenario and changed while it runs. Only the idle process is
//! marked, after the window; a busy sample ends the spell; the counters grow with idle ≤ held;
//! `notify` runs its command once per idle spell; `reclaim` ends an idle process after
//! `reclaim_after` and never an exempt or protected one; report mode ends nothing; `gpuctl
//! info` shows it (STATE, `--idle`, `--json`) from the watchdog's findings.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::util::{Gpu, Proc, Process, Scenario, Sim, TestCgroup, alive, process_on, wait_until};
use crate::watchdog::{Daemon, metrics, wait_more_loops};

const GIB: u64 = 1 << 30;

/// Two real processes on GPU 0, 4 GiB each, at these SM percentages.
fn two(idle: &Proc, busy: &Proc, idle_sm: u32, busy_sm: u32) -> Scenario {
    Scenario::new()
        .gpu(Gpu::h200())
        .process(Process::new(idle.pid()).used(4 * GIB).sm(idle_sm))
        .process(Process::new(busy.pid()).used(4 * GIB).sm(busy_sm))
}

/// The watchdog's configuration: fast loops, metrics and state in the scratch directory,
/// `watchdog` lines in [watchdog], then `idle` lines in [idle].
fn configure(sim: &Sim, watchdog: &str, idle: &str) {
    use std::os::unix::fs::PermissionsExt;
    let dir = sim.dir.path();
    let text = format!(
        "[watchdog]\ninterval = \"200ms\"\ngrace = \"1s\"\nterm_timeout = \"1s\"\n\
         metrics_file = \"{}\"\nstate_dir = \"{}\"\n{watchdog}\n[idle]\n{idle}\n",
        dir.join("gpuctl.prom").display(),
        dir.join("state").display()
    );
    let path = sim.config_path();
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
}

/// Reclaim mode, idle after 500 ms and reclaimed 1 s later, but for `exempt_owners` (the
/// inside of its TOML array).
fn reclaim_idle_exempting(sim: &Sim, exempt_owners: &str) {
    configure(
        sim,
        "mode = \"reclaim\"",
        &format!(
            "after = \"500ms\"\naction = \"reclaim\"\nreclaim_after = \"1s\"\n\
             exempt_owners = [{exempt_owners}]"
        ),
    );
}

/// The value of the first series in `text` whose line starts with `series`.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn user_of(sim: &Sim, pid: u32) -> String {
    let doc = sim.json(&["info"]);
    process_on(&doc, 0, pid)
        .and_then(|p| p["user"].as_str())
        .expect("the process's user")
        .to_string()
}

#[test]
fn only_the_idle_process_is_marked_after_the_window_and_a_busy_sample_wakes_it() {
    let notebook = Proc::spawn_ready("sleep", "python3", &["-m", "ipykernel"]);
    let server = Proc::spawn_ready("sleep", "python3", &["serve.py"]);
    let sim = Sim::new(&two(&notebook, &server, 0, 40));
    configure(
        &sim,
        "",
        "after = \"1500ms\"\nmin_memory = \"1GiB\"\nutil_below = 1",
    );
    let started = Instant::now();
    let daemon = Daemon::start(&sim, &[]);
    let idle_line = daemon.expect_count(&["ACTION=idle"], 1);
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "idle only after the window: {:?}",
        started.elapsed()
    );
    assert!(
        idle_line.contains(&format!("PID={} ", notebook.pid())),
        "{idle_line}"
    );
    assert!(idle_line.contains("idle for"), "{idle_line}");
    assert!(
        idle_line.contains("100% of the window measured"),
        "{idle_line}"
    );
    wait_more_loops(&sim, 5);
    assert_eq!(daemon.count(&["ACTION=idle"]), 1, "logged once");
    let server_pid = format!("PID={} ", server.pid());
    assert_eq!(daemon.count(&["ACTION=idle", &server_pid]), 0);
    assert!(metrics(&sim).contains("gpuctl_findings{kind=\"idle\"} 1"));
    // Report mode (the default) ends nothing.
    assert!(alive(notebook.pid()) && alive(server.pid()));

    // gpuctl info shows it from the watchdog's findings: STATE, --idle, --json.
    let table = sim.run(&["info"]);
    let row = table
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with(&notebook.pid().to_string()))
        .unwrap_or_else(|| panic!("no row: {}", table.stdout));
    let state = row
        .split("idle ")
        .nth(1)
        .unwrap_or_else(|| panic!("no idle STATE: {row}"));
    assert!(state.starts_with(|c: char| c.is_ascii_digit()), "{row}");
    let idle_only = sim.run(&["info", "--idle"]);
    assert_eq!(idle_only.code, 0, "{}", idle_only.stderr);
    assert!(
        idle_only.stdout.contains(&notebook.pid().to_string()),
        "{}",
        idle_only.stdout
    );
    assert!(
        !idle_only.stdout.contains(&server.pid().to_string()),
        "{}",
        idle_only.stdout
    );
    assert!(idle_only.stdout.contains("4.0 GiB"), "{}", idle_only.stdout);
    let doc = sim.json(&["info", "--idle"]);
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/schema/info-v1.schema.json"),
        )
        .unwrap(),
    )
    .unwrap();
    crate::schema::validate(&schema, &schema, &doc, "$").unwrap_or_else(|e| panic!("{e}"));
    crate::schema::conforms(&schema, &doc).unwrap_or_else(|e| panic!("{e}"));
    let listed = doc["devices"][0]["processes"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["idle"]["measured_pct"], 100);
    assert_eq!(listed[0]["idle"]["utilization"], "process");
    assert_eq!(listed[0]["idle"]["memory_bytes"], 4 * GIB);
    let findings = doc["watchdog"]["findings"].as_array().unwrap();
    let finding = findings
        .iter()
        .find(|f| f["kind"] == "idle")
        .expect("idle finding");
    assert_eq!(finding["pid"], notebook.pid());
    assert!(finding["start_ticks"].is_u64(), "{finding}");

    // The counters grow, and idle ≤ held.
    let user = user_of(&sim, notebook.pid());
    let held_series = format!("gpuctl_user_memory_byte_seconds_total{{user=\"{user}\"}}");
    let idle_series = format!("gpuctl_user_idle_memory_byte_seconds_total{{user=\"{user}\"}}");
    let first = metrics(&sim);
    let (held1, idle1) = (
        value(&first, &held_series).unwrap(),
        value(&first, &idle_series).unwrap(),
    );
    wait_more_loops(&sim, 3);
    let then = metrics(&sim);
    let (held2, idle2) = (
        value(&then, &held_series).unwrap(),
        value(&then, &idle_series).unwrap(),
    );
    assert!(
        held2 > held1 && idle2 > idle1,
        "{held1} {held2} {idle1} {idle2}"
    );
    assert!(
        idle2 <= held2 && idle2 < held2,
        "one of two holders is busy: {idle2} < {held2}"
    );
    assert!(
        then.contains("gpuctl_owner_memory_byte_seconds_total{owner_kind="),
        "{then}"
    );

    // One busy sample ends it: woke, logged once; the finding is gone.
    sim.write(&two(&notebook, &server, 25, 40));
    let woke = daemon.expect_count(&["ACTION=woke"], 1);
    assert!(woke.contains(&format!("PID={} ", notebook.pid())), "{woke}");
    assert!(woke.contains("SM at 25%"), "{woke}");
    wait_until(Duration::from_secs(5), || {
        metrics(&sim).contains("gpuctl_findings{kind=\"idle\"} 0")
    });
    wait_more_loops(&sim, 3);
    assert_eq!(daemon.count(&["ACTION=woke"]), 1);
}

#[test]
fn notify_runs_its_command_once_per_idle_spell_with_the_finding_in_its_environment() {
    let notebook = Proc::spawn_ready("sleep", "python3", &["-m", "ipykernel"]);
    let server = Proc::spawn_ready("sleep", "python3", &["serve.py"]);
    let sim = Sim::new(&two(&notebook, &server, 0, 40));
    let told = sim.dir.path().join("told");
    let script = sim.dir.path().join("tell-user");
    write_script(
        &script,
        &format!(
            "#!/bin/sh\necho \"$GPUCTL_IDLE_PID $GPUCTL_IDLE_BYTES $GPUCTL_IDLE_MEASURED_PCT $GPUCTL_IDLE_UTILIZATION $1\" >> {}\n",
            told.display()
        ),
    );
    configure(
        &sim,
        "",
        &format!(
            "after = \"1s\"\naction = \"notify\"\nnotify_command = [\"{}\", \"--idle\"]",
            script.display()
        ),
    );
    let daemon = Daemon::start(&sim, &[]);
    daemon.expect_count(&["ACTION=notify"], 1);
    let lines = || {
        std::fs::read_to_string(&told)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    wait_until(Duration::from_secs(5), || lines().len() == 1);
    wait_more_loops(&sim, 5);
    assert_eq!(
        lines(),
        [format!("{} {} 100 process --idle", notebook.pid(), 4 * GIB)],
        "once per spell"
    );
    // Busy, then idle again: a new spell, told again.
    sim.write(&two(&notebook, &server, 30, 40));
    daemon.expect_count(&["ACTION=woke"], 1);
    sim.write(&two(&notebook, &server, 0, 40));
    wait_until(Duration::from_secs(10), || lines().len() == 2);
    wait_more_loops(&sim, 5);
    assert_eq!(lines().len(), 2, "{:?}", lines());
    assert!(alive(notebook.pid()), "notify ends nothing");
}

fn write_script(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn reclaim_ends_an_idle_process_after_reclaim_after_and_never_a_busy_one() {
    let notebook = Proc::spawn_ready("sleep", "python3", &["-m", "ipykernel"]);
    let server = Proc::spawn_ready("sleep", "python3", &["serve.py"]);
    let sim = Sim::new(&two(&notebook, &server, 0, 40));
    configure(
        &sim,
        "mode = \"reclaim\"",
        "after = \"1s\"\naction = \"reclaim\"\nreclaim_after = \"2500ms\"",
    );
    let daemon = Daemon::start(&sim, &[]);
    let idle_at = {
        daemon.expect_count(&["ACTION=idle", &format!("PID={} ", notebook.pid())], 1);
        Instant::now()
    };
    let line = daemon.expect_count(&["ACTION=reclaimed"], 1);
    assert!(line.contains(&format!("PID={} ", notebook.pid())), "{line}");
    assert!(
        idle_at.elapsed() >= Duration::from_millis(1200),
        "not before reclaim_after: {:?} after idle",
        idle_at.elapsed()
    );
    assert!(!alive(notebook.pid()));
    wait_more_loops(&sim, 3);
    assert!(alive(server.pid()), "a busy process is never idle");
}

#[test]
fn reclaim_never_ends_an_exempt_or_a_protected_process() {
    let notebook = Proc::spawn_ready("sleep", "python3", &["-m", "ipykernel"]);
    let server = Proc::spawn_ready("sleep", "python3", &["serve.py"]);
    let sim = Sim::new(&two(&notebook, &server, 0, 40));
    let user = user_of(&sim, notebook.pid());
    configure(
        &sim,
        "mode = \"reclaim\"",
        &format!(
            "after = \"500ms\"\naction = \"reclaim\"\nreclaim_after = \"1s\"\nexempt_users = [\"{user}\"]"
        ),
    );
    let daemon = Daemon::start(&sim, &[]);
    // Past reclaim_after the finding says why it is not ended.
    let exempt = || {
        let doc = sim.json(&["info"]);
        doc["watchdog"]["findings"].as_array().is_some_and(|all| {
            all.iter().any(|f| {
                f["pid"] == notebook.pid()
                    && f["reason"]
                        .as_str()
                        .is_some_and(|r| r.contains(&format!("user {user} is exempt")))
            })
        })
    };
    wait_until(Duration::from_secs(10), exempt);
    wait_more_loops(&sim, 8);
    assert!(alive(notebook.pid()), "exempt: {}", metrics(&sim));
    assert_eq!(daemon.count(&["ACTION=reclaimed"]), 0);

    // Not exempt but protected: the guard refuses, and says so once.
    configure(
        &sim,
        &format!("mode = \"reclaim\"\nprotect_users = [\"{user}\"]"),
        "after = \"500ms\"\naction = \"reclaim\"\nreclaim_after = \"1s\"",
    );
    daemon.reload();
    let skipped = daemon.expect_count(&[&format!("protected user: {user}")], 1);
    assert!(
        skipped.contains(&format!("PID={} ", notebook.pid())),
        "{skipped}"
    );
    wait_more_loops(&sim, 5);
    assert!(alive(notebook.pid()), "protected");
    assert_eq!(daemon.count(&["ACTION=reclaimed"]), 0);
}

/// `exempt_owners = ["slurm:J"]` shields the job as its cgroups name it, and
/// `slurm:J@UID` that user's environment claims on it; mallory's `SLURM_JOB_ID=J` in her
/// own environment shields nothing: her idle process is reclaimed, alice's (her claim on
/// her own job, exempt as `slurm:J@1000`) is not.
#[test]
fn an_environment_claim_on_an_exempt_job_by_another_user_shields_nothing() {
    const ALICE: u32 = 1000;
    const MALLORY: u32 = 1001;
    let job = (7_000_000 + std::process::id() % 1_000_000).to_string();
    let env = [("SLURM_JOB_ID", job.as_str())];
    let alices = Proc::spawn_as_with_env(ALICE, "sleep", &["train.py"], &env);
    let mallorys = Proc::spawn_as_with_env(MALLORY, "sleep", &["attack.py"], &env);
    let sim = Sim::new(&two(&alices, &mallorys, 0, 0));
    reclaim_idle_exempting(&sim, &format!("\"slurm:{job}\", \"slurm:{job}@{ALICE}\""));
    let daemon = Daemon::start(&sim, &[]);
    let line = daemon.expect_count(&["ACTION=reclaimed"], 1);
    assert!(line.contains(&format!("PID={} ", mallorys.pid())), "{line}");
    let exempt = || {
        let doc = sim.json(&["info"]);
        doc["watchdog"]["findings"].as_array().is_some_and(|all| {
            all.iter().any(|f| {
                f["pid"] == alices.pid()
                    && f["reason"].as_str().is_some_and(|r| {
                        r.contains(&format!("owner slurm:{job}@{ALICE} is exempt"))
                    })
            })
        })
    };
    wait_until(Duration::from_secs(10), exempt);
    wait_more_loops(&sim, 5);
    assert!(alive(alices.pid()), "exempt: {}", metrics(&sim));
    assert!(
        !alive(mallorys.pid()),
        "mallory's claim shielded her process"
    );
    assert_eq!(daemon.count(&["ACTION=reclaimed"]), 1);
}

#[test]
fn the_window_survives_a_watchdog_restart() {
    let notebook = Proc::spawn_ready("sleep", "python3", &["-m", "ipykernel"]);
    let server = Proc::spawn_ready("sleep", "python3", &["serve.py"]);
    let sim = Sim::new(&two(&notebook, &server, 0, 40));
    configure(&sim, "", "after = \"3s\"");
    let first = Daemon::start(&sim, &[]);
    wait_until(Duration::from_secs(5), || {
        sim.dir.path().join("state/idle.json").exists()
    });
    std::thread::sleep(Duration::from_millis(2000));
    let mut first = first;
    assert_eq!(first.stop(), 0);
    // A new watchdog finds the spell under way: idle within the rest of the window, not a
    // whole new one.
    let restarted = Instant::now();
    let second = Daemon::start(&sim, &[]);
    second.expect_count(&["ACTION=idle", &format!("PID={} ", notebook.pid())], 1);
    assert!(
        restarted.elapsed() < Duration::from_millis(2800),
        "the window restarted: {:?}",
        restarted.elapsed()
    );
}

#[test]
fn without_per_process_samples_a_sole_holder_is_judged_by_its_gpu_and_a_shared_gpu_is_unknown() {
    let alone = Proc::spawn_ready("sleep", "python3", &["-m", "ipykernel"]);
    let (first, second) = (
        Proc::spawn_ready("sleep", "python3", &["a.py"]),
        Proc::spawn_ready("sleep", "python3", &["b.py"]),
    );
    // The driver gives no per-process samples on either GPU (nvmlDeviceGetProcessUtilization
    // answers NOT_SUPPORTED); the GPU's utilization is its processes' sum, 0 here.
    let no_samples = || Gpu::h200().unsupported(&["process_utilization"]);
    let sim = Sim::new(
        &Scenario::new()
            .gpu(no_samples())
            .gpu(no_samples())
            .process(Process::new(alone.pid()).on(0).used(4 * GIB).sm(0))
            .process(Process::new(first.pid()).on(1).used(4 * GIB).sm(0))
            .process(Process::new(second.pid()).on(1).used(4 * GIB).sm(0)),
    );
    configure(&sim, "", "after = \"1s\"");
    let daemon = Daemon::start(&sim, &[]);
    let line = daemon.expect_count(&["ACTION=idle"], 1);
    assert!(line.contains(&format!("PID={} ", alone.pid())), "{line}");
    assert!(
        line.contains("utilization of the GPU, its only holder"),
        "{line}"
    );
    wait_more_loops(&sim, 8);
    // Two holders of a GPU with no per-process samples: unknown, never called idle.
    assert_eq!(daemon.count(&["ACTION=idle"]), 1, "only the sole holder");
    let doc = sim.json(&["info"]);
    let idle = &doc["devices"][0]["processes"][0]["idle"];
    assert_eq!(idle["utilization"], "device", "{doc}");
    assert!(
        doc["devices"][1]["processes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p.get("idle").is_none())
    );
}

#[test]
fn the_epilog_writes_the_jobs_idle_summary_and_slurm_account_shows_it() {
    // A job's process, tied to job 4242 by its environment (no job cgroup here), idle.
    let worker = Proc::spawn_with("sleep", "python3", &["-m", "ipykernel"], |command| {
        use std::os::unix::process::CommandExt;
        command
            .env("SLURM_JOB_ID", "4242")
            .env("SLURM_STEP_ID", "0")
            .process_group(0);
    });
    wait_until(Duration::from_secs(5), || {
        std::fs::read(format!("/proc/{}/environ", worker.pid()))
            .is_ok_and(|e| e.windows(17).any(|w| w == b"SLURM_JOB_ID=4242"))
    });
    let sim = Sim::new(
        &Scenario::new()
            .gpu(Gpu::h200())
            .process(Process::new(worker.pid()).used(4 * GIB).sm(0)),
    );
    configure(&sim, "", "after = \"1s\"");
    let mut daemon = Daemon::start(&sim, &[]);
    daemon.expect_count(&["ACTION=idle"], 1);
    wait_more_loops(&sim, 5);
    assert_eq!(daemon.stop(), 0, "stopping writes the usage");
    let run = crate::slurm::run_script(
        &sim,
        "epilog.sh",
        &[("SLURM_JOB_ID", "4242"), ("SLURM_JOB_GPUS", "0")],
    );
    assert_eq!(run.code, 0, "{run:?}");
    let log = std::fs::read_to_string(sim.dir.path().join("state/slurm.log")).unwrap();
    let summary = log
        .lines()
        .find(|l| l.contains("job 4242: 1 GPU"))
        .unwrap_or_else(|| panic!("no summary line: {log}"));
    assert!(summary.contains("peak 4.0 GiB on a GPU"), "{summary}");
    assert!(summary.contains("mean SM 0.0%"), "{summary}");
    assert!(summary.contains("GiB-h held idle of"), "{summary}");
    let doc = sim.json(&["slurm", "account", "--job", "4242"]);
    let jobs = doc["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1, "{doc}");
    let usage = &jobs[0]["usage"];
    assert!(usage["idle_seconds"].as_u64().unwrap() >= 1, "{usage}");
    let (idle, held) = (
        usage["idle_gib_hours"].as_f64().unwrap(),
        usage["held_gib_hours"].as_f64().unwrap(),
    );
    assert!(idle > 0.0 && idle <= held, "{usage}");
    let table = sim.run(&["slurm", "account"]);
    assert_eq!(table.code, 0, "{}", table.stderr);
    assert!(table.stdout.contains("IDLE GiB-h"), "{}", table.stdout);
    assert!(
        table.stdout.lines().any(|l| l.starts_with("4242 ")),
        "{}",
        table.stdout
    );
    let missing = sim.run(&["slurm", "account", "--job", "9"]);
    assert_eq!(missing.code, 1, "{missing:?}");
    assert!(
        missing.stderr.contains("no account for job 9"),
        "{}",
        missing.stderr
    );
}

#[test]
fn a_gpu_given_to_a_job_with_none_of_its_processes_on_it_is_allocated_unused() {
    let sim = Sim::new(&Scenario::new().gpu(Gpu::h200()).gpu(Gpu::h200()));
    configure(&sim, "", "after = \"1s\"");
    let prolog = crate::slurm::run_script(
        &sim,
        "prolog.sh",
        &[("SLURM_JOB_ID", "5151"), ("SLURM_JOB_GPUS", "0,1")],
    );
    assert_eq!(prolog.code, 0, "{prolog:?}");
    let daemon = Daemon::start(&sim, &[]);
    let unused = |gpu: u32| format!("gpuctl_gpu_allocated_unused{{gpu=\"{gpu}\",uuid=");
    wait_until(Duration::from_secs(10), || {
        let text = metrics(&sim);
        text.contains(&unused(0)) && text.contains(&unused(1))
    });
    assert!(
        metrics(&sim).contains("job=\"5151\"} 1"),
        "{}",
        metrics(&sim)
    );
    let line = daemon.expect_count(&["ACTION=allocated-unused"], 2);
    assert!(line.contains("SLURM_JOB_ID=5151"), "{line}");
    // The job starts a process on GPU 1 (its environment names the job): GPU 0 only.
    let worker = Proc::spawn_with("sleep", "python3", &["train.py"], |command| {
        use std::os::unix::process::CommandExt;
        command.env("SLURM_JOB_ID", "5151").process_group(0);
    });
    wait_until(Duration::from_secs(5), || {
        std::fs::read(format!("/proc/{}/environ", worker.pid()))
            .is_ok_and(|e| e.windows(17).any(|w| w == b"SLURM_JOB_ID=5151"))
    });
    sim.write(
        &Scenario::new()
            .gpu(Gpu::h200())
            .gpu(Gpu::h200())
            .process(Process::new(worker.pid()).on(1).used(4 * GIB).sm(50)),
    );
    wait_until(Duration::from_secs(10), || {
        !metrics(&sim).contains(&unused(1))
    });
    assert!(metrics(&sim).contains(&unused(0)), "{}", metrics(&sim));
    // The epilog removes the record: nothing is allocated any more.
    let epilog = crate::slurm::run_script(&sim, "epilog.sh", &[("SLURM_JOB_ID", "5151")]);
    assert_eq!(epilog.code, 0, "{epilog:?}");
    wait_until(Duration::from_secs(10), || {
        !metrics(&sim).contains(&unused(0))
    });
    assert_eq!(
        daemon.count(&["ACTION=allocated-unused"]),
        2,
        "each said once"
    );
}

/// Idleness is the watchdog's measure: with no findings file (no watchdog has run), `info
/// --idle` says it does not know rather than "no idle processes"; once the watchdog writes
/// its findings, "none" is its answer.
#[test]
fn info_idle_says_when_no_watchdog_has_measured() {
    let notebook = Proc::spawn_ready("sleep", "python3", &["-m", "ipykernel"]);
    let server = Proc::spawn_ready("sleep", "python3", &["serve.py"]);
    let sim = Sim::new(&two(&notebook, &server, 50, 40));
    configure(&sim, "", "after = \"1h\"");
    let unknown = sim.run(&["info", "--idle"]);
    assert_eq!(unknown.code, 0, "{}", unknown.stderr);
    assert!(
        unknown.stdout.starts_with("no idle processes known: ")
            && unknown.stdout.contains("is it running?"),
        "{}",
        unknown.stdout
    );
    let daemon = Daemon::start(&sim, &[]);
    wait_more_loops(&sim, 2);
    let measured = sim.run(&["info", "--idle"]);
    drop(daemon);
    assert_eq!(
        measured.stdout, "no idle processes (as the watchdog's [idle] window finds them)\n",
        "{}",
        measured.stderr
    );
}

/// Any user may start a unit of any name under their own manager: `exempt_owners =
/// ["unit:vllm.service"]` shields the system's vllm.service, never mallory's own unit of
/// that name (`unit:vllm.service@1001` is hers, and only an exemption naming it would count).
#[test]
fn a_users_own_unit_named_as_an_exempt_system_unit_shields_nothing() {
    const MALLORY: u32 = 1001;
    let unit = format!("vllm-{}.service", std::process::id());
    let path = format!("/user.slice/user-{MALLORY}.slice/user@{MALLORY}.service/app.slice/{unit}");
    let Some(cgroup) = TestCgroup::create(Path::new("/sys/fs/cgroup/unified"), &path) else {
        panic!("cannot run here: cannot create cgroups under /sys/fs/cgroup/unified");
    };
    let mallorys = Proc::spawn_as(MALLORY, "sleep", &["serve.py"]);
    cgroup.add(mallorys.pid());
    let busy = Proc::spawn_ready("sleep", "python3", &["train.py"]);
    let sim = Sim::new(&two(&mallorys, &busy, 0, 40));
    let owner = sim.json(&["info"])["devices"][0]["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == mallorys.pid())
        .map(|p| p["owner"].clone())
        .unwrap();
    assert_eq!(owner["kind"], "systemd_user_unit", "{owner}");
    reclaim_idle_exempting(&sim, &format!("\"unit:{unit}\""));
    let daemon = Daemon::start(&sim, &[]);
    let line = daemon.expect_count(&["ACTION=reclaimed"], 1);
    assert!(line.contains(&format!("PID={} ", mallorys.pid())), "{line}");
    assert!(!alive(mallorys.pid()), "mallory's unit was shielded");
    assert!(alive(busy.pid()));
}
