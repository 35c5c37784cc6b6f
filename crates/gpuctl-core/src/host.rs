//! What the host knows about a process that NVML reports: user, command, state, identity,
//! age and owner. Only the PIDs NVML names are read, never all of /proc.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use procfs::FromRead;
use procfs::process::{Process, Status};
use serde::Serialize;

use crate::owner::{Owner, parse_cgroup};
use crate::pidmap::{PidMap, PidSet};

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
    pub age_seconds: Option<u64>,
    pub owner: Option<Owner>,
    pub cgroup: Option<String>,
}

impl HostProcess {
    pub fn unconfirmed(reason: impl Into<String>) -> HostProcess {
        HostProcess {
            confirmed: false,
            unconfirmed_reason: Some(reason.into()),
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
            age_seconds: None,
            owner: None,
            cgroup: None,
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
}

/// The state of a process group's leader, seen from a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaderState {
    /// The process leads its own group.
    Itself,
    Alive,
    /// Exited, not yet reaped.
    Zombie,
    /// No such process, or its number now belongs to a process of another group.
    Gone,
}

/// A process related to a GPU process (its parent), as /proc shows it now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Relative {
    pub pid: u32,
    pub pgid: u32,
    pub sid: u32,
    /// Shared: every worker of a run carries its parent's.
    pub comm: Arc<str>,
    pub state: ProcState,
}

/// Whether the run a process belongs to is still there: the evidence classification reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Lineage {
    pub leader: LeaderState,
    /// `None` when the parent cannot be read (pid 0, or it exited just now).
    pub parent: Option<Relative>,
    /// Children that are not zombies; `None` where the kernel does not list children
    /// (CONFIG_PROC_CHILDREN) or they were not asked for.
    pub live_children: Option<u32>,
}

/// Stats of related processes (group leaders, parents) read during one pass, so each is
/// read once. Kept by a [`FactCache`] across passes, a relative is read again once it is
/// as old as the cache's known processes may be.
#[derive(Debug, Default)]
pub struct Relatives {
    seen: PidMap<u32, SeenRelative>,
    /// The pass being read, and how long a relative read in an earlier one stays good.
    pass: u64,
    fresh_for: Duration,
    now: Option<Instant>,
}

#[derive(Debug)]
struct SeenRelative {
    relative: Option<Relative>,
    /// `None` until first read.
    read_at: Option<Instant>,
    read_pass: u64,
    used_pass: u64,
}

impl Relatives {
    /// Starts a pass: relatives read less than `fresh_for` ago are kept.
    fn start_pass(&mut self, fresh_for: Duration) {
        self.pass += 1;
        self.fresh_for = fresh_for;
        self.now = Some(Instant::now());
    }

    /// Forgets the relatives this pass did not ask for.
    fn end_pass(&mut self) {
        let pass = self.pass;
        self.seen.retain(|_, seen| seen.used_pass == pass);
    }
}

/// Host facts kept across passes by a long-running reader (the watchdog): for a process
/// seen before with the same start time, only /proc/PID/stat is read again; its command
/// line, user and cgroup owner are kept (they rarely change, and a change is picked up when
/// the process is read anew).
#[derive(Debug, Default)]
pub struct FactCache {
    known: PidMap<u32, Known>,
    /// A known process is looked at again only this long after the last look; until then
    /// its facts are reused whole, age included. Zero: every pass.
    refresh_every: Duration,
    /// Where the owner check stands in for reading the stat (see [`Known`]), the stat
    /// itself is read only this often. `None`: every look reads it.
    stat_every: Option<Duration>,
    /// Pidfds on the parents of owner-checked processes. One becomes readable once the
    /// parent's whole thread group has exited, which is when its children are reparented
    /// (their ppid changes: the orphan evidence).
    parents: PidMap<u32, OwnedFd>,
    /// How many files (stat files, parent pidfds) are held open, and the most that may be.
    open: usize,
    max_open: usize,
    /// Counts calls, so that entries not listed in the latest one can be told apart.
    pass: u64,
    /// Leaders and parents, read as often as known processes are looked at.
    relatives: Relatives,
}

