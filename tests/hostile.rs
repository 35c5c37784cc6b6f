//! What a process chooses for itself (its command line) never reaches the admin's terminal
//! as control characters: tables escape it, one row per process, and cap its length; JSON
//! keeps it exact.

use std::time::Duration;

use serde_json::Value;

use crate::util::{GIB, Gpu, Proc, Process, Scenario, Sim, process_on};

/// An argument that would retitle the terminal, clear it, colour what follows, start a
/// fake row, and reorder the rest with a right-to-left override.
const HOSTILE: &str =
    "\x1b]0;owned\x07\x1b[2J\x1b[31mred\nFAKE ROW 1 root\t\u{9b}1A\u{202e}txt.exe";

/// An H200 with one busy job holding `used` bytes.
fn one_job(pid: u32, used: u64) -> Scenario {
    Scenario::new()
        .gpu(Gpu::h200())
        .process(Process::new(pid).used(used).sm(50))
}

/// No byte of a control character (C0 other than the newlines between rows, DEL, the UTF-8
/// of C1) nor a bidirectional override in `text`.
fn assert_terminal_safe(text: &str) {
    for (at, c) in text.char_indices() {
        assert!(
            c == '\n' || !(c.is_control() || ('\u{202a}'..='\u{202e}').contains(&c)),
            "{:?} at byte {at} of {text:?}",
            c
        );
    }
}

