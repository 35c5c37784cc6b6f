//! The harness: finds the built binaries and nvml-sim, writes scenarios, spawns real
//! processes that are killed when the test ends.

#![allow(dead_code)]

use std::fmt::{self, Display};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A component a harness needs, installed by its scripts/fetch-* script (nvidia-smi, Slurm,
/// Prometheus): the script runs at most once per process, however many tests ask, and every
/// test that asks gets the same answer.
///
///     static SLURM: Fetch = Fetch::new("fetch-slurm");
///     let version = SLURM.once()?;
pub struct Fetch {
    script: &'static str,
    result: OnceLock<Result<String, String>>,
}

impl Fetch {
    pub const fn new(script: &'static str) -> Fetch {
        Fetch {
            script,
            result: OnceLock::new(),
        }
    }

    /// Runs scripts/SCRIPT the first time: Ok(what it printed on stdout, trimmed) or
    /// Err(its one-line reason, the last line of its stderr) for a test to fail with.
    pub fn once(&'static self) -> Result<&'static str, String> {
        self.result
            .get_or_init(|| {
                let script = Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../scripts")
                    .join(self.script);
                let output = Command::new(&script)
                    .stdin(Stdio::null())
                    .output()
                    .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
                if output.status.success() {
                    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
                } else {
                    let stderr = String::from_utf8_lossy(&output.stderr);
                    let line = stderr.lines().last().unwrap_or("").trim();
                    Err(if line.is_empty() {
                        format!("scripts/{} failed ({})", self.script, output.status)
                    } else {
                        line.to_string()
                    })
                }
            })
            .as_deref()
            .map_err(Clone::clone)
    }
}

/// The kinds the watchdog's `gpuctl_findings` family counts, in its order: every kind of
/// finding (core's `classify::Kind::ALL`, the one list of them), then impostors.
pub fn counted_finding_kinds() -> Vec<&'static str> {
    gpuctl_core::classify::Kind::ALL
        .iter()
        .map(|kind| kind.name())
        .chain(["impostor"])
        .collect()
}

/// Held while a launcher runs with `--create-users` (scripts/demo, the guide's examples):
/// a run removes the accounts it made when it ends, so two at once would take alice, bob and
/// carol from under each other.
pub static TEAM_ACCOUNTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A scenario of `count` H200s and no process.
pub fn h200s(count: usize) -> Scenario {
    Scenario::new().gpus(count, Gpu::h200())
}

/// The repository's root (tests/ lives in it).
pub fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives in the repository")
}

/// A published JSON schema, `docs/schema/NAME`.
pub fn schema(name: &str) -> serde_json::Value {
    let path = repo_root().join("docs/schema").join(name);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The name /etc/passwd (or NSS) gives `uid`.
pub fn user_name(uid: u32) -> String {
    let out = Command::new("id")
        .args(["-nu", &uid.to_string()])
        .output()
        .expect("run id");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// The last `lines` lines of a file, or a note that it cannot be read.
pub fn tail(path: &Path, lines: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("({}: {e})", path.display()),
    }
}

/// setpriv's arguments that run the program after them as user and group `uid`, with no
/// supplementary groups.
pub fn setpriv_args(uid: u32) -> [String; 6] {
    let id = uid.to_string();
    [
        "--reuid".into(),
        id.clone(),
        "--regid".into(),
        id,
        "--clear-groups".into(),
        "--".into(),
    ]
}

/// `setpriv` with [`setpriv_args`]: add the program and its arguments.
pub fn setpriv(uid: u32) -> Command {
    let mut command = Command::new("setpriv");
    command.args(setpriv_args(uid));
    command
}

/// The entry of process `pid` on GPU `gpu` in a `gpuctl info --json` document.
pub fn process_on(doc: &serde_json::Value, gpu: usize, pid: u32) -> Option<&serde_json::Value> {
    doc["devices"][gpu]["processes"]
        .as_array()?
        .iter()
        .find(|p| p["pid"] == pid)
}

/// The entry of process `pid` on any GPU in a `gpuctl info --json` document.
pub fn process_in(doc: &serde_json::Value, pid: u32) -> Option<&serde_json::Value> {
    doc["devices"]
        .as_array()?
        .iter()
        .flat_map(|d| d["processes"].as_array().into_iter().flatten())
        .find(|p| p["pid"] == pid)
}

/// target/<profile>, found from this test binary (target/<profile>/deps/e2e-HASH).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.parent()
        .and_then(Path::parent)
        .expect("test binary lives in target/<profile>/deps")
        .to_path_buf()
}

fn built(name: &str) -> PathBuf {
    let path = target_dir().join(name);
    assert!(
        path.exists(),
        "{} is not built: run `cargo build --workspace` before the tests (scripts/test does)",
        path.display()
    );
    path
}

pub fn gpuctl_bin() -> PathBuf {
    built("gpuctl")
}

pub fn watchdog_bin() -> PathBuf {
    built("gpuctl-watchdog")
}

pub fn sim_lib() -> PathBuf {
    built("libnvml_sim.so")
}

pub fn testproc_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gpuctl-testproc"))
}

/// A scratch directory with a scenario file and the sim's state file.
pub struct Sim {
    pub dir: tempfile::TempDir,
}

impl Sim {
    /// `scenario` is a [`Scenario`], or TOML text as it is (a file under test, or a literal).
    pub fn new(scenario: &(impl Display + ?Sized)) -> Sim {
        let sim = Sim {
            dir: tempfile::tempdir().expect("tempdir"),
        };
        // A named configuration must exist: this one is empty (the built-in policy) until a
        // test writes its own. In a directory of its own, which `share` leaves as it is: a
        // configuration in a directory everyone may write does not steer root.
        std::fs::create_dir(sim.dir.path().join("etc")).expect("configuration directory");
        std::fs::write(sim.config_path(), "").expect("write the empty configuration");
        sim.write(scenario);
        sim
    }

    pub fn scenario_path(&self) -> PathBuf {
        self.dir.path().join("scenario.toml")
    }

