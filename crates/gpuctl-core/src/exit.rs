//! Exit statuses: one set of codes for every binary, and for each binary one table of what
//! each code means for it. The `--help` text, the man pages (generated from `--help`) and the
//! code all come from these tables, so they cannot drift apart.

/// A documented exit status. The same number means the same kind of result in every gpuctl
/// program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    Ok = 0,
    /// The operation failed.
    Failed = 1,
    /// Bad usage or input: an option, a value, a configuration file.
    Usage = 2,
    /// What the program needs of the machine is missing: NVML or the NVIDIA driver (the
    /// trainer: CUDA).
    Unavailable = 3,
    /// GPUs not free: by `clear --wait`'s deadline, too few for `run` or `pick`, after the trainer's startup cleanup, or
    /// stale processes left by `gpuctl-watchdog --once`.
    NotClean = 4,
    /// The trainer ran out of memory even at micro-batch 1.
    OutOfMemory = 5,
    /// `gpuctl health`: a GPU needs an action (its health verdict is not `none`).
    NeedsAction = 6,
    /// `enable -- COMMAND`, `run`: found but could not be executed (as shells report it).
    CommandNotExecutable = 126,
    /// `enable -- COMMAND`, `run`: not found.
    CommandNotFound = 127,
}

impl Exit {
    pub fn code(self) -> u8 {
        self as u8
    }
}

impl From<Exit> for std::process::ExitCode {
    fn from(exit: Exit) -> std::process::ExitCode {
        std::process::ExitCode::from(exit.code())
    }
}

/// One program's table: each status it uses, with what it means for that program.
pub type Table = &'static [(Exit, &'static str)];

/// `gpuctl`.
pub const GPUCTL: Table = &[
    (Exit::Ok, "success"),
    (
        Exit::Failed,
        "the operation failed (info: a GPU is lost or cannot be read, the others are shown; \
         health: a GPU does not answer; \
         kill, clear: a selected process was skipped, refused, survived, or its memory is \
         still held; slurm prolog, epilog: the job's GPUs could not be made clean, and the \
         node was drained; fleet: Prometheus refused a query or gave a malformed answer, or \
         a node's command failed)",
    ),
    (
        Exit::Usage,
        "usage error (bad option, bad value, unknown GPU or user, a needed --yes missing, an \
         invalid or untrusted configuration file, slurm prolog or epilog outside a job; \
         fleet: no or a bad Prometheus URL, an unreadable bearer token or CA file, no [fleet] \
         exec for --exec or --detail)",
    ),
    (
        Exit::Unavailable,
        "NVML or the NVIDIA driver is unavailable; fleet: Prometheus cannot be reached",
    ),
    (
        Exit::NotClean,
        "clear --wait: the GPUs were not free by the deadline; run, pick: too few GPUs free, \
         healthy and (run) unleased, at once or by --wait's deadline",
    ),
    (
        Exit::NeedsAction,
        "health: a GPU needs an action (gpu_reset, node_reboot, drain_p2p or \
         drain_and_reset; a lost GPU needs node_reboot); it wins over 1 when another GPU \
         cannot be read",
    ),
    (
        Exit::CommandNotExecutable,
        "enable -- COMMAND, run: the command could not be executed (otherwise they exit \
         with the command's own status, 128+N when signal N ended it)",
    ),
    (
        Exit::CommandNotFound,
        "enable -- COMMAND, run: the command was not found",
    ),
];

/// `gpuctl-watchdog`.
pub const WATCHDOG: Table = &[
    (
        Exit::Ok,
        "stopped cleanly (SIGTERM, SIGINT); --once: nothing stale, or all of it reclaimed",
    ),
    (
        Exit::Failed,
        "--once: a reclaim failed (a process survived, was skipped, or its memory is still \
         held)",
    ),
    (
        Exit::Usage,
        "usage error, or an invalid or untrusted configuration file at start",
    ),
    (
        Exit::Unavailable,
        "--once: NVML or the NVIDIA driver is unavailable (the daemon itself keeps retrying)",
    ),
    (
        Exit::NotClean,
        "--once: stale processes found and left (report mode, --dry-run, or an incomplete \
         snapshot)",
    ),
];

/// `gpuctl-trainer`.
pub const TRAINER: Table = &[
    (Exit::Ok, "done"),
    (
        Exit::Failed,
        "failed (a worker died, I/O, the run name is in use)",
    ),
    (Exit::Usage, "usage"),
    (Exit::Unavailable, "CUDA asked for but unavailable"),
    (
        Exit::NotClean,
        "startup cleanup could not free the GPU memory",
    ),
    (Exit::OutOfMemory, "out of memory even at micro-batch 1"),
];

/// The "Exit status:" section of a program's help: one code a row, its meaning wrapped
/// under itself.
pub fn help(table: Table) -> String {
    const WIDTH: usize = 90;
    const INDENT: usize = 7;
    let mut out = String::from("Exit status:\n");
    for (exit, meaning) in table {
        let mut line = format!("  {:<3}  ", exit.code());
        for word in meaning.split_whitespace() {
            if line.len() + 1 + word.len() > WIDTH && line.trim().len() > 3 {
                out.push_str(line.trim_end());
                out.push('\n');
                line = " ".repeat(INDENT);
            } else if !line.ends_with(' ') {
                line.push(' ');
            }
            line.push_str(word);
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out.pop();
    out
}

/// The codes and meanings back out of a help or man page text's "Exit status:" section:
/// what tests compare with the tables.
pub fn parse_help(text: &str) -> Vec<(u8, String)> {
    let mut rows: Vec<(u8, String)> = Vec::new();
    let mut lines = text
        .lines()
        .skip_while(|line| line.trim() != "Exit status:");
    lines.next();
    for line in lines {
        if line.trim().is_empty() {
            break;
        }
        let trimmed = line.trim_start();
        let code = trimmed
            .split_whitespace()
            .next()
            .and_then(|word| word.parse::<u8>().ok());
        match code {
            Some(code) if line.len() - trimmed.len() < 4 => {
                let meaning = trimmed[trimmed.find(char::is_whitespace).unwrap_or(0)..].trim();
                rows.push((code, meaning.to_string()));
            }
            _ => {
                if let Some((_, meaning)) = rows.last_mut() {
                    meaning.push(' ');
                    meaning.push_str(trimmed);
                }
            }
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_lists_every_code_once_and_parses_back() {
        for table in [GPUCTL, WATCHDOG, TRAINER] {
            let text = help(table);
            assert!(text.lines().all(|line| line.len() <= 90), "{text}");
            let parsed = parse_help(&text);
            let expected: Vec<(u8, String)> = table
                .iter()
                .map(|(exit, meaning)| {
                    (
                        exit.code(),
                        meaning.split_whitespace().collect::<Vec<_>>().join(" "),
                    )
                })
                .collect();
            assert_eq!(parsed, expected);
        }
    }

    #[test]
    fn codes_are_the_documented_numbers() {
        let codes: Vec<u8> = GPUCTL.iter().map(|(exit, _)| exit.code()).collect();
        assert_eq!(codes, [0, 1, 2, 3, 4, 6, 126, 127]);
        assert_eq!(Exit::OutOfMemory.code(), 5);
        assert_eq!(Exit::NeedsAction.code(), 6);
    }
}
