//! Protection by identity. The programs that keep GPUs and displays working (and those the
//! configuration's `protect` lists name) are never signalled, but a name is not an identity:
//! any process can call itself `nvidia-persistenced` (`exec -a`, `prctl(PR_SET_NAME)`), and
//! anyone can run the real `nvidia-smi` with code of their own in it (`LD_PRELOAD`, ptrace).
//! Protection is for system programs run by root or by the program's own service user; a
//! user's own run of a monitoring tool is that user's process. So a process that claims a
//! protected name, by its command name or argv[0], is spared only when it *is* that program,
//! run by the system, with nothing but root's code in it:
//!
//! - its executable (`/proc/PID/exe`, resolved in the process's own root, so a container's
//!   files are the container's) is a regular file owned by root and writable by no one else;
//! - so is every directory above it, up to `/`: only root could have put the file there;
//! - the file is the program: its name is the protected name, or the protected name in the
//!   same directory (or a system bin directory) is a link to the same file (`X` to `Xorg`);
//! - every uid it runs with (real, effective, saved, filesystem) is root or one of the
//!   program's service users: persistenced's own user, a display manager's greeter user for
//!   a display server, the configuration's `[protect] users` for its `[protect] commands`
//!   (the MPS server and control daemon run as their users: any uid);
//! - no one traces it (`TracerPid` is 0): a tracer can put any code in it;
//! - every file it maps executable (`/proc/PID/maps`) passes the executable's trust rule,
//!   directories included (a deleted file: the directory it was in; memory named like a file,
//!   a memfd or SysV segment, never);
//! - its environment names no library search path or preloaded or audit library
//!   (`LD_LIBRARY_PATH`, `LD_PRELOAD`, `LD_AUDIT`) that anyone but root could change, links
//!   followed, in its own root.
//!
//! A process that claims a name without being the program is an impostor: not protected,
//! and said so (`gpuctl info`, the watchdog's log). So is one whose identity cannot be read
//! (a caller without CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH): the why says what could not
//! be read, and nothing is spared on an unverified claim.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::host::{Claimed, HostProcess};

/// A program that is never signalled, and the service users it may run as besides root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    pub name: String,
    /// Besides root (none listed: root only).
    pub users: Vec<String>,
    /// Named by the configuration: its users are the configuration's `[protect] users`.
    pub configured: bool,
}

/// The users a display manager runs its greeter's display server as (Debian's gdm is
/// `Debian-gdm`); a user's own session is that user's.
const DISPLAY_MANAGERS: &[&str] = &["gdm", "Debian-gdm", "sddm", "lightdm"];

/// The built-in programs and their service users besides root: NVIDIA's daemons (root, or
/// persistenced's own user), monitoring tools (root: a user's `nvidia-smi` is that user's)
/// and display servers (root, or a display manager's greeter user).
pub const BUILT_IN: &[(&str, &[&str])] = &[
    ("nvidia-persistenced", &["nvidia-persistenced"]),
    ("nv-hostengine", &[]),
    ("nvidia-fabricmanager", &[]),
    ("nvidia-powerd", &[]),
    // CUDA MPS: the server runs as its clients' user, and a user may run a daemon of their
    // own; ending either ends every client on the GPU (`crate::mps`). Any user, so long as
    // it is NVIDIA's file with only root's code in it.
    ("nvidia-cuda-mps-control", &[ANY_USER]),
    ("nvidia-cuda-mps-server", &[ANY_USER]),
    // Monitoring clients: they open every GPU's device file and hold no memory.
    ("nvidia-smi", &[]),
    ("dcgmi", &[]),
    ("dcgm-exporter", &[]),
    ("nvidia_gpu_exporter", &[]),
    ("Xorg", DISPLAY_MANAGERS),
    ("X", DISPLAY_MANAGERS),
    ("Xwayland", DISPLAY_MANAGERS),
    ("gnome-shell", DISPLAY_MANAGERS),
    ("kwin_wayland", DISPLAY_MANAGERS),
    ("kwin_x11", DISPLAY_MANAGERS),
    ("weston", DISPLAY_MANAGERS),
    ("sway", DISPLAY_MANAGERS),
    ("Hyprland", DISPLAY_MANAGERS),
    ("gdm-x-session", DISPLAY_MANAGERS),
    ("gdm-wayland-session", DISPLAY_MANAGERS),
];

/// In a built-in program's users: it may run as any user (the MPS server and daemon).
pub const ANY_USER: &str = "*";

