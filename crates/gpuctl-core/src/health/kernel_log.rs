//! The kernel's own Xid lines: NVML's Xid event carries no pid, the driver's log line does
//! (`NVRM: Xid (PCI:0000:18:00): 13, pid=8202, name=python3, Graphics Exception: ...`), as
//! NVIDIA's node monitors read it. The watchdog reads them from `/dev/kmsg` (or the file
//! `[watchdog] kernel_log` / `GPUCTL_KERNEL_LOG` names, in kmsg's record format), keyed by
//! the GPU's bus id, bounded, from where it left off: the last record's sequence number is
//! kept in the state directory with the boot's id, so a restart never reads old lines as
//! new (after a reboot, or without a record, it starts at the log's end).

use std::collections::VecDeque;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// The kernel's log.
pub const KMSG: &str = "/dev/kmsg";
/// Where the watchdog keeps its place, in its state directory.
pub const PLACE_FILE: &str = "kernel-log.json";
/// How long an Xid event waits for its kernel line before its culprit is unknown.
pub const CULPRIT_WINDOW: Duration = Duration::from_millis(1000);
/// The most bytes read in one pass: a flood of kernel messages cannot stall the loop.
const MAX_BYTES_PER_READ: usize = 1 << 20;
/// The most Xid lines held waiting for their event, and for how long.
const MAX_PENDING: usize = 256;
const PENDING_FOR: Duration = Duration::from_secs(30);

/// A PCI address as the kernel's Xid line gives it: domain, bus, device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PciAddress {
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
}

impl PciAddress {
    /// NVML's `00000000:18:00.0` (or `0000:18:00.0`, `18:00.0`), or the kernel's
    /// `0000:18:00`.
    pub fn parse(text: &str) -> Option<PciAddress> {
        let without_function = text.split('.').next()?;
        let parts: Vec<&str> = without_function.split(':').collect();
        let hex = |s: &str| u32::from_str_radix(s, 16).ok();
        match parts.as_slice() {
            [domain, bus, device] => Some(PciAddress {
                domain: hex(domain)?,
                bus: hex(bus)?,
                device: hex(device)?,
            }),
            [bus, device] => Some(PciAddress {
                domain: 0,
                bus: hex(bus)?,
                device: hex(device)?,
            }),
            _ => None,
        }
    }
}

/// One Xid line of the kernel's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelXid {
    pub address: PciAddress,
    pub xid: u32,
    /// The process the driver named; `None` for `pid='<unknown>'`.
    pub pid: Option<u32>,
    pub name: Option<String>,
}

/// The Xid in one kernel message, if it is an NVRM Xid line.
pub fn parse_message(message: &str) -> Option<KernelXid> {
    let rest = message.trim_start().strip_prefix("NVRM: Xid (PCI:")?;
    let (address, rest) = rest.split_once("):")?;
    let mut fields = rest.split(',').map(str::trim);
    let xid = fields.next()?.parse().ok()?;
    let (mut pid, mut name) = (None, None);
    for field in fields.take(2) {
        let unquoted = |v: &str| v.trim_matches(['\'', '"']).to_string();
        if let Some(value) = field.strip_prefix("pid=") {
            pid = unquoted(value).parse().ok();
        } else if let Some(value) = field.strip_prefix("name=") {
            name = Some(unquoted(value)).filter(|n| !n.is_empty() && n != "<unknown>");
        }
    }
    Some(KernelXid {
        address: PciAddress::parse(address)?,
        xid,
        pid,
        name,
    })
}

/// A kmsg record, `PRIORITY,SEQ,MICROS,FLAGS[,...];MESSAGE`: its sequence number and
/// message. Continuation lines (` KEY=VALUE`) are not records.
pub fn parse_record(line: &str) -> Option<(u64, &str)> {
    let (header, message) = line.split_once(';')?;
    let seq = header.split(',').nth(1)?.parse().ok()?;
    Some((seq, message))
}

/// Where the reader left off: the boot and the last record's sequence number.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Place {
    pub boot_id: String,
    pub seq: u64,
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|id| id.trim().to_string())
        .unwrap_or_default()
}

