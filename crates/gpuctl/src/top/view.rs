//! Drawing the model: header, one or two lines per GPU (and MIG instance), the process
//! table, a status line and the keys; panels (help, totals, holders, a kill's plan) over
//! the table. Everything a process chose arrives escaped from the model; nothing here
//! writes text of its own choosing that a process could have set.

use gpuctl_core::nvml::Place;
use gpuctl_core::snapshot::totals::{By, totals};
use gpuctl_core::snapshot::{GpuSnapshot, GpuStatus};
use gpuctl_core::units;
use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line as TextLine, Span};
use ratatui::widgets::{Block, Borders, Clear, Paragraph, Wrap};

use super::keys::{self, TableArea};
use super::model::{History, Line, Model, Panel, Row, finding_label};
use crate::render;

/// How the view decorates: colors (off with NO_COLOR or --color never), and Unicode bars.
#[derive(Debug, Clone, Copy)]
pub struct Palette {
    pub color: bool,
    pub unicode: bool,
}

impl Palette {
    fn fg(&self, color: Color) -> Style {
        if self.color {
            Style::default().fg(color)
        } else {
            Style::default()
        }
    }

    fn load(&self, fraction: f64) -> Style {
        self.fg(if fraction < 0.70 {
            Color::Green
        } else if fraction < 0.90 {
            Color::Yellow
        } else {
            Color::Red
        })
    }

    fn bar(&self, fraction: f64, cells: usize) -> String {
        render::bar(self.unicode, fraction, cells)
    }

    /// The last `cells` samples of `series` (0-100) as a sparkline.
    fn sparkline(&self, series: &std::collections::VecDeque<u64>, cells: usize) -> String {
        const BLOCKS: [&str; 8] = ["▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"];
        const ASCII: [&str; 8] = ["_", ".", ",", "-", "~", "=", "*", "#"];
        let steps = if self.unicode { BLOCKS } else { ASCII };
        let skip = series.len().saturating_sub(cells);
        let mut out: String = series
            .iter()
            .skip(skip)
            .map(|&v| steps[(v.min(100) as usize * 7).div_ceil(100)])
            .collect();
        // Newest on the right; until the history fills its cells it grows from the left.
        let shown = series.len() - skip;
        out.push_str(&" ".repeat(cells - shown));
        out
    }
}

pub struct Drawn {
    pub table: TableArea,
}

/// Puts `line` on row `y` of `area` and moves `y` down, while rows are left.
fn put(frame: &mut Frame, area: Rect, line: TextLine, y: &mut u16) {
    if *y < area.y + area.height {
        frame.render_widget(Paragraph::new(line), Rect::new(area.x, *y, area.width, 1));
        *y += 1;
    }
}

/// Draws the whole screen; returns where the table's rows went, for the mouse.
pub fn draw(frame: &mut Frame, model: &mut Model, palette: Palette, interval: &str) -> Drawn {
    let area = frame.area();
    let width = area.width as usize;
    let mut y = area.y;
    put(frame, area, header(model, palette, interval), &mut y);
    draw_gpus(frame, area, model, palette, &mut y);

    // The table fills what is left above the status line and the keys.
    let bottom = area.y + area.height;
    let table_top = y + 1;
    let rows_height = bottom.saturating_sub(table_top + 2);
    let columns = Columns::fit(&model.rows, width);
    put(frame, area, columns.heading(model, palette), &mut y);
    model.scroll_into_view(rows_height as usize);
    let table = Rect::new(area.x, table_top, area.width, rows_height);
    draw_table(frame, table, model, &columns, palette);

    let mut y = bottom.saturating_sub(2).max(table_top.min(bottom));
    put(frame, area, status_line(model, palette), &mut y);
    let footer = match (width, palette.unicode) {
        (..100, _) => keys::FOOTER_NARROW,
        (_, true) => keys::FOOTER,
        (_, false) => keys::FOOTER_ASCII,
    };
    let footer = Span::styled(footer, Style::default().add_modifier(Modifier::REVERSED));
    put(frame, area, TextLine::from(footer), &mut y);

    draw_panel(frame, model, palette);
    Drawn {
        table: TableArea {
            top: table_top,
            height: rows_height,
        },
    }
}

