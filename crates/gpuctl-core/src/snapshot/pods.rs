//! Kubernetes pods by namespace and name. A process's cgroup names its pod only by UID
//! (and its container by id); the node's container runtime knows the names, and is asked
//! over its CRI socket ([`crate::cri`]) at most once a snapshot, only when a process of a
//! pod not named yet is on a GPU, and under a deadline of its own. Names never change for
//! a UID or a container id, so a long-running reader (the watchdog, `top`) keeps them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::last_known::LastKnown;
use super::{GpuProcess, Snapshot};
use crate::config;
use crate::cri::{self, Runtime};
use crate::owner::{Owner, PodName};

/// How long a snapshot waits for the runtime, unless configured.
pub const DEFAULT_RUNTIME_TIMEOUT: Duration = Duration::from_secs(1);

/// After a failed ask, how long a long-running reader (the watchdog, `top`, `info --watch`)
/// shows the failure instead of asking again: a hanging runtime costs its timeout at most
/// this often, not every refresh.
const RETRY_AFTER: Duration = Duration::from_secs(30);

/// How the runtime was asked for a snapshot's pods: `gpuctl info --json`'s `pod_runtime`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RuntimeUse {
    /// The socket asked; `None` where none was configured or found.
    pub socket: Option<PathBuf>,
    /// Why its pods are shown by UID; `None` when it answered.
    pub error: Option<String>,
    /// The UIDs (lowercase) of the pods it has a ready sandbox for: their processes are
    /// alive, whatever their ancestry says after a container restarted.
    #[serde(skip)]
    pub ready_pod_uids: BTreeSet<String>,
    /// The UIDs (lowercase) of every pod it has a sandbox for, in any state. Only an answer
    /// (`error` is `None`) says anything of a pod missing here: a runtime that is down or
    /// slow has lost no pod.
    #[serde(skip)]
    pub known_pod_uids: BTreeSet<String>,
    /// The pods of this snapshot's processes that it answered it does not have, by UID
    /// (lowercase), with the namespace and name they had when this same socket last named
    /// them ([`super::last_known`]); a UID without a name here was never seen named.
    #[serde(skip)]
    pub gone_pods: BTreeMap<String, (String, String)>,
}

/// The names learned from the runtime, and where to ask for more.
#[derive(Debug, Clone)]
pub struct PodNames {
    socket: Option<PathBuf>,
    timeout: Duration,
    by_container: HashMap<String, PodName>,
    /// Namespace and name by pod UID (lowercase, with dashes).
    by_uid: HashMap<String, (String, String)>,
    /// The last failed ask, and when to ask again.
    failed: Option<(RuntimeUse, Instant)>,
    /// The names of the pods seen on a GPU, kept for after the runtime forgets them.
    last_known: LastKnown,
}

impl PodNames {
    /// As `[kubernetes]` says (the defaults without it).
    pub fn configured(kubernetes: &config::Kubernetes) -> PodNames {
        PodNames {
            socket: kubernetes.runtime_socket.clone(),
            timeout: kubernetes
                .runtime_timeout
                .unwrap_or(DEFAULT_RUNTIME_TIMEOUT),
            by_container: HashMap::new(),
            by_uid: HashMap::new(),
            failed: None,
            last_known: LastKnown::default(),
        }
    }

    /// Keeps the names of the pods seen on a GPU in `file` (see [`super::last_known`]), so
    /// that a pod's leftover is named after the runtime removed the pod.
    pub fn remembering(mut self, file: Option<PathBuf>) -> PodNames {
        self.last_known = LastKnown::at(file);
        self
    }

    /// Names every pod process of `snapshot` that the runtime names, asking it first (its
    /// pods' names and which of them run); how it was asked goes into
    /// `snapshot.pod_runtime`. Nothing is asked without a pod's process on a GPU.
    pub fn name(&mut self, snapshot: &mut Snapshot) {
        let mut uids = BTreeSet::new();
        for_each_process(snapshot, &mut |process| {
            if let Some(Owner::KubernetesPod { pod_uid, .. }) = &process.host.owner {
                uids.insert(pod_uid.to_ascii_lowercase());
            }
        });
        if uids.is_empty() {
            return;
        }
        if let Some((failure, retry_at)) = &self.failed
            && Instant::now() < *retry_at
        {
            snapshot.pod_runtime = Some(failure.clone());
            return;
        }
        let mut asked = self.ask();
        self.failed = asked
            .error
            .is_some()
            .then(|| (asked.clone(), Instant::now() + RETRY_AFTER));
        if asked.error.is_none() {
            self.remember(&uids, &mut asked);
        }
        snapshot.pod_runtime = Some(asked);
        for_each_process(snapshot, &mut |process| self.apply(process));
    }