    /// The configuration file gpuctl reads (empty unless a test writes it).
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("etc/gpuctl.toml")
    }

    /// The device directory gpuctl is pointed at: a scenario that wants device files says
    /// `device_dir = "<this>"`.
    pub fn dev_dir(&self) -> PathBuf {
        self.dir.path().join("dev")
    }

    /// The socket gpuctl asks for the host service (GPUCTL_SOCKET): nothing listens there.
    pub fn no_service_socket(&self) -> PathBuf {
        self.dir.path().join("no-service.sock")
    }

    pub fn state_path(&self) -> PathBuf {
        self.dir.path().join("state.json")
    }

    /// The kernel log of this simulated server (kmsg's record format): where the sim writes
    /// the driver's Xid lines and the watchdog reads them.
    pub fn kernel_log_path(&self) -> PathBuf {
        self.dir.path().join("kmsg")
    }

    /// The kernel log is the test's own: the sim writes the driver's Xid lines there, and
    /// the watchdog reads them there, never the machine's /dev/kmsg.
    pub fn kernel_log_env<'c>(&self, command: &'c mut Command) -> &'c mut Command {
        let kernel_log = self.kernel_log_path();
        if !kernel_log.exists() {
            std::fs::write(&kernel_log, "").expect("create the kernel log");
        }
        command
            .env("GPUCTL_KERNEL_LOG", &kernel_log)
            .env("NVML_SIM_KERNEL_LOG", &kernel_log)
    }

    /// Replaces the scenario atomically, as a program polling it must see whole files.
    pub fn write(&self, scenario: &(impl Display + ?Sized)) {
        let tmp = self.dir.path().join("scenario.toml.tmp");
        std::fs::write(&tmp, scenario.to_string()).expect("write scenario");
        std::fs::rename(&tmp, self.scenario_path()).expect("rename scenario");
    }

    /// `gpuctl ARGS` against this scenario, with a clean environment for colors.
    /// `command` (gpuctl-watchdog, or a wrapper that runs it) set to watch this simulated
    /// server, with nothing of systemd in its environment.
    pub fn watchdog_env<'c>(&self, command: &'c mut Command) -> &'c mut Command {
        self.kernel_log_env(command)
            .env("GPUCTL_NVML_LIB", sim_lib())
            .env("NVML_SIM_SCENARIO", self.scenario_path())
            .env("NVML_SIM_STATE", self.state_path())
            .env("GPUCTL_CONFIG", self.config_path())
            // A configuration that names no state_dir keeps the watchdog's state here (as
            // `gpuctl` keeps its own), never in this machine's /var/lib/gpuctl.
            .env("GPUCTL_STATE_DIR", self.dir.path().join("gpuctl-state"))
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID")
            .env_remove("JOURNAL_STREAM")
            .stdin(Stdio::null())
    }

    pub fn gpuctl(&self, args: &[&str]) -> Command {
        let mut command = Command::new(gpuctl_bin());
        self.kernel_log_env(&mut command)
            .args(args)
            .env("GPUCTL_NVML_LIB", sim_lib())
            .env("NVML_SIM_SCENARIO", self.scenario_path())
            .env("NVML_SIM_STATE", self.state_path())
            // gpuctl's own state (peak marks) stays in the scratch directory too.
            .env("GPUCTL_STATE_DIR", self.dir.path().join("gpuctl-state"))
            // Nothing of this machine's own configuration: a file the test may write, or none.
            .env("GPUCTL_CONFIG", self.config_path())
            // Where a scenario's `device_dir` puts the device files, when it says so.
            .env("GPUCTL_DEV_DIR", self.dev_dir())
            // No host service but the test's own: gpuctl run in a PID namespace asks the
            // socket here (where none listens unless the test starts one), never a
            // `gpuctl serve` this machine may run on /run/gpuctl/api.sock.
            .env("GPUCTL_SOCKET", self.no_service_socket())
            .env_remove("NO_COLOR")
            .env_remove("COLUMNS")
            .stdin(Stdio::null());
        command
    }

    pub fn run(&self, args: &[&str]) -> Run {
        Run::from(self.gpuctl(args).output().expect("run gpuctl"))
    }

    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = args.to_vec();
        all.push("--json");
        let run = self.run(&all);
        assert_eq!(run.code, 0, "gpuctl {all:?} failed: {}", run.stderr);
        serde_json::from_str(&run.stdout)
            .unwrap_or_else(|e| panic!("invalid JSON ({e}): {}", run.stdout))
    }
}

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// An nvml-sim scenario (crates/nvml-sim/src/scenario.rs), written as the TOML the sim
/// reads: only what a test sets is written, everything else is the sim's default.
#[derive(Debug, Clone, Default)]
pub struct Scenario {
    driver_version: Option<String>,
    cuda_driver_version: Option<i32>,
    init_error: Option<String>,
    device_dir: Option<PathBuf>,
    faults: Option<Faults>,
    gpus: Vec<Gpu>,
    processes: Vec<Process>,
    /// (GPU, Xid, pid)
    xids: Vec<(u32, u32, Option<u32>)>,
}

#[derive(Debug, Clone)]
struct Faults {
    rate: f64,
    seed: u64,
    errors: Vec<String>,
}

impl Scenario {
    pub fn new() -> Scenario {
        Scenario::default()
    }

    pub fn driver_version(mut self, version: &str) -> Scenario {
        self.driver_version = Some(version.to_string());
        self
    }

    /// As NVML gives it: 12080 is CUDA 12.8.
    pub fn cuda_driver_version(mut self, version: i32) -> Scenario {
        self.cuda_driver_version = Some(version);
        self
    }

    /// Every NVML init fails with this error (a name: `DRIVER_NOT_LOADED`).
    pub fn init_error(mut self, name: &str) -> Scenario {
        self.init_error = Some(name.to_string());
        self
    }

    /// Where the sim makes the GPUs' device files.
    pub fn device_dir(mut self, dir: &Path) -> Scenario {
        self.device_dir = Some(dir.to_path_buf());
        self
    }

    /// Each call on a GPU's handle fails with chance `rate`, with one of `errors` (names),
    /// drawn from a generator seeded with `seed`.
    pub fn faults(mut self, rate: f64, seed: u64, errors: &[&str]) -> Scenario {
        let errors = errors.iter().map(|e| e.to_string()).collect();
        self.faults = Some(Faults { rate, seed, errors });
        self
    }

    /// The next GPU: its index is the number of GPUs before it.
    pub fn gpu(mut self, gpu: Gpu) -> Scenario {
        self.gpus.push(gpu);
        self
    }

    /// `count` GPUs like `gpu`.
    pub fn gpus(mut self, count: usize, gpu: Gpu) -> Scenario {
        self.gpus.extend(std::iter::repeat_n(gpu, count));
        self
    }

    pub fn process(mut self, process: Process) -> Scenario {
        self.processes.push(process);
        self
    }

    pub fn processes(mut self, processes: impl IntoIterator<Item = Process>) -> Scenario {
        self.processes.extend(processes);
        self
    }

    /// An Xid the driver raises on GPU `gpu` (`pid`: the process its log line names).
    pub fn xid(mut self, gpu: u32, xid: u32, pid: Option<u32>) -> Scenario {
        self.xids.push((gpu, xid, pid));
        self
    }
}

/// A GPU: `Gpu::new()` is the sim's default model (an H200) with every default.
#[derive(Debug, Clone, Default)]
pub struct Gpu {
    name: Option<String>,
    pci_bus_id: Option<String>,
    memory_total_mib: Option<u64>,
    leaked_mib: Option<u64>,
    utilization_pct: Option<u32>,
    power_mw: Option<u32>,
    lost: bool,
    hang_ms: Option<u64>,
    compute_mode: Option<ComputeMode>,
    unsupported: Vec<String>,
    mig: Vec<Mig>,
    health: Health,
}

