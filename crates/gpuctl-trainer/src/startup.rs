//! Startup: the settings of `gpuctl enable`, the device to train on, and startup cleanup
//! (the run's name taken, a crashed previous run's leftovers ended, their GPU memory
//! allocatable again) before the run records itself.

use std::time::{Duration, Instant};

use crate::cli::cuda_only;
use crate::cli::{Args, DeviceArg};
use crate::failure::{Failure, log};
use crate::memory::bytes;
use crate::{cuda, runfile};
use gpuctl_core::session::{NvmlNeed, Session, SessionOptions};

/// The allocator settings of `gpuctl enable`, set in this process's environment where the
/// user did not set their own; returns them as `NAME=value`.
pub fn apply_enable_settings() -> Vec<String> {
    // Before anything can initialise CUDA or start a thread.
    let settings = gpuctl_core::settings::enable_env(&|name| std::env::var(name).ok(), None);
    let mut applied = Vec::new();
    for setting in settings.iter().filter(|s| !s.kept) {
        // SAFETY: single-threaded here: no worker, libtorch thread or CUDA context exists yet.
        unsafe { std::env::set_var(setting.name, &setting.value) };
        applied.push(format!("{}={}", setting.name, setting.value));
    }
    applied
}

/// What startup leaves the run: its claim on its name and the record in it, the device,
/// and gpuctl.toml.
pub struct Startup {
    pub run_file: runfile::RunFile,
    pub record: runfile::Record,
    pub device_arg: DeviceArg,
    /// gpuctl.toml, and NVML where this run is on CUDA and the library loads.
    pub session: Session,
}

/// A field of core's run file as the flag that sets it, for core's errors that name one.
fn flag(field: &str) -> Option<&'static str> {
    (field == "name").then_some("--run-name")
}

/// Startup cleanup: takes the run's name, ends what a crashed previous run left, waits
/// until its GPU memory can be allocated again, and records this run.
pub fn start_up(args: &Args) -> Result<Startup, Failure> {
    let run_path = runfile::location(&args.run_name, args.checkpoint.as_deref()).map_err(|e| {
        match e.exit() {
            gpuctl_core::exit::Exit::Usage => Failure::Usage(e.to_string()),
            _ => Failure::Failed(e.to_string()),
        }
    })?;
    let (run_file, previous) =
        runfile::acquire(&args.run_name, &run_path).map_err(|e| Failure::Failed(e.worded(flag)))?;
    // Another user's directory or lock where the run file would be: stepped around, said.
    for notice in run_file.notices() {
        log(gpuctl_core::text::escape(notice));
    }
    let device_arg = resolve_device(args.device)?;
    if device_arg == DeviceArg::Cpu {
        cuda_only(args, "no CUDA device is available, so this run is on cpu")?;
    }
    // gpuctl.toml: its [protect] lists guard startup cleanup, its [fraction] policy the
    // allocator.
    // An invalid or untrusted configuration is bad input: the one conversion says so.
    let session = Session::open_with(&SessionOptions {
        nvml: match device_arg {
            DeviceArg::Cpu => NvmlNeed::Never,
            _ => NvmlNeed::IfAvailable,
        },
        ..SessionOptions::default()
    })?;
    let freed = match &previous {
        Some(previous) => {
            let cleanup =
                runfile::clean_up(previous, &session.loaded().protect(), &mut |line| log(line));
            if !cleanup.failures.is_empty() {
                return Err(Failure::NotFree(format!(
                    "startup cleanup could not end the previous run's leftovers or free their \
                     memory: {}",
                    cleanup.failures.join("; ")
                )));
            }
            cleanup.freed_bytes
        }
        None => 0,
    };
    if let DeviceArg::Cuda(ordinal) = device_arg {
        wait_allocatable(ordinal, freed, Duration::from_secs(args.cleanup_wait))?;
    }
    let record = runfile::Record {
        version: 1,
        name: args.run_name.clone(),
        device: device_arg.to_string(),
        processes: runfile::processes(&[]),
    };
    run_file
        .record(&record)
        .map_err(|e| Failure::Failed(e.to_string()))?;
    Ok(Startup {
        run_file,
        record,
        device_arg,
        session,
    })
}

/// The device to train on. CUDA support lives in libtorch_cuda, loaded here only when CUDA
/// may be used, so a CPU run needs no CUDA library at all.
fn resolve_device(asked: Option<DeviceArg>) -> Result<DeviceArg, Failure> {
    if asked == Some(DeviceArg::Cpu) {
        return Ok(DeviceArg::Cpu);
    }
    let loaded = load_libtorch_cuda();
    let available = loaded.is_ok() && tch::Cuda::is_available();
    match asked {
        None if available => Ok(DeviceArg::Cuda(0)),
        None => Ok(DeviceArg::Cpu),
        Some(DeviceArg::Cuda(n)) if available && (n as i64) < tch::Cuda::device_count() => {
            Ok(DeviceArg::Cuda(n))
        }
        Some(DeviceArg::Cuda(n)) => {
            let why = match loaded {
                Err(e) => e,
                Ok(()) if !tch::Cuda::is_available() => {
                    "libtorch sees no CUDA device (no driver, or no GPU visible: \
                     CUDA_VISIBLE_DEVICES?)"
                        .into()
                }
                Ok(()) => format!("only {} CUDA device(s) visible", tch::Cuda::device_count()),
            };
            Err(Failure::NoCuda(format!("--device cuda:{n}: {why}")))
        }
        Some(DeviceArg::Cpu) => unreachable!("handled above"),
    }
}

fn load_libtorch_cuda() -> Result<(), String> {
    // RTLD_GLOBAL: its kernels and hooks register themselves with libtorch as it loads.
    // SAFETY: a library name and flags; the handle is kept for the process's life.
    let handle = unsafe {
        libc::dlopen(
            c"libtorch_cuda.so".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_GLOBAL,
        )
    };
    if handle.is_null() {
        // SAFETY: dlerror returns a message for the failed dlopen, valid until the next call.
        let reason = unsafe { std::ffi::CStr::from_ptr(libc::dlerror()) };
        return Err(format!(
            "libtorch_cuda.so could not be loaded ({}): is this a CUDA build of libtorch?",
            reason.to_string_lossy()
        ));
    }
    Ok(())
}

/// After startup cleanup freed `freed` bytes, waits until CUDA can really allocate them.
fn wait_allocatable(ordinal: usize, freed: u64, limit: Duration) -> Result<(), Failure> {
    if freed == 0 {
        return Ok(());
    }
    let deadline = Instant::now() + limit;
    loop {
        let memory = cuda::memory(ordinal)
            .map_err(|e| Failure::NoCuda(format!("checking the freed memory through CUDA: {e}")))?;
        if memory.free_bytes >= freed {
            log(format!(
                "cuda:{ordinal}: {} free of {}: the previous run's {} is allocatable again",
                bytes(memory.free_bytes as i64),
                bytes(memory.total_bytes as i64),
                bytes(freed as i64)
            ));
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(Failure::NotFree(format!(
                "cuda:{ordinal}: only {} free after {}s, but the previous run's leftovers held \
                 {}: another process took it, or the driver has not released it yet",
                bytes(memory.free_bytes as i64),
                limit.as_secs(),
                bytes(freed as i64)
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
