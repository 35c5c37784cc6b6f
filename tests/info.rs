//! `gpuctl info` against nvml-sim with real processes.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::util::{GIB, Gpu, MIB, Proc, Process, Run, Scenario, Sim, wait_until};

/// The versions the tests assert on (the sim's defaults, named here so they stay).
fn header() -> Scenario {
    Scenario::new()
        .driver_version("570.133.20")
        .cuda_driver_version(12080)
}

fn h200() -> Gpu {
    Gpu::h200().memory_total(143771 * MIB)
}

fn device(doc: &Value, index: u64) -> &Value {
    doc["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["index"] == index)
        .unwrap_or_else(|| panic!("no device {index} in {doc}"))
}

#[test]
fn table_shows_processes_with_host_facts_and_unattributed_memory() {
    let train = Proc::sleeper("python3", &["train.py", "--model", "llama-70b"]);
    let notebook = Proc::sleeper("jupyter-kernel", &[]);
    let sim = Sim::new(
        &header()
            .gpu(h200())
            .gpu(h200().leaked(2 * GIB))
            .process(Process::new(train.pid()).used(40 * GIB))
            .process(Process::new(notebook.pid()).on(1).used(GIB)),
    );
    let run = sim.run(&["info", "--color", "never"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let out = &run.stdout;
    assert!(out.contains("driver 570.133.20"), "{out}");
    assert!(out.contains("CUDA 12.8"), "{out}");
    assert!(out.contains("GPU 0") && out.contains("GPU 1"), "{out}");
    let train_line = out
        .lines()
        .find(|l| l.contains(&train.pid().to_string()))
        .expect("training process listed");
    assert!(train_line.contains("40.0 GiB"), "{train_line}");
    assert!(
        train_line.contains("python3 train.py --model llama-70b"),
        "{train_line}"
    );
    assert!(train_line.contains("sleeping"), "{train_line}");
    let me = nix_user();
    assert!(train_line.contains(&me), "{train_line} lacks user {me}");
    // GPU 1 has 2 GiB that no process accounts for.
    let unattributed = out
        .lines()
        .find(|l| l.contains("unattributed"))
        .expect("unattributed line");
    assert!(unattributed.contains("2.0 GiB"), "{unattributed}");
    assert!(!out.contains('\x1b'), "colors with --color never");
}

#[test]
fn json_document_carries_devices_processes_and_memory_arithmetic() {
    let holder = Proc::sleeper("python3", &["-m", "torch.distributed.run", "train.py"]);
    let sim = Sim::new(
        &header()
            .gpu(h200())
            .gpu(h200().leaked(512 * MIB))
            .process(Process::new(holder.pid()).on_each(&[0, 1]).used(1000 * MIB)),
    );
    let doc = sim.json(&["info"]);
    assert_eq!(doc["schema"], 1);
    assert_eq!(doc["driver_version"], "570.133.20");
    for index in [0, 1] {
        let gpu = device(&doc, index);
        assert_eq!(gpu["name"], "NVIDIA H200");
        assert_eq!(gpu["status"], "ok");
        assert!(gpu["uuid"].as_str().unwrap().starts_with("GPU-"));
        let memory = &gpu["memory"];
        assert_eq!(memory["total_bytes"], 143771 * MIB);
        let used = memory["used_bytes"].as_u64().unwrap();
        let free = memory["free_bytes"].as_u64().unwrap();
        let reserved = memory["reserved_bytes"].as_u64().unwrap();
        assert_eq!(used + free + reserved, 143771 * MIB);
        // A process on two GPUs appears on each.
        let processes = gpu["processes"].as_array().unwrap();
        assert_eq!(processes.len(), 1, "{gpu}");
        let p = &processes[0];
        assert_eq!(p["pid"], holder.pid());
        assert_eq!(p["used_bytes"], 1000 * MIB);
        assert_eq!(p["confirmed"], true);
        assert_eq!(p["argv"][0], "python3");
        assert_eq!(p["ppid"], std::process::id());
        assert!(p["start_ticks"].as_u64().is_some());
        assert!(p["owner"]["kind"].is_string(), "{p}");
    }
    assert_eq!(device(&doc, 0)["memory"]["unattributed_bytes"], 0);
    assert_eq!(device(&doc, 1)["memory"]["unattributed_bytes"], 512 * MIB);
    assert_eq!(device(&doc, 1)["memory"]["used_bytes"], (1000 + 512) * MIB);
}

#[test]
fn gpu_selection_by_index_and_uuid_and_bad_selector() {
    let sim = Sim::new(&header().gpus(3, h200()));
    let doc = sim.json(&["info", "--gpu", "2"]);
    let devices = doc["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 1);
    let uuid = devices[0]["uuid"].as_str().unwrap().to_string();
    let doc = sim.json(&["info", "--gpu", &uuid, "--gpu", "0"]);
    let indices: Vec<u64> = doc["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["index"].as_u64().unwrap())
        .collect();
    assert_eq!(indices, vec![0, 2]);

    let run = sim.run(&["info", "--gpu", "7"]);
    run.assert_one_line_error(2, "no GPU matches '7'");
    assert!(
        run.stderr.contains("GPUs present: 0 (GPU-"),
        "{}",
        run.stderr
    );
}

#[test]
fn lost_gpu_is_reported_while_the_others_are_shown() {
    let holder = Proc::sleeper("python3", &["serve.py"]);
    let sim = Sim::new(
        &header()
            .gpu(Gpu::new())
            .gpu(Gpu::new().lost())
            .gpu(Gpu::new())
            .process(Process::new(holder.pid()).on(2).used(300 * MIB)),
    );
    let run = sim.run(&["info", "--json"]);
    // The report is complete for the healthy GPUs; the status tells scripts one failed.
    assert_eq!(run.code, 1, "{}", run.stderr);
    let doc: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(device(&doc, 1)["status"], "lost");
    assert_eq!(device(&doc, 0)["status"], "ok");
    assert_eq!(device(&doc, 2)["processes"][0]["pid"], holder.pid());
    assert!(run.stderr.contains("GPU 1"), "{}", run.stderr);

    let table = sim.run(&["info", "--color", "never"]);
    assert_eq!(table.code, 1);
    assert!(table.stdout.contains("LOST"), "{}", table.stdout);
    assert!(table.stdout.contains("serve.py"), "{}", table.stdout);
}

#[test]
fn missing_library_and_unloaded_driver_exit_3_with_one_line() {
    let sim = Sim::new(&header().gpu(h200()));
    let run = sim
        .gpuctl(&["info"])
        .env("GPUCTL_NVML_LIB", "/nonexistent/libnvidia-ml.so.1")
        .output()
        .unwrap();
    let run = crate::util::Run::from(run);
    run.assert_one_line_error(3, "could not be loaded");
    assert!(run.stderr.contains("GPUCTL_NVML_LIB"), "{}", run.stderr);

    let no_driver = Sim::new(&header().init_error("DRIVER_NOT_LOADED").gpu(h200()));
    no_driver
        .run(&["info", "--json"])
        .assert_one_line_error(3, "kernel driver is not loaded");
}

#[test]
fn zombie_is_not_listed_but_zombie_leader_with_live_threads_is() {
    // An exited child that nobody has reaped yet: a zombie holds no context.
    let mut exited = std::process::Command::new("true").spawn().unwrap();
    let zombie_pid = exited.id();
    wait_until(Duration::from_secs(10), || {
        crate::util::proc_state(zombie_pid) == Some('Z')
    });
    let leader = Proc::spawn("zombie-leader", "python3", &["worker.py"]);
    leader.wait_for_state('Z');
    let sim = Sim::new(
        &header()
            .gpu(h200())
            .process(Process::new(zombie_pid).used(4 * GIB))
            .process(Process::new(leader.pid()).used(2 * GIB)),
    );
    let doc = sim.json(&["info"]);
    let gpu = device(&doc, 0);
    let pids: Vec<u64> = gpu["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pid"].as_u64().unwrap())
        .collect();
    assert_eq!(pids, vec![leader.pid() as u64]);
    let p = &gpu["processes"][0];
    assert_eq!(p["state"], "zombie");
    assert!(p["threads"].as_u64().unwrap() >= 2, "{p}");
    assert_eq!(gpu["memory"]["used_bytes"], 2048 * MIB);
    let _ = exited.wait();
}

#[test]
fn colors_follow_flag_and_no_color() {
    let holder = Proc::sleeper("python3", &["a.py"]);
    let sim = Sim::new(
        &header()
            .gpu(h200())
            .process(Process::new(holder.pid()).used(10 * MIB)),
    );
    let always = sim.run(&["info", "--color", "always"]);
    assert!(always.stdout.contains("\x1b["), "{}", always.stdout);
    // auto on a pipe: no color; NO_COLOR does not override an explicit `always`.
    let auto = sim.run(&["info"]);
    assert!(!auto.stdout.contains('\x1b'));
    let forced = crate::util::Run::from(
        sim.gpuctl(&["info", "--color", "always"])
            .env("NO_COLOR", "1")
            .output()
            .unwrap(),
    );
    assert!(forced.stdout.contains("\x1b["));
    sim.run(&["info", "--color", "sometimes"])
        .assert_one_line_error(2, "possible values: auto, always, never");
}

#[test]
fn watch_refreshes_and_ends_quietly_when_the_reader_goes_away() {
    let sim = Sim::new(&header().gpus(8, h200()));
    // `head` closes the pipe after 3 documents; gpuctl must then end without a word.
    let script = format!(
        "'{}' info --json --watch 0.1 | head -n 3",
        crate::util::gpuctl_bin().display()
    );
    let output = std::process::Command::new("sh")
        .arg("-c")
        .arg(&script)
        .env("GPUCTL_NVML_LIB", crate::util::sim_lib())
        .env("NVML_SIM_SCENARIO", sim.scenario_path())
        .env("NVML_SIM_STATE", sim.state_path())
        .env("GPUCTL_STATE_DIR", sim.dir.path().join("gpuctl-state"))
        .env("GPUCTL_CONFIG", sim.config_path())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let docs: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(docs.len(), 3);
    assert!(
        docs.iter()
            .all(|d| d["devices"].as_array().unwrap().len() == 8)
    );
    assert_eq!(String::from_utf8_lossy(&output.stderr), "");
}

#[test]
fn scenario_changes_are_seen_between_refreshes() {
    let first = Proc::sleeper("python3", &["one.py"]);
    let sim = Sim::new(
        &header()
            .gpu(h200())
            .process(Process::new(first.pid()).used(100 * MIB)),
    );
    let mut watch = sim
        .gpuctl(&["info", "--json", "--watch", "0.1"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let second = Proc::sleeper("python3", &["two.py"]);
    let reader = std::io::BufReader::new(watch.stdout.take().unwrap());
    let mut lines = std::io::BufRead::lines(reader);
    let pids = |line: String| -> Vec<u64> {
        let doc: Value = serde_json::from_str(&line).unwrap();
        doc["devices"][0]["processes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["pid"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(
        pids(lines.next().unwrap().unwrap()),
        vec![first.pid() as u64]
    );
    sim.write(
        &header()
            .gpu(h200())
            .process(Process::new(second.pid()).used(100 * MIB)),
    );
    let mut seen = false;
    for _ in 0..100 {
        if pids(lines.next().unwrap().unwrap()) == vec![second.pid() as u64] {
            seen = true;
            break;
        }
    }
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(seen, "the new scenario was never shown");
}

#[test]
fn bad_watch_values_are_usage_errors() {
    let sim = Sim::new(&header().gpu(h200()));
    for bad in ["0", "-1", "abc", "NaN"] {
        let run = sim.run(&["info", "--watch", bad]);
        run.assert_one_line_error(2, "--watch");
    }
}

fn nix_user() -> String {
    // SAFETY: getuid(2) takes nothing, cannot fail and touches no memory of ours.
    let uid = unsafe { libc::getuid() };
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    passwd
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields.get(2) == Some(&uid.to_string().as_str())).then(|| fields[0].to_string())
        })
        .unwrap_or_else(|| uid.to_string())
}

#[test]
fn in_another_pid_namespace_every_process_is_unconfirmed() {
    // Creating a PID namespace needs privilege; CI runs as root. Elsewhere, say so and stop.
    let probe = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "true"])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        panic!("cannot run here: cannot create a PID namespace here (needs root and unshare)");
    }
    let holder = Proc::sleeper("python3", &["train.py"]);
    let sim = Sim::new(
        &header()
            .gpu(h200())
            .process(Process::new(holder.pid()).used(100 * MIB)),
    );
    // Without --mount-proc, /proc is still the host's: only the namespace differs, so a pid
    // that exists in /proc must still not be attributed.
    let command = sim.gpuctl(&["info", "--json"]);
    let gpuctl = command.get_program().to_owned();
    let output = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "--"])
        .arg(gpuctl)
        .args(["info", "--json"])
        .envs(
            command
                .get_envs()
                .filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned()))),
        )
        .output()
        .unwrap();
    let run = crate::util::Run::from(output);
    assert_eq!(run.code, 0, "{}", run.stderr);
    // Hermetic: it asked the test's own socket (where nothing listens), not a service this
    // machine may run on the default path.
    assert!(
        run.stderr
            .contains(sim.no_service_socket().to_str().unwrap()),
        "{}",
        run.stderr
    );
    let doc: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(doc["host_pid_namespace"], false);
    let p = &device(&doc, 0)["processes"][0];
    assert_eq!(p["pid"], holder.pid());
    assert_eq!(p["confirmed"], false);
    assert!(
        p["user"].is_null() && p["command"].is_null() && p["owner"].is_null(),
        "{p}"
    );
    assert!(
        p["unconfirmed_reason"]
            .as_str()
            .unwrap()
            .contains("PID namespace"),
        "{p}"
    );
}

