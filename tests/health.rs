//! `gpuctl health`, and the health `info` shows: the verdict of each GPU from the sim's
//! health keys and the watchdog's Xid log, its exit status, self-clearing, the Xid catalog
//! override, acknowledgements, and the JSON against its schema.

use std::path::PathBuf;

use serde_json::{Value, json};

use crate::schema::{conforms, validate};
use crate::util::{Gpu, Proc, Scenario, Sim, schema};

const NEEDS_ACTION: i32 = 6;

fn sick() -> Gpu {
    Gpu::new()
        .remapped_rows(3, 1, true, false)
        .ecc([0, 2, 10, 2])
        .clock_event_reasons(&["hw_slowdown"])
}

fn health_json(sim: &Sim, args: &[&str]) -> (i32, Value) {
    let run = sim.run(&[&["health", "--json"], args].concat());
    let doc: Value = serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("invalid JSON ({e}): {}{}", run.stdout, run.stderr));
    let schema = schema("health-v1.schema.json");
    validate(&schema, &schema, &doc, "$").unwrap_or_else(|e| panic!("{e}"));
    conforms(&schema, &doc).unwrap_or_else(|e| panic!("{e}"));
    (run.code, doc)
}

fn actions(doc: &Value) -> Vec<Value> {
    doc["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["action"].clone())
        .collect()
}

fn kinds(gpu: &Value) -> Vec<(String, String)> {
    gpu["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["kind"].as_str().unwrap().to_string(),
                c["action"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// A configuration that points the watchdog's state directory into the scratch directory.
fn state_dir(sim: &Sim, extra: &str) -> PathBuf {
    let dir = sim.dir.path().join("watchdog-state");
    std::fs::create_dir_all(&dir).unwrap();
    let config = format!(
        "[watchdog]\nstate_dir = {}\n{extra}",
        toml::Value::String(dir.display().to_string())
    );
    std::fs::write(sim.config_path(), config).unwrap();
    dir
}

#[test]
fn each_gpu_gets_a_verdict_and_a_lost_one_needs_a_node_reboot() {
    let sim = Sim::new(
        &Scenario::new()
            .gpu(Gpu::new())
            .gpu(sick())
            .gpu(Gpu::new().lost())
            .gpu(Gpu::new().recovery_action("drain_p2p")),
    );
    let (code, doc) = health_json(&sim, &[]);
    assert_eq!(code, NEEDS_ACTION);
    assert_eq!(
        actions(&doc),
        [
            json!("none"),
            json!("gpu_reset"),
            json!("node_reboot"),
            json!("drain_p2p")
        ]
    );
    assert_eq!(
        kinds(&doc["gpus"][1]),
        [
            ("row_remap_pending".into(), "gpu_reset".into()),
            ("ecc_uncorrected_volatile".into(), "gpu_reset".into()),
            ("clock_event".into(), "none".into()),
        ]
    );
    // No recovery_action key: the field reads none, as on a current driver.
    assert_eq!(doc["gpus"][1]["readings"]["recovery_action"], "none");
    assert_eq!(doc["gpus"][1]["readings"]["ecc"]["aggregate_corrected"], 10);
    assert_eq!(doc["gpus"][2]["index"], 2);
    assert_eq!(
        kinds(&doc["gpus"][2]),
        [("lost".into(), "node_reboot".into())]
    );
    assert_eq!(
        kinds(&doc["gpus"][3]),
        [("recovery_action".into(), "drain_p2p".into())]
    );

    // The table: one line a GPU, one a cause.
    let run = sim.run(&["health"]);
    assert_eq!(run.code, NEEDS_ACTION, "{}", run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert!(
        lines[0].starts_with("GPU 0  GPU-") && lines[0].ends_with("  none"),
        "{}",
        run.stdout
    );
    assert!(
        lines[1].ends_with("gpu_reset  (needs a reset)"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains(
            "    row_remap_pending (gpu_reset): a row remap is pending: a GPU reset applies it\n"
        ),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout
            .contains("GPU 2  -  node_reboot  (needs a node reboot)\n"),
        "{}",
        run.stdout
    );

    // --gpu narrows the list; a healthy GPU alone is status 0.
    let (code, doc) = health_json(&sim, &["--gpu", "0"]);
    assert_eq!(code, 0);
    assert_eq!(actions(&doc), [json!("none")]);
    let run = sim.run(&["health", "--gpu", "7"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr.starts_with("gpuctl: no GPU matches '7'"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_scenario_that_heals_clears_every_verdict_by_itself() {
    let scenario = |gpu: Gpu| {
        Scenario::new()
            .gpu(gpu.clone())
            .gpu(gpu.recovery_action("gpu_reset"))
    };
    let sim = Sim::new(&scenario(sick().retired_pages(0, 1, true)));
    let (code, doc) = health_json(&sim, &[]);
    assert_eq!(code, NEEDS_ACTION);
    assert_eq!(actions(&doc), [json!("gpu_reset"), json!("gpu_reset")]);
    assert!(kinds(&doc["gpus"][0]).contains(&("retired_pages_pending".into(), "gpu_reset".into())));
    // What a reset leaves: nothing pending, the volatile counters back at zero, the
    // driver's action none. Nobody cleared anything in gpuctl.
    sim.write(
        &Scenario::new()
            .gpu(
                Gpu::new()
                    .remapped_rows(3, 1, false, false)
                    .ecc([0, 0, 10, 2])
                    .retired_pages(0, 1, false),
            )
            .gpu(Gpu::new().recovery_action("none")),
    );
    let (code, doc) = health_json(&sim, &[]);
    assert_eq!(code, 0, "{doc}");
    assert_eq!(actions(&doc), [json!("none"), json!("none")]);
    assert_eq!(doc["gpus"][0]["causes"], json!([]));
    assert_eq!(doc["gpus"][1]["readings"]["recovery_action"], "none");
}

/// The Xid log as the watchdog writes it (health.json in its state directory).
fn xid_log(dir: &std::path::Path, uuid: &str, records: Value) {
    let log = json!({ "gpus": { uuid: records } });
    std::fs::write(dir.join("health.json"), log.to_string()).unwrap();
}

#[test]
fn xids_since_the_last_reset_hold_their_catalog_action_until_acknowledged() {
    let job = Proc::sleeper("python3", &["train.py"]);
    let sim = Sim::new(
        &Scenario::new()
            .gpu(Gpu::new())
            .gpu(Gpu::new().no_recovery_field()),
    );
    let dir = state_dir(&sim, "");
    let uuid = sim.json(&["info"])["devices"][1]["uuid"]
        .as_str()
        .unwrap()
        .to_string();
    xid_log(
        &dir,
        &uuid,
        json!([
            { "xid": 43, "at_unix": 100 },
            { "xid": 64, "at_unix": 200, "processes": [
                { "pid": 4242, "user": "alice", "owner": "slurm:812", "command": "python3 train.py" }
            ] },
            { "xid": 13, "at_unix": 300, "processes": [ { "pid": job.pid() } ] },
            { "xid": 31, "at_unix": 301, "processes": [ { "pid": 999_999_999 } ] },
        ]),
    );
    let (code, doc) = health_json(&sim, &[]);
    assert_eq!(code, NEEDS_ACTION);
    assert_eq!(actions(&doc), [json!("none"), json!("gpu_reset")]);
    // 43 is ignored (listed, none); 64 resets; 13 is the app's while it runs; 31's
    // process is gone: expired.
    assert_eq!(
        kinds(&doc["gpus"][1]),
        [
            ("xid".into(), "none".into()),
            ("xid".into(), "gpu_reset".into()),
            ("xid".into(), "restart_app".into()),
        ]
    );
    let xid64 = &doc["gpus"][1]["causes"][1];
    assert_eq!(xid64["xid"], 64);
    assert_eq!(xid64["at_unix"], 200);
    assert_eq!(xid64["processes"][0]["owner"], "slurm:812");
    assert_eq!(
        xid64["meaning"],
        "ECC page retirement or row remapper recording failure"
    );
    // info's title line says what it needs, naming the job.
    let run = sim.run(&["info"]);
    assert!(
        run.stdout
            .contains("HEALTH: needs a reset: Xid 64 under job 812"),
        "{}",
        run.stdout
    );

    // An admin acknowledges: the Xids stay listed as history, the GPU needs nothing.
    let run = sim.run(&["health", "--ack", "1"]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let (code, doc) = health_json(&sim, &[]);
    assert_eq!(code, 0);
    assert_eq!(doc["gpus"][1]["causes"][1]["history"], "acknowledged");
    let acks: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("health-acks.json")).unwrap())
            .unwrap();
    assert!(acks["gpus"][&uuid].is_u64(), "{acks}");
}

#[test]
fn an_acknowledgement_goes_where_gpuctl_state_dir_says_when_the_file_names_no_directory() {
    let sim = Sim::new(&Scenario::new().gpu(Gpu::new()));
    let run = sim.run(&["health", "--ack", "0"]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    // Sim::gpuctl sets GPUCTL_STATE_DIR to gpuctl-state; the configuration is empty.
    let acks = sim.dir.path().join("gpuctl-state/health-acks.json");
    assert!(acks.exists(), "{} was not written", acks.display());
}

#[test]
fn an_acknowledgement_refused_for_want_of_root_says_so_once() {
    if !crate::util::is_root() {
        panic!("cannot run here: needs root to run gpuctl as another user");
    }
    let sim = Sim::new(&Scenario::new().gpu(Gpu::new()));
    sim.share();
    // Root's state directory, as /var/lib/gpuctl is.
    let state = sim.dir.path().join("root-state");
    std::fs::create_dir(&state).unwrap();
    let run = crate::util::Run::from(
        sim.gpuctl_as(65534, &["health", "--ack", "0"])
            .env("GPUCTL_STATE_DIR", &state)
            .output()
            .unwrap(),
    );
    run.assert_one_line_error(1, "cannot write ");
    assert!(run.stderr.contains("run as root"), "{}", run.stderr);
    assert_eq!(
        run.stderr.matches("Permission denied").count(),
        1,
        "{}",
        run.stderr
    );
}

#[test]
fn the_drivers_recovery_action_makes_xids_history_and_the_site_can_override_the_catalog() {
    let sim = Sim::new(&Scenario::new().gpu(Gpu::new().recovery_action("none")));
    let dir = state_dir(&sim, "");
    let uuid = sim.json(&["info"])["devices"][0]["uuid"]
        .as_str()
        .unwrap()
        .to_string();
    xid_log(&dir, &uuid, json!([{ "xid": 79, "at_unix": 1 }]));
    let (code, doc) = health_json(&sim, &[]);
    assert_eq!(code, 0);
    assert_eq!(doc["gpus"][0]["causes"][0]["history"], "recovery_action");

    // Without the field: Xid 109 resets by the catalog; the site says none.
    sim.write(&Scenario::new().gpu(Gpu::new().no_recovery_field()));
    xid_log(&dir, &uuid, json!([{ "xid": 109, "at_unix": 1 }]));
    assert_eq!(health_json(&sim, &[]).0, NEEDS_ACTION);
    state_dir(&sim, "[health.xid_actions]\n\"109\" = \"none\"\n");
    let (code, doc) = health_json(&sim, &[]);
    assert_eq!(code, 0);
    assert_eq!(kinds(&doc["gpus"][0]), [("xid".into(), "none".into())]);
    // A bad override is a one-line usage error naming the key.
    state_dir(&sim, "[health.xid_actions]\n\"109\" = \"reboot\"\n");
    let run = sim.run(&["health"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("health.xid_actions"), "{}", run.stderr);
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
}

#[test]
fn info_json_carries_each_devices_health_and_matches_its_schema() {
    let sim = Sim::new(
        &Scenario::new()
            .gpu(Gpu::new())
            .gpu(sick())
            .gpu(Gpu::new().lost()),
    );
    let run = sim.run(&["info", "--json"]);
    assert_eq!(run.code, 1, "a GPU is lost: {}", run.stderr);
    let doc: Value = serde_json::from_str(&run.stdout).unwrap();
    let schema = schema("info-v1.schema.json");
    validate(&schema, &schema, &doc, "$").unwrap_or_else(|e| panic!("{e}"));
    conforms(&schema, &doc).unwrap_or_else(|e| panic!("{e}"));
    let devices = doc["devices"].as_array().unwrap();
    assert_eq!(
        devices[0]["health"],
        json!({ "action": "none", "causes": [] })
    );
    assert_eq!(devices[1]["health"]["action"], "gpu_reset");
    assert_eq!(devices[2]["health"]["action"], "node_reboot");
    // The same verdict gpuctl health gives.
    let (_, health) = health_json(&sim, &[]);
    for (device, gpu) in devices.iter().zip(health["gpus"].as_array().unwrap()) {
        assert_eq!(device["health"]["action"], gpu["action"]);
        assert_eq!(device["health"]["causes"], gpu["causes"]);
    }
    let run = sim.run(&["info"]);
    let title = run
        .stdout
        .lines()
        .find(|l| l.starts_with("GPU 1 "))
        .unwrap();
    assert!(
        title.ends_with("HEALTH: needs a reset: row remap pending; uncorrected ECC errors"),
        "{title}"
    );
    let healthy = run
        .stdout
        .lines()
        .find(|l| l.starts_with("GPU 0 "))
        .unwrap();
    assert!(!healthy.contains("HEALTH"), "{healthy}");
}

/// The health schema and info's copy of the verdict stay the same.
#[test]
fn the_health_schemas_verdict_is_infos() {
    let health = schema("health-v1.schema.json");
    let info = schema("info-v1.schema.json");
    for def in ["action", "cause", "xid_process"] {
        assert_eq!(health["$defs"][def], info["$defs"][def], "{def}");
    }
}

/// `reset --gpu-reset`: refused, naming each holder, while a process uses the GPU (listed by
/// NVML, or holding its device file); done when none does, and the reset clears the GPU's
/// pending state, as a real reset would.
#[test]
fn a_gpu_reset_is_refused_while_anything_holds_the_gpu_and_clears_it_when_done() {
    let sim = Sim::new("");
    let dev = sim.dev_dir();
    let sick = || {
        Gpu::new()
            .recovery_action("gpu_reset")
            .remapped_rows(3, 1, true, false)
            .ecc([1, 2, 10, 2])
    };
    let scenario = |processes: Vec<crate::util::Process>| {
        Scenario::new()
            .device_dir(&dev)
            .gpu(Gpu::new())
            .gpu(sick())
            .processes(processes)
    };
    sim.write(&scenario(vec![]));
    assert_eq!(health_json(&sim, &["--gpu", "1"]).0, NEEDS_ACTION);
    let gpu1 = dev.join("nvidia1");
    assert!(gpu1.exists(), "nvml-sim made the device files");

    // A process NVML lists on GPU 1, and one that only holds its device file.
    let listed = Proc::sleeper("python3", &["train.py"]);
    let holding = Proc::spawn_holding("python3", &["infer.py"], &[&gpu1]);
    sim.write(&scenario(vec![
        crate::util::Process::new(listed.pid()).on(1).used(1 << 30),
    ]));
    let run = sim.run(&["reset", "--gpu", "1", "--gpu-reset"]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout
            .contains(&format!("refused: in use by pid {} (", listed.pid()))
            && run.stdout.contains("python3 train.py")
            && run.stdout.contains(&format!("pid {} (", holding.pid()))
            && run
                .stdout
                .contains("python3 infer.py) holding its device file"),
        "{}",
        run.stdout
    );
    assert_eq!(
        health_json(&sim, &["--gpu", "1"]).0,
        NEEDS_ACTION,
        "nothing was reset"
    );

    // Both gone: --dry-run says what it would do, and does nothing.
    drop(listed);
    drop(holding);
    sim.write(&scenario(vec![]));
    let run = sim.run(&["reset", "--gpu", "1", "--gpu-reset", "--dry-run", "--json"]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let doc: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(doc["gpu_reset"][0]["outcome"], "would_reset");
    let reset_schema = schema("reset-v1.schema.json");
    validate(&reset_schema, &reset_schema, &doc, "$").unwrap_or_else(|e| panic!("{e}"));
    conforms(&reset_schema, &doc).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(health_json(&sim, &["--gpu", "1"]).0, NEEDS_ACTION);

    // Done: the pending remap, the volatile ECC counts and the recovery action clear.
    let run = sim.run(&["reset", "--gpu", "1", "--gpu-reset", "--json"]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let doc: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(doc["gpu_reset"][0]["outcome"], "done");
    assert_eq!(doc["gpu_reset"][0]["via"], "nvml");
    conforms(&reset_schema, &doc).unwrap_or_else(|e| panic!("{e}"));
    let (code, doc) = health_json(&sim, &["--gpu", "1"]);
    assert_eq!(code, 0, "{doc}");
    let readings = &doc["gpus"][0]["readings"];
    assert_eq!(readings["recovery_action"], "none");
    assert_eq!(readings["remapped_rows"]["pending"], false);
    assert_eq!(readings["remapped_rows"]["correctable"], 3);
    assert_eq!(readings["ecc"]["volatile_uncorrected"], 0);
    assert_eq!(readings["ecc"]["aggregate_uncorrected"], 2);

    // Without --gpu, nothing is reset: a usage error.
    let run = sim.run(&["reset", "--gpu-reset"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("give --gpu GPU"), "{}", run.stderr);
    let run = sim.run(&["reset", "--gpu", "1", "--gpu-reset", "--peaks"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
}

/// A GPU that does not answer gets no verdict (action null, exit status 1); one that needs
/// an action beside it still makes the status 6.
#[test]
fn a_gpu_that_does_not_answer_has_no_verdict_and_a_needed_action_wins() {
    let hung = || Gpu::new().hang(std::time::Duration::from_secs(60));
    let sim = Sim::new(&Scenario::new().gpu(Gpu::new()).gpu(hung()));
    let (code, doc) = health_json(&sim, &["--timeout", "300ms"]);
    assert_eq!(code, 1, "{doc}");
    assert_eq!(actions(&doc), [json!("none"), Value::Null]);
    assert!(
        doc["gpus"][1]["error"]
            .as_str()
            .is_some_and(|e| e.contains("not answering")),
        "{doc}"
    );
    let run = sim.run(&["health", "--timeout", "300ms"]);
    assert!(
        run.stderr.contains("gpuctl: GPU 1: not answering"),
        "{}",
        run.stderr
    );
    assert!(
        run.stdout.contains("GPU 1  -  unknown: not answering"),
        "{}",
        run.stdout
    );

    let sim = Sim::new(&Scenario::new().gpu(sick()).gpu(hung()));
    let (code, doc) = health_json(&sim, &["--timeout", "300ms"]);
    assert_eq!(code, NEEDS_ACTION, "{doc}");
    assert_eq!(actions(&doc), [json!("gpu_reset"), Value::Null]);
}

/// A bad health value in the scenario is the sim's one-line error, and NVML unavailable
/// (exit status 3) for gpuctl.
#[test]
fn bad_health_values_in_the_scenario_are_one_line_errors() {
    for (text, says) in [
        (
            "[[gpu]]\nrecovery_action = \"reboot\"\n",
            "line 2: unknown variant 'reboot'",
        ),
        (
            "[[gpu]]\necc = { volatile_uncorrected = 3, aggregate_uncorrected = 1 }\n",
            "gpu[0]: ecc.aggregate_uncorrected (1) is below ecc.volatile_uncorrected (3)",
        ),
        (
            "[[gpu]]\n[[xid]]\ngpu = 2\nxid = 79\n",
            "xid[0]: gpu 2 does not exist (the scenario has 1 GPUs)",
        ),
    ] {
        let sim = Sim::new(text);
        let run = sim.run(&["health"]);
        assert_eq!(run.code, 3, "{text}: {}", run.stderr);
        let line = run
            .stderr
            .lines()
            .find(|l| l.starts_with("nvml-sim: "))
            .unwrap_or_else(|| panic!("{text}: {}", run.stderr));
        assert!(line.contains(says), "{text}: {line}");
    }
}
