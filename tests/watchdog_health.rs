//! The watchdog and GPU health: Xid events taken every loop and by `--once`, one journal
//! event per Xid naming the processes on the GPU, the Xid log that `gpuctl health` reads,
//! the health metrics, and a reset that clears it all.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::util::{self, GIB, Gpu, Proc, Process, Run, Scenario, Sim};
use crate::watchdog::{Daemon, command, metrics};

fn configure(sim: &Sim) {
    let dir = sim.dir.path();
    std::fs::create_dir_all(dir.join("state")).unwrap();
    let text = format!(
        "[watchdog]\ninterval = \"200ms\"\nmetrics_file = {}\nstate_dir = {}\n",
        toml::Value::String(dir.join("gpuctl.prom").display().to_string()),
        toml::Value::String(dir.join("state").display().to_string()),
    );
    std::fs::write(sim.config_path(), text).unwrap();
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ok() {
        assert!(Instant::now() < deadline, "not within 10 s: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_daemon_logs_each_xid_with_its_processes_counts_it_and_clears_on_a_reset() {
    let job = Proc::sleeper("python3", &["train.py"]);
    let gpu = |volatile: u64| Gpu::new().no_recovery_field().ecc([volatile, 0, 10, 0]);
    let scenario = |volatile: u64, xids: &[u32]| {
        xids.iter().fold(
            Scenario::new()
                .gpu(Gpu::new())
                .gpu(gpu(volatile))
                .process(Process::new(job.pid()).on(1).used(GIB)),
            |s, xid| s.xid(1, *xid, Some(job.pid())),
        )
    };
    let sim = Sim::new(&scenario(5, &[64]));
    configure(&sim);
    let daemon = Daemon::start(&sim, &[]);
    daemon.expect_count(&["watching Xid events on GPUs 0, 1"], 1);
    let line = daemon.expect_count(&["GPU 1: Xid 64", "action gpu_reset"], 1);
    assert!(
        line.contains(&format!("the kernel names pid {} (", job.pid())),
        "{line}"
    );
    assert!(line.contains("python3 train.py"), "{line}");
    assert!(
        line.contains("XID=64") && line.contains(&format!("PIDS={}", job.pid())),
        "{line}"
    );
    wait_for("the metrics name the Xid and the verdict", || {
        let m = metrics(&sim);
        m.contains("gpuctl_xid_errors_total{gpu=\"1\",")
            && m.contains(",xid=\"64\"} 1")
            && m.contains("action=\"gpu_reset\"} 1")
    });
    let m = metrics(&sim);
    assert!(m.contains("# TYPE gpuctl_xid_errors_total counter"), "{m}");
    assert!(
        m.contains("type=\"corrected\",counter=\"volatile\"} 5"),
        "{m}"
    );
    assert!(m.contains("gpuctl_gpu_remapped_rows{gpu=\"1\","), "{m}");

    // gpuctl health reads the Xid the watchdog recorded, with the process on the GPU.
    let run = sim.run(&["health", "--json"]);
    assert_eq!(run.code, 6, "{}{}", run.stdout, run.stderr);
    let doc: Value = serde_json::from_str(&run.stdout).unwrap();
    let cause = &doc["gpus"][1]["causes"][0];
    assert_eq!(cause["kind"], "xid");
    assert_eq!(cause["xid"], 64);
    assert_eq!(cause["processes"][0]["pid"], job.pid());

    // The same Xid again, appended: one more event, the counter at 2 (never a last value).
    sim.write(&scenario(5, &[64, 64]));
    daemon.expect_count(&["GPU 1: Xid 64"], 2);
    wait_for("the counter counts both", || {
        metrics(&sim).contains(",xid=\"64\"} 2")
    });
    assert_eq!(daemon.count(&["GPU 1: Xid 64"]), 2);

    // A reset: the volatile ECC counters restart. The Xids before it are forgotten and the
    // verdict is none again, with nobody clearing anything.
    sim.write(&scenario(0, &[64, 64]));
    wait_for("the verdict clears", || {
        metrics(&sim).contains("gpu=\"1\",uuid=") && {
            let m = metrics(&sim);
            m.lines().any(|l| {
                l.starts_with("gpuctl_gpu_health_action{gpu=\"1\"")
                    && l.contains("action=\"none\"} 1")
            })
        }
    });
    let run = sim.run(&["health", "--gpu", "1"]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
}

#[test]
fn once_takes_the_pending_xids_too() {
    let sim = Sim::new(
        &Scenario::new()
            .gpu(Gpu::new().no_recovery_field())
            .xid(0, 79, None),
    );
    configure(&sim);
    let run = Run::from(command(&sim, &["--once"]).output().unwrap());
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stderr.contains(
            "GPU 0: Xid 79 (GPU has fallen off the bus): action node_reboot; no process on the GPU"
        ),
        "{}",
        run.stderr
    );
    let log: Value = serde_json::from_str(
        &std::fs::read_to_string(sim.dir.path().join("state/health.json")).unwrap(),
    )
    .unwrap();
    let (_, records) = log["gpus"].as_object().unwrap().iter().next().unwrap();
    assert_eq!(records[0]["xid"], 79);
    let run = sim.run(&["health"]);
    assert_eq!(run.code, 6, "{}", run.stdout);
    assert!(
        run.stdout.contains("node_reboot  (needs a node reboot)"),
        "{}",
        run.stdout
    );
}

/// Memory a reclaim cannot get back on a GPU that needs a reset is reported as such, not
/// retried: it comes back only with the reset.
#[test]
fn memory_held_on_a_gpu_that_needs_a_reset_is_reported_not_retried() {
    let mut run = crate::util::TrainingRun::start(2, "sleep", "python3", &["train.py"]);
    run.crash();
    let worker = run.workers.pids[0];
    // The driver keeps the workers' memory after they exit (contexts it cannot tear down).
    let sim = Sim::new(
        &Scenario::new()
            .gpu(Gpu::new().remapped_rows(0, 1, true, false))
            .processes(run.workers.pids.iter().map(|&pid| {
                Process::new(pid)
                    .used(4 * GIB)
                    .teardown(Duration::from_secs(600))
            })),
    );
    configure(&sim);
    let out = Run::from(
        command(&sim, &["--once", "--mode", "reclaim"])
            .output()
            .unwrap(),
    );
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!("reclaim of pid {worker} ("))
            && out
                .stderr
                .contains("not got back, and not retried: GPU 0 needs a reset: row remap pending"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("ACTION=needs-gpu-reset"),
        "{}",
        out.stderr
    );
}

/// Xids NVIDIA's catalog lacks: each holds the GPU (by default), named as unknown.
const UNKNOWN_XIDS: [u32; 3] = [163, 500, 999];

/// Every Xid of NVIDIA's catalog, and some it lacks, raised on a driver without the
/// recovery-action field, taken by the watchdog and judged by `gpuctl health --json`: each
/// cause carries its catalog entry's action and meaning. Batched over GPUs, each below the
/// Xid log's per-GPU bound, with a process on each GPU for the app-caused ones to name.
#[test]
fn every_xid_of_the_catalog_gets_its_action_and_an_unknown_one_holds_the_gpu() {
    use gpuctl_core::health::{Catalog, XID_CATALOG};
    let xids: Vec<u32> = XID_CATALOG
        .iter()
        .map(|e| e.xid)
        .chain(UNKNOWN_XIDS)
        .collect();
    let per_gpu = 56;
    let gpus = xids.len().div_ceil(per_gpu);
    let job = Proc::sleeper("python3", &["train.py"]);
    let mut scenario = Scenario::new()
        .gpus(gpus, Gpu::new().no_recovery_field())
        .process(
            Process::new(job.pid())
                .on_each(&(0..gpus as u32).collect::<Vec<_>>())
                .used(GIB),
        );
    for (i, xid) in xids.iter().enumerate() {
        // The driver's line names the job (the sim writes it): an application Xid names it.
        scenario = scenario.xid((i / per_gpu) as u32, *xid, Some(job.pid()));
    }
    let sim = Sim::new(&scenario);
    configure(&sim);
    let run = Run::from(command(&sim, &["--once"]).output().unwrap());
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        run.stderr.matches(": Xid ").count(),
        xids.len(),
        "{}",
        run.stderr
    );

    let run = sim.run(&["health", "--json"]);
    assert_eq!(run.code, 6, "{}{}", run.stdout, run.stderr);
    let doc: Value = serde_json::from_str(&run.stdout).unwrap();
    let catalog = Catalog::default();
    for (i, xid) in xids.iter().enumerate() {
        let causes = doc["gpus"][i / per_gpu]["causes"].as_array().unwrap();
        let cause = causes
            .iter()
            .find(|c| c["xid"] == *xid)
            .unwrap_or_else(|| panic!("Xid {xid} is not among GPU {}'s causes", i / per_gpu));
        let rule = catalog.rule(*xid);
        assert_eq!(cause["action"], rule.action.name(), "Xid {xid}: {cause}");
        assert_eq!(cause["meaning"], rule.meaning, "Xid {xid}");
        if rule.action.name() == "restart_app" {
            assert_eq!(cause["processes"][0]["pid"], job.pid(), "Xid {xid}");
        }
    }
    for (i, xid) in UNKNOWN_XIDS.iter().enumerate() {
        let gpu = (XID_CATALOG.len() + i) / per_gpu;
        let cause = doc["gpus"][gpu]["causes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["xid"] == *xid)
            .unwrap()
            .clone();
        assert_eq!(cause["action"], "gpu_reset", "{cause}");
        let message = cause["message"].as_str().unwrap();
        assert!(
            message.starts_with(&format!("unknown Xid {xid}: ")),
            "{message}"
        );
    }
}

/// `[health] unknown_xid_action` decides what an unknown Xid asks for; an acknowledgement
/// clears it as it clears any Xid.
#[test]
fn unknown_xid_action_is_the_sites_and_an_acknowledgement_clears_an_unknown_xid() {
    let sim = Sim::new(
        &Scenario::new()
            .gpu(Gpu::new().no_recovery_field())
            .xid(0, 999, None),
    );
    configure(&sim);
    let run = Run::from(command(&sim, &["--once"]).output().unwrap());
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("GPU 0: Xid 999 (unknown Xid 999): action gpu_reset"),
        "{}",
        run.stderr
    );
    let run = sim.run(&["health"]);
    assert_eq!(run.code, 6, "{}", run.stdout);
    assert!(run.stdout.contains("unknown Xid 999"), "{}", run.stdout);

    let config = std::fs::read_to_string(sim.config_path()).unwrap();
    let lenient = format!("{config}[health]\nunknown_xid_action = \"none\"\n");
    std::fs::write(sim.config_path(), &lenient).unwrap();
    let run = sim.run(&["health"]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);

    std::fs::write(sim.config_path(), &config).unwrap();
    assert_eq!(sim.run(&["health"]).code, 6);
    let run = sim.run(&["health", "--ack", "0"]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let run = sim.run(&["health"]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);

    let bad = format!("{config}[health]\nunknown_xid_action = \"reboot\"\n");
    std::fs::write(sim.config_path(), bad).unwrap();
    let run = sim.run(&["health"]);
    assert_eq!(run.code, 2, "{}{}", run.stdout, run.stderr);
    assert!(run.stderr.contains("unknown_xid_action"), "{}", run.stderr);
}

/// A driver raises an Xid once: a watchdog restarted after it (a new NVML session, a new
/// event set) does not see it again, so it is logged and recorded once; an Xid raised after
/// the restart is the new daemon's.
#[test]
fn a_watchdog_restart_after_an_xid_counts_it_once() {
    let scenario = |xids: &[u32]| {
        xids.iter().fold(
            Scenario::new().gpu(Gpu::new().no_recovery_field()),
            |s, xid| s.xid(0, *xid, None),
        )
    };
    let sim = Sim::new(&scenario(&[64]));
    configure(&sim);
    let mut first = Daemon::start(&sim, &[]);
    first.expect_count(&["GPU 0: Xid 64"], 1);
    assert_eq!(first.stop(), 0);

    let second = Daemon::start(&sim, &[]);
    second.expect_count(&["watching Xid events on GPUs 0"], 1);
    // Entries are raised in file order: once 13 (appended) arrives, 64 would have before it.
    sim.write(&scenario(&[64, 13]));
    second.expect_count(&["GPU 0: Xid 13"], 1);
    assert_eq!(
        second.count(&["Xid 64"]),
        0,
        "64 replayed to the new daemon"
    );
    // The log line comes before the record is saved, so the file may lag it a moment.
    let recorded = || -> Vec<Value> {
        let text =
            std::fs::read_to_string(sim.dir.path().join("state/health.json")).unwrap_or_default();
        let Ok(log) = serde_json::from_str::<Value>(&text) else {
            return Vec::new();
        };
        log["gpus"]
            .as_object()
            .and_then(|gpus| gpus.values().next())
            .and_then(Value::as_array)
            .map(|records| records.iter().map(|r| r["xid"].clone()).collect())
            .unwrap_or_default()
    };
    util::wait_until(Duration::from_secs(10), || recorded().len() >= 2);
    assert_eq!(recorded(), [64, 13]);
    let run = Run::from(command(&sim, &["--once"]).output().unwrap());
    assert!(!run.stderr.contains(": Xid "), "{}", run.stderr);
}

/// A kmsg record naming `pid` for Xid `xid` on the GPU at `address` (the kernel's
/// `0000:18:00`), as the driver writes it; its sequence number the time in microseconds, as
/// the sim's lines have theirs.
fn nvrm_line(address: &str, xid: u32, pid: u32, name: &str) -> String {
    let micros = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros();
    format!(
        "3,{micros},{micros},-;NVRM: Xid (PCI:{address}): {xid}, pid={pid}, name={name}, Graphics Exception: ESR 0x50\n"
    )
}

fn append(path: &std::path::Path, text: &str) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    file.write_all(text.as_bytes()).unwrap();
}