/// Where a program named in a claim may be installed, besides its executable's directory.
const SYSTEM_BIN_DIRS: &[&str] = &[
    "/usr/bin",
    "/usr/sbin",
    "/bin",
    "/sbin",
    "/usr/local/bin",
    "/usr/local/sbin",
    "/usr/libexec",
    "/usr/lib/xorg",
];

/// What a process says it is: its command name and argv[0]'s basename.
#[derive(Debug, Clone, Copy)]
pub struct Claimant<'a> {
    pub pid: u32,
    /// Its effective uid as the snapshot saw it; the judgement reads every uid afresh.
    pub uid: Option<u32>,
    pub comm: Option<&'a str>,
    pub argv0: Option<&'a str>,
}

impl<'a> Claimant<'a> {
    /// What process `pid`, with these host facts, says it is.
    pub fn of(pid: u32, host: &'a HostProcess) -> Claimant<'a> {
        Claimant {
            pid,
            uid: host.uid,
            comm: host.comm.as_deref(),
            argv0: host.argv0_name(),
        }
    }
}

/// Whether a process is one of the protected programs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// It claims no protected name.
    None,
    /// It is the program it names.
    Genuine(String),
    /// It claims the name, and why it is not that program.
    Impostor { name: String, why: String },
}

impl Claim {
    /// What a report says of it: `None` when it claims nothing.
    pub fn report(&self) -> Option<Claimed> {
        match self {
            Claim::None => None,
            Claim::Genuine(name) => Some(Claimed {
                name: name.clone(),
                genuine: true,
                why: None,
            }),
            Claim::Impostor { name, why } => Some(Claimed {
                name: name.clone(),
                genuine: false,
                why: Some(why.clone()),
            }),
        }
    }
}

/// The programs never signalled, and the users and pods whose processes automatic reclaim
/// spares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Protection {
    pub programs: Vec<Program>,
    pub users: Vec<String>,
    /// `[protect] owners`: pods by the runtime's names (`pod:kube-system/*`).
    pub owners: Vec<crate::owner::OwnerMatch>,
}

impl Protection {
    /// The built-in programs, and the configuration's `[protect]` lists (its commands may run
    /// as root or as its users).
    pub fn configured(protect: &crate::config::Protect) -> Protection {
        let mut protection = Protection::built_in().with(&protect.commands, &protect.users);
        // Checked when the file was read: a word that does not parse is not there.
        protection.owners = protect
            .owners
            .iter()
            .filter_map(|owner| owner.parse().ok())
            .collect();
        protection
    }

    /// The `[protect] owners` pattern that spares a process of `owner`, if any.
    pub fn owner_protected(&self, owner: Option<&crate::owner::Owner>) -> Option<String> {
        let owner = owner?;
        self.owners
            .iter()
            .find(|wanted| wanted.matches(owner))
            .map(|wanted| wanted.to_string())
    }

    pub fn built_in() -> Protection {
        Protection {
            programs: BUILT_IN
                .iter()
                .map(|(name, users)| Program {
                    name: name.to_string(),
                    users: users.iter().map(|u| u.to_string()).collect(),
                    configured: false,
                })
                .collect(),
            users: Vec::new(),
            owners: Vec::new(),
        }
    }

    /// More commands and users on top (the watchdog's own lists). Every configured command
    /// may run as root or as any configured user: those are the site's service accounts.
    pub fn with(mut self, commands: &[String], users: &[String]) -> Protection {
        self.programs.extend(commands.iter().map(|name| Program {
            name: name.clone(),
            users: Vec::new(),
            configured: true,
        }));
        self.users.extend(users.iter().cloned());
        for program in self.programs.iter_mut().filter(|p| p.configured) {
            program.users = self.users.clone();
        }
        self
    }

    /// Programs only: an explicit `kill` is the admin's call, so users and pods are not
    /// spared (a configured command still runs as one of them: its users stay with it).
    pub fn programs_only(self) -> Protection {
        Protection {
            users: Vec::new(),
            owners: Vec::new(),
            ..self
        }
    }

    /// The protected program a process names itself after, if any: its command name (the
    /// kernel keeps 15 characters) or argv[0]'s basename.
    pub fn claimed(&self, claimant: &Claimant) -> Option<&Program> {
        self.candidates(claimant).next()
    }

