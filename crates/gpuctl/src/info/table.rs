//! `gpuctl info`'s readable view: a header, per GPU its figures, MIG instances, processes
//! and device-file holders; or the totals of `--by`; then the watchdog's findings.

use std::time::{Duration, SystemTime};

use gpuctl_core::Snapshot;
use gpuctl_core::report::WatchdogFindings;
use gpuctl_core::snapshot::totals::{By, totals};
use gpuctl_core::snapshot::{GpuSnapshot, GpuStatus, Holder, MigDevice};
use gpuctl_core::units;

use super::processes::{HostCells, host_cells, process_table};
use crate::render::{self, Color, Style};

/// The readable view: per GPU, or the totals of `--by`; then the watchdog's findings.
/// `unscanned_above`: no device-file scan ran, and a GPU with at least this much memory no
/// listed process accounts for says how to look for who holds it.
pub fn view(
    snapshot: &Snapshot,
    by: Option<By>,
    watchdog: Option<&WatchdogFindings>,
    unscanned_above: Option<u64>,
    style: &Style,
) -> String {
    let mut out = match by {
        None => table(snapshot, unscanned_above, style),
        Some(by) => totals_table(snapshot, by, style),
    };
    if let Some(watchdog) = watchdog {
        watchdog_lines(&mut out, watchdog, style);
    }
    out
}

/// How long ago the watchdog wrote its findings, where that is too long ago for a running
/// one: it rewrites them at least every minute, so older than two minutes (or three loops)
/// is stale.
pub(super) fn stale_for(watchdog: &WatchdogFindings) -> Option<Duration> {
    let written =
        Duration::from_secs((units::unix_seconds() - watchdog.written_unix).max(0.0) as u64);
    (written > Duration::from_secs(120).max(Duration::from_secs_f64(3.0 * watchdog.interval_s)))
        .then_some(written)
}

/// One line per finding the watchdog holds, with since when; and how old the file is, so a
/// stopped watchdog is not taken for a quiet one.
fn watchdog_lines(out: &mut String, watchdog: &WatchdogFindings, style: &Style) {
    let now = units::unix_seconds();
    let age = |at: f64| Duration::from_secs((now - at).max(0.0) as u64);
    let stale = stale_for(watchdog);
    let title = if let Some(written) = stale {
        format!(
            "watchdog: findings last written {} ago: is gpuctl-watchdog running?",
            humantime::format_duration(written)
        )
    } else if watchdog.findings.is_empty() {
        "watchdog: nothing found".to_string()
    } else {
        "watchdog:".to_string()
    };
    out.push('\n');
    let color = if stale.is_some() {
        Color::Yellow
    } else {
        Color::Bold
    };
    out.push_str(&style.paint(color, &title));
    out.push('\n');
    for finding in &watchdog.findings {
        let gpus = units::gpu_list(&finding.gpus);
        let what = match finding.pid {
            Some(pid) => format!("pid {pid} on GPU {gpus}"),
            None => format!("GPU {gpus}"),
        };
        let since = humantime::format_rfc3339_seconds(
            SystemTime::UNIX_EPOCH + Duration::from_secs_f64(finding.since_unix.max(0.0)),
        );
        let line = format!(
            "  {what}: {} since {since} ({}): {}",
            finding.kind,
            humantime::format_duration(age(finding.since_unix)),
            render::safe(&finding.reason)
        );
        let line = match style.width {
            Some(width) => render::cut(&line, width.saturating_sub(1), style.unicode),
            None => line,
        };
        out.push_str(&line);
        out.push('\n');
    }
}