/// The pids `gpuctl health --json` names for GPU `gpu`'s Xid `xid`.
fn named_by_health(sim: &Sim, gpu: usize, xid: u32) -> Vec<u64> {
    let doc = sim.json(&["health"]);
    doc["gpus"][gpu]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["xid"] == xid)
        .flat_map(|c| c["processes"].as_array().unwrap().clone())
        .map(|p| p["pid"].as_u64().unwrap())
        .collect()
}

/// Two processes share GPU 1; the driver's line names one. The application Xid names
/// exactly that one (in the journal event and `gpuctl health`), not its neighbour; a line
/// for another GPU's bus names nobody on this one: the culprit is unknown, not guessed.
#[test]
fn an_application_xid_names_only_the_process_the_kernel_named() {
    let culprit = Proc::sleeper("python3", &["train.py"]);
    let neighbour = Proc::sleeper("python3", &["eval.py"]);
    let scenario = |xids: &[(u32, Option<u32>)]| {
        xids.iter().fold(
            Scenario::new().gpus(2, Gpu::new()).processes([
                Process::new(culprit.pid()).on(1).used(GIB),
                Process::new(neighbour.pid()).on(1).used(GIB),
            ]),
            |s, (xid, pid)| s.xid(1, *xid, *pid),
        )
    };
    let sim = Sim::new(&scenario(&[]));
    configure(&sim);
    let daemon = Daemon::start(&sim, &[]);
    daemon.expect_count(&["watching Xid events on GPUs 0, 1"], 1);
    // The sim writes the driver's line naming the culprit as it raises the Xid.
    sim.write(&scenario(&[(13, Some(culprit.pid()))]));
    let line = daemon.expect_count(&["GPU 1: Xid 13"], 1);
    assert!(
        line.contains(&format!("CULPRIT={}", culprit.pid())),
        "{line}"
    );
    assert!(line.contains(&format!("PIDS={}", culprit.pid())), "{line}");
    assert!(!line.contains(&neighbour.pid().to_string()), "{line}");
    assert!(line.contains("the kernel names pid"), "{line}");
    let named = || named_by_health(&sim, 1, 13);
    wait_for("health names the culprit", || !named().is_empty());
    assert_eq!(named(), [u64::from(culprit.pid())]);

    // A line for GPU 0's bus (0000:18:00), then Xid 31 on GPU 1 (whose own line names
    // nobody): nobody is named.
    append(
        &sim.kernel_log_path(),
        &nvrm_line("0000:18:00", 31, neighbour.pid(), "python3"),
    );
    sim.write(&scenario(&[(13, Some(culprit.pid())), (31, None)]));
    let line = daemon.expect_count(&["GPU 1: Xid 31"], 1);
    assert!(line.contains("culprit unknown"), "{line}");
    assert!(line.contains("CULPRIT=unknown"), "{line}");
    assert!(!line.contains("PIDS="), "{line}");
    assert!(named_by_health(&sim, 1, 31).is_empty());
}

