//! What the view shows and where the user is in it: the latest snapshot made into rows, the
//! GPUs' history, and the cursor, marks, sort, filter and open panel. Pure: no terminal, no
//! NVML; the loop in `mod.rs` feeds it snapshots and keys.

use std::collections::{BTreeSet, HashMap, VecDeque};

use gpuctl_core::Snapshot;
use gpuctl_core::classify::Kind;
use gpuctl_core::nvml::Place;
use gpuctl_core::report::WatchdogFindings;
use gpuctl_core::snapshot::{GpuProcess, GpuStatus};
use gpuctl_core::text;

/// How many samples each GPU's sparklines keep: five minutes at the default interval.
pub const HISTORY: usize = 300;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sort {
    Memory,
    Sm,
    Age,
    Pid,
    User,
}

impl Sort {
    pub fn next(self) -> Sort {
        match self {
            Sort::Memory => Sort::Sm,
            Sort::Sm => Sort::Age,
            Sort::Age => Sort::Pid,
            Sort::Pid => Sort::User,
            Sort::User => Sort::Memory,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Sort::Memory => "memory",
            Sort::Sm => "SM",
            Sort::Age => "age",
            Sort::Pid => "pid",
            Sort::User => "user",
        }
    }
}

/// One process on one GPU, as shown: every text a process or user chose is escaped here,
/// once, so nothing drawn later can carry a control byte to the terminal.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub pid: u32,
    /// Its start time (clock ticks since boot), where it is confirmed: with the pid, the
    /// process itself, which `k` ends and no other that later takes the pid.
    pub start_ticks: Option<u64>,
    pub gpu: u32,
    /// The MIG GPU instance it runs in.
    pub instance: Option<u32>,
    pub used_bytes: Option<u64>,
    pub sm_pct: Option<u32>,
    pub age_seconds: Option<u64>,
    pub uid: Option<u32>,
    pub user: String,
    pub state: String,
    pub owner: String,
    pub command: String,
    /// Findings marked on it: the watchdog's (stale, stuck, zombie holder, above share), and
    /// an impostor of a protected program.
    pub flags: Vec<String>,
    pub confirmed: bool,
}

/// A process as the view showed it: pid, and start time where it was confirmed.
pub type ProcessKey = (u32, Option<u64>);

impl Row {
    pub fn key(&self) -> ProcessKey {
        (self.pid, self.start_ticks)
    }
}

/// Figures of one GPU over time, oldest first.
#[derive(Debug, Clone, Default)]
pub struct History {
    pub memory_pct: VecDeque<u64>,
    pub util_pct: VecDeque<u64>,
}

impl History {
    fn push(&mut self, memory_pct: Option<u64>, util_pct: Option<u64>) {
        for (series, value) in [
            (&mut self.memory_pct, memory_pct),
            (&mut self.util_pct, util_pct),
        ] {
            if let Some(value) = value {
                if series.len() == HISTORY {
                    series.pop_front();
                }
                series.push_back(value);
            }
        }
    }
}

/// A panel over the table.
#[derive(Debug, Clone, PartialEq)]
pub enum Panel {
    None,
    Help,
    Users,
    /// The device-file holders of this GPU.
    Holders(u32),
    /// A kill's plan, waiting for y or n.
    Confirm(Vec<String>),
}

/// A line of the process table: an owner's heading (grouped view) or a process row.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    Group {
        owner: String,
        processes: usize,
        bytes: u64,
    },
    Process(usize),
}

