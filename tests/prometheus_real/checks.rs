//! The tests, each on the running fleet. Values are compared with what `gpuctl info --json`
//! says on the same node (the contract: the metrics are the snapshot's figures), polling
//! Prometheus until they agree or the wait runs out.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::api::{self, Sample};
use crate::fleet::{self, DASHBOARD, Fleet, LEAK, NAMELESS_UID, NOBODY, RULES};
use crate::util::counted_finding_kinds;

/// `gpuctl info ARGS --json` on `node`'s sim. Node 3's lost GPU makes it exit 1 (a GPU
/// failed), with the whole document all the same.
fn info(node: &fleet::Node, args: &[&str]) -> Result<Value, String> {
    let mut all = args.to_vec();
    all.push("--json");
    let run = node.sim.run(&all);
    serde_json::from_str(&run.stdout).map_err(|e| {
        format!(
            "node{}: gpuctl {all:?} (exit {}) gave no JSON ({e}): {}{}",
            node.number, run.code, run.stdout, run.stderr
        )
    })
}

/// The value of every series, keyed by `labels`' values joined with " / ".
fn by_labels(samples: &[Sample], labels: &[&str]) -> BTreeMap<String, f64> {
    samples
        .iter()
        .map(|s| {
            let key: Vec<&str> = labels.iter().map(|l| s.label(l)).collect();
            (key.join(" / "), s.value)
        })
        .collect()
}

/// Polls `promql` until its series, keyed by `labels`, equal `want`.
fn expect_series(
    fleet: &mut Fleet,
    promql: &str,
    labels: &[&str],
    want: &BTreeMap<String, f64>,
) -> Result<(), String> {
    let port = fleet.port;
    fleet.poll(&format!("{promql} = {want:?}"), |_| {
        let got = by_labels(&api::query(port, promql)?, labels);
        if &got == want {
            Ok(Some(()))
        } else {
            Err(format!("got {got:?}"))
        }
    })
}

/// Every node with NVML has series of `family`: Err at once (not after the whole wait) when
/// the watchdog does not write it, naming it.
fn expect_family(fleet: &mut Fleet, family: &str) -> Result<(), String> {
    let port = fleet.port;
    let promql = format!(
        "count by (instance) ({family}{{{}}})",
        fleet.gpu_instances()
    );
    fleet
        .poll_for(fleet::PRESENT, &format!("{family} on every node"), |_| {
            let found = api::query(port, &promql)?;
            match found.len() == fleet::GPU_NODES {
                true => Ok(Some(())),
                false => Err(format!(
                    "series from {} of {} nodes",
                    found.len(),
                    fleet::GPU_NODES
                )),
            }
        })
        .map_err(|e| {
            format!(
                "the watchdog's textfile has no {family} (a family of the metrics contract): {}",
                e.lines().next().unwrap_or("")
            )
        })
}

