//! Reading /proc files: in as few syscalls as procfs allows, and /proc/PID/stat parsed only
//! as far as gpuctl reads it.

use std::io;

/// The fields of /proc/PID/stat that gpuctl reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatLine {
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
    pub fn parse(bytes: &[u8]) -> Option<StatLine> {
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

/// One `pread` at `offset`, again where a signal interrupted it.
fn pread(file: &std::fs::File, buffer: &mut [u8], offset: u64) -> io::Result<usize> {
    use std::os::unix::fs::FileExt;
    loop {
        match file.read_at(buffer, offset) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            read => return read,
        }
    }
}

/// /proc/PID/stat (or a task's), read in one call where it fits (it always does: one line
/// of at most about a kilobyte) and parsed. Reading on until a read returns 0, as for other
/// files, would make the kernel format the whole line a second time.
pub fn read_stat_line(file: &std::fs::File) -> io::Result<StatLine> {
    let mut buffer = [0u8; 1536];
    let len = pread(file, &mut buffer, 0)?;
    let parsed = if len < buffer.len() && buffer[..len].ends_with(b"\n") {
        StatLine::parse(&buffer[..len])
    } else {
        StatLine::parse(&pread_all(file)?)
    };
    parsed.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed stat line"))
}

/// Whether the process /proc/PID/statm (`file`) describes still has its memory map: its
/// size reads 0 once its main thread has exited (a zombie leader, whatever its other threads
/// do), and in a kernel thread. One `pread` of a few bytes.
pub fn has_memory_map(file: &std::fs::File) -> io::Result<bool> {
    let mut buffer = [0u8; 128];
    let len = pread(file, &mut buffer, 0)?;
    match buffer[..len].split(|&b| b == b' ').next() {
        Some(size) if !size.is_empty() && size.iter().all(u8::is_ascii_digit) => Ok(size != b"0"),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "malformed statm",
        )),
    }
}

/// A whole /proc file in as few syscalls as the kernel allows: procfs files report size 0,
/// so `File::read_to_end` asks for the size and position first and then probes with
/// 32-byte reads. A 4 KiB read takes most files at once. A read that comes back short is
/// the end: the per-process files gpuctl reads fill a read as far as they go (seq_file's
/// single-record files: stat, status, cgroup; cmdline loops over the argument pages until
/// the buffer is full), so the 0-byte read that would confirm it is not made (256 fewer
/// syscalls per file kind at 256 processes). Read from offset 0, so a file kept open can
/// be read again.
pub fn pread_all(file: &std::fs::File) -> io::Result<Vec<u8>> {
    // 4 KiB: one read for any stat, status, cmdline or cgroup file of a usual process.
    let mut bytes = vec![0; 4096];
    let mut len = 0;
    loop {
        if len == bytes.len() {
            bytes.resize(len * 2, 0);
        }
        match pread(file, &mut bytes[len..], len as u64)? {
            0 => break,
            n => {
                len += n;
                if len < bytes.len() {
                    break;
                }
            }
        }
    }
    bytes.truncate(len);
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use procfs::FromRead;

    #[test]
    fn a_statm_of_zeros_has_no_memory_map_and_a_malformed_one_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let statm = |text: &str| {
            let path = dir.path().join("statm");
            std::fs::write(&path, text).unwrap();
            has_memory_map(&std::fs::File::open(&path).unwrap()).map_err(|e| e.kind())
        };
        assert_eq!(statm("2668 229 204 1 0 2137 0\n"), Ok(true));
        assert_eq!(statm("10 0 0 0 0 0 0\n"), Ok(true));
        assert_eq!(statm("0 0 0 0 0 0 0\n"), Ok(false));
        assert_eq!(statm(""), Err(io::ErrorKind::InvalidData));
        assert_eq!(statm("x 1 2\n"), Err(io::ErrorKind::InvalidData));
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
    fn whole_files_are_read_in_as_few_reads_as_they_fill() {
        // A command line longer than one read (4 KiB), and the single-record files.
        let long = "x".repeat(10_000);
        let script = "import time; time.sleep(30)";
        let mut child = std::process::Command::new("python3")
            .args(["-c", script, &long])
            .spawn()
            .unwrap();
        let path = format!("/proc/{}/cmdline", child.id());
        // Until the child has exec'd, its cmdline is the test's (or empty).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let tail = format!("{long}\0");
        while !std::fs::read(&path).unwrap().ends_with(tail.as_bytes()) {
            assert!(
                std::time::Instant::now() < deadline,
                "python3 never started"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let ours = pread_all(&std::fs::File::open(&path).unwrap()).unwrap();
        let theirs = std::fs::read(&path).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(
            ours.len() > 4096 && ours.ends_with(tail.as_bytes()),
            "{}",
            ours.len()
        );
        assert_eq!(ours, theirs);
        for name in ["status", "cgroup", "stat"] {
            let path = format!("/proc/self/{name}");
            let ours = pread_all(&std::fs::File::open(&path).unwrap()).unwrap();
            let theirs = std::fs::read(&path).unwrap();
            // Counters in status and stat move between two reads; their lines do not.
            assert_eq!(
                ours.split(|&b| b == b'\n').count(),
                theirs.split(|&b| b == b'\n').count()
            );
            assert!(ours.ends_with(b"\n"), "{name}");
        }
    }
}
