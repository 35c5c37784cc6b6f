//! Memory nobody accounts for, explained: the processes holding a GPU's device file that
//! NVML does not list (`info --holders`), and ended only when asked (`clear --holders`).
//! Real processes hold real files in the device directory nvml-sim creates.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::util::{
    GIB, Gpu, MIB, Proc, Process, RootOwnedProgram, Run, Scenario, Sim, alive, is_root, wait_exited,
};

/// A sim with `device_dir`, its device files created (by a first NVML client).
fn sim_with_devices(gpus: usize) -> (Sim, PathBuf) {
    let sim = Sim::new("");
    let dev = sim.dev_dir();
    sim.write(&devices(&dev).gpus(gpus, Gpu::new()));
    let first = sim.run(&["info"]);
    assert_eq!(first.code, 0, "{}", first.stderr);
    for name in ["nvidia0", "nvidiactl", "nvidia-uvm"] {
        assert!(
            dev.join(name).exists(),
            "nvml-sim created {name} in {}",
            dev.display()
        );
    }
    (sim, dev)
}

/// A scenario whose GPUs' device files go in `dev`.
fn devices(dev: &Path) -> Scenario {
    Scenario::new().device_dir(dev)
}

fn holders_of(doc: &Value, gpu: usize) -> &Vec<Value> {
    doc["devices"][gpu]["holders"]
        .as_array()
        .unwrap_or_else(|| panic!("GPU {gpu} has no holders list: {}", doc["devices"][gpu]))
}

fn holder(doc: &Value, gpu: usize, pid: u32) -> Option<&Value> {
    holders_of(doc, gpu)
        .iter()
        .find(|h| h["pid"].as_u64() == Some(u64::from(pid)))
}

#[test]
fn an_unlisted_holder_is_named_suspected_and_cleared_only_when_asked() {
    let (sim, dev) = sim_with_devices(2);
    let file = |name: &str| dev.join(name);
    let (ctl, uvm, gpu0, gpu1) = (
        file("nvidiactl"),
        file("nvidia-uvm"),
        file("nvidia0"),
        file("nvidia1"),
    );
    // A training job NVML lists on GPU 0; CUDA opened both GPUs' files.
    let job = Proc::spawn_holding("python3", &["train.py"], &[&ctl, &uvm, &gpu0, &gpu1]);
    // A process holding 30 GiB on GPU 1 that NVML does not list.
    let hidden = Proc::spawn_holding("python3", &["infer.py"], &[&ctl, &uvm, &gpu1]);
    // A monitoring client: holds every GPU's file, no memory.
    let tool_program = is_root().then(|| RootOwnedProgram::install("nvidia-smi"));
    let tool = tool_program.as_ref().map(|program| {
        Proc::spawn_program_with(
            program.path(),
            "sleep",
            "nvidia-smi",
            &[],
            &[&ctl, &gpu0, &gpu1],
        )
    });
    sim.write(
        &devices(&dev)
            .gpus(2, Gpu::new())
            .process(Process::new(job.pid()).used(40 * GIB))
            .process(Process::new(hidden.pid()).on(1).used(30 * GIB).unlisted()),
    );

    // 30 GiB nobody accounts for, above the 1 GiB threshold: info says how to look, and
    // looks only when asked (the scan reads every process's descriptors).
    let unasked = sim.json(&["info"]);
    assert!(unasked["devices"][1].get("holders").is_none(), "{unasked}");
    let hint = sim.run(&["info"]);
    assert!(
        hint.stdout.contains(
            "holders of /dev/nvidia1 not looked for (gpuctl info --holders looks: it reads \
             every process's open files)"
        ),
        "{}",
        hint.stdout
    );
    let doc = sim.json(&["info", "--holders"]);
    assert_eq!(
        doc["devices"][1]["memory"]["unattributed_bytes"].as_u64(),
        Some(30 << 30)
    );
    let suspect = holder(&doc, 1, hidden.pid()).expect("the hidden holder is named");
    assert_eq!(suspect["suspect"], "unknown", "{suspect}");
    let reason = suspect["reason"].as_str().unwrap();
    assert!(
        reason.contains("nvidia1") && reason.contains("NVML does not list it"),
        "{reason}"
    );
    assert_eq!(suspect["argv"][1], "infer.py");
    let listed = holder(&doc, 1, job.pid()).expect("the job holds nvidia1 too");
    assert_eq!(listed["suspect"], "listed_elsewhere");
    assert!(
        listed["reason"].as_str().unwrap().contains("GPU 0"),
        "{listed}"
    );
    assert!(
        holder(&doc, 0, job.pid()).is_none(),
        "NVML lists it on GPU 0"
    );
    assert!(
        holder(&doc, 0, hidden.pid()).is_none(),
        "it holds no nvidia0"
    );
    if let Some(tool) = &tool {
        for gpu in [0, 1] {
            let named = holder(&doc, gpu, tool.pid()).expect("the tool is named");
            assert_eq!(named["suspect"], "tool", "{named}");
            assert!(named["reason"].as_str().unwrap().contains("nvidia-smi"));
        }
    }
    let table = sim.run(&["info", "--holders"]);
    assert_eq!(table.code, 0, "{}", table.stderr);
    assert!(
        table
            .stdout
            .contains("holding /dev/nvidia1, not listed by NVML:"),
        "{}",
        table.stdout
    );
    assert!(
        table.stdout.contains(&format!("    {}  ", hidden.pid())),
        "{}",
        table.stdout
    );
    assert!(
        table
            .stdout
            .contains("/dev/nvidia1 is also open in 1 process NVML lists on other GPUs"),
        "{}",
        table.stdout
    );

    // clear without --holders leaves it: nothing NVML lists is a leftover.
    let plain = sim.run(&["clear", "--json"]);
    assert_eq!(plain.code, 0, "{}", plain.stderr);
    assert!(alive(hidden.pid()));

    // clear --holders ends it, and only it; the memory comes back.
    let cleared = sim.run(&["clear", "--holders", "--gpu", "1", "--wait=10s", "--json"]);
    assert_eq!(cleared.code, 0, "{}\n{}", cleared.stdout, cleared.stderr);
    let report: Value = serde_json::from_str(&cleared.stdout).unwrap();
    let outcomes = report["outcomes"].as_array().unwrap();
    assert_eq!(outcomes.len(), 1, "{report}");
    assert_eq!(outcomes[0]["pid"].as_u64(), Some(u64::from(hidden.pid())));
    assert_eq!(outcomes[0]["memory_released"], true);
    wait_exited(hidden.pid());
    assert!(alive(job.pid()), "the listed job is untouched");
    if let Some(tool) = &tool {
        assert!(alive(tool.pid()), "the tool is untouched");
    }
    let after = sim.json(&["info", "--holders"]);
    assert_eq!(
        after["devices"][1]["memory"]["used_bytes"].as_u64(),
        Some(0)
    );
}

