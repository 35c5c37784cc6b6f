//! What the host knows about a process that NVML reports: user, command, state, identity,
//! age and owner. Only the PIDs NVML names are read, never all of /proc.

mod cache;
pub mod devfiles;
mod lineage;
pub mod tree;

pub use cache::FactCache;
pub use lineage::{LeaderState, Lineage, Relative, Relatives};

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use procfs::FromRead;
use procfs::process::{Process, Status};
use serde::Serialize;

use crate::owner::{CgroupInfo, Owner, parse_cgroup};
use crate::sys::procfile;

/// `PROC_PID_INIT_INO`: the inode number the kernel gives the initial PID namespace. A reader
/// whose own namespace has another inode sees PIDs that differ from the host PIDs NVML reports.
const INIT_PID_NS_INODE: u64 = 0xEFFF_FFFC;

/// Process state letters from /proc/PID/stat, named as `ps` documents them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcState {
    Running,
    Sleeping,
    DiskSleep,
    Stopped,
    TracingStop,
    Zombie,
    Dead,
    Idle,
    Other,
}

impl ProcState {
    pub fn from_letter(letter: char) -> ProcState {
        match letter {
            'R' => ProcState::Running,
            'S' => ProcState::Sleeping,
            'D' => ProcState::DiskSleep,
            'T' => ProcState::Stopped,
            't' => ProcState::TracingStop,
            'Z' => ProcState::Zombie,
            'X' | 'x' => ProcState::Dead,
            'I' => ProcState::Idle,
            _ => ProcState::Other,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ProcState::Running => "running",
            ProcState::Sleeping => "sleeping",
            ProcState::DiskSleep => "disk-sleep",
            ProcState::Stopped => "stopped",
            ProcState::TracingStop => "tracing-stop",
            ProcState::Zombie => "zombie",
            ProcState::Dead => "dead",
            ProcState::Idle => "idle",
            ProcState::Other => "other",
        }
    }
}

/// Host facts about one GPU process. When `confirmed` is false the PID could not be tied to a
/// local process (other PID namespace, hidden /proc, no permission): every other field is then
/// absent, so nothing is ever attributed to an unrelated process that has the same number.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostProcess {
    pub confirmed: bool,
    pub unconfirmed_reason: Option<String>,
    /// Who tied the listed process to this one where /proc alone could not: `host service`
    /// (`gpuctl serve`, for a process in this container's PID namespace). Absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confirmed_by: Option<&'static str>,
    /// Effective uid, as `ps` shows it.
    pub uid: Option<u32>,
    pub user: Option<String>,
    pub comm: Option<String>,
    pub argv: Option<Vec<String>>,
    pub command: Option<String>,
    pub state: Option<ProcState>,
    pub ppid: Option<u32>,
    pub pgid: Option<u32>,
    pub sid: Option<u32>,
    pub threads: Option<u32>,
    /// Start time in clock ticks since boot; with the PID, the process identity.
    pub start_ticks: Option<u64>,
    /// Shown as whole seconds (`age_seconds`), as old as the process is when shown.
    #[serde(rename = "age_seconds", serialize_with = "serialize_age")]
    pub age: Option<Age>,
    pub owner: Option<Owner>,
    pub cgroup: Option<String>,
    /// Whether it is the protected program it names itself after (see [`crate::protect`]);
    /// filled in by callers that show it (`gpuctl info`), `None` otherwise.
    pub protection: Option<Claimed>,
    /// The command line with each byte that is not UTF-8 written as `\xNN`, where it has
    /// any: what tables show. JSON carries `command` and `argv`, with U+FFFD in their place
    /// (a JSON string holds only UTF-8).
    #[serde(skip)]
    pub command_not_utf8: Option<String>,
}

/// A claim as reports carry it (`gpuctl info --json`'s `protection`): whether it is
/// the protected program it names itself after, as [`crate::protect`] judges it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Claimed {
    pub name: String,
    pub genuine: bool,
    /// Why it is not the program; `None` when it is.
    pub why: Option<String>,
}

