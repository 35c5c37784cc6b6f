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

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::ops::Range;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, open, openat, renameat};
use nix::sys::stat::{Mode, fchmod};
use nix::unistd::{Gid, Group, Uid, UnlinkatFlags, User, fchown, fsync, geteuid, unlinkat};
use serde::{Deserialize, Serialize};
use toml::de::{DeTable, DeValue};

/// The system file.
pub const SYSTEM_PATH: &str = "/etc/gpuctl/gpuctl.toml";
/// The environment variable naming one file that replaces both the system and the user file.
pub const ENV_VAR: &str = "GPUCTL_CONFIG";
/// Files larger than this are refused unread: a gpuctl config is a few lines.
const MAX_SIZE: u64 = 1 << 20;

/// One configuration file's content. `Default` is the empty policy (no limits, nothing
/// protected beyond the built-in list).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub fraction: FractionPolicy,
    pub protect: Protect,
    pub watchdog: Watchdog,
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
/// [`crate::reclaim::DEFAULT_PROTECTED`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Protect {
    /// Command names (matched like the built-in list).
    #[serde(deserialize_with = "de::names")]
    pub commands: Vec<String>,
    /// User names.
    #[serde(deserialize_with = "de::names")]
    pub users: Vec<String>,
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
    /// Where the daemon keeps state (peak marks); empty disables it.
    pub state_dir: PathBuf,
}

/// Default of `watchdog.metrics_file`: node-exporter's textfile collector directory.
pub const WATCHDOG_METRICS_FILE: &str = "/var/lib/prometheus/node-exporter/gpuctl.prom";
/// Default of `watchdog.state_dir`.
pub const WATCHDOG_STATE_DIR: &str = "/var/lib/gpuctl";

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
            state_dir: PathBuf::from(WATCHDOG_STATE_DIR),
        }
    }
}

impl Watchdog {
    /// The metrics file, `None` when disabled (`metrics_file = ""`).
    pub fn metrics_path(&self) -> Option<&Path> {
        (!self.metrics_file.as_os_str().is_empty()).then_some(self.metrics_file.as_path())
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
    /// The workers of a crashed run ([`crate::classify::Kind::Orphaned`]).
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

/// Reads, checks and parses one file; `None` when it does not exist.
pub fn load_file(source: &Source) -> Result<Option<Config>, ConfigError> {
    match read_checked(source)? {
        Some(file) => parse(&file.text, &source.path).map(Some),
        None => Ok(None),
    }
}

/// Parses a configuration's text; `path` is only used in messages.
pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
    let invalid =
        |span: Option<Range<usize>>, key: Option<String>, message: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            line: span.map(|span| line_of(text, span.start)),
            key,
            message,
        };
    // First the syntax, keeping every key's and value's position, so that a schema error
    // below can be given its key path.
    let tree = DeTable::parse(text).map_err(|error| {
        let message = match error.message() {
            "duplicate key" => match error.span() {
                Some(span) => format!("duplicate key {}", text[span].trim()),
                None => "duplicate key".to_string(),
            },
            message => message.to_string(),
        };
        invalid(error.span(), None, message)
    })?;
    toml::from_str::<Config>(text).map_err(|error| {
        let span = error.span();
        let key = span
            .clone()
            .and_then(|span| find_path(tree.get_ref(), &span))
            .map(|path| render_path(&path));
        let message = explain(error.message(), key.as_deref());
        invalid(span, key, message)
    })
}

/// The 1-based line holding byte `offset`.
fn line_of(text: &str, offset: usize) -> usize {
    let offset = offset.min(text.len());
    text.as_bytes()[..offset]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

#[derive(Debug, Clone, PartialEq)]
enum Segment {
    Key(String),
    Index(usize),
}

/// The key path of the key or value at `span`: an exact match first (the deepest), else the
/// deepest value that contains it.
fn find_path(table: &DeTable<'_>, span: &Range<usize>) -> Option<Vec<Segment>> {
    fn walk_value(
        value: &toml::Spanned<DeValue<'_>>,
        span: &Range<usize>,
        path: &mut Vec<Segment>,
        exact: &mut Option<Vec<Segment>>,
        within: &mut Option<Vec<Segment>>,
    ) {
        let here = value.span();
        if here == *span {
            if exact.as_ref().is_none_or(|found| found.len() < path.len()) {
                *exact = Some(path.clone());
            }
        } else if here.start <= span.start
            && span.end <= here.end
            && within.as_ref().is_none_or(|found| found.len() < path.len())
        {
            *within = Some(path.clone());
        }
        match value.get_ref() {
            DeValue::Table(table) => walk_table(table, span, path, exact, within),
            DeValue::Array(array) => {
                for (index, item) in array.iter().enumerate() {
                    path.push(Segment::Index(index));
                    walk_value(item, span, path, exact, within);
                    path.pop();
                }
            }
            _ => {}
        }
    }
    fn walk_table(
        table: &DeTable<'_>,
        span: &Range<usize>,
        path: &mut Vec<Segment>,
        exact: &mut Option<Vec<Segment>>,
        within: &mut Option<Vec<Segment>>,
    ) {
        for (key, value) in table.iter() {
            path.push(Segment::Key(key.get_ref().to_string()));
            if key.span() == *span && exact.as_ref().is_none_or(|found| found.len() < path.len()) {
                *exact = Some(path.clone());
            }
            walk_value(value, span, path, exact, within);
            path.pop();
        }
    }
    let (mut exact, mut within) = (None, None);
    walk_table(table, span, &mut Vec::new(), &mut exact, &mut within);
    exact.or(within).filter(|path| !path.is_empty())
}

/// `fraction.gpu."0"`, `protect.commands[1]`: bare keys where TOML allows them and they are
/// not all digits (a GPU index reads better quoted).
fn render_path(path: &[Segment]) -> String {
    let mut out = String::new();
    for segment in path {
        match segment {
            Segment::Key(key) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(&render_key(key));
            }
            Segment::Index(index) => out.push_str(&format!("[{index}]")),
        }
    }
    out
}