    /// Every protected program the claim may mean, the best first: the name argv[0] or the
    /// whole command name gives, then those a cut command name begins (`nvidia-cuda-mps`
    /// is the MPS server's and its daemon's, where argv[0] was not read).
    fn candidates<'p>(&'p self, claimant: &Claimant) -> impl Iterator<Item = &'p Program> {
        let exact = |program: &&Program| {
            let name = Some(program.name.as_str());
            claimant.argv0 == name || claimant.comm == name
        };
        let comm = claimant
            .comm
            .filter(|comm| comm.len() == 15)
            .map(str::to_owned);
        let cut = move |program: &&Program| {
            comm.as_deref()
                .is_some_and(|comm| program.name.starts_with(comm))
        };
        let first: Vec<&Program> = self.programs.iter().filter(exact).collect();
        let rest: Vec<&Program> = match first.is_empty() {
            true => self.programs.iter().filter(cut).collect(),
            false => Vec::new(),
        };
        first.into_iter().chain(rest)
    }

    /// Whether the process is the protected program it claims to be (see the module's
    /// rule). Reads /proc only for a process that claims a protected name.
    pub fn judge(&self, claimant: &Claimant) -> Claim {
        let mut first_refusal = None;
        for program in self.candidates(claimant) {
            match verify(program, claimant, Path::new("/proc")) {
                Ok(()) => return Claim::Genuine(program.name.clone()),
                Err(why) => {
                    first_refusal.get_or_insert(Claim::Impostor {
                        name: program.name.clone(),
                        why,
                    });
                }
            }
        }
        first_refusal.unwrap_or(Claim::None)
    }
}

/// Why `claimant` is not `program`, if it is not; `proc` is where /proc is.
fn verify(program: &Program, claimant: &Claimant, proc: &Path) -> Result<(), String> {
    let dir = proc.join(claimant.pid.to_string());
    let exe = fs::read_link(dir.join("exe"))
        .map_err(|e| format!("its executable cannot be read ({e})"))?;
    // A program replaced on disk while it runs (an upgrade) still is that program.
    let exe = PathBuf::from(
        exe.to_string_lossy()
            .trim_end_matches(" (deleted)")
            .to_string(),
    );
    let shown = exe.display();
    if !exe.is_absolute() {
        return Err(format!("its executable {shown} has no absolute path"));
    }
    // The file itself, through the link (the inode the process runs), and the directories
    // above it in the process's own root.
    let file = fs::metadata(dir.join("exe"))
        .map_err(|e| format!("its executable {shown} cannot be read ({e})"))?;
    if !file.is_file() {
        return Err(format!("its executable {shown} is not a regular file"));
    }
    trusted(&file).map_err(|what| format!("its executable {shown} {what}"))?;
    let root = dir.join("root");
    for ancestor in exe.ancestors().skip(1) {
        let meta = fs::metadata(inside(&root, ancestor))
            .map_err(|e| format!("{} cannot be read ({e})", ancestor.display()))?;
        trusted(&meta).map_err(|what| {
            format!(
                "its executable {shown} is in {}, which {what}",
                ancestor.display()
            )
        })?;
    }
    let named = exe
        .file_name()
        .is_some_and(|name| name == program.name.as_str());
    let linked = || {
        exe.parent()
            .into_iter()
            .chain(SYSTEM_BIN_DIRS.iter().map(Path::new))
            .any(|bin| {
                fs::metadata(inside(&root, &bin.join(&program.name))).is_ok_and(|meta| {
                    meta.dev() == file.dev() && meta.ino() == file.ino() && trusted(&meta).is_ok()
                })
            })
    };
    if !named && !linked() {
        return Err(format!("its executable is {shown}"));
    }
    // The right file, run by whom and with what code in it. /proc/PID/status is readable
    // by anyone; maps, environ and root need the rights to inspect the process.
    let status = fs::read_to_string(dir.join("status"))
        .map_err(|e| format!("its status cannot be read ({e})"))?;
    runs_as(program, &status)?;
    if let Some(tracer) = status_field(&status, "TracerPid:").filter(|pid| *pid != "0") {
        return Err(format!(
            "it is traced by pid {tracer}, which can change its code"
        ));
    }
    let mut known = std::collections::HashSet::new();
    mapped_code(&dir, &root, &mut known)?;
    environment(&dir, &root, &mut known)
}

/// `path` (absolute) as seen from `root` (a process's /proc/PID/root).
fn inside(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

/// The value of `/proc/PID/status`'s line `key`, tabs and spaces trimmed.
fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|line| line.strip_prefix(key))
        .map(str::trim)
}

