//! The Prometheus textfile (node-exporter's textfile collector): written whole to a temporary
//! file in the same directory and renamed over the old one, so a scrape never reads half.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use crate::idle::ByteSeconds;

/// One GPU's series; only GPUs read in the last loop are written.
#[derive(Clone, PartialEq)]
pub struct GpuMetrics {
    pub index: u32,
    pub uuid: String,
    /// The GPU answered every query (not lost, no failed query).
    pub ok: bool,
    pub used_bytes: Option<u64>,
    pub total_bytes: Option<u64>,
    pub processes: usize,
    pub stale: usize,
    /// Busy at low power with steady memory for `stuck_after` (a hung job).
    pub stuck: bool,
    /// Its MIG devices, on a MIG-enabled GPU.
    pub instances: Vec<InstanceMetrics>,
    /// Memory in use that no listed process accounts for, where known.
    pub unattributed_bytes: Option<u64>,
    /// Processes holding its device file that NVML does not list, where the scan ran.
    pub holders: Option<usize>,
}

/// One MIG device's series, labelled with its GPU, GPU instance id and MIG UUID.
#[derive(Clone, PartialEq)]
pub struct InstanceMetrics {
    pub gpu_instance: u32,
    pub mig_uuid: String,
    pub used_bytes: Option<u64>,
    pub total_bytes: Option<u64>,
    pub processes: usize,
    pub unattributed_bytes: Option<u64>,
}

/// The memory one kind of finding holds on one GPU for one owner (owners capped as
/// `gpuctl_owner_memory_bytes`'s are), for `gpuctl fleet`: never per process.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct FindingMemory {
    pub kind: &'static str,
    pub gpu: u32,
    pub uuid: String,
    /// The owner's kind and key, as `gpuctl_owner_memory_bytes` labels them.
    pub owner: [String; 2],
    pub bytes: u64,
}

/// One user's or owner's row: its labels' values, memory and distinct processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    /// The user; or the owner's kind and key.
    pub labels: Vec<String>,
    pub used_bytes: u64,
    pub processes: usize,
}

