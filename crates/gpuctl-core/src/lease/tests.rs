use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};

use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork};

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

/// In a forked child, tries the lease file's lock; `hold`: keeps it until killed. The child
/// calls only async-signal-safe functions (the test runner has other threads).
fn fork_locker(path: &Path, hold: bool) -> (Pid, bool) {
    let path = CString::new(path.as_os_str().as_bytes()).unwrap();
    let (read, write) = nix::unistd::pipe().unwrap();
    // SAFETY: the child runs only open, fcntl, write, pause and _exit.
    match unsafe { fork() }.unwrap() {
        // SAFETY: async-signal-safe calls on a path and a flock prepared before the fork.
        ForkResult::Child => unsafe {
            let fd = libc::open(path.as_ptr(), libc::O_RDWR);
            let lock = whole_file(libc::F_WRLCK);
            let ok = fd >= 0 && libc::fcntl(fd, libc::F_SETLK, &lock) == 0;
            let byte = u8::from(ok);
            libc::write(write.as_raw_fd(), (&byte as *const u8).cast(), 1);
            if !hold || !ok {
                libc::_exit(0);
            }
            loop {
                libc::pause();
            }
        },
        ForkResult::Parent { child } => {
            drop(write);
            let mut byte = [0u8];
            let got = nix::unistd::read(&read, &mut byte).unwrap();
            assert_eq!(got, 1, "the child said nothing");
            if !hold || byte[0] == 0 {
                waitpid(child, None).unwrap();
            }
            (child, byte[0] == 1)
        }
    }
}

/// Another process holding the lease file's lock, until dropped.
struct OtherHolder(Pid);

impl OtherHolder {
    fn of(path: &Path) -> OtherHolder {
        let (pid, locked) = fork_locker(path, true);
        assert!(
            locked,
            "the other process could not lock {}",
            path.display()
        );
        OtherHolder(pid)
    }
}

impl Drop for OtherHolder {
    fn drop(&mut self) {
        let _ = kill(self.0, Signal::SIGKILL);
        assert!(matches!(
            waitpid(self.0, None),
            Ok(WaitStatus::Signaled(..))
        ));
    }
}

/// Whether another process could take the lease file's lock now.
fn free_to_another(path: &Path) -> bool {
    fork_locker(path, false).1
}

#[test]
fn a_made_directory_is_its_owners_alone() {
    let (_tmp, leases) = dir();
    let mode = std::fs::metadata(leases.path()).unwrap().mode() & 0o7777;
    assert_eq!(mode, 0o755);
}

#[test]
fn a_lease_is_exclusive_until_dropped_in_this_process_and_others() {
    let (_tmp, leases) = dir();
    let path = leases.path().join("GPU-aaaa.lease");
    let lease = held(leases.try_take("GPU-aaaa").unwrap());
    assert!(matches!(leases.try_take("GPU-aaaa").unwrap(), Taken::Busy));
    assert!(!free_to_another(&path));
    drop(lease);
    assert!(free_to_another(&path));
    let other = OtherHolder::of(&path);
    assert!(matches!(leases.try_take("GPU-aaaa").unwrap(), Taken::Busy));
    drop(other);
    held(leases.try_take("GPU-aaaa").unwrap());
    assert!(path.exists(), "the file stays for the next run");
}

#[test]
fn the_holder_is_the_process_the_kernel_names() {
    let (_tmp, leases) = dir();
    // Made by a lease taken and given back.
    drop(held(leases.try_take("GPU-bbbb").unwrap()));
    let path = leases.path().join("GPU-bbbb.lease");
    assert!(leases.holder("GPU-bbbb").is_none(), "free");
    let other = OtherHolder::of(&path);
    let holder = leases.holder("GPU-bbbb").expect("held");
    assert_eq!(holder.pid, Some(other.0.as_raw() as u32));
    assert_eq!(holder.uid, Some(me()));
    assert!(holder.command.is_some() && holder.since.is_some());
    drop(other);
    assert!(
        leases.holder("GPU-bbbb").is_none(),
        "released with its holder"
    );
    assert!(leases.holder("GPU-cccc").is_none());
}

#[test]
fn reading_a_lease_this_process_holds_never_drops_it() {
    let (_tmp, leases) = dir();
    let path = leases.path().join("GPU-self.lease");
    let lease = held(leases.try_take("GPU-self").unwrap());
    for _ in 0..3 {
        let holder = leases.holder("GPU-self").expect("held");
        assert_eq!(holder.pid, Some(std::process::id()));
        assert_eq!(leases.provide(&["GPU-self".to_string()]), 0);
    }
    assert!(
        !free_to_another(&path),
        "a read dropped this process's lock"
    );
    drop(lease);
}

