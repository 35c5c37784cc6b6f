//! The last known names of the pods seen on a GPU, kept in gpuctl's state directory
//! (`pods.json`), so that a pod's leftover can be named after the runtime forgot the pod.
//!
//! Nothing else keeps them: a process's cgroup carries only the pod's UID, and the runtime
//! drops the pod's metadata with its sandbox. A name is kept with the socket it was learned
//! through: a UID only some other runtime knew is never taken for one this runtime had and
//! removed. The file is written only when a pod is new to it (or its `last_seen_unix` is an
//! hour old), merged with what is on disk then, bounded ([`MAX_PODS`], [`RETENTION_SECS`],
//! [`MAX_FILE_BYTES`]), mode 0600 (pod names come from a root-only socket), and read
//! without following a link.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The file's name in the state directory.
pub const FILE_NAME: &str = "pods.json";

/// The most pods the file keeps, the most recently seen: a node runs a few hundred pods.
pub const MAX_PODS: usize = 4096;

/// A pod not seen for longer than this is dropped when the file is written.
pub const RETENTION_SECS: u64 = 7 * 24 * 3600;

/// A larger file is not read (its names are unknown) and is replaced at the next write.
pub const MAX_FILE_BYTES: u64 = 4 << 20;

/// `last_seen_unix` is moved on only when older than this, so a watcher does not rewrite
/// the file on every pass.
const LAST_SEEN_GRANULARITY_SECS: u64 = 3600;

/// One pod as it was last seen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seen {
    pub namespace: String,
    pub name: String,
    /// The runtime socket that named it.
    pub socket: PathBuf,
    pub last_seen_unix: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct File {
    /// By pod UID (lowercase).
    pods: BTreeMap<String, Seen>,
}

/// The file, read at most once, and only when a name is asked for or a pod remembered.
#[derive(Debug, Clone, Default)]
pub struct LastKnown {
    path: Option<PathBuf>,
    pods: Option<BTreeMap<String, Seen>>,
}

impl LastKnown {
    /// Kept at `path`; `None`: nothing is kept (a reader without a state directory).
    pub fn at(path: Option<PathBuf>) -> LastKnown {
        LastKnown { path, pods: None }
    }

    fn pods(&mut self) -> &mut BTreeMap<String, Seen> {
        let path = self.path.as_deref();
        self.pods
            .get_or_insert_with(|| path.map(read).unwrap_or_default())
    }

    /// The namespace and name pod `uid` had when `socket` last named it.
    pub fn name(&mut self, uid: &str, socket: &Path) -> Option<(String, String)> {
        self.path.as_ref()?;
        let seen = self.pods().get(uid)?;
        (seen.socket == socket).then(|| (seen.namespace.clone(), seen.name.clone()))
    }

    /// Keeps the names of `pods` (UID, namespace, name) as `socket` gave them at `now`;
    /// writes the file when one is new to it. A failed write is not an error of the read
    /// that learned them: the names are kept in memory and written again next time.
    pub fn remember(&mut self, pods: &[(String, String, String)], socket: &Path, now: u64) {
        let Some(path) = self.path.clone().filter(|_| !pods.is_empty()) else {
            return;
        };
        let known = self.pods();
        let stale = |seen: &Seen, namespace: &str, name: &str| {
            seen.namespace != namespace
                || seen.name != name
                || seen.socket != socket
                || now.saturating_sub(seen.last_seen_unix) > LAST_SEEN_GRANULARITY_SECS
        };
        let fresh: Vec<_> = pods
            .iter()
            .filter(|(uid, namespace, name)| {
                known
                    .get(uid)
                    .is_none_or(|seen| stale(seen, namespace, name))
            })
            .map(|(uid, namespace, name)| {
                let seen = Seen {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    socket: socket.to_path_buf(),
                    last_seen_unix: now,
                };
                (uid.clone(), seen)
            })
            .collect();
        if fresh.is_empty() {
            return;
        }
        // Merged with the file as it is now: another reader (the watchdog, `info`) may
        // have written it since this one read it.
        let mut merged = read(&path);
        merged.extend(fresh);
        prune(&mut merged, now);
        let file = File { pods: merged };
        if let (Ok(bytes), Some(dir)) = (serde_json::to_vec(&file), path.parent())
            && std::fs::create_dir_all(dir).is_ok()
        {
            let _ = crate::files::replace(&path, &bytes, 0o600, false);
        }
        self.pods = Some(file.pods);
    }
}

