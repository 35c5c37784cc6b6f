//! Protection borrowed by running the real program: a genuine, root-owned protected program
//! run with a user's library preloaded, run by a user, or traced, is not protected; the
//! genuine program run by root still is. And the watchdog, under exactly the capabilities
//! the shipped unit gives it, tells the one from the others.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::util::{
    GIB, Gpu, Proc, Process, RootOwnedProgram, Run, Scenario, Sim, alive, background_workers_of,
    is_root, process_on, testproc_bin, user_name, wait_until, watchdog_bin,
};

/// The uid the tests run other users' processes as.
const NOBODY: u32 = 65534;
/// A service account every Debian system has (`daemon`), for a configured command's user.
const SERVICE: u32 = 1;

fn one_gpu(pids: &[u32]) -> Scenario {
    pids.iter()
        .fold(Scenario::new().gpu(Gpu::h200()), |s, &pid| {
            s.process(Process::new(pid).used(GIB).sm(0))
        })
}

/// `gpuctl info --json`'s protection claim of `pid`.
fn claim_of(sim: &Sim, pid: u32) -> Value {
    let doc = sim.json(&["info"]);
    process_on(&doc, 0, pid).unwrap_or_else(|| panic!("pid {pid} not shown: {doc:#}"))["protection"]
        .clone()
}

/// `gpuctl kill --pid PID --yes --json`: its exit status and the outcome for `pid`.
fn kill_pid(sim: &Sim, pid: u32) -> (i32, Value) {
    let run = sim.run(&[
        "kill",
        "--pid",
        &pid.to_string(),
        "--yes",
        "--timeout",
        "2s",
        "--json",
    ]);
    let doc: Value =
        serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("invalid JSON ({e}): {run:?}"));
    let outcome = doc["outcomes"]
        .as_array()
        .and_then(|all| all.iter().find(|o| o["pid"] == pid).cloned())
        .unwrap_or_else(|| panic!("no outcome for {pid}: {doc:#}"));
    (run.code, outcome)
}

fn needs_root() -> bool {
    assert!(
        is_root(),
        "cannot run here: needs root (a root-owned program, processes of other users)"
    );
    true
}

/// A directory anyone may write to (under /tmp), holding a copy of a system library.
pub fn user_writable_library() -> (tempfile::TempDir, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let library = [
        "/lib/x86_64-linux-gnu",
        "/usr/lib/x86_64-linux-gnu",
        "/lib/aarch64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/lib64",
        "/usr/lib64",
    ]
    .iter()
    .map(|dir| Path::new(dir).join("libm.so.6"))
    .find(|path| path.exists())
    .expect("no libm.so.6 to copy");
    let copy = dir.path().join("libm.so.6");
    std::fs::copy(&library, &copy).unwrap();
    (dir, copy)
}

// (a)
#[test]
fn a_genuine_program_with_a_users_library_preloaded_is_not_protected() {
    if !needs_root() {
        return;
    }
    let installed = RootOwnedProgram::install("nvidia-persistenced");
    let (_dir, library) = user_writable_library();
    let hog = Proc::spawn_program_env(
        installed.path(),
        "nvidia-persistenced",
        &[("LD_PRELOAD", library.as_os_str())],
    );
    let sim = Sim::new(&one_gpu(&[hog.pid()]));
    let claim = claim_of(&sim, hog.pid());
    assert_eq!(claim["genuine"], false, "{claim}");
    let why = claim["why"].as_str().unwrap();
    assert!(why.contains(&library.display().to_string()), "{why}");

    let (code, outcome) = kill_pid(&sim, hog.pid());
    assert_eq!(code, 0, "{outcome}");
    assert_eq!(outcome["action"], "signal", "{outcome}");
    assert!(!alive(hog.pid()));
}

// (b)
#[test]
fn a_users_own_run_of_a_genuine_monitoring_tool_is_ended_by_kill_user() {
    if !needs_root() {
        return;
    }
    let installed = RootOwnedProgram::install("nvidia-smi");
    let tool = Proc::spawn_program_as(NOBODY, installed.path());
    let sim = Sim::new(&one_gpu(&[tool.pid()]));
    let claim = claim_of(&sim, tool.pid());
    assert_eq!(claim["name"], "nvidia-smi", "{claim}");
    assert_eq!(claim["genuine"], false, "{claim}");
    assert!(
        claim["why"]
            .as_str()
            .unwrap()
            .contains(&format!("uid {NOBODY}, not as root")),
        "{claim}"
    );

    let user = user_name(NOBODY);
    let run = sim.run(&[
        "kill",
        "--user",
        &user,
        "--yes",
        "--timeout",
        "2s",
        "--json",
    ]);
    assert_eq!(run.code, 0, "{run:?}");
    let doc: Value = serde_json::from_str(&run.stdout).unwrap();
    let outcome = &doc["outcomes"][0];
    assert_eq!(outcome["pid"], tool.pid(), "{doc:#}");
    assert_eq!(outcome["action"], "signal", "{outcome}");
    assert!(!alive(tool.pid()));
}