pub struct Model {
    pub snapshot: Option<Snapshot>,
    pub watchdog: Option<WatchdogFindings>,
    pub history: HashMap<u32, History>,
    /// Every row of the snapshot, unfiltered.
    pub rows: Vec<Row>,
    /// What the table shows, in order.
    pub lines: Vec<Line>,
    /// Index into `lines`; always a process line when there is one.
    pub cursor: usize,
    /// The first line shown.
    pub offset: usize,
    /// Marked processes, by pid and start time ([`Row::key`]).
    pub marked: BTreeSet<ProcessKey>,
    pub sort: Sort,
    pub filter: String,
    /// Typing into the filter.
    pub editing_filter: bool,
    /// Only this GPU's processes (`g`).
    pub only_gpu: Option<u32>,
    /// The GPUs and MIG instances `--gpu` named (`None`: every GPU): processes elsewhere on
    /// a GPU of which only instances were named are not rows.
    pub places: Option<Vec<Place>>,
    /// Grouped by owner (`t`).
    pub grouped: bool,
    pub panel: Panel,
    /// The last kill's result, or a note.
    pub status: Option<String>,
    pub root: bool,
    pub uid: u32,
}

impl Model {
    pub fn new(root: bool, uid: u32) -> Model {
        Model {
            snapshot: None,
            watchdog: None,
            history: HashMap::new(),
            rows: Vec::new(),
            lines: Vec::new(),
            cursor: 0,
            offset: 0,
            marked: BTreeSet::new(),
            sort: Sort::Memory,
            filter: String::new(),
            editing_filter: false,
            only_gpu: None,
            places: None,
            grouped: false,
            panel: Panel::None,
            status: None,
            root,
            uid,
        }
    }

    /// Takes in a new snapshot: rows, history, and the cursor kept on the same process.
    pub fn update(&mut self, snapshot: Snapshot, watchdog: Option<WatchdogFindings>) {
        for gpu in &snapshot.devices {
            let history = self.history.entry(gpu.index).or_default();
            // A GPU that does not answer has no figures: its history waits.
            if gpu.status == GpuStatus::Ok || gpu.status == GpuStatus::Error {
                let memory = gpu
                    .memory
                    .map(|m| m.used_bytes * 100 / m.total_bytes.max(1));
                let util = gpu.utilization.map(|u| u64::from(u.gpu_pct));
                history.push(memory, util);
            }
        }
        self.rows = rows_of(&snapshot, watchdog.as_ref());
        if let Some(places) = &self.places {
            self.rows
                .retain(|row| places.iter().any(|p| p.holds(row.gpu, row.instance)));
        }
        self.snapshot = Some(snapshot);
        self.watchdog = watchdog;
        // Marks of processes gone are dropped: a later process with the pid is not marked.
        let alive: BTreeSet<ProcessKey> = self.rows.iter().map(Row::key).collect();
        self.marked.retain(|key| alive.contains(key));
        self.relayout();
    }

    /// The process under the cursor.
    pub fn current(&self) -> Option<&Row> {
        match self.lines.get(self.cursor)? {
            Line::Process(i) => self.rows.get(*i),
            Line::Group { .. } => None,
        }
    }

    /// What `k` ends: the marked processes, or the cursor's, each by pid and start time.
    pub fn chosen(&self) -> Vec<ProcessKey> {
        if self.marked.is_empty() {
            self.current().map(|r| vec![r.key()]).unwrap_or_default()
        } else {
            self.marked.iter().copied().collect()
        }
    }

    /// The pids of [`Model::chosen`].
    #[cfg(test)]
    pub fn chosen_pids(&self) -> Vec<u32> {
        self.chosen().into_iter().map(|(pid, _)| pid).collect()
    }

    fn matches(&self, row: &Row) -> bool {
        if self.only_gpu.is_some_and(|gpu| gpu != row.gpu) {
            return false;
        }
        if self.filter.is_empty() {
            return true;
        }
        let needle = self.filter.to_lowercase();
        [
            row.pid.to_string().as_str(),
            &row.user,
            &row.owner,
            &row.command,
        ]
        .iter()
        .any(|field| field.to_lowercase().contains(&needle))
    }

