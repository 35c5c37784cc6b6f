//! The process rows of `gpuctl info`'s view: one table per GPU or MIG instance, and the
//! cells shown of a process's host facts, which the device-file holders and `--idle` share.

use gpuctl_core::classify::idle;
use gpuctl_core::host::HostProcess;
use gpuctl_core::snapshot::{GpuProcess, IdleFacts};
use gpuctl_core::units;

use crate::render::{self, Color, Style};

struct Row {
    pid: String,
    user: String,
    memory: String,
    sm: String,
    age: String,
    state: String,
    owner: String,
    command: String,
    state_color: Option<Color>,
    dim: bool,
    /// The command cell is our text, not a command line: cut at its end.
    ours: bool,
}

pub(super) fn process_table(
    out: &mut String,
    processes: &[GpuProcess],
    unattributed: Option<u64>,
    style: &Style,
) {
    let mut rows: Vec<Row> = processes.iter().map(row).collect();
    if let Some(bytes) = unattributed {
        rows.push(Row {
            pid: "-".into(),
            user: "-".into(),
            memory: units::bytes(bytes),
            sm: "-".into(),
            age: "-".into(),
            state: "-".into(),
            owner: "unattributed".into(),
            command: "memory in use that no process accounts for".into(),
            state_color: None,
            dim: true,
            ours: true,
        });
    }
    let headers = [
        "PID", "USER", "MEMORY", "SM", "AGE", "STATE", "OWNER", "COMMAND",
    ];
    let widths = Widths::fit(&rows, style);
    let header_cells = headers.map(str::to_string);
    let mut header = header_cells.clone();
    header[5] = render::pad(&header_cells[5], widths.state);
    out.push_str(&style.paint(Color::Dim, widths.line(header, true, style).trim_end()));
    out.push('\n');
    for r in rows {
        let state = match r.state_color {
            Some(color) => style.paint(color, &render::pad(&r.state, widths.state)),
            None => render::pad(&r.state, widths.state),
        };
        let text = widths.line(
            [
                r.pid, r.user, r.memory, r.sm, r.age, state, r.owner, r.command,
            ],
            r.ours,
            style,
        );
        let text = text.trim_end();
        if r.dim {
            out.push_str(&style.paint(Color::Dim, text));
        } else {
            out.push_str(text);
        }
        out.push('\n');
    }
}

/// The process table's column widths: each column's widest cell or heading, up to a cap;
/// the command takes what a terminal leaves (nothing is cut without one).
struct Widths {
    pid: usize,
    user: usize,
    memory: usize,
    sm: usize,
    age: usize,
    state: usize,
    owner: usize,
    command: Option<usize>,
}

impl Widths {
    fn fit(rows: &[Row], style: &Style) -> Widths {
        let width = |pick: fn(&Row) -> &str, header: &str, cap: usize| {
            rows.iter()
                .map(|r| pick(r).chars().count())
                .chain([header.len()])
                .max()
                .unwrap_or(0)
                .min(cap)
        };
        let pid = width(|r| &r.pid, "PID", 10);
        let user = width(|r| &r.user, "USER", 12);
        let memory = width(|r| &r.memory, "MEMORY", 10);
        let sm = width(|r| &r.sm, "SM", 4);
        let age = width(|r| &r.age, "AGE", 7);
        let state = width(|r| &r.state, "STATE", 12);
        // A pod named by its namespace and name is wider than a job number.
        let owner = width(
            |r| &r.owner,
            "OWNER",
            gpuctl_core::owner::POD_LABEL_MAX_CHARS,
        );
        let fixed = 2 + pid + user + memory + sm + age + state + owner + 2 * 7;
        Widths {
            pid,
            user,
            memory,
            sm,
            age,
            state,
            owner,
            // On a narrow terminal the command keeps at least 20.
            command: style.width.map(|w| w.saturating_sub(fixed).max(20)),
        }
    }

