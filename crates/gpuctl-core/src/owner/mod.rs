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
mod pod;

pub use cgroup::{CgroupInfo, parse_cgroup};
use cgroup::{parse_digits, prefix_chars, truncate_label};
pub use pod::{POD_LABEL_MAX_CHARS, PodName};

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
        /// The pod's namespace and name (and the container's), where the node's container
        /// runtime named them: the cgroup path carries only the UID.
        #[serde(skip_serializing_if = "Option::is_none")]
        pod: Option<PodName>,
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
    // Most environments name no job: one search instead of a look at every entry.
    memchr::memmem::find(environ, b"SLURM_")?;
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
    /// * `pod ml/trainer-0 (container trainer)` where the runtime named the pod (at most
    ///   [`POD_LABEL_MAX_CHARS`]), else `k8s pod 1a2b3c4d` (first 8 characters of its UID)
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
            Owner::KubernetesPod { pod: Some(pod), .. } => return pod.label(),
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

/// An owner as a selector names it: `slurm:JOBID`, `slurm:JOBID@UID`, `pod:UID`,
/// `container:ID`, `unit:NAME`, `unit:NAME@UID`, `scope:NAME`. Pod UIDs and container ids may be given by a
/// unique-looking prefix of at least 8 characters, as `docker ps` shows 12. Ordered so that
/// it can key a total. In JSON it is that string (serde reads and writes it).
///
/// Which claims count where: a cgroup Slurm put a process in names the job (`slurm:J`); a
/// `SLURM_JOB_ID` in a process's environment is only its user's claim (`slurm:J@UID`), and
/// counts for the job only where UID is the job's own user's ([`OwnerMatch::job`]): never
/// through `slurm:J` alone, so that nobody's environment puts a process into another
/// job's Xids, drain reason, account, kill or exemption. Likewise any user can start a
/// unit of any name under their own user manager, so `unit:NAME` is only the system
/// manager's unit; user UID's unit is `unit:NAME@UID`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OwnerMatch {
    /// The job as Slurm's cgroups name it.
    SlurmJob(u64),
    /// `slurm:JOBID@UID`: the processes of uid UID whose environment, not a cgroup, names
    /// the job. The key such a claim is kept under (peaks), apart from the job's own, so
    /// that no other user's claim reaches the job's account.
    SlurmClaim {
        job_id: u64,
        uid: u32,
    },
    Pod(String),
    /// `pod:NAMESPACE/NAME`: pods by the runtime's names, each part a glob
    /// (`pod:kube-system/*`).
    PodName {
        namespace: String,
        name: String,
    },
    /// `namespace:NAMESPACE` (a glob): every pod of the namespace.
    Namespace(String),
    Container(String),
    /// A unit of the system manager.
    Unit(String),
    /// `unit:NAME@UID`: the unit NAME of user UID's own manager (`user@UID.service`).
    UserUnit {
        unit: String,
        uid: u32,
    },
    Scope(String),
}

impl std::str::FromStr for OwnerMatch {
    type Err = String;

