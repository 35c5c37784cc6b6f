//! tests/pynvml_check.py: pynvml (nvidia-ml-py) loading the sim as libnvidia-ml.so.1.
//! The interpreter is $PYTHON (default python3); it must be able to `import pynvml`.

mod common;

use common::*;

#[test]
fn pynvml_reads_the_simulated_gpus() {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_string());
    let mut child = sleeper();
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(lib_path(), dir.path().join("libnvidia-ml.so.1")).unwrap();
    let scenario = dir.path().join("scenario.toml");
    std::fs::write(
        &scenario,
        format!(
            r#"
driver_version = "570.133.20"
cuda_driver_version = 12080
[[gpu]]
reserved_mib = 512
temperature_c = 61
power_mw = 412000
[[gpu]]
unsupported = ["temperature"]
[[process]]
pid = {}
gpu = 0
used_mib = 1000
sm_pct = 77
mem_pct = 30
"#,
            child.id()
        ),
    )
    .unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/pynvml_check.py");
    let out = std::process::Command::new(&python)
        .arg(script)
        .arg(child.id().to_string())
        .env("LD_LIBRARY_PATH", dir.path())
        .env("NVML_SIM_SCENARIO", &scenario)
        .env("NVML_SIM_STATE", dir.path().join("state.json"))
        .output();
    kill_and_reap(&mut child);
    let out = out.unwrap_or_else(|e| panic!("cannot run {python}: {e} (set PYTHON)"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("PYNVML-MISSING"),
        "`import pynvml` failed with {python}: install nvidia-ml-py (pip install nvidia-ml-py) \
         and point PYTHON at that interpreter.\n{stderr}"
    );
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("CHECK-OK"),
        "pynvml_check.py failed ({}):\n{}\n{stderr}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
}

/// tests/pynvml_mig_check.py through the launcher on examples/h100-mig.toml: pynvml's view
/// of the MIG devices agrees with the scenario file.
#[test]
fn pynvml_reads_the_mig_devices_of_the_h100_example() {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_string());
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/h100-mig.toml");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/pynvml_mig_check.py");
    let state = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(bin_path())
        .args(["run", example, "--", &python, script, example])
        .env("NVML_SIM_STATE", state.path().join("state.json"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("PYNVML-MISSING"),
        "`import pynvml` failed with {python}: set PYTHON.\n{stderr}"
    );
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("CHECK-OK"),
        "pynvml_mig_check.py failed ({}):\n{}\n{stderr}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
}
