//! Settings that survive across processes: a JSON file, replaced atomically (temp file +
//! rename) under an flock on `<state>.lock`. The format is documented in README.md.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct State {
    /// Format version, always 1.
    #[serde(default = "one")]
    pub version: u32,
    /// Settings per GPU, keyed by UUID.
    #[serde(default)]
    pub gpus: BTreeMap<String, GpuState>,
    /// When a dead process with `teardown_ms` was first seen dead, keyed by pid.
    #[serde(default)]
    pub teardown: BTreeMap<String, Teardown>,
    /// The `[[xid]]` entries the driver has raised (delivered to a first event set), keyed
    /// by position: a set created after that never sees them, in any process.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub xids_raised: BTreeMap<String, RaisedXid>,
}

/// An `[[xid]]` entry raised: its GPU, number and culprit (an entry rewritten in place with
/// others is a new one), and when.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct RaisedXid {
    pub gpu: u32,
    pub xid: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Unix time in milliseconds.
    pub at_unix_ms: u64,
}

fn one() -> u32 {
    1
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct GpuState {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistence_mode: Option<bool>,
    /// "default" | "exclusive_process" | "prohibited"
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applications_clocks: Option<AppClocks>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locked_clocks: Option<ClockRange>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_locked_clocks: Option<ClockRange>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accounting_mode: Option<bool>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accounting_pids: Vec<u32>,
    /// The GPU was reset (removed and rediscovered) while its scenario health read this
    /// (a fingerprint): until the scenario's health keys change, it shows what a reset
    /// leaves (nothing pending, volatile ECC counts at zero, recovery action none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset_health: Option<String>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct AppClocks {
    pub mem_mhz: u32,
    pub graphics_mhz: u32,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct ClockRange {
    pub min_mhz: u32,
    pub max_mhz: u32,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Teardown {
    /// Unix time in milliseconds.
    pub first_dead_unix_ms: u64,
}

/// How often a long-running client re-checks the scenario file and the state file for a
/// change made by another process.
pub const RECHECK: std::time::Duration = std::time::Duration::from_millis(10);

/// Whether a file last checked at `checked_at` is due for another look ([`RECHECK`]);
/// when it is, now is recorded as the check.
pub fn recheck_due(checked_at: &mut Option<std::time::Instant>) -> bool {
    let now = std::time::Instant::now();
    if checked_at.is_some_and(|at| now.duration_since(at) < RECHECK) {
        return false;
    }
    *checked_at = Some(now);
    true
}

/// Identity of a file version: (dev, ino, size, mtime s, mtime ns).
pub type FileSig = (u64, u64, u64, i64, i64);

pub fn file_sig(path: &Path) -> Option<FileSig> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
}

/// The state file, cached in memory and re-read when its stat signature changes.
#[derive(Debug)]
pub struct StateStore {
    pub path: PathBuf,
    sig: Option<FileSig>,
    cached: State,
    /// When the file was last checked for a change.
    checked_at: Option<std::time::Instant>,
}

impl StateStore {
    pub fn new(path: PathBuf) -> StateStore {
        let mut s = StateStore {
            path,
            sig: None,
            cached: State {
                version: 1,
                ..State::default()
            },
            checked_at: None,
        };
        s.refresh();
        s
    }

    /// Re-reads the file if it changed; returns the current state. As with the scenario, a
    /// change by another process is seen within [`RECHECK`]: a stat per call was
    /// a hundred stats of one `gpuctl info`, which real NVML does not make. This process's
    /// own changes ([`StateStore::update`]) are seen at once.
    pub fn refresh(&mut self) -> &State {
        if !recheck_due(&mut self.checked_at) {
            return &self.cached;
        }
        let sig = file_sig(&self.path);
        if sig != self.sig {
            if let Some(state) = read(&self.path) {
                self.cached = state;
            } else if sig.is_none() {
                self.cached = State {
                    version: 1,
                    ..State::default()
                };
            }
            self.sig = sig;
        }
        &self.cached
    }

    pub fn cached(&self) -> &State {
        &self.cached
    }

    /// Applies `f` to the freshest state under the lock and writes it back. On failure the
    /// change is still kept in this process's memory.
    pub fn update(&mut self, f: impl FnOnce(&mut State)) -> std::io::Result<()> {
        match locked_update(&self.path, f) {
            Ok(state) => {
                self.cached = state;
                self.sig = file_sig(&self.path);
                Ok(())
            }
            Err((e, f)) => {
                if let Some(f) = f {
                    f(&mut self.cached);
                }
                Err(e)
            }
        }
    }
}

fn read(path: &Path) -> Option<State> {
    let text = std::fs::read(path).ok()?;
    match serde_json::from_slice::<State>(&text) {
        Ok(s) => Some(s),
        Err(e) => {
            eprintln!(
                "nvml-sim: {}: ignoring an unreadable state file: {e}",
                path.display()
            );
            None
        }
    }
}

type UpdateErr<F> = (std::io::Error, Option<F>);

fn locked_update<F: FnOnce(&mut State)>(path: &Path, f: F) -> Result<State, UpdateErr<F>> {
    use std::os::fd::AsRawFd;
    let mut lock_name = path.as_os_str().to_owned();
    lock_name.push(".lock");
    let lock = match std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_name)
    {
        Ok(l) => l,
        Err(e) => return Err((e, Some(f))),
    };
    // SAFETY: flock on a file descriptor we own; released when `lock` is closed.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err((std::io::Error::last_os_error(), Some(f)));
    }
    let mut state = read(path).unwrap_or(State {
        version: 1,
        ..State::default()
    });
    state.version = 1;
    f(&mut state);
    let write = || -> std::io::Result<()> {
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(format!(".tmp.{}", std::process::id()));
        let tmp = PathBuf::from(tmp);
        let mut file = std::fs::File::create(&tmp)?;
        let mut json = serde_json::to_vec_pretty(&state).map_err(std::io::Error::other)?;
        json.push(b'\n');
        file.write_all(&json)?;
        drop(file);
        std::fs::rename(&tmp, path).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
    };
    let result = write();
    drop(lock);
    match result {
        Ok(()) => Ok(state),
        Err(e) => Err((e, None)),
    }
}
