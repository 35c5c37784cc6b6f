//! The prolog and epilog under a real single-node Slurm, in both process-tracking modes
//! (proctrack/cgroup and proctrack/linuxproc). Slurm comes from Debian (scripts/fetch-slurm
//! installs it when missing; every test fails with its reason when it cannot).
//!
//! One cluster per mode, started by the first test of that mode and shared by the others:
//! the tests run one at a time, and every cluster is stopped before the process exits.
//! The node has two GPUs, whose device files nvml-sim makes from the scenario's
//! `device_dir`; the Prolog and Epilog run a per-cluster script (see [`Mode`]).

#[path = "../util.rs"]
mod util;

mod cluster;
mod health;
mod jobs;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

use libtest_mimic::{Arguments, Failed, Trial};

use cluster::{Batch, Cluster, ClusterSpec, Tracking, WAIT};
use util::Sim;

const GPUS: usize = 2;

/// A started cluster and what it is built on (the sim whose device files it uses), with a
/// gpuctl-watchdog on the same sim.
pub struct Mode {
    pub cluster: Cluster,
    pub sim: Sim,
    /// Where the Prolog and Epilog scripts of these tests write (`prolog.log`, ...).
    pub out: PathBuf,
    pub watchdog: Child,
}

impl Drop for Mode {
    fn drop(&mut self) {
        let _ = self.watchdog.kill();
        let _ = self.watchdog.wait();
    }
}

/// The cluster of each mode: None until a test of the mode runs; Err when it could not
/// start (the later tests of the mode fail with that reason rather than try again).
static CGROUP: Mutex<Option<Result<Mode, String>>> = Mutex::new(None);
static LINUXPROC: Mutex<Option<Result<Mode, String>>> = Mutex::new(None);

fn slot(tracking: Tracking) -> &'static Mutex<Option<Result<Mode, String>>> {
    match tracking {
        Tracking::Cgroup => &CGROUP,
        Tracking::Linuxproc => &LINUXPROC,
    }
}

/// A scenario with `GPUS` GPUs whose device files go in the sim's device directory.
fn scenario(dev: &Path) -> util::Scenario {
    util::Scenario::new()
        .device_dir(dev)
        .gpus(GPUS, util::Gpu::new())
}

/// What Slurm runs (through the cluster's wrapper): a line recording the run, with the job
/// and its GPUs as the wrapper's environment and Slurm give them, then packaging/slurm's
/// script, unchanged.
const RECORDER: &str = r#"#!/bin/sh
echo "job=$SLURM_JOB_ID gpus=$SLURM_JOB_GPUS myvar=$MYVAR" >>"$RECORD_DIR/NAME.log"
env >"$RECORD_DIR/NAME.env"
exec "$PACKAGING/NAME.sh"
"#;

/// Seconds between Slurm's runs of the health check.
const HEALTH_CHECK_INTERVAL: u32 = 2;

/// What points gpuctl (and the watchdog) at the sim: NVML, scenario, configuration, device
/// and state directories.
fn gpuctl_env(sim: &Sim) -> Vec<(String, String)> {
    let command = sim.gpuctl(&[]);
    let mut env: Vec<(String, String)> = command
        .get_envs()
        .filter_map(|(k, v)| Some((k.to_str()?.to_string(), v?.to_str()?.to_string())))
        .collect();
    let state = sim.dir.path().join("state").display().to_string();
    env.retain(|(k, _)| k != "GPUCTL_STATE_DIR");
    env.push(("GPUCTL_STATE_DIR".into(), state));
    env
}

