//! GPU jobs under the real slurmd, with packaging/slurm's prolog, epilog and health check
//! and a gpuctl-watchdog, against nvml-sim: what an admin relies on them for.
//!
//! A job registers on the GPUs: its script writes its pid (and its background child's) and
//! the GPU Slurm gave it, then waits for a go; the test lists those pids in the scenario
//! with known amounts of memory, looks, and lets the job end.

use std::path::PathBuf;

use serde_json::Value;

use crate::Mode;
use crate::cluster::{Batch, Tracking, WAIT};
use crate::util::{Gpu, Proc, Process, Scenario, alive, wait_exited, wait_until};

const MIB: u64 = 1 << 20;

/// A process on a GPU, as the scenario lists it.
#[derive(Clone, Copy)]
pub struct OnGpu {
    pub pid: u32,
    pub gpu: u32,
    pub mib: u64,
}

/// A running job, registered on its GPU.
pub struct Job {
    pub id: u64,
    pub gpu: u32,
    pub pid: u32,
    /// Its background child, when it was started with one.
    pub child: Option<u32>,
    /// Made to let the job end.
    go: PathBuf,
}

/// A test that fails mid-way still lets its job end, so the next test finds the node idle.
impl Drop for Job {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.go, "");
    }
}

impl Mode {
    /// Writes the scenario: the GPUs with their device files, `processes`, and memory held
    /// by no process (`leaked`: GPU, MiB).
    pub fn set_scenario(&self, processes: &[OnGpu], leaked: &[(u32, u64)]) {
        let mut scenario = Scenario::new().device_dir(&self.sim.dev_dir());
        for gpu in 0..crate::GPUS as u32 {
            scenario = scenario.gpu(match leaked.iter().find(|(g, _)| *g == gpu) {
                Some((_, mib)) => Gpu::new().leaked(mib * MIB),
                None => Gpu::new(),
            });
        }
        for p in processes {
            scenario = scenario.process(Process::new(p.pid).on(p.gpu).used(p.mib * MIB));
        }
        self.sim.write(&scenario);
    }

    fn jobs_dir(&self) -> PathBuf {
        self.sim.dir.path().join("jobs-ready")
    }

    /// Submits a one-GPU job that registers (its pid, a background child's with `child`)
    /// and waits for [`Mode::go`]; returns once it has registered.
    pub fn start_job(&self, child: bool) -> Job {
        let dir = self.jobs_dir();
        std::fs::create_dir_all(&dir).expect("jobs dir");
        let child_line = if child {
            "sleep 600 &\necho $! > \"$d/$SLURM_JOB_ID.child\"\n"
        } else {
            ""
        };
        let script = format!(
            "#!/bin/sh\nd='{}'\n{child_line}\
             echo \"$$ $CUDA_VISIBLE_DEVICES\" > \"$d/$SLURM_JOB_ID.tmp\"\n\
             mv \"$d/$SLURM_JOB_ID.tmp\" \"$d/$SLURM_JOB_ID.ready\"\n\
             while [ ! -e \"$d/$SLURM_JOB_ID.go\" ]; do sleep 0.1; done\n",
            dir.display()
        );
        let c = &self.cluster;
        let id = c.sbatch(Batch::Script(&script), &["--gres=gpu:1"]);
        let ready = dir.join(format!("{id}.ready"));
        wait_until(WAIT, || ready.exists());
        let text = std::fs::read_to_string(&ready).expect("ready file");
        let mut fields = text.split_whitespace();
        let pid: u32 = fields.next().and_then(|p| p.parse().ok()).expect("job pid");
        let gpu: u32 = fields
            .next()
            .and_then(|g| g.parse().ok())
            .unwrap_or_else(|| panic!("job {id} got no single GPU: {text}"));
        let child = child.then(|| {
            std::fs::read_to_string(dir.join(format!("{id}.child")))
                .ok()
                .and_then(|p| p.trim().parse().ok())
                .expect("child pid")
        });
        Job {
            id,
            gpu,
            pid,
            child,
            go: dir.join(format!("{id}.go")),
        }
    }

