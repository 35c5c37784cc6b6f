//! A GPU that looks busy and does nothing: utilization pinned high while the power draw
//! stays low and the memory does not move, for long. That is what a job hung in a
//! collective (an NCCL all-reduce waiting for a peer that died) looks like: its kernels spin
//! at 100 % until the wall time runs out. Reported, never acted on: only a person can tell
//! a hang from a slow phase.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::{Facts, Finding, Kind, Verdict};
use crate::snapshot::totals::{By, group_of};
use crate::snapshot::{GpuSnapshot, Snapshot};
use crate::units;

/// The check's thresholds (`watchdog.stuck_after`, `stuck_util_pct`, `stuck_power_fraction`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StuckCriteria {
    /// How long a GPU must look stuck to be reported.
    pub after: Duration,
    /// Utilization at or above this (percent).
    pub util_pct: u32,
    /// Power draw at or below this fraction of the power limit.
    pub power_fraction: f64,
}

/// Used memory may move by this fraction of the total and still count as steady.
pub const MEMORY_STEADY: f64 = 0.01;

/// Whether `gpu` looks stuck in this one reading (memory aside, which needs two).
pub fn looks_stuck(gpu: &GpuSnapshot, criteria: &StuckCriteria) -> bool {
    let (Some(util), Some(power), Some(limit)) =
        (gpu.utilization, gpu.power_mw, gpu.power_limit_mw)
    else {
        return false;
    };
    limit > 0
        && util.gpu_pct >= criteria.util_pct
        && f64::from(power) <= criteria.power_fraction * f64::from(limit)
}

/// One GPU's spell of looking stuck: since when, and its used memory when it began.
#[derive(Debug, Clone, Copy)]
struct Spell {
    since: Instant,
    used_bytes: u64,
}

/// Each GPU's spell, kept across loops (the watchdog's history).
#[derive(Debug, Default)]
pub struct StuckTracker {
    spells: HashMap<String, Spell>,
}

impl StuckTracker {
    /// Updates the spells from `snapshot` (a GPU that stops looking stuck, whose memory
    /// moves, or that is not read, starts over) and returns how long each GPU, by index,
    /// has looked stuck.
    pub fn observe(
        &mut self,
        snapshot: &Snapshot,
        criteria: &StuckCriteria,
        now: Instant,
    ) -> HashMap<u32, Duration> {
        let mut out = HashMap::new();
        let mut kept: HashMap<String, Spell> = HashMap::new();
        for gpu in &snapshot.devices {
            let (Some(uuid), Some(memory)) = (&gpu.uuid, gpu.memory) else {
                continue;
            };
            if !looks_stuck(gpu, criteria) {
                continue;
            }
            let steady_within = (MEMORY_STEADY * memory.total_bytes as f64) as u64;
            let spell = match self.spells.get(uuid) {
                Some(spell) if spell.used_bytes.abs_diff(memory.used_bytes) <= steady_within => {
                    *spell
                }
                _ => Spell {
                    since: now,
                    used_bytes: memory.used_bytes,
                },
            };
            out.insert(gpu.index, now.saturating_duration_since(spell.since));
            kept.insert(uuid.clone(), spell);
        }
        self.spells = kept;
        out
    }
}

/// The rule: a GPU that has looked stuck for `after` (history only the watchdog keeps).
pub(super) fn judge(facts: &Facts, gpu: &GpuSnapshot) -> Option<Finding> {
    let criteria = facts.policy.stuck.as_ref()?;
    let lasted = *facts.history?.stuck_for.get(&gpu.index)?;
    if lasted < criteria.after {
        return None;
    }
    Some(Finding {
        kind: Kind::Stuck,
        verdict: Verdict::Report,
        identity: None,
        gpus: vec![gpu.index],
        // The steady memory is in the reason; the finding holds none of its own.
        bytes: None,
        reason: reason(gpu, lasted),
        idle: None,
    })
}

