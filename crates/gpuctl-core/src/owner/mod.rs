//! Who a process belongs to, read from the text of `/proc/PID/cgroup`.
//!
//! This is the answer to the admin's question "whose is this GPU process?": a Slurm job, a
//! Kubernetes pod, a container, a systemd unit or scope, or nothing recognizable.
//!
//! The module is pure: it takes the file's text and never touches the system, so it can be
//! tested against golden fixtures (`tests/fixtures/cgroup/`).
//!
//! # Input
//!
//! Each line of `/proc/PID/cgroup` is `hierarchy-ID:controller-list:cgroup-path`:
//!
//! * cgroup v1: `9:memory:/slurm/uid_1000/job_123/step_0/task_1`, and the controller-less
//!   systemd hierarchy `1:name=systemd:/system.slice/nginx.service`;
//! * cgroup v2 (unified): `0::/system.slice/nginx.service`;
//! * hybrid: both kinds of line in one file.
//!
//! Every line is classified on its own; the most specific workload owner wins (see
//! [`parse_cgroup`]). A v2 path of a removed cgroup carries the kernel's ` (deleted)` suffix;
//! it is ignored for classification and kept in [`CgroupInfo::path`].
//!
//! # Layouts recognized
//!
//! Every pattern is anchored where its manager puts it, at places only root can create: a
//! user may create any cgroup inside a subtree delegated to it (`user@UID.service`, a unit
//! with `Delegate=yes`), so `.../user@1001.service/app.slice/slurm/job_777/step_0` is user
//! 1001's own cgroup, not job 777.
//!
//! * Slurm, cgroup/v1 plugin: `/slurm/uid_<uid>/job_<id>/step_<step>/task_<n>` at the root of
//!   any controller, and `/slurm_<nodename>/...` with multiple slurmd.
//! * Slurm, cgroup/v2 plugin: `/system.slice/slurmstepd.scope/job_<id>/step_<step>/user/task_<n>`
//!   (also `/system.slice/<nodename>_slurmstepd.scope`, and the step's own
//!   `.../step_<step>/slurm`). Steps: numeric, `batch`, `extern`, `interactive`.
//! * Kubernetes, systemd driver: `/kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid
//!   with _>.slice/<runtime>-<id>.scope`; guaranteed pods have no QoS slice
//!   (`kubepods-pod<uid>.slice`); kind nodes use `/kubelet.slice/kubelet-kubepods.slice/...`.
//! * Kubernetes, cgroupfs driver: `/kubepods/<qos>/pod<uid>/<id>` (guaranteed:
//!   `/kubepods/pod<uid>/<id>`).
//! * Containers: docker (`/docker/<id>`, `docker-<id>.scope`), containerd (`cri-containerd-<id>.scope`,
//!   `nerdctl-<id>.scope`, `ctr`'s `/default/<id>`), cri-o (`crio-<id>.scope`; its monitor
//!   `crio-conmon-<id>` is not a container), podman (`libpod-<id>.scope`,
//!   `libpod-<id>.scope/container`, `/libpod_parent/libpod-<id>`; `libpod-conmon-<id>.scope`
//!   is the monitor, not a container). A scope counts only in the system manager's slices
//!   (`/system.slice/`, `/machine.slice/`), a cgroupfs directory only at the root.
//! * Nested: a container's cgroup is a root again for the containers and pods inside it
//!   (docker-in-docker `/docker/<id>/docker/<id>`, a kind node's
//!   `/system.slice/docker-<id>.scope/kubelet.slice/...`, `/docker/<node>/kubepods/...`); the
//!   innermost wins. Slurm jobs are only the host's.
//! * systemd: system units (`nginx.service`, `getty@tty1.service`), scopes (`session-3.scope`,
//!   `init.scope`), and units of a user manager (`user@1000.service/app.slice/jupyter.service`).
//!   Everything under `user@UID.service` is that user's: the first unit below the manager
//!   (rootless podman's `libpod-<id>.scope` included), else the manager `user@UID.service`.
//!   Unit names are kept exactly as systemd writes them, escapes like `\x2d` included.

mod cgroup;

pub use cgroup::{CgroupInfo, parse_cgroup};
use cgroup::{parse_digits, prefix_chars, truncate_label};

