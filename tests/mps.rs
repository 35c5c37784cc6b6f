//! CUDA MPS on the sim: the server and each client as their own rows, with their own users
//! and memory (info's table and JSON, `--by user`), and what no command may do to the
//! server or its control daemon.

use std::time::Duration;

use serde_json::Value;

use crate::util::{GIB, Gpu, Proc, Process, Scenario, Sim, is_root, wait_until};

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
    doc["devices"][gpu]["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("pid {pid} not on GPU {gpu}: {doc}"))
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
    assert!(
        server_row.contains("[MPS server] nvidia-cuda-mps-server"),
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
