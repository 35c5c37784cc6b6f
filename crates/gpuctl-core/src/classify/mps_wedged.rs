//! A wedged MPS server: `nvidia-cuda-mps-server` alive with no client left, holding more
//! than its own context's overhead (the memory of clients it failed to release). Nothing a
//! signal should fix: ending the server is MPS's own business, so it is reported with the
//! remedy, never reclaimed.

use super::{Facts, Held, Verdict};
use crate::mps::Role;

/// What a server holds of its own with no client: its shared context (tens to a few
/// hundred MiB on the GPUs of the day). More than this with no client is left behind.
pub const SERVER_OVERHEAD_BYTES: u64 = 1 << 30;

pub(super) fn judge(facts: &Facts, held: &Held) -> Option<(Verdict, String)> {
    if held.process.mps != Some(Role::Server) {
        return None;
    }
    let bytes = held.bytes?;
    let has_client = facts
        .snapshot
        .devices
        .iter()
        .filter(|gpu| held.gpus.contains(&gpu.index))
        .flat_map(|gpu| &gpu.processes)
        .any(|p| p.mps == Some(Role::Client));
    if has_client || bytes <= SERVER_OVERHEAD_BYTES {
        return None;
    }
    Some((
        Verdict::Report,
        format!(
            "MPS server with no client left holds {}, more than its own {} of overhead: \
             wedged; stop MPS through its control daemon (echo quit | nvidia-cuda-mps-control, \
             with its CUDA_MPS_PIPE_DIRECTORY) or restart the service that runs it",
            crate::units::bytes(bytes),
            crate::units::bytes(SERVER_OVERHEAD_BYTES)
        ),
    ))
}

#[cfg(test)]
mod tests {
    use crate::classify::{Kind, Policy, Remedy, Verdict, classify};
    use crate::fixtures;
    use crate::mps::Role;
    use crate::snapshot::Snapshot;

    fn with_role(pid: u32, gib: u64, role: Option<Role>) -> crate::snapshot::GpuProcess {
        let mut process = fixtures::process(pid)
            .used_gib(gib)
            .confirmed()
            .state(crate::host::ProcState::Sleeping)
            .started(1000 + u64::from(pid))
            .build();
        process.mps = role;
        process
    }

    fn wedged(snapshot: &Snapshot) -> Vec<(Option<u32>, Verdict)> {
        classify(snapshot, &Default::default(), None, &Policy::default())
            .into_iter()
            .filter(|f| f.kind == Kind::MpsWedged)
            .map(|f| (f.identity.map(|i| i.pid), f.verdict))
            .collect()
    }

    #[test]
    fn a_server_with_no_client_holding_more_than_its_overhead_is_reported() {
        let alone = Snapshot::of(vec![fixtures::gpu(
            0,
            vec![with_role(40, 6, Some(Role::Server))],
        )]);
        assert_eq!(wedged(&alone), [(Some(40), Verdict::Report)]);
        let finding = classify(&alone, &Default::default(), None, &Policy::default())
            .into_iter()
            .find(|f| f.kind == Kind::MpsWedged)
            .unwrap();
        assert!(
            finding
                .reason
                .contains("echo quit | nvidia-cuda-mps-control"),
            "{}",
            finding.reason
        );
        assert_eq!(Kind::MpsWedged.remedy(), Remedy::Report);
        assert_eq!(Kind::MpsWedged.reclaim_kind(), None);

        // Serving a client, or holding only its overhead: not wedged.
        let serving = Snapshot::of(vec![fixtures::gpu(
            0,
            vec![
                with_role(40, 6, Some(Role::Server)),
                with_role(41, 2, Some(Role::Client)),
            ],
        )]);
        assert!(wedged(&serving).is_empty());
        let idle = Snapshot::of(vec![fixtures::gpu(
            0,
            vec![with_role(40, 1, Some(Role::Server))],
        )]);
        assert!(wedged(&idle).is_empty());
        // A client on another GPU is not this server's.
        let elsewhere = Snapshot::of(vec![
            fixtures::gpu(0, vec![with_role(40, 6, Some(Role::Server))]),
            fixtures::gpu(1, vec![with_role(41, 2, Some(Role::Client))]),
        ]);
        assert_eq!(wedged(&elsewhere), [(Some(40), Verdict::Report)]);
        // Not a server at all.
        let plain = Snapshot::of(vec![fixtures::gpu(0, vec![with_role(40, 6, None)])]);
        assert!(wedged(&plain).is_empty());
    }
}