fn render_key(key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && !key.chars().all(|c| c.is_ascii_digit());
    if bare {
        return key.to_string();
    }
    let mut quoted = String::from("\"");
    for c in key.chars() {
        match c {
            '"' => quoted.push_str("\\\""),
            '\\' => quoted.push_str("\\\\"),
            c if c.is_control() => quoted.push_str(&format!("\\u{:04X}", c as u32)),
            c => quoted.push(c),
        }
    }
    quoted.push('"');
    quoted
}

/// Turns serde's wording into ours, with the key path in front.
fn explain(message: &str, key: Option<&str>) -> String {
    let key_prefix = |text: String| match key {
        Some(key) => format!("{key}: {text}"),
        None => text,
    };
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let (name, expected) = rest.split_once('`').unwrap_or((rest, ""));
        let known: Vec<&str> = expected
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|name| !name.is_empty())
            .collect();
        let shown = key.map(str::to_string).unwrap_or_else(|| render_key(name));
        let parent = shown
            .strip_suffix(&render_key(name))
            .and_then(|parent| parent.strip_suffix('.'))
            .filter(|parent| !parent.is_empty());
        let known = match (known.is_empty(), parent) {
            (true, _) => String::new(),
            (false, Some(parent)) => format!(" (known keys in [{parent}]: {})", known.join(", ")),
            (false, None) => format!(" (known keys: {})", known.join(", ")),
        };
        return format!("unknown key '{shown}'{known}");
    }
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = message.strip_prefix(prefix)
            && let Some((found, expected)) = rest.split_once(", expected ")
        {
            return key_prefix(format!(
                "expected {}, found {}",
                expected_words(expected),
                found_words(found)
            ));
        }
    }
    key_prefix(message.to_string())
}

fn expected_words(expected: &str) -> String {
    match expected {
        "a sequence" => "an array".to_string(),
        "a map" => "a table".to_string(),
        other if other.starts_with("struct ") => "a table".to_string(),
        other => other.to_string(),
    }
}

fn found_words(found: &str) -> String {
    let inner = |text: &str| text.trim_matches('`').to_string();
    match found {
        "map" => "a table".to_string(),
        "sequence" => "an array".to_string(),
        other => match other.split_once(' ') {
            Some(("string", text)) => format!("the string {text}"),
            Some(("integer", number)) => inner(number),
            Some(("floating", rest)) => inner(rest.trim_start_matches("point ")),
            Some(("boolean", value)) => inner(value),
            _ => other.to_string(),
        },
    }
}

// ---------------------------------------------------------------------------------------
// Values

/// Checks a share: in (0, 1] and a number.
fn check_share(value: f64) -> Result<f64, String> {
    if value.is_nan() {
        Err("nan is not a number: give a share in (0, 1]".to_string())
    } else if value > 0.0 && value <= 1.0 {
        Ok(value)
    } else {
        Err(format!(
            "{} is out of range: give a share in (0, 1]",
            show_f64(value)
        ))
    }
}

fn show_f64(value: f64) -> String {
    if value.is_nan() {
        "nan".to_string()
    } else if value.is_infinite() {
        if value > 0.0 { "inf" } else { "-inf" }.to_string()
    } else {
        value.to_string()
    }
}