#[derive(Default, Clone, PartialEq)]
pub struct Metrics {
    pub nvml_up: bool,
    pub gpus: Vec<GpuMetrics>,
    pub reclaims_total: u64,
    pub reclaimed_bytes_total: u64,
    pub reclaim_failures_total: u64,
    pub loops_total: u64,
    /// Unix time of the last snapshot in which every GPU answered.
    pub last_good_poll: Option<f64>,
    /// Per user and per owner, capped (see `publish::capped`).
    pub users: Vec<Holding>,
    pub owners: Vec<Holding>,
    /// Per Kubernetes pod the runtime named (namespace, pod), capped as the owners.
    pub pods: Vec<Holding>,
    /// Current findings per kind, every kind (0 when none).
    pub findings: Vec<(&'static str, usize)>,
    /// The memory findings hold, per kind, GPU and owner.
    pub finding_memory: Vec<FindingMemory>,
    /// The loop interval in force, in seconds.
    pub interval_seconds: f64,
    /// Each GPU's health, and the Xid counters.
    pub health: crate::health::HealthMetrics,
    /// Memory held, and held idle, per user and per owner (counters).
    pub idle: crate::idle::Accounts,
}

impl Metrics {
    /// Whether `self` and `other` say the same apart from the two series that change every
    /// loop (the loop counter and the poll time): then the file need not be rewritten.
    pub fn same_but_per_loop(&self, other: &Metrics) -> bool {
        // Destructured, so that a field added is a field compared.
        let Metrics {
            nvml_up,
            gpus,
            reclaims_total,
            reclaimed_bytes_total,
            reclaim_failures_total,
            loops_total: _,
            last_good_poll: _,
            users,
            owners,
            pods,
            findings,
            finding_memory,
            interval_seconds,
            health,
            // Counters that move while memory is held: per loop, as the loop counter.
            idle: _,
        } = self;
        *nvml_up == other.nvml_up
            && *gpus == other.gpus
            && *reclaims_total == other.reclaims_total
            && *reclaimed_bytes_total == other.reclaimed_bytes_total
            && *reclaim_failures_total == other.reclaim_failures_total
            && *users == other.users
            && *owners == other.owners
            && *pods == other.pods
            && *findings == other.findings
            && *finding_memory == other.finding_memory
            && *interval_seconds == other.interval_seconds
            && *health == other.health
    }
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// One metric family: its HELP and TYPE lines, then the samples `samples` makes for the
/// loop's figures (given the family's name to start each line with).
struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    samples: fn(&Metrics, &str) -> Vec<String>,
    /// Declared only when it has a sample (the poll time, before any good poll).
    omitted_when_empty: bool,
}

const GAUGE: &str = "gauge";
const COUNTER: &str = "counter";

/// A gauge declared whether or not it has samples.
const fn gauge(
    name: &'static str,
    help: &'static str,
    samples: fn(&Metrics, &str) -> Vec<String>,
) -> Family {
    Family {
        name,
        kind: GAUGE,
        help,
        samples,
        omitted_when_empty: false,
    }
}

/// A counter declared whether or not it has samples.
const fn counter(
    name: &'static str,
    help: &'static str,
    samples: fn(&Metrics, &str) -> Vec<String>,
) -> Family {
    Family {
        kind: COUNTER,
        ..gauge(name, help, samples)
    }
}

/// Every family, in the order of the file.
const FAMILIES: &[Family] = &[
    gauge(
        "gpuctl_nvml_up",
        "Whether NVML answered the last loop (1) or is unavailable (0).",
        |m, name| vec![format!("{name} {}", u8::from(m.nvml_up))],
    ),
    gauge(
        "gpuctl_gpu_up",
        "Whether the GPU answered every query in the last loop (0: lost or failing).",
        |m, name| per_gpu(m, name, |g| Some(u64::from(g.ok))),
    ),
    gauge(
        "gpuctl_gpu_memory_used_bytes",
        "GPU memory in use.",
        |m, name| per_gpu(m, name, |g| g.used_bytes),
    ),
    gauge(
        "gpuctl_gpu_memory_total_bytes",
        "GPU memory in all.",
        |m, name| per_gpu(m, name, |g| g.total_bytes),
    ),
    gauge(
        "gpuctl_gpu_processes",
        "Processes holding memory on the GPU.",
        |m, name| per_gpu(m, name, |g| Some(g.processes as u64)),
    ),
    gauge(
        "gpuctl_gpu_stale_processes",
        "Processes on the GPU classified as stale (leftovers of crashed runs).",
        |m, name| per_gpu(m, name, |g| Some(g.stale as u64)),
    ),
    gauge(
        "gpuctl_gpu_stuck",
        "Whether the GPU has looked stuck for watchdog.stuck_after: busy at low power with \
         steady memory, as a job hung in a collective looks (1), or not (0).",
        |m, name| per_gpu(m, name, |g| Some(u64::from(g.stuck))),
    ),
    gauge(
        "gpuctl_gpu_unattributed_bytes",
        "GPU memory in use that no listed process accounts for.",
        |m, name| per_gpu(m, name, |g| g.unattributed_bytes),
    ),
    gauge(
        "gpuctl_holders",
        "Processes holding the GPU's device file that NVML does not list (GPUs the \
         device-file scan ran for: some GPU had holders_threshold unattributed, at most once a minute).",
        |m, name| per_gpu(m, name, |g| g.holders.map(|n| n as u64)),
    ),
    gauge(
        "gpuctl_mig_memory_used_bytes",
        "Memory in use in a MIG device (GPU instance) of a MIG-enabled GPU.",
        |m, name| per_instance(m, name, |i| i.used_bytes),
    ),
    gauge(
        "gpuctl_mig_memory_total_bytes",
        "Memory of a MIG device (GPU instance).",
        |m, name| per_instance(m, name, |i| i.total_bytes),
    ),
    gauge(
        "gpuctl_mig_processes",
        "Processes holding memory in a MIG device (GPU instance).",
        |m, name| per_instance(m, name, |i| Some(i.processes as u64)),
    ),
    gauge(
        "gpuctl_mig_unattributed_bytes",
        "Memory in use in a MIG device that no listed process accounts for.",
        |m, name| per_instance(m, name, |i| i.unattributed_bytes),
    ),
    gauge(
        "gpuctl_user_memory_bytes",
        "GPU memory held by each user's processes, summed over GPUs (the largest \
         watchdog.metrics_max_owners users; the rest in user=\"other\").",
        |m, name| per_holding(name, &["user"], &m.users, |h| h.used_bytes),
    ),
    gauge(
        "gpuctl_user_processes",
        "GPU processes (distinct pids) of each user, for the users of gpuctl_user_memory_bytes.",
        |m, name| per_holding(name, &["user"], &m.users, |h| h.processes as u64),
    ),
    gauge(
        "gpuctl_owner_memory_bytes",
        "GPU memory by owner (the key gpuctl kill --owner takes; the largest \
         watchdog.metrics_max_owners owners; the rest in owner=\"other\").",
        |m, name| per_holding(name, &OWNER_KEYS, &m.owners, |h| h.used_bytes),
    ),
    gauge(
        "gpuctl_pod_memory_bytes",
        "GPU memory by Kubernetes pod, as the node's container runtime names it (the largest \
         watchdog.metrics_max_owners pods; the rest in pod=\"other\").",
        |m, name| per_holding(name, &["namespace", "pod"], &m.pods, |h| h.used_bytes),
    ),
    counter(
        "gpuctl_user_memory_byte_seconds_total",
        "GPU memory held by each user's processes over time (increase() over a window gives \
         byte-seconds held; at most watchdog.metrics_max_owners users, later ones in \
         user=\"other\").",
        |m, name| byte_seconds(name, &["user"], &m.idle.users, |v| v.held),
    ),
    counter(
        "gpuctl_user_idle_memory_byte_seconds_total",
        "GPU memory held by each user's processes while their SM utilization was under \
         idle.util_below (measured), over time.",
        |m, name| byte_seconds(name, &["user"], &m.idle.users, |v| v.idle),
    ),
    counter(
        "gpuctl_owner_memory_byte_seconds_total",
        "GPU memory held by each owner over time (at most watchdog.metrics_max_owners owners, \
         later ones in owner=\"other\").",
        |m, name| byte_seconds(name, &OWNER_KEYS, &m.idle.owners, |v| v.held),
    ),
    counter(
        "gpuctl_owner_idle_memory_byte_seconds_total",
        "GPU memory held by each owner while its processes' SM utilization was under \
         idle.util_below (measured), over time.",
        |m, name| byte_seconds(name, &OWNER_KEYS, &m.idle.owners, |v| v.idle),
    ),
    counter(
        "gpuctl_namespace_memory_byte_seconds_total",
        "GPU memory held by the pods of each Kubernetes namespace over time, of the pods the \
         container runtime named (at most watchdog.metrics_max_owners namespaces, later ones \
         in namespace=\"other\").",
        |m, name| byte_seconds(name, &["namespace"], &m.idle.namespaces, |v| v.held),
    ),
    counter(
        "gpuctl_namespace_idle_memory_byte_seconds_total",
        "GPU memory held by the pods of each Kubernetes namespace while their SM utilization \
         was under idle.util_below (measured), over time.",
        |m, name| byte_seconds(name, &["namespace"], &m.idle.namespaces, |v| v.idle),
    ),
    gauge(
        "gpuctl_gpu_allocated_unused",
        "1 for a GPU given to a Slurm job (its prolog's record) on which none of the job's \
         processes has run for idle.after.",
        |m, name| {
            let unused = m.idle.allocated_unused.iter();
            unused
                .map(|(gpu, uuid, job)| {
                    let uuid = escape(uuid);
                    format!("{name}{{gpu=\"{gpu}\",uuid=\"{uuid}\",job=\"{job}\"}} 1")
                })
                .collect()
        },
    ),
    gauge(
        "gpuctl_findings",
        "Current findings of each kind (impostor: a process claiming a protected name that is not it).",
        |m, name| {
            let findings = m.findings.iter();
            findings
                .map(|(kind, n)| format!("{name}{{kind=\"{kind}\"}} {n}"))
                .collect()
        },
    ),
    gauge(
        "gpuctl_finding_memory_bytes",
        "GPU memory held by the processes of current findings, by kind, GPU and owner (owners \
         as gpuctl_owner_memory_bytes caps them); a stuck GPU's finding holds its processes' memory.",
        |m, name| {
            m.finding_memory
                .iter()
                .map(|f| finding_memory(name, f))
                .collect()
        },
    ),
    gauge(
        "gpuctl_gpu_health_action",
        "The GPU's health verdict (gpuctl health): 1 for the action it needs (none, gpu_reset, \
         node_reboot, drain_p2p, drain_and_reset), 0 for the others.",
        health_actions,
    ),
    gauge(
        "gpuctl_gpu_remapped_rows",
        "Remapped rows (nvmlDeviceGetRemappedRows): kind correctable and uncorrectable count \
         rows; pending (a reset applies a remap) and failure (an RMA criterion) are 0 or 1.",
        remapped_rows,
    ),
    gauge(
        "gpuctl_gpu_ecc_errors",
        "Device-memory ECC errors (nvmlDeviceGetTotalEccErrors), by type (corrected, \
         uncorrected) and counter (volatile: since the last reset or driver load; aggregate: \
         the board's life).",
        ecc_errors,
    ),
    gauge(
        "gpuctl_gpu_app_xid_jobs",
        "Distinct jobs (owners) that hit an application Xid (restart_app) on the GPU in the \
         last 24 hours: several is NVIDIA's \"same GPU, different apps\" hint of hardware.",
        |m, name| {
            let gpus = health_gpus(m).iter();
            gpus.map(|g| format!("{name}{{{}}} {}", health_labels(g), g.app_xid_jobs))
                .collect()
        },
    ),
    counter(
        "gpuctl_xid_errors_total",
        "Xid errors the driver raised on the GPU since the watchdog started, by Xid number.",
        |m, name| {
            let xids = m.health.xids.iter();
            xids.map(|((gpu, uuid, xid), n)| {
                let uuid = escape(uuid);
                format!("{name}{{gpu=\"{gpu}\",uuid=\"{uuid}\",xid=\"{xid}\"}} {n}")
            })
            .collect()
        },
    ),
    gauge(
        "gpuctl_watchdog_interval_seconds",
        "The watchdog's loop interval in force.",
        |m, name| vec![format!("{name} {}", m.interval_seconds)],
    ),
    counter(
        "gpuctl_reclaims_total",
        "Processes the watchdog ended whose memory came back.",
        |m, name| vec![format!("{name} {}", m.reclaims_total)],
    ),
    counter(
        "gpuctl_reclaimed_bytes_total",
        "GPU memory the watchdog got back by ending processes.",
        |m, name| vec![format!("{name} {}", m.reclaimed_bytes_total)],
    ),
    counter(
        "gpuctl_reclaim_failures_total",
        "Reclaims that failed: the process survived, was refused, or its memory stayed held.",
        |m, name| vec![format!("{name} {}", m.reclaim_failures_total)],
    ),
    counter(
        "gpuctl_watchdog_loops_total",
        "Loops the watchdog has run.",
        |m, name| vec![format!("{name} {}", m.loops_total)],
    ),
    Family {
        omitted_when_empty: true,
        ..gauge(
            "gpuctl_last_good_poll_timestamp_seconds",
            "Unix time of the last loop in which every GPU answered.",
            |m, name| {
                m.last_good_poll
                    .map(|at| format!("{name} {at:.3}"))
                    .into_iter()
                    .collect()
            },
        )
    },
];

/// The labels of an owner's series: its kind and key.
const OWNER_KEYS: [&str; 2] = ["owner_kind", "owner"];

/// One sample per GPU read in the last loop for which `value` is known.
fn per_gpu(m: &Metrics, name: &str, value: fn(&GpuMetrics) -> Option<u64>) -> Vec<String> {
    let known = m.gpus.iter().filter_map(|gpu| Some((gpu, value(gpu)?)));
    known
        .map(|(gpu, v)| {
            let uuid = escape(&gpu.uuid);
            format!("{name}{{gpu=\"{}\",uuid=\"{uuid}\"}} {v}", gpu.index)
        })
        .collect()
}

/// One sample per MIG device for which `value` is known, labelled with its GPU too.
fn per_instance(
    m: &Metrics,
    name: &str,
    value: fn(&InstanceMetrics) -> Option<u64>,
) -> Vec<String> {
    let mut block = Vec::new();
    for gpu in &m.gpus {
        for instance in &gpu.instances {
            if let Some(v) = value(instance) {
                block.push(format!(
                    "{name}{{gpu=\"{}\",uuid=\"{}\",gpu_instance=\"{}\",mig_uuid=\"{}\"}} {v}",
                    gpu.index,
                    escape(&gpu.uuid),
                    instance.gpu_instance,
                    escape(&instance.mig_uuid)
                ));
            }
        }
    }
    block
}

/// `{key="value",...}`: each of `keys` with its value of `values`, escaped.
fn label_set(keys: &[&str], values: &[String]) -> String {
    let mut set = String::from("{");
    for (i, (key, value)) in keys.iter().zip(values).enumerate() {
        let comma = if i == 0 { "" } else { "," };
        let _ = write!(set, "{comma}{key}=\"{}\"", escape(value));
    }
    set.push('}');
    set
}

/// One sample per user's, owner's or pod's row.
fn per_holding(
    name: &str,
    keys: &[&str],
    rows: &[Holding],
    value: fn(&Holding) -> u64,
) -> Vec<String> {
    let samples = rows.iter();
    samples
        .map(|row| format!("{name}{} {}", label_set(keys, &row.labels), value(row)))
        .collect()
}

/// One counter sample per series of byte-seconds, held or held idle as `value` picks.
fn byte_seconds(
    name: &str,
    keys: &[&str],
    rows: &BTreeMap<Vec<String>, ByteSeconds>,
    value: fn(&ByteSeconds) -> f64,
) -> Vec<String> {
    let samples = rows.iter();
    samples
        .map(|(labels, v)| format!("{name}{} {:.0}", label_set(keys, labels), value(v)))
        .collect()
}

fn finding_memory(name: &str, f: &FindingMemory) -> String {
    format!(
        "{name}{{kind=\"{}\",gpu=\"{}\",uuid=\"{}\",owner_kind=\"{}\",owner=\"{}\"}} {}",
        f.kind,
        f.gpu,
        escape(&f.uuid),
        escape(&f.owner[0]),
        escape(&f.owner[1]),
        f.bytes
    )
}

/// The GPUs whose health the last loop read (none while NVML is down).
fn health_gpus(m: &Metrics) -> &[crate::health::GpuHealthMetrics] {
    if m.nvml_up { &m.health.gpus[..] } else { &[] }
}

fn health_labels(g: &crate::health::GpuHealthMetrics) -> String {
    format!("gpu=\"{}\",uuid=\"{}\"", g.index, escape(&g.uuid))
}

/// Each GPU's verdict as one sample per action (restart_app is a process's, not a GPU's).
fn health_actions(m: &Metrics, name: &str) -> Vec<String> {
    use gpuctl_core::health::Action;
    let mut block = Vec::new();
    for g in health_gpus(m) {
        for action in Action::ALL.into_iter().filter(|a| *a != Action::RestartApp) {
            block.push(format!(
                "{name}{{{},action=\"{}\"}} {}",
                health_labels(g),
                action.name(),
                u8::from(g.action == action)
            ));
        }
    }
    block
}

fn remapped_rows(m: &Metrics, name: &str) -> Vec<String> {
    let mut block = Vec::new();
    for g in health_gpus(m) {
        if let Some(rows) = g.remapped_rows {
            let kinds = ["correctable", "uncorrectable", "pending", "failure"];
            for (kind, v) in kinds.into_iter().zip(rows) {
                block.push(format!(
                    "{name}{{{},kind=\"{kind}\"}} {v}",
                    health_labels(g)
                ));
            }
        }
    }
    block
}

fn ecc_errors(m: &Metrics, name: &str) -> Vec<String> {
    let kinds = [
        ("corrected", "volatile"),
        ("uncorrected", "volatile"),
        ("corrected", "aggregate"),
        ("uncorrected", "aggregate"),
    ];
    let mut block = Vec::new();
    for g in health_gpus(m) {
        if let Some(ecc) = g.ecc {
            for ((kind, counter), v) in kinds.into_iter().zip(ecc) {
                block.push(format!(
                    "{name}{{{},type=\"{kind}\",counter=\"{counter}\"}} {v}",
                    health_labels(g)
                ));
            }
        }
    }
    block
}

/// The textfile: each family's HELP and TYPE lines, then its samples.
pub fn render(m: &Metrics) -> String {
    let mut text = String::with_capacity(4096);
    for family in FAMILIES {
        let samples = (family.samples)(m, family.name);
        if samples.is_empty() && family.omitted_when_empty {
            continue;
        }
        let (name, kind, help) = (family.name, family.kind, family.help);
        let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for sample in samples {
            text.push_str(&sample);
            text.push('\n');
        }
    }
    text
}

/// Writes `text` to `path` through a temporary file in the same directory and a rename.
pub fn write_atomic(path: &Path, text: &str) -> std::io::Result<()> {
    gpuctl_core::files::replace(path, text.as_bytes(), 0o644, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_have_help_and_type_before_their_samples() {
        let text = render(&Metrics {
            nvml_up: true,
            gpus: vec![GpuMetrics {
                index: 0,
                uuid: "GPU-1".into(),
                ok: true,
                used_bytes: Some(5),
                total_bytes: Some(10),
                processes: 2,
                stale: 1,
                stuck: true,
                instances: vec![InstanceMetrics {
                    gpu_instance: 9,
                    mig_uuid: "MIG-1".into(),
                    used_bytes: Some(3),
                    total_bytes: Some(4),
                    processes: 1,
                    unattributed_bytes: Some(2),
                }],
                unattributed_bytes: None,
                holders: Some(3),
            }],
            reclaims_total: 3,
            reclaimed_bytes_total: 7,
            last_good_poll: Some(12.5),
            interval_seconds: 0.5,
            idle: crate::idle::Accounts {
                namespaces: [(
                    vec!["ml".to_string()],
                    crate::idle::ByteSeconds {
                        held: 30.0,
                        idle: 20.0,
                    },
                )]
                .into(),
                ..Default::default()
            },
            ..Metrics::default()
        });
        assert!(
            text.contains(
                "# TYPE gpuctl_namespace_memory_byte_seconds_total counter\ngpuctl_namespace_memory_byte_seconds_total{namespace=\"ml\"} 30\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("gpuctl_namespace_idle_memory_byte_seconds_total{namespace=\"ml\"} 20\n"),
            "{text}"
        );
        assert!(text.contains(
            "# HELP gpuctl_nvml_up Whether NVML answered the last loop (1) or is unavailable (0).\n# TYPE gpuctl_nvml_up gauge\ngpuctl_nvml_up 1\n"
        ), "{text}");
        assert!(text.contains("# TYPE gpuctl_gpu_memory_used_bytes gauge\ngpuctl_gpu_memory_used_bytes{gpu=\"0\",uuid=\"GPU-1\"} 5\n"), "{text}");
        assert!(
            text.contains("gpuctl_gpu_stale_processes{gpu=\"0\",uuid=\"GPU-1\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "# TYPE gpuctl_gpu_stuck gauge\ngpuctl_gpu_stuck{gpu=\"0\",uuid=\"GPU-1\"} 1\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("# TYPE gpuctl_reclaims_total counter\ngpuctl_reclaims_total 3\n"),
            "{text}"
        );
        assert!(text.contains("gpuctl_reclaimed_bytes_total 7\n"), "{text}");
        assert!(
            text.contains("gpuctl_last_good_poll_timestamp_seconds 12.500\n"),
            "{text}"
        );
        // An unknown figure is no sample; the family is still declared.
        assert!(
            text.contains("# TYPE gpuctl_gpu_unattributed_bytes gauge\n# HELP"),
            "{text}"
        );
        assert!(
            text.contains("gpuctl_holders{gpu=\"0\",uuid=\"GPU-1\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("gpuctl_mig_unattributed_bytes{gpu=\"0\",uuid=\"GPU-1\",gpu_instance=\"9\",mig_uuid=\"MIG-1\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("gpuctl_watchdog_interval_seconds 0.5\n"),
            "{text}"
        );
        // Every sample line's family was declared.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            assert!(text.contains(&format!("# TYPE {name} ")), "{line}");
        }
    }

    /// What a user controls (a user name, a cgroup's unit name) is one label value: it
    /// can neither end the line nor add a label.
    #[test]
    fn hostile_label_values_stay_one_value() {
        let hostile = "a\"b\\c\nd}e,f=\"g";
        let text = render(&Metrics {
            users: vec![Holding {
                labels: vec![hostile.into()],
                used_bytes: 1,
                processes: 1,
            }],
            owners: vec![Holding {
                labels: vec!["unit".into(), format!("unit:{hostile}")],
                used_bytes: 2,
                processes: 1,
            }],
            ..Metrics::default()
        });
        let escaped = "a\\\"b\\\\c\\nd}e,f=\\\"g";
        assert!(
            text.contains(&format!(
                "gpuctl_user_memory_bytes{{user=\"{escaped}\"}} 1\n"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "gpuctl_owner_memory_bytes{{owner_kind=\"unit\",owner=\"unit:{escaped}\"}} 2\n"
            )),
            "{text}"
        );
        // Every sample is one line of name, labels, value: unescaped quotes come in pairs
        // around each of the family's labels.
        for line in text
            .lines()
            .filter(|l| l.starts_with("gpuctl_user") || l.starts_with("gpuctl_owner"))
        {
            let unescaped = line.replace("\\\\", "").replace("\\\"", "");
            let labels = if line.starts_with("gpuctl_owner") {
                2
            } else {
                1
            };
            assert_eq!(unescaped.matches('"').count(), 2 * labels, "{line}");
            // Outside the quoted values: the name, one `key=` per label, the value.
            let outside: String = unescaped.split('"').step_by(2).collect();
            assert_eq!(outside.matches('=').count(), labels, "{line}");
            assert_eq!(outside.matches('}').count(), 1, "{line}");
        }
    }

    #[test]
    fn only_the_loop_counter_and_poll_time_are_per_loop() {
        let a = Metrics {
            loops_total: 1,
            last_good_poll: Some(1.0),
            ..Metrics::default()
        };
        let b = Metrics {
            loops_total: 2,
            last_good_poll: Some(2.0),
            ..Metrics::default()
        };
        assert!(a.same_but_per_loop(&b));
        let c = Metrics {
            findings: vec![("impostor", 1)],
            ..b.clone()
        };
        assert!(!a.same_but_per_loop(&c));
        let d = Metrics {
            interval_seconds: 1.0,
            ..b
        };
        assert!(!a.same_but_per_loop(&d));
    }

    #[test]
    fn written_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpuctl.prom");
        write_atomic(&path, "a 1\n").unwrap();
        write_atomic(&path, "a 2\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a 2\n");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
