use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};

use super::*;

fn dir() -> (tempfile::TempDir, LeaseDir) {
    let tmp = tempfile::tempdir().unwrap();
    let leases = LeaseDir::at(&tmp.path().join("leases")).unwrap();
    (tmp, leases)
}

fn held(taken: Taken) -> Lease {
    match taken {
        Taken::Held(lease) => lease,
        other => panic!("not taken: {other:?}"),
    }
}

#[test]
fn a_made_directory_is_sticky_and_open_to_all() {
    let (_tmp, leases) = dir();
    let mode = std::fs::metadata(leases.path()).unwrap().mode() & 0o7777;
    assert_eq!(mode, 0o1777);
}

#[test]
fn a_lease_is_exclusive_until_dropped() {
    let (_tmp, leases) = dir();
    let lease = held(leases.try_take("GPU-aaaa").unwrap());
    // Another open file description is another holder, as another process would be.
    assert!(matches!(leases.try_take("GPU-aaaa").unwrap(), Taken::Busy));
    drop(lease);
    held(leases.try_take("GPU-aaaa").unwrap());
}

#[test]
fn the_holder_is_named_from_its_note_and_the_note_goes_with_the_lease() {
    let (_tmp, leases) = dir();
    let lease = held(leases.try_take("GPU-bbbb").unwrap());
    let holder = leases.holder("GPU-bbbb").expect("a holder");
    assert_eq!(holder.pid, Some(std::process::id()));
    assert!(holder.since.is_some() && holder.user.is_some());
    assert!(leases.holder("GPU-cccc").is_none());
    drop(lease);
    assert!(leases.holder("GPU-bbbb").is_none(), "released");
    let file = leases.path().join("GPU-bbbb.lease");
    assert!(
        std::fs::symlink_metadata(file).is_err(),
        "the file goes too"
    );
}

#[test]
fn a_note_naming_another_process_or_a_reused_pid_names_nobody() {
    let (_tmp, leases) = dir();
    let lease = held(leases.try_take("GPU-note").unwrap());
    let path = leases.path().join("GPU-note.lease");
    let me = std::process::id();
    let ticks = own_start_ticks().unwrap();
    // The same pid started at another time (a reused pid), a start time no process has,
    // and no note at all.
    for note in [
        format!(r#"{{"pid":{me},"start_ticks":{},"since":1}}"#, ticks + 1),
        format!(r#"{{"pid":1,"start_ticks":{},"since":1}}"#, u64::MAX),
        "not json".to_string(),
    ] {
        std::fs::write(&path, note).unwrap();
        let holder = leases.holder("GPU-note").expect("still held");
        assert_eq!(holder, Holder::default());
        assert!(
            holder.describe().contains("no note"),
            "{}",
            holder.describe()
        );
    }
    drop(lease);
}

#[test]
fn a_huge_sparse_lease_file_is_never_read() {
    let (_tmp, leases) = dir();
    let path = leases.path().join("GPU-huge.lease");
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(1 << 40).unwrap();
    // Locked by another open file, as another user's process would hold it.
    // SAFETY: flock on a descriptor this test owns.
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(locked, 0);
    assert_eq!(leases.holder("GPU-huge"), Some(Holder::default()));
    assert!(matches!(leases.try_take("GPU-huge").unwrap(), Taken::Busy));
    drop(file);
    // Free again, and taken: the note replaces the terabyte.
    let lease = held(leases.try_take("GPU-huge").unwrap());
    assert!(std::fs::metadata(&path).unwrap().len() < NOTE_MAX);
    drop(lease);
}

#[test]
fn several_are_taken_all_or_nothing() {
    let (_tmp, leases) = dir();
    let uuids: Vec<String> = ["GPU-c", "GPU-a", "GPU-b"].map(String::from).to_vec();
    let busy = held(leases.try_take("GPU-b").unwrap());
    let (taken, missed) = leases.take(&uuids, None).unwrap();
    assert!(taken.is_none());
    assert!(matches!(missed[0], (ref uuid, Taken::Busy) if uuid == "GPU-b"));
    // Nothing was kept: GPU-a (tried first) is free again.
    held(leases.try_take("GPU-a").unwrap());
    // Two of three, one of them busy: the other two, in UUID order.
    let (taken, _) = leases.take(&uuids, Some(2)).unwrap();
    let taken: Vec<String> = taken.unwrap().into_iter().map(|l| l.uuid.clone()).collect();
    assert_eq!(taken, ["GPU-a", "GPU-c"]);
    drop(busy);
}

#[test]
fn two_runs_of_two_on_three_never_hold_one_each() {
    // Tried in UUID order without waiting: whichever gets the first gets the second, or
    // gives back what it took.
    let (_tmp, leases) = dir();
    let uuids: Vec<String> = ["GPU-3", "GPU-1", "GPU-2"].map(String::from).to_vec();
    let (first, _) = leases.take(&uuids, Some(2)).unwrap();
    let (second, _) = leases.take(&uuids, Some(2)).unwrap();
    assert!(first.is_some());
    assert!(second.is_none());
    held(leases.try_take("GPU-3").unwrap());
}

#[test]
fn a_uuid_that_cannot_name_a_file_is_refused() {
    let (_tmp, leases) = dir();
    for bad in ["", "../GPU-x", "GPU-x/y", "GPU x"] {
        assert!(
            matches!(leases.try_take(bad), Err(LeaseError::Unsafe(_))),
            "{bad}"
        );
    }
}

#[test]
fn a_planted_symbolic_link_is_never_followed() {
    let (tmp, leases) = dir();
    let victim = tmp.path().join("victim");
    symlink(&victim, leases.path().join("GPU-link.lease")).unwrap();
    match leases.try_take("GPU-link").unwrap() {
        // Root removes the link and takes a real lease file.
        Taken::Held(_) => {
            assert!(nix::unistd::geteuid().is_root());
            let meta = std::fs::symlink_metadata(leases.path().join("GPU-link.lease")).unwrap();
            assert!(meta.is_file());
        }
        Taken::Refused(why) => assert!(why.contains("symbolic link"), "{why}"),
        Taken::Busy => panic!("busy"),
    }
    assert!(!victim.exists(), "the link was followed");
}

#[test]
fn a_planted_fifo_or_hard_link_is_not_a_lease_file() {
    let (tmp, leases) = dir();
    nix::unistd::mkfifo(
        &leases.path().join("GPU-fifo.lease"),
        Mode::from_bits_truncate(0o666),
    )
    .unwrap();
    let other = tmp.path().join("other");
    std::fs::write(&other, "keep").unwrap();
    std::fs::hard_link(&other, leases.path().join("GPU-hard.lease")).unwrap();
    for uuid in ["GPU-fifo", "GPU-hard"] {
        match leases.try_take(uuid).unwrap() {
            Taken::Held(_) => assert!(nix::unistd::geteuid().is_root()),
            Taken::Refused(why) => assert!(why.contains("not followed"), "{why}"),
            Taken::Busy => panic!("busy"),
        }
    }
    assert_eq!(std::fs::read_to_string(&other).unwrap(), "keep");
}

#[test]
fn a_directory_others_may_write_without_the_sticky_bit_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("leases");
    std::fs::create_dir(&path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
    let error = LeaseDir::at(&path).unwrap_err().to_string();
    assert!(error.contains("not sticky"), "{error}");
}

#[test]
fn a_symbolic_link_for_the_directory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join("real")).unwrap();
    symlink(tmp.path().join("real"), tmp.path().join("leases")).unwrap();
    let error = LeaseDir::at(&tmp.path().join("leases"))
        .unwrap_err()
        .to_string();
    assert!(error.contains("not followed"), "{error}");
}

