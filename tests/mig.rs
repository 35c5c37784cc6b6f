//! MIG-partitioned GPUs in `gpuctl info`: each instance under its parent with its profile,
//! ids, UUID, memory and processes; no utilization shown where MIG gives none.

use serde_json::Value;

use crate::util::{Proc, Sim};

const MIB: u64 = 1024 * 1024;

fn h100_mixed(a: u32, b: u32) -> String {
    format!(
        "[[gpu]]\nname = \"NVIDIA H100 80GB HBM3\"\n\
         [[gpu.mig]]\nprofile = \"3g.40gb\"\ngpu_instance = 1\n\
         [[gpu.mig]]\nprofile = \"1g.10gb\"\ngpu_instance = 9\n\
         [[gpu.mig]]\nprofile = \"1g.10gb\"\ngpu_instance = 10\n\
         [[gpu]]\nname = \"NVIDIA H100 80GB HBM3\"\n\
         [[process]]\npid = {a}\ngpu = 0\ngpu_instance = 1\nused_mib = 20480\n\
         [[process]]\npid = {b}\ngpu = 0\ngpu_instance = 10\nused_mib = 4096\n"
    )
}

#[test]
fn info_shows_each_instance_with_its_memory_and_processes() {
    let a = Proc::spawn_ready("sleep", "python3", &["train.py"]);
    let b = Proc::spawn_ready("sleep", "python3", &["serve.py"]);
    let sim = Sim::new(&h100_mixed(a.pid(), b.pid()));
    let doc = sim.json(&["info"]);
    let gpu: &Value = &doc["devices"][0];
    assert_eq!(gpu["mig_enabled"], true, "{gpu}");
    assert!(
        gpu["utilization"].is_null(),
        "MIG gives no utilization: {gpu}"
    );
    let migs = gpu["mig_devices"].as_array().expect("mig_devices");
    let profiles: Vec<(&str, u64)> = migs
        .iter()
        .map(|m| {
            (
                m["profile"].as_str().unwrap(),
                m["gpu_instance_id"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        profiles,
        vec![("3g.40gb", 1), ("1g.10gb", 9), ("1g.10gb", 10)]
    );
    for m in migs {
        assert!(m["uuid"].as_str().unwrap().starts_with("MIG-"), "{m}");
    }
    let pids = |m: &Value| -> Vec<u64> {
        m["processes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["pid"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(pids(&migs[0]), vec![u64::from(a.pid())]);
    assert_eq!(pids(&migs[1]), Vec::<u64>::new());
    assert_eq!(pids(&migs[2]), vec![u64::from(b.pid())]);
    assert_eq!(migs[0]["memory"]["used_bytes"].as_u64(), Some(20480 * MIB));
    assert_eq!(migs[0]["memory"]["unattributed_bytes"].as_u64(), Some(0));
    assert_eq!(
        migs[2]["processes"][0]["gpu_instance_id"].as_u64(),
        Some(10)
    );
    // The parent still lists every process (old consumers keep working).
    assert_eq!(gpu["processes"].as_array().unwrap().len(), 2);
    // A GPU without MIG: no instances.
    assert_eq!(doc["devices"][1]["mig_enabled"], false);
    assert_eq!(doc["devices"][1]["mig_devices"], serde_json::json!([]));

    let table = sim.run(&["info"]);
    assert_eq!(table.code, 0, "{}", table.stderr);
    for needle in [
        "MIG 3g.40gb · GI 1",
        "MIG 1g.10gb · GI 9",
        "MIG 1g.10gb · GI 10",
    ] {
        assert!(table.stdout.contains(needle), "{needle}:\n{}", table.stdout);
    }
    let gpu0 = table.stdout.split("GPU 1").next().unwrap();
    assert!(
        !gpu0.contains("util"),
        "no utilization on a MIG GPU:\n{gpu0}"
    );
}
