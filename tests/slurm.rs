//! The Slurm prolog and epilog shipped in packaging/slurm/, run as slurmd would run them,
//! against nvml-sim with real processes.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::util::{
    ComputeMode, GIB, Gpu, Proc, Process, Run, Scenario, Sim, TrainingRun, alive, wait_exited,
};

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../packaging/slurm")
        .join(name)
}

/// The script with the environment slurmd gives it, and gpuctl against `sim`. Slurm's
/// scontrol is a stand-in that records what it was asked (`scontrol_calls`): these tests
/// run the scripts without a slurmd (tests/slurm_real runs them under a real one), and must
/// never drain the machine's own node. The job's user (SLURM_JOB_UID) is this test's,
/// whose processes the tests start, unless `env` says otherwise.
pub(crate) fn run_script(sim: &Sim, name: &str, env: &[(&str, &str)]) -> Run {
    run_script_with(sim, name, env, "printf '%s\\n' \"$*\" >> \"$CALLS\"")
}

/// [`run_script`] with `scontrol` a stand-in whose body is `scontrol_body` (its calls go to
/// `$CALLS`, `<sim>/scontrol.calls`, if it records them).
pub(crate) fn run_script_with(
    sim: &Sim,
    name: &str,
    env: &[(&str, &str)],
    scontrol_body: &str,
) -> Run {
    let bin = sim.dir.path().join("bin");
    std::fs::create_dir_all(&bin).expect("bin dir");
    let scontrol = bin.join("scontrol");
    std::fs::write(&scontrol, format!("#!/bin/sh\n{scontrol_body}\n")).expect("write scontrol");
    std::fs::set_permissions(
        &scontrol,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod scontrol");
    if std::fs::read_to_string(sim.config_path())
        .unwrap()
        .is_empty()
    {
        std::fs::write(
            sim.config_path(),
            format!(
                "[watchdog]\nstate_dir = \"{}\"\n",
                sim.dir.path().join("state").display()
            ),
        )
        .expect("write config");
    }
    let gpuctl = sim.gpuctl(&[]);
    let mut command = Command::new("sh");
    command
        .arg(script(name))
        .env("GPUCTL", gpuctl.get_program())
        .env("GPUCTL_DEFAULTS", "/nonexistent")
        .env("CALLS", sim.dir.path().join("scontrol.calls"))
        .env(
            "PATH",
            format!(
                "{}:{}",
                bin.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .env_remove("SLURM_JOB_GPUS")
        .env_remove("SLURM_JOB_ID")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env_remove("SLURMD_NODENAME")
        .env_remove("SLURM_JOB_USER")
        .env("SLURM_JOB_UID", own_uid().to_string())
        .envs(
            gpuctl
                .get_envs()
                .filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned()))),
        )
        .envs(env.iter().copied());
    Run::from(command.output().expect("run the script"))
}

/// This test's effective uid: /proc/self is owned by it.
fn own_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").expect("/proc/self").uid()
}

/// What the scripts asked of scontrol, a line per call.
fn scontrol_calls(sim: &Sim) -> String {
    std::fs::read_to_string(sim.dir.path().join("scontrol.calls")).unwrap_or_default()
}

/// Two GPUs in exclusive-process mode and `processes` as (pid, GPU, SM %), 2 GiB each.
fn scenario(processes: &[(u32, u32, u32)]) -> Scenario {
    Scenario::new()
        .driver_version("1")
        .gpus(2, Gpu::new().compute_mode(ComputeMode::ExclusiveProcess))
        .processes(
            processes
                .iter()
                .map(|&(pid, gpu, sm)| Process::new(pid).on(gpu).used(2 * GIB).sm(sm)),
        )
}