/// Each GPU's lines (two each, figures then sparklines, where the table keeps room).
fn draw_gpus(frame: &mut Frame, area: Rect, model: &Model, palette: Palette, y: &mut u16) {
    // Header, table heading, status and keys take four lines; the sparklines get lines of
    // their own only where the table keeps at least eight.
    let room = area.height.saturating_sub(4 + 8) as usize;
    let gpus: Vec<&GpuSnapshot> = model.snapshot.iter().flat_map(|s| &s.devices).collect();
    let single: usize = gpus.iter().map(|g| 1 + g.mig_devices.len()).sum();
    let two_lines = single + gpus.len() <= room;
    let empty = History::default();
    let width = area.width as usize;
    for gpu in &gpus {
        let history = model.history.get(&gpu.index).unwrap_or(&empty);
        for line in gpu_lines(gpu, history, model, palette, width, two_lines) {
            put(frame, area, line, y);
        }
    }
    if gpus.is_empty() {
        put(frame, area, TextLine::from("reading the GPUs…"), y);
    }
}

/// The table's visible lines (owner headings and processes) in `table`, or why it is empty.
fn draw_table(frame: &mut Frame, table: Rect, model: &Model, columns: &Columns, palette: Palette) {
    let area = frame.area();
    let mut row_y = table.y;
    let end = (model.offset + table.height as usize).min(model.lines.len());
    for index in model.offset..end {
        let line = match &model.lines[index] {
            Line::Group {
                owner,
                processes,
                bytes,
            } => TextLine::from(Span::styled(
                format!(
                    "{} {owner}: {processes} process{}, {}",
                    if palette.unicode { "▾" } else { "-" },
                    units::plural(*processes, "es"),
                    units::bytes(*bytes)
                ),
                Style::default().add_modifier(Modifier::BOLD),
            )),
            Line::Process(i) => {
                let row = &model.rows[*i];
                let marked = model.marked.contains(&row.key());
                columns.row(row, marked, index == model.cursor, model.grouped, palette)
            }
        };
        put(frame, area, line, &mut row_y);
    }
    if model.lines.is_empty() && table.height > 0 {
        let note = if model.filter.is_empty() && model.only_gpu.is_none() {
            "  no processes"
        } else {
            "  no process matches"
        };
        let note = Span::styled(note, Style::default().add_modifier(Modifier::DIM));
        put(frame, area, TextLine::from(note), &mut row_y);
    }
}

fn header(model: &Model, palette: Palette, interval: &str) -> TextLine<'static> {
    let dot = if palette.unicode { " · " } else { " | " };
    let mut parts = vec!["gpuctl top".to_string()];
    if let Some(snapshot) = &model.snapshot {
        parts.push(format!(
            "driver {}",
            snapshot.driver_version.as_deref().unwrap_or("?")
        ));
        if let Some(cuda) = &snapshot.cuda_driver_version {
            parts.push(format!("CUDA {cuda}"));
        }
        parts.push(match snapshot.devices.len() {
            1 => "1 GPU".into(),
            n => format!("{n} GPUs"),
        });
        parts.push(humantime::format_rfc3339_seconds(snapshot.taken_at).to_string());
    }
    parts.push(format!("every {interval}"));
    TextLine::from(Span::styled(
        parts.join(dot),
        Style::default().add_modifier(Modifier::BOLD),
    ))
}

fn gpu_lines(
    gpu: &GpuSnapshot,
    history: &History,
    model: &Model,
    palette: Palette,
    width: usize,
    two_lines: bool,
) -> Vec<TextLine<'static>> {
    let title = format!("GPU {:<2}", gpu.index);
    let mut spans = vec![Span::styled(
        title,
        Style::default().add_modifier(Modifier::BOLD),
    )];
    if matches!(gpu.status, GpuStatus::NotAnswering | GpuStatus::Lost) {
        let label = if gpu.status == GpuStatus::Lost {
            "LOST"
        } else {
            "NOT ANSWERING"
        };
        spans.push(Span::styled(
            format!(" {label}: {}", error_text(gpu)),
            palette.fg(Color::Red).add_modifier(Modifier::BOLD),
        ));
        return vec![TextLine::from(spans)];
    }
    let bar_cells = if width >= 120 { 20 } else { 10 };
    gpu_figures(gpu, palette, width, bar_cells, &mut spans);
    gpu_marks(gpu, model, palette, &mut spans);
    let used: usize = spans.iter().map(|s| s.content.chars().count()).sum();
    let mut lines = Vec::new();
    if two_lines {
        lines.push(TextLine::from(spans));
        let cells = width.saturating_sub(6 + 10) / 2;
        let mut second = vec![Span::raw("      ")];
        second.extend(sparklines(
            history,
            palette,
            cells.min(super::model::HISTORY),
        ));
        lines.push(TextLine::from(second));
    } else {
        // One line each: the sparklines take what the figures leave, if enough.
        let spare = width.saturating_sub(used + 12) / 2;
        if spare >= 8 {
            spans.extend(sparklines(history, palette, spare.min(40)));
        }
        lines.push(TextLine::from(spans));
    }
    for mig in &gpu.mig_devices {
        lines.push(mig_line(mig, palette, bar_cells / 2));
    }
    lines
}