/// A GPU's health keys (nvml-sim's README: recovery_action, remapped_rows, ecc,
/// retired_pages, clock_event_reasons).
#[derive(Debug, Clone, Default)]
struct Health {
    recovery_action: Option<String>,
    /// correctable, uncorrectable, pending, failure
    remapped_rows: Option<(u32, u32, bool, bool)>,
    /// volatile corrected, volatile uncorrected, aggregate corrected, aggregate uncorrected
    ecc: Option<[u64; 4]>,
    /// single bit, double bit, pending
    retired_pages: Option<(u32, u32, bool)>,
    clock_event_reasons: Option<Vec<String>>,
}

#[derive(Debug, Clone)]
struct Mig {
    profile: String,
    gpu_instance: u32,
}

#[derive(Debug, Clone, Copy)]
pub enum ComputeMode {
    Default,
    ExclusiveProcess,
    Prohibited,
}

impl ComputeMode {
    fn as_str(self) -> &'static str {
        match self {
            ComputeMode::Default => "default",
            ComputeMode::ExclusiveProcess => "exclusive_process",
            ComputeMode::Prohibited => "prohibited",
        }
    }
}

impl Gpu {
    pub fn new() -> Gpu {
        Gpu::default()
    }

    pub fn h200() -> Gpu {
        Gpu::new().name("NVIDIA H200")
    }

    /// The model MIG is modelled on besides the H200.
    pub fn h100() -> Gpu {
        Gpu::new().name("NVIDIA H100 80GB HBM3")
    }

    /// The model's name, which gives its memory, power limit, clocks (the sim's table).
    pub fn name(mut self, name: &str) -> Gpu {
        self.name = Some(name.to_string());
        self
    }

    pub fn memory_total(mut self, bytes: u64) -> Gpu {
        self.memory_total_mib = Some(mib(bytes));
        self
    }

    /// Used memory that no process accounts for.
    pub fn leaked(mut self, bytes: u64) -> Gpu {
        self.leaked_mib = Some(mib(bytes));
        self
    }

    pub fn utilization(mut self, pct: u32) -> Gpu {
        self.utilization_pct = Some(pct);
        self
    }

    pub fn power_mw(mut self, milliwatts: u32) -> Gpu {
        self.power_mw = Some(milliwatts);
        self
    }

    /// Fallen off the bus.
    pub fn lost(mut self) -> Gpu {
        self.lost = true;
        self
    }

    /// Every call on this GPU blocks this long (0: answers at once).
    pub fn hang(mut self, time: std::time::Duration) -> Gpu {
        self.hang_ms = Some(millis(time));
        self
    }

    /// NVML's bus id (`00000000:18:00.0`).
    pub fn pci_bus_id(mut self, bus_id: &str) -> Gpu {
        self.pci_bus_id = Some(bus_id.to_string());
        self
    }

    pub fn compute_mode(mut self, mode: ComputeMode) -> Gpu {
        self.compute_mode = Some(mode);
        self
    }

    /// Features whose queries answer NOT_SUPPORTED (names: `temperature`, `locked_clocks`).
    pub fn unsupported(mut self, features: &[&str]) -> Gpu {
        self.unsupported = features.iter().map(|f| f.to_string()).collect();
        self
    }

    /// NVML's recovery action (`gpu_reset`, ...); without it the field reads `none`, as on
    /// a healthy H100/H200 with a driver of R550 or later (the sim's default, 570).
    pub fn recovery_action(mut self, action: &str) -> Gpu {
        self.health.recovery_action = Some(action.to_string());
        self
    }

    /// A driver without the recovery-action field (before R550): an Xid's catalog action
    /// then holds until a reset or an acknowledgement.
    pub fn no_recovery_field(self) -> Gpu {
        self.recovery_action("not_supported")
    }

    pub fn remapped_rows(
        mut self,
        correctable: u32,
        uncorrectable: u32,
        pending: bool,
        failure: bool,
    ) -> Gpu {
        self.health.remapped_rows = Some((correctable, uncorrectable, pending, failure));
        self
    }

    /// Device-memory ECC counts: volatile corrected and uncorrected, aggregate corrected and
    /// uncorrected.
    pub fn ecc(mut self, counts: [u64; 4]) -> Gpu {
        self.health.ecc = Some(counts);
        self
    }

    pub fn retired_pages(mut self, single_bit: u32, double_bit: u32, pending: bool) -> Gpu {
        self.health.retired_pages = Some((single_bit, double_bit, pending));
        self
    }

    /// NVML's clock-event reasons in snake case (`hw_slowdown`).
    pub fn clock_event_reasons(mut self, reasons: &[&str]) -> Gpu {
        self.health.clock_event_reasons = Some(reasons.iter().map(|r| r.to_string()).collect());
        self
    }

    /// A MIG instance of `profile` (`3g.40gb`) as GPU instance `gpu_instance`; any puts the
    /// GPU in MIG mode.
    pub fn mig(mut self, profile: &str, gpu_instance: u32) -> Gpu {
        self.mig.push(Mig {
            profile: profile.to_string(),
            gpu_instance,
        });
        self
    }
}

/// A process NVML lists (or, `unlisted`, only counts): by default on GPU 0, its memory "not
/// available" (no `used`: NVML's answer for it, counted as 0) and no SM use.
#[derive(Debug, Clone)]
pub struct Process {
    pid: u32,
    gpus: Vec<u32>,
    used_mib: Option<u64>,
    sm_pct: Option<u32>,
    gpu_instance: Option<u32>,
    teardown_ms: Option<u64>,
    unlisted: bool,
    /// "server" or "client": its part in CUDA MPS on its GPUs.
    mps: Option<&'static str>,
    graphics: bool,
}

impl Process {
    pub fn new(pid: u32) -> Process {
        Process {
            pid,
            gpus: vec![0],
            used_mib: None,
            sm_pct: None,
            gpu_instance: None,
            teardown_ms: None,
            unlisted: false,
            mps: None,
            graphics: false,
        }
    }

    pub fn on(mut self, gpu: u32) -> Process {
        self.gpus = vec![gpu];
        self
    }

    /// On several GPUs at once (one context on each).
    pub fn on_each(mut self, gpus: &[u32]) -> Process {
        self.gpus = gpus.to_vec();
        self
    }

    pub fn used(mut self, bytes: u64) -> Process {
        self.used_mib = Some(mib(bytes));
        self
    }

    pub fn sm(mut self, pct: u32) -> Process {
        self.sm_pct = Some(pct);
        self
    }

    /// The MIG GPU instance it runs in (required on a GPU in MIG mode).
    pub fn instance(mut self, gpu_instance: u32) -> Process {
        self.gpu_instance = Some(gpu_instance);
        self
    }

    /// Its memory stays held this long after it exits (a driver tearing a context down).
    pub fn teardown(mut self, time: std::time::Duration) -> Process {
        self.teardown_ms = Some(millis(time));
        self
    }

    /// Holds memory but is in no process list (a holder NVML cannot attribute).
    pub fn unlisted(mut self) -> Process {
        self.unlisted = true;
        self
    }

