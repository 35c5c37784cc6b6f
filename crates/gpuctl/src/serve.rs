//! `gpuctl serve`: the host service that tells a container which GPU processes are its own
//! (see `gpuctl_core::service`). One thread a connection, so a slow or silent client
//! delays no other; one shared snapshot, so a burst of clients costs one NVML read.
//! It reads only: nothing here sends a signal.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use gpuctl_core::classify::{Finding, Policy};
use gpuctl_core::exit::Exit;
use gpuctl_core::host::FactCache;
use gpuctl_core::service::caller::Caller;
use gpuctl_core::service::{self, ErrorReply, MAX_REQUEST_BYTES};
use gpuctl_core::session::{Reader, Session};
use gpuctl_core::snapshot::{Snapshot, SnapshotOptions};

use gpuctl::cli::ServeArgs;

/// A client must have sent its whole request this long after it connected.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a reply may take to be taken by a client that stopped reading.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// A snapshot answers every request that arrives this soon after it was taken: a burst of
/// clients costs one NVML read, and a client polling every 100 ms still sees each change.
const FRESH_FOR: Duration = Duration::from_millis(50);

/// Connections served at once; one more gets a one-line refusal (a flood costs threads).
const MAX_CONNECTIONS: usize = 512;

/// The fd systemd passes first (`SD_LISTEN_FDS_START`).
const LISTEN_FDS_START: i32 = 3;

