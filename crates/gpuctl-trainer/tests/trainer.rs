//! End-to-end tests of the gpuctl-trainer binary on the CPU: OOM recovery that changes
//! nothing learned, resume, the micro-batch-1 failure, startup cleanup of a crashed run's
//! leftovers registered in nvml-sim, and the run's life with real signals.

use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn trainer_bin() -> &'static str {
    env!("CARGO_BIN_EXE_gpuctl-trainer")
}

/// nvml-sim, built by `cargo build --workspace` (scripts/test) next to this test binary.
fn sim_lib() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let lib = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps")
        .join("libnvml_sim.so");
    assert!(
        lib.exists(),
        "{} is not built: run `cargo build --workspace` first (scripts/test does)",
        lib.display()
    );
    lib
}

/// A small, quick model; every test adds its own options.
const SMALL: &[&str] = &[
    "--device",
    "cpu",
    "--layers",
    "2",
    "--width",
    "32",
    "--heads",
    "4",
    "--vocab-size",
    "64",
    "--max-length",
    "16",
    "--dataset-size",
    "256",
    "--threads",
    "1",
];

struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    /// With a one-GPU nvml-sim scenario and no processes (tests replace it).
    fn new() -> Scratch {
        let scratch = Scratch {
            dir: tempfile::tempdir().expect("tempdir"),
        };
        // The configuration GPUCTL_CONFIG names must exist: empty, the built-in policy.
        std::fs::write(scratch.path("gpuctl.toml"), "").expect("configuration");
        std::fs::write(
            scratch.path("scenario.toml"),
            "driver_version = \"570.133.20\"\ncuda_driver_version = 12080\n\n[[gpu]]\nname = \"NVIDIA H200\"\n",
        )
        .expect("scenario");
        scratch
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The trainer with the small model, its run files and NVML (none, or nvml-sim with a
    /// scenario the test writes) kept in this scratch directory.
    fn trainer(&self, args: &[&str]) -> Command {
        let mut command = Command::new(trainer_bin());
        command
            .args(SMALL)
            .args(args)
            .env("XDG_RUNTIME_DIR", self.path("runtime"))
            .env("GPUCTL_CONFIG", self.path("gpuctl.toml"))
            .env("GPUCTL_NVML_LIB", sim_lib())
            .env("NVML_SIM_SCENARIO", self.path("scenario.toml"))
            .env("NVML_SIM_STATE", self.path("sim-state.json"))
            .stdin(Stdio::null());
        std::fs::create_dir_all(self.path("runtime")).expect("runtime dir");
        command
    }

    fn run(&self, args: &[&str]) -> Finished {
        Finished::from(self.trainer(args).output().expect("run gpuctl-trainer"))
    }
}

#[derive(Debug)]
struct Finished {
    code: i32,
    stdout: String,
    stderr: String,
}

impl From<Output> for Finished {
    fn from(output: Output) -> Finished {
        Finished {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

impl Finished {
    fn summary(&self) -> Value {
        assert_eq!(self.code, 0, "the trainer failed: {}", self.stderr);
        let line = self.stdout.lines().last().unwrap_or("");
        serde_json::from_str(line).unwrap_or_else(|e| panic!("summary ({e}): {}", self.stdout))
    }
}

/// The float32 tensors of a safetensors file, by name.
fn read_safetensors(path: &Path) -> HashMap<String, Vec<f32>> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + header_len]).expect("header");
    let data = &bytes[8 + header_len..];
    let mut tensors = HashMap::new();
    for (name, info) in header.as_object().expect("header object") {
        if name == "__metadata__" {
            continue;
        }
        assert_eq!(info["dtype"], "F32", "{name}");
        let start = info["data_offsets"][0].as_u64().unwrap() as usize;
        let end = info["data_offsets"][1].as_u64().unwrap() as usize;
        let values = data[start..end]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        tensors.insert(name.clone(), values);
    }
    tensors
}

fn latest_model(checkpoint: &Path) -> HashMap<String, Vec<f32>> {
    let latest = std::fs::read_to_string(checkpoint.join("latest")).expect("latest");
    read_safetensors(&checkpoint.join(latest.trim()).join("model.safetensors"))
}

/// ‖a − b‖ / ‖b‖ over all parameters.
fn relative_difference(a: &HashMap<String, Vec<f32>>, b: &HashMap<String, Vec<f32>>) -> f64 {
    assert_eq!(a.len(), b.len());
    let (mut diff, mut norm) = (0f64, 0f64);
    for (name, values) in b {
        let other = &a[name];
        assert_eq!(other.len(), values.len(), "{name}");
        for (x, y) in other.iter().zip(values) {
            diff += (f64::from(*x) - f64::from(*y)).powi(2);
            norm += f64::from(*y).powi(2);
        }
    }
    (diff / norm).sqrt()
}

#[test]
fn injected_oom_recovery_learns_what_an_unconstrained_run_learns() {
    let scratch = Scratch::new();
    let (plain, recovered) = (scratch.path("plain"), scratch.path("recovered"));
    let common = ["--batch-size", "16", "--steps", "6"];
    let reference = scratch.run(
        &[
            &common[..],
            &["--micro-batch", "16", "--checkpoint"],
            &[plain.to_str().unwrap()],
        ]
        .concat(),
    );
    let reference = reference.summary();
    assert_eq!(reference["oom_recoveries"], 0);
    assert_eq!(reference["grad_accum"], 1);

    let trace = scratch.path("trace.csv");
    let plot = scratch.path("memory.png");
    let run = scratch.run(
        &[
            &common[..],
            &[
                "--inject-oom-above",
                "4",
                "--checkpoint",
                recovered.to_str().unwrap(),
            ],
            &["--memory-trace", trace.to_str().unwrap()],
            &["--memory-plot", plot.to_str().unwrap()],
        ]
        .concat(),
    );
    let summary = run.summary();
    // 16 fails, 8 fails, 4 fits: two recoveries, and the step is redone on the same samples.
    assert_eq!(summary["oom_recoveries"], 2, "{}", run.stderr);
    assert_eq!(summary["micro_batch"], 4);
    assert_eq!(summary["grad_accum"], 4);
    assert_eq!(summary["samples_seen"], 96);
    assert_eq!(summary["steps"], 6);
    assert_eq!(
        run.stderr.matches("out of memory at step 0").count(),
        2,
        "each recovery is logged: {}",
        run.stderr
    );
    assert!(
        run.stderr
            .contains("redoing the step with micro-batch 4 x 4"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("memory: allocated"),
        "recoveries log memory figures: {}",
        run.stderr
    );

    let difference = relative_difference(&latest_model(&recovered), &latest_model(&plain));
    assert!(difference < 1e-5, "parameters differ by {difference:e}");
    let loss = |s: &Value| s["final_loss"].as_f64().unwrap();
    assert!((loss(&summary) - loss(&reference)).abs() < 1e-4);

    // The trace has a row after each micro-step's forward and backward, the OOMs and the
    // optimizer steps; the plot is a PNG.
    let csv = std::fs::read_to_string(&trace).expect("trace");
    let header = csv.lines().next().unwrap();
    assert!(
        header.starts_with("step,micro_step,grad_accum,micro_batch,event,"),
        "{header}"
    );
    assert_eq!(csv.lines().filter(|l| l.contains(",oom,")).count(), 2);
    assert_eq!(
        csv.lines()
            .filter(|l| l.contains(",optimizer_step,"))
            .count(),
        6
    );
    assert_eq!(
        csv.lines().filter(|l| l.contains(",backward,")).count(),
        6 * 4
    );
    // The sawtooth of accumulation: each micro-step's activations are alive after its forward
    // and gone after its backward.
    let column = header
        .split(',')
        .position(|c| c == "host_allocated_bytes")
        .expect("column");
    let rows: Vec<Vec<&str>> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    for pair in rows.windows(2) {
        if pair[0][4] == "forward" && pair[1][4] == "backward" {
            let bytes = |row: &Vec<&str>| row[column].parse::<u64>().unwrap();
            assert!(bytes(&pair[0]) > bytes(&pair[1]), "{pair:?}");
        }
    }
    assert_eq!(summary["peak_memory_source"], "host_allocated");
    let png = std::fs::read(&plot).expect("plot");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
}

#[test]
fn a_resumed_run_continues_as_if_uninterrupted() {
    let scratch = Scratch::new();
    let (straight, split) = (scratch.path("straight"), scratch.path("split"));
    let common = ["--batch-size", "8", "--micro-batch", "4", "--workers", "2"];
    let whole = scratch
        .run(
            &[
                &common[..],
                &["--steps", "8", "--checkpoint", straight.to_str().unwrap()],
            ]
            .concat(),
        )
        .summary();

    let first = scratch
        .run(
            &[
                &common[..],
                &["--steps", "3", "--checkpoint", split.to_str().unwrap()],
            ]
            .concat(),
        )
        .summary();
    assert_eq!(first["steps"], 3);
    let run = scratch.run(
        &[
            &common[..],
            &[
                "--steps",
                "8",
                "--resume",
                "--checkpoint",
                split.to_str().unwrap(),
            ],
        ]
        .concat(),
    );
    let resumed = run.summary();
    assert!(run.stderr.contains("resumed from"), "{}", run.stderr);
    assert_eq!(resumed["steps"], 8);
    assert_eq!(resumed["steps_this_run"], 5);
    assert_eq!(resumed["samples_seen"], 64);
    assert_eq!(resumed["final_loss"], whole["final_loss"]);
    assert_eq!(resumed["param_checksum"], whole["param_checksum"]);
    assert_eq!(
        relative_difference(&latest_model(&split), &latest_model(&straight)),
        0.0
    );
    // Only the newest two checkpoints are kept.
    let mut kept: Vec<String> = std::fs::read_dir(&split)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("step-"))
        .collect();
    kept.sort();
    assert_eq!(kept, ["step-00000003", "step-00000008"]);

    // A checkpoint of another model is refused, not loaded.
    let other = scratch.run(&[
        "--steps",
        "9",
        "--width",
        "64",
        "--resume",
        "--checkpoint",
        split.to_str().unwrap(),
    ]);
    assert_eq!(other.code, 2, "{}", other.stderr);
    assert!(
        other.stderr.contains("was written by a different run"),
        "{}",
        other.stderr
    );
}

#[test]
fn oom_at_micro_batch_one_fails_clearly_and_keeps_the_checkpoint() {
    let scratch = Scratch::new();
    let dir = scratch.path("ck");
    let dir = dir.to_str().unwrap();
    scratch
        .run(&["--batch-size", "4", "--steps", "2", "--checkpoint", dir])
        .summary();
    let before = latest_model(Path::new(dir));

    let run = scratch.run(&[
        "--batch-size",
        "4",
        "--steps",
        "4",
        "--resume",
        "--checkpoint",
        dir,
        "--inject-oom-above",
        "0",
    ]);
    assert_eq!(run.code, 5, "{}", run.stderr);
    let last = run.stderr.lines().last().unwrap();
    assert!(
        last.starts_with("gpuctl-trainer: out of memory at step 2 even with micro-batch 1"),
        "{last}"
    );
    for needle in [
        "--precision bf16",
        "--max-length (now 16)",
        "--width 32",
        "logits alone take",
        "last checkpoint is intact",
    ] {
        assert!(last.contains(needle), "{needle:?} missing: {last}");
    }
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    assert!(
        run.stdout.is_empty(),
        "no summary on failure: {}",
        run.stdout
    );
    assert_eq!(
        std::fs::read_to_string(Path::new(dir).join("latest"))
            .unwrap()
            .trim(),
        "step-00000002"
    );
    assert_eq!(latest_model(Path::new(dir)), before);
}

/// A process of the test's, standing in for a crashed run's worker.
struct Leftover {
    child: Child,
}

impl Leftover {
    fn spawn() -> Leftover {
        let child = Command::new("sleep")
            .arg("300")
            .spawn()
            .expect("spawn sleep");
        Leftover { child }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it still runs (a zombie, killed and not yet reaped, does not).
    fn running(&self) -> bool {
        alive(u64::from(self.pid()))
    }
}

impl Drop for Leftover {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let rest = stat.rsplit_once(") ").expect("comm").1;
    rest.split(' ')
        .nth(19)
        .expect("starttime")
        .parse()
        .expect("ticks")
}

fn recorded(pid: u32, ticks: u64, role: &str) -> Value {
    serde_json::json!({"pid": pid, "start_ticks": ticks, "role": role})
}

#[test]
fn startup_cleanup_reclaims_a_crashed_runs_leftovers_and_nothing_else() {
    let scratch = Scratch::new();
    let (gpu_a, gpu_b, off_gpu) = (Leftover::spawn(), Leftover::spawn(), Leftover::spawn());
    let reused = Leftover::spawn();
    let bystander = Leftover::spawn();
    // The crashed trainer itself is gone.
    let mut dead = Command::new("sleep").arg("300").spawn().unwrap();
    let (dead_pid, dead_ticks) = (dead.id(), start_ticks(dead.id()));
    dead.kill().unwrap();
    dead.wait().unwrap();

    std::fs::write(
        scratch.path("scenario.toml"),
        format!(
            "driver_version = \"570.133.20\"\ncuda_driver_version = 12080\n\n[[gpu]]\nname = \"NVIDIA H200\"\n\n\
             [[process]]\npid = {}\ngpu = 0\nused_mib = 3072\n\n\
             [[process]]\npid = {}\ngpu = 0\nused_mib = 1024\n\n\
             [[process]]\npid = {}\ngpu = 0\nused_mib = 2048\n\n\
             [[process]]\npid = {}\ngpu = 0\nused_mib = 512\n",
            gpu_a.pid(),
            gpu_b.pid(),
            reused.pid(),
            bystander.pid()
        ),
    )
    .unwrap();
    let checkpoint = scratch.path("ck");
    std::fs::create_dir_all(&checkpoint).unwrap();
    let record = serde_json::json!({
        "version": 1,
        "name": "job",
        "device": "cuda:0",
        "processes": [
            recorded(dead_pid, dead_ticks, "trainer"),
            recorded(gpu_a.pid(), start_ticks(gpu_a.pid()), "worker"),
            recorded(gpu_b.pid(), start_ticks(gpu_b.pid()), "worker"),
            recorded(off_gpu.pid(), start_ticks(off_gpu.pid()), "worker"),
            // The pid now names another process (another start time): not the run's.
            recorded(reused.pid(), start_ticks(reused.pid()) + 1, "worker"),
        ],
    });
    std::fs::write(checkpoint.join("job.run.json"), record.to_string()).unwrap();

    let run = scratch.run(&[
        "--run-name",
        "job",
        "--steps",
        "2",
        "--batch-size",
        "4",
        "--checkpoint",
        checkpoint.to_str().unwrap(),
    ]);
    let summary = run.summary();
    assert_eq!(summary["steps"], 2);
    assert!(
        run.stderr.contains("crashed and left 3 processes alive"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains(&format!(
            "pid {} held 3.00 GiB on GPU 0: ended (SIGTERM)",
            gpu_a.pid()
        )),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains(&format!(
            "pid {} held 1.00 GiB on GPU 0: ended",
            gpu_b.pid()
        )),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains(&format!(
            "pid {} (worker), not on a GPU: ended by SIGTERM",
            off_gpu.pid()
        )),
        "{}",
        run.stderr
    );
    assert!(!gpu_a.running() && !gpu_b.running() && !off_gpu.running());
    assert!(reused.running(), "a reused pid is not the run's");
    assert!(
        bystander.running(),
        "another job's process is never touched"
    );
    // A clean end leaves no run file for the next run to clean up.
    assert!(!checkpoint.join("job.run.json").exists());
}

fn read_run_file(path: &Path) -> Option<Value> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    done()
}

fn alive(pid: u64) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next());
    !matches!(state, None | Some('Z') | Some('X'))
}

