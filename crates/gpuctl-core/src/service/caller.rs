//! The caller as the kernel names it, and how it numbers what the host sees: its PID
//! namespace (the `/proc/PID/ns/pid` inode), its level in the namespace tree (how many
//! entries its `NSpid` has), its user namespace's uid map and its time namespace's boot
//! clock offset.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::sys::peer;

/// `PROC_PID_INIT_INO`: the host's (initial) PID namespace.
pub const INIT_PID_NS_INODE: u64 = 0xEFFF_FFFC;

/// The kernel's overflow uid: what an unmapped uid reads as inside a user namespace.
pub const OVERFLOW_UID: u32 = 65534;

/// `NS_GET_PARENT` (`_IO(0xb7, 0x2)`): the parent of a PID namespace, as a new descriptor.
const NS_GET_PARENT: libc::c_ulong = 0xb702;

/// One line of a uid map: `inside outside count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UidRange {
    pub inside: u32,
    pub outside: u32,
    pub count: u32,
}

/// Who connected, pinned when the connection was accepted (before anything else is done
/// with it; under socket activation, before NVML is opened): the kernel's credentials from
/// connect(2) and, where the kernel has `SO_PEERPIDFD`, a pidfd on that very process, which
/// a process that later gets its pid can never pass for.
#[derive(Debug)]
pub struct Peer {
    /// Its pid in the service's namespace (`SO_PEERCRED`).
    pub pid: u32,
    /// Its effective uid at connect(2), in the host's terms.
    pub uid: u32,
    pidfd: Option<OwnedFd>,
    /// When it was accepted, in clock ticks since boot: without a pidfd, a process at the pid
    /// that started later is not the one that connected.
    accepted_ticks: Option<u64>,
}

impl Peer {
    /// The peer of an accepted connection.
    pub fn of(stream: &UnixStream) -> io::Result<Peer> {
        let accepted_ticks = boot_ticks_now();
        let creds = peer::credentials(stream)?;
        // A peer outside this service's PID namespace reads as pid 0.
        let pid = u32::try_from(creds.pid)
            .ok()
            .filter(|&pid| pid > 0)
            .ok_or_else(|| {
                io::Error::other("the caller is outside this service's PID namespace")
            })?;
        let pidfd = match peer::pidfd(stream) {
            Ok(fd) => Some(fd),
            // Gone already (kernels that refuse a pidfd on an exited peer): no answer is due.
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
                return Err(io::Error::other(exited(pid)));
            }
            Err(_) => None,
        };
        Ok(Peer {
            pid,
            uid: creds.uid,
            pidfd,
            accepted_ticks,
        })
    }

    /// Whether the process that connected is still alive at its pid (without a pidfd: whether
    /// some process is at that pid).
    pub fn alive(&self) -> bool {
        match &self.pidfd {
            Some(pidfd) => peer::pid_of(pidfd).is_ok_and(|pid| pid == Some(self.pid)),
            None => Path::new(&format!("/proc/{}", self.pid)).exists(),
        }
    }

    /// The connecting process's namespaces and maps, read from `proc_root`, once it is sure
    /// they are its own: with a pidfd, that process is still alive after the reads (so its
    /// pid was never another's meanwhile); without one, the process at the pid has the uid
    /// the kernel recorded at connect and started before the connection was accepted.
    pub fn caller(&self, proc_root: &Path) -> Result<Caller, String> {
        let caller = Caller::read(proc_root, self.pid, self.uid)
            .map_err(|e| format!("cannot read the caller (pid {}): {e}", self.pid))?;
        match &self.pidfd {
            Some(pidfd) => match peer::pid_of(pidfd) {
                Ok(Some(pid)) if pid == self.pid => Ok(caller),
                Ok(_) => Err(exited(self.pid)),
                Err(e) => Err(format!("cannot tell whether the caller is alive: {e}")),
            },
            None => same_process(&caller, self.accepted_ticks).map(|()| caller),
        }
    }
}

