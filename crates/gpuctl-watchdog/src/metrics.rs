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

/// The health families: each GPU's action, remapped rows and ECC counts (GPUs read in the
/// last loop), and the Xid counters.
fn health_blocks(
    m: &Metrics,
    family: &mut dyn FnMut(&str, &str, &str) -> String,
) -> Vec<Vec<String>> {
    use gpuctl_core::health::Action;
    let gpus = if m.nvml_up { &m.health.gpus[..] } else { &[] };
    let label = |g: &crate::health::GpuHealthMetrics| {
        format!("gpu=\"{}\",uuid=\"{}\"", g.index, escape(&g.uuid))
    };
    let mut blocks = Vec::new();
    let name = family(
        "gpuctl_gpu_health_action",
        "gauge",
        "The GPU's health verdict (gpuctl health): 1 for the action it needs (none, gpu_reset, \
         node_reboot, drain_p2p, drain_and_reset), 0 for the others.",
    );
    let mut block = Vec::new();
    for g in gpus {
        for action in Action::ALL.into_iter().filter(|a| *a != Action::RestartApp) {
            block.push(format!(
                "{name}{{{},action=\"{}\"}} {}",
                label(g),
                action.name(),
                u8::from(g.action == action)
            ));
        }
    }
    blocks.push(block);
    let name = family(
        "gpuctl_gpu_remapped_rows",
        "gauge",
        "Remapped rows (nvmlDeviceGetRemappedRows): kind correctable and uncorrectable count \
         rows; pending (a reset applies a remap) and failure (an RMA criterion) are 0 or 1.",
    );
    let mut block = Vec::new();
    for g in gpus {
        if let Some(rows) = g.remapped_rows {
            for (kind, v) in ["correctable", "uncorrectable", "pending", "failure"]
                .into_iter()
                .zip(rows)
            {
                block.push(format!("{name}{{{},kind=\"{kind}\"}} {v}", label(g)));
            }
        }
    }
    blocks.push(block);
    let name = family(
        "gpuctl_gpu_ecc_errors",
        "gauge",
        "Device-memory ECC errors (nvmlDeviceGetTotalEccErrors), by type (corrected, \
         uncorrected) and counter (volatile: since the last reset or driver load; aggregate: \
         the board's life).",
    );
    let mut block = Vec::new();
    for g in gpus {
        if let Some(ecc) = g.ecc {
            let kinds = [
                ("corrected", "volatile"),
                ("uncorrected", "volatile"),
                ("corrected", "aggregate"),
                ("uncorrected", "aggregate"),
            ];
            for ((kind, counter), v) in kinds.into_iter().zip(ecc) {
                block.push(format!(
                    "{name}{{{},type=\"{kind}\",counter=\"{counter}\"}} {v}",
                    label(g)
                ));
            }
        }
    }
    blocks.push(block);
    let name = family(
        "gpuctl_gpu_app_xid_jobs",
        "gauge",
        "Distinct jobs (owners) that hit an application Xid (restart_app) on the GPU in the \
         last 24 hours: several is NVIDIA's \"same GPU, different apps\" hint of hardware.",
    );
    blocks.push(
        gpus.iter()
            .map(|g| format!("{name}{{{}}} {}", label(g), g.app_xid_jobs))
            .collect(),
    );
    let name = family(
        "gpuctl_xid_errors_total",
        "counter",
        "Xid errors the driver raised on the GPU since the watchdog started, by Xid number.",
    );
    blocks.push(
        m.health
            .xids
            .iter()
            .map(|((gpu, uuid, xid), n)| {
                format!(
                    "{name}{{gpu=\"{gpu}\",uuid=\"{}\",xid=\"{xid}\"}} {n}",
                    escape(uuid)
                )
            })
            .collect(),
    );
    blocks
}

