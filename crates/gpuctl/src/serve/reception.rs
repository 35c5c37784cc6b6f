//! The service's reception: one thread that accepts every connection, pins who connected
//! (`Peer`, before anything else: under socket activation, before NVML is opened), reads each
//! request without a thread of its own (poll(2) over all of them), and hands a complete
//! request to a worker only within its share.
//!
//! A connection counts from its accept until its reply is written. Besides the global cap
//! ([`MAX_CONNECTIONS`]), each host uid other than root and each PID namespace other than the
//! host's holds at most [`SHARE`] of them: one user, or one container, cannot crowd out the
//! rest. A connection over its share (or over the cap) is still read, then answered "busy";
//! a silent one is dropped at its deadline with the one-line error, as any is. Connections
//! are held as descriptors only, up to [`MAX_HELD`]; past that, the oldest connection of
//! whoever holds the most is answered "busy" unread to make room.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpuctl_core::service::caller::{INIT_PID_NS_INODE, Peer};
use gpuctl_core::service::{self, ErrorReply, MAX_REQUEST_BYTES};

/// A client must have sent its whole request this long after it connected.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

/// Connections being answered at once, over everyone.
pub const MAX_CONNECTIONS: usize = 512;

/// Connections one uid (other than root) or one PID namespace (other than the host's) may
/// hold at once: well below [`MAX_CONNECTIONS`], so sixteen others always find room.
pub const SHARE: usize = 32;

/// Connections held at once, counted or not (a descriptor and a small buffer each).
const MAX_HELD: usize = 8192;

/// Accepts taken in one go before the held connections are looked at again.
const ACCEPT_BATCH: usize = 256;

/// Whose share a connection counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Holder {
    Uid(u32),
    Namespace(u64),
}

/// The connections counted now, in all and per holder.
#[derive(Default)]
pub struct Shares {
    total: AtomicUsize,
    held: Mutex<HashMap<Holder, usize>>,
}

impl Shares {
    /// Counts a connection of `holders` if the cap and each of their shares allow.
    fn take(&self, holders: &[Holder]) -> bool {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if self.total.load(Ordering::Acquire) >= MAX_CONNECTIONS
            || holders
                .iter()
                .any(|h| held.get(h).copied().unwrap_or(0) >= SHARE)
        {
            return false;
        }
        for holder in holders {
            *held.entry(*holder).or_insert(0) += 1;
        }
        self.total.fetch_add(1, Ordering::AcqRel);
        true
    }

    /// Gives back what [`Shares::take`] counted.
    fn give_back(&self, holders: &[Holder]) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        for holder in holders {
            if let Some(count) = held.get_mut(holder) {
                *count -= 1;
                if *count == 0 {
                    held.remove(holder);
                }
            }
        }
        self.total.fetch_sub(1, Ordering::AcqRel);
    }

    /// Connections counted now.
    pub fn active(&self) -> usize {
        self.total.load(Ordering::Acquire)
    }
}

/// A complete request within its share, for a worker. Its count is given back when it is
/// dropped: once answered (or if no worker could take it).
pub struct Ready {
    pub stream: UnixStream,
    pub request: Vec<u8>,
    pub peer: Peer,
    holders: Vec<Holder>,
    shares: Arc<Shares>,
}

impl Drop for Ready {
    fn drop(&mut self) {
        self.shares.give_back(&self.holders);
    }
}

/// A connection whose request is still being read.
struct Pending {
    stream: UnixStream,
    accepted: Instant,
    request: Vec<u8>,
    /// `Err`: who connected could not be told (the reply says why).
    peer: Result<Peer, String>,
    holders: Vec<Holder>,
    /// Counted in its shares: answered by a worker; else "busy" once read.
    counted: bool,
}

/// Accepts and reads until `idle` passes with nothing to do (socket activation), or for
/// ever. Complete requests within their share go to `workers`.
pub fn run(
    listener: &UnixListener,
    shares: &Arc<Shares>,
    workers: &Sender<Ready>,
    idle: Option<Duration>,
) -> io::Result<()> {
    listener.set_nonblocking(true)?;
    let mut pending: Vec<Pending> = Vec::new();
    let mut last_busy = Instant::now();
    loop {
        let mut polls = Vec::with_capacity(pending.len() + 1);
        polls.push(libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        polls.extend(pending.iter().map(|p| libc::pollfd {
            fd: p.stream.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }));
        let next_deadline = pending
            .iter()
            .map(|p| (p.accepted + REQUEST_TIMEOUT).saturating_duration_since(Instant::now()))
            .min()
            .unwrap_or(Duration::from_millis(200))
            .min(Duration::from_millis(200));
        let wait = i32::try_from(next_deadline.as_millis().max(1)).unwrap_or(200);
        // SAFETY: poll(2) over a vector of pollfds we own, its length passed.
        let rc = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, wait) };
        if rc < 0 {
            let error = io::Error::last_os_error();
            if error.kind() != io::ErrorKind::Interrupted {
                return Err(error);
            }
            continue;
        }
        // The held connections first (their readiness is by position), then new ones.
        let mut keep = Vec::with_capacity(pending.len());
        for (mut held, poll) in pending.into_iter().zip(&polls[1..]) {
            if poll.revents != 0 {
                match read_some(&mut held) {
                    Reading::More => {}
                    Reading::Done => {
                        finish(held, shares, workers);
                        continue;
                    }
                    Reading::Failed(error) => {
                        refuse(held, shares, &error);
                        continue;
                    }
                }
            }
            if held.accepted.elapsed() >= REQUEST_TIMEOUT {
                refuse(held, shares, &no_request_in_time());
                continue;
            }
            keep.push(held);
        }
        pending = keep;
        if polls[0].revents != 0 {
            accept_some(listener, shares, &mut pending)?;
        }
        if !pending.is_empty() || shares.active() > 0 {
            last_busy = Instant::now();
        } else if idle.is_some_and(|idle| last_busy.elapsed() >= idle) {
            // Socket activation keeps the socket: the next client starts us again.
            return Ok(());
        }
    }
}