fn exited(pid: u32) -> String {
    format!("the caller (pid {pid}) exited before it was answered")
}

/// Without a pidfd: the process read at the pid is the one that connected unless it runs as
/// another uid than the kernel recorded at connect, or started after the accept.
fn same_process(caller: &Caller, accepted_ticks: Option<u64>) -> Result<(), String> {
    if caller.proc_uid.is_some_and(|uid| uid != caller.host_uid) {
        return Err(exited(caller.host_pid));
    }
    match (caller.start_ticks, accepted_ticks) {
        (Some(started), Some(accepted)) if started > accepted => Err(exited(caller.host_pid)),
        _ => Ok(()),
    }
}

/// The boot clock now, in clock ticks (the unit of a process's start time).
fn boot_ticks_now() -> Option<u64> {
    let at = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).ok()?;
    let at = Duration::from(at);
    let hz = procfs::ticks_per_second();
    Some((at.as_nanos() * u128::from(hz) / 1_000_000_000) as u64)
}

/// The process that connected, as read from the host's /proc.
#[derive(Debug, Clone)]
pub struct Caller {
    proc_root: PathBuf,
    /// Its pid in the service's (host) namespace, from `SO_PEERCRED`.
    pub host_pid: u32,
    /// Its effective uid in the host's terms, from `SO_PEERCRED`.
    pub host_uid: u32,
    pub pid_namespace: u64,
    /// Depth of its PID namespace: 0 for the host's.
    pub level: usize,
    /// Its pid as it sees itself.
    pub local_pid: u32,
    pub uid_map: Vec<UidRange>,
    /// Its time namespace's boot clock offset, in clock ticks (start times shift by it).
    pub boot_offset_ticks: i64,
    /// When it started, in the host's clock ticks since boot: a process that started after
    /// the connection was made is not the one that made it (its pid was reused).
    pub start_ticks: Option<u64>,
    /// The effective uid /proc shows for the pid now (the kernel's word at connect is
    /// `host_uid`).
    pub proc_uid: Option<u32>,
}

