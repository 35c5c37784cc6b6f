//! Owners read from `/proc/PID/cgroup` text, the environment's Slurm job, and the owner
//! selectors.

use super::*;

const ID64: &str = "3f2a1b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708";

fn owner(contents: &str) -> Owner {
    parse_cgroup(contents).owner
}

fn v2(path: &str) -> Owner {
    owner(&format!("0::{path}\n"))
}

#[test]
fn empty_and_garbage_give_none_with_empty_path() {
    for input in [
        "",
        "\n",
        "garbage",
        "::",
        "a:b:c",
        "1:cpu",
        "0::relative/path",
        "x::/a",
    ] {
        let info = parse_cgroup(input);
        assert_eq!(info.owner, Owner::None, "{input:?}");
        assert_eq!(info.path, "", "{input:?}");
    }
}

#[test]
fn root_is_none_and_keeps_slash() {
    let info = parse_cgroup("0::/\n");
    assert_eq!(
        info,
        CgroupInfo {
            owner: Owner::None,
            path: "/".into()
        }
    );
}

#[test]
fn unrecognized_keeps_the_most_telling_path() {
    let info = parse_cgroup("3:cpu:/\n2:memory:/user/1000.user/c2.session\n1:name=systemd:/\n");
    assert_eq!(info.owner, Owner::None);
    assert_eq!(info.path, "/user/1000.user/c2.session");
    let info = parse_cgroup("1:name=systemd:/weird\n0::/other\n");
    assert_eq!(info.path, "/other");
}

#[test]
fn slurm_steps() {
    for (step, want) in [
        ("step_0", Some("0")),
        ("step_batch", Some("batch")),
        ("step_extern", Some("extern")),
        ("step_interactive", Some("interactive")),
        ("step_12", Some("12")),
    ] {
        let o = v2(&format!(
            "/system.slice/slurmstepd.scope/job_77/{step}/user/task_0"
        ));
        assert_eq!(
            o,
            Owner::SlurmJob {
                job_id: 77,
                step: want.map(String::from),
                uid: None,
                from_environ: false,
            }
        );
    }
    assert_eq!(
        v2("/system.slice/slurmstepd.scope/job_77"),
        Owner::SlurmJob {
            job_id: 77,
            step: None,
            uid: None,
            from_environ: false,
        }
    );
    assert_eq!(
        v2("/system.slice/slurmstepd.scope/job_77").label(),
        "slurm 77"
    );
}

#[test]
fn slurm_v1_and_multiple_slurmd() {
    let want = Owner::SlurmJob {
        job_id: 123,
        step: Some("0".into()),
        uid: Some(1000),
        from_environ: false,
    };
    assert_eq!(
        owner("4:memory:/slurm/uid_1000/job_123/step_0/task_1\n"),
        want
    );
    assert_eq!(
        owner("4:freezer:/slurm_node7/uid_1000/job_123/step_0\n"),
        want
    );
    assert_eq!(
        v2("/system.slice/node7_slurmstepd.scope/job_123/step_0/user/task_0"),
        Owner::SlurmJob {
            job_id: 123,
            step: Some("0".into()),
            uid: None,
            from_environ: false,
        }
    );
    assert_eq!(want.label(), "slurm 123.0");
}

#[test]
fn slurm_needs_its_root_and_a_number() {
    // slurmstepd's own cgroup is a plain scope.
    assert_eq!(
        v2("/system.slice/slurmstepd.scope/system"),
        Owner::SystemdScope {
            scope: "slurmstepd.scope".into(),
            uid: None
        }
    );
    assert_eq!(v2("/job_123/step_0"), Owner::None);
    assert_eq!(v2("/slurm/uid_1/job_x/step_0"), Owner::None);
    assert_eq!(v2("/slurm/uid_1/job_+5/step_0"), Owner::None);
    assert_eq!(
        v2("/slurm/uid_1/job_99999999999999999999999/step_0"),
        Owner::None
    );
}

