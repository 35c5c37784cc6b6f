//! `nvml-sim run`: stand-ins with the scenario's argv, the environment for the command,
//! and clean-up when the command ends.

mod common;

use std::time::Duration;

use common::*;

const CHILD: &str = "NVML_SIM_TEST_LAUNCHER_CHILD";

/// `nvml-sim run SCENARIO -- <this test binary>` running only the test `child`, which acts
/// when `marker` is set; its output, once the launcher succeeded.
fn under_launcher(scenario: &std::path::Path, child: &str, marker: &str) -> String {
    let out = std::process::Command::new(bin_path())
        .arg("run")
        .arg(scenario)
        .arg("--")
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", child, "--nocapture", "--test-threads=1"])
        .env(marker, "1")
        .env_remove("NVML_SIM_STATE")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "launcher failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn run_starts_standins_and_stops_them() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/single.toml");
    let stdout = under_launcher(std::path::Path::new(example), "launcher_child", CHILD);
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

const LISTS_CHILD: &str = "NVML_SIM_TEST_LAUNCHER_LISTS_CHILD";

/// `unlisted` and `listed_pid` on `spawn` entries survive the launcher's resolution; the
/// workers of an unlisted stand-in are unlisted too.
#[test]
fn unlisted_and_listed_pid_work_on_spawn_entries() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("s.toml");
    std::fs::write(
        &scenario,
        r#"
[[gpu]]
[[gpu]]
[[process]]
spawn = ["python3", "infer.py"]
gpu = 0
used_mib = 30720
unlisted = true
workers = 2
worker_used_mib = 100
[[process]]
spawn = ["python3", "train.py"]
gpu = 1
used_mib = 2048
listed_pid = 4242
"#,
    )
    .unwrap();
    let stdout = under_launcher(&scenario, "lists_child", LISTS_CHILD);
    assert!(stdout.contains("GPU0 used=30920 pids=[]\n"), "{stdout}");
    assert!(stdout.contains("GPU1 used=2048 pids=[4242]\n"), "{stdout}");
}

/// Runs only under the launcher: each GPU's used memory and listed pids.
#[test]
fn lists_child() {
    if std::env::var_os(LISTS_CHILD).is_none() {
        return;
    }
    let lib = std::env::var("GPUCTL_NVML_LIB").unwrap();
    let nvml = nvml_wrapper::Nvml::builder()
        .lib_path(std::ffi::OsStr::new(&lib))
        .init()
        .unwrap();
    for i in 0..nvml.device_count().unwrap() {
        let d = nvml.device_by_index(i).unwrap();
        let pids: Vec<u32> = d
            .running_compute_processes()
            .unwrap()
            .iter()
            .map(|p| p.pid)
            .collect();
        let used = d.memory_info().unwrap().used / (1024 * 1024);
        println!("GPU{i} used={used} pids={pids:?}");
    }
}

/// COMMAND gets GPUCTL_DEV_DIR: the launcher's temporary directory without a device_dir,
/// made and filled before COMMAND starts, and gone with the launcher.
#[test]
fn run_exports_a_device_dir() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/single.toml");
    let out = std::process::Command::new(bin_path())
        .args(["run", example, "--", "sh", "-c"])
        .arg("echo \"DIR=$GPUCTL_DEV_DIR\"; ls \"$GPUCTL_DEV_DIR\"")
        .env_remove("NVML_SIM_STATE")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines = stdout.lines();
    let dir = lines.next().and_then(|l| l.strip_prefix("DIR=")).unwrap();
    assert!(
        dir.starts_with('/') && dir.ends_with("/dev"),
        "GPUCTL_DEV_DIR={dir}"
    );
    let mut names: Vec<&str> = lines.collect();
    names.sort();
    assert_eq!(names, ["nvidia-uvm", "nvidia0", "nvidiactl"], "{stdout}");
    assert!(
        !std::path::Path::new(dir).exists(),
        "the temporary {dir} outlived the run"
    );
}

/// The scenario's own device_dir (relative to the scenario): exported as an absolute path,
/// made before COMMAND, kept afterwards; one that cannot be made is a one-line error.
#[test]
fn run_uses_the_scenarios_device_dir() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("s.toml");
    std::fs::write(
        &scenario,
        "device_dir = \"devs\"\n[[gpu]]\nminor = 3\n[[gpu]]\n",
    )
    .unwrap();
    let out = std::process::Command::new(bin_path())
        .arg("run")
        .arg(&scenario)
        .args([
            "--",
            "sh",
            "-c",
            "echo \"$GPUCTL_DEV_DIR\"; ls \"$GPUCTL_DEV_DIR\" | wc -l",
        ])
        .current_dir("/")
        .env_remove("NVML_SIM_STATE")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let devs = dir.path().join("devs");
    assert_eq!(stdout, format!("{}\n4\n", devs.display()));
    assert_device_files(
        &devs,
        &[
            ("nvidia1", (1, 3)),
            ("nvidia3", (1, 5)),
            ("nvidiactl", (1, 7)),
            ("nvidia-uvm", (1, 8)),
        ],
    );

    std::fs::write(dir.path().join("blocker"), "").unwrap();
    std::fs::write(&scenario, "device_dir = \"blocker/dev\"\n[[gpu]]\n").unwrap();
    let out = std::process::Command::new(bin_path())
        .arg("run")
        .arg(&scenario)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("nvml-sim: ") && stderr.contains("cannot create it"),
        "{stderr}"
    );
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
