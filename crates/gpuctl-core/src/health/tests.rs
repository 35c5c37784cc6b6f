//! The verdict, cause by cause, and how it clears itself.

use std::collections::BTreeMap;

use super::*;

fn judge(facts: &Facts) -> Verdict {
    verdict(facts, &Catalog::default())
}

fn kinds(v: &Verdict) -> Vec<(CauseKind, Action)> {
    v.causes.iter().map(|c| (c.kind, c.action)).collect()
}

fn xid(xid: u32, at_unix: u64) -> XidRecord {
    XidRecord {
        xid,
        at_unix,
        ..XidRecord::default()
    }
}

fn under_job(mut record: XidRecord, pid: u32, job: &str) -> XidRecord {
    record.processes.push(XidProcess {
        pid,
        start_ticks: Some(1000),
        user: Some("alice".into()),
        owner: Some(format!("slurm:{job}").parse().unwrap()),
        command: Some("python3 train.py".into()),
    });
    record
}

#[test]
fn a_healthy_gpu_needs_nothing_and_lists_nothing() {
    let facts = Facts {
        recovery_action: Some(Action::None),
        remapped_rows: Some(RemappedRows {
            correctable: 2,
            ..RemappedRows::default()
        }),
        ecc: Some(EccCounts {
            volatile_corrected: 5,
            aggregate_corrected: 9,
            aggregate_uncorrected: 1,
            ..EccCounts::default()
        }),
        retired_pages: Some(RetiredPages::default()),
        clock_event_reasons: Some(0x1),
        ..Facts::default()
    };
    let v = judge(&facts);
    assert_eq!(v.action, Action::None);
    assert!(v.causes.is_empty(), "{v:?}");
    assert_eq!(v.summary(), None);
    assert_eq!(judge(&Facts::default()), v);
}

#[test]
fn a_lost_gpu_needs_a_node_reboot() {
    let v = Verdict::lost();
    assert_eq!(v.action, Action::NodeReboot);
    assert_eq!(kinds(&v), [(CauseKind::Lost, Action::NodeReboot)]);
    assert_eq!(
        v.summary().as_deref(),
        Some("needs a node reboot: GPU lost")
    );
}

#[test]
fn the_drivers_recovery_action_counts_as_it_reads() {
    for action in [
        Action::GpuReset,
        Action::NodeReboot,
        Action::DrainP2p,
        Action::DrainAndReset,
    ] {
        let v = judge(&Facts {
            recovery_action: Some(action),
            ..Facts::default()
        });
        assert_eq!(v.action, action);
        assert_eq!(kinds(&v), [(CauseKind::RecoveryAction, action)]);
    }
}

#[test]
fn row_remaps_ecc_and_retired_pages_pending_need_a_reset() {
    let v = judge(&Facts {
        remapped_rows: Some(RemappedRows {
            correctable: 3,
            uncorrectable: 1,
            pending: true,
            failure: false,
        }),
        ..Facts::default()
    });
    assert_eq!(v.action, Action::GpuReset);
    assert_eq!(kinds(&v), [(CauseKind::RowRemapPending, Action::GpuReset)]);
    assert_eq!(v.causes[0].count, Some(4));

    let v = judge(&Facts {
        remapped_rows: Some(RemappedRows {
            failure: true,
            ..RemappedRows::default()
        }),
        ..Facts::default()
    });
    assert_eq!(kinds(&v), [(CauseKind::RowRemapFailure, Action::GpuReset)]);
    assert!(v.causes[0].rma);
    assert!(
        v.causes[0].message.contains("RMA"),
        "{}",
        v.causes[0].message
    );

    let v = judge(&Facts {
        ecc: Some(EccCounts {
            volatile_uncorrected: 2,
            aggregate_uncorrected: 2,
            ..EccCounts::default()
        }),
        ..Facts::default()
    });
    assert_eq!(
        kinds(&v),
        [(CauseKind::EccUncorrectedVolatile, Action::GpuReset)]
    );
    assert_eq!(
        v.causes[0].message,
        "2 uncorrected ECC errors since the last reset"
    );

    let v = judge(&Facts {
        retired_pages: Some(RetiredPages {
            double_bit: 1,
            pending: true,
            ..RetiredPages::default()
        }),
        ..Facts::default()
    });
    assert_eq!(
        kinds(&v),
        [(CauseKind::RetiredPagesPending, Action::GpuReset)]
    );
}

