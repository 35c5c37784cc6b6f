//! Every example in the guide runs as written. Each fenced block of docs/guide/*.md and the
//! README is marked on the line before it (CONTRIBUTING.md, "Guide examples"):
//!
//!     <!-- example: scenario=crates/nvml-sim/examples/h200x8.toml columns=100 -->
//!     <!-- not-run: REASON -->
//!
//! An example block is `$ COMMAND` lines, each followed by what it prints (stdout and stderr
//! as one stream; a `...` line stands for any lines). Its commands run in order, in one
//! simulation of the scenario (`nvml-sim run`), with the built gpuctl first on PATH and
//! nothing of this machine's configuration or state; the output must equal the page's but
//! for the volatile fields `normalize` names. A block with no marker fails the count.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::util::{TEAM_ACCOUNTS, repo_root, target_dir};

/// How a block is marked.
#[derive(Debug, PartialEq)]
enum Marker {
    Example(Example),
    NotRun(String),
    /// No marker, or one that does not parse (the message says why).
    Bad(String),
}

#[derive(Debug, Default, PartialEq)]
struct Example {
    /// Relative to the repository root.
    scenario: String,
    /// A configuration file (relative to the repository root); none: an empty one.
    config: Option<String>,
    /// COLUMNS for the commands, as a terminal that wide would set it.
    columns: Option<u32>,
}

#[derive(Debug)]
struct Block {
    place: String,
    marker: Marker,
    lines: Vec<String>,
}

fn parse_marker(line: &str) -> Marker {
    let Some(inner) = line
        .trim()
        .strip_prefix("<!--")
        .and_then(|l| l.strip_suffix("-->"))
    else {
        return Marker::Bad(
            "no marker on the line before it (<!-- example: ... --> or <!-- not-run: REASON -->)"
                .into(),
        );
    };
    let inner = inner.trim();
    if let Some(reason) = inner.strip_prefix("not-run:") {
        return match reason.trim() {
            "" => Marker::Bad("not-run needs a reason".into()),
            reason => Marker::NotRun(reason.to_string()),
        };
    }
    let Some(settings) = inner.strip_prefix("example:") else {
        return Marker::Bad(format!("'{inner}' is neither example: nor not-run:"));
    };
    let mut example = Example::default();
    for setting in settings.split_whitespace() {
        match setting.split_once('=') {
            Some(("scenario", v)) => example.scenario = v.to_string(),
            Some(("config", v)) => example.config = Some(v.to_string()),
            Some(("columns", v)) => match v.parse() {
                Ok(n) => example.columns = Some(n),
                Err(_) => return Marker::Bad(format!("columns={v} is not a number")),
            },
            _ => return Marker::Bad(format!("unknown example setting '{setting}'")),
        }
    }
    if example.scenario.is_empty() {
        return Marker::Bad("an example names its scenario=".into());
    }
    Marker::Example(example)
}

/// Every fenced block of `text`, with the marker on the nearest non-blank line before it.
fn blocks(name: &str, text: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let fence = lines[i].trim_start();
        if !fence.starts_with("```") {
            i += 1;
            continue;
        }
        let indent = lines[i].len() - fence.len();
        let before = lines[..i].iter().rev().find(|l| !l.trim().is_empty());
        let marker = parse_marker(before.copied().unwrap_or(""));
        let start = i;
        i += 1;
        let mut body = Vec::new();
        while i < lines.len() && !lines[i].trim_start().starts_with("```") {
            body.push(
                lines[i]
                    .get(indent..)
                    .unwrap_or(lines[i].trim())
                    .to_string(),
            );
            i += 1;
        }
        i += 1;
        found.push(Block {
            place: format!("{name}:{}", start + 1),
            marker,
            lines: body,
        });
    }
    found
}

