//! Owners a user forges: a cgroup named like a Slurm job in a subtree that is the user's
//! own, or SLURM_JOB_ID in the environment. Alice's job 777 ends; mallory's process that
//! claims job 777 on a GPU alice was never given is neither ended by alice's epilog nor
//! put in alice's account.

use std::path::Path;

use serde_json::Value;

use crate::slurm::run_script;
use crate::util::{
    GIB, Gpu, Proc, Process, Scenario, Sim, TestCgroup, alive, process_in, wait_exited,
};

const ALICE: u32 = 1000;
const MALLORY: u32 = 1001;

/// Mallory's 29.3 GiB.
const MALLORYS: u64 = 30_000 * 1024 * 1024;

/// Alice's leftover on GPU 0 (2 GiB), mallory's process on GPU 1.
fn scenario(alice: u32, mallory: u32) -> Scenario {
    Scenario::new()
        .driver_version("1")
        .gpus(2, Gpu::h100())
        .process(Process::new(alice).on(0).used(2 * GIB))
        .process(Process::new(mallory).on(1).used(MALLORYS).sm(90))
}

/// A job id of this test run's own: cgroup directories are the whole machine's.
fn job_id(salt: u64) -> u64 {
    6_000_000 + salt * 1_000_000 + u64::from(std::process::id()) % 1_000_000
}

/// What `gpuctl info --json` says of `pid`.
fn shown(sim: &Sim, pid: u32) -> Value {
    let doc = sim.json(&["info"]);
    process_in(&doc, pid)
        .unwrap_or_else(|| panic!("pid {pid} not shown: {doc}"))
        .clone()
}

/// One look, as the watchdog's loop takes it, recording owners' peaks where the epilog
/// reads them (run_script's configuration puts the state directory at `state/`).
fn watchdog_look(sim: &Sim) {
    let run = sim
        .gpuctl(&["info"])
        .env("GPUCTL_STATE_DIR", sim.dir.path().join("state"))
        .output()
        .expect("run gpuctl info");
    assert!(run.status.success(), "{run:?}");
}

