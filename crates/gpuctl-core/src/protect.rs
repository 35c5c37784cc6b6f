//! Protection by identity. The programs that keep GPUs and displays working (and those the
//! configuration's `protect` lists name) are never signalled, but a name is not an identity:
//! any process can call itself `nvidia-persistenced` (`exec -a`, `prctl(PR_SET_NAME)`). So a
//! process that claims a protected name, by its command name or argv[0], is spared only when
//! it *is* that program:
//!
//! - its executable (`/proc/PID/exe`, resolved in the process's own root, so a container's
//!   files are the container's) is a regular file owned by root and writable by no one else;
//! - so is every directory above it, up to `/`: only root could have put the file there;
//! - the file is the program: its name is the protected name, or the protected name in the
//!   same directory (or a system bin directory) is a link to the same file (`X` to `Xorg`);
//! - it runs as root or as one of the program's own users, where the program has such users
//!   (a display server runs as its session's user, and a name the configuration protects may
//!   run as anyone).
//!
//! A process that claims a name without being the program is an impostor: not protected,
//! and said so (`gpuctl info`, the watchdog's log).

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::host::{Claimed, HostProcess};

/// A program that is never signalled, and the users it may run as (none listed: any user).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    pub name: String,
    pub users: Vec<String>,
}

/// The built-in programs: NVIDIA's daemons (root, or persistenced's own user) and display
/// servers (any user: they run as the session's user).
pub const BUILT_IN: &[(&str, &[&str])] = &[
    ("nvidia-persistenced", &["root", "nvidia-persistenced"]),
    ("nv-hostengine", &["root"]),
    ("nvidia-fabricmanager", &["root"]),
    ("nvidia-powerd", &["root"]),
    // Monitoring clients: they open every GPU's device file and hold no memory.
    ("nvidia-smi", &[]),
    ("dcgmi", &[]),
    ("dcgm-exporter", &[]),
    ("nvidia_gpu_exporter", &[]),
    ("Xorg", &[]),
    ("X", &[]),
    ("Xwayland", &[]),
    ("gnome-shell", &[]),
    ("kwin_wayland", &[]),
    ("kwin_x11", &[]),
    ("weston", &[]),
    ("sway", &[]),
    ("Hyprland", &[]),
    ("gdm-x-session", &[]),
    ("gdm-wayland-session", &[]),
];

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

/// The programs never signalled, and the users whose processes automatic reclaim spares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Protection {
    pub programs: Vec<Program>,
    pub users: Vec<String>,
}

impl Protection {
    /// The built-in programs, and the configuration's `[protect]` lists (their commands may
    /// run as any user).
    pub fn configured(protect: &crate::config::Protect) -> Protection {
        Protection::built_in().with(&protect.commands, &protect.users)
    }

    pub fn built_in() -> Protection {
        Protection {
            programs: BUILT_IN
                .iter()
                .map(|(name, users)| Program {
                    name: name.to_string(),
                    users: users.iter().map(|u| u.to_string()).collect(),
                })
                .collect(),
            users: Vec::new(),
        }
    }

    /// More commands (any user) and users on top (the watchdog's own lists).
    pub fn with(mut self, commands: &[String], users: &[String]) -> Protection {
        self.programs.extend(commands.iter().map(|name| Program {
            name: name.clone(),
            users: Vec::new(),
        }));
        self.users.extend(users.iter().cloned());
        self
    }

    /// Programs only: an explicit `kill` is the admin's call, so users are not spared.
    pub fn programs_only(self) -> Protection {
        Protection {
            users: Vec::new(),
            ..self
        }
    }

    /// The protected program a process names itself after, if any: its command name (the
    /// kernel keeps 15 characters) or argv[0]'s basename.
    pub fn claimed(&self, claimant: &Claimant) -> Option<&Program> {
        self.programs.iter().find(|program| {
            let name = program.name.as_str();
            claimant
                .comm
                .is_some_and(|comm| comm == name || (comm.len() == 15 && name.starts_with(comm)))
                || claimant.argv0 == Some(name)
        })
    }

