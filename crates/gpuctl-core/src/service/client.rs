//! The client: asks the host service which GPU processes are the caller's, for a snapshot
//! taken where NVML's host PIDs mean nothing (a container's own PID namespace).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::Serialize;

use super::{ErrorReply, MAX_REPLY_BYTES, Reply, Request, SCHEMA, socket_path};

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
}

impl ServiceUse {
    /// The one hint line a front shows when the service could not be reached.
    pub fn hint(&self) -> Option<String> {
        if self.answered {
            return None;
        }
        Some(if self.unreachable {
            format!(
                "hint: mount the host's {} (gpuctl serve) into this container to see and \
                 reclaim its own GPU processes",
                self.socket.display()
            )
        } else {
            format!(
                "hint: the host service at {} did not answer: {}",
                self.socket.display(),
                self.error.as_deref().unwrap_or("no reason given")
            )
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
}

impl AskError {
    pub fn message(&self) -> &str {
        match self {
            AskError::Unreachable(m) | AskError::Failed(m) => m,
        }
    }
}

/// Asks the service at `socket` for the caller's GPU processes.
pub fn ask(socket: &Path) -> Result<Reply, AskError> {
    let mut stream = UnixStream::connect(socket).map_err(|e| {
        let text = format!("cannot connect to {}: {e}", socket.display());
        match e.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
                AskError::Unreachable(text)
            }
            _ => AskError::Failed(text),
        }
    })?;
    let failed = |e: std::io::Error| AskError::Failed(format!("{}: {e}", socket.display()));
    stream
        .set_read_timeout(Some(ANSWER_TIMEOUT))
        .map_err(failed)?;
    stream
        .set_write_timeout(Some(ANSWER_TIMEOUT))
        .map_err(failed)?;
    let mut line = serde_json::to_string(&Request::processes()).expect("a request serializes");
    line.push('\n');
    stream.write_all(line.as_bytes()).map_err(failed)?;
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut reply = Vec::new();
    (&mut stream)
        .take(MAX_REPLY_BYTES as u64 + 1)
        .read_to_end(&mut reply)
        .map_err(failed)?;
    parse_reply(&reply).map_err(AskError::Failed)
}

/// A reply line: the answer, or the service's error as it said it.
pub fn parse_reply(bytes: &[u8]) -> Result<Reply, String> {
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
    serde_json::from_value(value).map_err(|e| format!("the service's reply is not understood: {e}"))
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
            },
            Some(reply),
        ),
        Err(error) => (
            ServiceUse {
                socket,
                answered: false,
                unreachable: matches!(error, AskError::Unreachable(_)),
                error: Some(error.message().to_string()),
            },
            None,
        ),
    }
}
