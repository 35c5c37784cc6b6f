//! Host facts kept across passes by a long-running reader (the watchdog).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::lineage::Relatives;
use super::{HostProcess, ProcState, ProcView};
use crate::pidmap::PidMap;
use crate::sys::{limits, procfile};

/// Host facts kept across passes by a long-running reader (the watchdog): for a process
/// seen before with the same start time, only /proc/PID/stat is read again; its command
/// line, user and cgroup owner are kept (they rarely change, and a change is picked up when
/// the process is read anew).
#[derive(Debug, Default)]
pub struct FactCache {
    known: PidMap<u32, Known>,
    /// A known process is looked at again only this long after the last look; until then
    /// its facts are reused whole (their age counts on by itself). Zero: every pass.
    refresh_every: Duration,
    /// How many stat files are held open, and the most that may be.
    open: usize,
    max_open: usize,
    /// Counts calls, so that entries not listed in the latest one can be told apart.
    pass: u64,
    /// Leaders and parents, read as often as known processes are looked at.
    relatives: Relatives,
}

/// A known process. A look reads its stat again (the kernel formats 52 fields: 3-4 µs
/// when cold). Nothing cheaper stands in for it: the change that must be seen soonest, its
/// main thread exiting while other threads hold the GPU (a zombie holder), is reported by
/// no event (a pidfd, even a PIDFD_THREAD one on the leader, wakes only once the whole
/// thread group has exited) and, since Linux 6.18, leaves the owner of its proc files as
/// it was.
#[derive(Debug)]
struct Known {
    fact: Arc<HostProcess>,
    /// When its stat was last read.
    read_at: Instant,
    /// Its /proc/PID/stat, kept open: reading it again is one `pread` (2 µs) instead of
    /// open, read and close (10 µs on a VM). An open stat file stays bound to its process:
    /// once that process has exited it fails (ESRCH), so a reused pid is never read through
    /// it.
    stat: Option<std::fs::File>,
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
            max_open: limits::open_file_budget(),
            ..FactCache::default()
        }
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
            read_at: now,
            stat: None,
            pass: self.pass,
        };
        if let Some(old) = self.known.insert(pid, known)
            && old.stat.is_some()
        {
            self.open -= 1;
        }
    }

    /// Keeps only the processes of this pass (`listed` of them), closing the others' stat
    /// files.
    fn keep_only_pass(&mut self, listed: usize) {
        if self.known.len() <= listed {
            return;
        }
        let pass = self.pass;
        let mut closed = 0;
        self.known.retain(|_, known| {
            let keep = known.pass == pass;
            if !keep && known.stat.is_some() {
                closed += 1;
            }
            keep
        });
        self.open -= closed;
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

impl ProcView {
    /// [`ProcView::processes`], reusing what `cache` knows of processes seen before; the
    /// cache keeps only the pids of this call, and answers for them until the next.
    pub fn processes_cached<'c>(&self, pids: &[u32], cache: &'c mut FactCache) -> &'c FactCache {
        let now = Instant::now();
        cache.pass += 1;
        let pass = cache.pass;
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
            let may_open = cache.open < cache.max_open;
            let held = known.stat.is_some();
            match self.refresh(pid, known, may_open) {
                Some(()) => known.read_at = now,
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
            cache.insert_read(pid, fact, now);
            listed += 1;
        }
        cache.keep_only_pass(listed);
        cache
    }

    /// Reads a known process's stat again (through its held stat file, or one opened now and
    /// kept when `may_open`) and takes what it shows into its facts; facts it shows nothing
    /// new in are kept as they are (their age counts on by itself). `None` when it is not
    /// the same process any more (another start time), or was not confirmed.
    fn refresh(&self, pid: u32, known: &mut Known, may_open: bool) -> Option<()> {
        if !known.fact.confirmed || !self.host_pid_namespace {
            return None;
        }
        let stat = match &known.stat {
            Some(file) => procfile::read_stat_line(file).ok()?,
            None => {
                let file =
                    std::fs::File::open(self.root.join(pid.to_string()).join("stat")).ok()?;
                let stat = procfile::read_stat_line(&file).ok()?;
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
            return Some(());
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
        Some(())
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

    #[test]
    fn a_look_sees_a_zombie_leader_whose_threads_live_on() {
        let Some(view) = host_view() else {
            return;
        };
        // Its main thread exits (the exit syscall, not exit_group) while another sleeps.
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
        assert!(cache.known[&pid].stat.is_some());

        parent.kill().unwrap();
        parent.wait().unwrap();
        let after = Arc::clone(&view.processes_cached(&[pid], &mut cache)[&pid]);
        // The sleep started above, still alive (it was just read).
        let _ = kill(Pid::from_raw(pid as libc::pid_t), Signal::SIGKILL);
        assert_ne!(after.ppid, Some(parent.id()), "{after:?}");
        assert_eq!(after.start_ticks, before.start_ticks);
    }
}
