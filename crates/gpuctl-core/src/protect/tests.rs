//! Protection by identity, against real processes started under protected names.

use super::*;

fn claimant<'a>(pid: u32, comm: &'a str, argv0: &'a str) -> Claimant<'a> {
    Claimant {
        pid,
        uid: Some(nix::unistd::geteuid().as_raw()),
        comm: Some(comm),
        argv0: Some(argv0),
    }
}

/// `/usr/bin/sleep` (or `/bin/sleep`) started as `argv0`, once it runs that binary.
fn system_sleep(argv0: &str) -> std::process::Child {
    system_sleep_with(argv0, |_| {})
}

/// [`system_sleep`], with `configure` applied to the command first.
fn system_sleep_with(
    argv0: &str,
    configure: impl FnOnce(&mut std::process::Command),
) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let sleep = ["/usr/bin/sleep", "/bin/sleep"]
        .into_iter()
        .find(|path| Path::new(path).exists())
        .expect("no sleep binary in /usr/bin or /bin");
    let mut command = std::process::Command::new(sleep);
    // ld.so complains on stderr about the bad LD_* values some tests give on purpose:
    // not a line for a passing run's log.
    command
        .arg0(argv0)
        .arg("30")
        .stderr(std::process::Stdio::null());
    configure(&mut command);
    let child = command.spawn().unwrap();
    let pid = child.id();
    // Until exec, its exe is this test's.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while fs::read_link(format!("/proc/{pid}/exe"))
        .is_ok_and(|exe| !exe.to_string_lossy().contains("sleep"))
    {
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // exec sets the executable before the new environment: until then environ is empty.
    while fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| env.is_empty()) {
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    child
}

#[test]
fn names_are_claimed_by_comm_cut_to_15_or_by_argv0() {
    let protection = Protection::built_in();
    let claimed = |comm, argv0| {
        protection
            .claimed(&claimant(1, comm, argv0))
            .map(|p| p.name.clone())
    };
    assert_eq!(
        claimed("nvidia-persiste", "x").as_deref(),
        Some("nvidia-persistenced")
    );
    assert_eq!(claimed("python3", "Xorg").as_deref(), Some("Xorg"));
    assert_eq!(claimed("python3", "train.py"), None);
    assert_eq!(
        claimed("nvidia-persist", "x"),
        None,
        "a short comm is whole"
    );
    // The MPS server and its daemon share their cut command name: argv[0] tells which.
    for program in ["nvidia-cuda-mps-server", "nvidia-cuda-mps-control"] {
        assert_eq!(
            claimed("nvidia-cuda-mps", program).as_deref(),
            Some(program)
        );
    }
    assert!(claimed("nvidia-cuda-mps", "x").is_some());
}

/// The MPS server runs as its clients' user, and a user may run a control daemon of their
/// own: the genuine program is spared whoever runs it.
#[test]
fn the_mps_server_and_daemon_are_spared_as_any_user() {
    use std::os::unix::process::CommandExt;
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root to run a process as another user");
        return;
    }
    let any = Protection::default().with(&[], &[]);
    let any = Protection {
        programs: vec![Program {
            name: "sleep".into(),
            users: vec![ANY_USER.into()],
            configured: false,
        }],
        ..any
    };
    let judged = judged_sleep(&any, |command| {
        command.uid(65534).gid(65534);
    });
    assert_eq!(judged, Claim::Genuine("sleep".into()));
    let built_in = Protection::built_in();
    for name in ["nvidia-cuda-mps-server", "nvidia-cuda-mps-control"] {
        let program = built_in.programs.iter().find(|p| p.name == name).unwrap();
        assert_eq!(program.users, [ANY_USER], "{name}");
    }
}

