//! gpuctl-trainer: a reference trainer on tch (libtorch) that uses gpuctl-core in-process.
//! See the README's "gpuctl-trainer" section for the options, the run file and exit codes.

mod alloc;
mod checkpoint;
mod cli;
mod cuda;
mod data;
mod loader;
mod memory;
mod model;
mod optim;
mod plot;
mod runfile;
mod train;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use clap::Parser;
use serde::Serialize;
use tch::nn;
use tch::{Device, Kind, Tensor};

use cli::{Args, DeviceArg, MicroBatch, Precision};
use data::DataSpec;
use gpuctl_core::exit::Exit;
use memory::{Monitor, Trace, bytes};
use model::{Model, ModelConfig};
use optim::{AdamW, AdamWConfig};
use train::{TrainError, Trainer};

/// A failure, with its exit status (documented in --help and the README).
#[derive(Debug)]
enum Failure {
    Failed(String),
    Usage(String),
    NoCuda(String),
    NotFree(String),
    OutOfMemory(String),
}

impl Failure {
    fn exit(&self) -> Exit {
        match self {
            Failure::Failed(_) => Exit::Failed,
            Failure::Usage(_) => Exit::Usage,
            Failure::NoCuda(_) => Exit::Unavailable,
            Failure::NotFree(_) => Exit::NotClean,
            Failure::OutOfMemory(_) => Exit::OutOfMemory,
        }
    }

    fn message(&self) -> &str {
        match self {
            Failure::Failed(m)
            | Failure::Usage(m)
            | Failure::NoCuda(m)
            | Failure::NotFree(m)
            | Failure::OutOfMemory(m) => m,
        }
    }
}

/// The signal that asked this run to stop (SIGTERM from Slurm or systemd, SIGINT), if any;
/// 0 until one comes.
static STOP_SIGNAL: LazyLock<Arc<AtomicUsize>> = LazyLock::new(|| Arc::new(AtomicUsize::new(0)));

/// The stop signal received so far, 0 for none.
fn stop_signal() -> i32 {
    STOP_SIGNAL.load(Ordering::SeqCst) as i32
}

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some(loader::WORKER_ARG) {
        std::process::exit(loader::worker_main(&argv[2..]));
    }
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            std::process::exit(0);
        }
        Err(e) => {
            // Clap's message without its usage block and tip, on one line.
            let text = e.render().to_string();
            let message: Vec<&str> = text
                .lines()
                .map(str::trim)
                .take_while(|line| !line.is_empty() && !line.starts_with("Usage:"))
                .collect();
            let message = message.join(" ");
            eprintln!(
                "gpuctl-trainer: {} (see --help)",
                message.trim_start_matches("error: ")
            );
            std::process::exit(Exit::Usage.code().into());
        }
    };
    train::install_panic_hook();
    match run(&args) {
        Ok(()) => {}
        Err(failure) => {
            eprintln!("gpuctl-trainer: {}", failure.message());
            std::process::exit(failure.exit().code().into());
        }
    }
}

fn log(line: impl AsRef<str>) {
    eprintln!("gpuctl-trainer: {}", line.as_ref());
}

/// The final JSON line on stdout.
#[derive(Debug, Serialize)]
struct Summary {
    steps: u64,
    samples_seen: u64,
    final_loss: Option<f64>,
    micro_batch: u32,
    grad_accum: u32,
    oom_recoveries: u64,
    param_checksum: f64,
    peak_memory_bytes: u64,
    /// `cuda_allocated` (the caching allocator's peak) or `host_allocated` (CPU tensors').
    peak_memory_source: &'static str,
    device: String,
    precision: &'static str,
    steps_this_run: u64,
    seconds: f64,
    samples_per_second: f64,
    /// Set when a signal stopped the run early (after a checkpoint).
    stopped_by: Option<String>,
    /// Seconds spent in the per-micro-step memory readings (`--memory-trace`/`--memory-plot`).
    memory_hook_seconds: f64,
}

