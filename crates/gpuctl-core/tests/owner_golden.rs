//! Golden tests for `gpuctl_core::owner::parse_cgroup`.
//!
//! Each directory `tests/fixtures/cgroup/NN-name/` holds `cgroup`, the raw text of a
//! `/proc/PID/cgroup` file in a real layout, and `expected.json`, the pretty JSON of the
//! `CgroupInfo` it must parse to. The test parses every fixture and compares.
//!
//! To regenerate the expected files after a deliberate change, run
//!
//! ```text
//! UPDATE_GOLDEN=1 cargo test -p gpuctl-core --test owner_golden
//! ```
//!
//! then review every changed `expected.json` by eye (`git diff`) before committing: a golden
//! file is only worth something if a person has checked that it says the right owner.

use std::fs;
use std::path::{Path, PathBuf};

use gpuctl_core::owner::parse_cgroup;

fn fixture_dirs() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cgroup");
    let mut dirs: Vec<PathBuf> = fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("reading {}: {e}", root.display()))
        .map(|entry| entry.expect("fixture dir entry").path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

#[test]
fn cgroup_fixtures_match_expected_json() {
    let update = std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1");
    let dirs = fixture_dirs();
    assert!(
        dirs.len() >= 15,
        "expected the cgroup fixture set, found {} directories",
        dirs.len()
    );

    let mut failures = Vec::new();
    for dir in &dirs {
        let name = dir.file_name().unwrap_or_default().to_string_lossy();
        let input = fs::read_to_string(dir.join("cgroup"))
            .unwrap_or_else(|e| panic!("{name}: reading cgroup: {e}"));
        let info = parse_cgroup(&input);
        let mut actual = serde_json::to_string_pretty(&info).expect("CgroupInfo serializes");
        actual.push('\n');

        let expected_path = dir.join("expected.json");
        if update {
            fs::write(&expected_path, &actual)
                .unwrap_or_else(|e| panic!("{name}: writing expected.json: {e}"));
            continue;
        }
        let expected = fs::read_to_string(&expected_path).unwrap_or_else(|e| {
            panic!("{name}: reading expected.json: {e} (UPDATE_GOLDEN=1 creates it)")
        });
        if actual != expected {
            failures.push(format!(
                "--- {name}\nexpected:\n{expected}actual:\n{actual}label: {}\n",
                info.owner.label()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cgroup fixtures differ (UPDATE_GOLDEN=1 rewrites them; review the diff):\n{}",
        failures.len(),
        dirs.len(),
        failures.join("\n")
    );
}

/// Labels of a few fixtures, so the table column's forms are pinned too.
#[test]
fn cgroup_fixture_labels() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cgroup");
    let label = |name: &str| {
        let input = fs::read_to_string(root.join(name).join("cgroup"))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        parse_cgroup(&input).owner.label()
    };
    assert_eq!(label("01-docker-cgroupfs-v1"), "docker 4f797c539e6c");
    assert_eq!(label("03-k8s-containerd-burstable-v2"), "k8s pod 2edf54f8");
    assert_eq!(label("09-podman-rootful-v2"), "podman 6dd05e91f00f");
    assert_eq!(label("14-slurm-v1-hybrid-step0"), "slurm 123.0");
    assert_eq!(label("17-slurm-v2-batch"), "slurm 1446354.batch");
    assert_eq!(label("20-systemd-service-v2"), "nginx.service");
    assert_eq!(label("23-systemd-session-scope-v2"), "session-3.scope");
    assert_eq!(
        label("24-systemd-user-service-v2"),
        "user 1000: jupyter.service"
    );
    assert_eq!(label("27-root-v2"), "-");
}

/// A user's own delegated subtree (`user@UID.service`, a service with `Delegate=yes`) may
/// hold any cgroup name: a Slurm job's or a container's there names neither, and the table
/// says whose cgroup it is.
#[test]
fn names_below_a_delegation_are_not_jobs_or_containers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cgroup");
    let owner = |name: &str| {
        let input = fs::read_to_string(root.join(name).join("cgroup"))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        parse_cgroup(&input).owner
    };
    for name in [
        "30-hostile-slurm-under-user-manager-v2",
        "31-hostile-slurm-v1-form-under-user-manager-v2",
        "32-hostile-slurmstepd-scope-under-user-manager-v2",
        "33-hostile-docker-scope-under-user-manager-v2",
        "34-hostile-docker-cgroupfs-under-user-manager-v2",
        "35-hostile-kubepods-under-user-manager-v2",
        "36-hostile-slurm-under-delegated-service-v2",
        "37-hostile-slurm-under-user-manager-hybrid",
    ] {
        let json = serde_json::to_value(owner(name)).expect("owner serializes");
        let kind = json["kind"].as_str().unwrap_or_default().to_string();
        assert!(
            kind == "systemd_unit" || kind == "systemd_user_unit",
            "{name}: {json}"
        );
    }
    assert_eq!(
        owner("30-hostile-slurm-under-user-manager-v2").label(),
        "user@1001.service"
    );
    assert_eq!(
        owner("33-hostile-docker-scope-under-user-manager-v2").label(),
        "user 1001: docker-9ec39b91f…"
    );
    assert_eq!(
        owner("38-slurm-v2-multiple-slurmd-step0").label(),
        "slurm 280679.0"
    );
}
