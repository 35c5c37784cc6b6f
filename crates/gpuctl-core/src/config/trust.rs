//! Reading a file with the checks sudo makes of a sudoers file.

use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, open, openat};
use nix::sys::stat::Mode;
use nix::unistd::{Gid, Group, Uid, User, geteuid};

use super::*;

/// An opened, checked configuration file.
pub(super) struct CheckedFile {
    /// Where it really is (symbolic links resolved): edits go there.
    pub(super) path: PathBuf,
    pub(super) text: String,
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) mode: u32,
}

/// Opens `source` without following a final symbolic link after resolution, checks the
/// opened file (and, for a file that steers root, its directory) by their descriptors, and
/// reads it. `None` when it does not exist.
pub(super) fn read_checked(source: &Source) -> Result<Option<CheckedFile>, ConfigError> {
    let read_error = |source_error: io::Error| ConfigError::Read {
        path: source.path.clone(),
        source: source_error,
    };
    let real = match fs::canonicalize(&source.path) {
        Ok(real) => real,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(read_error(error)),
    };
    let (Some(dir), Some(name)) = (real.parent(), real.file_name()) else {
        return Err(read_error(io::Error::other("not a file")));
    };
    let dir_fd = open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| read_error(errno.into()))?;
    let fd = match openat(
        &dir_fd,
        name,
        OFlag::O_RDONLY
            | OFlag::O_CLOEXEC
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_NOCTTY,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(None),
        Err(errno) => return Err(read_error(errno.into())),
    };
    let mut file = File::from(fd);
    let meta = file.metadata().map_err(read_error)?;
    if !meta.file_type().is_file() {
        return Err(ConfigError::Invalid {
            path: source.path.clone(),
            line: None,
            key: None,
            message: "not a regular file".to_string(),
        });
    }
    check_trust(source, &meta, &File::from(dir_fd), dir)?;
    if meta.len() > MAX_SIZE {
        return Err(ConfigError::Invalid {
            path: source.path.clone(),
            line: None,
            key: None,
            message: "larger than 1 MiB: not a gpuctl configuration".to_string(),
        });
    }
    let mut bytes = Vec::new();
    (&mut file)
        .take(MAX_SIZE + 1)
        .read_to_end(&mut bytes)
        .map_err(read_error)?;
    let text = String::from_utf8(bytes).map_err(|error| ConfigError::Invalid {
        path: source.path.clone(),
        line: Some(line_of(
            &String::from_utf8_lossy(error.as_bytes()),
            error.utf8_error().valid_up_to(),
        )),
        key: None,
        message: "not UTF-8 text".to_string(),
    })?;
    Ok(Some(CheckedFile {
        path: real,
        text,
        uid: meta.uid(),
        gid: meta.gid(),
        mode: meta.mode(),
    }))
}

/// Why a file (or directory) with this owner and mode may not steer root: owned by someone
/// other than root, writable by a group other than root's, or by everyone. A directory with
/// the sticky bit (like /tmp) is not counted as writable: there only the file's owner (root,
/// checked) may rename or remove it.
pub(super) fn root_problems(uid: u32, gid: u32, mode: u32, is_dir: bool) -> Vec<String> {
    let sticky = is_dir && mode & 0o1000 != 0;
    let mut problems = Vec::new();
    if uid != 0 {
        problems.push(format!("owned by {}, not root", describe_uid(uid)));
    }
    if mode & 0o002 != 0 && !sticky {
        problems.push("writable by everyone".to_string());
    } else if mode & 0o020 != 0 && gid != 0 && !sticky {
        problems.push(format!("writable by group {}", describe_gid(gid)));
    }
    problems
}

pub(super) fn describe_uid(uid: u32) -> String {
    match User::from_uid(Uid::from_raw(uid)) {
        Ok(Some(user)) => format!("uid {uid} ({})", user.name),
        _ => format!("uid {uid}"),
    }
}

pub(super) fn describe_gid(gid: u32) -> String {
    match Group::from_gid(Gid::from_raw(gid)) {
        Ok(Some(group)) => format!("'{}'", group.name),
        _ => format!("gid {gid}"),
    }
}

pub(super) const SUDO_REASON: &str =
    "refusing it, as sudo refuses such a sudoers (it steers a root daemon that kills processes)";