/// The GPU's error, escaped (empty when it gave none).
fn error_text(gpu: &GpuSnapshot) -> std::borrow::Cow<'_, str> {
    let error = gpu.error.as_deref();
    error.map(gpuctl_core::text::escape).unwrap_or_default()
}

/// The GPU's name (on a wide screen), memory bar, utilization, unattributed memory,
/// temperature and power, as far as they were read.
fn gpu_figures(
    gpu: &GpuSnapshot,
    palette: Palette,
    width: usize,
    bar_cells: usize,
    spans: &mut Vec<Span<'static>>,
) {
    if width >= 120
        && let Some(name) = &gpu.name
    {
        spans.push(Span::raw(format!(
            " {:<22}",
            render::cut(&gpuctl_core::text::escape(name), 22, palette.unicode)
        )));
    }
    if let Some(memory) = gpu.memory {
        let fraction = memory_bar(
            spans,
            memory.used_bytes,
            memory.total_bytes,
            bar_cells,
            palette,
        );
        spans.push(Span::raw(format!(" {:>3.0}%", fraction * 100.0)));
    }
    if let Some(util) = gpu.utilization {
        spans.push(Span::raw(format!("  util {:>3}%", util.gpu_pct)));
    }
    if let Some(bytes) = gpu.memory.and_then(|m| m.unattributed_bytes) {
        spans.extend(unattributed(bytes, palette));
    }
    if let Some(temp) = gpu.temperature_c {
        spans.push(Span::raw(format!(
            "  {temp}{}C",
            if palette.unicode { "°" } else { "" }
        )));
    }
    match (gpu.power_mw, gpu.power_limit_mw) {
        (Some(power), Some(limit)) => {
            spans.push(Span::raw(format!("  {}/{} W", power / 1000, limit / 1000)))
        }
        (Some(power), None) => spans.push(Span::raw(format!("  {} W", power / 1000))),
        _ => {}
    }
}

/// Memory no listed process accounts for, from a MiB up (less is the driver's own).
fn unattributed(bytes: u64, palette: Palette) -> Option<Span<'static>> {
    (bytes >= 1024 * 1024).then(|| {
        Span::styled(
            format!("  unattributed {}", units::bytes(bytes)),
            palette.fg(Color::Yellow),
        )
    })
}

/// What the GPU needs seen: the watchdog's findings on it, its health where it needs an
/// action, the leases on it, and its error.
fn gpu_marks(gpu: &GpuSnapshot, model: &Model, palette: Palette, spans: &mut Vec<Span<'static>>) {
    let alarm = palette.fg(Color::Red).add_modifier(Modifier::BOLD);
    // The watchdog's findings on the GPU itself (stuck), and its own errors.
    for finding in model
        .watchdog
        .iter()
        .flat_map(|w| &w.findings)
        .filter(|f| f.pid.is_none() && f.gpus.contains(&gpu.index))
    {
        let label = format!("  [{}]", finding_label(finding.kind));
        spans.push(Span::styled(label, alarm));
    }
    // The GPU's health, where it needs an action (`gpuctl health` says why).
    if let Some(action) = gpu
        .health
        .as_ref()
        .map(|v| v.action)
        .filter(|a| *a != gpuctl_core::health::Action::None)
    {
        spans.push(Span::styled(format!("  [{}]", action.needs()), alarm));
    }
    // `gpuctl run` leases on the GPU or its instances: who holds each (info shows the rest).
    for lease in &gpu.leases {
        spans.push(lease_mark(lease, palette));
    }
    if gpu.status == GpuStatus::Error {
        spans.push(Span::styled(
            format!("  ERROR: {}", error_text(gpu)),
            palette.fg(Color::Red),
        ));
    }
}