    /// After an answer: keeps the names of the GPU's pods the runtime has, and looks up
    /// the last known names of those it answered it does not have.
    fn remember(&mut self, uids: &BTreeSet<String>, asked: &mut RuntimeUse) {
        let Some(socket) = asked.socket.clone() else {
            return;
        };
        let (present, gone): (Vec<&String>, Vec<&String>) = uids
            .iter()
            .partition(|uid| asked.known_pod_uids.contains(*uid));
        let seen: Vec<(String, String, String)> = present
            .into_iter()
            .filter_map(|uid| {
                let (namespace, name) = self.by_uid.get(uid)?;
                Some((uid.clone(), namespace.clone(), name.clone()))
            })
            .collect();
        let now = crate::units::unix_whole_seconds();
        self.last_known.remember(&seen, &socket, now);
        for uid in gone {
            if let Some(names) = self.last_known.name(uid, &socket) {
                // A UID's names never change: they name its processes as before.
                self.by_uid.insert(uid.clone(), names.clone());
                asked.gone_pods.insert(uid.clone(), names);
            }
        }
    }

    fn lookup(&self, pod_uid: &str, container_id: Option<&str>) -> Option<PodName> {
        if let Some(named) = container_id.and_then(|id| self.by_container.get(id)) {
            return Some(named.clone());
        }
        let (namespace, name) = self.by_uid.get(&pod_uid.to_ascii_lowercase())?;
        Some(PodName {
            namespace: namespace.clone(),
            name: name.clone(),
            container: None,
        })
    }

    fn apply(&self, process: &mut GpuProcess) {
        let Some(Owner::KubernetesPod {
            pod_uid,
            container_id,
            ..
        }) = &process.host.owner
        else {
            return;
        };
        let Some(named) = self.lookup(pod_uid, container_id.as_deref()) else {
            return;
        };
        let host = Arc::make_mut(&mut process.host);
        if let Some(Owner::KubernetesPod { pod, .. }) = &mut host.owner {
            *pod = Some(named);
        }
    }

    /// One conversation with the runtime: its pods, then its containers.
    fn ask(&mut self) -> RuntimeUse {
        let Some(socket) = self.socket.clone().or_else(cri::detect_socket) else {
            return RuntimeUse {
                socket: None,
                ready_pod_uids: BTreeSet::new(),
                known_pod_uids: BTreeSet::new(),
                gone_pods: BTreeMap::new(),
                error: Some(format!(
                    "no container runtime socket (looked for {}; set [kubernetes] runtime_socket)",
                    cri::RUNTIME_SOCKETS.join(", ")
                )),
            };
        };
        let deadline = Instant::now() + self.timeout;
        let answer = Runtime::connect(&socket, deadline)
            .and_then(|mut runtime| Ok((runtime.pods()?, runtime.containers()?)));
        let (mut ready_pod_uids, mut known_pod_uids) = (BTreeSet::new(), BTreeSet::new());
        let error = match answer {
            Ok((pods, containers)) => {
                known_pod_uids = pods
                    .iter()
                    .map(|pod| pod.uid.to_ascii_lowercase())
                    .collect();
                ready_pod_uids = pods
                    .iter()
                    .filter(|pod| pod.ready)
                    .map(|pod| pod.uid.to_ascii_lowercase())
                    .collect();
                self.learn(pods, containers);
                None
            }
            Err(cri::CriError::Deadline) => Some(format!(
                "{} did not answer within {}",
                socket.display(),
                humantime::format_duration(self.timeout)
            )),
            Err(error) => Some(format!("{}: {error}", socket.display())),
        };
        RuntimeUse {
            socket: Some(socket),
            error,
            ready_pod_uids,
            known_pod_uids,
            gone_pods: BTreeMap::new(),
        }
    }

