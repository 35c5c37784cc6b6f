//! The sim loaded in a PID namespace of its own (`unshare --pid --fork --mount-proc`, as a
//! container without the host's): it lists host pids it cannot look at, and learns of their
//! deaths from an instance on the host, through the file beside the scenario.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use common::*;

/// A client inside a new PID namespace (python3's ctypes, no pynvml needed): prints the
/// memory used on GPU 0, then waits up to `wait` seconds for it to change and prints it
/// again (the same value if it did not).
const CLIENT: &str = r#"
import ctypes, sys, time
lib = ctypes.CDLL(sys.argv[1])
class Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]
assert lib.nvmlInit_v2() == 0
gpu = ctypes.c_void_p()
assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(gpu)) == 0
def used():
    memory = Memory()
    assert lib.nvmlDeviceGetMemoryInfo(gpu, ctypes.byref(memory)) == 0
    return (memory.total - memory.free) >> 20
first = used()
print(first, flush=True)
sys.stdin.readline()
deadline = time.monotonic() + float(sys.argv[2])
now = used()
while now == first and time.monotonic() < deadline:
    time.sleep(0.01)
    now = used()
print(now, flush=True)
"#;

fn require(tool: &str) {
    let found = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()));
    assert!(
        found,
        "{tool} is not installed: the namespace tests need util-linux's unshare and python3"
    );
}

/// The client, started in a PID namespace of its own against `sim`.
fn client_inside(sim: &Sim, wait_s: f64) -> Child {
    require("unshare");
    require("python3");
    Command::new("unshare")
        .args([
            "--pid",
            "--fork",
            "--mount-proc",
            "--",
            "python3",
            "-c",
            CLIENT,
        ])
        .arg(lib_path())
        .arg(wait_s.to_string())
        .env("NVML_SIM_SCENARIO", &sim.scenario)
        .env("NVML_SIM_STATE", &sim.state)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start unshare")
}

/// The memory used inside before a death, and after it (the client is told to look again
/// once `pid` is reaped).
fn used_before_and_after_death(sim: &Sim, victim: &mut Child, wait_s: f64) -> (u64, u64) {
    use std::io::Write;
    let mut client = client_inside(sim, wait_s);
    let mut lines = BufReader::new(client.stdout.take().unwrap()).lines();
    let mut next = |what: &str| -> u64 {
        let line = lines
            .next()
            .unwrap_or_else(|| panic!("the client inside said nothing {what}"))
            .unwrap();
        line.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{what}: {line:?}"))
    };
    let before = next("before the death");
    kill_and_reap(victim);
    client.stdin.take().unwrap().write_all(b"\n").unwrap();
    let after = next("after the death");
    let status = client.wait().unwrap();
    assert!(status.success(), "the client inside failed: {status}");
    (before, after)
}

fn one_process(pid: u32) -> String {
    format!("[[gpu]]\n[[process]]\npid = {pid}\ngpu = 0\nused_mib = 1024\n")
}

#[test]
fn a_death_on_the_host_is_seen_inside_through_the_file_beside_the_scenario() {
    let mut victim = sleeper();
    let sim = Sim::new(&one_process(victim.id()));
    // An instance on the host (this test process): it shares what it sees.
    let nvml = sim.nvml();
    let (before, after) = used_before_and_after_death(&sim, &mut victim, 5.0);
    drop(nvml);
    assert_eq!(before, 1024, "the live host process's memory, inside");
    assert_eq!(after, 0, "the death, seen inside");
    let deaths = std::fs::read_to_string(sim.dir.path().join("scenario.toml.deaths")).unwrap();
    assert!(
        deaths.lines().any(|l| l == victim.id().to_string()),
        "{deaths}"
    );
}

#[test]
fn with_no_instance_on_the_host_every_listed_process_stays_alive_inside() {
    let mut victim = sleeper();
    let sim = Sim::new(&one_process(victim.id()));
    let (before, after) = used_before_and_after_death(&sim, &mut victim, 0.5);
    assert_eq!(before, 1024);
    assert_eq!(after, 1024, "nothing on the host saw it die");
    // The file the instance inside asked for is there, naming nothing.
    let deaths = std::fs::read_to_string(sim.dir.path().join("scenario.toml.deaths")).unwrap();
    assert!(deaths.lines().all(|l| l.starts_with('#')), "{deaths}");
}

#[test]
fn an_instance_on_the_host_alone_writes_nothing_beside_the_scenario() {
    // A listed pid that is not running: dead on the host, but nobody inside asked.
    let mut gone = sleeper();
    let pid = gone.id();
    kill_and_reap(&mut gone);
    let sim = Sim::new(&one_process(pid));
    let nvml = sim.nvml();
    let used = nvml.device_by_index(0).unwrap().memory_info().unwrap().used;
    std::thread::sleep(nvml_sim::deaths::SHARE_EVERY * 5);
    drop(nvml);
    assert_eq!(used, 0);
    assert!(!sim.dir.path().join("scenario.toml.deaths").exists());
}
