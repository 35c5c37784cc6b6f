//! Per-user and per-owner totals of a snapshot: who holds how much GPU memory, on which GPUs.
//! What a fair-share conversation on a shared server starts from (`gpuctl info --by`).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::ser::{Serialize, SerializeMap, Serializer};

use super::Snapshot;
use crate::host::HostProcess;
use crate::owner::{Owner, PodName};
use crate::pidmap::PidMap;

/// What the totals are grouped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    User,
    Owner,
    /// The Kubernetes namespace of a pod the runtime named.
    Namespace,
}

impl By {
    /// The JSON key and the table header of the group's name.
    pub fn key(self) -> &'static str {
        match self {
            By::User => "user",
            By::Owner => "owner",
            By::Namespace => "namespace",
        }
    }
}

/// One user's or owner's holdings. A process on several GPUs counts on each, as NVML
/// reports its memory per GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Total {
    pub by: By,
    pub name: String,
    pub used_bytes: u64,
    pub gpus: Vec<u32>,
    /// Distinct processes (a process on two GPUs is one).
    pub processes: usize,
}

impl Serialize for Total {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(4))?;
        map.serialize_entry(self.by.key(), &self.name)?;
        map.serialize_entry("used_bytes", &self.used_bytes)?;
        map.serialize_entry("gpus", &self.gpus)?;
        map.serialize_entry("processes", &self.processes)?;
        map.end()
    }
}

/// The group a process belongs to: its user name (else uid, else "?"), or its owner at the
/// level people share by: the Slurm job (not the step), the pod (not the container);
/// "(no owner)" for a process in no unit, container or job, "?" where it cannot be read.
/// By namespace: a pod's, as the runtime named it; "(pod not named)" for a pod it did not
/// name, "(not in a pod)" for any other process.
pub fn group_of(host: &HostProcess, by: By) -> String {
    match by {
        By::User => host
            .user
            .clone()
            .or_else(|| host.uid.map(|uid| uid.to_string()))
            .unwrap_or_else(|| "?".to_string()),
        By::Owner => match &host.owner {
            None => "?".to_string(),
            Some(Owner::None) => "(no owner)".to_string(),
            // An environment claim is its user's, never summed with the job's own.
            Some(Owner::SlurmJob {
                job_id,
                from_environ: true,
                uid,
                ..
            }) => match uid {
                Some(uid) => format!("slurm {job_id} (env, uid {uid})"),
                None => format!("slurm {job_id} (env)"),
            },
            Some(Owner::SlurmJob { job_id, .. }) => format!("slurm {job_id}"),
            Some(Owner::KubernetesPod { pod: Some(pod), .. }) => PodName {
                container: None,
                ..pod.clone()
            }
            .label(),
            Some(owner) => owner.label(),
        },
        By::Namespace => match &host.owner {
            None => "?".to_string(),
            Some(Owner::KubernetesPod { pod: Some(pod), .. }) => pod.namespace.clone(),
            Some(Owner::KubernetesPod { .. }) => "(pod not named)".to_string(),
            Some(_) => "(not in a pod)".to_string(),
        },
    }
}

/// Totals, largest first (then by name).
pub fn totals(snapshot: &Snapshot, by: By) -> Vec<Total> {
    sums(snapshot, |host| group_of(host, by))
        .into_iter()
        .map(|sum| Total {
            by,
            name: sum.key,
            used_bytes: sum.used_bytes,
            gpus: sum.gpus,
            processes: sum.processes,
        })
        .collect()
}

/// One group's holdings under any key (what [`Total`] is for a name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sum<K> {
    pub key: K,
    pub used_bytes: u64,
    pub gpus: Vec<u32>,
    /// Distinct processes (a process on two GPUs is one).
    pub processes: usize,
}