#[test]
fn timings_are_one_stderr_line_only_when_asked_for() {
    let job = Proc::sleeper("python3", &["train.py"]);
    let sim = Sim::new(
        &header()
            .gpus(2, h200())
            .process(Process::new(job.pid()).on(1).used(2 * GIB)),
    );
    let quiet = sim.run(&["info", "--json"]);
    assert_eq!((quiet.code, quiet.stderr.as_str()), (0, ""));
    let timed = Run::from(
        sim.gpuctl(&["info", "--json"])
            .env("GPUCTL_TIMINGS", "1")
            .output()
            .unwrap(),
    );
    assert_eq!(timed.code, 0, "{}", timed.stderr);
    assert_eq!(timed.stdout.lines().count(), quiet.stdout.lines().count());
    let line = timed.stderr.trim_end();
    assert_eq!(timed.stderr.lines().count(), 1, "{line}");
    let phases: Vec<(&str, f64)> = line
        .strip_prefix("gpuctl: timings: ")
        .unwrap_or_else(|| panic!("{line}"))
        .split(", ")
        .map(|part| {
            let mut words = part.split(' ');
            let name = words.next().unwrap();
            let ms: f64 = words.next().unwrap().parse().unwrap();
            assert_eq!(words.next(), Some("ms"), "{part}");
            (name, ms)
        })
        .collect();
    let names: Vec<&str> = phases.iter().map(|(name, _)| *name).collect();
    assert_eq!(names, ["open", "nvml", "proc", "peaks", "render"]);
    assert!(phases.iter().all(|(_, ms)| *ms >= 0.0), "{line}");
}