#[test]
fn this_test_binary_is_no_protected_program_whatever_it_claims() {
    let protection = Protection::built_in();
    let me = std::process::id();
    match protection.judge(&claimant(me, "nvidia-persiste", "nvidia-persistenced")) {
        Claim::Impostor { name, why } => {
            assert_eq!(name, "nvidia-persistenced");
            assert!(!why.is_empty());
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        protection.judge(&claimant(me, "cargo", "cargo")),
        Claim::None
    );
}

/// A system binary run under a protected name is still not that program: being in a
/// root-owned directory is not enough, the file must be the program.
#[test]
fn a_system_binary_renamed_is_an_impostor() {
    let mut child = system_sleep("nvidia-persistenced");
    let pid = child.id();
    let judged = Protection::built_in().judge(&claimant(pid, "sleep", "nvidia-persistenced"));
    child.kill().unwrap();
    child.wait().unwrap();
    match judged {
        Claim::Impostor { why, .. } => assert!(why.contains("sleep"), "{why}"),
        other => panic!("{other:?}"),
    }
}

/// The user running the tests, by name, where it is not root: configured commands run
/// as root or as a configured user.
fn me() -> Vec<String> {
    let uid = nix::unistd::geteuid();
    match nix::unistd::User::from_uid(uid) {
        Ok(Some(user)) if !uid.is_root() => vec![user.name],
        _ => Vec::new(),
    }
}

fn judged_sleep(
    protection: &Protection,
    configure: impl FnOnce(&mut std::process::Command),
) -> Claim {
    let mut child = system_sleep_with("sleep", configure);
    let judged = protection.judge(&claimant(child.id(), "sleep", "sleep"));
    child.kill().unwrap();
    child.wait().unwrap();
    judged
}

#[test]
fn a_genuine_system_binary_under_its_own_name_is_protected() {
    let mut child = system_sleep("sleep");
    let exe = fs::metadata(format!("/proc/{}/exe", child.id())).unwrap();
    assert!(
        trusted(&exe).is_ok(),
        "the system's sleep is not root's: this machine's system directories are not"
    );
    let pid = child.id();
    let protection = Protection::default().with(&["sleep".to_string()], &me());
    let judged = protection.judge(&claimant(pid, "sleep", "sleep"));
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(judged, Claim::Genuine("sleep".into()));
}

/// The genuine program run by a user who is not one of its own: that user's process.
#[test]
fn a_genuine_program_run_by_another_user_is_not_protected() {
    use std::os::unix::process::CommandExt;
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root to run a process as another user");
        return;
    }
    let protection = Protection::default().with(&["sleep".to_string()], &[]);
    let refused = judged_sleep(&protection, |command| {
        command.uid(65534).gid(65534);
    });
    assert!(
        matches!(&refused, Claim::Impostor { why, .. } if why.contains("uid 65534, not as root")),
        "{refused:?}"
    );
    // Its own service user may run it.
    let nobody = nix::unistd::User::from_uid(65534.into()).unwrap();
    if let Some(nobody) = nobody {
        let protection = Protection::default().with(&["sleep".to_string()], &[nobody.name]);
        let judged = judged_sleep(&protection, |command| {
            command.uid(65534).gid(65534);
        });
        assert_eq!(judged, Claim::Genuine("sleep".into()));
    }
}

#[test]
fn built_in_programs_run_as_root_or_their_service_users() {
    let protection = Protection::built_in();
    let users = |name: &str| {
        protection
            .programs
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.users.clone())
            .unwrap()
    };
    assert!(users("nvidia-smi").is_empty());
    assert!(users("dcgm-exporter").is_empty());
    assert_eq!(users("nvidia-persistenced"), ["nvidia-persistenced"]);
    assert!(users("Xorg").contains(&"Debian-gdm".to_string()));
    // Configured commands run as the configured users, whichever list named them, and
    // keep them when an explicit kill drops the users' own protection.
    let configured = Protection::built_in()
        .with(&["my-monitor".into()], &["prometheus".into()])
        .with(&["other".into()], &["exporter".into()])
        .programs_only();
    for name in ["my-monitor", "other"] {
        let program = configured.programs.iter().find(|p| p.name == name).unwrap();
        assert_eq!(program.users, ["prometheus", "exporter"], "{name}");
    }
    assert!(configured.users.is_empty());
    assert!(
        configured
            .programs
            .iter()
            .find(|p| p.name == "nvidia-smi")
            .unwrap()
            .users
            .is_empty()
    );
}

/// A directory anyone may write to, with a copy of a system library in it.
fn writable_dir_with_library() -> (tempfile::TempDir, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).unwrap();
    let library = [
        "/lib/x86_64-linux-gnu",
        "/usr/lib/x86_64-linux-gnu",
        "/lib64",
        "/usr/lib64",
        "/lib",
        "/usr/lib",
    ]
    .iter()
    .flat_map(|dir| ["libm.so.6", "libdl.so.2", "libutil.so.1"].map(|l| Path::new(dir).join(l)))
    .find(|path| path.exists())
    .expect("no system library to copy");
    let copy = dir.path().join(library.file_name().unwrap());
    fs::copy(&library, &copy).unwrap();
    (dir, copy)
}

