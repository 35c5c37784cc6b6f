//! The scenario's `device_dir`: stand-ins for the driver's `/dev/nvidia*` files, for
//! programs that look for a GPU's device file (Slurm's gres.conf `File=`, device cgroups,
//! gpuctl).
//!
//! Several client processes may load the library at once, so creation is idempotent and
//! race-safe: what exists is left as it is (whatever its type), and nothing is created
//! through a symlink planted in the directory.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use crate::scenario::Scenario;

/// Device numbers of harmless character devices, used in turn for the device files made as
/// root: /dev/null, /dev/zero, /dev/full, /dev/random, /dev/urandom. Opening or reading
/// them does nothing a GPU program could regret.
pub const HARMLESS_DEVICES: [(u32, u32); 5] = [(1, 3), (1, 5), (1, 7), (1, 8), (1, 9)];

/// The files of a scenario's device directory, in order: `nvidia<minor>` for every GPU by
/// minor, then `nvidiactl` and `nvidia-uvm`; each with the (major, minor) it gets when
/// made as a character device.
pub fn device_files(scenario: &Scenario) -> Vec<(String, (u32, u32))> {
    let mut minors: Vec<u32> = scenario.gpus.iter().map(|g| g.minor).collect();
    minors.sort_unstable();
    minors
        .iter()
        .map(|m| format!("nvidia{m}"))
        .chain(["nvidiactl".to_string(), "nvidia-uvm".to_string()])
        .enumerate()
        .map(|(k, name)| (name, HARMLESS_DEVICES[k % HARMLESS_DEVICES.len()]))
        .collect()
}

/// Makes the scenario's `device_dir` (mkdir -p) and the files of [`device_files`] that are
/// missing: character devices when the caller is root (Slurm accepts only device files),
/// else empty regular files; mode 0666 either way. Nothing to do without `device_dir`.
/// `Err` is one line naming what failed; the files that could be made are made.
pub fn create_device_dir(scenario: &Scenario) -> Result<(), String> {
    let Some(dir) = &scenario.device_dir else {
        return Ok(());
    };
    // SAFETY: geteuid never fails.
    let root = unsafe { libc::geteuid() } == 0;
    create_in(dir, &device_files(scenario), root)
        .map_err(|e| format!("{}: {e}", scenario.path.display()))
}

/// [`create_device_dir`] with the kind of file chosen by the caller: character devices
/// (`devices`) or regular files.
fn create_in(dir: &Path, files: &[(String, (u32, u32))], devices: bool) -> Result<(), String> {
    std::fs::create_dir_all(dir)
        .map_err(|e| format!("device_dir {}: cannot create it: {e}", dir.display()))?;
    let dir_fd =
        open_dir(dir).map_err(|e| format!("device_dir {}: cannot open it: {e}", dir.display()))?;
    let mut first_error: Option<String> = None;
    let mut failures = 0;
    let mut fell_back = 0;
    for (name, (major, minor)) in files {
        let Ok(cname) = CString::new(name.as_str()) else {
            continue;
        };
        let made = if devices {
            match make_device(&dir_fd, &cname, *major, *minor) {
                // A root without CAP_MKNOD (a user namespace, a container): a regular file
                // still serves programs that only look for the name.
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                    fell_back += 1;
                    make_file(&dir_fd, &cname)
                }
                other => other,
            }
        } else {
            make_file(&dir_fd, &cname)
        };
        if let Err(e) = made {
            failures += 1;
            first_error.get_or_insert_with(|| {
                format!("device_dir {}: cannot create {name}: {e}", dir.display())
            });
        }
    }
    match first_error {
        Some(e) if failures > 1 => Err(format!("{e} (and {} more)", failures - 1)),
        Some(e) => Err(e),
        None if fell_back > 0 => Err(format!(
            "device_dir {}: mknod is not permitted: made {fell_back} regular files instead of character devices",
            dir.display()
        )),
        None => Ok(()),
    }
}