fn start_mode(tracking: Tracking) -> Result<Mode, String> {
    cluster::ensure_slurm()?;
    let sim = Sim::new("");
    let dev = sim.dev_dir();
    sim.write(&scenario(&dev));
    // The first NVML client makes the device files.
    let info = sim.run(&["info"]);
    if info.code != 0 {
        return Err(format!(
            "gpuctl info (making the device files) failed: {}",
            info.stderr
        ));
    }
    // The watchdog (every 250 ms, reporting only) and the Slurm commands share a state
    // directory: peaks, slurm.log, slurm-jobs.jsonl.
    let state = sim.dir.path().join("state");
    std::fs::write(
        sim.config_path(),
        format!(
            "[watchdog]\ninterval = \"250ms\"\nmetrics_file = \"\"\nstate_dir = \"{}\"\n",
            state.display()
        ),
    )
    .map_err(|e| format!("{}: {e}", sim.config_path().display()))?;
    let packaging = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/slurm");
    let out = sim.dir.path().join("scripts-out");
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let mut scripts = Vec::new();
    for name in ["prolog", "epilog", "healthcheck"] {
        let path = sim.dir.path().join(format!("{name}.sh"));
        let text = RECORDER.replace("NAME", name);
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        scripts.push(path);
    }
    let spec = ClusterSpec {
        gpus: GPUS,
        dev_dir: dev,
        prolog: Some(scripts[0].clone()),
        epilog: Some(scripts[1].clone()),
        health_check: Some(scripts[2].clone()),
        // Often, for the tests of undraining.
        health_check_interval: HEALTH_CHECK_INTERVAL,
        script_env: [
            ("MYVAR".to_string(), "from the wrapper's 'env'".to_string()),
            ("RECORD_DIR".into(), out.display().to_string()),
            ("PACKAGING".into(), packaging.display().to_string()),
            ("GPUCTL".into(), util::gpuctl_bin().display().to_string()),
            // Nothing of this machine's /etc/default/gpuctl.
            ("GPUCTL_DEFAULTS".into(), "/nonexistent".into()),
            ("GPUCTL_PROLOG_WAIT".into(), "10s".into()),
            ("GPUCTL_EPILOG_TIMEOUT".into(), "2s".into()),
        ]
        .into_iter()
        .chain(gpuctl_env(&sim))
        .collect(),
    };
    let cluster = Cluster::try_start(tracking, spec)?;
    let watchdog = Command::new(util::watchdog_bin())
        .envs(gpuctl_env(&sim))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(
            std::fs::File::create(sim.dir.path().join("watchdog.log"))
                .map_err(|e| format!("watchdog.log: {e}"))?,
        )
        .spawn()
        .map_err(|e| format!("cannot start gpuctl-watchdog: {e}"))?;
    Ok(Mode {
        cluster,
        sim,
        out,
        watchdog,
    })
}

/// Runs `test` on the mode's cluster, starting it first if this is the mode's first test.
fn with_mode(tracking: Tracking, test: fn(&Mode)) -> Result<(), Failed> {
    let mut guard = slot(tracking).lock().unwrap_or_else(|e| e.into_inner());
    let mode = guard.get_or_insert_with(|| start_mode(tracking));
    match mode {
        Ok(mode) => {
            test(mode);
            Ok(())
        }
        Err(e) => Err(e.clone().into()),
    }
}

