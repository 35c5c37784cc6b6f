//! `nvml-sim run`: stand-ins with the scenario's argv, the environment for the command,
//! and clean-up when the command ends.

mod common;

use std::time::Duration;

use common::*;

const CHILD: &str = "NVML_SIM_TEST_LAUNCHER_CHILD";

#[test]
fn run_starts_standins_and_stops_them() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/single.toml");
    let out = std::process::Command::new(bin_path())
        .args(["run", example, "--"])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "launcher_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env_remove("NVML_SIM_STATE")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "launcher failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let procs: Vec<(u32, String)> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("PROC "))
        .map(|l| {
            let (pid, cmdline) = l.split_once(' ').unwrap();
            (pid.parse().unwrap(), cmdline.to_string())
        })
        .collect();
    assert_eq!(procs.len(), 1, "{stdout}");
    assert_eq!(procs[0].1, "python3 train.py --model llama-8b");
    assert!(stdout.contains("SCENARIO /"), "{stdout}");
    let pid = procs[0].0;
    let gone = poll(Duration::from_secs(5), || {
        matches!(proc_state(pid), None | Some('Z') | Some('X')).then_some(())
    });
    assert!(gone.is_some(), "stand-in {pid} outlived the launcher");
}

/// Runs only under the launcher: prints NVML_SIM_SCENARIO and the NVML process list.
#[test]
fn launcher_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let scenario = std::env::var("NVML_SIM_SCENARIO").unwrap();
    println!("SCENARIO {scenario}");
    let lib = std::env::var("GPUCTL_NVML_LIB").unwrap();
    let nvml = nvml_wrapper::Nvml::builder()
        .lib_path(std::ffi::OsStr::new(&lib))
        .init()
        .unwrap();
    let d = nvml.device_by_index(0).unwrap();
    for p in d.running_compute_processes().unwrap() {
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", p.pid)).unwrap();
        let cmdline: Vec<String> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let comm = std::fs::read_to_string(format!("/proc/{}/comm", p.pid)).unwrap();
        assert_eq!(comm.trim(), "python3");
        println!("PROC {} {}", p.pid, cmdline.join(" "));
    }
}

#[test]
fn bad_scenario_is_one_line_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "driver_version = \"1\"\n[[gpu]]\nfoo = 1\n").unwrap();
    let out = std::process::Command::new(bin_path())
        .args(["run"])
        .arg(&bad)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("line 3: unknown field 'foo'"), "{stderr}");
    let out = std::process::Command::new(bin_path())
        .arg("bogus")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