use serde::Serialize;

/// Longest label [`Owner::label`] returns, in characters.
pub const LABEL_MAX_CHARS: usize = 28;

/// Shortest hex id accepted as a container id (docker's short form is 12).
const MIN_CONTAINER_ID_LEN: usize = 12;

/// Who a process belongs to, from /proc/PID/cgroup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Owner {
    /// A Slurm job. `step` is the step directory's name without `step_`: `0`, `batch`,
    /// `extern`, `interactive`. `uid` comes from the v1 layout's `uid_<uid>` directory.
    /// `from_environ`: no cgroup names the job (Slurm's proctrack/linuxproc), so it was read
    /// from the process's SLURM_JOB_ID (and SLURM_STEP_ID), which the process could have set
    /// itself: a fallback, said as such, and only a claim of the process's own user, whose
    /// uid is then `uid`.
    SlurmJob {
        job_id: u64,
        step: Option<String>,
        uid: Option<u32>,
        from_environ: bool,
    },
    /// A Kubernetes pod. `pod_uid` is normalized with dashes. `qos` is the pod's QoS class as
    /// the Kubernetes API spells it: `Guaranteed`, `Burstable` or `BestEffort`.
    /// `runtime` is set only where the cgroup name tells it (systemd driver, cri-o).
    KubernetesPod {
        pod_uid: String,
        qos: Option<String>,
        container_id: Option<String>,
        runtime: Option<ContainerRuntime>,
    },
    /// A container outside Kubernetes, with its full id.
    Container {
        runtime: ContainerRuntime,
        id: String,
    },
    /// A system service, e.g. `nginx.service`.
    SystemdUnit { unit: String },
    /// A unit under the user manager `user@UID.service`.
    SystemdUserUnit { unit: String, uid: u32 },
    /// A system scope, e.g. `session-3.scope` (with the uid of its `user-UID.slice`).
    SystemdScope { scope: String, uid: Option<u32> },
    /// The root cgroup, or nothing recognizable.
    None,
}

/// The container runtime that created a container's cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ContainerRuntime {
    Docker,
    Containerd,
    CriO,
    Podman,
}

impl ContainerRuntime {
    /// The runtime's name as its users write it: `docker`, `containerd`, `cri-o`, `podman`.
    pub fn name(self) -> &'static str {
        match self {
            ContainerRuntime::Docker => "docker",
            ContainerRuntime::Containerd => "containerd",
            ContainerRuntime::CriO => "cri-o",
            ContainerRuntime::Podman => "podman",
        }
    }
}

/// The Slurm job named by the environment (NUL-separated `KEY=VALUE`, as /proc/PID/environ
/// gives it) of a process running as `uid`: SLURM_JOB_ID, and SLURM_STEP_ID as its step.
/// Anyone can set these, so the owner carries `uid`: it is that user's claim.
pub fn slurm_job_from_environ(environ: &[u8], uid: u32) -> Option<Owner> {
    let mut job_id = None;
    let mut step = None;
    for entry in environ.split(|b| *b == 0) {
        if let Some(value) = entry.strip_prefix(b"SLURM_JOB_ID=") {
            job_id = std::str::from_utf8(value).ok()?.trim().parse::<u64>().ok();
        } else if let Some(value) = entry.strip_prefix(b"SLURM_STEP_ID=") {
            step = std::str::from_utf8(value)
                .ok()
                .map(str::trim)
                .filter(|v| {
                    !v.is_empty() && v.len() <= 32 && v.bytes().all(|b| b.is_ascii_alphanumeric())
                })
                .map(str::to_string);
        }
    }
    Some(Owner::SlurmJob {
        job_id: job_id?,
        step,
        uid: Some(uid),
        from_environ: true,
    })
}

