use super::*;
use std::os::unix::fs::PermissionsExt;

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// A directory everyone may write in, sticky, as /tmp and a team's checkpoint directory.
fn shared_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o1777)).unwrap();
    dir
}

/// Another user (65534) made this user's predictable /tmp directory first (finding 6):
/// reported and stepped around, and the next run finds the same place.
#[test]
fn a_directory_planted_at_the_predictable_name_is_stepped_around_and_found_again() {
    assert!(
        is_root(),
        "this test plants a directory as another user: run it as root"
    );
    let tmp = shared_dir();
    let me = nix::unistd::geteuid().as_raw();
    let planted = tmp.path().join(format!("gpuctl-trainer-{me}"));
    fs::DirBuilder::new().mode(0o700).create(&planted).unwrap();
    std::os::unix::fs::chown(&planted, Some(65534), Some(65534)).unwrap();

    let (base, stepped) = private_in(tmp.path(), me).unwrap();
    assert_ne!(base, planted);
    assert!(base.starts_with(tmp.path()), "{}", base.display());
    assert!(is_private_of(&base, me), "{}", base.display());
    let stepped = stepped.expect("the planted directory is reported");
    assert!(
        stepped.contains("is not a private directory of uid")
            && stepped.contains(&base.display().to_string()),
        "{stepped}"
    );
    // The next run: the same place, found by its owner, not a new one each time.
    let (again, _) = private_in(tmp.path(), me).unwrap();
    assert_eq!(again, base);
    // Another user's directory of the unpredictable form is never taken for ours.
    let decoy = tmp.path().join(format!("gpuctl-trainer-{me}.AAAAAA"));
    fs::DirBuilder::new().mode(0o700).create(&decoy).unwrap();
    std::os::unix::fs::chown(&decoy, Some(65534), Some(65534)).unwrap();
    assert_eq!(private_in(tmp.path(), me).unwrap().0, base);
    // Without anything planted, the predictable name, and nothing to report.
    let clean = shared_dir();
    let (plain, none) = private_in(clean.path(), me).unwrap();
    assert_eq!(plain, clean.path().join(format!("gpuctl-trainer-{me}")));
    assert!(none.is_none());
}

/// Another user put a lock (or a link, or a run file) at the run's names in a shared
/// checkpoint directory first: the run goes on elsewhere and says so, and the next run of
/// the name finds its file there.
#[test]
fn a_lock_or_run_file_planted_in_a_shared_directory_is_stepped_around() {
    assert!(
        is_root(),
        "this test plants files as another user: run it as root"
    );
    let private = tempfile::tempdir().unwrap();
    let base = || Ok(private.path().to_path_buf());
    for plant in ["lock", "link", "record"] {
        let shared = shared_dir();
        let path = shared.path().join("job.run.json");
        match plant {
            "lock" => {
                let lock = shared.path().join("job.run.lock");
                fs::write(&lock, "").unwrap();
                std::os::unix::fs::chown(&lock, Some(65534), Some(65534)).unwrap();
            }
            "link" => std::os::unix::fs::symlink("/etc/passwd", shared.path().join("job.run.lock"))
                .unwrap(),
            _ => {
                fs::write(&path, "{}").unwrap();
                std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
            }
        }
        let (file, previous) = acquire_with("job", &path, &base).unwrap();
        assert!(previous.is_none(), "{plant}");
        assert!(
            file.path().starts_with(private.path()),
            "{plant}: {}",
            file.path().display()
        );
        assert_eq!(file.notices().len(), 1, "{plant}: {:?}", file.notices());
        assert!(
            file.notices()[0].contains("put there by another user"),
            "{plant}: {:?}",
            file.notices()
        );
        // The record is kept where the next run of the name looks.
        let record = Record {
            version: 1,
            name: "job".into(),
            device: "cpu".into(),
            processes: Vec::new(),
        };
        file.record(&record).unwrap();
        let elsewhere = file.path().to_path_buf();
        drop(file);
        let (again, previous) = acquire_after_release("job", &path, &base);
        assert_eq!(again.path(), elsewhere, "{plant}");
        assert_eq!(previous.map(|r| r.name), Some("job".to_string()), "{plant}");
    }
}

/// `acquire_with` once the lock just dropped is free. A test running beside this one may be
/// spawning a process at that moment: its child holds a copy of every descriptor (the lock's
/// too) from fork until exec, and the flock with it, so a busy lock is tried again briefly.
fn acquire_after_release(
    name: &str,
    path: &Path,
    base: &dyn Fn() -> Result<PathBuf, RunError>,
) -> (RunFile, Option<Record>) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match acquire_with(name, path, base) {
            Err(RunError::Busy { .. }) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            result => return result.unwrap(),
        }
    }
}

/// In a directory of this user's own, nobody else could have put anything there: a link
/// at the lock's name is refused as before.
#[test]
fn a_link_in_a_private_directory_is_still_refused() {
    let own = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("/etc/passwd", own.path().join("job.run.lock")).unwrap();
    let error = acquire_with("job", &own.path().join("job.run.json"), &|| {
        panic!("stepped around in a private directory")
    })
    .err()
    .expect("refused");
    assert!(error.to_string().contains("a symbolic link"), "{error}");
}

#[test]
fn a_busy_run_is_said_in_cores_words_or_the_fronts() {
    let busy = RunError::Busy {
        name: "llama".into(),
        holder: " as pid 42".into(),
        lock: PathBuf::from("/run/llama.run.lock"),
    };
    assert_eq!(
        busy.to_string(),
        "run \"llama\" is already running as pid 42 (its lock /run/llama.run.lock is \
         held): wait for it, or give this run another name"
    );
    let flag = |field: &str| (field == "name").then_some("--run-name");
    assert!(
        busy.worded(flag)
            .ends_with("or give this run another --run-name")
    );
    let bad = RunError::BadName("../x".into());
    assert_eq!(bad.worded(flag), bad.to_string());
}
