//! The fleet's rows from Prometheus: one query for the per-node view and one for the
//! per-user or per-owner view, whatever the number of nodes (each part of a query is
//! labelled `q` and joined with `or`, so one round trip carries them all). Pure: samples
//! in, rows out.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use super::prometheus::{FleetError, Sample};

/// A node is one that wrote the watchdog's metrics within this window (a node stopped for
/// longer drops out of the view).
const KNOWN_WITHIN: &str = "1h";
/// The window of the "idle now" rate: a few of the usual scrape intervals.
const IDLE_NOW: &str = "5m";
/// A node whose metrics are older than this many of its watchdog's intervals has stopped
/// reporting (`--stale-after` overrides it); never less than `MIN_STALE`.
const STALE_INTERVALS: f64 = 3.0;
const MIN_STALE: f64 = 60.0;

/// The kinds whose memory `gpuctl clear` gets back on the node.
pub const CLEARED_KINDS: [&str; 4] = ["orphaned", "zombie_holder", "stopped", "pod_leftover"];

/// The label matcher of `--node PATTERN` (matched whole against the node's name, the
/// instance without its port), or every instance.
pub fn node_matcher(pattern: Option<&str>) -> Result<String, FleetError> {
    let Some(pattern) = pattern else {
        return Ok("instance!=\"\"".into());
    };
    if pattern.is_empty() || pattern.chars().any(char::is_control) {
        return Err(FleetError::Usage(
            "--node: give a pattern without control characters".into(),
        ));
    }
    let quoted = pattern.replace('\\', "\\\\").replace('"', "\\\"");
    Ok(format!("instance=~\"({quoted})(:[0-9]+)?\""))
}

/// `label_replace(EXPR, "q", NAME, "", "")`: the part's name on each of its series.
fn part(name: &str, expr: &str) -> String {
    format!("label_replace({expr}, \"q\", \"{name}\", \"\", \"\")")
}

/// The one query of the per-node view.
pub fn nodes_query(matcher: &str) -> String {
    let m = matcher;
    [
        part(
            "known",
            &format!("max by (instance) (last_over_time(gpuctl_watchdog_loops_total{{{m}}}[{KNOWN_WITHIN}]))"),
        ),
        part("up", &format!("max by (instance) (up{{{m}}})")),
        part(
            "age",
            &format!(
                "time() - max by (instance) (node_textfile_mtime_seconds{{{m},file=~\".*gpuctl[^/]*[.]prom\"}})"
            ),
        ),
        part("interval", &format!("max by (instance) (gpuctl_watchdog_interval_seconds{{{m}}})")),
        part("nvml_up", &format!("max by (instance) (gpuctl_nvml_up{{{m}}})")),
        part("gpus", &format!("count by (instance) (gpuctl_gpu_up{{{m}}})")),
        part("gpus_down", &format!("count by (instance) (gpuctl_gpu_up{{{m}}} == 0)")),
        part("used", &format!("sum by (instance) (gpuctl_gpu_memory_used_bytes{{{m}}})")),
        part("total", &format!("sum by (instance) (gpuctl_gpu_memory_total_bytes{{{m}}})")),
        part(
            "unattributed",
            &format!("sum by (instance) (gpuctl_gpu_unattributed_bytes{{{m}}})"),
        ),
        part(
            "held",
            &format!("sum by (instance, kind, owner) (gpuctl_finding_memory_bytes{{{m}}})"),
        ),
        part(
            "health",
            &format!(
                "max by (instance, gpu, action) (gpuctl_gpu_health_action{{{m},action!=\"none\"}} == 1)"
            ),
        ),
        part("findings", &format!("sum by (instance, kind) (gpuctl_findings{{{m}}} > 0)")),
        part(
            "slurm",
            &format!("count by (instance) (gpuctl_owner_memory_bytes{{{m},owner_kind=\"slurm\"}})"),
        ),
    ]
    .join(" or ")
}

/// Whether a node's figures can be believed now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Its metrics are fresh.
    Reporting,
    /// Fresh, but its watchdog cannot read NVML: nothing is known of its GPUs.
    NvmlDown,
    /// Prometheus cannot scrape it.
    TargetDown,
    /// Scraped, but its watchdog's metrics are older than the limit.
    Stale,
    /// Prometheus no longer scrapes it (it reported within the last hour).
    NotScraped,
}

impl Status {
    pub fn reporting(self) -> bool {
        self == Status::Reporting
    }

