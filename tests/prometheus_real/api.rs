//! Prometheus's HTTP API through a minimal HTTP/1.1 client (GET, `Connection: close`) on a
//! loopback port: enough for `/api/v1/query`, `/api/v1/targets` and `/api/v1/rules`, and
//! no HTTP library to add for it.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::Value;

/// How long one request may take before it is an error (a hung server fails the test).
const TIMEOUT: Duration = Duration::from_secs(5);

/// `text` percent-encoded for a query string: everything but RFC 3986's unreserved bytes.
pub fn url_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(byte as char)
            }
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

/// The body of `GET path` on 127.0.0.1:`port`, whatever its status (the API answers errors
/// with a JSON body that says why). Err: the connection or the response could not be had.
pub fn get(port: u16, path: &str) -> Result<(u16, String), String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream =
        TcpStream::connect_timeout(&addr, TIMEOUT).map_err(|e| format!("connect {addr}: {e}"))?;
    stream
        .set_read_timeout(Some(TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(TIMEOUT)))
        .map_err(|e| format!("{addr}: {e}"))?;
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: */*\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .map_err(|e| format!("send to {addr}: {e}"))?;
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .map_err(|e| format!("read from {addr}: {e}"))?;
    parse_response(&raw).map_err(|e| format!("GET {path} on {addr}: {e}"))
}

/// Status and body of a whole HTTP/1.1 response (the server closed the connection after it).
fn parse_response(raw: &[u8]) -> Result<(u16, String), String> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no end of headers")?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let body = &raw[split + 4..];
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| format!("no status line: {head}"))?;
    // Go's server chunks a body it did not measure beforehand, Connection: close or not.
    let chunked = lines.any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

fn dechunk(mut body: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let end = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("truncated chunk size")?;
        let line = String::from_utf8_lossy(&body[..end]);
        let size = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size, 16).map_err(|_| format!("chunk size {line:?}"))?;
        body = &body[end + 2..];
        if size == 0 {
            return Ok(out);
        }
        if body.len() < size + 2 {
            return Err("truncated chunk".into());
        }
        out.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
}

/// The `data` of a successful API answer at `path`; Err with Prometheus's error otherwise.
pub fn api(port: u16, path: &str) -> Result<Value, String> {
    let (status, body) = get(port, path)?;
    let json: Value = serde_json::from_str(&body)
        .map_err(|e| format!("GET {path}: HTTP {status}, not JSON ({e}): {body}"))?;
    if json["status"] != "success" {
        return Err(format!(
            "GET {path}: HTTP {status}, {}: {}",
            json["errorType"].as_str().unwrap_or("?"),
            json["error"].as_str().unwrap_or(&body)
        ));
    }
    Ok(json["data"].clone())
}

/// One series of an instant vector: its labels and value.
#[derive(Debug, Clone)]
pub struct Sample {
    pub labels: serde_json::Map<String, Value>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, name: &str) -> &str {
        self.labels.get(name).and_then(Value::as_str).unwrap_or("")
    }
}

/// The result of the instant query `promql` now. A scalar or string result is one sample
/// with no labels; Err: the query failed (parse or evaluation error), with the reason.
pub fn query(port: u16, promql: &str) -> Result<Vec<Sample>, String> {
    let data = api(port, &format!("/api/v1/query?query={}", url_encode(promql)))?;
    let value = |pair: &Value| -> Result<f64, String> {
        let text = pair[1]
            .as_str()
            .ok_or_else(|| format!("no value in {pair}"))?;
        // Prometheus writes NaN and ±Inf as such; Rust's parser reads those spellings.
        text.parse::<f64>()
            .map_err(|_| format!("value {text:?} of {promql}"))
    };
    match data["resultType"].as_str() {
        Some("vector") => data["result"]
            .as_array()
            .ok_or_else(|| format!("no result array: {data}"))?
            .iter()
            .map(|s| {
                Ok(Sample {
                    labels: s["metric"].as_object().cloned().unwrap_or_default(),
                    value: value(&s["value"])?,
                })
            })
            .collect(),
        Some("scalar") => Ok(vec![Sample {
            labels: Default::default(),
            value: value(&data["result"])?,
        }]),
        Some("matrix") => Ok(data["result"]
            .as_array()
            .map(|all| {
                all.iter()
                    .map(|s| Sample {
                        labels: s["metric"].as_object().cloned().unwrap_or_default(),
                        value: f64::NAN,
                    })
                    .collect()
            })
            .unwrap_or_default()),
        other => Err(format!("{promql}: result type {other:?}: {data}")),
    }
}

/// The client's own pieces, on fixed input (a trial: this binary has no libtest).
pub fn self_test() {
    assert_eq!(
        url_encode(r#"sum by (user) (x{a=~".*"})"#),
        "sum%20by%20%28user%29%20%28x%7Ba%3D~%22.%2A%22%7D%29"
    );
    let raw =
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x\r\nde\r\n0\r\n\r\n";
    assert_eq!(parse_response(raw).unwrap(), (200, "abcde".into()));
    let raw = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 2\r\n\r\n{}";
    assert_eq!(parse_response(raw).unwrap(), (400, "{}".into()));
}