    /// Filters, sorts and groups the rows again, keeping the cursor on its process.
    pub fn relayout(&mut self) {
        let keep = self.current().map(|r| (r.pid, r.gpu));
        let mut shown: Vec<usize> = (0..self.rows.len())
            .filter(|&i| self.matches(&self.rows[i]))
            .collect();
        let rows = &self.rows;
        let sort = self.sort;
        shown.sort_by(|&a, &b| {
            let (a, b) = (&rows[a], &rows[b]);
            let by_key = match sort {
                Sort::Memory => b.used_bytes.cmp(&a.used_bytes),
                Sort::Sm => b.sm_pct.cmp(&a.sm_pct),
                Sort::Age => b.age_seconds.cmp(&a.age_seconds),
                Sort::Pid => a.pid.cmp(&b.pid),
                Sort::User => a.user.cmp(&b.user),
            };
            by_key.then(a.pid.cmp(&b.pid)).then(a.gpu.cmp(&b.gpu))
        });
        self.lines = if self.grouped {
            let mut owners: Vec<(String, Vec<usize>)> = Vec::new();
            for i in shown {
                let owner = &rows[i].owner;
                match owners.iter_mut().find(|(o, _)| o == owner) {
                    Some((_, members)) => members.push(i),
                    None => owners.push((owner.clone(), vec![i])),
                }
            }
            // The owners holding most first; each owner's processes in the sort's order.
            owners.sort_by_key(|(owner, members)| {
                let bytes: u64 = members.iter().filter_map(|&i| rows[i].used_bytes).sum();
                (std::cmp::Reverse(bytes), owner.clone())
            });
            let mut lines = Vec::new();
            for (owner, members) in owners {
                let pids: BTreeSet<u32> = members.iter().map(|&i| rows[i].pid).collect();
                lines.push(Line::Group {
                    owner,
                    processes: pids.len(),
                    bytes: members.iter().filter_map(|&i| rows[i].used_bytes).sum(),
                });
                lines.extend(members.into_iter().map(Line::Process));
            }
            lines
        } else {
            shown.into_iter().map(Line::Process).collect()
        };
        self.cursor = keep
            .and_then(|(pid, gpu)| {
                self.lines.iter().position(|line| match line {
                    Line::Process(i) => rows[*i].pid == pid && rows[*i].gpu == gpu,
                    Line::Group { .. } => false,
                })
            })
            .unwrap_or(self.cursor.min(self.lines.len().saturating_sub(1)));
        self.settle(1);
    }

    /// Moves the cursor by `delta` lines (clamped), onto a process line.
    pub fn move_by(&mut self, delta: isize) {
        if self.lines.is_empty() {
            self.cursor = 0;
            return;
        }
        let last = self.lines.len() - 1;
        self.cursor = self.cursor.saturating_add_signed(delta).min(last);
        self.settle(if delta < 0 { -1 } else { 1 });
    }

    pub fn move_to(&mut self, line: usize) {
        if self.lines.is_empty() {
            return;
        }
        self.cursor = line.min(self.lines.len() - 1);
        self.settle(1);
    }

    /// Off a group heading, in `direction`, else the other way.
    fn settle(&mut self, direction: isize) {
        let is_process = |i: usize| matches!(self.lines.get(i), Some(Line::Process(_)));
        if self.lines.is_empty() || is_process(self.cursor) {
            return;
        }
        let mut probe = self.cursor;
        while let Some(next) = probe.checked_add_signed(direction) {
            if next >= self.lines.len() {
                break;
            }
            if is_process(next) {
                self.cursor = next;
                return;
            }
            probe = next;
        }
        probe = self.cursor;
        while let Some(next) = probe.checked_add_signed(-direction) {
            if next >= self.lines.len() {
                break;
            }
            if is_process(next) {
                self.cursor = next;
                return;
            }
            probe = next;
        }
    }

    /// Keeps the cursor within the `height` lines shown.
    pub fn scroll_into_view(&mut self, height: usize) {
        if height == 0 {
            return;
        }
        if self.cursor < self.offset {
            self.offset = self.cursor;
        } else if self.cursor >= self.offset + height {
            self.offset = self.cursor + 1 - height;
        }
        self.offset = self.offset.min(self.lines.len().saturating_sub(height));
    }