#[test]
fn a_hardware_slowdown_is_a_warning_without_an_action() {
    let v = judge(&Facts {
        // Idle (0x1) is no slowdown; hw_slowdown (0x8) and hw_thermal (0x40) are.
        clock_event_reasons: Some(0x1 | 0x8 | 0x40),
        ..Facts::default()
    });
    assert_eq!(v.action, Action::None);
    assert_eq!(kinds(&v), [(CauseKind::ClockEvent, Action::None)]);
    assert_eq!(v.causes[0].reasons, ["hw_slowdown", "hw_thermal_slowdown"]);
}

#[test]
fn the_gpus_action_is_the_most_severe_of_its_causes() {
    let v = judge(&Facts {
        recovery_action: Some(Action::DrainP2p),
        remapped_rows: Some(RemappedRows {
            pending: true,
            ..RemappedRows::default()
        }),
        xids: vec![xid(79, 5)],
        ..Facts::default()
    });
    // Xid 79 is history under a driver with the field; the field and the remap count.
    assert_eq!(v.action, Action::GpuReset);
    let v = judge(&Facts {
        lost: true,
        recovery_action: Some(Action::GpuReset),
        ..Facts::default()
    });
    assert_eq!(v.action, Action::NodeReboot);
}

#[test]
fn without_the_field_an_xid_holds_its_catalog_action() {
    let v = judge(&Facts {
        xids: vec![under_job(xid(64, 100), 4242, "812")],
        ..Facts::default()
    });
    assert_eq!(v.action, Action::GpuReset);
    let cause = &v.causes[0];
    assert_eq!(cause.kind, CauseKind::Xid);
    assert_eq!(cause.xid, Some(64));
    assert_eq!(
        cause.meaning.as_deref(),
        Some("ECC page retirement or row remapper recording failure")
    );
    assert_eq!(cause.at_unix, Some(100));
    assert_eq!(cause.processes[0].pid, 4242);
    assert_eq!(cause.history, None);
    assert_eq!(
        v.summary().as_deref(),
        Some("needs a reset: Xid 64 under job 812")
    );
    let v = judge(&Facts {
        xids: vec![xid(79, 1)],
        ..Facts::default()
    });
    assert_eq!(v.action, Action::NodeReboot);
}

/// A job only the environment names is a claim of its process's user: a verdict does not
/// know the job's user, so such a claim names no job in the summary (a drain reason, info's
/// health line), whoever made it.
#[test]
fn an_environment_claim_names_no_job_in_the_summary() {
    let claimed = under_job(xid(64, 100), 4242, "812@1001");
    let both = under_job(claimed.clone(), 4243, "813");
    let v = judge(&Facts {
        xids: vec![claimed],
        ..Facts::default()
    });
    assert_eq!(v.summary().as_deref(), Some("needs a reset: Xid 64"));
    let v = judge(&Facts {
        xids: vec![both],
        ..Facts::default()
    });
    assert_eq!(
        v.summary().as_deref(),
        Some("needs a reset: Xid 64 under job 813")
    );
}

#[test]
fn a_process_in_a_cause_reads_as_what_is_known_of_it() {
    let record = under_job(xid(13, 1), 4242, "812@1000");
    assert_eq!(
        record.processes[0].to_string(),
        "pid 4242 (alice, slurm:812@1000, python3 train.py)"
    );
    assert_eq!(
        XidProcess {
            pid: 7,
            ..XidProcess::default()
        }
        .to_string(),
        "pid 7"
    );
    let p = &record.processes[0];
    assert!(p.is_of_job(812, Some(1000)));
    assert!(!p.is_of_job(812, Some(1001)));
    assert!(!p.is_of_job(812, None));
    assert!(!p.is_of_job(813, Some(1000)));
    let cgroup = &under_job(xid(13, 1), 1, "812").processes[0];
    assert!(cgroup.is_of_job(812, None) && !cgroup.is_of_job(8120, None));
}

