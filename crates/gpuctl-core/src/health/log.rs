//! What outlives one look at a GPU: the Xids the watchdog saw since each GPU's last reset
//! (`health.json` in its state directory, written by the watchdog alone), and the admins'
//! acknowledgements (`health-acks.json`, written by `gpuctl health --ack` and by
//! `gpuctl reset --gpu-reset`). Both bounded, both keyed by GPU UUID, both replaced whole.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::XidRecord;

/// The watchdog's Xid log, in its state directory.
pub const XID_LOG_FILE: &str = "health.json";
/// The acknowledgements, in the same directory.
pub const ACK_FILE: &str = "health-acks.json";
/// The most Xids kept per GPU: the newest. A GPU raising Xids in a loop must not grow the
/// file without end; the counter metric keeps the full count.
pub const MAX_XIDS_PER_GPU: usize = 64;
/// The most GPUs kept (a board swapped many times leaves old UUIDs behind): those with the
/// newest Xids.
pub const MAX_GPUS: usize = 64;
/// A file larger than this is not read (and is replaced, bounded, at the next write).
const MAX_FILE_BYTES: u64 = 4 << 20;

fn read_json<T: for<'de> Deserialize<'de> + Default>(path: &Path) -> T {
    let small = std::fs::metadata(path).is_ok_and(|m| m.len() <= MAX_FILE_BYTES);
    if !small {
        return T::default();
    }
    std::fs::read(path)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

fn write_json<T: Serialize>(path: &Path, value: &T) -> std::io::Result<()> {
    let mut bytes = serde_json::to_vec_pretty(value).map_err(std::io::Error::other)?;
    bytes.push(b'\n');
    crate::files::replace(path, &bytes, 0o644, false)
}

/// The Xids seen since each GPU's last reset, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct XidLog {
    #[serde(default)]
    pub gpus: BTreeMap<String, Vec<XidRecord>>,
}

impl XidLog {
    pub fn path(dir: &Path) -> PathBuf {
        dir.join(XID_LOG_FILE)
    }

    /// The log in `dir`; empty where there is none or it cannot be read.
    pub fn read(dir: &Path) -> XidLog {
        read_json(&XidLog::path(dir))
    }

    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        write_json(&XidLog::path(dir), self)
    }

    pub fn for_gpu(&self, uuid: &str) -> &[XidRecord] {
        self.gpus.get(uuid).map_or(&[], Vec::as_slice)
    }

    /// Adds `record` on GPU `uuid`, keeping the newest [`MAX_XIDS_PER_GPU`] and
    /// [`MAX_GPUS`] GPUs.
    pub fn record(&mut self, uuid: &str, record: XidRecord) {
        let list = self.gpus.entry(uuid.to_string()).or_default();
        list.push(record);
        if list.len() > MAX_XIDS_PER_GPU {
            list.drain(..list.len() - MAX_XIDS_PER_GPU);
        }
        while self.gpus.len() > MAX_GPUS {
            let oldest = self
                .gpus
                .iter()
                .min_by_key(|(_, list)| list.last().map_or(0, |r| r.at_unix))
                .map(|(uuid, _)| uuid.clone());
            match oldest {
                Some(uuid) => self.gpus.remove(&uuid),
                None => break,
            };
        }
    }

    /// Forgets GPU `uuid`'s Xids from before a reset: those recorded with a higher volatile
    /// ECC count than it reads now (the counters restart with the GPU), and those up to an
    /// acknowledgement at `acknowledged_unix`. True when any was forgotten.
    pub fn forget_reset(
        &mut self,
        uuid: &str,
        volatile_now: Option<u64>,
        acknowledged_unix: Option<u64>,
    ) -> bool {
        let Some(list) = self.gpus.get_mut(uuid) else {
            return false;
        };
        let before = list.len();
        list.retain(|r| {
            let reset = r
                .volatile_ecc
                .zip(volatile_now)
                .is_some_and(|(then, now)| now < then);
            let acknowledged = acknowledged_unix.is_some_and(|ack| ack >= r.at_unix);
            !reset && !acknowledged
        });
        let forgot = list.len() != before;
        if list.is_empty() {
            self.gpus.remove(uuid);
        }
        forgot
    }
}

