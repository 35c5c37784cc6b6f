//! Who has the NVIDIA driver's device files open: `/dev/nvidia<minor>` (one per GPU),
//! `/dev/nvidiactl` and `/dev/nvidia-uvm`. Every CUDA context and every NVML client holds
//! them, so a process holding a GPU's file while NVML does not list it on that GPU is where
//! memory "nobody accounts for" may be (`fuser -v /dev/nvidia*`, without the noise).
//!
//! The scan reads every process's descriptors, so callers run it only when asked or when a
//! GPU has unattributed memory worth explaining.

use std::collections::BTreeMap;
use std::path::Path;

use crate::sys::fds;

/// One of the driver's device files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum DeviceFile {
    /// `nvidia<minor>`: the GPU with this minor number (`nvmlDeviceGetMinorNumber`).
    Gpu(u32),
    /// `nvidiactl`
    Control,
    /// `nvidia-uvm`
    Uvm,
}

/// Why the holders of the GPU with minor number `minor` cannot be looked for in `dev_dir`,
/// if they cannot: descriptors are matched by the file's path, so a device file missing from
/// the device directory (a wrong `dev_dir`, a container without the files) would read as "no
/// holder" when nothing was looked for.
pub fn not_scannable(dev_dir: &Path, minor: Option<u32>) -> Option<String> {
    let Some(minor) = minor else {
        return Some("its minor number, and so its device file, is unknown".to_string());
    };
    let file = dev_dir.join(format!("nvidia{minor}"));
    match std::fs::symlink_metadata(&file) {
        Ok(_) => None,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Some(format!(
            "{} does not exist (dev_dir {})",
            file.display(),
            dev_dir.display()
        )),
        Err(error) => Some(format!("{} cannot be read ({error})", file.display())),
    }
}

/// The device file a descriptor target names, if it is one in `dev_dir` (a path without a
/// trailing slash, e.g. `/dev`).
pub fn device_file(target: &[u8], dev_dir: &[u8]) -> Option<DeviceFile> {
    let name = target.strip_prefix(dev_dir)?.strip_prefix(b"/")?;
    match name {
        b"nvidiactl" => Some(DeviceFile::Control),
        b"nvidia-uvm" => Some(DeviceFile::Uvm),
        _ => {
            let digits = name.strip_prefix(b"nvidia")?;
            if digits.is_empty() || digits.len() > 3 || !digits.iter().all(u8::is_ascii_digit) {
                return None;
            }
            std::str::from_utf8(digits)
                .ok()?
                .parse()
                .ok()
                .map(DeviceFile::Gpu)
        }
    }
}

/// The processes holding each device file, by ascending pid.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceHolders {
    pub holders: BTreeMap<DeviceFile, Vec<u32>>,
    /// Processes whose descriptors were read, and those that could not be (gone meanwhile,
    /// or not readable by this user: their holdings are unknown).
    pub scanned: usize,
    pub unreadable: usize,
}

impl DeviceHolders {
    /// The pids holding GPU `minor`'s file.
    pub fn of_gpu(&self, minor: u32) -> &[u32] {
        self.holders
            .get(&DeviceFile::Gpu(minor))
            .map_or(&[], Vec::as_slice)
    }
}

/// Reads every process's descriptors (from /proc) for the device files in `dev_dir`. The
/// cost is one readlinkat per open descriptor on the host, so the processes are shared out
/// among threads, one per CPU (at most 16).
pub fn scan(dev_dir: &Path) -> std::io::Result<DeviceHolders> {
    let dev_dir = dev_dir.as_os_str().as_encoded_bytes();
    let dev_dir = match dev_dir {
        [rest @ .., b'/'] if !rest.is_empty() => rest,
        whole => whole,
    };
    let pids: Vec<u32> = std::fs::read_dir("/proc")?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 16)
        .min(pids.len().div_ceil(64).max(1));
    let chunk = pids.len().div_ceil(threads).max(1);
    let parts: Vec<Scanned> = std::thread::scope(|scope| {
        let workers: Vec<_> = pids
            .chunks(chunk)
            .map(|pids| scope.spawn(move || scan_pids(pids, dev_dir)))
            .collect();
        workers
            .into_iter()
            .map(|worker| worker.join().unwrap_or_default())
            .collect()
    });
    let mut out = DeviceHolders::default();
    for (held, scanned, unreadable) in parts {
        out.scanned += scanned;
        out.unreadable += unreadable;
        for (pid, files) in held {
            for file in files {
                out.holders.entry(file).or_default().push(pid);
            }
        }
    }
    for pids in out.holders.values_mut() {
        pids.sort_unstable();
    }
    Ok(out)
}

