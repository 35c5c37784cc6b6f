//! Every command is bounded by its deadlines, whatever the GPUs do (hostile users, round
//! four, item 7): a GPU that answers each NVML call only after 4 s, a pid handed to a new
//! process while `kill` waits on it, and the machine busy. `kill` must return within the NVML
//! deadline plus its `--timeout` plus a margin, every time.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::{GIB, Gpu, PidReuser, Proc, Process, Scenario, Sim, wait_until_listed_by};

/// Busy loops, one per CPU and one more, ended (by pid) on drop.
struct Load(Vec<Child>);

impl Load {
    fn start() -> Load {
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        Load(
            (0..=cpus)
                .map(|_| {
                    Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .stdin(Stdio::null())
                        .spawn()
                        .expect("start a busy loop")
                })
                .collect(),
        )
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The NVML deadline of the runs below.
const NVML_TIMEOUT: Duration = Duration::from_secs(8);
/// Their `--timeout`.
const KILL_TIMEOUT: Duration = Duration::from_secs(2);
/// What start-up, /proc reads and the report may add on a loaded machine (debug build).
const MARGIN: Duration = Duration::from_secs(6);

#[test]
fn kill_on_a_slow_gpu_with_a_reused_pid_returns_within_its_deadlines_every_time() {
    let _load = Load::start();
    let bound = NVML_TIMEOUT + KILL_TIMEOUT + MARGIN;
    let mut walls = Vec::new();
    for run in 0..20 {
        let mut a = Proc::sleeper("python3", &["train.py"]);
        let b = Proc::sleeper("python3", &["eval.py"]);
        let sim = Sim::new(
            &Scenario::new()
                .gpu(Gpu::h200())
                .gpu(Gpu::h200().hang(Duration::from_secs(4)))
                .process(Process::new(a.pid()).on(0).used(GIB))
                .process(Process::new(b.pid()).on(0).used(2 * GIB)),
        );
        let (pid_a, pid_b) = (a.pid().to_string(), b.pid().to_string());
        let started = Instant::now();
        let mut child = sim
            .gpuctl(&[
                "kill",
                "--pid",
                &pid_a,
                "--pid",
                &pid_b,
                "--yes",
                "--timeout",
                "2s",
                "--json",
            ])
            .env("GPUCTL_NVML_TIMEOUT", "8s")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run gpuctl kill");
        // While the snapshot waits on GPU 1, A exits and a new process takes its pid.
        wait_until_listed_by(child.id(), a.pid());
        let pid = a.pid();
        a.kill();
        let reuser = PidReuser::spawn(pid, "sleep", "python3");
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait for gpuctl") {
                break Some(status);
            }
            if started.elapsed() > bound + Duration::from_secs(20) {
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let wall = started.elapsed();
        if status.is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        walls.push(wall);
        assert!(
            wall <= bound,
            "run {run}: kill took {wall:?} (still running: {}), over the bound of {bound:?} \
             (NVML deadline {NVML_TIMEOUT:?} + --timeout {KILL_TIMEOUT:?} + {MARGIN:?}); \
             the runs so far: {walls:?}",
            status.is_none()
        );
        drop(reuser);
        drop(b);
    }
    eprintln!("kill wall times: {walls:?}");
}