#[test]
fn prolog_frees_only_the_jobs_gpus_and_passes_jobs_without_gpus() {
    let mut crashed = TrainingRun::start(2, "sleep", "python3", &["train.py"]);
    crashed.crash();
    let busy = Proc::sleeper("python3", &["serve.py"]);
    let mut processes: Vec<(u32, u32, u32)> = crashed
        .workers
        .pids
        .iter()
        .map(|&pid| (pid, 0, 0))
        .collect();
    processes.push((busy.pid(), 1, 80));
    let sim = Sim::new(&scenario(&processes));

    // A job without GPUs: nothing is touched, nothing waited for.
    let run = run_script(&sim, "prolog.sh", &[("SLURM_JOB_ID", "10")]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(crashed.workers.pids.iter().all(|&pid| alive(pid)));

    // The job gets GPU 0: the crashed run's workers are reclaimed, GPU 1 is none of its
    // business.
    let run = run_script(
        &sim,
        "prolog.sh",
        &[("SLURM_JOB_ID", "11"), ("SLURM_JOB_GPUS", "0")],
    );
    assert_eq!(run.code, 0, "{run:?}");
    for &pid in &crashed.workers.pids {
        wait_exited(pid);
    }
    assert!(alive(busy.pid()));

    // A job given GPU 1, held by a live job: not free by the deadline, so Slurm would
    // drain the node rather than start a job on a full GPU.
    let run = run_script(
        &sim,
        "prolog.sh",
        &[
            ("SLURM_JOB_ID", "12"),
            ("SLURM_JOB_GPUS", "1"),
            ("SLURMD_NODENAME", "gpu7"),
            ("GPUCTL_PROLOG_WAIT", "1s"),
        ],
    );
    assert_eq!(run.code, 1, "{run:?}");
    assert!(alive(busy.pid()));
    // The node is drained with a reason that names the GPU, the memory and the holder.
    let calls = scontrol_calls(&sim);
    let drain = calls
        .lines()
        .find(|l| l.starts_with("update NodeName=gpu7 State=DRAIN Reason=gpuctl: GPU 1 (GPU-"))
        .unwrap_or_else(|| panic!("no drain: {calls}"));
    assert!(
        drain.contains(&format!("2.0 GiB held, pid {} (", busy.pid())),
        "{drain}"
    );
}

/// A cgroup v1 freezer directory laid out as Slurm's cgroup plugin lays out a job step.
struct SlurmCgroup {
    dirs: Vec<PathBuf>,
}

impl SlurmCgroup {
    /// `None` where the freezer hierarchy cannot be written (no root, cgroup v2 only).
    fn create(job: u64) -> Option<SlurmCgroup> {
        let base = Path::new("/sys/fs/cgroup/freezer");
        let uid = base.join("slurm").join("uid_0");
        let job_dir = uid.join(format!("job_{job}"));
        let step = job_dir.join("step_0");
        std::fs::create_dir_all(&step).ok()?;
        // Removed innermost first; rmdir leaves a directory that is not empty (another
        // test's job, a real Slurm) alone.
        Some(SlurmCgroup {
            dirs: vec![step, job_dir, uid, base.join("slurm")],
        })
    }

    fn add(&self, pid: u32) {
        std::fs::write(self.dirs[0].join("cgroup.procs"), pid.to_string()).expect("join cgroup");
    }
}

impl Drop for SlurmCgroup {
    fn drop(&mut self) {
        // Back to the root cgroup, then remove the (now empty) directories.
        let root = Path::new("/sys/fs/cgroup/freezer/cgroup.procs");
        if let Ok(pids) = std::fs::read_to_string(self.dirs[0].join("cgroup.procs")) {
            for pid in pids.lines() {
                let _ = std::fs::write(root, pid);
            }
        }
        for dir in &self.dirs {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

#[test]
fn epilog_ends_the_jobs_leftovers_and_restores_its_gpus() {
    let job = 4_000_000 + u64::from(std::process::id());
    let Some(cgroup) = SlurmCgroup::create(job) else {
        panic!("cannot run here: cannot create a cgroup v1 freezer hierarchy here (needs root)");
    };
    let leftover = Proc::sleeper("python3", &["train.py", "--job", "leftover"]);
    cgroup.add(leftover.pid());
    let neighbour = Proc::sleeper("python3", &["serve.py"]);
    let sim = Sim::new(&scenario(&[
        (leftover.pid(), 1, 0),
        (neighbour.pid(), 0, 50),
    ]));
    let info = sim.json(&["info"]);
    assert_eq!(
        info["devices"][1]["processes"][0]["owner"]["job_id"].as_u64(),
        Some(job),
        "the leftover must show as the job's: {}",
        info["devices"][1]["processes"][0]
    );

    let run = run_script(
        &sim,
        "epilog.sh",
        &[
            ("SLURM_JOB_ID", &job.to_string()),
            ("SLURM_JOB_GPUS", "1"),
            ("GPUCTL_EPILOG_TIMEOUT", "2s"),
        ],
    );
    assert_eq!(run.code, 0, "{run:?}");
    wait_exited(leftover.pid());
    assert!(
        alive(neighbour.pid()),
        "another job's process was signalled"
    );
    let info: Value = sim.json(&["info"]);
    assert_eq!(
        info["devices"][1]["compute_mode"], "default",
        "the job's GPU is reset"
    );
    assert_eq!(
        info["devices"][0]["compute_mode"], "exclusive_process",
        "a GPU the job did not have is left alone"
    );

    // Without a job id the epilog refuses rather than guess.
    let run = run_script(&sim, "epilog.sh", &[]);
    assert_eq!(run.code, 2);
    assert!(
        run.stderr.contains("SLURM_JOB_ID is not set"),
        "{}",
        run.stderr
    );
}

/// A job handed a MIG slice (SLURM_JOB_GPUS holding its MIG UUID, as Slurm's MIG support
/// and the k8s device plugin give them): the prolog clears that instance only, while the
/// card's other tenant lives; the epilog's reset leaves the shared card alone.
#[test]
fn prolog_and_epilog_on_a_mig_slice_touch_that_instance_only() {
    let neighbour = Proc::sleeper("python3", &["serve.py"]);
    let leftover = Proc::spawn("zombie-leader", "python3", &["train.py"]);
    leftover.wait_for_state('Z');
    let sim = Sim::new(
        &Scenario::new()
            .gpu(Gpu::h100().mig("3g.40gb", 1).mig("3g.40gb", 2))
            .process(
                Process::new(neighbour.pid())
                    .instance(1)
                    .used(8 * GIB)
                    .sm(80),
            )
            .process(Process::new(leftover.pid()).instance(2).used(4 * GIB)),
    );
    let info = sim.json(&["info"]);
    let slice = info["devices"][0]["mig_devices"][1]["uuid"]
        .as_str()
        .unwrap()
        .to_string();
    let run = run_script(
        &sim,
        "prolog.sh",
        &[
            ("SLURM_JOB_ID", "4241"),
            ("SLURM_JOB_GPUS", &slice),
            ("GPUCTL_PROLOG_WAIT", "10s"),
        ],
    );
    assert_eq!(run.code, 0, "{run:?}");
    wait_exited(leftover.pid());
    assert!(alive(neighbour.pid()), "the other instance's job lives");

    let run = run_script(
        &sim,
        "epilog.sh",
        &[("SLURM_JOB_GPUS", &slice), ("SLURM_JOB_ID", "4242")],
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert!(alive(neighbour.pid()));
}

/// proctrack/linuxproc: no cgroup names the job, and a job's background child outlives it,
/// carrying SLURM_JOB_ID. `info` names the job from the environment (marked so), and the
/// epilog ends that child and only it.
#[test]
fn without_a_job_cgroup_the_environment_names_the_job_and_the_epilog_ends_its_leftover() {
    let spawn_in_job = |job: &str, script: &str| {
        Proc::spawn_with("sleep", "python3", &[script], |command| {
            use std::os::unix::process::CommandExt;
            command
                .env("SLURM_JOB_ID", job)
                .env("SLURM_STEP_ID", "0")
                .process_group(0);
        })
    };
    let leftover = spawn_in_job("777", "train.py");
    let other_job = spawn_in_job("778", "serve.py");
    crate::util::wait_until(std::time::Duration::from_secs(5), || {
        std::fs::read(format!("/proc/{}/environ", leftover.pid()))
            .is_ok_and(|e| e.windows(16).any(|w| w == b"SLURM_JOB_ID=777"))
    });
    let sim = Sim::new(&scenario(&[
        (leftover.pid(), 0, 0),
        (other_job.pid(), 1, 50),
    ]));
    let doc = sim.json(&["info"]);
    let owner_of =
        |pid: u32| -> Value { crate::util::process_in(&doc, pid).unwrap()["owner"].clone() };
    let owner = owner_of(leftover.pid());
    assert_eq!(owner["kind"], "slurm_job", "{owner}");
    assert_eq!(owner["job_id"], 777);
    assert_eq!(owner["from_environ"], true);
    let table = sim.run(&["info"]);
    assert!(
        table.stdout.contains("slurm 777.0 (env)"),
        "{}",
        table.stdout
    );

    let run = run_script(&sim, "epilog.sh", &[("SLURM_JOB_ID", "777")]);
    assert_eq!(run.code, 0, "{run:?}");
    wait_exited(leftover.pid());
    assert!(alive(other_job.pid()), "another job's process is untouched");
}