/// A share as people write it on a command line: `0.8`, `.8`, `1`, or a percentage, `80%`.
/// Zero, negative values, values above 1 (100%), nan, inf and anything else are errors.
pub fn parse_fraction(text: &str) -> Result<f64, String> {
    let trimmed = text.trim();
    let hint = "give a share in (0, 1], like 0.8, or a percentage, like 80%";
    let not_a_share = || format!("'{text}' is not a share: {hint}");
    let (number, percent) = match trimmed.strip_suffix('%') {
        Some(number) => (number.trim_end(), true),
        None => (trimmed, false),
    };
    // Rust's float syntax also takes "inf", "nan" and "infinity"; only digits, one dot, an
    // exponent and a sign are numbers here.
    let looks_numeric = !number.is_empty()
        && number.chars().any(|c| c.is_ascii_digit())
        && number
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-'));
    let value: f64 = match number.parse() {
        Ok(value) if looks_numeric => value,
        _ => return Err(not_a_share()),
    };
    if !value.is_finite() {
        return Err(not_a_share());
    }
    if percent {
        if value > 0.0 && value <= 100.0 {
            Ok(value / 100.0)
        } else {
            Err(format!(
                "'{text}' is out of range: give a percentage in (0%, 100%]"
            ))
        }
    } else if value > 0.0 && value <= 1.0 {
        Ok(value)
    } else {
        Err(format!("'{text}' is out of range: {hint}"))
    }
}

/// Why `key` cannot name a GPU in `[fraction.gpu]`, if it cannot.
fn check_gpu_key(key: &str) -> Result<(), String> {
    let index =
        !key.is_empty() && key.chars().all(|c| c.is_ascii_digit()) && key.parse::<u32>().is_ok();
    let uuid = ["GPU-", "MIG-"].iter().any(|prefix| {
        key.len() > prefix.len()
            && key[..prefix.len()].eq_ignore_ascii_case(prefix)
            && key[prefix.len()..]
                .chars()
                .all(|c| c.is_ascii_hexdigit() || c == '-' || c == '/')
    });
    if index || uuid {
        Ok(())
    } else {
        Err(
            "not a GPU: name one by index, like \"0\", or by UUID, like \"GPU-6a8295fa-c8f6-96e0-6154-3094e85e05b1\" (see nvidia-smi -L)"
                .to_string(),
        )
    }
}

/// Why `name` cannot be a user name, if it cannot. Checks the form only: user databases
/// (LDAP, SSSD) may be unreachable when the watchdog starts, and a config must not fail then.
fn check_user_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.starts_with('-')
        || name
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || matches!(c, ':' | '/' | ','))
    {
        Err("not a user name".to_string())
    } else {
        Ok(())
    }
}

mod de {
    //! Deserializers that check values as they are read, so that the error carries the
    //! value's position (and so its line and key path).

    use std::collections::BTreeMap;
    use std::fmt;

    use serde::Deserialize;
    use serde::de::{self, Deserializer, Visitor};

    struct Share(f64);