/// Starts a long run and waits until its run file lists its workers.
fn start_long_run(scratch: &Scratch, name: &str, extra: &[&str]) -> (Child, Vec<u64>) {
    let child = scratch
        .trainer(
            &[
                &[
                    "--run-name",
                    name,
                    "--steps",
                    "100000",
                    "--batch-size",
                    "4",
                    "--workers",
                    "2",
                ],
                extra,
            ]
            .concat(),
        )
        // In its own process group, as a job started from a shell or by Slurm is.
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start trainer");
    // With --checkpoint DIR the run file is in DIR.
    let dir = match extra.iter().position(|a| *a == "--checkpoint") {
        Some(at) => PathBuf::from(extra[at + 1]),
        None => scratch.path("runtime").join("gpuctl-trainer"),
    };
    let run_file = dir.join(format!("{name}.run.json"));
    let mut workers = Vec::new();
    assert!(
        wait_until(Duration::from_secs(30), || {
            let Some(record) = read_run_file(&run_file) else {
                return false;
            };
            workers = record["processes"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|p| p["role"] == "worker")
                .map(|p| p["pid"].as_u64().unwrap())
                .collect();
            workers.len() == 2
        }),
        "the run file never listed two workers"
    );
    (child, workers)
}

#[test]
fn a_live_run_keeps_its_name_and_stops_cleanly_on_sigterm() {
    let scratch = Scratch::new();
    let checkpoint = scratch.path("ck");
    let (child, workers) = start_long_run(&scratch, "live", &["--checkpoint-every", "0"]);
    let trainer_pid = child.id();

    // A second run of the same name must not start, and must not touch the first.
    let second = scratch.run(&["--run-name", "live", "--steps", "2"]);
    assert_eq!(second.code, 1, "{}", second.stderr);
    assert!(
        second.stderr.contains("is already running"),
        "{}",
        second.stderr
    );
    assert!(
        second
            .stderr
            .contains("or give this run another --run-name"),
        "{}",
        second.stderr
    );
    assert!(
        second.stderr.contains(&format!("as pid {trainer_pid}")),
        "{}",
        second.stderr
    );
    assert!(alive(u64::from(trainer_pid)) && workers.iter().all(|&w| alive(w)));

    // SIGTERM (Slurm's and systemd's stop): finish the step, checkpoint, exit 143.
    let _ = checkpoint;
    // SAFETY: kill(2) takes no pointers; the pid is our child, not yet reaped.
    unsafe { libc::kill(trainer_pid as i32, libc::SIGTERM) };
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(143), "{stderr}");
    assert!(stderr.contains("SIGTERM: stopping after step"), "{stderr}");
    let summary: Value =
        serde_json::from_str(String::from_utf8_lossy(&output.stdout).trim()).unwrap();
    assert_eq!(summary["stopped_by"], "SIGTERM");
    assert!(wait_until(Duration::from_secs(5), || workers
        .iter()
        .all(|&w| !alive(w))));
}