/// How old a process is, kept current: facts a long-running reader keeps across passes (the
/// watchdog's cache) age with the clock, so a fact whose stat read again shows no change is
/// kept as it is instead of rebuilt each second for its age alone.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Age {
    /// Seconds since the process started, at `since`.
    seconds: f64,
    /// When `seconds` held, on the monotonic clock; `None` where the view's uptime counts in
    /// no clock of this machine (a fixture tree): the age stays as read.
    since: Option<Instant>,
}

impl Age {
    /// An age that stays `seconds` (tests, fixtures).
    pub fn fixed(seconds: u64) -> Age {
        Age {
            seconds: seconds as f64,
            since: None,
        }
    }

    /// Whole seconds, rounded down, as of now.
    pub fn seconds(self) -> u64 {
        let aged = self
            .since
            .map_or(0.0, |since| since.elapsed().as_secs_f64());
        (self.seconds + aged).max(0.0) as u64
    }
}

fn serialize_age<S: serde::Serializer>(
    age: &Option<Age>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    age.map(Age::seconds).serialize(serializer)
}

impl HostProcess {
    pub fn unconfirmed(reason: impl Into<String>) -> HostProcess {
        HostProcess {
            confirmed: false,
            unconfirmed_reason: Some(reason.into()),
            confirmed_by: None,
            uid: None,
            user: None,
            comm: None,
            argv: None,
            command: None,
            state: None,
            ppid: None,
            pgid: None,
            sid: None,
            threads: None,
            start_ticks: None,
            age: None,
            owner: None,
            cgroup: None,
            protection: None,
            command_not_utf8: None,
        }
    }

    /// A short command for tables: the command line, or `[comm]` when it has none (zombies,
    /// kernel threads), as `ps` shows them.
    pub fn display_command(&self) -> String {
        match (&self.command, &self.comm) {
            (Some(cmd), _) if !cmd.is_empty() => cmd.clone(),
            (_, Some(comm)) => format!("[{comm}]"),
            _ => "?".to_string(),
        }
    }

    /// The basename of argv[0], which a process chooses for itself (`exec -a`).
    pub fn argv0_name(&self) -> Option<&str> {
        let argv0 = self.argv.as_ref()?.first()?;
        // A byte search: '/' is never part of another UTF-8 character, and a char pattern's
        // searcher costs more than the few bytes of a usual argv[0] (the watchdog asks this
        // for every process on every GPU, each loop).
        let start = argv0
            .bytes()
            .rposition(|b| b == b'/')
            .map_or(0, |slash| slash + 1);
        Some(&argv0[start..])
    }

    /// Whole seconds since it started, as of now.
    pub fn age_seconds(&self) -> Option<u64> {
        self.age.map(|age| age.seconds())
    }

    /// "alice", or "uid 1000" where the name is unknown.
    pub fn user_name(&self) -> Option<String> {
        user_label(self.user.as_deref(), self.uid)
    }

    /// [`HostProcess::display_command`] with bytes that are not UTF-8 shown as `\xNN`.
    pub fn shown_command(&self) -> String {
        self.command_not_utf8
            .clone()
            .unwrap_or_else(|| self.display_command())
    }
}

/// A process's user as messages name it: its name, else "uid N".
pub fn user_label(user: Option<&str>, uid: Option<u32>) -> Option<String> {
    user.map(String::from)
        .or_else(|| uid.map(|uid| format!("uid {uid}")))
}

/// `bytes` as text, each byte that is not part of UTF-8 written as `\xNN`.
pub fn escape_not_utf8(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        out.push_str(chunk.valid());
        for byte in chunk.invalid() {
            out.push_str(&format!("\\x{byte:02x}"));
        }
    }
    out
}

/// How user names are found: through NSS (getpwuid_r, so LDAP and SSSD users on shared servers
/// resolve), or from a fixed table (golden tests over fixture trees).
#[derive(Debug, Clone)]
pub enum UserNames {
    Nss,
    Table(HashMap<u32, String>),
}