impl Caller {
    /// Reads the caller `pid` (host terms) with effective uid `uid` under `proc_root`.
    pub fn read(proc_root: &Path, pid: u32, uid: u32) -> io::Result<Caller> {
        let dir = proc_root.join(pid.to_string());
        let pid_namespace = std::fs::metadata(dir.join("ns/pid"))?.ino();
        let status = std::fs::read_to_string(dir.join("status"))?;
        let nspid = parse_nspid(&status).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}/status has no NSpid line", dir.display()),
            )
        })?;
        let proc_uid = parse_euid(&status);
        let level = nspid.len().saturating_sub(1);
        let local_pid = *nspid.last().unwrap_or(&pid);
        let uid_map = std::fs::read_to_string(dir.join("uid_map"))
            .map(|text| parse_uid_map(&text))
            .unwrap_or_else(|_| vec![identity_map()]);
        let boot_offset_ticks = std::fs::read_to_string(dir.join("timens_offsets"))
            .ok()
            .and_then(|text| boot_offset(&text))
            .map_or(0, |(secs, nanos)| {
                let tps = procfs::ticks_per_second() as i64;
                secs * tps + nanos * tps / 1_000_000_000
            });
        let start_ticks = std::fs::read_to_string(dir.join("stat"))
            .ok()
            .and_then(|stat| {
                stat.rsplit_once(')')?
                    .1
                    .split_whitespace()
                    .nth(19)?
                    .parse()
                    .ok()
            });
        Ok(Caller {
            start_ticks,
            proc_uid,
            proc_root: proc_root.to_path_buf(),
            host_pid: pid,
            host_uid: uid,
            pid_namespace,
            level,
            local_pid,
            uid_map,
            boot_offset_ticks,
        })
    }

    /// Whether the caller is in the host's PID namespace.
    pub fn in_host_namespace(&self) -> bool {
        self.pid_namespace == INIT_PID_NS_INODE || self.level == 0
    }

    /// The caller's own uid as it sees it.
    pub fn local_uid(&self) -> u32 {
        self.map_uid(self.host_uid)
    }

    /// `uid` (host terms) as the caller's user namespace maps it; [`OVERFLOW_UID`] where
    /// it maps it not.
    pub fn map_uid(&self, uid: u32) -> u32 {
        map_uid(&self.uid_map, uid)
    }

    /// A host start time (clock ticks since boot) as the caller's /proc shows it.
    pub fn local_start(&self, host_ticks: u64) -> u64 {
        host_ticks.saturating_add_signed(self.boot_offset_ticks)
    }

    /// The pid the caller knows host process `pid` by, where that process is in the
    /// caller's PID namespace or one below it; `None` otherwise (another container, the
    /// host, or gone). For a caller in the host namespace: `pid` itself. `below` remembers,
    /// per namespace inode, whether that namespace is below the caller's: processes share a
    /// few namespaces, so most cost one stat, and only the caller's own a status read.
    pub fn local_pid_of(&self, pid: u32, below: &mut HashMap<u64, bool>) -> Option<u32> {
        let dir = self.proc_root.join(pid.to_string());
        if self.in_host_namespace() {
            return dir.exists().then_some(pid);
        }
        let namespace = dir.join("ns/pid");
        let inode = std::fs::metadata(&namespace).ok()?.ino();
        let mine = inode == self.pid_namespace
            || *below
                .entry(inode)
                .or_insert_with(|| self.is_below(&namespace));
        if !mine {
            return None;
        }
        // Its namespace's entry at the caller's depth is the pid the caller sees.
        read_nspid(&dir).ok()?.get(self.level).copied()
    }

    /// Whether the PID namespace at `path` has the caller's among its ancestors.
    fn is_below(&self, path: &Path) -> bool {
        let Ok(file) = File::open(path) else {
            return false;
        };
        let mut current = OwnedFd::from(file);
        // The kernel nests PID namespaces at most 32 deep.
        for _ in 0..32 {
            let Some(parent) = parent_namespace(&current) else {
                return false;
            };
            let parent = File::from(parent);
            let Ok(meta) = parent.metadata() else {
                return false;
            };
            match meta.ino() {
                inode if inode == self.pid_namespace => return true,
                INIT_PID_NS_INODE => return false,
                _ => current = OwnedFd::from(parent),
            }
        }
        false
    }
}

/// The `NSpid` line of `dir/status`: the process's pid in each namespace, outermost first.
fn read_nspid(dir: &Path) -> io::Result<Vec<u32>> {
    let status = std::fs::read_to_string(dir.join("status"))?;
    parse_nspid(&status).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}/status has no NSpid line", dir.display()),
        )
    })
}

/// The effective uid on a status file's `Uid:` line (real, effective, saved, fs).
pub fn parse_euid(status: &str) -> Option<u32> {
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The pids on a status file's `NSpid:` line.
pub fn parse_nspid(status: &str) -> Option<Vec<u32>> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let pids: Option<Vec<u32>> = line.split_whitespace().map(|f| f.parse().ok()).collect();
    pids.filter(|p| !p.is_empty())
}

fn identity_map() -> UidRange {
    UidRange {
        inside: 0,
        outside: 0,
        count: u32::MAX,
    }
}

/// Parses `/proc/PID/uid_map` (read from the host: `outside` is in the host's terms).
pub fn parse_uid_map(text: &str) -> Vec<UidRange> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace().map(|f| f.parse::<u32>().ok());
            Some(UidRange {
                inside: fields.next()??,
                outside: fields.next()??,
                count: fields.next()??,
            })
        })
        .collect()
}

/// `uid` (host terms) through `map`, as the kernel's `from_kuid_munged` does.
pub fn map_uid(map: &[UidRange], uid: u32) -> u32 {
    map.iter()
        .find(|r| uid >= r.outside && u64::from(uid) < u64::from(r.outside) + u64::from(r.count))
        .map_or(OVERFLOW_UID, |r| r.inside + (uid - r.outside))
}