fn guide_blocks() -> Vec<Block> {
    let mut pages: Vec<PathBuf> = std::fs::read_dir(repo_root().join("docs/guide"))
        .expect("docs/guide")
        .map(|e| e.expect("docs/guide entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    pages.push(repo_root().join("README.md"));
    pages
        .iter()
        .flat_map(|page| {
            let name = page
                .strip_prefix(repo_root())
                .unwrap()
                .display()
                .to_string();
            let text = std::fs::read_to_string(page).expect("read a guide page");
            blocks(&name, &text)
        })
        .collect()
}

/// A token that is a duration or an age as gpuctl prints them: `0s`, `24s`, `1.0s`, `3h12m`,
/// `2d04h`, `0.0s` (trailing `:,;)` aside).
fn is_age(token: &str) -> bool {
    let mut rest = token
        .trim_start_matches('(')
        .trim_end_matches([':', ',', ';', ')']);
    let mut parts = 0;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        if digits == 0 || !rest.as_bytes()[0].is_ascii_digit() {
            return false;
        }
        rest = &rest[digits..];
        let unit = ["ms", "s", "m", "h", "d"]
            .into_iter()
            .find(|u| rest.starts_with(u));
        let Some(unit) = unit else { return false };
        rest = &rest[unit.len()..];
        parts += 1;
    }
    parts > 0
}

fn is_number(token: &str) -> bool {
    !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit() || b == b'.')
}

