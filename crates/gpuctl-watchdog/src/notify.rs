//! sd_notify(3) through the sd-notify crate: one datagram per message to $NOTIFY_SOCKET, and
//! the watchdog period from $WATCHDOG_USEC (for this process only, as $WATCHDOG_PID says).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::time::{ClockId, clock_gettime};
use sd_notify::NotifyState;

pub struct Notifier {
    /// WATCHDOG_USEC, when systemd expects keep-alive pings from this process.
    pub watchdog: Option<Duration>,
}

impl Notifier {
    pub fn from_env() -> Notifier {
        Notifier {
            watchdog: usable_period(sd_notify::watchdog_enabled()),
        }
    }

    /// How often to send WATCHDOG=1: well within half the period systemd allows.
    pub fn ping_every(&self) -> Option<Duration> {
        self.watchdog
            .map(|period| (period / 3).max(Duration::from_millis(10)))
    }

    /// Runs `work` (a reclaim waiting out its escalation), sending WATCHDOG=1 from a helper
    /// thread meanwhile when systemd expects pings, so a long wait is not taken for a hang.
    pub fn pinging_while<T: Send>(&self, work: impl FnOnce() -> T + Send) -> T {
        let Some(every) = self.ping_every() else {
            return work();
        };
        let done = AtomicBool::new(false);
        std::thread::scope(|scope| {
            let pinger = scope.spawn(|| {
                while !done.load(Ordering::SeqCst) {
                    self.send("WATCHDOG=1");
                    std::thread::park_timeout(every);
                }
            });
            let result = work();
            done.store(true, Ordering::SeqCst);
            pinger.thread().unpark();
            result
        })
    }

    /// RELOADING=1 with the reload's start on CLOCK_MONOTONIC, as systemd wants it (Instant
    /// does not expose that clock).
    pub fn reloading(&self) {
        let monotonic = clock_gettime(ClockId::CLOCK_MONOTONIC).map_or(0, |ts| {
            ts.tv_sec() as u64 * 1_000_000 + ts.tv_nsec() as u64 / 1000
        });
        self.send(&format!("RELOADING=1\nMONOTONIC_USEC={monotonic}"));
    }

    /// Sends `message` (`KEY=value` lines, e.g. `READY=1`, `STATUS=...`,
    /// `RELOADING=1\nMONOTONIC_USEC=...`) as it is; nothing when NOTIFY_SOCKET is unset.
    pub fn send(&self, message: &str) {
        let _ = sd_notify::notify(&[NotifyState::Custom(message)]);
    }
}

/// sd_watchdog_enabled(3) takes WATCHDOG_USEC=0 as "no watchdog"; the crate returns a zero
/// period for it, which would have us ping every 10 ms.
fn usable_period(period: Option<Duration>) -> Option<Duration> {
    period.filter(|period| !period.is_zero())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixDatagram;

    #[test]
    fn a_zero_watchdog_period_is_no_watchdog() {
        assert_eq!(usable_period(None), None);
        assert_eq!(usable_period(Some(Duration::ZERO)), None);
        let second = Some(Duration::from_secs(1));
        assert_eq!(usable_period(second), second);
        let notifier = Notifier { watchdog: second };
        assert_eq!(notifier.ping_every(), Some(Duration::from_secs(1) / 3));
        let notifier = Notifier {
            watchdog: Some(Duration::from_micros(1)),
        };
        assert_eq!(notifier.ping_every(), Some(Duration::from_millis(10)));
    }

    /// The only test here that touches the environment.
    #[test]
    fn the_environment_names_the_socket_and_the_watchdog() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let socket = UnixDatagram::bind(&path).unwrap();
        let pid = std::process::id().to_string();
        // SAFETY: no other test of this binary reads or writes these variables.
        unsafe {
            std::env::set_var("NOTIFY_SOCKET", &path);
            std::env::set_var("WATCHDOG_USEC", "3000000");
            std::env::set_var("WATCHDOG_PID", &pid);
        }
        let notifier = Notifier::from_env();
        assert_eq!(notifier.watchdog, Some(Duration::from_secs(3)));
        notifier.send("RELOADING=1\nMONOTONIC_USEC=42");
        let mut buffer = [0u8; 256];
        let n = socket.recv(&mut buffer).unwrap();
        // The crate ends every assignment with a newline, the last one too.
        assert_eq!(&buffer[..n], b"RELOADING=1\nMONOTONIC_USEC=42\n");

        // SAFETY: as above, this test alone touches these variables.
        unsafe { std::env::set_var("WATCHDOG_PID", "1") };
        assert_eq!(
            Notifier::from_env().watchdog,
            None,
            "another process's watchdog"
        );
        // SAFETY: as above.
        unsafe { std::env::set_var("WATCHDOG_PID", &pid) };
        // SAFETY: as above.
        unsafe { std::env::set_var("WATCHDOG_USEC", "0") };
        assert_eq!(Notifier::from_env().watchdog, None);
        // SAFETY: as above.
        unsafe {
            std::env::remove_var("NOTIFY_SOCKET");
            std::env::remove_var("WATCHDOG_USEC");
            std::env::remove_var("WATCHDOG_PID");
        }
        Notifier::from_env().send("READY=1");
        socket.set_nonblocking(true).unwrap();
        assert!(
            socket.recv(&mut buffer).is_err(),
            "sent with no NOTIFY_SOCKET"
        );
    }
}