    pub fn words(self) -> &'static str {
        match self {
            Status::Reporting => "ok",
            Status::NvmlDown => "NVML down",
            Status::TargetDown => "target down",
            Status::Stale => "stale",
            Status::NotScraped => "not scraped",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OwnerHeld {
    pub owner: String,
    pub kind: String,
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuAction {
    pub gpu: u32,
    pub action: String,
}

/// One node's row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Node {
    /// The instance without its port: what `{node}` in the exec template becomes.
    pub node: String,
    pub instance: String,
    pub status: Status,
    /// How old its watchdog's metrics file is, where the node exporter says.
    pub age_seconds: Option<f64>,
    pub gpus: u32,
    pub gpus_down: u32,
    pub used_bytes: u64,
    pub total_bytes: u64,
    pub unattributed_bytes: u64,
    /// Memory held by findings, per kind.
    pub held_bytes: BTreeMap<String, u64>,
    /// Who holds it, per owner and kind, largest first.
    pub owners: Vec<OwnerHeld>,
    /// What `gpuctl clear` on the node gets back (orphaned, zombie, stopped).
    pub clearable_bytes: u64,
    /// Findings memory and unattributed memory: what the rows are sorted by.
    pub reclaimable_bytes: u64,
    /// The GPUs whose health verdict needs an action.
    pub health: Vec<GpuAction>,
    /// Current findings per kind (those above 0).
    pub findings: BTreeMap<String, u64>,
    /// Slurm jobs hold memory on it now: its plan drains it through scontrol.
    pub slurm: bool,
}

/// The per-node rows from the answer of [`nodes_query`], most to reclaim first, then the
/// nodes not reporting, then by name.
pub fn nodes(samples: &[Sample], stale_after: Option<Duration>) -> Vec<Node> {
    let mut by_instance: BTreeMap<&str, Vec<&Sample>> = BTreeMap::new();
    for s in samples {
        by_instance.entry(s.label("instance")).or_default().push(s);
    }
    let mut rows: Vec<Node> = by_instance
        .into_iter()
        .filter(|(_, parts)| parts.iter().any(|s| s.label("q") == "known"))
        .map(|(instance, parts)| node(instance, &parts, stale_after))
        .collect();
    rows.sort_by(|a, b| {
        b.reclaimable_bytes
            .cmp(&a.reclaimable_bytes)
            .then(a.status.reporting().cmp(&b.status.reporting()))
            .then(a.node.cmp(&b.node))
    });
    rows
}

/// A byte count from a sample (NaN and negatives are 0).
fn bytes(value: f64) -> u64 {
    if value.is_finite() && value > 0.0 {
        value as u64
    } else {
        0
    }
}

fn node(instance: &str, parts: &[&Sample], stale_after: Option<Duration>) -> Node {
    let one = |q: &str| parts.iter().find(|s| s.label("q") == q).map(|s| s.value);
    let age = one("age").filter(|a| a.is_finite());
    let limit = stale_after.map(|d| d.as_secs_f64()).unwrap_or_else(|| {
        one("interval").map_or(MIN_STALE, |i| (i * STALE_INTERVALS).max(MIN_STALE))
    });
    let status = match one("up") {
        None => Status::NotScraped,
        Some(up) if up < 1.0 => Status::TargetDown,
        Some(_) if age.is_some_and(|a| a > limit) || one("nvml_up").is_none() => Status::Stale,
        Some(_) if one("nvml_up") == Some(0.0) => Status::NvmlDown,
        Some(_) => Status::Reporting,
    };
    let mut held_bytes: BTreeMap<String, u64> = BTreeMap::new();
    let mut owners: Vec<OwnerHeld> = Vec::new();
    let mut health = Vec::new();
    let mut findings = BTreeMap::new();
    for s in parts {
        match s.label("q") {
            "held" => {
                *held_bytes.entry(s.label("kind").into()).or_default() += bytes(s.value);
                owners.push(OwnerHeld {
                    owner: s.label("owner").into(),
                    kind: s.label("kind").into(),
                    bytes: bytes(s.value),
                });
            }
            "health" => health.push(GpuAction {
                gpu: s.label("gpu").parse().unwrap_or(u32::MAX),
                action: s.label("action").into(),
            }),
            "findings" => {
                findings.insert(s.label("kind").to_string(), bytes(s.value));
            }
            _ => {}
        }
    }
    owners.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.owner.cmp(&b.owner)));
    health.sort_by_key(|g| g.gpu);
    let unattributed_bytes = one("unattributed").map_or(0, bytes);
    let clearable_bytes = CLEARED_KINDS
        .iter()
        .filter_map(|k| held_bytes.get(*k))
        .sum();
    Node {
        node: node_name(instance).to_string(),
        instance: instance.to_string(),
        status,
        age_seconds: age,
        gpus: one("gpus").map_or(0, |v| bytes(v) as u32),
        gpus_down: one("gpus_down").map_or(0, |v| bytes(v) as u32),
        used_bytes: one("used").map_or(0, bytes),
        total_bytes: one("total").map_or(0, bytes),
        unattributed_bytes,
        reclaimable_bytes: held_bytes.values().sum::<u64>() + unattributed_bytes,
        clearable_bytes,
        held_bytes,
        owners,
        health,
        findings,
        slurm: one("slurm").is_some(),
    }
}