    /// A graphics context only (a display server): in the graphics list, not the compute one.
    pub fn graphics(mut self) -> Process {
        self.graphics = true;
        self
    }

    /// The MPS server of its GPUs (`nvidia-cuda-mps-server`).
    pub fn mps_server(mut self) -> Process {
        self.mps = Some("server");
        self
    }

    /// An MPS client of its GPUs' server.
    pub fn mps_client(mut self) -> Process {
        self.mps = Some("client");
        self
    }
}

/// The sim counts memory in MiB: a test giving bytes that are not whole MiB is wrong.
fn mib(bytes: u64) -> u64 {
    assert_eq!(bytes % MIB, 0, "{bytes} bytes is not a whole number of MiB");
    bytes / MIB
}

fn millis(time: std::time::Duration) -> u64 {
    u64::try_from(time.as_millis()).expect("milliseconds fit in u64")
}

/// A TOML string, escaped by the toml crate (a path or name may hold quotes or backslashes).
fn quoted(text: &str) -> toml::Value {
    toml::Value::String(text.to_string())
}

fn quoted_list(items: &[String]) -> String {
    let items: Vec<String> = items.iter().map(|i| quoted(i).to_string()).collect();
    format!("[{}]", items.join(", "))
}

impl Display for Scenario {
    /// Keys in the order of the sim's own structs, each table's keys before its sub-tables.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(v) = &self.driver_version {
            writeln!(f, "driver_version = {}", quoted(v))?;
        }
        if let Some(v) = self.cuda_driver_version {
            writeln!(f, "cuda_driver_version = {v}")?;
        }
        if let Some(v) = &self.init_error {
            writeln!(f, "init_error = {}", quoted(v))?;
        }
        if let Some(dir) = &self.device_dir {
            let dir = dir.to_str().expect("a UTF-8 device_dir");
            writeln!(f, "device_dir = {}", quoted(dir))?;
        }
        if let Some(Faults { rate, seed, errors }) = &self.faults {
            // {:?} of an f64 always has a '.' or an exponent: a TOML float, never an integer.
            writeln!(f, "fault_rate = {rate:?}")?;
            writeln!(f, "fault_seed = {seed}")?;
            writeln!(f, "fault_errors = {}", quoted_list(errors))?;
        }
        for gpu in &self.gpus {
            writeln!(f, "\n[[gpu]]")?;
            if let Some(v) = &gpu.name {
                writeln!(f, "name = {}", quoted(v))?;
            }
            if let Some(v) = gpu.memory_total_mib {
                writeln!(f, "memory_total_mib = {v}")?;
            }
            if let Some(v) = gpu.leaked_mib {
                writeln!(f, "leaked_mib = {v}")?;
            }
            if let Some(v) = gpu.utilization_pct {
                writeln!(f, "utilization_pct = {v}")?;
            }
            if let Some(v) = gpu.power_mw {
                writeln!(f, "power_mw = {v}")?;
            }
            if let Some(v) = &gpu.pci_bus_id {
                writeln!(f, "pci_bus_id = {}", quoted(v))?;
            }
            if gpu.lost {
                writeln!(f, "lost = true")?;
            }
            if let Some(v) = gpu.hang_ms {
                writeln!(f, "hang_ms = {v}")?;
            }
            if let Some(v) = gpu.compute_mode {
                writeln!(f, "compute_mode = {}", quoted(v.as_str()))?;
            }
            if !gpu.unsupported.is_empty() {
                writeln!(f, "unsupported = {}", quoted_list(&gpu.unsupported))?;
            }
            let h = &gpu.health;
            if let Some(v) = &h.recovery_action {
                writeln!(f, "recovery_action = {}", quoted(v))?;
            }
            if let Some((c, u, p, x)) = h.remapped_rows {
                writeln!(
                    f,
                    "remapped_rows = {{ correctable = {c}, uncorrectable = {u}, pending = {p}, failure = {x} }}"
                )?;
            }
            if let Some([vc, vu, ac, au]) = h.ecc {
                writeln!(
                    f,
                    "ecc = {{ volatile_corrected = {vc}, volatile_uncorrected = {vu}, aggregate_corrected = {ac}, aggregate_uncorrected = {au} }}"
                )?;
            }
            if let Some((s, d, p)) = h.retired_pages {
                writeln!(
                    f,
                    "retired_pages = {{ single_bit = {s}, double_bit = {d}, pending = {p} }}"
                )?;
            }
            if let Some(reasons) = &h.clock_event_reasons {
                writeln!(f, "clock_event_reasons = {}", quoted_list(reasons))?;
            }
            for m in &gpu.mig {
                writeln!(f, "[[gpu.mig]]")?;
                writeln!(f, "profile = {}", quoted(&m.profile))?;
                writeln!(f, "gpu_instance = {}", m.gpu_instance)?;
            }
        }
        for p in &self.processes {
            writeln!(f, "\n[[process]]")?;
            writeln!(f, "pid = {}", p.pid)?;
            match p.gpus.as_slice() {
                [one] => writeln!(f, "gpu = {one}")?,
                many => {
                    let list: Vec<String> = many.iter().map(u32::to_string).collect();
                    writeln!(f, "gpu = [{}]", list.join(", "))?
                }
            }
            if let Some(v) = p.used_mib {
                writeln!(f, "used_mib = {v}")?;
            }
            if let Some(v) = p.sm_pct {
                writeln!(f, "sm_pct = {v}")?;
            }
            if let Some(v) = p.gpu_instance {
                writeln!(f, "gpu_instance = {v}")?;
            }
            if let Some(v) = p.teardown_ms {
                writeln!(f, "teardown_ms = {v}")?;
            }
            if p.graphics {
                writeln!(f, "type = \"graphics\"")?;
            }
            if let Some(role) = p.mps {
                writeln!(f, "mps = {}", quoted(role))?;
            }
            if p.unlisted {
                writeln!(f, "unlisted = true")?;
            }
        }
        for (gpu, xid, pid) in &self.xids {
            writeln!(f, "\n[[xid]]\ngpu = {gpu}\nxid = {xid}")?;
            if let Some(pid) = pid {
                writeln!(f, "pid = {pid}")?;
            }
        }
        Ok(())
    }
}