    /// Whether the process is the protected program it claims to be (see the module's
    /// rule). Reads /proc only for a process that claims a protected name.
    pub fn judge(&self, claimant: &Claimant) -> Claim {
        let Some(program) = self.claimed(claimant) else {
            return Claim::None;
        };
        match verify(program, claimant, Path::new("/proc")) {
            Ok(()) => Claim::Genuine(program.name.clone()),
            Err(why) => Claim::Impostor {
                name: program.name.clone(),
                why,
            },
        }
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
    let inside = |path: &Path| root.join(path.strip_prefix("/").unwrap_or(path));
    for ancestor in exe.ancestors().skip(1) {
        let meta = fs::metadata(inside(ancestor))
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
                fs::metadata(inside(&bin.join(&program.name))).is_ok_and(|meta| {
                    meta.dev() == file.dev() && meta.ino() == file.ino() && trusted(&meta).is_ok()
                })
            })
    };
    if !named && !linked() {
        return Err(format!("its executable is {shown}"));
    }
    if !program.users.is_empty() {
        let uid = claimant
            .uid
            .ok_or_else(|| "its user is unknown".to_string())?;
        let allowed = uid == 0
            || program.users.iter().any(|user| {
                nix::unistd::User::from_name(user)
                    .ok()
                    .flatten()
                    .is_some_and(|found| found.uid.as_raw() == uid)
            });
        if !allowed {
            return Err(format!(
                "it runs as uid {uid}, not as root or {}",
                program.users.join(" or ")
            ));
        }
    }
    Ok(())
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
/// (/proc/PID/exe and the directories above it).
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
mod tests {
    use super::*;

    fn claimant<'a>(pid: u32, comm: &'a str, argv0: &'a str) -> Claimant<'a> {
        Claimant {
            pid,
            uid: Some(nix::unistd::geteuid().as_raw()),
            comm: Some(comm),
            argv0: Some(argv0),
        }
    }

    /// `/usr/bin/sleep` (or `/bin/sleep`) started as `argv0`, once it runs that binary.
    fn system_sleep(argv0: &str) -> std::process::Child {
        use std::os::unix::process::CommandExt;
        let sleep = ["/usr/bin/sleep", "/bin/sleep"]
            .into_iter()
            .find(|path| Path::new(path).exists())
            .expect("no sleep binary in /usr/bin or /bin");
        let child = std::process::Command::new(sleep)
            .arg0(argv0)
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        // Until exec, its exe is this test's.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while fs::read_link(format!("/proc/{pid}/exe"))
            .is_ok_and(|exe| !exe.to_string_lossy().contains("sleep"))
        {
            assert!(std::time::Instant::now() < deadline);
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        child
    }

    #[test]
    fn names_are_claimed_by_comm_cut_to_15_or_by_argv0() {
        let protection = Protection::built_in();
        let claimed = |comm, argv0| {
            protection
                .claimed(&claimant(1, comm, argv0))
                .map(|p| p.name.clone())
        };
        assert_eq!(
            claimed("nvidia-persiste", "x").as_deref(),
            Some("nvidia-persistenced")
        );
        assert_eq!(claimed("python3", "Xorg").as_deref(), Some("Xorg"));
        assert_eq!(claimed("python3", "train.py"), None);
        assert_eq!(
            claimed("nvidia-persist", "x"),
            None,
            "a short comm is whole"
        );
    }

    #[test]
    fn this_test_binary_is_no_protected_program_whatever_it_claims() {
        let protection = Protection::built_in();
        let me = std::process::id();
        match protection.judge(&claimant(me, "nvidia-persiste", "nvidia-persistenced")) {
            Claim::Impostor { name, why } => {
                assert_eq!(name, "nvidia-persistenced");
                assert!(!why.is_empty());
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            protection.judge(&claimant(me, "cargo", "cargo")),
            Claim::None
        );
    }

    /// A system binary run under a protected name is still not that program: being in a
    /// root-owned directory is not enough, the file must be the program.
    #[test]
    fn a_system_binary_renamed_is_an_impostor() {
        let mut child = system_sleep("nvidia-persistenced");
        let pid = child.id();
        let judged = Protection::built_in().judge(&claimant(pid, "sleep", "nvidia-persistenced"));
        child.kill().unwrap();
        child.wait().unwrap();
        match judged {
            Claim::Impostor { why, .. } => assert!(why.contains("sleep"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_genuine_system_binary_under_its_own_name_is_protected() {
        let mut child = system_sleep("sleep");
        let exe = fs::metadata(format!("/proc/{}/exe", child.id())).unwrap();
        assert!(
            trusted(&exe).is_ok(),
            "the system's sleep is not root's: this machine's system directories are not"
        );
        let pid = child.id();
        let protection = Protection::default().with(&["sleep".to_string()], &[]);
        let judged = protection.judge(&claimant(pid, "sleep", "sleep"));
        // A program with its own users refuses anyone else.
        let mut only_daemon = protection.clone();
        only_daemon.programs[0].users = vec!["a-user-that-does-not-exist".into()];
        let as_other = Claimant {
            uid: Some(65534),
            ..claimant(pid, "sleep", "sleep")
        };
        let refused = only_daemon.judge(&as_other);
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(judged, Claim::Genuine("sleep".into()));
        assert!(
            matches!(&refused, Claim::Impostor { why, .. } if why.contains("uid 65534")),
            "{refused:?}"
        );
    }
}