/// `[GI 3 leased by alice, pid 42]`.
fn lease_mark(lease: &gpuctl_core::lease::Leased, palette: Palette) -> Span<'static> {
    let who = lease.holder.user.clone().unwrap_or_else(|| {
        lease
            .holder
            .uid
            .map_or("someone".into(), |uid| format!("uid {uid}"))
    });
    let place = lease
        .gpu_instance
        .map_or(String::new(), |gi| format!("GI {gi} "));
    let holder = match lease.holder.pid {
        Some(pid) => format!("{}, pid {pid}", gpuctl_core::text::escape(&who)),
        None => "an unnamed process".into(),
    };
    Span::styled(
        format!("  [{place}leased by {holder}]"),
        palette.fg(Color::Cyan),
    )
}

/// The memory and utilization histories as sparklines of `cells` each.
fn sparklines(history: &History, palette: Palette, cells: usize) -> Vec<Span<'static>> {
    vec![
        Span::raw(" mem "),
        Span::styled(
            palette.sparkline(&history.memory_pct, cells),
            palette.fg(Color::Cyan),
        ),
        Span::raw(" util "),
        Span::styled(
            palette.sparkline(&history.util_pct, cells),
            palette.fg(Color::Magenta),
        ),
    ]
}

/// A MIG device's line: profile, instance, memory bar and figures.
fn mig_line(
    mig: &gpuctl_core::snapshot::MigDevice,
    palette: Palette,
    bar_cells: usize,
) -> TextLine<'static> {
    let mut spans = vec![Span::raw(format!(
        "   MIG {} GI {}",
        mig.profile
            .as_deref()
            .map_or("?".into(), gpuctl_core::text::escape),
        mig.gpu_instance_id.map_or("?".into(), |id| id.to_string())
    ))];
    if let Some(memory) = mig.memory {
        memory_bar(
            &mut spans,
            memory.used_bytes,
            memory.total_bytes,
            bar_cells,
            palette,
        );
        if let Some(bytes) = memory.unattributed_bytes {
            spans.extend(unattributed(bytes, palette));
        }
    }
    TextLine::from(spans)
}

/// The process table's column widths, fitted to the screen: the command takes the rest.
struct Columns {
    user: usize,
    gpu: usize,
    state: usize,
    owner: usize,
    command: usize,
}

const PID: usize = 7;
const MEMORY: usize = 9;
const SM: usize = 4;
const AGE: usize = 6;

impl Columns {
    fn fit(rows: &[Row], width: usize) -> Columns {
        let widest = |pick: fn(&Row) -> usize, floor: usize, cap: usize| {
            rows.iter().map(pick).max().unwrap_or(0).clamp(floor, cap)
        };
        let narrow = width < 100;
        let user = widest(|r| r.user.chars().count(), 4, if narrow { 8 } else { 12 });
        let gpu = widest(|r| if r.instance.is_some() { 4 } else { 3 }, 3, 6);
        let state = widest(|r| r.state.chars().count(), 5, if narrow { 8 } else { 12 });
        let owner = widest(|r| r.owner.chars().count(), 5, if narrow { 12 } else { 28 });
        // Mark, then nine columns with a space after each but the last.
        let fixed = 2 + PID + user + gpu + MEMORY + SM + AGE + state + owner + 8;
        Columns {
            user,
            gpu,
            state,
            owner,
            command: width.saturating_sub(fixed).max(8),
        }
    }

