//! What a newcomer reads first, held as rules: sizes in the tables' units wherever they
//! appear, a GPU's UUID whole at 80 columns, a command line cut in the middle so its
//! distinguishing end stays, and the demo's server as a team's (users, Slurm job, unit,
//! container).

use std::process::{Command, Stdio};

use crate::util::{GIB, Gpu, Proc, Process, Pty, Scenario, Sim, repo_root};

/// `gpuctl ARGS` with stdout on a terminal `columns` wide (a pty without a size: gpuctl
/// takes COLUMNS then), in a UTF-8 locale without colors; what it printed, lines ending in
/// `\n`.
fn on_terminal(sim: &Sim, columns: usize, args: &[&str]) -> String {
    let pty = Pty::open();
    let received = pty.reader();
    let mut gpuctl = sim.gpuctl(args);
    gpuctl
        .env("COLUMNS", columns.to_string())
        .env("LANG", "C.UTF-8")
        .env_remove("LC_ALL")
        .env_remove("LC_CTYPE")
        .stdout(pty.slave.try_clone().unwrap())
        .stderr(Stdio::piped());
    let child = gpuctl.spawn().expect("run gpuctl");
    let Pty { master, slave } = pty;
    drop(slave);
    let output = child.wait_with_output().expect("gpuctl");
    assert!(
        output.status.success(),
        "gpuctl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    drop(master);
    let mut text = Vec::new();
    while let Ok(bytes) = received.recv_timeout(std::time::Duration::from_secs(2)) {
        text.extend(bytes);
    }
    String::from_utf8_lossy(&text).replace("\r\n", "\n")
}

#[test]
fn at_80_columns_the_gpu_header_wraps_and_the_uuid_stays_whole() {
    let sim = Sim::new(&Scenario::new().gpu(Gpu::h200()));
    let uuid = sim.json(&["info"])["devices"][0]["uuid"]
        .as_str()
        .expect("a UUID")
        .to_string();
    let text = on_terminal(&sim, 80, &["info", "--color", "never"]);
    let title = text
        .lines()
        .find(|l| l.starts_with("GPU 0"))
        .unwrap_or_else(|| panic!("no GPU line: {text}"));
    assert_eq!(title, "GPU 0 · NVIDIA H200 · 00000000:18:00.0", "{text}");
    assert!(
        text.contains(&format!("{title}\n  {uuid}\n")),
        "the UUID on a line of its own: {text}"
    );
    for line in text.lines() {
        assert!(line.chars().count() <= 80, "{line:?} passes 80 columns");
    }
    // Wide enough: one line, as before.
    let text = on_terminal(&sim, 120, &["info", "--color", "never"]);
    assert!(
        text.contains(&format!(
            "GPU 0 · NVIDIA H200 · 00000000:18:00.0 · {uuid}\n"
        )),
        "{text}"
    );
}

#[test]
fn a_command_cut_to_fit_keeps_its_end() {
    let argv = |rank: &'static str| {
        [
            "-m",
            "torch.distributed.run",
            "--nproc-per-node=4",
            "train.py",
            "--model",
            "llama-70b",
            "--rank",
            rank,
        ]
    };
    let ranks: Vec<Proc> = ["0", "1", "2", "3"]
        .iter()
        .map(|rank| Proc::sleeper("python3", &argv(rank)))
        .collect();
    let mut scenario = Scenario::new().gpu(Gpu::h200());
    for rank in &ranks {
        scenario = scenario.process(Process::new(rank.pid()).used(GIB));
    }
    let sim = Sim::new(&scenario);
    let text = on_terminal(&sim, 100, &["info", "--color", "never"]);
    for (rank, process) in ranks.iter().enumerate() {
        let row = text
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{} ", process.pid())))
            .unwrap_or_else(|| panic!("no row for rank {rank}: {text}"));
        assert!(row.chars().count() <= 100, "{row:?}");
        // The cut falls between the program and the rank, wherever the width puts it.
        assert!(
            row.contains("python3 -m torch.distributed")
                && row.contains(" … ")
                && row.ends_with(&format!(" --rank {rank}")),
            "rank {rank}: {row:?}"
        );
    }
    // Not on a terminal: nothing is cut.
    let piped = sim.run(&["info", "--color", "never"]);
    assert!(
        piped
            .stdout
            .contains("python3 -m torch.distributed.run --nproc-per-node=4 train.py --model llama-70b --rank 3"),
        "{}",
        piped.stdout
    );
}

