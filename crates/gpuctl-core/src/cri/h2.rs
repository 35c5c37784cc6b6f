//! The HTTP/2 of one gRPC client (RFC 9113): a connection over a Unix socket that makes
//! unary calls one after another, each under the caller's deadline. Only what a unary call
//! needs: the preface and SETTINGS, HEADERS (and CONTINUATION) with HPACK, DATA with the
//! gRPC length prefix, PING and SETTINGS acknowledged, GOAWAY and RST_STREAM as errors.
//! Windows are opened wide at the start, so no answer waits on flow control.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Instant;

use super::CriError;
use super::hpack;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const CONTINUATION: u8 = 0x9;

const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// The largest answer accepted, and the window opened for it.
pub const MAX_ANSWER: u32 = 16 << 20;
/// The frame size every peer must accept (SETTINGS_MAX_FRAME_SIZE's default).
const FRAME_SIZE: usize = 16384;

pub struct Connection {
    stream: UnixStream,
    decoder: hpack::Decoder,
    next_stream: u32,
    deadline: Instant,
}

struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

/// What came back on a call's stream.
#[derive(Default)]
struct Answer {
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Connection {
    /// Opens the connection: the client preface and SETTINGS (no push, a 16 MiB stream
    /// window), and the connection window raised to match.
    pub fn open(stream: UnixStream, deadline: Instant) -> Result<Connection, CriError> {
        let mut connection = Connection {
            stream,
            decoder: hpack::Decoder::default(),
            next_stream: 1,
            deadline,
        };
        let mut settings = Vec::new();
        for (id, value) in [(0x2u16, 0u32), (0x4, MAX_ANSWER)] {
            settings.extend_from_slice(&id.to_be_bytes());
            settings.extend_from_slice(&value.to_be_bytes());
        }
        let increment = (MAX_ANSWER - 65535).to_be_bytes();
        let mut opening = PREFACE.to_vec();
        opening.extend(frame(SETTINGS, 0, 0, &settings));
        opening.extend(frame(0x8, 0, 0, &increment)); // WINDOW_UPDATE
        connection.write(&opening)?;
        Ok(connection)
    }

    /// One unary call: `path` is `/package.Service/Method`, `request` the encoded message.
    /// Returns the answer's message, or the gRPC status the server ended the call with.
    pub fn unary(&mut self, path: &str, request: &[u8]) -> Result<Vec<u8>, CriError> {
        let id = self.next_stream;
        self.next_stream += 2;
        let block = hpack::encode(&[
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("user-agent", "gpuctl"),
        ]);
        let mut message = vec![0];
        message.extend_from_slice(&(request.len() as u32).to_be_bytes());
        message.extend_from_slice(request);
        let mut out = frame(HEADERS, END_HEADERS, id, &block);
        let chunks: Vec<&[u8]> = message.chunks(FRAME_SIZE).collect();
        for (i, chunk) in chunks.iter().enumerate() {
            let last = i + 1 == chunks.len();
            out.extend(frame(DATA, if last { END_STREAM } else { 0 }, id, chunk));
        }
        self.write(&out)?;
        let answer = self.read_answer(id)?;
        grpc_message(answer)
    }

    fn read_answer(&mut self, id: u32) -> Result<Answer, CriError> {
        let mut answer = Answer::default();
        let mut block: Vec<u8> = Vec::new();
        let mut ended = false;
        loop {
            let frame = self.read_frame()?;
            match frame.kind {
                SETTINGS if frame.flags & ACK == 0 => {
                    self.write(&self::frame(SETTINGS, ACK, 0, &[]))?
                }
                PING if frame.flags & ACK == 0 => {
                    self.write(&self::frame(PING, ACK, 0, &frame.payload))?
                }
                GOAWAY => return Err(goaway(&frame.payload)),
                RST_STREAM if frame.stream == id => {
                    let code = frame.payload.get(..4).map_or(0, be32);
                    return Err(CriError::Protocol(format!(
                        "the runtime reset the call (HTTP/2 error {code})"
                    )));
                }
                HEADERS | CONTINUATION => {
                    block.extend_from_slice(header_fragment(&frame)?);
                    if block.len() > 1 << 20 {
                        return Err(bad("a header block above 1 MiB"));
                    }
                    if frame.flags & END_HEADERS != 0 {
                        let fields = self.decoder.decode(&block).map_err(|e| {
                            CriError::Protocol(format!("bad header block: {}", e.0))
                        })?;
                        block.clear();
                        if frame.stream == id {
                            answer.headers.extend(fields);
                        }
                    }
                }
                DATA if frame.stream == id => {
                    answer.body.extend_from_slice(unpadded(&frame)?);
                    if answer.body.len() > MAX_ANSWER as usize {
                        return Err(CriError::Protocol(
                            "the answer is larger than 16 MiB".into(),
                        ));
                    }
                }
                _ => {}
            }
            if frame.stream == id
                && matches!(frame.kind, HEADERS | DATA)
                && frame.flags & END_STREAM != 0
            {
                ended = true;
            }
            // A HEADERS frame that ends the stream may go on in CONTINUATION frames.
            if ended && block.is_empty() {
                return Ok(answer);
            }
        }
    }

    fn read_frame(&mut self) -> Result<Frame, CriError> {
        let mut head = [0u8; 9];
        self.read_exact(&mut head)?;
        let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
        if len > 1 << 20 {
            return Err(CriError::Protocol(format!("a frame of {len} bytes")));
        }
        let mut payload = vec![0; len];
        self.read_exact(&mut payload)?;
        Ok(Frame {
            kind: head[3],
            flags: head[4],
            stream: be32(&head[5..9]) & 0x7fff_ffff,
            payload,
        })
    }

    fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), CriError> {
        let mut filled = 0;
        while filled < buf.len() {
            let left = self.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(CriError::Deadline);
            }
            self.stream
                .set_read_timeout(Some(left))
                .map_err(CriError::Io)?;
            match self.stream.read(&mut buf[filled..]) {
                Ok(0) => {
                    return Err(CriError::Protocol(
                        "the runtime closed the connection".into(),
                    ));
                }
                Ok(n) => filled += n,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Err(CriError::Deadline);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(CriError::Io(e)),
            }
        }
        Ok(())
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), CriError> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(CriError::Deadline);
        }
        self.stream
            .set_write_timeout(Some(left))
            .map_err(CriError::Io)?;
        self.stream.write_all(bytes).map_err(|e| match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => CriError::Deadline,
            _ => CriError::Io(e),
        })
    }
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