/// A finished command: status and text.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for Run {
    fn from(output: Output) -> Run {
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

impl Run {
    /// An error must be exactly one line on stderr, naming what was wrong.
    pub fn assert_one_line_error(&self, code: i32, needle: &str) {
        assert_eq!(self.code, code, "exit status; stderr: {}", self.stderr);
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(
            lines.len(),
            1,
            "expected one line on stderr, got: {:?}",
            self.stderr
        );
        assert!(
            lines[0].contains(needle),
            "stderr {:?} lacks {needle:?}",
            lines[0]
        );
        assert!(!self.stderr.contains("panicked"), "{}", self.stderr);
    }
}

/// A real process for a scenario to name; killed and reaped on drop.
pub struct Proc {
    pub child: Child,
}

impl Proc {
    /// The test process binary in `mode`, with `argv0` and `args` as its visible command.
    pub fn spawn(mode: &str, argv0: &str, args: &[&str]) -> Proc {
        use std::os::unix::process::CommandExt;
        let child = Command::new(testproc_bin())
            .arg0(argv0)
            .args(args)
            .env("GPUCTL_TESTPROC_MODE", mode)
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn test process");
        Proc { child }
    }

    pub fn sleeper(argv0: &str, args: &[&str]) -> Proc {
        Proc::spawn("sleep", argv0, args)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until /proc shows the process's leader in `state` (a stat letter).
    pub fn wait_for_state(&self, letter: char) {
        wait_until(Duration::from_secs(10), || {
            proc_state(self.pid()) == Some(letter)
        });
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Polls `done` until it holds, or fails the test after `limit`.
pub fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < limit,
            "condition not met within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

// ---- Helpers for `kill` and `clear`: runs with workers, processes that are not our children,
// ---- other users.

impl Proc {
    /// Like [`Proc::spawn`], with `configure` applied to the command before it starts.
    pub fn spawn_with(
        mode: &str,
        argv0: &str,
        args: &[&str],
        configure: impl FnOnce(&mut Command),
    ) -> Proc {
        use std::os::unix::process::CommandExt;
        let mut command = Command::new(testproc_bin());
        command
            .arg0(argv0)
            .args(args)
            .env("GPUCTL_TESTPROC_MODE", mode)
            .stdin(Stdio::null());
        configure(&mut command);
        Proc {
            child: command.spawn().expect("spawn test process"),
        }
    }

    /// A ready test process whose command name (comm) is `comm`, whatever its argv[0].
    pub fn spawn_ready_with_comm(mode: &str, argv0: &str, comm: &str) -> Proc {
        let mut proc = Proc::spawn_with(mode, argv0, &[], |command| {
            command
                .env("GPUCTL_TESTPROC_COMM", comm)
                .env("GPUCTL_TESTPROC_READY", "1")
                .stdout(Stdio::piped());
        });
        proc.expect_ready();
        proc
    }

    /// A ready test process in its own process group (a job of its own) holding `files` open.
    pub fn spawn_holding(argv0: &str, args: &[&str], files: &[&Path]) -> Proc {
        use std::os::unix::process::CommandExt;
        let paths = std::env::join_paths(files).expect("paths without ':'");
        let mut proc = Proc::spawn_with("sleep", argv0, args, |command| {
            command
                .env("GPUCTL_TESTPROC_OPEN", paths)
                .env("GPUCTL_TESTPROC_READY", "1")
                .process_group(0)
                .stdout(Stdio::piped());
        });
        proc.expect_ready();
        proc
    }

    /// A ready test process run from `program` (a copy of the test binary) as `argv0`.
    pub fn spawn_program_ready(program: &Path, mode: &str, argv0: &str, args: &[&str]) -> Proc {
        Proc::spawn_program_with(program, mode, argv0, args, &[])
    }

    /// [`Proc::spawn_program_ready`], holding `files` open.
    pub fn spawn_program_with(
        program: &Path,
        mode: &str,
        argv0: &str,
        args: &[&str],
        files: &[&Path],
    ) -> Proc {
        use std::os::unix::process::CommandExt;
        let paths = std::env::join_paths(files).expect("paths without ':'");
        let spawn = || {
            let mut command = Command::new(program);
            command
                .arg0(argv0)
                .args(args)
                .env("GPUCTL_TESTPROC_MODE", mode)
                .env("GPUCTL_TESTPROC_READY", "1")
                .stdin(Stdio::null())
                .stdout(Stdio::piped());
            if !files.is_empty() {
                command.env("GPUCTL_TESTPROC_OPEN", &paths);
            }
            command.spawn()
        };
        // A test thread forking while the copy was being written holds its descriptor until
        // that child execs: exec fails with ETXTBSY for that moment.
        let deadline = Instant::now() + Duration::from_secs(5);
        let child = loop {
            match spawn() {
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                result => break result.expect("spawn the installed program"),
            }
        };
        let mut proc = Proc { child };
        proc.expect_ready();
        proc
    }

    /// A test process in `mode` (sleep, ignore-term) that has finished setting itself up
    /// (signal dispositions, comm) when this returns.
    pub fn spawn_ready(mode: &str, argv0: &str, args: &[&str]) -> Proc {
        let mut proc = Proc::spawn_with(mode, argv0, args, |command| {
            command
                .env("GPUCTL_TESTPROC_READY", "1")
                .stdout(Stdio::piped());
        });
        proc.expect_ready();
        proc
    }

    /// The test process in `mode` as user and group `uid` (through setpriv, which execs it:
    /// the pid is the test process's), once it runs as that user.
    pub fn spawn_as(uid: u32, mode: &str, args: &[&str]) -> Proc {
        let mut child = setpriv(uid)
            .arg(testproc_bin())
            .args(args)
            .env("GPUCTL_TESTPROC_MODE", mode)
            .env("GPUCTL_TESTPROC_READY", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn setpriv");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut proc = Proc { child };
        proc.child.stdout = Some(stdout);
        proc.expect_ready();
        proc
    }

    fn expect_ready(&mut self) {
        use std::io::{BufRead, BufReader};
        let stdout = self.child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read ready line");
        assert_eq!(
            line.trim(),
            "ready",
            "test process {} not ready",
            self.pid()
        );
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child, which is not reaped before drop.
        let rc = unsafe { libc::kill(self.pid() as libc::pid_t, signal) };
        assert_eq!(rc, 0, "kill({}, {signal})", self.pid());
    }
}

/// A run with workers (testproc mode run-with-workers): the parent leads its own process
/// group, the workers are its children in that group. `crash` SIGKILLs the parent, as a
/// crash or an OOM kill would; the workers live on, reparented to init.
pub struct TrainingRun {
    pub parent: Proc,
    pub workers: Strays,
}

impl TrainingRun {
    /// `count` workers in `worker_mode` (sleep, ignore-term), all with the command line
    /// `argv0 args`.
    pub fn start(count: usize, worker_mode: &str, argv0: &str, args: &[&str]) -> TrainingRun {
        TrainingRun::start_as(None, count, worker_mode, argv0, args)
    }

    /// [`TrainingRun::start`], run by `uid` (the tests run as root) where given.
    pub fn start_as(
        uid: Option<u32>,
        count: usize,
        worker_mode: &str,
        argv0: &str,
        args: &[&str],
    ) -> TrainingRun {
        let mut parent = Proc::spawn_with("run-with-workers", argv0, args, |command| {
            use std::os::unix::process::CommandExt;
            command
                .env("GPUCTL_TESTPROC_WORKERS", count.to_string())
                .env("GPUCTL_TESTPROC_WORKER_MODE", worker_mode)
                .stdout(Stdio::piped())
                .process_group(0);
            if let Some(uid) = uid {
                command.uid(uid).gid(uid);
            }
        });
        let stdout = parent.child.stdout.take().expect("piped stdout");
        let workers = Strays::read(stdout, count);
        TrainingRun { parent, workers }
    }

    /// SIGKILLs the parent and reaps it.
    pub fn crash(&mut self) {
        self.parent.kill();
    }

    pub fn pgid(&self) -> u32 {
        self.parent.pid()
    }
}

/// A background job: a launcher (testproc mode launch-and-exit, in its own process group)
/// starts it and exits; it lives on alone in the launcher's group, reparented to init.
pub fn background_job(argv0: &str, args: &[&str]) -> Strays {
    let mut launcher = Proc::spawn_with("launch-and-exit", argv0, args, |command| {
        use std::os::unix::process::CommandExt;
        command
            .env("GPUCTL_TESTPROC_WORKERS", "1")
            .stdout(Stdio::piped())
            .process_group(0);
    });
    let stdout = launcher.child.stdout.take().expect("piped stdout");
    let job = Strays::read(stdout, 1);
    let status = launcher.child.wait().expect("wait for launcher");
    assert!(status.success(), "launcher failed: {status}");
    job
}

/// Processes that are not our children (workers of a run), by identity: SIGKILLed on drop
/// through a pidfd opened on the process with the recorded start time, so a pid reused
/// meanwhile is never hit.
pub struct Strays {
    pub pids: Vec<u32>,
    start_ticks: Vec<u64>,
}

impl Strays {
    fn read(stdout: impl std::io::Read, count: usize) -> Strays {
        use std::io::{BufRead, BufReader};
        let mut pids = Vec::with_capacity(count);
        for line in BufReader::new(stdout).lines().take(count) {
            let line = line.expect("read worker pid");
            pids.push(line.trim().parse::<u32>().expect("a worker pid"));
        }
        assert_eq!(
            pids.len(),
            count,
            "the run printed {} of {count} pids",
            pids.len()
        );
        let start_ticks = pids
            .iter()
            .map(|&pid| start_ticks(pid).expect("worker start time"))
            .collect();
        Strays { pids, start_ticks }
    }

    pub fn pid(&self, i: usize) -> u32 {
        self.pids[i]
    }

    /// Sends `signal` to every one still alive with its recorded start time.
    pub fn signal_all(&self, signal: i32) {
        for (&pid, &ticks) in self.pids.iter().zip(&self.start_ticks) {
            signal_identity(pid, ticks, signal);
        }
    }
}

impl Drop for Strays {
    fn drop(&mut self) {
        self.signal_all(libc::SIGKILL);
    }
}

/// Signals pid only if it still names the process started at `ticks` (through a pidfd).
fn signal_identity(pid: u32, ticks: u64, signal: i32) {
    // SAFETY: pidfd_open takes a pid and flags; a negative result is an error.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_long, 0 as libc::c_long) };
    if fd < 0 {
        return;
    }
    if start_ticks(pid) == Some(ticks) {
        // SAFETY: a pidfd we own, no siginfo, no flags.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd as libc::c_long,
                signal as libc::c_long,
                std::ptr::null::<libc::siginfo_t>(),
                0 as libc::c_long,
            )
        };
    }
    // SAFETY: closing the descriptor opened above.
    unsafe { libc::close(fd as libc::c_int) };
}

/// Field 22 of /proc/PID/stat.
pub fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

/// Gives COMMAND the default dispositions of the signals a test sends it to end it: a job
/// started in the background by a non-interactive shell (`scripts/test &`) inherits SIGINT
/// and SIGQUIT ignored, and a test that expects 130 from Ctrl-C would then see 0.
pub fn default_stop_signals(command: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec only async-signal-safe calls: signal(2) resets dispositions.
    unsafe {
        command.pre_exec(|| {
            for signal in [libc::SIGINT, libc::SIGQUIT, libc::SIGTERM, libc::SIGHUP] {
                libc::signal(signal, libc::SIG_DFL);
            }
            Ok(())
        })
    }
}

pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Whether pid names a process that has not exited (not a zombie, not gone).
pub fn alive(pid: u32) -> bool {
    proc_state(pid).is_some_and(|state| !matches!(state, 'Z' | 'X' | 'x'))
}

/// Waits (10 s at most) until pid has exited: gone from /proc or a zombie (orphans of a
/// crashed run are reparented to init, which may reap them late or, in a container, never).
pub fn wait_exited(pid: u32) {
    wait_until(Duration::from_secs(10), || !alive(pid));
}

impl Sim {
    /// Lets other users read the scenario (and create the sim's state file next to it).
    pub fn share(&self) {
        use std::os::unix::fs::PermissionsExt;
        let mode = |m| std::fs::Permissions::from_mode(m);
        std::fs::set_permissions(self.dir.path(), mode(0o777)).expect("chmod sim dir");
        std::fs::set_permissions(self.scenario_path(), mode(0o644)).expect("chmod scenario");
    }

    /// `gpuctl ARGS` as user and group `uid` (through setpriv), against this scenario.
    pub fn gpuctl_as(&self, uid: u32, args: &[&str]) -> Command {
        let inner = self.gpuctl(args);
        let mut command = setpriv(uid);
        command.arg(inner.get_program()).args(inner.get_args());
        for (key, value) in inner.get_envs() {
            match value {
                Some(value) => command.env(key, value),
                None => command.env_remove(key),
            };
        }
        command.stdin(Stdio::null());
        command
    }
}

/// clone3 with `set_tid` (the pids to take, the innermost PID namespace's first), its child
/// exec'ing `program` with `argv` and `envp`, NUL-terminated arrays prepared beforehand: after
/// the clone, in a multi-threaded process, the child may only call async-signal-safe
/// functions. The child's pid, or the kernel's refusal (no CAP_SYS_ADMIN or
/// CAP_CHECKPOINT_RESTORE, the pid taken, an old kernel).
pub fn clone3_exec(
    tids: &[libc::pid_t],
    program: &std::ffi::CStr,
    argv: &[*const libc::c_char],
    envp: &[*const libc::c_char],
) -> std::io::Result<u32> {
    #[repr(C)]
    struct CloneArgs {
        flags: u64,
        pidfd: u64,
        child_tid: u64,
        parent_tid: u64,
        exit_signal: u64,
        stack: u64,
        stack_size: u64,
        tls: u64,
        set_tid: u64,
        set_tid_size: u64,
        cgroup: u64,
    }
    let args = CloneArgs {
        flags: 0,
        pidfd: 0,
        child_tid: 0,
        parent_tid: 0,
        exit_signal: libc::SIGCHLD as u64,
        stack: 0,
        stack_size: 0,
        tls: 0,
        set_tid: tids.as_ptr() as u64,
        set_tid_size: tids.len() as u64,
        cgroup: 0,
    };
    // SAFETY: clone3 with a valid, fully initialised clone_args of the size given; the child
    // only calls execve and _exit.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if rc == 0 {
        // SAFETY: the caller's NUL-terminated arrays, valid until it returns.
        unsafe {
            libc::execve(program.as_ptr(), argv.as_ptr(), envp.as_ptr());
            libc::_exit(127);
        }
    }
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(rc as u32)
}

/// A process started with a chosen pid (clone3 with set_tid, as CRIU does): how a test makes a
/// pid name another process, the way pid reuse does. Killed and reaped on drop.
pub struct PidReuser {
    pub pid: u32,
}

impl PidReuser {
    /// The test process in `mode` with `argv0`, as pid `pid` (which must be free). `None`
    /// where the kernel refuses (no CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE, old kernel).
    pub fn spawn(pid: u32, mode: &str, argv0: &str) -> Option<PidReuser> {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        let path = CString::new(testproc_bin().as_os_str().as_bytes()).ok()?;
        let arg0 = CString::new(argv0).ok()?;
        let env = CString::new(format!("GPUCTL_TESTPROC_MODE={mode}")).ok()?;
        let argv = [arg0.as_ptr(), std::ptr::null()];
        let envp = [env.as_ptr(), std::ptr::null()];
        let rc = clone3_exec(&[pid as libc::pid_t], &path, &argv, &envp).ok()?;
        assert_eq!(rc, pid, "clone3 gave another pid");
        let reuser = PidReuser { pid };
        // Exec'd when argv[0] shows.
        wait_until(Duration::from_secs(10), || {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|&b| b == 0).next() == Some(argv0.as_bytes()))
        });
        Some(reuser)
    }
}