#[test]
fn workers_exit_when_the_trainer_is_killed_and_the_next_run_starts_clean() {
    let scratch = Scratch::new();
    let (mut child, workers) = start_long_run(&scratch, "crashy", &[]);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || workers
            .iter()
            .all(|&w| !alive(w))),
        "workers outlived their trainer"
    );
    let run = scratch.run(&["--run-name", "crashy", "--steps", "2", "--batch-size", "4"]);
    run.summary();
    assert!(
        run.stderr
            .contains("did not finish cleanly; none of its 3 processes is left"),
        "{}",
        run.stderr
    );
}

#[test]
fn bad_input_gets_one_line_and_a_documented_status() {
    let scratch = Scratch::new();
    for (args, code, needle) in [
        (
            &["--micro-batch", "0"][..],
            2,
            "neither a positive number nor `auto`",
        ),
        (
            &["--width", "30"][..],
            2,
            "--width 30 is not a multiple of --heads 4",
        ),
        (
            &["--precision", "bf16"][..],
            2,
            "--precision bf16 is autocast on CUDA",
        ),
        (
            &["--memory-fraction", "0.5"][..],
            2,
            "caps the CUDA caching allocator, and --device cpu",
        ),
        (&["--memory-fraction", "2"][..], 2, "--memory-fraction"),
        (&["--device", "tpu"][..], 2, "expected cpu, cuda or cuda:N"),
        (&["--run-name", "../x"][..], 2, "run name \"../x\""),
        (&["--batch-size", "512"][..], 2, "smaller than one batch"),
        (&["--resume"][..], 2, "--checkpoint"),
    ] {
        let run = scratch.run(args);
        assert_eq!(run.code, code, "{args:?}: {}", run.stderr);
        assert_eq!(run.stderr.lines().count(), 1, "{args:?}: {}", run.stderr);
        assert!(
            run.stderr.starts_with("gpuctl-trainer: "),
            "{args:?}: {}",
            run.stderr
        );
        assert!(
            run.stderr.contains(needle),
            "{args:?}: {needle:?} not in {}",
            run.stderr
        );
    }
}

