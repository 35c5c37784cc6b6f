//! Hostile users, round three: escapes in what gpuctl logs, the environment variables that
//! steer root, and a device-file scan that could not look.

use std::path::Path;
use std::process::Command;

use crate::util::{
    ComputeMode, GIB, Gpu, MIB, Proc, Process, Run, Scenario, Sim, is_root, sim_lib, testproc_bin,
    watchdog_bin,
};

/// A command name (comm, 14 bytes) that retitles and clears a terminal, then reverses what
/// follows it.
const HOSTILE: &str = "\x1b]0;PWN\x07\x1b[2J\u{202e}";
/// [`HOSTILE`] as gpuctl writes it in a line.
const HOSTILE_SHOWN: &str = "\\e]0;PWN\\x07\\e[2J\\u{202e}";

/// Whether `text` holds anything a terminal would act on: ESC, BEL, a C1 control or a
/// bidirectional control.
fn raw_controls(text: &str) -> Vec<char> {
    text.chars()
        .filter(|&c| {
            (c.is_control() && c != '\n')
                || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        })
        .collect()
}

fn slurm_log(sim: &Sim) -> String {
    std::fs::read_to_string(sim.dir.path().join("state/slurm.log")).unwrap_or_default()
}

/// A process named with terminal escapes holds the GPU a job's epilog must hand back: the
/// drain reason scontrol is given (so `sinfo -R`), slurm.log and the epilog's stderr name it
/// escaped.
#[test]
fn a_command_name_with_escapes_reaches_no_drain_reason_log_or_stderr_raw() {
    let holder = Proc::spawn_ready_with_comm("sleep", "python3", HOSTILE);
    let sim = Sim::new(
        &Scenario::new()
            .driver_version("1")
            .gpus(2, Gpu::new().compute_mode(ComputeMode::ExclusiveProcess))
            .process(Process::new(holder.pid()).on(1).used(2 * GIB).sm(50)),
    );
    let run = crate::slurm::run_script_with(
        &sim,
        "epilog.sh",
        &[
            ("SLURM_JOB_ID", "31"),
            // slurmd always gives the job's uid; without it the epilog ends nothing.
            ("SLURM_JOB_UID", "0"),
            ("SLURM_JOB_GPUS", "1"),
            ("SLURMD_NODENAME", "gpu7"),
            ("GPUCTL_EPILOG_TIMEOUT", "1s"),
        ],
        "printf '%s\\n' \"$*\" >> \"$CALLS\"",
    );
    assert_eq!(run.code, 1, "{run:?}");
    let calls = std::fs::read_to_string(sim.dir.path().join("scontrol.calls")).unwrap();
    let drain = calls
        .lines()
        .find(|l| l.starts_with("update NodeName=gpu7 State=DRAIN Reason=gpuctl: GPU 1"))
        .unwrap_or_else(|| panic!("no drain: {calls:?}"));
    let label = format!("pid {} (root, {HOSTILE_SHOWN})", holder.pid());
    assert!(drain.contains(&label), "{drain:?}");
    assert_eq!(raw_controls(&calls), [], "{calls:?}");
    let log = slurm_log(&sim);
    assert!(log.contains(&label), "{log:?}");
    assert_eq!(raw_controls(&log), [], "{log:?}");
    assert!(run.stderr.contains(&label), "{:?}", run.stderr);
    assert_eq!(raw_controls(&run.stderr), [], "{:?}", run.stderr);
}

/// An impostor of a protected program run from a file named with escapes: the watchdog's
/// event names its executable, and neither MESSAGE nor the REASON field carries it raw.
#[test]
fn the_watchdogs_log_lines_escape_what_a_process_chose() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let program = dir.path().join(HOSTILE);
    std::fs::copy(testproc_bin(), &program).unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let impostor = Proc::spawn_program_ready(&program, "sleep", "nvidia-persistenced", &[]);
    let sim = Sim::new(
        &Scenario::new()
            .gpu(Gpu::h200())
            .process(Process::new(impostor.pid()).on(0).used(4096 * MIB).sm(30)),
    );
    // The watchdog's findings and metrics stay in the test's directory, out of the
    // machine's /var/lib/gpuctl (which `gpuctl info` as root would show afterwards).
    std::fs::write(
        sim.config_path(),
        format!(
            "[watchdog]\nstate_dir = \"{}\"\nmetrics_file = \"\"\n",
            sim.dir.path().join("watchdog-state").display()
        ),
    )
    .unwrap();
    let run = Run::from(
        sim.watchdog_env(Command::new(watchdog_bin()).arg("--once"))
            .output()
            .unwrap(),
    );
    let line = run
        .stderr
        .lines()
        .find(|l| l.contains("ACTION=impostor"))
        .unwrap_or_else(|| panic!("no impostor event: {:?}", run.stderr));
    assert!(line.contains("PWN"), "{line:?}");
    // MESSAGE as text::escape writes it, quoted by logfmt (its backslashes doubled).
    assert!(line.contains("\\\\e]0;PWN\\\\x07"), "{line:?}");
    assert_eq!(raw_controls(&run.stderr), [], "{:?}", run.stderr);
}

