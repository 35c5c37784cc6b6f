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
    })
}
