//! The stand-ins' cgroups. A scenario names each as its manager would make it
//! (`/system.slice/slurmstepd.scope/job_812/step_0`); the launcher, as root, makes that path
//! inside a private subtree of each hierarchy managers put processes in (cgroup v2, and
//! v1's named `systemd` hierarchy on hybrid hosts), never in the host's own slices, and runs
//! the stand-ins and COMMAND in cgroup namespaces rooted at the subtree (as `unshare
//! --cgroup` does). /proc/PID/cgroup, read from such a namespace, then says exactly what the
//! manager would have written, and nothing of the host's own hierarchy.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What a subtree's name starts with: `nvml-sim-run.<launcher pid>.<nanos>`.
const PREFIX: &str = "nvml-sim-run.";

/// A mounted hierarchy the subtree is made in.
#[derive(Debug)]
struct Hierarchy {
    mount: PathBuf,
    /// The launcher's own cgroup there, where processes left in the subtree go back to.
    own: PathBuf,
}

/// The run's private subtree in every hierarchy; removed on drop (after the stand-ins and
/// COMMAND have ended: drop it after them).
#[derive(Debug)]
pub struct Subtree {
    hierarchies: Vec<Hierarchy>,
    name: String,
    /// Every directory made, parents before children.
    made: Vec<PathBuf>,
}

/// How a process enters its cgroup: its `cgroup.procs` files, prepared before the fork, so
/// that the child writes them without allocating.
#[derive(Debug, Clone)]
pub struct Entry {
    roots: Vec<CString>,
    leaves: Vec<CString>,
}

impl Subtree {
    /// Makes the subtree and `paths` in it, in each hierarchy the host mounts. An error
    /// (no hierarchy, no right to write one) leaves nothing behind.
    pub fn create(paths: &[&str]) -> Result<Subtree, String> {
        let hierarchies = hierarchies()?;
        for h in &hierarchies {
            remove_stale(&h.mount);
        }
        let nanos = super::clock_nanos();
        let mut subtree = Subtree {
            hierarchies,
            name: format!("{PREFIX}{}.{nanos:08x}", std::process::id()),
            made: Vec::new(),
        };
        let roots: Vec<PathBuf> = subtree
            .hierarchies
            .iter()
            .map(|h| h.mount.join(&subtree.name))
            .collect();
        for root in roots {
            subtree.make(&root)?;
            for path in paths {
                let mut dir = root.clone();
                for name in path.split('/').filter(|n| !n.is_empty()) {
                    dir.push(name);
                    if !dir.is_dir() {
                        subtree.make(&dir)?;
                    }
                }
            }
        }
        Ok(subtree)
    }

    fn make(&mut self, dir: &Path) -> Result<(), String> {
        std::fs::create_dir(dir)
            .map_err(|e| format!("cannot create the cgroup {}: {e}", dir.display()))?;
        self.made.push(dir.to_path_buf());
        Ok(())
    }

    /// How a process enters the subtree's root (COMMAND: its own cgroup then reads `/`) or
    /// the cgroup `leaf` in it.
    pub fn entry(&self, leaf: Option<&str>) -> Entry {
        let procs = |dir: PathBuf| {
            CString::new(dir.join("cgroup.procs").as_os_str().as_bytes())
                .expect("validated cgroup paths hold no NUL")
        };
        let root_of = |h: &Hierarchy| h.mount.join(&self.name);
        Entry {
            roots: self.hierarchies.iter().map(|h| procs(root_of(h))).collect(),
            leaves: leaf
                .map(|leaf| {
                    self.hierarchies
                        .iter()
                        .map(|h| procs(root_of(h).join(leaf.trim_start_matches('/'))))
                        .collect()
                })
                .unwrap_or_default(),
        }
    }
}

impl Entry {
    /// Moves the calling process into the subtree's root in every hierarchy, makes a cgroup
    /// namespace rooted there, then moves it down to its leaf. For a child between fork and
    /// exec: only async-signal-safe calls.
    pub fn enter(&self) -> io::Result<()> {
        for root in &self.roots {
            move_self(root)?;
        }
        // SAFETY: unshare takes flags only.
        if unsafe { libc::unshare(libc::CLONE_NEWCGROUP) } != 0 {
            return Err(io::Error::last_os_error());
        }
        for leaf in &self.leaves {
            move_self(leaf)?;
        }
        Ok(())
    }
}