fn open_dir(dir: &Path) -> io::Result<OwnedFd> {
    let c = CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a NUL-terminated path; open returns a new descriptor or -1.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// An empty regular file, mode 0666; an existing entry of any kind (a symlink included) is
/// left alone.
fn make_file(dir: &OwnedFd, name: &CString) -> io::Result<()> {
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: an open directory descriptor and a NUL-terminated name.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags, 0o666 as libc::c_uint) };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::EEXIST) {
            Ok(())
        } else {
            Err(e)
        };
    }
    // SAFETY: a new descriptor that we now own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // The umask took bits off the mode; the file is ours, so set it exactly.
    // SAFETY: an open descriptor.
    if unsafe { libc::fchmod(fd.as_raw_fd(), 0o666) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A character device node, mode 0666; an existing entry is left alone.
fn make_device(dir: &OwnedFd, name: &CString, major: u32, minor: u32) -> io::Result<()> {
    let dev = libc::makedev(major, minor);
    // SAFETY: an open directory descriptor and a NUL-terminated name.
    let r = unsafe { libc::mknodat(dir.as_raw_fd(), name.as_ptr(), libc::S_IFCHR | 0o666, dev) };
    if r != 0 {
        let e = io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::EEXIST) {
            Ok(())
        } else {
            Err(e)
        };
    }
    // The umask took bits off the mode. AT_SYMLINK_NOFOLLOW: should the node have been
    // swapped for a symlink since, this fails rather than change the link's target.
    // SAFETY: an open directory descriptor and a NUL-terminated name.
    let r = unsafe {
        libc::fchmodat(
            dir.as_raw_fd(),
            name.as_ptr(),
            0o666,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("made, but its mode cannot be set to 0666: {e}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};

    fn scenario(text: &str) -> Scenario {
        crate::scenario::parse(Path::new("/tmp/x.toml"), text).unwrap()
    }

    #[test]
    fn names_follow_minors_and_numbers_cycle() {
        let s = scenario(
            "[[gpu]]\nminor = 5\n[[gpu]]\n[[gpu]]\nminor = 0\n[[gpu]]\n[[gpu]]\nminor = 9\n",
        );
        let files = device_files(&s);
        let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "nvidia0",
                "nvidia1",
                "nvidia3",
                "nvidia5",
                "nvidia9",
                "nvidiactl",
                "nvidia-uvm"
            ]
        );
        let numbers: Vec<(u32, u32)> = files.iter().map(|(_, d)| *d).collect();
        assert_eq!(
            numbers,
            [(1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (1, 3), (1, 5)]
        );
        assert_eq!(
            device_files(&scenario("")),
            [
                ("nvidiactl".to_string(), (1, 3)),
                ("nvidia-uvm".to_string(), (1, 5))
            ]
        );
    }

    /// The branch a non-root caller takes: empty regular files, 0666, made once, nothing
    /// replaced, no symlink followed.
    #[test]
    fn regular_files_are_made_once_and_never_through_a_symlink() {
        let tmp = std::env::temp_dir().join(format!("nvml-sim-devdir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let dir = tmp.join("a/b/dev");
        let target = tmp.join("target");
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink(&target, dir.join("nvidia-uvm")).unwrap();
        std::fs::write(dir.join("nvidiactl"), "kept").unwrap();
        let s = scenario("[[gpu]]\n[[gpu]]\nminor = 3\n");
        let files = device_files(&s);
        for _ in 0..2 {
            create_in(&dir, &files, false).unwrap();
        }
        for name in ["nvidia0", "nvidia3"] {
            let meta = std::fs::symlink_metadata(dir.join(name)).unwrap();
            assert!(meta.file_type().is_file(), "{name}");
            assert!(!meta.file_type().is_char_device());
            assert_eq!(meta.len(), 0);
            assert_eq!(meta.permissions().mode() & 0o7777, 0o666, "{name}");
        }
        assert_eq!(
            std::fs::read_to_string(dir.join("nvidiactl")).unwrap(),
            "kept"
        );
        assert!(
            std::fs::symlink_metadata(dir.join("nvidia-uvm"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert!(!target.exists(), "created through a planted symlink");
        let names: std::collections::BTreeSet<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 4, "{names:?}");
        // A directory that cannot be made is one line naming it.
        let blocked = tmp.join("file");
        std::fs::write(&blocked, "").unwrap();
        let e = create_in(&blocked.join("dev"), &files, false).unwrap_err();
        assert!(
            e.starts_with("device_dir ") && e.contains("cannot create it"),
            "{e}"
        );
        assert!(!e.contains('\n'));
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