    impl<'de> Deserialize<'de> for Share {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Share, D::Error> {
            struct ShareVisitor;
            impl Visitor<'_> for ShareVisitor {
                type Value = Share;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("a share in (0, 1]")
                }
                fn visit_f64<E: de::Error>(self, value: f64) -> Result<Share, E> {
                    super::check_share(value).map(Share).map_err(E::custom)
                }
                fn visit_i64<E: de::Error>(self, value: i64) -> Result<Share, E> {
                    self.visit_f64(value as f64)
                }
                fn visit_u64<E: de::Error>(self, value: u64) -> Result<Share, E> {
                    self.visit_f64(value as f64)
                }
            }
            deserializer.deserialize_any(ShareVisitor)
        }
    }

    struct GpuKey(String);

    impl<'de> Deserialize<'de> for GpuKey {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<GpuKey, D::Error> {
            let key = String::deserialize(deserializer)?;
            super::check_gpu_key(&key).map_err(de::Error::custom)?;
            Ok(GpuKey(key))
        }
    }

    struct UserKey(String);

    impl<'de> Deserialize<'de> for UserKey {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<UserKey, D::Error> {
            let key = String::deserialize(deserializer)?;
            super::check_user_name(&key).map_err(de::Error::custom)?;
            Ok(UserKey(key))
        }
    }

    impl PartialEq for GpuKey {
        fn eq(&self, other: &Self) -> bool {
            self.0 == other.0
        }
    }
    impl Eq for GpuKey {}
    impl PartialOrd for GpuKey {
        fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
            Some(self.cmp(other))
        }
    }
    impl Ord for GpuKey {
        fn cmp(&self, other: &Self) -> std::cmp::Ordering {
            self.0.cmp(&other.0)
        }
    }
    impl PartialEq for UserKey {
        fn eq(&self, other: &Self) -> bool {
            self.0 == other.0
        }
    }
    impl Eq for UserKey {}
    impl PartialOrd for UserKey {
        fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
            Some(self.cmp(other))
        }
    }
    impl Ord for UserKey {
        fn cmp(&self, other: &Self) -> std::cmp::Ordering {
            self.0.cmp(&other.0)
        }
    }

    struct Name(String);

    impl<'de> Deserialize<'de> for Name {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Name, D::Error> {
            struct NameVisitor;
            impl Visitor<'_> for NameVisitor {
                type Value = Name;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("a name (a non-empty string)")
                }
                fn visit_str<E: de::Error>(self, value: &str) -> Result<Name, E> {
                    if value.trim().is_empty() {
                        Err(E::custom("empty name: give a non-empty string"))
                    } else {
                        Ok(Name(value.to_string()))
                    }
                }
            }
            deserializer.deserialize_str(NameVisitor)
        }
    }

    pub(super) fn share_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        Share::deserialize(d).map(|share| Some(share.0))
    }

    pub(super) fn gpu_shares<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<String, f64>, D::Error> {
        let map = BTreeMap::<GpuKey, Share>::deserialize(d)?;
        Ok(map
            .into_iter()
            .map(|(key, share)| (key.0, share.0))
            .collect())
    }

    pub(super) fn user_shares<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<String, f64>, D::Error> {
        let map = BTreeMap::<UserKey, Share>::deserialize(d)?;
        Ok(map
            .into_iter()
            .map(|(key, share)| (key.0, share.0))
            .collect())
    }

    /// Durations: `"60s"`, `"500ms"`, `"1h 30m"`, or a number of seconds.
    pub(super) mod duration {
        use std::fmt;
        use std::time::Duration;

        use serde::de::{self, Deserializer, Visitor};
        use serde::ser::Serializer;

        pub(in super::super) fn serialize<S: Serializer>(
            value: &Duration,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            s.serialize_str(&humantime::format_duration(*value).to_string())
        }

        pub(in super::super) fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Duration, D::Error> {
            struct DurationVisitor;
            impl Visitor<'_> for DurationVisitor {
                type Value = Duration;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("a duration, like \"60s\" or \"500ms\"")
                }
                fn visit_str<E: de::Error>(self, value: &str) -> Result<Duration, E> {
                    crate::units::parse_duration(value).map_err(E::custom)
                }
                fn visit_f64<E: de::Error>(self, value: f64) -> Result<Duration, E> {
                    Duration::try_from_secs_f64(value).map_err(|_| {
                        E::custom(format!("{value} is not a duration (like 10s, 500ms, 2m)"))
                    })
                }
                fn visit_i64<E: de::Error>(self, value: i64) -> Result<Duration, E> {
                    self.visit_f64(value as f64)
                }
                fn visit_u64<E: de::Error>(self, value: u64) -> Result<Duration, E> {
                    Ok(Duration::from_secs(value))
                }
            }
            d.deserialize_any(DurationVisitor)
        }
    }

    /// A duration that must be above zero (an interval, a timeout).
    pub(super) mod duration_positive {
        use std::time::Duration;

        use serde::de::{self, Deserializer};
        use serde::ser::Serializer;

        pub(in super::super) fn serialize<S: Serializer>(
            value: &Duration,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            super::duration::serialize(value, s)
        }

        pub(in super::super) fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Duration, D::Error> {
            let value = super::duration::deserialize(d)?;
            if value < Duration::from_millis(10) {
                return Err(de::Error::custom(format!(
                    "{} is too short: give at least 10ms",
                    humantime::format_duration(value)
                )));
            }
            Ok(value)
        }
    }

    pub(super) fn names<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
        let names = Vec::<Name>::deserialize(d)?;
        Ok(names.into_iter().map(|name| name.0).collect())
    }
}

// ---------------------------------------------------------------------------------------
// The share in force

/// The share in force for a process, and where it comes from.
#[derive(Debug, Clone, PartialEq)]
pub struct FractionInForce {
    pub value: f64,
    /// The file that set it.
    pub source: Source,
    /// The key that set it: `fraction.default`, `fraction.gpu."0"`, `fraction.user.alice`.
    pub key: String,
    /// Set when the user file asked for a higher share than the system file, which is not
    /// allowed: `user /home/alice/.config/gpuctl/gpuctl.toml: fraction.default = 0.95
    /// ignored: a user file may only lower the system's 0.9`.
    pub note: Option<String>,
}

impl FractionInForce {
    /// `system /etc/gpuctl/gpuctl.toml: fraction.gpu."0"`
    pub fn describe(&self) -> String {
        format!("{}: {}", self.source, self.key)
    }
}

impl fmt::Display for FractionInForce {
    /// `0.5 (system /etc/gpuctl/gpuctl.toml: fraction.gpu."0")`, with the note after a `;`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}", self.value, self.describe())?;
        if let Some(note) = &self.note {
            write!(f, "; {note}")?;
        }
        f.write_str(")")
    }
}

