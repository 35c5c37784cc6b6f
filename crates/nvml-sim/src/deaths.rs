//! Deaths seen in the host's PID namespace, shared with instances in other PID namespaces.
//!
//! The real driver is one for the whole machine: it sees a listed process die wherever its
//! client runs. A sim instance in a PID namespace of its own (a container without the
//! host's) cannot look at a host pid, so an instance that can (in the host's namespace)
//! writes which listed pids are dead to a file beside the scenario file,
//! `<scenario file>.deaths`; the scenario's directory is what a container mounts anyway.
//!
//! - An instance inside a namespace makes the file, empty, where it is missing (where it
//!   can: a read-only mount leaves that to the host), and drops the listed processes it
//!   names.
//! - An instance on the host keeps an existing file up to date from a thread of its own
//!   (every [`SHARE_EVERY`]; until the file appears, it looks for it every [`LOOK_EVERY`]),
//!   so a death is shared even while no host client is asking NVML anything. Where no file exists (no instance in a namespace asked), it writes
//!   nothing: a scenario beside a source tree, or one naming pids that never existed, is
//!   left alone.
//! - With no instance on the host, the file stays empty and a namespaced instance reports
//!   every listed process alive, as it always did.
//!
//! The format: one decimal pid a line, after a `#` comment line. Replaced whole (temp file
//! and rename), so a reader never sees half of it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::state::{FileSig, file_sig};

/// How often a host instance brings the file up to date.
pub const SHARE_EVERY: Duration = Duration::from_millis(20);

/// How often a host instance looks for the file while no instance has asked: every host
/// client of the sim runs this thread for its whole life, and a wake-up every
/// [`SHARE_EVERY`] was a tenth of the watchdog's CPU. The first death after an ask is shared
/// this much later at most.
pub const LOOK_EVERY: Duration = Duration::from_millis(250);

const HEADER: &str = "# nvml-sim: the scenario's pids found dead in the host's PID namespace\n";

/// The file beside `scenario`.
pub fn path_for(scenario: &Path) -> PathBuf {
    let mut name = scenario
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".deaths");
    scenario.with_file_name(name)
}

/// The file, read again when its stat signature changes.
#[derive(Debug)]
pub struct Deaths {
    pub path: PathBuf,
    sig: Option<FileSig>,
    dead: Arc<BTreeSet<u32>>,
}

impl Deaths {
    pub fn new(path: PathBuf) -> Deaths {
        Deaths {
            path,
            sig: None,
            dead: Arc::default(),
        }
    }

    /// Makes the file, empty, if it is missing, asking host instances to share what they
    /// see. A failure (a read-only mount) is silent: the host side may have made it.
    pub fn ask(&self) {
        if !self.path.exists() {
            let _ = write(&self.path, &BTreeSet::new());
        }
    }

    /// Whether the file exists: only then do host instances write it.
    pub fn asked(&self) -> bool {
        self.path.exists()
    }

    /// The pids the file names now.
    pub fn current(&mut self) -> Arc<BTreeSet<u32>> {
        let sig = file_sig(&self.path);
        if sig != self.sig {
            self.sig = sig;
            self.dead = Arc::new(
                std::fs::read_to_string(&self.path)
                    .map(|text| parse(&text))
                    .unwrap_or_default(),
            );
        }
        Arc::clone(&self.dead)
    }

    /// Replaces the file with `dead` where it names something else.
    pub fn share(&mut self, dead: &BTreeSet<u32>) -> std::io::Result<()> {
        if *self.current() == *dead {
            return Ok(());
        }
        write(&self.path, dead)?;
        self.sig = file_sig(&self.path);
        self.dead = Arc::new(dead.clone());
        Ok(())
    }
}

fn parse(text: &str) -> BTreeSet<u32> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .filter_map(|line| line.parse().ok())
        .collect()
}

fn write(path: &Path, dead: &BTreeSet<u32>) -> std::io::Result<()> {
    let mut text = String::from(HEADER);
    for pid in dead {
        text.push_str(&pid.to_string());
        text.push('\n');
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp.{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, text)?;
    // Readable by a container's root, which may be nobody on the host.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// The file the sharing thread watches for: the loaded scenario's.
static WATCHED: std::sync::Mutex<Option<PathBuf>> = std::sync::Mutex::new(None);

/// Starts, once per process, the thread that runs `pass` every [`SHARE_EVERY`] while the
/// file `path` exists (an instance in another namespace asked for it), and looks for it every
/// [`LOOK_EVERY`] until then; a later call only
/// changes the file watched. The thread looks for the file before `pass` takes the sim's
/// lock, so where nothing asked it never holds that lock (a program that forks while it
/// did would leave its child's lock taken). The library is pinned first (never unloaded,
/// even by `dlclose`): the thread runs its code for the process's life. Where it cannot be
/// pinned, no thread is started.
pub fn start_sharing(path: PathBuf, pass: fn()) {
    *WATCHED.lock().unwrap_or_else(|e| e.into_inner()) = Some(path);
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        if !pin_this_library() {
            return;
        }
        let _ = std::thread::Builder::new()
            .name("nvml-sim-deaths".into())
            .spawn(move || {
                let mut asked = false;
                loop {
                    std::thread::sleep(if asked { SHARE_EVERY } else { LOOK_EVERY });
                    asked = WATCHED
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .as_deref()
                        .is_some_and(Path::exists);
                    if asked {
                        pass();
                    }
                }
            });
    });
}

/// `dlopen(self, RTLD_NODELETE | RTLD_NOLOAD)`: the object this code is in stays mapped
/// after the program's last `dlclose`.
fn pin_this_library() -> bool {
    // SAFETY: dladdr reads the address of a function of this object and fills `info`;
    // dlopen with RTLD_NOLOAD only takes another reference to an object already loaded.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        let here = pin_this_library as *const libc::c_void;
        if libc::dladdr(here, &mut info) == 0 || info.dli_fname.is_null() {
            return false;
        }
        let handle = libc::dlopen(
            info.dli_fname,
            libc::RTLD_NOW | libc::RTLD_NOLOAD | libc::RTLD_NODELETE,
        );
        !handle.is_null()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_sits_beside_the_scenario() {
        assert_eq!(
            path_for(Path::new("/x/y/scenario.toml")),
            Path::new("/x/y/scenario.toml.deaths")
        );
    }

    #[test]
    fn it_is_asked_for_shared_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = path_for(&dir.path().join("s.toml"));
        let mut reader = Deaths::new(path.clone());
        assert!(!reader.asked());
        assert!(reader.current().is_empty(), "missing: nothing is dead");
        reader.ask();
        assert!(reader.asked());
        let mut writer = Deaths::new(path.clone());
        let dead: BTreeSet<u32> = [42, 7].into_iter().collect();
        writer.share(&dead).unwrap();
        assert_eq!(*reader.current(), dead);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, format!("{HEADER}7\n42\n"));
        // Unchanged: not written again (the same inode).
        let before = file_sig(&path);
        writer.share(&dead).unwrap();
        assert_eq!(file_sig(&path), before);
        writer.share(&BTreeSet::new()).unwrap();
        assert!(reader.current().is_empty());
    }

    #[test]
    fn lines_that_are_not_pids_are_ignored() {
        assert_eq!(
            parse("# c\n12\n\nx\n 13 \n"),
            [12, 13].into_iter().collect()
        );
    }
}