fn run(args: &Args) -> Result<(), Failure> {
    validate(args)?;
    // Before anything can initialise CUDA or start a thread: the allocator settings of
    // `gpuctl enable`, kept where the user set their own.
    let settings = gpuctl_core::settings::enable_env(&|name| std::env::var(name).ok(), None);
    let mut applied = Vec::new();
    for setting in settings.iter().filter(|s| !s.kept) {
        // SAFETY: single-threaded here: no worker, libtorch thread or CUDA context exists yet.
        unsafe { std::env::set_var(setting.name, &setting.value) };
        applied.push(format!("{}={}", setting.name, setting.value));
    }
    // Before the first tensor: host tensors get "allocated" and "peak" figures too.
    alloc::count_host_allocations()
        .map_err(|e| Failure::Failed(format!("installing the counting CPU allocator: {e}")))?;

    // Startup cleanup: take the run's name, end what a crashed previous run left.
    let run_path =
        runfile::location(&args.run_name, args.checkpoint.as_deref()).map_err(|e| match e {
            runfile::RunError::BadName(_) => Failure::Usage(e.to_string()),
            _ => Failure::Failed(e.to_string()),
        })?;
    let (run_file, previous) =
        runfile::acquire(&args.run_name, &run_path).map_err(|e| Failure::Failed(e.to_string()))?;
    let device_arg = resolve_device(args.device)?;
    if device_arg == DeviceArg::Cpu {
        cuda_only(args, "no CUDA device is available, so this run is on cpu")?;
    }
    // gpuctl.toml: its [protect] lists guard startup cleanup, its [fraction] policy the
    // allocator.
    let policy = gpuctl_core::config::load().map_err(|e| Failure::Usage(e.to_string()))?;
    let freed = match &previous {
        Some(previous) => {
            let cleanup = runfile::clean_up(previous, &policy.protect(), &mut |line| log(line));
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
    let mut record = runfile::Record {
        version: 1,
        name: args.run_name.clone(),
        device: device_arg.to_string(),
        processes: runfile::processes(&[]),
    };
    run_file
        .record(&record)
        .map_err(|e| Failure::Failed(e.to_string()))?;

    // SIGTERM and SIGINT store their number: the loop finishes its step, checkpoints, stops.
    for signal in [libc::SIGTERM, libc::SIGINT] {
        signal_hook::flag::register_usize(signal, Arc::clone(&STOP_SIGNAL), signal as usize)
            .map_err(|e| Failure::Failed(format!("cannot handle signal {signal}: {e}")))?;
    }
    if let Some(threads) = args.threads {
        tch::set_num_threads(threads as i32);
    }
    let (device, cuda_index) = match device_arg {
        DeviceArg::Cpu => (Device::Cpu, None),
        DeviceArg::Cuda(n) => (Device::Cuda(n), Some(n)),
    };
    if !applied.is_empty() && cuda_index.is_some() {
        log(format!(
            "allocator settings (gpuctl enable): {}",
            applied.join(" ")
        ));
    }
    let mut monitor = Monitor::new(cuda_index);
    log(format!("memory [start]: {}", monitor.milestone()));

    let config = ModelConfig {
        vocab: i64::from(args.vocab_size),
        width: i64::from(args.width),
        layers: i64::from(args.layers),
        heads: i64::from(args.heads),
        length: i64::from(args.max_length),
    };
    tch::manual_seed(args.seed as i64);
    let store = nn::VarStore::new(device);
    let model = Model::new(&store.root(), config);
    let mut params: Vec<(String, Tensor)> = store.variables().into_iter().collect();
    params.sort_by(|a, b| a.0.cmp(&b.0));
    log(format!(
        "model: {} parameters ({} layers, width {}, {} heads, vocabulary {}, length {}) on {}",
        config.parameters(),
        config.layers,
        config.width,
        config.heads,
        config.vocab,
        config.length,
        device_arg
    ));
    log(format!("memory [model on device]: {}", monitor.milestone()));
    if let Some(index) = cuda_index {
        apply_fraction(args, &policy, index)?;
        if args.precision == Precision::Bf16 {
            alloc::autocast_bf16().map_err(|e| Failure::Failed(format!("bf16 autocast: {e}")))?;
        }
    }

    let mut optimizer = AdamW::new(
        AdamWConfig {
            lr: args.lr,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: args.weight_decay,
        },
        &params,
    );
    log(format!(
        "memory [optimizer created]: {}",
        monitor.milestone()
    ));

    let spec = DataSpec {
        seed: args.seed,
        vocab: args.vocab_size,
        length: args.max_length,
        dataset_size: args.dataset_size,
        batch_size: args.batch_size,
    };
    let fingerprint = checkpoint::Fingerprint {
        model: config,
        batch_size: args.batch_size,
        dataset_size: args.dataset_size,
        seed: args.seed,
    };
    let mut start_step = 0;
    let mut samples_seen = 0;
    let mut oom_recoveries = 0;
    let mut resumed_micro = None;
    if args.resume {
        let dir = args
            .checkpoint
            .as_deref()
            .expect("clap: --resume requires --checkpoint");
        match checkpoint::load(dir).map_err(Failure::Failed)? {
            None => log(format!(
                "no checkpoint in {} yet: starting at step 0",
                dir.display()
            )),
            Some(loaded) => {
                if loaded.state.fingerprint != fingerprint {
                    return Err(Failure::Usage(format!(
                        "{} was written by a different run (model, batch size, dataset or \
                         seed differ: {:?}); resume with the same options or use another \
                         --checkpoint",
                        loaded.path.display(),
                        loaded.state.fingerprint
                    )));
                }
                restore(&params, &loaded.model).map_err(Failure::Failed)?;
                optimizer
                    .load_state(&params, &loaded.optimizer, loaded.state.step as i64)
                    .map_err(Failure::Failed)?;
                start_step = loaded.state.step;
                samples_seen = loaded.state.samples_seen;
                oom_recoveries = loaded.state.oom_recoveries;
                resumed_micro = Some(loaded.state.micro_batch);
                log(format!(
                    "resumed from {} at step {start_step}",
                    loaded.path.display()
                ));
            }
        }
    }
    let total_steps = match (args.steps, args.epochs) {
        (Some(steps), _) => steps,
        (None, Some(epochs)) => epochs * spec.steps_per_epoch(),
        (None, None) => spec.steps_per_epoch(),
    };

    let bf16 = args.precision == Precision::Bf16;
    let mut micro_batch = match args
        .micro_batch
        .unwrap_or(MicroBatch::Fixed(args.batch_size))
    {
        MicroBatch::Fixed(n) => n.min(args.batch_size),
        MicroBatch::Auto => {
            let free = match cuda_index {
                Some(index) => alloc::memory_info(index).map(|(free, _)| free).ok(),
                None => monitor.host_available(),
            };
            let Some(free) = free else {
                return Err(Failure::Failed(
                    "--micro-batch auto: free memory could not be read".into(),
                ));
            };
            let grad_bytes = config.parameters() as u64 * 4;
            let estimate =
                train::estimate_micro_batch(&config, bf16, args.batch_size, free, grad_bytes);
            log(format!(
                "micro-batch auto: {} (per sample {}: activations {}, logits {}; budget {} \
                 of {} free)",
                estimate.micro_batch,
                bytes(estimate.per_sample_bytes as i64),
                bytes(estimate.activation_bytes as i64),
                bytes(estimate.logit_bytes as i64),
                bytes(estimate.budget_bytes as i64),
                bytes(free as i64)
            ));
            estimate.micro_batch
        }
    };
    if let Some(resumed) = resumed_micro.filter(|&m| m < micro_batch) {
        log(format!(
            "micro-batch {resumed}: the previous run recovered from an OOM down to it"
        ));
        micro_batch = resumed;
    }
    if args.empty_cache_every.is_some() && cuda_index.is_none() {
        log("--empty-cache-every has no effect on cpu: there is no device cache");
    }

    let mut loader = loader::Loader::start(
        spec,
        args.workers as usize,
        start_step,
        total_steps.max(start_step),
    )
    .map_err(|e| Failure::Failed(e.to_string()))?;
    record.processes = runfile::processes(&loader.worker_pids());
    run_file
        .record(&record)
        .map_err(|e| Failure::Failed(e.to_string()))?;

    let hooks = args.memory_trace.is_some() || args.memory_plot.is_some();
    let mut trainer = Trainer {
        model: &model,
        config,
        params,
        optimizer,
        device,
        cuda_index,
        bf16,
        batch_size: args.batch_size,
        micro_batch,
        clip_grad: args.clip_grad,
        inject_oom_above: args.inject_oom_above,
        monitor,
        trace: hooks.then(Trace::default),
        oom_recoveries,
    };
    log(format!(
        "training steps {start_step}..{total_steps}: batch {} as micro-batch {} x {}, {} data \
         worker{}",
        args.batch_size,
        trainer.micro_batch,
        trainer.grad_accum(),
        args.workers,
        if args.workers == 1 { "" } else { "s" }
    ));

    let started = Instant::now();
    let mut last_loss = None;
    let mut step = start_step;
    let mut stopped_by = None;
    let steps_per_epoch = spec.steps_per_epoch();
    let mut window = (Instant::now(), 0u64);
    let mut saved_at = None;
    while step < total_steps {
        let tokens = match loader.batch(step) {
            Ok(tokens) => tokens,
            // A stop sent to the whole process group (Slurm's scancel, systemd's stop) ends
            // the workers too: stop after the last completed step, as asked.
            Err(_) if stop_signal() != 0 => {
                let stop = stop_signal();
                if let Some(dir) = &args.checkpoint
                    && saved_at != Some(step)
                    && step > start_step
                {
                    save_checkpoint(dir, &trainer, step, samples_seen, last_loss, fingerprint)?;
                }
                stopped_by = Some(stop_name(stop));
                log(format!("{}: stopping after step {step}", stop_name(stop)));
                break;
            }
            Err(e) => return Err(Failure::Failed(e.to_string())),
        };
        let samples = Tensor::from_slice(&tokens.iter().map(|&t| i64::from(t)).collect::<Vec<_>>())
            .view([i64::from(args.batch_size), i64::from(args.max_length) + 1]);
        let result = trainer.step(step, &samples, &mut |line| log(line));
        let loss = match result {
            Ok(loss) => loss,
            Err(error) => {
                write_memory_outputs(args, &trainer, &device_arg);
                return Err(match error {
                    TrainError::OutOfMemory(message) => Failure::OutOfMemory(message),
                    TrainError::Failed(message) => Failure::Failed(message),
                });
            }
        };
        step += 1;
        samples_seen += u64::from(args.batch_size);
        window.1 += 1;
        last_loss = Some(loss);
        if !loss.is_finite() {
            return Err(Failure::Failed(format!(
                "the loss is {loss} at step {step}: training diverged (lower --lr?)"
            )));
        }
        if let (Some(every), Some(index)) = (args.empty_cache_every, cuda_index)
            && step % every == 0
        {
            alloc::empty_cache()
                .map_err(|e| Failure::Failed(format!("empty_cache on cuda:{index}: {e}")))?;
        }
        if step % args.log_every == 0 || step == total_steps {
            let rate = window.1 as f64 * f64::from(args.batch_size)
                / window.0.elapsed().as_secs_f64().max(1e-9);
            log(format!(
                "step {step}/{total_steps} loss {loss:.4} micro-batch {} x {} {rate:.0} samples/s",
                trainer.micro_batch,
                trainer.grad_accum()
            ));
            window = (Instant::now(), 0);
        }
        if step % steps_per_epoch == 0 {
            log(format!(
                "memory [epoch {} done]: {}",
                step / steps_per_epoch,
                trainer.monitor.milestone()
            ));
            // Each epoch's log shows its own peak; the summary keeps the run's.
            trainer.monitor.reset_peak();
        }
        let stop = stop_signal();
        let save_now = args.checkpoint_every > 0 && step % args.checkpoint_every == 0;
        if let Some(dir) = &args.checkpoint
            && (save_now || stop != 0 || step == total_steps)
        {
            save_checkpoint(dir, &trainer, step, samples_seen, last_loss, fingerprint)?;
            saved_at = Some(step);
        }
        if stop != 0 {
            log(format!("{}: stopping after step {step}", stop_name(stop)));
            stopped_by = Some(stop_name(stop));
            break;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    log(format!("memory [end]: {}", trainer.monitor.milestone()));
    drop(loader);
    write_memory_outputs(args, &trainer, &device_arg);
    let (peak, source) = trainer.monitor.peak();
    let steps_this_run = step - start_step;
    let summary = Summary {
        steps: step,
        samples_seen,
        final_loss: last_loss,
        micro_batch: trainer.micro_batch,
        grad_accum: trainer.grad_accum(),
        oom_recoveries: trainer.oom_recoveries,
        param_checksum: train::param_checksum(&trainer.params),
        peak_memory_bytes: peak,
        peak_memory_source: source,
        device: device_arg.to_string(),
        precision: if bf16 { "bf16" } else { "fp32" },
        steps_this_run,
        seconds,
        samples_per_second: steps_this_run as f64 * f64::from(args.batch_size) / seconds.max(1e-9),
        stopped_by: stopped_by.clone(),
        memory_hook_seconds: trainer.monitor.spent().as_secs_f64(),
    };
    println!(
        "{}",
        serde_json::to_string(&summary).expect("the summary serializes")
    );
    run_file.finish();
    if let Some(name) = stopped_by {
        let code = if name == "SIGINT" { 130 } else { 143 };
        std::process::exit(code);
    }
    Ok(())
}

fn stop_name(signal: i32) -> String {
    if signal == libc::SIGINT {
        "SIGINT".into()
    } else {
        "SIGTERM".into()
    }
}

/// Writes the checkpoint of the state after `step` steps.
fn save_checkpoint(
    dir: &Path,
    trainer: &Trainer,
    step: u64,
    samples_seen: u64,
    loss: Option<f64>,
    fingerprint: checkpoint::Fingerprint,
) -> Result<(), Failure> {
    let state = checkpoint::State {
        version: 1,
        step,
        samples_seen,
        micro_batch: trainer.micro_batch,
        oom_recoveries: trainer.oom_recoveries,
        loss,
        fingerprint,
    };
    let saved = checkpoint::save(
        dir,
        &trainer.params,
        &trainer.optimizer.state(&trainer.params),
        &state,
    )
    .map_err(|e| Failure::Failed(format!("checkpoint: {e}")))?;
    log(format!("checkpoint {}", saved.display()));
    Ok(())
}

fn validate(args: &Args) -> Result<(), Failure> {
    if !args.width.is_multiple_of(args.heads) {
        return Err(Failure::Usage(format!(
            "--width {} is not a multiple of --heads {}",
            args.width, args.heads
        )));
    }
    if args.dataset_size < u64::from(args.batch_size) {
        return Err(Failure::Usage(format!(
            "--dataset-size {} is smaller than one batch (--batch-size {})",
            args.dataset_size, args.batch_size
        )));
    }
    if args.device == Some(DeviceArg::Cpu) {
        cuda_only(args, "--device cpu")?;
    }
    Ok(())
}

/// The options that need CUDA, refused for a run on the CPU (`why` says why it is on the CPU).
fn cuda_only(args: &Args, why: &str) -> Result<(), Failure> {
    if args.precision == Precision::Bf16 {
        return Err(Failure::Usage(format!(
            "--precision bf16 is autocast on CUDA, and {why}: use fp32 on cpu"
        )));
    }
    if args.memory_fraction.is_some() {
        return Err(Failure::Usage(format!(
            "--memory-fraction caps the CUDA caching allocator, and {why}"
        )));
    }
    Ok(())
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

/// `--memory-fraction`, or the fraction policy of gpuctl.toml, applied to the allocator.
fn apply_fraction(
    args: &Args,
    loaded: &gpuctl_core::config::Loaded,
    index: usize,
) -> Result<(), Failure> {
    let (fraction, source) = match args.memory_fraction {
        Some(fraction) => (fraction, "--memory-fraction".to_string()),
        None => {
            let user = nix::unistd::User::from_uid(nix::unistd::getuid())
                .ok()
                .flatten()
                .map(|u| u.name);
            // The policy names GPUs by NVML index or UUID; without CUDA_VISIBLE_DEVICES the
            // CUDA index is the NVML one in PCI order.
            let uuid = gpuctl_core::nvml::Gpus::open()
                .ok()
                .and_then(|gpus| gpus.uuids().ok())
                .and_then(|uuids| uuids.get(index).cloned().flatten());
            match gpuctl_core::config::fraction_for(
                loaded,
                index as u32,
                uuid.as_deref(),
                user.as_deref(),
            ) {
                Some(policy) => (policy.value, policy.to_string()),
                None => return Ok(()),
            }
        }
    };
    if !alloc::has_cuda() {
        return Err(Failure::Failed(format!(
            "the memory fraction {fraction} ({source}) cannot be applied: gpuctl-trainer was \
             built against a libtorch without CUDA"
        )));
    }
    alloc::set_memory_fraction(fraction, index)
        .map_err(|e| Failure::Failed(format!("setting the memory fraction {fraction}: {e}")))?;
    log(format!(
        "memory fraction {fraction} of cuda:{index} ({source})"
    ));
    Ok(())
}

/// Copies checkpointed values into the model's parameters.
fn restore(params: &[(String, Tensor)], saved: &[(String, Tensor)]) -> Result<(), String> {
    tch::no_grad(|| {
        for (name, param) in params {
            let value = saved
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| t)
                .ok_or_else(|| format!("the checkpoint lacks parameter {name}"))?;
            if value.size() != param.size() || value.kind() != Kind::Float {
                return Err(format!("the checkpoint's {name} has another shape or type"));
            }
            param
                .shallow_clone()
                .copy_(&value.to_device(param.device()));
        }
        Ok(())
    })
}

/// The trace CSV and plot, when asked for; a failure to write them is logged, not fatal.
fn write_memory_outputs(args: &Args, trainer: &Trainer, device: &DeviceArg) {
    let Some(trace) = &trainer.trace else {
        return;
    };
    if let Some(path) = &args.memory_trace {
        match trace.write_csv(path) {
            Ok(()) => log(format!("memory trace {}", path.display())),
            Err(e) => log(format!("memory trace {}: {e}", path.display())),
        }
    }
    if let Some(path) = &args.memory_plot {
        let title = format!(
            "gpuctl-trainer on {device}: batch {}, micro-batch {} x {}, {} OOM recoveries",
            args.batch_size,
            trainer.micro_batch,
            trainer.grad_accum(),
            trainer.oom_recoveries
        );
        match plot::write_png(trace, &title, Path::new(path)) {
            Ok(()) => log(format!("memory plot {}", path.display())),
            Err(e) => log(format!("memory plot {}: {e}", path.display())),
        }
    }
}
