//! The client: asks the host service which GPU processes are the caller's, for a snapshot
//! taken where NVML's host PIDs mean nothing (a container's own PID namespace).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::Serialize;

use super::{
    ErrorReply, LeaseFilesMade, LeaseFilesReply, MAX_REPLY_BYTES, Reply, Request, SCHEMA,
    socket_path,
};
use crate::text;

/// How long the service may take to answer before the snapshot goes on without it.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// Set by the service itself: it never asks itself.
static NEVER_ASK: AtomicBool = AtomicBool::new(false);

/// How the last snapshot of this process used the service, for the front's one hint.
static LAST_USE: Mutex<Option<ServiceUse>> = Mutex::new(None);

/// The hint for a person, where the last snapshot this process took could not use the
/// service it needed: one line, at most once per command (fronts print it at the end).
pub fn hint() -> Option<String> {
    LAST_USE.lock().ok()?.as_ref()?.hint()
}

/// Snapshots taken by this process never ask the service (the service's own).
pub fn never_ask() {
    NEVER_ASK.store(true, Ordering::Relaxed);
}

pub(crate) fn asking_allowed() -> bool {
    !NEVER_ASK.load(Ordering::Relaxed)
}

/// How a snapshot used the host service: reported with it (`gpuctl info --json`'s
/// `host_service`) so a person sees why processes are or are not confirmed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServiceUse {
    pub socket: PathBuf,
    /// It answered: the processes it named are confirmed.
    pub answered: bool,
    /// Why it did not, in one line.
    pub error: Option<String>,
    /// The socket was not there or nobody listened on it (mount it, or start the service).
    #[serde(skip)]
    pub unreachable: bool,
    /// Something listened on it that is not the host's service: it was not asked.
    #[serde(skip)]
    pub untrusted: bool,
}

impl ServiceUse {
    /// The one hint line a front shows when the service could not be reached. The socket
    /// path (from GPUCTL_SOCKET) and the service's words are escaped: either may hold what
    /// would act on a terminal.
    pub fn hint(&self) -> Option<String> {
        if self.answered {
            return None;
        }
        let socket = self.socket.display().to_string();
        let socket = text::escape(&socket);
        let error = text::escape(self.error.as_deref().unwrap_or("no reason given"));
        Some(if self.unreachable {
            format!(
                "hint: mount the host's {socket} (gpuctl serve) into this container to see and \
                 reclaim its own GPU processes"
            )
        } else if self.untrusted {
            format!(
                "hint: {socket} is not the host's gpuctl serve, so it was not asked and this \
                 container's processes are unconfirmed: {error}"
            )
        } else {
            format!("hint: the host service at {socket} did not answer: {error}")
        })
    }
}

/// Why an answer was not had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AskError {
    /// No socket there, or nobody listening on it.
    Unreachable(String),
    /// The service answered with an error, or with something that is not a reply.
    Failed(String),
    /// What listens on the socket is not the host's service ([`super::trust`]): not asked.
    Untrusted(String),
}

impl AskError {
    pub fn message(&self) -> &str {
        match self {
            AskError::Unreachable(m) | AskError::Failed(m) | AskError::Untrusted(m) => m,
        }
    }
}

/// Asks the service at `socket` for the caller's GPU processes.
pub fn ask(socket: &Path) -> Result<Reply, AskError> {
    let reply = exchange(socket, &Request::processes(), true)?;
    parse_reply(&reply).map_err(AskError::Failed)
}

/// Asks the service at `socket` to make the lease files only root may make. Its listener
/// is not checked ([`super::trust`]): nothing of its answer is believed but as words for a
/// message, since the caller opens only lease files root owns, whoever says they were made.
pub fn ask_lease_files(socket: &Path) -> Result<LeaseFilesMade, AskError> {
    let reply = exchange(socket, &Request::lease_files(), false)?;
    let value = checked_reply(&reply).map_err(AskError::Failed)?;
    serde_json::from_value::<LeaseFilesReply>(value)
        .map(|reply| reply.lease_files)
        .map_err(|e| AskError::Failed(format!("the service's reply is not understood: {e}")))
}