#[test]
fn cuda_on_a_machine_without_it_is_status_3() {
    let scratch = Scratch::new();
    let mut command = scratch.trainer(&["--steps", "1"]);
    // SMALL asks for cpu; a later --device wins.
    command.args(["--device", "cuda:0"]);
    let run = Finished::from(command.output().unwrap());
    if run.code == 0 {
        eprintln!("skipped: this machine has CUDA");
        return;
    }
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert!(run.stderr.contains("--device cuda:0: "), "{}", run.stderr);
}

#[test]
fn a_stop_sent_to_the_whole_job_ends_it_after_a_checkpoint() {
    // Ctrl-C reaches the foreground group; scancel and systemd's stop send SIGTERM to every
    // process of the job. Either way the workers get it too.
    for (signal, code, name) in [
        (libc::SIGINT, 130, "SIGINT"),
        (libc::SIGTERM, 143, "SIGTERM"),
    ] {
        let scratch = Scratch::new();
        let checkpoint = scratch.path("ck");
        let (child, workers) = start_long_run(
            &scratch,
            "group",
            &[
                "--checkpoint",
                checkpoint.to_str().unwrap(),
                "--checkpoint-every",
                "5",
            ],
        );
        // Some steps done (a checkpoint written), then the stop.
        assert!(wait_until(Duration::from_secs(30), || checkpoint
            .join("latest")
            .exists()));
        // SAFETY: killpg(2) takes no pointers; the group is our child's, which leads it.
        unsafe { libc::killpg(child.id() as i32, signal) };
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(code), "{name}: {stderr}");
        assert!(
            !stderr.contains("stopped sending batches"),
            "{name}: {stderr}"
        );
        let summary: Value =
            serde_json::from_str(String::from_utf8_lossy(&output.stdout).trim()).unwrap();
        assert_eq!(summary["stopped_by"], name);
        let steps = summary["steps"].as_u64().unwrap();
        let latest = std::fs::read_to_string(checkpoint.join("latest"))
            .unwrap_or_else(|e| panic!("{name}: no checkpoint ({e}): {stderr}"));
        assert_eq!(
            latest.trim(),
            format!("step-{steps:08}"),
            "{name}: {stderr}"
        );
        assert!(wait_until(Duration::from_secs(5), || workers
            .iter()
            .all(|&w| !alive(w))));
    }
}

