//! CUDA MPS on the reclaim road: what ending the server would do, said where it is skipped.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::act::{Ended, Identity};
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

/// Where CUDA looks for the control daemon when `CUDA_MPS_PIPE_DIRECTORY` is not set, and
/// where NVIDIA's Kubernetes device plugin puts it.
const DEFAULT_PIPE_DIRS: &[&str] = &["/tmp/nvidia-mps", "/run/nvidia/mps"];
const PIPE_DIR_VAR: &[u8] = b"CUDA_MPS_PIPE_DIRECTORY=";

/// A running NVIDIA MPS control daemon, verified by identity, and its pipe directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlDaemon {
    pub pid: u32,
    pub pipe_dir: std::path::PathBuf,
}

/// The value of `CUDA_MPS_PIPE_DIRECTORY` in process `pid`'s environment (read bounded).
fn pipe_dir_of(pid: u32) -> Option<std::path::PathBuf> {
    use std::io::Read;
    use std::os::unix::ffi::OsStrExt;
    let mut environ = Vec::new();
    std::fs::File::open(format!("/proc/{pid}/environ"))
        .ok()?
        .take(256 * 1024)
        .read_to_end(&mut environ)
        .ok()?;
    environ
        .split(|&b| b == 0)
        .find_map(|var| var.strip_prefix(PIPE_DIR_VAR))
        .filter(|dir| dir.starts_with(b"/"))
        .map(|dir| std::path::PathBuf::from(std::ffi::OsStr::from_bytes(dir)))
}

/// Whether `pid` is NVIDIA's control daemon (by identity, as protection judges it).
fn is_control_daemon(pid: u32) -> bool {
    let Ok(comm) = std::fs::read_to_string(format!("/proc/{pid}/comm")) else {
        return false;
    };
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let argv0 = cmdline.split(|&b| b == 0).next().unwrap_or_default();
    let argv0 = String::from_utf8_lossy(argv0);
    let argv0 = argv0.rsplit('/').next().unwrap_or_default();
    let claimant = crate::protect::Claimant {
        pid,
        uid: None,
        comm: Some(comm.trim_end()),
        argv0: Some(argv0),
    };
    matches!(
        crate::protect::Protection::built_in().judge(&claimant),
        crate::protect::Claim::Genuine(name) if name == crate::mps::CONTROL
    )
}

impl ControlDaemon {
    /// The daemon the client `client` of the server `server` reaches: the server's parent
    /// where that is the daemon (it starts its servers), else the daemon whose pipe
    /// directory is the client's (`CUDA_MPS_PIPE_DIRECTORY`, else CUDA's default).
    pub fn of(server_ppid: Option<u32>, client: u32) -> Option<ControlDaemon> {
        let daemon = |pid: u32| {
            let pipe_dir = pipe_dir_of(pid).or_else(|| {
                DEFAULT_PIPE_DIRS
                    .iter()
                    .map(std::path::PathBuf::from)
                    .find(|dir| dir.join("control").exists())
            })?;
            Some(ControlDaemon { pid, pipe_dir })
        };
        if let Some(parent) = server_ppid.filter(|&pid| pid > 1 && is_control_daemon(pid)) {
            return daemon(parent);
        }
        let wanted = pipe_dir_of(client).unwrap_or_else(|| DEFAULT_PIPE_DIRS[0].into());
        std::fs::read_dir("/proc")
            .ok()?
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&pid| is_control_daemon(pid))
            .filter_map(daemon)
            .find(|found| found.pipe_dir == wanted)
    }

    /// Asks the daemon to end `client` of `server` (`terminate_client`), through NVIDIA's
    /// own client: the daemon's executable, run from the file the verified process runs
    /// (`/proc/PID/exe`), with nothing of our environment but the pipe directory. `Err`: it
    /// could not be reached, or it refused, in its words.
    pub fn terminate_client(&self, server: u32, client: u32) -> Result<(), String> {
        use std::io::Write;
        use std::process::{Command, Stdio};
        let mut child = Command::new(format!("/proc/{}/exe", self.pid))
            .env_clear()
            .env("CUDA_MPS_PIPE_DIRECTORY", &self.pipe_dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run the control daemon's client: {e}"))?;
        let command = format!("terminate_client {server} {client}\n");
        let sent = child
            .stdin
            .take()
            .map(|mut stdin| stdin.write_all(command.as_bytes()));
        let waited = wait_bounded(&mut child, std::time::Duration::from_secs(5));
        let said = |out: Option<std::process::ChildStdout>| {
            let mut text = String::new();
            if let Some(mut out) = out {
                let _ = std::io::Read::read_to_string(&mut out, &mut text);
            }
            text
        };
        let status = waited.ok_or("the control daemon did not answer within 5s")?;
        if !matches!(sent, Some(Ok(()))) {
            return Err("the control daemon's client took no command".into());
        }
        let answer = said(child.stdout.take()) + &said_err(child.stderr.take());
        let answer = crate::text::escape(answer.trim()).replace("\\n", "; ");
        let refused = ["not found", "cannot", "error", "invalid", "fail", "denied"]
            .iter()
            .any(|word| answer.to_ascii_lowercase().contains(word));
        match (status.success(), refused) {
            (true, false) => Ok(()),
            _ if answer.is_empty() => Err(format!("the control daemon's client {status}")),
            _ => Err(answer),
        }
    }
}