    /// Lets the job end, and waits until Slurm has run its epilog.
    pub fn finish(&self, job: &Job) -> String {
        std::fs::write(&job.go, "").expect("go file");
        self.cluster.wait_job_done(job.id, WAIT)
    }

    fn state_dir(&self) -> PathBuf {
        self.sim.dir.path().join("state")
    }

    /// The account lines the epilog wrote for `job`.
    pub fn account(&self, job: u64) -> Value {
        let path = self.state_dir().join("slurm-jobs.jsonl");
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line ({e}): {l}")))
            .filter(|v: &Value| v["job"].as_u64() == Some(job))
            .collect();
        assert_eq!(lines.len(), 1, "one account line for job {job}: {text}");
        lines[0].clone()
    }

    pub fn slurm_log(&self) -> String {
        std::fs::read_to_string(self.state_dir().join("slurm.log")).unwrap_or_default()
    }

    fn health_checks(&self) -> usize {
        std::fs::read_to_string(self.out.join("healthcheck.log"))
            .map(|t| t.lines().count())
            .unwrap_or(0)
    }

    /// The processes `gpuctl info` shows, by pid.
    fn shown(&self, pid: u32) -> Option<Value> {
        let doc = self.sim.json(&["info"]);
        doc["devices"]
            .as_array()?
            .iter()
            .flat_map(|d| d["processes"].as_array().into_iter().flatten())
            .find(|p| p["pid"].as_u64() == Some(u64::from(pid)))
            .cloned()
    }

    fn uuid(&self, gpu: u32) -> String {
        let doc = self.sim.json(&["info"]);
        doc["devices"][gpu as usize]["uuid"]
            .as_str()
            .expect("uuid")
            .to_string()
    }
}

fn assert_idle(mode: &Mode) {
    mode.cluster.wait_node_idle(WAIT);
    let (state, reason) = mode.cluster.node_state();
    assert!(
        !state.contains("DRAIN"),
        "drained: {state} ({reason})\n{}",
        mode.slurm_log()
    );
}

