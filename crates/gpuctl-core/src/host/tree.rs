//! A process's descendants, from every process's /proc/PID/stat: what a child subreaper
//! (`gpuctl run`) still has below it, including those that left its session or were
//! orphaned to it.

use std::collections::HashMap;

use crate::sys::procfile::{self, StatLine};

/// Every live descendant of `root` (not `root` itself), parents before children.
pub fn descendants(root: u32) -> Vec<StatLine> {
    let mut children: HashMap<u32, Vec<StatLine>> = HashMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(file) = std::fs::File::open(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if let Ok(stat) = procfile::read_stat_line(&file)
            && let Ok(ppid) = u32::try_from(stat.ppid)
        {
            children.entry(ppid).or_default().push(stat);
        }
    }
    let mut found = Vec::new();
    let mut next = vec![root];
    while let Some(parent) = next.pop() {
        for child in children.remove(&parent).unwrap_or_default() {
            next.push(child.pid);
            found.push(child);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_and_its_grandchild_are_found() {
        let mut command = std::process::Command::new("sh");
        command.args(["-c", "sleep 30 & echo $!; wait"]);
        let (mut child, line) = crate::host::tests::spawn_reading_line(command);
        let grandchild: u32 = line.trim().parse().unwrap();
        let found: Vec<u32> = descendants(std::process::id())
            .iter()
            .map(|s| s.pid)
            .collect();
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(grandchild as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = child.kill();
        let _ = child.wait();
        assert!(found.contains(&child.id()), "{found:?}");
        assert!(found.contains(&grandchild), "{found:?}");
    }
}
