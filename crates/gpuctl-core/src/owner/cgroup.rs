//! Reading an owner from a cgroup path: each manager's pattern (Slurm, container runtimes,
//! Kubernetes, systemd), anchored where that manager puts it.

use super::*;

/// Parsed /proc/PID/cgroup: the owner and the cgroup path it came from (v2 path when present,
/// else the most telling v1 path).
///
/// `path` is the path of the line the owner was read from. When no line names an owner it is
/// the v2 path if that is not the root, else the `name=systemd` path, else the first other
/// non-root v1 path, else `/`; it is empty when the input has no well-formed line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CgroupInfo {
    pub owner: Owner,
    pub path: String,
}

/// Parses the text of `/proc/PID/cgroup`. Never panics; malformed lines are skipped.
///
/// Precedence when lines disagree (hybrid hierarchies, or v1 controllers placed differently):
/// Slurm job > Kubernetes pod > container > systemd unit/scope > none; then the owner with
/// more detail (step, uid, QoS, container id); then the v2 line, then `name=systemd`, then
/// the deeper path, then the earlier line.
pub fn parse_cgroup(contents: &str) -> CgroupInfo {
    let mut best: Option<(Key, Owner, &str)> = None;
    // Fallback paths for `Owner::None`.
    let mut v2_path: Option<&str> = None;
    let mut systemd_path: Option<&str> = None;
    let mut other_path: Option<&str> = None;

    for raw in contents.lines() {
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        let Some(parsed) = parse_line(line) else {
            continue;
        };
        let clean = strip_deleted(parsed.path);
        let is_root = clean == "/";
        if parsed.v2 {
            if v2_path.is_none() || v2_path == Some("/") {
                v2_path = Some(parsed.path);
            }
        } else if parsed.named_systemd {
            if systemd_path.is_none() || (!is_root && systemd_path == Some("/")) {
                systemd_path = Some(parsed.path);
            }
        } else if other_path.is_none() || (!is_root && other_path == Some("/")) {
            other_path = Some(parsed.path);
        }

        let segs = segments(clean);
        let owner = classify(&segs);
        if matches!(owner, Owner::None) {
            continue;
        }
        let key = Key {
            rank: rank(&owner),
            detail: detail(&owner),
            v2: parsed.v2,
            named_systemd: parsed.named_systemd,
            depth: segs.len(),
        };
        if best.as_ref().is_none_or(|(k, _, _)| key > *k) {
            best = Some((key, owner, parsed.path));
        }
    }

    match best {
        Some((_, owner, path)) => CgroupInfo {
            owner,
            path: path.to_string(),
        },
        None => {
            let path = non_root(v2_path)
                .or(non_root(systemd_path))
                .or(non_root(other_path))
                .or(v2_path)
                .or(systemd_path)
                .or(other_path)
                .unwrap_or("");
            CgroupInfo {
                owner: Owner::None,
                path: path.to_string(),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Lines and precedence

pub(super) struct Line<'a> {
    v2: bool,
    named_systemd: bool,
    path: &'a str,
}

/// `ID:controllers:path`, where the path may itself contain `:`.
pub(super) fn parse_line(line: &str) -> Option<Line<'_>> {
    let mut parts = line.splitn(3, ':');
    let id = parts.next()?;
    let controllers = parts.next()?;
    let path = parts.next()?;
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) || !path.starts_with('/') {
        return None;
    }
    Some(Line {
        v2: controllers.is_empty() && id.bytes().all(|b| b == b'0'),
        named_systemd: controllers.split(',').any(|c| c == "name=systemd"),
        path,
    })
}

/// Field order is precedence order (derived `Ord` compares fields top to bottom).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Key {
    rank: u8,
    detail: u8,
    v2: bool,
    named_systemd: bool,
    depth: usize,
}

pub(super) fn rank(owner: &Owner) -> u8 {
    match owner {
        Owner::SlurmJob { .. } => 4,
        Owner::KubernetesPod { .. } => 3,
        Owner::Container { .. } => 2,
        Owner::SystemdUnit { .. } | Owner::SystemdUserUnit { .. } | Owner::SystemdScope { .. } => 1,
        Owner::None => 0,
    }
}

