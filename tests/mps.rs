//! CUDA MPS on the sim: the server and each client as their own rows, with their own users
//! and memory (info's table and JSON, `--by user`); what no command (kill by GPU, clear,
//! the watchdog's idle reclaim) may do to the server; a client ended through NVIDIA's own
//! control daemon first, and a crashed run's orphaned client reclaimed.

use std::time::Duration;

use serde_json::Value;

use crate::util::{
    Fetch, GIB, Gpu, Proc, Process, RootOwnedProgram, Scenario, Sim, TrainingRun, alive, is_root,
    process_on, wait_until,
};
use crate::watchdog::{Daemon, wait_more_loops};

/// Two users' uids, with no account needed.
const ALICE: u32 = 64101;
const BOB: u32 = 64102;

/// A test process running as `uid` (setpriv has exec'd it).
fn as_user(uid: u32, args: &[&str]) -> Proc {
    let process = Proc::spawn_as(uid, "sleep", args);
    let status = format!("/proc/{}/status", process.pid());
    wait_until(Duration::from_secs(5), || {
        std::fs::read_to_string(&status).is_ok_and(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.contains(&uid.to_string()))
        })
    });
    process
}

/// GPU 0 under MPS: the server (1 GiB of its own), alice's two ranks (8 and 4 GiB) and
/// bob's client (2 GiB); GPU 1 without MPS, alice's 3 GiB.
struct MpsServer {
    server: Proc,
    alice: [Proc; 2],
    bob: Proc,
    plain: Proc,
}

impl MpsServer {
    fn start() -> MpsServer {
        assert!(
            is_root(),
            "the MPS tests run clients as other users: run as root"
        );
        MpsServer {
            server: Proc::spawn_ready("sleep", "nvidia-cuda-mps-server", &[]),
            alice: [as_user(ALICE, &["rank0.py"]), as_user(ALICE, &["rank1.py"])],
            bob: as_user(BOB, &["train.py"]),
            plain: as_user(ALICE, &["eval.py"]),
        }
    }

    fn scenario(&self) -> Scenario {
        Scenario::new()
            .gpu(Gpu::new())
            .gpu(Gpu::new())
            .process(Process::new(self.server.pid()).used(GIB).mps_server())
            .process(Process::new(self.alice[0].pid()).used(8 * GIB).mps_client())
            .process(Process::new(self.alice[1].pid()).used(4 * GIB).mps_client())
            .process(Process::new(self.bob.pid()).used(2 * GIB).mps_client())
            .process(Process::new(self.plain.pid()).on(1).used(3 * GIB))
    }
}

fn process(doc: &Value, gpu: usize, pid: u32) -> &Value {
    process_on(doc, gpu, pid).unwrap_or_else(|| panic!("pid {pid} not on GPU {gpu}: {doc}"))
}

#[test]
fn info_shows_the_mps_server_and_each_client_with_its_own_user_and_memory() {
    let mps = MpsServer::start();
    let sim = Sim::new(&mps.scenario());
    let doc = sim.json(&["info"]);
    crate::schema::conforms(
        &serde_json::from_str(include_str!("../docs/schema/info-v1.schema.json")).unwrap(),
        &doc,
    )
    .unwrap();
    let server = process(&doc, 0, mps.server.pid());
    assert_eq!(server["mps"], "server", "{server}");
    assert_eq!(server["used_bytes"], GIB);
    assert_eq!(server["user"], "root");
    for (proc_, uid, bytes) in [
        (&mps.alice[0], ALICE, 8 * GIB),
        (&mps.alice[1], ALICE, 4 * GIB),
        (&mps.bob, BOB, 2 * GIB),
    ] {
        let client = process(&doc, 0, proc_.pid());
        assert_eq!(client["mps"], "client", "{client}");
        assert_eq!(client["uid"], uid, "{client}");
        assert_eq!(client["used_bytes"], bytes, "{client}");
    }
    let plain = process(&doc, 1, mps.plain.pid());
    assert!(plain.get("mps").is_none(), "{plain}");

    let table = sim.run(&["info"]);
    assert_eq!(table.code, 0, "{}", table.stderr);
    let row = |pid: u32| {
        table
            .stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(&pid.to_string()))
            .unwrap_or_else(|| panic!("no row for {pid}:\n{}", table.stdout))
            .to_string()
    };
    let server_row = row(mps.server.pid());
    // Named so, but the test's own binary: shown as the impostor it is.
    assert!(
        server_row
            .contains("[MPS server] [claims to be nvidia-cuda-mps-server] nvidia-cuda-mps-server"),
        "{server_row}"
    );
    assert!(server_row.contains(" 1.0 GiB "), "{server_row}");
    let bob_row = row(mps.bob.pid());
    assert!(
        bob_row.contains("[MPS client] ") && bob_row.ends_with(" train.py"),
        "{bob_row}"
    );
    assert!(bob_row.contains(&BOB.to_string()), "{bob_row}");
    assert!(!row(mps.plain.pid()).contains("MPS"));
}

