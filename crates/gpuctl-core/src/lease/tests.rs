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
fn the_holder_is_named_from_the_kernel_lock_table() {
    let (_tmp, leases) = dir();
    let _lease = held(leases.try_take("GPU-bbbb").unwrap());
    let holder = leases.holder("GPU-bbbb").expect("a holder");
    assert_eq!(holder.pid, std::process::id());
    assert!(holder.since.is_some());
    assert!(leases.holder("GPU-cccc").is_none());
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
    let taken: Vec<String> = taken.unwrap().into_iter().map(|l| l.uuid).collect();
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
fn flock_holders_are_read_from_the_lock_table() {
    let table = "1: POSIX  ADVISORY  WRITE 100 08:01:77 0 EOF\n\
                 2: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF\n\
                 2: -> FLOCK  ADVISORY  WRITE 4343 fd:01:1234 0 EOF\n";
    assert_eq!(flock_holder(table, (0xfd, 1), 1234), Some(4242));
    assert_eq!(flock_holder(table, (8, 1), 77), None);
    assert_eq!(flock_holder(table, (0xfd, 1), 99), None);
}
