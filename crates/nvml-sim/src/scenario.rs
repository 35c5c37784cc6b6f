//! The scenario file: parsing, validation and defaults.
//!
//! Every key is documented in the crate's README.md. Unknown keys and bad values are errors.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::hash::fnv1a;
use crate::types::*;

pub mod health;
mod validate;
use validate::validate;

/// Most GPUs a scenario may hold (handles point into a static array of this size).
pub const MAX_GPUS: usize = 64;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    #[serde(default = "default_driver_version")]
    driver_version: String,
    #[serde(default = "default_cuda_driver_version")]
    cuda_driver_version: i32,
    nvml_version: Option<String>,
    init_error: Option<InitError>,
    /// As real drivers: a setting (persistence, clocks, compute mode, reset) is root's.
    #[serde(default = "settings_are_roots")]
    settings_require_root: bool,
    state_file: Option<PathBuf>,
    /// Where the sim makes the GPUs' device files (nvidia0, nvidiactl, ...).
    device_dir: Option<PathBuf>,
    /// The chance, per call on a GPU's handle, that it fails with one of `fault_errors`.
    #[serde(default)]
    fault_rate: f64,
    #[serde(default)]
    fault_seed: u64,
    /// Which errors injected faults are (default UNKNOWN).
    #[serde(default)]
    fault_errors: Vec<InitError>,
    #[serde(default)]
    gpu: Vec<RawGpu>,
    #[serde(default)]
    process: Vec<RawProcess>,
    /// Xid errors the driver raises (see `health.rs`).
    #[serde(default)]
    xid: Vec<health::RawXid>,
}

fn default_driver_version() -> String {
    "570.133.20".to_string()
}

fn default_cuda_driver_version() -> i32 {
    12080
}

