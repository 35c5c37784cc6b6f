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
    let result = (|| {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&temporary)?;
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
}
