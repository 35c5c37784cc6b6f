//! Host facts kept across passes by a long-running reader (the watchdog).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::lineage::Relatives;
use super::{HostProcess, ProcState, ProcView};
use crate::pidmap::PidMap;
use crate::sys::{limits, procfile};

/// Host facts kept across passes by a long-running reader (the watchdog): for a process
/// seen before with the same start time, only /proc/PID/stat is read again (or, between its
/// whole reads, its statm; see [`Known`]); its command line, user and cgroup owner are kept
/// (they rarely change, and a change is picked up when the process is read anew).
#[derive(Debug, Default)]
pub struct FactCache {
    known: PidMap<u32, Known>,
    /// A known process is looked at again only this long after the last look; until then
    /// its facts are reused whole (their age counts on by itself). Zero: every pass.
    refresh_every: Duration,
    /// Its stat is read whole at least this often; the looks in between are quick ones.
    /// Not above `refresh_every` (the default, zero): every look reads the stat whole.
    whole_every: Duration,
    /// How many files are held open (known processes' and watched parents'), and the most
    /// that may be.
    open: usize,
    max_open: usize,
    /// Counts calls, so that entries not listed in the latest one can be told apart.
    pass: u64,
    /// Leaders and parents, read as often as known processes are looked at.
    relatives: Relatives,
    /// Where looks are quick: the parents of known processes, each watched through its
    /// held statm, since their exit is what makes a worker an orphan.
    parents: PidMap<u32, Parent>,
}

/// A known process. A look must see, within `refresh_every`, the change no event reports:
/// its main thread exiting while other threads hold the GPU (a zombie holder; a pidfd, even
/// a PIDFD_THREAD one on the leader, wakes only once the whole thread group has exited, and
/// since Linux 6.18 the owner of its proc files stays as it was). A whole look reads its
/// stat (the kernel formats 52 fields and sums the thread group's times: about 4 µs on a
/// quiet VM). A quick look reads its statm instead (7 fields, no thread-group lock: about
/// 1.3 µs): the main thread's exit drops the memory map, after which statm reads all
/// zeros, and the look becomes a whole one. What no quick look shows (stopped, group,
/// thread count) waits for the next whole read, at most `whole_every` away; a process last
/// seen neither running nor asleep is read whole at every look.
#[derive(Debug)]
struct Known {
    fact: Arc<HostProcess>,
    /// When it was last looked at.
    looked_at: Instant,
    /// When its stat was last read whole: its facts are as of then.
    read_at: Instant,
    /// Its stat where every look is whole, else its statm, kept open: reading it again is
    /// one `pread` (2 µs) instead of open, read and close (10 µs on a VM). An open proc file
    /// stays bound to its process: once that process has exited it fails (ESRCH), so a
    /// reused pid is never read through it.
    held: Option<std::fs::File>,
    /// The last call that listed it.
    pass: u64,
}

/// A watched parent: its statm, held since `opened_at`. It fails or reads all zeros once
/// the parent has exited, which reparents its children.
#[derive(Debug)]
struct Parent {
    statm: std::fs::File,
    opened_at: Instant,
    /// Looked at once per pass, however many children ask.
    checked_pass: u64,
    alive: bool,
    /// Kept while some child asks: dropped once none has for two looks' time.
    asked_at: Instant,
}

/// How a known process is looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LookKind {
    Whole,
    Quick,
}

impl FactCache {
    /// A cache that looks at a known process again at most every `refresh_every`. A reader
    /// acting on facts only after they have held for a grace period can afford facts that
    /// much older; signals are still bound to the identity the kernel reports at the time.
    pub fn refreshing_every(refresh_every: Duration) -> FactCache {
        FactCache {
            refresh_every,
            max_open: limits::open_file_budget(),
            ..FactCache::default()
        }
    }

    /// Reads a known process's stat whole at least every `whole_every`; the looks in
    /// between are quick ones (see [`Known`]). Above `refresh_every` only.
    pub fn reading_whole_every(mut self, whole_every: Duration) -> FactCache {
        self.retime(self.refresh_every, whole_every);
        self
    }

    /// New periods for the looks from now on (a reloaded configuration's grace). What is
    /// held for the old ones is let go, and taken again at the next look.
    pub fn retime(&mut self, refresh_every: Duration, whole_every: Duration) {
        if (refresh_every, whole_every) == (self.refresh_every, self.whole_every) {
            return;
        }
        self.refresh_every = refresh_every;
        self.whole_every = whole_every;
        for known in self.known.values_mut() {
            known.held = None;
        }
        self.parents.clear();
        self.open = 0;
    }

