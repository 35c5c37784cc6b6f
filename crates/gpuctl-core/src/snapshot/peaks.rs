//! gpuctl's "peak since reset" memory marks. NVML keeps no device-wide peak, so this is the
//! highest used memory gpuctl itself has seen on each GPU (each `gpuctl info`, each watchdog
//! loop) since `gpuctl reset` cleared it. Kept per GPU UUID in the state directory.
//!
//! The same looks also keep each owner's peak (a Slurm job, a pod, a unit…, by its selector
//! key `slurm:123`), per GPU, so that the job's epilog can take what its job used
//! ([`PeakStore::take_owner`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::owner::{Owner, OwnerMatch};
use crate::snapshot::Snapshot;

/// An owner not seen for longer than this is dropped when the file is written: its job
/// ended without an epilog taking its peaks, and the file must stay bounded.
pub const OWNER_RETENTION_SECS: u64 = 7 * 24 * 3600;

/// The most owners the file keeps. Owner keys come from cgroup names and job ids, which users
/// choose: without a cap, 300 000 of them made a 135 MB file that `info` took 1.8 s to read
/// and the watchdog 535 MB to hold. A node runs a few jobs at once; past the cap the
/// [`OWNERS_KEPT_BY_SIZE`] largest are kept, then the most recently seen.
pub const MAX_OWNERS: usize = 4096;

/// Of [`MAX_OWNERS`], how many are kept for their size (their highest per-GPU peak) before
/// the most recently seen fill the rest: a flood of small new owners cannot push out the
/// peaks of the jobs that used the GPUs most.
pub const OWNERS_KEPT_BY_SIZE: usize = MAX_OWNERS / 2;

/// A peaks file larger than this is not read (its marks are ignored) and is replaced, bounded,
/// at the next write (the watchdog's next loop). [`MAX_OWNERS`] owners with 16 GPUs each stay
/// well under it.
pub const MAX_FILE_BYTES: u64 = 16 << 20;

/// `last_seen_unix` is moved on only when older than this: moving it every look would
/// rewrite the file every watchdog loop.
const LAST_SEEN_GRANULARITY_SECS: u64 = 60;

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

/// One owner's peaks, from the first look that saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerPeaks {
    /// By GPU UUID (a MIG instance's process counts on its parent GPU): the highest sum of
    /// the owner's processes' used memory on that GPU at one look. A process whose usage
    /// the driver does not report counts as 0, but its GPU is still listed.
    pub gpus: BTreeMap<String, u64>,
    /// The user name of the owner's processes, as first known.
    pub user: Option<String>,
    pub first_seen_unix: u64,
    /// Within [`LAST_SEEN_GRANULARITY_SECS`] of the last look that saw it.
    pub last_seen_unix: u64,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct PeakFile {
    gpus: BTreeMap<String, Peak>,
    /// Absent from files written before owners were kept.
    #[serde(default)]
    owners: BTreeMap<String, OwnerPeaks>,
}

#[derive(Debug)]
pub struct PeakStore {
    path: PathBuf,
    /// The file as last read or written, with its identity then: a long-running observer
    /// (the watchdog, every loop) reads and parses it again only when it was replaced.
    seen: Mutex<Option<(FileIdentity, PeakFile)>>,
    /// The size of the file when the last read found it over [`MAX_FILE_BYTES`].
    oversized: Mutex<Option<u64>>,
    /// `seen` holds what this store wrote (not what it read): never over the limit.
    written: std::sync::atomic::AtomicBool,
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
            oversized: Mutex::new(None),
            written: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The store in [`state_dir`].
    pub fn default_location() -> Option<PeakStore> {
        state_dir().map(|dir| PeakStore::in_dir(&dir))
    }