fn settings_are_roots() -> bool {
    true
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGpu {
    name: Option<String>,
    uuid: Option<Uuid>,
    pci_bus_id: Option<PciBusId>,
    serial: Option<String>,
    memory_total_mib: Option<u64>,
    #[serde(default)]
    reserved_mib: u64,
    #[serde(default)]
    leaked_mib: u64,
    utilization_pct: Option<Pct>,
    memory_utilization_pct: Option<Pct>,
    temperature_c: Option<u32>,
    power_mw: Option<u32>,
    power_limit_mw: Option<u32>,
    fan_pct: Option<Pct>,
    #[serde(default)]
    lost: bool,
    /// Every call on this GPU blocks this long (a GPU falling off the bus).
    #[serde(default)]
    hang_ms: u64,
    persistence_mode: Option<bool>,
    compute_mode: Option<ComputeMode>,
    #[serde(default)]
    unsupported: Vec<Feature>,
    #[serde(default)]
    no_permission: Vec<Feature>,
    /// The device minor number (`/dev/nvidia<minor>`); default: the index.
    minor: Option<u32>,
    /// GPU instances: any puts the GPU in MIG mode.
    #[serde(default)]
    mig: Vec<RawMig>,
    /// Current MIG mode (default: on when `mig` lists instances).
    mig_mode: Option<bool>,
    /// Pending MIG mode (default: the current one).
    mig_pending: Option<bool>,
    // Health (see `health.rs`).
    recovery_action: Option<health::RecoveryKey>,
    remapped_rows: Option<health::RemappedRows>,
    ecc: Option<health::Ecc>,
    retired_pages: Option<health::RetiredPages>,
    clock_event_reasons: Option<Vec<health::ClockEventReason>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMig {
    profile: String,
    gpu_instance: Option<u32>,
    compute_instance: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProcess {
    pid: Option<u32>,
    gpu: GpuSel,
    used_mib: Option<u64>,
    #[serde(default)]
    sm_pct: Pct,
    #[serde(default)]
    mem_pct: Pct,
    #[serde(rename = "type", default)]
    kind: ProcKind,
    teardown_ms: Option<u64>,
    spawn: Option<Vec<String>>,
    workers: Option<u32>,
    worker_used_mib: Option<u64>,
    #[serde(default)]
    worker_sm_pct: Pct,
    /// Holds memory but is in no process list (a holder NVML cannot attribute).
    #[serde(default)]
    unlisted: bool,
    /// The pid NVML reports instead of `pid` (the process's pid in another PID namespace).
    listed_pid: Option<u32>,
    /// On MIG GPUs: the GPU instance the process runs in (required there).
    gpu_instance: Option<u32>,
    /// On MIG GPUs: the compute instance (default: the GPU instance's).
    compute_instance: Option<u32>,
    /// The stand-in's user: a name or a uid (the launcher, as root, runs it as that user).
    user: Option<toml::Value>,
    /// The stand-in's cgroup, as its manager would create it (the launcher, as root, makes
    /// it in a private subtree and runs the stand-in there, in a cgroup namespace).
    cgroup: Option<String>,
    /// The stand-in's main process exits once its workers run, as a crashed run's does,
    /// leaving them orphaned.
    #[serde(default)]
    crashed: bool,
    /// Its part in CUDA MPS on its GPUs: the server (a stand-in named
    /// `nvidia-cuda-mps-server` by default) or a client of that GPU's server.
    mps: Option<MpsRole>,
    /// An MPS client's `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` (its stand-in's environment).
    mps_active_thread_pct: Option<Pct>,
    /// An MPS client's pinned device memory limit, `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`.
    mps_pinned_mem_limit_mib: Option<u64>,
}

/// A process's part in CUDA MPS (Multi-Process Service) on its GPUs.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum MpsRole {
    /// `nvidia-cuda-mps-server`: holds the GPU context its clients' work runs in.
    Server,
    /// A CUDA process whose work the server runs.
    Client,
}

/// The name of NVIDIA's MPS server, which a server stand-in takes by default.
pub const MPS_SERVER: &str = "nvidia-cuda-mps-server";

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum GpuSel {
    One(u32),
    Many(Vec<u32>),
}

/// A percentage, 0..=100.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(try_from = "i64")]
pub struct Pct(pub u32);

impl TryFrom<i64> for Pct {
    type Error = String;
    fn try_from(v: i64) -> Result<Self, String> {
        if (0..=100).contains(&v) {
            Ok(Pct(v as u32))
        } else {
            Err(format!("percentage {v} is not in 0..=100"))
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
pub enum ProcKind {
    #[default]
    #[serde(rename = "compute")]
    Compute,
    #[serde(rename = "graphics")]
    Graphics,
    #[serde(rename = "compute+graphics")]
    ComputeGraphics,
}

impl ProcKind {
    pub fn compute(self) -> bool {
        matches!(self, ProcKind::Compute | ProcKind::ComputeGraphics)
    }
    pub fn graphics(self) -> bool {
        matches!(self, ProcKind::Graphics | ProcKind::ComputeGraphics)
    }
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ComputeMode {
    Default,
    ExclusiveProcess,
    Prohibited,
}

impl ComputeMode {
    pub fn to_nvml(self) -> u32 {
        match self {
            ComputeMode::Default => NVML_COMPUTEMODE_DEFAULT,
            ComputeMode::ExclusiveProcess => NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
            ComputeMode::Prohibited => NVML_COMPUTEMODE_PROHIBITED,
        }
    }
    pub fn from_nvml(v: u32) -> Option<Self> {
        match v {
            NVML_COMPUTEMODE_DEFAULT => Some(ComputeMode::Default),
            NVML_COMPUTEMODE_EXCLUSIVE_PROCESS => Some(ComputeMode::ExclusiveProcess),
            NVML_COMPUTEMODE_PROHIBITED => Some(ComputeMode::Prohibited),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            ComputeMode::Default => "default",
            ComputeMode::ExclusiveProcess => "exclusive_process",
            ComputeMode::Prohibited => "prohibited",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "default" => Some(ComputeMode::Default),
            "exclusive_process" => Some(ComputeMode::ExclusiveProcess),
            "prohibited" => Some(ComputeMode::Prohibited),
            _ => None,
        }
    }
}

/// Names usable in a GPU's `unsupported` list (and, for settings, `no_permission`).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Feature {
    Serial,
    PciInfo,
    MinorNumber,
    Brand,
    Architecture,
    CudaComputeCapability,
    Memory,
    Bar1Memory,
    Utilization,
    Temperature,
    Power,
    Fan,
    PerformanceState,
    Clocks,
    Processes,
    ProcessUtilization,
    // Settings (also valid in `no_permission`).
    PersistenceMode,
    ComputeMode,
    ApplicationsClocks,
    LockedClocks,
    MemoryLockedClocks,
    Accounting,
}

impl Feature {
    pub fn is_setting(self) -> bool {
        matches!(
            self,
            Feature::PersistenceMode
                | Feature::ComputeMode
                | Feature::ApplicationsClocks
                | Feature::LockedClocks
                | Feature::MemoryLockedClocks
                | Feature::Accounting
        )
    }
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(try_from = "String")]
struct InitError(u32);

impl TryFrom<String> for InitError {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        let upper = s.trim().to_ascii_uppercase();
        let name = upper.strip_prefix("NVML_ERROR_").unwrap_or(&upper);
        RETURN_CODES
            .iter()
            .find(|(n, code, _)| *n == name && *code != NVML_SUCCESS)
            .map(|(_, code, _)| InitError(*code))
            .ok_or_else(|| format!("unknown NVML error name '{s}' (e.g. DRIVER_NOT_LOADED)"))
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "String")]
struct Uuid(String);

impl TryFrom<String> for Uuid {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        let ok = s.len() < 80
            && s.starts_with("GPU-")
            && s.is_ascii()
            && !s.contains(char::is_whitespace);
        if ok {
            Ok(Uuid(s))
        } else {
            Err(format!(
                "uuid '{s}' must look like GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
            ))
        }
    }
}

/// A PCI address: domain, bus, device, function.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(try_from = "String")]
pub struct PciBusId {
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    pub function: u32,
}

impl PciBusId {
    /// Parses `DDDDDDDD:BB:DD.F`, `DDDD:BB:DD.F` or `BB:DD.F` (hex, any case).
    pub fn parse(s: &str) -> Option<PciBusId> {
        let s = s.trim();
        let parts: Vec<&str> = s.split(':').collect();
        let (domain, bus, rest) = match parts.as_slice() {
            [d, b, r] => (u32::from_str_radix(d, 16).ok()?, *b, *r),
            [b, r] => (0, *b, *r),
            _ => return None,
        };
        let (dev, func) = rest.split_once('.').unwrap_or((rest, "0"));
        let bus = u32::from_str_radix(bus, 16).ok()?;
        let device = u32::from_str_radix(dev, 16).ok()?;
        let function = u32::from_str_radix(func, 16).ok()?;
        if bus > 0xff || device > 0x1f || function > 7 {
            return None;
        }
        Some(PciBusId {
            domain,
            bus,
            device,
            function,
        })
    }

    /// `00000000:18:00.0`, as NVML's `busId` (v2/v3).
    pub fn long(&self) -> String {
        format!(
            "{:08X}:{:02X}:{:02X}.{:X}",
            self.domain, self.bus, self.device, self.function
        )
    }

    /// `0000:18:00.0`, as NVML's `busIdLegacy` / v1 `busId`.
    pub fn legacy(&self) -> String {
        format!(
            "{:04X}:{:02X}:{:02X}.{:X}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl TryFrom<String> for PciBusId {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        PciBusId::parse(&s)
            .ok_or_else(|| format!("pci_bus_id '{s}' must look like 00000000:18:00.0"))
    }
}

/// One simulated GPU, with every default filled in.
#[derive(Debug, Clone)]
pub struct Gpu {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub pci: PciBusId,
    pub pci_device_id: u32,
    pub pci_subsystem_id: u32,
    pub serial: String,
    pub memory_total_mib: u64,
    pub reserved_mib: u64,
    pub leaked_mib: u64,
    pub utilization_pct: Option<u32>,
    pub memory_utilization_pct: Option<u32>,
    pub temperature_c: Option<u32>,
    pub power_mw: Option<u32>,
    pub power_limit_mw: u32,
    pub fan_pct: Option<u32>,
    pub lost: bool,
    /// Every call on this GPU blocks this long before it answers; 0: none.
    pub hang_ms: u64,
    pub persistence_mode: bool,
    pub compute_mode: ComputeMode,
    pub unsupported: Vec<Feature>,
    pub no_permission: Vec<Feature>,
    /// The device minor number: `nvmlDeviceGetMinorNumber`, `/dev/nvidia<minor>`.
    pub minor: u32,
    pub architecture: u32,
    pub cuda_cc: (i32, i32),
    pub max_graphics_mhz: u32,
    pub max_memory_mhz: u32,
    pub max_video_mhz: u32,
    /// Current and pending MIG mode.
    pub mig_mode: bool,
    pub mig_pending: bool,
    /// The MIG devices, sorted by GPU instance id: a device's position here is its index
    /// for `nvmlDeviceGetMigDeviceHandleByIndex`.
    pub mig: Vec<crate::mig::MigInstance>,
    /// Recovery action, remapped rows, ECC, retired pages, clock-event reasons.
    pub health: health::GpuHealth,
}

impl Gpu {
    pub fn supports(&self, f: Feature) -> bool {
        !self.unsupported.contains(&f)
    }

    /// The MIG device with these GPU and compute instance ids, and its index.
    pub fn mig_instance(&self, gi: u32, ci: u32) -> Option<(usize, &crate::mig::MigInstance)> {
        self.mig
            .iter()
            .enumerate()
            .find(|(_, m)| m.gi == gi && m.ci == ci)
    }
}

/// One listed process (only entries with a `pid`; `spawn`-only entries are resolved by the
/// launcher).
#[derive(Debug, Clone)]
pub struct Process {
    pub pid: u32,
    pub gpus: Vec<u32>,
    pub used_mib: Option<u64>,
    pub sm_pct: u32,
    pub mem_pct: u32,
    pub kind: ProcKind,
    pub teardown_ms: Option<u64>,
    /// Counted in the GPU's used memory while alive, but in no process list.
    pub unlisted: bool,
    /// The pid the process lists report; liveness is still judged on `pid`.
    pub listed_pid: Option<u32>,
    /// Per entry of `gpus`: the (GPU instance, compute instance) it runs in on that GPU,
    /// `None` on a GPU not in MIG mode.
    pub instances: Vec<Option<(u32, u32)>>,
    /// Its part in MPS on its GPUs.
    pub mps: Option<MpsRole>,
}

impl Process {
    /// The MIG instance the process runs in on GPU `gpu`.
    pub fn instance_on(&self, gpu: u32) -> Option<(u32, u32)> {
        let k = self.gpus.iter().position(|g| *g == gpu)?;
        self.instances.get(k).copied().flatten()
    }
}

/// A `spawn` entry, for the launcher.
#[derive(Debug, Clone)]
pub struct SpawnSpec {
    /// Position of the entry in the `[[process]]` array.
    pub entry: usize,
    pub argv: Vec<String>,
    pub workers: u32,
    pub worker_used_mib: Option<u64>,
    pub worker_sm_pct: u32,
    /// Who the stand-in runs as (when the launcher is root).
    pub user: Option<User>,
    /// The stand-in's cgroup path as its manager writes it, `/`-separated, never the root.
    pub cgroup: Option<String>,
    /// The main process exits once its workers run; only the workers stay, orphaned.
    pub crashed: bool,
    /// Variables set in the stand-in's environment (an MPS client's limits).
    pub env: Vec<(String, String)>,
}

/// A stand-in's user, as the scenario names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum User {
    Name(String),
    Uid(u32),
}

impl std::fmt::Display for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            User::Name(name) => f.write_str(name),
            User::Uid(uid) => write!(f, "uid {uid}"),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Scenario {
    pub path: PathBuf,
    pub driver_version: String,
    pub nvml_version: String,
    pub cuda_driver_version: i32,
    pub init_error: Option<u32>,
    pub settings_require_root: bool,
    pub state_file: Option<PathBuf>,
    /// Where the GPUs' device files are made; relative paths already resolved against the
    /// scenario's directory.
    pub device_dir: Option<PathBuf>,
    /// Injected faults: each call on a GPU's handle fails with this chance, with one of
    /// `fault_errors` (NVML return codes), drawn from a generator seeded by `fault_seed`.
    pub fault_rate: f64,
    pub fault_seed: u64,
    pub fault_errors: Vec<u32>,
    pub gpus: Vec<Gpu>,
    pub processes: Vec<Process>,
    /// For each GPU, the positions in `processes` of the entries on it.
    pub by_gpu: Vec<Vec<usize>>,
    pub spawns: Vec<SpawnSpec>,
    /// The `[[xid]]` entries, in file order.
    pub xids: Vec<health::Xid>,
}

/// The UUID a GPU gets when the scenario gives none.
pub fn derived_uuid(index: u32) -> String {
    let key = format!("nvml-sim-gpu-{index}");
    let a = fnv1a(0, key.as_bytes());
    let b = fnv1a(0x9e37_79b9_7f4a_7c15, key.as_bytes());
    let hex = format!("{a:016x}{b:016x}");
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The PCI address a GPU gets when the scenario gives none: the bus numbers of an HGX
/// 8-GPU board, then the same buses in the next PCI domain.
pub fn derived_pci(index: u32) -> PciBusId {
    const BUSES: [u32; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];
    PciBusId {
        domain: index / 8,
        bus: BUSES[(index % 8) as usize],
        device: 0,
        function: 0,
    }
}

/// A problem with a scenario, as one line: `PATH: line N: message` (line where known).
pub type ScenarioError = String;

fn one_line(s: &str) -> String {
    s.trim()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
        .replace('`', "'")
}

/// Reads and validates a scenario file.
pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{}: cannot read the scenario: {e}", path.display()))?;
    parse(path, &text)
}

/// Parses and validates scenario text; `path` names it in errors and anchors relative paths.
pub fn parse(path: &Path, text: &str) -> Result<Scenario, ScenarioError> {
    let raw: RawScenario = toml::from_str(text).map_err(|e| {
        let line = e
            .span()
            .map(|span| text[..span.start.min(text.len())].matches('\n').count() + 1);
        match line {
            Some(line) => format!("{}: line {line}: {}", path.display(), one_line(e.message())),
            None => format!("{}: {}", path.display(), one_line(e.message())),
        }
    })?;
    validate(path, raw).map_err(|msg| format!("{}: {msg}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Result<Scenario, String> {
        parse(Path::new("/tmp/x.toml"), text)
    }

    #[test]
    fn defaults() {
        let s = p("[[gpu]]\n[[gpu]]\nname = \"NVIDIA H100 80GB HBM3\"\n").unwrap();
        assert_eq!(s.gpus.len(), 2);
        assert_eq!(s.gpus[0].name, "NVIDIA H200");
        assert_eq!(s.gpus[0].memory_total_mib, 143771);
        assert_eq!(s.gpus[1].memory_total_mib, 81559);
        assert_ne!(s.gpus[0].uuid, s.gpus[1].uuid);
        assert_eq!(s.gpus[0].uuid.len(), 40);
        assert_eq!(s.gpus[1].pci.long(), "00000000:2A:00.0");
        assert_eq!(s.nvml_version, "12.570.133.20");
        // A non-root caller's settings are refused, as by the real driver.
        assert!(s.settings_require_root);
    }

    #[test]
    fn unknown_key_names_line() {
        let e = p("driver_version = \"1\"\n[[gpu]]\nfoo = 1\n").unwrap_err();
        assert!(
            e.starts_with("/tmp/x.toml: line 3: unknown field 'foo'"),
            "{e}"
        );
        assert!(!e.contains('\n'));
    }

    #[test]
    fn bad_values() {
        assert!(p("init_error = \"NOPE\"").unwrap_err().contains("line 1"));
        assert_eq!(
            p("init_error = \"NVML_ERROR_DRIVER_NOT_LOADED\"")
                .unwrap()
                .init_error,
            Some(NVML_ERROR_DRIVER_NOT_LOADED)
        );
        assert!(p("[[gpu]]\nutilization_pct = 101").is_err());
        assert!(p("[[gpu]]\nunsupported = [\"bogus\"]").is_err());
        assert!(p("[[gpu]]\nno_permission = [\"temperature\"]").is_err());
        assert!(
            p("[[gpu]]\n[[process]]\npid = 5\ngpu = 1")
                .unwrap_err()
                .contains("does not exist")
        );
        assert!(p("[[gpu]]\n[[process]]\ngpu = 0").is_err());
        assert!(p("[[gpu]]\ncompute_mode = \"exclusive_thread\"").is_err());
        let s =
            p("[[gpu]]\n[[gpu]]\n[[process]]\npid = 5\ngpu = [0, 1]\ntype = \"compute+graphics\"")
                .unwrap();
        assert_eq!(s.processes[0].gpus, vec![0, 1]);
    }

    #[test]
    fn minor_device_dir_and_process_keys() {
        let s = p("device_dir = \"dev\"\n[[gpu]]\nminor = 7\n[[gpu]]\n").unwrap();
        assert_eq!(s.device_dir.as_deref(), Some(Path::new("/tmp/dev")));
        assert_eq!((s.gpus[0].minor, s.gpus[1].minor), (7, 1));
        let s = p("device_dir = \"/abs/dev\"").unwrap();
        assert_eq!(s.device_dir.as_deref(), Some(Path::new("/abs/dev")));
        assert!(p("").unwrap().device_dir.is_none());
        let s = p(
            "[[gpu]]\n[[process]]\npid = 5\ngpu = 0\nunlisted = true\n[[process]]\npid = 6\ngpu = 0\nlisted_pid = 1\n",
        )
        .unwrap();
        assert!(s.processes[0].unlisted && s.processes[0].listed_pid.is_none());
        assert!(!s.processes[1].unlisted);
        assert_eq!(s.processes[1].listed_pid, Some(1));
    }

    #[test]
    fn bad_minor_device_dir_and_process_keys() {
        let one_line = |e: String| {
            assert!(e.starts_with("/tmp/x.toml: "), "{e}");
            assert!(!e.contains('\n'), "{e}");
            e
        };
        let e = one_line(p("[[gpu]]\n[[gpu]]\nminor = 0\n").unwrap_err());
        assert!(e.contains("gpu[0] and gpu[1] share the minor 0"), "{e}");
        let e = one_line(p("[[gpu]]\nminor = 256\n").unwrap_err());
        assert!(e.contains("gpu[0]: minor must be in 0..=255"), "{e}");
        let e = one_line(p("[[gpu]]\nminor = -1\n").unwrap_err());
        assert!(e.contains("line 2"), "{e}");
        let e = one_line(p("[[gpu]]\nminor = \"3\"\n").unwrap_err());
        assert!(e.contains("line 2"), "{e}");
        let e = one_line(p("device_dir = \"\"\n").unwrap_err());
        assert!(e.contains("device_dir must not be empty"), "{e}");
        let e = one_line(p("device_dir = 3\n").unwrap_err());
        assert!(e.contains("line 1"), "{e}");
        let proc_ = "[[gpu]]\n[[process]]\npid = 5\ngpu = 0\n";
        let e = one_line(p(&format!("{proc_}unlisted = \"yes\"\n")).unwrap_err());
        assert!(e.contains("line 5"), "{e}");
        let e = one_line(p(&format!("{proc_}listed_pid = 0\n")).unwrap_err());
        assert!(
            e.contains("process[0] (pid 5): listed_pid must be in 1..="),
            "{e}"
        );
        let e = one_line(p(&format!("{proc_}listed_pid = 4294967295\n")).unwrap_err());
        assert!(e.contains("listed_pid must be in 1..="), "{e}");
        let e = one_line(p(&format!("{proc_}listed_pid = -2\n")).unwrap_err());
        assert!(e.contains("line 5"), "{e}");
        let e = one_line(p(&format!("{proc_}listed_pid = 9\nunlisted = true\n")).unwrap_err());
        assert!(
            e.contains("process[0] (pid 5): listed_pid and unlisted"),
            "{e}"
        );
    }

    #[test]
    fn standin_user_cgroup_and_crashed() {
        let s = p(r#"
[[gpu]]
[[process]]
spawn = ["python3", "train.py"]
gpu = 0
user = "alice"
cgroup = "/system.slice/slurmstepd.scope/job_812/step_0"
[[process]]
spawn = ["python3", "train.py"]
gpu = 0
user = 1001
workers = 2
crashed = true
[[process]]
spawn = ["python3", "serve.py"]
gpu = 0
"#)
        .unwrap();
        let [a, b, c] = &s.spawns[..] else {
            panic!("{:?}", s.spawns)
        };
        assert_eq!(a.user, Some(User::Name("alice".into())));
        assert_eq!(
            a.cgroup.as_deref(),
            Some("/system.slice/slurmstepd.scope/job_812/step_0")
        );
        assert!(!a.crashed);
        assert_eq!(b.user, Some(User::Uid(1001)));
        assert!(b.crashed && b.cgroup.is_none());
        assert!(c.user.is_none() && c.cgroup.is_none() && !c.crashed);
    }

    #[test]
    fn bad_standin_user_cgroup_and_crashed() {
        let spawn = "[[gpu]]\n[[process]]\nspawn = [\"x\"]\ngpu = 0\n";
        let err = |extra: &str| {
            let e = p(&format!("{spawn}{extra}\n")).unwrap_err();
            assert!(e.starts_with("/tmp/x.toml: "), "{e}");
            assert!(!e.contains('\n'), "{e}");
            e
        };
        for (extra, says) in [
            (
                "user = \"Alice\"",
                "process[0]: user 'Alice' is not a user name",
            ),
            ("user = \"\"", "user '' is not a user name"),
            ("user = \"a b\"", "user 'a b' is not a user name"),
            (
                "user = \"1001\"",
                "user '1001' is a uid written as a string: write user = 1001",
            ),
            ("user = -1", "user -1 is not a uid"),
            ("user = 4294967295", "user 4294967295 is not a uid"),
            ("user = true", "user must be a name or a uid, not a boolean"),
            (
                "cgroup = \"system.slice/x.service\"",
                "must be an absolute path",
            ),
            ("cgroup = \"/\"", "cgroup '/' is the root"),
            ("cgroup = \"/a//b\"", "has an empty name"),
            ("cgroup = \"/a/\"", "has an empty name"),
            ("cgroup = \"/a/../b\"", "has '.' or '..'"),
            ("cgroup = \"/a\\nb\"", "has a control character"),
            ("cgroup = \"/cgroup.procs\"", "starting with 'cgroup.'"),
            ("cgroup = 3", "line 5"),
            ("crashed = true", "crashed = true needs workers"),
            ("crashed = 1", "line 5"),
        ] {
            let e = err(extra);
            assert!(e.contains(says), "{extra}: {e}");
        }
        let long = format!("cgroup = \"/{}\"", "a".repeat(256));
        assert!(err(&long).contains("longer than 255 bytes"));
        let e = p("[[gpu]]\n[[process]]\npid = 5\ngpu = 0\nuser = \"alice\"\n").unwrap_err();
        assert!(
            e.contains("process[0] (pid 5): user, cgroup and crashed describe a stand-in"),
            "{e}"
        );
    }

    #[test]
    fn mps_server_clients_and_limits() {
        let s = p(r#"
[[gpu]]
[[gpu]]
[[process]]
mps = "server"
gpu = 0
used_mib = 300
[[process]]
spawn = ["python3", "rank.py"]
gpu = 0
mps = "client"
mps_active_thread_pct = 50
mps_pinned_mem_limit_mib = 2048
[[process]]
pid = 7
gpu = 0
mps = "client"
"#)
        .unwrap();
        let [server, client] = &s.spawns[..] else {
            panic!("{:?}", s.spawns)
        };
        assert_eq!(server.argv, vec![MPS_SERVER.to_string()]);
        assert!(server.env.is_empty());
        assert_eq!(
            client.env,
            vec![
                ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(), "50".into()),
                ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(), "0=2048M".into()),
            ]
        );
        assert_eq!(s.processes[0].mps, Some(MpsRole::Client));
    }

    #[test]
    fn bad_mps_keys() {
        let err = |text: &str, says: &str| {
            let e = p(text).unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
            assert!(!e.contains('\n'), "{e}");
        };
        let server = "[[gpu]]\n[[gpu]]\n[[process]]\nmps = \"server\"\ngpu = 0\n";
        err(
            &format!("{server}[[process]]\nmps = \"server\"\ngpu = [1, 0]\n"),
            "process[0] and process[1] are both the MPS server of gpu 0",
        );
        err(
            &format!("{server}[[process]]\npid = 4\nmps = \"client\"\ngpu = 1\n"),
            "process[1]: an MPS client of gpu 1, which has no MPS server",
        );
        err(
            &format!("{server}[[process]]\npid = 4\ngpu = 0\nmps_active_thread_pct = 5\n"),
            "need mps = \"client\"",
        );
        err(
            &format!(
                "{server}[[process]]\npid = 4\ngpu = 0\nmps = \"client\"\nmps_active_thread_pct = 5\n"
            ),
            "they need a spawn list",
        );
        err(
            "[[gpu]]\n[[process]]\nmps = \"server\"\ngpu = 0\nworkers = 2\n",
            "an MPS server has no workers",
        );
        err(
            "[[gpu]]\n[[process]]\nmps = \"mayor\"\ngpu = 0\n",
            "line 3: unknown variant 'mayor'",
        );
        err(
            &format!(
                "{server}[[process]]\nspawn = [\"x\"]\ngpu = 0\nmps = \"client\"\nmps_pinned_mem_limit_mib = 0\n"
            ),
            "mps_pinned_mem_limit_mib must be at least 1",
        );
    }

    #[test]
    fn pci_parse() {
        let a = PciBusId::parse("0000:9a:00.0").unwrap();
        assert_eq!(a.long(), "00000000:9A:00.0");
        assert_eq!(a.legacy(), "0000:9A:00.0");
        assert_eq!(PciBusId::parse("9A:00.0"), Some(a));
        assert!(PciBusId::parse("zz").is_none());
    }
}
