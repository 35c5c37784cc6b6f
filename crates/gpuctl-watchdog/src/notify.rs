//! sd_notify(3) without libsystemd: one datagram per message to $NOTIFY_SOCKET (a path, or
//! `@name` in the abstract namespace), and the watchdog period from $WATCHDOG_USEC.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

pub struct Notifier {
    socket: Option<(UnixDatagram, SocketAddr)>,
    /// WATCHDOG_USEC, when systemd expects keep-alive pings from this process.
    pub watchdog: Option<Duration>,
}

impl Notifier {
    pub fn from_env() -> Notifier {
        let socket = std::env::var_os("NOTIFY_SOCKET").and_then(|path| {
            let bytes = std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()).to_vec();
            let address = match bytes.strip_prefix(b"@") {
                Some(name) => SocketAddr::from_abstract_name(name).ok()?,
                None if bytes.starts_with(b"/") => SocketAddr::from_pathname(&path).ok()?,
                None => return None,
            };
            Some((UnixDatagram::unbound().ok()?, address))
        });
        let for_us = std::env::var("WATCHDOG_PID")
            .ok()
            .is_none_or(|pid| pid.trim() == std::process::id().to_string());
        let watchdog = std::env::var("WATCHDOG_USEC")
            .ok()
            .and_then(|usec| usec.trim().parse::<u64>().ok())
            .filter(|&usec| usec > 0 && for_us)
            .map(Duration::from_micros);
        Notifier { socket, watchdog }
    }

    /// How often to send WATCHDOG=1: well within half the period systemd allows.
    pub fn ping_every(&self) -> Option<Duration> {
        self.watchdog
            .map(|period| (period / 3).max(Duration::from_millis(10)))
    }

    pub fn send(&self, message: &str) {
        if let Some((socket, address)) = &self.socket {
            let _ = socket.send_to_addr(message.as_bytes(), address);
        }
    }
}