    pub fn toggle_mark(&mut self) {
        if let Some(key) = self.current().map(Row::key)
            && !self.marked.remove(&key)
        {
            self.marked.insert(key);
        }
        self.move_by(1);
    }

    /// All, then each GPU in turn, then all again.
    pub fn next_gpu(&mut self) {
        let indices: Vec<u32> = self
            .snapshot
            .iter()
            .flat_map(|s| &s.devices)
            .map(|g| g.index)
            .collect();
        self.only_gpu = match self.only_gpu {
            None => indices.first().copied(),
            Some(gpu) => indices.iter().copied().find(|&i| i > gpu),
        };
        self.relayout();
    }

    /// The GPU `h` shows holders of: the one narrowed to, else the cursor's, else the first.
    pub fn holder_gpu(&self) -> Option<u32> {
        self.only_gpu.or(self.current().map(|r| r.gpu)).or(self
            .snapshot
            .as_ref()
            .and_then(|s| s.devices.first())
            .map(|g| g.index))
    }
}

/// Every process entry of `snapshot`, whole GPUs and MIG instances alike, made into rows.
pub fn rows_of(snapshot: &Snapshot, watchdog: Option<&WatchdogFindings>) -> Vec<Row> {
    snapshot
        .devices
        .iter()
        .flat_map(|gpu| {
            gpu.processes
                .iter()
                .map(move |p| row_of(gpu.index, p, watchdog))
        })
        .collect()
}

fn row_of(gpu: u32, process: &GpuProcess, watchdog: Option<&WatchdogFindings>) -> Row {
    let host = &process.host;
    let mut flags: Vec<String> = watchdog
        .into_iter()
        .flat_map(|w| &w.findings)
        .filter(|f| f.pid == Some(process.pid) && (f.gpus.is_empty() || f.gpus.contains(&gpu)))
        .map(|f| finding_label(f.kind).to_string())
        .collect();
    flags.dedup();
    if let Some(claim) = host.protection.as_ref().filter(|c| !c.genuine) {
        flags.push(format!("impostor of {}", text::escape(&claim.name)));
    }
    let command = if host.confirmed {
        text::safe(&host.shown_command()).into_owned()
    } else {
        format!(
            "(unconfirmed: {})",
            text::safe(host.unconfirmed_reason.as_deref().unwrap_or("unknown"))
        )
    };
    Row {
        pid: process.pid,
        start_ticks: host.start_ticks.filter(|_| host.confirmed),
        gpu,
        instance: process.gpu_instance_id,
        used_bytes: process.used_bytes,
        sm_pct: process.sm_util_pct,
        age_seconds: host.age_seconds(),
        uid: host.uid,
        user: host
            .user
            .as_deref()
            .map(|user| text::safe(user).into_owned())
            .or_else(|| host.uid.map(|uid| uid.to_string()))
            .unwrap_or_else(|| "?".into()),
        // What `clear` would reclaim it as (as `info` shows it), else idle by the
        // watchdog's window (how long), in place of the process state.
        state: match (process.reclaimable, process.idle) {
            (Some(kind), _) => kind.to_string(),
            (None, Some(idle)) => format!(
                "idle {}",
                gpuctl_core::classify::idle::short_duration(
                    (gpuctl_core::units::unix_seconds() as u64)
                        .saturating_sub(idle.idle_since)
                        .max(idle.idle_seconds)
                )
            ),
            (None, None) => host
                .state
                .map_or_else(|| "?".to_string(), |s| s.as_str().to_string()),
        },
        owner: host.owner.as_ref().map_or_else(
            || "-".to_string(),
            |owner| text::safe(&owner.label()).into_owned(),
        ),
        command,
        flags,
        confirmed: host.confirmed,
    }
}