fn reason(gpu: &GpuSnapshot, lasted: Duration) -> String {
    let util = gpu.utilization.map_or(0, |u| u.gpu_pct);
    let power = gpu.power_mw.unwrap_or(0);
    let limit = gpu.power_limit_mw.unwrap_or(0).max(1);
    let used = gpu.memory.map_or(0, |m| m.used_bytes);
    let processes: Vec<String> = gpu
        .processes
        .iter()
        .map(|p| {
            let user = group_of(&p.host, By::User);
            match group_of(&p.host, By::Owner).as_str() {
                "?" | "(no owner)" => format!("pid {} ({user})", p.pid),
                owner => format!("pid {} ({user}, {owner})", p.pid),
            }
        })
        .collect();
    format!(
        "stuck for {}: {util}% utilization at {:.0}% of its power limit ({} of {} W) with \
         memory steady at {}, as a job hung in a collective looks; {}",
        humantime::format_duration(Duration::from_secs(lasted.as_secs())),
        f64::from(power) * 100.0 / f64::from(limit),
        power / 1000,
        limit / 1000,
        units::bytes(used),
        if processes.is_empty() {
            "no process listed".to_string()
        } else {
            format!("processes: {}", processes.join(", "))
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::{History, Policy, classify};
    use crate::fixtures;
    use crate::snapshot::Utilization;

    const CRITERIA: StuckCriteria = StuckCriteria {
        after: Duration::from_secs(600),
        util_pct: 95,
        power_fraction: 0.4,
    };

    fn gpu(util: u32, power_w: u32, used_gib: u64) -> GpuSnapshot {
        GpuSnapshot {
            uuid: Some("GPU-1".into()),
            memory: Some(fixtures::memory(100 << 30, used_gib << 30)),
            utilization: Some(Utilization {
                gpu_pct: util,
                memory_pct: 0,
            }),
            power_mw: Some(power_w * 1000),
            power_limit_mw: Some(700_000),
            ..GpuSnapshot::unread(3)
        }
    }

    #[test]
    fn busy_at_low_power_is_stuck_looking_and_anything_else_is_not() {
        assert!(looks_stuck(&gpu(100, 150, 40), &CRITERIA));
        assert!(
            looks_stuck(&gpu(95, 280, 40), &CRITERIA),
            "both bounds are inclusive"
        );
        assert!(
            !looks_stuck(&gpu(94, 150, 40), &CRITERIA),
            "not busy enough"
        );
        assert!(
            !looks_stuck(&gpu(100, 281, 40), &CRITERIA),
            "drawing real power"
        );
        let mut unknown = gpu(100, 150, 40);
        unknown.power_mw = None;
        assert!(
            !looks_stuck(&unknown, &CRITERIA),
            "no power reading: no verdict"
        );
    }

    #[test]
    fn a_spell_lasts_while_memory_is_steady_and_restarts_when_anything_moves() {
        let mut tracker = StuckTracker::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let lasted = |tracker: &mut StuckTracker, g: GpuSnapshot, s: u64| {
            tracker
                .observe(&Snapshot::of(vec![g]), &CRITERIA, at(s))
                .get(&3)
                .copied()
        };
        assert_eq!(
            lasted(&mut tracker, gpu(100, 150, 40), 0),
            Some(Duration::ZERO)
        );
        // Memory moves by under 1% of the total (1 GiB of 100): still the same spell.
        assert_eq!(
            lasted(&mut tracker, gpu(100, 150, 40), 300),
            Some(Duration::from_secs(300))
        );
        assert_eq!(
            lasted(&mut tracker, gpu(99, 140, 40), 700),
            Some(Duration::from_secs(700))
        );
        // Memory moves by 2 GiB: the job is doing something; the spell starts over.
        assert_eq!(
            lasted(&mut tracker, gpu(100, 150, 42), 800),
            Some(Duration::ZERO)
        );
        // Power rises: not stuck; then stuck-looking again from scratch.
        assert_eq!(lasted(&mut tracker, gpu(100, 600, 42), 900), None);
        assert_eq!(
            lasted(&mut tracker, gpu(100, 150, 42), 950),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn reported_once_it_lasted_stuck_after_never_reclaimed() {
        let snapshot = Snapshot::of(vec![gpu(100, 150, 40)]);
        let policy = Policy {
            stuck: Some(CRITERIA),
            ..Policy::default()
        };
        let history = |secs: u64| History {
            stuck_for: [(3, Duration::from_secs(secs))].into_iter().collect(),
            ..History::default()
        };
        let lineages = Default::default();
        let early = classify(&snapshot, &lineages, Some(&history(599)), &policy);
        assert!(early.iter().all(|f| f.kind != Kind::Stuck), "{early:?}");
        let due = classify(&snapshot, &lineages, Some(&history(600)), &policy);
        let stuck: Vec<&Finding> = due.iter().filter(|f| f.kind == Kind::Stuck).collect();
        assert_eq!(stuck.len(), 1, "{due:?}");
        assert_eq!(stuck[0].verdict, Verdict::Report);
        assert_eq!(Kind::Stuck.remedy(), crate::classify::Remedy::Report);
        assert!(
            stuck[0]
                .reason
                .starts_with("stuck for 10m: 100% utilization at 21%"),
            "{}",
            stuck[0].reason
        );
        // The CLI keeps no history: never stuck.
        let none = classify(&snapshot, &lineages, None, &policy);
        assert!(none.iter().all(|f| f.kind != Kind::Stuck));
    }
}