/// The Xid log as older versions wrote it reads back; an owner that is not one is dropped,
/// not the log.
#[test]
fn xid_records_read_their_owners_back_and_survive_a_bad_one() {
    let json = r#"{"xid": 13, "at_unix": 5, "processes": [
        {"pid": 1, "owner": "slurm:812"}, {"pid": 2, "owner": "slurm:812@1000"},
        {"pid": 3, "owner": "bogus"}, {"pid": 4, "owner": 7}, {"pid": 5}]}"#;
    let record: XidRecord = serde_json::from_str(json).unwrap();
    let owners: Vec<Option<String>> = record
        .processes
        .iter()
        .map(|p| p.owner.as_ref().map(OwnerMatch::to_string))
        .collect();
    assert_eq!(
        owners,
        [
            Some("slurm:812".into()),
            Some("slurm:812@1000".into()),
            None,
            None,
            None
        ]
    );
    let back: XidRecord = serde_json::from_str(&serde_json::to_string(&record).unwrap()).unwrap();
    assert_eq!(back, record);
}

#[test]
fn an_unknown_xid_holds_the_gpu_until_it_clears_as_every_xid_does() {
    let facts = Facts {
        xids: vec![xid(999, 100)],
        ecc: Some(EccCounts::default()),
        ..Facts::default()
    };
    let v = judge(&facts);
    assert_eq!(v.action, Action::GpuReset);
    assert!(
        v.causes[0].message.starts_with("unknown Xid 999: "),
        "{v:?}"
    );
    assert_eq!(
        v.summary().as_deref(),
        Some("needs a reset: unknown Xid 999")
    );
    let acknowledged = judge(&Facts {
        acknowledged_unix: Some(100),
        ..facts.clone()
    });
    assert_eq!(acknowledged.action, Action::None);
    let driver_judged = judge(&Facts {
        recovery_action: Some(Action::None),
        ..facts.clone()
    });
    assert_eq!(driver_judged.action, Action::None);
    let lenient = Catalog::default().unknown_xid_action(Action::None);
    assert_eq!(verdict(&facts, &lenient).action, Action::None);
}

#[test]
fn the_summary_names_every_cause_that_asks_for_an_action() {
    let v = judge(&Facts {
        remapped_rows: Some(RemappedRows {
            pending: true,
            ..RemappedRows::default()
        }),
        clock_event_reasons: Some(0x8),
        xids: vec![under_job(xid(64, 100), 4242, "812"), xid(43, 101)],
        ..Facts::default()
    });
    assert_eq!(
        v.summary().as_deref(),
        Some("needs a reset: row remap pending; Xid 64 under job 812")
    );
}

#[test]
fn with_the_field_reading_none_earlier_xids_are_history() {
    let v = judge(&Facts {
        recovery_action: Some(Action::None),
        xids: vec![xid(64, 100), xid(79, 101)],
        ..Facts::default()
    });
    assert_eq!(v.action, Action::None);
    assert_eq!(
        kinds(&v),
        [
            (CauseKind::Xid, Action::None),
            (CauseKind::Xid, Action::None)
        ]
    );
    assert!(
        v.causes
            .iter()
            .all(|c| c.history == Some(History::RecoveryAction))
    );
}

#[test]
fn an_acknowledgement_turns_the_xids_up_to_it_into_history() {
    let facts = Facts {
        xids: vec![xid(64, 100), xid(95, 200)],
        acknowledged_unix: Some(150),
        ..Facts::default()
    };
    let v = judge(&facts);
    assert_eq!(v.action, Action::GpuReset);
    assert_eq!(v.causes[0].history, Some(History::Acknowledged));
    assert_eq!(v.causes[1].history, None);
    let v = judge(&Facts {
        acknowledged_unix: Some(200),
        ..facts
    });
    assert_eq!(v.action, Action::None);
}

#[test]
fn a_reset_shows_as_volatile_ecc_counters_lower_than_at_the_xid() {
    let mut record = xid(95, 100);
    record.volatile_ecc = Some(3);
    let before = Facts {
        ecc: Some(EccCounts {
            volatile_corrected: 3,
            aggregate_corrected: 3,
            ..EccCounts::default()
        }),
        xids: vec![record],
        ..Facts::default()
    };
    assert_eq!(judge(&before).action, Action::GpuReset);
    let after = Facts {
        ecc: Some(EccCounts {
            aggregate_corrected: 3,
            ..EccCounts::default()
        }),
        ..before
    };
    let v = judge(&after);
    assert_eq!(v.action, Action::None);
    assert_eq!(v.causes[0].history, Some(History::Reset));
}

