//! Prometheus' HTTP query API (`POST /api/v1/query`), which Thanos, Mimir and
//! VictoriaMetrics answer the same way. The client lives in the CLI, not in core: only this
//! front talks HTTP, and the wheel, the watchdog and the trainer should not carry a TLS stack.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gpuctl_core::exit::Exit;
use serde_json::Value;

/// The most of an answer read: a fleet's instant vectors are a few MiB at 1,000 nodes.
const ANSWER_LIMIT: u64 = 64 << 20;

/// What went wrong, each one line with its documented exit status.
#[derive(Debug)]
pub enum FleetError {
    /// Bad usage or input: no URL, a bad URL, an unreadable token or CA file (exit 2).
    Usage(String),
    /// Prometheus cannot be reached (connection, name, TLS, timeout) (exit 3).
    Unreachable(String),
    /// Prometheus answered with an error for a query (exit 1).
    Query(String),
    /// The answer is not what the API documents (exit 1).
    Malformed(String),
    /// A node's command could not be run or failed (exit 1).
    Failed(String),
}

impl FleetError {
    pub fn exit(&self) -> Exit {
        match self {
            FleetError::Usage(_) => Exit::Usage,
            FleetError::Unreachable(_) => Exit::Unavailable,
            FleetError::Query(_) | FleetError::Malformed(_) | FleetError::Failed(_) => Exit::Failed,
        }
    }
}

impl std::fmt::Display for FleetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FleetError::Usage(m)
            | FleetError::Unreachable(m)
            | FleetError::Query(m)
            | FleetError::Malformed(m)
            | FleetError::Failed(m) => f.write_str(m),
        }
    }
}

/// One series of an instant vector: its labels and value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, name: &str) -> &str {
        self.labels.get(name).map_or("", String::as_str)
    }
}

/// Where to ask, and how.
pub struct Endpoint {
    pub url: String,
    pub bearer_token_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    pub timeout: Duration,
}

pub struct Client {
    agent: ureq::Agent,
    query_url: String,
    authorization: Option<String>,
    /// Queries made, for the benchmark's count.
    pub queries: std::cell::Cell<usize>,
}

impl Client {
    /// Checks the URL and reads the token and CA files now, so a bad one is one line
    /// before any query.
    pub fn new(endpoint: &Endpoint) -> Result<Client, FleetError> {
        if let Some(why) = gpuctl_core::config::prometheus_url_error(&endpoint.url) {
            return Err(FleetError::Usage(why));
        }
        let authorization = match &endpoint.bearer_token_file {
            Some(path) => Some(format!("Bearer {}", read_token(path)?)),
            None => None,
        };
        let mut config = ureq::Agent::config_builder()
            .timeout_global(Some(endpoint.timeout))
            .http_status_as_error(false)
            .user_agent(concat!("gpuctl/", env!("CARGO_PKG_VERSION")));
        if let Some(path) = &endpoint.ca_file {
            config = config.tls_config(tls_with_roots(path)?);
        }
        Ok(Client {
            agent: config.build().into(),
            query_url: format!("{}/api/v1/query", endpoint.url.trim_end_matches('/')),
            authorization,
            queries: Default::default(),
        })
    }

    /// The instant vector `promql` gives now.
    pub fn query(&self, promql: &str) -> Result<Vec<Sample>, FleetError> {
        self.queries.set(self.queries.get() + 1);
        let mut request = self.agent.post(&self.query_url);
        if let Some(value) = &self.authorization {
            request = request.header("Authorization", value);
        }
        let mut response = request
            .send_form([("query", promql)])
            .map_err(|e| unreachable(&self.query_url, e))?;
        let status = response.status().as_u16();
        let body = response
            .body_mut()
            .with_config()
            .limit(ANSWER_LIMIT)
            .read_to_string()
            .map_err(|e| unreachable(&self.query_url, e))?;
        parse_answer(status, &body)
    }
}

fn unreachable(url: &str, error: ureq::Error) -> FleetError {
    let error = match error {
        ureq::Error::Io(e) => e.to_string(),
        other => other.to_string(),
    };
    FleetError::Unreachable(format!("cannot reach Prometheus at {url}: {error}"))
}

/// The token, trimmed: one line, not empty.
fn read_token(path: &Path) -> Result<String, FleetError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| FleetError::Usage(format!("bearer token file {}: {e}", path.display())))?;
    let token = text.trim();
    if token.is_empty() || token.contains(['\n', '\r']) {
        return Err(FleetError::Usage(format!(
            "bearer token file {}: give one token on one line",
            path.display()
        )));
    }
    Ok(token.to_string())
}