pub fn render(m: &Metrics) -> String {
    let mut out = String::with_capacity(2048);
    let mut family = |name: &str, kind: &str, help: &str| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        name.to_string()
    };
    let mut lines: Vec<String> = Vec::new();
    let header = family(
        "gpuctl_nvml_up",
        "gauge",
        "Whether NVML answered the last loop (1) or is unavailable (0).",
    );
    lines.push(format!("{header} {}", u8::from(m.nvml_up)));
    let mut per_gpu = |name: &str, help: &str, value: &dyn Fn(&GpuMetrics) -> Option<u64>| {
        let name = family(name, "gauge", help);
        let mut block = Vec::new();
        for gpu in &m.gpus {
            if let Some(v) = value(gpu) {
                block.push(format!(
                    "{name}{{gpu=\"{}\",uuid=\"{}\"}} {v}",
                    gpu.index,
                    escape(&gpu.uuid)
                ));
            }
        }
        block
    };
    let mut blocks = vec![lines];
    blocks.push(per_gpu(
        "gpuctl_gpu_up",
        "Whether the GPU answered every query in the last loop (0: lost or failing).",
        &|g| Some(u64::from(g.ok)),
    ));
    blocks.push(per_gpu(
        "gpuctl_gpu_memory_used_bytes",
        "GPU memory in use.",
        &|g| g.used_bytes,
    ));
    blocks.push(per_gpu(
        "gpuctl_gpu_memory_total_bytes",
        "GPU memory in all.",
        &|g| g.total_bytes,
    ));
    blocks.push(per_gpu(
        "gpuctl_gpu_processes",
        "Processes holding memory on the GPU.",
        &|g| Some(g.processes as u64),
    ));
    blocks.push(per_gpu(
        "gpuctl_gpu_stale_processes",
        "Processes on the GPU classified as stale (leftovers of crashed runs).",
        &|g| Some(g.stale as u64),
    ));
    blocks.push(per_gpu(
        "gpuctl_gpu_stuck",
        "Whether the GPU has looked stuck for watchdog.stuck_after: busy at low power with \
         steady memory, as a job hung in a collective looks (1), or not (0).",
        &|g| Some(u64::from(g.stuck)),
    ));
    blocks.push(per_gpu(
        "gpuctl_gpu_unattributed_bytes",
        "GPU memory in use that no listed process accounts for.",
        &|g| g.unattributed_bytes,
    ));
    blocks.push(per_gpu(
        "gpuctl_holders",
        "Processes holding the GPU's device file that NVML does not list (GPUs the \
         device-file scan ran for: some GPU had holders_threshold unattributed, at most once a minute).",
        &|g| g.holders.map(|n| n as u64),
    ));
    let mut per_instance =
        |name: &str, help: &str, value: &dyn Fn(&InstanceMetrics) -> Option<u64>| {
            let name = family(name, "gauge", help);
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
        };
    blocks.push(per_instance(
        "gpuctl_mig_memory_used_bytes",
        "Memory in use in a MIG device (GPU instance) of a MIG-enabled GPU.",
        &|i| i.used_bytes,
    ));
    blocks.push(per_instance(
        "gpuctl_mig_memory_total_bytes",
        "Memory of a MIG device (GPU instance).",
        &|i| i.total_bytes,
    ));
    blocks.push(per_instance(
        "gpuctl_mig_processes",
        "Processes holding memory in a MIG device (GPU instance).",
        &|i| Some(i.processes as u64),
    ));
    blocks.push(per_instance(
        "gpuctl_mig_unattributed_bytes",
        "Memory in use in a MIG device that no listed process accounts for.",
        &|i| i.unattributed_bytes,
    ));
    let mut per_holding = |name: &str,
                           help: &str,
                           keys: &[&str],
                           rows: &[Holding],
                           value: &dyn Fn(&Holding) -> u64| {
        let name = family(name, "gauge", help);
        rows.iter()
            .map(|row| {
                let mut line = format!("{name}{{");
                for (i, (key, value)) in keys.iter().zip(&row.labels).enumerate() {
                    let comma = if i == 0 { "" } else { "," };
                    let _ = write!(line, "{comma}{key}=\"{}\"", escape(value));
                }
                let _ = write!(line, "}} {}", value(row));
                line
            })
            .collect::<Vec<_>>()
    };
    blocks.push(per_holding(
        "gpuctl_user_memory_bytes",
        "GPU memory held by each user's processes, summed over GPUs (the largest \
         watchdog.metrics_max_owners users; the rest in user=\"other\").",
        &["user"],
        &m.users,
        &|h| h.used_bytes,
    ));
    blocks.push(per_holding(
        "gpuctl_user_processes",
        "GPU processes (distinct pids) of each user, for the users of gpuctl_user_memory_bytes.",
        &["user"],
        &m.users,
        &|h| h.processes as u64,
    ));
    blocks.push(per_holding(
        "gpuctl_owner_memory_bytes",
        "GPU memory by owner (the key gpuctl kill --owner takes; the largest \
         watchdog.metrics_max_owners owners; the rest in owner=\"other\").",
        &["owner_kind", "owner"],
        &m.owners,
        &|h| h.used_bytes,
    ));
    blocks.push(per_holding(
        "gpuctl_pod_memory_bytes",
        "GPU memory by Kubernetes pod, as the node's container runtime names it (the largest \
         watchdog.metrics_max_owners pods; the rest in pod=\"other\").",
        &["namespace", "pod"],
        &m.pods,
        &|h| h.used_bytes,
    ));
    let mut byte_seconds = |name: &str,
                            help: &str,
                            keys: &[&str],
                            rows: &BTreeMap<Vec<String>, ByteSeconds>,
                            idle: bool| {
        let name = family(name, "counter", help);
        rows.iter()
            .map(|(labels, value)| {
                let mut line = format!("{name}{{");
                for (i, (key, label)) in keys.iter().zip(labels).enumerate() {
                    let comma = if i == 0 { "" } else { "," };
                    let _ = write!(line, "{comma}{key}=\"{}\"", escape(label));
                }
                let value = if idle { value.idle } else { value.held };
                let _ = write!(line, "}} {value:.0}");
                line
            })
            .collect::<Vec<_>>()
    };
    let (users, owners) = (&m.idle.users, &m.idle.owners);
    blocks.push(byte_seconds(
        "gpuctl_user_memory_byte_seconds_total",
        "GPU memory held by each user's processes over time (increase() over a window gives \
         byte-seconds held; at most watchdog.metrics_max_owners users, later ones in \
         user=\"other\").",
        &["user"],
        users,
        false,
    ));
    blocks.push(byte_seconds(
        "gpuctl_user_idle_memory_byte_seconds_total",
        "GPU memory held by each user's processes while their SM utilization was under \
         idle.util_below (measured), over time.",
        &["user"],
        users,
        true,
    ));
    blocks.push(byte_seconds(
        "gpuctl_owner_memory_byte_seconds_total",
        "GPU memory held by each owner over time (at most watchdog.metrics_max_owners owners, \
         later ones in owner=\"other\").",
        &["owner_kind", "owner"],
        owners,
        false,
    ));
    blocks.push(byte_seconds(
        "gpuctl_owner_idle_memory_byte_seconds_total",
        "GPU memory held by each owner while its processes' SM utilization was under \
         idle.util_below (measured), over time.",
        &["owner_kind", "owner"],
        owners,
        true,
    ));
    let namespaces = &m.idle.namespaces;
    blocks.push(byte_seconds(
        "gpuctl_namespace_memory_byte_seconds_total",
        "GPU memory held by the pods of each Kubernetes namespace over time, of the pods the \
         container runtime named (at most watchdog.metrics_max_owners namespaces, later ones \
         in namespace=\"other\").",
        &["namespace"],
        namespaces,
        false,
    ));
    blocks.push(byte_seconds(
        "gpuctl_namespace_idle_memory_byte_seconds_total",
        "GPU memory held by the pods of each Kubernetes namespace while their SM utilization \
         was under idle.util_below (measured), over time.",
        &["namespace"],
        namespaces,
        true,
    ));
    let name = family(
        "gpuctl_gpu_allocated_unused",
        "gauge",
        "1 for a GPU given to a Slurm job (its prolog's record) on which none of the job's \
         processes has run for idle.after.",
    );
    blocks.push(
        m.idle
            .allocated_unused
            .iter()
            .map(|(gpu, uuid, job)| {
                format!(
                    "{name}{{gpu=\"{gpu}\",uuid=\"{}\",job=\"{job}\"}} 1",
                    escape(uuid)
                )
            })
            .collect(),
    );
    let name = family(
        "gpuctl_findings",
        "gauge",
        "Current findings of each kind (impostor: a process claiming a protected name that is not it).",
    );
    blocks.push(
        m.findings
            .iter()
            .map(|(kind, n)| format!("{name}{{kind=\"{kind}\"}} {n}"))
            .collect(),
    );
    let name = family(
        "gpuctl_finding_memory_bytes",
        "gauge",
        "GPU memory held by the processes of current findings, by kind, GPU and owner (owners \
         as gpuctl_owner_memory_bytes caps them); a stuck GPU's finding holds its processes' memory.",
    );
    blocks.push(
        m.finding_memory
            .iter()
            .map(|f| {
                format!(
                    "{name}{{kind=\"{}\",gpu=\"{}\",uuid=\"{}\",owner_kind=\"{}\",owner=\"{}\"}} {}",
                    f.kind,
                    f.gpu,
                    escape(&f.uuid),
                    escape(&f.owner[0]),
                    escape(&f.owner[1]),
                    f.bytes
                )
            })
            .collect(),
    );
    blocks.extend(health_blocks(m, &mut family));
    let name = family(
        "gpuctl_watchdog_interval_seconds",
        "gauge",
        "The watchdog's loop interval in force.",
    );
    blocks.push(vec![format!("{name} {}", m.interval_seconds)]);
    let counters = [
        (
            "gpuctl_reclaims_total",
            "Processes the watchdog ended whose memory came back.",
            m.reclaims_total,
        ),
        (
            "gpuctl_reclaimed_bytes_total",
            "GPU memory the watchdog got back by ending processes.",
            m.reclaimed_bytes_total,
        ),
        (
            "gpuctl_reclaim_failures_total",
            "Reclaims that failed: the process survived, was refused, or its memory stayed held.",
            m.reclaim_failures_total,
        ),
        (
            "gpuctl_watchdog_loops_total",
            "Loops the watchdog has run.",
            m.loops_total,
        ),
    ];
    for (name, help, value) in counters {
        let name = family(name, "counter", help);
        blocks.push(vec![format!("{name} {value}")]);
    }
    if let Some(at) = m.last_good_poll {
        let name = family(
            "gpuctl_last_good_poll_timestamp_seconds",
            "gauge",
            "Unix time of the last loop in which every GPU answered.",
        );
        blocks.push(vec![format!("{name} {at:.3}")]);
    }
    // The HELP/TYPE lines were written in order; interleave each with its samples.
    let headers: Vec<&str> = out.lines().collect();
    let mut text = String::with_capacity(out.len() * 2);
    for (pair, samples) in headers.chunks(2).zip(&blocks) {
        for line in pair {
            text.push_str(line);
            text.push('\n');
        }
        for sample in samples {
            text.push_str(sample);
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
