//! CUDA MPS on the reclaim road: what ending the server would do, said where it is skipped.

use crate::mps::Role;
use crate::plan::{Disposition, Outcome};
use crate::snapshot::Snapshot;

/// Each MPS server the guard spared gets, in its skip, the clients that ending it would end
/// (every client on its GPUs, whoever runs them) and how to end it anyway.
pub(super) fn name_the_clients(planned: &mut [Outcome], snapshot: &Snapshot) {
    let spared = format!("protected: {}", crate::mps::SERVER);
    for outcome in planned.iter_mut() {
        let Disposition::Skipped { why } = &mut outcome.disposition else {
            continue;
        };
        if *why != spared {
            continue;
        }
        *why = explain(&spared, outcome.target.pid, &outcome.target.gpus, snapshot);
    }
}

/// "protected: nvidia-cuda-mps-server; ending it ends its 2 clients on GPU 0: pid 41 (alice:
/// python3 rank0.py), pid 42 (bob: train.py); to end it anyway: --pid 40 --force".
fn explain(spared: &str, server: u32, gpus: &[u32], snapshot: &Snapshot) -> String {
    let clients: Vec<String> = snapshot
        .devices
        .iter()
        .filter(|gpu| gpus.contains(&gpu.index))
        .flat_map(|gpu| &gpu.processes)
        .filter(|p| p.mps == Some(Role::Client))
        .map(|p| {
            let user = p.host.user_name().unwrap_or_else(|| "?".into());
            format!(
                "pid {} ({user}: {})",
                p.pid,
                crate::text::safe(&p.host.shown_command())
            )
        })
        .collect();
    let on = format!(
        "GPU{} {}",
        crate::units::plural(gpus.len(), "s"),
        crate::units::gpu_list(gpus)
    );
    let what = match clients.len() {
        0 => format!("ending it ends MPS on {on} (no client now)"),
        n => format!(
            "ending it ends its {n} client{} on {on}: {}",
            crate::units::plural(n, "s"),
            clients.join(", ")
        ),
    };
    format!("{spared}; {what}; to end it anyway: --pid {server} --force")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;
    use crate::select::Target;

    fn with_role(pid: u32, user: &str, role: Option<Role>) -> crate::snapshot::GpuProcess {
        let mut process = fixtures::process(pid)
            .used_gib(1)
            .confirmed()
            .user(user)
            .host(|host| host.command = Some("rank.py".into()))
            .build();
        process.mps = role;
        process
    }

    fn skipped(snapshot: &Snapshot, pid: u32, why: &str) -> Outcome {
        Outcome {
            target: Target::of(snapshot, pid).unwrap(),
            disposition: Disposition::Skipped { why: why.into() },
        }
    }

    #[test]
    fn a_spared_server_names_its_gpus_clients_and_how_to_end_it() {
        let snapshot = Snapshot::of(vec![
            fixtures::gpu(
                0,
                vec![
                    with_role(40, "root", Some(Role::Server)),
                    with_role(41, "alice", Some(Role::Client)),
                    with_role(42, "bob", Some(Role::Client)),
                ],
            ),
            fixtures::gpu(1, vec![with_role(43, "carol", Some(Role::Client))]),
        ]);
        let mut planned = vec![
            skipped(&snapshot, 40, "protected: nvidia-cuda-mps-server"),
            skipped(&snapshot, 41, "protected: nvidia-smi"),
        ];
        name_the_clients(&mut planned, &snapshot);
        let why = |o: &Outcome| match &o.disposition {
            Disposition::Skipped { why } => why.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            why(&planned[0]),
            "protected: nvidia-cuda-mps-server; ending it ends its 2 clients on GPU 0: \
             pid 41 (alice: rank.py), pid 42 (bob: rank.py); to end it anyway: --pid 40 --force"
        );
        assert_eq!(why(&planned[1]), "protected: nvidia-smi");

        let alone = Snapshot::of(vec![fixtures::gpu(
            0,
            vec![with_role(40, "root", Some(Role::Server))],
        )]);
        let mut planned = vec![skipped(&alone, 40, "protected: nvidia-cuda-mps-server")];
        name_the_clients(&mut planned, &alone);
        assert!(why(&planned[0]).contains("ending it ends MPS on GPU 0 (no client now)"));
    }
}
