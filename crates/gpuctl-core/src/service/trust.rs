//! Whether the socket a client reached is the host's service, before anything is asked of it.
//!
//! The rendezvous directory is shared by every container that mounts it; were it writable,
//! root in any one of them could unlink the socket and bind its own, and answer the others
//! (hide their leftovers, pass their `clear --wait`). The path proves nothing, so the client
//! asks the kernel who listens:
//!
//! 1. Where the kernel can say (Linux 6.11+, and this process may inspect the listener):
//!    the listener's pidfd (`SO_PEERPIDFD`) names its PID namespace, which must be a proper
//!    ancestor of this process's (a container's processes live in their own namespace or
//!    below it, never above: no container can put a process there), and its user namespace,
//!    which must be the initial one, as root (`SO_PEERCRED`). A process of this container, of
//!    a sibling container or of a user on the host fails. Under socket activation the
//!    listener is systemd, which passes.
//! 2. Where it cannot (an older kernel, or a caller the kernel does not let inspect a root
//!    process: another uid, a user namespace): the socket's directory must be on a read-only
//!    mount and owned by root (from inside a user namespace: by a uid it does not map), and
//!    writable by nobody else, so no one in the container could have replaced the socket.
//!    That is the documented mount (`-v /run/gpuctl:/run/gpuctl:ro`, `readOnly: true`).
//!
//! A socket that fails is not asked: its processes stay unconfirmed, and the front's hint
//! says why.

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::Path;

use crate::sys::peer;

/// Why the service at a socket was not believed, in one line.
pub type Refusal = String;

/// Checks the listener of `stream`, reached at `socket`.
pub fn check(stream: &UnixStream, socket: &Path) -> Result<(), Refusal> {
    let why_unsure = match by_namespace(stream) {
        Namespace::Host => return Ok(()),
        Namespace::Not(reason) => return Err(reason),
        Namespace::Unknown(why) => why,
    };
    by_mount(socket).map_err(|mount| {
        format!("cannot tell it is the host's service ({why_unsure}), and {mount}")
    })
}

enum Namespace {
    Host,
    Not(Refusal),
    /// The kernel did not say: why, for the hint.
    Unknown(String),
}

fn by_namespace(stream: &UnixStream) -> Namespace {
    let unknown = |what: &str, error: &io::Error| {
        Namespace::Unknown(if peer::unsupported(error) {
            format!("this kernel does not report {what}; Linux 6.11 does")
        } else {
            format!("the kernel did not report {what}: {error}")
        })
    };
    let creds = match peer::credentials(stream) {
        Ok(creds) => creds,
        Err(e) => return Namespace::Not(format!("the kernel did not say who listens: {e}")),
    };
    let pidfd = match peer::pidfd(stream) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
            return Namespace::Not("the process that listens on it has exited".into());
        }
        Err(e) => return unknown("who listens", &e),
    };
    let namespace = match peer::pid_namespace(&pidfd) {
        Ok(ns) => ns,
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
            return Namespace::Not("the process that listens on it has exited".into());
        }
        Err(e) => return unknown("the listener's PID namespace", &e),
    };
    let own = match File::open("/proc/self/ns/pid") {
        Ok(own) => own,
        Err(e) => return unknown("this process's PID namespace", &e),
    };
    match peer::same_namespace(&namespace, &own) {
        Ok(true) => {
            return Namespace::Not(
                "a process of this container's own PID namespace listens on it, not the host"
                    .into(),
            );
        }
        Ok(false) => {}
        Err(e) => return unknown("the listener's PID namespace", &e),
    }
    match peer::is_own_or_ancestor(&namespace) {
        Ok(true) => {}
        Ok(false) => {
            return Namespace::Not(
                "a process of another container listens on it (its PID namespace is not an \
                 ancestor of this one)"
                    .into(),
            );
        }
        Err(e) => return unknown("whether the listener's namespace is above this one", &e),
    }
    let user = match peer::user_namespace(&pidfd) {
        Ok(user) => user,
        Err(e) => return unknown("the listener's user namespace", &e),
    };
    let initial = user
        .metadata()
        .is_ok_and(|meta| meta.ino() == peer::INIT_USER_NS_INODE);
    if !initial || creds.uid != 0 {
        return Namespace::Not(format!(
            "it listens as uid {} {}, not as root of the host",
            creds.uid,
            if initial {
                "of the host"
            } else {
                "of a user namespace"
            }
        ));
    }
    Namespace::Host
}

/// The fallback: the socket's directory is a read-only mount of a directory only root could
/// have written in.
fn by_mount(socket: &Path) -> Result<(), String> {
    let dir = match socket.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let shown = dir.display();
    let meta = std::fs::metadata(dir).map_err(|e| format!("{shown}: {e}"))?;
    let read_only = nix::sys::statvfs::statvfs(dir)
        .map_err(|e| format!("{shown}: {e}"))?
        .flags()
        .contains(nix::sys::statvfs::FsFlags::ST_RDONLY);
    if !read_only {
        return Err(format!(
            "{shown} is not mounted read-only (mount the host's directory with :ro, or \
             readOnly: true)"
        ));
    }
    if !owned_by_root(meta.uid()) || meta.mode() & 0o022 != 0 {
        return Err(format!(
            "{shown} is not a directory only root can write in (uid {}, mode {:o})",
            meta.uid(),
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

/// Root's, as this process sees owners: uid 0, or from inside a user namespace that does not
/// map the host's root, the overflow uid, where this namespace maps no uid to it.
fn owned_by_root(uid: u32) -> bool {
    if uid == 0 {
        return true;
    }
    let overflow = std::fs::read_to_string("/proc/sys/kernel/overflowuid")
        .ok()
        .and_then(|text| text.trim().parse::<u32>().ok())
        .unwrap_or(65534);
    let Ok(map) = std::fs::read_to_string("/proc/self/uid_map") else {
        return false;
    };
    uid == overflow && !maps_inside(&map, uid)
}

/// Whether a uid map (`/proc/self/uid_map`) has `uid` on its inside.
fn maps_inside(map: &str, uid: u32) -> bool {
    super::caller::parse_uid_map(map)
        .iter()
        .any(|r| uid >= r.inside && u64::from(uid) < u64::from(r.inside) + u64::from(r.count))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unmapped_uid_is_one_the_map_has_not_inside() {
        let rootless = "         0      65534          1\n";
        assert!(!maps_inside(rootless, 65534));
        assert!(maps_inside(rootless, 0));
        let whole = "         0          0 4294967295\n";
        assert!(maps_inside(whole, 65534));
    }

    /// This process, listening and asking itself: in the test's own namespace, which is not a
    /// proper ancestor of itself.
    #[test]
    fn a_listener_in_the_askers_own_namespace_is_refused_where_the_kernel_says() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("api.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let stream = UnixStream::connect(&path).unwrap();
        match by_namespace(&stream) {
            Namespace::Not(reason) => assert!(reason.contains("own PID namespace"), "{reason}"),
            // A kernel before 6.11: the fallback below is what decides there.
            Namespace::Unknown(why) => assert!(why.contains("kernel"), "{why}"),
            Namespace::Host => panic!("a process of the asker's own namespace was believed"),
        }
        // And the fallback refuses a writable scratch directory.
        let refusal = by_mount(&path).unwrap_err();
        assert!(refusal.contains("not mounted read-only"), "{refusal}");
    }
}