/// When an admin last acknowledged each GPU's Xids (Unix seconds), by UUID.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Acks {
    #[serde(default)]
    pub gpus: BTreeMap<String, u64>,
}

impl Acks {
    pub fn path(dir: &Path) -> PathBuf {
        dir.join(ACK_FILE)
    }

    pub fn read(dir: &Path) -> Acks {
        read_json(&Acks::path(dir))
    }

    pub fn get(&self, uuid: &str) -> Option<u64> {
        self.gpus.get(uuid).copied()
    }

    /// Records an acknowledgement of GPU `uuid`'s Xids up to `now` and writes the file.
    pub fn acknowledge(dir: &Path, uuid: &str, now: u64) -> std::io::Result<()> {
        let mut acks = Acks::read(dir);
        acks.gpus.insert(uuid.to_string(), now);
        while acks.gpus.len() > MAX_GPUS {
            let oldest = acks
                .gpus
                .iter()
                .min_by_key(|(_, at)| **at)
                .map(|(uuid, _)| uuid.clone());
            match oldest {
                Some(uuid) => acks.gpus.remove(&uuid),
                None => break,
            };
        }
        std::fs::create_dir_all(dir)?;
        write_json(&Acks::path(dir), &acks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xid(xid: u32, at_unix: u64, volatile_ecc: Option<u64>) -> XidRecord {
        XidRecord {
            xid,
            at_unix,
            volatile_ecc,
            ..XidRecord::default()
        }
    }

    #[test]
    fn the_log_keeps_the_newest_xids_of_each_gpu() {
        let mut log = XidLog::default();
        for at in 0..(MAX_XIDS_PER_GPU as u64 + 10) {
            log.record("GPU-a", xid(13, at, None));
        }
        let kept = log.for_gpu("GPU-a");
        assert_eq!(kept.len(), MAX_XIDS_PER_GPU);
        assert_eq!(kept[0].at_unix, 10);
        assert!(log.for_gpu("GPU-b").is_empty());
    }

    #[test]
    fn the_log_keeps_the_gpus_with_the_newest_xids() {
        let mut log = XidLog::default();
        for gpu in 0..(MAX_GPUS as u64 + 3) {
            log.record(&format!("GPU-{gpu}"), xid(79, gpu, None));
        }
        assert_eq!(log.gpus.len(), MAX_GPUS);
        assert!(log.for_gpu("GPU-0").is_empty());
        assert_eq!(log.for_gpu(&format!("GPU-{}", MAX_GPUS + 2)).len(), 1);
    }

    #[test]
    fn a_reset_or_an_acknowledgement_forgets_the_xids_before_it() {
        let mut log = XidLog::default();
        log.record("GPU-a", xid(64, 100, Some(5)));
        log.record("GPU-a", xid(79, 200, Some(7)));
        assert!(!log.forget_reset("GPU-a", Some(7), None));
        assert_eq!(log.for_gpu("GPU-a").len(), 2);
        // The counters read lower than at the second Xid: a reset came after both.
        assert!(log.forget_reset("GPU-a", Some(0), None));
        assert!(log.gpus.is_empty());

        log.record("GPU-a", xid(64, 100, None));
        log.record("GPU-a", xid(79, 200, None));
        assert!(log.forget_reset("GPU-a", None, Some(150)));
        assert_eq!(log.for_gpu("GPU-a"), &[xid(79, 200, None)]);
    }

    #[test]
    fn files_round_trip_and_a_missing_or_bad_file_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(XidLog::read(dir.path()), XidLog::default());
        let mut log = XidLog::default();
        log.record("GPU-a", xid(48, 1, Some(2)));
        log.write(dir.path()).unwrap();
        assert_eq!(XidLog::read(dir.path()), log);
        std::fs::write(XidLog::path(dir.path()), "{not json").unwrap();
        assert_eq!(XidLog::read(dir.path()), XidLog::default());

        Acks::acknowledge(dir.path(), "GPU-a", 42).unwrap();
        assert_eq!(Acks::read(dir.path()).get("GPU-a"), Some(42));
        assert_eq!(Acks::read(dir.path()).get("GPU-b"), None);
    }
}