impl FractionPolicy {
    /// The share this file sets for a process of `user` on a GPU, and its key. A GPU entry
    /// (by UUID, then by index) beats a user entry, which beats the default.
    pub fn lookup(
        &self,
        gpu_index: u32,
        gpu_uuid: Option<&str>,
        user: Option<&str>,
    ) -> Option<(f64, String)> {
        let gpu_key = |key: &str| format!("fraction.gpu.{}", render_key(key));
        if let Some(uuid) = gpu_uuid
            && let Some((key, value)) = self
                .gpu
                .iter()
                .find(|(key, _)| key.eq_ignore_ascii_case(uuid))
        {
            return Some((*value, gpu_key(key)));
        }
        if let Some((key, value)) = self.gpu.iter().find(|(key, _)| {
            key.chars().all(|c| c.is_ascii_digit()) && key.parse::<u32>() == Ok(gpu_index)
        }) {
            return Some((*value, gpu_key(key)));
        }
        if let Some(user) = user
            && let Some(value) = self.user.get(user)
        {
            return Some((*value, format!("fraction.user.{}", render_key(user))));
        }
        self.default
            .map(|value| (value, "fraction.default".to_string()))
    }
}

/// The share of one GPU's memory a process of `user` may hold on GPU `gpu_index` (UUID
/// `gpu_uuid`), and where it comes from. Within a file, a GPU entry beats a user entry beats
/// the default. Across files, the user file may only lower the system's value: its share is
/// taken when the system sets none or a higher one; a higher one is ignored, and `note`
/// says so. `None`: no limit.
pub fn fraction_for(
    loaded: &Loaded,
    gpu_index: u32,
    gpu_uuid: Option<&str>,
    user: Option<&str>,
) -> Option<FractionInForce> {
    let found = |file: &Option<(Source, Config)>| {
        file.as_ref().and_then(|(source, config)| {
            config
                .fraction
                .lookup(gpu_index, gpu_uuid, user)
                .map(|(value, key)| FractionInForce {
                    value,
                    source: source.clone(),
                    key,
                    note: None,
                })
        })
    };
    match (found(&loaded.system), found(&loaded.user)) {
        (None, None) => None,
        (Some(system), None) => Some(system),
        (None, Some(user)) => Some(user),
        (Some(system), Some(user)) if user.value <= system.value => Some(user),
        (Some(mut system), Some(user)) => {
            system.note = Some(format!(
                "{} = {} ignored: a user file may only lower the system's {}",
                user.describe(),
                user.value,
                system.value
            ));
            Some(system)
        }
    }
}

// ---------------------------------------------------------------------------------------
// Reading with the checks sudo makes

/// An opened, checked configuration file.
struct CheckedFile {
    /// Where it really is (symbolic links resolved): edits go there.
    path: PathBuf,
    text: String,
    uid: u32,
    gid: u32,
    mode: u32,
}

/// Opens `source` without following a final symbolic link after resolution, checks the
/// opened file (and, for a file that steers root, its directory) by their descriptors, and
/// reads it. `None` when it does not exist.
fn read_checked(source: &Source) -> Result<Option<CheckedFile>, ConfigError> {
    let read_error = |source_error: io::Error| ConfigError::Read {
        path: source.path.clone(),
        source: source_error,
    };
    let real = match fs::canonicalize(&source.path) {
        Ok(real) => real,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(read_error(error)),
    };
    let (Some(dir), Some(name)) = (real.parent(), real.file_name()) else {
        return Err(read_error(io::Error::other("not a file")));
    };
    let dir_fd = open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| read_error(errno.into()))?;
    let fd = match openat(
        &dir_fd,
        name,
        OFlag::O_RDONLY
            | OFlag::O_CLOEXEC
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_NOCTTY,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(None),
        Err(errno) => return Err(read_error(errno.into())),
    };
    let mut file = File::from(fd);
    let meta = file.metadata().map_err(read_error)?;
    if !meta.file_type().is_file() {
        return Err(ConfigError::Invalid {
            path: source.path.clone(),
            line: None,
            key: None,
            message: "not a regular file".to_string(),
        });
    }
    check_trust(source, &meta, &File::from(dir_fd), dir)?;
    if meta.len() > MAX_SIZE {
        return Err(ConfigError::Invalid {
            path: source.path.clone(),
            line: None,
            key: None,
            message: "larger than 1 MiB: not a gpuctl configuration".to_string(),
        });
    }
    let mut bytes = Vec::new();
    (&mut file)
        .take(MAX_SIZE + 1)
        .read_to_end(&mut bytes)
        .map_err(read_error)?;
    let text = String::from_utf8(bytes).map_err(|error| ConfigError::Invalid {
        path: source.path.clone(),
        line: Some(line_of(
            &String::from_utf8_lossy(error.as_bytes()),
            error.utf8_error().valid_up_to(),
        )),
        key: None,
        message: "not UTF-8 text".to_string(),
    })?;
    Ok(Some(CheckedFile {
        path: real,
        text,
        uid: meta.uid(),
        gid: meta.gid(),
        mode: meta.mode(),
    }))
}

