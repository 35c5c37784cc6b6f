//! Events: to the journal with structured fields when stderr is connected to it (systemd sets
//! JOURNAL_STREAM to stderr's device:inode), else one logfmt line per event on stderr
//! (`PRIORITY=5 MESSAGE="..." ACTION=reclaimed PID=4242 ...`), the same fields either way.
//! The journal side is systemd-journal-logger, fed one `log::Record` per event.

use std::io::Write;

use gpuctl_core::text::needs_escape;
use log::{Level, Record};
use systemd_journal_logger::JournalLog;

/// SYSLOG_IDENTIFIER, whatever the executable is called.
const IDENTIFIER: &str = "gpuctl-watchdog";

/// syslog priorities, as journald's PRIORITY field takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    Err = 3,
    Warning = 4,
    Notice = 5,
    Info = 6,
}

impl Priority {
    /// The `log` level that systemd-journal-logger writes as this PRIORITY (its table: Error 3,
    /// Warn 4, Info 5, Debug 6, Trace 7).
    fn level(self) -> Level {
        match self {
            Priority::Err => Level::Error,
            Priority::Warning => Level::Warn,
            Priority::Notice => Level::Info,
            Priority::Info => Level::Debug,
        }
    }
}

/// Where events go.
pub struct Logger {
    journal: Option<JournalLog>,
    /// Where the logfmt lines go when the journal does not take an event: stderr, or for the
    /// daemon's unit tests a buffer they can read (libtest captures only `print!`, so lines
    /// written to stderr would land in a passing test run's log).
    lines: Lines,
}

enum Lines {
    Stderr,
    #[cfg(test)]
    Buffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>),
}

impl Logger {
    /// The journal when stderr is connected to it and its socket answers, else stderr.
    pub fn from_env() -> Logger {
        let journal = systemd_journal_logger::connected_to_journal()
            .then(|| JournalLog::empty().ok())
            .flatten()
            .map(|journal| journal.with_syslog_identifier(IDENTIFIER.to_string()));
        Logger {
            journal,
            lines: Lines::Stderr,
        }
    }

    /// A logger for unit tests: no journal, each event's line appended to the buffer returned.
    #[cfg(test)]
    pub fn buffered() -> (Logger, std::sync::Arc<std::sync::Mutex<Vec<u8>>>) {
        let buffer = std::sync::Arc::default();
        let logger = Logger {
            journal: None,
            lines: Lines::Buffer(std::sync::Arc::clone(&buffer)),
        };
        (logger, buffer)
    }

    /// MESSAGE is escaped (`gpuctl_core::text::escape`): it quotes command names and users
    /// that users chose, and journalctl and a terminal tailing stderr print it. The other
    /// fields keep the exact text, as the JSON documents do: journald stores them as data
    /// (journalctl shows one holding a control character as a blob unless asked with
    /// --all), and on stderr logfmt quotes them with every control escaped.
    pub fn log(&self, priority: Priority, message: &str, fields: &[(&str, String)]) {
        let message = &*gpuctl_core::text::escape(message);
        debug_assert!(
            fields.iter().all(|(key, _)| is_journal_field_name(key)),
            "the journal logger would rename one of {fields:?}"
        );
        // A send that fails (journald gone) falls back to stderr for that event.
        let sent = self.journal.as_ref().is_some_and(|journal| {
            with_record(priority, message, fields, |record| {
                journal.journal_send(record).is_ok()
            })
        });
        if sent {
            return;
        }
        let line = logfmt(priority, message, fields);
        match &self.lines {
            Lines::Stderr => {
                let _ = std::io::stderr().lock().write_all(line.as_bytes());
            }
            #[cfg(test)]
            Lines::Buffer(buffer) => buffer
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .extend_from_slice(line.as_bytes()),
        }
    }
}

/// The event as the journal logger takes it: no CODE_FILE/CODE_LINE/CODE_MODULE (they would
/// name this file), the daemon's fields as key-values, in order, each under its own name.
fn with_record<R>(
    priority: Priority,
    message: &str,
    fields: &[(&str, String)],
    use_record: impl FnOnce(&Record) -> R,
) -> R {
    use_record(
        &Record::builder()
            .level(priority.level())
            .target(IDENTIFIER)
            .args(format_args!("{message}"))
            .key_values(&fields)
            .build(),
    )
}

/// Whether the journal logger sends `name` unchanged: it upper-cases a key, turns any other
/// character than A-Z, 0-9 and `_` into `_`, prefixes `ESCAPED_` to one that starts with a
/// digit or `_`, and cuts it to 64 bytes.
fn is_journal_field_name(name: &str) -> bool {
    name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_uppercase())
        && name
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
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