/// An ISO 8601 UTC time, `2026-11-26T18:55:23Z`, inside `token`.
fn replace_times(token: &str) -> String {
    let chars: Vec<char> = token.chars().collect();
    let shape: Vec<char> = "dddd-dd-ddTdd:dd:ddZ".chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < chars.len() {
        let fits = chars.len() - i >= shape.len()
            && shape.iter().zip(&chars[i..]).all(|(s, c)| match s {
                'd' => c.is_ascii_digit(),
                s => s == c,
            });
        if fits {
            out.push_str("<time>");
            i += shape.len();
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    out
}

/// What differs from one run to the next, and only that: times of day, ages and durations
/// (`1.0 s`, `0 ms` too), pids (a row's first column, `pid N`), and the column widths they
/// change (runs of spaces count as one).
fn normalize(line: &str) -> String {
    let tokens: Vec<&str> = line.split_whitespace().collect();
    let mut out: Vec<String> = Vec::with_capacity(tokens.len());
    for (i, token) in tokens.iter().enumerate() {
        let previous = i.checked_sub(1).map(|p| tokens[p]);
        let next = tokens.get(i + 1).copied();
        // A process row: its pid, then its user (a name, or `?` where none is known).
        let pid_row = i == 0
            && tokens.len() >= 3
            && is_number(token)
            && tokens[1].starts_with(|c: char| c.is_alphabetic() || c == '?');
        // `pid N`, `(pid N)`, logfmt's `MESSAGE="pid N`.
        let named_pid = previous.is_some_and(|p| p.ends_with("pid"))
            && is_number(token.trim_end_matches([':', ',', ')']));
        let value = if token.strip_prefix("PID=").is_some_and(is_number) {
            "PID=<pid>".to_string()
        } else if pid_row || named_pid {
            let tail = &token[token.trim_end_matches([':', ',', ')']).len()..];
            format!("<pid>{tail}")
        } else if is_age(token) {
            // The punctuation around it stays: `(4s):` is `(<age>):`.
            let core = token
                .trim_start_matches('(')
                .trim_end_matches([':', ',', ';', ')']);
            token.replacen(core, "<age>", 1)
        } else if is_number(token)
            && next.is_some_and(|n| n == "s" || n == "ms" || n.starts_with("s,"))
        {
            "<n>".to_string()
        } else {
            replace_times(token)
        };
        out.push(value);
    }
    out.join(" ")
}

/// Whether `actual` is `expected`, where an expected `...` line is any lines (none too).
fn matches(expected: &[String], actual: &[String]) -> bool {
    match expected.split_first() {
        None => actual.is_empty(),
        Some((first, rest)) if first == "..." => {
            (0..=actual.len()).any(|skip| matches(rest, &actual[skip..]))
        }
        Some((first, rest)) => actual
            .split_first()
            .is_some_and(|(a, more)| a == first && matches(rest, more)),
    }
}

/// Single quotes for sh.
fn quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// The shell script that runs `commands` as at a prompt: each line shown, then run.
fn script_of(example: &Example, commands: &[&str]) -> String {
    // Each command sees the status of the one before it, as at a prompt (`echo $?`).
    let mut script = String::from("exec 2>&1\nstatus=0\n");
    for command in commands {
        let shown = quoted(&format!("$ {command}"));
        // A terminal that wide, as the page's screen was taken in (gpuctl cuts to a
        // terminal's width only): script(1) gives it one.
        let run = match example.columns {
            Some(columns) => format!(
                "script -qec {} /dev/null",
                quoted(&format!("stty cols {columns} rows 60; {command}"))
            ),
            None => command.to_string(),
        };
        script.push_str(&format!(
            "printf '%s\\n' {shown}; (exit $status); {run}\nstatus=$?\n"
        ));
    }
    script
}

/// Runs the block's commands in one simulation of its scenario; what they printed.
fn run_example(example: &Example, commands: &[&str]) -> Result<String, String> {
    let scratch = tempfile::tempdir().expect("tempdir");
    let config = match &example.config {
        Some(path) => repo_root().join(path),
        None => {
            let empty = scratch.path().join("etc/gpuctl.toml");
            std::fs::create_dir(scratch.path().join("etc")).expect("mkdir etc");
            std::fs::write(&empty, "").expect("write the empty configuration");
            empty
        }
    };
    if example.columns.is_some()
        && !Command::new("script")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    {
        return Err("columns= needs script(1) from util-linux, not found on PATH".into());
    }
    let script = script_of(example, commands);
    let kernel_log = scratch.path().join("kmsg");
    std::fs::write(&kernel_log, "").expect("create the kernel log");
    let path = format!(
        "{}:{}",
        target_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut launcher = Command::new(target_dir().join("nvml-sim"));
    launcher.arg("run");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        launcher.arg("--create-users");
    }
    launcher
        .arg(repo_root().join(&example.scenario))
        .args(["--", "sh", "-c", &script])
        .current_dir(scratch.path())
        .env("PATH", path)
        .env("GPUCTL_CONFIG", &config)
        .env("GPUCTL_STATE_DIR", scratch.path().join("state"))
        .env("GPUCTL_LEASE_DIR", scratch.path().join("leases"))
        .env("GPUCTL_SOCKET", scratch.path().join("no-service.sock"))
        .env("NVML_SIM_STATE", scratch.path().join("sim-state.json"))
        .env("GPUCTL_KERNEL_LOG", &kernel_log)
        .env("NVML_SIM_KERNEL_LOG", &kernel_log)
        .env("LANG", "C.UTF-8")
        .env_remove("NO_COLOR")
        .env_remove("COLUMNS")
        .env_remove("GPUCTL_NVML_TIMEOUT")
        .stdin(Stdio::null());
    if example.columns.is_some() {
        // A terminal, but a screen without colors.
        launcher.env("NO_COLOR", "1");
    }
    let output = launcher
        .output()
        .map_err(|e| format!("cannot run nvml-sim: {e}"))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !stderr.trim().is_empty() {
        return Err(format!("nvml-sim said: {}", stderr.trim()));
    }
    // A terminal's line ends are \r\n.
    Ok(String::from_utf8_lossy(&output.stdout).replace('\r', ""))
}

/// None when the block's example runs as written, else what differs.
fn check_example(block: &Block, example: &Example) -> Option<String> {
    let commands: Vec<&str> = block
        .lines
        .iter()
        .filter_map(|l| l.strip_prefix("$ "))
        .collect();
    if !block.lines.first().is_some_and(|l| l.starts_with("$ ")) {
        return Some(format!(
            "{}: an example starts with a `$ ` command line",
            block.place
        ));
    }
    let expected: Vec<String> = block.lines.iter().map(|l| normalize(l)).collect();
    let mut actual = match run_example(example, &commands) {
        Ok(actual) => actual,
        Err(reason) => return Some(format!("{}: {reason}", block.place)),
    };
    // Each table's PID column is as wide as its widest pid, and a screen cut to a width cuts
    // its commands where that column leaves off. Pids that crossed a power of ten during
    // the run (GPU 0's 9984, then GPU 6's 10003) make the tables' columns differ, which no
    // one terminal width evens out: a run again starts past the crossing.
    let page_widths = pid_widths(block.lines.iter().map(String::as_str));
    let mut run_widths = pid_widths(actual.lines());
    for _ in 0..2 {
        if !mixed(&run_widths) || mixed(&page_widths) {
            break;
        }
        actual = match run_example(example, &commands) {
            Ok(actual) => actual,
            Err(reason) => return Some(format!("{}: {reason}", block.place)),
        };
        run_widths = pid_widths(actual.lines());
    }
    let mut got: Vec<String> = actual.lines().map(normalize).collect();
    // Pids one digit longer than the page's leave each command one character less. Once
    // more in a terminal as much wider, the commands have the page's room.
    let widths = (page_widths.first().copied(), run_widths.first().copied());
    if let (Some(columns), (Some(page), Some(run))) = (example.columns, widths)
        && page != run
        && !matches(&expected, &got)
    {
        let wider = Example {
            columns: Some((i64::from(columns) + run as i64 - page as i64).max(1) as u32),
            scenario: example.scenario.clone(),
            config: example.config.clone(),
        };
        actual = match run_example(&wider, &commands) {
            Ok(actual) => actual,
            Err(reason) => return Some(format!("{}: {reason}", block.place)),
        };
        got = actual.lines().map(normalize).collect();
    }
    (!matches(&expected, &got)).then(|| {
        format!(
            "{}: the page shows\n{}\n--- but it prints\n{actual}--- (normalized: page | run)\n{}",
            block.place,
            block.lines.join("\n"),
            side_by_side(&expected, &got)
        )
    })
}

/// The digits of each process row's pid (`normalize`'s pid rows), in order.
fn pid_widths<'a>(lines: impl Iterator<Item = &'a str>) -> Vec<usize> {
    lines
        .filter_map(|line| {
            let tokens: Vec<&str> = line.split_whitespace().collect();
            (tokens.len() >= 3
                && tokens[0].bytes().all(|b| b.is_ascii_digit())
                && tokens[1].starts_with(|c: char| c.is_alphabetic() || c == '?'))
            .then(|| tokens[0].len())
        })
        .collect()
}

/// Whether the pids are not all as long.
fn mixed(widths: &[usize]) -> bool {
    widths.windows(2).any(|pair| pair[0] != pair[1])
}

fn side_by_side(expected: &[String], got: &[String]) -> String {
    (0..expected.len().max(got.len()))
        .map(|i| {
            let e = expected.get(i).map_or("", String::as_str);
            let g = got.get(i).map_or("", String::as_str);
            let mark = if e == g { ' ' } else { '!' };
            format!("{mark} {e}\n  {g}\n")
        })
        .collect()
}

/// Every fenced block is marked, so none escapes the run by being forgotten.
#[test]
fn every_block_in_the_guide_is_marked() {
    let all = guide_blocks();
    let unmarked: Vec<String> = all
        .iter()
        .filter_map(|b| match &b.marker {
            Marker::Bad(why) => Some(format!("{}: {why}", b.place)),
            _ => None,
        })
        .collect();
    assert!(unmarked.is_empty(), "{}", unmarked.join("\n"));
    let examples = all
        .iter()
        .filter(|b| matches!(b.marker, Marker::Example(_)))
        .count();
    // A floor: a change that stops the guide's examples from running shows here.
    assert!(examples >= 9, "only {examples} of {} blocks run", all.len());
}

#[test]
fn every_guide_example_runs_as_written() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "the guide's examples show the team's users, which nvml-sim makes only as root: run the suite as root"
    );
    // The demo's accounts (alice, bob, carol) exist only while a launcher holds them.
    let _accounts = TEAM_ACCOUNTS.lock().unwrap_or_else(|e| e.into_inner());
    let failures: Vec<String> = guide_blocks()
        .iter()
        .filter_map(|block| match &block.marker {
            Marker::Example(example) => check_example(block, example),
            _ => None,
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[cfg(test)]
mod unit {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(normalize).collect()
    }

    #[test]
    fn pids_across_a_power_of_ten_are_told_from_one_width() {
        let run = [
            "   PID  USER     MEMORY   SM",
            "  9984  alice  128.0 GiB  94%",
            "    PID  USER    MEMORY   SM",
            "  10003  carol  36.0 GiB  71%",
            "      -  -       9.0 GiB    -",
        ];
        assert_eq!(pid_widths(run.into_iter()), [4, 5]);
        assert!(mixed(&pid_widths(run.into_iter())));
        let page = [
            "  8202  alice  128.0 GiB  94%",
            "  8225  carol  36.0 GiB  71%",
        ];
        assert_eq!(pid_widths(page.into_iter()), [4, 4]);
        assert!(!mixed(&pid_widths(page.into_iter())));
        assert!(!mixed(&[]));
    }

    #[test]
    fn volatile_fields_are_forgiven_and_nothing_else() {
        let page = "  8202  alice  128.0 GiB  94%   0s  sleeping  slurm 812.0  python3\n\
                    driver 570.133.20 · 3 GPUs · 2026-11-26T18:55:23Z\n\
                    gpuctl run: pid 2829 (sleep), not on a GPU: ended by SIGTERM after 0 ms\n\
                    GPU 0 for 1.0 s, exit status 0";
        let run = "  20330  alice  128.0 GiB  94%   2h  sleeping  slurm 812.0  python3\n\
                   driver 570.133.20 · 3 GPUs · 2026-11-28T14:13:12Z\n\
                   gpuctl run: pid 20874 (sleep), not on a GPU: ended by SIGTERM after 12 ms\n\
                   GPU 0 for 1.3 s, exit status 0";
        assert!(matches(&lines(page), &lines(run)));
        for changed in [
            run.replace("128.0 GiB", "127.0 GiB"),
            run.replace("alice", "bob"),
            run.replace("94%", "93%"),
            run.replace("812.0", "813.0"),
            run.replace("3 GPUs", "4 GPUs"),
            run.replace("exit status 0", "exit status 1"),
            run.replace("GPU 0 for", "GPU 3 for"),
        ] {
            assert!(!matches(&lines(page), &lines(&changed)), "{changed}");
        }
    }

    #[test]
    fn an_ellipsis_stands_for_any_lines() {
        let page = lines("a\n...\nz");
        assert!(matches(&page, &lines("a\nz")));
        assert!(matches(&page, &lines("a\nb\nc\nz")));
        assert!(!matches(&page, &lines("a\nb")));
        assert!(!matches(&lines("a\nz"), &lines("a\nb\nz")));
    }

    #[test]
    fn markers_parse_or_say_why_not() {
        assert_eq!(
            parse_marker("<!-- example: scenario=x.toml columns=100 -->"),
            Marker::Example(Example {
                scenario: "x.toml".into(),
                config: None,
                columns: Some(100)
            })
        );
        assert_eq!(
            parse_marker("<!-- not-run: needs Docker -->"),
            Marker::NotRun("needs Docker".into())
        );
        for bad in [
            "",
            "some prose",
            "<!-- not-run: -->",
            "<!-- example: columns=100 -->",
            "<!-- example: scenario=x.toml colums=100 -->",
        ] {
            assert!(matches!(parse_marker(bad), Marker::Bad(_)), "{bad}");
        }
    }
}
