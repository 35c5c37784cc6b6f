//! Whether the run a GPU process belongs to is still there: its group leader, its parent
//! and its live children, the evidence classification reads.

use std::sync::Arc;
use std::time::{Duration, Instant};

use procfs::process::Process;
use serde::Serialize;

use super::{HostProcess, ProcState, ProcView};
use crate::pidmap::PidMap;
use crate::sys::procfile;

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
    pub(super) fn start_pass(&mut self, fresh_for: Duration) {
        self.pass += 1;
        self.fresh_for = fresh_for;
        self.now = Some(Instant::now());
    }

    /// Forgets the relatives this pass did not ask for.
    pub(super) fn end_pass(&mut self) {
        let pass = self.pass;
        self.seen.retain(|_, seen| seen.used_pass == pass);
    }
}

impl ProcView {
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
        let stat = procfile::read_stat_line(&file).ok()?;
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
}