#[test]
fn what_the_content_says_names_nobody_and_a_huge_sparse_file_is_never_read() {
    let (_tmp, leases) = dir();
    drop(held(leases.try_take("GPU-huge").unwrap()));
    let path = leases.path().join("GPU-huge.lease");
    // Anyone may write the file (it is 0666 in root's directory): nothing in it counts.
    let me = std::process::id();
    std::fs::write(
        &path,
        format!(r#"{{"pid":{me},"start_ticks":1,"since":1}}"#),
    )
    .unwrap();
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(1 << 40)
        .unwrap();
    assert!(leases.holder("GPU-huge").is_none());
    let other = OtherHolder::of(&path);
    assert_eq!(
        leases.holder("GPU-huge").unwrap().pid,
        Some(other.0.as_raw() as u32)
    );
    assert!(matches!(leases.try_take("GPU-huge").unwrap(), Taken::Busy));
    drop(other);
    drop(held(leases.try_take("GPU-huge").unwrap()));
}

#[test]
fn a_file_the_directorys_owner_did_not_make_is_never_a_lease() {
    const NOBODY: u32 = 65534;
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let (_tmp, leases) = dir();
    let path = leases.path().join("GPU-theirs.lease");
    std::fs::write(&path, "").unwrap();
    std::os::unix::fs::chown(&path, Some(NOBODY), Some(NOBODY)).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    // Locked by its maker: no lease, and no holder named.
    let theirs = OtherHolder::of(&path);
    assert!(leases.holder("GPU-theirs").is_none());
    // The directory's owner removes it and makes its own.
    let lease = held(leases.try_take("GPU-theirs").unwrap());
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o7777), (0, 0o666));
    drop(theirs);
    drop(lease);
}

#[test]
fn the_owner_provides_every_missing_file_and_puts_wrong_ones_right() {
    let (_tmp, leases) = dir();
    let uuids: Vec<String> = ["GPU-p1", "GPU-p2", "GPU-p3"].map(String::from).to_vec();
    std::fs::create_dir(leases.path().join("GPU-p2.lease")).unwrap();
    assert_eq!(leases.provide(&uuids), 3);
    let mode = if me() == 0 { 0o666 } else { 0o600 };
    for uuid in &uuids {
        let meta = std::fs::symlink_metadata(leases.path().join(format!("{uuid}.lease"))).unwrap();
        assert!(meta.is_file(), "{uuid}");
        assert_eq!(meta.mode() & 0o7777, mode, "{uuid}");
    }
    std::fs::set_permissions(
        leases.path().join("GPU-p3.lease"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    assert_eq!(leases.provide(&uuids), usize::from(mode != 0o600));
    assert_eq!(leases.provide(&uuids), 0, "nothing left to do");
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
    drop(held(leases.try_take("GPU-a").unwrap()));
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
    // The directory's owner removes the link and takes a real lease file.
    drop(held(leases.try_take("GPU-link").unwrap()));
    let meta = std::fs::symlink_metadata(leases.path().join("GPU-link.lease")).unwrap();
    assert!(meta.is_file());
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
        drop(held(leases.try_take(uuid).unwrap()));
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
fn a_planted_directory_with_content_refuses_that_gpu_only() {
    let (_tmp, leases) = dir();
    std::fs::create_dir(leases.path().join("GPU-dir.lease")).unwrap();
    std::fs::write(leases.path().join("GPU-dir.lease/inside"), "x").unwrap();
    match leases.try_take("GPU-dir").unwrap() {
        Taken::Refused(why) => assert!(why.contains("a directory"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(leases.holder("GPU-dir").is_none());
    // The others are taken all the same.
    let uuids: Vec<String> = ["GPU-dir", "GPU-free"].map(String::from).to_vec();
    let (taken, missed) = leases.take(&uuids, Some(1)).unwrap();
    assert_eq!(taken.unwrap()[0].uuid, "GPU-free");
    assert!(matches!(missed[0], (ref uuid, Taken::Refused(_)) if uuid == "GPU-dir"));
}

#[test]
fn a_lease_file_removed_while_held_is_said() {
    let (_tmp, leases) = dir();
    let lease = held(leases.try_take("GPU-gone").unwrap());
    assert!(leases.lost(&lease).is_none());
    std::fs::remove_file(leases.path().join("GPU-gone.lease")).unwrap();
    let why = leases.lost(&lease).expect("lost");
    assert!(why.contains("removed or replaced"), "{why}");
}