/// The header line every view starts with: driver, CUDA, GPU count, time.
fn header(snapshot: &Snapshot, style: &Style) -> String {
    let header = [
        Some(format!(
            "driver {}",
            snapshot.driver_version.as_deref().unwrap_or("?")
        )),
        snapshot
            .cuda_driver_version
            .as_ref()
            .map(|v| format!("CUDA {v}")),
        Some(match snapshot.devices.len() {
            1 => "1 GPU".to_string(),
            n => format!("{n} GPUs"),
        }),
        Some(humantime::format_rfc3339_seconds(SystemTime::now()).to_string()),
    ];
    let dot = if style.unicode { " · " } else { " | " };
    let mut out = style.paint(
        Color::Bold,
        &header.into_iter().flatten().collect::<Vec<_>>().join(dot),
    );
    out.push('\n');
    out
}

/// One row per user or owner: memory, GPUs, processes; then the memory no process accounts
/// for, which has no user.
fn totals_table(snapshot: &Snapshot, by: By, style: &Style) -> String {
    let mut out = header(snapshot, style);
    out.push('\n');
    let mut rows: Vec<[String; 4]> = totals(snapshot, by)
        .into_iter()
        .map(|t| {
            [
                render::safe(&t.name).into_owned(),
                units::bytes(t.used_bytes),
                units::gpu_list(&t.gpus),
                t.processes.to_string(),
            ]
        })
        .collect();
    let unattributed: Vec<(u32, u64)> = snapshot
        .devices
        .iter()
        .filter_map(|g| Some((g.index, g.memory?.unattributed_bytes?)))
        .filter(|&(_, bytes)| bytes >= 1024 * 1024)
        .collect();
    let dim_from = rows.len();
    if !unattributed.is_empty() {
        let gpus: Vec<u32> = unattributed.iter().map(|&(i, _)| i).collect();
        let bytes = unattributed.iter().map(|&(_, b)| b).sum();
        rows.push([
            "(unattributed)".into(),
            units::bytes(bytes),
            units::gpu_list(&gpus),
            "-".into(),
        ]);
    }
    let header_cells = [
        by.key().to_ascii_uppercase(),
        "MEMORY".into(),
        "GPUS".into(),
        "PROCESSES".into(),
    ];
    let widths = render::column_widths(&header_cells, &rows, 4);
    let name_width = match style.width {
        Some(width) => widths[0].min(
            width
                .saturating_sub(widths[1] + widths[2] + widths[3] + 8)
                .max(12),
        ),
        None => widths[0],
    };
    let line = |cells: &[String; 4]| {
        format!(
            "  {}  {}  {}  {}",
            render::pad(
                &render::cut(&cells[0], name_width, style.unicode),
                name_width
            ),
            render::pad_left(&cells[1], widths[1]),
            render::pad(&cells[2], widths[2]),
            render::pad_left(&cells[3], widths[3]),
        )
    };
    out.push_str(&style.paint(Color::Dim, line(&header_cells).trim_end()));
    out.push('\n');
    if rows.is_empty() {
        out.push_str(&format!("  {}\n", style.paint(Color::Dim, "no processes")));
    }
    for (i, row) in rows.iter().enumerate() {
        let text = line(row);
        if i >= dim_from {
            out.push_str(&style.paint(Color::Dim, text.trim_end()));
        } else {
            out.push_str(text.trim_end());
        }
        out.push('\n');
    }
    out
}

/// The readable view: a header, then per GPU its figures and its processes.
pub fn table(snapshot: &Snapshot, unscanned_above: Option<u64>, style: &Style) -> String {
    let mut out = header(snapshot, style);
    let dot = if style.unicode { " · " } else { " | " };
    if !snapshot.host_pid_namespace {
        let note = match &snapshot.host_service {
            Some(service) if service.answered => format!(
                "note: gpuctl runs in a non-host PID namespace; this namespace's processes are \
                 confirmed by the host service ({}), others' memory is one number per GPU",
                render::safe(&service.socket.display().to_string())
            ),
            _ => "note: gpuctl runs in a non-host PID namespace; processes are shown unconfirmed"
                .to_string(),
        };
        out.push_str(&style.paint(Color::Yellow, &note));
        out.push('\n');
    }
    if let Some(error) = snapshot
        .pod_runtime
        .as_ref()
        .and_then(|r| r.error.as_deref())
    {
        let note = format!("note: pods are shown by UID: {}", render::safe(error));
        out.push_str(&style.paint(Color::Yellow, &note));
        out.push('\n');
    }
    for gpu in &snapshot.devices {
        out.push('\n');
        gpu_block(&mut out, gpu, unscanned_above, style, dot);
    }
    out
}