#[test]
fn code_or_search_paths_from_outside_roots_files_void_the_claim() {
    let protection = Protection::default().with(&["sleep".to_string()], &me());
    let (dir, library) = writable_dir_with_library();
    let shown = dir.path().display().to_string();
    // Preloaded: mapped from a directory anyone can write to (judged once ld.so mapped
    // it; before, its environment says the same).
    let mut child = system_sleep_with("sleep", |command| {
        command.env("LD_PRELOAD", &library);
    });
    let maps = format!("/proc/{}/maps", child.id());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !fs::read_to_string(&maps).is_ok_and(|maps| maps.contains(&shown)) {
        assert!(
            std::time::Instant::now() < deadline,
            "the library was never mapped"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let judged = protection.judge(&claimant(child.id(), "sleep", "sleep"));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        matches!(&judged, Claim::Impostor { why, .. }
            if why.contains("runs code from") && why.contains(&shown)),
        "{judged:?}"
    );
    // A search directory anyone could fill, loaded from or not.
    let judged = judged_sleep(&protection, |command| {
        command.env("LD_LIBRARY_PATH", format!("/usr/lib:{shown}/not-yet"));
    });
    assert!(
        matches!(&judged, Claim::Impostor { why, .. }
            if why.contains("LD_LIBRARY_PATH names") && why.contains("writable by others")),
        "{judged:?}"
    );
    for (name, value, says) in [
        ("LD_LIBRARY_PATH", "/usr/lib:", "empty entry"),
        ("LD_LIBRARY_PATH", "lib", "relative path"),
        ("LD_AUDIT", "./audit.so", "relative path"),
        ("LD_PRELOAD", "$ORIGIN/x.so", "expands"),
    ] {
        let judged = judged_sleep(&protection, |command| {
            command.env(name, value);
        });
        assert!(
            matches!(&judged, Claim::Impostor { why, .. } if why.contains(name) && why.contains(says)),
            "{name}={value}: {judged:?}"
        );
    }
    // Root's own directories, and names found on the search path, change nothing.
    let judged = judged_sleep(&protection, |command| {
        command
            .env("LD_LIBRARY_PATH", "/usr/lib:/usr/lib/no-such-dir")
            .env("LD_PRELOAD", "libm.so.6");
    });
    assert_eq!(judged, Claim::Genuine("sleep".into()));
}

#[test]
fn a_sticky_root_directory_may_be_passed_through_but_not_searched_or_created_in() {
    use std::os::unix::fs::PermissionsExt;
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root for a root-owned sticky directory");
        return;
    }
    let protection = Protection::default().with(&["sleep".to_string()], &[]);
    // As /tmp is, and as a checkout under it (cargo puts its build directories on the
    // tests' LD_LIBRARY_PATH): root's entries in it can only be changed by root.
    let sticky = tempfile::tempdir().unwrap();
    fs::set_permissions(sticky.path(), fs::Permissions::from_mode(0o1777)).unwrap();
    let inner = sticky.path().join("lib");
    fs::create_dir(&inner).unwrap();
    fs::set_permissions(&inner, fs::Permissions::from_mode(0o755)).unwrap();
    let judged = judged_sleep(&protection, |command| {
        command.env("LD_LIBRARY_PATH", &inner);
    });
    assert_eq!(judged, Claim::Genuine("sleep".into()));
    // Searched itself, anyone may add a library to it.
    let judged = judged_sleep(&protection, |command| {
        command.env("LD_LIBRARY_PATH", sticky.path());
    });
    assert!(
        matches!(&judged, Claim::Impostor { why, .. } if why.contains("writable by others")),
        "{judged:?}"
    );
    // Missing in it, anyone may create it.
    let judged = judged_sleep(&protection, |command| {
        command.env("LD_LIBRARY_PATH", sticky.path().join("later"));
    });
    assert!(
        matches!(&judged, Claim::Impostor { why, .. } if why.contains("anyone may create it")),
        "{judged:?}"
    );
}

#[test]
fn paths_are_judged_component_by_component_links_followed() {
    use std::os::unix::fs::{PermissionsExt, symlink};
    let mut known = std::collections::HashSet::new();
    let judge = |path: &Path, must_exist: bool, known: &mut _| {
        judge_path(Path::new("/"), path, must_exist, known)
    };
    assert_eq!(judge(Path::new("/usr/lib"), true, &mut known), Ok(()));
    assert_eq!(
        judge(Path::new("/usr/./lib/../lib/missing"), false, &mut known),
        Ok(())
    );
    assert!(
        judge(Path::new("/usr/lib/missing"), true, &mut known)
            .unwrap_err()
            .contains("cannot be read")
    );
    // /tmp may be passed through (sticky, root's entries are root's alone), but what is
    // missing in it anyone may create.
    let why = judge(Path::new("/tmp/x.so"), false, &mut known).unwrap_err();
    assert_eq!(
        why,
        "/tmp/x.so does not exist, and anyone may create it in /tmp"
    );
    if nix::unistd::geteuid().is_root() {
        // A root-owned link in a root-owned directory to a file anyone can replace.
        let dir = tempfile::Builder::new()
            .prefix("gpuctl-protect-")
            .tempdir_in("/var/lib")
            .unwrap();
        let safe = dir.path().join("safe");
        fs::create_dir(&safe).unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(&safe, fs::Permissions::from_mode(0o755)).unwrap();
        symlink("/tmp/evil.so", safe.join("lib.so")).unwrap();
        symlink("../safe", safe.join("up")).unwrap();
        let mut known = std::collections::HashSet::new();
        let why = judge(&safe.join("lib.so"), false, &mut known).unwrap_err();
        assert!(why.starts_with("/tmp/evil.so does not exist"), "{why}");
        let through = judge(&safe.join("up/up/lib.so"), false, &mut known).unwrap_err();
        assert_eq!(through, why);
    }
}