pub(super) fn detail(owner: &Owner) -> u8 {
    match owner {
        Owner::SlurmJob { step, uid, .. } => u8::from(step.is_some()) + u8::from(uid.is_some()),
        Owner::KubernetesPod {
            qos,
            container_id,
            runtime,
            ..
        } => {
            u8::from(qos.is_some()) + u8::from(container_id.is_some()) + u8::from(runtime.is_some())
        }
        Owner::SystemdScope { uid, .. } => u8::from(uid.is_some()),
        _ => 0,
    }
}

pub(super) fn non_root(path: Option<&str>) -> Option<&str> {
    path.filter(|p| strip_deleted(p) != "/")
}

pub(super) fn strip_deleted(path: &str) -> &str {
    path.strip_suffix(" (deleted)").unwrap_or(path)
}

pub(super) fn segments(path: &str) -> Vec<&str> {
    path.split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .collect()
}

/// The owner one cgroup path names, most specific first.
///
/// Each manager's pattern is anchored where that manager puts its cgroups, at places only
/// root can create: a user may create any cgroup inside a subtree delegated to it
/// (`user@UID.service`, a unit with `Delegate=yes`, its own Slurm step), so a name found
/// further down proves nothing.
pub(super) fn classify(segs: &[&str]) -> Owner {
    slurm(segs)
        .or_else(|| workload(segs))
        .or_else(|| systemd(segs))
        .unwrap_or(Owner::None)
}

// ---------------------------------------------------------------------------------------------
// Slurm

/// A Slurm job's cgroup, only where slurmstepd makes it:
///
/// * cgroup/v1: `/slurm/uid_<uid>/job_<id>[/step_<step>/...]`, or `/slurm_<nodename>/...`
///   with multiple slurmd, at the hierarchy's root;
/// * cgroup/v2: `/system.slice/slurmstepd.scope/job_<id>[/step_<step>/...]`, or
///   `<nodename>_slurmstepd.scope` (Slurm's cgroup/v2 plugin fixes both names).
///
/// The job and step are read at their fixed depth: below its step a job's user may create
/// cgroups of its own (Slurm's v1 plugin gives the step's directory to the user).
pub(super) fn slurm(segs: &[&str]) -> Option<Owner> {
    let (uid, job_at) = match segs {
        [root, uid, ..] if *root == "slurm" || root.starts_with("slurm_") => (
            Some(uid.strip_prefix("uid_").and_then(parse_digits::<u32>)?),
            2,
        ),
        ["system.slice", scope, ..]
            if *scope == "slurmstepd.scope" || scope.ends_with("_slurmstepd.scope") =>
        {
            (None, 2)
        }
        _ => return None,
    };
    let job_id = segs
        .get(job_at)?
        .strip_prefix("job_")
        .and_then(parse_digits::<u64>)?;
    let step = segs
        .get(job_at + 1)
        .and_then(|s| s.strip_prefix("step_"))
        .filter(|s| !s.is_empty())
        .map(str::to_string);
    Some(Owner::SlurmJob {
        job_id,
        step,
        uid,
        from_environ: false,
    })
}

// ---------------------------------------------------------------------------------------------
// Pods and containers

