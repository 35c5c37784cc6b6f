//! The daemon's NVML session: opened when it can be, closed and re-opened with backoff when
//! NVML fails, and re-opened while a GPU is lost or failing (a driver reload leaves the old
//! session unable to see the GPUs again).

use std::time::{Duration, Instant};

use gpuctl_core::nvml::Gpus;

use crate::log::{Logger, Priority};

/// The longest wait between two attempts to reach NVML.
pub const BACKOFF_CAP: Duration = Duration::from_secs(60);

/// Whether NVML can be reached, and when to try again.
enum Nvml {
    Up(Box<Gpus>),
    Down { retry_at: Instant },
}

pub struct Link {
    nvml: Nvml,
    /// Doubles with each failed attempt to reach NVML (or to re-open it after an incomplete
    /// snapshot), up to BACKOFF_CAP; reset by a complete snapshot.
    backoff: Duration,
    /// When NVML is re-opened next while snapshots stay incomplete (driver reload).
    reopen_at: Option<Instant>,
    last_down: Option<String>,
}

impl Link {
    /// Down, to be tried at once; `interval` is the first backoff.
    pub fn new(interval: Duration) -> Link {
        Link {
            nvml: Nvml::Down {
                retry_at: Instant::now(),
            },
            backoff: interval,
            reopen_at: None,
            last_down: None,
        }
    }

    /// The session, when NVML is up.
    pub fn gpus(&self) -> Option<&Gpus> {
        match &self.nvml {
            Nvml::Up(gpus) => Some(gpus),
            Nvml::Down { .. } => None,
        }
    }

    /// Reaches NVML if it is down and the retry time has come (`once`: now). Returns the
    /// STATUS line when it stays down.
    pub fn ensure(&mut self, timeout: Duration, once: bool, log: &Logger) -> Option<String> {
        let Nvml::Down { retry_at, .. } = &self.nvml else {
            return None;
        };
        if Instant::now() < *retry_at && !once {
            return None;
        }
        match Gpus::open_within(timeout) {
            Ok(gpus) => {
                if let Some(reason) = self.last_down.take() {
                    log.log(
                        Priority::Notice,
                        &format!("NVML is available again (it was not: {reason})"),
                        &[("ACTION", "nvml-up".into())],
                    );
                }
                self.nvml = Nvml::Up(Box::new(gpus));
                None
            }
            Err(error) => Some(self.down(error.to_string(), log)),
        }
    }

    /// NVML failed: the session (if any) is closed, to be tried again after the backoff.
    /// Logged when the reason changes; returns the STATUS line.
    pub fn down(&mut self, reason: String, log: &Logger) -> String {
        let retry_at = Instant::now() + self.backoff;
        if self.last_down.as_deref() != Some(reason.as_str()) {
            log.log(
                Priority::Err,
                &format!(
                    "NVML is unavailable, nothing is reclaimed; retrying with backoff (up to {}): {reason}",
                    humantime::format_duration(BACKOFF_CAP)
                ),
                &[("ACTION", "nvml-down".into()), ("REASON", reason.clone())],
            );
            self.last_down = Some(reason.clone());
        }
        let status = format!(
            "NVML unavailable: {}; retrying in {}",
            first_sentence(&reason),
            humantime::format_duration(Duration::from_millis(self.backoff.as_millis() as u64))
        );
        self.backoff = (self.backoff * 2).min(BACKOFF_CAP);
        self.nvml = Nvml::Down { retry_at };
        status
    }

    /// After a snapshot at `now`: whether NVML is to be re-opened after this pass.
    /// `incomplete`: some GPU did not answer; `reopen_may_help`: one is lost or failing
    /// (which a new session may see past; one that does not answer is not helped, its calls
    /// would block again). A complete snapshot resets the backoff to `interval`.
    pub fn after_read(
        &mut self,
        incomplete: bool,
        reopen_may_help: bool,
        once: bool,
        now: Instant,
        interval: Duration,
    ) -> bool {
        if !incomplete {
            self.backoff = interval;
            self.reopen_at = None;
        } else if !reopen_may_help {
            self.reopen_at = None;
        } else if !once {
            let at = *self.reopen_at.get_or_insert(now + self.backoff);
            if now >= at {
                // Re-open NVML after this pass: a driver reload leaves the old session
                // unable to see the GPUs again.
                self.reopen_at = None;
            }
        }
        reopen_may_help && !once && self.reopen_at.is_none()
    }

    /// Closes the session, to be re-opened at the next pass, and backs off the next re-open.
    pub fn reopen(&mut self, log: &Logger) {
        log.log(
            Priority::Notice,
            "re-opening NVML while a GPU does not answer",
            &[("ACTION", "nvml-reopen".into())],
        );
        self.nvml = Nvml::Down {
            retry_at: Instant::now(),
        };
        self.backoff = (self.backoff * 2).min(BACKOFF_CAP);
    }
}

/// The first sentence of an error, for a one-line status.
fn first_sentence(text: &str) -> &str {
    text.split(". ").next().unwrap_or(text)
}
