//! The configuration: `/etc/gpuctl/gpuctl.toml` (the system file, read by the CLI and the
//! root watchdog) and `$XDG_CONFIG_HOME/gpuctl/gpuctl.toml` (a user's own defaults, which
//! may only make the system's policy stricter). `GPUCTL_CONFIG`, or an explicit path such as
//! the watchdog's `--config`, names one file that replaces both.
//!
//! A missing file is an empty policy. A present file is checked before it is believed: a file
//! that steers root must be owned by root and writable by nobody else, as sudo demands of a
//! sudoers file; the checks are made on the descriptor the text is read from. Unknown keys
//! and bad values are errors naming the file, the line and the key.
//!
//! Adding a table (say `[watchdog]`) is one struct deriving `Deserialize` with
//! `#[serde(default, deny_unknown_fields)]` and one field of [`Config`]; error messages,
//! line numbers and key paths come for free.

mod de;
mod fleet;
mod fraction;
mod idle;
mod parse;
mod trust;
mod write;

pub use fleet::{FleetConfig, prometheus_url_error};
pub use fraction::{FractionInForce, caller_name, fraction_for, share_for};
pub use idle::{IdleAction, IdlePolicy};
use parse::*;
pub use parse::{parse, parse_fraction};
pub use trust::trusted_by_root;
use trust::*;
pub use write::{FractionScope, set_fraction};

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use nix::unistd::{User, geteuid};
use serde::{Deserialize, Serialize};

/// The system file.
pub const SYSTEM_PATH: &str = "/etc/gpuctl/gpuctl.toml";
/// The environment variable naming one file that replaces both the system and the user file.
pub const ENV_VAR: &str = "GPUCTL_CONFIG";

/// The name that says "no configuration file" where one must be named.
pub const NO_FILE: &str = "/dev/null";
/// The environment variable naming the device directory (before the `dev_dir` key).
pub const DEV_DIR_ENV: &str = "GPUCTL_DEV_DIR";
/// Unattributed memory worth explaining: the watchdog scans for device-file holders, and `info` says where `--holders` would look.
pub const DEFAULT_HOLDERS_THRESHOLD: u64 = 1 << 30;

/// Where the NVIDIA device files are: `GPUCTL_DEV_DIR`, else the configuration's `dev_dir`,
/// else /dev. Under euid 0, `GPUCTL_DEV_DIR` must pass [`trusted_by_root`] (`sudo -E` keeps
/// it, and a directory a user controls decides whose processes `clear --holders` ends); its
/// resolved path is returned.
pub fn device_dir(loaded: Option<&Loaded>) -> Result<PathBuf, ConfigError> {
    match std::env::var_os(DEV_DIR_ENV).filter(|dir| !dir.is_empty()) {
        Some(dir) => root_may_use(DEV_DIR_ENV, Path::new(&dir)),
        None => Ok(loaded
            .and_then(Loaded::dev_dir)
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("/dev"))),
    }
}

/// `path`, named by the environment variable `name`: as it is for a user, and for root
/// only where [`trusted_by_root`] says so (resolved), else a usage error that names the
/// variable and why (exit status 2, as an untrusted configuration file).
pub fn root_may_use(name: &str, path: &Path) -> Result<PathBuf, ConfigError> {
    if !geteuid().is_root() {
        return Ok(path.to_path_buf());
    }
    trusted_by_root(path).map_err(|why| ConfigError::Untrusted {
        path: path.to_path_buf(),
        message: format!(
            "{name}={}: not used as root: {why} (it must be root's and writable by root alone, \
             with every directory above it)",
            path.display()
        ),
    })
}

/// The watchdog's state directory, where other programs read what it writes (findings,
/// per-job peaks) and the Slurm commands keep their logs: the system configuration's
/// `watchdog.state_dir`, else GPUCTL_STATE_DIR, else /var/lib/gpuctl; `None` when the
/// configuration disables it.
pub fn watchdog_state_dir(loaded: Option<&Loaded>) -> Option<PathBuf> {
    match loaded.and_then(|l| l.system.as_ref()) {
        Some((_, system)) => system.watchdog.state_path().map(Path::to_path_buf),
        None => Some(Watchdog::default().state_dir),
    }
}