/// A known process. Reading its stat again costs the kernel formatting 52 fields (3-4 µs
/// when cold, every loop for every process at the default interval). The one change that
/// must be seen within a second and that no event reports is its main thread exiting (a
/// zombie holder). That thread's exit also drops its memory map, after which procfs gives
/// the process's files to root (it does so for processes that cannot be dumped): so for a
/// process not run by root, an `fstat` of its held stat file (0.2 µs) still showing its own
/// uid means its main thread lives. Its parent's exit (reparenting) is reported by the
/// parent's pidfd. Everything else is read with the stat, every `stat_every`.
#[derive(Debug)]
struct Known {
    fact: Arc<HostProcess>,
    /// When it was last looked at (stat read, or owner checked).
    read_at: Instant,
    /// When its stat was last read.
    stat_at: Instant,
    /// Its /proc/PID/stat, kept open: reading it again is one `pread` (2 µs) instead of
    /// open, read and close (10 µs on a VM). An open stat file stays bound to its process:
    /// once that process has exited it fails (ESRCH), so a reused pid is never read through
    /// it.
    stat: Option<std::fs::File>,
    /// The uid its stat file was owned by when last read, where the owner check applies
    /// (not root, its main thread alive then, stat file held).
    owner: Option<u32>,
    /// The last call that listed it.
    pass: u64,
}

impl FactCache {
    /// A cache that looks at a known process again at most every `refresh_every`. A reader
    /// acting on facts only after they have held for a grace period can afford facts that
    /// much older; signals are still bound to the identity the kernel reports at the time.
    pub fn refreshing_every(refresh_every: Duration) -> FactCache {
        FactCache {
            refresh_every,
            max_open: open_file_budget(),
            ..FactCache::default()
        }
    }

    /// Lets the owner check stand in for reading the stat of a process not run by root,
    /// whose parent is watched (see [`Known`]); the stat is then read every `every`. What
    /// only the stat shows (stopped, its group or thread count changed) is seen that late.
    pub fn reading_stat_every(mut self, every: Duration) -> FactCache {
        self.stat_every = Some(every);
        self
    }

    /// Runs `read` over the relatives kept for lineages (see [`Relatives`]), then forgets
    /// those it did not ask for.
    pub(crate) fn with_relatives<T>(&mut self, read: impl FnOnce(&mut Relatives) -> T) -> T {
        self.relatives.start_pass(self.refresh_every);
        let out = read(&mut self.relatives);
        self.relatives.end_pass();
        out
    }

    /// Stops watching the parents whose whole thread group has exited since the last pass,
    /// so that their children are read (and watch their new parents).
    fn forget_exited_parents(&mut self) {
        if self.parents.is_empty() {
            return;
        }
        let exited = readable_pidfds(self.parents.iter().map(|(&pid, fd)| (pid, fd.as_raw_fd())));
        for pid in &exited {
            self.parents.remove(pid);
            self.open -= 1;
        }
    }

    /// Holds a pidfd on the parent of each owner-checked process, and only those.
    fn watch_parents(&mut self) {
        let needed: PidSet<u32> = self
            .known
            .values()
            .filter(|known| known.owner.is_some())
            .filter_map(|known| known.fact.ppid.filter(|&ppid| ppid > 1))
            .collect();
        let before = self.parents.len();
        self.parents.retain(|pid, _| needed.contains(pid));
        self.open -= before - self.parents.len();
        for ppid in needed {
            if self.open >= self.max_open || self.parents.contains_key(&ppid) {
                continue;
            }
            // Opened after the child's stat named it: if the parent had exited meanwhile and
            // its pid were taken at once, the event would never come and the change would be
            // seen at the next stat read.
            // Readable once the parent's whole thread group has exited.
            let parent = libc::pid_t::try_from(ppid).ok();
            if let Some(fd) = parent.and_then(|pid| crate::act::pidfd_open(pid).ok()) {
                self.parents.insert(ppid, fd);
                self.open += 1;
            }
        }
    }

    /// The facts of a pid listed in the latest [`ProcView::processes_cached`] call.
    pub fn get(&self, pid: u32) -> Option<&Arc<HostProcess>> {
        self.known
            .get(&pid)
            .filter(|known| known.pass == self.pass)
            .map(|known| &known.fact)
    }
}

impl std::ops::Index<&u32> for FactCache {
    type Output = Arc<HostProcess>;