/// A user may create any cgroup in a subtree delegated to it: a manager's name found
/// there, or anywhere but where the manager puts it, names no job and no container.
#[test]
fn names_are_anchored_where_their_manager_puts_them() {
    let mallory = |rest: &str| {
        v2(&format!(
            "/user.slice/user-1001.slice/user@1001.service/app.slice/{rest}"
        ))
    };
    let manager = Owner::SystemdUnit {
        unit: "user@1001.service".into(),
    };
    assert_eq!(mallory("slurm/job_777/step_0"), manager);
    assert_eq!(mallory("slurm/uid_1000/job_777/step_0"), manager);
    assert_eq!(
        mallory("kubepods/pod1fe19bf5-e8ef-11e8-900c-52daee5a874d"),
        manager
    );
    assert_eq!(mallory(&format!("docker/{ID64}")), manager);
    assert_eq!(
        mallory(&format!("docker-{ID64}.scope")),
        Owner::SystemdUserUnit {
            unit: format!("docker-{ID64}.scope"),
            uid: 1001
        }
    );
    assert_eq!(
        mallory("evil.service/system.slice/slurmstepd.scope/job_777/step_0"),
        Owner::SystemdUserUnit {
            unit: "evil.service".into(),
            uid: 1001
        }
    );
    // A system service with Delegate=yes: its own sub-cgroups stay the service's.
    assert_eq!(
        v2("/system.slice/ci-runner.service/slurm/uid_0/job_777/step_0"),
        Owner::SystemdUnit {
            unit: "ci-runner.service".into()
        }
    );
    assert_eq!(
        v2(&format!("/system.slice/ci-runner.service/docker/{ID64}")),
        Owner::SystemdUnit {
            unit: "ci-runner.service".into()
        }
    );
    // Slurm's names one level off their place.
    assert_eq!(v2("/a/slurm/uid_0/job_777/step_0"), Owner::None);
    assert_eq!(v2("/slurm/job_777/step_0"), Owner::None);
    for off in ["/", "/machine.slice/"] {
        assert_eq!(
            v2(&format!("{off}slurmstepd.scope/job_777/step_0")),
            Owner::SystemdScope {
                scope: "slurmstepd.scope".into(),
                uid: None
            }
        );
    }
    // The job sits at its fixed depth: what a job's user creates below its step (Slurm's
    // v1 plugin gives the step's directory to the user) names no other job.
    assert_eq!(
        owner("4:freezer:/slurm/uid_1000/job_5/step_0/slurm/uid_1000/job_777/step_0\n"),
        Owner::SlurmJob {
            job_id: 5,
            step: Some("0".into()),
            uid: Some(1000),
            from_environ: false,
        }
    );
    // A Slurm job inside a container is not the host's job.
    assert_eq!(
        v2(&format!("/docker/{ID64}/slurm/uid_0/job_777/step_0")),
        Owner::Container {
            runtime: ContainerRuntime::Docker,
            id: ID64.into()
        }
    );
    // Container scopes outside the system manager's slices; cgroupfs ids off the root.
    assert_eq!(v2(&format!("/a/docker/{ID64}")), Owner::None);
    assert_eq!(v2(&format!("/docker/x/{ID64}")), Owner::None);
    // A pod deeper than its QoS directory (inside some container) is not a pod.
    assert_eq!(
        v2(&format!(
            "/kubepods/burstable/{ID64}/pod1fe19bf5-e8ef-11e8-900c-52daee5a874d"
        )),
        Owner::None
    );
}

#[test]
fn slurm_beats_systemd_in_hybrid() {
    let info = parse_cgroup(
        "5:memory:/slurm/uid_5/job_9/step_batch/task_0\n1:name=systemd:/system.slice/slurmd.service\n0::/system.slice/slurmd.service\n",
    );
    assert_eq!(
        info.owner,
        Owner::SlurmJob {
            job_id: 9,
            step: Some("batch".into()),
            uid: Some(5),
            from_environ: false,
        }
    );
    assert_eq!(info.path, "/slurm/uid_5/job_9/step_batch/task_0");
    assert_eq!(info.owner.label(), "slurm 9.batch");
}

#[test]
fn kubernetes_systemd_driver() {
    let p = format!(
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0a1b2c3d_4e5f_6789_abcd_ef0123456789.slice/cri-containerd-{ID64}.scope"
    );
    let o = v2(&p);
    assert_eq!(
        o,
        Owner::KubernetesPod {
            pod_uid: "0a1b2c3d-4e5f-6789-abcd-ef0123456789".into(),
            qos: Some("Burstable".into()),
            container_id: Some(ID64.into()),
            runtime: Some(ContainerRuntime::Containerd),
            pod: None,
        }
    );
    assert_eq!(o.label(), "k8s pod 0a1b2c3d");
    // Guaranteed: no QoS slice.
    let p = "/kubepods.slice/kubepods-pod0a1b2c3d_4e5f_6789_abcd_ef0123456789.slice";
    assert_eq!(
        v2(p),
        Owner::KubernetesPod {
            pod_uid: "0a1b2c3d-4e5f-6789-abcd-ef0123456789".into(),
            qos: Some("Guaranteed".into()),
            container_id: None,
            runtime: None,
            pod: None,
        }
    );
}

