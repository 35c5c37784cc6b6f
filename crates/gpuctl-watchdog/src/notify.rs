//! sd_notify(3) through the sd-notify crate: one datagram per message to $NOTIFY_SOCKET, and
//! the watchdog period from $WATCHDOG_USEC (for this process only, as $WATCHDOG_PID says).

use std::time::Duration;

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