/// Every node's target is up and its textfile read without error, and the families that
/// exist today carry the node's figures: NVML up (down on node 4), each GPU's used memory as
/// `info` reads it.
pub fn every_node_is_scraped(fleet: &mut Fleet) -> Result<(), String> {
    let mut up = BTreeMap::new();
    let mut scrape_errors = BTreeMap::new();
    let mut nvml_up = BTreeMap::new();
    let mut used = BTreeMap::new();
    for node in &fleet.nodes {
        let instance = node.instance();
        up.insert(instance.clone(), 1.0);
        scrape_errors.insert(instance.clone(), 0.0);
        nvml_up.insert(instance.clone(), f64::from(u8::from(node.has_nvml())));
        if !node.has_nvml() {
            continue;
        }
        for device in info(node, &["info"])?["devices"]
            .as_array()
            .cloned()
            .unwrap_or_default()
        {
            // A lost GPU has no memory figures (and no sample).
            if device["memory"].is_null() {
                continue;
            }
            let bytes = device["memory"]["used_bytes"]
                .as_f64()
                .ok_or_else(|| format!("node{}: no used_bytes in {device}", node.number))?;
            used.insert(format!("{instance} / {}", device["index"]), bytes);
        }
    }
    expect_series(fleet, r#"up{job="node"}"#, &["instance"], &up)?;
    expect_series(
        fleet,
        "node_textfile_scrape_error",
        &["instance"],
        &scrape_errors,
    )?;
    expect_series(fleet, "gpuctl_nvml_up", &["instance"], &nvml_up)?;
    expect_series(
        fleet,
        "gpuctl_gpu_memory_used_bytes",
        &["instance", "gpu"],
        &used,
    )
}

/// promtool's linter finds nothing in any node's textfile (as the watchdog writes it now).
pub fn promtool_check_metrics(fleet: &mut Fleet) -> Result<(), String> {
    let mut problems = Vec::new();
    for node in &fleet.nodes {
        let file = node.metrics_file();
        let out = fleet::run_with_input("promtool", &["check", "metrics"], &file)?;
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if !out.status.success() || !said.trim().is_empty() {
            problems.push(format!(
                "node{} ({}): promtool check metrics {}:\n{said}\n--- the file:\n{}",
                node.number,
                file.display(),
                out.status,
                crate::util::tail(&file, 40)
            ));
        }
    }
    match problems.is_empty() {
        true => Ok(()),
        false => Err(problems.join("\n")),
    }
}

/// The user label gpuctl's metrics give a total's `user` (a name, else the uid as a number).
fn user_label(total_user: &str) -> String {
    match total_user.parse::<u32>() {
        Ok(uid) => format!("uid {uid}"),
        Err(_) => total_user.to_string(),
    }
}

/// Summed over the fleet, each user's GPU memory in Prometheus is what `gpuctl info --by
/// user` totals on the nodes.
pub fn user_memory_sums_to_info_totals(fleet: &mut Fleet) -> Result<(), String> {
    let mut want: BTreeMap<String, f64> = BTreeMap::new();
    for node in fleet.gpu_nodes() {
        for total in info(node, &["info", "--by", "user"])?["totals"]
            .as_array()
            .cloned()
            .unwrap_or_default()
        {
            let user = total["user"]
                .as_str()
                .ok_or_else(|| format!("no user in {total}"))?;
            let bytes = total["used_bytes"]
                .as_f64()
                .ok_or_else(|| format!("no used_bytes in {total}"))?;
            *want.entry(user_label(user)).or_default() += bytes;
        }
    }
    // The fleet has root, nobody and a user with no name, each somewhere.
    for user in ["root", "nobody", &format!("uid {NAMELESS_UID}")] {
        if !want.contains_key(user) {
            return Err(format!("gpuctl info's totals lack {user:?}: {want:?}"));
        }
    }
    expect_family(fleet, "gpuctl_user_memory_bytes")?;
    expect_series(
        fleet,
        "sum by (user) (gpuctl_user_memory_bytes)",
        &["user"],
        &want,
    )
}

/// A process that names its Slurm job only in its environment is owned by
/// `slurm:JOB@UID`, on its node, with its memory.
pub fn slurm_owners(fleet: &mut Fleet) -> Result<(), String> {
    let want: BTreeMap<String, f64> = [
        (
            format!("{} / slurm:812@{NOBODY}", fleet.nodes[0].instance()),
            (6 * crate::util::GIB) as f64,
        ),
        (
            format!("{} / slurm:913@{NAMELESS_UID}", fleet.nodes[2].instance()),
            (7 * crate::util::GIB) as f64,
        ),
    ]
    .into_iter()
    .collect();
    expect_family(fleet, "gpuctl_owner_memory_bytes")?;
    expect_series(
        fleet,
        r#"gpuctl_owner_memory_bytes{owner_kind="slurm"}"#,
        &["instance", "owner"],
        &want,
    )
}

/// Node 2's leak is its GPU 0's unattributed memory, under node 2's instance; every GPU's
/// figure is the one `info` gives.
pub fn leak_is_unattributed_on_its_node(fleet: &mut Fleet) -> Result<(), String> {
    let mut want = BTreeMap::new();
    for node in fleet.gpu_nodes() {
        for device in info(node, &["info"])?["devices"]
            .as_array()
            .cloned()
            .unwrap_or_default()
        {
            // The sample is omitted where the figure is unknown (null).
            if let Some(bytes) = device["memory"]["unattributed_bytes"].as_f64() {
                want.insert(format!("{} / {}", node.instance(), device["index"]), bytes);
            }
        }
    }
    let leaked = format!("{} / 0", fleet.nodes[1].instance());
    if want.get(&leaked) != Some(&(LEAK as f64)) {
        return Err(format!(
            "gpuctl info does not show node 2's leak of {LEAK} bytes on GPU 0: {want:?}"
        ));
    }
    expect_family(fleet, "gpuctl_gpu_unattributed_bytes")?;
    expect_series(
        fleet,
        "gpuctl_gpu_unattributed_bytes",
        &["instance", "gpu"],
        &want,
    )
}

/// Every node has a `gpuctl_findings` series for every kind (0 when none), node 2's leak
/// counts as an unattributed finding, and each node gives the loop interval in force.
pub fn findings_and_interval(fleet: &mut Fleet) -> Result<(), String> {
    expect_family(fleet, "gpuctl_findings")?;
    expect_family(fleet, "gpuctl_watchdog_interval_seconds")?;
    let mut kinds = BTreeMap::new();
    let mut interval = BTreeMap::new();
    for node in fleet.gpu_nodes() {
        for kind in counted_finding_kinds() {
            kinds.insert(format!("{} / {kind}", node.instance()), 1.0);
        }
        interval.insert(node.instance(), 0.25);
    }
    let nodes = fleet.gpu_instances();
    expect_series(
        fleet,
        &format!("gpuctl_findings{{{nodes}}} >= bool 0"),
        &["instance", "kind"],
        &kinds,
    )?;
    let unattributed: BTreeMap<String, f64> =
        [(fleet.nodes[1].instance(), 1.0)].into_iter().collect();
    expect_series(
        fleet,
        r#"clamp_max(gpuctl_findings{kind="unattributed"} > 0, 1)"#,
        &["instance"],
        &unattributed,
    )?;
    expect_series(
        fleet,
        &format!("gpuctl_watchdog_interval_seconds{{{nodes}}}"),
        &["instance"],
        &interval,
    )
}

/// Every `expr` of the dashboard's panels (rows' panels included), with Grafana's variables
/// given values as Grafana would (`$instance`: all; intervals: 1m).
pub fn dashboard_exprs(fleet: &mut Fleet) -> Result<(), String> {
    let path = fleet::repo().join(DASHBOARD);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        format!(
            "{DASHBOARD} cannot be read ({e}): the dashboard must be in the repository for \
             this test"
        )
    })?;
    let dashboard: Value =
        serde_json::from_str(&text).map_err(|e| format!("{DASHBOARD} is not JSON: {e}"))?;
    let mut exprs = Vec::new();
    collect_exprs(&dashboard["panels"], &mut exprs);
    if exprs.is_empty() {
        return Err(format!("{DASHBOARD} has no panel with an expr"));
    }
    let variables: Vec<String> = dashboard["templating"]["list"]
        .as_array()
        .map(|list| {
            list.iter()
                .filter_map(|v| v["name"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let queries: Vec<(String, String)> = exprs
        .into_iter()
        .map(|(title, expr)| {
            let promql = substitute(&expr, &variables);
            (format!("{title:?}: {expr}"), promql)
        })
        .collect();
    let port = fleet.port;
    // Rates need two scrapes of a series and recording rules an evaluation: poll until every
    // expr answers, then name those that never did.
    fleet.poll("every dashboard expr returns series", |_| {
        let failing: Vec<String> = queries
            .iter()
            .filter_map(|(what, promql)| match api::query(port, promql) {
                Ok(samples) if !samples.is_empty() => None,
                Ok(_) => Some(format!("{what}\n    ({promql}): no series")),
                Err(e) => Some(format!("{what}\n    ({promql}): {e}")),
            })
            .collect();
        match failing.is_empty() {
            true => Ok(Some(())),
            false => Err(format!(
                "{} of {} exprs:\n  {}",
                failing.len(),
                queries.len(),
                failing.join("\n  ")
            )),
        }
    })
}

/// (panel title, expr) of every target of `panels`, and of the panels of rows within.
fn collect_exprs(panels: &Value, out: &mut Vec<(String, String)>) {
    for panel in panels.as_array().into_iter().flatten() {
        let title = panel["title"].as_str().unwrap_or("(untitled)");
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str().filter(|e| !e.trim().is_empty()) {
                out.push((title.to_string(), expr.to_string()));
            }
        }
        collect_exprs(&panel["panels"], out);
    }
}

/// `expr` with Grafana's interval variables as 1m and the dashboard's own variables
/// (`$instance`, ...) as `.*`, in each of Grafana's spellings ($x, ${x}, ${x:fmt}, [[x]]).
fn substitute(expr: &str, variables: &[String]) -> String {
    let mut out = expr.to_string();
    let intervals = ["__rate_interval", "__interval", "__range"];
    let mut names: Vec<(&str, &str)> = intervals.iter().map(|n| (*n, "1m")).collect();
    names.extend(variables.iter().map(|v| (v.as_str(), ".*")));
    names.push(("instance", ".*"));
    // Longest first, so `$__interval` is not eaten by a variable `__int`.
    names.sort_by_key(|(n, _)| std::cmp::Reverse(n.len()));
    for (name, value) in names {
        out = out.replace(&format!("[[{name}]]"), value);
        while let Some(start) = out.find(&format!("${{{name}")) {
            let Some(len) = out[start..].find('}') else {
                break;
            };
            out.replace_range(start..start + len + 1, value);
        }
        out = replace_word(&out, &format!("${name}"), value);
    }
    out
}

/// `text` with every `needle` not followed by a name character replaced by `value`.
fn replace_word(text: &str, needle: &str, value: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(needle) {
        let after = &rest[at + needle.len()..];
        out.push_str(&rest[..at]);
        if after.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
            out.push_str(needle);
        } else {
            out.push_str(value);
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// The groups of a rules file, each with its rules' names (`alert:` or `record:`), in order.
/// Read by line, as rules files are written (one `- name:`, `- alert:`, `- record:` a line):
/// enough to name what Prometheus must have loaded, without a YAML parser.
fn rule_names(text: &str) -> Vec<(String, Vec<String>)> {
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for line in text.lines() {
        let Some(item) = line.trim_start().strip_prefix("- ") else {
            continue;
        };
        let value = |key: &str| {
            item.strip_prefix(key).map(|v| {
                let v = v.split(" #").next().unwrap_or(v).trim();
                v.trim_matches(|c| c == '"' || c == '\'').to_string()
            })
        };
        if let Some(name) = value("name:") {
            groups.push((name, Vec::new()));
        } else if let (Some(rule), Some((_, rules))) = (
            value("alert:").or_else(|| value("record:")),
            groups.last_mut(),
        ) {
            rules.push(rule);
        }
    }
    groups
}

/// A rule as /api/v1/rules gives it: name, health, last error.
type LoadedRule = (String, String, String);

/// Prometheus loaded every group and rule of the rules file, and each has been evaluated
/// without error (health "ok").
pub fn rules_load_and_evaluate(fleet: &mut Fleet) -> Result<(), String> {
    let path = fleet::repo().join(RULES);
    if !fleet.rules {
        return Err(format!(
            "{RULES} is missing: the alert rules must be in the repository (Prometheus loads \
             them from there) for this test"
        ));
    }
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{RULES}: {e}"))?;
    let want = rule_names(&text);
    if want.is_empty() || want.iter().any(|(_, rules)| rules.is_empty()) {
        return Err(format!(
            "{RULES}: no groups, or a group with no rules: {want:?}"
        ));
    }
    let port = fleet.port;
    fleet.poll("every rule loaded and evaluated, health ok", |_| {
        let data = api::api(port, "/api/v1/rules")?;
        let loaded: Vec<(String, Vec<LoadedRule>)> = data["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|g| {
                let rules = g["rules"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|r| {
                        let s = |k: &str| r[k].as_str().unwrap_or("").to_string();
                        (s("name"), s("health"), s("lastError"))
                    })
                    .collect();
                (g["name"].as_str().unwrap_or("").to_string(), rules)
            })
            .collect();
        let names: Vec<(String, Vec<String>)> = loaded
            .iter()
            .map(|(g, rules)| (g.clone(), rules.iter().map(|r| r.0.clone()).collect()))
            .collect();
        if names != want {
            return Err(format!(
                "Prometheus has the groups {names:?}, the file {want:?}"
            ));
        }
        let unhealthy: Vec<String> = loaded
            .iter()
            .flat_map(|(g, rules)| rules.iter().map(move |r| (g, r)))
            .filter(|(_, (_, health, _))| health != "ok")
            .map(|(g, (name, health, error))| format!("{g}/{name}: {health} {error}"))
            .collect();
        match unhealthy.is_empty() {
            true => Ok(Some(())),
            false => Err(format!("not (yet) ok: {}", unhealthy.join("; "))),
        }
    })
}

/// The pure helpers, on fixed input.
pub fn self_test() {
    let vars = vec!["instance".to_string(), "gpu".to_string()];
    assert_eq!(
        substitute(
            r#"rate(x{instance=~"$instance",gpu=~"${gpu:regex}"}[$__rate_interval]) / $__interval_ms"#,
            &vars
        ),
        r#"rate(x{instance=~".*",gpu=~".*"}[1m]) / $__interval_ms"#
    );
    let rules = "groups:\n  - name: gpuctl.rules\n    interval: 30s\n    rules:\n      - record: a:b\n        expr: x\n      - alert: \"GpuctlDown\" # why\n        labels:\n          severity: page\n  - name: two\n    rules:\n    - alert: B\n";
    assert_eq!(
        rule_names(rules),
        vec![
            (
                "gpuctl.rules".to_string(),
                vec!["a:b".to_string(), "GpuctlDown".into()]
            ),
            ("two".to_string(), vec!["B".to_string()]),
        ]
    );
}

/// The health families: every node's GPUs have a verdict (node 3's lost GPU needs a node
/// reboot, the rest nothing), node 2's application Xid is counted, and remapped rows and
/// ECC counts are there for every GPU that answers.
pub fn health_series(fleet: &mut Fleet) -> Result<(), String> {
    for family in [
        "gpuctl_gpu_health_action",
        "gpuctl_gpu_remapped_rows",
        "gpuctl_gpu_ecc_errors",
    ] {
        expect_family(fleet, family)?;
    }
    let nodes = fleet.gpu_instances();
    let reboot: BTreeMap<String, f64> = [(format!("{} / 2", fleet.nodes[2].instance()), 1.0)]
        .into_iter()
        .collect();
    expect_series(
        fleet,
        &format!("gpuctl_gpu_health_action{{{nodes},action!=\"none\"}} == 1"),
        &["instance", "gpu"],
        &reboot,
    )?;
    let xids: BTreeMap<String, f64> = [(format!("{} / 1 / 94", fleet.nodes[1].instance()), 1.0)]
        .into_iter()
        .collect();
    expect_series(
        fleet,
        &format!("gpuctl_xid_errors_total{{{nodes}}}"),
        &["instance", "gpu", "xid"],
        &xids,
    )
}
