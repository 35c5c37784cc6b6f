//! The container service (`gpuctl serve`) and its client: which GPU processes belong to the
//! caller's PID namespace, as the caller numbers them.
//!
//! Inside a container without the host's PID namespace the driver lists host PIDs, which
//! the container's /proc cannot resolve. A host service answers, over a Unix socket, with
//! the GPU processes in the caller's PID namespace (or below it), each by the PID and start
//! time the caller sees, and for each GPU one number for the memory held outside it. The
//! caller is known from the kernel (`SO_PEERCRED`), never from what it says; the service
//! reads only and signals nothing.
//!
//! One JSON request and one JSON reply per connection, each one line ([`Request`],
//! [`Reply`], or [`LeaseFilesReply`] to a `lease_files` request: the service, root, makes
//! the lease files of `gpuctl run` that only root may make); documented in docs/json.md. [`client`] asks; [`crate::serve`] builds the
//! reply on the host; [`caller`] is the namespace arithmetic it relies on. This module
//! needs nothing of the snapshot, so a snapshot can ask through it.

pub mod caller;
pub mod client;
pub mod trust;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The version of the request and reply documents; additive changes only within it.
pub const SCHEMA: u32 = 1;

/// Where the service listens unless `--socket` or `GPUCTL_SOCKET` says otherwise.
pub const DEFAULT_SOCKET: &str = "/run/gpuctl/api.sock";

/// The environment variable naming the socket, for the service and its clients alike.
pub const SOCKET_ENV: &str = "GPUCTL_SOCKET";

/// A request longer than this is refused unread.
pub const MAX_REQUEST_BYTES: usize = 4096;

/// A client reads no more than this of a reply (8 GPUs of 4096 processes fit many times).
pub const MAX_REPLY_BYTES: usize = 64 << 20;

/// The socket in force: `explicit` (`--socket`), else `GPUCTL_SOCKET`, else
/// [`DEFAULT_SOCKET`].
pub fn socket_path(explicit: Option<PathBuf>) -> PathBuf {
    explicit
        .or_else(|| {
            std::env::var_os(SOCKET_ENV)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET))
}

/// What a client asks. Fields a later version adds are ignored by this one (additive
/// changes), and nothing in a request can name whom it is about: that is the kernel's word.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    pub schema: u32,
    pub request: RequestKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestKind {
    /// The GPU processes of the caller's PID namespace.
    Processes,
    /// Make the lease file of every GPU and MIG instance the service sees that has none, in
    /// the service's lease directory (only root makes them: [`crate::lease`]). Nothing in
    /// the request names a file.
    LeaseFiles,
}

impl Request {
    pub fn processes() -> Request {
        Request {
            schema: SCHEMA,
            request: RequestKind::Processes,
        }
    }

    pub fn lease_files() -> Request {
        Request {
            schema: SCHEMA,
            request: RequestKind::LeaseFiles,
        }
    }
}

/// The answer to a `lease_files` request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseFilesReply {
    pub schema: u32,
    pub lease_files: LeaseFilesMade,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseFilesMade {
    /// The service's lease directory.
    pub directory: PathBuf,
    /// How many lease files it made or put right now.
    pub made: usize,
}

/// Parses one request (its bytes, the line end excluded). The error is one line that names
/// what was wrong, sent back as [`ErrorReply`].
pub fn parse_request(bytes: &[u8]) -> Result<Request, String> {
    if bytes.len() > MAX_REQUEST_BYTES {
        return Err(too_long());
    }
    let text = std::str::from_utf8(bytes).map_err(|_| "request is not UTF-8".to_string())?;
    if text.trim().is_empty() {
        return Err(
            "empty request: send one JSON object, e.g. {\"schema\":1,\"request\":\"processes\"}"
                .into(),
        );
    }
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| one_line(&format!("malformed JSON: {e}")))?;
    let schema = value
        .get("schema")
        .ok_or("request has no \"schema\" field")?
        .as_u64()
        .ok_or("\"schema\" must be a whole number")?;
    if schema != u64::from(SCHEMA) {
        return Err(format!(
            "request schema {schema} is not supported: this service speaks schema {SCHEMA}"
        ));
    }
    serde_json::from_value(value).map_err(|e| one_line(&format!("invalid request: {e}")))
}

/// Why an oversized request was refused.
pub fn too_long() -> String {
    format!("request over {MAX_REQUEST_BYTES} bytes refused")
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The answer to a request: the caller as the kernel names it, and each GPU the service
/// sees, by UUID (a container may see fewer GPUs, indexed otherwise).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    pub schema: u32,
    pub caller: CallerInfo,
    pub gpus: Vec<GpuReply>,
}

