//! A process that holds GPU memory and does nothing with it: a notebook kernel with 40 GiB
//! allocated over a weekend, an inference server nobody calls. The opposite of `stuck`
//! (busy, no progress). Each process has a window, keyed by its identity (pid and start
//! time), that the watchdog moves on at every sample: since when its SM utilization has
//! stayed under `util_below` while it held at least `min_memory`, and how much of that
//! spell was measured. A single busy sample ends the spell.
//!
//! Pure: every call takes the sample's time (milliseconds since the epoch, so a window
//! survives a restart of the watchdog), and is tested with an explicit clock.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Facts, Held, Verdict};
use crate::act::Identity;
use crate::config::{IdleAction, IdlePolicy};
use crate::owner::OwnerMatch;
use crate::pidmap::PidMap;
use crate::snapshot::{GpuProcess, Snapshot};
pub use crate::snapshot::{IdleFacts, IdleSource};
use crate::units;

/// `[idle]`'s thresholds, as the window reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdleCriteria {
    /// How long the spell must last.
    pub after: Duration,
    /// Memory held below this is not worth a finding (and ends a spell).
    pub min_memory: u64,
    /// SM utilization under this percentage counts as idle.
    pub util_below: u32,
}

impl IdleCriteria {
    /// The window's thresholds of `[idle]`.
    pub fn of(policy: &IdlePolicy) -> IdleCriteria {
        IdleCriteria {
            after: policy.after,
            min_memory: policy.min_memory,
            util_below: policy.util_below,
        }
    }
}

/// One process's utilization at one sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub identity: Identity,
    /// GPU memory it holds over all its GPUs.
    pub bytes: u64,
    /// Highest SM utilization known on its GPUs; `None`: none known.
    pub sm_pct: Option<u32>,
    /// Where it came from: `Unknown` when some GPU of it gives none.
    pub source: IdleSource,
}

impl Sample {
    /// Whether the sample is idle (`Some(true)`), busy (`Some(false)`: a busy GPU anywhere
    /// decides), or unknown.
    pub fn low(&self, util_below: u32) -> Option<bool> {
        match (self.sm_pct, self.source) {
            (Some(pct), _) if pct >= util_below => Some(false),
            (_, IdleSource::Unknown) | (None, _) => None,
            (Some(_), _) => Some(true),
        }
    }
}

/// A process's window: its current idle spell (if any), kept across samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    pub pid: u32,
    pub start_ticks: u64,
    /// When the spell began (ms since the epoch); `None`: not in one.
    pub since_ms: Option<u64>,
    /// Of the spell, how long was covered by known utilization.
    pub measured_ms: u64,
    /// The last sample's time, memory and source.
    pub last_ms: u64,
    pub bytes: u64,
    pub source: IdleSource,
}

impl Window {
    fn identity(&self) -> Identity {
        Identity::new(self.pid, self.start_ticks)
    }
}

/// What one sample adds to the accounting of one process: memory held over the time since
/// its last sample, and whether that time was idle (measured under `util_below`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Accounted {
    pub identity: Identity,
    /// The time since its last sample.
    pub seconds: f64,
    pub byte_seconds: f64,
    pub idle: bool,
    /// Its SM utilization over that time, where measured (not unknown).
    pub sm_pct: Option<u32>,
}

/// The most windows kept (the state file is bounded by it): a host runs far fewer GPU
/// processes; past it, new processes get no window until old ones leave.
pub const MAX_WINDOWS: usize = 16384;

/// Time between two samples longer than this is not accounted (the watchdog was down):
/// memory held while nobody looked is not counted as held.
pub const MAX_ACCOUNTED_GAP_MS: u64 = 5 * 60 * 1000;

/// Every process's window.
#[derive(Debug, Default, Clone)]
pub struct IdleTracker {
    windows: PidMap<Identity, Window>,
    /// Counts the passes in which a window came or went, or a spell began or ended: a
    /// keeper of the windows writes them again when it moved (see [`IdleTracker::spell_changes`]).
    spell_changes: u64,
}

impl IdleTracker {
    /// Windows as kept in the state file (a restart): at most [`MAX_WINDOWS`].
    pub fn from_windows(windows: impl IntoIterator<Item = Window>) -> IdleTracker {
        IdleTracker {
            windows: windows
                .into_iter()
                .take(MAX_WINDOWS)
                .map(|w| (w.identity(), w))
                .collect(),
            spell_changes: 0,
        }
    }

    /// Grows whenever a window came or went or a spell began or ended: what was kept of the
    /// windows is out of date when this is not what it was then. Cheaper than comparing
    /// every window each pass.
    pub fn spell_changes(&self) -> u64 {
        self.spell_changes
    }