#[test]
fn an_app_xid_is_the_processs_problem_and_expires_with_it() {
    let record = under_job(xid(13, 100), 4242, "812");
    let running = Facts {
        xids: vec![record.clone()],
        running: vec![(4242, Some(1000))],
        ..Facts::default()
    };
    let v = judge(&running);
    assert_eq!(v.action, Action::None, "the GPU is fit");
    assert_eq!(kinds(&v), [(CauseKind::Xid, Action::RestartApp)]);
    assert_eq!(
        v.causes[0].processes[0].owner,
        Some(OwnerMatch::SlurmJob(812))
    );
    assert_eq!(v.summary(), None);

    // Gone, or its pid reused by another process: the cause expires.
    for running in [vec![], vec![(4242, Some(2000))]] {
        let v = judge(&Facts {
            running,
            ..running_facts(&record)
        });
        assert!(v.causes.is_empty(), "{v:?}");
    }
}

fn running_facts(record: &XidRecord) -> Facts {
    Facts {
        xids: vec![record.clone()],
        ..Facts::default()
    }
}

#[test]
fn ignored_and_workflow_xids_are_listed_without_an_action() {
    let v = judge(&Facts {
        xids: vec![xid(43, 1), xid(63, 2), xid(48, 3), xid(45, 4)],
        ..Facts::default()
    });
    assert_eq!(v.action, Action::None);
    assert_eq!(v.causes.len(), 4);
    assert!(v.causes.iter().all(|c| c.action == Action::None));
    assert!(
        v.causes[2].message.contains("multi-step workflow"),
        "{}",
        v.causes[2].message
    );
}

#[test]
fn a_site_override_decides_an_xids_action() {
    let catalog = Catalog::with_overrides(BTreeMap::from([
        (43, Action::GpuReset),
        (109, Action::None),
    ]));
    let facts = Facts {
        xids: vec![xid(43, 1), xid(109, 2)],
        ..Facts::default()
    };
    let v = verdict(&facts, &catalog);
    assert_eq!(v.action, Action::GpuReset);
    assert_eq!(v.causes[0].action, Action::GpuReset);
    assert_eq!(v.causes[1].action, Action::None);
    assert_eq!(judge(&facts).action, Action::GpuReset, "109 by the catalog");
}

#[test]
fn a_gpu_that_heals_clears_every_cause_by_itself() {
    let mut record = under_job(xid(64, 100), 4242, "812");
    record.volatile_ecc = Some(2);
    let sick = Facts {
        recovery_action: None,
        remapped_rows: Some(RemappedRows {
            correctable: 3,
            uncorrectable: 1,
            pending: true,
            failure: false,
        }),
        ecc: Some(EccCounts {
            volatile_uncorrected: 2,
            aggregate_uncorrected: 2,
            ..EccCounts::default()
        }),
        retired_pages: Some(RetiredPages {
            double_bit: 1,
            pending: true,
            ..RetiredPages::default()
        }),
        xids: vec![record],
        ..Facts::default()
    };
    assert_eq!(judge(&sick).action, Action::GpuReset);
    // After a reset: nothing pending, the volatile counters restarted; the Xid is history.
    let healed = Facts {
        remapped_rows: Some(RemappedRows {
            pending: false,
            ..sick.remapped_rows.unwrap()
        }),
        ecc: Some(EccCounts {
            volatile_uncorrected: 0,
            ..sick.ecc.unwrap()
        }),
        retired_pages: Some(RetiredPages {
            pending: false,
            ..sick.retired_pages.unwrap()
        }),
        ..sick.clone()
    };
    let v = judge(&healed);
    assert_eq!(v.action, Action::None);
    assert!(v.causes.iter().all(|c| c.action == Action::None), "{v:?}");
}

#[test]
fn actions_round_trip_through_their_names_and_nvmls_values() {
    for action in Action::ALL {
        assert_eq!(Action::parse(action.name()), Some(action));
        assert_eq!(
            serde_json::to_value(action).unwrap(),
            serde_json::json!(action.name())
        );
    }
    assert_eq!(Action::parse("reboot"), None);
    assert_eq!(Action::from_nvml(0), Some(Action::None));
    assert_eq!(Action::from_nvml(1), Some(Action::GpuReset));
    assert_eq!(Action::from_nvml(2), Some(Action::NodeReboot));
    assert_eq!(Action::from_nvml(3), Some(Action::DrainP2p));
    assert_eq!(Action::from_nvml(4), Some(Action::DrainAndReset));
    assert_eq!(Action::from_nvml(9), None);
    assert!(!Action::RestartApp.drains());
    assert!(!Action::None.drains());
    assert!(Action::DrainP2p.drains() && Action::GpuReset.drains());
}