impl UserNames {
    /// Parses passwd(5) lines into a table.
    pub fn from_passwd(text: &str) -> UserNames {
        let table = text
            .lines()
            .filter_map(|line| {
                let mut fields = line.split(':');
                let name = fields.next()?;
                let uid = fields.nth(1)?.parse().ok()?;
                Some((uid, name.to_string()))
            })
            .collect();
        UserNames::Table(table)
    }

    fn lookup(&self, uid: u32) -> Option<String> {
        match self {
            UserNames::Nss => nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
                .ok()
                .flatten()
                .map(|user| user.name),
            UserNames::Table(table) => table.get(&uid).cloned(),
        }
    }
}

/// A view of one /proc tree: the real one, or a fixture tree in tests.
#[derive(Debug, Clone)]
pub struct ProcView {
    root: PathBuf,
    /// Whether PIDs under `root` are host PIDs, i.e. comparable with what NVML reports.
    host_pid_namespace: bool,
    /// `root` is a mounted procfs, not a fixture tree, so the kernel's rules hold: the
    /// /proc/PID directory is owned by the process's effective uid (one fstat instead of
    /// reading /proc/PID/status), and uptime is CLOCK_BOOTTIME.
    procfs: bool,
    uptime_seconds: f64,
    /// When `uptime_seconds` was read, where it is a clock of this machine (procfs).
    uptime_read_at: Option<Instant>,
    ticks_per_second: u64,
    users: UserNames,
}

impl ProcView {
    /// The running system's /proc.
    pub fn system() -> io::Result<ProcView> {
        let root = PathBuf::from("/proc");
        let host_pid_namespace = in_initial_pid_namespace(&root);
        ProcView::at(root, host_pid_namespace, UserNames::Nss)
    }

    /// A /proc tree at `root` (containing `uptime` and `PID/` directories).
    pub fn at(root: PathBuf, host_pid_namespace: bool, users: UserNames) -> io::Result<ProcView> {
        let uptime_seconds = read_uptime(&root.join("uptime"))?;
        let procfs = is_procfs(&root);
        Ok(ProcView {
            procfs,
            root,
            host_pid_namespace,
            uptime_seconds,
            uptime_read_at: procfs.then(Instant::now),
            ticks_per_second: procfs::ticks_per_second(),
            users,
        })
    }

    pub fn host_pid_namespace(&self) -> bool {
        self.host_pid_namespace
    }

    /// This view for PIDs known to be this namespace's own (the host service named them):
    /// their facts are read even where NVML's PIDs are the host's.
    pub fn as_local(&self) -> ProcView {
        ProcView {
            host_pid_namespace: true,
            ..self.clone()
        }
    }

    /// Reads the uptime again (the clock ages are computed against), keeping what does not
    /// change while a program runs: a long-running reader's view for its next pass. On
    /// procfs that is CLOCK_BOOTTIME, the clock /proc/uptime and process start times count
    /// in (both shifted alike by a time namespace), read without a file.
    pub fn refresh_uptime(&mut self) -> io::Result<()> {
        self.uptime_seconds = if self.procfs {
            boot_clock()?.as_secs_f64()
        } else {
            read_uptime(&self.root.join("uptime"))?
        };
        self.uptime_read_at = self.procfs.then(Instant::now);
        Ok(())
    }

    /// `at`, a reading of [`boot_clock`], in the unit of a process's start time (clock ticks
    /// since boot), rounded down as the kernel rounds start times; `None` for a fixture tree,
    /// whose start times count in no clock of this machine.
    pub fn boot_ticks(&self, at: Duration) -> Option<u64> {
        self.procfs.then(|| ticks_of(at, self.ticks_per_second))
    }

    /// Reads the host facts of each PID. User names are looked up once per distinct uid.
    pub fn processes(&self, pids: &[u32]) -> HashMap<u32, HostProcess> {
        let mut facts = self.read_in_parallel(pids);
        let mut names: HashMap<u32, Option<String>> = HashMap::new();
        for fact in facts.values_mut() {
            if let Some(uid) = fact.uid {
                fact.user = names
                    .entry(uid)
                    .or_insert_with(|| self.users.lookup(uid))
                    .clone();
            }
        }
        facts
    }