/// A job with a background child on its GPU: `gpuctl info` names the job for both (from
/// the freezer cgroup, or under linuxproc from the environment, marked so); the watchdog
/// records the job's peak; at its end the child is gone (Slurm kills it under
/// proctrack/cgroup; under linuxproc it outlives the job and the epilog ends it), the node
/// stays idle, and the job's account line holds the amounts it held.
pub fn job_is_named_accounted_and_cleaned_up(mode: &Mode) {
    let job = mode.start_job(true);
    let child = job.child.expect("child");
    // The prolog's record of the job's GPUs, while the job runs.
    let recorded = mode
        .state_dir()
        .join(format!("slurm-allocations/{}.json", job.id))
        .exists();
    mode.set_scenario(
        &[
            OnGpu {
                pid: job.pid,
                gpu: job.gpu,
                mib: 1024,
            },
            OnGpu {
                pid: child,
                gpu: job.gpu,
                mib: 2048,
            },
        ],
        &[],
    );
    let env = mode.cluster.tracking() == Tracking::Linuxproc;
    for pid in [job.pid, child] {
        let shown = mode
            .shown(pid)
            .unwrap_or_else(|| panic!("pid {pid} not shown"));
        let owner = &shown["owner"];
        assert_eq!(owner["kind"], "slurm_job", "{shown}");
        assert_eq!(owner["job_id"], job.id, "{shown}");
        assert_eq!(owner["from_environ"], env, "{shown}");
    }
    let table = mode.sim.run(&["info"]);
    // A batch script's environment names its job but no step (SLURM_STEP_ID is srun's).
    let label = if env {
        format!("slurm {} (env)", job.id)
    } else {
        format!("slurm {}.batch", job.id)
    };
    assert!(table.stdout.contains(&label), "{label}: {}", table.stdout);

    // The watchdog has seen the job at its peak (both processes at once).
    let uuid = mode.uuid(job.gpu);
    let peaks = mode.state_dir().join("peaks.json");
    // A job only the environment names is kept as its user's claim, `slurm:JOB@UID`
    // (the jobs here run as root): anyone can set SLURM_JOB_ID.
    let key = if env {
        format!("slurm:{}@0", job.id)
    } else {
        format!("slurm:{}", job.id)
    };
    wait_until(WAIT, || {
        std::fs::read(&peaks)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .is_some_and(|v| v["owners"][&key]["gpus"][&uuid].as_u64() == Some(3072 * MIB))
    });

    assert_eq!(mode.finish(&job), "COMPLETED", "{}", mode.cluster.logs());
    wait_exited(child);
    assert_idle(mode);

    let account = mode.account(job.id);
    assert_eq!(account["schema"], 1, "{account}");
    assert_eq!(account["user"], "root", "{account}");
    assert_eq!(account["node"], mode.cluster.host(), "{account}");
    assert_eq!(account["outcome"], "clean", "{account}");
    assert_eq!(account["peaks_from"], "watchdog", "{account}");
    let gpus = account["gpus"].as_array().expect("gpus");
    assert_eq!(gpus.len(), 1, "{account}");
    assert_eq!(gpus[0]["index"], job.gpu, "{account}");
    assert_eq!(gpus[0]["uuid"], uuid.as_str(), "{account}");
    assert_eq!(gpus[0]["peak_bytes"], 3072 * MIB, "{account}");
    // Under linuxproc the child was the epilog's to end, with its 2 GiB.
    let (ended, reclaimed) = if env { (1, 2048 * MIB) } else { (0, 0) };
    assert_eq!(account["leftovers_ended"], ended, "{account}");
    assert_eq!(account["reclaimed_bytes"], reclaimed, "{account}");
    // The epilog's summary line, and the prolog's record of the job's GPUs removed.
    let log = mode.slurm_log();
    let summary = format!("epilog: job {}: 1 GPU, peak 3.0 GiB on a GPU", job.id);
    assert!(log.contains(&summary), "{summary}: {log}");
    assert!(recorded, "the prolog recorded job {}'s GPUs", job.id);
    let record = mode
        .state_dir()
        .join(format!("slurm-allocations/{}.json", job.id));
    assert!(!record.exists(), "the epilog removed {}", record.display());
    mode.set_scenario(&[], &[]);
}

/// Two jobs at once, one per GPU: the end of the second (its epilog ending its leftover
/// under linuxproc) leaves the first one's processes running and on their GPU.
pub fn a_job_ending_leaves_the_other_gpus_job_alone(mode: &Mode) {
    let first = mode.start_job(false);
    let second = mode.start_job(true);
    assert_ne!(first.gpu, second.gpu, "one GPU each");
    let child = second.child.expect("child");
    let processes = [
        OnGpu {
            pid: first.pid,
            gpu: first.gpu,
            mib: 4096,
        },
        OnGpu {
            pid: second.pid,
            gpu: second.gpu,
            mib: 1024,
        },
        OnGpu {
            pid: child,
            gpu: second.gpu,
            mib: 1024,
        },
    ];
    mode.set_scenario(&processes, &[]);
    assert_eq!(mode.finish(&second), "COMPLETED", "{}", mode.cluster.logs());
    wait_exited(child);
    assert!(alive(first.pid), "the other job's process was ended");
    assert_eq!(
        mode.cluster.job_state(first.id).as_deref(),
        Some("RUNNING"),
        "the other job"
    );
    assert!(
        mode.shown(first.pid).is_some(),
        "the other job left its GPU"
    );
    assert_eq!(mode.account(second.id)["outcome"], "clean");
    assert_eq!(mode.finish(&first), "COMPLETED");
    assert_idle(mode);
    mode.set_scenario(&[], &[]);
}

