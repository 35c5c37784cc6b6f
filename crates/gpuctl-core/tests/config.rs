//! The configuration file: parsing, messages, precedence, editing and the trust checks.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use gpuctl_core::config::{
    self, Config, ConfigError, FractionPolicy, FractionScope, Loaded, Origin, Protect, Source,
};

const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../packaging/gpuctl.toml");

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// A config file in a fresh directory, mode 0644, read as `GPUCTL_CONFIG` would be.
struct File {
    _dir: tempfile::TempDir,
    source: Source,
}

impl File {
    fn path(&self) -> &Path {
        &self.source.path
    }
}

fn file(text: &str) -> File {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpuctl.toml");
    fs::write(&path, text).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
    File {
        source: Source::new(Origin::Env, path),
        _dir: dir,
    }
}

/// The error message for `text`, with the file's path replaced by FILE.
fn error_of(text: &str) -> String {
    let file = file(text);
    let error = config::load_file(&file.source).expect_err(text).to_string();
    error.replace(&file.path().display().to_string(), "FILE")
}

fn parsed(text: &str) -> Config {
    let file = file(text);
    config::load_file(&file.source).unwrap().unwrap()
}

#[test]
fn the_example_file_is_valid() {
    let shipped = fs::read_to_string(EXAMPLE).unwrap();
    // As shipped (the package's conffile), every setting is commented out: no policy.
    assert_eq!(
        config::parse(&shipped, Path::new(EXAMPLE)).unwrap(),
        Config::default()
    );
    // Every documented setting is valid once enabled ("#key" and "#[table]" lines).
    let text: String = shipped
        .lines()
        .map(|line| match line.strip_prefix('#') {
            Some(rest)
                if rest
                    .starts_with(|c: char| c.is_ascii_alphanumeric() || c == '[' || c == '"') =>
            {
                rest
            }
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let config = config::parse(&text, Path::new(EXAMPLE)).unwrap();
    assert_eq!(
        config,
        Config {
            nvml_timeout: Some(std::time::Duration::from_secs(10)),
            dev_dir: Some("/dev".into()),
            holders_threshold: Some(1 << 30),
            fraction: FractionPolicy {
                default: Some(0.9),
                gpu: BTreeMap::from([
                    ("0".to_string(), 0.5),
                    ("GPU-6a8295fa-c8f6-96e0-6154-3094e85e05b1".to_string(), 0.75),
                ]),
                user: BTreeMap::from([("alice".to_string(), 0.6)]),
            },
            protect: Protect {
                commands: vec!["my-monitor".to_string()],
                users: vec!["slurm".to_string()],
                owners: vec!["namespace:kube-system".to_string()],
            },
            // The example documents the defaults: enabled, they change nothing.
            watchdog: config::parse("[watchdog]\n", Path::new("defaults"))
                .unwrap()
                .watchdog,
            health: config::HealthPolicy {
                xid_actions: BTreeMap::from([
                    ("109".to_string(), gpuctl_core::health::Action::GpuReset),
                    ("43".to_string(), gpuctl_core::health::Action::None),
                ]),
                unknown_xid_action: Some(gpuctl_core::health::UNKNOWN_XID_DEFAULT),
            },
            // The defaults, with a command and an exempt owner as the example names them.
            idle: config::IdlePolicy {
                notify_command: vec!["/usr/local/bin/tell-user".to_string()],
                exempt_owners: vec!["unit:vllm.service".to_string()],
                ..config::IdlePolicy::default()
            },
            fleet: config::FleetConfig {
                prometheus: Some("http://prometheus.example:9090".into()),
                bearer_token_file: Some("/etc/gpuctl/prometheus-token".into()),
                ca_file: Some("/etc/ssl/certs/site-ca.pem".into()),
                exec: ["ssh", "-oBatchMode=yes", "{node}", "{command}"]
                    .map(String::from)
                    .to_vec(),
                concurrency: Some(8),
            },
            kubernetes: config::Kubernetes {
                runtime_socket: Some("/run/containerd/containerd.sock".into()),
                runtime_timeout: Some(std::time::Duration::from_secs(1)),
            },
        }
    );
    // And through the file-reading path, with its checks.
    assert_eq!(parsed(&text), config);
}

#[test]
fn a_named_file_that_is_missing_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    for origin in [Origin::Env, Origin::Explicit] {
        let path = dir.path().join("gpuctl.tmol");
        let error = config::load_sources(&Source::new(origin, &path), None).unwrap_err();
        assert!(matches!(error, ConfigError::Missing { .. }), "{error:?}");
        let none = Source::new(origin, config::NO_FILE);
        assert_eq!(
            config::load_sources(&none, None).unwrap(),
            Loaded::default()
        );
        assert_eq!(
            error.to_string(),
            format!("{}: no such file (named by {origin})", path.display())
        );
    }
}

#[test]
fn missing_and_empty_files_are_the_empty_policy() {
    let dir = tempfile::tempdir().unwrap();
    let missing = Source::new(Origin::System, dir.path().join("nope/gpuctl.toml"));
    assert_eq!(config::load_file(&missing).unwrap(), None);
    let loaded = config::load_sources(&missing, None).unwrap();
    assert_eq!(loaded, Loaded::default());
    assert_eq!(config::fraction_for(&loaded, 0, None, Some("alice")), None);
    assert_eq!(parsed(""), Config::default());
    assert_eq!(parsed("# only a comment\n"), Config::default());
    // An integer is a share too.
    assert_eq!(
        parsed("[fraction]\ndefault = 1\n").fraction.default,
        Some(1.0)
    );
}

#[test]
fn unknown_keys_name_file_line_and_key() {
    assert_eq!(
        error_of("# a comment\n\nfractoin = 0.5\n"),
        "FILE: line 3: unknown key 'fractoin' (known keys: nvml_timeout, dev_dir, holders_threshold, fraction, protect, watchdog, health, idle, fleet, kubernetes)"
    );
    assert_eq!(
        error_of("[fraction]\ndefault = 0.5\ndefualt = 0.5\n"),
        "FILE: line 3: unknown key 'fraction.defualt' (known keys in [fraction]: default, gpu, user)"
    );
    assert_eq!(
        error_of("fraction = { defualt = 0.5 }\n"),
        "FILE: line 1: unknown key 'fraction.defualt' (known keys in [fraction]: default, gpu, user)"
    );
    assert_eq!(
        error_of("[protect]\ncommand = [\"x\"]\n"),
        "FILE: line 2: unknown key 'protect.command' (known keys in [protect]: commands, users, owners)"
    );
    assert_eq!(
        error_of("[fractions.user]\nalice = 0.5\n"),
        "FILE: line 1: unknown key 'fractions' (known keys: nvml_timeout, dev_dir, holders_threshold, fraction, protect, watchdog, health, idle, fleet, kubernetes)"
    );
    // [fraction.user] is keyed by user names: a key that cannot be one, a table under a
    // user, or the [protect] header forgotten.
    assert_eq!(
        error_of("[fraction.user]\nalice = 0.5\n\"bob smith\" = 0.5\n"),
        "FILE: line 3: fraction.user.\"bob smith\": not a user name"
    );
    assert_eq!(
        error_of("[fraction.user]\nalice = 0.5\n\n[fraction.user.bob]\ngpu = 0.5\n"),
        "FILE: line 4: fraction.user.bob: expected a share in (0, 1], found a table"
    );
    assert_eq!(
        error_of("[fraction.user]\nalice = 0.5\ncommands = [\"my-monitor\"]\n"),
        "FILE: line 3: fraction.user.commands: expected a share in (0, 1], found an array"
    );
    // [fraction.gpu] is keyed by index or UUID.
    assert_eq!(
        error_of("[fraction.gpu]\ngpu0 = 0.5\n"),
        "FILE: line 2: fraction.gpu.gpu0: not a GPU: name one by index, like \"0\", or by UUID, \
         like \"GPU-6a8295fa-c8f6-96e0-6154-3094e85e05b1\" (see nvidia-smi -L)"
    );
}

#[test]
fn bad_values_name_file_line_and_key() {
    let cases = [
        (
            "default = 1.5",
            "fraction.default: 1.5 is out of range: give a share in (0, 1]",
        ),
        (
            "default = 0",
            "fraction.default: 0 is out of range: give a share in (0, 1]",
        ),
        (
            "default = -0.1",
            "fraction.default: -0.1 is out of range: give a share in (0, 1]",
        ),
        (
            "default = inf",
            "fraction.default: inf is out of range: give a share in (0, 1]",
        ),
        (
            "default = nan",
            "fraction.default: nan is not a number: give a share in (0, 1]",
        ),
        (
            "default = \"abc\"",
            "fraction.default: expected a share in (0, 1], found the string \"abc\"",
        ),
        (
            "default = \"80%\"",
            "fraction.default: expected a share in (0, 1], found the string \"80%\"",
        ),
        (
            "default = true",
            "fraction.default: expected a share in (0, 1], found true",
        ),
    ];
    for (line, message) in cases {
        assert_eq!(
            error_of(&format!("# policy\n[fraction]\n{line}\n")),
            format!("FILE: line 3: {message}")
        );
    }
    assert_eq!(
        error_of("[fraction.user]\nbob = 0.5\nalice = 1.5\n"),
        "FILE: line 3: fraction.user.alice: 1.5 is out of range: give a share in (0, 1]"
    );
    assert_eq!(
        error_of("[fraction.gpu]\n\"0\" = 0\n"),
        "FILE: line 2: fraction.gpu.\"0\": 0 is out of range: give a share in (0, 1]"
    );
    assert_eq!(
        error_of("[protect]\ncommands = [\"a\", \"\"]\n"),
        "FILE: line 2: protect.commands[1]: empty name: give a non-empty string"
    );
    assert_eq!(
        error_of("[protect]\nusers = [\"a\", 3]\n"),
        "FILE: line 2: protect.users[1]: expected a name (a non-empty string), found 3"
    );
    assert_eq!(
        error_of("[protect]\nusers = \"slurm\"\n"),
        "FILE: line 2: protect.users: expected an array, found the string \"slurm\""
    );
    assert_eq!(
        error_of("[protect]\nowners = [\"slurm:12\"]\n"),
        "FILE: line 2: protect.owners: 'slurm:12' is not a pod: give pod:NAMESPACE/NAME, namespace:NAME or pod:UID"
    );
    assert_eq!(
        error_of("[protect]\nowners = [\"namespace:ML\"]\n"),
        "FILE: line 2: protect.owners: 'namespace:ML': a namespace is lowercase letters, digits and '-', with * and ? as globs"
    );
    assert_eq!(
        error_of("fraction = 0.5\n"),
        "FILE: line 1: fraction: expected a table, found 0.5"
    );
    // Syntax errors carry the line too.
    assert_eq!(
        error_of("[fraction]\ndefault = abc\n"),
        "FILE: line 2: string values must be quoted, expected literal string"
    );
    assert_eq!(
        error_of("[fraction]\ndefault = 0.5\ndefault = 0.6\n"),
        "FILE: line 3: duplicate key default"
    );
}

fn loaded(system: Option<&str>, user: Option<&str>) -> Loaded {
    let config = |text: &str| config::parse(text, Path::new("test")).unwrap();
    Loaded {
        system: system.map(|text| {
            (
                Source::new(Origin::System, "/etc/gpuctl/gpuctl.toml"),
                config(text),
            )
        }),
        user: user.map(|text| {
            (
                Source::new(Origin::User, "/home/alice/.config/gpuctl/gpuctl.toml"),
                config(text),
            )
        }),
    }
}

const UUID0: &str = "GPU-6a8295fa-c8f6-96e0-6154-3094e85e05b1";

#[test]
fn precedence_within_a_file() {
    let system = loaded(
        Some(
            "[fraction]\ndefault = 0.9\n[fraction.gpu]\n\"0\" = 0.5\n\"GPU-AAAA\" = 0.4\n\
             \"GPU-6a8295fa-c8f6-96e0-6154-3094e85e05b1\" = 0.75\n[fraction.user]\nalice = 0.6\n",
        ),
        None,
    );
    let share = |index, uuid, user| {
        config::fraction_for(&system, index, uuid, user)
            .map(|found| (found.value, found.describe()))
    };
    let at = |key: &str| format!("system /etc/gpuctl/gpuctl.toml: {key}");
    // GPU by index beats the user entry.
    assert_eq!(
        share(0, None, Some("alice")),
        Some((0.5, at("fraction.gpu.\"0\"")))
    );
    // GPU by UUID (any case) beats the index entry and the user entry.
    assert_eq!(
        share(0, Some(UUID0), Some("alice")),
        Some((0.75, at(&format!("fraction.gpu.{UUID0}"))))
    );
    assert_eq!(
        share(3, Some("gpu-aaaa"), None),
        Some((0.4, at("fraction.gpu.GPU-AAAA")))
    );
    // A user entry beats the default.
    assert_eq!(
        share(1, Some("GPU-other"), Some("alice")),
        Some((0.6, at("fraction.user.alice")))
    );
    // The default for everyone else.
    assert_eq!(
        share(1, None, Some("bob")),
        Some((0.9, at("fraction.default")))
    );
    assert_eq!(share(1, None, None), Some((0.9, at("fraction.default"))));
    assert_eq!(
        config::fraction_for(&loaded(None, None), 0, None, None),
        None
    );
}

#[test]
fn the_user_file_may_only_lower_the_system_value() {
    let system = "[fraction]\ndefault = 0.9\n[fraction.gpu]\n\"0\" = 0.5\n";
    let user_at = |key: &str| format!("user /home/alice/.config/gpuctl/gpuctl.toml: {key}");
    let sys_at = |key: &str| format!("system /etc/gpuctl/gpuctl.toml: {key}");

    // Lowering: the user file's share is taken.
    let both = loaded(Some(system), Some("[fraction]\ndefault = 0.7\n"));
    let found = config::fraction_for(&both, 1, None, Some("alice")).unwrap();
    assert_eq!(
        (found.value, found.describe(), found.note),
        (0.7, user_at("fraction.default"), None)
    );

    // Raising: ignored, and said so.
    let found = config::fraction_for(&both, 0, None, Some("alice")).unwrap();
    assert_eq!(found.value, 0.5);
    assert_eq!(found.describe(), sys_at("fraction.gpu.\"0\""));
    assert_eq!(
        found.note.as_deref(),
        Some(
            "user /home/alice/.config/gpuctl/gpuctl.toml: fraction.default = 0.7 ignored: \
             a user file may only lower the system's 0.5"
        )
    );
    assert_eq!(
        found.to_string(),
        "0.5 (system /etc/gpuctl/gpuctl.toml: fraction.gpu.\"0\"; user \
         /home/alice/.config/gpuctl/gpuctl.toml: fraction.default = 0.7 ignored: a user file \
         may only lower the system's 0.5)"
    );

    // The user file's own precedence applies before the comparison.
    let both = loaded(
        Some(system),
        Some("[fraction]\ndefault = 0.95\n[fraction.user]\nalice = 0.3\n"),
    );
    let found = config::fraction_for(&both, 0, None, Some("alice")).unwrap();
    assert_eq!(
        (found.value, found.describe()),
        (0.3, user_at("fraction.user.alice"))
    );

    // Where the system sets nothing, the user file may set a share.
    let user_only = loaded(
        Some("[protect]\nusers = [\"slurm\"]\n"),
        Some("[fraction]\ndefault = 0.8\n"),
    );
    let found = config::fraction_for(&user_only, 0, None, None).unwrap();
    assert_eq!(
        (found.value, found.describe()),
        (0.8, user_at("fraction.default"))
    );

    // Protect lists add up.
    let both = loaded(
        Some("[protect]\ncommands = [\"a\"]\nusers = [\"slurm\"]\n"),
        Some("[protect]\ncommands = [\"b\", \"a\"]\nowners = [\"pod:ml/trainer-*\"]\n"),
    );
    assert_eq!(
        both.protect(),
        Protect {
            commands: vec!["a".into(), "b".into()],
            users: vec!["slurm".into()],
            owners: vec!["pod:ml/trainer-*".into()],
        }
    );
}

const EDITABLE: &str = "\
# Site policy. Ask #gpu-admins before changing.

[fraction]
# Most jobs fit in 90%.
default = 0.9   # was 0.95 until March

[fraction.gpu]
\"0\" = 0.5 # the shared card

[protect]
users = [ \"slurm\" ]   # keep
";

fn editable() -> File {
    file(EDITABLE)
}

#[test]
fn set_fraction_changes_only_its_line() {
    let file = editable();
    config::set_fraction(&file.source, FractionScope::Default, 0.8).unwrap();
    assert_eq!(
        fs::read_to_string(file.path()).unwrap(),
        EDITABLE.replace("default = 0.9   #", "default = 0.8   #")
    );
    config::set_fraction(&file.source, FractionScope::Gpu("0".into()), 0.25).unwrap();
    assert_eq!(
        fs::read_to_string(file.path()).unwrap(),
        EDITABLE
            .replace("default = 0.9   #", "default = 0.8   #")
            .replace("\"0\" = 0.5 #", "\"0\" = 0.25 #")
    );
    let meta = fs::metadata(file.path()).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o644);
    // What was written loads.
    let config = config::load_file(&file.source).unwrap().unwrap();
    assert_eq!(config.fraction.default, Some(0.8));
    assert_eq!(config.fraction.gpu["0"], 0.25);
    // No temporary file is left behind.
    let names: Vec<_> = fs::read_dir(file.path().parent().unwrap())
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert_eq!(names, ["gpuctl.toml"]);
}

#[test]
fn set_fraction_adds_keys_and_tables() {
    let file = editable();
    config::set_fraction(&file.source, FractionScope::Gpu(UUID0.into()), 0.75).unwrap();
    config::set_fraction(&file.source, FractionScope::User("alice".into()), 0.6).unwrap();
    // The new table goes next to its siblings, not to the end of the file.
    assert_eq!(
        fs::read_to_string(file.path()).unwrap(),
        EDITABLE.replace(
            "\"0\" = 0.5 # the shared card\n",
            &format!(
                "\"0\" = 0.5 # the shared card\n\"{UUID0}\" = 0.75\n\n[fraction.user]\nalice = 0.6\n"
            )
        )
    );

    // A file without [fraction] gets one.
    let file = file_with("[protect]\nusers = [\"slurm\"]\n");
    config::set_fraction(&file.source, FractionScope::Default, 0.5).unwrap();
    assert_eq!(
        fs::read_to_string(file.path()).unwrap(),
        "[protect]\nusers = [\"slurm\"]\n\n[fraction]\ndefault = 0.5\n"
    );
    let file = file_with("[protect]\nusers = [\"slurm\"]\n");
    config::set_fraction(&file.source, FractionScope::User("bob".into()), 0.5).unwrap();
    assert_eq!(
        fs::read_to_string(file.path()).unwrap(),
        "[protect]\nusers = [\"slurm\"]\n\n[fraction.user]\nbob = 0.5\n"
    );
    // Inline tables stay inline.
    let file = file_with("fraction = { default = 0.9 }\n");
    config::set_fraction(&file.source, FractionScope::Default, 0.5).unwrap();
    assert_eq!(
        fs::read_to_string(file.path()).unwrap(),
        "fraction = { default = 0.5 }\n"
    );
}

fn file_with(text: &str) -> File {
    file(text)
}

#[test]
fn set_fraction_creates_a_missing_file_and_directory() {
    let dir = tempfile::tempdir().unwrap();
    let source = Source::new(Origin::Env, dir.path().join("etc/gpuctl/gpuctl.toml"));
    config::set_fraction(&source, FractionScope::Gpu("1".into()), 0.5).unwrap();
    assert_eq!(
        fs::read_to_string(&source.path).unwrap(),
        "# gpuctl configuration. gpuctl keeps comments and layout when it edits this file.\n\
         \n[fraction.gpu]\n\"1\" = 0.5\n"
    );
    assert_eq!(fs::metadata(&source.path).unwrap().mode() & 0o7777, 0o644);
    let parent = source.path.parent().unwrap();
    assert_eq!(
        fs::metadata(parent).unwrap().mode() & 0o7777,
        0o755 & !umask()
    );
    assert_eq!(
        config::load_file(&source).unwrap().unwrap().fraction.gpu,
        BTreeMap::from([("1".to_string(), 0.5)])
    );
}

fn umask() -> u32 {
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
    nix::sys::stat::umask(old);
    old.bits()
}

#[test]
fn set_fraction_rejects_bad_values_without_touching_the_file() {
    let file = editable();
    let before = fs::metadata(file.path()).unwrap();
    let cases = [
        (
            FractionScope::Default,
            1.5,
            "fraction.default: 1.5 is out of range: give a share in (0, 1]",
        ),
        (
            FractionScope::Default,
            0.0,
            "fraction.default: 0 is out of range: give a share in (0, 1]",
        ),
        (
            FractionScope::User("alice".into()),
            -0.1,
            "fraction.user.alice: -0.1 is out of range: give a share in (0, 1]",
        ),
        (
            FractionScope::Gpu("0".into()),
            f64::NAN,
            "fraction.gpu.\"0\": nan is not a number: give a share in (0, 1]",
        ),
        (
            FractionScope::Default,
            f64::INFINITY,
            "fraction.default: inf is out of range: give a share in (0, 1]",
        ),
        (
            FractionScope::Gpu("gpu0".into()),
            0.5,
            "fraction.gpu.gpu0: not a GPU: name one by index, like \"0\", or by UUID, like \
             \"GPU-6a8295fa-c8f6-96e0-6154-3094e85e05b1\" (see nvidia-smi -L)",
        ),
        (
            FractionScope::User("a b".into()),
            0.5,
            "fraction.user.\"a b\": not a user name",
        ),
    ];
    for (scope, value, message) in cases {
        let error = config::set_fraction(&file.source, scope, value).unwrap_err();
        assert!(matches!(error, ConfigError::Value(_)), "{error:?}");
        assert_eq!(error.to_string(), message);
    }
    // A file that does not load is not edited either.
    let broken = file_with("[fraction]\ndefualt = 0.5\n");
    let error = config::set_fraction(&broken.source, FractionScope::Default, 0.5).unwrap_err();
    assert!(error.to_string().ends_with(
        "line 2: unknown key 'fraction.defualt' (known keys in [fraction]: default, gpu, user)"
    ));
    assert_eq!(
        fs::read_to_string(broken.path()).unwrap(),
        "[fraction]\ndefualt = 0.5\n"
    );

    let after = fs::metadata(file.path()).unwrap();
    assert_eq!(fs::read_to_string(file.path()).unwrap(), EDITABLE);
    assert_eq!(
        (after.ino(), after.mtime(), after.mtime_nsec()),
        (before.ino(), before.mtime(), before.mtime_nsec())
    );
}

#[test]
fn parse_fraction_for_command_lines() {
    assert_eq!(config::parse_fraction("0.8"), Ok(0.8));
    assert_eq!(config::parse_fraction("80%"), Ok(0.8));
    assert_eq!(config::parse_fraction("1"), Ok(1.0));
    assert_eq!(
        config::parse_fraction("abc"),
        Err(
            "'abc' is not a share: give a share in (0, 1], like 0.8, or a percentage, like 80%"
                .into()
        )
    );
    assert_eq!(
        config::parse_fraction("1.5"),
        Err(
            "'1.5' is out of range: give a share in (0, 1], like 0.8, or a percentage, like 80%"
                .into()
        )
    );
}

// ---------------------------------------------------------------------------------------
// Trust: these need root (to own files as root and give them away); elsewhere they fail
// saying so, never pass unchecked.

fn skip_unless_root(test: &str) -> bool {
    assert!(
        is_root(),
        "cannot run {test} here: needs root (run the tests as root to check the sudo-like file checks)"
    );
    false
}

const POLICY: &str = "[fraction]\ndefault = 0.5\n";

fn refused(file: &File) -> String {
    match config::load_file(&file.source) {
        Err(error @ ConfigError::Untrusted { .. }) => error.to_string(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn root_owned_0644_is_accepted() {
    if skip_unless_root("root_owned_0644_is_accepted") {
        return;
    }
    let file = file(POLICY);
    assert_eq!(
        config::load_file(&file.source)
            .unwrap()
            .unwrap()
            .fraction
            .default,
        Some(0.5)
    );
    // Group-writable is fine when the group is root's.
    fs::set_permissions(file.path(), fs::Permissions::from_mode(0o664)).unwrap();
    nix::unistd::chown(file.path(), Some(0.into()), Some(0.into())).unwrap();
    assert!(config::load_file(&file.source).unwrap().is_some());
    // So is a sticky directory such as /tmp: only root may replace root's file there.
    fs::set_permissions(
        file.path().parent().unwrap(),
        fs::Permissions::from_mode(0o1777),
    )
    .unwrap();
    assert!(config::load_file(&file.source).unwrap().is_some());
}

#[test]
fn world_writable_is_refused() {
    if skip_unless_root("world_writable_is_refused") {
        return;
    }
    let file = file(POLICY);
    fs::set_permissions(file.path(), fs::Permissions::from_mode(0o666)).unwrap();
    let path = file.path().display();
    assert_eq!(
        refused(&file),
        format!(
            "{path} is writable by everyone: refusing it, as sudo refuses such a sudoers (it steers \
             a root daemon that kills processes); fix with: chown root:root {path} && chmod 644 {path}"
        )
    );
}

#[test]
fn group_writable_with_a_non_root_group_is_refused() {
    if skip_unless_root("group_writable_with_a_non_root_group_is_refused") {
        return;
    }
    let file = file(POLICY);
    let gid = 4242;
    nix::unistd::chown(file.path(), None, Some(gid.into())).unwrap();
    fs::set_permissions(file.path(), fs::Permissions::from_mode(0o664)).unwrap();
    let group = match nix::unistd::Group::from_gid(gid.into()) {
        Ok(Some(group)) => format!("'{}'", group.name),
        _ => format!("gid {gid}"),
    };
    let path = file.path().display();
    assert_eq!(
        refused(&file),
        format!(
            "{path} is writable by group {group}: refusing it, as sudo refuses such a sudoers (it \
             steers a root daemon that kills processes); fix with: chown root:root {path} && chmod 644 {path}"
        )
    );
}

#[test]
fn not_owned_by_root_is_refused() {
    if skip_unless_root("not_owned_by_root_is_refused") {
        return;
    }
    let file = file(POLICY);
    nix::unistd::chown(file.path(), Some(4243.into()), None).unwrap();
    fs::set_permissions(file.path(), fs::Permissions::from_mode(0o646)).unwrap();
    let owner = match nix::unistd::User::from_uid(4243.into()) {
        Ok(Some(user)) => format!("uid 4243 ({})", user.name),
        _ => "uid 4243".to_string(),
    };
    let message = refused(&file);
    let path = file.path().display();
    assert!(
        message.starts_with(&format!(
            "{path} is owned by {owner}, not root, and writable by everyone: refusing it, as sudo refuses"
        )),
        "{message}"
    );
}

#[test]
fn a_writable_directory_is_refused() {
    if skip_unless_root("a_writable_directory_is_refused") {
        return;
    }
    let file = file(POLICY);
    let dir = file.path().parent().unwrap().to_path_buf();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
    let (path, dir) = (file.path().display(), dir.display());
    assert_eq!(
        refused(&file),
        format!(
            "{path}: its directory {dir} is writable by everyone: refusing it, as sudo refuses such \
             a sudoers (it steers a root daemon that kills processes); fix with: chown root:root {dir} \
             && chmod 755 {dir}"
        )
    );
    // Nor is root's policy written there.
    let error = config::set_fraction(&file.source, FractionScope::Default, 0.4).unwrap_err();
    assert!(matches!(error, ConfigError::Untrusted { .. }), "{error}");
    assert_eq!(fs::read_to_string(file.path()).unwrap(), POLICY);
}

#[test]
fn the_checks_follow_symbolic_links_to_the_real_file() {
    if skip_unless_root("the_checks_follow_symbolic_links_to_the_real_file") {
        return;
    }
    // A link in a safe directory to a file in an unsafe one is judged by the real file's
    // directory; set_fraction edits the target and keeps the link.
    let real = file(POLICY);
    let links = tempfile::tempdir().unwrap();
    let link: PathBuf = links.path().join("gpuctl.toml");
    std::os::unix::fs::symlink(real.path(), &link).unwrap();
    let source = Source::new(Origin::Env, &link);
    config::set_fraction(&source, FractionScope::Default, 0.4).unwrap();
    assert!(
        fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(
        fs::read_to_string(real.path()).unwrap(),
        "[fraction]\ndefault = 0.4\n"
    );
    fs::set_permissions(
        real.path().parent().unwrap(),
        fs::Permissions::from_mode(0o757),
    )
    .unwrap();
    assert!(matches!(
        config::load_file(&source),
        Err(ConfigError::Untrusted { .. })
    ));
}

#[test]
fn a_user_file_writable_by_others_is_refused() {
    // Runs as any user: a user file must be its reader's (or root's), like authorized_keys.
    let file = file(POLICY);
    let source = Source::new(Origin::User, file.path());
    assert!(config::load_file(&source).unwrap().is_some());
    fs::set_permissions(file.path(), fs::Permissions::from_mode(0o666)).unwrap();
    let path = file.path().display();
    assert_eq!(
        config::load_file(&source).unwrap_err().to_string(),
        format!(
            "{path} is writable by everyone: refusing it, as ssh refuses such an authorized_keys \
             (others could steer what gpuctl does as you); fix with: chmod 644 {path}"
        )
    );
}

#[test]
fn watchdog_table() {
    use gpuctl_core::config::{ReclaimKind, Watchdog, WatchdogMode};
    use std::time::Duration;
    let defaults = config::parse("", Path::new("FILE")).unwrap().watchdog;
    assert_eq!(defaults, Watchdog::default());
    assert_eq!(defaults.interval, Duration::from_secs(5));
    assert_eq!(defaults.grace, Duration::from_secs(60));
    assert_eq!(defaults.term_timeout, Duration::from_secs(10));
    assert_eq!(defaults.mode, WatchdogMode::Report);
    assert_eq!(
        defaults.reclaim,
        vec![ReclaimKind::Orphaned, ReclaimKind::Zombie]
    );
    assert!(!defaults.enforce_fraction);
    assert_eq!(
        defaults.metrics_path(),
        Some(Path::new("/var/lib/prometheus/node-exporter/gpuctl.prom"))
    );
    assert_eq!(defaults.state_path(), Some(Path::new("/var/lib/gpuctl")));

    let text = "[watchdog]\ninterval = \"500ms\"\ngrace = 90\nterm_timeout = \"1m\"\nmode = \"reclaim\"\nreclaim = [\"stopped\"]\nenforce_fraction = true\nprotect_users = [\"bob\"]\nprotect_commands = [\"dcgm\"]\nmetrics_file = \"\"\nstate_dir = \"/tmp/x\"\n";
    let w = config::parse(text, Path::new("FILE")).unwrap().watchdog;
    assert_eq!(w.interval, Duration::from_millis(500));
    assert_eq!(w.grace, Duration::from_secs(90));
    assert_eq!(w.term_timeout, Duration::from_secs(60));
    assert_eq!(w.mode, WatchdogMode::Reclaim);
    assert_eq!(w.reclaim, vec![ReclaimKind::Stopped]);
    assert!(w.enforce_fraction);
    assert_eq!(w.protect_users, vec!["bob".to_string()]);
    assert_eq!(w.protect_commands, vec!["dcgm".to_string()]);
    assert_eq!(w.metrics_path(), None);
    assert_eq!(w.state_path(), Some(Path::new("/tmp/x")));

    let error = |text: &str| {
        config::parse(text, Path::new("FILE"))
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        error("[watchdog]\nintervall = \"5s\""),
        "FILE: line 2: unknown key 'watchdog.intervall' (known keys in [watchdog]: interval, grace, term_timeout, mode, reclaim, enforce_fraction, protect_users, protect_commands, metrics_file, state_dir, stuck_after, stuck_util_pct, stuck_power_fraction, metrics_max_owners, kernel_log)"
    );
    // The kernel log: /dev/kmsg by default, a file where named, off when empty.
    assert_eq!(defaults.kernel_log(), Some("/dev/kmsg".into()));
    let kernel_log = |text: &str| {
        config::parse(&format!("[watchdog]\n{text}\n"), Path::new("FILE"))
            .unwrap()
            .watchdog
            .kernel_log()
    };
    assert_eq!(
        kernel_log("kernel_log = \"/var/log/kern.kmsg\""),
        Some("/var/log/kern.kmsg".into())
    );
    assert_eq!(kernel_log("kernel_log = \"\""), None);
    // The stuck-GPU check: defaults, values, and bad values naming the key.
    assert_eq!(defaults.stuck_after, Duration::from_secs(600));
    assert_eq!(
        (defaults.stuck_util_pct, defaults.stuck_power_fraction),
        (95, 0.4)
    );
    let stuck = config::parse(
        "[watchdog]\nstuck_after = \"0s\"\nstuck_util_pct = 90\nstuck_power_fraction = 0.25\n",
        Path::new("FILE"),
    )
    .unwrap()
    .watchdog;
    assert_eq!(
        (
            stuck.stuck_after,
            stuck.stuck_util_pct,
            stuck.stuck_power_fraction
        ),
        (Duration::ZERO, 90, 0.25)
    );
    let bad = error("[watchdog]\nstuck_util_pct = 101");
    assert!(
        bad.contains("watchdog.stuck_util_pct") && bad.contains("0 to 100"),
        "{bad}"
    );
    let bad = error("[watchdog]\nstuck_power_fraction = 1.5");
    assert!(bad.contains("watchdog.stuck_power_fraction"), "{bad}");
    let bad = error("[watchdog]\ngrace = \"soon\"");
    assert!(
        bad.starts_with("FILE: line 2: watchdog.grace: 'soon' is not a duration"),
        "{bad}"
    );
    let bad = error("[watchdog]\ninterval = \"0s\"");
    assert!(bad.contains("watchdog.interval: 0s is too short"), "{bad}");
    let bad = error("[watchdog]\nmode = \"always\"");
    assert!(bad.starts_with("FILE: line 2: watchdog.mode: "), "{bad}");
    let bad = error("[watchdog]\nreclaim = [\"orphaned\", \"all\"]");
    assert!(
        bad.starts_with("FILE: line 2: watchdog.reclaim[1]: "),
        "{bad}"
    );
}