    fn age_of(&self, start_ticks: u64) -> Age {
        let started = start_ticks as f64 / self.ticks_per_second as f64;
        Age {
            seconds: (self.uptime_seconds - started).max(0.0),
            since: self.uptime_read_at,
        }
    }

    /// Reading /proc is kernel time (tens of microseconds a process on some VMs), so large
    /// sets are split across cores; small ones are not worth a thread.
    fn read_in_parallel(&self, pids: &[u32]) -> HashMap<u32, HostProcess> {
        const PIDS_PER_THREAD: usize = 32;
        let read = |part: &[u32]| -> Vec<(u32, HostProcess)> {
            part.iter().map(|&pid| (pid, self.process(pid))).collect()
        };
        if pids.len() < 2 * PIDS_PER_THREAD {
            // Not worth a thread; nor asking how many cores (that reads cgroup files).
            return read(pids).into_iter().collect();
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = cores.min(pids.len() / PIDS_PER_THREAD).max(1);
        if threads == 1 {
            return read(pids).into_iter().collect();
        }
        let chunk = pids.len().div_ceil(threads);
        std::thread::scope(|scope| {
            // This thread reads the first part itself: one thread fewer to start.
            let (first, rest) = pids.split_at(chunk);
            let workers: Vec<_> = rest
                .chunks(chunk)
                .map(|part| scope.spawn(move || read(part)))
                .collect();
            let mut facts: HashMap<u32, HostProcess> = read(first).into_iter().collect();
            for worker in workers {
                match worker.join() {
                    Ok(part) => facts.extend(part),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
            facts
        })
    }

    /// Reads the host facts of one PID; `user` is left for [`ProcView::processes`] to fill.
    pub fn process(&self, pid: u32) -> HostProcess {
        if !self.host_pid_namespace {
            return HostProcess::unconfirmed(
                "gpuctl runs in another PID namespace than the host; NVML reports host PIDs",
            );
        }
        match self.read_process(pid) {
            Ok(fact) => fact,
            Err(reason) => HostProcess::unconfirmed(reason),
        }
    }

    fn read_process(&self, pid: u32) -> Result<HostProcess, String> {
        let dir = self.root.join(pid.to_string());
        // Every file is opened through this one directory handle, so all facts are of one
        // process even if the pid is reused meanwhile.
        let process = Process::new_with_root(dir).map_err(|e| not_visible(pid, e))?;
        let stat_file = process
            .open_relative("stat")
            .map_err(|e| not_visible(pid, e))?;
        let stat = procfile::read_stat_line(&stat_file)
            .map_err(|e| format!("cannot read /proc/{pid}/stat: {e}"))?;
        if stat.pid != pid {
            return Err(format!("/proc/{pid}/stat names another pid ({})", stat.pid));
        }
        let uid = match process.uid() {
            // On procfs the /proc/PID directory is owned by the effective uid, root's
            // included: the kernel's task_dump_owner gives a non-dumpable process's files to
            // root but exempts its world-readable directories ("before /proc/pid/status
            // existed, stat of /proc/pid was the way to read the effective uid"). One fstat.
            Ok(owner) if self.procfs => owner,
            // A fixture tree: the status file is the only source.
            _ => {
                Status::from_read(read_relative(&process, "status", pid)?.as_slice())
                    .map_err(|e| not_visible(pid, e))?
                    .euid
            }
        };
        // A zombie's cmdline is empty; an unreadable one is not worth failing the whole entry.
        let cmdline = read_relative(&process, "cmdline", pid).unwrap_or_default();
        let (argv, command, command_not_utf8) = command_line(&cmdline);
        let cgroup = read_relative(&process, "cgroup", pid)
            .ok()
            .map(|text| parse_cgroup(&String::from_utf8_lossy(&text)));
        let environ_owner = environ_owner(&process, cgroup.as_ref(), pid, uid);
        let age = self.age_of(stat.starttime);
        Ok(HostProcess {
            confirmed: true,
            unconfirmed_reason: None,
            confirmed_by: None,
            uid: Some(uid),
            user: None,
            comm: Some(stat.comm.clone()),
            argv: Some(argv),
            command,
            state: Some(ProcState::from_letter(stat.state)),
            ppid: u32::try_from(stat.ppid).ok(),
            pgid: u32::try_from(stat.pgrp).ok(),
            sid: u32::try_from(stat.session).ok(),
            threads: u32::try_from(stat.num_threads).ok(),
            start_ticks: Some(stat.starttime),
            age: Some(age),
            owner: environ_owner.or_else(|| cgroup.as_ref().map(|c| c.owner.clone())),
            cgroup: cgroup.map(|c| c.path),
            protection: None,
            command_not_utf8,
        })
    }
}

/// A cmdline's arguments, the command they make (none for an empty cmdline, a zombie's),
/// and, when an argument is not UTF-8, the command with those bytes escaped.
fn command_line(cmdline: &[u8]) -> (Vec<String>, Option<String>, Option<String>) {
    let args: Vec<&[u8]> = cmdline
        .split(|&byte| byte == 0)
        .filter(|arg| !arg.is_empty())
        .collect();
    let argv: Vec<String> = args
        .iter()
        .map(|arg| String::from_utf8_lossy(arg).into_owned())
        .collect();
    let command = (!argv.is_empty()).then(|| argv.join(" "));
    let command_not_utf8 = args
        .iter()
        .any(|arg| std::str::from_utf8(arg).is_err())
        .then(|| {
            args.iter()
                .map(|arg| escape_not_utf8(arg))
                .collect::<Vec<_>>()
                .join(" ")
        });
    (argv, command, command_not_utf8)
}

/// The job a process's environment names, read only where no cgroup names one.
fn environ_owner(
    process: &Process,
    cgroup: Option<&CgroupInfo>,
    pid: u32,
    uid: u32,
) -> Option<Owner> {
    // No cgroup names a job (Slurm's proctrack/linuxproc leaves job processes in
    // slurmd's own unit, or in none): the environment's SLURM_JOB_ID, where this user
    // may read it (root, or the process's owner), is the fallback. Any process can set
    // it, so it is kept as its uid's claim (`slurm:JOB@UID`), never the job itself.
    match cgroup.map(|c| &c.owner) {
        None | Some(Owner::None) => true,
        Some(Owner::SystemdUnit { unit }) => unit == "slurmd.service",
        Some(_) => false,
    }
    .then(|| read_relative(process, "environ", pid).ok())
    .flatten()
    .and_then(|environ| crate::owner::slurm_job_from_environ(&environ, uid))
}

/// The start time (boot ticks) of `pid` in this namespace's /proc, while it runs: with the
/// pid, its identity. One bounded read of its stat file.
pub fn start_ticks(pid: u32) -> Option<u64> {
    let file = std::fs::File::open(format!("/proc/{pid}/stat")).ok()?;
    let stat = procfile::read_stat_line(&file).ok()?;
    (stat.pid == pid).then_some(stat.starttime)
}

/// CLOCK_BOOTTIME now: the clock /proc/uptime and process start times count in (both
/// shifted alike by a time namespace). A vDSO call, no file.
pub fn boot_clock() -> io::Result<Duration> {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)?;
    Ok(Duration::new(now.tv_sec() as u64, now.tv_nsec() as u32))
}

/// `at` in whole clock ticks, rounded down as the kernel's `nsec_to_clock_t` rounds a
/// process's start time.
fn ticks_of(at: Duration, ticks_per_second: u64) -> u64 {
    u64::try_from(at.as_nanos() * u128::from(ticks_per_second) / 1_000_000_000).unwrap_or(u64::MAX)
}

/// A whole /proc file, read through the process's directory handle.
fn read_relative(process: &Process, name: &str, pid: u32) -> Result<Vec<u8>, String> {
    let file = process
        .open_relative(name)
        .map_err(|e| not_visible(pid, e))?;
    read_all(file).map_err(|e| format!("cannot read /proc/{pid}/{name}: {e}"))
}

fn read_all(file: std::fs::File) -> io::Result<Vec<u8>> {
    // Freshly opened: reading from offset 0 is reading it whole.
    procfile::pread_all(&file)
}

fn not_visible(pid: u32, error: procfs::ProcError) -> String {
    match error {
        procfs::ProcError::PermissionDenied(_) => {
            format!("no permission to read /proc/{pid}")
        }
        procfs::ProcError::NotFound(_) => {
            format!("pid {pid} is not visible in /proc (exited, or hidden by hidepid)")
        }
        other => format!("cannot read /proc/{pid}: {other}"),
    }
}

fn read_uptime(path: &Path) -> io::Result<f64> {
    let text = std::fs::read_to_string(path)?;
    text.split_whitespace()
        .next()
        .and_then(|field| field.parse().ok())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: no uptime", path.display()),
            )
        })
}