fn gpu_block(
    out: &mut String,
    gpu: &GpuSnapshot,
    unscanned_above: Option<u64>,
    style: &Style,
    dot: &str,
) {
    gpu_title(out, gpu, style, dot);
    if matches!(gpu.status, GpuStatus::Lost | GpuStatus::NotAnswering) {
        return;
    }
    for line in pack(&gpu_figures(gpu, style), style.width) {
        out.push_str(&format!("  {line}\n"));
    }

    if !gpu.mig_devices.is_empty() {
        // A MIG GPU: each instance with its memory and its processes.
        for mig in &gpu.mig_devices {
            mig_block(out, mig, &gpu.leases, style, dot);
        }
    } else {
        let unattributed = gpu
            .memory
            .and_then(|m| m.unattributed_bytes)
            .filter(|&bytes| bytes >= 1024 * 1024);
        if gpu.processes.is_empty() && unattributed.is_none() {
            out.push_str(&format!("  {}\n", style.paint(Color::Dim, "no processes")));
        } else {
            process_table(out, &gpu.processes, unattributed, style);
        }
    }
    if let Some(holders) = &gpu.holders {
        holder_lines(out, gpu, holders, style);
    } else if let Some(threshold) = unscanned_above {
        unscanned_line(out, gpu, threshold, style);
    }
}

/// The GPU's title line: index, name, bus id, UUID and the leases on the whole GPU, then
/// its status where it is not answering and its health where it needs something.
fn gpu_title(out: &mut String, gpu: &GpuSnapshot, style: &Style, dot: &str) {
    let mut title = vec![format!("GPU {}", gpu.index)];
    title.extend(gpu.name.clone());
    title.extend(gpu.pci_bus_id.clone());
    title.extend(gpu.uuid.clone());
    title.extend(
        gpu.leases
            .iter()
            .filter(|lease| lease.gpu_instance.is_none())
            .map(|lease| lease.describe()),
    );
    // Wrapped, never cut: the UUID is copied from here into --gpu and CUDA_VISIBLE_DEVICES.
    let title = wrap_title(&title, dot, style.width);
    out.push_str(&style.paint(Color::Bold, &title));
    match gpu.status {
        GpuStatus::Ok => {}
        GpuStatus::Lost | GpuStatus::Error | GpuStatus::NotAnswering => {
            let label = match gpu.status {
                GpuStatus::Lost => "LOST",
                GpuStatus::NotAnswering => "NOT ANSWERING",
                _ => "ERROR",
            };
            let message = gpu.error.as_deref().unwrap_or("");
            out.push_str(&format!(
                "  {}",
                style.paint(Color::Red, &format!("{label}: {message}"))
            ));
        }
    }
    // What `gpuctl health` says, where the GPU needs something.
    if let Some(summary) = gpu.health.as_ref().and_then(|v| v.summary()) {
        let summary = gpuctl_core::text::escape(&summary);
        out.push_str(&format!(
            "  {}",
            style.paint(Color::Red, &format!("HEALTH: {summary}"))
        ));
    }
    out.push('\n');
}

