//! `gpuctl reset` and peak marks against nvml-sim: settings reach the sim and are read back
//! from its state file; unsupported and forbidden items are reported as such.

use serde_json::Value;

use crate::util::{Proc, Sim};

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
    let scenario = |mib: u32| {
        format!(
            "driver_version = \"1\"\ncuda_driver_version = 12080\n[[gpu]]\n\
             [[process]]\npid = {}\ngpu = 0\nused_mib = {mib}\n",
            holder.pid()
        )
    };
    let sim = Sim::new(&scenario(4096));
    let peak = |sim: &Sim| sim.json(&["info"])["devices"][0]["peak"]["used_bytes"].as_u64();
    assert_eq!(peak(&sim), Some(4096 << 20));
    sim.write(&scenario(1024));
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
