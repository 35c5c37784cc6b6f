//! The fleet's tables and JSON documents.

use gpuctl_core::text::escape;
use gpuctl_core::units::bytes;
use serde::Serialize;

use super::model::{By, Holder, Node, Status};
use crate::render::{Style, pad, pad_left};

/// `fleet --json`'s document version.
pub const FLEET_SCHEMA: u32 = 1;

#[derive(Serialize)]
pub struct NodesDocument<'a> {
    pub schema: u32,
    pub prometheus: &'a str,
    /// Unix time of the query.
    pub timestamp: f64,
    pub nodes: &'a [Node],
}

#[derive(Serialize)]
pub struct HoldersDocument<'a> {
    pub schema: u32,
    pub prometheus: &'a str,
    pub timestamp: f64,
    pub by: &'static str,
    pub since_seconds: u64,
    pub rows: &'a [Holder],
}

/// Memory for a table cell: "-" for none.
fn cell(value: u64) -> String {
    if value == 0 { "-".into() } else { bytes(value) }
}

fn age(seconds: Option<f64>) -> String {
    match seconds {
        Some(s) if s.is_finite() => crate::render::age(s.max(0.0) as u64),
        _ => "?".into(),
    }
}

/// Who holds a node's findings memory: the largest owner, and how many more.
fn owners(node: &Node) -> String {
    let mut names: Vec<&str> = Vec::new();
    for o in &node.owners {
        if !names.contains(&o.owner.as_str()) {
            names.push(&o.owner);
        }
    }
    match names.as_slice() {
        [] => "-".into(),
        [one] => escape(one).into_owned(),
        [first, rest @ ..] => format!("{} +{}", escape(first), rest.len()),
    }
}

fn health(node: &Node) -> String {
    if node.health.is_empty() {
        return "-".into();
    }
    node.health
        .iter()
        .map(|g| format!("{}:{}", g.gpu, escape(&g.action)))
        .collect::<Vec<_>>()
        .join(",")
}

fn held(node: &Node, kinds: &[&str]) -> u64 {
    kinds.iter().filter_map(|k| node.held_bytes.get(*k)).sum()
}

/// One line per node, the nodes not reporting said so; a summary line.
pub fn nodes_table(nodes: &[Node], style: &Style) -> String {
    const HEADERS: [&str; 12] = [
        "NODE", "GPUS", "USED", "UNATTR", "ORPHANED", "ZOMBIE", "STUCK", "IDLE", "OTHER", "OWNERS",
        "HEALTH", "AGE",
    ];
    let silent = "(no data)".to_string();
    let rows: Vec<[String; 12]> = nodes
        .iter()
        .map(|n| {
            let known = n.status == Status::Reporting;
            let figure = |v: u64| if known { cell(v) } else { "?".into() };
            let gpus = match (known, n.gpus_down) {
                (false, _) => "?".into(),
                (true, 0) => n.gpus.to_string(),
                (true, down) => format!("{} ({down} down)", n.gpus),
            };
            [
                escape(&n.node).into_owned(),
                gpus,
                if known {
                    format!("{}/{}", cell(n.used_bytes), bytes(n.total_bytes))
                } else {
                    "?".into()
                },
                figure(n.unattributed_bytes),
                figure(held(n, &["orphaned"])),
                figure(held(n, &["zombie_holder"])),
                figure(held(n, &["stuck"])),
                figure(held(n, &["idle"])),
                figure(held(n, &["stopped", "uninterruptible", "above_fraction"])),
                if known { owners(n) } else { silent.clone() },
                if known {
                    health(n)
                } else {
                    n.status.words().to_string()
                },
                age(n.age_seconds),
            ]
        })
        .collect();
    let headers = HEADERS.map(String::from);
    let widths = crate::render::column_widths(&headers, &rows, 12);
    let line = |cells: &[String; 12]| {
        let mut out = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            let text = if (1..=8).contains(&i) {
                pad_left(c, *w)
            } else {
                pad(c, *w)
            };
            out.push_str(&text);
            out.push_str("  ");
        }
        format!("{}\n", out.trim_end())
    };
    let mut out = style.paint(crate::render::Color::Bold, line(&headers).trim_end());
    out.push('\n');
    for (row, node) in rows.iter().zip(nodes) {
        let text = line(row);
        if node.status.reporting() {
            out.push_str(&text);
        } else {
            out.push_str(&style.paint(crate::render::Color::Red, text.trim_end()));
            out.push('\n');
        }
    }
    out.push_str(&summary(nodes));
    out
}

fn summary(nodes: &[Node]) -> String {
    let silent = nodes.iter().filter(|n| !n.status.reporting()).count();
    let reclaimable: u64 = nodes.iter().map(|n| n.reclaimable_bytes).sum();
    let clearable: u64 = nodes.iter().map(|n| n.clearable_bytes).sum();
    let unhealthy: usize = nodes.iter().map(|n| n.health.len()).sum();
    format!(
        "{} node{}, {silent} not reporting; {} held by findings or unattributed, {} of it \
         cleared by `gpuctl clear`; {unhealthy} GPU{} needing an action\n",
        nodes.len(),
        gpuctl_core::units::plural(nodes.len(), "s"),
        bytes(reclaimable),
        bytes(clearable),
        gpuctl_core::units::plural(unhealthy, "s"),
    )
}

/// One line per user or owner.
pub fn holders_table(by: By, rows: &[Holder], since: &str, style: &Style) -> String {
    let headers = [
        by.label().to_uppercase(),
        "HELD".into(),
        "IDLE (5m)".into(),
        format!("GIB-H HELD ({since})"),
        format!("GIB-H IDLE ({since})"),
    ];
    let cells: Vec<[String; 5]> = rows
        .iter()
        .map(|r| {
            [
                escape(&r.name).into_owned(),
                cell(r.held_bytes),
                cell(r.idle_bytes),
                format!("{:.1}", r.held_gib_hours),
                format!("{:.1}", r.idle_gib_hours),
            ]
        })
        .collect();
    let widths = crate::render::column_widths(&headers, &cells, 5);
    let line = |cells: &[String; 5]| {
        let mut out = pad(&cells[0], widths[0]);
        for (c, w) in cells[1..].iter().zip(&widths[1..]) {
            out.push_str("  ");
            out.push_str(&pad_left(c, *w));
        }
        out.push('\n');
        out
    };
    let mut out = style.paint(crate::render::Color::Bold, line(&headers).trim_end());
    out.push('\n');
    for row in &cells {
        out.push_str(&line(row));
    }
    out
}