impl Place {
    pub fn read(dir: &Path) -> Option<Place> {
        let path = dir.join(PLACE_FILE);
        let small = std::fs::metadata(&path).is_ok_and(|m| m.len() <= 4096);
        serde_json::from_slice(&std::fs::read(small.then_some(path)?).ok()?).ok()
    }

    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        let mut bytes = serde_json::to_vec(self).map_err(std::io::Error::other)?;
        bytes.push(b'\n');
        crate::files::replace(&dir.join(PLACE_FILE), &bytes, 0o644, false)
    }
}

/// The kernel's log, read as it grows.
#[derive(Debug)]
pub struct KernelLog {
    pub path: PathBuf,
    file: std::fs::File,
    /// Records up to this one were read (or skipped as old).
    last_seq: Option<u64>,
    partial: Vec<u8>,
    pending: VecDeque<(Instant, KernelXid)>,
}

impl KernelLog {
    /// Opens `path`, to continue after `place` when it is this boot's, else at the end.
    pub fn open(path: &Path, place: Option<&Place>) -> std::io::Result<KernelLog> {
        use std::io::Seek;
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
            .open(path)?;
        let resume = place.filter(|p| p.boot_id == boot_id()).map(|p| p.seq);
        if resume.is_none() {
            file.seek(std::io::SeekFrom::End(0))?;
        }
        let mut log = KernelLog {
            path: path.to_path_buf(),
            file,
            last_seq: resume,
            partial: Vec::new(),
            pending: VecDeque::new(),
        };
        // What was written while no reader ran belongs to Xid events no reader took (a
        // driver does not replay them): read past it, never claimed by a new event.
        log.read_new();
        log.pending.clear();
        Ok(log)
    }

    /// Where it is now, to be kept for the next start.
    pub fn place(&self) -> Option<Place> {
        self.last_seq.map(|seq| Place {
            boot_id: boot_id(),
            seq,
        })
    }

    /// Reads what was added since, at most [`MAX_BYTES_PER_READ`], keeping the Xid lines.
    pub fn read_new(&mut self) {
        let mut buf = vec![0u8; 16 * 1024];
        let mut total = 0;
        while total < MAX_BYTES_PER_READ {
            match self.file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    total += n;
                    self.partial.extend_from_slice(&buf[..n]);
                    self.take_lines();
                }
                // kmsg: a record overwritten before it was read; the next read goes on.
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        let now = Instant::now();
        while self
            .pending
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) > PENDING_FOR)
        {
            self.pending.pop_front();
        }
    }

    fn take_lines(&mut self) {
        while let Some(end) = self.partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line[..end]);
            let Some((seq, message)) = parse_record(&line) else {
                continue;
            };
            if self.last_seq.is_some_and(|last| seq <= last) {
                continue;
            }
            self.last_seq = Some(seq);
            if let Some(xid) = parse_message(message) {
                if self.pending.len() >= MAX_PENDING {
                    self.pending.pop_front();
                }
                self.pending.push_back((Instant::now(), xid));
            }
        }
        // A line longer than any record is not one: dropped rather than held.
        if self.partial.len() > 64 * 1024 {
            self.partial.clear();
        }
    }

    /// The oldest unclaimed line for Xid `xid` on the GPU at `address`, claimed.
    pub fn take(&mut self, address: PciAddress, xid: u32) -> Option<KernelXid> {
        let at = self
            .pending
            .iter()
            .position(|(_, line)| line.address == address && line.xid == xid)?;
        self.pending.remove(at).map(|(_, line)| line)
    }
}

/// The processes an Xid is recorded against, from those on its GPU (`on_gpu`) and its
/// kernel line: the one process the kernel named (as the GPU listed it, else as the line
/// names it: it may have left the GPU already); without a named process, nobody for an
/// application Xid (its culprit is unknown, never guessed among the GPU's tenants), and
/// every process on the GPU for a GPU-level one (they are what it hit).
pub fn culprits(
    on_gpu: Vec<super::XidProcess>,
    line: Option<&KernelXid>,
    app_caused: bool,
) -> Vec<super::XidProcess> {
    match line.and_then(|l| l.pid.map(|pid| (pid, l))) {
        Some((pid, line)) => {
            let named = on_gpu.into_iter().find(|p| p.pid == pid);
            vec![named.unwrap_or_else(|| super::XidProcess {
                pid,
                command: line.name.clone(),
                ..super::XidProcess::default()
            })]
        }
        None if app_caused => Vec::new(),
        None => on_gpu,
    }
}

#[cfg(test)]
mod tests;
