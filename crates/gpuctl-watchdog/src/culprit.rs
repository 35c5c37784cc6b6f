//! The driver's own Xid lines in the kernel log (`gpuctl_core::health::kernel_log`), for
//! the one process an Xid names: opened on first use, read once a loop (bounded) and while
//! an application Xid waits for its line, its place kept in the state directory.

use std::path::{Path, PathBuf};
use std::time::Instant;

use gpuctl_core::health::kernel_log::{CULPRIT_WINDOW, KernelLog, KernelXid, PciAddress, Place};

use crate::log::{Logger, Priority};

#[derive(Debug, Default)]
pub struct KernelLogReader {
    path: Option<PathBuf>,
    log: Option<KernelLog>,
    /// Why it could not be opened, as last logged.
    failed: Option<String>,
    saved: Option<Place>,
    /// Until when an application Xid of this loop waits for its line.
    deadline: Option<Instant>,
}

impl KernelLogReader {
    /// The log to read (`None`: disabled); a change reopens it.
    pub fn set_path(&mut self, path: Option<PathBuf>) {
        if path != self.path {
            *self = KernelLogReader {
                path,
                ..KernelLogReader::default()
            };
        }
    }

    /// A loop begins: open where needed, read what is new.
    pub fn begin(&mut self, state_dir: Option<&Path>, logger: &Logger) {
        self.deadline = None;
        if self.log.is_none()
            && let Some(path) = &self.path
        {
            let place = state_dir.and_then(Place::read);
            match KernelLog::open(path, place.as_ref()) {
                Ok(log) => {
                    self.log = Some(log);
                    self.failed = None;
                }
                Err(error) => {
                    let why = format!(
                        "cannot read the kernel log {}: {error}; the culprits of application Xids are unknown",
                        path.display()
                    );
                    if self.failed.as_ref() != Some(&why) {
                        logger.log(Priority::Warning, &why, &[("ACTION", "kernel-log".into())]);
                    }
                    self.failed = Some(why);
                }
            }
        }
        if let Some(log) = &mut self.log {
            log.read_new();
        }
    }

    /// The kernel's line for Xid `xid` on the GPU at `bus_id`: an application Xid waits
    /// for it up to [`CULPRIT_WINDOW`] (once a loop, shared by its Xids).
    pub fn line_for(&mut self, bus_id: Option<&str>, xid: u32, app: bool) -> Option<KernelXid> {
        let address = PciAddress::parse(bus_id?)?;
        let log = self.log.as_mut()?;
        let deadline = *self
            .deadline
            .get_or_insert_with(|| Instant::now() + CULPRIT_WINDOW);
        // The driver writes its line as it raises the event: it may have come since.
        log.read_new();
        loop {
            if let Some(line) = log.take(address, xid) {
                return Some(line);
            }
            if !app || Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            log.read_new();
        }
    }

    /// A loop ends: the place kept for the next start, when it moved.
    pub fn end(&mut self, state_dir: Option<&Path>) {
        let (Some(dir), Some(place)) = (state_dir, self.log.as_ref().and_then(KernelLog::place))
        else {
            return;
        };
        if self.saved.as_ref() != Some(&place) && place.write(dir).is_ok() {
            self.saved = Some(place);
        }
    }
}