/// Checks an opened file (and, when it steers root, its directory `dir`, opened at
/// `dir_path`) against who may change them.
pub(super) fn check_trust(
    source: &Source,
    meta: &fs::Metadata,
    dir: &File,
    dir_path: &Path,
) -> Result<(), ConfigError> {
    let path = source.path.display();
    if source.origin.steers_root() {
        let problems = root_problems(meta.uid(), meta.gid(), meta.mode(), false);
        if !problems.is_empty() {
            return Err(ConfigError::Untrusted {
                path: source.path.clone(),
                message: format!(
                    "{path} is {}: {SUDO_REASON}; fix with: chown root:root {path} && chmod 644 {path}",
                    problems.join(", and ")
                ),
            });
        }
        let dir_meta = dir.metadata().map_err(|error| ConfigError::Read {
            path: source.path.clone(),
            source: error,
        })?;
        let problems = root_problems(dir_meta.uid(), dir_meta.gid(), dir_meta.mode(), true);
        if !problems.is_empty() {
            let dir_path = dir_path.display();
            return Err(ConfigError::Untrusted {
                path: source.path.clone(),
                message: format!(
                    "{path}: its directory {dir_path} is {}: {SUDO_REASON}; fix with: chown root:root {dir_path} && chmod 755 {dir_path}",
                    problems.join(", and ")
                ),
            });
        }
        return Ok(());
    }
    // A file that steers only its reader: like ssh with ~/.ssh/authorized_keys, it must be
    // the reader's (or root's) and writable by nobody else.
    let me = geteuid().as_raw();
    let mut problems = Vec::new();
    if meta.uid() != me && meta.uid() != 0 {
        if me == 0 {
            problems.push(format!("owned by {}, not root", describe_uid(meta.uid())));
        } else {
            problems.push(format!(
                "owned by {}, not by you ({}) or root",
                describe_uid(meta.uid()),
                describe_uid(me)
            ));
        }
    }
    if meta.mode() & 0o002 != 0 {
        problems.push("writable by everyone".to_string());
    } else if meta.mode() & 0o020 != 0 {
        problems.push(format!("writable by group {}", describe_gid(meta.gid())));
    }
    if problems.is_empty() {
        return Ok(());
    }
    let owner = User::from_uid(Uid::from_raw(me))
        .ok()
        .flatten()
        .map(|user| user.name)
        .unwrap_or_else(|| me.to_string());
    let fix = if meta.uid() != me && meta.uid() != 0 {
        format!("chown {owner} {path} && chmod 644 {path}")
    } else {
        format!("chmod 644 {path}")
    };
    Err(ConfigError::Untrusted {
        path: source.path.clone(),
        message: format!(
            "{path} is {}: refusing it, as ssh refuses such an authorized_keys (others could steer what gpuctl does as you); fix with: {fix}",
            problems.join(", and ")
        ),
    })
}

/// Why root may not use `path`, named by an environment variable (a library to load, a
/// device directory), if it may not: the sudoers rule ([`root_problems`]) for it and every
/// directory above it, symbolic links resolved, so that nobody but root can change what it
/// names between this check and its use. Returns the resolved path, which is what is to be
/// used. A path that does not exist (yet) is judged by its deepest existing directory, which
/// must then be writable by root alone, sticky or not: anyone who may create the rest could.
pub fn trusted_by_root(path: &Path) -> Result<PathBuf, String> {
    if !path.is_absolute() {
        return Err("not an absolute path".to_string());
    }
    let mut missing = Vec::new();
    let mut existing = path;
    let real = loop {
        match fs::canonicalize(existing) {
            Ok(real) => break real,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                let (Some(parent), Some(name)) = (existing.parent(), existing.file_name()) else {
                    return Err(format!("{} cannot be read ({error})", existing.display()));
                };
                missing.push(name.to_os_string());
                existing = parent;
            }
            Err(error) => return Err(format!("{} cannot be read ({error})", existing.display())),
        }
    };
    for (depth, step) in real.ancestors().enumerate() {
        let meta =
            fs::metadata(step).map_err(|e| format!("{} cannot be read ({e})", step.display()))?;
        let mut problems = root_problems(meta.uid(), meta.gid(), meta.mode(), meta.is_dir());
        let others_write =
            meta.mode() & 0o002 != 0 || (meta.mode() & 0o020 != 0 && meta.gid() != 0);
        if depth == 0 && !missing.is_empty() && problems.is_empty() && others_write {
            problems.push(format!(
                "writable by others (with {} still to be created in it)",
                missing
                    .last()
                    .map_or(String::new(), |m| m.to_string_lossy().into_owned())
            ));
        }
        if !problems.is_empty() {
            let what = if depth == 0 && missing.is_empty() {
                format!("{} is", step.display())
            } else {
                format!("its directory {} is", step.display())
            };
            return Err(format!("{what} {}", problems.join(", and ")));
        }
    }
    Ok(missing
        .iter()
        .rev()
        .fold(real, |path, name| path.join(name)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(path: &Path, mode: u32) {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_path_root_may_use_is_roots_all_the_way_up() {
        if !geteuid().is_root() {
            eprintln!("skipped: needs root (files owned by root)");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let lib = dir.path().join("lib.so");
        fs::write(&lib, "").unwrap();
        chmod(&lib, 0o755);
        assert_eq!(trusted_by_root(&lib), Ok(fs::canonicalize(&lib).unwrap()));
        // Not there yet, below a directory only root writes: fine.
        let later = dir.path().join("dev/nvidia0");
        assert!(trusted_by_root(&later).is_ok());

        chmod(&lib, 0o666);
        let why = trusted_by_root(&lib).unwrap_err();
        assert!(why.ends_with("lib.so is writable by everyone"), "{why}");
        chmod(&lib, 0o755);
        // The directory is writable by others: sticky (as /tmp) or not, the file itself is
        // root's, but what does not exist yet could be created by anyone.
        chmod(dir.path(), 0o1777);
        assert!(trusted_by_root(&lib).is_ok());
        let why = trusted_by_root(&later).unwrap_err();
        assert!(why.contains("writable by others"), "{why}");
        chmod(dir.path(), 0o777);
        let why = trusted_by_root(&lib).unwrap_err();
        assert!(
            why.starts_with("its directory ") && why.ends_with("writable by everyone"),
            "{why}"
        );
        chmod(dir.path(), 0o700);
        nix::unistd::chown(&lib, Some(Uid::from_raw(65534)), None).unwrap();
        let why = trusted_by_root(&lib).unwrap_err();
        assert!(why.contains("owned by uid 65534"), "{why}");
        assert!(trusted_by_root(Path::new("lib.so")).is_err());
    }
}