/// Files larger than this are refused unread: a gpuctl config is a few lines.
const MAX_SIZE: u64 = 1 << 20;

/// One configuration file's content. `Default` is the empty policy (no limits, nothing
/// protected beyond the built-in list).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// `nvml_timeout`: how long NVML may take to answer for one GPU, for the CLI and the
    /// watchdog (GPUCTL_NVML_TIMEOUT and `info --timeout` override it); absent: 10 s.
    #[serde(
        deserialize_with = "de::duration_positive_opt",
        serialize_with = "de::serialize_duration_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub nvml_timeout: Option<std::time::Duration>,
    /// `dev_dir`: where the NVIDIA device files are (`nvidia<minor>`, `nvidiactl`,
    /// `nvidia-uvm`); absent: /dev. A containerized watchdog sees the host's /dev mounted
    /// elsewhere. GPUCTL_DEV_DIR overrides it.
    #[serde(
        deserialize_with = "de::absolute_path_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub dev_dir: Option<PathBuf>,
    /// `holders_threshold`: memory no listed process accounts for that is worth explaining
    /// (a size: "1GiB", "512MiB"; absent: 1 GiB). Where a GPU has at least this much, the
    /// watchdog looks for the processes holding its device file without NVML listing them,
    /// and `info` says where `--holders` would look.
    #[serde(
        deserialize_with = "de::size_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub holders_threshold: Option<u64>,
    pub fraction: FractionPolicy,
    pub protect: Protect,
    pub watchdog: Watchdog,
    pub health: HealthPolicy,
    pub idle: IdlePolicy,
    pub fleet: FleetConfig,
    pub kubernetes: Kubernetes,
}

/// `[kubernetes]`: where the node's container runtime answers for its pods.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Kubernetes {
    /// `runtime_socket`: the CRI socket pods are named by; absent: the first of
    /// containerd's, CRI-O's and k3s's usual sockets that exists.
    #[serde(
        deserialize_with = "de::absolute_path_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub runtime_socket: Option<PathBuf>,
    /// `runtime_timeout`: how long one snapshot waits for the runtime's answers; absent:
    /// 1 s.
    #[serde(
        deserialize_with = "de::duration_positive_opt",
        serialize_with = "de::serialize_duration_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub runtime_timeout: Option<std::time::Duration>,
}

/// `[health]`: how the GPU health verdict reads Xids.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthPolicy {
    /// `[health.xid_actions]`: an action per Xid number (`"109" = "gpu_reset"`,
    /// `"13" = "none"`) in place of NVIDIA's catalog's (`crate::health::catalog`). Read from
    /// the system file only: it decides what drains a node.
    #[serde(
        deserialize_with = "de::xid_actions",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub xid_actions: BTreeMap<String, crate::health::Action>,
    /// `unknown_xid_action`: what an Xid NVIDIA's catalog lacks asks for (absent:
    /// `health::UNKNOWN_XID_DEFAULT`, `gpu_reset`: never fit on a guess). System file only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unknown_xid_action: Option<crate::health::Action>,
}

/// `[fraction]`: the share of one GPU's memory a single process may hold, in (0, 1].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FractionPolicy {
    /// `fraction.default`; absent: no limit.
    #[serde(
        deserialize_with = "de::share_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub default: Option<f64>,
    /// `[fraction.gpu]`: per GPU, keyed by index (`"0"`) or UUID (`"GPU-..."`, `"MIG-..."`).
    #[serde(deserialize_with = "de::gpu_shares")]
    pub gpu: BTreeMap<String, f64>,
    /// `[fraction.user]`: per user, keyed by user name.
    #[serde(deserialize_with = "de::user_shares")]
    pub user: BTreeMap<String, f64>,
}