fn stop_all() {
    for tracking in [Tracking::Cgroup, Tracking::Linuxproc] {
        let taken = slot(tracking)
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        drop(taken);
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A GPU job with srun: it gets a GPU, runs in the job's freezer cgroup under
/// proctrack/cgroup, and the Prolog ran for it with the wrapper's environment.
fn smoke(mode: &Mode) {
    let c = &mode.cluster;
    let out = c.srun(&[
        "--gres=gpu:1",
        "sh",
        "-c",
        "echo job=$SLURM_JOB_ID; echo gpus=$CUDA_VISIBLE_DEVICES; cat /proc/self/cgroup",
    ]);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "srun failed ({}): {stdout}{}\n{}",
        out.status,
        text(&out.stderr),
        c.logs()
    );
    let job: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("job="))
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("no job id in srun's output: {stdout}"));
    let gpu = stdout
        .lines()
        .find_map(|l| l.strip_prefix("gpus="))
        .unwrap_or_else(|| panic!("no CUDA_VISIBLE_DEVICES line: {stdout}"));
    assert!(
        gpu == "0" || gpu == "1",
        "CUDA_VISIBLE_DEVICES={gpu:?}, not one GPU index: {stdout}"
    );
    let freezer = stdout
        .lines()
        .find(|l| {
            l.split(':')
                .nth(1)
                .is_some_and(|s| s.split(',').any(|s| s == "freezer"))
        })
        .unwrap_or("");
    let in_job = freezer.contains(&format!("/job_{job}/"));
    match c.tracking() {
        Tracking::Cgroup => assert!(
            in_job && freezer.contains(&format!("/slurm_{}/", c.host())),
            "the task is not in the job's freezer cgroup: {freezer:?}\n{stdout}"
        ),
        Tracking::Linuxproc => assert!(!in_job, "a freezer cgroup under linuxproc: {freezer:?}"),
    }
    assert_eq!(c.wait_job_done(job, WAIT), "COMPLETED");

    // The Prolog ran for the job, with its GPU from Slurm and MYVAR from the wrapper; the
    // Epilog too, by the time the job is done.
    let record = |name: &str| std::fs::read_to_string(mode.out.join(format!("{name}.log")));
    for name in ["prolog", "epilog"] {
        let log = record(name).unwrap_or_else(|e| panic!("{name} never ran: {e}\n{}", c.logs()));
        let line = log
            .lines()
            .find(|l| l.starts_with(&format!("job={job} ")))
            .unwrap_or_else(|| panic!("{name} did not run for job {job}: {log}"));
        assert!(
            line.contains(&format!("gpus={gpu} ")),
            "{name} saw other GPUs than the job's {gpu}: {line}"
        );
        assert!(
            line.ends_with(" myvar=from the wrapper's 'env'"),
            "{name} lacks the wrapper's MYVAR: {line}"
        );
    }
    c.wait_node_idle(WAIT);
}

/// Slurm ran the health check at slurmd's start, through its wrapper, in a clean
/// environment (nothing of slurmd's: what the wrappers are for), as it runs the Prolog and
/// Epilog.
fn scripts_get_a_clean_environment(mode: &Mode) {
    let c = &mode.cluster;
    for name in ["healthcheck", "prolog", "epilog"] {
        let env = std::fs::read_to_string(mode.out.join(format!("{name}.env")))
            .unwrap_or_else(|e| panic!("{name} never ran: {e}\n{}", c.logs()));
        assert!(
            env.lines().any(|l| l == "MYVAR=from the wrapper's 'env'"),
            "{name} lacks the wrapper's MYVAR: {env}"
        );
        assert!(
            !env.contains(cluster::DAEMON_MARK),
            "{name} got slurmd's environment: {env}"
        );
    }
}

/// A batch job (a script, and a --wrap command) through sbatch: it gets a GPU and ends
/// COMPLETED, its output where [`Cluster::job_output`] reads it.
fn sbatch_smoke(mode: &Mode) {
    let c = &mode.cluster;
    let id = c.sbatch(
        Batch::Script("#!/bin/sh\necho \"job=$SLURM_JOB_ID gpus=$CUDA_VISIBLE_DEVICES\"\n"),
        &["--gres=gpu:2"],
    );
    assert_eq!(c.wait_job_done(id, WAIT), "COMPLETED", "{}", c.logs());
    assert_eq!(c.job_output(id), format!("job={id} gpus=0,1\n"));
    let id = c.sbatch(Batch::Wrap("echo wrapped"), &[]);
    assert_eq!(c.wait_job_done(id, WAIT), "COMPLETED", "{}", c.logs());
    assert_eq!(c.job_output(id), "wrapped\n");
    c.wait_node_idle(WAIT);
}