impl Owner {
    /// A short label for a table column, at most [`LABEL_MAX_CHARS`] characters (longer ones
    /// end in `…`):
    ///
    /// * `slurm 123.0`, `slurm 123.batch`, `slurm 123` (no step known)
    /// * `k8s pod 1a2b3c4d` (first 8 characters of the pod UID)
    /// * `docker 3f2a1b4c5d6e`, `containerd …`, `cri-o …`, `podman …` (12-character id, as
    ///   `docker ps` shows it)
    /// * `nginx.service` (system unit), `session-3.scope` (scope)
    /// * `user 1000: jupyter.service` (unit of a user manager)
    /// * `-` for none
    pub fn label(&self) -> String {
        let full = match self {
            Owner::SlurmJob {
                job_id,
                step: Some(step),
                from_environ,
                ..
            } => format!(
                "slurm {job_id}.{step}{}",
                if *from_environ { " (env)" } else { "" }
            ),
            Owner::SlurmJob {
                job_id,
                from_environ,
                ..
            } => format!(
                "slurm {job_id}{}",
                if *from_environ { " (env)" } else { "" }
            ),
            Owner::KubernetesPod { pod_uid, .. } => format!("k8s pod {}", prefix_chars(pod_uid, 8)),
            Owner::Container { runtime, id } => {
                format!("{} {}", runtime.name(), prefix_chars(id, 12))
            }
            Owner::SystemdUnit { unit } => unit.clone(),
            Owner::SystemdUserUnit { unit, uid } => format!("user {uid}: {unit}"),
            Owner::SystemdScope { scope, .. } => scope.clone(),
            Owner::None => "-".to_string(),
        };
        truncate_label(full)
    }
}

/// An owner as a selector names it: `slurm:JOBID`, `pod:UID`, `container:ID`, `unit:NAME`,
/// `scope:NAME`. Pod UIDs and container ids may be given by a unique-looking prefix of at
/// least 8 characters, as `docker ps` shows 12. Ordered so that it can key a total.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OwnerMatch {
    /// The job, however a process is tied to it (its cgroup, or its environment).
    SlurmJob(u64),
    /// `slurm:JOBID@UID`: the processes of uid UID whose environment, not a cgroup, names
    /// the job. The key such a claim is kept under (peaks), apart from the job's own, so
    /// that no other user's claim reaches the job's account.
    SlurmClaim {
        job_id: u64,
        uid: u32,
    },
    Pod(String),
    Container(String),
    Unit(String),
    Scope(String),
}

impl std::str::FromStr for OwnerMatch {
    type Err = String;

    fn from_str(text: &str) -> Result<OwnerMatch, String> {
        let usage = || {
            format!(
                "'{text}' is not an owner: give slurm:JOBID, pod:UID, container:ID, unit:NAME or \
                 scope:NAME"
            )
        };
        let (kind, id) = text.split_once(':').ok_or_else(usage)?;
        let id = id.trim();
        if id.is_empty() {
            return Err(usage());
        }
        let prefix = |id: &str| {
            if id.len() >= 8 {
                Ok(id.to_ascii_lowercase())
            } else {
                Err(format!("'{text}': give at least 8 characters of the id"))
            }
        };
        match kind {
            "slurm" | "slurm-job" => {
                let number = |id: &str| {
                    parse_digits(id).ok_or_else(|| format!("'{text}': a Slurm job id is a number"))
                };
                match id.split_once('@') {
                    Some((job, uid)) => Ok(OwnerMatch::SlurmClaim {
                        job_id: number(job)?,
                        uid: parse_digits(uid).ok_or_else(|| {
                            format!("'{text}': give slurm:JOBID@UID, a uid number")
                        })?,
                    }),
                    None => number(id).map(OwnerMatch::SlurmJob),
                }
            }
            "pod" => prefix(id).map(OwnerMatch::Pod),
            "container" => prefix(id).map(OwnerMatch::Container),
            "unit" => Ok(OwnerMatch::Unit(id.to_string())),
            "scope" => Ok(OwnerMatch::Scope(id.to_string())),
            _ => Err(usage()),
        }
    }
}

/// The selector form: what [`OwnerMatch::from_str`](std::str::FromStr) reads back.
impl std::fmt::Display for OwnerMatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OwnerMatch::SlurmJob(job_id) => write!(f, "slurm:{job_id}"),
            OwnerMatch::SlurmClaim { job_id, uid } => write!(f, "slurm:{job_id}@{uid}"),
            OwnerMatch::Pod(uid) => write!(f, "pod:{uid}"),
            OwnerMatch::Container(id) => write!(f, "container:{id}"),
            OwnerMatch::Unit(unit) => write!(f, "unit:{unit}"),
            OwnerMatch::Scope(scope) => write!(f, "scope:{scope}"),
        }
    }
}