/// Whether every uid the process has (real, effective, saved, filesystem) is root or one of
/// the program's service users: any one of them could have changed it.
fn runs_as(program: &Program, status: &str) -> Result<(), String> {
    let uids = status_field(status, "Uid:").ok_or("its uids cannot be read")?;
    let uids: Vec<u32> = uids
        .split_whitespace()
        .map(|uid| {
            uid.parse()
                .map_err(|_| format!("its uid {uid:?} is not a number"))
        })
        .collect::<Result<_, _>>()?;
    if uids.is_empty() {
        return Err("its uids cannot be read".into());
    }
    let service_uid = |user: &String| {
        nix::unistd::User::from_name(user)
            .ok()
            .flatten()
            .map(|found| found.uid.as_raw())
    };
    if program.users.iter().any(|user| user == ANY_USER) {
        return Ok(());
    }
    let allowed: Vec<u32> = program.users.iter().filter_map(service_uid).collect();
    match uids
        .iter()
        .find(|&&uid| uid != 0 && !allowed.contains(&uid))
    {
        None => Ok(()),
        Some(uid) if program.users.is_empty() => Err(format!("it runs as uid {uid}, not as root")),
        Some(uid) => Err(format!(
            "it runs as uid {uid}, not as root or {}",
            program.users.join(" or ")
        )),
    }
}

/// Whether every file the process maps executable passes the trust rule. `known`: paths
/// already found trusted.
fn mapped_code(
    dir: &Path,
    root: &Path,
    known: &mut std::collections::HashSet<PathBuf>,
) -> Result<(), String> {
    let maps = fs::read_to_string(dir.join("maps"))
        .map_err(|e| format!("its memory map cannot be read ({e})"))?;
    for line in maps.lines() {
        // address perms offset dev inode, then the path (padded; it may hold spaces).
        let mut fields = line.splitn(6, ' ');
        let executable = fields
            .nth(1)
            .is_some_and(|perms| perms.as_bytes().get(2) == Some(&b'x'));
        let Some(path) = fields.nth(3).map(str::trim_start) else {
            continue;
        };
        // Anonymous memory and the kernel's ([vdso]) are no file anyone could replace.
        if !executable || !path.starts_with('/') {
            continue;
        }
        match path.strip_suffix(" (deleted)") {
            // Replaced on disk (an upgrade): what it was is judged by where it lay. Memory
            // with a file's name (memfd, SysV segments) lies in no directory: never root's.
            Some(gone) => {
                let lay = Path::new(gone)
                    .parent()
                    .filter(|dir| *dir != Path::new("/"))
                    .ok_or_else(|| format!("it runs code from {gone}, which is no file"))?;
                judge_path(root, lay, true, known)
                    .map_err(|why| format!("it runs code from {path}: {why}"))?
            }
            None => judge_path(root, Path::new(path), true, known)
                .map_err(|why| format!("it runs code from {path}: {why}"))?,
        }
    }
    Ok(())
}

/// Whether the process's environment makes ld.so load code that anyone but root could
/// change: a preloaded or audit library, or a library search directory.
fn environment(
    dir: &Path,
    root: &Path,
    known: &mut std::collections::HashSet<PathBuf>,
) -> Result<(), String> {
    use std::os::unix::ffi::OsStrExt;
    let environ = fs::read(dir.join("environ"))
        .map_err(|e| format!("its environment cannot be read ({e})"))?;
    for variable in environ.split(|&b| b == 0) {
        let Some(eq) = variable.iter().position(|&b| b == b'=') else {
            continue;
        };
        let (name, value) = (&variable[..eq], &variable[eq + 1..]);
        let search_path = name == b"LD_LIBRARY_PATH";
        if !search_path && name != b"LD_PRELOAD" && name != b"LD_AUDIT" {
            continue;
        }
        let name = String::from_utf8_lossy(name);
        // ld.so splits these at colons (and LD_PRELOAD at spaces, LD_LIBRARY_PATH at
        // semicolons); splitting all at each only ever finds more entries to judge.
        for entry in value.split(|b| b":; \t".contains(b)) {
            let path = Path::new(std::ffi::OsStr::from_bytes(entry));
            let shown = path.display();
            if entry.is_empty() {
                if search_path {
                    return Err(format!(
                        "its {name} has an empty entry, the working directory"
                    ));
                }
                continue;
            }
            // A bare library name is looked up in the search path, judged on its own.
            if !search_path && !entry.contains(&b'/') {
                continue;
            }
            if entry.contains(&b'$') {
                return Err(format!(
                    "its {name} names {shown}, which ld.so expands ($ORIGIN, $LIB)"
                ));
            }
            if !path.is_absolute() {
                return Err(format!("its {name} names {shown}, a relative path"));
            }
            judge_path(root, path, false, known)
                .map_err(|why| format!("its {name} names {shown}: {why}"))?;
        }
    }
    Ok(())
}

