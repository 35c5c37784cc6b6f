use super::*;

/// The actions an Xid can ask for: NVML's `drain_p2p` and `drain_and_reset` come only from
/// the driver's recovery-action field, never from an Xid.
const XID_ACTIONS: [Action; 4] = [
    Action::None,
    Action::RestartApp,
    Action::GpuReset,
    Action::NodeReboot,
];

#[test]
fn the_table_follows_nvidias_catalog_for_the_xids_it_names() {
    let catalog = Catalog::default();
    for xid in [8, 13, 31, 41, 94, 159] {
        assert_eq!(catalog.rule(xid).action, Action::RestartApp, "Xid {xid}");
    }
    for xid in [14, 38, 43, 63, 92, 121, 154, 161] {
        assert_eq!(catalog.rule(xid).action, Action::None, "Xid {xid}");
    }
    for xid in [46, 61, 64, 95, 109, 119, 120, 158, 162] {
        assert_eq!(catalog.rule(xid).action, Action::GpuReset, "Xid {xid}");
    }
    for xid in [79, 151, 160] {
        assert_eq!(catalog.rule(xid).action, Action::NodeReboot, "Xid {xid}");
    }
    for xid in [45, 48, 74, 144, 150] {
        assert!(catalog.rule(xid).workflow, "Xid {xid}");
    }
    assert_eq!(catalog.rule(79).meaning, "GPU has fallen off the bus");
    assert_eq!(catalog.rule(46).meaning, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR");
}

#[test]
fn the_table_holds_every_xid_of_nvidias_catalog_once_in_order() {
    let numbers: Vec<u32> = XID_CATALOG.iter().map(|e| e.xid).collect();
    assert_eq!(numbers, (1..=162).collect::<Vec<u32>>());
    for pair in XID_CATALOG.windows(2) {
        assert!(
            pair[0].xid < pair[1].xid,
            "{} then {}",
            pair[0].xid,
            pair[1].xid
        );
    }
}

#[test]
fn every_entry_asks_for_an_action_gpuctl_shows_and_every_action_is_reachable() {
    for entry in XID_CATALOG {
        assert!(
            XID_ACTIONS.contains(&entry.action()),
            "Xid {}: {}",
            entry.xid,
            entry.action()
        );
        assert!(!entry.meaning().is_empty(), "Xid {}", entry.xid);
    }
    for action in XID_ACTIONS {
        assert!(
            XID_CATALOG.iter().any(|e| e.action() == action),
            "no Xid asks for {action}"
        );
    }
    for bucket in Bucket::ALL {
        assert!(
            XID_CATALOG.iter().any(|e| e.bucket == bucket),
            "no Xid is in {bucket:?}"
        );
    }
}

#[test]
fn an_unknown_xid_holds_the_gpu_by_default_and_says_so() {
    let rule = Catalog::default().rule(999);
    assert_eq!(rule.action, Action::GpuReset);
    assert!(rule.action.drains());
    assert!(!rule.known);
    assert!(
        rule.meaning.starts_with("unknown Xid 999"),
        "{}",
        rule.meaning
    );
    let lenient = Catalog::default().unknown_xid_action(Action::None);
    assert_eq!(lenient.rule(999).action, Action::None);
    assert_eq!(lenient.rule(95).action, Action::GpuReset);
}

#[test]
fn a_site_override_replaces_the_catalogs_action() {
    let catalog = Catalog::with_overrides(BTreeMap::from([
        (109, Action::None),
        (43, Action::GpuReset),
        (500, Action::DrainP2p),
    ]));
    assert_eq!(catalog.rule(109).action, Action::None);
    assert!(catalog.rule(109).overridden);
    assert_eq!(catalog.rule(43).action, Action::GpuReset);
    assert_eq!(catalog.rule(500).action, Action::DrainP2p);
    assert!(!catalog.rule(48).overridden);
    assert_eq!(catalog.rule(48).meaning, "Double Bit ECC Error");
    let unknown_too = catalog.unknown_xid_action(Action::NodeReboot);
    assert_eq!(unknown_too.rule(500).action, Action::DrainP2p);
    assert_eq!(unknown_too.rule(501).action, Action::NodeReboot);
}
