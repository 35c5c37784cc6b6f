//! The harness: finds the built binaries and nvml-sim, writes scenarios, spawns real
//! processes that are killed when the test ends.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// target/<profile>, found from this test binary (target/<profile>/deps/e2e-HASH).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.parent()
        .and_then(Path::parent)
        .expect("test binary lives in target/<profile>/deps")
        .to_path_buf()
}

fn built(name: &str) -> PathBuf {
    let path = target_dir().join(name);
    assert!(
        path.exists(),
        "{} is not built: run `cargo build --workspace` before the tests (scripts/test does)",
        path.display()
    );
    path
}

pub fn gpuctl_bin() -> PathBuf {
    built("gpuctl")
}

pub fn sim_lib() -> PathBuf {
    built("libnvml_sim.so")
}

pub fn testproc_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gpuctl-testproc"))
}

/// A scratch directory with a scenario file and the sim's state file.
pub struct Sim {
    pub dir: tempfile::TempDir,
}

impl Sim {
    pub fn new(scenario: &str) -> Sim {
        let sim = Sim {
            dir: tempfile::tempdir().expect("tempdir"),
        };
        sim.write(scenario);
        sim
    }

    pub fn scenario_path(&self) -> PathBuf {
        self.dir.path().join("scenario.toml")
    }

    pub fn state_path(&self) -> PathBuf {
        self.dir.path().join("state.json")
    }

    /// Replaces the scenario atomically, as a program polling it must see whole files.
    pub fn write(&self, scenario: &str) {
        let tmp = self.dir.path().join("scenario.toml.tmp");
        std::fs::write(&tmp, scenario).expect("write scenario");
        std::fs::rename(&tmp, self.scenario_path()).expect("rename scenario");
    }

    /// `gpuctl ARGS` against this scenario, with a clean environment for colors.
    pub fn gpuctl(&self, args: &[&str]) -> Command {
        let mut command = Command::new(gpuctl_bin());
        command
            .args(args)
            .env("GPUCTL_NVML_LIB", sim_lib())
            .env("NVML_SIM_SCENARIO", self.scenario_path())
            .env("NVML_SIM_STATE", self.state_path())
            .env_remove("NO_COLOR")
            .env_remove("COLUMNS")
            .stdin(Stdio::null());
        command
    }

    pub fn run(&self, args: &[&str]) -> Run {
        Run::from(self.gpuctl(args).output().expect("run gpuctl"))
    }

    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = args.to_vec();
        all.push("--json");
        let run = self.run(&all);
        assert_eq!(run.code, 0, "gpuctl {all:?} failed: {}", run.stderr);
        serde_json::from_str(&run.stdout)
            .unwrap_or_else(|e| panic!("invalid JSON ({e}): {}", run.stdout))
    }
}

/// A finished command: status and text.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for Run {
    fn from(output: Output) -> Run {
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

impl Run {
    /// An error must be exactly one line on stderr, naming what was wrong.
    pub fn assert_one_line_error(&self, code: i32, needle: &str) {
        assert_eq!(self.code, code, "exit status; stderr: {}", self.stderr);
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(
            lines.len(),
            1,
            "expected one line on stderr, got: {:?}",
            self.stderr
        );
        assert!(
            lines[0].contains(needle),
            "stderr {:?} lacks {needle:?}",
            lines[0]
        );
        assert!(!self.stderr.contains("panicked"), "{}", self.stderr);
    }
}

/// A real process for a scenario to name; killed and reaped on drop.
pub struct Proc {
    pub child: Child,
}

impl Proc {
    /// The test process binary in `mode`, with `argv0` and `args` as its visible command.
    pub fn spawn(mode: &str, argv0: &str, args: &[&str]) -> Proc {
        use std::os::unix::process::CommandExt;
        let child = Command::new(testproc_bin())
            .arg0(argv0)
            .args(args)
            .env("GPUCTL_TESTPROC_MODE", mode)
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn test process");
        Proc { child }
    }

    pub fn sleeper(argv0: &str, args: &[&str]) -> Proc {
        Proc::spawn("sleep", argv0, args)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until /proc shows the process's leader in `state` (a stat letter).
    pub fn wait_for_state(&self, letter: char) {
        wait_until(Duration::from_secs(10), || {
            proc_state(self.pid()) == Some(letter)
        });
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Polls `done` until it holds, or fails the test after `limit`.
pub fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < limit,
            "condition not met within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