/// A watchdog finding's kind as the view names it.
pub fn finding_label(kind: Kind) -> &'static str {
    match kind {
        Kind::Orphaned => "stale",
        Kind::ZombieHolder => "zombie holder",
        Kind::AboveFraction => "above share",
        other => other.name(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pid: u32, gpu: u32, bytes: u64, user: &str, owner: &str) -> Row {
        Row {
            pid,
            start_ticks: Some(u64::from(pid) * 100),
            gpu,
            instance: None,
            used_bytes: Some(bytes),
            sm_pct: Some(pid % 100),
            age_seconds: Some(u64::from(pid)),
            uid: Some(1000),
            user: user.into(),
            state: "sleeping".into(),
            owner: owner.into(),
            command: format!("python3 run{pid}.py"),
            flags: Vec::new(),
            confirmed: true,
        }
    }

    fn model(rows: Vec<Row>) -> Model {
        let mut model = Model::new(false, 1000);
        model.rows = rows;
        model.relayout();
        model
    }

    fn shown_pids(model: &Model) -> Vec<u32> {
        model
            .lines
            .iter()
            .filter_map(|l| match l {
                Line::Process(i) => Some(model.rows[*i].pid),
                Line::Group { .. } => None,
            })
            .collect()
    }

    #[test]
    fn sorts_filters_and_keeps_the_cursor_on_its_process() {
        let mut m = model(vec![
            row(10, 0, 5, "bob", "slurm:1"),
            row(20, 1, 9, "alice", "-"),
            row(30, 0, 1, "carol", "slurm:1"),
        ]);
        assert_eq!(shown_pids(&m), [20, 10, 30]);
        m.move_by(1);
        assert_eq!(m.current().unwrap().pid, 10);
        m.sort = Sort::Pid;
        m.relayout();
        assert_eq!(shown_pids(&m), [10, 20, 30]);
        assert_eq!(
            m.current().unwrap().pid,
            10,
            "the cursor follows its process"
        );
        m.sort = Sort::User;
        m.relayout();
        assert_eq!(shown_pids(&m), [20, 10, 30]);
        m.filter = "run30".into();
        m.relayout();
        assert_eq!(shown_pids(&m), [30]);
        m.filter = "ALICE".into();
        m.relayout();
        assert_eq!(shown_pids(&m), [20]);
        m.filter.clear();
        m.only_gpu = Some(0);
        m.relayout();
        assert_eq!(shown_pids(&m), [10, 30]);
    }

    #[test]
    fn grouping_puts_headings_the_cursor_never_rests_on() {
        let mut m = model(vec![
            row(10, 0, 5, "bob", "slurm:1"),
            row(20, 1, 9, "alice", "-"),
            row(30, 0, 1, "carol", "slurm:1"),
        ]);
        m.grouped = true;
        m.relayout();
        assert!(
            matches!(&m.lines[0], Line::Group { owner, processes: 1, bytes: 9 } if owner == "-")
        );
        assert!(matches!(
            m.lines[2],
            Line::Group {
                processes: 2,
                bytes: 6,
                ..
            }
        ));
        assert!(m.current().is_some());
        m.move_to(0);
        assert_eq!(m.cursor, 1);
        m.move_by(1);
        assert_eq!(m.cursor, 3, "stepped over the heading");
        m.move_by(-1);
        assert_eq!(m.cursor, 1);
    }

    /// A snapshot of GPU 0 with `processes` (pid, start time, MIG instance).
    fn snapshot(processes: &[(u32, u64, Option<u32>)]) -> Snapshot {
        use gpuctl_core::host::HostProcess;
        use gpuctl_core::snapshot::{GpuSnapshot, ProcessType};
        let mut gpu = GpuSnapshot::unread(0);
        gpu.processes = processes
            .iter()
            .map(|&(pid, start, instance)| GpuProcess {
                pid,
                used_bytes: Some(1 << 30),
                kind: ProcessType::Compute,
                sm_util_pct: None,
                idle: None,
                reclaimable: None,
                gpu_instance_id: instance,
                compute_instance_id: instance.map(|_| 0),
                mps: None,
                host: std::sync::Arc::new(HostProcess {
                    confirmed: true,
                    start_ticks: Some(start),
                    ..HostProcess::unconfirmed("")
                }),
            })
            .collect();
        Snapshot::of(vec![gpu])
    }

    #[test]
    fn an_idle_process_shows_how_long_in_its_state() {
        use gpuctl_core::snapshot::{IdleFacts, IdleSource};
        let mut shot = snapshot(&[(10, 500, None), (20, 600, None)]);
        let now = gpuctl_core::units::unix_seconds() as u64;
        shot.devices[0].processes[0].idle = Some(IdleFacts {
            idle_since: now - (3 * 3600 + 12 * 60),
            idle_seconds: 3 * 3600,
            memory_bytes: 1 << 30,
            measured_pct: 100,
            utilization: IdleSource::Process,
        });
        let rows = rows_of(&shot, None);
        let state = |pid: u32| rows.iter().find(|r| r.pid == pid).unwrap().state.clone();
        assert!(state(10).starts_with("idle 3h1"), "{}", state(10));
        assert!(!state(20).starts_with("idle"), "{}", state(20));
    }

    #[test]
    fn a_mark_is_of_the_process_shown_not_of_a_later_one_with_its_pid() {
        let mut m = Model::new(true, 0);
        m.update(snapshot(&[(10, 500, None), (20, 600, None)]), None);
        m.move_to(0);
        let first = m.current().unwrap().pid;
        m.toggle_mark();
        assert_eq!(m.chosen().len(), 1);
        let start = if first == 10 { 500 } else { 600 };
        assert_eq!(m.chosen(), [(first, Some(start))]);
        // The marked process exits and another takes its pid: the mark does not carry over.
        let replaced = [(10, 500, None), (20, 600, None)]
            .map(|(pid, started, gi)| (pid, if pid == first { started + 1 } else { started }, gi));
        m.update(snapshot(&replaced), None);
        assert!(m.marked.is_empty(), "{:?}", m.marked);
    }

    #[test]
    fn a_mig_instance_named_keeps_only_its_processes_as_rows() {
        let mut m = Model::new(true, 0);
        m.places = Some(vec![Place {
            gpu: 0,
            gpu_instance: Some(9),
        }]);
        m.update(
            snapshot(&[(10, 1, Some(1)), (20, 2, Some(9)), (30, 3, Some(10))]),
            None,
        );
        let pids: Vec<u32> = m.rows.iter().map(|r| r.pid).collect();
        assert_eq!(pids, [20]);
        m.places = Some(vec![Place::whole(0)]);
        m.update(snapshot(&[(10, 1, Some(1)), (20, 2, Some(9))]), None);
        assert_eq!(m.rows.len(), 2, "a GPU named whole shows every instance");
    }

    #[test]
    fn marks_choose_what_k_ends_and_vanish_with_their_process() {
        let mut m = model(vec![row(10, 0, 5, "a", "-"), row(20, 0, 4, "a", "-")]);
        assert_eq!(m.chosen_pids(), [10]);
        m.toggle_mark();
        m.toggle_mark();
        assert_eq!(m.chosen_pids(), [10, 20]);
        m.rows.retain(|r| r.pid != 20);
        let alive: BTreeSet<ProcessKey> = m.rows.iter().map(Row::key).collect();
        m.marked.retain(|p| alive.contains(p));
        assert_eq!(m.chosen_pids(), [10]);
    }

    #[test]
    fn scrolling_keeps_the_cursor_shown() {
        let mut m = model(
            (1..=50)
                .map(|p| row(p, 0, 100 - u64::from(p), "a", "-"))
                .collect(),
        );
        m.move_by(30);
        m.scroll_into_view(10);
        assert_eq!(m.offset, 21);
        m.move_to(0);
        m.scroll_into_view(10);
        assert_eq!(m.offset, 0);
    }
}
