//! The scenario COMMAND reads: the launcher's, with the stand-ins' real pids in it.

use std::path::Path;

use nvml_sim::scenario;

use super::spawn::Standin;

/// The scenario with every `spawn` entry given its real pid and its workers appended, and
/// `device_dir` set to `dev_dir` (absolute: the resolved file lives elsewhere).
pub(super) fn resolve(
    path: &Path,
    text: &str,
    sc: &scenario::Scenario,
    started: &[(usize, Standin)],
    dev_dir: &Path,
) -> Result<String, String> {
    let mut table: toml::Table =
        toml::from_str(text).map_err(|e| format!("{}: {}", path.display(), e.message()))?;
    table.insert(
        "device_dir".into(),
        toml::Value::String(dev_dir.to_string_lossy().into_owned()),
    );
    if let Some(sf) = &sc.state_file {
        let abs = std::path::absolute(sf).unwrap_or_else(|_| sf.clone());
        table.insert(
            "state_file".into(),
            toml::Value::String(abs.to_string_lossy().into_owned()),
        );
    }
    if let Some(toml::Value::Array(procs)) = table.get_mut("process") {
        let mut extra = Vec::new();
        for (entry, standin) in started {
            let Some(toml::Value::Table(p)) = procs.get_mut(*entry) else {
                continue;
            };
            let spec = sc
                .spawns
                .iter()
                .find(|s| s.entry == *entry)
                .expect("spawn entry");
            for key in [
                "spawn",
                "workers",
                "worker_used_mib",
                "worker_sm_pct",
                "user",
                "cgroup",
                "crashed",
                "mps_active_thread_pct",
                "mps_pinned_mem_limit_mib",
            ] {
                p.remove(key);
            }
            p.insert("pid".into(), toml::Value::Integer(standin.pid.into()));
            for w in &standin.workers {
                extra.push(toml::Value::Table(worker_entry(p, spec, *w)));
            }
        }
        // A crashed run's main process is gone: only its workers are listed.
        let mut k = 0;
        procs.retain(|_| {
            k += 1;
            !sc.spawns.iter().any(|s| s.entry == k - 1 && s.crashed)
        });
        procs.extend(extra);
    }
    toml::to_string(&table).map_err(|e| format!("cannot write the resolved scenario: {e}"))
}

/// The process entry of one of a stand-in's workers, from its leader's entry `p`.
fn worker_entry(p: &toml::Table, spec: &scenario::SpawnSpec, pid: i32) -> toml::Table {
    let mut wt = toml::Table::new();
    wt.insert("pid".into(), toml::Value::Integer(pid.into()));
    if let Some(g) = p.get("gpu") {
        wt.insert("gpu".into(), g.clone());
    }
    // Workers share their leader's fate in NVML's eyes: hidden with it, in its
    // MIG instance. Not its listed_pid: each has its own pid in any namespace.
    // And an MPS client's part: a crashed client's orphaned workers are clients.
    for key in [
        "type",
        "unlisted",
        "gpu_instance",
        "compute_instance",
        "mps",
    ] {
        if let Some(v) = p.get(key) {
            wt.insert(key.into(), v.clone());
        }
    }
    if let Some(m) = spec.worker_used_mib {
        wt.insert("used_mib".into(), toml::Value::Integer(m as i64));
    }
    wt.insert(
        "sm_pct".into(),
        toml::Value::Integer(spec.worker_sm_pct.into()),
    );
    wt
}