/// A pod or a container, anchored at the root; a container's own cgroup is a root again
/// for what runs nested in it (docker-in-docker, a kind node's pods), as its cgroup
/// namespace shows it to the runtime inside. The innermost wins.
pub(super) fn workload(segs: &[&str]) -> Option<Owner> {
    let mut root = 0;
    let mut outer = None;
    loop {
        let rest = &segs[root..];
        if let Some(pod) = kubernetes(rest) {
            return Some(pod);
        }
        match container(rest) {
            Some((at, owner)) => {
                outer = Some(owner);
                root += at + 1;
            }
            None => return outer,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Kubernetes

/// A pod under the kubelet's root: `kubepods.slice` (systemd driver), `kubepods`
/// (cgroupfs), or a kind node's `kubelet.slice/kubelet-kubepods.slice`; the pod directly
/// in it (Guaranteed) or in its QoS class's directory, and the container below the pod.
pub(super) fn kubernetes(segs: &[&str]) -> Option<Owner> {
    let start = match segs {
        ["kubepods.slice" | "kubepods", ..] => 1,
        ["kubelet.slice", "kubelet-kubepods.slice", ..] => 2,
        _ => return None,
    };
    for i in start..(start + 2).min(segs.len()) {
        let Some((pod_uid, qos)) = pod_segment(segs[i], Some(segs[i - 1])) else {
            continue;
        };
        let (container_id, runtime) = match segs.get(i + 1).and_then(|s| pod_container(s)) {
            Some((id, runtime)) => (id, runtime),
            None => (None, None),
        };
        return Some(Owner::KubernetesPod {
            pod_uid,
            qos: qos.map(str::to_string),
            container_id,
            runtime,
            pod: None,
        });
    }
    None
}

/// A pod's cgroup: `kubepods-burstable-pod<uid_>.slice`, `kubepods-pod<uid_>.slice`,
/// `kubelet-kubepods-besteffort-pod<uid_>.slice` (systemd driver) or `pod<uid>` (cgroupfs).
/// Returns the normalized UID and the QoS class.
pub(super) fn pod_segment(
    seg: &str,
    parent: Option<&str>,
) -> Option<(String, Option<&'static str>)> {
    if let Some(base) = seg.strip_suffix(".slice") {
        let at = base.rfind("-pod")?;
        let prefix = &base[..at];
        let uid = normalize_pod_uid(&base[at + "-pod".len()..])?;
        let qos = match prefix.rsplit('-').next() {
            Some(last) if last.ends_with("kubepods") => Some("Guaranteed"),
            Some(last) => qos_from_name(last),
            None => None,
        };
        return Some((uid, qos));
    }
    let uid = normalize_pod_uid(seg.strip_prefix("pod")?)?;
    let qos = match parent {
        Some(p) if p.contains("kubepods") => Some("Guaranteed"),
        Some(p) => qos_from_name(p),
        None => None,
    };
    Some((uid, qos))
}

pub(super) fn qos_from_name(name: &str) -> Option<&'static str> {
    match name {
        "burstable" => Some("Burstable"),
        "besteffort" => Some("BestEffort"),
        "guaranteed" => Some("Guaranteed"),
        _ => None,
    }
}

/// A pod UID is a UUID (`1a2b3c4d-...`, or with `_` in systemd slice names) or, for static
/// pods, 32 hex digits. Normalized to dashes.
pub(super) fn normalize_pod_uid(raw: &str) -> Option<String> {
    let mut hex = 0usize;
    for b in raw.bytes() {
        match b {
            b'-' | b'_' => {}
            b if b.is_ascii_hexdigit() => hex += 1,
            _ => return None,
        }
    }
    (hex == 32).then(|| raw.replace('_', "-"))
}

/// The cgroup directly below a pod's: a container (or the sandbox), or cri-o's monitor.
pub(super) fn pod_container(seg: &str) -> Option<(Option<String>, Option<ContainerRuntime>)> {
    let base = seg.strip_suffix(".scope").unwrap_or(seg);
    if let Some(id) = base.strip_prefix("crio-conmon-") {
        return is_hex_id(id).then_some((None, Some(ContainerRuntime::CriO)));
    }
    const PREFIXES: [(&str, ContainerRuntime); 3] = [
        ("cri-containerd-", ContainerRuntime::Containerd),
        ("crio-", ContainerRuntime::CriO),
        ("docker-", ContainerRuntime::Docker),
    ];
    for (prefix, runtime) in PREFIXES {
        if let Some(id) = base.strip_prefix(prefix) {
            return is_hex_id(id).then(|| (Some(id.to_string()), Some(runtime)));
        }
    }
    // cgroupfs driver: the bare id, whichever runtime made it.
    is_hex_id(base).then(|| (Some(base.to_string()), None))
}

// ---------------------------------------------------------------------------------------------
// Containers

/// A container anchored at the root, and the index of its own cgroup:
///
/// * systemd driver: `<runtime>-<id>.scope` in the system manager's slices
///   (`/system.slice/docker-<id>.scope`, `/machine.slice/libpod-<id>.scope`): only root
///   creates slices, so a scope whose every parent is one was made by PID 1 for root;
/// * cgroupfs driver: the runtime's directory at the root: `/docker/<id>`, containerd's
///   `ctr` namespace `/default/<id>`, podman's `/libpod_parent/libpod-<id>`.
///
/// Below `user@UID.service` (rootless podman, or anyone's lookalike) is never a container.
pub(super) fn container(segs: &[&str]) -> Option<(usize, Owner)> {
    let make = |runtime, id: &str| Owner::Container {
        runtime,
        id: id.to_string(),
    };
    let slices = segs.iter().take_while(|s| s.ends_with(".slice")).count();
    if let Some(owner) = segs.get(slices).and_then(|seg| container_scope(seg)) {
        return Some((slices, owner));
    }
    let (parent, seg) = (*segs.first()?, *segs.get(1)?);
    let owner = match parent {
        "docker" if is_full_id(seg) => make(ContainerRuntime::Docker, seg),
        "default" if is_full_id(seg) => make(ContainerRuntime::Containerd, seg),
        "libpod_parent" => make(
            ContainerRuntime::Podman,
            seg.strip_prefix("libpod-").filter(|id| is_hex_id(id))?,
        ),
        _ => return None,
    };
    Some((1, owner))
}

/// systemd driver: `<runtime>-<id>.scope`; the monitors `libpod-conmon-<id>.scope` and
/// `crio-conmon-<id>.scope` fail the hex test.
pub(super) fn container_scope(seg: &str) -> Option<Owner> {
    const SCOPES: [(&str, ContainerRuntime); 5] = [
        ("docker-", ContainerRuntime::Docker),
        ("cri-containerd-", ContainerRuntime::Containerd),
        ("nerdctl-", ContainerRuntime::Containerd),
        ("crio-", ContainerRuntime::CriO),
        ("libpod-", ContainerRuntime::Podman),
    ];
    let base = seg.strip_suffix(".scope")?;
    SCOPES.iter().find_map(|&(prefix, runtime)| {
        let id = base.strip_prefix(prefix)?;
        is_hex_id(id).then(|| Owner::Container {
            runtime,
            id: id.to_string(),
        })
    })
}

/// The full 64-hex id a cgroupfs runtime names its directory by.
pub(super) fn is_full_id(s: &str) -> bool {
    s.len() == 64 && is_hex_id(s)
}

pub(super) fn is_hex_id(s: &str) -> bool {
    s.len() >= MIN_CONTAINER_ID_LEN && s.bytes().all(|b| b.is_ascii_hexdigit())
}

// ---------------------------------------------------------------------------------------------
// systemd

/// Unit types that can hold processes.
pub(super) const PROCESS_UNIT_SUFFIXES: [&str; 5] =
    [".service", ".scope", ".socket", ".mount", ".swap"];

pub(super) fn is_process_unit(seg: &str) -> bool {
    PROCESS_UNIT_SUFFIXES
        .iter()
        .any(|suffix| seg.len() > suffix.len() && seg.ends_with(suffix))
}

/// Walks the slices down to the first unit that can hold processes; sub-cgroups below it
/// belong to that unit (delegation).
pub(super) fn systemd(segs: &[&str]) -> Option<Owner> {
    let mut slice_uid: Option<u32> = None;
    for (i, seg) in segs.iter().enumerate() {
        if let Some(base) = seg.strip_suffix(".slice") {
            if let Some(uid) = base.strip_prefix("user-").and_then(parse_digits::<u32>) {
                slice_uid = Some(uid);
            }
            continue;
        }
        if !is_process_unit(seg) {
            return None;
        }
        if let Some(uid) = seg
            .strip_prefix("user@")
            .and_then(|s| s.strip_suffix(".service"))
            .and_then(parse_digits::<u32>)
        {
            // The user manager: the owner is the first unit below it, if any.
            let unit = segs[i + 1..]
                .iter()
                .take_while(|s| s.ends_with(".slice") || is_process_unit(s))
                .find(|s| is_process_unit(s));
            return Some(match unit {
                Some(unit) => Owner::SystemdUserUnit {
                    unit: unit.to_string(),
                    uid,
                },
                None => Owner::SystemdUnit {
                    unit: seg.to_string(),
                },
            });
        }
        return Some(if seg.ends_with(".scope") {
            Owner::SystemdScope {
                scope: seg.to_string(),
                uid: slice_uid,
            }
        } else {
            Owner::SystemdUnit {
                unit: seg.to_string(),
            }
        });
    }
    None
}

// ---------------------------------------------------------------------------------------------
// Small helpers

/// Parses only plain ASCII digits (`str::parse` would also take a leading `+`).
pub(super) fn parse_digits<T: std::str::FromStr>(s: &str) -> Option<T> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

pub(super) fn prefix_chars(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((at, _)) => &s[..at],
        None => s,
    }
}

pub(super) fn truncate_label(s: String) -> String {
    if s.chars().count() <= LABEL_MAX_CHARS {
        return s;
    }
    let mut out = prefix_chars(&s, LABEL_MAX_CHARS - 1).to_string();
    out.push('…');
    out
}