impl Drop for PidReuser {
    fn drop(&mut self) {
        // SAFETY: our own child, reaped here.
        unsafe {
            libc::kill(self.pid as libc::pid_t, libc::SIGKILL);
            libc::waitpid(self.pid as libc::pid_t, std::ptr::null_mut(), 0);
        }
    }
}

/// A pseudo-terminal pair: the terminal a person would answer a confirmation on.
pub struct Pty {
    pub master: std::fs::File,
    pub slave: std::os::fd::OwnedFd,
}

impl Pty {
    pub fn open() -> Pty {
        use std::os::fd::FromRawFd;
        let (mut master, mut slave) = (-1, -1);
        // SAFETY: openpty writes two descriptors; no name, termios or winsize.
        let rc = unsafe {
            libc::openpty(
                &mut master,
                &mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
        // SAFETY: both descriptors were just returned to us and are owned by nothing else.
        unsafe {
            Pty {
                master: std::fs::File::from_raw_fd(master),
                slave: std::os::fd::OwnedFd::from_raw_fd(slave),
            }
        }
    }

    /// What the other side writes, line or not, as it comes (read on a thread until EOF/EIO).
    pub fn reader(&self) -> std::sync::mpsc::Receiver<Vec<u8>> {
        use std::io::Read;
        let mut master = self.master.try_clone().expect("dup pty master");
        let (send, receive) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            while let Ok(n) = master.read(&mut buffer) {
                if n == 0 || send.send(buffer[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        receive
    }
}

/// Collects from `received` until the text contains `needle`, or fails after 10 s.
pub fn expect_text(received: &std::sync::mpsc::Receiver<Vec<u8>>, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut text = Vec::new();
    while !String::from_utf8_lossy(&text).contains(needle) {
        let left = deadline.saturating_duration_since(Instant::now());
        match received.recv_timeout(left) {
            Ok(bytes) => text.extend(bytes),
            Err(_) => panic!(
                "{needle:?} not seen within 10 s; got {:?}",
                String::from_utf8_lossy(&text)
            ),
        }
    }
    String::from_utf8_lossy(&text).into_owned()
}

/// A copy of the test process installed as a protected program would be: a root-owned,
/// not group- or world-writable file named `name`, in a directory of the same kind under
/// /var/lib (every directory up to / is root's on the machines the suite runs on as root).
/// Removed on drop.
pub struct RootOwnedProgram {
    dir: PathBuf,
    path: PathBuf,
}

impl RootOwnedProgram {
    pub fn install(name: &str) -> RootOwnedProgram {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        assert!(is_root(), "a root-owned program needs root");
        let unique = format!(
            "gpuctl-tests-{}-{}",
            std::process::id(),
            NEXT_PROGRAM.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        );
        let dir = Path::new("/var/lib").join(unique);
        std::fs::DirBuilder::new()
            .mode(0o755)
            .create(&dir)
            .expect("create a root-owned directory under /var/lib");
        // The mode given may be narrowed by the umask, never widened.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.join(name);
        std::fs::copy(testproc_bin(), &path).expect("copy the test process");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        RootOwnedProgram { dir, path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for RootOwnedProgram {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

static NEXT_PROGRAM: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

// ---- Helpers for protection by identity: a program run with more than root's code in it,
// ---- or by a user.

impl Proc {
    /// A ready test process run from `program` (a copy of the test binary) as `argv0`, with
    /// `env` added to its environment (LD_PRELOAD, ...).
    pub fn spawn_program_env(
        program: &Path,
        argv0: &str,
        env: &[(&str, &std::ffi::OsStr)],
    ) -> Proc {
        use std::os::unix::process::CommandExt;
        let spawn = || {
            Command::new(program)
                .arg0(argv0)
                .envs(env.iter().copied())
                .env("GPUCTL_TESTPROC_MODE", "sleep")
                .env("GPUCTL_TESTPROC_READY", "1")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .spawn()
        };
        // As in spawn_program_with: a fork elsewhere may hold the fresh copy open (ETXTBSY).
        let deadline = Instant::now() + Duration::from_secs(5);
        let child = loop {
            match spawn() {
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                result => break result.expect("spawn the installed program"),
            }
        };
        let mut proc = Proc { child };
        proc.expect_ready();
        proc
    }

    /// `program` (a root-owned copy of the test binary) run by user and group `uid`
    /// through setpriv, which execs it: the pid is the program's, its argv[0] its path.
    pub fn spawn_program_as(uid: u32, program: &Path) -> Proc {
        Proc::spawn_program_as_env(uid, program, &[])
    }

    /// [`Proc::spawn_program_as`] with `env` added to its environment (LD_PRELOAD, ...).
    pub fn spawn_program_as_env(
        uid: u32,
        program: &Path,
        env: &[(&str, &std::ffi::OsStr)],
    ) -> Proc {
        let child = setpriv(uid)
            .arg(program)
            .envs(env.iter().copied())
            .env("GPUCTL_TESTPROC_MODE", "sleep")
            .env("GPUCTL_TESTPROC_READY", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn setpriv");
        let mut proc = Proc { child };
        proc.expect_ready();
        proc
    }
}

/// `workers` background workers of `program` (a copy of the test binary, its argv[0] its
/// path), run by `uid` where given: their launcher exits, so they live on alone in its
/// process group, reparented to init, idle: the leftovers of a run that crashed.
pub fn background_workers_of(program: &Path, uid: Option<u32>, workers: usize) -> Strays {
    background_workers_of_env(program, uid, workers, &[])
}

/// [`background_workers_of`] with `env` added to the launcher's environment, which its
/// workers inherit (LD_PRELOAD, ...).
pub fn background_workers_of_env(
    program: &Path,
    uid: Option<u32>,
    workers: usize,
    env: &[(&str, &std::ffi::OsStr)],
) -> Strays {
    let mut command = match uid {
        Some(uid) => {
            let mut command = setpriv(uid);
            command.arg(program);
            command
        }
        None => Command::new(program),
    };
    {
        use std::os::unix::process::CommandExt;
        command
            .envs(env.iter().copied())
            .env("GPUCTL_TESTPROC_MODE", "launch-and-exit")
            .env("GPUCTL_TESTPROC_WORKERS", workers.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .process_group(0);
    }
    let mut launcher = command.spawn().expect("spawn the launcher");
    let stdout = launcher.stdout.take().expect("piped stdout");
    let job = Strays::read(stdout, workers);
    let status = launcher.wait().expect("wait for launcher");
    assert!(status.success(), "launcher failed: {status}");
    job
}

#[test]
fn a_scenario_renders_as_the_toml_the_sim_reads() {
    use std::time::Duration;
    let text = Scenario::new()
        .driver_version("1")
        .cuda_driver_version(12080)
        .device_dir(Path::new("/tmp/a \"b\"\\c"))
        .faults(0.02, 42, &["UNKNOWN", "TIMEOUT"])
        .gpu(Gpu::h200().leaked(512 * MIB).lost().hang(Duration::ZERO))
        .gpu(Gpu::h100().mig("3g.40gb", 1).mig("1g.10gb", 9))
        .gpu(
            Gpu::new()
                .compute_mode(ComputeMode::ExclusiveProcess)
                .unsupported(&["power"]),
        )
        .process(Process::new(7).on_each(&[0, 2]).used(GIB).sm(40))
        .process(
            Process::new(8)
                .on(1)
                .instance(9)
                .teardown(Duration::from_millis(300)),
        )
        .process(Process::new(9).unlisted())
        .to_string();
    // Whatever quoting the toml crate picks, the path reads back as given.
    let doc: toml::Table = text.parse().unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(
        doc["device_dir"].as_str(),
        Some("/tmp/a \"b\"\\c"),
        "{text}"
    );
    let without_dir: String = text
        .lines()
        .filter(|l| !l.starts_with("device_dir = "))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(
        without_dir,
        "driver_version = \"1\"\ncuda_driver_version = 12080\n\
         fault_rate = 0.02\nfault_seed = 42\nfault_errors = [\"UNKNOWN\", \"TIMEOUT\"]\n\
         \n[[gpu]]\nname = \"NVIDIA H200\"\nleaked_mib = 512\nlost = true\nhang_ms = 0\n\
         \n[[gpu]]\nname = \"NVIDIA H100 80GB HBM3\"\n\
         [[gpu.mig]]\nprofile = \"3g.40gb\"\ngpu_instance = 1\n\
         [[gpu.mig]]\nprofile = \"1g.10gb\"\ngpu_instance = 9\n\
         \n[[gpu]]\ncompute_mode = \"exclusive_process\"\nunsupported = [\"power\"]\n\
         \n[[process]]\npid = 7\ngpu = [0, 2]\nused_mib = 1024\nsm_pct = 40\n\
         \n[[process]]\npid = 8\ngpu = 1\ngpu_instance = 9\nteardown_ms = 300\n\
         \n[[process]]\npid = 9\ngpu = 0\nunlisted = true\n"
    );
}

/// Waits (5 s at most) until process `reader` has listed `pid` through nvml-sim, which holds a
/// pidfd on each live process it lists (its liveness check): then the NVML call that lists
/// `pid` has run, or is about to return. Where no such pidfd shows (the sim fell back to
/// /proc), it goes on after the 5 s; the caller's assertions on what was listed tell.
pub fn wait_until_listed_by(reader: u32, pid: u32) {
    let holds_pidfd = || {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{reader}/fd")) else {
            return false;
        };
        fds.flatten().any(|fd| {
            std::fs::read_link(fd.path())
                .is_ok_and(|target| target == Path::new("anon_inode:[pidfd]"))
                && std::fs::read_to_string(format!(
                    "/proc/{reader}/fdinfo/{}",
                    fd.file_name().to_string_lossy()
                ))
                .is_ok_and(|info| info.lines().any(|line| line == format!("Pid:\t{pid}")))
        })
    };
    let start = Instant::now();
    while !holds_pidfd() && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    // The list call returns, and the read moves on to the next GPU.
    std::thread::sleep(Duration::from_millis(200));
}

// ---- Helpers for processes of other users, with a job's environment or in a cgroup of
// ---- their own (tests/hostile_owner.rs).

impl Proc {
    /// [`Proc::spawn_as`] with `env` added to its environment (SLURM_JOB_ID and the like).
    pub fn spawn_as_with_env(uid: u32, mode: &str, args: &[&str], env: &[(&str, &str)]) -> Proc {
        let mut child = setpriv(uid)
            .arg(testproc_bin())
            .args(args)
            .env("GPUCTL_TESTPROC_MODE", mode)
            .env("GPUCTL_TESTPROC_READY", "1")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn setpriv");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut proc = Proc { child };
        proc.child.stdout = Some(stdout);
        proc.expect_ready();
        proc
    }
}

/// A cgroup made for a test under a mounted hierarchy (`/sys/fs/cgroup/unified`,
/// `/sys/fs/cgroup/freezer`), at any path: what a user may make in a subtree delegated
/// to it. On drop its processes go back to the hierarchy's root and the directories this
/// made are removed, innermost first.
pub struct TestCgroup {
    hierarchy: PathBuf,
    leaf: PathBuf,
    made: Vec<PathBuf>,
}

impl TestCgroup {
    /// `None` where the hierarchy cannot be written (no root, not mounted).
    pub fn create(hierarchy: &Path, path: &str) -> Option<TestCgroup> {
        let mut made = Vec::new();
        let mut dir = hierarchy.to_path_buf();
        for part in path.split('/').filter(|p| !p.is_empty()) {
            dir.push(part);
            if !dir.exists() {
                if std::fs::create_dir(&dir).is_err() {
                    let cgroup = TestCgroup {
                        hierarchy: hierarchy.to_path_buf(),
                        leaf: dir.clone(),
                        made,
                    };
                    drop(cgroup);
                    return None;
                }
                made.push(dir.clone());
            }
        }
        Some(TestCgroup {
            hierarchy: hierarchy.to_path_buf(),
            leaf: dir,
            made,
        })
    }

    pub fn add(&self, pid: u32) {
        std::fs::write(self.leaf.join("cgroup.procs"), pid.to_string()).expect("join cgroup");
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let root = self.hierarchy.join("cgroup.procs");
        if let Ok(pids) = std::fs::read_to_string(self.leaf.join("cgroup.procs")) {
            for pid in pids.lines() {
                let _ = std::fs::write(&root, pid);
            }
        }
        for dir in self.made.iter().rev() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}
