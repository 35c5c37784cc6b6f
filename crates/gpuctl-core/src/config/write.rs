//! Writing a setting into a file, keeping its owner, mode and comments.

use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{OFlag, open, openat, renameat};
use nix::sys::stat::{Mode, fchmod};
use nix::unistd::{Gid, Uid, UnlinkatFlags, fchown, fsync, geteuid, unlinkat};

use super::*;

/// Which fraction key [`set_fraction`] writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FractionScope {
    /// `fraction.default`
    Default,
    /// `fraction.gpu."<index or UUID>"`
    Gpu(String),
    /// `fraction.user.<name>`
    User(String),
}

impl FractionScope {
    /// The key path this scope writes: `fraction.gpu."0"`.
    pub fn key(&self) -> String {
        match self {
            FractionScope::Default => "fraction.default".to_string(),
            FractionScope::Gpu(gpu) => format!("fraction.gpu.{}", render_key(gpu)),
            FractionScope::User(user) => format!("fraction.user.{}", render_key(user)),
        }
    }
}

pub(super) const HEADER: &str =
    "# gpuctl configuration. gpuctl keeps comments and layout when it edits this file.\n";

/// Writes one fraction key into the file, keeping its comments, layout and other keys.
/// Creates the file (with a short header comment) and its directory (mode 0755) when
/// missing. The value and key are checked first, and the existing file is read with the
/// same checks as [`load_file`]: nothing is written when either fails. The write is atomic
/// (a temporary file in the same directory, renamed over the old one); the file gets mode
/// 0644 (or stricter if it was), and keeps its owner when written by root.
pub fn set_fraction(source: &Source, scope: FractionScope, value: f64) -> Result<(), ConfigError> {
    check_share(value)
        .map_err(|message| ConfigError::Value(format!("{}: {message}", scope.key())))?;
    match &scope {
        FractionScope::Default => {}
        FractionScope::Gpu(key) => check_gpu_key(key)
            .map_err(|message| ConfigError::Value(format!("{}: {message}", scope.key())))?,
        FractionScope::User(name) => check_user_name(name)
            .map_err(|message| ConfigError::Value(format!("{}: {message}", scope.key())))?,
    }
    let existing = read_checked(source)?;
    if let Some(file) = &existing {
        // Refuse to edit a file that does not load: fix it first.
        parse(&file.text, &source.path)?;
    }
    let mut doc: toml_edit::DocumentMut = match &existing {
        Some(file) => {
            file.text
                .parse()
                .map_err(|error: toml_edit::TomlError| ConfigError::Invalid {
                    path: source.path.clone(),
                    line: None,
                    key: None,
                    message: error.message().to_string(),
                })?
        }
        None => toml_edit::DocumentMut::new(),
    };
    set_in_document(&mut doc, &scope, value).map_err(|message| ConfigError::Invalid {
        path: source.path.clone(),
        line: None,
        key: Some(scope.key()),
        message,
    })?;
    let mut text = doc.to_string();
    if existing.is_none() {
        text = format!("{HEADER}\n{text}");
    }
    // What is written must load.
    parse(&text, &source.path)?;
    let target = existing
        .as_ref()
        .map(|file| file.path.clone())
        .unwrap_or_else(|| source.path.clone());
    write_atomic(source, &target, text.as_bytes(), existing.as_ref())
}

pub(super) fn set_in_document(
    doc: &mut toml_edit::DocumentMut,
    scope: &FractionScope,
    value: f64,
) -> Result<(), String> {
    use toml_edit::Key;
    let (parent, key) = match scope {
        FractionScope::Default => {
            let fraction = child_table(doc.as_item_mut(), "fraction", false)?;
            (fraction, Key::new("default"))
        }
        FractionScope::Gpu(gpu) => {
            let fraction = child_table(doc.as_item_mut(), "fraction", true)?;
            let table = child_table(fraction, "gpu", false)?;
            // GPU keys are written quoted, as the example does: "0" = 0.5.
            let key = Key::parse(&render_quoted(gpu))
                .ok()
                .and_then(|mut keys| (keys.len() == 1).then(|| keys.remove(0)))
                .unwrap_or_else(|| Key::new(gpu.as_str()));
            (table, key)
        }
        FractionScope::User(user) => {
            let fraction = child_table(doc.as_item_mut(), "fraction", true)?;
            (
                child_table(fraction, "user", false)?,
                Key::new(user.as_str()),
            )
        }
    };
    let table = parent
        .as_table_like_mut()
        .ok_or_else(|| "not a table".to_string())?;
    match table.get_mut(key.get()) {
        Some(item) => {
            let Some(old) = item.as_value_mut() else {
                return Err("is a table, not a value".to_string());
            };
            let decor = old.decor().clone();
            let mut new = toml_edit::Value::from(value);
            *new.decor_mut() = decor;
            *old = new;
        }
        None => {
            let item = toml_edit::value(value);
            if let Some(table) = parent.as_table_mut() {
                table.insert_formatted(&key, item);
            } else if let Some(inline) = parent.as_inline_table_mut() {
                inline.insert_formatted(&key, toml_edit::Value::from(value));
            } else {
                return Err("not a table".to_string());
            }
        }
    }
    Ok(())
}

pub(super) fn render_quoted(key: &str) -> String {
    let rendered = render_key(key);
    if rendered.starts_with('"') {
        rendered
    } else {
        format!("\"{rendered}\"")
    }
}