/// Memory still held on a job's GPU after its epilog (held by no process: leaked in the
/// sim) drains the node with gpuctl's reason naming the GPU; the health check resumes the
/// node once the memory is back, and logs it.
pub fn held_memory_drains_with_the_reason_and_the_health_check_resumes(mode: &Mode) {
    let job = mode.start_job(false);
    mode.set_scenario(
        &[OnGpu {
            pid: job.pid,
            gpu: job.gpu,
            mib: 1024,
        }],
        &[(job.gpu, 6144)],
    );
    mode.finish(&job);
    let uuid = mode.uuid(job.gpu);
    let (state, reason) = mode.cluster.node_state();
    assert!(state.contains("DRAIN"), "{state} ({reason})");
    let want = format!("gpuctl: GPU {} ({uuid}): ", job.gpu);
    assert!(
        reason.starts_with(&want) && reason.ends_with("held by no listed process"),
        "reason {reason:?}, wanted {want}… held by no listed process"
    );
    let account = mode.account(job.id);
    assert_eq!(account["outcome"], "drained", "{account}");
    assert_eq!(account["reason"], reason.as_str(), "{account}");

    // Still held at the next health check: the node stays drained.
    let checks = mode.health_checks();
    wait_until(WAIT, || mode.health_checks() > checks);
    assert!(mode.cluster.node_state().0.contains("DRAIN"));

    mode.set_scenario(&[], &[]);
    assert_idle(mode);
    let log = mode.slurm_log();
    assert!(
        log.contains(&format!(
            "resumed {}: its GPUs are free",
            mode.cluster.host()
        )),
        "{log}"
    );
}

/// A node an admin drained stays drained, however free its GPUs, through health checks.
pub fn an_admins_drain_is_never_resumed(mode: &Mode) {
    let c = &mode.cluster;
    let node = format!("nodename={}", c.host());
    let out = c.scontrol(&[
        "update",
        &node,
        "state=drain",
        "reason=PSU swap, ticket 4411",
    ]);
    assert!(out.status.success());
    let checks = mode.health_checks();
    wait_until(WAIT, || mode.health_checks() >= checks + 2);
    let (state, reason) = c.node_state();
    assert!(state.contains("DRAIN"), "{state}");
    assert_eq!(reason, "PSU swap, ticket 4411");
    let out = c.scontrol(&["update", &node, "state=resume"]);
    assert!(out.status.success());
    assert_idle(mode);
}

/// A crashed run's leftover (a zombie leader holding memory) on the GPU a job is given is
/// ended by the prolog before the job starts; a process on the other GPU is not touched.
pub fn the_prolog_clears_a_leftover_on_the_jobs_gpu(mode: &Mode) {
    let leftover = Proc::spawn("zombie-leader", "python3", &["train.py"]);
    leftover.wait_for_state('Z');
    let other = Proc::sleeper("python3", &["serve.py"]);
    // Slurm gives the lowest free GPU: 0, where the leftover is.
    mode.set_scenario(
        &[
            OnGpu {
                pid: leftover.pid(),
                gpu: 0,
                mib: 4096,
            },
            OnGpu {
                pid: other.pid(),
                gpu: 1,
                mib: 1024,
            },
        ],
        &[],
    );
    let job = mode.start_job(false);
    assert_eq!(job.gpu, 0);
    // Ended before the job's script ran (the prolog runs at allocation, and waits).
    let log = mode.slurm_log();
    assert!(
        log.contains(&format!(
            "job {}: ended 1 leftover of earlier runs on GPU 0",
            job.id
        )),
        "{log}"
    );
    wait_exited(leftover.pid());
    assert!(alive(other.pid()), "a process on another GPU was ended");
    mode.finish(&job);
    mode.set_scenario(&[], &[]);
    assert_idle(mode);
}
