//! The host service's side (`gpuctl serve`): the reply to one caller, from a host snapshot
//! and its findings. The protocol and the client are [`crate::service`].

use std::collections::HashMap;

use crate::classify::Finding;
use crate::service::caller::Caller;
use crate::service::{CallerInfo, GpuReply, ProcessReply, Reply, SCHEMA};
use crate::snapshot::Snapshot;

/// The reply for `caller`: on each GPU, the processes in its PID namespace or below it
/// (for a caller in the host's namespace, its own processes, or every one for root: what
/// it could read from /proc itself), numbered as it numbers them; the rest only as one sum.
pub fn answer(snapshot: &Snapshot, findings: &[Finding], caller: &Caller) -> Reply {
    let finding_of: HashMap<u32, String> = findings
        .iter()
        .filter_map(|f| {
            let identity = f.identity?;
            let kind = serde_json::to_value(f.kind).ok()?.as_str()?.to_string();
            Some((identity.pid, kind))
        })
        .collect();
    // Each host pid is looked up once, whatever the GPUs it is on; each namespace once.
    let mut local: HashMap<u32, Option<u32>> = HashMap::new();
    let mut below = HashMap::new();
    let host = caller.in_host_namespace();
    let gpus = snapshot
        .devices
        .iter()
        .filter_map(|gpu| {
            let uuid = gpu.uuid.clone()?;
            let mut outside_bytes = 0u64;
            let mut processes = Vec::new();
            for process in &gpu.processes {
                let facts = &process.host;
                let mine = facts.confirmed
                    && facts.start_ticks.is_some()
                    && (!host || caller.host_uid == 0 || facts.uid == Some(caller.host_uid));
                let local_pid = match mine {
                    true => *local
                        .entry(process.pid)
                        .or_insert_with(|| caller.local_pid_of(process.pid, &mut below)),
                    false => None,
                };
                let (Some(pid), Some(started)) = (local_pid, facts.start_ticks) else {
                    outside_bytes += process.used_bytes.unwrap_or(0);
                    continue;
                };
                processes.push(ProcessReply {
                    pid,
                    start_ticks: caller.local_start(started),
                    used_bytes: process.used_bytes,
                    kind: type_name(process.kind),
                    sm_util_pct: process.sm_util_pct,
                    gpu_instance_id: process.gpu_instance_id,
                    compute_instance_id: process.compute_instance_id,
                    uid: facts.uid.map(|uid| caller.map_uid(uid)),
                    finding: finding_of.get(&process.pid).cloned(),
                    mps: process.mps,
                });
            }
            Some(GpuReply {
                uuid,
                outside_bytes,
                processes,
            })
        })
        .collect();
    Reply {
        schema: SCHEMA,
        caller: CallerInfo {
            pid: caller.local_pid,
            uid: caller.local_uid(),
            pid_namespace: caller.pid_namespace,
            host_pid_namespace: host,
        },
        gpus,
    }
}

/// A process type as `gpuctl info --json` names it.
fn type_name(kind: crate::snapshot::ProcessType) -> String {
    serde_json::to_value(kind)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_else(|| "compute".into())
}