    fn heading(&self, model: &Model, palette: Palette) -> TextLine<'static> {
        let arrow = |sort: super::model::Sort, name: &str| {
            if model.sort == sort {
                format!("{name}{}", if palette.unicode { "▼" } else { "v" })
            } else {
                name.to_string()
            }
        };
        use super::model::Sort;
        let text = format!(
            "  {:>PID$} {:<uw$} {:<gw$} {:>MEMORY$} {:>SM$} {:>AGE$} {:<sw$} {:<ow$} COMMAND",
            arrow(Sort::Pid, "PID"),
            arrow(Sort::User, "USER"),
            "GPU",
            arrow(Sort::Memory, "MEMORY"),
            arrow(Sort::Sm, "SM"),
            arrow(Sort::Age, "AGE"),
            "STATE",
            "OWNER",
            uw = self.user,
            gw = self.gpu,
            sw = self.state,
            ow = self.owner,
        );
        TextLine::from(Span::styled(
            text,
            Style::default().add_modifier(Modifier::BOLD | Modifier::UNDERLINED),
        ))
    }

    fn row(
        &self,
        row: &Row,
        marked: bool,
        cursor: bool,
        indent: bool,
        palette: Palette,
    ) -> TextLine<'static> {
        let unicode = palette.unicode;
        let gpu = Place {
            gpu: row.gpu,
            gpu_instance: row.instance,
        }
        .to_string();
        // In the tree, a process hangs under its owner's heading.
        let mark = match (marked, indent, unicode) {
            (true, _, _) => "*",
            (false, true, true) => "│",
            (false, true, false) => "|",
            (false, false, _) => " ",
        };
        let text = format!(
            "{mark} {:>PID$} {:<uw$} {:<gw$} {:>MEMORY$} {:>SM$} {:>AGE$} {:<sw$} {:<ow$} ",
            row.pid,
            render::cut(&row.user, self.user, unicode),
            gpu,
            row.used_bytes.map_or_else(|| "n/a".into(), units::bytes),
            row.sm_pct.map_or_else(|| "-".into(), |p| format!("{p}%")),
            row.age_seconds.map_or_else(|| "-".into(), render::age),
            render::cut(&row.state, self.state, unicode),
            render::cut(&row.owner, self.owner, unicode),
            uw = self.user,
            gw = self.gpu,
            sw = self.state,
            ow = self.owner,
        );
        let mut base = Style::default();
        if !row.confirmed {
            base = base.add_modifier(Modifier::DIM);
        }
        if marked {
            base = base
                .add_modifier(Modifier::BOLD)
                .patch(palette.fg(Color::Yellow));
        }
        if cursor {
            base = base.add_modifier(Modifier::REVERSED);
        }
        let mut spans = vec![Span::styled(text, base)];
        let mut room = self.command;
        for flag in &row.flags {
            let flag = format!("[{flag}] ");
            room = room.saturating_sub(flag.chars().count());
            spans.push(Span::styled(
                flag,
                base.patch(palette.fg(Color::Red))
                    .add_modifier(Modifier::BOLD),
            ));
        }
        let command = command_cell(&row.command, room, unicode);
        let pad = room.saturating_sub(command.chars().count());
        spans.push(Span::styled(format!("{command}{}", " ".repeat(pad)), base));
        TextLine::from(spans)
    }
}

/// A command line cut to `width` characters in the middle, as `info` cuts it: the tail
/// (`--rank 3`) tells a job's processes apart.
fn command_cell(command: &str, width: usize, unicode: bool) -> String {
    render::cut_middle(command, width, unicode)
}

fn status_line(model: &Model, palette: Palette) -> TextLine<'static> {
    if model.editing_filter {
        return TextLine::from(vec![
            Span::styled("filter: ", Style::default().add_modifier(Modifier::BOLD)),
            Span::raw(format!("{}_", gpuctl_core::text::escape(&model.filter))),
            Span::raw("   Enter keeps it, Esc clears it"),
        ]);
    }
    if let Some(status) = &model.status {
        return TextLine::from(Span::styled(
            status.clone(),
            Style::default().add_modifier(Modifier::BOLD),
        ));
    }
    let mut parts = vec![format!("sort: {}", model.sort.name())];
    if !model.filter.is_empty() {
        parts.push(format!(
            "filter: {}",
            gpuctl_core::text::escape(&model.filter)
        ));
    }
    if let Some(gpu) = model.only_gpu {
        parts.push(format!("GPU {gpu} only"));
    }
    if !model.marked.is_empty() {
        parts.push(format!("{} marked", model.marked.len()));
    }
    let mut spans = vec![Span::raw(parts.join("  "))];
    if !model.root {
        spans.push(Span::styled(
            format!(
                "  not root: you can end only your own processes (uid {})",
                model.uid
            ),
            palette.fg(Color::Yellow),
        ));
    }
    TextLine::from(spans)
}