#[test]
fn a_holder_in_a_live_jobs_process_group_is_named_but_never_cleared() {
    let (sim, dev) = sim_with_devices(1);
    // Two processes of one job (one process group): NVML lists the first only.
    let mut listed = Proc::spawn_holding("python3", &["train.py"], &[&dev.join("nvidia0")]);
    let pgid = listed.pid();
    let helper = Proc::spawn_with("sleep", "python3", &["prefetch.py"], |command| {
        use std::os::unix::process::CommandExt;
        command
            .env("GPUCTL_TESTPROC_OPEN", dev.join("nvidia0"))
            .process_group(pgid as i32);
    });
    crate::util::wait_until(std::time::Duration::from_secs(5), || {
        std::fs::read_link(format!("/proc/{}/fd/3", helper.pid())).is_ok()
    });
    sim.write(
        &devices(&dev)
            .gpu(Gpu::new())
            .process(Process::new(listed.pid()).used(GIB))
            .process(Process::new(helper.pid()).used(4 * GIB).unlisted()),
    );
    let doc = sim.json(&["info", "--holders"]);
    let named = holder(&doc, 0, helper.pid()).expect("named");
    let reason = named["reason"].as_str().unwrap();
    assert!(reason.contains("part of a live job"), "{reason}");
    let cleared = sim.run(&["clear", "--holders", "--json"]);
    assert_eq!(cleared.code, 0, "{}", cleared.stderr);
    let report: Value = serde_json::from_str(&cleared.stdout).unwrap();
    assert_eq!(report["outcomes"], serde_json::json!([]), "{report}");
    assert!(alive(helper.pid()), "a live job's process is never cleared");
    listed.kill();
}