/// Why anyone but root could change what `path` (absolute, in the process's root `root`)
/// names, if anyone could: each component from `/` down is root's and writable by no one
/// else, links followed inside `root` (a link is root's; its target is judged the same way).
/// Without `must_exist`, a missing component ends the walk well: only the owner of the
/// directory above, root, could create it.
fn judge_path(
    root: &Path,
    path: &Path,
    must_exist: bool,
    known: &mut std::collections::HashSet<PathBuf>,
) -> Result<(), String> {
    let top = Path::new("/");
    if !known.contains(top) {
        let meta =
            fs::metadata(inside(root, top)).map_err(|e| format!("/ cannot be read ({e})"))?;
        trusted(&meta).map_err(|what| format!("/ {what}"))?;
        known.insert(top.to_path_buf());
    }
    // Components still to walk, the next one last.
    let mut pending: Vec<std::ffi::OsString> = Vec::new();
    push_components(&mut pending, path);
    let mut current = top.to_path_buf();
    let mut links = 0;
    // Whether `current` is a sticky directory others may write in (as /tmp): passing through
    // it is safe, since only root may rename or remove root's entries there, but anyone may
    // create what is missing in it.
    let mut open = false;
    while let Some(name) = pending.pop() {
        if name == ".." {
            // Its parent was judged on the way down.
            current.pop();
            open = false;
            continue;
        }
        let next = current.join(&name);
        if known.contains(&next) {
            current = next;
            open = false;
            continue;
        }
        let meta = match fs::symlink_metadata(inside(root, &next)) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && open => {
                return Err(format!(
                    "{} does not exist, and anyone may create it in {}",
                    next.display(),
                    current.display()
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !must_exist => return Ok(()),
            Err(e) => return Err(format!("{} cannot be read ({e})", next.display())),
            Ok(meta) => meta,
        };
        if meta.file_type().is_symlink() {
            if meta.uid() != 0 {
                return Err(format!("{} is a link not owned by root", next.display()));
            }
            links += 1;
            if links > 40 {
                return Err(format!("{} has too many links", path.display()));
            }
            let target = fs::read_link(inside(root, &next))
                .map_err(|e| format!("{} cannot be read ({e})", next.display()))?;
            if target.is_absolute() {
                current = top.to_path_buf();
            }
            push_components(&mut pending, &target);
            continue;
        }
        // The last component (the file, or the directory ld.so searches) must be writable by
        // root alone; a directory on the way may be a sticky one (a checkout under /tmp).
        let passage = !pending.is_empty() && meta.is_dir();
        match trusted(&meta) {
            Ok(()) => open = false,
            Err(_) if passage && sticky_root_dir(&meta) => open = true,
            Err(what) => return Err(format!("{} {what}", next.display())),
        }
        // A sticky directory is judged again each time: what is missing in it matters.
        if !open {
            known.insert(next.clone());
        }
        current = next;
    }
    Ok(())
}

/// Pushes `path`'s components onto `pending` so that its first is popped first (`..` kept
/// as a step up; `/` and `.` dropped).
fn push_components(pending: &mut Vec<std::ffi::OsString>, path: &Path) {
    use std::path::Component;
    for component in path.components().rev() {
        match component {
            Component::Normal(name) => pending.push(name.to_os_string()),
            Component::ParentDir => pending.push("..".into()),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
}

/// A root-owned directory with the sticky bit: others may add entries, but only root may
/// rename or remove root's.
fn sticky_root_dir(meta: &fs::Metadata) -> bool {
    meta.is_dir() && meta.uid() == 0 && meta.mode() & 0o1000 != 0
}

/// Owned by root and writable by no one else: only root can have put it there or changed it.
fn trusted(meta: &fs::Metadata) -> Result<(), &'static str> {
    if meta.uid() != 0 {
        Err("is not owned by root")
    } else if meta.mode() & 0o022 != 0 {
        Err("is writable by others than root")
    } else {
        Ok(())
    }
}

/// Says, for each confirmed process of `snapshot` (listed or holding a device file) that
/// names itself after a protected program, whether it is that program. Only those are read
/// (/proc/PID/exe, status, maps, environ and the files they name).
pub fn mark_claims(snapshot: &mut crate::snapshot::Snapshot, protection: &Protection) {
    let mark = |pid: u32, host: &mut std::sync::Arc<HostProcess>| {
        if !host.confirmed {
            return;
        }
        let claimant = Claimant::of(pid, host);
        if protection.claimed(&claimant).is_none() {
            return;
        }
        let claimed = protection.judge(&claimant).report();
        std::sync::Arc::make_mut(host).protection = claimed;
    };
    for gpu in &mut snapshot.devices {
        for process in &mut gpu.processes {
            mark(process.pid, &mut process.host);
        }
        for holder in gpu.holders.iter_mut().flatten() {
            mark(holder.pid, &mut holder.host);
        }
    }
}

#[cfg(test)]
mod tests;
