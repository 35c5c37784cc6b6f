//! Validation of a parsed scenario: each `[[gpu]]` and `[[process]]` entry in turn, then
//! what the entries must not share. The first problem found is the error.

use std::collections::HashSet;

use super::*;

struct Model {
    memory_mib: u64,
    arch: u32,
    cc: (i32, i32),
    pci_device_id: u32,
    max_graphics: u32,
    max_memory: u32,
    power_limit_mw: u32,
}

fn model_of(name: &str) -> Model {
    let n = name.to_ascii_uppercase();
    if n.contains("H100") {
        Model {
            memory_mib: 81559,
            arch: 9,
            cc: (9, 0),
            pci_device_id: 0x2330_10DE,
            max_graphics: 1980,
            max_memory: 2619,
            power_limit_mw: 700_000,
        }
    } else if n.contains("A100") {
        Model {
            memory_mib: 81920,
            arch: 7,
            cc: (8, 0),
            pci_device_id: 0x20B2_10DE,
            max_graphics: 1410,
            max_memory: 1593,
            power_limit_mw: 400_000,
        }
    } else if n.contains("B200") {
        Model {
            memory_mib: 183_359,
            arch: 10,
            cc: (10, 0),
            pci_device_id: 0x2901_10DE,
            max_graphics: 1965,
            max_memory: 3996,
            power_limit_mw: 1_000_000,
        }
    } else {
        // H200 and anything unknown.
        Model {
            memory_mib: 143_771,
            arch: 9,
            cc: (9, 0),
            pci_device_id: 0x2335_10DE,
            max_graphics: 1980,
            max_memory: 3201,
            power_limit_mw: 700_000,
        }
    }
}