    fn read(&self) -> PeakFile {
        let now = identity(&self.path);
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let mut oversized_now = self.oversized.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some(now), Some((then, file))) = (now, seen.as_ref())
            && now == *then
        {
            // The same file: over the limit only if it was when read (a write replaced it).
            if self.written.load(std::sync::atomic::Ordering::Relaxed) {
                *oversized_now = None;
            }
            return file.clone();
        }
        let (file, oversized) = read_bounded(&self.path);
        *oversized_now = oversized;
        self.written
            .store(false, std::sync::atomic::Ordering::Relaxed);
        *seen = now.map(|now| (now, file.clone()));
        file
    }

    /// Why the marks were not read, when the file was over [`MAX_FILE_BYTES`] at the last
    /// read (a write since then has replaced it, bounded): one line for a front that shows
    /// the marks to say so.
    pub fn oversized_warning(&self) -> Option<String> {
        let size = (*self.oversized.lock().unwrap_or_else(|e| e.into_inner()))?;
        Some(format!(
            "{} is {}, over the {} a peaks file may be: its marks are ignored, and it is \
             replaced by the marks seen from now on",
            self.path.display(),
            crate::units::bytes(size),
            crate::units::bytes(MAX_FILE_BYTES)
        ))
    }

    /// Written whole to a temporary file and renamed, so a reader never sees half a file.
    /// Two writers at once may lose one's update: a peak is then recorded at the next look
    /// (and an owner taken meanwhile comes back, to be dropped after the retention).
    fn write(&self, file: &mut PeakFile) -> Result<(), String> {
        prune_owners(&mut file.owners, crate::units::unix_whole_seconds());
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let text = serde_json::to_vec_pretty(file).map_err(|e| e.to_string())?;
        crate::files::replace(&self.path, &text, 0o644, false)
            .map_err(|e| format!("{}: {e}", self.path.display()))?;
        *self.seen.lock().unwrap_or_else(|e| e.into_inner()) =
            identity(&self.path).map(|now| (now, file.clone()));
        self.written
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Raises each GPU's mark, and each owner's, to what `snapshot` shows and returns the
    /// GPU marks in force. Writing is best effort: an unwritable state directory leaves the
    /// marks unrecorded.
    pub fn observe(&self, snapshot: &Snapshot) -> BTreeMap<String, Peak> {
        let mut file = self.read();
        let now = crate::units::unix_whole_seconds();
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
        changed |= raise_owners(&mut file.owners, snapshot, now);
        changed |= prune_owners(&mut file.owners, now);
        if changed {
            let _ = self.write(&mut file);
        }
        file.gpus
    }

    /// One owner's peaks (`key` as [`OwnerMatch`] writes it: `slurm:123`), left in place.
    pub fn owner(&self, key: &str) -> Option<OwnerPeaks> {
        self.read().owners.remove(key)
    }

    /// Removes one owner's peaks and returns them: a Slurm epilog takes its job's once, at
    /// its end. `Ok(None)` when none were recorded; on `Err` nothing was removed.
    pub fn take_owner(&self, key: &str) -> Result<Option<OwnerPeaks>, String> {
        let mut file = self.read();
        let taken = file.owners.remove(key);
        if taken.is_some() {
            self.write(&mut file)?;
        }
        Ok(taken)
    }

    /// Clears one GPU's mark: the next look starts it again.
    pub fn reset(&self, uuid: &str) -> Result<(), String> {
        let mut file = self.read();
        if file.gpus.remove(uuid).is_some() {
            self.write(&mut file)?;
        }
        Ok(())
    }
}

/// What one look shows of an owner: its used memory per GPU UUID, and its user.
#[derive(Debug, Default)]
struct OwnerLook {
    gpus: BTreeMap<String, u64>,
    user: Option<String>,
}

/// Each keyed owner's processes summed per GPU at this look. Only confirmed processes
/// count: an unconfirmed pid (another PID namespace) may not be the process its facts
/// describe.
fn owner_looks(snapshot: &Snapshot) -> BTreeMap<String, OwnerLook> {
    /// One owner seen at this look: its key (none for an owner no selector names, whose
    /// processes are then only compared, not summed), its sum per GPU, its user.
    struct Seen<'s> {
        owner: &'s Owner,
        key: Option<OwnerMatch>,
        gpus: Vec<(&'s str, u64)>,
        user: Option<&'s str>,
    }
    // Grouped by owner first, so that a key is written once per owner, not per process
    // (the watchdog does this every loop); the owners on a node are few.
    let mut by_owner: Vec<Seen> = Vec::new();
    for gpu in &snapshot.devices {
        let Some(uuid) = gpu.uuid.as_deref() else {
            continue;
        };
        // `processes` lists a MIG instance's processes too (on the parent), so each once.
        for process in &gpu.processes {
            let host = &process.host;
            let Some(owner) = host.owner.as_ref().filter(|_| host.confirmed) else {
                continue;
            };
            // A process on several GPUs carries one set of facts: the same owner, by address.
            let at = match by_owner
                .iter()
                .position(|seen| std::ptr::eq(seen.owner, owner) || seen.owner == owner)
            {
                Some(at) => at,
                None => {
                    by_owner.push(Seen {
                        owner,
                        key: OwnerMatch::of(owner),
                        gpus: Vec::new(),
                        user: None,
                    });
                    by_owner.len() - 1
                }
            };
            let seen = &mut by_owner[at];
            if seen.key.is_none() {
                continue;
            }
            let used = process.used_bytes.unwrap_or(0);
            // A GPU's processes come together: its sum is the owner's last one, or a new one
            // (the same `uuid` by address, so no string is compared per process).
            match seen.gpus.last_mut() {
                Some((last, sum)) if std::ptr::eq(*last, uuid) => *sum = sum.saturating_add(used),
                _ => seen.gpus.push((uuid, used)),
            }
            if seen.user.is_none() {
                seen.user = host.user.as_deref();
            }
        }
    }
    // Owners that differ only in what the key leaves out (a job's steps) share one key.
    let mut looks: BTreeMap<String, OwnerLook> = BTreeMap::new();
    for seen in by_owner {
        let Some(key) = seen.key else {
            continue;
        };
        let look = looks.entry(key.to_string()).or_default();
        for (uuid, bytes) in seen.gpus {
            let sum = look.gpus.entry(uuid.to_string()).or_default();
            *sum = sum.saturating_add(bytes);
        }
        if look.user.is_none() {
            look.user = seen.user.map(str::to_string);
        }
    }
    looks
}