/// The GPU's figures as far as they were read: memory bar, peak, utilization, temperature,
/// power, persistence, compute mode, memory held from outside this PID namespace.
fn gpu_figures(gpu: &GpuSnapshot, style: &Style) -> Vec<String> {
    let mut figures = Vec::new();
    if let Some(memory) = gpu.memory {
        let fraction = memory.used_bytes as f64 / memory.total_bytes.max(1) as f64;
        figures.push(format!(
            "mem {} {} / {} {:>3.0}%",
            style.paint(render::load_color(fraction), &style.bar(fraction, 24)),
            units::bytes(memory.used_bytes),
            units::bytes(memory.total_bytes),
            fraction * 100.0
        ));
    }
    if let Some(peak) = gpu.peak {
        figures.push(format!("peak {}", units::bytes(peak.used_bytes)));
    }
    if let Some(util) = gpu.utilization {
        figures.push(format!("util {:>3}%", util.gpu_pct));
    }
    if let Some(temp) = gpu.temperature_c {
        figures.push(format!("{temp}{}C", if style.unicode { "°" } else { " " }));
    }
    match (gpu.power_mw, gpu.power_limit_mw) {
        (Some(power), Some(limit)) => {
            figures.push(format!("{} / {} W", power / 1000, limit / 1000))
        }
        (Some(power), None) => figures.push(format!("{} W", power / 1000)),
        _ => {}
    }
    if let Some(persistence) = gpu.persistence_mode {
        figures.push(format!(
            "persistence {}",
            if persistence { "on" } else { "off" }
        ));
    }
    if let Some(mode) = gpu.compute_mode {
        figures.push(format!("compute {mode}"));
    }
    if let Some(outside) = gpu.outside_namespace_bytes {
        figures.push(format!("outside this namespace {}", units::bytes(outside)));
    }
    figures
}

/// Where memory no listed process accounts for is worth explaining (at least `threshold`)
/// and no scan looked for who holds the device file: says so, and how to look, rather
/// than nothing (which would read as "no holder").
fn unscanned_line(out: &mut String, gpu: &GpuSnapshot, threshold: u64, style: &Style) {
    let worth = gpu
        .memory
        .and_then(|m| m.unattributed_bytes)
        .is_some_and(|bytes| bytes >= threshold);
    if !worth {
        return;
    }
    let said = format!(
        "holders of {} not looked for (gpuctl info --holders looks: it reads every process's \
         open files)",
        device_file(gpu)
    );
    out.push_str(&format!("  {}\n", style.paint(Color::Dim, &said)));
}

/// The GPU's device file as the driver names it, wherever GPUCTL_DEV_DIR points.
fn device_file(gpu: &GpuSnapshot) -> String {
    gpu.minor.map_or_else(
        || "its device file".to_string(),
        |m| format!("/dev/nvidia{m}"),
    )
}

/// One MIG device: profile, instance ids, UUID, memory, then its processes.
fn mig_block(
    out: &mut String,
    mig: &MigDevice,
    leases: &[gpuctl_core::lease::Leased],
    style: &Style,
    dot: &str,
) {
    let mut title = vec![format!(
        "MIG {}",
        mig.profile.as_deref().map_or("?".into(), render::safe)
    )];
    title.extend(mig.gpu_instance_id.map(|id| format!("GI {id}")));
    title.extend(mig.compute_instance_id.map(|id| format!("CI {id}")));
    title.extend(mig.uuid.clone());
    title.extend(
        leases
            .iter()
            .filter(|lease| {
                lease.gpu_instance.is_some() && lease.gpu_instance == mig.gpu_instance_id
            })
            .map(|lease| lease.describe()),
    );
    let mut line = format!("  {}", title.join(dot));
    if let Some(memory) = mig.memory {
        let fraction = memory.used_bytes as f64 / memory.total_bytes.max(1) as f64;
        line.push_str(&format!(
            "   mem {} {} / {} {:>3.0}%",
            style.paint(render::load_color(fraction), &style.bar(fraction, 12)),
            units::bytes(memory.used_bytes),
            units::bytes(memory.total_bytes),
            fraction * 100.0
        ));
    }
    out.push_str(&line);
    out.push('\n');
    let unattributed = mig
        .memory
        .and_then(|m| m.unattributed_bytes)
        .filter(|&bytes| bytes >= 1024 * 1024);
    if mig.processes.is_empty() && unattributed.is_none() {
        out.push_str(&format!(
            "    {}\n",
            style.paint(Color::Dim, "no processes")
        ));
    } else {
        let mut table = String::new();
        process_table(&mut table, &mig.processes, unattributed, style);
        for row in table.lines() {
            out.push_str("  ");
            out.push_str(row);
            out.push('\n');
        }
    }
}

