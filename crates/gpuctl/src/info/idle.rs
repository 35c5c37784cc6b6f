//! `gpuctl info --idle`: the processes the watchdog's `[idle]` window finds idle, one row
//! each.

use std::time::{Duration, SystemTime};

use gpuctl_core::Snapshot;
use gpuctl_core::report::WatchdogFindings;
use gpuctl_core::snapshot::GpuProcess;
use gpuctl_core::units;

use super::processes::{host_cells, idle_for};
use crate::render::{self, Color, Style};

/// `info --idle`: the idle processes only, longest idle first, one row each. Idleness is
/// what the watchdog measured, so a missing or stale findings file is said: "none" from a
/// watchdog that is not running means nothing.
pub fn idle_view(
    snapshot: &Snapshot,
    watchdog: Option<&WatchdogFindings>,
    style: &Style,
) -> String {
    let idle = gpuctl_core::info::idle_processes(snapshot);
    let unknown = unknown_idleness(watchdog);
    if idle.is_empty() {
        return match unknown {
            Some(why) => format!("no idle processes known: {why}\n"),
            None => "no idle processes (as the watchdog's [idle] window finds them)\n".to_string(),
        };
    }
    let rows: Vec<[String; 9]> = idle
        .iter()
        .map(|(process, gpus)| idle_row(process, gpus))
        .collect();
    let mut out = idle_table(&rows, style);
    if let Some(why) = unknown {
        out.push_str(&style.paint(
            Color::Yellow,
            &format!("as the watchdog last saw them: {why}"),
        ));
        out.push('\n');
    }
    out
}

/// Why the watchdog's idleness may not be current: its findings are missing or stale.
fn unknown_idleness(watchdog: Option<&WatchdogFindings>) -> Option<String> {
    match watchdog {
        None => Some(
            "the watchdog's findings are not there: gpuctl-watchdog measures idleness \
             ([idle] in gpuctl.toml); is it running?"
                .to_string(),
        ),
        Some(findings) => super::table::stale_for(findings).map(|written| {
            format!(
                "the watchdog's findings were last written {} ago: is gpuctl-watchdog running?",
                humantime::format_duration(written)
            )
        }),
    }
}

/// An idle process's cells, in the order of `HEADERS`.
fn idle_row(process: &GpuProcess, gpus: &[u32]) -> [String; 9] {
    let facts = process
        .idle
        .unwrap_or_else(|| unreachable!("listed as idle"));
    let cells = host_cells(&process.host);
    [
        process.pid.to_string(),
        cells.user,
        units::gpu_list(gpus),
        units::bytes(facts.memory_bytes),
        idle_for(&facts),
        humantime::format_rfc3339_seconds(
            SystemTime::UNIX_EPOCH + Duration::from_secs(facts.idle_since),
        )
        .to_string(),
        format!("{}%", facts.measured_pct),
        facts.utilization.name().to_string(),
        format!("{}  {}", cells.owner, cells.command),
    ]
}

const HEADERS: [&str; 9] = [
    "PID",
    "USER",
    "GPU",
    "MEMORY",
    "IDLE",
    "SINCE",
    "MEASURED",
    "SM FROM",
    "OWNER  COMMAND",
];

/// The heading and `rows`, each column as wide as its widest cell (owner and command, last,
/// run on), every line cut to the terminal.
fn idle_table(rows: &[[String; 9]], style: &Style) -> String {
    let headers = HEADERS.map(str::to_string);
    let widths: Vec<usize> = (0..8)
        .map(|i| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .chain([headers[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: &[String; 9]| {
        let mut text = String::from(" ");
        for (i, cell) in cells.iter().enumerate() {
            text.push(' ');
            match i {
                8 => text.push_str(cell),
                0 | 3 | 4 | 6 => text.push_str(&render::pad_left(cell, widths[i])),
                _ => text.push_str(&render::pad(cell, widths[i])),
            }
            text.push(' ');
        }
        let text = text.trim_end().to_string();
        match style.width {
            Some(width) => render::cut(&text, width.saturating_sub(1), style.unicode),
            None => text,
        }
    };
    let mut out = style.paint(Color::Dim, &line(&headers));
    out.push('\n');
    for row in rows {
        out.push_str(&line(row));
        out.push('\n');
    }
    out
}