fn be32(bytes: &[u8]) -> u32 {
    u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

/// A DATA or HEADERS payload without its padding.
fn unpadded(frame: &Frame) -> Result<&[u8], CriError> {
    let payload = &frame.payload[..];
    if frame.flags & PADDED == 0 || frame.kind == CONTINUATION {
        return Ok(payload);
    }
    let pad = usize::from(*payload.first().ok_or_else(|| bad("padded frame"))?);
    payload
        .get(1..payload.len().saturating_sub(pad))
        .filter(|_| pad < payload.len())
        .ok_or_else(|| bad("padding longer than the frame"))
}

fn header_fragment(frame: &Frame) -> Result<&[u8], CriError> {
    let fragment = unpadded(frame)?;
    if frame.kind == HEADERS && frame.flags & PRIORITY != 0 {
        return fragment.get(5..).ok_or_else(|| bad("priority fields"));
    }
    Ok(fragment)
}

fn bad(what: &str) -> CriError {
    CriError::Protocol(format!("malformed HTTP/2 frame: {what}"))
}

fn goaway(payload: &[u8]) -> CriError {
    let code = payload.get(4..8).map_or(0, be32);
    let debug = payload
        .get(8..)
        .map(String::from_utf8_lossy)
        .unwrap_or_default();
    CriError::Protocol(
        format!("the runtime closed the connection (GOAWAY {code}) {debug}")
            .trim_end()
            .to_string(),
    )
}

/// The call's message from its answer, or its gRPC status as an error.
fn grpc_message(answer: Answer) -> Result<Vec<u8>, CriError> {
    let header = |wanted: &str| {
        answer
            .headers
            .iter()
            .rev()
            .find(|(name, _)| name == wanted)
            .map(|(_, value)| value.as_str())
    };
    if let Some(status) = header(":status").filter(|s| *s != "200") {
        return Err(CriError::Protocol(format!(
            "the runtime answered HTTP status {status}"
        )));
    }
    match header("grpc-status").map(str::parse::<u32>) {
        Some(Ok(0)) => {}
        Some(Ok(code)) => {
            return Err(CriError::Status {
                code,
                message: percent_decode(header("grpc-message").unwrap_or("")),
            });
        }
        _ => return Err(CriError::Protocol("the answer has no gRPC status".into())),
    }
    let body = answer.body;
    let (prefix, rest) = body
        .split_at_checked(5)
        .ok_or_else(|| bad("gRPC message prefix"))?;
    if prefix[0] != 0 {
        return Err(CriError::Protocol(
            "the runtime compressed its answer".into(),
        ));
    }
    let len = be32(&prefix[1..5]) as usize;
    rest.get(..len)
        .map(<[u8]>::to_vec)
        .ok_or_else(|| bad("gRPC message shorter than its prefix"))
}

/// gRPC percent-encodes its status message.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_messages_are_percent_decoded() {
        assert_eq!(
            percent_decode("container %22abc%22 not found"),
            "container \"abc\" not found"
        );
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }

    #[test]
    fn an_answer_is_its_message_or_its_status() {
        let headers = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect()
        };
        let ok = Answer {
            headers: headers(&[(":status", "200"), ("grpc-status", "0")]),
            body: vec![0, 0, 0, 0, 2, 8, 1],
        };
        assert_eq!(grpc_message(ok).unwrap(), [8, 1]);
        let failed = Answer {
            headers: headers(&[
                (":status", "200"),
                ("grpc-status", "5"),
                ("grpc-message", "not%20found"),
            ]),
            body: vec![],
        };
        assert!(
            matches!(grpc_message(failed), Err(CriError::Status { code: 5, message }) if message == "not found")
        );
        let short = Answer {
            headers: headers(&[("grpc-status", "0")]),
            body: vec![0, 0, 0, 0, 9, 1],
        };
        assert!(matches!(grpc_message(short), Err(CriError::Protocol(_))));
    }
}