fn gi_list(gpu: &Gpu) -> String {
    if gpu.mig.is_empty() {
        return "none".into();
    }
    gpu.mig
        .iter()
        .map(|m| m.gi.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

pub(super) fn validate(path: &Path, raw: RawScenario) -> Result<Scenario, String> {
    if raw.gpu.len() > MAX_GPUS {
        return Err(format!("at most {MAX_GPUS} [[gpu]] entries are supported"));
    }
    let nvml_version = versions(&raw)?;
    let mut gpus = Vec::with_capacity(raw.gpu.len());
    for (i, g) in raw.gpu.into_iter().enumerate() {
        gpus.push(gpu(i, g, &raw.driver_version)?);
    }
    distinct(&gpus)?;
    let mut processes = Vec::new();
    let mut spawns = Vec::new();
    let mut seen = HashSet::new();
    let mut roles = Vec::new();
    for (i, p) in raw.process.into_iter().enumerate() {
        if let Some(role) = p.mps {
            roles.push((i, role, gpu_indices(&p.gpu)));
        }
        if let Some(p) = process(i, p, &gpus, &mut seen, &mut spawns)? {
            processes.push(p);
        }
    }
    mps_servers(&roles)?;
    let beside_scenario = |f: PathBuf| {
        if f.is_relative() {
            path.parent().unwrap_or(Path::new(".")).join(f)
        } else {
            f
        }
    };
    let state_file = raw.state_file.map(beside_scenario);
    if raw
        .device_dir
        .as_ref()
        .is_some_and(|d| d.as_os_str().is_empty())
    {
        return Err("device_dir must not be empty".into());
    }
    let device_dir = raw.device_dir.map(beside_scenario);
    let by_gpu = by_gpu(&processes, gpus.len());
    Ok(Scenario {
        path: path.to_path_buf(),
        by_gpu,
        driver_version: raw.driver_version,
        nvml_version,
        cuda_driver_version: raw.cuda_driver_version,
        init_error: raw.init_error.map(|e| e.0),
        settings_require_root: raw.settings_require_root,
        state_file,
        device_dir,
        fault_rate: raw.fault_rate,
        fault_seed: raw.fault_seed,
        fault_errors: if raw.fault_errors.is_empty() {
            vec![NVML_ERROR_UNKNOWN]
        } else {
            raw.fault_errors.iter().map(|e| e.0).collect()
        },
        xids: health::xids(raw.xid, gpus.len())?,
        gpus,
        processes,
        spawns,
    })
}

/// The driver's and NVML's version strings (NVML's derived when not given), and the fault
/// rate, checked.
fn versions(raw: &RawScenario) -> Result<String, String> {
    if raw.driver_version.is_empty() || raw.driver_version.len() >= 80 {
        return Err("driver_version must be a non-empty string shorter than 80 bytes".into());
    }
    let nvml_version = raw
        .nvml_version
        .clone()
        .unwrap_or_else(|| format!("{}.{}", raw.cuda_driver_version / 1000, raw.driver_version));
    if nvml_version.len() >= 80 {
        return Err("nvml_version must be shorter than 80 bytes".into());
    }
    if !(0.0..=1.0).contains(&raw.fault_rate) {
        return Err(format!(
            "fault_rate must be between 0 and 1, not {}",
            raw.fault_rate
        ));
    }
    Ok(nvml_version)
}

/// For each GPU, the indices of the processes on it.
fn by_gpu(processes: &[Process], gpus: usize) -> Vec<Vec<usize>> {
    let mut by_gpu = vec![Vec::new(); gpus];
    for (k, p) in processes.iter().enumerate() {
        for g in &p.gpus {
            by_gpu[*g as usize].push(k);
        }
    }
    by_gpu
}

/// `[[gpu]]` entry `i`, with its defaults filled in.
fn gpu(i: usize, g: RawGpu, driver_version: &str) -> Result<Gpu, String> {
    let index = i as u32;
    let at = format!("gpu[{i}]");
    let name = g.name.unwrap_or_else(|| "NVIDIA H200".to_string());
    if name.is_empty() || name.len() >= 64 {
        return Err(format!("{at}: name must be 1..63 bytes"));
    }
    let model = model_of(&name);
    let memory_total_mib = g.memory_total_mib.unwrap_or(model.memory_mib);
    if g.reserved_mib > memory_total_mib {
        return Err(format!(
            "{at}: reserved_mib is larger than memory_total_mib"
        ));
    }
    if let Some(f) = g.no_permission.iter().find(|f| !f.is_setting()) {
        return Err(format!(
            "{at}: no_permission lists {f:?}, which is not a setting (persistence_mode, compute_mode, applications_clocks, locked_clocks, memory_locked_clocks, accounting)"
        ));
    }
    let minor = g.minor.unwrap_or(index);
    if minor > 255 {
        return Err(format!("{at}: minor must be in 0..=255, not {minor}"));
    }
    let (mig_mode, mig) = mig(&at, &name, g.mig, g.mig_mode)?;
    let health = health::gpu_health(
        &at,
        health::recovery_action(g.recovery_action, driver_version),
        g.remapped_rows,
        g.ecc,
        g.retired_pages,
        g.clock_event_reasons,
    )?;
    let serial = g
        .serial
        .unwrap_or_else(|| format!("165{:010}", 2_400_000 + u64::from(index)));
    if serial.len() >= 30 {
        return Err(format!("{at}: serial must be shorter than 30 bytes"));
    }
    Ok(Gpu {
        index,
        uuid: g.uuid.map(|u| u.0).unwrap_or_else(|| derived_uuid(index)),
        pci: g.pci_bus_id.unwrap_or_else(|| derived_pci(index)),
        pci_device_id: model.pci_device_id,
        pci_subsystem_id: 0x18BE_10DE,
        serial,
        memory_total_mib,
        reserved_mib: g.reserved_mib,
        leaked_mib: g.leaked_mib,
        utilization_pct: g.utilization_pct.map(|p| p.0),
        memory_utilization_pct: g.memory_utilization_pct.map(|p| p.0),
        temperature_c: g.temperature_c,
        power_mw: g.power_mw,
        power_limit_mw: g.power_limit_mw.unwrap_or(model.power_limit_mw),
        fan_pct: g.fan_pct.map(|p| p.0),
        lost: g.lost,
        hang_ms: g.hang_ms,
        persistence_mode: g.persistence_mode.unwrap_or(false),
        compute_mode: g.compute_mode.unwrap_or(ComputeMode::Default),
        unsupported: g.unsupported,
        no_permission: g.no_permission,
        minor,
        architecture: model.arch,
        cuda_cc: model.cc,
        max_graphics_mhz: model.max_graphics,
        max_memory_mhz: model.max_memory,
        max_video_mhz: 1755,
        mig_mode,
        mig_pending: g.mig_pending.unwrap_or(mig_mode),
        mig,
        health,
        name,
    })
}

/// A GPU's MIG mode (on by default when it lists instances) and its instances laid out.
fn mig(
    at: &str,
    name: &str,
    raw: Vec<RawMig>,
    mig_mode: Option<bool>,
) -> Result<(bool, Vec<crate::mig::MigInstance>), String> {
    let requests: Vec<crate::mig::MigRequest> = raw
        .into_iter()
        .map(|m| crate::mig::MigRequest {
            profile: m.profile,
            gpu_instance: m.gpu_instance,
            compute_instance: m.compute_instance,
        })
        .collect();
    let mig_mode = mig_mode.unwrap_or(!requests.is_empty());
    if !mig_mode && !requests.is_empty() {
        return Err(format!(
            "{at}: mig_mode = false contradicts its [[gpu.mig]] instances (MIG off has none)"
        ));
    }
    if mig_mode && crate::mig::profiles_for(name).is_none() {
        return Err(format!(
            "{at}: MIG is modelled on H100 80GB and H200 only, not on '{name}'"
        ));
    }
    let mig = crate::mig::layout(name, &requests).map_err(|e| format!("{at}: {e}"))?;
    Ok((mig_mode, mig))
}

/// No two GPUs share a UUID, a minor number or a PCI bus id.
fn distinct(gpus: &[Gpu]) -> Result<(), String> {
    for (i, a) in gpus.iter().enumerate() {
        for b in &gpus[..i] {
            if a.uuid.eq_ignore_ascii_case(&b.uuid) {
                return Err(format!(
                    "gpu[{}] and gpu[{}] share the uuid {}",
                    b.index, a.index, a.uuid
                ));
            }
            if a.minor == b.minor {
                return Err(format!(
                    "gpu[{}] and gpu[{}] share the minor {}",
                    b.index, a.index, a.minor
                ));
            }
            if a.pci == b.pci {
                return Err(format!(
                    "gpu[{}] and gpu[{}] share the pci_bus_id {}",
                    b.index,
                    a.index,
                    a.pci.long()
                ));
            }
        }
    }
    Ok(())
}

/// `[[process]]` entry `i`: `None` for a spawn entry without a pid (its spawn spec goes
/// into `spawns`). `seen` holds the (pid, gpu) pairs of the entries before it.
fn process(
    i: usize,
    p: RawProcess,
    gpus: &[Gpu],
    seen: &mut HashSet<(u32, u32)>,
    spawns: &mut Vec<SpawnSpec>,
) -> Result<Option<Process>, String> {
    let at = match p.pid {
        Some(pid) => format!("process[{i}] (pid {pid})"),
        None => format!("process[{i}]"),
    };
    let sel = gpu_selection(&at, &p.gpu, gpus.len())?;
    if let Some(pid) = p.pid
        && (pid == 0 || pid > i32::MAX as u32)
    {
        return Err(format!("{at}: pid must be in 1..={}", i32::MAX));
    }
    let env = mps_keys(&at, &p, &sel)?;
    let server_default = (p.mps == Some(MpsRole::Server) && p.pid.is_none() && p.spawn.is_none())
        .then(|| vec![MPS_SERVER.to_string()]);
    if let Some(spec) = stand_in(i, &at, &p, server_default.as_ref(), env)? {
        spawns.push(spec);
    }
    listed_pid(&at, &p)?;
    if p.workers.unwrap_or(0) > 256 {
        return Err(format!("{at}: at most 256 workers"));
    }
    let instances = instances(&at, p.gpu_instance, p.compute_instance, &sel, gpus)?;
    let Some(pid) = p.pid else {
        return Ok(None);
    };
    for g in &sel {
        if !seen.insert((pid, *g)) {
            return Err(format!("{at}: pid {pid} is listed twice on gpu {g}"));
        }
    }
    Ok(Some(Process {
        pid,
        gpus: sel,
        used_mib: p.used_mib,
        sm_pct: p.sm_pct.0,
        mem_pct: p.mem_pct.0,
        kind: p.kind,
        teardown_ms: p.teardown_ms,
        unlisted: p.unlisted,
        listed_pid: p.listed_pid,
        instances,
        mps: p.mps,
    }))
}

/// The GPU indices a process entry names: at least one, each existing, none twice.
fn gpu_selection(at: &str, sel: &GpuSel, gpus: usize) -> Result<Vec<u32>, String> {
    let sel = gpu_indices(sel);
    if sel.is_empty() {
        return Err(format!("{at}: gpu must name at least one GPU index"));
    }
    for (k, g) in sel.iter().enumerate() {
        if *g as usize >= gpus {
            return Err(format!(
                "{at}: gpu {g} does not exist (the scenario has {gpus} GPUs)"
            ));
        }
        if sel[..k].contains(g) {
            return Err(format!("{at}: gpu {g} is listed twice"));
        }
    }
    Ok(sel)
}

/// The stand-in a process entry asks for (its `spawn` list, or an MPS server's default), or
/// none for an entry with only a pid, which must then carry no stand-in keys.
fn stand_in(
    i: usize,
    at: &str,
    p: &RawProcess,
    server_default: Option<&Vec<String>>,
    env: Vec<(String, String)>,
) -> Result<Option<SpawnSpec>, String> {
    match (p.spawn.as_ref().or(server_default), p.pid) {
        (None, None) => Err(format!("{at}: needs a pid or a spawn list")),
        (Some(argv), _) => {
            if argv.is_empty() || argv.iter().any(|a| a.is_empty() || a.contains('\0')) {
                return Err(format!(
                    "{at}: spawn must be a non-empty list of non-empty strings"
                ));
            }
            if p.crashed && p.workers.unwrap_or(0) == 0 {
                return Err(format!(
                    "{at}: crashed = true needs workers (a crashed run leaves its workers behind)"
                ));
            }
            Ok(Some(SpawnSpec {
                entry: i,
                argv: argv.clone(),
                workers: p.workers.unwrap_or(0),
                worker_used_mib: p.worker_used_mib,
                worker_sm_pct: p.worker_sm_pct.0,
                user: p.user.as_ref().map(|u| user(at, u)).transpose()?,
                cgroup: p.cgroup.as_deref().map(|c| cgroup(at, c)).transpose()?,
                crashed: p.crashed,
                env,
            }))
        }
        (None, Some(_)) => {
            if p.workers.is_some() || p.worker_used_mib.is_some() {
                return Err(format!("{at}: workers/worker_used_mib need a spawn list"));
            }
            if p.user.is_some() || p.cgroup.is_some() || p.crashed {
                return Err(format!(
                    "{at}: user, cgroup and crashed describe a stand-in: they need a spawn list"
                ));
            }
            Ok(None)
        }
    }
}

/// A `listed_pid` is a pid, and contradicts `unlisted`.
fn listed_pid(at: &str, p: &RawProcess) -> Result<(), String> {
    if let Some(lp) = p.listed_pid {
        if lp == 0 || lp > i32::MAX as u32 {
            return Err(format!("{at}: listed_pid must be in 1..={}", i32::MAX));
        }
        if p.unlisted {
            return Err(format!(
                "{at}: listed_pid and unlisted = true contradict (an unlisted process is reported under no pid)"
            ));
        }
    }
    Ok(())
}

fn gpu_indices(sel: &GpuSel) -> Vec<u32> {
    match sel {
        GpuSel::One(g) => vec![*g],
        GpuSel::Many(v) => v.clone(),
    }
}

/// An entry's MPS keys: the client limits go into its stand-in's environment, as CUDA reads
/// them (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` per device ordinal, here the GPU's index).
fn mps_keys(at: &str, p: &RawProcess, sel: &[u32]) -> Result<Vec<(String, String)>, String> {
    let limits = p.mps_active_thread_pct.is_some() || p.mps_pinned_mem_limit_mib.is_some();
    if limits && p.mps != Some(MpsRole::Client) {
        return Err(format!(
            "{at}: mps_active_thread_pct and mps_pinned_mem_limit_mib need mps = \"client\""
        ));
    }
    if limits && p.spawn.is_none() {
        return Err(format!(
            "{at}: mps_active_thread_pct and mps_pinned_mem_limit_mib set a client stand-in's environment: they need a spawn list"
        ));
    }
    if p.mps == Some(MpsRole::Server) && (p.workers.is_some() || p.crashed || p.unlisted) {
        return Err(format!(
            "{at}: an MPS server has no workers, does not crash here and is listed"
        ));
    }
    let mut env = Vec::new();
    if let Some(pct) = p.mps_active_thread_pct {
        env.push((
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(),
            pct.0.to_string(),
        ));
    }
    if let Some(mib) = p.mps_pinned_mem_limit_mib {
        if mib == 0 {
            return Err(format!("{at}: mps_pinned_mem_limit_mib must be at least 1"));
        }
        let per_gpu: Vec<String> = sel.iter().map(|g| format!("{g}={mib}M")).collect();
        env.push(("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(), per_gpu.join(",")));
    }
    Ok(env)
}

/// Each GPU has at most one MPS server, and every MPS client's GPUs have one: a client
/// talks to its GPU's server, never to the GPU itself.
fn mps_servers(roles: &[(usize, MpsRole, Vec<u32>)]) -> Result<(), String> {
    let mut servers: Vec<(u32, usize)> = Vec::new();
    for (i, _, gpus) in roles.iter().filter(|r| r.1 == MpsRole::Server) {
        for g in gpus {
            if let Some((_, first)) = servers.iter().find(|(sg, _)| sg == g) {
                return Err(format!(
                    "process[{first}] and process[{i}] are both the MPS server of gpu {g}"
                ));
            }
            servers.push((*g, *i));
        }
    }
    for (i, _, gpus) in roles.iter().filter(|r| r.1 == MpsRole::Client) {
        if let Some(g) = gpus
            .iter()
            .find(|g| !servers.iter().any(|(sg, _)| sg == *g))
        {
            return Err(format!(
                "process[{i}]: an MPS client of gpu {g}, which has no MPS server (an entry with mps = \"server\")"
            ));
        }
    }
    Ok(())
}

/// The (GPU instance, compute instance) a process runs in on each GPU of `sel`: `None` on
/// a GPU without MIG.
fn instances(
    at: &str,
    gpu_instance: Option<u32>,
    compute_instance: Option<u32>,
    sel: &[u32],
    gpus: &[Gpu],
) -> Result<Vec<Option<(u32, u32)>>, String> {
    let mut instances = Vec::with_capacity(sel.len());
    for g in sel {
        let gpu = &gpus[*g as usize];
        if !gpu.mig_mode {
            instances.push(None);
            continue;
        }
        let Some(gi) = gpu_instance else {
            return Err(format!(
                "{at}: gpu {g} is in MIG mode: gpu_instance must name one of its GPU instances ({})",
                gi_list(gpu)
            ));
        };
        let Some(m) = gpu.mig.iter().find(|m| m.gi == gi) else {
            return Err(format!(
                "{at}: gpu_instance {gi} does not exist on gpu {g} (its GPU instances: {})",
                gi_list(gpu)
            ));
        };
        if let Some(ci) = compute_instance
            && ci != m.ci
        {
            return Err(format!(
                "{at}: compute_instance {ci} does not exist in gpu_instance {gi} of gpu {g} (its compute instance is {})",
                m.ci
            ));
        }
        instances.push(Some((gi, m.ci)));
    }
    if (gpu_instance.is_some() || compute_instance.is_some())
        && instances.iter().all(Option::is_none)
    {
        return Err(format!(
            "{at}: gpu_instance/compute_instance need a GPU in MIG mode"
        ));
    }
    Ok(instances)
}

/// A stand-in's `user`: a uid (a number), or a name as useradd accepts it by default
/// (Debian's NAME_REGEX): a lowercase letter or `_`, then lowercase letters, digits, `_`
/// and `-`, at most 32, with an optional final `$`.
fn user(at: &str, value: &toml::Value) -> Result<User, String> {
    match value {
        toml::Value::Integer(uid) => u32::try_from(*uid)
            .ok()
            .filter(|uid| *uid != u32::MAX)
            .map(User::Uid)
            .ok_or_else(|| format!("{at}: user {uid} is not a uid (0..={})", u32::MAX - 1)),
        toml::Value::String(name) => {
            let body = name.strip_suffix('$').unwrap_or(name);
            let well_formed = !body.is_empty()
                && name.len() <= 32
                && body.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
                && body
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
            if well_formed {
                Ok(User::Name(name.clone()))
            } else if !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit()) {
                Err(format!(
                    "{at}: user '{name}' is a uid written as a string: write user = {name}"
                ))
            } else {
                Err(format!(
                    "{at}: user '{}' is not a user name (a lowercase letter or '_', then lowercase letters, digits, '_' or '-'; at most 32)",
                    name.escape_debug()
                ))
            }
        }
        other => Err(format!(
            "{at}: user must be a name or a uid, not a {}",
            other.type_str()
        )),
    }
}

/// A stand-in's `cgroup`: an absolute path below the root, as a manager writes it
/// (`/system.slice/slurmstepd.scope/job_812/step_0`), made of names a cgroup may have.
fn cgroup(at: &str, path: &str) -> Result<String, String> {
    let shown = path.escape_debug();
    let example = "like /system.slice/slurmstepd.scope/job_812/step_0";
    let Some(rest) = path.strip_prefix('/') else {
        return Err(format!(
            "{at}: cgroup '{shown}' must be an absolute path, {example}"
        ));
    };
    if rest.is_empty() {
        return Err(format!(
            "{at}: cgroup '/' is the root, which no manager puts a job in: name one below it, {example}"
        ));
    }
    if path.len() > 4095 {
        return Err(format!("{at}: cgroup is longer than 4095 bytes"));
    }
    for name in rest.split('/') {
        let problem = if name.is_empty() {
            Some("an empty name ('//' or a trailing '/')")
        } else if name == "." || name == ".." {
            Some("'.' or '..'")
        } else if name.chars().any(char::is_control) {
            Some("a control character")
        } else if name.len() > 255 {
            Some("a name longer than 255 bytes")
        } else if name.starts_with("cgroup.") {
            Some("a name starting with 'cgroup.' (the kernel's interface files)")
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(format!("{at}: cgroup '{shown}' has {problem}"));
        }
    }
    Ok(path.to_string())
}