    fn from_str(text: &str) -> Result<OwnerMatch, String> {
        let usage = || {
            format!(
                "'{text}' is not an owner: give slurm:JOBID, pod:UID, pod:NAMESPACE/NAME, \
                 namespace:NAME, container:ID, unit:NAME, unit:NAME@UID or scope:NAME"
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
            "pod" => match id.split_once('/') {
                Some((namespace, name)) => {
                    if !pod::is_name_pattern(namespace) || !pod::is_name_pattern(name) {
                        return Err(format!(
                            "'{text}': give pod:NAMESPACE/NAME in lowercase letters, digits, \
                             '-' and '.', with * and ? as globs"
                        ));
                    }
                    Ok(OwnerMatch::PodName {
                        namespace: namespace.to_string(),
                        name: name.to_string(),
                    })
                }
                None => prefix(id).map(OwnerMatch::Pod),
            },
            "namespace" => match pod::is_name_pattern(id) {
                true => Ok(OwnerMatch::Namespace(id.to_string())),
                false => Err(format!(
                    "'{text}': a namespace is lowercase letters, digits and '-', with * and ? \
                     as globs"
                )),
            },
            "container" => prefix(id).map(OwnerMatch::Container),
            // Unit names end in their type (`.service`), so a last `@` followed by digits
            // alone is a uid, never part of a template instance (`getty@tty1.service`).
            "unit" => {
                let user_unit = id
                    .rsplit_once('@')
                    .and_then(|(unit, uid)| Some((unit, parse_digits::<u32>(uid)?)));
                Ok(match user_unit {
                    Some((unit, uid)) if !unit.is_empty() => OwnerMatch::UserUnit {
                        unit: unit.to_string(),
                        uid,
                    },
                    _ => OwnerMatch::Unit(id.to_string()),
                })
            }
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
            OwnerMatch::PodName { namespace, name } => write!(f, "pod:{namespace}/{name}"),
            OwnerMatch::Namespace(namespace) => write!(f, "namespace:{namespace}"),
            OwnerMatch::Container(id) => write!(f, "container:{id}"),
            OwnerMatch::Unit(unit) => write!(f, "unit:{unit}"),
            OwnerMatch::UserUnit { unit, uid } => write!(f, "unit:{unit}@{uid}"),
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
            OwnerMatch::Pod(_) | OwnerMatch::PodName { .. } => "pod",
            OwnerMatch::Namespace(_) => "namespace",
            OwnerMatch::Container(_) => "container",
            OwnerMatch::Unit(_) | OwnerMatch::UserUnit { .. } => "unit",
            OwnerMatch::Scope(_) => "scope",
        }
    }

    /// The selector that names `owner` (its key, written with `to_string`: `slurm:123`,
    /// `unit:jupyter.service@1000` for a user's own unit),
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
            Owner::SystemdUnit { unit } => OwnerMatch::Unit(unit.clone()),
            Owner::SystemdUserUnit { unit, uid } => OwnerMatch::UserUnit {
                unit: unit.clone(),
                uid: *uid,
            },
            Owner::SystemdScope { scope, .. } => OwnerMatch::Scope(scope.clone()),
            Owner::None => return None,
        })
    }

    /// The selectors of job `job_id` whose user is `job_uid`: the job its cgroups name, and
    /// that user's environment claims on it (proctrack/linuxproc). Without a known user,
    /// the cgroups alone: a claim by an unknown uid is no one's.
    pub fn job(job_id: u64, job_uid: Option<u32>) -> Vec<OwnerMatch> {
        let claim = job_uid.map(|uid| OwnerMatch::SlurmClaim { job_id, uid });
        std::iter::once(OwnerMatch::SlurmJob(job_id))
            .chain(claim)
            .collect()
    }

    /// Whether `owner` is the one this selector names. `slurm:J` is only the job a cgroup
    /// names; a claim from the environment is matched by `slurm:J@UID` of its own uid.
    pub fn matches(&self, owner: &Owner) -> bool {
        match (self, owner) {
            (
                OwnerMatch::SlurmJob(wanted),
                Owner::SlurmJob {
                    job_id,
                    from_environ: false,
                    ..
                },
            ) => wanted == job_id,
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
            (
                OwnerMatch::PodName { namespace, name },
                Owner::KubernetesPod { pod: Some(pod), .. },
            ) => pod::glob_matches(namespace, &pod.namespace) && pod::glob_matches(name, &pod.name),
            (OwnerMatch::Namespace(namespace), Owner::KubernetesPod { pod: Some(pod), .. }) => {
                pod::glob_matches(namespace, &pod.namespace)
            }
            (OwnerMatch::Container(wanted), Owner::Container { id, .. })
            | (
                OwnerMatch::Container(wanted),
                Owner::KubernetesPod {
                    container_id: Some(id),
                    ..
                },
            ) => id.to_ascii_lowercase().starts_with(wanted),
            (OwnerMatch::Unit(wanted), Owner::SystemdUnit { unit }) => wanted == unit,
            (
                OwnerMatch::UserUnit {
                    unit: wanted,
                    uid: wanted_uid,
                },
                Owner::SystemdUserUnit { unit, uid },
            ) => wanted == unit && wanted_uid == uid,
            (OwnerMatch::Scope(wanted), Owner::SystemdScope { scope, .. }) => wanted == scope,
            _ => false,
        }
    }
}

/// The selector form in JSON: `"slurm:812"`, `"slurm:812@1000"`, `"unit:vllm.service"`.
impl Serialize for OwnerMatch {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for OwnerMatch {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<OwnerMatch, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// For a field of a file gpuctl reads back (the Xid log): an owner that does not read as
/// one (a file from another version, or edited) is no owner, never the whole file lost.
pub fn lenient<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<OwnerMatch>, D::Error> {
    let text = <Option<serde_json::Value> as serde::Deserialize>::deserialize(d)?;
    Ok(text
        .as_ref()
        .and_then(serde_json::Value::as_str)
        .and_then(|t| t.parse().ok()))
}

#[cfg(test)]
mod tests;