/// Raises each owner's per-GPU peaks to this look's sums; whether anything changed.
fn raise_owners(owners: &mut BTreeMap<String, OwnerPeaks>, snapshot: &Snapshot, now: u64) -> bool {
    let mut changed = false;
    for (key, look) in owner_looks(snapshot) {
        let peaks = owners.entry(key).or_insert_with(|| {
            changed = true;
            OwnerPeaks {
                gpus: BTreeMap::new(),
                user: None,
                first_seen_unix: now,
                last_seen_unix: now,
            }
        });
        for (uuid, bytes) in look.gpus {
            match peaks.gpus.get_mut(&uuid) {
                Some(peak) if *peak >= bytes => {}
                Some(peak) => {
                    *peak = bytes;
                    changed = true;
                }
                None => {
                    peaks.gpus.insert(uuid, bytes);
                    changed = true;
                }
            }
        }
        if peaks.user.is_none() && look.user.is_some() {
            peaks.user = look.user;
            changed = true;
        }
        if now.saturating_sub(peaks.last_seen_unix) > LAST_SEEN_GRANULARITY_SECS {
            peaks.last_seen_unix = now;
            changed = true;
        }
    }
    changed
}

/// The file's marks, read with at most [`MAX_FILE_BYTES`] in memory: a missing or corrupt
/// file reads as empty; one over the limit too, with its size.
fn read_bounded(path: &Path) -> (PeakFile, Option<u64>) {
    use std::io::Read;
    let Ok(file) = std::fs::File::open(path) else {
        return (PeakFile::default(), None);
    };
    let mut bytes = Vec::new();
    // The size is taken from what is read, not from a stat before: the file may grow.
    if file
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .is_err()
    {
        return (PeakFile::default(), None);
    }
    if bytes.len() as u64 > MAX_FILE_BYTES {
        let size = std::fs::metadata(path).map_or(bytes.len() as u64, |m| m.len());
        return (PeakFile::default(), Some(size));
    }
    (serde_json::from_slice(&bytes).unwrap_or_default(), None)
}