/// `[protect]`: processes never signalled by `clear` or the watchdog, in addition to
/// [`crate::protect::BUILT_IN`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Protect {
    /// Command names (matched like the built-in list).
    #[serde(deserialize_with = "de::names")]
    pub commands: Vec<String>,
    /// User names.
    #[serde(deserialize_with = "de::names")]
    pub users: Vec<String>,
    /// Kubernetes pods whose processes `clear` and the watchdog never signal, as the
    /// node's container runtime names them: `pod:NAMESPACE/NAME`, `namespace:NAME` (globs),
    /// `pod:UID`. Only pod forms: their names come from the root-only runtime socket and the
    /// kubelet's cgroups, never from anything a user can set.
    #[serde(deserialize_with = "de::pod_owners")]
    pub owners: Vec<String>,
}

/// `[watchdog]`: the reclaim daemon's settings (`gpuctl-watchdog`). Durations are written as
/// people write them (`"60s"`, `"500ms"`, `"2m"`) or as a number of seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Watchdog {
    /// Time between two loops (snapshot, classify, act).
    #[serde(with = "de::duration_positive")]
    pub interval: std::time::Duration,
    /// How long a process must stay stale (or above its share) before anything is done.
    #[serde(with = "de::duration")]
    pub grace: std::time::Duration,
    /// Time between SIGTERM and SIGKILL, and the bound on verifying the memory came back.
    #[serde(with = "de::duration_positive")]
    pub term_timeout: std::time::Duration,
    /// `report` (log only, the default: shared servers opt in) or `reclaim`.
    pub mode: WatchdogMode,
    /// Which kinds of stale process are reclaimed; other findings are only reported.
    pub reclaim: Vec<ReclaimKind>,
    /// Terminate a process that stays above its share (`[fraction]`) for `grace`; without
    /// it such a process is only warned about.
    pub enforce_fraction: bool,
    /// Users whose processes the watchdog never signals, added to `protect.users`.
    #[serde(deserialize_with = "de::names")]
    pub protect_users: Vec<String>,
    /// Commands the watchdog never signals, added to `protect.commands`.
    #[serde(deserialize_with = "de::names")]
    pub protect_commands: Vec<String>,
    /// The Prometheus textfile written each loop (at least once a second when loops are
    /// closer and nothing but the loop counter and poll time changed); empty disables it.
    pub metrics_file: PathBuf,
    /// Where the daemon keeps state (peak marks, its current findings for `gpuctl info`);
    /// empty disables it.
    pub state_dir: PathBuf,
    /// A GPU at or above `stuck_util_pct` utilization, drawing at most
    /// `stuck_power_fraction` of its power limit, with memory steady (within 1 %), for this
    /// long is reported as stuck (a job hung in a collective); "0s" disables the check.
    #[serde(with = "de::duration")]
    pub stuck_after: std::time::Duration,
    #[serde(deserialize_with = "de::percent")]
    pub stuck_util_pct: u32,
    #[serde(deserialize_with = "de::share")]
    pub stuck_power_fraction: f64,
    /// At most this many user series and this many owner series in the metrics file (the
    /// largest by memory); the rest are summed into one `other` series, so that a host
    /// running thousands of jobs cannot flood Prometheus.
    #[serde(deserialize_with = "de::at_least_one")]
    pub metrics_max_owners: usize,
    /// The kernel's log, read for the driver's Xid lines (the process an application Xid
    /// names): /dev/kmsg, or a file in its record format; empty disables it (an
    /// application Xid's culprit is then unknown). `GPUCTL_KERNEL_LOG` overrides it.
    pub kernel_log: PathBuf,
}

/// The environment variable naming the kernel log the watchdog reads (before the
/// `watchdog.kernel_log` key).
pub const KERNEL_LOG_ENV: &str = "GPUCTL_KERNEL_LOG";

/// Default of `watchdog.metrics_file`: node-exporter's textfile collector directory.
pub const WATCHDOG_METRICS_FILE: &str = "/var/lib/prometheus/node-exporter/gpuctl.prom";
/// Default of `watchdog.state_dir`.
pub const WATCHDOG_STATE_DIR: &str = "/var/lib/gpuctl";