// (c) and (d)
#[test]
fn a_genuine_program_is_spared_until_something_traces_it() {
    if !needs_root() {
        return;
    }
    let strace = ["/usr/bin/strace", "/bin/strace"]
        .into_iter()
        .find(|path| Path::new(path).exists())
        .expect("strace is not installed: scripts/test installs it (apt-get install strace)");
    let installed = RootOwnedProgram::install("nvidia-persistenced");
    let daemon = Proc::spawn_program_env(installed.path(), "nvidia-persistenced", &[]);
    let sim = Sim::new(&one_gpu(&[daemon.pid()]));

    // Run by root, untraced, only root's code: spared.
    assert_eq!(claim_of(&sim, daemon.pid())["genuine"], true);
    let (code, outcome) = kill_pid(&sim, daemon.pid());
    assert_eq!(code, 1, "{outcome}");
    assert_eq!(outcome["skipped"], "protected: nvidia-persistenced");
    assert!(alive(daemon.pid()));

    // A tracer can put any code in it: no longer spared.
    let tracer = Tracer::attach(strace, daemon.pid());
    let claim = claim_of(&sim, daemon.pid());
    assert_eq!(claim["genuine"], false, "{claim}");
    assert!(
        claim["why"]
            .as_str()
            .unwrap()
            .contains(&format!("traced by pid {}", tracer.child.id())),
        "{claim}"
    );
    let (code, outcome) = kill_pid(&sim, daemon.pid());
    assert_eq!(code, 0, "{outcome}");
    assert_eq!(outcome["action"], "signal", "{outcome}");
    assert!(!alive(daemon.pid()));
}

/// strace attached to a process (until it ends, or drop).
struct Tracer {
    child: Child,
}