pub fn run(args: &ServeArgs) -> Result<Exit> {
    // The service's own snapshots are the host's: it never asks itself.
    service::client::never_ask();
    let session = Session::open()?;
    let (listener, path) = listener(args.socket.clone())?;
    eprintln!(
        "gpuctl serve: answering on {} (reads only; never signals)",
        path.as_ref()
            .map_or("the socket systemd passed".into(), |p| p
                .display()
                .to_string())
    );
    let server = Arc::new(Server {
        latest: Mutex::new(Latest {
            reader: Reader::new(SnapshotOptions::reclaim(None))
                .keeping_facts(FactCache::refreshing_every(Duration::ZERO))
                .host_only(),
            answer: None,
        }),
        session,
        active: AtomicUsize::new(0),
    });
    if let Some(idle) = args.idle_exit {
        listener.set_nonblocking(true)?;
        let mut last = Instant::now();
        loop {
            match listener.accept() {
                Ok((stream, _)) => {
                    stream.set_nonblocking(false)?;
                    spawn(&server, stream);
                    last = Instant::now();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if server.active.load(Ordering::Relaxed) == 0 && last.elapsed() >= idle {
                        // Socket activation keeps the socket: the next client starts us again.
                        return Ok(Exit::Ok);
                    }
                    if server.active.load(Ordering::Relaxed) > 0 {
                        last = Instant::now();
                    }
                    wait_readable(listener.as_raw_fd(), Duration::from_millis(200));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(anyhow!("accept on the service socket failed: {e}")),
            }
        }
    }
    loop {
        match listener.accept() {
            Ok((stream, _)) => spawn(&server, stream),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // Out of descriptors and the like: the clients already connected go on.
            Err(e) => {
                eprintln!("gpuctl serve: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

struct Server {
    session: Session,
    latest: Mutex<Latest>,
    active: AtomicUsize,
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
        let look = reader
            .look(&self.session.gpus)
            .map_err(|e| gpuctl_core::text::escape(&e.to_string()).into_owned())?;
        let findings = look.classify(None, &Policy::default());
        let fresh = Arc::new((look.snapshot, findings));
        *answer = Some((Instant::now(), Arc::clone(&fresh)));
        Ok(fresh)
    }
}

fn spawn(server: &Arc<Server>, mut stream: UnixStream) {
    let accepted = Instant::now();
    let accepted_ticks = gpuctl_core::host::boot_clock()
        .ok()
        .map(|at| (at.as_nanos() * u128::from(procfs_ticks()) / 1_000_000_000) as u64);
    if server.active.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
        server.active.fetch_sub(1, Ordering::AcqRel);
        let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
        let _ = stream.write_all(
            ErrorReply::new("busy: too many clients at once; ask again")
                .line()
                .as_bytes(),
        );
        return;
    }
    let shared = Arc::clone(server);
    let spawned = std::thread::Builder::new()
        .name("gpuctl-serve-client".into())
        .spawn(move || {
            let reply = serve(&shared, &stream, accepted, accepted_ticks);
            let _ = stream.set_write_timeout(Some(REPLY_TIMEOUT));
            let _ = stream.write_all(reply.as_bytes());
            let _ = stream.shutdown(std::net::Shutdown::Both);
            shared.active.fetch_sub(1, Ordering::AcqRel);
        });
    if spawned.is_err() {
        // The client's connection went with the closure; its count is given back here.
        server.active.fetch_sub(1, Ordering::AcqRel);
        eprintln!("gpuctl serve: cannot start a thread for a client");
    }
}

/// The reply line for one connection.
fn serve(
    server: &Server,
    stream: &UnixStream,
    accepted: Instant,
    accepted_ticks: Option<u64>,
) -> String {
    let request = match read_request(stream, accepted) {
        Ok(bytes) => bytes,
        Err(error) => return ErrorReply::new(error).line(),
    };
    if let Err(error) = service::parse_request(&request) {
        return ErrorReply::new(error).line();
    }
    // Whom it is for is the kernel's word, never the request's.
    let (pid, uid) = match peer_credentials(stream) {
        Ok(creds) => creds,
        Err(e) => return ErrorReply::new(format!("cannot tell who is asking: {e}")).line(),
    };
    let caller = match Caller::read(Path::new("/proc"), pid, uid) {
        Ok(caller) => caller,
        Err(e) => {
            return ErrorReply::new(format!("cannot read the caller (pid {pid}): {e}")).line();
        }
    };
    // The connecting process exited and its pid went to a newer one: answer nobody.
    if let (Some(started), Some(accepted)) = (caller.start_ticks, accepted_ticks)
        && started > accepted
    {
        return ErrorReply::new(format!(
            "the caller (pid {pid}) exited before it was answered"
        ))
        .line();
    }
    let host = match server.host_view() {
        Ok(host) => host,
        Err(error) => return ErrorReply::new(error).line(),
    };
    let reply = gpuctl_core::serve::answer(&host.0, &host.1, &caller);
    match serde_json::to_string(&reply) {
        Ok(mut line) => {
            line.push('\n');
            line
        }
        Err(e) => ErrorReply::new(format!("cannot write the reply: {e}")).line(),
    }
}

/// The request's bytes: up to its first newline or the client's end of writing, within
/// [`REQUEST_TIMEOUT`] of the connection and [`MAX_REQUEST_BYTES`].
fn read_request(mut stream: &UnixStream, accepted: Instant) -> Result<Vec<u8>, String> {
    let mut request = Vec::with_capacity(256);
    let mut chunk = [0u8; 1024];
    loop {
        let left = REQUEST_TIMEOUT.saturating_sub(accepted.elapsed());
        if left.is_zero() {
            return Err(no_request_in_time());
        }
        stream
            .set_read_timeout(Some(left))
            .map_err(|e| format!("cannot read the request: {e}"))?;
        let n = match stream.read(&mut chunk) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(no_request_in_time());
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("cannot read the request: {e}")),
        };
        let read = &chunk[..n];
        let end = read.iter().position(|&b| b == b'\n');
        request.extend_from_slice(&read[..end.unwrap_or(n)]);
        if request.len() > MAX_REQUEST_BYTES {
            return Err(service::too_long());
        }
        if n == 0 || end.is_some() {
            return Ok(request);
        }
    }
}

fn no_request_in_time() -> String {
    format!(
        "no request within {} s: send one JSON line",
        REQUEST_TIMEOUT.as_secs()
    )
}

/// The connecting process's pid and uid, as the kernel recorded them at connect(2), in
/// this service's namespaces.
fn peer_credentials(stream: &UnixStream) -> io::Result<(u32, u32)> {
    let mut creds = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED writes one ucred into the struct we own, whose size is passed.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut creds as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // A peer outside this service's PID namespace reads as pid 0.
    let pid = u32::try_from(creds.pid)
        .ok()
        .filter(|&pid| pid > 0)
        .ok_or_else(|| io::Error::other("the caller is outside this service's PID namespace"))?;
    Ok((pid, creds.uid))
}

/// The socket systemd passed (LISTEN_PID is this process, LISTEN_FDS at least 1), else
/// one bound at `explicit`, GPUCTL_SOCKET or the default path. The path is `None` for a
/// passed socket.
fn listener(explicit: Option<PathBuf>) -> Result<(UnixListener, Option<PathBuf>)> {
    if let Some(listener) = inherited()? {
        return Ok((listener, None));
    }
    let path = service::socket_path(explicit);
    // /run/gpuctl, where systemd would have made it: readable by all, so containers that
    // mount it reach the socket.
    if let Some(dir) = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty() && !d.exists())
    {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
            .with_context(|| format!("cannot open up {}", dir.display()))?;
    }
    if let Ok(meta) = std::fs::symlink_metadata(&path) {
        if !meta.file_type().is_socket() {
            return Err(crate::Usage(format!(
                "{} exists and is not a socket: not replacing it",
                path.display()
            ))
            .into());
        }
        if UnixStream::connect(&path).is_ok() {
            return Err(crate::Usage(format!(
                "another service already answers on {}",
                path.display()
            ))
            .into());
        }
        // Left by a service that ended: nobody listens on it.
        std::fs::remove_file(&path)
            .with_context(|| format!("cannot remove the stale socket {}", path.display()))?;
    }
    let listener = UnixListener::bind(&path)
        .with_context(|| format!("cannot listen on {}", path.display()))?;
    // Anyone may ask: what is answered depends on who asks, as the kernel says.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))
        .with_context(|| format!("cannot open up {}", path.display()))?;
    Ok((listener, Some(path)))
}

/// The first socket systemd passed this process, if it passed any.
fn inherited() -> Result<Option<UnixListener>> {
    let for_us = std::env::var("LISTEN_PID")
        .ok()
        .and_then(|pid| pid.parse::<u32>().ok())
        == Some(std::process::id());
    let count = std::env::var("LISTEN_FDS")
        .ok()
        .and_then(|n| n.parse::<i32>().ok())
        .unwrap_or(0);
    if !for_us || count < 1 {
        return Ok(None);
    }
    // SAFETY: removing variables before any other thread of ours runs (this is the
    // service's start), so nothing reads the environment meanwhile.
    unsafe {
        std::env::remove_var("LISTEN_PID");
        std::env::remove_var("LISTEN_FDS");
        std::env::remove_var("LISTEN_FDNAMES");
    }
    let fd = LISTEN_FDS_START;
    // A passed descriptor must be a listening Unix stream socket.
    // SAFETY: fstat writes into a stat we own.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd 3 is ours by the LISTEN_FDS protocol; stat is a valid out-pointer.
    if unsafe { libc::fstat(fd, &mut stat) } != 0 || stat.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(crate::Usage(
            "LISTEN_FDS is set for this process but fd 3 is not a socket".into(),
        )
        .into());
    }
    // SAFETY: fd 3 is a socket systemd handed to this process alone; we take ownership.
    let listener = unsafe { UnixListener::from_raw_fd(fd) };
    // Close-on-exec, as every other descriptor of ours.
    // SAFETY: fcntl on a descriptor we own.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    Ok(Some(listener))
}

/// Clock ticks a second (USER_HZ), the unit of a process's start time.
fn procfs_ticks() -> u64 {
    // SAFETY: sysconf reads a constant of the system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(hz).ok().filter(|&hz| hz > 0).unwrap_or(100)
}

/// Waits until `fd` is readable or `limit` passes.
fn wait_readable(fd: i32, limit: Duration) {
    let mut poll = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd that we own.
    unsafe { libc::poll(&mut poll, 1, limit.as_millis() as i32) };
}