/// The `boottime SECS NANOS` line of `/proc/PID/timens_offsets`.
fn boot_offset(text: &str) -> Option<(i64, i64)> {
    let line = text.lines().find_map(|l| l.strip_prefix("boottime"))?;
    let mut fields = line.split_whitespace().map(|f| f.parse::<i64>().ok());
    Some((fields.next()??, fields.next()??))
}

/// The parent PID namespace of `namespace`, or `None` at the top (or where refused).
fn parent_namespace(namespace: &OwnedFd) -> Option<OwnedFd> {
    // SAFETY: NS_GET_PARENT takes no argument and returns a new descriptor or -1; the
    // descriptor passed is open for the call's duration.
    let fd = unsafe { libc::ioctl(namespace.as_raw_fd(), NS_GET_PARENT as _) };
    // SAFETY: a non-negative return is a new descriptor that we now own.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nspid_lists_pids_outermost_first() {
        let status = "Name:\tpython\nTgid:\t4242\nNSpid:\t4242\t17\t3\nPPid:\t1\n";
        assert_eq!(parse_nspid(status), Some(vec![4242, 17, 3]));
        assert_eq!(parse_nspid("Name:\tx\n"), None);
        assert_eq!(parse_nspid("NSpid:\t\n"), None);
    }

    #[test]
    fn uids_map_through_the_ranges_and_unmapped_ones_overflow() {
        let map =
            parse_uid_map("         0       1000          1\n         1     100000      65536\n");
        assert_eq!(map_uid(&map, 1000), 0);
        assert_eq!(map_uid(&map, 100000), 1);
        assert_eq!(map_uid(&map, 100005), 6);
        assert_eq!(map_uid(&map, 165536), OVERFLOW_UID, "past the range");
        assert_eq!(map_uid(&map, 0), OVERFLOW_UID, "host root is unmapped");
        assert_eq!(map_uid(&[identity_map()], 4321), 4321);
        assert!(parse_uid_map("garbage\n1 2\n").is_empty());
    }

    #[test]
    fn the_boot_offset_is_read_from_timens_offsets() {
        assert_eq!(
            boot_offset("monotonic 0 0\nboottime -5 250000000\n"),
            Some((-5, 250000000))
        );
        assert_eq!(boot_offset("monotonic 1 0\n"), None);
    }

    #[test]
    fn without_a_pidfd_a_caller_of_another_uid_or_started_after_the_accept_is_refused() {
        let me = std::process::id();
        let uid = nix::unistd::geteuid().as_raw();
        let caller = Caller::read(Path::new("/proc"), me, uid).unwrap();
        let started = caller.start_ticks.unwrap();
        assert_eq!(same_process(&caller, Some(started + 10)), Ok(()));
        assert!(
            same_process(&caller, Some(started - 1)).is_err(),
            "started after"
        );
        let other = Caller {
            host_uid: uid + 1,
            ..caller.clone()
        };
        let refused = same_process(&other, Some(started + 10)).unwrap_err();
        assert!(
            refused.contains("exited before it was answered"),
            "{refused}"
        );
        assert_eq!(parse_euid("Uid:\t1000\t0\t0\t0\n"), Some(0));
    }

    /// This process, asking about itself: whatever namespace the tests run in, it finds
    /// itself by the pid it knows itself by.
    #[test]
    fn a_caller_finds_itself() {
        let me = std::process::id();
        let caller = Caller::read(Path::new("/proc"), me, nix::unistd::geteuid().as_raw()).unwrap();
        assert_eq!(caller.local_pid, me);
        assert_eq!(caller.local_pid_of(me, &mut HashMap::new()), Some(me));
        assert_eq!(caller.local_uid(), nix::unistd::geteuid().as_raw());
    }
}