    /// The windows, to be kept in the state file.
    pub fn windows(&self) -> Vec<Window> {
        let mut all: Vec<Window> = self.windows.values().copied().collect();
        all.sort_unstable_by_key(|w| (w.pid, w.start_ticks));
        all
    }

    /// Moves every window on to the samples taken at `now_ms`, and returns what each
    /// sample adds to the accounting. `covers_ms`: how far back a sample's utilization
    /// reaches (the window it was read over): time between two samples beyond it (the
    /// watchdog was down) is not measured. `complete`: the read listed every GPU, so a
    /// process not sampled is gone and its window is dropped (a pid reused by a new process
    /// is another identity, with a window of its own).
    pub fn observe(
        &mut self,
        samples: &[Sample],
        criteria: &IdleCriteria,
        (now_ms, covers_ms): (u64, u64),
        complete: bool,
    ) -> Vec<Accounted> {
        let mut accounted = Vec::with_capacity(samples.len());
        let mut moved = false;
        let mut seen: PidMap<Identity, ()> =
            PidMap::with_capacity_and_hasher(samples.len(), Default::default());
        for sample in samples {
            seen.insert(sample.identity, ());
            let low = sample.low(criteria.util_below);
            let previous = self.windows.get(&sample.identity).copied();
            if previous.is_none() && self.windows.len() >= MAX_WINDOWS {
                continue;
            }
            let gap = previous.map(|w| now_ms.saturating_sub(w.last_ms));
            if let Some(gap) = gap.filter(|gap| *gap <= MAX_ACCOUNTED_GAP_MS) {
                accounted.push(Accounted {
                    identity: sample.identity,
                    seconds: gap as f64 / 1000.0,
                    byte_seconds: sample.bytes as f64 * gap as f64 / 1000.0,
                    idle: low == Some(true),
                    sm_pct: sample.sm_pct.filter(|_| low.is_some()),
                });
            }
            let candidate = sample.bytes >= criteria.min_memory && low != Some(false);
            let since_ms = match (candidate, previous.and_then(|w| w.since_ms)) {
                (false, _) => None,
                (true, Some(since)) => Some(since),
                (true, None) => Some(now_ms),
            };
            let measured_ms = match (since_ms, previous) {
                (Some(since), Some(w)) if w.since_ms == Some(since) => {
                    // What this sample covers: since the last one, within the spell.
                    let covered = now_ms.saturating_sub(w.last_ms.max(since)).min(covers_ms);
                    w.measured_ms + if low.is_some() { covered } else { 0 }
                }
                _ => 0,
            };
            moved |= previous.map(|w| w.since_ms) != Some(since_ms);
            self.windows.insert(
                sample.identity,
                Window {
                    pid: sample.identity.pid,
                    start_ticks: sample.identity.start_ticks,
                    since_ms,
                    measured_ms,
                    last_ms: now_ms,
                    bytes: sample.bytes,
                    source: sample.source,
                },
            );
        }
        if complete {
            let before = self.windows.len();
            self.windows.retain(|id, _| seen.contains_key(id));
            moved |= self.windows.len() != before;
        }
        self.spell_changes += u64::from(moved);
        accounted
    }

    /// The processes idle at `now_ms` (their spell lasted `after`, at least half of it
    /// measured: a window of unknown utilization shows nothing idle), with what the finding
    /// says of each.
    pub fn idle(&self, criteria: &IdleCriteria, now_ms: u64) -> PidMap<Identity, IdleFacts> {
        self.windows
            .iter()
            .filter_map(|(id, w)| Some((*id, facts_of(w, criteria, now_ms)?)))
            .collect()
    }
}

fn facts_of(window: &Window, criteria: &IdleCriteria, now_ms: u64) -> Option<IdleFacts> {
    let since = window.since_ms?;
    let lasted = now_ms.saturating_sub(since);
    if lasted == 0 || u128::from(lasted) < criteria.after.as_millis() {
        return None;
    }
    let measured_pct = (window.measured_ms.min(lasted) * 100 / lasted) as u32;
    if measured_pct < 50 {
        return None;
    }
    Some(IdleFacts {
        idle_since: since / 1000,
        idle_seconds: lasted / 1000,
        memory_bytes: window.bytes,
        measured_pct,
        utilization: window.source,
    })
}

