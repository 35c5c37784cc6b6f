//! Pod leftover: a process of a Kubernetes pod that the node's container runtime answered
//! it no longer has (its sandbox removed), still on a GPU: what a deleted or crashed pod
//! left behind, which nothing in Kubernetes will end any more.
//!
//! Only an answer counts: a runtime that is down, slow or unreachable has lost no pod
//! (`pod_runtime.error` is set, and this rule says nothing). The pod must also have been
//! seen named through the same socket ([`crate::snapshot::last_known`]): a UID this
//! runtime never had (another runtime's pod, a cgroup made by hand) is reported, not
//! reclaimed.

use super::{Facts, Held, Verdict};
use crate::host::ProcState;
use crate::owner::Owner;

pub(super) fn judge(facts: &Facts, h: &Held) -> Option<(Verdict, String)> {
    let Some(Owner::KubernetesPod { pod_uid, .. }) = &h.process.host.owner else {
        return None;
    };
    // Zombies are judged by their own rule; signals cannot end a D-state process.
    if matches!(
        h.process.host.state?,
        ProcState::DiskSleep | ProcState::Zombie | ProcState::Dead
    ) {
        return None;
    }
    let runtime = facts.snapshot.pod_runtime.as_ref()?;
    let socket = runtime.socket.as_ref()?;
    let uid = pod_uid.to_ascii_lowercase();
    if runtime.error.is_some() || runtime.known_pod_uids.contains(&uid) {
        return None;
    }
    let socket = socket.display();
    Some(match runtime.gone_pods.get(&uid) {
        Some((namespace, name)) => (
            Verdict::Reclaim,
            format!(
                "leftover of pod {namespace}/{name}: the container runtime ({socket}) answered \
                 that it no longer has the pod (UID {uid}), and this process still holds the GPU"
            ),
        ),
        None => (
            Verdict::Report,
            format!(
                "its pod (UID {uid}) is not among the container runtime's ({socket}) pods, but \
                 gpuctl never saw that runtime name it, so it is not reclaimed (end it with: \
                 gpuctl kill --pid {})",
                h.identity.pid
            ),
        ),
    })
}