/// The device files each process holds (those holding any), how many processes were read,
/// and how many could not be.
type Scanned = (Vec<(u32, Vec<DeviceFile>)>, usize, usize);

fn scan_pids(pids: &[u32], dev_dir: &[u8]) -> Scanned {
    let (mut held, mut scanned, mut unreadable) = (Vec::new(), 0, 0);
    for &pid in pids {
        let mut files: Vec<DeviceFile> = Vec::new();
        let mut note = |target: &[u8]| {
            if let Some(file) = device_file(target, dev_dir)
                && !files.contains(&file)
            {
                files.push(file);
            }
        };
        match fds::each_target(pid, &mut note) {
            // No descriptors: a kernel thread, or a zombie leader whose other threads still
            // hold the files (its own table is gone): look through its threads.
            Ok(0) => {
                scanned += 1;
                for tid in threads(pid).into_iter().filter(|&tid| tid != pid) {
                    let _ = fds::each_task_target(pid, tid, &mut note);
                }
            }
            Ok(_) => scanned += 1,
            Err(_) => unreadable += 1,
        }
        if !files.is_empty() {
            held.push((pid, files));
        }
    }
    (held, scanned, unreadable)
}

/// The thread ids of `pid` (none when it is gone).
fn threads(pid: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|entries| {
            entries
                .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_files_are_named_as_the_driver_names_them() {
        let dev = b"/dev";
        assert_eq!(device_file(b"/dev/nvidia0", dev), Some(DeviceFile::Gpu(0)));
        assert_eq!(
            device_file(b"/dev/nvidia17", dev),
            Some(DeviceFile::Gpu(17))
        );
        assert_eq!(
            device_file(b"/dev/nvidiactl", dev),
            Some(DeviceFile::Control)
        );
        assert_eq!(device_file(b"/dev/nvidia-uvm", dev), Some(DeviceFile::Uvm));
        for other in [
            &b"/dev/nvidia-uvm-tools"[..],
            b"/dev/nvidia-modeset",
            b"/dev/nvidia-caps/nvidia-cap1",
            b"/dev/nvidia",
            b"/dev/nvidia0x",
            b"/dev/nvidia1234",
            b"/dev/nvidia0 (deleted)",
            b"/devx/nvidia0",
            b"/var/dev/nvidia0",
            b"socket:[1234]",
            b"/dev/null",
        ] {
            assert_eq!(
                device_file(other, dev),
                None,
                "{}",
                String::from_utf8_lossy(other)
            );
        }
        assert_eq!(
            device_file(b"/run/sim/dev/nvidia3", b"/run/sim/dev"),
            Some(DeviceFile::Gpu(3))
        );
    }

    #[test]
    fn a_held_file_is_found_under_its_holder() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("nvidia2"), b"").unwrap();
        std::fs::write(dir.path().join("nvidiactl"), b"").unwrap();
        let _gpu = std::fs::File::open(dir.path().join("nvidia2")).unwrap();
        let _ctl = std::fs::File::open(dir.path().join("nvidiactl")).unwrap();
        let found = scan(dir.path()).unwrap();
        let me = std::process::id();
        assert!(found.of_gpu(2).contains(&me), "{found:?}");
        assert!(found.holders[&DeviceFile::Control].contains(&me));
        assert!(found.of_gpu(0).is_empty());
        assert!(found.scanned > 1);
        // A trailing slash names the same directory.
        let mut slashed = dir.path().as_os_str().to_owned();
        slashed.push("/");
        assert!(scan(Path::new(&slashed)).unwrap().of_gpu(2).contains(&me));
    }
}
