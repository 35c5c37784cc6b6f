//! A process's open descriptors, read from /proc/PID/fd: what each one points to.

use std::ffi::CStr;
use std::io;

/// Calls `each` with the target of every open descriptor of `pid` (what readlink of
/// /proc/PID/fd/N gives: a path, or `socket:[123]` and the like). One directory open and
/// one readlinkat per descriptor, relative to the open directory, so no path is walked
/// twice. Descriptors closed while reading are skipped; a process that is gone, or whose
/// descriptors this user may not read, is an error for the caller to skip.
pub fn each_target(pid: u32, each: impl FnMut(&[u8])) -> io::Result<usize> {
    each_target_in(&format!("/proc/{pid}/fd"), each)
}

/// [`each_target`] for one thread's view (`/proc/PID/task/TID/fd`): a zombie leader's own
/// descriptor directory is empty while its other threads still hold the files.
pub fn each_task_target(pid: u32, tid: u32, each: impl FnMut(&[u8])) -> io::Result<usize> {
    each_target_in(&format!("/proc/{pid}/task/{tid}/fd"), each)
}

/// The targets of the descriptors listed in `dir`; how many there were.
fn each_target_in(dir: &str, mut each: impl FnMut(&[u8])) -> io::Result<usize> {
    let path = format!("{dir}\0");
    // SAFETY: a NUL-terminated path; the descriptor is owned by the DIR stream from here on.
    let dir = unsafe {
        let fd = libc::open(
            path.as_ptr().cast(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let dir = libc::fdopendir(fd);
        if dir.is_null() {
            let error = io::Error::last_os_error();
            libc::close(fd);
            return Err(error);
        }
        dir
    };
    let mut target = [0u8; 4096];
    let mut count = 0;
    loop {
        // SAFETY: `dir` is an open stream; the entry is valid until the next readdir.
        let entry = unsafe { libc::readdir(dir) };
        if entry.is_null() {
            break;
        }
        // SAFETY: `entry` is non-null (checked above) and readdir keeps the dirent it points to
        // valid until the next call on `dir`; the kernel NUL-terminates d_name.
        let name = unsafe { CStr::from_ptr((*entry).d_name.as_ptr()) };
        if name.to_bytes().first() == Some(&b'.') {
            continue;
        }
        // SAFETY: dirfd names the open stream's directory, `name` is NUL-terminated and lives
        // through the call, and readlinkat writes at most `target.len()` bytes into `target`.
        let n = unsafe {
            libc::readlinkat(
                libc::dirfd(dir),
                name.as_ptr(),
                target.as_mut_ptr().cast(),
                target.len(),
            )
        };
        if n > 0 {
            count += 1;
            each(&target[..n as usize]);
        }
    }
    // SAFETY: closes the stream and its descriptor, once.
    unsafe { libc::closedir(dir) };
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_processes_descriptors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("held");
        let _file = std::fs::File::create(&path).unwrap();
        let mut targets = Vec::new();
        let count = each_target(std::process::id(), |t| targets.push(t.to_vec())).unwrap();
        assert_eq!(count, targets.len());
        let wanted = path.as_os_str().as_encoded_bytes();
        assert!(
            targets.iter().any(|t| t == wanted),
            "{path:?} not among {} targets",
            targets.len()
        );
        assert!(
            each_target(u32::MAX >> 1, |_| {}).is_err(),
            "no such process"
        );
    }
}