/// A drained node's state and reason (spaces and all) as [`Cluster::node_state`] reads
/// them, and back to idle.
fn drain_and_resume(mode: &Mode) {
    let c = &mode.cluster;
    let host = format!("nodename={}", c.host());
    let out = c.scontrol(&["update", &host, "state=drain", "reason=gpu 1 not free [x]"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (state, reason) = c.node_state();
    assert!(state.contains("DRAIN"), "{state} ({reason})");
    assert_eq!(reason, "gpu 1 not free [x]");
    let out = c.scontrol(&["update", &host, "state=resume"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    c.wait_node_idle(WAIT);
    assert_eq!(c.node_state(), ("IDLE".to_string(), String::new()));
}

/// The slurm.conf lines the guide (docs/guide/slurm.md) tells admins to add are the ones the
/// clusters here run (packaging/slurm/slurm.conf.example, which the harness builds its
/// configuration from).
fn readme_gives_the_lines_the_harness_runs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let guide =
        std::fs::read_to_string(root.join("docs/guide/slurm.md")).expect("docs/guide/slurm.md");
    let example = std::fs::read_to_string(root.join("packaging/slurm/slurm.conf.example"))
        .expect("slurm.conf.example");
    let lines: Vec<&str> = example
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .collect();
    assert!(lines.len() >= 4, "{example}");
    let block = format!("```\n{}\n```", lines.join("\n"));
    assert!(
        guide.contains(&block),
        "docs/guide/slurm.md must show, as one block:\n{block}"
    );
}

fn main() {
    let mut args = Arguments::from_args();
    // The tests of a mode share its cluster (and the two clusters share the machine).
    args.test_threads = Some(1);
    type Test = fn(&Mode);
    let tests: &[(&str, Test)] = &[
        ("smoke", smoke),
        (
            "scripts_get_a_clean_environment",
            scripts_get_a_clean_environment,
        ),
        ("sbatch_smoke", sbatch_smoke),
        ("drain_and_resume", drain_and_resume),
        (
            "job_is_named_accounted_and_cleaned_up",
            jobs::job_is_named_accounted_and_cleaned_up,
        ),
        (
            "a_job_ending_leaves_the_other_gpus_job_alone",
            jobs::a_job_ending_leaves_the_other_gpus_job_alone,
        ),
        (
            "held_memory_drains_with_the_reason_and_the_health_check_resumes",
            jobs::held_memory_drains_with_the_reason_and_the_health_check_resumes,
        ),
        (
            "an_admins_drain_is_never_resumed",
            jobs::an_admins_drain_is_never_resumed,
        ),
        (
            "the_prolog_clears_a_leftover_on_the_jobs_gpu",
            jobs::the_prolog_clears_a_leftover_on_the_jobs_gpu,
        ),
        (
            "an_unhealthy_gpu_drains_the_node_and_its_recovery_resumes_it",
            health::an_unhealthy_gpu_drains_the_node_and_its_recovery_resumes_it,
        ),
        (
            "an_app_xid_never_drains_and_the_epilog_names_the_job",
            health::an_app_xid_never_drains_and_the_epilog_names_the_job,
        ),
        (
            "another_users_claim_on_the_job_is_not_in_its_xid_lines",
            health::another_users_claim_on_the_job_is_not_in_its_xid_lines,
        ),
    ];
    let mut trials = Vec::new();
    for tracking in [Tracking::Cgroup, Tracking::Linuxproc] {
        for &(name, test) in tests {
            trials.push(Trial::test(
                format!("{}::{name}", tracking.name()),
                move || with_mode(tracking, test),
            ));
        }
    }
    trials.push(Trial::test(
        "readme_gives_the_lines_the_harness_runs",
        || {
            readme_gives_the_lines_the_harness_runs();
            Ok(())
        },
    ));
    let conclusion = libtest_mimic::run(&args, trials);
    stop_all();
    conclusion.exit();
}
