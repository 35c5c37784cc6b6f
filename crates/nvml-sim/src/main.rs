//! `nvml-sim run SCENARIO [-- COMMAND ARGS...]`: starts the scenario's stand-in processes,
//! points NVML clients at the simulated library and runs COMMAND (see README.md).

use std::ffi::OsString;
use std::path::Path;

mod launch;

const HELP: &str = "\
nvml-sim: run programs against a simulated NVIDIA driver (libnvidia-ml.so.1)

usage:
  nvml-sim run [--create-users] SCENARIO [-- COMMAND [ARGS...]]
  nvml-sim --help

`run` starts a stand-in process for every [[process]] of SCENARIO that has `spawn = [argv...]`
(its /proc/PID/cmdline reads exactly that argv; `workers = N` adds N forked children), writes
the resolved scenario (real pids) to a temporary file and runs COMMAND with:
  NVML_SIM_SCENARIO  the resolved scenario
  GPUCTL_NVML_LIB    the simulated library (libnvml_sim.so next to this binary)
  LD_LIBRARY_PATH    a directory holding libnvidia-ml.so.1 -> that library (pynvml, nvitop,
                     nvidia-smi)
  PATH               with the nvidia-smi that scripts/fetch-nvidia-smi cached appended, when
                     none is on PATH (~/.cache/gpuctl/nvidia-smi, or $GPUCTL_CACHE/nvidia-smi)
  GPUCTL_DEV_DIR     the absolute path of the simulated GPUs' device files (nvidia<minor>,
                     nvidiactl, nvidia-uvm; character devices when run as root): the
                     scenario's device_dir, else a temporary directory; made before COMMAND
As root, a stand-in with `user` runs as that user (a name, or a uid that needs no account;
--create-users makes a missing name a system account for the run, removed at its end), and
one with `cgroup` runs in that cgroup, made in a private subtree of the host's hierarchies,
with COMMAND in a cgroup namespace rooted there, so /proc/PID/cgroup reads as the manager
would write it (`crashed = true`: the stand-in exits, its workers stay on, orphaned).
Without root, user and cgroup are left out, with one warning.
Without COMMAND it runs $SHELL, for an interactive rehearsal. It exits with COMMAND's status
and stops the stand-ins when COMMAND ends or when it gets SIGTERM/SIGHUP (SIGINT goes to
COMMAND, which decides). Bad usage or a bad scenario: one line on stderr, exit status 2.

The scenario format is documented in crates/nvml-sim/README.md.
";

fn main() {
    if launch::standin::requested() {
        launch::standin::live();
    }
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let code = match args.first().and_then(|a| a.to_str()) {
        None => usage_error("missing a command (try: nvml-sim run SCENARIO -- COMMAND)"),
        Some("-h" | "--help" | "help") => {
            print!("{HELP}");
            0
        }
        Some("run") => {
            let mut rest = &args[1..];
            let create_users = rest.first().is_some_and(|a| a == "--create-users");
            if create_users {
                rest = &rest[1..];
            }
            match rest.first() {
                None => usage_error("run: missing the SCENARIO file"),
                Some(s) if s.to_str().is_some_and(|s| s.starts_with('-') && s != "-") => {
                    usage_error(&format!("run: unknown option {}", s.to_string_lossy()))
                }
                Some(s) => {
                    let cmd = match rest.get(1).map(|a| a.as_os_str()) {
                        None => Vec::new(),
                        Some(a) if a == "--" => rest[2..].to_vec(),
                        Some(_) => rest[1..].to_vec(),
                    };
                    match launch::run(Path::new(s), cmd, create_users) {
                        Ok(code) => code,
                        Err(msg) => {
                            eprintln!("nvml-sim: {msg}");
                            2
                        }
                    }
                }
            }
        }
        Some(other) => usage_error(&format!("unknown command '{other}' (try --help)")),
    };
    std::process::exit(code);
}

fn usage_error(msg: &str) -> i32 {
    eprintln!("nvml-sim: {msg}");
    2
}