/// The instance without a trailing `:PORT` (`gpu-01:9100` → `gpu-01`; `[::1]:9100` →
/// `[::1]`); an instance relabelled to a name stays as it is.
pub fn node_name(instance: &str) -> &str {
    match instance.rsplit_once(':') {
        Some((host, port))
            if !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit())
                && (!host.contains(':') || host.ends_with(']')) =>
        {
            host
        }
        _ => instance,
    }
}

/// `--by`: the label, and the families of the memory held now and the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    User,
    Owner,
}

impl By {
    pub fn label(self) -> &'static str {
        match self {
            By::User => "user",
            By::Owner => "owner",
        }
    }
}

/// The one query of the per-user or per-owner view, over `since`.
pub fn by_query(by: By, matcher: &str, since: Duration) -> String {
    let (l, m) = (by.label(), matcher);
    let window = format!("{}s", since.as_secs().max(1));
    [
        part("held", &format!("sum by ({l}) (gpuctl_{l}_memory_bytes{{{m}}})")),
        part(
            "idle",
            &format!("sum by ({l}) (rate(gpuctl_{l}_idle_memory_byte_seconds_total{{{m}}}[{IDLE_NOW}]))"),
        ),
        part(
            "held_over",
            &format!("sum by ({l}) (increase(gpuctl_{l}_memory_byte_seconds_total{{{m}}}[{window}]))"),
        ),
        part(
            "idle_over",
            &format!(
                "sum by ({l}) (increase(gpuctl_{l}_idle_memory_byte_seconds_total{{{m}}}[{window}]))"
            ),
        ),
    ]
    .join(" or ")
}

/// One user's or owner's row across the fleet.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Holder {
    pub name: String,
    pub held_bytes: u64,
    /// Held while under `[idle] util_below`, averaged over the last 5 minutes.
    pub idle_bytes: u64,
    pub held_gib_hours: f64,
    pub idle_gib_hours: f64,
}

const GIB_HOUR: f64 = (1u64 << 30) as f64 * 3600.0;