    /// Whether looks between whole reads are quick ones.
    fn quick_looks(&self) -> bool {
        self.whole_every > self.refresh_every
    }

    /// Runs `read` over the relatives kept for lineages (see [`Relatives`]), then forgets
    /// those it did not ask for.
    pub(crate) fn with_relatives<T>(&mut self, read: impl FnOnce(&mut Relatives) -> T) -> T {
        self.relatives.start_pass(self.refresh_every);
        let out = read(&mut self.relatives);
        self.relatives.end_pass();
        out
    }

    /// A process read whole at `now`, in this pass, replacing any entry of its pid.
    fn insert_read(&mut self, pid: u32, fact: HostProcess, now: Instant) {
        let known = Known {
            fact: Arc::new(fact),
            looked_at: now,
            read_at: now,
            held: None,
            pass: self.pass,
        };
        if let Some(old) = self.known.insert(pid, known)
            && old.held.is_some()
        {
            self.open -= 1;
        }
    }

    /// Keeps only the processes of this pass (`listed` of them), closing the others' held
    /// files.
    fn keep_only_pass(&mut self, listed: usize) {
        if self.known.len() <= listed {
            return;
        }
        let pass = self.pass;
        let mut closed = 0;
        self.known.retain(|_, known| {
            let keep = known.pass == pass;
            if !keep && known.held.is_some() {
                closed += 1;
            }
            keep
        });
        self.open -= closed;
    }