/// `watchdog.state_dir` when the file does not set it: GPUCTL_STATE_DIR where set (the state
/// goes where the user said, for `health --ack` as for peak marks), else /var/lib/gpuctl.
fn default_state_dir() -> PathBuf {
    std::env::var_os("GPUCTL_STATE_DIR")
        .filter(|dir| !dir.is_empty())
        .map_or_else(|| PathBuf::from(WATCHDOG_STATE_DIR), PathBuf::from)
}

impl Default for Watchdog {
    fn default() -> Watchdog {
        Watchdog {
            interval: std::time::Duration::from_secs(5),
            grace: std::time::Duration::from_secs(60),
            term_timeout: std::time::Duration::from_secs(10),
            mode: WatchdogMode::Report,
            reclaim: vec![ReclaimKind::Orphaned, ReclaimKind::Zombie],
            enforce_fraction: false,
            protect_users: Vec::new(),
            protect_commands: Vec::new(),
            metrics_file: PathBuf::from(WATCHDOG_METRICS_FILE),
            state_dir: default_state_dir(),
            kernel_log: PathBuf::from(crate::health::kernel_log::KMSG),
            stuck_after: std::time::Duration::from_secs(600),
            stuck_util_pct: 95,
            stuck_power_fraction: 0.4,
            metrics_max_owners: 50,
        }
    }
}

impl Watchdog {
    /// The metrics file, `None` when disabled (`metrics_file = ""`).
    pub fn metrics_path(&self) -> Option<&Path> {
        (!self.metrics_file.as_os_str().is_empty()).then_some(self.metrics_file.as_path())
    }

    /// The kernel log: `GPUCTL_KERNEL_LOG`, else `kernel_log`; `None` when disabled (an
    /// empty value).
    pub fn kernel_log(&self) -> Option<PathBuf> {
        let path = std::env::var_os(KERNEL_LOG_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(|| self.kernel_log.clone());
        (!path.as_os_str().is_empty()).then_some(path)
    }

    /// The state directory, `None` when disabled (`state_dir = ""`).
    pub fn state_path(&self) -> Option<&Path> {
        (!self.state_dir.as_os_str().is_empty()).then_some(self.state_dir.as_path())
    }
}

/// `watchdog.mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WatchdogMode {
    /// Log what would be done; signal nothing.
    #[default]
    Report,
    /// Reclaim stale processes (and, with `enforce_fraction`, processes above their share).
    Reclaim,
}

impl WatchdogMode {
    pub fn as_str(self) -> &'static str {
        match self {
            WatchdogMode::Report => "report",
            WatchdogMode::Reclaim => "reclaim",
        }
    }
}

/// An entry of `watchdog.reclaim`: a kind of stale process the watchdog ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReclaimKind {
    /// The workers of a crashed run ([`crate::classify::Kind::Orphaned`]), and a deleted
    /// pod's leftover ([`crate::classify::Kind::PodLeftover`]).
    Orphaned,
    /// A zombie leader whose threads still hold the context.
    Zombie,
    /// Stopped (state T) for longer than the grace.
    Stopped,
}

/// Where a file comes from, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// `/etc/gpuctl/gpuctl.toml`.
    System,
    /// `$XDG_CONFIG_HOME/gpuctl/gpuctl.toml`.
    User,
    /// The file named by `GPUCTL_CONFIG`.
    Env,
    /// A path given on the command line (the watchdog's `--config`).
    Explicit,
}

impl Origin {
    /// Whether the user named this file (`GPUCTL_CONFIG`, `--config`) rather than it being
    /// looked for where it usually is.
    pub fn is_named(self) -> bool {
        matches!(self, Origin::Env | Origin::Explicit)
    }

    /// Whether a file of this origin is trusted like a sudoers file by this process: always
    /// for the system file, and for a file named by `GPUCTL_CONFIG` or `--config` when the
    /// reader is root.
    fn steers_root(self) -> bool {
        match self {
            Origin::System => true,
            Origin::User => false,
            Origin::Env | Origin::Explicit => geteuid().is_root(),
        }
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Origin::System => "system",
            Origin::User => "user",
            Origin::Env => ENV_VAR,
            Origin::Explicit => "--config",
        })
    }
}