#[test]
fn a_run_file_cannot_point_startup_cleanup_at_someone_else() {
    let scratch = Scratch::new();
    let checkpoint = scratch.path("ck");
    std::fs::create_dir_all(&checkpoint).unwrap();
    let run_file = checkpoint.join("job.run.json");
    let mine = Leftover::spawn();
    let write = |processes: Vec<Value>| {
        let record = serde_json::json!({"version": 1, "name": "job", "device": "cpu", "processes": processes});
        std::fs::write(&run_file, record.to_string()).unwrap();
    };
    let args = [
        "--run-name",
        "job",
        "--steps",
        "1",
        "--batch-size",
        "4",
        "--checkpoint",
        checkpoint.to_str().unwrap(),
    ];

    // A run file others may write (a shared checkpoint directory) is not acted on.
    write(vec![recorded(
        mine.pid(),
        start_ticks(mine.pid()),
        "worker",
    )]);
    std::fs::set_permissions(
        &run_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o666),
    )
    .unwrap();
    let run = scratch.run(&args);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr.contains("refusing to act on it"),
        "{}",
        run.stderr
    );
    assert!(mine.running());

    // Another user's process listed in it is not signalled, whoever runs the trainer.
    // SAFETY: geteuid(2) has no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped the other-user half: it needs root to start a process as another user");
        return;
    }
    let theirs = Command::new("sleep")
        .arg("300")
        .uid(65534)
        .gid(65534)
        .spawn()
        .unwrap();
    let theirs = Leftover { child: theirs };
    std::fs::remove_file(&run_file).unwrap();
    write(vec![recorded(
        theirs.pid(),
        start_ticks(theirs.pid()),
        "worker",
    )]);
    let run = scratch.run(&args);
    assert_eq!(run.code, 4, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("belongs to another user: not signalled"),
        "{}",
        run.stderr
    );
    assert!(theirs.running());
}

