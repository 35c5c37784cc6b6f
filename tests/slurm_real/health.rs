//! GPU health under the real slurmd: the health check drains the node for a GPU that needs
//! a reset, with the reason naming the GPU, the action and the cause, and resumes it by
//! itself once the GPU is healthy again; an application Xid never drains, and the epilog
//! names the job it hit in slurm.log.

use crate::Mode;
use crate::cluster::WAIT;
use crate::util::{Gpu, Proc, Process, Scenario, wait_until};

const MIB: u64 = 1 << 20;

/// The node's GPUs, GPU 1 as given.
fn scenario(mode: &Mode, gpu1: Gpu) -> Scenario {
    (0..crate::GPUS as u32).fold(Scenario::new().device_dir(&mode.sim.dev_dir()), |s, gpu| {
        s.gpu(if gpu == 1 { gpu1.clone() } else { Gpu::new() })
    })
}

pub fn an_unhealthy_gpu_drains_the_node_and_its_recovery_resumes_it(mode: &Mode) {
    let c = &mode.cluster;
    mode.sim
        .write(&scenario(mode, Gpu::new().remapped_rows(0, 1, true, false)));
    wait_until(WAIT, || c.node_state().0.contains("DRAIN"));
    let (_, reason) = c.node_state();
    assert_eq!(reason, "gpuctl: GPU 1 needs a reset: row remap pending");
    let log = mode.slurm_log();
    assert!(
        log.contains(&format!(
            "drained {}: gpuctl: GPU 1 needs a reset: row remap pending",
            c.host()
        )),
        "{log}"
    );
    // After the reset: nothing pending. The health check resumes the node by itself.
    mode.sim.write(&scenario(
        mode,
        Gpu::new().remapped_rows(0, 1, false, false),
    ));
    wait_until(WAIT, || !c.node_state().0.contains("DRAIN"));
    let log = mode.slurm_log();
    assert!(
        log.contains(&format!(
            "resumed {}: every GPU is healthy again (drained for: gpuctl: GPU 1 needs a reset",
            c.host()
        )),
        "{log}"
    );
    mode.set_scenario(&[], &[]);
    c.wait_node_idle(WAIT);
}

pub fn an_app_xid_never_drains_and_the_epilog_names_the_job(mode: &Mode) {
    let c = &mode.cluster;
    let job = mode.start_job(false);
    let mut on_gpu = Scenario::new().device_dir(&mode.sim.dev_dir());
    for _ in 0..crate::GPUS {
        on_gpu = on_gpu.gpu(Gpu::new());
    }
    let on_gpu = on_gpu
        .process(Process::new(job.pid).on(job.gpu).used(1024 * MIB))
        .xid(job.gpu, 13, Some(job.pid));
    mode.sim.write(&on_gpu);
    // The watchdog records the Xid with the job's process.
    let xid_log = mode.sim.dir.path().join("state/health.json");
    wait_until(WAIT, || {
        std::fs::read_to_string(&xid_log)
            .is_ok_and(|t| t.contains(&format!("\"pid\": {}", job.pid)))
    });
    // restart_app: the GPU is fit, the node is not drained.
    let checks = || {
        std::fs::read_to_string(mode.out.join("healthcheck.log"))
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    let before = checks();
    wait_until(WAIT, || checks() >= before + 2);
    assert!(!c.node_state().0.contains("DRAIN"), "{:?}", c.node_state());
    mode.finish(&job);
    let log = mode.slurm_log();
    assert!(
        log.contains(&format!(
            "job {}: Xid 13 (Graphics Engine Exception) on GPU {} hit pid {}",
            job.id, job.gpu, job.pid
        )),
        "{log}"
    );
    mode.set_scenario(&[], &[]);
    c.wait_node_idle(WAIT);
}

/// Another user sets the job's id in her own environment and runs on the job's GPU, where
/// two application Xids come, the kernel naming her process for one and the job's for the
/// other: the watchdog records each with its culprit, and the epilog's line in slurm.log names
/// the job's process only. (Her process leaves the GPU before the job ends, so that the
/// epilog finds the GPU free.)
pub fn another_users_claim_on_the_job_is_not_in_its_xid_lines(mode: &Mode) {
    let c = &mode.cluster;
    let job = mode.start_job(false);
    let id = job.id.to_string();
    let mallory = Proc::spawn_as_with_env(1001, "sleep", &["attack.py"], &[("SLURM_JOB_ID", &id)]);
    let gpus = |scenario: Scenario| (0..crate::GPUS).fold(scenario, |s, _| s.gpu(Gpu::new()));
    let ours = Process::new(job.pid).on(job.gpu).used(1024 * MIB);
    let both = gpus(Scenario::new().device_dir(&mode.sim.dev_dir()))
        .process(ours.clone())
        .process(Process::new(mallory.pid()).on(job.gpu).used(512 * MIB))
        .xid(job.gpu, 13, Some(mallory.pid()))
        .xid(job.gpu, 13, Some(job.pid));
    mode.sim.write(&both);
    let xid_log = mode.sim.dir.path().join("state/health.json");
    wait_until(WAIT, || {
        std::fs::read_to_string(&xid_log).is_ok_and(|t| {
            t.contains(&format!("\"pid\": {}", job.pid))
                && t.contains(&format!("\"pid\": {}", mallory.pid()))
        })
    });
    mode.sim
        .write(&gpus(Scenario::new().device_dir(&mode.sim.dev_dir())).process(ours));
    mode.finish(&job);
    let log = mode.slurm_log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(&format!("job {}: Xid 13", job.id)))
        .collect();
    assert!(!lines.is_empty(), "no Xid line for job {}: {log}", job.id);
    assert!(
        lines
            .iter()
            .any(|l| l.contains(&format!("hit pid {} (", job.pid))),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .all(|l| !l.contains(&format!("pid {}", mallory.pid()))),
        "{lines:?}"
    );
    drop(mallory);
    mode.set_scenario(&[], &[]);
    c.wait_node_idle(WAIT);
}