/// The health check cannot reach Slurm (scontrol fails, as without SLURM_CONF for a
/// non-default location): the reason is in slurm.log, where admins look, not only on the
/// stderr slurmd discards.
#[test]
fn a_health_check_that_cannot_reach_slurm_says_why_in_slurm_log() {
    let sim = Sim::new(&Scenario::new().gpu(Gpu::new()));
    let run = crate::slurm::run_script_with(
        &sim,
        "healthcheck.sh",
        &[("SLURMD_NODENAME", "gpu7")],
        "echo 'slurm_load_node error: Unable to contact slurm controller' >&2\nexit 1",
    );
    assert_eq!(run.code, 1, "{run:?}");
    let log = slurm_log(&sim);
    assert!(
        log.contains("healthcheck: ")
            && log.contains("gpu7")
            && log.contains("Unable to contact slurm controller"),
        "{log:?}"
    );
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// As root, GPUCTL_NVML_LIB and GPUCTL_DEV_DIR follow the configuration's trust rule: a
/// library in a directory others may write, or owned by another user, is refused with the
/// usage status before anything is loaded (the "library" here is not one: loading it would
/// fail with status 3, NVML unavailable), by gpuctl and by the watchdog alike.
#[test]
fn as_root_a_library_or_device_directory_others_control_is_refused_before_loading() {
    if !is_root() {
        panic!("cannot run here: the rule applies to root");
    }
    let sim = Sim::new(&Scenario::new().gpu(Gpu::new()));
    // The suite's own library and scratch directories pass.
    assert_eq!(sim.run(&["info"]).code, 0);

    let open = tempfile::tempdir().unwrap();
    chmod(open.path(), 0o777);
    let fake = open.path().join("fake.so");
    std::fs::write(&fake, "not a library\n").unwrap();
    chmod(&fake, 0o755);
    let run = Run::from(
        sim.gpuctl(&["info"])
            .env("GPUCTL_NVML_LIB", &fake)
            .output()
            .unwrap(),
    );
    run.assert_one_line_error(2, "GPUCTL_NVML_LIB=");
    assert!(
        run.stderr.contains("writable by everyone") && run.stderr.contains("not used as root"),
        "{}",
        run.stderr
    );

    // A real library, in a root directory, but owned by another user.
    let closed = tempfile::tempdir().unwrap();
    let theirs = closed.path().join("libnvml_sim.so");
    std::fs::copy(sim_lib(), &theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), None).unwrap();
    let run = Run::from(
        sim.gpuctl(&["info"])
            .env("GPUCTL_NVML_LIB", &theirs)
            .output()
            .unwrap(),
    );
    run.assert_one_line_error(2, "owned by uid 65534");
    let run = Run::from(
        Command::new(watchdog_bin())
            .arg("--once")
            .env("GPUCTL_NVML_LIB", &theirs)
            .env("NVML_SIM_SCENARIO", sim.scenario_path())
            .env("NVML_SIM_STATE", sim.state_path())
            .env("GPUCTL_CONFIG", sim.config_path())
            .env_remove("JOURNAL_STREAM")
            .output()
            .unwrap(),
    );
    run.assert_one_line_error(2, "GPUCTL_NVML_LIB=");

    // A device directory another user owns.
    let dev = closed.path().join("dev");
    std::fs::create_dir(&dev).unwrap();
    std::os::unix::fs::chown(&dev, Some(65534), None).unwrap();
    let run = Run::from(
        sim.gpuctl(&["info"])
            .env("GPUCTL_DEV_DIR", &dev)
            .output()
            .unwrap(),
    );
    run.assert_one_line_error(2, "GPUCTL_DEV_DIR=");
}

/// The device directory lacks the GPU's file (a wrong dev_dir, a container without the
/// device files): the scan cannot look for its holders, and `info` says so and why rather
/// than "none".
#[test]
fn a_device_file_missing_from_the_device_directory_is_not_reported_as_unheld() {
    let sim = Sim::new(&Scenario::new().gpu(Gpu::new().leaked(2 * GIB)));
    let dev = sim.dev_dir();
    assert!(!dev.join("nvidia0").exists());
    let why = format!(
        "{} does not exist (dev_dir {})",
        dev.join("nvidia0").display(),
        dev.display()
    );
    // The scan runs when asked for (see holders.rs).
    let table = sim.run(&["info", "--holders"]);
    assert_eq!(table.code, 0, "{}", table.stderr);
    assert!(
        table
            .stdout
            .contains(&format!("holders of /dev/nvidia0 not looked for: {why}")),
        "{}",
        table.stdout
    );
    assert!(
        !table.stdout.contains("does not list: none"),
        "{}",
        table.stdout
    );
    let doc = sim.json(&["info", "--holders"]);
    assert_eq!(doc["devices"][0]["holders_not_scanned"], why.as_str());
    assert_eq!(doc["devices"][0]["holders"], serde_json::json!([]));
}