    /// One line of the table; the state cell comes padded (and painted).
    fn line(&self, cells: [String; 8], ours: bool, style: &Style) -> String {
        let [pid, user, mem, sm, age, state, owner, command] = cells;
        format!(
            "  {}  {}  {}  {}  {}  {}  {}  {}",
            render::pad_left(&pid, self.pid),
            render::pad(&render::cut(&user, self.user, style.unicode), self.user),
            render::pad_left(&mem, self.memory),
            render::pad_left(&sm, self.sm),
            render::pad_left(&age, self.age),
            state,
            render::pad(&render::cut(&owner, self.owner, style.unicode), self.owner),
            match self.command {
                Some(w) if ours => render::cut(&command, w, style.unicode),
                Some(w) => render::cut_middle(&command, w, style.unicode),
                None => command,
            }
        )
    }
}

/// What a table shows of a process from the host's facts, for the process rows and the
/// device-file holders alike. Everything a process or user chose is escaped
/// (`render::safe`); the rest is ours.
pub(super) struct HostCells {
    pub(super) user: String,
    pub(super) state: String,
    pub(super) state_color: Option<Color>,
    pub(super) owner: String,
    pub(super) command: String,
}

pub(super) fn host_cells(host: &HostProcess) -> HostCells {
    let (state, state_color) = match host.state {
        Some(state) => {
            let color = match state.as_str() {
                "zombie" | "disk-sleep" | "dead" => Some(Color::Red),
                "stopped" | "tracing-stop" => Some(Color::Yellow),
                "running" => Some(Color::Green),
                _ => None,
            };
            (state.as_str().to_string(), color)
        }
        None => ("?".to_string(), Some(Color::Yellow)),
    };
    let command = if host.confirmed {
        let command = render::safe(&host.shown_command()).into_owned();
        match &host.protection {
            Some(claim) if !claim.genuine => format!("[claims to be {}] {command}", claim.name),
            _ => command,
        }
    } else {
        format!(
            "(unconfirmed: {})",
            host.unconfirmed_reason.as_deref().unwrap_or("unknown")
        )
    };
    HostCells {
        user: host
            .user
            .as_deref()
            .map(|user| render::safe(user).into_owned())
            .or_else(|| host.uid.map(|uid| uid.to_string()))
            .unwrap_or_else(|| "?".into()),
        state,
        state_color,
        owner: host.owner.as_ref().map_or_else(
            || "-".to_string(),
            |owner| render::safe(&owner.label()).into_owned(),
        ),
        command,
    }
}

/// How long a process has been idle, now ("3h12m"): its state cell, and `--idle`'s column.
pub(super) fn idle_for(idle: &IdleFacts) -> String {
    let now = units::unix_seconds() as u64;
    idle::short_duration(now.saturating_sub(idle.idle_since).max(idle.idle_seconds))
}

fn row(process: &GpuProcess) -> Row {
    let host = &process.host;
    let dash = || "-".to_string();
    let cells = host_cells(host);
    Row {
        pid: process.pid.to_string(),
        user: cells.user,
        memory: process
            .used_bytes
            .map_or_else(|| "n/a".into(), units::bytes),
        sm: process
            .sm_util_pct
            .map_or_else(dash, |pct| format!("{pct}%")),
        age: host.age_seconds().map_or_else(dash, render::age),
        // What `clear` would reclaim it as, else idle by the watchdog's window (how long),
        // in place of the process state.
        state: match (process.reclaimable, process.idle) {
            (Some(kind), _) => kind.to_string(),
            (None, Some(idle)) => format!("idle {}", idle_for(&idle)),
            (None, None) => cells.state,
        },
        owner: cells.owner,
        // Under MPS: the server's row is its own memory, each client's its own.
        command: match process.mps {
            Some(role) => format!("[{}] {}", role.label(), cells.command),
            None => cells.command,
        },
        state_color: match process.reclaimable {
            Some(_) => Some(Color::Red),
            None => cells.state_color,
        },
        dim: !host.confirmed,
        ours: !host.confirmed,
    }
}