/// Why a file (or directory) with this owner and mode may not steer root: owned by someone
/// other than root, writable by a group other than root's, or by everyone. A directory with
/// the sticky bit (like /tmp) is not counted as writable: there only the file's owner (root,
/// checked) may rename or remove it.
fn root_problems(uid: u32, gid: u32, mode: u32, is_dir: bool) -> Vec<String> {
    let sticky = is_dir && mode & 0o1000 != 0;
    let mut problems = Vec::new();
    if uid != 0 {
        problems.push(format!("owned by {}, not root", describe_uid(uid)));
    }
    if mode & 0o002 != 0 && !sticky {
        problems.push("writable by everyone".to_string());
    } else if mode & 0o020 != 0 && gid != 0 && !sticky {
        problems.push(format!("writable by group {}", describe_gid(gid)));
    }
    problems
}

fn describe_uid(uid: u32) -> String {
    match User::from_uid(Uid::from_raw(uid)) {
        Ok(Some(user)) => format!("uid {uid} ({})", user.name),
        _ => format!("uid {uid}"),
    }
}

fn describe_gid(gid: u32) -> String {
    match Group::from_gid(Gid::from_raw(gid)) {
        Ok(Some(group)) => format!("'{}'", group.name),
        _ => format!("gid {gid}"),
    }
}

const SUDO_REASON: &str =
    "refusing it, as sudo refuses such a sudoers (it steers a root daemon that kills processes)";

/// Checks an opened file (and, when it steers root, its directory `dir`, opened at
/// `dir_path`) against who may change them.
fn check_trust(
    source: &Source,
    meta: &fs::Metadata,
    dir: &File,
    dir_path: &Path,
) -> Result<(), ConfigError> {
    let path = source.path.display();
    if source.origin.steers_root() {
        let problems = root_problems(meta.uid(), meta.gid(), meta.mode(), false);
        if !problems.is_empty() {
            return Err(ConfigError::Untrusted {
                path: source.path.clone(),
                message: format!(
                    "{path} is {}: {SUDO_REASON}; fix with: chown root:root {path} && chmod 644 {path}",
                    problems.join(", and ")
                ),
            });
        }
        let dir_meta = dir.metadata().map_err(|error| ConfigError::Read {
            path: source.path.clone(),
            source: error,
        })?;
        let problems = root_problems(dir_meta.uid(), dir_meta.gid(), dir_meta.mode(), true);
        if !problems.is_empty() {
            let dir_path = dir_path.display();
            return Err(ConfigError::Untrusted {
                path: source.path.clone(),
                message: format!(
                    "{path}: its directory {dir_path} is {}: {SUDO_REASON}; fix with: chown root:root {dir_path} && chmod 755 {dir_path}",
                    problems.join(", and ")
                ),
            });
        }
        return Ok(());
    }
    // A file that steers only its reader: like ssh with ~/.ssh/authorized_keys, it must be
    // the reader's (or root's) and writable by nobody else.
    let me = geteuid().as_raw();
    let mut problems = Vec::new();
    if meta.uid() != me && meta.uid() != 0 {
        if me == 0 {
            problems.push(format!("owned by {}, not root", describe_uid(meta.uid())));
        } else {
            problems.push(format!(
                "owned by {}, not by you ({}) or root",
                describe_uid(meta.uid()),
                describe_uid(me)
            ));
        }
    }
    if meta.mode() & 0o002 != 0 {
        problems.push("writable by everyone".to_string());
    } else if meta.mode() & 0o020 != 0 {
        problems.push(format!("writable by group {}", describe_gid(meta.gid())));
    }
    if problems.is_empty() {
        return Ok(());
    }
    let owner = User::from_uid(Uid::from_raw(me))
        .ok()
        .flatten()
        .map(|user| user.name)
        .unwrap_or_else(|| me.to_string());
    let fix = if meta.uid() != me && meta.uid() != 0 {
        format!("chown {owner} {path} && chmod 644 {path}")
    } else {
        format!("chmod 644 {path}")
    };
    Err(ConfigError::Untrusted {
        path: source.path.clone(),
        message: format!(
            "{path} is {}: refusing it, as ssh refuses such an authorized_keys (others could steer what gpuctl does as you); fix with: {fix}",
            problems.join(", and ")
        ),
    })
}

// ---------------------------------------------------------------------------------------
// Writing