/// A value as logfmt writes it: bare when it can be, else in double quotes with `"`, `\`,
/// control characters and bidirectional controls escaped.
fn quote(value: &str) -> String {
    let bare = !value.is_empty()
        && value
            .chars()
            .all(|c| !c.is_whitespace() && !needs_escape(c) && !matches!(c, '"' | '=' | '\\'));
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
            c if needs_escape(c) => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use log::kv::{self, Key, Value, VisitSource};

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
    fn logfmt_escapes_terminal_and_bidi_controls_in_every_value() {
        let line = logfmt(
            Priority::Notice,
            "m",
            &[("COMMAND", "a\u{202e}b\x1bc\u{9b}".into())],
        );
        assert_eq!(
            line,
            "PRIORITY=5 MESSAGE=m COMMAND=\"a\\u202eb\\u001bc\\u009b\"\n"
        );
    }

    #[test]
    fn priorities_keep_their_numbers_through_the_journal_logger() {
        // systemd-journal-logger's table from level to PRIORITY.
        let journal_number = |level| match level {
            Level::Error => 3,
            Level::Warn => 4,
            Level::Info => 5,
            Level::Debug => 6,
            Level::Trace => 7,
        };
        for priority in [
            Priority::Err,
            Priority::Warning,
            Priority::Notice,
            Priority::Info,
        ] {
            assert_eq!(
                journal_number(priority.level()),
                priority as u8,
                "{priority:?}"
            );
        }
    }

    #[test]
    fn the_record_carries_the_message_and_every_field_in_order() {
        let fields = [
            ("GPU_UUID", "GPU-1,GPU-2".to_string()),
            ("PID", "7".into()),
            ("REASON", "a\nb".into()),
            ("USER", String::new()),
        ];
        let (level, message, target, pairs) =
            with_record(Priority::Notice, "pid 7 reclaimed", &fields, |record| {
                struct Pairs(Vec<(String, String)>);
                impl<'kvs> VisitSource<'kvs> for Pairs {
                    fn visit_pair(
                        &mut self,
                        k: Key<'kvs>,
                        v: Value<'kvs>,
                    ) -> Result<(), kv::Error> {
                        self.0.push((k.to_string(), v.to_string()));
                        Ok(())
                    }
                }
                let mut pairs = Pairs(Vec::new());
                record.key_values().visit(&mut pairs).unwrap();
                assert_eq!(record.file(), None);
                assert_eq!(record.line(), None);
                assert_eq!(record.module_path(), None);
                (
                    record.level(),
                    record.args().to_string(),
                    record.target().to_string(),
                    pairs.0,
                )
            });
        assert_eq!(level, Level::Info);
        assert_eq!(message, "pid 7 reclaimed");
        assert_eq!(target, "gpuctl-watchdog");
        let expected: Vec<(String, String)> = fields
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        assert_eq!(pairs, expected);
    }

    #[test]
    fn field_names_the_journal_logger_keeps() {
        for name in [
            "GPU_UUID",
            "PID",
            "USER",
            "REASON",
            "ACTION",
            "RECLAIMED_BYTES",
            "CAUSE",
            "SKIPPED",
            "GPU_MEMORY_BYTES",
            "X1",
        ] {
            assert!(is_journal_field_name(name), "{name}");
        }
        for name in [
            "", "pid", "Pid", "_PID", "1PID", "GPU-UUID", "GPU UUID", "ÄPID",
        ] {
            assert!(!is_journal_field_name(name), "{name}");
        }
        assert!(is_journal_field_name(&"A".repeat(64)));
        assert!(!is_journal_field_name(&"A".repeat(65)));
    }

    /// The native protocol's fields: `KEY=value\n`, or `KEY\n`, a 64-bit little-endian length,
    /// the bytes and `\n`.
    fn journal_fields(mut datagram: &[u8]) -> Vec<(String, Vec<u8>)> {
        let mut fields = Vec::new();
        while !datagram.is_empty() {
            let end = datagram
                .iter()
                .position(|&b| b == b'\n')
                .expect("a field ends");
            let line = &datagram[..end];
            if let Some(eq) = line.iter().position(|&b| b == b'=') {
                let key = String::from_utf8(line[..eq].to_vec()).unwrap();
                fields.push((key, line[eq + 1..].to_vec()));
                datagram = &datagram[end + 1..];
            } else {
                let key = String::from_utf8(line.to_vec()).unwrap();
                let rest = &datagram[end + 1..];
                let len = u64::from_le_bytes(rest[..8].try_into().unwrap()) as usize;
                fields.push((key, rest[8..8 + len].to_vec()));
                assert_eq!(rest[8 + len], b'\n');
                datagram = &rest[8 + len + 1..];
            }
        }
        fields
    }

    fn field<'a>(fields: &'a [(String, Vec<u8>)], key: &str) -> Vec<&'a [u8]> {
        fields
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_slice())
            .collect()
    }

    const IN_NAMESPACE: &str = "GPUCTL_TEST_JOURNAL_NAMESPACE";

    /// systemd-journal-logger sends to /run/systemd/journal/socket, a path it does not let us
    /// change: this test runs the one below in a user and mount namespace whose
    /// /run/systemd/journal/socket is a bind mount of a socket the test reads, with stderr a
    /// file named by JOURNAL_STREAM, as systemd starts a service.
    #[test]
    fn journal_socket_receives_one_datagram_per_event() {
        use std::os::unix::fs::MetadataExt;
        use std::os::unix::net::UnixDatagram;
        use std::process::{Command, Stdio};

        let probe = Command::new("unshare").args(["-rm", "true"]).output();
        if !probe.is_ok_and(|out| out.status.success()) {
            eprintln!("skipped: `unshare -rm` (user and mount namespaces) is not available");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.sock");
        let server = UnixDatagram::bind(&path).unwrap();
        let stderr_path = dir.path().join("stderr");
        let stderr = std::fs::File::create(&stderr_path).unwrap();
        let meta = stderr.metadata().unwrap();
        let output = Command::new("unshare")
            .args(["-rm", "sh", "-c"])
            .arg(
                "mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/journal \
                 && touch /run/systemd/journal/socket \
                 && mount --bind \"$0\" /run/systemd/journal/socket && exec \"$@\"",
            )
            .arg(&path)
            .arg(std::env::current_exe().unwrap())
            .args(["--exact", "log::tests::journal_events", "--ignored"])
            .args(["--nocapture", "--test-threads=1"])
            .env(IN_NAMESPACE, "1")
            .env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()))
            .stdin(Stdio::null())
            .stderr(stderr)
            .output()
            .unwrap();
        let stderr = std::fs::read_to_string(&stderr_path).unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{stdout}\n{stderr}");
        assert!(stdout.contains("1 passed"), "{stdout}");
        assert_eq!(stderr, "", "an event fell back to stderr");

        server.set_nonblocking(true).unwrap();
        let mut buffer = [0u8; 4096];
        let mut datagrams = Vec::new();
        while let Ok(n) = server.recv(&mut buffer) {
            // The logger's connection probe is an empty datagram, which journald drops.
            if n > 0 {
                datagrams.push(buffer[..n].to_vec());
            }
        }
        assert_eq!(datagrams.len(), 2, "one datagram per event");

        let first = journal_fields(&datagrams[0]);
        assert_eq!(field(&first, "PRIORITY"), [b"4"]);
        assert_eq!(field(&first, "SYSLOG_IDENTIFIER"), [b"gpuctl-watchdog"]);
        assert_eq!(field(&first, "MESSAGE"), [b"m"]);
        assert_eq!(field(&first, "PID"), [b"7"]);
        assert_eq!(field(&first, "REASON"), [b"a\nb"]);
        let mut binary = b"REASON\n".to_vec();
        binary.extend_from_slice(&3u64.to_le_bytes());
        binary.extend_from_slice(b"a\nb\n");
        assert!(datagrams[0].windows(binary.len()).any(|w| w == binary));
        for absent in ["CODE_FILE", "CODE_LINE", "CODE_MODULE"] {
            assert!(field(&first, absent).is_empty(), "{absent}: {first:?}");
        }
        // Our fields come after the logger's own, in the order given.
        let keys: Vec<&str> = first.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys[keys.len() - 2..], ["PID", "REASON"], "{keys:?}");

        let second = journal_fields(&datagrams[1]);
        assert_eq!(field(&second, "PRIORITY"), [b"3"]);
        assert_eq!(field(&second, "MESSAGE"), [b"failed"]);
        assert_eq!(field(&second, "ACTION"), [b"failed"]);
    }

    #[test]
    #[ignore = "run by journal_socket_receives_one_datagram_per_event in a namespace"]
    fn journal_events() {
        if std::env::var_os(IN_NAMESPACE).is_none() {
            return;
        }
        let logger = Logger::from_env();
        assert!(logger.journal.is_some(), "the journal was not taken");
        logger.log(
            Priority::Warning,
            "m",
            &[("PID", "7".into()), ("REASON", "a\nb".into())],
        );
        logger.log(Priority::Err, "failed", &[("ACTION", "failed".into())]);
    }
}