/// The epilog of `job` (alice's, given GPU 0) and its account line.
fn alices_epilog(sim: &Sim, job: u64) -> Value {
    let run = run_script(
        sim,
        "epilog.sh",
        &[
            ("SLURM_JOB_ID", &job.to_string()),
            ("SLURM_JOB_UID", &ALICE.to_string()),
            ("SLURM_JOB_GPUS", "0"),
            ("GPUCTL_EPILOG_TIMEOUT", "2s"),
        ],
    );
    assert_eq!(run.code, 0, "{run:?}");
    let text = std::fs::read_to_string(sim.dir.path().join("state/slurm-jobs.jsonl"))
        .expect("the epilog's account");
    let line = text.lines().last().expect("an account line");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

/// Alice's account holds her leftover and her GPU, nothing of mallory's.
fn assert_alices_account_only(account: &Value, job: u64) {
    assert_eq!(account["job"], job, "{account}");
    assert_eq!(account["outcome"], "clean", "{account}");
    assert_eq!(account["leftovers_ended"], 1, "{account}");
    assert_eq!(account["reclaimed_bytes"], 2 * GIB, "{account}");
    let gpus = account["gpus"].as_array().expect("gpus");
    assert_eq!(gpus.len(), 1, "only the GPU alice was given: {account}");
    assert_eq!(gpus[0]["index"], 0, "{account}");
    assert_eq!(gpus[0]["peak_bytes"], 2 * GIB, "{account}");
}

/// The attack as reported: in the cgroup subtree systemd delegates to her
/// (`user@1001.service/app.slice/...`), mallory makes `slurm/job_N/step_0` and runs there.
/// It is her own unit's cgroup, shown so; alice's job N (in Slurm's own cgroup) ends, its
/// epilog ends alice's leftover and leaves mallory's process and memory alone.
#[test]
fn a_job_cgroup_made_in_a_users_own_subtree_is_not_the_job() {
    let job = job_id(0);
    let unified = Path::new("/sys/fs/cgroup/unified");
    let forged = format!(
        "/user.slice/user-{MALLORY}.slice/user@{MALLORY}.service/app.slice/slurm/job_{job}/step_0"
    );
    let Some(mallorys) = TestCgroup::create(unified, &forged) else {
        panic!(
            "cannot run here: cannot create cgroups under {}",
            unified.display()
        );
    };
    let Some(alices) = TestCgroup::create(
        Path::new("/sys/fs/cgroup/freezer"),
        &format!("/slurm/uid_{ALICE}/job_{job}/step_0"),
    ) else {
        panic!("cannot run here: cannot create a cgroup v1 freezer hierarchy here");
    };
    let mallory = Proc::spawn_as(MALLORY, "sleep", &["train.py"]);
    mallorys.add(mallory.pid());
    let leftover = Proc::spawn_as(ALICE, "sleep", &["train.py", "--job", "leftover"]);
    alices.add(leftover.pid());
    let sim = Sim::new(&scenario(leftover.pid(), mallory.pid()));

    let owner = shown(&sim, mallory.pid())["owner"].clone();
    assert_eq!(owner["kind"], "systemd_unit", "{owner}");
    assert_eq!(owner["unit"], format!("user@{MALLORY}.service"), "{owner}");
    let owner = shown(&sim, leftover.pid())["owner"].clone();
    assert_eq!(owner["kind"], "slurm_job", "{owner}");
    assert_eq!(owner["job_id"], job, "{owner}");
    let table = sim.run(&["info"]).stdout;
    let row = table
        .lines()
        .find(|l| l.contains(&mallory.pid().to_string()))
        .unwrap_or_else(|| panic!("no row for mallory: {table}"));
    assert!(!row.contains("slurm"), "{row}");

    watchdog_look(&sim);
    let account = alices_epilog(&sim, job);
    wait_exited(leftover.pid());
    assert!(
        alive(mallory.pid()),
        "alice's epilog ended mallory's process"
    );
    assert_alices_account_only(&account, job);
}

/// proctrack/linuxproc: no cgroup names a job, so SLURM_JOB_ID in the environment does,
/// marked `(env)`. Mallory sets it too: her process is her own claim on the job, which
/// alice's epilog neither ends nor accounts.
#[test]
fn another_users_slurm_job_id_in_the_environment_is_not_the_job() {
    let job = job_id(1).to_string();
    let env = [("SLURM_JOB_ID", job.as_str()), ("SLURM_STEP_ID", "0")];
    let leftover = Proc::spawn_as_with_env(ALICE, "sleep", &["train.py"], &env);
    let mallory = Proc::spawn_as_with_env(MALLORY, "sleep", &["train.py"], &env);
    let sim = Sim::new(&scenario(leftover.pid(), mallory.pid()));

    for pid in [leftover.pid(), mallory.pid()] {
        let owner = shown(&sim, pid)["owner"].clone();
        assert_eq!(owner["kind"], "slurm_job", "{owner}");
        assert_eq!(owner["from_environ"], true, "{owner}");
    }
    let table = sim.run(&["info"]).stdout;
    assert!(table.contains(&format!("slurm {job}.0 (env)")), "{table}");

    watchdog_look(&sim);
    let peaks: Value = serde_json::from_slice(
        &std::fs::read(sim.dir.path().join("state/peaks.json")).expect("peaks.json"),
    )
    .expect("peaks.json is JSON");
    // Each user's claim is kept apart.
    assert!(
        peaks["owners"][format!("slurm:{job}@{MALLORY}")].is_object(),
        "{peaks}"
    );
    assert!(peaks["owners"][format!("slurm:{job}")].is_null(), "{peaks}");

    let job: u64 = job.parse().expect("job id");
    let account = alices_epilog(&sim, job);
    wait_exited(leftover.pid());
    assert!(
        alive(mallory.pid()),
        "alice's epilog ended mallory's process"
    );
    assert_alices_account_only(&account, job);
    // Mallory's claim stays with her uid, to be dropped after the retention.
    let peaks: Value = serde_json::from_slice(
        &std::fs::read(sim.dir.path().join("state/peaks.json")).expect("peaks.json"),
    )
    .expect("peaks.json is JSON");
    assert!(
        peaks["owners"][format!("slurm:{job}@{MALLORY}")].is_object(),
        "{peaks}"
    );
    assert!(
        peaks["owners"][format!("slurm:{job}@{ALICE}")].is_null(),
        "alice's claim was taken: {peaks}"
    );
}

/// The health check's drain reason, with `scontrol` answering that node gpu7 is idle.
fn health_check_reason(sim: &Sim) -> String {
    let run = crate::slurm::run_script_with(
        sim,
        "healthcheck.sh",
        &[("SLURMD_NODENAME", "gpu7")],
        "case \"$1\" in show) printf 'NodeName=gpu7\\n   State=IDLE\\n' ;; \
         *) printf '%s\\n' \"$*\" >> \"$CALLS\" ;; esac",
    );
    assert_eq!(run.code, 0, "{run:?}");
    std::fs::read_to_string(sim.dir.path().join("scontrol.calls"))
        .unwrap_or_else(|_| panic!("the health check did not drain: {run:?}"))
}

/// The finding as reported: mallory runs `env SLURM_JOB_ID=J` on GPU 0, which alice's job
/// J shares; GPU 0 raises Xid 13 and Xid 64 with her process on it, GPU 1 an Xid 13 with
/// alice's. Mallory's claim is her own: the epilog's Xid lines in slurm.log name alice's
/// process only, and neither `info`'s health line nor the health check's drain reason
/// puts GPU 0's Xid 64 under job J.
#[test]
fn another_users_environment_claim_never_enters_the_jobs_xids_or_drain_reason() {
    let job = job_id(2);
    let job_text = job.to_string();
    let env = [("SLURM_JOB_ID", job_text.as_str())];
    let alices = Proc::spawn_as_with_env(ALICE, "sleep", &["train.py"], &env);
    let mallorys = Proc::spawn_as_with_env(MALLORY, "sleep", &["attack.py"], &env);
    let sim = Sim::new(
        &Scenario::new()
            // A driver before R550 (no recovery-action field): the catalog alone judges
            // Xid 64, so the verdict names the Xid the test is about.
            .gpus(2, Gpu::new().no_recovery_field())
            .process(Process::new(mallorys.pid()).on(0).used(GIB))
            .process(Process::new(alices.pid()).on(1).used(GIB))
            .xid(0, 13, Some(mallorys.pid()))
            .xid(0, 64, Some(mallorys.pid()))
            .xid(1, 13, Some(alices.pid())),
    );
    let state = sim.dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(
        sim.config_path(),
        format!("[watchdog]\nstate_dir = \"{}\"\n", state.display()),
    )
    .unwrap();
    let run = crate::util::Run::from(
        crate::watchdog::command(&sim, &["--once"])
            .output()
            .expect("run gpuctl-watchdog"),
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stderr.contains("GPU 0: Xid 64"), "{}", run.stderr);

    let info = sim.run(&["info"]).stdout;
    assert!(info.contains("HEALTH: needs a reset: Xid 64"), "{info}");
    assert!(!info.contains(&format!("job {job}")), "{info}");
    let reason = health_check_reason(&sim);
    assert!(reason.contains("GPU 0 needs a reset: Xid 64"), "{reason}");
    assert!(!reason.contains(&format!("job {job}")), "{reason}");

    let run = run_script(
        &sim,
        "epilog.sh",
        &[
            ("SLURM_JOB_ID", &job_text),
            ("SLURM_JOB_UID", &ALICE.to_string()),
            ("SLURM_JOB_GPUS", "0,1"),
            ("GPUCTL_EPILOG_TIMEOUT", "1s"),
        ],
    );
    let log = std::fs::read_to_string(state.join("slurm.log")).unwrap_or_default();
    let xid_lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" epilog: ") && l.contains(": Xid "))
        .collect();
    assert_eq!(xid_lines.len(), 1, "{log}\n{run:?}");
    assert!(
        xid_lines[0].contains(&format!(
            "job {job}: Xid 13 (Graphics Engine Exception) on GPU 1 hit pid {}",
            alices.pid()
        )),
        "{log}"
    );
    wait_exited(alices.pid());
    assert!(
        alive(mallorys.pid()),
        "alice's epilog ended mallory's process"
    );
}