/// Which fraction key [`set_fraction`] writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FractionScope {
    /// `fraction.default`
    Default,
    /// `fraction.gpu."<index or UUID>"`
    Gpu(String),
    /// `fraction.user.<name>`
    User(String),
}

impl FractionScope {
    /// The key path this scope writes: `fraction.gpu."0"`.
    pub fn key(&self) -> String {
        match self {
            FractionScope::Default => "fraction.default".to_string(),
            FractionScope::Gpu(gpu) => format!("fraction.gpu.{}", render_key(gpu)),
            FractionScope::User(user) => format!("fraction.user.{}", render_key(user)),
        }
    }
}

const HEADER: &str =
    "# gpuctl configuration. gpuctl keeps comments and layout when it edits this file.\n";

/// Writes one fraction key into the file, keeping its comments, layout and other keys.
/// Creates the file (with a short header comment) and its directory (mode 0755) when
/// missing. The value and key are checked first, and the existing file is read with the
/// same checks as [`load_file`]: nothing is written when either fails. The write is atomic
/// (a temporary file in the same directory, renamed over the old one); the file gets mode
/// 0644 (or stricter if it was), and keeps its owner when written by root.
pub fn set_fraction(source: &Source, scope: FractionScope, value: f64) -> Result<(), ConfigError> {
    check_share(value)
        .map_err(|message| ConfigError::Value(format!("{}: {message}", scope.key())))?;
    match &scope {
        FractionScope::Default => {}
        FractionScope::Gpu(key) => check_gpu_key(key)
            .map_err(|message| ConfigError::Value(format!("{}: {message}", scope.key())))?,
        FractionScope::User(name) => check_user_name(name)
            .map_err(|message| ConfigError::Value(format!("{}: {message}", scope.key())))?,
    }
    let existing = read_checked(source)?;
    if let Some(file) = &existing {
        // Refuse to edit a file that does not load: fix it first.
        parse(&file.text, &source.path)?;
    }
    let mut doc: toml_edit::DocumentMut = match &existing {
        Some(file) => {
            file.text
                .parse()
                .map_err(|error: toml_edit::TomlError| ConfigError::Invalid {
                    path: source.path.clone(),
                    line: None,
                    key: None,
                    message: error.message().to_string(),
                })?
        }
        None => toml_edit::DocumentMut::new(),
    };
    set_in_document(&mut doc, &scope, value).map_err(|message| ConfigError::Invalid {
        path: source.path.clone(),
        line: None,
        key: Some(scope.key()),
        message,
    })?;
    let mut text = doc.to_string();
    if existing.is_none() {
        text = format!("{HEADER}\n{text}");
    }
    // What is written must load.
    parse(&text, &source.path)?;
    let target = existing
        .as_ref()
        .map(|file| file.path.clone())
        .unwrap_or_else(|| source.path.clone());
    write_atomic(source, &target, text.as_bytes(), existing.as_ref())
}

fn set_in_document(
    doc: &mut toml_edit::DocumentMut,
    scope: &FractionScope,
    value: f64,
) -> Result<(), String> {
    use toml_edit::Key;
    let (parent, key) = match scope {
        FractionScope::Default => {
            let fraction = child_table(doc.as_item_mut(), "fraction", false)?;
            (fraction, Key::new("default"))
        }
        FractionScope::Gpu(gpu) => {
            let fraction = child_table(doc.as_item_mut(), "fraction", true)?;
            let table = child_table(fraction, "gpu", false)?;
            // GPU keys are written quoted, as the example does: "0" = 0.5.
            let key = Key::parse(&render_quoted(gpu))
                .ok()
                .and_then(|mut keys| (keys.len() == 1).then(|| keys.remove(0)))
                .unwrap_or_else(|| Key::new(gpu.as_str()));
            (table, key)
        }
        FractionScope::User(user) => {
            let fraction = child_table(doc.as_item_mut(), "fraction", true)?;
            (
                child_table(fraction, "user", false)?,
                Key::new(user.as_str()),
            )
        }
    };
    let table = parent
        .as_table_like_mut()
        .ok_or_else(|| "not a table".to_string())?;
    match table.get_mut(key.get()) {
        Some(item) => {
            let Some(old) = item.as_value_mut() else {
                return Err("is a table, not a value".to_string());
            };
            let decor = old.decor().clone();
            let mut new = toml_edit::Value::from(value);
            *new.decor_mut() = decor;
            *old = new;
        }
        None => {
            let item = toml_edit::value(value);
            if let Some(table) = parent.as_table_mut() {
                table.insert_formatted(&key, item);
            } else if let Some(inline) = parent.as_inline_table_mut() {
                inline.insert_formatted(&key, toml_edit::Value::from(value));
            } else {
                return Err("not a table".to_string());
            }
        }
    }
    Ok(())
}