/// The processes holding the GPU's device file that NVML does not list, each with what it
/// is suspected to be and why.
fn holder_lines(out: &mut String, gpu: &GpuSnapshot, holders: &[Holder], style: &Style) {
    let file = device_file(gpu);
    if holders.is_empty() {
        // Said only where there is memory to explain.
        let unattributed = gpu
            .memory
            .and_then(|m| m.unattributed_bytes)
            .is_some_and(|bytes| bytes >= 1024 * 1024);
        if !unattributed {
            return;
        }
        // No holder because none was looked for is not "none".
        let said = match &gpu.holders_not_scanned {
            Some(why) => format!("holders of {file} not looked for: {}", render::safe(why)),
            None => format!("holders of {file} that NVML does not list: none"),
        };
        out.push_str(&format!("  {}\n", style.paint(Color::Dim, &said)));
        return;
    }
    // Tools and processes NVML lists on other GPUs are explained in one line; the rest,
    // where the memory may be, one by one.
    let (innocent, suspected): (Vec<&Holder>, Vec<&Holder>) = holders
        .iter()
        .partition(|h| matches!(h.suspect, Some("tool" | "listed_elsewhere")));
    if !suspected.is_empty() {
        out.push_str(&format!(
            "  {}\n",
            style.paint(Color::Bold, &format!("holding {file}, not listed by NVML:"))
        ));
    }
    for holder in suspected {
        suspect_lines(out, holder, style);
    }
    if !innocent.is_empty() {
        let also = format!("{file} is also open in {}", innocent_holders(&innocent));
        out.push_str(&format!("  {}\n", style.paint(Color::Dim, &also)));
    }
}

/// A suspected holder: its process's cells, then what it is suspected to be and why.
fn suspect_lines(out: &mut String, holder: &Holder, style: &Style) {
    let HostCells {
        user,
        state,
        owner,
        command,
        ..
    } = host_cells(&holder.host);
    let line = format!("    {}  {user}  {state}  {owner}  {command}", holder.pid);
    let line = match style.width {
        Some(width) => render::cut(&line, width.saturating_sub(1), style.unicode),
        None => line,
    };
    out.push_str(&line);
    out.push('\n');
    let why = format!(
        "      {}: {}",
        holder.suspect.unwrap_or("unknown"),
        render::safe(holder.reason.as_deref().unwrap_or(""))
    );
    out.push_str(&style.paint(Color::Dim, &why));
    out.push('\n');
}

/// The holders that explain themselves, in one phrase: how many processes NVML lists on
/// other GPUs, and the monitoring tools by name and pid.
fn innocent_holders(innocent: &[&Holder]) -> String {
    let tools: Vec<String> = innocent
        .iter()
        .filter(|h| h.suspect == Some("tool"))
        .map(|h| {
            let name = h
                .host
                .protection
                .as_ref()
                .map_or("tool", |claim| claim.name.as_str());
            format!("{} ({})", render::safe(name), h.pid)
        })
        .collect();
    let elsewhere = innocent.len() - tools.len();
    let mut parts = Vec::new();
    if elsewhere > 0 {
        parts.push(format!(
            "{elsewhere} process{} NVML lists on other GPUs",
            units::plural(elsewhere, "es")
        ));
    }
    if !tools.is_empty() {
        parts.push(format!("monitoring tools: {}", tools.join(", ")));
    }
    parts.join("; ")
}