/// `--by user` counts each client's memory to the client's user and the server's own
/// memory to the server's: nothing to the server's user for its clients.
#[test]
fn by_user_counts_client_memory_to_the_clients_user() {
    let mps = MpsServer::start();
    let sim = Sim::new(&mps.scenario());
    let doc = sim.json(&["info", "--by", "user"]);
    let total = |user: &str| -> u64 {
        doc["totals"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["user"] == user)
            .unwrap_or_else(|| panic!("no total for {user}: {}", doc["totals"]))["used_bytes"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(total(&ALICE.to_string()), 15 * GIB);
    assert_eq!(total(&BOB.to_string()), 2 * GIB);
    assert_eq!(total("root"), GIB);
}

/// NVIDIA's server as installed (a root-owned file named `nvidia-cuda-mps-server`), run as
/// alice as the control daemon runs it for her clients, once setpriv has exec'd it.
fn genuine_server(installed: &RootOwnedProgram) -> Proc {
    let server = Proc::spawn_program_as(ALICE, installed.path());
    let exe = format!("/proc/{}/exe", server.pid());
    wait_until(Duration::from_secs(5), || {
        std::fs::read_link(&exe).is_ok_and(|target| target == installed.path())
    });
    server
}

/// `gpuctl kill ARGS --json`: its exit status and the document.
fn kill(sim: &Sim, args: &[&str]) -> (i32, Value) {
    let mut all = vec!["kill", "--timeout", "2s", "--json"];
    all.extend_from_slice(args);
    let run = sim.run(&all);
    let doc = serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("kill {args:?}: invalid JSON ({e}): {run:?}"));
    (run.code, doc)
}

fn outcome(doc: &Value, pid: u32) -> &Value {
    doc["outcomes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["pid"] == pid)
        .unwrap_or_else(|| panic!("no outcome for {pid}: {doc:#}"))
}

/// The genuine server, run as its clients' user, is never ended by a selector: `kill --gpu`
/// ends the clients and leaves it; `kill --pid SERVER` says which clients ending it would
/// end and needs `--force`, which then ends it.
#[test]
fn the_mps_server_is_ended_only_by_its_pid_with_force() {
    assert!(is_root(), "a root-owned MPS server needs root");
    let installed = RootOwnedProgram::install("nvidia-cuda-mps-server");
    let mps = MpsServer {
        server: genuine_server(&installed),
        ..MpsServer::start()
    };
    let sim = Sim::new(&mps.scenario());
    let server = mps.server.pid();
    let info = sim.json(&["info"]);
    let shown = process(&info, 0, server);
    assert_eq!(shown["protection"]["genuine"], true, "{shown}");
    assert_eq!(shown["mps"], "server");

    // By its pid alone: spared, and the skip names every client it would end.
    let (code, doc) = kill(&sim, &["--pid", &server.to_string()]);
    assert_eq!(code, 1, "{doc}");
    let why = outcome(&doc, server)["skipped"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        why.starts_with(
            "protected: nvidia-cuda-mps-server; ending it ends its 3 clients on GPU 0: "
        ),
        "{why}"
    );
    for client in [&mps.alice[0], &mps.alice[1], &mps.bob] {
        assert!(why.contains(&format!("pid {} (", client.pid())), "{why}");
    }
    assert!(why.contains(&format!("(uid {BOB}: ")), "{why}");
    assert!(
        why.ends_with(&format!("to end it anyway: --pid {server} --force")),
        "{why}"
    );
    assert!(alive(server));

    // Every process of the GPU: the clients end, the server stays.
    let (_, doc) = kill(&sim, &["--gpu", "0", "--yes"]);
    assert!(
        outcome(&doc, server)["skipped"]
            .as_str()
            .unwrap()
            .starts_with("protected: nvidia-cuda-mps-server; ending it ends"),
        "{doc}"
    );
    for client in [&mps.alice[0], &mps.alice[1], &mps.bob] {
        wait_until(Duration::from_secs(5), || !alive(client.pid()));
    }
    assert!(alive(server));

    // --force with a selector that is not its pid: still spared.
    let (_, doc) = kill(&sim, &["--user", &ALICE.to_string(), "--force", "--yes"]);
    assert!(outcome(&doc, server)["skipped"].is_string(), "{doc}");
    assert!(alive(server));

    // Named and forced: ended.
    let (code, doc) = kill(&sim, &["--pid", &server.to_string(), "--force"]);
    assert_eq!(code, 0, "{doc}");
    wait_until(Duration::from_secs(5), || !alive(server));
}

/// NVIDIA's own control daemon (scripts/fetch-mps), run in the foreground in a scratch pipe
/// and log directory of its own; asked to quit and ended by its pid on drop.
struct RealDaemon {
    child: std::process::Child,
    dir: tempfile::TempDir,
}

impl RealDaemon {
    fn start() -> RealDaemon {
        static MPS: Fetch = Fetch::new("fetch-mps");
        let program = MPS.once().unwrap_or_else(|why| {
            panic!("NVIDIA's MPS control daemon is needed and could not be had: {why}")
        });
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("pipe")).unwrap();
        std::fs::create_dir(dir.path().join("log")).unwrap();
        // In the foreground it logs to its stdout what it would write to control.log.
        let out = std::fs::File::create(dir.path().join("log/foreground.log")).unwrap();
        let child = std::process::Command::new(program)
            .arg("-f")
            .env_clear()
            .env("CUDA_MPS_PIPE_DIRECTORY", dir.path().join("pipe"))
            .env("CUDA_MPS_LOG_DIRECTORY", dir.path().join("log"))
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("start nvidia-cuda-mps-control -f");
        let daemon = RealDaemon { child, dir };
        let control = daemon.pipe_dir().join("control");
        wait_until(Duration::from_secs(5), || control.exists());
        daemon
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn pipe_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("pipe")
    }

    fn log(&self) -> String {
        ["control.log", "foreground.log"]
            .iter()
            .filter_map(|name| std::fs::read_to_string(self.dir.path().join("log").join(name)).ok())
            .collect()
    }
}

impl Drop for RealDaemon {
    fn drop(&mut self) {
        // Our child, unreaped: its pid is still its own.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client of the real daemon's server is ended the supported way first: gpuctl finds the
/// daemon (by the client's pipe directory, the server here not being the daemon's child),
/// and its terminate_client reaches it with the server's and the client's pids (the
/// daemon's own log). This daemon has no such server (a real one needs a GPU), so it
/// refuses: gpuctl then signals the client, and says why.
#[test]
fn a_client_is_ended_through_the_real_control_daemon_first() {
    assert!(is_root(), "a root-owned MPS server needs root");
    let daemon = RealDaemon::start();
    let installed = RootOwnedProgram::install("nvidia-cuda-mps-server");
    let server = genuine_server(&installed);
    let pipe = daemon.pipe_dir();
    let pipe = pipe.to_str().unwrap();
    let client = Proc::spawn_as_with_env(
        BOB,
        "sleep",
        &["train.py"],
        &[("CUDA_MPS_PIPE_DIRECTORY", pipe)],
    );
    wait_until(Duration::from_secs(5), || {
        std::fs::read_to_string(format!("/proc/{}/status", client.pid())).is_ok_and(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.contains(&BOB.to_string()))
        })
    });
    let sim = Sim::new(
        &Scenario::new()
            .gpu(Gpu::new())
            .process(Process::new(server.pid()).used(GIB).mps_server())
            .process(Process::new(client.pid()).used(4 * GIB).mps_client()),
    );
    let (code, doc) = kill(&sim, &["--pid", &client.pid().to_string()]);
    wait_until(Duration::from_secs(5), || !alive(client.pid()));
    let log = daemon.log();
    assert!(
        log.contains(&format!(
            "Cmd:terminate_client {} {}",
            server.pid(),
            client.pid()
        )),
        "the daemon's log:\n{log}\nkill's document: {doc:#}"
    );
    let ended = &outcome(&doc, client.pid())["ended"];
    let signal = ended["signal"]
        .as_str()
        .unwrap_or_else(|| panic!("{doc:#}"));
    assert!(
        signal.starts_with(&format!(
            "SIGTERM, as the MPS control daemon (pid {}) did not end it: Server {} not found",
            daemon.pid(),
            server.pid()
        )),
        "{signal}"
    );
    assert_eq!(code, 0, "{doc:#}");
    // The server and the daemon are untouched.
    assert!(alive(server.pid()) && alive(daemon.pid()));
}

/// A crashed run's orphaned worker, still a client of the GPU's MPS server, is reclaimed by
/// `clear`; with no control daemon for it (none serves its pipe directory) it is signalled,
/// and the outcome says why. The server, and the other user's client, stay.
#[test]
fn clear_reclaims_a_crashed_runs_orphaned_client_and_leaves_the_server() {
    assert!(is_root(), "a root-owned MPS server needs root");
    let installed = RootOwnedProgram::install("nvidia-cuda-mps-server");
    let server = genuine_server(&installed);
    let other = as_user(ALICE, &["rank0.py"]);
    // Two workers: a group of idle orphans is a crashed run, one alone may be a job's.
    let mut run = TrainingRun::start(2, "sleep", "python3", &["train.py"]);
    run.crash();
    let orphans = [run.workers.pid(0), run.workers.pid(1)];
    let sim = Sim::new(
        &Scenario::new()
            .gpu(Gpu::new())
            .process(Process::new(server.pid()).used(GIB).mps_server())
            .process(Process::new(other.pid()).used(8 * GIB).mps_client())
            .process(Process::new(orphans[0]).used(6 * GIB).mps_client())
            .process(Process::new(orphans[1]).used(2 * GIB).mps_client()),
    );
    let run_clear = sim.run(&["clear", "--timeout", "2s", "--json"]);
    let doc: Value = serde_json::from_str(&run_clear.stdout)
        .unwrap_or_else(|e| panic!("invalid JSON ({e}): {run_clear:?}"));
    assert_eq!(run_clear.code, 0, "{doc:#}");
    let outcomes = doc["outcomes"].as_array().unwrap();
    assert_eq!(outcomes.len(), 2, "only the orphans are leftovers: {doc:#}");
    for orphan in orphans {
        let ended = &outcome(&doc, orphan)["ended"];
        assert_eq!(
            ended["signal"],
            format!(
                "SIGTERM, as no MPS control daemon found for server {}",
                server.pid()
            ),
            "{doc:#}"
        );
        assert_eq!(outcome(&doc, orphan)["memory_released"], true);
        assert!(!alive(orphan));
    }
    assert!(alive(server.pid()) && alive(other.pid()));
}

/// The watchdog's idle reclaim (`[idle] action = "reclaim"`) ends an idle MPS client, but
/// never the genuine server sitting at 0 % with its own memory: the guard skips it, and the
/// skip names the clients it would have ended.
#[test]
fn idle_reclaim_by_the_watchdog_never_ends_the_mps_server() {
    use std::os::unix::fs::PermissionsExt;
    assert!(is_root(), "a root-owned MPS server needs root");
    let installed = RootOwnedProgram::install("nvidia-cuda-mps-server");
    let server = genuine_server(&installed);
    let idle = as_user(BOB, &["notebook.py"]);
    let busy = as_user(ALICE, &["rank0.py"]);
    let sim = Sim::new(
        &Scenario::new()
            .gpu(Gpu::new())
            .process(Process::new(server.pid()).used(GIB).sm(0).mps_server())
            .process(Process::new(idle.pid()).used(4 * GIB).sm(0).mps_client())
            .process(Process::new(busy.pid()).used(4 * GIB).sm(60).mps_client()),
    );
    let dir = sim.dir.path();
    let config = format!(
        "[watchdog]\ninterval = \"200ms\"\ngrace = \"1s\"\nterm_timeout = \"1s\"\n\
         metrics_file = \"{}\"\nstate_dir = \"{}\"\nmode = \"reclaim\"\n\
         [idle]\nafter = \"500ms\"\naction = \"reclaim\"\nreclaim_after = \"1s\"\n",
        dir.join("gpuctl.prom").display(),
        dir.join("state").display()
    );
    std::fs::write(sim.config_path(), config).unwrap();
    std::fs::set_permissions(sim.config_path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    let daemon = Daemon::start(&sim, &[]);
    let reclaimed = daemon.expect_count(&["ACTION=reclaimed"], 1);
    assert!(
        reclaimed.contains(&format!("PID={} ", idle.pid())),
        "{reclaimed}"
    );
    let spared = daemon.expect_count(&["protected: nvidia-cuda-mps-server"], 1);
    assert!(
        spared.contains(&format!("PID={} ", server.pid())),
        "{spared}"
    );
    wait_more_loops(&sim, 5);
    assert!(alive(server.pid()), "the server is never ended");
    assert!(alive(busy.pid()), "a busy client is never idle");
    assert_eq!(daemon.count(&["ACTION=reclaimed"]), 1);
}

/// A wedged server (alive, no client left, holding more than its overhead) is reported by
/// the watchdog in reclaim mode with the remedy, and not ended.
#[test]
fn the_watchdog_reports_a_wedged_mps_server_and_leaves_it() {
    use std::os::unix::fs::PermissionsExt;
    assert!(is_root(), "a root-owned MPS server needs root");
    let installed = RootOwnedProgram::install("nvidia-cuda-mps-server");
    let server = genuine_server(&installed);
    let sim = Sim::new(
        &Scenario::new()
            .gpu(Gpu::new())
            .process(Process::new(server.pid()).used(6 * GIB).mps_server()),
    );
    let dir = sim.dir.path();
    let config = format!(
        "[watchdog]\ninterval = \"200ms\"\ngrace = \"1s\"\nterm_timeout = \"1s\"\n\
         metrics_file = \"{}\"\nstate_dir = \"{}\"\nmode = \"reclaim\"\n",
        dir.join("gpuctl.prom").display(),
        dir.join("state").display()
    );
    std::fs::write(sim.config_path(), config).unwrap();
    std::fs::set_permissions(sim.config_path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    let daemon = Daemon::start(&sim, &[]);
    let line = daemon.expect_count(&["MPS server with no client left holds 6.0 GiB"], 1);
    assert!(line.contains(&format!("PID={} ", server.pid())), "{line}");
    assert!(
        line.contains("echo quit | nvidia-cuda-mps-control"),
        "{line}"
    );
    wait_more_loops(&sim, 5);
    assert!(alive(server.pid()), "reported, never ended");
    assert_eq!(daemon.count(&["ACTION=reclaimed"]), 0);
}
