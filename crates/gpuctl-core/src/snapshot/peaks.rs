//! gpuctl's "peak since reset" memory marks. NVML keeps no device-wide peak, so this is the
//! highest used memory gpuctl itself has seen on each GPU (each `gpuctl info`, each watchdog
//! loop) since `gpuctl reset` cleared it. Kept per GPU UUID in the state directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::snapshot::Snapshot;

/// Where gpuctl keeps state: `GPUCTL_STATE_DIR`, else /var/lib/gpuctl for root, else
/// `$XDG_STATE_HOME/gpuctl` (default ~/.local/state/gpuctl).
pub fn state_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("GPUCTL_STATE_DIR").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    if nix::unistd::geteuid().is_root() {
        return Some(PathBuf::from("/var/lib/gpuctl"));
    }
    let base = std::env::var_os("XDG_STATE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|h| !h.is_empty())
                .map(|h| PathBuf::from(h).join(".local/state"))
        })?;
    Some(base.join("gpuctl"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Peak {
    pub used_bytes: u64,
    /// When the mark was last cleared (or first recorded), seconds since the epoch.
    pub since_unix: u64,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct PeakFile {
    gpus: BTreeMap<String, Peak>,
}

#[derive(Debug)]
pub struct PeakStore {
    path: PathBuf,
    /// The file as last read or written, with its identity then: a long-running observer
    /// (the watchdog, every loop) reads and parses it again only when it was replaced.
    seen: Mutex<Option<(FileIdentity, PeakFile)>>,
}

/// Device, inode, size and modification time: every write replaces the file (a new
/// inode), so a change of any of them means another writer's marks.
type FileIdentity = (u64, u64, u64, i64, i64);

fn identity(path: &Path) -> Option<FileIdentity> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some((
        meta.dev(),
        meta.ino(),
        meta.size(),
        meta.mtime(),
        meta.mtime_nsec(),
    ))
}

impl PeakStore {
    pub fn in_dir(dir: &Path) -> PeakStore {
        PeakStore {
            path: dir.join("peaks.json"),
            seen: Mutex::new(None),
        }
    }

    /// The store in [`state_dir`].
    pub fn default_location() -> Option<PeakStore> {
        state_dir().map(|dir| PeakStore::in_dir(&dir))
    }

    fn read(&self) -> PeakFile {
        let now = identity(&self.path);
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some(now), Some((then, file))) = (now, seen.as_ref())
            && now == *then
        {
            return file.clone();
        }
        let file: PeakFile = std::fs::read(&self.path)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default();
        *seen = now.map(|now| (now, file.clone()));
        file
    }

    /// Written whole to a temporary file and renamed, so a reader never sees half a file.
    /// Two writers at once may lose one's update: a peak is then recorded at the next look.
    fn write(&self, file: &PeakFile) -> Result<(), String> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let text = serde_json::to_vec_pretty(file).map_err(|e| e.to_string())?;
        crate::files::replace(&self.path, &text, 0o644, false)
            .map_err(|e| format!("{}: {e}", self.path.display()))?;
        *self.seen.lock().unwrap_or_else(|e| e.into_inner()) =
            identity(&self.path).map(|now| (now, file.clone()));
        Ok(())
    }

    /// Raises each GPU's mark to what `snapshot` shows and returns the marks in force.
    /// Writing is best effort: an unwritable state directory leaves the marks unrecorded.
    pub fn observe(&self, snapshot: &Snapshot) -> BTreeMap<String, Peak> {
        let mut file = self.read();
        let now = now_unix();
        let mut changed = false;
        for gpu in &snapshot.devices {
            let (Some(uuid), Some(memory)) = (&gpu.uuid, gpu.memory) else {
                continue;
            };
            let peak = file.gpus.entry(uuid.clone()).or_insert_with(|| {
                changed = true;
                Peak {
                    used_bytes: memory.used_bytes,
                    since_unix: now,
                }
            });
            if memory.used_bytes > peak.used_bytes {
                peak.used_bytes = memory.used_bytes;
                changed = true;
            }
        }
        if changed {
            let _ = self.write(&file);
        }
        file.gpus
    }

    /// Clears one GPU's mark: the next look starts it again.
    pub fn reset(&self, uuid: &str) -> Result<(), String> {
        let mut file = self.read();
        if file.gpus.remove(uuid).is_some() {
            self.write(&file)?;
        }
        Ok(())
    }
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{GpuSnapshot, Memory};

    fn one_gpu_using(used_bytes: u64) -> Snapshot {
        Snapshot::of(vec![GpuSnapshot {
            uuid: Some("GPU-0".into()),
            memory: Some(Memory {
                total_bytes: 100,
                used_bytes,
                free_bytes: 100 - used_bytes,
                reserved_bytes: 0,
                unattributed_bytes: Some(0),
            }),
            ..GpuSnapshot::unread(0)
        }])
    }

    #[test]
    fn a_long_running_observer_sees_another_writers_reset() {
        let dir = tempfile::tempdir().unwrap();
        let watchdog = PeakStore::in_dir(dir.path());
        assert_eq!(watchdog.observe(&one_gpu_using(80))["GPU-0"].used_bytes, 80);
        assert_eq!(watchdog.observe(&one_gpu_using(30))["GPU-0"].used_bytes, 80);
        // `gpuctl reset`, another process: a store of its own.
        PeakStore::in_dir(dir.path()).reset("GPU-0").unwrap();
        assert_eq!(watchdog.observe(&one_gpu_using(30))["GPU-0"].used_bytes, 30);
        assert_eq!(watchdog.observe(&one_gpu_using(20))["GPU-0"].used_bytes, 30);
    }
}
