//! Events: to the journal with structured fields when stderr is connected to it (systemd sets
//! JOURNAL_STREAM to stderr's device:inode), else one logfmt line per event on stderr
//! (`PRIORITY=5 MESSAGE="..." ACTION=reclaimed PID=4242 ...`), the same fields either way.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;

/// The journal's native socket.
const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";

/// syslog priorities, as journald's PRIORITY field takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    Err = 3,
    Warning = 4,
    Notice = 5,
    Info = 6,
}

/// Where events go.
pub struct Logger {
    journal: Option<(UnixDatagram, PathBuf)>,
}

impl Logger {
    /// The journal when stderr is connected to it, else stderr.
    pub fn from_env() -> Logger {
        let journal = stderr_is_journal()
            .then(|| UnixDatagram::unbound().ok())
            .flatten()
            .map(|socket| (socket, PathBuf::from(JOURNAL_SOCKET)));
        Logger { journal }
    }

    /// Sends to the journal socket at `path` (tests).
    #[cfg(test)]
    pub fn to_journal_at(path: &std::path::Path) -> Logger {
        Logger {
            journal: UnixDatagram::unbound()
                .ok()
                .map(|socket| (socket, path.to_path_buf())),
        }
    }

    pub fn log(&self, priority: Priority, message: &str, fields: &[(&str, String)]) {
        if let Some((socket, path)) = &self.journal {
            let datagram = journal_datagram(priority, message, fields);
            if socket.send_to(&datagram, path).is_ok() {
                return;
            }
        }
        let line = logfmt(priority, message, fields);
        let mut stderr = std::io::stderr().lock();
        let _ = stderr.write_all(line.as_bytes());
    }
}

/// JOURNAL_STREAM is "DEVICE:INODE" of the stream systemd connected; it is ours only if
/// stderr still is that stream (a child of a service inherits the variable, not the stream).
fn stderr_is_journal() -> bool {
    let Some(value) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = value.to_str().and_then(|v| v.split_once(':')) else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    // SAFETY: fstat on fd 2 into a zeroed stat buffer.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::fstat(std::io::stderr().as_raw_fd(), &mut stat) };
    rc == 0 && stat.st_dev == dev && stat.st_ino == ino
}

/// The native protocol: `KEY=value\n` per field; a value with a newline is sent as `KEY\n`,
/// its length as 64-bit little endian, the bytes, `\n`.
pub fn journal_datagram(priority: Priority, message: &str, fields: &[(&str, String)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    let mut field = |key: &str, value: &str| {
        if value.contains('\n') {
            out.extend_from_slice(key.as_bytes());
            out.push(b'\n');
            out.extend_from_slice(&(value.len() as u64).to_le_bytes());
            out.extend_from_slice(value.as_bytes());
            out.push(b'\n');
        } else {
            out.extend_from_slice(key.as_bytes());
            out.push(b'=');
            out.extend_from_slice(value.as_bytes());
            out.push(b'\n');
        }
    };
    field("PRIORITY", &(priority as u8).to_string());
    field("SYSLOG_IDENTIFIER", "gpuctl-watchdog");
    field("MESSAGE", message);
    for (key, value) in fields {
        field(key, value);
    }
    out
}

/// `PRIORITY=5 MESSAGE="..." KEY=value ...` and a newline.
pub fn logfmt(priority: Priority, message: &str, fields: &[(&str, String)]) -> String {
    let mut line = format!("PRIORITY={} MESSAGE={}", priority as u8, quote(message));
    for (key, value) in fields {
        line.push(' ');
        line.push_str(key);
        line.push('=');
        line.push_str(&quote(value));
    }
    line.push('\n');
    line
}

/// A value as logfmt writes it: bare when it can be, else in double quotes with `"`, `\` and
/// control characters escaped.
fn quote(value: &str) -> String {
    let bare = !value.is_empty()
        && value
            .chars()
            .all(|c| !c.is_whitespace() && !c.is_control() && !matches!(c, '"' | '=' | '\\'));
    if bare {
        return value.to_string();
    }
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logfmt_quotes_what_needs_it() {
        let line = logfmt(
            Priority::Notice,
            "pid 7 reclaimed",
            &[
                ("PID", "7".into()),
                ("REASON", "say \"hi\"\nnow".into()),
                ("USER", String::new()),
            ],
        );
        assert_eq!(
            line,
            "PRIORITY=5 MESSAGE=\"pid 7 reclaimed\" PID=7 REASON=\"say \\\"hi\\\"\\nnow\" USER=\"\"\n"
        );
    }

    #[test]
    fn journal_fields_and_binary_values() {
        let datagram = journal_datagram(
            Priority::Warning,
            "m",
            &[("PID", "7".into()), ("REASON", "a\nb".into())],
        );
        let mut expected =
            b"PRIORITY=4\nSYSLOG_IDENTIFIER=gpuctl-watchdog\nMESSAGE=m\nPID=7\nREASON\n".to_vec();
        expected.extend_from_slice(&3u64.to_le_bytes());
        expected.extend_from_slice(b"a\nb\n");
        assert_eq!(datagram, expected);
    }

    #[test]
    fn journal_socket_receives_one_datagram_per_event() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.sock");
        let server = UnixDatagram::bind(&path).unwrap();
        Logger::to_journal_at(&path).log(Priority::Err, "failed", &[("ACTION", "failed".into())]);
        let mut buffer = [0u8; 512];
        let n = server.recv(&mut buffer).unwrap();
        let text = String::from_utf8_lossy(&buffer[..n]);
        assert!(text.contains("PRIORITY=3\n"), "{text}");
        assert!(text.contains("MESSAGE=failed\nACTION=failed\n"), "{text}");
    }
}