/// A configuration file: where it comes from and its path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Source {
    pub origin: Origin,
    pub path: PathBuf,
}

impl Source {
    pub fn new(origin: Origin, path: impl Into<PathBuf>) -> Source {
        Source {
            origin,
            path: path.into(),
        }
    }
}

impl fmt::Display for Source {
    /// `system /etc/gpuctl/gpuctl.toml`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.origin, self.path.display())
    }
}

/// What [`load`] found: `system` holds the system file, or the `GPUCTL_CONFIG` / `--config`
/// file that replaces both (then `user` is `None`). A missing file is `None`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Loaded {
    pub system: Option<(Source, Config)>,
    pub user: Option<(Source, Config)>,
}

impl Loaded {
    /// Whether any file sets a memory share ([`fraction_for`] is `None` everywhere if not).
    pub fn has_fraction_policy(&self) -> bool {
        self.files().any(|(_, config)| {
            let fraction = &config.fraction;
            fraction.default.is_some() || !fraction.gpu.is_empty() || !fraction.user.is_empty()
        })
    }

    /// The NVML timeout the files set: the shorter of theirs, a user file's included (a
    /// shorter wait steers nothing of root's).
    pub fn nvml_timeout(&self) -> Option<std::time::Duration> {
        self.files()
            .filter_map(|(_, config)| config.nvml_timeout)
            .min()
    }

    /// The device directory the files name (the system file's first): `None` for /dev.
    pub fn dev_dir(&self) -> Option<&Path> {
        self.files()
            .find_map(|(_, config)| config.dev_dir.as_deref())
    }

    /// The unattributed memory above which `info` scans for device-file holders: the lower
    /// of the files' (scanning more only shows more).
    pub fn holders_threshold(&self) -> Option<u64> {
        self.files()
            .filter_map(|(_, config)| config.holders_threshold)
            .min()
    }

    /// The system file's `[health] xid_actions`, by Xid number (keys were checked when
    /// the file was read).
    pub fn xid_actions(&self) -> BTreeMap<u32, crate::health::Action> {
        self.system
            .iter()
            .flat_map(|(_, config)| &config.health.xid_actions)
            .filter_map(|(xid, action)| Some((xid.parse().ok()?, *action)))
            .collect()
    }

    /// The Xid catalog in force: NVIDIA's, with the system file's `[health] xid_actions`
    /// and `unknown_xid_action`.
    pub fn xid_catalog(&self) -> crate::health::Catalog {
        let unknown = self
            .system
            .as_ref()
            .and_then(|(_, config)| config.health.unknown_xid_action)
            .unwrap_or(crate::health::UNKNOWN_XID_DEFAULT);
        crate::health::Catalog::with_overrides(self.xid_actions()).unknown_xid_action(unknown)
    }

    /// The system file's `[idle]` (the defaults without one): the watchdog acts on it, and
    /// `info` shows idleness by it, so a user's own file does not change it.
    pub fn idle(&self) -> IdlePolicy {
        self.system
            .as_ref()
            .map(|(_, config)| config.idle.clone())
            .unwrap_or_default()
    }

    /// `[fleet]`: each key of the user's file where it has one, else the system file's.
    pub fn fleet(&self) -> FleetConfig {
        let system = self.system.as_ref().map(|(_, c)| c.fleet.clone());
        let user = self.user.as_ref().map(|(_, c)| &c.fleet);
        match user {
            Some(user) => system.unwrap_or_default().under(user),
            None => system.unwrap_or_default(),
        }
    }

    /// The system file's `[kubernetes]` (the defaults without one): the names it gives
    /// pods decide what `[protect]` patterns spare, so a user's file does not choose them.
    pub fn kubernetes(&self) -> Kubernetes {
        self.system
            .as_ref()
            .map(|(_, config)| config.kubernetes.clone())
            .unwrap_or_default()
    }

    /// The files that were found, system first.
    pub fn files(&self) -> impl Iterator<Item = &(Source, Config)> {
        self.system.iter().chain(self.user.iter())
    }

