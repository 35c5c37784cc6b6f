//! Kubernetes pods by namespace and name. A process's cgroup names its pod only by UID
//! (and its container by id); the node's container runtime knows the names, and is asked
//! over its CRI socket ([`crate::cri`]) at most once a snapshot, only when a process of a
//! pod not named yet is on a GPU, and under a deadline of its own. Names never change for
//! a UID or a container id, so a long-running reader (the watchdog, `top`) keeps them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::config;
use crate::cri::{self, Runtime};
use crate::owner::{Owner, PodName};
use crate::snapshot::{GpuProcess, Snapshot};

/// How long a snapshot waits for the runtime, unless configured.
pub const DEFAULT_RUNTIME_TIMEOUT: Duration = Duration::from_secs(1);

/// How the runtime was asked for a snapshot's pods: `gpuctl info --json`'s `pod_runtime`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RuntimeUse {
    /// The socket asked; `None` where none was configured or found.
    pub socket: Option<PathBuf>,
    /// Why its pods are shown by UID; `None` when it answered.
    pub error: Option<String>,
}

/// The names learned from the runtime, and where to ask for more.
#[derive(Debug, Clone)]
pub struct PodNames {
    socket: Option<PathBuf>,
    timeout: Duration,
    by_container: HashMap<String, PodName>,
    /// Namespace and name by pod UID (lowercase, with dashes).
    by_uid: HashMap<String, (String, String)>,
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
        }
    }

    /// Names every pod process of `snapshot` that the runtime names, asking it first where
    /// one is not named yet; how it was asked goes into `snapshot.pod_runtime`.
    pub fn name(&mut self, snapshot: &mut Snapshot) {
        let mut unnamed = false;
        for_each_process(snapshot, &mut |process| {
            if let Some(Owner::KubernetesPod {
                pod_uid,
                container_id,
                ..
            }) = &process.host.owner
            {
                unnamed |= self.lookup(pod_uid, container_id.as_deref()).is_none();
            }
        });
        if !unnamed {
            return;
        }
        snapshot.pod_runtime = Some(self.ask());
        for_each_process(snapshot, &mut |process| self.apply(process));
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
                error: Some(format!(
                    "no container runtime socket (looked for {}; set [kubernetes] runtime_socket)",
                    cri::RUNTIME_SOCKETS.join(", ")
                )),
            };
        };
        let deadline = Instant::now() + self.timeout;
        let answer = Runtime::connect(&socket, deadline)
            .and_then(|mut runtime| Ok((runtime.pods()?, runtime.containers()?)));
        let error = match answer {
            Ok((pods, containers)) => {
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