fn tls_with_roots(path: &Path) -> Result<ureq::tls::TlsConfig, FleetError> {
    let bad = |why: String| FleetError::Usage(format!("CA file {}: {why}", path.display()));
    let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let mut roots = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        if let ureq::tls::PemItem::Certificate(cert) = item.map_err(|e| bad(e.to_string()))? {
            roots.push(cert);
        }
    }
    if roots.is_empty() {
        return Err(bad("no PEM certificate in it".into()));
    }
    Ok(ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::Specific(Arc::new(roots)))
        .build())
}

/// An answer of the query API: the samples of a vector (a scalar is one sample without
/// labels), or the error it names.
pub fn parse_answer(status: u16, body: &str) -> Result<Vec<Sample>, FleetError> {
    let json: Value = serde_json::from_str(body).map_err(|_| {
        FleetError::Malformed(format!(
            "Prometheus answered HTTP {status} with no JSON API answer: {}",
            first_words(body)
        ))
    })?;
    match json["status"].as_str() {
        Some("success") => {}
        Some("error") => {
            return Err(FleetError::Query(format!(
                "Prometheus refused the query (HTTP {status}, {}): {}",
                json["errorType"].as_str().unwrap_or("?"),
                json["error"].as_str().unwrap_or("no reason given")
            )));
        }
        _ => {
            return Err(FleetError::Malformed(format!(
                "Prometheus answered HTTP {status} without a status: {}",
                first_words(body)
            )));
        }
    }
    let data = &json["data"];
    let malformed =
        || FleetError::Malformed(format!("not an instant vector: {}", first_words(body)));
    match data["resultType"].as_str() {
        Some("vector") => data["result"]
            .as_array()
            .ok_or_else(malformed)?
            .iter()
            .map(|s| {
                let labels = s["metric"]
                    .as_object()
                    .ok_or_else(malformed)?
                    .iter()
                    .map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect::<Option<_>>()
                    .ok_or_else(malformed)?;
                Ok(Sample {
                    labels,
                    value: value(&s["value"]).ok_or_else(malformed)?,
                })
            })
            .collect(),
        Some("scalar") => Ok(vec![Sample {
            labels: BTreeMap::new(),
            value: value(&data["result"]).ok_or_else(malformed)?,
        }]),
        _ => Err(malformed()),
    }
}

/// `[time, "value"]`: Prometheus writes NaN and ±Inf as such, which Rust reads.
fn value(pair: &Value) -> Option<f64> {
    pair.get(1)?.as_str()?.parse().ok()
}

/// The start of a body, on one line, for a message.
fn first_words(body: &str) -> String {
    let line: String = body.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut cut: String = line.chars().take(120).collect();
    if cut.len() < line.len() {
        cut.push('…');
    }
    if cut.is_empty() {
        "(empty)".into()
    } else {
        cut
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vector_its_labels_and_values() {
        let body = r#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"instance":"gpu-01","q":"used"},"value":[1.5,"42"]},
            {"metric":{},"value":[1.5,"NaN"]}]}}"#;
        let samples = parse_answer(200, body).unwrap();
        assert_eq!(samples[0].label("instance"), "gpu-01");
        assert_eq!(samples[0].value, 42.0);
        assert!(samples[1].value.is_nan());
    }

    #[test]
    fn each_bad_answer_is_one_line_and_its_exit() {
        let refused =
            r#"{"status":"error","errorType":"bad_data","error":"parse error at char 3"}"#;
        let error = parse_answer(400, refused).unwrap_err();
        assert_eq!(error.exit(), Exit::Failed);
        assert!(
            error
                .to_string()
                .contains("bad_data): parse error at char 3")
        );
        for body in [
            "<html>\n<body>502 Bad Gateway</body></html>",
            "{\"status\":\"success\",\"data\":{\"resultType\":\"matrix\",\"result\":[]}}",
            "{\"status\":\"success\",\"data\":{\"resultType\":\"vector\",\"result\":[{\"metric\":{},\"value\":[1]}]}}",
            "{\"data\":1}",
            "",
        ] {
            let error = parse_answer(502, body).unwrap_err();
            assert!(matches!(error, FleetError::Malformed(_)), "{body}: {error}");
            assert!(!error.to_string().contains('\n'), "{error}");
        }
    }

    #[test]
    fn the_token_file_must_hold_one_token() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "abc\n").unwrap();
        assert_eq!(read_token(&path).unwrap(), "abc");
        std::fs::write(&path, "a\nb\n").unwrap();
        assert!(read_token(&path).is_err());
        let missing = read_token(&dir.path().join("none")).unwrap_err();
        assert_eq!(missing.exit(), Exit::Usage);
    }
}