/// The rows from the answer of [`by_query`], most GiB-hours held idle first.
pub fn holders(by: By, samples: &[Sample]) -> Vec<Holder> {
    let mut rows: BTreeMap<&str, Holder> = BTreeMap::new();
    for s in samples {
        let name = s.label(by.label());
        let row = rows.entry(name).or_insert_with(|| Holder {
            name: name.to_string(),
            held_bytes: 0,
            idle_bytes: 0,
            held_gib_hours: 0.0,
            idle_gib_hours: 0.0,
        });
        let hours = |v: f64| {
            if v.is_finite() {
                v.max(0.0) / GIB_HOUR
            } else {
                0.0
            }
        };
        match s.label("q") {
            "held" => row.held_bytes = bytes(s.value),
            "idle" => row.idle_bytes = bytes(s.value),
            "held_over" => row.held_gib_hours = hours(s.value),
            "idle_over" => row.idle_gib_hours = hours(s.value),
            _ => {}
        }
    }
    let mut rows: Vec<Holder> = rows.into_values().collect();
    rows.sort_by(|a, b| {
        b.idle_gib_hours
            .total_cmp(&a.idle_gib_hours)
            .then(b.held_gib_hours.total_cmp(&a.held_gib_hours))
            .then(b.held_bytes.cmp(&a.held_bytes))
            .then(a.name.cmp(&b.name))
    });
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(instance: &str, q: &str, value: f64, more: &[(&str, &str)]) -> Sample {
        let mut labels: BTreeMap<String, String> = [("instance", instance), ("q", q)]
            .into_iter()
            .chain(more.iter().copied())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        labels.retain(|_, v| !v.is_empty());
        Sample { labels, value }
    }

    #[test]
    fn names_drop_the_port_only() {
        assert_eq!(node_name("gpu-01:9100"), "gpu-01");
        assert_eq!(node_name("gpu-01"), "gpu-01");
        assert_eq!(node_name("[::1]:9100"), "[::1]");
        assert_eq!(node_name("fe80::1"), "fe80::1");
        assert_eq!(node_name("10.0.0.7:9100"), "10.0.0.7");
    }

    #[test]
    fn a_pattern_is_one_quoted_regex_matched_with_or_without_a_port() {
        assert_eq!(node_matcher(None).unwrap(), "instance!=\"\"");
        assert_eq!(
            node_matcher(Some("gpu-0[1-4]")).unwrap(),
            "instance=~\"(gpu-0[1-4])(:[0-9]+)?\""
        );
        // A quote cannot end the string and add a matcher of its own.
        assert_eq!(
            node_matcher(Some("a\",job=\"x")).unwrap(),
            "instance=~\"(a\\\",job=\\\"x)(:[0-9]+)?\""
        );
        assert!(node_matcher(Some("a\nb")).is_err());
    }

    #[test]
    fn one_query_for_every_node() {
        let q = nodes_query("instance!=\"\"");
        assert_eq!(q.matches(" or ").count(), 13);
        assert!(!q.contains("gpu-01"));
    }

    /// Sorted by what can be reclaimed; a node down or stale is said so, never clean.
    #[test]
    fn rows_sorted_by_reclaimable_and_silent_nodes_never_clean() {
        let g = 1u64 << 30;
        let mut samples = Vec::new();
        for (node, up, age) in [
            ("a:9100", 1.0, 1.0),
            ("b:9100", 1.0, 2.0),
            ("c:9100", 0.0, 0.0),
            ("d:9100", 1.0, 900.0),
        ] {
            samples.push(sample(node, "known", 10.0, &[]));
            samples.push(sample(node, "up", up, &[]));
            if up > 0.0 {
                samples.push(sample(node, "age", age, &[]));
                samples.push(sample(node, "interval", 10.0, &[]));
                samples.push(sample(node, "nvml_up", 1.0, &[]));
            }
        }
        samples.push(sample(
            "b:9100",
            "held",
            (3 * g) as f64,
            &[("kind", "orphaned"), ("owner", "slurm:7")],
        ));
        samples.push(sample(
            "b:9100",
            "held",
            (2 * g) as f64,
            &[("kind", "idle"), ("owner", "slurm:8")],
        ));
        samples.push(sample("a:9100", "unattributed", g as f64, &[]));
        samples.push(sample(
            "a:9100",
            "health",
            1.0,
            &[("gpu", "3"), ("action", "gpu_reset")],
        ));
        // Scraped by Prometheus, but never ran the watchdog: not a node of the fleet.
        samples.push(sample("e:9100", "up", 1.0, &[]));
        let rows = nodes(&samples, None);
        let order: Vec<(&str, Status)> = rows.iter().map(|n| (n.node.as_str(), n.status)).collect();
        assert_eq!(
            order,
            [
                ("b", Status::Reporting),
                ("a", Status::Reporting),
                ("c", Status::TargetDown),
                ("d", Status::Stale),
            ]
        );
        assert_eq!(rows[0].clearable_bytes, 3 * g);
        assert_eq!(rows[0].reclaimable_bytes, 5 * g);
        assert_eq!(rows[0].owners[0].owner, "slurm:7");
        assert_eq!(
            rows[1].health,
            [GpuAction {
                gpu: 3,
                action: "gpu_reset".into()
            }]
        );
        // An explicit limit wins over three intervals.
        let rows = nodes(&samples, Some(Duration::from_millis(1500)));
        assert_eq!(
            rows.iter().find(|n| n.node == "b").unwrap().status,
            Status::Stale
        );
        assert_eq!(
            rows.iter().find(|n| n.node == "a").unwrap().status,
            Status::Reporting
        );
    }

    #[test]
    fn holders_in_gib_hours() {
        let q = by_query(By::User, "instance!=\"\"", Duration::from_secs(86400));
        assert!(
            q.contains("increase(gpuctl_user_memory_byte_seconds_total{instance!=\"\"}[86400s])")
        );
        let hour = GIB_HOUR;
        let samples = [
            sample("", "held", 4.0 * (1u64 << 30) as f64, &[("user", "alice")]),
            sample("", "held_over", 2.0 * hour, &[("user", "alice")]),
            sample("", "idle_over", 1.5 * hour, &[("user", "alice")]),
            sample("", "held_over", 9.0 * hour, &[("user", "bob")]),
        ];
        let rows = holders(By::User, &samples);
        assert_eq!(rows[0].name, "alice");
        assert_eq!(rows[0].idle_gib_hours, 1.5);
        assert_eq!(rows[1].held_gib_hours, 9.0);
    }
}