/// The parts of a GPU's title joined by `dot`, a part that would pass `width` starting a new
/// line (indented two), each part whole.
fn wrap_title(parts: &[String], dot: &str, width: Option<usize>) -> String {
    let room = width.map_or(usize::MAX, |w| w.saturating_sub(1));
    let mut out = String::new();
    let mut used = 0;
    for (i, part) in parts.iter().enumerate() {
        let len = part.chars().count();
        if i == 0 {
            out.push_str(part);
            used = len;
        } else if used + dot.chars().count() + len <= room {
            out.push_str(dot);
            out.push_str(part);
            used += dot.chars().count() + len;
        } else {
            out.push_str("\n  ");
            out.push_str(part);
            used = 2 + len;
        }
    }
    out
}

/// Joins figures with three spaces, starting a new line where the next would pass `width`
/// (colors do not count: they take no columns).
fn pack(figures: &[String], width: Option<usize>) -> Vec<String> {
    let room = width.map_or(usize::MAX, |w| w.saturating_sub(3));
    let mut lines: Vec<(String, usize)> = Vec::new();
    for figure in figures {
        let len = visible_len(figure);
        match lines.last_mut() {
            Some((line, used)) if *used + 3 + len <= room => {
                line.push_str("   ");
                line.push_str(figure);
                *used += 3 + len;
            }
            _ => lines.push((figure.clone(), len)),
        }
    }
    lines.into_iter().map(|(line, _)| line).collect()
}

/// Characters a terminal shows: ANSI color sequences skipped.
fn visible_len(text: &str) -> usize {
    let mut len = 0;
    let mut in_escape = false;
    for c in text.chars() {
        match (in_escape, c) {
            (false, '\x1b') => in_escape = true,
            (true, 'm') => in_escape = false,
            (true, _) => {}
            (false, _) => len += 1,
        }
    }
    len
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_pack_into_the_width_ignoring_colors() {
        let figures: Vec<String> = ["\x1b[32maaaa\x1b[0m", "bbbb", "cccc"]
            .map(String::from)
            .to_vec();
        assert_eq!(
            pack(&figures, None),
            vec!["\x1b[32maaaa\x1b[0m   bbbb   cccc"]
        );
        // 4 + 3 + 4 = 11 columns fit in 14 - 3; the third figure starts a new line.
        assert_eq!(
            pack(&figures, Some(14)),
            vec!["\x1b[32maaaa\x1b[0m   bbbb", "cccc"]
        );
        assert_eq!(pack(&figures, Some(1)).len(), 3);
        assert_eq!(visible_len("\x1b[1mGPU\x1b[0m"), 3);
    }

    #[test]
    fn the_title_wraps_before_a_part_that_does_not_fit_and_cuts_none() {
        let parts = [
            "GPU 0",
            "NVIDIA H200",
            "00000000:18:00.0",
            "GPU-6a8295fa-c8f6-96e0-6154-3094e85e05b1",
        ]
        .map(String::from);
        let whole =
            "GPU 0 · NVIDIA H200 · 00000000:18:00.0 · GPU-6a8295fa-c8f6-96e0-6154-3094e85e05b1";
        assert_eq!(wrap_title(&parts, " · ", None), whole);
        assert_eq!(wrap_title(&parts, " · ", Some(100)), whole);
        assert_eq!(
            wrap_title(&parts, " · ", Some(80)),
            "GPU 0 · NVIDIA H200 · 00000000:18:00.0\n  GPU-6a8295fa-c8f6-96e0-6154-3094e85e05b1"
        );
        // Narrower than a part: the part is still whole, on its own line.
        let narrow = wrap_title(&parts, " · ", Some(20));
        assert!(narrow.contains("\n  GPU-6a8295fa-c8f6-96e0-6154-3094e85e05b1"));
    }
}