    /// Lets go of the parents no child has asked about for two looks' time.
    fn forget_unasked_parents(&mut self, now: Instant) {
        let kept_for = self.refresh_every.max(Duration::from_millis(500)) * 2;
        let before = self.parents.len();
        self.parents
            .retain(|_, parent| now.duration_since(parent.asked_at) <= kept_for);
        self.open -= before - self.parents.len();
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

/// Whether a process in `state` may be looked at quickly: one running or asleep. Any other
/// state is read whole at every look, so that its end (a stopped process resumed, a D
/// state left) is seen as soon.
fn steady(state: Option<ProcState>) -> bool {
    matches!(
        state,
        Some(ProcState::Running | ProcState::Sleeping | ProcState::Idle)
    )
}

impl ProcView {
    /// [`ProcView::processes`], reusing what `cache` knows of processes seen before; the
    /// cache keeps only the pids of this call, and answers for them until the next.
    pub fn processes_cached<'c>(&self, pids: &[u32], cache: &'c mut FactCache) -> &'c FactCache {
        let now = Instant::now();
        cache.pass += 1;
        let pass = cache.pass;
        let quick_looks = cache.quick_looks();
        let mut looked = false;
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
            if now.duration_since(known.looked_at) < cache.refresh_every {
                continue;
            }
            looked = true;
            let held = known.held.is_some();
            let may_open = cache.open < cache.max_open;
            let kind = if quick_looks
                && now.duration_since(known.read_at) < cache.whole_every
                && steady(known.fact.state)
                && !self.parent_exited(
                    known,
                    &mut cache.parents,
                    &mut cache.open,
                    may_open,
                    pass,
                    now,
                ) {
                LookKind::Quick
            } else {
                LookKind::Whole
            };
            // Again: watching its parent may have taken the last file the budget allows.
            let may_open = cache.open < cache.max_open;
            match self.look(pid, known, kind, quick_looks, may_open) {
                Some(whole) => {
                    known.looked_at = now;
                    if whole {
                        known.read_at = now;
                    }
                }
                None => {
                    known.held = None;
                    // Read anew below; its entry is replaced.
                    known.pass = 0;
                    listed -= 1;
                    unknown.push(pid);
                }
            }
            match (held, known.held.is_some()) {
                (false, true) => cache.open += 1,
                (true, false) => cache.open -= 1,
                _ => {}
            }
        }
        unknown.sort_unstable();
        unknown.dedup();
        for (pid, fact) in self.processes(&unknown) {
            cache.insert_read(pid, fact, now);
            listed += 1;
        }
        cache.keep_only_pass(listed);
        if looked && !cache.parents.is_empty() {
            cache.forget_unasked_parents(now);
        }
        cache
    }

    /// Whether `known`'s parent may have exited since its stat was last read whole (then a
    /// whole read is due: its parent is what it shows). Its parent is watched through a
    /// statm held in `parents` (opened now if it is not and `may_open`: read whole once
    /// after, the child then shows whether the file is its parent's). Checked once per pass.
    /// No parent to watch (pid 1 or 0) is no exit; one that cannot be watched may be.
    fn parent_exited(
        &self,
        known: &Known,
        parents: &mut PidMap<u32, Parent>,
        open: &mut usize,
        may_open: bool,
        pass: u64,
        now: Instant,
    ) -> bool {
        let Some(ppid) = known.fact.ppid.filter(|&ppid| ppid > 1) else {
            return false;
        };
        let parent = match parents.entry(ppid) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(_) if !may_open => return true,
            std::collections::hash_map::Entry::Vacant(entry) => {
                let statm = std::fs::File::open(self.root.join(ppid.to_string()).join("statm"));
                let Ok(statm) = statm else {
                    return true;
                };
                *open += 1;
                entry.insert(Parent {
                    statm,
                    opened_at: now,
                    checked_pass: pass,
                    alive: true,
                    asked_at: now,
                })
            }
        };
        parent.asked_at = now;
        if parent.checked_pass != pass {
            parent.checked_pass = pass;
            parent.alive = procfile::has_memory_map(&parent.statm).unwrap_or(false);
        }
        if !parent.alive {
            parents.remove(&ppid);
            *open -= 1;
            return true;
        }
        // The child was read before the file was opened: the pid may have been another
        // process's by then.
        parent.opened_at > known.read_at
    }

    /// Looks at a known process again (`kind`), through its held file or one opened now
    /// and kept when `may_open`; a quick look that finds its memory map gone reads it
    /// whole. Facts a whole read shows nothing new in are kept as they are (their age
    /// counts on by itself). Whether it was read whole; `None` when it is not the same
    /// process any more (another start time, or exited), or was not confirmed.
    fn look(
        &self,
        pid: u32,
        known: &mut Known,
        kind: LookKind,
        quick_looks: bool,
        may_open: bool,
    ) -> Option<bool> {
        if !known.fact.confirmed || !self.host_pid_namespace {
            return None;
        }
        let path = |file: &str| self.root.join(pid.to_string()).join(file);
        if !quick_looks {
            // The held file is its stat.
            let stat = match &known.held {
                Some(file) => procfile::read_stat_line(file).ok()?,
                None => {
                    let file = std::fs::File::open(path("stat")).ok()?;
                    let stat = procfile::read_stat_line(&file).ok()?;
                    if may_open {
                        known.held = Some(file);
                    }
                    stat
                }
            };
            return self.take_stat(pid, known, stat).then_some(true);
        }
        // The held file is its statm. One opened now is bound to this process by the whole
        // read that follows: a pid reused before the open shows another start time.
        let opened = match &known.held {
            Some(statm) if kind == LookKind::Quick => {
                if procfile::has_memory_map(statm).ok()? {
                    return Some(false);
                }
                None
            }
            Some(_) => None,
            None if may_open => Some(std::fs::File::open(path("statm")).ok()?),
            None => None,
        };
        let stat = procfile::read_stat_line(&std::fs::File::open(path("stat")).ok()?).ok()?;
        if !self.take_stat(pid, known, stat) {
            return None;
        }
        if opened.is_some() {
            known.held = opened;
        }
        Some(true)
    }

    /// Takes what a whole read of `known`'s stat shows into its facts; false when it is not
    /// the same process any more (the start time is checked on every read, held file or
    /// not).
    fn take_stat(&self, pid: u32, known: &mut Known, stat: procfile::StatLine) -> bool {
        if Some(stat.starttime) != known.fact.start_ticks || stat.pid != pid {
            return false;
        }
        let state = Some(ProcState::from_letter(stat.state));
        let ppid = u32::try_from(stat.ppid).ok();
        let pgid = u32::try_from(stat.pgrp).ok();
        let sid = u32::try_from(stat.session).ok();
        let threads = u32::try_from(stat.num_threads).ok();
        let old = &known.fact;
        if (old.state, old.ppid, old.pgid, old.sid, old.threads)
            == (state, ppid, pgid, sid, threads)
            && old.comm.as_deref() == Some(stat.comm.as_str())
        {
            return true;
        }
        let mut fact = HostProcess::clone(old);
        fact.state = state;
        fact.ppid = ppid;
        fact.pgid = pgid;
        fact.sid = sid;
        fact.threads = threads;
        fact.comm = Some(stat.comm);
        fact.age = Some(self.age_of(stat.starttime));
        known.fact = Arc::new(fact);
        true
    }
}

