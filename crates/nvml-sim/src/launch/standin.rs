//! The stand-in process: what a scenario's `spawn` entry runs. The launcher starts itself
//! again with `NVML_SIM_STANDIN=1`, under the argv the scenario gave, and `main` hands over
//! to [`live`] before any argument is read.

use std::ffi::OsStr;
use std::path::Path;

pub(super) const STANDIN_ENV: &str = "NVML_SIM_STANDIN";
pub(super) const WORKERS_ENV: &str = "NVML_SIM_STANDIN_WORKERS";
/// Set for a `crashed = true` stand-in: the descriptor of its lifeline, a pipe whose write
/// end only the launcher holds. Its workers, which outlive it, live until that pipe closes.
pub(super) const LIFELINE_ENV: &str = "NVML_SIM_STANDIN_LIFELINE";
/// Test hook: the stand-in's main thread exits while another thread lives on (a zombie
/// leader that still holds its GPU context).
const ZOMBIE_LEADER_ENV: &str = "NVML_SIM_STANDIN_ZOMBIE_LEADER";

/// Whether this process was started as a stand-in.
pub fn requested() -> bool {
    std::env::var_os(STANDIN_ENV).is_some_and(|v| v == "1")
}

/// The stand-in: names itself after argv[0], forks its workers, reports their pids on
/// stdout, then sleeps until a signal ends it.
pub fn live() -> ! {
    let comm = comm_name();
    let workers: u32 = std::env::var(WORKERS_ENV)
        .ok()
        .and_then(|w| w.parse().ok())
        .unwrap_or(0);
    let lifeline: Option<libc::c_int> = std::env::var(LIFELINE_ENV)
        .ok()
        .and_then(|fd| fd.parse().ok());
    // SAFETY: plain libc calls; the process is single-threaded here, so fork is sound, and
    // the children only make async-signal-safe calls.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, comm.as_ptr() as libc::c_ulong, 0, 0, 0);
        let devnull = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        let mut pids = String::new();
        for _ in 0..workers {
            match libc::fork() {
                0 => match lifeline {
                    Some(fd) => crashed_worker(fd, devnull),
                    None => worker(devnull),
                },
                pid if pid > 0 => pids.push_str(&format!("{pid}\n")),
                _ => {}
            }
        }
        let _ = std::io::Write::write_all(&mut std::io::stdout(), pids.as_bytes());
        let _ = std::io::Write::flush(&mut std::io::stdout());
        if lifeline.is_some() {
            // The crash: the run's main process is gone, its workers stay.
            libc::_exit(1);
        }
        libc::dup2(devnull, 1);
        if std::env::var_os(ZOMBIE_LEADER_ENV).is_some_and(|v| v == "1") {
            std::thread::spawn(|| {
                loop {
                    libc::pause();
                }
            });
            // Exit only the main thread, without unwinding (pthread_exit would unwind
            // through Rust frames).
            libc::syscall(libc::SYS_exit, 0);
        }
        loop {
            libc::pause();
        }
    }
}

/// argv[0]'s file name as a thread name: at most 15 bytes, NULs replaced.
fn comm_name() -> [u8; 16] {
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let base = Path::new(&argv0)
        .file_name()
        .unwrap_or(OsStr::new("standin"))
        .as_encoded_bytes();
    let mut comm = [0u8; 16];
    for (c, b) in comm.iter_mut().zip(base.iter().take(15)) {
        *c = if *b == 0 { b'?' } else { *b };
    }
    comm
}

/// A crashed run's worker: its parent exits at once, so a parent-death signal would end it
/// with the crash; it lives until the launcher ends (the lifeline's write end closes) or a
/// signal ends it.
fn crashed_worker(lifeline: libc::c_int, devnull: libc::c_int) -> ! {
    // SAFETY: async-signal-safe calls only, in a child just forked.
    unsafe {
        libc::dup2(devnull, 1);
        let mut byte = 0u8;
        loop {
            let n = libc::read(lifeline, (&raw mut byte).cast(), 1);
            if n == 0 || (n < 0 && *libc::__errno_location() != libc::EINTR) {
                libc::_exit(0);
            }
        }
    }
}

/// A live run's worker: ends with the stand-in, or by a signal.
fn worker(devnull: libc::c_int) -> ! {
    // SAFETY: async-signal-safe calls only, in a child just forked.
    unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        );
        if libc::getppid() == 1 {
            libc::_exit(0);
        }
        libc::dup2(devnull, 1);
        loop {
            libc::pause();
        }
    }
}