    /// The protect lists of both files together (a user file may add to them: protecting
    /// more only makes gpuctl gentler), without duplicates, system entries first.
    pub fn protect(&self) -> Protect {
        let mut protect = Protect::default();
        for (_, config) in self.files() {
            for command in &config.protect.commands {
                if !protect.commands.contains(command) {
                    protect.commands.push(command.clone());
                }
            }
            for user in &config.protect.users {
                if !protect.users.contains(user) {
                    protect.users.push(user.clone());
                }
            }
            for owner in &config.protect.owners {
                if !protect.owners.contains(owner) {
                    protect.owners.push(owner.clone());
                }
            }
        }
        protect
    }
}

/// Failures to read, trust, parse or write a configuration file. Every message is one line
/// and names the file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file exists but could not be opened or read.
    #[error("{}: cannot read: {source}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Not TOML, an unknown key, or a bad value. `message` starts with the key path when
    /// there is one (`fraction.user.alice: 1.5 is out of range: give a share in (0, 1]`).
    #[error("{}: {}{message}", .path.display(), .line.map(|line| format!("line {line}: ")).unwrap_or_default())]
    Invalid {
        path: PathBuf,
        line: Option<usize>,
        key: Option<String>,
        message: String,
    },
    /// The file, or its directory, could be changed by someone it must not trust.
    #[error("{message}")]
    Untrusted { path: PathBuf, message: String },
    /// A value or key given to [`set_fraction`] that the file may not hold.
    #[error("{0}")]
    Value(String),
    /// A file named explicitly (`GPUCTL_CONFIG`, `--config`) that does not exist: a
    /// mistyped path is never read as "no policy".
    #[error("{}: no such file (named by {origin})", .path.display())]
    Missing { path: PathBuf, origin: Origin },
    /// The file could not be written.
    #[error("{}: cannot write: {source}{hint}", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
        hint: &'static str,
    },
}