/// Drops the owners not seen for longer than [`OWNER_RETENTION_SECS`], then, past
/// [`MAX_OWNERS`], all but the [`OWNERS_KEPT_BY_SIZE`] largest and the most recently seen;
/// whether any were dropped.
fn prune_owners(owners: &mut BTreeMap<String, OwnerPeaks>, now: u64) -> bool {
    let before = owners.len();
    owners.retain(|_, peaks| now.saturating_sub(peaks.last_seen_unix) <= OWNER_RETENTION_SECS);
    if owners.len() > MAX_OWNERS {
        let largest = |peaks: &OwnerPeaks| peaks.gpus.values().copied().max().unwrap_or(0);
        let mut ranked: Vec<(&String, &OwnerPeaks)> = owners.iter().collect();
        // Largest first (the newer of equals first); the key breaks ties, so the choice is
        // the same whatever the order of the map.
        ranked.sort_by(|a, b| {
            largest(b.1)
                .cmp(&largest(a.1))
                .then(b.1.last_seen_unix.cmp(&a.1.last_seen_unix))
                .then(a.0.cmp(b.0))
        });
        let (by_size, rest) = ranked.split_at(OWNERS_KEPT_BY_SIZE);
        let mut rest = rest.to_vec();
        rest.sort_by(|a, b| {
            b.1.last_seen_unix
                .cmp(&a.1.last_seen_unix)
                .then(largest(b.1).cmp(&largest(a.1)))
                .then(a.0.cmp(b.0))
        });
        let kept: std::collections::BTreeSet<String> = by_size
            .iter()
            .chain(rest.iter().take(MAX_OWNERS - OWNERS_KEPT_BY_SIZE))
            .map(|(key, _)| (*key).clone())
            .collect();
        owners.retain(|key, _| kept.contains(key));
    }
    owners.len() != before
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;
    use crate::snapshot::GpuSnapshot;

    pub(super) fn one_gpu_using(used_bytes: u64) -> Snapshot {
        Snapshot::of(vec![GpuSnapshot {
            uuid: Some("GPU-0".into()),
            memory: Some(fixtures::memory(100, used_bytes)),
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

#[cfg(test)]
mod owner_tests {
    use std::sync::Arc;

    use super::*;
    use crate::fixtures;
    use crate::snapshot::{GpuProcess, GpuSnapshot, MigDevice};

    fn job(job_id: u64, step: &str) -> Owner {
        Owner::SlurmJob {
            job_id,
            step: Some(step.into()),
            uid: Some(1000),
            from_environ: false,
        }
    }

    fn process(pid: u32, owner: Option<Owner>, used_bytes: Option<u64>) -> GpuProcess {
        fixtures::process(pid)
            .used_bytes(used_bytes)
            .confirmed()
            .user("alice")
            .owner(owner)
            .build()
    }

    fn gpu(index: u32, processes: Vec<GpuProcess>) -> GpuSnapshot {
        GpuSnapshot {
            uuid: Some(format!("GPU-{index}")),
            ..fixtures::gpu(index, processes)
        }
    }

    fn one_look(processes: Vec<GpuProcess>) -> Snapshot {
        Snapshot::of(vec![gpu(0, processes)])
    }

    #[test]
    fn an_owners_peak_is_the_highest_per_look_sum() {
        let dir = tempfile::tempdir().unwrap();
        let store = PeakStore::in_dir(dir.path());
        // Two processes of one job on one GPU sum; a later look with less keeps the peak;
        // one with more raises it, even though no single process ever held that much.
        for (a, b, peak) in [(10, 20, 30), (25, 0, 30), (20, 15, 35)] {
            store.observe(&one_look(vec![
                process(1, Some(job(123, "0")), Some(a)),
                process(2, Some(job(123, "batch")), Some(b)),
            ]));
            let peaks = store.owner("slurm:123").unwrap();
            assert_eq!(peaks.gpus, BTreeMap::from([("GPU-0".into(), peak)]));
            assert_eq!(peaks.user.as_deref(), Some("alice"));
        }
    }

    #[test]
    fn gpus_and_owners_are_kept_apart() {
        let dir = tempfile::tempdir().unwrap();
        let store = PeakStore::in_dir(dir.path());
        store.observe(&Snapshot::of(vec![
            gpu(
                0,
                vec![
                    process(1, Some(job(7, "0")), Some(100)),
                    process(2, Some(job(8, "0")), Some(5)),
                ],
            ),
            gpu(1, vec![process(1, Some(job(7, "0")), None)]),
        ]));
        let seven = store.owner("slurm:7").unwrap();
        // Unknown usage counts as 0, but the GPU is the job's all the same.
        assert_eq!(
            seven.gpus,
            BTreeMap::from([("GPU-0".into(), 100), ("GPU-1".into(), 0)])
        );
        assert_eq!(
            store.owner("slurm:8").unwrap().gpus,
            BTreeMap::from([("GPU-0".into(), 5)])
        );
    }

    #[test]
    fn only_confirmed_processes_with_an_owner_count_and_mig_processes_count_once() {
        let mut unconfirmed = process(3, Some(job(9, "0")), Some(1000));
        Arc::get_mut(&mut unconfirmed.host).unwrap().confirmed = false;
        let mut in_instance = process(4, Some(job(9, "0")), Some(40));
        in_instance.gpu_instance_id = Some(1);
        let mut card = gpu(
            0,
            vec![
                unconfirmed,
                in_instance.clone(),
                process(5, None, Some(500)),
                process(6, Some(Owner::None), Some(500)),
            ],
        );
        // A MIG device repeats its parent's processes: the parent's list alone counts.
        card.mig_enabled = Some(true);
        card.mig_devices = vec![MigDevice {
            uuid: Some("MIG-x".into()),
            gpu_instance_id: Some(1),
            compute_instance_id: Some(0),
            profile: None,
            memory: None,
            processes: vec![in_instance],
        }];
        let looks = owner_looks(&Snapshot::of(vec![card]));
        assert_eq!(looks.keys().collect::<Vec<_>>(), vec!["slurm:9"]);
        assert_eq!(
            looks["slurm:9"].gpus,
            BTreeMap::from([("GPU-0".into(), 40)])
        );
    }

    #[test]
    fn take_owner_removes_what_owner_only_reads() {
        let dir = tempfile::tempdir().unwrap();
        let watchdog = PeakStore::in_dir(dir.path());
        watchdog.observe(&one_look(vec![process(1, Some(job(5, "0")), Some(64))]));
        // The epilog is another process: a store of its own.
        let epilog = PeakStore::in_dir(dir.path());
        let read = epilog.owner("slurm:5").unwrap();
        assert_eq!(epilog.owner("slurm:5"), Some(read.clone()));
        assert_eq!(epilog.take_owner("slurm:5").unwrap(), Some(read));
        assert_eq!(epilog.take_owner("slurm:5").unwrap(), None);
        assert_eq!(watchdog.owner("slurm:5"), None);
        assert_eq!(epilog.take_owner("slurm:404").unwrap(), None);
    }

    #[test]
    fn a_file_without_owners_still_reads_and_a_corrupt_one_reads_as_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("peaks.json");
        std::fs::write(
            &path,
            r#"{"gpus": {"GPU-0": {"used_bytes": 900, "since_unix": 1}}}"#,
        )
        .unwrap();
        let store = PeakStore::in_dir(dir.path());
        let marks = store.observe(&one_look(vec![process(1, Some(job(2, "0")), Some(3))]));
        assert_eq!(
            marks["GPU-0"],
            Peak {
                used_bytes: 900,
                since_unix: 1
            }
        );
        assert_eq!(store.owner("slurm:2").unwrap().gpus["GPU-0"], 3);

        std::fs::write(&path, b"{not json").unwrap();
        let store = PeakStore::in_dir(dir.path());
        assert_eq!(store.owner("slurm:2"), None);
        assert_eq!(store.take_owner("slurm:2").unwrap(), None);
    }

    #[test]
    fn last_seen_moves_only_when_a_minute_old() {
        let look = one_look(vec![process(1, Some(job(1, "0")), Some(8))]);
        let mut owners = BTreeMap::new();
        assert!(raise_owners(&mut owners, &look, 1000));
        // The same look again changes nothing to write.
        assert!(!raise_owners(
            &mut owners,
            &look,
            1000 + LAST_SEEN_GRANULARITY_SECS
        ));
        assert_eq!(owners["slurm:1"].last_seen_unix, 1000);
        assert!(raise_owners(
            &mut owners,
            &look,
            1001 + LAST_SEEN_GRANULARITY_SECS
        ));
        assert_eq!(
            owners["slurm:1"].last_seen_unix,
            1001 + LAST_SEEN_GRANULARITY_SECS
        );
        assert_eq!(owners["slurm:1"].first_seen_unix, 1000);
    }

    #[test]
    fn owners_unseen_for_seven_days_are_dropped() {
        let mut owners = BTreeMap::new();
        raise_owners(
            &mut owners,
            &one_look(vec![process(1, Some(job(1, "0")), Some(8))]),
            1000,
        );
        raise_owners(
            &mut owners,
            &one_look(vec![process(2, Some(job(2, "0")), Some(8))]),
            2000,
        );
        assert!(!prune_owners(&mut owners, 1000 + OWNER_RETENTION_SECS));
        assert!(prune_owners(&mut owners, 1001 + OWNER_RETENTION_SECS));
        assert_eq!(owners.keys().collect::<Vec<_>>(), vec!["slurm:2"]);

        // Writing prunes: an owner last seen 8 days ago is gone from the file after the
        // next write, whatever caused it.
        let dir = tempfile::tempdir().unwrap();
        let store = PeakStore::in_dir(dir.path());
        let old = OwnerPeaks {
            gpus: BTreeMap::from([("GPU-0".into(), 1)]),
            user: None,
            first_seen_unix: 0,
            last_seen_unix: crate::units::unix_whole_seconds() - 8 * 24 * 3600,
        };
        let mut file = PeakFile::default();
        file.owners.insert("slurm:old".into(), old);
        std::fs::write(
            dir.path().join("peaks.json"),
            serde_json::to_vec(&file).unwrap(),
        )
        .unwrap();
        store.observe(&one_look(vec![process(1, Some(job(3, "0")), Some(8))]));
        let text = std::fs::read_to_string(dir.path().join("peaks.json")).unwrap();
        assert!(
            !text.contains("slurm:old") && text.contains("slurm:3"),
            "{text}"
        );
    }

    fn owner_peaks(bytes: u64, last_seen_unix: u64) -> OwnerPeaks {
        OwnerPeaks {
            gpus: BTreeMap::from([("GPU-0".into(), bytes)]),
            user: None,
            first_seen_unix: last_seen_unix,
            last_seen_unix,
        }
    }

    #[test]
    fn past_the_cap_the_largest_and_the_newest_owners_are_kept() {
        let now = 10_000_000;
        let mut owners = BTreeMap::new();
        // Old jobs that used the GPU most, then a flood of small new owners.
        for i in 0..OWNERS_KEPT_BY_SIZE as u64 {
            owners.insert(format!("slurm:big{i}"), owner_peaks(1 << 40, now - 3600));
        }
        let flood = 3 * MAX_OWNERS as u64;
        for i in 0..flood {
            owners.insert(format!("unit:flood{i}"), owner_peaks(1, now - flood + i));
        }
        assert!(prune_owners(&mut owners, now));
        assert_eq!(owners.len(), MAX_OWNERS);
        assert!((0..OWNERS_KEPT_BY_SIZE).all(|i| owners.contains_key(&format!("slurm:big{i}"))));
        // The rest: the most recently seen of the flood.
        let newest = flood - (MAX_OWNERS - OWNERS_KEPT_BY_SIZE) as u64;
        assert!(owners.contains_key(&format!("unit:flood{}", flood - 1)));
        assert!(owners.contains_key(&format!("unit:flood{newest}")));
        assert!(!owners.contains_key(&format!("unit:flood{}", newest - 1)));
        // At the cap, nothing more is dropped.
        assert!(!prune_owners(&mut owners, now));
    }

    #[test]
    fn a_file_over_the_size_limit_is_not_read_and_the_next_write_bounds_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("peaks.json");
        let mut file = PeakFile::default();
        file.gpus.insert(
            "GPU-0".into(),
            Peak {
                used_bytes: 99,
                since_unix: 1,
            },
        );
        let now = crate::units::unix_whole_seconds();
        // Padded past the limit with owners: valid JSON, too big to read.
        let entry = serde_json::to_string(&owner_peaks(1, now)).unwrap();
        let mut owners = Vec::new();
        let mut size = 0;
        while size <= MAX_FILE_BYTES as usize {
            let one = format!("\"unit:u{}\":{entry}", owners.len());
            size += one.len() + 1;
            owners.push(one);
        }
        let text = format!(
            "{{\"gpus\":{},\"owners\":{{{}}}}}",
            serde_json::to_string(&file.gpus).unwrap(),
            owners.join(",")
        );
        assert!(serde_json::from_str::<PeakFile>(&text).is_ok());
        std::fs::write(&path, &text).unwrap();

        let store = PeakStore::in_dir(dir.path());
        assert_eq!(store.owner("unit:u0"), None, "not read");
        let warning = store.oversized_warning().expect("a warning");
        assert!(
            warning.contains("peaks.json is ") && warning.contains("over the 16 MiB"),
            "{warning}"
        );
        assert!(!warning.contains('\n'));
        // The next write (the watchdog's next look, or this one's) replaces it, bounded; the
        // look that found it says so, the next one has nothing to say.
        let marks = store.observe(&super::tests::one_gpu_using(40));
        assert_eq!(marks["GPU-0"].used_bytes, 40, "the old mark was ignored");
        assert!(store.oversized_warning().is_some());
        assert!(std::fs::metadata(&path).unwrap().len() < MAX_FILE_BYTES);
        store.observe(&super::tests::one_gpu_using(50));
        assert_eq!(store.oversized_warning(), None);
        assert_eq!(PeakStore::in_dir(dir.path()).owner("unit:u0"), None);
    }
}