/// Sends `request` to the service at `socket` and reads its reply, bounded; `trusting`: only
/// where the listener is the host's service.
fn exchange(socket: &Path, request: &Request, trusting: bool) -> Result<Vec<u8>, AskError> {
    let mut stream = UnixStream::connect(socket).map_err(|e| {
        let text = format!("cannot connect to {}: {e}", socket.display());
        match e.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
                AskError::Unreachable(text)
            }
            _ => AskError::Failed(text),
        }
    })?;
    // Nothing is sent to, or believed of, a listener that is not the host's service.
    if trusting {
        super::trust::check(&stream, socket).map_err(AskError::Untrusted)?;
    }
    let failed = |e: std::io::Error| AskError::Failed(format!("{}: {e}", socket.display()));
    stream
        .set_read_timeout(Some(ANSWER_TIMEOUT))
        .map_err(failed)?;
    stream
        .set_write_timeout(Some(ANSWER_TIMEOUT))
        .map_err(failed)?;
    let mut line = serde_json::to_string(request).expect("a request serializes");
    line.push('\n');
    stream.write_all(line.as_bytes()).map_err(failed)?;
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut reply = Vec::new();
    (&mut stream)
        .take(MAX_REPLY_BYTES as u64 + 1)
        .read_to_end(&mut reply)
        .map_err(failed)?;
    Ok(reply)
}

/// A reply line: the answer, or the service's error as it said it.
pub fn parse_reply(bytes: &[u8]) -> Result<Reply, String> {
    let value = checked_reply(bytes)?;
    serde_json::from_value(value).map_err(|e| format!("the service's reply is not understood: {e}"))
}

/// A reply line as JSON of this schema, or the service's error as it said it.
fn checked_reply(bytes: &[u8]) -> Result<serde_json::Value, String> {
    if bytes.len() > MAX_REPLY_BYTES {
        return Err(format!(
            "the service's reply is over {MAX_REPLY_BYTES} bytes"
        ));
    }
    let value: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| format!("the service's reply is not JSON: {e}"))?;
    if let Ok(error) = serde_json::from_value::<ErrorReply>(value.clone()) {
        return Err(format!("the service refused: {}", error.error));
    }
    let schema = value.get("schema").and_then(|s| s.as_u64());
    if schema != Some(u64::from(SCHEMA)) {
        return Err(format!(
            "the service's reply has schema {}, not {SCHEMA}",
            schema.map_or("none".into(), |s| s.to_string())
        ));
    }
    Ok(value)
}

/// Asks the service in force ([`socket_path`]), as a snapshot does.
pub(crate) fn ask_for_snapshot() -> (ServiceUse, Option<Reply>) {
    let socket = socket_path(None);
    let asked = ask_at(socket);
    if let Ok(mut last) = LAST_USE.lock() {
        *last = Some(asked.0.clone());
    }
    asked
}

fn ask_at(socket: PathBuf) -> (ServiceUse, Option<Reply>) {
    match ask(&socket) {
        Ok(reply) => (
            ServiceUse {
                socket,
                answered: true,
                error: None,
                unreachable: false,
                untrusted: false,
            },
            Some(reply),
        ),
        Err(error) => (
            ServiceUse {
                socket,
                answered: false,
                unreachable: matches!(error, AskError::Unreachable(_)),
                untrusted: matches!(error, AskError::Untrusted(_)),
                error: Some(error.message().to_string()),
            },
            None,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a service or GPUCTL_SOCKET says reaches a terminal only escaped: ESC, BEL, CSI
    /// and bidirectional controls, in the path and in the words.
    #[test]
    fn the_hint_escapes_the_socket_path_and_the_services_words() {
        let hostile = "\x1b]0;PWNED\x07\x1b[2J\u{9b}31m\u{202e}gnp.exe\n";
        for (unreachable, untrusted) in [(true, false), (false, true), (false, false)] {
            let used = ServiceUse {
                socket: PathBuf::from(format!("/run/{hostile}/api.sock")),
                answered: false,
                error: Some(format!("the service refused: {hostile}")),
                unreachable,
                untrusted,
            };
            let hint = used.hint().unwrap();
            assert!(
                !hint.chars().any(text::needs_escape),
                "a control reached the hint: {hint:?}"
            );
            assert!(
                hint.contains("\\e]0;PWNED\\x07\\e[2J\\u{9b}31m\\u{202e}"),
                "{hint}"
            );
        }
    }
}