/// The file's pods; a missing, corrupt, linked or oversized file reads as none.
fn read(path: &Path) -> BTreeMap<String, Seen> {
    let Ok(file) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    else {
        return BTreeMap::new();
    };
    let mut bytes = Vec::new();
    if file
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .is_err()
        || bytes.len() as u64 > MAX_FILE_BYTES
    {
        return BTreeMap::new();
    }
    serde_json::from_slice::<File>(&bytes)
        .map(|file| file.pods)
        .unwrap_or_default()
}

/// Drops pods unseen for [`RETENTION_SECS`], then all but the [`MAX_PODS`] most recent.
fn prune(pods: &mut BTreeMap<String, Seen>, now: u64) {
    pods.retain(|_, seen| now.saturating_sub(seen.last_seen_unix) <= RETENTION_SECS);
    if pods.len() <= MAX_PODS {
        return;
    }
    let mut by_age: Vec<(u64, String)> = pods
        .iter()
        .map(|(uid, seen)| (seen.last_seen_unix, uid.clone()))
        .collect();
    // Newest first; the UID breaks ties, so the choice does not depend on the map's order.
    by_age.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for (_, uid) in by_age.into_iter().skip(MAX_PODS) {
        pods.remove(&uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, name: &str) -> (String, String, String) {
        (uid.into(), "ml".into(), name.into())
    }

    #[test]
    fn a_name_is_given_back_only_for_the_socket_that_named_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let socket = Path::new("/run/containerd/containerd.sock");
        LastKnown::at(Some(path.clone())).remember(&[pod("aaaa", "trainer-0")], socket, 1000);
        let mode = std::fs::metadata(&path).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
            0o600
        );
        let mut again = LastKnown::at(Some(path));
        assert_eq!(
            again.name("aaaa", socket),
            Some(("ml".into(), "trainer-0".into()))
        );
        assert_eq!(again.name("aaaa", Path::new("/run/crio/crio.sock")), None);
        assert_eq!(again.name("bbbb", socket), None);
        assert_eq!(LastKnown::at(None).name("aaaa", socket), None);
    }

    #[test]
    fn writes_only_what_is_new_and_merges_with_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let socket = Path::new("/s");
        let mut first = LastKnown::at(Some(path.clone()));
        first.remember(&[pod("aaaa", "a")], socket, 1000);
        // Another reader adds a pod meanwhile.
        LastKnown::at(Some(path.clone())).remember(&[pod("bbbb", "b")], socket, 1000);
        let written = std::fs::metadata(&path).unwrap().modified().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        first.remember(&[pod("aaaa", "a")], socket, 1100); // known and fresh: no write
        assert_eq!(
            std::fs::metadata(&path).unwrap().modified().unwrap(),
            written
        );
        first.remember(&[pod("cccc", "c")], socket, 1100);
        let on_disk = read(&path);
        assert_eq!(on_disk.keys().collect::<Vec<_>>(), ["aaaa", "bbbb", "cccc"]);
    }

    #[test]
    fn the_file_stays_bounded_and_a_link_or_a_huge_file_is_not_read() {
        let mut pods = BTreeMap::new();
        for i in 0..MAX_PODS + 10 {
            let seen = Seen {
                namespace: "ns".into(),
                name: format!("p{i}"),
                socket: "/s".into(),
                last_seen_unix: 1_000_000 + i as u64,
            };
            pods.insert(format!("{i:08}"), seen);
        }
        pods.get_mut("00000011").unwrap().last_seen_unix = 1;
        prune(&mut pods, 1_000_000 + MAX_PODS as u64 + 10);
        assert_eq!(pods.len(), MAX_PODS);
        assert!(!pods.contains_key("00000011"), "too old");
        assert!(!pods.contains_key("00000000"), "the oldest past the cap");
        assert!(pods.contains_key(&format!("{:08}", MAX_PODS + 9)));

        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere.json");
        std::fs::write(
            &target,
            r#"{"pods":{"aaaa":{"namespace":"x","name":"y","socket":"/s","last_seen_unix":1}}}"#,
        )
        .unwrap();
        assert_eq!(read(&target).len(), 1);
        let link = dir.path().join(FILE_NAME);
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(read(&link).is_empty());
        let huge = dir.path().join("huge.json");
        std::fs::write(&huge, vec![b' '; MAX_FILE_BYTES as usize + 1]).unwrap();
        assert!(read(&huge).is_empty());
    }
}