#[test]
fn kubernetes_cgroupfs_static_pod_and_nesting() {
    let p =
        format!("/docker/{ID64}/kubepods/besteffort/pod5b4e1c0f9a8d7e6b5c4d3e2f1a0b9c8d/{ID64}");
    assert_eq!(
        v2(&p),
        Owner::KubernetesPod {
            pod_uid: "5b4e1c0f9a8d7e6b5c4d3e2f1a0b9c8d".into(),
            qos: Some("BestEffort".into()),
            container_id: Some(ID64.into()),
            runtime: None,
            pod: None,
        }
    );
}

#[test]
fn crio_conmon_is_not_a_container() {
    let p = format!(
        "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0a1b2c3d_4e5f_6789_abcd_ef0123456789.slice/crio-conmon-{ID64}.scope"
    );
    match v2(&p) {
        Owner::KubernetesPod {
            container_id,
            runtime,
            ..
        } => {
            assert_eq!(container_id, None);
            assert_eq!(runtime, Some(ContainerRuntime::CriO));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        v2(&format!("/machine.slice/libpod-conmon-{ID64}.scope")),
        Owner::SystemdScope {
            scope: format!("libpod-conmon-{ID64}.scope"),
            uid: None
        }
    );
}

#[test]
fn kubepods_without_a_pod_is_not_a_pod() {
    assert_eq!(v2("/kubepods.slice/kubepods-burstable.slice"), Owner::None);
    assert_eq!(v2("/kubepods/burstable/podnothex"), Owner::None);
    // "pod" lookalike outside kubepods.
    assert_eq!(v2("/pod0a1b2c3d-4e5f-6789-abcd-ef0123456789"), Owner::None);
}

#[test]
fn containers() {
    let c = |runtime| Owner::Container {
        runtime,
        id: ID64.into(),
    };
    assert_eq!(v2(&format!("/docker/{ID64}")), c(ContainerRuntime::Docker));
    assert_eq!(
        v2(&format!("/system.slice/docker-{ID64}.scope")),
        c(ContainerRuntime::Docker)
    );
    assert_eq!(
        v2(&format!("/system.slice/cri-containerd-{ID64}.scope")),
        c(ContainerRuntime::Containerd)
    );
    assert_eq!(
        v2(&format!("/system.slice/nerdctl-{ID64}.scope")),
        c(ContainerRuntime::Containerd)
    );
    assert_eq!(
        v2(&format!("/default/{ID64}")),
        c(ContainerRuntime::Containerd)
    );
    assert_eq!(
        v2(&format!("/system.slice/crio-{ID64}.scope")),
        c(ContainerRuntime::CriO)
    );
    assert_eq!(
        v2(&format!("/machine.slice/libpod-{ID64}.scope/container")),
        c(ContainerRuntime::Podman)
    );
    assert_eq!(
        v2(&format!("/libpod_parent/libpod-{ID64}")),
        c(ContainerRuntime::Podman)
    );
    // Rootless podman is its user's own cgroup: a unit of the user's manager.
    assert_eq!(
        v2(&format!(
            "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID64}.scope"
        )),
        Owner::SystemdUserUnit {
            unit: format!("libpod-{ID64}.scope"),
            uid: 1000
        }
    );
    assert_eq!(c(ContainerRuntime::Docker).label(), "docker 3f2a1b4c5d6e");
    assert_eq!(c(ContainerRuntime::CriO).label(), "cri-o 3f2a1b4c5d6e");
    // A bare hex directory under an unknown parent is not claimed.
    assert_eq!(v2(&format!("/somewhere/{ID64}")), Owner::None);
    // docker.service itself is a unit, not a container.
    assert_eq!(
        v2("/system.slice/docker.service"),
        Owner::SystemdUnit {
            unit: "docker.service".into()
        }
    );
}

#[test]
fn docker_in_docker_takes_the_innermost() {
    let inner = "a".repeat(64);
    assert_eq!(
        v2(&format!("/docker/{ID64}/docker/{inner}")),
        Owner::Container {
            runtime: ContainerRuntime::Docker,
            id: inner
        }
    );
}

#[test]
fn systemd_forms() {
    assert_eq!(
        v2("/system.slice/nginx.service"),
        Owner::SystemdUnit {
            unit: "nginx.service".into()
        }
    );
    assert_eq!(
        v2("/system.slice/system-getty.slice/getty@tty1.service"),
        Owner::SystemdUnit {
            unit: "getty@tty1.service".into()
        }
    );
    assert_eq!(
        v2("/system.slice/system-serial\\x2dgetty.slice/serial-getty@ttyS0.service"),
        Owner::SystemdUnit {
            unit: "serial-getty@ttyS0.service".into()
        }
    );
    let s = v2("/user.slice/user-1000.slice/session-3.scope");
    assert_eq!(
        s,
        Owner::SystemdScope {
            scope: "session-3.scope".into(),
            uid: Some(1000)
        }
    );
    assert_eq!(s.label(), "session-3.scope");
    assert_eq!(
        v2("/init.scope"),
        Owner::SystemdScope {
            scope: "init.scope".into(),
            uid: None
        }
    );
    let u = v2("/user.slice/user-1000.slice/user@1000.service/app.slice/jupyter.service");
    assert_eq!(
        u,
        Owner::SystemdUserUnit {
            unit: "jupyter.service".into(),
            uid: 1000
        }
    );
    assert_eq!(u.label(), "user 1000: jupyter.service");
    assert_eq!(
        v2(
            "/user.slice/user-1000.slice/user@1000.service/app.slice/app-gnome-org.gnome.Terminal\\x2dfoo-1234.scope"
        ),
        Owner::SystemdUserUnit {
            unit: "app-gnome-org.gnome.Terminal\\x2dfoo-1234.scope".into(),
            uid: 1000
        }
    );
    assert_eq!(
        v2("/user.slice/user-1000.slice/user@1000.service/init.scope"),
        Owner::SystemdUserUnit {
            unit: "init.scope".into(),
            uid: 1000
        }
    );
    assert_eq!(
        v2("/user.slice/user-1000.slice/user@1000.service"),
        Owner::SystemdUnit {
            unit: "user@1000.service".into()
        }
    );
    // Delegated sub-cgroups belong to their unit.
    assert_eq!(
        v2("/system.slice/foo.service/worker/1"),
        Owner::SystemdUnit {
            unit: "foo.service".into()
        }
    );
    assert_eq!(v2("/system.slice"), Owner::None);
    assert_eq!(v2("/.service"), Owner::None);
}

#[test]
fn deleted_suffix_is_ignored_for_classification() {
    let info = parse_cgroup("0::/system.slice/nginx.service (deleted)\n");
    assert_eq!(
        info.owner,
        Owner::SystemdUnit {
            unit: "nginx.service".into()
        }
    );
    assert_eq!(info.path, "/system.slice/nginx.service (deleted)");
}

#[test]
fn crlf_and_colons_in_path() {
    let info = parse_cgroup("0::/system.slice/a:b.service\r\n");
    assert_eq!(
        info.owner,
        Owner::SystemdUnit {
            unit: "a:b.service".into()
        }
    );
}

#[test]
fn labels_are_bounded() {
    let long = Owner::SlurmJob {
        job_id: u64::MAX,
        step: Some("interactive".into()),
        uid: None,
        from_environ: false,
    };
    let l = long.label();
    assert_eq!(l.chars().count(), LABEL_MAX_CHARS);
    assert!(l.ends_with('…'));
    assert_eq!(Owner::None.label(), "-");
    let unit = Owner::SystemdUnit {
        unit: "é".repeat(100),
    };
    assert_eq!(unit.label().chars().count(), LABEL_MAX_CHARS);
    let pod = Owner::KubernetesPod {
        pod_uid: "ü".into(),
        qos: None,
        container_id: None,
        runtime: None,
        pod: None,
    };
    assert_eq!(pod.label(), "k8s pod ü");
}

#[test]
fn json_shape() {
    let info = parse_cgroup(&format!("0::/system.slice/crio-{ID64}.scope\n"));
    let json = serde_json::to_value(&info).unwrap();
    assert_eq!(json["owner"]["kind"], "container");
    assert_eq!(json["owner"]["runtime"], "cri-o");
    assert_eq!(
        serde_json::to_value(Owner::None).unwrap(),
        serde_json::json!({"kind": "none"})
    );
}

/// Property-style: random lines built from cgroup-ish tokens and odd characters never
/// panic, and every label stays within bounds.
#[test]
fn malformed_lines_never_panic() {
    const TOKENS: &[&str] = &[
        "0",
        "1",
        "12",
        ":",
        "::",
        "/",
        "//",
        "name=systemd",
        "memory,cpu",
        "slurm",
        "slurm_n1",
        "slurmstepd.scope",
        "uid_",
        "uid_1000",
        "job_",
        "job_42",
        "job_18446744073709551616",
        "step_",
        "step_0",
        "step_batch",
        "task_0",
        "kubepods",
        "kubepods.slice",
        "kubepods-burstable-pod",
        "-pod",
        "pod",
        ".slice",
        ".scope",
        ".service",
        "user@",
        "user-1000.slice",
        "user@1000.service",
        "docker",
        "docker-",
        "cri-containerd-",
        "crio-",
        "crio-conmon-",
        "libpod-",
        "libpod-conmon-",
        "default",
        "0a1b2c3d_4e5f_6789_abcd_ef0123456789",
        "0a1b2c3d-4e5f-6789-abcd-ef0123456789",
        ID64,
        "abcdef012345",
        "_",
        "-",
        ".",
        "..",
        " (deleted)",
        "\r",
        "\n",
        "\u{FFFD}",
        "é",
        "…",
        "\u{0}",
        "🙂",
        "\\x2d",
        " ",
    ];
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..20_000 {
        let n = (next() % 24) as usize;
        let mut s = String::new();
        for _ in 0..n {
            s.push_str(TOKENS[(next() % TOKENS.len() as u64) as usize]);
        }
        let info = parse_cgroup(&s);
        assert!(
            info.owner.label().chars().count() <= LABEL_MAX_CHARS,
            "{s:?}"
        );
        // The reported path is always one of the input's paths (or empty).
        assert!(info.path.is_empty() || s.contains(&info.path), "{s:?}");
    }
}

#[test]
fn huge_inputs() {
    let huge_id = "f".repeat(1 << 20);
    let info = parse_cgroup(&format!("0::/system.slice/docker-{huge_id}.scope\n"));
    assert_eq!(info.owner.label(), "docker ffffffffffff");
    let many = "1:cpu:/\n".repeat(100_000);
    assert_eq!(parse_cgroup(&many).owner, Owner::None);
    let deep = format!("0::{}\n", "/a".repeat(100_000));
    assert_eq!(parse_cgroup(&deep).owner, Owner::None);
}

#[test]
fn the_environment_names_a_slurm_job_as_a_marked_fallback() {
    let environ = b"PATH=/usr/bin\0SLURM_JOB_ID=4242\0SLURM_STEP_ID=0\0HOME=/root\0";
    let owner = slurm_job_from_environ(environ, 1001).unwrap();
    assert_eq!(
        owner,
        Owner::SlurmJob {
            job_id: 4242,
            step: Some("0".into()),
            uid: Some(1001),
            from_environ: true,
        }
    );
    assert_eq!(owner.label(), "slurm 4242.0 (env)");
    // Kept as uid 1001's claim, apart from the job a cgroup names.
    let key = OwnerMatch::of(&owner).unwrap();
    assert_eq!(key.to_string(), "slurm:4242@1001");
    assert_eq!(key, "slurm:4242@1001".parse().unwrap());
    assert!(key.matches(&owner));
    let anchored = v2("/system.slice/slurmstepd.scope/job_4242/step_0");
    assert!(!key.matches(&anchored));
    // The job as a cgroup names it is not what the environment claims.
    assert!(!OwnerMatch::SlurmJob(4242).matches(&owner));
    assert_eq!(slurm_job_from_environ(b"HOME=/root\0", 0), None);
    assert_eq!(slurm_job_from_environ(b"SLURM_JOB_ID=x1\0", 0), None);
    // A step id that is not a plain word is left out, not shown.
    let odd = slurm_job_from_environ(b"SLURM_JOB_ID=7\0SLURM_STEP_ID=\x1b[2J\0", 0).unwrap();
    assert_eq!(odd.label(), "slurm 7 (env)");
}

#[test]
fn owner_selectors_parse_and_match() {
    let job: OwnerMatch = "slurm:42".parse().unwrap();
    let slurm = Owner::SlurmJob {
        job_id: 42,
        step: Some("0".into()),
        uid: Some(1000),
        from_environ: false,
    };
    assert!(job.matches(&slurm));
    assert!(!"slurm:43".parse::<OwnerMatch>().unwrap().matches(&slurm));
    let container = Owner::Container {
        runtime: ContainerRuntime::Docker,
        id: "9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d".into(),
    };
    assert!(
        "container:9EC39B91F3D7"
            .parse::<OwnerMatch>()
            .unwrap()
            .matches(&container)
    );
    assert!(!job.matches(&container));
    let unit = Owner::SystemdUnit {
        unit: "jupyter.service".into(),
    };
    assert!(
        "unit:jupyter.service"
            .parse::<OwnerMatch>()
            .unwrap()
            .matches(&unit)
    );
    let pod = Owner::KubernetesPod {
        pod_uid: "1a2b3c4d-0000-4000-8000-00000000abcd".into(),
        qos: None,
        container_id: Some("9ec39b91f3d7".into()),
        runtime: None,
        pod: None,
    };
    let claim = Owner::SlurmJob {
        job_id: 42,
        step: None,
        uid: Some(1001),
        from_environ: true,
    };
    // Each owner's key reads back as the selector that matches it.
    for owner in [&slurm, &claim, &container, &unit, &pod] {
        let key = OwnerMatch::of(owner).unwrap().to_string();
        assert!(key.parse::<OwnerMatch>().unwrap().matches(owner), "{key}");
    }
    assert_eq!(OwnerMatch::of(&slurm).unwrap().to_string(), "slurm:42");
    assert_eq!(OwnerMatch::of(&Owner::None), None);
    for bad in [
        "",
        "slurm",
        "slurm:",
        "slurm:abc",
        "slurm:+5",
        "slurm:42@",
        "slurm:42@alice",
        "slurm:@1000",
        "pod:1234",
        "vm:x",
        ":42",
    ] {
        assert!(bad.parse::<OwnerMatch>().is_err(), "{bad} accepted");
    }
}

/// Which claims count for a job: a cgroup always; the environment only with the job's uid,
/// never through `slurm:J` alone; a claim without a uid never.
#[test]
fn a_claim_counts_for_a_job_only_from_a_cgroup_or_the_jobs_own_user() {
    let job = |uid: Option<u32>, from_environ: bool| Owner::SlurmJob {
        job_id: 812,
        step: None,
        uid,
        from_environ,
    };
    let of_alice = OwnerMatch::job(812, Some(1000));
    let counts = |patterns: &[OwnerMatch], owner: &Owner| patterns.iter().any(|m| m.matches(owner));
    // A cgroup claim (v1 with its uid directory, v2 without).
    assert!(counts(&of_alice, &job(Some(1000), false)));
    assert!(counts(&of_alice, &job(None, false)));
    assert!(counts(&[OwnerMatch::SlurmJob(812)], &job(None, false)));
    // The environment, with the job's uid: the job's, where its user is known.
    assert!(counts(&of_alice, &job(Some(1000), true)));
    assert!(!counts(
        &[OwnerMatch::SlurmJob(812)],
        &job(Some(1000), true)
    ));
    // With another uid: never the job's.
    assert!(!counts(&of_alice, &job(Some(1001), true)));
    assert!(!OwnerMatch::SlurmJob(812).matches(&job(Some(1001), true)));
    // With none: no one's.
    assert!(!counts(&of_alice, &job(None, true)));
    assert_eq!(OwnerMatch::of(&job(None, true)), None);
    // A job whose user is unknown: its cgroups alone.
    assert_eq!(OwnerMatch::job(812, None), [OwnerMatch::SlurmJob(812)]);
    assert!(!counts(&OwnerMatch::job(812, None), &job(Some(1000), true)));
    // Another job's number is never this one.
    assert!(!counts(
        &OwnerMatch::job(813, Some(1000)),
        &job(Some(1000), false)
    ));
}

#[test]
fn owner_selectors_are_their_strings_in_json() {
    for text in [
        "slurm:812",
        "slurm:812@1000",
        "unit:vllm.service",
        "scope:session-3.scope",
    ] {
        let wanted: OwnerMatch = text.parse().unwrap();
        let json = serde_json::to_string(&wanted).unwrap();
        assert_eq!(json, format!("\"{text}\""));
        assert_eq!(serde_json::from_str::<OwnerMatch>(&json).unwrap(), wanted);
    }
    assert!(serde_json::from_str::<OwnerMatch>("\"slurm:x\"").is_err());
}

#[test]
fn pods_are_selected_by_the_names_the_runtime_gave_them() {
    let named = |namespace: &str, name: &str| Owner::KubernetesPod {
        pod_uid: "1a2b3c4d-0000-4000-8000-00000000abcd".into(),
        qos: Some("Burstable".into()),
        container_id: None,
        runtime: None,
        pod: Some(PodName {
            namespace: namespace.into(),
            name: name.into(),
            container: Some("trainer".into()),
        }),
    };
    let matches =
        |selector: &str, owner: &Owner| selector.parse::<OwnerMatch>().unwrap().matches(owner);
    let trainer = named("ml", "trainer-0");
    assert!(matches("pod:ml/trainer-0", &trainer));
    assert!(matches("pod:ml/trainer-*", &trainer));
    assert!(matches("pod:*/trainer-0", &trainer));
    assert!(!matches("pod:kube-system/*", &trainer));
    assert!(matches("namespace:ml", &trainer));
    assert!(matches("namespace:m*", &trainer));
    assert!(!matches("namespace:ml-prod", &trainer));
    // The UID form still matches, named or not; the name forms need the runtime's names.
    assert!(matches("pod:1a2b3c4d", &trainer));
    let mut unnamed = named("ml", "trainer-0");
    if let Owner::KubernetesPod { pod, .. } = &mut unnamed {
        *pod = None;
    }
    assert!(!matches("namespace:ml", &unnamed));
    // Written back as given.
    for form in ["pod:ml/trainer-*", "namespace:ml"] {
        assert_eq!(form.parse::<OwnerMatch>().unwrap().to_string(), form);
    }
    for bad in ["pod:ML/x", "pod:ml/", "namespace:a/b", "namespace:"] {
        assert!(bad.parse::<OwnerMatch>().is_err(), "{bad}");
    }
}

/// Any user can start a unit of any name under their own manager, so `unit:NAME` is the
/// system's unit alone: an exemption or `--owner` for `unit:vllm.service` must never reach
/// mallory's `vllm.service`. A user's unit is `unit:NAME@UID`, and only that uid's.
#[test]
fn a_user_unit_is_named_with_its_uid_and_never_matches_the_systems_unit() {
    let system = Owner::SystemdUnit {
        unit: "vllm.service".into(),
    };
    let user = |uid| Owner::SystemdUserUnit {
        unit: "vllm.service".into(),
        uid,
    };
    let system_selector: OwnerMatch = "unit:vllm.service".parse().unwrap();
    assert!(system_selector.matches(&system));
    assert!(!system_selector.matches(&user(1001)));

    let user_selector: OwnerMatch = "unit:vllm.service@1000".parse().unwrap();
    assert!(user_selector.matches(&user(1000)));
    assert!(!user_selector.matches(&user(1001)));
    assert!(!user_selector.matches(&system));

    assert_eq!(OwnerMatch::of(&user(1000)), Some(user_selector.clone()));
    assert_eq!(user_selector.to_string(), "unit:vllm.service@1000");
    assert_eq!(user_selector.kind(), "unit");
    assert_eq!(OwnerMatch::of(&system), Some(system_selector));

    // A template instance's `@` is part of the unit's name.
    for text in ["unit:getty@tty1.service", "unit:user@1000.service"] {
        let instance: OwnerMatch = text.parse().unwrap();
        assert!(matches!(instance, OwnerMatch::Unit(_)), "{text}");
        assert_eq!(instance.to_string(), text);
    }
    let instance_of_user: OwnerMatch = "unit:worker@3.service@1000".parse().unwrap();
    assert_eq!(
        instance_of_user,
        OwnerMatch::UserUnit {
            unit: "worker@3.service".into(),
            uid: 1000
        }
    );
}
