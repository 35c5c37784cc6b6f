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

static STDERR: Mutex<()> = Mutex::new(());

/// Runs `f` with file descriptor 2 sent to a file, and returns what was written there: the
/// library loaded in-process writes its one-line complaints straight to fd 2, past libtest's
/// capture, so a test that provokes one reads it here (and a passing run's log stays clean).
pub fn stderr_of<R>(f: impl FnOnce() -> R) -> (R, String) {
    use std::io::{Read, Seek};
    use std::os::fd::AsRawFd;
    let _guard = STDERR.lock().unwrap_or_else(|e| e.into_inner());
    let mut file = tempfile::tempfile().expect("a file for stderr");
    // SAFETY: dup/dup2 on descriptors this process owns; fd 2 is restored before returning.
    let saved = unsafe { libc::dup(2) };
    assert!(saved >= 0, "dup(2): {}", std::io::Error::last_os_error());
    // SAFETY: as above.
    unsafe { libc::dup2(file.as_raw_fd(), 2) };
    let result = f();
    // SAFETY: as above; `saved` is closed once fd 2 is back.
    unsafe {
        libc::dup2(saved, 2);
        libc::close(saved);
    }
    let mut text = String::new();
    file.rewind().expect("rewind");
    file.read_to_string(&mut text).expect("read stderr");
    (result, text)
}

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

/// Whether this process can make device nodes (root with CAP_MKNOD): what the sim's device
/// files are then.
pub fn can_mknod() -> bool {
    // SAFETY: geteuid never fails.
    if unsafe { libc::geteuid() } != 0 {
        return false;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let node = std::ffi::CString::new(dir.path().join("probe").as_os_str().as_encoded_bytes())
        .expect("path");
    // SAFETY: a NUL-terminated path; makes a /dev/null node in our own temp dir.
    unsafe { libc::mknod(node.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(1, 3)) == 0 }
}

/// Asserts that `dir` holds exactly these device files: character devices with these
/// numbers where the test may make device nodes, else empty regular files; mode 0666.
pub fn assert_device_files(dir: &Path, want: &[(&str, (u32, u32))]) {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
    let devices = can_mknod();
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut wanted: Vec<String> = want.iter().map(|(n, _)| n.to_string()).collect();
    wanted.sort();
    assert_eq!(names, wanted, "in {}", dir.display());
    for (name, (major, minor)) in want {
        let meta = std::fs::symlink_metadata(dir.join(name)).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o666, "{name}");
        if devices {
            assert!(meta.file_type().is_char_device(), "{name}: {meta:?}");
            let rdev = meta.rdev();
            assert_eq!(
                (libc::major(rdev), libc::minor(rdev)),
                (*major, *minor),
                "{name}"
            );
        } else {
            assert!(meta.file_type().is_file(), "{name}: {meta:?}");
            assert_eq!(meta.len(), 0, "{name}");
        }
    }
}

/// The sim's library opened by hand, for the raw ABI: the calls a wrapper does not make.
pub struct Raw {
    pub lib: libloading::Library,
}

impl Raw {
    pub fn open() -> Raw {
        // SAFETY: loading our own library, which runs no code at load.
        let lib = unsafe { libloading::Library::new(lib_path()) }.unwrap();
        Raw { lib }
    }

    /// The export `name`, typed as its C signature.
    pub fn f<T: Copy>(&self, name: &str) -> T {
        // SAFETY: the caller names the symbol with its C signature.
        unsafe { *self.lib.get::<T>(name.as_bytes()).unwrap() }
    }
}