    fn index(&self, pid: &u32) -> &Arc<HostProcess> {
        self.get(*pid).expect("pid listed in the latest pass")
    }
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
    /// reading /proc/PID/status), the files in it turn root's when the process cannot be
    /// dumped or its main thread has exited (the owner check), and uptime is
    /// CLOCK_BOOTTIME.
    procfs: bool,
    uptime_seconds: f64,
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
        Ok(ProcView {
            procfs: is_procfs(&root),
            root,
            host_pid_namespace,
            uptime_seconds,
            ticks_per_second: procfs::ticks_per_second(),
            users,
        })
    }

    pub fn host_pid_namespace(&self) -> bool {
        self.host_pid_namespace
    }

    /// Reads the uptime again (the clock ages are computed against), keeping what does not
    /// change while a program runs: a long-running reader's view for its next pass. On
    /// procfs that is CLOCK_BOOTTIME, the clock /proc/uptime and process start times count
    /// in (both shifted alike by a time namespace), read without a file.
    pub fn refresh_uptime(&mut self) -> io::Result<()> {
        self.uptime_seconds = if self.procfs {
            let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)?;
            now.tv_sec() as f64 + now.tv_nsec() as f64 / 1e9
        } else {
            read_uptime(&self.root.join("uptime"))?
        };
        Ok(())
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

    /// [`ProcView::processes`], reusing what `cache` knows of processes seen before; the
    /// cache keeps only the pids of this call, and answers for them until the next.
    pub fn processes_cached<'c>(&self, pids: &[u32], cache: &'c mut FactCache) -> &'c FactCache {
        let now = Instant::now();
        cache.pass += 1;
        let pass = cache.pass;
        cache.forget_exited_parents();
        let mut listed = 0;
        let mut unknown = Vec::new();
        for &pid in pids {
            let Some(known) = cache.known.get_mut(&pid) else {
                unknown.push(pid);
                continue;
            };
            if known.pass == pass {
                continue;
            }
            known.pass = pass;
            listed += 1;
            if now.duration_since(known.read_at) < cache.refresh_every {
                continue;
            }
            // A parent that exited is no longer watched: its children are read.
            let ppid = known.fact.ppid.unwrap_or(0);
            let parent_watched = ppid <= 1 || cache.parents.contains_key(&ppid);
            if let (Some(uid), Some(stat_every)) = (known.owner, cache.stat_every)
                && parent_watched
                && now.duration_since(known.stat_at) < stat_every
                && known.stat.as_ref().and_then(owner_uid) == Some(uid)
            {
                known.read_at = now;
                continue;
            }
            let may_open = cache.open < cache.max_open;
            let held = known.stat.is_some();
            match self.refresh(pid, known, may_open) {
                Some(fresh) => {
                    // Not for a stopped or exited process: its next change (continued,
                    // reaped) must be seen as soon as it happens.
                    let running = matches!(
                        fresh.state,
                        Some(ProcState::Running | ProcState::Sleeping | ProcState::DiskSleep)
                    );
                    known.owner = cache
                        .stat_every
                        .and(fresh.uid)
                        .filter(|&uid| self.procfs && running && uid != 0)
                        .filter(|&uid| known.stat.as_ref().and_then(owner_uid) == Some(uid));
                    known.fact = Arc::new(fresh);
                    known.read_at = now;
                    known.stat_at = now;
                }
                None => {
                    known.stat = None;
                    // Read anew below; its entry is replaced.
                    known.pass = 0;
                    listed -= 1;
                    unknown.push(pid);
                }
            }
            match (held, known.stat.is_some()) {
                (false, true) => cache.open += 1,
                (true, false) => cache.open -= 1,
                _ => {}
            }
        }
        unknown.sort_unstable();
        unknown.dedup();
        for (pid, fact) in self.processes(&unknown) {
            let known = Known {
                fact: Arc::new(fact),
                read_at: now,
                stat_at: now,
                stat: None,
                owner: None,
                pass,
            };
            if let Some(old) = cache.known.insert(pid, known)
                && old.stat.is_some()
            {
                cache.open -= 1;
            }
            listed += 1;
        }
        // Only the processes of this call are kept.
        if cache.known.len() > listed {
            let mut closed = 0;
            cache.known.retain(|_, known| {
                let keep = known.pass == pass;
                if !keep && known.stat.is_some() {
                    closed += 1;
                }
                keep
            });
            cache.open -= closed;
        }
        cache.watch_parents();
        cache
    }

    /// A known process's facts with its stat read again (through its held stat file, or one
    /// opened now and kept when `may_open`); `None` when it is not the same process any
    /// more (another start time), or was not confirmed.
    fn refresh(&self, pid: u32, known: &mut Known, may_open: bool) -> Option<HostProcess> {
        if !known.fact.confirmed || !self.host_pid_namespace {
            return None;
        }
        let stat = match &known.stat {
            Some(file) => read_stat_line(file).ok()?,
            None => {
                let file =
                    std::fs::File::open(self.root.join(pid.to_string()).join("stat")).ok()?;
                let stat = read_stat_line(&file).ok()?;
                if may_open {
                    known.stat = Some(file);
                }
                stat
            }
        };
        // The start time is checked on every read, held file or not.
        if Some(stat.starttime) != known.fact.start_ticks || stat.pid != pid {
            return None;
        }
        let mut fact = HostProcess::clone(&known.fact);
        fact.state = Some(ProcState::from_letter(stat.state));
        fact.ppid = u32::try_from(stat.ppid).ok();
        fact.pgid = u32::try_from(stat.pgrp).ok();
        fact.sid = u32::try_from(stat.session).ok();
        fact.threads = u32::try_from(stat.num_threads).ok();
        fact.comm = Some(stat.comm);
        fact.age_seconds = Some(self.age_of(stat.starttime));
        Some(fact)
    }

    fn age_of(&self, start_ticks: u64) -> u64 {
        let started = start_ticks as f64 / self.ticks_per_second as f64;
        (self.uptime_seconds - started).max(0.0) as u64
    }

    /// Reading /proc is kernel time (tens of microseconds a process on some VMs), so large
    /// sets are split across cores; small ones are not worth a thread.
    fn read_in_parallel(&self, pids: &[u32]) -> HashMap<u32, HostProcess> {
        const PIDS_PER_THREAD: usize = 32;
        if pids.len() < 2 * PIDS_PER_THREAD {
            // Not worth a thread; nor asking how many cores (that reads cgroup files).
            return pids.iter().map(|&pid| (pid, self.process(pid))).collect();
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = cores.min(pids.len() / PIDS_PER_THREAD).max(1);
        if threads == 1 {
            return pids.iter().map(|&pid| (pid, self.process(pid))).collect();
        }
        let chunk = pids.len().div_ceil(threads);
        std::thread::scope(|scope| {
            let workers: Vec<_> = pids
                .chunks(chunk)
                .map(|part| {
                    scope.spawn(move || {
                        part.iter()
                            .map(|&pid| (pid, self.process(pid)))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|worker| match worker.join() {
                    Ok(facts) => facts,
                    Err(panic) => std::panic::resume_unwind(panic),
                })
                .collect()
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

    /// The lineage of a confirmed process: its group leader and parent, and, when
    /// `with_children`, how many live children it has. `None` for an unconfirmed process.
    pub fn lineage(
        &self,
        pid: u32,
        host: &HostProcess,
        with_children: bool,
        seen: &mut Relatives,
    ) -> Option<Lineage> {
        if !host.confirmed {
            return None;
        }
        let (pgid, ppid) = (host.pgid?, host.ppid?);
        let leader = if pgid == pid {
            LeaderState::Itself
        } else {
            match self.relative(pgid, seen) {
                None => LeaderState::Gone,
                // The number was reused by a process that does not lead this group.
                Some(leader) if leader.pgid != pgid => LeaderState::Gone,
                Some(leader) if matches!(leader.state, ProcState::Zombie | ProcState::Dead) => {
                    LeaderState::Zombie
                }
                Some(_) => LeaderState::Alive,
            }
        };
        let parent = (ppid != 0)
            .then(|| self.relative(ppid, seen).cloned())
            .flatten();
        let live_children = with_children
            .then(|| self.live_children(pid, seen))
            .flatten();
        Some(Lineage {
            leader,
            parent,
            live_children,
        })
    }

    /// A relative's stat, read once per pass however many GPU processes share it (the
    /// workers of one run share their leader and parent), or less often (see [`Relatives`]).
    fn relative<'s>(&self, pid: u32, seen: &'s mut Relatives) -> Option<&'s Relative> {
        let (pass, fresh_for) = (seen.pass, seen.fresh_for);
        let now = *seen.now.get_or_insert_with(Instant::now);
        let entry = seen.seen.entry(pid).or_insert_with(|| SeenRelative {
            relative: None,
            read_at: None,
            read_pass: pass,
            used_pass: pass,
        });
        let fresh = entry.read_at.is_some_and(|read_at| {
            entry.read_pass == pass || now.duration_since(read_at) < fresh_for
        });
        if !fresh {
            entry.relative = self.read_relative_stat(pid);
            entry.read_at = Some(now);
            entry.read_pass = pass;
        }
        entry.used_pass = pass;
        entry.relative.as_ref()
    }

    /// One file, so no directory handle is needed to keep its facts of one process.
    fn read_relative_stat(&self, pid: u32) -> Option<Relative> {
        let file = std::fs::File::open(self.root.join(pid.to_string()).join("stat")).ok()?;
        let stat = read_stat_line(&file).ok()?;
        Some(Relative {
            pid,
            pgid: u32::try_from(stat.pgrp).ok()?,
            sid: u32::try_from(stat.session).ok()?,
            comm: Arc::from(stat.comm),
            state: ProcState::from_letter(stat.state),
        })
    }

    /// Children of every thread (a child belongs to the thread that forked it).
    fn live_children(&self, pid: u32, seen: &mut Relatives) -> Option<u32> {
        let process = Process::new_with_root(self.root.join(pid.to_string())).ok()?;
        let mut live = 0;
        let mut listed = false;
        for task in process.tasks().ok()?.flatten() {
            let Ok(children) = task.children() else {
                continue;
            };
            listed = true;
            live += children
                .into_iter()
                .filter(|&child| {
                    self.relative(child, seen)
                        .is_some_and(|c| !matches!(c.state, ProcState::Zombie | ProcState::Dead))
                })
                .count() as u32;
        }
        listed.then_some(live)
    }

    fn read_process(&self, pid: u32) -> Result<HostProcess, String> {
        let dir = self.root.join(pid.to_string());
        // Every file is opened through this one directory handle, so all facts are of one
        // process even if the pid is reused meanwhile.
        let process = Process::new_with_root(dir).map_err(|e| not_visible(pid, e))?;
        let stat_file = process
            .open_relative("stat")
            .map_err(|e| not_visible(pid, e))?;
        let stat =
            read_stat_line(&stat_file).map_err(|e| format!("cannot read /proc/{pid}/stat: {e}"))?;
        if stat.pid != pid {
            return Err(format!("/proc/{pid}/stat names another pid ({})", stat.pid));
        }
        let uid = match process.uid() {
            Ok(owner) if self.procfs && owner != 0 => owner,
            // Root-owned: root, as the directory shows the effective uid; the status file
            // confirms it (it is the only source on a fixture tree).
            _ => {
                Status::from_read(read_relative(&process, "status", pid)?.as_slice())
                    .map_err(|e| not_visible(pid, e))?
                    .euid
            }
        };
        // A zombie's cmdline is empty; an unreadable one is not worth failing the whole entry.
        let argv: Vec<String> = read_relative(&process, "cmdline", pid)
            .unwrap_or_default()
            .split(|&byte| byte == 0)
            .filter(|arg| !arg.is_empty())
            .map(|arg| String::from_utf8_lossy(arg).into_owned())
            .collect();
        let command = (!argv.is_empty()).then(|| argv.join(" "));
        let cgroup = read_relative(&process, "cgroup", pid)
            .ok()
            .map(|text| parse_cgroup(&String::from_utf8_lossy(&text)));
        let age_seconds = self.age_of(stat.starttime);
        Ok(HostProcess {
            confirmed: true,
            unconfirmed_reason: None,
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
            age_seconds: Some(age_seconds),
            owner: cgroup.as_ref().map(|c| c.owner.clone()),
            cgroup: cgroup.map(|c| c.path),
        })
    }
}

/// The fields of /proc/PID/stat that gpuctl reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StatLine {
    pub pid: u32,
    pub comm: String,
    pub state: char,
    pub ppid: i64,
    pub pgrp: i64,
    pub session: i64,
    pub num_threads: i64,
    pub starttime: u64,
}

impl StatLine {
    /// Parses a stat line: `pid (comm) state ppid pgrp session ...`. The command name may
    /// hold spaces and parentheses, so fields are counted from the last ')'. Only the
    /// fields read are parsed (a watchdog pass reads hundreds of these).
    pub(crate) fn parse(bytes: &[u8]) -> Option<StatLine> {
        let open = bytes.iter().position(|&b| b == b'(')?;
        let close = bytes.iter().rposition(|&b| b == b')')?;
        if close < open {
            return None;
        }
        let pid = std::str::from_utf8(&bytes[..open])
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let comm = String::from_utf8_lossy(&bytes[open + 1..close]).into_owned();
        let rest = std::str::from_utf8(&bytes[close + 1..]).ok()?;
        // Field n of proc(5) (1-based) is token n - 3 after the ')'.
        let mut fields = rest.split_ascii_whitespace();
        let state = fields.next()?.chars().next()?;
        let ppid = fields.next()?.parse().ok()?;
        let pgrp = fields.next()?.parse().ok()?;
        let session = fields.next()?.parse().ok()?;
        let num_threads = fields.nth(13)?.parse().ok()?;
        let starttime = fields.nth(1)?.parse().ok()?;
        Some(StatLine {
            pid,
            comm,
            state,
            ppid,
            pgrp,
            session,
            num_threads,
            starttime,
        })
    }
}

/// A whole /proc file, read through the process's directory handle.
fn read_relative(process: &Process, name: &str, pid: u32) -> Result<Vec<u8>, String> {
    let file = process
        .open_relative(name)
        .map_err(|e| not_visible(pid, e))?;
    read_all(file).map_err(|e| format!("cannot read /proc/{pid}/{name}: {e}"))
}

/// /proc/PID/stat (or a task's), read in one call where it fits (it always does: one line
/// of at most about a kilobyte) and parsed. Reading on until a read returns 0, as for other
/// files, would make the kernel format the whole line a second time.
pub(crate) fn read_stat_line(file: &std::fs::File) -> io::Result<StatLine> {
    use std::os::unix::fs::FileExt;
    let mut buffer = [0u8; 1536];
    let len = loop {
        match file.read_at(&mut buffer, 0) {
            Ok(len) => break len,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    };
    let parsed = if len < buffer.len() && buffer[..len].ends_with(b"\n") {
        StatLine::parse(&buffer[..len])
    } else {
        StatLine::parse(&pread_all(file)?)
    };
    parsed.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed stat line"))
}

/// A whole /proc file in as few syscalls as the kernel allows: procfs files report size 0,
/// so `File::read_to_end` asks for the size and position first and then probes with
/// 32-byte reads. A 4 KiB read takes most files at once. Read from offset 0, so a file
/// kept open can be read again.
fn pread_all(file: &std::fs::File) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    // 4 KiB: one read for any stat, status, cmdline or cgroup file of a usual process.
    let mut bytes = vec![0; 4096];
    let mut len = 0;
    loop {
        if len == bytes.len() {
            bytes.resize(len * 2, 0);
        }
        match file.read_at(&mut bytes[len..], len as u64) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    bytes.truncate(len);
    Ok(bytes)
}

/// How many stat files a fact cache may keep open: a quarter of the soft open-file limit,
/// so the program keeps plenty for everything else.
fn open_file_budget() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
        limit.rlim_cur as usize
    } else {
        1024
    };
    (soft / 4).min(16384)
}

fn read_all(file: std::fs::File) -> io::Result<Vec<u8>> {
    // Freshly opened: reading from offset 0 is reading it whole.
    pread_all(&file)
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

/// The owner procfs gives a process's stat file now: its effective uid, or root once its
/// main thread has exited (no memory map) or it cannot be dumped.
fn owner_uid(stat: &std::fs::File) -> Option<u32> {
    // fstat, not statx (File::metadata): a fifth cheaper, 256 times a loop.
    nix::sys::stat::fstat(stat).ok().map(|meta| meta.st_uid)
}

/// The pids among `watched` whose pidfd is readable, in one poll.
fn readable_pidfds(watched: impl Iterator<Item = (u32, RawFd)>) -> PidSet<u32> {
    let (pids, mut polls): (Vec<u32>, Vec<libc::pollfd>) = watched
        .map(|(pid, fd)| {
            let poll = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            (pid, poll)
        })
        .unzip();
    // SAFETY: `polls` is an array of pollfds that we own; zero timeout.
    let ready = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, 0) };
    if ready <= 0 {
        // A failed poll reports nothing; the stat is still read every `stat_every`.
        return PidSet::default();
    }
    pids.into_iter()
        .zip(&polls)
        .filter(|(_, poll)| poll.revents != 0)
        .map(|(pid, _)| pid)
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_letters_map_to_ps_names() {
        assert_eq!(ProcState::from_letter('D').as_str(), "disk-sleep");
        assert_eq!(ProcState::from_letter('Z'), ProcState::Zombie);
        assert_eq!(ProcState::from_letter('t'), ProcState::TracingStop);
        assert_eq!(ProcState::from_letter('?'), ProcState::Other);
    }

    #[test]
    fn stat_lines_are_read_from_the_last_parenthesis() {
        let line = b"4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 7 0 \
                     123456 1000 50 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 3 0 0\n";
        let stat = StatLine::parse(line).unwrap();
        assert_eq!(
            stat,
            StatLine {
                pid: 4242,
                comm: "a) b (c)".into(),
                state: 'S',
                ppid: 1,
                pgrp: 4242,
                session: 4242,
                num_threads: 7,
                starttime: 123456,
            }
        );
        assert_eq!(StatLine::parse(b"12 (x) Z 1 2 3"), None, "cut short");
        assert_eq!(StatLine::parse(b"12 x) R"), None);
        assert_eq!(StatLine::parse(b""), None);
    }

    #[test]
    fn own_stat_line_agrees_with_procfs() {
        let bytes = std::fs::read("/proc/self/stat").unwrap();
        let ours = StatLine::parse(&bytes).unwrap();
        let theirs = procfs::process::Stat::from_read(bytes.as_slice()).unwrap();
        assert_eq!(ours.pid, theirs.pid as u32);
        assert_eq!(ours.comm, theirs.comm);
        assert_eq!(ours.state, theirs.state);
        assert_eq!(ours.ppid, i64::from(theirs.ppid));
        assert_eq!(ours.pgrp, i64::from(theirs.pgrp));
        assert_eq!(ours.session, i64::from(theirs.session));
        assert_eq!(ours.num_threads, theirs.num_threads);
        assert_eq!(ours.starttime, theirs.starttime);
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
    fn a_held_stat_file_follows_its_process_and_dies_with_it() {
        let Some(view) = host_view() else {
            return;
        };
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pid = child.id();
        let mut cache = FactCache::refreshing_every(std::time::Duration::ZERO);
        let first = view.processes_cached(&[pid], &mut cache)[&pid].clone();
        // The second pass refreshes through a stat file it then keeps open; the third reads
        // through that file.
        let second = view.processes_cached(&[pid], &mut cache)[&pid].clone();
        assert!(cache.known[&pid].stat.is_some());
        assert_eq!(cache.open, 1);
        let third = view.processes_cached(&[pid], &mut cache)[&pid].clone();
        assert_eq!(first.start_ticks, third.start_ticks);
        assert_eq!(second.command, third.command);

        child.kill().unwrap();
        child.wait().unwrap();
        // Exited and reaped: the held file fails, and nothing is read in its name.
        let gone = view.processes_cached(&[pid], &mut cache).get(pid).cloned();
        assert!(
            gone.as_ref()
                .is_none_or(|fact| fact.start_ticks != first.start_ticks),
            "{gone:?}"
        );
        assert!(cache.known[&pid].stat.is_none());
        assert_eq!(cache.open, 0);
        // A pass without it forgets it.
        view.processes_cached(&[], &mut cache);
        assert!(cache.known.is_empty() && cache.get(pid).is_none());
    }

    #[test]
    fn a_cache_reads_relatives_again_only_once_they_are_as_old_as_its_facts_may_be() {
        let Some(view) = host_view() else {
            return;
        };
        let (mut parent, pid) = sleep_in_a_shell(std::process::Command::new("sh"));
        let mut cache = FactCache::refreshing_every(Duration::from_secs(3600));
        let fact = Arc::clone(&view.processes_cached(&[pid], &mut cache)[&pid]);
        let lineage = |cache: &mut FactCache| {
            cache.with_relatives(|seen| view.lineage(pid, &fact, false, seen).unwrap())
        };
        assert_eq!(lineage(&mut cache).parent.map(|p| p.pid), Some(parent.id()));

        parent.kill().unwrap();
        parent.wait().unwrap();
        // Read less than an hour ago: kept.
        assert_eq!(lineage(&mut cache).parent.map(|p| p.pid), Some(parent.id()));
        // Due: read again, and gone. A one-pass reader reads it now too.
        cache.refresh_every = Duration::ZERO;
        assert_eq!(lineage(&mut cache).parent, None);
        let once = view.lineage(pid, &fact, false, &mut Relatives::default());
        // SAFETY: kill(2) on the sleep started above, still alive (it was just read).
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        assert_eq!(once.unwrap().parent, None);
    }

    /// `command`, as a user other than root: nobody (65534) when the tests run as root,
    /// with a PATH of system directories that user can reach.
    fn not_root(mut command: std::process::Command) -> std::process::Command {
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
    fn spawn_reading_line(mut command: std::process::Command) -> (std::process::Child, String) {
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

    /// `sh` (as `shell` runs it) with a `sleep` in the background: the shell and the sleep's
    /// pid. The shell waits for a line on its stdin.
    fn sleep_in_a_shell(mut shell: std::process::Command) -> (std::process::Child, u32) {
        shell.args(["-c", "sleep 60 & echo $!; read line"]);
        let (parent, line) = spawn_reading_line(shell);
        (parent, line.trim().parse().unwrap())
    }

    /// The system's /proc, where its pids are the host's (NVML's); `None` (the test is
    /// skipped) in another PID namespace.
    fn host_view() -> Option<ProcView> {
        let view = ProcView::system().unwrap();
        if !view.host_pid_namespace() {
            eprintln!("skipped: not in the host PID namespace");
            return None;
        }
        Some(view)
    }

    /// A cache that looks every pass and reads the stat only once an hour where the owner
    /// check applies; the process is read once (new) and once more (its stat file opened).
    fn owner_checking_cache(view: &ProcView, pid: u32) -> FactCache {
        let mut cache = FactCache::refreshing_every(Duration::ZERO)
            .reading_stat_every(Duration::from_secs(3600));
        view.processes_cached(&[pid], &mut cache);
        cache.known.get_mut(&pid).unwrap().stat_at -= Duration::from_secs(7200);
        view.processes_cached(&[pid], &mut cache);
        cache
    }

    #[test]
    fn the_owner_check_stands_in_for_the_stat_until_the_main_thread_exits() {
        let Some(view) = host_view() else {
            return;
        };
        let script = format!(
            "import ctypes, sys, threading, time\n\
             threading.Thread(target=time.sleep, args=(60,)).start()\n\
             print('ready', flush=True)\n\
             sys.stdin.readline()\n\
             ctypes.CDLL(None).syscall({}, 0)\n",
            libc::SYS_exit
        );
        let mut command = not_root(std::process::Command::new("python3"));
        command.args(["-c", &script]);
        let (mut child, _) = spawn_reading_line(command);
        let pid = child.id();
        let mut cache = owner_checking_cache(&view, pid);
        let known = &cache.known[&pid];
        assert!(known.owner.is_some(), "{known:?}");
        let (stat_at, fact) = (known.stat_at, Arc::clone(&known.fact));
        view.processes_cached(&[pid], &mut cache);
        let known = &cache.known[&pid];
        assert_eq!(
            known.stat_at, stat_at,
            "stat read although the owner check held"
        );
        assert!(Arc::ptr_eq(&known.fact, &fact));

        std::io::Write::write_all(child.stdin.as_mut().unwrap(), b"go\n").unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let zombie = loop {
            let fact = Arc::clone(&view.processes_cached(&[pid], &mut cache)[&pid]);
            if fact.state == Some(ProcState::Zombie) || Instant::now() > deadline {
                break fact;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(zombie.state, Some(ProcState::Zombie), "{zombie:?}");
        assert_eq!(zombie.threads, Some(2));
        assert!(cache.known[&pid].owner.is_none());
    }

    #[test]
    fn a_checked_process_is_read_again_once_its_parent_exits() {
        let Some(view) = host_view() else {
            return;
        };
        let (mut parent, pid) = sleep_in_a_shell(not_root(std::process::Command::new("sh")));
        let mut cache = owner_checking_cache(&view, pid);
        assert!(cache.known[&pid].owner.is_some());
        assert!(cache.parents.contains_key(&parent.id()));
        let stat_at = cache.known[&pid].stat_at;
        let before = Arc::clone(&view.processes_cached(&[pid], &mut cache)[&pid]);
        assert_eq!(cache.known[&pid].stat_at, stat_at);
        assert_eq!(before.ppid, Some(parent.id()));

        parent.kill().unwrap();
        parent.wait().unwrap();
        let after = Arc::clone(&view.processes_cached(&[pid], &mut cache)[&pid]);
        // SAFETY: kill(2) on the sleep started above, still alive (it was just read).
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        assert_ne!(after.ppid, Some(parent.id()), "{after:?}");
        assert!(!cache.parents.contains_key(&parent.id()));
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
}