/// The open panel, centred over the table.
fn draw_panel(frame: &mut Frame, model: &Model, palette: Palette) {
    let (title, lines): (String, Vec<TextLine<'static>>) = match &model.panel {
        Panel::None => return,
        Panel::Help => (
            "keys".into(),
            keys::HELP
                .iter()
                .map(|(key, what)| TextLine::from(format!("{key:<27} {what}")))
                .collect(),
        ),
        Panel::Users => (
            "per-user totals (u or Esc closes)".into(),
            user_totals(model, palette),
        ),
        Panel::Holders(index) => (
            format!("holders of GPU {index}'s device file, not listed by NVML (h or Esc closes)"),
            holder_lines(model, *index),
        ),
        Panel::Confirm(plan) => {
            let mut lines: Vec<TextLine<'static>> = plan
                .iter()
                .map(|line| TextLine::from(line.clone()))
                .collect();
            lines.push(TextLine::from(""));
            lines.push(TextLine::from(Span::styled(
                "y: carry it out   n or Esc: leave everything as it is",
                Style::default().add_modifier(Modifier::BOLD),
            )));
            ("end processes: the plan".into(), lines)
        }
    };
    let area = frame.area();
    let width = (lines.iter().map(TextLine::width).max().unwrap_or(0) + 4)
        .max(title.chars().count() + 4)
        .min(area.width as usize) as u16;
    let height = (lines.len() as u16 + 2).min(area.height);
    let rect = Rect::new(
        area.x + (area.width - width) / 2,
        area.y + (area.height - height) / 2,
        width,
        height,
    );
    frame.render_widget(Clear, rect);
    frame.render_widget(
        Paragraph::new(lines)
            .wrap(Wrap { trim: false })
            .block(Block::default().borders(Borders::ALL).title(title)),
        rect,
    );
}

/// The per-user totals panel: a heading, then memory, GPUs and processes per user.
fn user_totals(model: &Model, palette: Palette) -> Vec<TextLine<'static>> {
    let mut lines = vec![TextLine::from(Span::styled(
        format!(
            "{:<20} {:>10}  {:<10} {:>9}",
            "USER", "MEMORY", "GPUS", "PROCESSES"
        ),
        Style::default().add_modifier(Modifier::BOLD),
    ))];
    if let Some(snapshot) = &model.snapshot {
        for total in totals(snapshot, By::User) {
            lines.push(TextLine::from(format!(
                "{:<20} {:>10}  {:<10} {:>9}",
                render::cut(&gpuctl_core::text::safe(&total.name), 20, palette.unicode),
                units::bytes(total.used_bytes),
                units::gpu_list(&total.gpus),
                total.processes
            )));
        }
    }
    lines
}

/// The holders panel of GPU `index`: each process holding its device file that NVML does
/// not list, with the suspicion and its reason; or why there are none to show.
fn holder_lines(model: &Model, index: u32) -> Vec<TextLine<'static>> {
    let gpu = model
        .snapshot
        .iter()
        .flat_map(|s| &s.devices)
        .find(|g| g.index == index);
    let mut lines = Vec::new();
    match gpu.and_then(|g| g.holders.as_ref()) {
        None => lines.push(TextLine::from("reading the device files…")),
        Some(holders) if holders.is_empty() => lines.push(TextLine::from(
            match gpu.and_then(|g| g.holders_not_scanned.as_deref()) {
                Some(why) => format!("not looked for: {}", gpuctl_core::text::escape(why)),
                None => "no process holds its device file without NVML listing it".into(),
            },
        )),
        Some(holders) => {
            for holder in holders {
                let host = &holder.host;
                lines.push(TextLine::from(format!(
                    "{:>7} {:<10} {}",
                    holder.pid,
                    host.user
                        .as_deref()
                        .map_or("?".into(), gpuctl_core::text::safe),
                    gpuctl_core::text::safe(&host.shown_command())
                )));
                lines.push(TextLine::from(Span::styled(
                    format!(
                        "        {}: {}",
                        holder.suspect.unwrap_or("unknown"),
                        gpuctl_core::text::safe(holder.reason.as_deref().unwrap_or(""))
                    ),
                    Style::default().add_modifier(Modifier::DIM),
                )));
            }
        }
    }
    lines
}

/// " mem ", the bar of `used` in `total` and " USED/TOTAL"; the fraction used.
fn memory_bar(
    spans: &mut Vec<Span<'static>>,
    used: u64,
    total: u64,
    bar_cells: usize,
    palette: Palette,
) -> f64 {
    let fraction = used as f64 / total.max(1) as f64;
    spans.push(Span::raw(" mem "));
    spans.push(Span::styled(
        palette.bar(fraction, bar_cells),
        palette.load(fraction),
    ));
    spans.push(Span::raw(format!(
        " {}/{}",
        units::bytes(used),
        units::bytes(total)
    )));
    fraction
}
