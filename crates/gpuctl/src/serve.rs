//! `gpuctl serve`: the host service that tells a container which GPU processes are its own
//! (see `gpuctl_core::service`). One reception thread accepts and reads every request
//! (`reception`: who connected is pinned at accept, and each uid and container gets a fair
//! share); a worker thread answers each complete one, so a slow client delays no other; one
//! shared snapshot, so a burst of clients costs one NVML read. The socket is made safely
//! (`socket`). It signals nothing; the one thing it writes is the lease files of `gpuctl run`
//! that only root may make, on any user's request, for the GPUs it sees and nothing else.

mod reception;
mod socket;

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use gpuctl_core::classify::{Finding, Policy};
use gpuctl_core::exit::Exit;
use gpuctl_core::host::FactCache;
use gpuctl_core::service::{self, ErrorReply};
use gpuctl_core::session::{Reader, Session};
use gpuctl_core::snapshot::{Snapshot, SnapshotOptions};

use gpuctl::cli::ServeArgs;

use reception::{Ready, Shares};

/// How long a reply may take to be taken by a client that stopped reading.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// A snapshot answers every request that arrives this soon after it was taken: a burst of
/// clients costs one NVML read, and a client polling every 100 ms still sees each change.
const FRESH_FOR: Duration = Duration::from_millis(50);

pub fn run(args: &ServeArgs) -> Result<Exit> {
    // The service's own snapshots are the host's: it never asks itself.
    service::client::never_ask();
    let loaded = gpuctl_core::config::load()?;
    // The socket first, while this process has one thread (its mode comes from the umask),
    // and its reception at once: connections waiting while NVML opens (socket activation
    // starts the service on the first one) have who made them pinned before anything else.
    let (listener, made) = socket::listener(args.socket.clone())?;
    let shares = Arc::new(Shares::default());
    let (workers, ready) = std::sync::mpsc::channel::<Ready>();
    let reception = {
        let shares = Arc::clone(&shares);
        let idle = args.idle_exit;
        std::thread::Builder::new()
            .name("gpuctl-serve-reception".into())
            .spawn(move || reception::run(&listener, &shares, &workers, idle))?
    };
    let session = match Session::with(loaded) {
        Ok(session) => session,
        Err(error) => {
            if let Some(made) = &made {
                made.remove();
            }
            return Err(error.into());
        }
    };
    eprintln!(
        "gpuctl serve: answering on {} (reads only; never signals)",
        made.as_ref()
            .map_or("the socket systemd passed".into(), |made| {
                gpuctl_core::text::escape(&made.path.display().to_string()).into_owned()
            })
    );
    let server = Arc::new(Server {
        latest: Mutex::new(Latest {
            reader: Reader::new(SnapshotOptions::reclaim(None))
                .naming_pods(&session.loaded().kubernetes())
                .keeping_facts(FactCache::refreshing_every(Duration::ZERO))
                .host_only(),
            answer: None,
        }),
        session,
    });
    // Ends when the reception does (idle under socket activation).
    for request in ready {
        spawn(&server, request);
    }
    match reception.join() {
        Ok(Ok(())) => Ok(Exit::Ok),
        Ok(Err(error)) => Err(anyhow!("accept on the service socket failed: {error}")),
        Err(_) => Err(anyhow!("the service's reception stopped")),
    }
}

struct Server {
    session: Session,
    latest: Mutex<Latest>,
}

/// The host's GPU processes and what classification found of them.
type HostView = Arc<(Snapshot, Vec<Finding>)>;

struct Latest {
    /// The host's processes, their facts kept between reads.
    reader: Reader,
    /// The last view, and when it was read.
    answer: Option<(Instant, HostView)>,
}

impl Server {
    /// The host's GPU processes and what classification finds of them: the last ones if
    /// fresh, else read now (one reader at a time; the others then share its read).
    fn host_view(&self) -> Result<HostView, String> {
        let mut latest = self
            .latest
            .lock()
            .map_err(|_| "internal error".to_string())?;
        if let Some((at, answer)) = &latest.answer
            && at.elapsed() < FRESH_FOR
        {
            return Ok(Arc::clone(answer));
        }
        let Latest { reader, answer } = &mut *latest;
        let look = self
            .session
            .look(reader)
            .map_err(|e| gpuctl_core::text::escape(&e.to_string()).into_owned())?;
        let findings = look.classify(None, &Policy::default());
        let fresh = Arc::new((look.snapshot, findings));
        *answer = Some((Instant::now(), Arc::clone(&fresh)));
        Ok(fresh)
    }
}

/// Makes the lease file of every GPU and MIG instance this service sees that has none, in
/// its own lease directory: the request names nothing, so no caller chooses a file.
fn lease_files(server: &Server) -> String {
    let host = match server.host_view() {
        Ok(host) => host,
        Err(error) => return ErrorReply::new(error).line(),
    };
    let uuids: Vec<String> = host
        .0
        .devices
        .iter()
        .flat_map(|gpu| {
            let instances = gpu.mig_devices.iter().filter_map(|mig| mig.uuid.clone());
            gpu.uuid.clone().into_iter().chain(instances)
        })
        .collect();
    let dir = match gpuctl_core::lease::LeaseDir::open() {
        Ok(dir) => dir,
        Err(error) => return ErrorReply::new(error.to_string()).line(),
    };
    let reply = service::LeaseFilesReply {
        schema: service::SCHEMA,
        lease_files: service::LeaseFilesMade {
            made: dir.provide(&uuids),
            directory: dir.path().to_path_buf(),
        },
    };
    reply_line(&reply)
}

/// Answers one complete request on a thread of its own.
fn spawn(server: &Arc<Server>, ready: Ready) {
    let server = Arc::clone(server);
    let spawned = std::thread::Builder::new()
        .name("gpuctl-serve-client".into())
        .spawn(move || {
            let reply = serve(&server, &ready);
            let mut stream = &ready.stream;
            let _ = stream.set_nonblocking(false);
            let _ = stream.set_write_timeout(Some(REPLY_TIMEOUT));
            let _ = stream.write_all(reply.as_bytes());
            let _ = stream.shutdown(std::net::Shutdown::Both);
            // Dropped here: its count is given back.
        });
    if let Err(unspawned) = spawned {
        // The connection went with the closure: closed, and its count given back.
        eprintln!("gpuctl serve: cannot start a thread for a client: {unspawned}");
    }
}

/// The reply line for one request.
fn serve(server: &Server, ready: &Ready) -> String {
    let request = match service::parse_request(&ready.request) {
        Ok(request) => request,
        Err(error) => return ErrorReply::new(error).line(),
    };
    if request.request == service::RequestKind::LeaseFiles {
        return lease_files(server);
    }
    // Whom it is for is the kernel's word, never the request's: the process that connected,
    // and only while it is still the process at its pid.
    let caller = match ready.peer.caller(Path::new("/proc")) {
        Ok(caller) => caller,
        Err(error) => return ErrorReply::new(error).line(),
    };
    let host = match server.host_view() {
        Ok(host) => host,
        Err(error) => return ErrorReply::new(error).line(),
    };
    let reply = gpuctl_core::serve::answer(&host.0, &host.1, &caller);
    reply_line(&reply)
}

/// A reply as its one line, newline included.
fn reply_line(reply: &impl serde::Serialize) -> String {
    match serde_json::to_string(reply) {
        Ok(mut line) => {
            line.push('\n');
            line
        }
        Err(e) => ErrorReply::new(format!("cannot write the reply: {e}")).line(),
    }
}