fn render_quoted(key: &str) -> String {
    let rendered = render_key(key);
    if rendered.starts_with('"') {
        rendered
    } else {
        format!("\"{rendered}\"")
    }
}

/// The table `name` under `parent`, created if missing: a `[header]` table under a table
/// (implicit, i.e. without a header of its own, when `implicit`), dotted under a dotted
/// table, inline under an inline table.
fn child_table<'a>(
    parent: &'a mut toml_edit::Item,
    name: &str,
    implicit: bool,
) -> Result<&'a mut toml_edit::Item, String> {
    use toml_edit::{InlineTable, Item, Table, Value};
    let new = match parent {
        Item::Table(table) => {
            let mut child = Table::new();
            child.set_implicit(implicit);
            child.set_dotted(table.is_dotted());
            Item::Table(child)
        }
        Item::Value(Value::InlineTable(_)) => Item::Value(Value::InlineTable(InlineTable::new())),
        _ => return Err("is not a table".to_string()),
    };
    let table = parent.as_table_like_mut().expect("checked above");
    if table.get(name).is_none() {
        table.insert(name, new);
    }
    let child = table.get_mut(name).expect("inserted above");
    if child.is_table_like() {
        Ok(child)
    } else {
        Err(format!("{name} is not a table"))
    }
}

fn write_atomic(
    source: &Source,
    target: &Path,
    bytes: &[u8],
    existing: Option<&CheckedFile>,
) -> Result<(), ConfigError> {
    let hint = if source.origin == Origin::System {
        " (the system file is root's: run as root)"
    } else {
        ""
    };
    let write_error = |error: io::Error| ConfigError::Write {
        path: source.path.clone(),
        hint: if error.kind() == io::ErrorKind::PermissionDenied {
            hint
        } else {
            ""
        },
        source: error,
    };
    let (Some(dir), Some(name)) = (target.parent(), target.file_name()) else {
        return Err(write_error(io::Error::other("not a file path")));
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(write_error)?;
    let dir_fd = open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| write_error(errno.into()))?;
    if source.origin.steers_root() {
        // Never write root's policy into a directory others could swap it in.
        let dir_meta = File::from(dir_fd.try_clone().map_err(write_error)?)
            .metadata()
            .map_err(write_error)?;
        let problems = root_problems(dir_meta.uid(), dir_meta.gid(), dir_meta.mode(), true);
        if !problems.is_empty() {
            let dir = dir.display();
            return Err(ConfigError::Untrusted {
                path: source.path.clone(),
                message: format!(
                    "{}: its directory {dir} is {}: {SUDO_REASON}; fix with: chown root:root {dir} && chmod 755 {dir}",
                    source.path.display(),
                    problems.join(", and ")
                ),
            });
        }
    }
    let mode = existing.map_or(0o644, |file| file.mode & 0o644);
    let (tmp_name, tmp_fd) = create_temp(&dir_fd, name).map_err(write_error)?;
    let result = (|| -> io::Result<()> {
        fchmod(&tmp_fd, Mode::from_bits_truncate(mode)).map_err(io::Error::from)?;
        if geteuid().is_root() {
            let (uid, gid) = match existing {
                Some(file) => (file.uid, file.gid),
                None if source.origin.steers_root() => (0, 0),
                None => (geteuid().as_raw(), nix::unistd::getegid().as_raw()),
            };
            fchown(&tmp_fd, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))
                .map_err(io::Error::from)?;
        }
        let mut file = File::from(tmp_fd.try_clone()?);
        file.write_all(bytes)?;
        fsync(&tmp_fd).map_err(io::Error::from)?;
        renameat(&dir_fd, tmp_name.as_os_str(), &dir_fd, name).map_err(io::Error::from)?;
        // The rename is durable once the directory is.
        fsync(&dir_fd).map_err(io::Error::from)?;
        Ok(())
    })();
    if let Err(error) = result {
        let _ = unlinkat(&dir_fd, tmp_name.as_os_str(), UnlinkatFlags::NoRemoveDir);
        return Err(write_error(error));
    }
    Ok(())
}

/// Creates `.<name>.<pid>.<n>.tmp` next to the target, exclusively.
fn create_temp(dir: &OwnedFd, name: &OsStr) -> io::Result<(OsString, OwnedFd)> {
    let pid = std::process::id();
    for attempt in 0..100u32 {
        let mut tmp = OsString::from(".");
        tmp.push(name);
        tmp.push(format!(".{pid}.{attempt}.tmp"));
        match openat(
            dir.as_fd(),
            tmp.as_os_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
            Mode::from_bits_truncate(0o600),
        ) {
            Ok(fd) => return Ok((tmp, fd)),
            Err(Errno::EEXIST) => continue,
            Err(errno) => return Err(errno.into()),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!("no free temporary name for {}", Path::new(name).display()),
    ))
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