/// The table `name` under `parent`, created if missing: a `[header]` table under a table
/// (implicit, i.e. without a header of its own, when `implicit`), dotted under a dotted
/// table, inline under an inline table.
pub(super) fn child_table<'a>(
    parent: &'a mut toml_edit::Item,
    name: &str,
    implicit: bool,
) -> Result<&'a mut toml_edit::Item, String> {
    use toml_edit::{InlineTable, Item, Table, Value};
    let new = match parent {
        Item::Table(table) => {
            let mut child = Table::new();
            child.set_implicit(implicit);
            child.set_dotted(table.is_dotted());
            Item::Table(child)
        }
        Item::Value(Value::InlineTable(_)) => Item::Value(Value::InlineTable(InlineTable::new())),
        _ => return Err("is not a table".to_string()),
    };
    let table = parent.as_table_like_mut().expect("checked above");
    if table.get(name).is_none() {
        table.insert(name, new);
    }
    let child = table.get_mut(name).expect("inserted above");
    if child.is_table_like() {
        Ok(child)
    } else {
        Err(format!("{name} is not a table"))
    }
}

pub(super) fn write_atomic(
    source: &Source,
    target: &Path,
    bytes: &[u8],
    existing: Option<&CheckedFile>,
) -> Result<(), ConfigError> {
    let hint = match source.origin {
        Origin::System => " (the system file is root's: run as root)",
        Origin::User => {
            " (your own defaults: make XDG_CONFIG_HOME or HOME a directory you can write; the \
             system policy needs root)"
        }
        Origin::Env | Origin::Explicit => "",
    };
    let write_error = |error: io::Error| ConfigError::Write {
        path: source.path.clone(),
        hint: if error.kind() == io::ErrorKind::PermissionDenied {
            hint
        } else {
            ""
        },
        source: error,
    };
    let (Some(dir), Some(name)) = (target.parent(), target.file_name()) else {
        return Err(write_error(io::Error::other("not a file path")));
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(write_error)?;
    let dir_fd = open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| write_error(errno.into()))?;
    if source.origin.steers_root() {
        trusted_dir(source, dir, &dir_fd, &write_error)?;
    }
    let (tmp_name, tmp_fd) = create_temp(&dir_fd, name).map_err(write_error)?;
    let result = fill_and_rename(&dir_fd, &tmp_name, &tmp_fd, name, bytes, existing, source);
    if let Err(error) = result {
        let _ = unlinkat(&dir_fd, tmp_name.as_os_str(), UnlinkatFlags::NoRemoveDir);
        return Err(write_error(error));
    }
    Ok(())
}

/// Refuses a directory for root's policy that others could swap the file in.
fn trusted_dir(
    source: &Source,
    dir: &Path,
    dir_fd: &OwnedFd,
    write_error: &impl Fn(io::Error) -> ConfigError,
) -> Result<(), ConfigError> {
    // Never write root's policy into a directory others could swap it in.
    let dir_meta = File::from(dir_fd.try_clone().map_err(write_error)?)
        .metadata()
        .map_err(write_error)?;
    let problems = root_problems(dir_meta.uid(), dir_meta.gid(), dir_meta.mode(), true);
    if !problems.is_empty() {
        let dir = dir.display();
        return Err(ConfigError::Untrusted {
            path: source.path.clone(),
            message: format!(
                "{}: its directory {dir} is {}: {SUDO_REASON}; fix with: chown root:root {dir} && chmod 755 {dir}",
                source.path.display(),
                problems.join(", and ")
            ),
        });
    }
    Ok(())
}

/// Gives the temporary file its mode and owner (the existing file's, or root's for root's
/// policy), writes `bytes` to it and renames it over `name`, durably.
fn fill_and_rename(
    dir_fd: &OwnedFd,
    tmp_name: &OsStr,
    tmp_fd: &OwnedFd,
    name: &OsStr,
    bytes: &[u8],
    existing: Option<&CheckedFile>,
    source: &Source,
) -> io::Result<()> {
    let mode = existing.map_or(0o644, |file| file.mode & 0o644);
    fchmod(tmp_fd, Mode::from_bits_truncate(mode)).map_err(io::Error::from)?;
    if geteuid().is_root() {
        let (uid, gid) = match existing {
            Some(file) => (file.uid, file.gid),
            None if source.origin.steers_root() => (0, 0),
            None => (geteuid().as_raw(), nix::unistd::getegid().as_raw()),
        };
        fchown(tmp_fd, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))
            .map_err(io::Error::from)?;
    }
    let mut file = File::from(tmp_fd.try_clone()?);
    file.write_all(bytes)?;
    fsync(tmp_fd).map_err(io::Error::from)?;
    renameat(dir_fd, tmp_name, dir_fd, name).map_err(io::Error::from)?;
    // The rename is durable once the directory is.
    fsync(dir_fd).map_err(io::Error::from)?;
    Ok(())
}

/// Creates `.<name>.<pid>.<n>.tmp` next to the target, exclusively.
pub(super) fn create_temp(dir: &OwnedFd, name: &OsStr) -> io::Result<(OsString, OwnedFd)> {
    let pid = std::process::id();
    for attempt in 0..100u32 {
        let mut tmp = OsString::from(".");
        tmp.push(name);
        tmp.push(format!(".{pid}.{attempt}.tmp"));
        match openat(
            dir.as_fd(),
            tmp.as_os_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
            Mode::from_bits_truncate(0o600),
        ) {
            Ok(fd) => return Ok((tmp, fd)),
            Err(Errno::EEXIST) => continue,
            Err(errno) => return Err(errno.into()),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!("no free temporary name for {}", Path::new(name).display()),
    ))
}