fn is_procfs(root: &Path) -> bool {
    nix::sys::statfs::statfs(root)
        .is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::PROC_SUPER_MAGIC)
}

/// True when `root`'s own process is in the initial PID namespace.
fn in_initial_pid_namespace(root: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    // When the namespace cannot be read (very old kernels), assume the host view as NVML's
    // own tools do; the pid namespace file exists on every kernel NVIDIA still supports.
    std::fs::metadata(root.join("self/ns/pid"))
        .map(|meta| meta.ino() == INIT_PID_NS_INODE)
        .unwrap_or(true)
}

/// A user name or uid, as a uid: what `--user` (and the Python package's `user=`) names.
pub fn uid_of(user: &str) -> std::result::Result<u32, String> {
    if let Ok(uid) = user.parse::<u32>() {
        return Ok(uid);
    }
    match nix::unistd::User::from_name(user) {
        Ok(Some(found)) => Ok(found.uid.as_raw()),
        Ok(None) => Err(format!("no such user '{user}'")),
        Err(error) => Err(format!("cannot look up user '{user}': {error}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv0_names_are_what_follows_the_last_slash() {
        let name = |argv0: Option<&str>| {
            let mut process = HostProcess::unconfirmed("test");
            process.argv = argv0.map(|a| vec![a.to_string(), "--flag=/x".to_string()]);
            process.argv0_name().map(str::to_string)
        };
        assert_eq!(
            name(Some("/usr/bin/nvidia-cuda-mps-server")).as_deref(),
            Some("nvidia-cuda-mps-server")
        );
        assert_eq!(name(Some("python3")).as_deref(), Some("python3"));
        assert_eq!(name(Some("./dir/")).as_deref(), Some(""));
        assert_eq!(
            name(Some("/opt/naïve/überlauf")).as_deref(),
            Some("überlauf")
        );
        assert_eq!(name(Some("")).as_deref(), Some(""));
        assert_eq!(name(None), None);
    }

    #[test]
    fn state_letters_map_to_ps_names() {
        assert_eq!(ProcState::from_letter('D').as_str(), "disk-sleep");
        assert_eq!(ProcState::from_letter('Z'), ProcState::Zombie);
        assert_eq!(ProcState::from_letter('t'), ProcState::TracingStop);
        assert_eq!(ProcState::from_letter('?'), ProcState::Other);
    }

    #[test]
    fn passwd_table_skips_malformed_lines() {
        let names = UserNames::from_passwd(
            "root:x:0:0::/root:/bin/sh\nbroken\nalice:x:1000:1000::/h:/bin/sh\nbad:x:notanumber:0::/:/\n",
        );
        assert_eq!(names.lookup(0).as_deref(), Some("root"));
        assert_eq!(names.lookup(1000).as_deref(), Some("alice"));
        assert_eq!(names.lookup(1), None);
    }

    #[test]
    fn own_process_is_confirmed_with_identity() {
        let view = ProcView::system().unwrap();
        let me = std::process::id();
        let facts = view.processes(&[me]);
        let fact = &facts[&me];
        if view.host_pid_namespace() {
            assert!(fact.confirmed, "{fact:?}");
            assert_eq!(fact.uid, Some(nix::unistd::getuid().as_raw()));
            assert!(fact.start_ticks.is_some());
            assert_eq!(fact.ppid, Some(std::os::unix::process::parent_id()));
        } else {
            assert!(!fact.confirmed);
        }
    }

    /// The effective uid comes from one fstat of /proc/PID even for a process that cannot be
    /// dumped, whose files procfs gives to root: what lets `info` skip /proc/PID/status.
    #[test]
    fn a_non_dumpable_process_keeps_its_own_uid() {
        let view = ProcView::system().unwrap();
        if !view.host_pid_namespace() {
            eprintln!("skipped: not in the host PID namespace");
            return;
        }
        let expected = if nix::unistd::geteuid().is_root() {
            65534
        } else {
            nix::unistd::geteuid().as_raw()
        };
        // PR_SET_DUMPABLE (4) to 0, then say so and wait.
        let mut command = std::process::Command::new("python3");
        command.args([
            "-c",
            "import ctypes, sys; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); \
             print('ready', flush=True); sys.stdin.read()",
        ]);
        let (mut child, line) = spawn_reading_line(not_root(command));
        assert_eq!(line.trim(), "ready");
        let pid = child.id();
        let stat_owner = {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(format!("/proc/{pid}/stat"))
                .unwrap()
                .uid()
        };
        assert_eq!(
            stat_owner, 0,
            "procfs gives a non-dumpable process's files to root"
        );
        let fact = &view.processes(&[pid])[&pid];
        drop(child.stdin.take());
        child.wait().unwrap();
        assert_eq!(fact.uid, Some(expected), "{fact:?}");
    }

    /// `command`, as a user other than root: nobody (65534) when the tests run as root,
    /// with a PATH of system directories that user can reach.
    pub(super) fn not_root(mut command: std::process::Command) -> std::process::Command {
        use std::os::unix::process::CommandExt;
        if nix::unistd::geteuid().is_root() {
            command
                .uid(65534)
                .gid(65534)
                .env("PATH", "/usr/local/bin:/usr/bin:/bin")
                .current_dir("/");
        }
        command
    }

    /// Starts `command` with piped stdin and stdout and returns it with its first line.
    pub(super) fn spawn_reading_line(
        mut command: std::process::Command,
    ) -> (std::process::Child, String) {
        let mut child = command
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        (child, line)
    }

    /// A fact kept across passes ages with the clock; one read from a fixture tree does not.
    #[test]
    fn an_age_counts_on_from_its_reading_and_a_fixture_age_stays() {
        let read = Age {
            seconds: 10.5,
            since: Some(Instant::now() - Duration::from_secs(2)),
        };
        assert_eq!(read.seconds(), 12);
        assert_eq!(Age::fixed(60).seconds(), 60);
        let mut fact = HostProcess::unconfirmed("test");
        fact.age = Some(read);
        let json = serde_json::to_value(&fact).unwrap();
        assert_eq!(json["age_seconds"], 12, "{json}");
    }

    /// Rounded down as the kernel rounds start times, so a moment and a process started
    /// in the same tick compare equal.
    #[test]
    fn boot_clock_readings_round_down_to_whole_ticks() {
        assert_eq!(ticks_of(Duration::from_nanos(2_999_999_999), 100), 299);
        assert_eq!(ticks_of(Duration::from_secs(3), 100), 300);
        assert_eq!(ticks_of(Duration::from_millis(1_234), 1000), 1_234);
        assert_eq!(ticks_of(Duration::ZERO, 100), 0);
    }

    /// The clock read agrees with /proc: this process started before now.
    #[test]
    fn this_process_started_no_later_than_the_boot_clock_reads() {
        let view = ProcView::system().unwrap();
        let me = std::process::id();
        let Some(started) = view.process(me).start_ticks else {
            return;
        };
        let now = view.boot_ticks(boot_clock().unwrap()).unwrap();
        assert!(started <= now, "started {started}, now {now}");
    }

    #[test]
    fn bytes_that_are_not_utf8_are_shown_as_hex() {
        assert_eq!(escape_not_utf8(b"train.py"), "train.py");
        assert_eq!(escape_not_utf8(b"a\xffb\xc3"), "a\\xffb\\xc3");
        assert_eq!(escape_not_utf8("é✓".as_bytes()), "é✓");
    }
}