/// Writes `0` (this process) into the `cgroup.procs` file `procs`.
fn move_self(procs: &CString) -> io::Result<()> {
    // SAFETY: open/write/close on a NUL-terminated path we own; the descriptor is closed here.
    unsafe {
        let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let written = libc::write(fd, c"0".as_ptr().cast(), 1);
        let error = io::Error::last_os_error();
        libc::close(fd);
        if written != 1 {
            return Err(error);
        }
    }
    Ok(())
}

impl Drop for Subtree {
    /// Gives processes still in the subtree (what COMMAND left running) back to the
    /// launcher's own cgroup, then removes the directories, innermost first. Processes that
    /// are exiting are waited for, two seconds at most.
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(2);
        for dir in self.made.iter().rev() {
            let own = self
                .hierarchies
                .iter()
                .find(|h| dir.starts_with(&h.mount))
                .map(|h| h.own.join("cgroup.procs"));
            loop {
                if let (Ok(pids), Some(own)) =
                    (std::fs::read_to_string(dir.join("cgroup.procs")), &own)
                {
                    for pid in pids.lines() {
                        let _ = std::fs::write(own, pid);
                    }
                }
                match std::fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    Err(e) => {
                        eprintln!("nvml-sim: cannot remove the cgroup {}: {e}", dir.display());
                        break;
                    }
                }
            }
        }
    }
}

/// The hierarchies to use: cgroup v2's, and v1's named `systemd` one, as mounted here
/// (/proc/self/mountinfo); the first mount of each.
fn hierarchies() -> Result<Vec<Hierarchy>, String> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let (mut v2, mut systemd) = (None, None);
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let Some(mount) = left.split(' ').nth(4) else {
            continue;
        };
        let mut right = right.split(' ');
        let (fstype, options) = (right.next(), right.nth(1).unwrap_or(""));
        match fstype {
            Some("cgroup2") if v2.is_none() => v2 = Some(unescape(mount)),
            Some("cgroup")
                if systemd.is_none() && options.split(',').any(|o| o == "name=systemd") =>
            {
                systemd = Some(unescape(mount))
            }
            _ => {}
        }
    }
    // /proc/self/cgroup: `0::PATH` for v2, `N:name=systemd:PATH` for v1's systemd.
    let own_path = |wanted: &dyn Fn(&str, &str) -> bool| {
        own.lines()
            .filter_map(|l| {
                let mut parts = l.splitn(3, ':');
                Some((parts.next()?, parts.next()?, parts.next()?))
            })
            .find(|(id, controllers, _)| wanted(id, controllers))
            .map(|(_, _, path)| path.trim_start_matches('/').to_string())
            .unwrap_or_default()
    };
    let mut found = Vec::new();
    if let Some(mount) = systemd {
        let own = own_path(&|_, c| c.split(',').any(|c| c == "name=systemd"));
        found.push(Hierarchy {
            own: mount.join(own),
            mount,
        });
    }
    if let Some(mount) = v2 {
        let own = own_path(&|id, c| id == "0" && c.is_empty());
        found.push(Hierarchy {
            own: mount.join(own),
            mount,
        });
    }
    if found.is_empty() {
        return Err("no cgroup hierarchy to make the stand-ins' cgroups in (neither cgroup2 nor v1's name=systemd is mounted)".into());
    }
    Ok(found)
}

/// A mountinfo field: spaces, tabs, newlines and backslashes come as `\ooo`.
fn unescape(field: &str) -> PathBuf {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|d| {
            d.iter()
                .all(|b| (b'0'..=b'7').contains(b))
                .then(|| d.iter().fold(0u32, |n, b| n * 8 + u32::from(b - b'0')))
        });
        match (bytes[i], octal) {
            (b'\\', Some(n)) if n <= 0xff => {
                out.push(n as u8);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    PathBuf::from(std::ffi::OsStr::from_bytes(&out))
}

/// Removes the empty subtrees of launchers that are gone (killed before they could): only
/// directories, innermost first, so a cgroup that still holds a process stays.
fn remove_stale(mount: &Path) {
    let Ok(entries) = std::fs::read_dir(mount) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(PREFIX))
            .and_then(|rest| rest.split('.').next())
            .and_then(|pid| pid.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: signal 0 only checks that the process exists.
        let gone = pid > 0
            && unsafe { libc::kill(pid, 0) } != 0
            && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone {
            remove_tree(&entry.path());
        }
    }
}

fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_fields_are_unescaped() {
        assert_eq!(
            unescape("/sys/fs/cgroup/a\\040b\\134c"),
            Path::new("/sys/fs/cgroup/a b\\c")
        );
        assert_eq!(unescape("/x\\04"), Path::new("/x\\04"));
    }
}