    fn learn(&mut self, pods: Vec<cri::PodSandbox>, containers: Vec<cri::Container>) {
        let mut by_sandbox = HashMap::new();
        for pod in pods {
            let names = (pod.namespace, pod.name);
            self.by_uid
                .insert(pod.uid.to_ascii_lowercase(), names.clone());
            by_sandbox.insert(pod.id, names);
        }
        for container in containers {
            if let Some((namespace, name)) = by_sandbox.get(&container.pod_sandbox_id) {
                self.by_container.insert(
                    container.id,
                    PodName {
                        namespace: namespace.clone(),
                        name: name.clone(),
                        container: Some(container.name),
                    },
                );
            }
        }
    }
}

fn for_each_process(snapshot: &mut Snapshot, each: &mut dyn FnMut(&mut GpuProcess)) {
    for gpu in &mut snapshot.devices {
        gpu.processes.iter_mut().for_each(&mut *each);
        for mig in &mut gpu.mig_devices {
            mig.processes.iter_mut().for_each(&mut *each);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{one_gpu, process};

    fn pod_process(pid: u32, uid: &str, container: Option<&str>) -> GpuProcess {
        process(pid)
            .owner(Some(Owner::KubernetesPod {
                pod_uid: uid.into(),
                qos: Some("Burstable".into()),
                container_id: container.map(str::to_string),
                runtime: None,
                pod: None,
            }))
            .build()
    }

    fn names(snapshot: &Snapshot) -> Vec<String> {
        snapshot.devices[0]
            .processes
            .iter()
            .map(|p| p.host.owner.as_ref().unwrap().label())
            .collect()
    }

    #[test]
    fn names_by_container_id_and_else_by_pod_uid() {
        let mut names_ = PodNames::configured(&config::Kubernetes::default());
        names_.learn(
            vec![cri::PodSandbox {
                id: "sandbox".into(),
                name: "trainer-0".into(),
                namespace: "ml".into(),
                uid: "AAAA-1".into(),
                ready: true,
            }],
            vec![cri::Container {
                id: "c1".into(),
                pod_sandbox_id: "sandbox".into(),
                name: "trainer".into(),
                ..cri::Container::default()
            }],
        );
        let mut snapshot = one_gpu(vec![
            pod_process(10, "aaaa-1", Some("c1")),
            pod_process(11, "aaaa-1", Some("c-unknown")),
            pod_process(12, "bbbb-2", None),
        ]);
        // Every pod is named but one: the runtime would be asked; here nothing answers.
        names_.socket = Some("/nonexistent/gpuctl-test.sock".into());
        names_.name(&mut snapshot);
        assert_eq!(
            names(&snapshot),
            [
                "pod ml/trainer-0 (container trainer)",
                "pod ml/trainer-0",
                "k8s pod bbbb-2"
            ]
        );
        let error = snapshot.pod_runtime.unwrap().error.unwrap();
        assert!(error.contains("cannot connect"), "{error}");
    }

    #[test]
    fn a_runtime_that_does_not_answer_is_asked_again_only_after_a_while() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("hanging.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        listener.set_nonblocking(true).unwrap();
        let mut names_ = PodNames::configured(&config::Kubernetes {
            runtime_socket: Some(socket),
            runtime_timeout: Some(Duration::from_millis(50)),
        });
        let take = |names_: &mut PodNames| {
            let mut snapshot = one_gpu(vec![pod_process(10, "aaaa-1", Some("c1"))]);
            names_.name(&mut snapshot);
            snapshot.pod_runtime.unwrap().error.unwrap()
        };
        assert!(take(&mut names_).contains("did not answer within 50ms"));
        assert!(listener.accept().is_ok(), "the first snapshot asked");
        assert!(take(&mut names_).contains("did not answer within 50ms"));
        assert!(
            listener.accept().is_err(),
            "the second one did not ask again"
        );
    }

    #[test]
    fn a_node_without_pod_processes_asks_nothing() {
        let mut names_ = PodNames::configured(&config::Kubernetes::default());
        let mut snapshot = one_gpu(vec![process(10).owner(Some(Owner::None)).build()]);
        names_.name(&mut snapshot);
        assert!(snapshot.pod_runtime.is_none());
    }
}