impl Tracer {
    fn attach(strace: &str, pid: u32) -> Tracer {
        let child = Command::new(strace)
            .args(["-o", "/dev/null", "-p", &pid.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start strace");
        let tracer = Tracer { child };
        wait_until(Duration::from_secs(10), || {
            tracer_of(pid).is_some_and(|tracer| tracer != 0)
        });
        tracer
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tracer_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("TracerPid:"))?
        .trim()
        .parse()
        .ok()
}

// ---- (e) The watchdog under the shipped unit's capabilities.

/// The shipped unit's privilege settings, read from systemd/gpuctl-watchdog.service.
#[derive(Debug, Default)]
struct UnitPrivileges {
    /// Capability names without CAP_, lower case (setpriv's spelling).
    bounding: Vec<String>,
    ambient: Vec<String>,
    no_new_privileges: bool,
    securebits: Vec<String>,
}

impl UnitPrivileges {
    fn shipped() -> UnitPrivileges {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../systemd/gpuctl-watchdog.service");
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        UnitPrivileges::parse(&text)
    }

    /// The settings as systemd merges them: lists add up, an empty assignment resets.
    fn parse(text: &str) -> UnitPrivileges {
        let mut unit = UnitPrivileges::default();
        let caps = |value: &str| -> Vec<String> {
            assert!(
                !value.starts_with('~'),
                "an inverted capability list ({value}) is not understood by this test"
            );
            value
                .split_whitespace()
                .map(|cap| {
                    cap.strip_prefix("CAP_")
                        .unwrap_or_else(|| panic!("{cap}: not a capability name"))
                        .to_ascii_lowercase()
                })
                .collect()
        };
        for line in text.lines().map(str::trim) {
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            let list = match key {
                "CapabilityBoundingSet" => &mut unit.bounding,
                "AmbientCapabilities" => &mut unit.ambient,
                "SecureBits" => &mut unit.securebits,
                "NoNewPrivileges" => {
                    unit.no_new_privileges = value == "yes";
                    continue;
                }
                "User" | "DynamicUser" => panic!(
                    "the unit sets {key}=: this test runs the daemon as root only; teach it the user"
                ),
                _ => continue,
            };
            if value.is_empty() {
                list.clear();
            } else if key == "SecureBits" {
                list.extend(value.split_whitespace().map(|bit| bit.replace('-', "_")));
            } else {
                list.extend(caps(value));
            }
        }
        unit
    }

    /// setpriv's arguments for the same privileges (root stays root: the unit sets no User=).
    fn setpriv_args(&self) -> Vec<String> {
        let set = |caps: &[String]| {
            std::iter::once("-all".to_string())
                .chain(caps.iter().map(|cap| format!("+{cap}")))
                .collect::<Vec<_>>()
                .join(",")
        };
        let mut args = vec![
            format!("--bounding-set={}", set(&self.bounding)),
            // Ambient capabilities must be inheritable too.
            format!("--inh-caps={}", set(&self.ambient)),
            format!("--ambient-caps={}", set(&self.ambient)),
        ];
        if self.no_new_privileges {
            args.push("--no-new-privs".into());
        }
        if !self.securebits.is_empty() {
            let bits: Vec<String> = self.securebits.iter().map(|b| format!("+{b}")).collect();
            args.push(format!("--securebits={}", bits.join(",")));
        }
        args
    }
}

#[test]
fn the_units_privileges_read_back_as_setpriv_arguments() {
    let unit = UnitPrivileges::parse(
        "[Service]\nCapabilityBoundingSet=CAP_CHOWN\nCapabilityBoundingSet=\n\
         CapabilityBoundingSet=CAP_KILL CAP_SYS_PTRACE\nCapabilityBoundingSet=CAP_DAC_READ_SEARCH\n\
         AmbientCapabilities=\nNoNewPrivileges=yes\nSecureBits=noroot-locked\n",
    );
    assert_eq!(
        unit.setpriv_args(),
        [
            "--bounding-set=-all,+kill,+sys_ptrace,+dac_read_search",
            "--inh-caps=-all",
            "--ambient-caps=-all",
            "--no-new-privs",
            "--securebits=+noroot_locked",
        ]
    );
}

/// `gpuctl-watchdog --once ARGS` under setpriv with the unit's privileges.
fn watchdog_as_the_unit(sim: &Sim, args: &[&str]) -> Run {
    let unit = UnitPrivileges::shipped();
    let mut command = Command::new("setpriv");
    command
        .args(unit.setpriv_args())
        .arg("--")
        .arg(watchdog_bin())
        .arg("--once")
        .args(args);
    sim.watchdog_env(&mut command);
    Run::from(command.output().expect("run gpuctl-watchdog under setpriv"))
}

// (e)
#[test]
fn under_the_units_capabilities_the_watchdog_spares_the_genuine_program_only() {
    if !needs_root() {
        return;
    }
    let installed = RootOwnedProgram::install("nvidia-smi");
    // The leftovers of crashed runs, each two idle orphans of one group: of the genuine
    // program run by root (with every capability, as root's processes run), of the same
    // program run by a user, and of a program that only takes the name.
    let genuine = background_workers_of(installed.path(), None, 2);
    let users = background_workers_of(installed.path(), Some(NOBODY), 2);
    let fake_dir = tempfile::tempdir().unwrap();
    let fake = fake_dir.path().join("nvidia-smi");
    std::fs::copy(testproc_bin(), &fake).unwrap();
    let named = background_workers_of(&fake, None, 2);
    // A configured command run by its service user: verified only where the daemon may
    // read another user's environment and memory map.
    let monitor = RootOwnedProgram::install("my-monitor");
    let service = background_workers_of(monitor.path(), Some(SERVICE), 2);
    let all: Vec<u32> = [&genuine, &users, &named, &service]
        .iter()
        .flat_map(|job| job.pids.iter().copied())
        .collect();
    let sim = Sim::new(&one_gpu(&all));
    std::fs::write(
        sim.config_path(),
        format!(
            "[protect]\ncommands = [\"my-monitor\"]\nusers = [\"{}\"]\n\
             [watchdog]\nterm_timeout = \"1s\"\nmetrics_file = \"{}\"\nstate_dir = \"{}\"\n",
            user_name(SERVICE),
            sim.dir.path().join("gpuctl.prom").display(),
            sim.dir.path().join("state").display()
        ),
    )
    .unwrap();

    let run = watchdog_as_the_unit(&sim, &["--mode", "reclaim"]);
    // Refused reclaims (the genuine program's) make it exit 1.
    assert_eq!(run.code, 1, "{}", run.stderr);
    // It could read everything it judges by: nothing is unverified for want of rights.
    assert!(!run.stderr.contains("cannot be read"), "{}", run.stderr);
    let lines_of = |pid: u32| -> Vec<&str> {
        run.stderr
            .lines()
            .filter(|line| {
                line.contains(&format!("PID={pid} ")) || line.ends_with(&format!("PID={pid}"))
            })
            .collect()
    };
    for &pid in &genuine.pids {
        assert!(
            alive(pid),
            "the genuine program {pid} was ended:\n{}",
            run.stderr
        );
        assert!(
            lines_of(pid)
                .iter()
                .any(|l| l.contains("ACTION=skipped") && l.contains("protected: nvidia-smi")),
            "pid {pid}:\n{}",
            run.stderr
        );
    }
    for &pid in &service.pids {
        assert!(
            alive(pid),
            "the service's program {pid} was ended:\n{}",
            run.stderr
        );
        assert!(
            lines_of(pid)
                .iter()
                .any(|l| l.contains("ACTION=skipped") && l.contains("protected: my-monitor")),
            "pid {pid}:\n{}",
            run.stderr
        );
    }
    for &pid in users.pids.iter().chain(&named.pids) {
        assert!(!alive(pid), "pid {pid} was spared:\n{}", run.stderr);
        assert!(
            lines_of(pid).iter().any(|l| l.contains("ACTION=reclaimed")),
            "pid {pid}:\n{}",
            run.stderr
        );
    }
    let user_why = format!("uid {NOBODY}, not as root");
    assert!(run.stderr.contains(&user_why), "{}", run.stderr);
    assert!(
        run.stderr
            .contains(&format!("its executable {}", fake.display())),
        "{}",
        run.stderr
    );
}