/// `--by user` and `--by owner`: each total is the sum of its rows in the per-GPU document,
/// a process on two GPUs counts on both and once as a process.
#[test]
fn totals_by_user_and_owner_are_the_sums_of_the_rows() {
    let mut holders = vec![
        Proc::spawn_ready("sleep", "python3", &["train.py"]),
        Proc::spawn_ready("sleep", "python3", &["eval.py"]),
    ];
    if crate::util::is_root() {
        holders.push(Proc::spawn_as(65534, "sleep", &["serve.py"]));
    }
    let mut scenario = Scenario::new()
        .gpus(2, h200())
        .process(
            Process::new(holders[0].pid())
                .on_each(&[0, 1])
                .used(4 * GIB),
        )
        .process(Process::new(holders[1].pid()).on(1).used(GIB));
    if let Some(other) = holders.get(2) {
        scenario = scenario.process(Process::new(other.pid()).used(2 * GIB));
    }
    let sim = Sim::new(&scenario);
    for by in ["user", "owner"] {
        let doc = sim.json(&["info", "--by", by]);
        let mut want: std::collections::BTreeMap<String, (u64, Vec<u64>, Vec<u64>)> =
            Default::default();
        let users: Vec<Value> = doc["devices"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|d| {
                let index = d["index"].as_u64().unwrap();
                d["processes"].as_array().unwrap().iter().map(move |p| {
                    let mut p = p.clone();
                    p["gpu"] = index.into();
                    p
                })
            })
            .collect();
        for p in &users {
            let key = match by {
                "user" => p["user"].as_str().unwrap().to_string(),
                // Every test process runs in this test's own cgroup: one owner for all.
                _ => "all".to_string(),
            };
            let entry = want.entry(key).or_default();
            entry.0 += p["used_bytes"].as_u64().unwrap();
            let gpu = p["gpu"].as_u64().unwrap();
            if !entry.1.contains(&gpu) {
                entry.1.push(gpu);
            }
            let pid = p["pid"].as_u64().unwrap();
            if !entry.2.contains(&pid) {
                entry.2.push(pid);
            }
        }
        let totals = doc["totals"].as_array().expect("totals with --by");
        assert_eq!(totals.len(), want.len(), "{by}: {totals:?}");
        for t in totals {
            let name = t[by].as_str().expect("the group's name under its key");
            let key = if by == "user" { name } else { "all" };
            let (bytes, gpus, pids) = &want[key];
            assert_eq!(t["used_bytes"].as_u64().unwrap(), *bytes, "{by} {name}");
            let mut gpus = gpus.clone();
            gpus.sort();
            assert_eq!(t["gpus"], serde_json::json!(gpus), "{by} {name}");
            assert_eq!(t["processes"].as_u64().unwrap() as usize, pids.len());
        }
        let sum: u64 = totals
            .iter()
            .map(|t| t["used_bytes"].as_u64().unwrap())
            .sum();
        assert_eq!(
            sum,
            (4096 * 2 + 1024 + if holders.len() > 2 { 2048 } else { 0 }) << 20
        );

        let table = sim.run(&["info", "--by", by]);
        assert_eq!(table.code, 0, "{}", table.stderr);
        assert!(
            table.stdout.contains(&by.to_ascii_uppercase()),
            "{}",
            table.stdout
        );
    }
    // Without --by the document has no totals.
    assert!(sim.json(&["info"]).get("totals").is_none());
    let bad = sim.run(&["info", "--by", "team"]);
    assert_eq!(bad.code, 2, "{}", bad.stderr);
}