#[cfg(test)]
mod tests {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;

    use super::*;
    use crate::host::tests::{not_root, spawn_reading_line};

    #[test]
    fn a_stat_that_shows_nothing_new_keeps_the_facts_and_one_that_does_replaces_them() {
        let Some(view) = host_view() else {
            return;
        };
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pid = child.id();
        let mut cache = FactCache::refreshing_every(Duration::ZERO);
        // Asleep first: just after its exec it may still read as running.
        let first = facts_once(&view, &mut cache, pid, ProcState::Sleeping).expect("sleep sleeps");
        let again = Arc::clone(&view.processes_cached(&[pid], &mut cache)[&pid]);
        assert!(Arc::ptr_eq(&first, &again), "{first:?}\n{again:?}");

        kill(Pid::from_raw(pid as libc::pid_t), Signal::SIGSTOP).unwrap();
        // Stopping is seen once the kernel has done it.
        let stopped = facts_once(&view, &mut cache, pid, ProcState::Stopped);
        let _ = child.kill();
        child.wait().unwrap();
        let stopped = stopped.expect("the stop is seen");
        assert!(!Arc::ptr_eq(&first, &stopped));
        assert_eq!(
            (stopped.command.as_deref(), stopped.start_ticks),
            (first.command.as_deref(), first.start_ticks)
        );
    }

