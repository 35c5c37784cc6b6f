//! Memory in use that no listed process accounts for.

use super::{Facts, Finding, Kind, Verdict};
use crate::snapshot::GpuSnapshot;

pub(super) fn judge(facts: &Facts, gpu: &GpuSnapshot) -> Option<Finding> {
    let bytes = gpu.memory?.unattributed_bytes?;
    (bytes >= facts.policy.unattributed_min_bytes).then(|| Finding {
        kind: Kind::Unattributed,
        verdict: Verdict::Report,
        identity: None,
        gpus: vec![gpu.index],
        bytes: Some(bytes),
        reason: "in use but held by no listed process: a context the driver has not released \
                 yet, or a process in another PID namespace; if it stays with no processes \
                 on the GPU, reset the GPU"
            .into(),
        idle: None,
    })
}

#[cfg(test)]
mod tests {
    use crate::classify::{Kind, Policy, Verdict, classify};
    use crate::fixtures;
    use crate::snapshot::{GpuSnapshot, Memory, Snapshot};

    fn gpu(index: u32, unattributed_mib: Option<u64>) -> GpuSnapshot {
        GpuSnapshot {
            memory: Some(Memory {
                unattributed_bytes: unattributed_mib.map(|mib| mib << 20),
                ..fixtures::memory(80 << 30, 4 << 30)
            }),
            ..GpuSnapshot::unread(index)
        }
    }

    #[test]
    fn memory_no_process_holds_is_reported_above_the_noise_floor_only() {
        let snapshot = Snapshot::of(vec![gpu(0, Some(4096)), gpu(1, Some(255)), gpu(2, None)]);
        let findings = classify(&snapshot, &Default::default(), None, &Policy::default());
        assert_eq!(findings.len(), 1, "{findings:?}");
        let finding = &findings[0];
        assert_eq!(
            (finding.kind, finding.verdict, finding.identity),
            (Kind::Unattributed, Verdict::Report, None)
        );
        assert_eq!(
            (finding.gpus.as_slice(), finding.bytes),
            (&[0][..], Some(4 << 30))
        );
        assert_eq!(Kind::Unattributed.remedy(), crate::classify::Remedy::Report);
    }
}