/// The caller, in its own terms.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallerInfo {
    /// Its pid as it sees itself.
    pub pid: u32,
    /// Its uid as it sees itself (through its user namespace's map).
    pub uid: u32,
    /// The inode of its PID namespace (`/proc/self/ns/pid`).
    pub pid_namespace: u64,
    /// Whether that is the host's (initial) PID namespace.
    pub host_pid_namespace: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuReply {
    pub uuid: String,
    /// Memory held by the GPU's processes that are not the caller's: one number, nothing
    /// of whose it is.
    pub outside_bytes: u64,
    pub processes: Vec<ProcessReply>,
}

/// One of the caller's GPU processes on one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessReply {
    /// As the caller sees it (its namespace's entry in NSpid).
    pub pid: u32,
    /// Start time in clock ticks since boot, as the caller's /proc shows it: with `pid`,
    /// the process's identity.
    pub start_ticks: u64,
    pub used_bytes: Option<u64>,
    /// `compute`, `graphics` or `compute+graphics`, as `gpuctl info --json` names them.
    #[serde(rename = "type")]
    pub kind: String,
    pub sm_util_pct: Option<u32>,
    pub gpu_instance_id: Option<u32>,
    pub compute_instance_id: Option<u32>,
    /// Its effective uid as the caller's user namespace maps it (65534 when unmapped).
    pub uid: Option<u32>,
    /// What the host found of it, where it is a leftover: `orphaned`, `zombie_holder`,
    /// `stopped`, `uninterruptible`; `None` for a process with no finding.
    pub finding: Option<String>,
    /// Its part in MPS on the GPU (a container's MPS clients are its own; the server, where
    /// the container runs one); absent from a host that does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps: Option<crate::mps::Role>,
}

/// The reply to a request that could not be answered: one line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorReply {
    pub schema: u32,
    pub error: String,
}

impl ErrorReply {
    pub fn new(error: impl Into<String>) -> ErrorReply {
        ErrorReply {
            schema: SCHEMA,
            error: error.into(),
        }
    }

    /// The reply as one line, newline included.
    pub fn line(&self) -> String {
        let mut line = serde_json::to_string(self)
            .unwrap_or_else(|_| format!("{{\"schema\":{SCHEMA},\"error\":\"unprintable error\"}}"));
        line.push('\n');
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_processes_request_parses_and_unknown_fields_are_ignored() {
        let plain = parse_request(br#"{"schema":1,"request":"processes"}"#).unwrap();
        assert_eq!(plain, Request::processes());
        // A forged claim about whom it is for is no part of the request: ignored.
        let forged = parse_request(
            br#"{"schema":1,"request":"processes","pid":1,"pid_namespace":4026531836}"#,
        )
        .unwrap();
        assert_eq!(forged, Request::processes());
    }

    #[test]
    fn bad_requests_get_one_line_naming_what_was_wrong() {
        let cases: [(&[u8], &str); 7] = [
            (b"", "empty request"),
            (b"{", "malformed JSON"),
            (b"[1,2]", "no \"schema\""),
            (br#"{"schema":"1"}"#, "whole number"),
            (
                br#"{"schema":2,"request":"processes"}"#,
                "schema 2 is not supported",
            ),
            (
                br#"{"schema":1,"request":"kill"}"#,
                "invalid request: unknown variant `kill`",
            ),
            (b"\xff\xfe", "not UTF-8"),
        ];
        for (bytes, needle) in cases {
            let error = parse_request(bytes).unwrap_err();
            assert!(error.contains(needle), "{error:?} lacks {needle:?}");
            assert!(!error.contains('\n'), "{error:?}");
        }
        let big = vec![b' '; MAX_REQUEST_BYTES + 1];
        assert_eq!(parse_request(&big).unwrap_err(), too_long());
    }

    proptest! {
        /// Whatever arrives, the parser answers with a request or a one-line error; it
        /// never panics.
        #[test]
        fn the_parser_never_panics_and_errors_are_one_line(bytes in proptest::collection::vec(any::<u8>(), 0..5000)) {
            match parse_request(&bytes) {
                Ok(request) => prop_assert_eq!(request, Request::processes()),
                Err(error) => prop_assert!(!error.contains('\n') && !error.is_empty()),
            }
        }

        /// JSON-shaped input, nearer the parser's paths than random bytes.
        #[test]
        fn json_shaped_input_is_answered(schema in proptest::option::of(0u64..4), kind in "[a-z_]{0,12}", extra in "[ -~]{0,40}") {
            let mut text = String::from("{");
            if let Some(schema) = schema {
                text.push_str(&format!("\"schema\":{schema},"));
            }
            text.push_str(&format!("\"request\":{},\"x\":{}}}", serde_json::to_string(&kind).unwrap(), serde_json::to_string(&extra).unwrap()));
            let parsed = parse_request(text.as_bytes());
            let valid = schema == Some(1) && kind == "processes";
            prop_assert_eq!(parsed.is_ok(), valid, "{:?} -> {:?}", text, parsed);
        }
    }
}
