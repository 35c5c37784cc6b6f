//! A client of the Container Runtime Interface, the gRPC API the kubelet drives containerd
//! and CRI-O with, over the runtime's Unix socket: small, synchronous, unary calls only,
//! every call under the caller's deadline, so a hanging runtime costs a reader at most that.
//!
//! Hand-written rather than tonic and prost: those bring an async runtime (tokio), hyper and
//! h2 into a library whose readers are synchronous, many minutes of compiling, and protoc or
//! hand-derived messages anyway; gpuctl needs two calls and a few fields of their answers.
//! The protocol stack is HTTP/2 ([`h2`]), HPACK ([`hpack`]) and the protobuf wire format
//! ([`proto`]), with the field numbers of kubernetes/cri-api's
//! `pkg/apis/runtime/v1/api.proto`.

mod h2;
mod hpack;
pub mod proto;

use std::collections::BTreeMap;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Instant;

pub use proto::Writer;
use proto::{Value, fields, map_entry, text};

/// Where the runtimes put their CRI socket, in the order they are tried: containerd, CRI-O,
/// k3s's embedded containerd.
pub const RUNTIME_SOCKETS: [&str; 3] = [
    "/run/containerd/containerd.sock",
    "/run/crio/crio.sock",
    "/run/k3s/containerd/containerd.sock",
];

/// The first of [`RUNTIME_SOCKETS`] that exists and is a socket.
pub fn detect_socket() -> Option<PathBuf> {
    use std::os::unix::fs::FileTypeExt;
    RUNTIME_SOCKETS
        .iter()
        .map(PathBuf::from)
        .find(|path| std::fs::metadata(path).is_ok_and(|meta| meta.file_type().is_socket()))
}

/// Why a call got no answer.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    #[error("cannot connect to {}: {source}", path.display())]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no answer before the deadline")]
    Deadline,
    #[error("{0}")]
    Io(std::io::Error),
    #[error("{0}")]
    Protocol(String),
    #[error("the runtime answered gRPC status {code}{}", if message.is_empty() { String::new() } else { format!(": {message}") })]
    Status { code: u32, message: String },
    #[error("the runtime's answer is malformed: {0}")]
    Malformed(&'static str),
}

impl From<proto::Malformed> for CriError {
    fn from(error: proto::Malformed) -> CriError {
        CriError::Malformed(error.0)
    }
}

/// gRPC's status code for an unknown method (a runtime without the v1 API).
pub const UNIMPLEMENTED: u32 = 12;

/// A connection to a runtime's `runtime.v1.RuntimeService`.
pub struct Runtime {
    connection: h2::Connection,
}

impl Runtime {
    /// Connects to `socket`; every call on the connection ends by `deadline`.
    pub fn connect(socket: &Path, deadline: Instant) -> Result<Runtime, CriError> {
        let stream = UnixStream::connect(socket).map_err(|source| CriError::Connect {
            path: socket.to_path_buf(),
            source,
        })?;
        Ok(Runtime {
            connection: h2::Connection::open(stream, deadline)?,
        })
    }

    /// Calls `method` of the RuntimeService (`ListContainers`) with `request`; the answer's
    /// encoded message.
    pub fn call(&mut self, method: &str, request: Writer) -> Result<Vec<u8>, CriError> {
        let path = format!("/runtime.v1.RuntimeService/{method}");
        self.connection.unary(&path, &request.into_bytes())
    }

    /// Every pod sandbox the runtime has, ready or not.
    pub fn pods(&mut self) -> Result<Vec<PodSandbox>, CriError> {
        let answer = self.call("ListPodSandbox", Writer::new())?;
        repeated(&answer, 1, PodSandbox::decode)
    }

    /// Every container the runtime has, in any state.
    pub fn containers(&mut self) -> Result<Vec<Container>, CriError> {
        let answer = self.call("ListContainers", Writer::new())?;
        repeated(&answer, 1, Container::decode)
    }
}

fn repeated<T>(
    message: &[u8],
    number: u32,
    decode: fn(&[u8]) -> Result<T, CriError>,
) -> Result<Vec<T>, CriError> {
    let mut items = Vec::new();
    for field in fields(message) {
        if let (n, Value::Bytes(bytes)) = field?
            && n == number
        {
            items.push(decode(bytes)?);
        }
    }
    Ok(items)
}

/// A pod sandbox as `ListPodSandbox` gives it (`PodSandbox`, its `PodSandboxMetadata`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodSandbox {
    pub id: String,
    pub name: String,
    pub namespace: String,
    pub uid: String,
    /// `SANDBOX_READY`: its containers may run.
    pub ready: bool,
}

impl PodSandbox {
    fn decode(message: &[u8]) -> Result<PodSandbox, CriError> {
        let mut pod = PodSandbox::default();
        let mut state = 0;
        for field in fields(message) {
            match field? {
                (1, Value::Bytes(b)) => pod.id = text(b),
                (2, Value::Bytes(metadata)) => {
                    for field in fields(metadata) {
                        match field? {
                            (1, Value::Bytes(b)) => pod.name = text(b),
                            (2, Value::Bytes(b)) => pod.uid = text(b),
                            (3, Value::Bytes(b)) => pod.namespace = text(b),
                            _ => {}
                        }
                    }
                }
                (3, Value::Varint(v)) => state = v,
                _ => {}
            }
        }
        pod.ready = state == 0;
        Ok(pod)
    }
}

/// A container as `ListContainers` gives it (`Container`, its `ContainerMetadata`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Container {
    pub id: String,
    pub pod_sandbox_id: String,
    pub name: String,
    /// `ContainerState`: 0 created, 1 running, 2 exited, 3 unknown.
    pub state: u64,
    pub labels: BTreeMap<String, String>,
}

impl Container {
    fn decode(message: &[u8]) -> Result<Container, CriError> {
        let mut container = Container::default();
        for field in fields(message) {
            match field? {
                (1, Value::Bytes(b)) => container.id = text(b),
                (2, Value::Bytes(b)) => container.pod_sandbox_id = text(b),
                (3, Value::Bytes(metadata)) => {
                    for field in fields(metadata) {
                        if let (1, Value::Bytes(b)) = field? {
                            container.name = text(b);
                        }
                    }
                }
                (6, Value::Varint(v)) => container.state = v,
                (8, Value::Bytes(entry)) => map_entry(entry, &mut container.labels)?,
                _ => {}
            }
        }
        Ok(container)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_and_containers_decode_from_their_field_numbers() {
        let metadata = Writer::new()
            .string(1, "trainer-0")
            .string(2, "0a1b")
            .string(3, "ml")
            .uint(4, 1);
        let pod = Writer::new()
            .string(1, "sandbox")
            .message(2, metadata)
            .uint(3, 1)
            .into_bytes();
        let pod = PodSandbox::decode(&pod).unwrap();
        assert_eq!(
            (pod.name.as_str(), pod.namespace.as_str(), pod.uid.as_str()),
            ("trainer-0", "ml", "0a1b")
        );
        assert!(!pod.ready, "state 1 is SANDBOX_NOTREADY");

        let container = Writer::new()
            .string(1, "c1")
            .string(2, "sandbox")
            .message(3, Writer::new().string(1, "trainer").uint(2, 4))
            .uint(6, 1)
            .map(8, &[("io.kubernetes.pod.namespace", "ml")])
            .into_bytes();
        let container = Container::decode(&container).unwrap();
        assert_eq!(container.name, "trainer");
        assert_eq!(container.state, 1);
        assert_eq!(container.labels["io.kubernetes.pod.namespace"], "ml");
    }
}
