//! `gpuctl reset` and peak marks against nvml-sim: settings reach the sim and are read back
//! from its state file; unsupported and forbidden items are reported as such.

use serde_json::Value;

use crate::util::{GIB, Gpu, MIB, Proc, Process, Scenario, Sim};

fn sim_state(sim: &Sim) -> Value {
    serde_json::from_str(&std::fs::read_to_string(sim.state_path()).unwrap_or("{}".into())).unwrap()
}

fn outcomes(doc: &Value, gpu: usize) -> Vec<(String, String)> {
    doc["gpus"][gpu]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["item"].as_str().unwrap().to_string(),
                i["outcome"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn reset_restores_settings_in_the_sim_and_reports_each_item() {
    let sim = Sim::new(
        "driver_version = \"1\"\ncuda_driver_version = 12080\n\
         [[gpu]]\ncompute_mode = \"exclusive_process\"\n\
         [[gpu]]\ncompute_mode = \"prohibited\"\nunsupported = [\"applications_clocks\"]\n\
         no_permission = [\"compute_mode\"]\n",
    );
    // A dry run changes nothing.
    let dry = sim.run(&["reset", "--dry-run", "--json"]);
    assert_eq!(dry.code, 0, "{}", dry.stderr);
    let doc: Value = serde_json::from_str(&dry.stdout).unwrap();
    assert!(outcomes(&doc, 0).iter().all(|(_, o)| o == "would_do"));
    let info = sim.json(&["info"]);
    assert_eq!(info["devices"][0]["compute_mode"], "exclusive_process");

    let run = sim.run(&["reset", "--json"]);
    // GPU 1 forbids changing its compute mode: that is a failure of the operation.
    assert_eq!(run.code, 1, "{}", run.stderr);
    let doc: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(doc["schema"], 1);
    let gpu0 = outcomes(&doc, 0);
    assert!(gpu0.iter().all(|(_, o)| o == "done"), "{gpu0:?}");
    let gpu1 = outcomes(&doc, 1);
    assert!(
        gpu1.contains(&("application_clocks".into(), "not_supported".into())),
        "{gpu1:?}"
    );
    assert!(
        gpu1.contains(&("compute_mode".into(), "not_permitted".into())),
        "{gpu1:?}"
    );
    assert!(
        gpu1.contains(&("locked_clocks".into(), "done".into())),
        "{gpu1:?}"
    );

    // Read back through NVML (another process) and from the sim's state file.
    let info = sim.json(&["info"]);
    assert_eq!(info["devices"][0]["compute_mode"], "default");
    assert_eq!(info["devices"][1]["compute_mode"], "prohibited");
    let uuid0 = info["devices"][0]["uuid"].as_str().unwrap();
    assert_eq!(sim_state(&sim)["gpus"][uuid0]["compute_mode"], "default");
}

#[test]
fn reset_items_are_selectable_and_not_supported_is_not_a_failure() {
    let sim = Sim::new(
        "driver_version = \"1\"\ncuda_driver_version = 12080\n\
         [[gpu]]\ncompute_mode = \"exclusive_process\"\nunsupported = [\"locked_clocks\"]\n",
    );
    let run = sim.run(&["reset", "--locked-clocks", "--peaks", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let doc: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(
        outcomes(&doc, 0),
        vec![
            ("locked_clocks".to_string(), "not_supported".to_string()),
            ("peak_marks".to_string(), "done".to_string())
        ]
    );
    // Compute mode was not asked for and is untouched.
    assert_eq!(
        sim.json(&["info"])["devices"][0]["compute_mode"],
        "exclusive_process"
    );
    sim.run(&["reset", "--gpu", "3"])
        .assert_one_line_error(2, "no GPU matches '3'");
}

#[test]
fn peak_marks_rise_with_use_and_clear_on_reset() {
    let holder = Proc::sleeper("python3", &["train.py"]);
    let scenario = |used: u64| {
        Scenario::new()
            .driver_version("1")
            .gpu(Gpu::new())
            .process(Process::new(holder.pid()).used(used))
    };
    let sim = Sim::new(&scenario(4 * GIB));
    let peak = |sim: &Sim| sim.json(&["info"])["devices"][0]["peak"]["used_bytes"].as_u64();
    assert_eq!(peak(&sim), Some(4096 << 20));
    sim.write(&scenario(GIB));
    assert_eq!(
        peak(&sim),
        Some(4096 << 20),
        "the peak stays after use falls"
    );
    let table = sim.run(&["info", "--color", "never"]);
    assert!(table.stdout.contains("peak 4.0 GiB"), "{}", table.stdout);
    assert_eq!(sim.run(&["reset", "--peaks"]).code, 0);
    assert_eq!(
        peak(&sim),
        Some(1024 << 20),
        "after reset the mark starts again"
    );
}

#[test]
fn fraction_is_stored_with_comments_kept_and_shown_with_its_source() {
    let sim = Sim::new("driver_version = \"1\"\ncuda_driver_version = 12080\n[[gpu]]\n[[gpu]]\n");
    let original = "# site policy, reviewed 2026-11\n[fraction]\n# most jobs\ndefault = 0.9 # keep\n\n[protect]\nusers = [\"slurm\"]\n";
    std::fs::write(sim.config_path(), original).unwrap();
    let run = sim.run(&["fraction", "0.75"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stdout.contains("fraction.default = 0.75"),
        "{}",
        run.stdout
    );
    assert_eq!(
        std::fs::read_to_string(sim.config_path()).unwrap(),
        original.replace("default = 0.9 # keep", "default = 0.75 # keep")
    );
    assert_eq!(sim.run(&["fraction", "50%", "--gpu", "1"]).code, 0);
    let doc = sim.json(&["fraction"]);
    let shares: Vec<(f64, String)> = doc["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["fraction"].as_f64().unwrap(),
                g["source"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(shares[0].0, 0.75);
    assert!(shares[0].1.ends_with("fraction.default"), "{shares:?}");
    assert_eq!(shares[1].0, 0.5);
    assert!(shares[1].1.ends_with("fraction.gpu.\"1\""), "{shares:?}");
}

#[test]
fn bad_fractions_and_bad_configs_are_one_line_usage_errors() {
    let sim = Sim::new("driver_version = \"1\"\ncuda_driver_version = 12080\n[[gpu]]\n");
    for bad in ["0", "-0.5", "1.5", "NaN", "inf", "garbage", "150%"] {
        sim.run(&["fraction", bad]).assert_one_line_error(2, bad);
    }
    assert!(
        std::fs::read_to_string(sim.config_path())
            .unwrap()
            .is_empty(),
        "a bad value must not create the file"
    );
    std::fs::write(
        sim.config_path(),
        "[fraction]\ndefault = 0.5\nfractoin = 1\n",
    )
    .unwrap();
    for command in [&["fraction"][..], &["enable"], &["clear", "--dry-run"]] {
        let run = sim.run(command);
        run.assert_one_line_error(2, "line 3: unknown key 'fraction.fractoin'");
        assert!(
            run.stderr
                .contains(&sim.config_path().display().to_string())
        );
    }
}

/// Every command that reads the configuration, as a user would give it.
const READERS: &[&[&str]] = &[
    &["info"],
    &["info", "--json"],
    &["info", "--idle"],
    &["kill", "--pid", "1", "--dry-run"],
    &["clear", "--dry-run"],
    &["reset", "--dry-run"],
    &["health"],
    &["health", "--ack", "0"],
    &["fraction"],
    &["enable"],
    &["pick"],
    &["run", "--", "true"],
];

#[test]
fn a_named_configuration_that_is_missing_or_malformed_stops_every_command() {
    let sim = Sim::new("driver_version = \"1\"\ncuda_driver_version = 12080\n[[gpu]]\n");
    let missing = sim.dir.path().join("gpuctl.tmol");
    let watchdog = |config: &std::path::Path, flag: bool| {
        let mut command = std::process::Command::new(crate::util::watchdog_bin());
        sim.watchdog_env(&mut command)
            .env("GPUCTL_STATE_DIR", sim.dir.path().join("watchdog-state"))
            .arg("--once");
        match flag {
            true => command.arg("--config").arg(config),
            false => command.env("GPUCTL_CONFIG", config),
        };
        crate::util::Run::from(command.output().expect("run gpuctl-watchdog"))
    };
    for args in READERS {
        let run = crate::util::Run::from(
            sim.gpuctl(args)
                .env("GPUCTL_CONFIG", &missing)
                .env("GPUCTL_LEASE_DIR", sim.dir.path().join("leases"))
                .output()
                .unwrap(),
        );
        run.assert_one_line_error(2, "gpuctl.tmol: no such file (named by GPUCTL_CONFIG)");
    }
    watchdog(&missing, false).assert_one_line_error(2, "no such file (named by GPUCTL_CONFIG)");
    watchdog(&missing, true).assert_one_line_error(2, "no such file (named by --config)");
    assert!(!sim.dir.path().join("watchdog-state").exists());
    std::fs::write(
        sim.config_path(),
        "[watchdog]\nmode = \"report\"\ngrace = \"2s\"\nmdoe = 1\n",
    )
    .unwrap();
    for args in READERS {
        let run = sim.run(args);
        run.assert_one_line_error(2, "line 4: unknown key 'watchdog.mdoe'");
    }
    watchdog(&sim.config_path(), false).assert_one_line_error(2, "unknown key 'watchdog.mdoe'");
    // /dev/null names no file: the built-in policy.
    let none = sim
        .gpuctl(&["info"])
        .env("GPUCTL_CONFIG", "/dev/null")
        .output()
        .unwrap();
    assert!(none.status.success(), "{none:?}");
}

#[test]
fn a_non_root_rehearsal_of_reset_is_refused_as_by_a_real_driver() {
    if !nix_is_root() {
        panic!("cannot run here: needs root to run gpuctl as another user");
    }
    let sim = Sim::new(&Scenario::new().gpu(Gpu::new()));
    sim.share();
    let run = crate::util::Run::from(sim.gpuctl_as(65534, &["reset", "--json"]).output().unwrap());
    assert_eq!(run.code, 1, "{}", run.stderr);
    let doc: Value = serde_json::from_str(&run.stdout).unwrap();
    let refused: Vec<(String, String)> = outcomes(&doc, 0)
        .into_iter()
        .filter(|(item, _)| item == "compute_mode" || item == "application_clocks")
        .collect();
    assert_eq!(refused.len(), 2, "{doc:#}");
    assert!(
        refused
            .iter()
            .all(|(_, outcome)| outcome == "not_permitted"),
        "{refused:?}"
    );
}

#[test]
fn a_config_writable_by_others_is_refused_when_it_steers_root() {
    if !nix_is_root() {
        panic!("cannot run here: the trust check for root needs root");
    }
    use std::os::unix::fs::PermissionsExt;
    let sim = Sim::new("driver_version = \"1\"\ncuda_driver_version = 12080\n[[gpu]]\n");
    std::fs::write(sim.config_path(), "[fraction]\ndefault = 0.5\n").unwrap();
    std::fs::set_permissions(sim.config_path(), std::fs::Permissions::from_mode(0o666)).unwrap();
    sim.run(&["clear", "--dry-run"])
        .assert_one_line_error(2, "is writable by everyone: refusing it");
    std::fs::set_permissions(sim.config_path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    assert_eq!(sim.run(&["clear", "--dry-run"]).code, 0);
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid(2) takes nothing, cannot fail and touches no memory of ours.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn enable_prints_merges_and_execs() {
    let sim = Sim::new("driver_version = \"1\"\ncuda_driver_version = 12080\n[[gpu]]\n");
    std::fs::write(sim.config_path(), "[fraction]\ndefault = 0.6\n").unwrap();
    let run = crate::util::Run::from(
        sim.gpuctl(&["enable"])
            .env("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
            .env("TF_FORCE_GPU_ALLOW_GROWTH", "false")
            .output()
            .unwrap(),
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let out = &run.stdout;
    assert!(
        out.contains(
            "export PYTORCH_CUDA_ALLOC_CONF='max_split_size_mb:128,expandable_segments:True';"
        ),
        "{out}"
    );
    assert!(
        out.contains("export PYTORCH_ALLOC_CONF='expandable_segments:True';"),
        "{out}"
    );
    assert!(
        out.contains("export XLA_PYTHON_CLIENT_MEM_FRACTION='0.6';"),
        "{out}"
    );
    assert!(
        out.contains("export TF_FORCE_GPU_ALLOW_GROWTH='false';"),
        "the user's value is kept: {out}"
    );
    // What is printed is valid for sh: eval it and read a variable back.
    let evaluated = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{out}\nprintf %s \"$PYTORCH_CUDA_ALLOC_CONF\""))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&evaluated.stdout),
        "max_split_size_mb:128,expandable_segments:True"
    );
    let fish = sim.run(&["enable", "--shell", "fish"]);
    assert!(
        fish.stdout.contains("set -gx CUDA_MODULE_LOADING 'LAZY';"),
        "{}",
        fish.stdout
    );

    // With a command: exec'd with the settings, no shell between, its status is ours.
    let run = sim.run(&[
        "enable",
        "--",
        "sh",
        "-c",
        "printf '%s|%s' \"$PYTORCH_ALLOC_CONF\" \"$XLA_PYTHON_CLIENT_PREALLOCATE\"; exit 7",
    ]);
    assert_eq!(run.code, 7);
    assert_eq!(run.stdout, "expandable_segments:True|false");
    sim.run(&["enable", "--", "/nonexistent/train"])
        .assert_one_line_error(127, "/nonexistent/train: no such file");
    let not_executable = sim.dir.path().join("notes.txt");
    std::fs::write(&not_executable, "not a program\n").unwrap();
    let path = not_executable.to_str().unwrap();
    sim.run(&["enable", "--", path])
        .assert_one_line_error(126, &format!("cannot run {path}"));
}

#[test]
fn enable_persistence_reaches_the_sim_and_a_refusal_stops_the_command() {
    let sim = Sim::new(
        "driver_version = \"1\"\ncuda_driver_version = 12080\n[[gpu]]\n[[gpu]]\nno_permission = [\"persistence_mode\"]\n",
    );
    let run = sim.run(&["enable", "--persistence", "--gpu", "0", "--", "true"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stderr.contains("GPU 0: persistence mode: done"),
        "{}",
        run.stderr
    );
    let info = sim.json(&["info"]);
    assert_eq!(info["devices"][0]["persistence_mode"], true);
    assert_eq!(info["devices"][1]["persistence_mode"], false);

    let marker = sim.dir.path().join("ran");
    let run = sim.run(&[
        "enable",
        "--persistence",
        "--",
        "touch",
        marker.to_str().unwrap(),
    ]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("GPU 1: persistence mode: not permitted"),
        "{}",
        run.stderr
    );
    assert!(
        !marker.exists(),
        "the command must not run when persistence was refused"
    );
}

#[test]
fn protect_lists_from_the_config_spare_processes() {
    // A configured command is spared when it is that program (a root-owned executable of
    // that name in root-owned directories: only root can install one), not when a process
    // merely takes the name.
    if !crate::util::is_root() {
        panic!(
            "cannot run here: needs root to install a root-owned program in a root-owned directory"
        );
    }
    let installed = crate::util::RootOwnedProgram::install("my-monitor");
    let monitor = Proc::spawn_program_ready(
        installed.path(),
        "sleep",
        "my-monitor",
        &["--interval", "5"],
    );
    let impostor = Proc::sleeper("my-monitor", &["--interval", "5"]);
    let sim = Sim::new(
        &Scenario::new()
            .driver_version("1")
            .gpu(Gpu::new())
            .process(Process::new(monitor.pid()).used(100 * MIB))
            .process(Process::new(impostor.pid()).used(100 * MIB)),
    );
    std::fs::write(
        sim.config_path(),
        "[protect]\ncommands = [\"my-monitor\"]\n",
    )
    .unwrap();
    let run = sim.run(&[
        "kill",
        "--pid",
        &monitor.pid().to_string(),
        "--timeout",
        "1s",
    ]);
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert!(
        run.stdout.contains("protected: my-monitor"),
        "{}",
        run.stdout
    );
    assert!(
        crate::util::proc_state(monitor.pid()).is_some(),
        "the protected process was signalled"
    );
    let run = sim.run(&[
        "kill",
        "--pid",
        &impostor.pid().to_string(),
        "--timeout",
        "1s",
    ]);
    assert_eq!(run.code, 0, "{}", run.stdout);
    assert!(!run.stdout.contains("protected"), "{}", run.stdout);
}