fn command_of(doc: &Value, pid: u32) -> String {
    process_on(doc, 0, pid).unwrap_or_else(|| panic!("pid {pid} not in {doc}"))["command"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn escape_sequences_and_newlines_are_shown_escaped_in_one_row_and_exact_in_json() {
    let job = Proc::sleeper("python3", &["train.py", HOSTILE]);
    let sim = Sim::new(&one_job(job.pid(), 2 * GIB));
    let table = sim.run(&["info", "--color", "never"]);
    assert_eq!(table.code, 0, "{}", table.stderr);
    assert_terminal_safe(&table.stdout);
    let rows: Vec<&str> = table
        .stdout
        .lines()
        .filter(|line| line.contains(&job.pid().to_string()))
        .collect();
    assert_eq!(rows.len(), 1, "{}", table.stdout);
    assert!(!table.stdout.contains("\nFAKE ROW"), "{}", table.stdout);
    assert!(
        rows[0].contains("train.py \\e]0;owned\\x07\\e[2J\\e[31mred\\nFAKE ROW 1 root\\t\\u{9b}1A\\u{202e}txt.exe"),
        "{}",
        rows[0]
    );

    let doc = sim.json(&["info"]);
    assert_eq!(
        command_of(&doc, job.pid()),
        format!("python3 train.py {HOSTILE}")
    );

    // The kill report names it the same way: escaped in the table, exact in JSON.
    let pid = job.pid().to_string();
    let dry = sim.run(&["kill", "--pid", &pid, "--dry-run", "--color", "never"]);
    assert_eq!(dry.code, 0, "{}", dry.stderr);
    assert_terminal_safe(&dry.stdout);
    assert!(dry.stdout.contains("\\e]0;owned"), "{}", dry.stdout);
    let dry = sim.json(&["kill", "--pid", &pid, "--dry-run"]);
    assert_eq!(
        dry["outcomes"][0]["command"],
        format!("python3 train.py {HOSTILE}").as_str()
    );
}

#[test]
fn a_megabyte_command_line_is_one_capped_row_and_whole_in_json() {
    // Eight arguments of 128 KiB (the kernel's limit for one), 1 MiB in all.
    let chunk = "x".repeat(128 * 1024 - 1);
    let args: Vec<&str> = std::iter::repeat_n(chunk.as_str(), 8).collect();
    let job = Proc::sleeper("python3", &args);
    let sim = Sim::new(&one_job(job.pid(), 4 * GIB));
    let table = sim.run(&["info", "--color", "never"]);
    assert_eq!(table.code, 0, "{}", table.stderr);
    let row = table
        .stdout
        .lines()
        .find(|line| line.contains(&job.pid().to_string()))
        .unwrap();
    assert!(row.chars().count() < 4096 + 200, "{} characters", row.len());
    assert!(row.ends_with('…'), "the cut is marked");
    let doc = sim.json(&["info"]);
    assert_eq!(
        command_of(&doc, job.pid()).len(),
        "python3 ".len() + 8 * chunk.len() + 7
    );
}

/// Two H200s, GPU 1 blocking every call for `hang`; a job on each.
fn hanging(hang: Duration, jobs: &[(u32, u32)]) -> Scenario {
    Scenario::new()
        .gpu(Gpu::h200())
        .gpu(Gpu::h200().hang(hang))
        .processes(
            jobs.iter()
                .map(|&(pid, gpu)| Process::new(pid).on(gpu).used(GIB).sm(50)),
        )
}

#[test]
fn a_gpu_that_does_not_answer_is_marked_and_info_returns_within_its_deadline() {
    let job0 = Proc::sleeper("python3", &["train.py"]);
    let job1 = Proc::sleeper("python3", &["eval.py"]);
    let sim = Sim::new(&hanging(
        Duration::from_secs(60),
        &[(job0.pid(), 0), (job1.pid(), 1)],
    ));

    let started = std::time::Instant::now();
    let table = sim.run(&["info", "--timeout", "1s", "--color", "never"]);
    let took = started.elapsed();
    assert!(took < std::time::Duration::from_secs(3), "took {took:?}");
    assert_eq!(table.code, 1, "{table:?}");
    assert!(
        table
            .stdout
            .contains("NOT ANSWERING: not answering after 1s"),
        "{}",
        table.stdout
    );
    assert!(
        table.stdout.contains("train.py"),
        "GPU 0 is shown: {}",
        table.stdout
    );
    assert!(
        table.stderr.contains("GPU 1: not answering after 1s"),
        "{}",
        table.stderr
    );

    // The environment sets it too; JSON marks the GPU.
    let run = crate::util::Run::from(
        sim.gpuctl(&["info", "--json"])
            .env("GPUCTL_NVML_TIMEOUT", "500ms")
            .output()
            .unwrap(),
    );
    assert_eq!(run.code, 1, "{}", run.stderr);
    let doc: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(doc["devices"][0]["status"], "ok");
    assert_eq!(doc["devices"][0]["processes"][0]["pid"], job0.pid());
    assert_eq!(doc["devices"][1]["status"], "not_answering");
    assert_eq!(doc["devices"][1]["error"], "not answering after 500ms");

    // A timeout that is not a duration is a usage error, in one line.
    let bad = crate::util::Run::from(
        sim.gpuctl(&["info"])
            .env("GPUCTL_NVML_TIMEOUT", "soon")
            .output()
            .unwrap(),
    );
    assert_eq!(bad.code, 2, "{bad:?}");
    assert_eq!(bad.stderr.lines().count(), 1, "{}", bad.stderr);
    assert!(bad.stderr.contains("GPUCTL_NVML_TIMEOUT"), "{}", bad.stderr);
}

#[test]
fn reset_of_a_gpu_that_does_not_answer_fails_it_alone_within_the_deadline() {
    let sim = Sim::new(&hanging(Duration::from_secs(60), &[]));
    let started = std::time::Instant::now();
    let run = crate::util::Run::from(
        sim.gpuctl(&["reset", "--compute-mode", "--json"])
            .env("GPUCTL_NVML_TIMEOUT", "500ms")
            .output()
            .unwrap(),
    );
    let took = started.elapsed();
    // Resolving the GPUs (their UUIDs) and the reset each wait at most the timeout.
    assert!(took < std::time::Duration::from_secs(4), "took {took:?}");
    assert_eq!(run.code, 1, "{run:?}");
    let doc: Value = serde_json::from_str(&run.stdout).unwrap();
    let gpus = doc["gpus"].as_array().unwrap();
    assert_eq!(gpus[0]["items"][0]["outcome"], "done", "{doc}");
    assert_eq!(gpus[1]["items"][0]["outcome"], "failed", "{doc}");
    assert_eq!(
        gpus[1]["items"][0]["error"], "not answering after 500ms",
        "{doc}"
    );
}

#[test]
fn bytes_that_are_not_utf8_are_shown_as_hex_in_tables_and_replaced_in_json() {
    use std::os::unix::ffi::OsStrExt;
    let job = Proc::spawn_with("sleep", "python3", &["train.py"], |command| {
        command.arg(std::ffi::OsStr::from_bytes(b"--tag=\xff\xfe\x1bok"));
    });
    let pid = job.pid();
    let path = format!("/proc/{pid}/cmdline");
    crate::util::wait_until(std::time::Duration::from_secs(10), || {
        std::fs::read(&path).is_ok_and(|bytes| bytes.ends_with(b"ok\0"))
    });
    let sim = Sim::new(&one_job(pid, GIB));
    let table = sim.run(&["info", "--color", "never"]);
    assert_eq!(table.code, 0, "{}", table.stderr);
    assert_terminal_safe(&table.stdout);
    assert!(
        table.stdout.contains("train.py --tag=\\xff\\xfe\\eok"),
        "{}",
        table.stdout
    );
    let doc = sim.json(&["info"]);
    assert_eq!(
        command_of(&doc, pid),
        "python3 train.py --tag=\u{fffd}\u{fffd}\u{1b}ok"
    );
}
