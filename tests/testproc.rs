//! A stand-in GPU process for end-to-end tests. Modes (env GPUCTL_TESTPROC_MODE, so that the
//! command line is exactly what the test gave):
//!   sleep             sleep until killed (default)
//!   zombie-leader     the main thread exits while a second thread lives on, so /proc shows the
//!                     leader as a zombie while the process still holds its (simulated) context;
//!                     with GPUCTL_TESTPROC_ZOMBIE_ON_LINE=1, only once a line is read from
//!                     stdin (a healthy process that turns zombie while watched)
//!   ignore-term       ignores SIGTERM, then sleeps: only SIGKILL ends it
//!   run-with-workers  a training run: starts GPUCTL_TESTPROC_WORKERS (default 1) workers, in
//!                     its own process group and with its own argv, in mode
//!                     GPUCTL_TESTPROC_WORKER_MODE (default sleep). They do not die with it (no
//!                     PDEATHSIG), as DataLoader workers of a crashed run do not. Once every
//!                     worker is set up, prints their pids one per line on stdout, then sleeps
//!   launch-and-exit   as run-with-workers, but exits once the pids are printed: a launcher
//!                     script that started a background job
//! Every mode first sets the kernel's command name (comm) to the basename of argv[0], as
//! interpreters and nvml-sim's stand-ins do, so comm and argv[0] agree. A mode that runs a
//! worker prints "ready" on stdout once set up when GPUCTL_TESTPROC_READY=1 (its launcher sets
//! that and waits for the line).
//! With GPUCTL_TESTPROC_OPEN=PATH[:PATH...] it first opens those files and holds them open
//! (a process holding a GPU's device file).
//! Tests give it a realistic argv; the arguments are not read.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

fn main() {
    set_comm_from_argv0();
    if let Some(paths) = std::env::var_os("GPUCTL_TESTPROC_OPEN") {
        for path in std::env::split_paths(&paths) {
            let file = std::fs::File::open(&path)
                .unwrap_or_else(|e| panic!("testproc: cannot open {}: {e}", path.display()));
            // Held until the process ends, as a driver client holds its device files.
            std::mem::forget(file);
        }
    }
    let mode = std::env::var("GPUCTL_TESTPROC_MODE").unwrap_or_default();
    match mode.as_str() {
        "zombie-leader" => {
            std::thread::spawn(|| sleep_forever());
            if std::env::var_os("GPUCTL_TESTPROC_ZOMBIE_ON_LINE").is_some_and(|v| v == "1") {
                let mut line = String::new();
                let _ = std::io::stdin().read_line(&mut line);
            } else {
                std::thread::sleep(Duration::from_millis(50));
            }
            // SYS_exit ends only the calling thread (exit(3) would end the whole group).
            // SAFETY: the raw exit(2) never returns, so nothing on this thread's stack is
            // used again; the sleeping thread borrows nothing from it, and the destructors
            // skipped only leak.
            unsafe { libc::syscall(libc::SYS_exit, 0) };
            unreachable!("SYS_exit returned");
        }
        "ignore-term" => {
            // SAFETY: installing SIG_IGN for one signal, before any other thread exists.
            unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
            ready_then_sleep()
        }
        "run-with-workers" | "launch-and-exit" => {
            start_workers();
            if mode == "launch-and-exit" {
                std::process::exit(0);
            }
            sleep_forever()
        }
        _ => ready_then_sleep(),
    }
}

/// prctl(PR_SET_NAME, basename(argv[0])), or GPUCTL_TESTPROC_COMM when set (a process
/// naming itself): the kernel keeps the first 15 bytes.
fn set_comm_from_argv0() {
    let Some(argv0) =
        std::env::var_os("GPUCTL_TESTPROC_COMM").or_else(|| std::env::args_os().next())
    else {
        return;
    };
    let bytes = std::os::unix::ffi::OsStrExt::as_bytes(argv0.as_os_str());
    let base = bytes.rsplit(|&b| b == b'/').next().unwrap_or(bytes);
    let mut name = [0u8; 16];
    let len = base.len().min(15);
    name[..len].copy_from_slice(&base[..len]);
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr() as libc::c_ulong, 0, 0, 0) };
}

/// Starts the workers with this process's own argv, waits until each said "ready", and
/// prints their pids.
fn start_workers() {
    let count: usize = std::env::var("GPUCTL_TESTPROC_WORKERS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    let worker_mode =
        std::env::var("GPUCTL_TESTPROC_WORKER_MODE").unwrap_or_else(|_| "sleep".into());
    let mut args = std::env::args_os();
    let argv0 = args.next().expect("argv[0]");
    let rest: Vec<_> = args.collect();
    let exe = std::env::current_exe().expect("own executable");
    let mut workers = Vec::with_capacity(count);
    for _ in 0..count {
        let child = Command::new(&exe)
            .arg0(&argv0)
            .args(&rest)
            .env("GPUCTL_TESTPROC_MODE", &worker_mode)
            .env("GPUCTL_TESTPROC_READY", "1")
            .env_remove("GPUCTL_TESTPROC_WORKERS")
            .env_remove("GPUCTL_TESTPROC_WORKER_MODE")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn worker");
        workers.push(child);
    }
    let mut out = std::io::stdout().lock();
    for worker in &mut workers {
        let mut line = String::new();
        let stdout = worker.stdout.take().expect("worker stdout");
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("worker ready line");
        assert_eq!(line.trim(), "ready", "worker {} did not start", worker.id());
        writeln!(out, "{}", worker.id()).expect("print worker pid");
    }
    out.flush().expect("flush worker pids");
}

fn ready_then_sleep() -> ! {
    if std::env::var_os("GPUCTL_TESTPROC_READY").is_some_and(|v| v == "1") {
        // A closed pipe is no reason to stop (Rust ignores SIGPIPE).
        let mut out = std::io::stdout();
        let _ = writeln!(out, "ready").and_then(|()| out.flush());
    }
    sleep_forever()
}

fn sleep_forever() -> ! {
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