impl ConfigError {
    /// The file the error is about, if any.
    pub fn path(&self) -> Option<&Path> {
        match self {
            ConfigError::Read { path, .. }
            | ConfigError::Missing { path, .. }
            | ConfigError::Invalid { path, .. }
            | ConfigError::Untrusted { path, .. }
            | ConfigError::Write { path, .. } => Some(path),
            ConfigError::Value(_) => None,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Paths and loading

/// The files to read: the system file (or the `GPUCTL_CONFIG` file) and the user file (None
/// when `GPUCTL_CONFIG` is set, or no home directory is known).
pub fn paths() -> (Source, Option<Source>) {
    paths_with(&|name| std::env::var_os(name))
}

/// [`paths`] with the environment given as a function (for tests and callers that hold
/// their own environment).
pub fn paths_with(env: &dyn Fn(&str) -> Option<OsString>) -> (Source, Option<Source>) {
    if let Some(path) = env(ENV_VAR).filter(|path| !path.is_empty()) {
        return (Source::new(Origin::Env, path), None);
    }
    let system = Source::new(Origin::System, SYSTEM_PATH);
    // XDG: a relative $XDG_CONFIG_HOME is to be ignored.
    let config_home = env("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|path| path.is_absolute())
        .or_else(|| {
            env("HOME")
                .filter(|home| !home.is_empty())
                .map(PathBuf::from)
                .or_else(|| {
                    User::from_uid(geteuid())
                        .ok()
                        .flatten()
                        .map(|user| user.dir)
                })
                .filter(|home| home.is_absolute())
                .map(|home| home.join(".config"))
        });
    let user = config_home.map(|dir| Source::new(Origin::User, dir.join("gpuctl/gpuctl.toml")));
    (system, user)
}

/// Reads the configuration `GPUCTL_CONFIG` or the default paths name.
pub fn load() -> Result<Loaded, ConfigError> {
    let (system, user) = paths();
    load_sources(&system, user.as_ref())
}

/// Reads one explicitly named file (the watchdog's `--config`), which replaces both the
/// system and the user file.
pub fn load_explicit(path: &Path) -> Result<Loaded, ConfigError> {
    load_sources(&Source::new(Origin::Explicit, path), None)
}

/// Reads the given files; a missing one is left out of the result.
pub fn load_sources(system: &Source, user: Option<&Source>) -> Result<Loaded, ConfigError> {
    let system = load_file(system)?.map(|config| (system.clone(), config));
    let user = match user {
        Some(user) => load_file(user)?.map(|config| (user.clone(), config)),
        None => None,
    };
    Ok(Loaded { system, user })
}

/// Reads, checks and parses one file; `None` when an implicit one (the system or the user
/// file) does not exist. A file named explicitly must exist; `/dev/null` names no file at all
/// (the built-in policy, as for `git`'s `GIT_CONFIG_GLOBAL=/dev/null`).
pub fn load_file(source: &Source) -> Result<Option<Config>, ConfigError> {
    if source.path == Path::new(NO_FILE) {
        return Ok(None);
    }
    match read_checked(source)? {
        Some(file) => parse(&file.text, &source.path).map(Some),
        None if source.origin.is_named() => Err(ConfigError::Missing {
            path: source.path.clone(),
            origin: source.origin,
        }),
        None => Ok(None),
    }
}

/// Whether `GPUCTL_CONFIG` names the configuration: then its file must exist and parse for
/// every command, even those that otherwise read on without a configuration.
pub fn is_named() -> bool {
    paths().0.origin.is_named()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fractions_from_command_lines() {
        assert_eq!(parse_fraction("0.8"), Ok(0.8));
        assert_eq!(parse_fraction(" .5 "), Ok(0.5));
        assert_eq!(parse_fraction("1"), Ok(1.0));
        assert_eq!(parse_fraction("80%"), Ok(0.8));
        assert_eq!(parse_fraction("100 %"), Ok(1.0));
        let hint = "give a share in (0, 1], like 0.8, or a percentage, like 80%";
        assert_eq!(
            parse_fraction("0"),
            Err(format!("'0' is out of range: {hint}"))
        );
        assert_eq!(
            parse_fraction("-0.1"),
            Err(format!("'-0.1' is out of range: {hint}"))
        );
        assert_eq!(
            parse_fraction("1.5"),
            Err(format!("'1.5' is out of range: {hint}"))
        );
        assert_eq!(
            parse_fraction("150%"),
            Err("'150%' is out of range: give a percentage in (0%, 100%]".to_string())
        );
        for garbage in [
            "abc", "nan", "NaN", "inf", "infinity", "", "%", "0.5x", "1e999",
        ] {
            assert_eq!(
                parse_fraction(garbage),
                Err(format!("'{garbage}' is not a share: {hint}")),
                "{garbage}"
            );
        }
    }

    #[test]
    fn xid_actions_name_an_action_per_xid_number() {
        let path = Path::new("/etc/gpuctl/gpuctl.toml");
        let config = parse(
            "[health.xid_actions]\n\"109\" = \"none\"\n\"43\" = \"gpu_reset\"\n",
            path,
        )
        .unwrap();
        let loaded = Loaded {
            system: Some((Source::new(Origin::System, path), config)),
            user: None,
        };
        assert_eq!(
            loaded.xid_actions(),
            BTreeMap::from([
                (43, crate::health::Action::GpuReset),
                (109, crate::health::Action::None)
            ])
        );
        for (bad, says) in [
            ("\"abc\" = \"none\"", "'abc' is not an Xid number"),
            ("\"0\" = \"none\"", "'0' is not an Xid number"),
            ("\"013\" = \"none\"", "'013' is not an Xid number"),
            ("\"13\" = \"reboot\"", "reboot"),
            ("\"13\" = 1", "health.xid_actions"),
        ] {
            let error = parse(&format!("[health.xid_actions]\n{bad}\n"), path)
                .unwrap_err()
                .to_string();
            assert!(error.contains(says), "{bad}: {error}");
            assert!(error.contains("line 2"), "{bad}: {error}");
            assert!(!error.contains('\n'), "{bad}: {error}");
        }
    }

    #[test]
    fn unknown_xid_action_names_an_action_and_defaults_to_a_reset() {
        use crate::health::Action;
        let path = Path::new("/etc/gpuctl/gpuctl.toml");
        let loaded = |text: &str| Loaded {
            system: Some((
                Source::new(Origin::System, path),
                parse(text, path).unwrap(),
            )),
            user: None,
        };
        let rule = |loaded: &Loaded| loaded.xid_catalog().rule(999).action;
        assert_eq!(rule(&loaded("")), Action::GpuReset);
        assert_eq!(
            rule(&loaded("[health]\nunknown_xid_action = \"none\"\n")),
            Action::None
        );
        assert_eq!(
            rule(&loaded("[health]\nunknown_xid_action = \"node_reboot\"\n")),
            Action::NodeReboot
        );
        for bad in ["\"reboot\"", "1", "\"\""] {
            let error = parse(&format!("[health]\nunknown_xid_action = {bad}\n"), path)
                .unwrap_err()
                .to_string();
            assert!(error.contains("unknown_xid_action"), "{bad}: {error}");
            assert!(error.contains("line 2"), "{bad}: {error}");
            assert!(!error.contains('\n'), "{bad}: {error}");
        }
    }

    #[test]
    fn metrics_max_owners_is_a_count_of_at_least_one() {
        let path = Path::new("/etc/gpuctl/gpuctl.toml");
        let parsed = |text: &str| parse(text, path).map(|c| c.watchdog.metrics_max_owners);
        assert_eq!(parsed("[watchdog]\n").unwrap(), 50);
        assert_eq!(parsed("[watchdog]\nmetrics_max_owners = 3\n").unwrap(), 3);
        for bad in ["0", "-1", "2.5", "\"50\""] {
            let error = parsed(&format!("[watchdog]\nmetrics_max_owners = {bad}\n"))
                .unwrap_err()
                .to_string();
            assert!(error.contains("metrics_max_owners"), "{bad}: {error}");
            assert!(!error.contains('\n'), "{bad}: {error}");
        }
    }

    #[test]
    fn key_paths() {
        let path = |keys: &[&str]| {
            render_path(
                &keys
                    .iter()
                    .map(|key| Segment::Key(key.to_string()))
                    .collect::<Vec<_>>(),
            )
        };
        assert_eq!(path(&["fraction", "gpu", "0"]), "fraction.gpu.\"0\"");
        assert_eq!(
            path(&["fraction", "user", "alice smith"]),
            "fraction.user.\"alice smith\""
        );
        assert_eq!(
            path(&["fraction", "user", "a\"b"]),
            "fraction.user.\"a\\\"b\""
        );
        assert_eq!(
            render_path(&[
                Segment::Key("protect".into()),
                Segment::Key("users".into()),
                Segment::Index(1)
            ]),
            "protect.users[1]"
        );
    }

    #[test]
    fn env_and_xdg() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(key, _)| *key == name)
                    .map(|(_, value)| OsString::from(value))
            }
        };
        let (system, user) = paths_with(&env(&[
            ("GPUCTL_CONFIG", "/tmp/x.toml"),
            ("HOME", "/home/a"),
        ]));
        assert_eq!(system, Source::new(Origin::Env, "/tmp/x.toml"));
        assert_eq!(user, None);
        let (system, user) = paths_with(&env(&[("GPUCTL_CONFIG", ""), ("HOME", "/home/a")]));
        assert_eq!(system, Source::new(Origin::System, SYSTEM_PATH));
        assert_eq!(
            user,
            Some(Source::new(
                Origin::User,
                "/home/a/.config/gpuctl/gpuctl.toml"
            ))
        );
        let (_, user) = paths_with(&env(&[("XDG_CONFIG_HOME", "/x/cfg"), ("HOME", "/home/a")]));
        assert_eq!(
            user,
            Some(Source::new(Origin::User, "/x/cfg/gpuctl/gpuctl.toml"))
        );
        // A relative XDG_CONFIG_HOME is ignored, as the spec says.
        let (_, user) = paths_with(&env(&[("XDG_CONFIG_HOME", "cfg"), ("HOME", "/home/a")]));
        assert_eq!(
            user,
            Some(Source::new(
                Origin::User,
                "/home/a/.config/gpuctl/gpuctl.toml"
            ))
        );
    }
}