/// The scan reads every process's descriptors (400 ms on a busy server), so `info` runs
/// it only when asked; where a GPU has at least `holders_threshold` of memory no listed
/// process accounts for, the table says it was not looked for and how to look, never "none".
#[test]
fn the_scan_runs_only_when_asked_and_the_table_says_where_it_would_explain_memory() {
    let (sim, dev) = sim_with_devices(2);
    let timed = |args: &[&str]| -> Run {
        Run::from(
            sim.gpuctl(args)
                .env("GPUCTL_TIMINGS", "1")
                .output()
                .expect("run gpuctl"),
        )
    };
    let scanned = |run: &Run| -> bool {
        assert_eq!(run.code, 0, "{}", run.stderr);
        let doc: Value = serde_json::from_str(&run.stdout).unwrap();
        let present: Vec<bool> = doc["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.get("holders").is_some())
            .collect();
        let timed = run.stderr.contains(", holders ");
        assert!(
            present.iter().all(|p| *p == timed),
            "holders keys {present:?} and timings agree: {}",
            run.stderr
        );
        timed
    };
    let hint = "holders of /dev/nvidia0 not looked for (gpuctl info --holders looks";
    // 512 MiB nobody accounts for: below 1 GiB, no scan and nothing to say.
    sim.write(
        &devices(&dev)
            .gpu(Gpu::new().leaked(512 * MIB))
            .gpu(Gpu::new()),
    );
    assert!(!scanned(&timed(&["info", "--json"])), "below the threshold");
    assert!(!sim.run(&["info"]).stdout.contains("holders of"));
    // Asked for: every device carries a list, empty or not.
    let asked = timed(&["info", "--json", "--holders"]);
    assert!(scanned(&asked));
    let doc: Value = serde_json::from_str(&asked.stdout).unwrap();
    assert_eq!(holders_of(&doc, 0), &Vec::<Value>::new());
    // A lower threshold in the configuration: still no scan unasked, and the table says so.
    std::fs::write(sim.config_path(), "holders_threshold = \"256MiB\"\n").unwrap();
    assert!(
        !scanned(&timed(&["info", "--json"])),
        "above holders_threshold, not asked"
    );
    let table = sim.run(&["info"]);
    assert!(table.stdout.contains(hint), "{}", table.stdout);
    std::fs::write(sim.config_path(), "").unwrap();
    // 2 GiB: above the default.
    sim.write(
        &devices(&dev)
            .gpu(Gpu::new().leaked(2 * GIB))
            .gpu(Gpu::new()),
    );
    assert!(
        !scanned(&timed(&["info", "--json"])),
        "above 1 GiB, not asked"
    );
    // The table points at the GPU with memory to explain, and says nothing of the other.
    let table = sim.run(&["info"]);
    assert!(table.stdout.contains(hint), "{}", table.stdout);
    assert!(!table.stdout.contains("nvidia1"), "{}", table.stdout);
    // Asked, it looks and says what it found: none.
    let table = sim.run(&["info", "--holders"]);
    assert!(
        table
            .stdout
            .contains("holders of /dev/nvidia0 that NVML does not list: none"),
        "{}",
        table.stdout
    );
    assert!(!table.stdout.contains("nvidia1"), "{}", table.stdout);
    // A bad threshold is a configuration error naming the key.
    std::fs::write(sim.config_path(), "holders_threshold = \"lots\"\n").unwrap();
    let bad = sim.run(&["clear"]);
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    assert!(bad.stderr.contains("holders_threshold"), "{}", bad.stderr);
}

/// A zombie leader whose other threads still hold the device file (its own descriptor
/// table is gone): found through its threads, suspected as a job's exiting process, and
/// cleared with --holders.
#[test]
fn a_zombie_leader_holding_a_device_file_through_its_threads_is_found_and_cleared() {
    let (sim, dev) = sim_with_devices(1);
    let zombie = Proc::spawn_with("zombie-leader", "python3", &["train.py"], |command| {
        use std::os::unix::process::CommandExt;
        command
            .env("GPUCTL_TESTPROC_OPEN", dev.join("nvidia0"))
            .process_group(0);
    });
    zombie.wait_for_state('Z');
    sim.write(
        &devices(&dev)
            .gpu(Gpu::new())
            .process(Process::new(zombie.pid()).used(8 * GIB).unlisted()),
    );
    let doc = sim.json(&["info", "--holders"]);
    let named = holder(&doc, 0, zombie.pid()).expect("found through its threads");
    assert_eq!(named["suspect"], "job_process", "{named}");
    assert_eq!(named["state"], "zombie");
    let cleared = sim.run(&["clear", "--holders", "--wait=10s", "--json"]);
    assert_eq!(cleared.code, 0, "{}\n{}", cleared.stdout, cleared.stderr);
    wait_exited(zombie.pid());
}
