//! Above its share: a process holding more of a GPU than the `[fraction]` policy in force
//! for it (by GPU, user or default) allows.

use super::{Facts, Held, Verdict};
use crate::config;
use crate::units::bytes;

/// The first of its GPUs on which it holds more than its share, said as a sentence.
pub(super) fn judge(facts: &Facts, h: &Held) -> Option<(Verdict, String)> {
    let loaded = facts.policy.fraction.as_deref()?;
    for gpu in &facts.snapshot.devices {
        let Some(memory) = gpu.memory else { continue };
        let Some(process) = gpu.processes.iter().find(|p| p.pid == h.process.pid) else {
            continue;
        };
        let Some(used) = process.used_bytes else {
            continue;
        };
        let user = process.host.user.as_deref();
        // In a MIG instance the share is of the instance's memory: its MIG UUID's entry
        // first, else what applies to the GPU (index, user, default).
        let instance = process.gpu_instance_id.and_then(|gi| {
            gpu.mig_devices
                .iter()
                .find(|m| m.gpu_instance_id == Some(gi) && m.memory.is_some())
        });
        let (total, share, place) = match instance {
            Some(mig) => {
                let share = config::fraction_for(loaded, gpu.index, mig.uuid.as_deref(), user)
                    .or_else(|| config::fraction_for(loaded, gpu.index, gpu.uuid.as_deref(), user));
                let place = format!(
                    "MIG instance {}/{} ({})",
                    gpu.index,
                    mig.gpu_instance_id.unwrap_or_default(),
                    mig.profile.as_deref().unwrap_or("?")
                );
                (mig.memory.map_or(0, |m| m.total_bytes), share, place)
            }
            None => (
                memory.total_bytes,
                config::fraction_for(loaded, gpu.index, gpu.uuid.as_deref(), user),
                format!("GPU {}", gpu.index),
            ),
        };
        let Some(share) = share else {
            continue;
        };
        let limit = (total as f64 * share.value) as u64;
        if used > limit {
            return Some((
                Verdict::Reclaim,
                format!(
                    "holds {} on {place}, above its share {} ({}, set by {})",
                    bytes(used),
                    share.value,
                    bytes(limit),
                    share.describe()
                ),
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::classify::{Kind, Policy, Verdict, classify};
    use crate::config::{self, Loaded, Source};
    use crate::fixtures;
    use crate::snapshot::{GpuProcess, GpuSnapshot, Snapshot};

    fn holding(pid: u32, user: &str, gib: u64) -> GpuProcess {
        fixtures::process(pid)
            .used_gib(gib)
            .sm_pct(50)
            .confirmed()
            .user(user)
            .state(crate::host::ProcState::Sleeping)
            .started(1000 + u64::from(pid))
            .build()
    }

    fn policy(text: &str) -> Policy {
        let path = std::path::Path::new("/etc/gpuctl/gpuctl.toml");
        let loaded = Loaded {
            system: Some((
                Source::new(config::Origin::System, path),
                config::parse(text, path).unwrap(),
            )),
            user: None,
        };
        Policy {
            fraction: Some(Arc::new(loaded)),
            ..Policy::default()
        }
    }

    fn findings(policy: &Policy) -> Vec<(u32, Kind, Verdict, String)> {
        let snapshot = Snapshot::of(vec![GpuSnapshot {
            memory: Some(fixtures::memory(80 << 30, 70 << 30)),
            processes: vec![holding(10, "alice", 50), holding(11, "bob", 20)],
            ..GpuSnapshot::unread(0)
        }]);
        classify(&snapshot, &Default::default(), None, policy)
            .into_iter()
            .map(|f| (f.identity.unwrap().pid, f.kind, f.verdict, f.reason))
            .collect()
    }

    #[test]
    fn a_process_above_its_share_is_found_with_the_key_that_set_it() {
        let found = findings(&policy("[fraction]\ndefault = 0.5\n"));
        assert_eq!(found.len(), 1, "{found:?}");
        let (pid, kind, verdict, reason) = &found[0];
        assert_eq!(
            (*pid, *kind, *verdict),
            (10, Kind::AboveFraction, Verdict::Reclaim)
        );
        assert_eq!(
            reason,
            "holds 50.0 GiB on GPU 0, above its share 0.5 (40.0 GiB, set by system \
             /etc/gpuctl/gpuctl.toml: fraction.default)"
        );
    }

    #[test]
    fn a_user_entry_beats_the_default_and_no_policy_finds_nothing() {
        let found = findings(&policy("[fraction]\ndefault = 0.9\nuser.bob = 0.2\n"));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, 11);
        assert!(found[0].3.contains("fraction.user.bob"), "{found:?}");
        assert!(findings(&Policy::default()).is_empty());
    }

    /// On a MIG GPU the share is of the instance's memory; the instance's MIG UUID entry
    /// beats the GPU's.
    #[test]
    fn in_a_mig_instance_the_share_is_of_the_instance() {
        use crate::snapshot::{MigDevice, MigMemory};
        let in_instance = |pid: u32, gib: u64, gi: u32| GpuProcess {
            gpu_instance_id: Some(gi),
            compute_instance_id: Some(0),
            mps: None,
            ..holding(pid, "alice", gib)
        };
        let mig = |gi: u32, uuid: &str, total_gib: u64, processes: Vec<GpuProcess>| MigDevice {
            uuid: Some(uuid.into()),
            gpu_instance_id: Some(gi),
            compute_instance_id: Some(0),
            profile: Some("3g.40gb".into()),
            memory: Some(MigMemory {
                total_bytes: total_gib << 30,
                used_bytes: 0,
                unattributed_bytes: None,
            }),
            processes,
        };
        let (a, b) = (in_instance(10, 25, 1), in_instance(11, 15, 2));
        let snapshot = Snapshot::of(vec![GpuSnapshot {
            memory: Some(fixtures::memory(80 << 30, 40 << 30)),
            processes: vec![a.clone(), b.clone()],
            mig_devices: vec![
                mig(1, "MIG-aaaa", 40, vec![a]),
                mig(2, "MIG-bbbb", 40, vec![b]),
            ],
            mig_enabled: Some(true),
            ..GpuSnapshot::unread(0)
        }]);
        let run = |text: &str| -> Vec<(u32, String)> {
            classify(&snapshot, &Default::default(), None, &policy(text))
                .into_iter()
                .filter(|f| f.kind == Kind::AboveFraction)
                .map(|f| (f.identity.unwrap().pid, f.reason))
                .collect()
        };
        // 0.5 of a 40 GiB instance is 20 GiB: 25 GiB is above it, 15 GiB is not (0.5 of
        // the whole 80 GiB card would have let both be).
        let found = run("[fraction]\ndefault = 0.5\n");
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, 10);
        assert!(
            found[0].1.contains("on MIG instance 0/1 (3g.40gb)"),
            "{found:?}"
        );
        assert!(found[0].1.contains("20.0 GiB"), "{found:?}");
        // The instance's own entry beats the default.
        let found = run("[fraction]\ndefault = 0.9\ngpu.\"MIG-bbbb\" = 0.25\n");
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, 11);
        assert!(found[0].1.contains("fraction.gpu.MIG-bbbb"), "{found:?}");
    }
}