/// The same through the machine's real kernel log: as root, a real NVRM line written to
/// /dev/kmsg names one of two processes; a GPU at an unusual bus id keeps other tests'
/// lines (and this one's) apart.
#[test]
fn the_kernels_own_log_names_the_culprit_as_root() {
    if !nix_is_root() {
        panic!("this test writes a line into /dev/kmsg and must run as root");
    }
    let culprit = Proc::sleeper("python3", &["train.py"]);
    let neighbour = Proc::sleeper("python3", &["eval.py"]);
    let scenario = |xids: &[u32]| {
        xids.iter().fold(
            Scenario::new()
                .gpu(Gpu::new().pci_bus_id("00000000:E7:00.0"))
                .processes([
                    Process::new(culprit.pid()).on(0).used(GIB),
                    Process::new(neighbour.pid()).on(0).used(GIB),
                ]),
            |s, xid| s.xid(0, *xid, None),
        )
    };
    let sim = Sim::new(&scenario(&[]));
    configure(&sim);
    let mut command = command(&sim, &[]);
    command.env("GPUCTL_KERNEL_LOG", "/dev/kmsg");
    let daemon = Daemon::start_with(command);
    daemon.expect_count(&["watching Xid events on GPUs 0"], 1);
    let kmsg = std::path::Path::new("/dev/kmsg");
    // A write to /dev/kmsg is one record, in the "<priority>message" form.
    let message = nvrm_line("0000:e7:00", 13, culprit.pid(), "python3");
    let message = message.split_once(';').unwrap().1;
    append(kmsg, &format!("<3>{message}"));
    sim.write(&scenario(&[13]));
    let line = daemon.expect_count(&["GPU 0: Xid 13"], 1);
    assert!(
        line.contains(&format!("CULPRIT={}", culprit.pid())),
        "{line}"
    );
    assert!(!line.contains(&neighbour.pid().to_string()), "{line}");
    wait_for("health names the culprit", || {
        named_by_health(&sim, 0, 13) == [u64::from(culprit.pid())]
    });
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}