/// `info` marks what `clear` would reclaim (finding 6 of issue 52): a crashed run's workers
/// show their finding in the STATE column and as `reclaimable` in the JSON; a healthy
/// process shows neither.
#[test]
fn a_crashed_runs_orphans_are_marked_reclaimable_and_a_healthy_process_is_not() {
    use crate::util::TrainingRun;
    let mut run = TrainingRun::start(2, "sleep", "python3", &["train.py", "--model", "llama-8b"]);
    run.crash();
    let workers = run.workers.pids.clone();
    let healthy = Proc::sleeper("python3", &["serve.py"]);
    let sim = Sim::new(
        &header()
            .gpu(h200())
            .gpu(h200())
            .process(Process::new(workers[0]).used(2 * GIB))
            .process(Process::new(workers[1]).used(2 * GIB))
            .process(Process::new(healthy.pid()).on(1).used(GIB)),
    );
    let table = sim.run(&["info", "--color", "never"]);
    assert_eq!(table.code, 0, "{}", table.stderr);
    let line_of = |pid: u32| {
        table
            .stdout
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{pid} ")))
            .unwrap_or_else(|| panic!("{pid} not listed:\n{}", table.stdout))
            .to_string()
    };
    for &pid in &workers {
        assert!(line_of(pid).contains("  orphaned  "), "{}", line_of(pid));
    }
    let healthy_line = line_of(healthy.pid());
    assert!(!healthy_line.contains("orphaned"), "{healthy_line}");
    assert!(healthy_line.contains("sleeping"), "{healthy_line}");

    let doc = sim.json(&["info"]);
    // The schema, which admits no unknown field, holds the new one.
    let schema = crate::schema::schema("info-v1.schema.json");
    crate::schema::validate(&schema, &schema, &doc, "$").unwrap_or_else(|e| panic!("{e}"));
    crate::schema::conforms(&schema, &doc).unwrap_or_else(|e| panic!("{e}"));
    let process = |gpu: u64, pid: u32| {
        device(&doc, gpu)["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pid"] == pid)
            .unwrap_or_else(|| panic!("{pid} not on GPU {gpu}: {doc}"))
            .clone()
    };
    for &pid in &workers {
        assert_eq!(process(0, pid)["reclaimable"], "orphaned");
    }
    let healthy_doc = process(1, healthy.pid());
    assert!(healthy_doc.get("reclaimable").is_none(), "{healthy_doc}");
}

/// A GPU listing more processes than the first call has room for (256) is asked again at
/// the size NVML names: every process is still listed, and no GPU is in error.
#[test]
fn a_gpu_with_more_processes_than_the_first_call_has_room_for_lists_them_all() {
    let holders: Vec<Proc> = (0..300)
        .map(|_| Proc::sleeper("python3", &["worker.py"]))
        .collect();
    let mut scenario = header().gpu(h200()).gpu(h200());
    for holder in &holders {
        scenario = scenario.process(Process::new(holder.pid()).used(MIB));
    }
    let sim = Sim::new(&scenario);
    let doc = sim.json(&["info"]);
    let gpu = device(&doc, 0);
    assert_eq!(gpu["status"], "ok", "{gpu}");
    let mut listed: Vec<u64> = gpu["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pid"].as_u64().unwrap())
        .collect();
    listed.sort_unstable();
    let mut want: Vec<u64> = holders.iter().map(|h| u64::from(h.pid())).collect();
    want.sort_unstable();
    assert_eq!(listed, want);
    assert_eq!(gpu["memory"]["used_bytes"], 300 * MIB);
    assert_eq!(device(&doc, 1)["processes"], serde_json::json!([]));
}