/// Each confirmed process's sample from `snapshot`: its memory over its GPUs, and its
/// highest SM utilization, from the driver's per-process samples; where a GPU gives none,
/// the GPU's utilization when the process is its only holder, else unknown.
pub fn samples(snapshot: &Snapshot) -> Vec<Sample> {
    let most = snapshot.most_listed();
    let mut at: PidMap<Identity, usize> =
        PidMap::with_capacity_and_hasher(most, Default::default());
    let mut out: Vec<Sample> = Vec::with_capacity(most);
    for gpu in &snapshot.devices {
        let holders = gpu.processes.len();
        for process in &gpu.processes {
            let Some(ticks) = process.host.start_ticks else {
                continue;
            };
            let identity = Identity::new(process.pid, ticks);
            let (sm_pct, source) = match (process.sm_util_pct, gpu.utilization) {
                (Some(pct), _) => (Some(pct), IdleSource::Process),
                (None, Some(util)) if holders == 1 => (Some(util.gpu_pct), IdleSource::Device),
                (None, _) => (None, IdleSource::Unknown),
            };
            let index = *at.entry(identity).or_insert_with(|| {
                out.push(Sample {
                    identity,
                    bytes: 0,
                    sm_pct: None,
                    source,
                });
                out.len() - 1
            });
            let entry = &mut out[index];
            entry.bytes += process.used_bytes.unwrap_or(0);
            entry.sm_pct = entry.sm_pct.max(sm_pct);
            // Unknown on one GPU makes it unknown; the device's reading beats the process's.
            entry.source = match (entry.source, source) {
                (IdleSource::Unknown, _) | (_, IdleSource::Unknown) => IdleSource::Unknown,
                (IdleSource::Device, _) | (_, IdleSource::Device) => IdleSource::Device,
                _ => IdleSource::Process,
            };
        }
    }
    out
}

/// `[idle] action = "reclaim"`: idle for `after` (`reclaim_after`), and neither an exempt
/// user's nor an exempt owner's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdleReclaim {
    pub after: Duration,
    pub exempt_users: Vec<String>,
    pub exempt_owners: Vec<OwnerMatch>,
}

impl IdleReclaim {
    /// With `[idle] action = "reclaim"`, which idle processes are ended; `None` otherwise.
    pub fn of(policy: &IdlePolicy) -> Option<IdleReclaim> {
        (policy.action == IdleAction::Reclaim).then(|| IdleReclaim {
            after: policy.reclaim_after,
            exempt_users: policy.exempt_users.clone(),
            // Checked when the file was read.
            exempt_owners: policy
                .exempt_owners
                .iter()
                .filter_map(|owner| owner.parse().ok())
                .collect(),
        })
    }

    /// Why `process` is exempt, if it is.
    pub fn exempt(&self, process: &GpuProcess) -> Option<String> {
        let host = &process.host;
        if let Some(user) = host
            .user
            .as_deref()
            .filter(|user| self.exempt_users.iter().any(|u| u == user))
        {
            return Some(format!("user {user} is exempt (idle.exempt_users)"));
        }
        let owner = host.owner.as_ref()?;
        self.exempt_owners
            .iter()
            .find(|wanted| wanted.matches(owner))
            .map(|wanted| format!("owner {wanted} is exempt (idle.exempt_owners)"))
    }
}

/// The rule: a process whose window says idle (history only the watchdog keeps). Reported;
/// with `[idle] action = "reclaim"`, reclaimed once idle for `reclaim_after` unless exempt.
pub(super) fn judge(facts: &Facts, held: &Held) -> Option<(Verdict, String)> {
    let idle = facts.history?.idle.get(&held.identity)?;
    let mut reason = reason(idle);
    let verdict = match &facts.policy.idle_reclaim {
        // Whole seconds: never before `reclaim_after`.
        Some(rule) if Duration::from_secs(idle.idle_seconds) >= rule.after => {
            match rule.exempt(held.process) {
                Some(why) => {
                    reason.push_str(&format!("; not ended: {why}"));
                    Verdict::Report
                }
                None => Verdict::Reclaim,
            }
        }
        _ => Verdict::Report,
    };
    Some((verdict, reason))
}

/// "idle for 3h12m: holds 40 GiB with SM under 1 % (...)".
pub fn reason(idle: &IdleFacts) -> String {
    format!(
        "idle for {}: holds {} with no SM activity to speak of ({}% of the window measured, \
         utilization {})",
        short_duration(idle.idle_seconds),
        units::bytes(idle.memory_bytes),
        idle.measured_pct,
        match idle.utilization {
            IdleSource::Process => "per process",
            IdleSource::Device => "of the GPU, its only holder",
            IdleSource::Unknown => "unknown at the last sample",
        }
    )
}

/// "3h12m", "45m", "20s": the way `info` shows how long.
pub fn short_duration(seconds: u64) -> String {
    let (h, m, s) = (seconds / 3600, seconds % 3600 / 60, seconds % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m"),
        _ => format!("{h}h{m:02}m"),
    }
}

#[cfg(test)]
mod tests;