#[test]
fn a_planted_directory_socket_or_unreadable_file_refuses_that_gpu_only() {
    let (_tmp, leases) = dir();
    std::fs::create_dir(leases.path().join("GPU-dir.lease")).unwrap();
    std::fs::write(leases.path().join("GPU-dir.lease/inside"), "x").unwrap();
    let _socket =
        std::os::unix::net::UnixListener::bind(leases.path().join("GPU-sock.lease")).unwrap();
    for (uuid, what) in [("GPU-dir", "a directory"), ("GPU-sock", "a socket")] {
        match leases.try_take(uuid).unwrap() {
            // Root removes what it can (not a directory with something in it).
            Taken::Held(_) => assert!(nix::unistd::geteuid().is_root() && uuid == "GPU-sock"),
            Taken::Refused(why) => assert!(why.contains(what), "{why}"),
            Taken::Busy => panic!("busy"),
        }
        assert!(leases.holder(uuid).is_none());
    }
    // The others are taken all the same.
    let uuids: Vec<String> = ["GPU-dir", "GPU-free"].map(String::from).to_vec();
    let (taken, missed) = leases.take(&uuids, Some(1)).unwrap();
    assert_eq!(taken.unwrap()[0].uuid, "GPU-free");
    assert!(matches!(missed[0], (ref uuid, Taken::Refused(_)) if uuid == "GPU-dir"));
}

#[test]
fn a_run_that_opened_a_file_given_back_meanwhile_takes_the_new_one() {
    let (_tmp, leases) = dir();
    let first = held(leases.try_take("GPU-race").unwrap());
    // Opened by a second run just before the first gives the lease back (and its file).
    let stale = leases.open_file("GPU-race.lease").unwrap();
    drop(first);
    // SAFETY: flock on a descriptor this test owns.
    let locked = unsafe { libc::flock(stale.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(locked, 0, "the old file is free");
    assert!(
        !leases.names("GPU-race.lease", &stale),
        "but no longer the lease"
    );
    let second = held(leases.try_take("GPU-race").unwrap());
    assert!(leases.names("GPU-race.lease", &second.file));
    assert!(leases.lost(&second).is_none());
}