#[test]
fn startup_cleanup_spares_a_protected_leftover_that_is_on_no_gpu() {
    let scratch = Scratch::new();
    let checkpoint = scratch.path("ck");
    std::fs::create_dir_all(&checkpoint).unwrap();
    // A leftover NVML does not list (the scenario has no processes), in the run file.
    let leftover = Leftover::spawn();
    let record = serde_json::json!({
        "version": 1,
        "name": "job",
        "device": "cpu",
        "processes": [recorded(leftover.pid(), start_ticks(leftover.pid()), "worker")],
    });
    std::fs::write(checkpoint.join("job.run.json"), record.to_string()).unwrap();
    let args = [
        "--run-name",
        "job",
        "--steps",
        "1",
        "--batch-size",
        "4",
        "--checkpoint",
        checkpoint.to_str().unwrap(),
    ];
    let me = Command::new("id").arg("-un").output().unwrap();
    let me = String::from_utf8(me.stdout).unwrap().trim().to_string();

    // The guard of `gpuctl clear` decides for it as for a GPU process: a protected user's
    // process, and a protected program (sleep is root's, in root's directories), are not
    // signalled, and the run stops as startup cleanup could not end them.
    for (protect, why) in [
        (
            format!("users = [\"{me}\"]"),
            format!("protected user: {me}"),
        ),
        (
            "commands = [\"sleep\"]".to_string(),
            "protected: sleep".into(),
        ),
    ] {
        std::fs::write(
            scratch.path("gpuctl.toml"),
            format!("[protect]\n{protect}\n"),
        )
        .unwrap();
        let run = scratch.run(&args);
        assert_eq!(run.code, 4, "{}", run.stderr);
        assert!(
            run.stderr.contains(&format!(
                "pid {} (worker), not on a GPU: not signalled ({why})",
                leftover.pid()
            )),
            "{}",
            run.stderr
        );
        assert!(leftover.running());
    }
}

