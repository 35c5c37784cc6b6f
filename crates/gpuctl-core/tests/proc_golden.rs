//! Golden tests of the host-facts reader over fixture /proc trees (zram-generator style):
//! `fixtures/proc/NN-name/{proc/,etc/passwd,pids}` against `expected.json`. The expected files
//! were computed from the fixture inputs by hand-checked arithmetic (age = uptime - start ticks
//! / 100), not recorded from this reader's output.

use std::collections::BTreeMap;
use std::path::Path;

use gpuctl_core::host::{ProcView, UserNames};

#[test]
fn proc_trees_match_expected_facts() {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/proc");
    let mut cases: Vec<_> = std::fs::read_dir(&base)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    cases.sort();
    assert!(
        cases.len() >= 8,
        "fixtures missing under {}",
        base.display()
    );
    assert_eq!(
        procfs::ticks_per_second(),
        100,
        "fixtures assume USER_HZ = 100"
    );
    let mut failures = Vec::new();
    for case in &cases {
        let pids: Vec<u32> = std::fs::read_to_string(case.join("pids"))
            .unwrap()
            .split_whitespace()
            .map(|pid| pid.parse().unwrap())
            .collect();
        let users =
            UserNames::from_passwd(&std::fs::read_to_string(case.join("etc/passwd")).unwrap());
        let host_ns = !case.join("other-pid-namespace").exists();
        let view = ProcView::at(case.join("proc"), host_ns, users).unwrap();
        let actual: BTreeMap<String, _> = view
            .processes(&pids)
            .into_iter()
            .map(|(pid, fact)| (pid.to_string(), fact))
            .collect();
        let actual = serde_json::to_value(&actual).unwrap();
        let expected: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(case.join("expected.json")).unwrap())
                .unwrap();
        if actual != expected {
            failures.push(format!(
                "{}:\nexpected {}\nactual   {}",
                case.display(),
                serde_json::to_string_pretty(&expected).unwrap(),
                serde_json::to_string_pretty(&actual).unwrap()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