#[test]
fn a_reason_gives_sizes_in_the_tables_units() {
    let big = Proc::sleeper("python3", &["finetune_lora.py"]);
    let small = Proc::sleeper("python3", &["notebook.py"]);
    let sim = Sim::new(
        &Scenario::new()
            .gpu(Gpu::h200())
            .process(Process::new(big.pid()).used(36 * GIB))
            .process(Process::new(small.pid()).used(GIB)),
    );
    let run = sim.run(&[
        "kill",
        "--dry-run",
        "--min-mem",
        "20GiB",
        "--color",
        "never",
    ]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout
            .contains("selected: holds 36.0 GiB, at least --min-mem 20.0 GiB"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("36.0 GiB"),
        "the MEMORY column: {}",
        run.stdout
    );
    assert!(!run.stdout.contains(" MiB"), "{}", run.stdout);
    let run = sim.run(&[
        "kill",
        "--dry-run",
        "--min-mem",
        "512MiB",
        "--color",
        "never",
    ]);
    assert!(
        run.stdout
            .contains("selected: holds 1.0 GiB, at least --min-mem 512 MiB"),
        "{}",
        run.stdout
    );
}

/// `scripts/demo` as root, in docs/guide/rehearse.md's words: users, owners a Slurm job, a systemd unit
/// and a container, and `--by user` with a row per user.
#[test]
fn the_demo_shows_a_teams_server() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "the demo shows users and owners only as root (it makes accounts and cgroups): run the suite as root"
    );
    // The demo's accounts exist only while a launcher holds them (the guide's examples too).
    let _accounts = crate::util::TEAM_ACCOUNTS
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let demo = |args: &[&str]| {
        let out = Command::new(repo_root().join("scripts/demo"))
            .args(args)
            // The binaries this suite runs: building them again here would replace them
            // under the other tests.
            .env("GPUCTL_DEMO_BIN", crate::util::target_dir())
            .env("LANG", "C.UTF-8")
            .env_remove("GPUCTL_CONFIG")
            .env_remove("GPUCTL_DEMO_HEAD_START")
            .stdin(Stdio::null())
            .output()
            .expect("run scripts/demo");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            out.status.success(),
            "scripts/demo {args:?}: {stderr}\n{stdout}"
        );
        // As root nothing is worth a warning: users are made, cgroups too.
        assert!(stderr.is_empty(), "{stderr}");
        stdout
    };
    let doc: serde_json::Value =
        serde_json::from_str(&demo(&["info", "--json"])).expect("info --json");
    let processes: Vec<&serde_json::Value> = doc["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .flat_map(|d| d["processes"].as_array().into_iter().flatten())
        .collect();
    let mut users: Vec<&str> = processes
        .iter()
        .filter_map(|p| p["user"].as_str())
        .collect();
    users.sort();
    users.dedup();
    assert_eq!(users, ["alice", "bob", "carol"], "{doc:#}");
    // The stand-ins have run a while when gpuctl looks: AGE shows them running, not 0s.
    for process in &processes {
        let age = process["age_seconds"].as_u64();
        assert!(age.is_some_and(|a| a >= 1), "age {age:?}: {process:#}");
    }
    let owner_of = |kind: &str| {
        processes
            .iter()
            .filter(|p| p["owner"]["kind"] == kind)
            .map(|p| p["owner"].clone())
            .next()
            .unwrap_or_else(|| panic!("no {kind} owner: {doc:#}"))
    };
    assert_eq!(owner_of("slurm_job")["job_id"], 812);
    assert_eq!(owner_of("slurm_job")["step"], "0");
    assert_eq!(owner_of("systemd_unit")["unit"], "vllm.service");
    let container = owner_of("container");
    assert_eq!(container["runtime"], "docker");
    assert_eq!(container["id"].as_str().map(str::len), Some(64));

    let by_user = demo(&["info", "--by", "user", "--color", "never"]);
    let rows: Vec<&str> = by_user
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("USER"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter(|l| !l.trim_start().starts_with("(unattributed)"))
        .collect();
    let names: Vec<&str> = rows
        .iter()
        .filter_map(|r| r.split_whitespace().next())
        .collect();
    assert_eq!(names, ["alice", "bob", "carol"], "{by_user}");

    // The tour: one simulation, so clear's work shows in the info after it.
    let tour = demo(&["--tour"]);
    let captions = tour.lines().filter(|l| l.starts_with("── gpuctl ")).count();
    assert_eq!(captions, 7, "{tour}");
    assert_eq!(tour.matches("ended (SIGTERM)").count(), 3, "{tour}");
    let after = tour
        .rsplit("── gpuctl info --gpu 6 --gpu 7")
        .next()
        .unwrap();
    let gpu7 = after
        .split("GPU 7 ·")
        .nth(1)
        .unwrap_or_else(|| panic!("{tour}"));
    assert!(gpu7.contains("no processes"), "{tour}");
}