#[test]
fn help_lists_the_exit_table_in_gpuctl_core() {
    let out = Command::new(trainer_bin()).arg("--help").output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let listed = gpuctl_core::exit::parse_help(&String::from_utf8_lossy(&out.stdout));
    let table: Vec<(u8, String)> = gpuctl_core::exit::TRAINER
        .iter()
        .map(|(exit, meaning)| {
            let words: Vec<&str> = meaning.split_whitespace().collect();
            (exit.code(), words.join(" "))
        })
        .collect();
    assert_eq!(listed, table);
}

/// The arguments of a short run named `job` whose run file is kept in `checkpoint`.
fn job_args(checkpoint: &Path) -> Vec<String> {
    [
        "--run-name",
        "job",
        "--steps",
        "1",
        "--batch-size",
        "4",
        "--checkpoint",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([checkpoint.to_str().unwrap().to_string()])
    .collect()
}

/// A run record of run `job` listing `processes`.
fn job_record(processes: Vec<Value>) -> String {
    serde_json::json!({"version": 1, "name": "job", "device": "cpu", "processes": processes})
        .to_string()
}

/// The command `inner` run under `prefix` (a tracer), with the same arguments and environment.
fn wrapped(prefix: &[&str], inner: &Command) -> Command {
    let mut outer = Command::new(prefix[0]);
    outer
        .args(&prefix[1..])
        .arg(inner.get_program())
        .args(inner.get_args())
        .stdin(Stdio::null());
    for (key, value) in inner.get_envs() {
        match value {
            Some(value) => outer.env(key, value),
            None => outer.env_remove(key),
        };
    }
    outer
}

/// Whether strace runs here: it is installed and ptrace is allowed.
fn strace_works() -> bool {
    Command::new("strace")
        .args(["-qq", "-o", "/dev/null", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn a_run_file_that_is_a_link_is_refused_even_if_it_appears_after_a_check() {
    let scratch = Scratch::new();
    let checkpoint = scratch.path("ck");
    std::fs::create_dir_all(&checkpoint).unwrap();
    let run_file = checkpoint.join("job.run.json");
    // A forged record (in the attack another user's file, the pid and start time of one of
    // the caller's processes being world-readable), linked at the run file's name. It is the
    // caller's own and private here, so only the link itself can be refused.
    let mine = Leftover::spawn();
    let forged = scratch.path("forged.json");
    std::fs::write(
        &forged,
        job_record(vec![recorded(
            mine.pid(),
            start_ticks(mine.pid()),
            "worker",
        )]),
    )
    .unwrap();
    std::fs::set_permissions(&forged, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    std::os::unix::fs::symlink(&forged, &run_file).unwrap();
    let args = job_args(&checkpoint);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();

    let run = scratch.run(&args);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let last = run.stderr.lines().last().unwrap_or("");
    assert!(last.contains("refusing to act on it"), "{}", run.stderr);
    assert!(mine.running());

    // The race a link/unlink loop wins now and then: the run file missing when it is checked
    // and the link there when it is read. Made certain: every stat of the run file reports it
    // missing, so only a check of what was opened can see the link.
    // scripts/test installs strace; without it (or without ptrace) this half cannot run,
    // and says so rather than passing.
    assert!(
        strace_works(),
        "strace is missing or ptrace is not allowed: install strace (scripts/test does)"
    );
    let path = run_file.to_str().unwrap();
    let mut command = wrapped(
        &[
            "strace",
            "-f",
            "-qq",
            "-o",
            "/dev/null",
            "-P",
            path,
            "-e",
            "trace=%%stat",
            "-e",
            "inject=%%stat:error=ENOENT",
        ],
        &scratch.trainer(&args),
    );
    let run = Finished::from(command.output().unwrap());
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr.contains("refusing to act on it"),
        "{}",
        run.stderr
    );
    assert!(mine.running(), "a forged record was acted on");
}

#[test]
fn a_lock_that_is_a_link_is_refused_and_its_target_never_created() {
    let scratch = Scratch::new();
    let checkpoint = scratch.path("ck");
    std::fs::create_dir_all(&checkpoint).unwrap();
    // As root the target could be /etc/nologin.
    let target = checkpoint.join("created_by_trainer");
    std::os::unix::fs::symlink(&target, checkpoint.join("job.run.lock")).unwrap();
    let args = job_args(&checkpoint);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = scratch.run(&args);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let last = run.stderr.lines().last().unwrap_or("");
    assert!(
        last.starts_with("gpuctl-trainer: ") && last.contains("job.run.lock: a symbolic link"),
        "{}",
        run.stderr
    );
    assert_eq!(
        run.stderr.matches("job.run.lock").count(),
        1,
        "{}",
        run.stderr
    );
    assert!(
        std::fs::symlink_metadata(&target).is_err(),
        "the lock's link was followed: {} was created",
        target.display()
    );
}

#[test]
fn a_shared_checkpoint_directory_must_be_sticky_and_the_run_file_the_callers_alone() {
    use std::os::unix::fs::PermissionsExt;
    let scratch = Scratch::new();
    let checkpoint = scratch.path("ck");
    std::fs::create_dir_all(&checkpoint).unwrap();
    let args = job_args(&checkpoint);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let chmod =
        |mode: u32| std::fs::set_permissions(&checkpoint, PermissionsExt::from_mode(mode)).unwrap();

    // Others may write in it and it is not sticky: they could rename this run's lock away
    // (and start a second run of the name) or put their run file in place of ours.
    chmod(0o777);
    let run = scratch.run(&args);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let last = run.stderr.lines().last().unwrap_or("");
    assert!(last.contains("sticky"), "{}", run.stderr);
    assert!(!checkpoint.join("job.run.lock").exists());
    // Sticky, as /tmp is: each user's files are theirs to remove.
    chmod(0o1777);
    scratch.run(&args).summary();
    chmod(0o755);

    // A second name of another run's file (a hard link) is not this run's record.
    let mine = Leftover::spawn();
    let other = checkpoint.join("other.run.json");
    std::fs::write(
        &other,
        job_record(vec![recorded(
            mine.pid(),
            start_ticks(mine.pid()),
            "worker",
        )]),
    )
    .unwrap();
    std::fs::hard_link(&other, checkpoint.join("job.run.json")).unwrap();
    let run = scratch.run(&args);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr.contains("refusing to act on it"),
        "{}",
        run.stderr
    );
    assert!(mine.running());
    std::fs::remove_file(checkpoint.join("job.run.json")).unwrap();

    // Another user's run file.
    // SAFETY: geteuid(2) has no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped the other-user half: it needs root to give a file away");
        return;
    }
    std::fs::rename(&other, checkpoint.join("job.run.json")).unwrap();
    std::os::unix::fs::chown(checkpoint.join("job.run.json"), Some(65534), Some(65534)).unwrap();
    let run = scratch.run(&args);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr.contains("refusing to act on it"),
        "{}",
        run.stderr
    );
    assert!(mine.running());
}
