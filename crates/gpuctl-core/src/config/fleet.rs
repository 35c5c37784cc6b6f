//! The `[fleet]` table: where `gpuctl fleet` finds the Prometheus (or Thanos, Mimir,
//! VictoriaMetrics: the same query API) that scrapes every node, and how it runs a command
//! on a node.

use std::path::PathBuf;

use serde::{Deserialize, Deserializer, Serialize};

use super::de;

/// `[fleet]`. A user's own file may name its own Prometheus and template (`gpuctl fleet`
/// reads with the caller's rights and acts through the caller's own ssh or clush); each key
/// of the user's file wins over the system file's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FleetConfig {
    /// The query API's base URL: `http://prometheus:9090`, `https://thanos.example/`,
    /// `http://vm:8428/select/0/prometheus` (`--prometheus` overrides it).
    #[serde(
        deserialize_with = "prometheus_url",
        skip_serializing_if = "Option::is_none"
    )]
    pub prometheus: Option<String>,
    /// A file holding the bearer token sent with each query (read when a query is made).
    #[serde(
        deserialize_with = "de::absolute_path_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub bearer_token_file: Option<PathBuf>,
    /// PEM certificates of the CAs that sign the server's certificate (https), in place of
    /// the built-in public roots.
    #[serde(
        deserialize_with = "de::absolute_path_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub ca_file: Option<PathBuf>,
    /// The command run before a node's command, each `{node}` replaced by the node's name:
    /// `["ssh", "{node}"]`, `["clush", "-w", "{node}", "--"]`, `["srun", "-w", "{node}", "-N1", "--"]`.
    #[serde(
        deserialize_with = "exec_template",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub exec: Vec<String>,
    /// How many nodes `--exec` works on at once (1 to 256; absent: 8).
    #[serde(
        deserialize_with = "concurrency",
        skip_serializing_if = "Option::is_none"
    )]
    pub concurrency: Option<usize>,
}

/// Why `url` is not a query API's base URL, in one line; `None` when it is one. Only
/// http and https, a host, no credentials (they belong in `bearer_token_file`, not in a
/// command line or a file others read), no query or fragment.
pub fn prometheus_url_error(url: &str) -> Option<String> {
    let bad = |why: &str| Some(format!("'{url}' is not a Prometheus URL: {why}"));
    let Some((scheme, rest)) = url.split_once("://") else {
        return bad("give http://HOST:PORT or https://HOST");
    };
    if scheme != "http" && scheme != "https" {
        return bad("only http and https");
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return bad("it contains a space or a control character");
    }
    let authority = rest.split('/').next().unwrap_or("");
    if authority.contains('@') {
        return bad("credentials in the URL: give bearer_token_file instead");
    }
    if authority.is_empty() || authority.starts_with(':') {
        return bad("no host");
    }
    if rest.contains(['?', '#']) {
        return bad("a query or fragment: give the base URL only");
    }
    None
}

fn prometheus_url<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let url = String::deserialize(d)?;
    match prometheus_url_error(&url) {
        Some(why) => Err(serde::de::Error::custom(why)),
        None => Ok(Some(url)),
    }
}

/// A template: words, none empty, `{node}` in at least one (else every node's command
/// would run in the same place).
fn exec_template<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let words = Vec::<String>::deserialize(d)?;
    if words.iter().any(|w| w.is_empty() || w.contains('\0')) {
        return Err(serde::de::Error::custom(
            "a command's words must not be empty",
        ));
    }
    if !words.is_empty() && !words.iter().any(|w| w.contains("{node}")) {
        return Err(serde::de::Error::custom(
            "no word says {node}: give where to run it, as [\"ssh\", \"{node}\"]",
        ));
    }
    Ok(words)
}

fn concurrency<'de, D: Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    let n = i64::deserialize(d)?;
    match usize::try_from(n) {
        Ok(n @ 1..=256) => Ok(Some(n)),
        _ => Err(serde::de::Error::custom(format!(
            "{n} is not a concurrency: give 1 to 256"
        ))),
    }
}

impl FleetConfig {
    /// Each key of `over` (the user's file) where it has one, else `self`'s.
    pub fn under(self, over: &FleetConfig) -> FleetConfig {
        FleetConfig {
            prometheus: over.prometheus.clone().or(self.prometheus),
            bearer_token_file: over.bearer_token_file.clone().or(self.bearer_token_file),
            ca_file: over.ca_file.clone().or(self.ca_file),
            exec: if over.exec.is_empty() {
                self.exec
            } else {
                over.exec.clone()
            },
            concurrency: over.concurrency.or(self.concurrency),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::parse;

    #[test]
    fn the_fleet_table_reads_every_key() {
        let path = Path::new("/etc/gpuctl/gpuctl.toml");
        assert_eq!(parse("", path).unwrap().fleet, FleetConfig::default());
        let fleet = parse(
            "[fleet]\nprometheus = \"https://thanos.example/select/0/prometheus\"\n\
             bearer_token_file = \"/etc/gpuctl/token\"\nca_file = \"/etc/ssl/site.pem\"\n\
             exec = [\"clush\", \"-w\", \"{node}\", \"--\"]\nconcurrency = 16\n",
            path,
        )
        .unwrap()
        .fleet;
        assert_eq!(
            fleet.prometheus.as_deref(),
            Some("https://thanos.example/select/0/prometheus")
        );
        assert_eq!(fleet.exec, ["clush", "-w", "{node}", "--"]);
        assert_eq!(fleet.concurrency, Some(16));
        assert_eq!(
            fleet.ca_file.as_deref(),
            Some(Path::new("/etc/ssl/site.pem"))
        );
    }

    #[test]
    fn each_bad_value_is_one_line_naming_the_key() {
        let path = Path::new("/etc/gpuctl/gpuctl.toml");
        for (text, says) in [
            ("prometheus = \"prom:9090\"", "give http://HOST:PORT"),
            ("prometheus = \"ftp://prom\"", "only http and https"),
            ("prometheus = \"http://u:p@prom\"", "bearer_token_file"),
            ("prometheus = \"http:///x\"", "no host"),
            ("prometheus = \"http://p/?a=1\"", "a query or fragment"),
            ("bearer_token_file = \"token\"", "not an absolute path"),
            ("exec = [\"ssh\"]", "no word says {node}"),
            ("exec = [\"ssh\", \"\"]", "must not be empty"),
            ("concurrency = 0", "give 1 to 256"),
            ("nodes = 3", "unknown"),
        ] {
            let error = parse(&format!("[fleet]\n{text}\n"), path)
                .unwrap_err()
                .to_string();
            assert!(error.contains(says), "{text}: {error}");
            assert!(error.contains("fleet"), "{text}: {error}");
            assert!(!error.contains('\n'), "{text}: {error}");
        }
    }

    #[test]
    fn the_users_keys_win_one_by_one() {
        let system = FleetConfig {
            prometheus: Some("http://site:9090".into()),
            exec: vec!["ssh".into(), "{node}".into()],
            ..FleetConfig::default()
        };
        let user = FleetConfig {
            prometheus: Some("http://mine:9090".into()),
            ..FleetConfig::default()
        };
        let both = system.under(&user);
        assert_eq!(both.prometheus.as_deref(), Some("http://mine:9090"));
        assert_eq!(both.exec, ["ssh", "{node}"]);
    }
}
