//! MIG-partitioned GPUs in `gpuctl info`: each instance under its parent with its profile,
//! ids, UUID, memory and processes; no utilization shown where MIG gives none.

use serde_json::Value;

use crate::util::{GIB, Gpu, Proc, Process, Scenario, Sim};

const MIB: u64 = 1024 * 1024;

/// Two H100s, GPU 0 in MIG mode (instances 1, 9 and 10), no process.
fn h100_mig() -> Scenario {
    Scenario::new()
        .gpu(
            Gpu::h100()
                .mig("3g.40gb", 1)
                .mig("1g.10gb", 9)
                .mig("1g.10gb", 10),
        )
        .gpu(Gpu::h100())
}

/// [`h100_mig`] with `a` in instance 1 and `b` in instance 10.
fn h100_mixed(a: u32, b: u32) -> Scenario {
    h100_mig()
        .process(Process::new(a).instance(1).used(20 * GIB))
        .process(Process::new(b).instance(10).used(4 * GIB))
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

/// `kill` and `clear` named a MIG instance (by MIG UUID or GPU/GI) act in it only, while a
/// live job in the neighbouring instance of the same card is untouched; `clear --wait`
/// judges free on the instance's memory.
#[test]
fn kill_and_clear_are_confined_to_one_instance() {
    use crate::util::{alive, wait_exited};
    let live = Proc::spawn_ready("sleep", "python3", &["train.py"]);
    let other = Proc::spawn_ready("sleep", "python3", &["serve.py"]);
    // A crashed run's leftover in instance 9: a zombie leader whose threads hold the context.
    let zombie = Proc::spawn("zombie-leader", "python3", &["finetune.py"]);
    zombie.wait_for_state('Z');
    let sim = Sim::new(
        &h100_mixed(live.pid(), other.pid())
            .process(Process::new(zombie.pid()).instance(9).used(2 * GIB)),
    );
    let doc = sim.json(&["info"]);
    let migs = doc["devices"][0]["mig_devices"].as_array().unwrap().clone();
    let uuid_of = |gi: u64| {
        migs.iter()
            .find(|m| m["gpu_instance_id"].as_u64() == Some(gi))
            .unwrap()["uuid"]
            .as_str()
            .unwrap()
            .to_string()
    };

    // clear on instance 9: its leftover goes, the other instances' processes stay.
    let cleared = sim.run(&["clear", "--gpu", "0/9", "--wait=10s", "--json"]);
    assert_eq!(cleared.code, 0, "{}\n{}", cleared.stdout, cleared.stderr);
    wait_exited(zombie.pid());
    assert!(
        alive(live.pid()) && alive(other.pid()),
        "instances 1 and 10 are untouched"
    );
    let report: Value = serde_json::from_str(&cleared.stdout).unwrap();
    assert_eq!(report["outcomes"].as_array().unwrap().len(), 1, "{report}");
    assert_eq!(report["wait"]["met"], true, "{report}");
    assert_eq!(report["wait"]["gpus"][0]["gpu_instance"], 9, "{report}");

    // kill by MIG UUID: only that instance's process.
    let killed = sim.run(&["kill", "--gpu", &uuid_of(10), "--yes", "--json"]);
    assert_eq!(killed.code, 0, "{}\n{}", killed.stdout, killed.stderr);
    wait_exited(other.pid());
    assert!(alive(live.pid()), "instance 1 is untouched");

    // Selectors that name no instance, or an instance the wrong way: one line, status 2.
    for (selector, needle) in [
        (
            "0/5",
            "GPU 0 has no GPU instance 5 (its instances: 1, 9, 10)",
        ),
        ("1/1", "GPU 1 is not in MIG mode"),
        ("0:9", "no GPU matches '0:9'"),
        ("0/x", "is not a MIG instance: give GPU/GI"),
        (
            "MIG-00000000-0000-0000-0000-000000000000",
            "no MIG device has the UUID",
        ),
    ] {
        sim.run(&["clear", "--gpu", selector])
            .assert_one_line_error(2, needle);
    }
}

/// `reset` named a MIG instance resets nothing of the shared card and says so (status 0, as
/// a Slurm epilog handing a job's MIG UUID must not fail); the whole GPU is still reset.
#[test]
fn reset_of_a_mig_instance_leaves_the_shared_card_alone_and_says_so() {
    let sim = Sim::new(&h100_mig());
    let doc = sim.json(&["info"]);
    let uuid = doc["devices"][0]["mig_devices"][1]["uuid"]
        .as_str()
        .unwrap()
        .to_string();
    for selector in ["0/9", uuid.as_str()] {
        let report = sim.json(&["reset", "--gpu", selector]);
        let items = report["gpus"][0]["items"].as_array().unwrap();
        assert!(!items.is_empty());
        for item in items {
            assert_eq!(item["outcome"], "skipped", "{item}");
            assert!(
                item["why"]
                    .as_str()
                    .unwrap()
                    .contains("GPU 0/9 is a MIG instance"),
                "{item}"
            );
        }
        let table = sim.run(&["reset", "--gpu", selector]);
        assert_eq!(table.code, 0, "{}", table.stderr);
        assert_eq!(
            table.stdout.matches("skipped:").count(),
            1,
            "{}",
            table.stdout
        );
    }
    let card = sim.json(&["reset", "--gpu", "0", "--peaks"]);
    assert_eq!(card["gpus"][0]["items"][0]["outcome"], "done", "{card}");
}

/// `info --gpu` takes a MIG instance too: its GPU is shown with that instance only.
#[test]
fn info_gpu_names_a_mig_instance() {
    let a = Proc::spawn_ready("sleep", "python3", &["train.py"]);
    let b = Proc::spawn_ready("sleep", "python3", &["serve.py"]);
    let sim = Sim::new(&h100_mixed(a.pid(), b.pid()));
    let uuid = sim.json(&["info"])["devices"][0]["mig_devices"][2]["uuid"]
        .as_str()
        .unwrap()
        .to_string();
    for selector in ["0/10", uuid.as_str()] {
        let doc = sim.json(&["info", "--gpu", selector]);
        let devices = doc["devices"].as_array().unwrap();
        assert_eq!(devices.len(), 1, "{doc}");
        let migs = devices[0]["mig_devices"].as_array().unwrap();
        assert_eq!(migs.len(), 1, "{doc}");
        assert_eq!(migs[0]["gpu_instance_id"], 10);
        assert_eq!(
            migs[0]["processes"][0]["pid"].as_u64(),
            Some(u64::from(b.pid()))
        );
    }
}

#[test]
fn a_mig_instance_named_to_fraction_stands_for_its_gpu() {
    let sim = Sim::new(&h100_mig());
    std::fs::write(
        sim.config_path(),
        "[fraction]\ndefault = 0.9\n\n[fraction.gpu]\n\"0\" = 0.5\n",
    )
    .unwrap();
    for name in ["0/9", "0"] {
        let doc = sim.json(&["fraction", "--gpu", name]);
        let shares = doc["gpus"].as_array().unwrap();
        assert_eq!(shares.len(), 1, "{name}: {doc}");
        assert_eq!(shares[0]["index"], 0, "{name}: {doc}");
        assert_eq!(shares[0]["fraction"].as_f64(), Some(0.5), "{name}: {doc}");
    }
    // The other GPU keeps the default; an instance that does not exist is refused.
    let other = sim.json(&["fraction", "--gpu", "1"]);
    assert_eq!(other["gpus"][0]["fraction"].as_f64(), Some(0.9), "{other}");
    sim.run(&["fraction", "--gpu", "0/2"])
        .assert_one_line_error(2, "GPU 0 has no GPU instance 2");
}
