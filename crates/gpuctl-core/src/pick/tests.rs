use super::*;
use crate::fixtures::{gpu, memory, process};
use crate::health::{Cause, CauseKind, Verdict};
use crate::snapshot::{MigDevice, MigMemory, Utilization};

const GIB: u64 = 1 << 30;

fn idle(index: u32) -> GpuSnapshot {
    GpuSnapshot {
        uuid: Some(format!("GPU-{index}")),
        memory: Some(memory(80 * GIB, 10 << 20)),
        utilization: Some(Utilization {
            gpu_pct: 0,
            memory_pct: 0,
        }),
        health: Some(Verdict {
            action: Action::None,
            causes: Vec::new(),
        }),
        ..gpu(index, Vec::new())
    }
}

fn unfit_of(snapshot: &Snapshot, criteria: &Criteria) -> Vec<Option<String>> {
    judge(snapshot, None, criteria)
        .into_iter()
        .map(|s| s.unfit)
        .collect()
}

#[test]
fn a_free_healthy_gpu_qualifies_and_a_busy_or_broken_one_does_not() {
    let busy = GpuSnapshot {
        memory: Some(memory(80 * GIB, 2 * GIB)),
        ..idle(1)
    };
    let mut busy = busy;
    busy.processes = vec![process(42).used_gib(2).build()];
    let broken = GpuSnapshot {
        health: Some(Verdict {
            action: Action::GpuReset,
            causes: vec![Cause::new(
                CauseKind::RowRemapPending,
                Action::GpuReset,
                "a row remap is pending".into(),
            )],
        }),
        ..idle(2)
    };
    let snapshot = Snapshot::of(vec![idle(0), busy, broken]);
    let unfit = unfit_of(&snapshot, &Criteria::default());
    assert_eq!(unfit[0], None);
    assert!(
        unfit[1].as_ref().unwrap().starts_with("busy: 1 process"),
        "{unfit:?}"
    );
    assert!(
        unfit[2].as_ref().unwrap().contains("needs a reset"),
        "{unfit:?}"
    );
}

#[test]
fn memory_in_use_without_a_process_is_not_free() {
    let snapshot = Snapshot::of(vec![GpuSnapshot {
        memory: Some(memory(80 * GIB, GIB)),
        ..idle(0)
    }]);
    assert_eq!(
        unfit_of(&snapshot, &Criteria::default())[0].as_deref(),
        Some("1.0 GiB in use")
    );
}

#[test]
fn min_free_and_max_util_replace_the_clear_rule() {
    let mut shared = GpuSnapshot {
        memory: Some(memory(80 * GIB, 20 * GIB)),
        utilization: Some(Utilization {
            gpu_pct: 30,
            memory_pct: 0,
        }),
        ..idle(0)
    };
    shared.processes = vec![process(42).used_gib(20).build()];
    let snapshot = Snapshot::of(vec![shared]);
    let roomy = Criteria {
        min_free: Some(Amount::Bytes(40 * GIB)),
        max_util: None,
    };
    assert_eq!(unfit_of(&snapshot, &roomy)[0], None);
    let tight = Criteria {
        min_free: Some(Amount::Bytes(70 * GIB)),
        max_util: None,
    };
    assert_eq!(
        unfit_of(&snapshot, &tight)[0].as_deref(),
        Some("only 60.0 GiB free")
    );
    let quiet = Criteria {
        min_free: None,
        max_util: Some(20),
    };
    assert_eq!(
        unfit_of(&snapshot, &quiet)[0].as_deref(),
        Some("30 % utilized")
    );
    let calm = Criteria {
        min_free: None,
        max_util: Some(50),
    };
    assert_eq!(unfit_of(&snapshot, &calm)[0], None);
}

#[test]
fn a_split_gpu_offers_each_instance_by_its_mig_uuid() {
    let instance = |gi: u32, used: u64| MigDevice {
        uuid: Some(format!("MIG-{gi}")),
        gpu_instance_id: Some(gi),
        compute_instance_id: Some(0),
        profile: Some("3g.40gb".into()),
        memory: Some(MigMemory {
            total_bytes: 40 * GIB,
            used_bytes: used,
            unattributed_bytes: Some(0),
        }),
        processes: Vec::new(),
    };
    let split = GpuSnapshot {
        mig_enabled: Some(true),
        mig_devices: vec![instance(1, 10 << 20), instance(2, 5 * GIB)],
        ..idle(0)
    };
    let spots = judge(&Snapshot::of(vec![split]), None, &Criteria::default());
    assert_eq!(spots.len(), 2);
    assert_eq!(spots[0].uuid.as_deref(), Some("MIG-1"));
    assert_eq!(spots[0].name(), "0/1");
    assert!(spots[0].fit());
    assert!(!spots[1].fit());
}

#[test]
fn what_is_missing_names_each_place_and_its_holder() {
    let spots = vec![
        Spot {
            place: Place::whole(0),
            uuid: Some("GPU-0".into()),
            total_bytes: None,
            unfit: None,
        },
        Spot {
            place: Place::whole(1),
            uuid: Some("GPU-1".into()),
            total_bytes: None,
            unfit: Some("busy: 1 process (2.0 GiB in use)".into()),
        },
    ];
    let line = missing(
        &spots,
        1,
        &[("GPU-0".into(), "bob (pid 7: gpuctl run -- sleep 9)".into())],
        &[],
    );
    assert_eq!(
        line,
        "1 GPU wanted, 0 free and healthy; GPU 0: leased by bob (pid 7: gpuctl run -- sleep \
         9); GPU 1: busy: 1 process (2.0 GiB in use)"
    );
}