fn said_err(err: Option<std::process::ChildStderr>) -> String {
    let mut text = String::new();
    if let Some(mut err) = err {
        let _ = std::io::Read::read_to_string(&mut err, &mut text);
    }
    text
}

/// Waits for `child` at most `limit`; past it the child is killed (ours, unreaped: its pid
/// is still ours) and `None` returned.
fn wait_bounded(
    child: &mut std::process::Child,
    limit: std::time::Duration,
) -> Option<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

/// What asking the daemon came to for one client: ended by it, or why signals follow.
pub(super) enum Asked {
    Ended(Ended),
    Signal { why: String },
}

/// Ends each MPS client among `planned` (index, identity) the supported way, through its
/// control daemon's `terminate_client`, waiting at most `within` for it to exit. Processes
/// that are no MPS client are not in the answer; a client the daemon did not end is, with
/// why signals follow.
pub(super) fn end_clients(
    planned: &[(usize, Identity)],
    before: &Snapshot,
    within: Duration,
) -> HashMap<usize, Asked> {
    planned
        .iter()
        .filter_map(|&(index, identity)| {
            let server = server_of_client(before, identity.pid)?;
            Some((index, ask_daemon(server, identity, within)))
        })
        .collect()
}

/// The server (pid, parent) of the GPU where `client` is an MPS client.
fn server_of_client(snapshot: &Snapshot, client: u32) -> Option<(u32, Option<u32>)> {
    snapshot
        .devices
        .iter()
        .filter(|gpu| {
            gpu.processes
                .iter()
                .any(|p| p.pid == client && p.mps == Some(Role::Client))
        })
        .find_map(|gpu| gpu.processes.iter().find(|p| p.mps == Some(Role::Server)))
        .map(|server| (server.pid, server.host.ppid))
}

fn ask_daemon(server: (u32, Option<u32>), client: Identity, within: Duration) -> Asked {
    let Some(daemon) = ControlDaemon::of(server.1, client.pid) else {
        return Asked::Signal {
            why: format!("no MPS control daemon found for server {}", server.0),
        };
    };
    let asked = Instant::now();
    if let Err(why) = daemon.terminate_client(server.0, client.pid) {
        return Asked::Signal {
            why: format!(
                "the MPS control daemon (pid {}) did not end it: {why}",
                daemon.pid
            ),
        };
    }
    while asked.elapsed() < within {
        if !same_process_alive(client) {
            return Asked::Ended(Ended::Exited {
                signal: "terminate_client".into(),
                after_ms: asked.elapsed().as_millis() as u64,
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Asked::Signal {
        why: format!(
            "still running {} after the MPS control daemon's terminate_client",
            humantime::format_duration(within)
        ),
    }
}

/// Whether the process `identity` names still runs (and is not a zombie).
fn same_process_alive(identity: Identity) -> bool {
    std::fs::read(format!("/proc/{}/stat", identity.pid))
        .ok()
        .and_then(|bytes| crate::sys::procfile::StatLine::parse(&bytes))
        .is_some_and(|stat| stat.starttime == identity.start_ticks && stat.state != 'Z')
}

/// How a client that signals ended after the daemon did not end it says so.
pub(super) fn said_signalled(ended: Ended, why: &str) -> Ended {
    match ended {
        Ended::Exited { signal, after_ms } => Ended::Exited {
            signal: format!("{signal}, as {why}"),
            after_ms,
        },
        Ended::Failed { error } => Ended::Failed {
            error: format!("{error} ({why})"),
        },
        other => other,
    }
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