/// The holdings of each group `key` puts a process in, largest first (then by key): the one
/// summing road for `info --by` and the watchdog's metrics, which key processes differently
/// (a name to show, a selector to scrape).
pub fn sums<K: Ord>(snapshot: &Snapshot, mut key: impl FnMut(&HostProcess) -> K) -> Vec<Sum<K>> {
    #[derive(Default)]
    struct Acc {
        used_bytes: u64,
        /// In the snapshot's order, each once (a GPU's processes come together).
        gpus: Vec<u32>,
        processes: usize,
    }
    let mut groups: BTreeMap<K, usize> = BTreeMap::new();
    let mut accs: Vec<Acc> = Vec::new();
    // A process listed on several GPUs carries the same host facts (one Arc) on each: its
    // group is worked out once per pid, not once per GPU (the watchdog sums every loop).
    // Other facts for the same pid (a listing found to be of a reused pid) are grouped anew.
    let listed = snapshot.devices.first().map_or(0, |g| g.processes.len());
    let mut seen: PidMap<u32, (*const HostProcess, usize)> =
        PidMap::with_capacity_and_hasher(listed, Default::default());
    for gpu in &snapshot.devices {
        for process in &gpu.processes {
            let host = Arc::as_ptr(&process.host);
            let mut group_of = |host: &HostProcess| {
                let next = accs.len();
                *groups.entry(key(host)).or_insert_with(|| {
                    accs.push(Acc::default());
                    next
                })
            };
            let group = match seen.get(&process.pid) {
                Some(&(facts, group)) if facts == host => group,
                Some(&(_, before)) => {
                    let group = group_of(&process.host);
                    if group != before {
                        accs[group].processes += 1;
                    }
                    group
                }
                None => {
                    let group = group_of(&process.host);
                    seen.insert(process.pid, (host, group));
                    accs[group].processes += 1;
                    group
                }
            };
            let acc = &mut accs[group];
            acc.used_bytes = acc
                .used_bytes
                .saturating_add(process.used_bytes.unwrap_or(0));
            if acc.gpus.last() != Some(&gpu.index) {
                acc.gpus.push(gpu.index);
            }
        }
    }
    let mut out: Vec<Sum<K>> = groups
        .into_iter()
        .map(|(key, group)| {
            let acc = std::mem::take(&mut accs[group]);
            let mut gpus = acc.gpus;
            gpus.sort_unstable();
            gpus.dedup();
            Sum {
                key,
                used_bytes: acc.used_bytes,
                gpus,
                processes: acc.processes,
            }
        })
        .collect();
    out.sort_by(|a, b| {
        b.used_bytes
            .cmp(&a.used_bytes)
            .then_with(|| a.key.cmp(&b.key))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;
    use crate::snapshot::GpuProcess;

    fn process(pid: u32, used_gib: Option<u64>, user: Option<&str>, owner: Owner) -> GpuProcess {
        fixtures::process(pid)
            .used_bytes(used_gib.map(|g| g << 30))
            .confirmed()
            .uid(1000 + pid)
            .owner(Some(owner))
            .host(|host| host.user = user.map(str::to_string))
            .build()
    }

    fn job(job_id: u64, step: &str) -> Owner {
        Owner::SlurmJob {
            job_id,
            step: Some(step.to_string()),
            uid: None,
            from_environ: false,
        }
    }

    fn snapshot() -> Snapshot {
        let unit = Owner::SystemdUnit {
            unit: "vllm.service".into(),
        };
        Snapshot::of(vec![
            fixtures::gpu(
                0,
                vec![
                    process(10, Some(40), Some("alice"), job(7, "0")),
                    process(11, Some(1), Some("alice"), job(7, "batch")),
                    process(20, Some(30), Some("bob"), unit.clone()),
                ],
            ),
            // pid 10 on a second GPU: counted there too, one process.
            fixtures::gpu(
                1,
                vec![
                    process(10, Some(40), Some("alice"), job(7, "0")),
                    process(30, None, None, Owner::None),
                ],
            ),
        ])
    }

    #[test]
    fn users_sum_their_processes_on_every_gpu() {
        let by_user = totals(&snapshot(), By::User);
        let view: Vec<(&str, u64, Vec<u32>, usize)> = by_user
            .iter()
            .map(|t| {
                (
                    t.name.as_str(),
                    t.used_bytes >> 30,
                    t.gpus.clone(),
                    t.processes,
                )
            })
            .collect();
        assert_eq!(
            view,
            vec![
                ("alice", 81, vec![0, 1], 2),
                ("bob", 30, vec![0], 1),
                // No user name: the uid; memory not reported counts as none.
                ("1030", 0, vec![1], 1),
            ]
        );
    }

    #[test]
    fn owners_group_a_jobs_steps_together() {
        let by_owner = totals(&snapshot(), By::Owner);
        let names: Vec<(&str, u64)> = by_owner
            .iter()
            .map(|t| (t.name.as_str(), t.used_bytes >> 30))
            .collect();
        assert_eq!(
            names,
            vec![("slurm 7", 81), ("vllm.service", 30), ("(no owner)", 0)]
        );
        let json = serde_json::to_value(&by_owner[0]).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"owner": "slurm 7", "used_bytes": 81u64 << 30, "gpus": [0, 1], "processes": 2})
        );
    }

    #[test]
    fn an_environment_claim_is_its_users_total_not_the_jobs() {
        let claim = |uid| Owner::SlurmJob {
            job_id: 7,
            step: None,
            uid,
            from_environ: true,
        };
        let host = |owner| process(1, Some(1), None, owner).host.as_ref().clone();
        assert_eq!(group_of(&host(job(7, "0")), By::Owner), "slurm 7");
        assert_eq!(
            group_of(&host(claim(Some(1001))), By::Owner),
            "slurm 7 (env, uid 1001)"
        );
        assert_eq!(group_of(&host(claim(None)), By::Owner), "slurm 7 (env)");
    }
}