impl OwnerMatch {
    /// The selector's kind, the part before the colon: `slurm`, `pod`, `container`, `unit`,
    /// `scope`.
    pub fn kind(&self) -> &'static str {
        match self {
            OwnerMatch::SlurmJob(_) | OwnerMatch::SlurmClaim { .. } => "slurm",
            OwnerMatch::Pod(_) => "pod",
            OwnerMatch::Container(_) => "container",
            OwnerMatch::Unit(_) => "unit",
            OwnerMatch::Scope(_) => "scope",
        }
    }

    /// The selector that names `owner` (its key, written with `to_string`: `slurm:123`),
    /// or `None` for no owner. A Slurm job is named without its step and a pod without its
    /// container, so every process of the job or pod has one key. A job only the environment
    /// names is its user's claim, `slurm:123@1000`, kept apart from the job a cgroup names:
    /// anyone can set SLURM_JOB_ID, and only the job's own user's claim is the job's.
    pub fn of(owner: &Owner) -> Option<OwnerMatch> {
        Some(match owner {
            Owner::SlurmJob {
                job_id,
                from_environ: true,
                uid,
                ..
            } => OwnerMatch::SlurmClaim {
                job_id: *job_id,
                // A claim by no known user is no one's to account.
                uid: (*uid)?,
            },
            Owner::SlurmJob { job_id, .. } => OwnerMatch::SlurmJob(*job_id),
            Owner::KubernetesPod { pod_uid, .. } => OwnerMatch::Pod(pod_uid.to_ascii_lowercase()),
            Owner::Container { id, .. } => OwnerMatch::Container(id.to_ascii_lowercase()),
            Owner::SystemdUnit { unit } | Owner::SystemdUserUnit { unit, .. } => {
                OwnerMatch::Unit(unit.clone())
            }
            Owner::SystemdScope { scope, .. } => OwnerMatch::Scope(scope.clone()),
            Owner::None => return None,
        })
    }

    pub fn matches(&self, owner: &Owner) -> bool {
        match (self, owner) {
            (OwnerMatch::SlurmJob(wanted), Owner::SlurmJob { job_id, .. }) => wanted == job_id,
            (
                OwnerMatch::SlurmClaim {
                    job_id: wanted,
                    uid: claimant,
                },
                Owner::SlurmJob {
                    job_id,
                    uid,
                    from_environ: true,
                    ..
                },
            ) => wanted == job_id && *uid == Some(*claimant),
            (OwnerMatch::Pod(wanted), Owner::KubernetesPod { pod_uid, .. }) => {
                pod_uid.to_ascii_lowercase().starts_with(wanted)
            }
            (OwnerMatch::Container(wanted), Owner::Container { id, .. })
            | (
                OwnerMatch::Container(wanted),
                Owner::KubernetesPod {
                    container_id: Some(id),
                    ..
                },
            ) => id.to_ascii_lowercase().starts_with(wanted),
            (OwnerMatch::Unit(wanted), Owner::SystemdUnit { unit })
            | (OwnerMatch::Unit(wanted), Owner::SystemdUserUnit { unit, .. }) => wanted == unit,
            (OwnerMatch::Scope(wanted), Owner::SystemdScope { scope, .. }) => wanted == scope,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
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
            }
        );
    }

    #[test]
    fn kubernetes_cgroupfs_static_pod_and_nesting() {
        let p = format!(
            "/docker/{ID64}/kubepods/besteffort/pod5b4e1c0f9a8d7e6b5c4d3e2f1a0b9c8d/{ID64}"
        );
        assert_eq!(
            v2(&p),
            Owner::KubernetesPod {
                pod_uid: "5b4e1c0f9a8d7e6b5c4d3e2f1a0b9c8d".into(),
                qos: Some("BestEffort".into()),
                container_id: Some(ID64.into()),
                runtime: None,
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
        assert!(OwnerMatch::SlurmJob(4242).matches(&owner));
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
}
