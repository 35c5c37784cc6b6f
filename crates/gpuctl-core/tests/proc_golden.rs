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

/// The watchdog's cache: a known identity costs one stat read per pass, so its state is
/// fresh while its command line is kept; a new start time at the same pid is a new process,
/// read in full.
#[test]
fn cached_facts_follow_state_and_notice_a_reused_pid() {
    use gpuctl_core::host::{FactCache, ProcState};
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/proc/01-command-with-spaces-and-parens");
    let scratch = tempfile::tempdir().unwrap();
    let root = scratch.path();
    copy_tree(&source, root);
    let proc_dir = root.join("proc");
    let users = UserNames::from_passwd(&std::fs::read_to_string(root.join("etc/passwd")).unwrap());
    let view = ProcView::at(proc_dir.clone(), true, users).unwrap();
    let mut cache = FactCache::default();
    let first = view.processes_cached(&[4242], &mut cache)[&4242].clone();
    assert_eq!(first.state, Some(ProcState::Sleeping));
    assert_eq!(first.user.as_deref(), Some("alice"));

    let stat_path = proc_dir.join("4242/stat");
    let stat = std::fs::read_to_string(&stat_path).unwrap();
    std::fs::write(&stat_path, stat.replacen(") S ", ") T ", 1)).unwrap();
    std::fs::write(proc_dir.join("4242/cmdline"), "renamed\0").unwrap();
    let second = view.processes_cached(&[4242], &mut cache)[&4242].clone();
    assert_eq!(
        second.state,
        Some(ProcState::Stopped),
        "state is read every pass"
    );
    assert_eq!(second.command, first.command, "the command line is kept");

    // Another process at the same pid: another start time, so everything is read again.
    let stopped = std::fs::read_to_string(&stat_path).unwrap();
    std::fs::write(&stat_path, stopped.replace(" 8000000 ", " 9000000 ")).unwrap();
    let third = view.processes_cached(&[4242], &mut cache)[&4242].clone();
    assert_eq!(third.start_ticks, Some(9_000_000));
    assert_eq!(third.command.as_deref(), Some("renamed"));
}

fn copy_tree(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}
