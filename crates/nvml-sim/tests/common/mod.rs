//! Shared helpers of the nvml-sim integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// target/<profile>, from target/<profile>/deps/<test binary>.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("deps dir");
    deps.parent().expect("profile dir").to_path_buf()
}

/// The built cdylib.
pub fn lib_path() -> PathBuf {
    let lib = target_dir().join("libnvml_sim.so");
    assert!(
        lib.exists(),
        "{} is missing: build it first (cargo build -p nvml-sim)",
        lib.display()
    );
    lib
}

/// The launcher binary (also the stand-in).
pub fn bin_path() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_nvml-sim"))
}

static LOCK: Mutex<()> = Mutex::new(());

/// One simulated machine for one test: the process-wide environment and the loaded
/// library are shared, so tests that load the library run one at a time.
pub struct Sim {
    _guard: MutexGuard<'static, ()>,
    pub dir: tempfile::TempDir,
    pub scenario: PathBuf,
    pub state: PathBuf,
}

impl Sim {
    pub fn new(scenario: &str) -> Sim {
        let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("scenario.toml");
        let state = dir.path().join("state.json");
        std::fs::write(&path, scenario).expect("write scenario");
        // SAFETY: every test that touches the environment holds LOCK.
        unsafe {
            std::env::set_var("NVML_SIM_SCENARIO", &path);
            std::env::set_var("NVML_SIM_STATE", &state);
        }
        Sim {
            _guard: guard,
            dir,
            scenario: path,
            state,
        }
    }

    /// Replaces the scenario atomically (write + rename), as tests are told to.
    pub fn replace(&self, scenario: &str) {
        let tmp = self.dir.path().join("scenario.toml.new");
        std::fs::write(&tmp, scenario).expect("write scenario");
        std::fs::rename(&tmp, &self.scenario).expect("rename scenario");
        // The contract under test: a loaded library sees a change within RECHECK.
        std::thread::sleep(nvml_sim::sim::RECHECK + std::time::Duration::from_millis(5));
    }

    pub fn nvml(&self) -> nvml_wrapper::Nvml {
        open_nvml()
    }
}

pub fn open_nvml() -> nvml_wrapper::Nvml {
    nvml_wrapper::Nvml::builder()
        .lib_path(lib_path().as_os_str())
        .init()
        .expect("nvml init")
}

/// Polls `f` until it returns Some or `timeout` passes.
pub fn poll<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The state letter of /proc/PID/stat.
pub fn proc_state(pid: u32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let close = s.rfind(')')?;
    s[close + 2..].chars().next()
}

pub fn sleeper() -> std::process::Child {
    std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .expect("spawn sleep")
}

pub fn kill_and_reap(child: &mut std::process::Child) {
    let _ = child.kill();
    let _ = child.wait();
}

pub fn exists(path: &Path) -> bool {
    path.exists()
}