    /// `pid`'s facts through `cache` once they show `state` (polled for up to a second).
    fn facts_once(
        view: &ProcView,
        cache: &mut FactCache,
        pid: u32,
        state: ProcState,
    ) -> Option<Arc<HostProcess>> {
        (0..200)
            .map(|_| {
                std::thread::sleep(Duration::from_millis(5));
                Arc::clone(&view.processes_cached(&[pid], cache)[&pid])
            })
            .find(|fact| fact.state == Some(state))
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
        assert!(cache.known[&pid].held.is_some());
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
        assert!(cache.known[&pid].held.is_none());
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
        // The sleep started above, still alive (it was just read).
        let _ = kill(Pid::from_raw(pid as libc::pid_t), Signal::SIGKILL);
        assert_eq!(once.unwrap().parent, None);
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

    /// A process of two threads whose main thread exits (the exit syscall, not exit_group)
    /// on a line from its stdin, while the other sleeps on.
    fn zombie_leader_on_a_line() -> std::process::Child {
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
        spawn_reading_line(command).0
    }

    #[test]
    fn a_look_sees_a_zombie_leader_whose_threads_live_on() {
        let Some(view) = host_view() else {
            return;
        };
        let mut child = zombie_leader_on_a_line();
        let pid = child.id();
        let mut cache = FactCache::refreshing_every(Duration::ZERO);
        let alive = Arc::clone(&view.processes_cached(&[pid], &mut cache)[&pid]);
        assert_eq!(alive.threads, Some(2), "{alive:?}");

        std::io::Write::write_all(child.stdin.as_mut().unwrap(), b"go\n").unwrap();
        let zombie = facts_once(&view, &mut cache, pid, ProcState::Zombie);
        child.kill().unwrap();
        child.wait().unwrap();
        let zombie = zombie.expect("the zombie leader is seen");
        assert_eq!(zombie.threads, Some(2), "{zombie:?}");
        assert_eq!(zombie.start_ticks, alive.start_ticks);
    }

    #[test]
    fn a_look_sees_a_process_reparented_once_its_parent_exits() {
        let Some(view) = host_view() else {
            return;
        };
        let (mut parent, pid) = sleep_in_a_shell(not_root(std::process::Command::new("sh")));
        let mut cache = FactCache::refreshing_every(Duration::ZERO);
        let before = Arc::clone(&view.processes_cached(&[pid], &mut cache)[&pid]);
        assert_eq!(before.ppid, Some(parent.id()));
        // The second look reads through the stat file the first kept open.
        view.processes_cached(&[pid], &mut cache);
        assert!(cache.known[&pid].held.is_some());

        parent.kill().unwrap();
        parent.wait().unwrap();
        let after = Arc::clone(&view.processes_cached(&[pid], &mut cache)[&pid]);
        // The sleep started above, still alive (it was just read).
        let _ = kill(Pid::from_raw(pid as libc::pid_t), Signal::SIGKILL);
        assert_ne!(after.ppid, Some(parent.id()), "{after:?}");
        assert_eq!(after.start_ticks, before.start_ticks);
    }

    /// A cache whose looks between whole reads are quick ones, and whose whole reads are an
    /// hour apart: what it sees, a quick look saw.
    fn quick_cache() -> FactCache {
        FactCache::refreshing_every(Duration::ZERO).reading_whole_every(Duration::from_secs(3600))
    }

    #[test]
    fn a_quick_look_sees_a_zombie_leader_whose_threads_live_on() {
        let Some(view) = host_view() else {
            return;
        };
        let mut child = zombie_leader_on_a_line();
        let pid = child.id();
        let mut cache = quick_cache();
        let alive = Arc::clone(&view.processes_cached(&[pid], &mut cache)[&pid]);
        // The second look opens its statm (and reads the stat once more); the third is quick.
        view.processes_cached(&[pid], &mut cache);
        let quick = Arc::clone(&view.processes_cached(&[pid], &mut cache)[&pid]);
        assert!(cache.known[&pid].held.is_some());
        assert!(Arc::ptr_eq(&alive, &quick) || quick.state == alive.state);

        std::io::Write::write_all(child.stdin.as_mut().unwrap(), b"go\n").unwrap();
        let zombie = facts_once(&view, &mut cache, pid, ProcState::Zombie);
        child.kill().unwrap();
        child.wait().unwrap();
        let zombie = zombie.expect("the zombie leader is seen by a quick look");
        assert_eq!(zombie.threads, Some(2), "{zombie:?}");
        assert_eq!(zombie.start_ticks, alive.start_ticks);
    }

    #[test]
    fn a_quick_look_sees_a_process_reparented_once_its_parent_exits() {
        let Some(view) = host_view() else {
            return;
        };
        let (mut parent, pid) = sleep_in_a_shell(not_root(std::process::Command::new("sh")));
        let mut cache = quick_cache();
        let before = Arc::clone(&view.processes_cached(&[pid], &mut cache)[&pid]);
        assert_eq!(before.ppid, Some(parent.id()));
        // The second look opens its statm and its parent's, and reads its stat once more
        // (which binds the parent's file); the third is quick and keeps the facts.
        view.processes_cached(&[pid], &mut cache);
        let quick = Arc::clone(&view.processes_cached(&[pid], &mut cache)[&pid]);
        assert!(cache.known[&pid].held.is_some() && cache.parents.contains_key(&parent.id()));
        assert_eq!(cache.open, 2);
        assert_eq!(quick.ppid, Some(parent.id()));

        parent.kill().unwrap();
        parent.wait().unwrap();
        let after = Arc::clone(&view.processes_cached(&[pid], &mut cache)[&pid]);
        // The sleep started above, still alive (it was just read).
        let _ = kill(Pid::from_raw(pid as libc::pid_t), Signal::SIGKILL);
        assert_ne!(after.ppid, Some(parent.id()), "{after:?}");
        assert_eq!(after.start_ticks, before.start_ticks);
        // The exited parent's file is let go.
        assert!(!cache.parents.contains_key(&parent.id()));
    }

    #[test]
    fn a_stop_is_seen_by_the_next_whole_read_not_by_a_quick_look() {
        let Some(view) = host_view() else {
            return;
        };
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pid = child.id();
        let mut cache = quick_cache();
        facts_once(&view, &mut cache, pid, ProcState::Sleeping).expect("sleep sleeps");
        view.processes_cached(&[pid], &mut cache);
        kill(Pid::from_raw(pid as libc::pid_t), Signal::SIGSTOP).unwrap();
        // Stopped for the kernel (its stat says so after the second of quick looks), but not
        // for quick looks.
        let quick = facts_once(&view, &mut cache, pid, ProcState::Stopped);
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        // Whole reads every look from now on: the stop is seen.
        cache.retime(Duration::ZERO, Duration::ZERO);
        let whole = facts_once(&view, &mut cache, pid, ProcState::Stopped);
        let _ = child.kill();
        child.wait().unwrap();
        assert!(stat.contains(") T "), "{stat}");
        assert!(quick.is_none(), "{quick:?}");
        assert!(whole.is_some());
        // Retimed: the statm and the parent's were let go; its stat is held now.
        assert!(cache.parents.is_empty());
        assert_eq!(cache.open, 1);
    }
}
