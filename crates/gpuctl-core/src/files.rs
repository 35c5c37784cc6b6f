//! Replacing a file whole: written under a temporary name in the same directory, then renamed
//! over the old one, so a reader sees the old file or the new one, never a part. Used for the
//! peak marks, the watchdog's metrics and the trainer's checkpoints and run files. (The
//! configuration writer has its own: it must also keep the file's owner and check the
//! directory it writes root's policy into.)

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Replaces `path` with `bytes`, creating it with `mode` (before the umask). `durable`: the
/// data reaches the disk before the rename, so a crash leaves the old file or the whole new
/// one (checkpoints); without it a crash may leave an empty file (metrics, peak marks).
pub fn replace(path: &Path, bytes: &[u8], mode: u32, durable: bool) -> io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other("not a file path"))?;
    let mut temporary = std::ffi::OsString::from(".");
    temporary.push(name);
    temporary.push(format!(".{}.tmp", std::process::id()));
    let temporary = dir.join(temporary);
    // Never through a link: the directory may be writable by others (a textfile collector's
    // directory shared with a group), who could plant a symbolic link at the temporary name
    // pointing at a file of root's. The temporary is created anew (O_EXCL, O_NOFOLLOW); a
    // leftover of the same name (a crash, or planted) is unlinked first, which removes a link
    // itself, never its target. The rename replaces whatever is at `path` without following.
    let create = || {
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(mode)
            .open(&temporary)
    };
    let result = (|| {
        let mut file = match create() {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                fs::remove_file(&temporary)?;
                create()?
            }
            other => other?,
        };
        file.write_all(bytes)?;
        if durable {
            file.sync_all()?;
        }
        drop(file);
        fs::rename(&temporary, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temporary);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_whole_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        replace(&path, b"one", 0o644, false).unwrap();
        replace(&path, b"two", 0o644, true).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
        assert!(replace(&dir.path().join("missing/f"), b"x", 0o644, false).is_err());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_link_planted_at_the_temporary_name_is_never_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, b"root's").unwrap();
        let path = dir.path().join("gpuctl.prom");
        let planted = dir
            .path()
            .join(format!(".gpuctl.prom.{}.tmp", std::process::id()));
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        replace(&path, b"metrics", 0o644, false).unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"root's");
        assert_eq!(fs::read(&path).unwrap(), b"metrics");
        assert!(fs::symlink_metadata(&planted).is_err(), "the link is gone");
        // A link at the path itself is replaced, not followed.
        fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        replace(&path, b"again", 0o644, true).unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"root's");
        assert!(
            !fs::symlink_metadata(&path)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(fs::read(&path).unwrap(), b"again");
    }
}