fn accept_some(
    listener: &UnixListener,
    shares: &Shares,
    pending: &mut Vec<Pending>,
) -> io::Result<()> {
    for _ in 0..ACCEPT_BATCH {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // Out of descriptors and the like: the clients already connected go on.
            Err(e) => {
                eprintln!("gpuctl serve: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(20));
                return Ok(());
            }
        };
        // Who connected, pinned now, before anything else. One already gone counts against
        // no share: it is read and answered why, as any other refusal.
        let peer = Peer::of(&stream).map_err(|e| format!("cannot tell who is asking: {e}"));
        let (peer, holders) = match peer.map(|peer| (holders_of(&peer), peer)) {
            Ok((Some(holders), peer)) => (Ok(peer), holders),
            Ok((None, peer)) => (
                Err(format!(
                    "the caller (pid {}) exited before it was answered",
                    peer.pid
                )),
                Vec::new(),
            ),
            Err(error) => (Err(error), Vec::new()),
        };
        let counted = peer.is_ok() && shares.take(&holders);
        if stream.set_nonblocking(true).is_err() {
            if counted {
                shares.give_back(&holders);
            }
            continue;
        }
        if pending.len() >= MAX_HELD {
            make_room(pending, shares);
        }
        pending.push(Pending {
            stream,
            accepted: Instant::now(),
            request: Vec::with_capacity(128),
            peer,
            holders,
            counted,
        });
    }
    Ok(())
}

/// Whose shares a peer counts against: its uid unless root, its PID namespace unless the
/// host's. `None` where its process is gone already.
fn holders_of(peer: &Peer) -> Option<Vec<Holder>> {
    let mut holders = Vec::with_capacity(2);
    if peer.uid != 0 {
        holders.push(Holder::Uid(peer.uid));
    }
    let namespace = std::fs::metadata(format!("/proc/{}/ns/pid", peer.pid))
        .ok()?
        .ino();
    if namespace != INIT_PID_NS_INODE {
        holders.push(Holder::Namespace(namespace));
    }
    peer.alive().then_some(holders)
}

/// Answers "busy", unread, the oldest held connection of whoever holds the most.
fn make_room(pending: &mut Vec<Pending>, shares: &Shares) {
    let mut count: HashMap<Option<Holder>, usize> = HashMap::new();
    for held in pending.iter() {
        *count.entry(held.holders.first().copied()).or_insert(0) += 1;
    }
    let Some((most, _)) = count.into_iter().max_by_key(|(_, n)| *n) else {
        return;
    };
    if let Some(at) = pending
        .iter()
        .position(|held| held.holders.first().copied() == most)
    {
        let held = pending.remove(at);
        refuse(held, shares, busy());
    }
}

enum Reading {
    More,
    Done,
    Failed(String),
}

/// Reads what a held connection has sent: its request is up to its first newline or its end
/// of writing, within [`MAX_REQUEST_BYTES`].
fn read_some(held: &mut Pending) -> Reading {
    let mut chunk = [0u8; 1024];
    loop {
        let n = match held.stream.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Reading::More,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Reading::Failed(format!("cannot read the request: {e}")),
        };
        let read = &chunk[..n];
        let end = read.iter().position(|&b| b == b'\n');
        held.request.extend_from_slice(&read[..end.unwrap_or(n)]);
        if held.request.len() > MAX_REQUEST_BYTES {
            return Reading::Failed(service::too_long());
        }
        if n == 0 || end.is_some() {
            return Reading::Done;
        }
    }
}

/// A complete request: to a worker within its share, else "busy" (or why who asked could not
/// be told).
fn finish(held: Pending, shares: &Arc<Shares>, workers: &Sender<Ready>) {
    let peer = match held.peer {
        Ok(peer) if held.counted => peer,
        Ok(_) => return refuse_unpinned(held.stream, busy()),
        Err(ref error) => {
            let error = error.clone();
            return refuse_unpinned(held.stream, &error);
        }
    };
    // Unsent (the service is ending): dropped, its count given back.
    let _ = workers.send(Ready {
        stream: held.stream,
        request: held.request,
        peer,
        holders: held.holders,
        shares: Arc::clone(shares),
    });
}

/// Answers a held connection with one error line and closes it, giving back its count.
fn refuse(held: Pending, shares: &Shares, error: &str) {
    if held.counted {
        shares.give_back(&held.holders);
    }
    refuse_unpinned(held.stream, error);
}

fn refuse_unpinned(mut stream: UnixStream, error: &str) {
    // Non-blocking: a line this short fits a socket's buffer; a client that filled it gets
    // nothing, and nobody waits on it.
    let _ = stream.set_nonblocking(true);
    let _ = stream.write_all(ErrorReply::new(error).line().as_bytes());
    // What the client sent and was not read is taken first: a Unix socket closed with
    // unread data resets its peer, which would then never see the line.
    let mut sink = [0u8; 4096];
    for _ in 0..16 {
        match stream.read(&mut sink) {
            Ok(n) if n > 0 => {}
            _ => break,
        }
    }
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

fn busy() -> &'static str {
    "busy: too many clients at once (of yours, or in all); ask again"
}

fn no_request_in_time() -> String {
    format!(
        "no request within {} s: send one JSON line",
        REQUEST_TIMEOUT.as_secs()
    )
}
