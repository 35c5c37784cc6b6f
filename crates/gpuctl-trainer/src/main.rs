//! gpuctl-trainer: a reference trainer on tch (libtorch) that uses gpuctl-core in-process.
//! See docs/guide/trainer.md for the options, the run file and exit codes.

mod alloc;
mod checkpoint;
mod cli;
mod cuda;
mod data;
mod failure;
mod loader;
mod memory;
mod model;
mod optim;
mod plot;
mod resume;
mod runfile;
mod startup;
mod steps;
mod train;

use clap::Parser;
use tch::nn;
use tch::{Device, Tensor};

use cli::{Args, DeviceArg, MicroBatch, Precision, validate};
use data::DataSpec;
use failure::{Failure, log};
use gpuctl_core::exit::Exit;
use gpuctl_core::session::Session;
use memory::{Monitor, Trace, bytes};
use model::{Model, ModelConfig};
use optim::{AdamW, AdamWConfig};
use resume::resume;
use startup::{Startup, apply_enable_settings, start_up};
use steps::{Steps, finish, train_loop};
use train::Trainer;

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

fn run(args: &Args) -> Result<(), Failure> {
    validate(args)?;
    let applied = apply_enable_settings();
    // Before the first tensor: host tensors get "allocated" and "peak" figures too.
    alloc::count_host_allocations()
        .map_err(|e| Failure::Failed(format!("installing the counting CPU allocator: {e}")))?;
    let Startup {
        run_file,
        mut record,
        device_arg,
        session,
    } = start_up(args)?;

    steps::handle_stop_signals()?;
    if let Some(threads) = args.threads {
        tch::set_num_threads(threads as i32);
    }
    let (device, cuda_index) = placed(device_arg);
    if !applied.is_empty() && cuda_index.is_some() {
        log(format!(
            "allocator settings (gpuctl enable): {}",
            applied.join(" ")
        ));
    }
    let mut monitor = Monitor::new(cuda_index, session.nvml());
    log(format!("memory [start]: {}", monitor.milestone()));
    let Built {
        config,
        store: _store,
        model,
        params,
        mut optimizer,
    } = build_model(args, &session, device_arg, &mut monitor)?;

    let (spec, fingerprint) = data_and_fingerprint(args, config);
    let resumed = resume(args, fingerprint, &params, &mut optimizer)?;
    let total_steps = total_steps(args, &spec);
    let micro_batch =
        choose_micro_batch(args, &config, cuda_index, &mut monitor, resumed.micro_batch)?;

    let mut loader = start_loader(args, spec, resumed.step, total_steps)?;
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
        bf16: args.precision == Precision::Bf16,
        batch_size: args.batch_size,
        micro_batch,
        clip_grad: args.clip_grad,
        inject_oom_above: args.inject_oom_above,
        monitor,
        trace: hooks.then(Trace::default),
        oom_recoveries: resumed.oom_recoveries,
    };
    log_plan(args, &trainer, resumed.step, total_steps);

    let run = Steps {
        total: total_steps,
        per_epoch: spec.steps_per_epoch(),
        fingerprint,
        device: device_arg,
    };
    let ended = train_loop(args, &run, &mut trainer, &mut loader, &resumed)?;
    finish(args, &run, &mut trainer, &resumed, &ended, loader, run_file);
    Ok(())
}

/// The data the run reads, and what a checkpoint must match to be resumed.
fn data_and_fingerprint(args: &Args, config: ModelConfig) -> (DataSpec, checkpoint::Fingerprint) {
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
    (spec, fingerprint)
}

/// --steps, or --epochs of steps, or one epoch.
fn total_steps(args: &Args, spec: &DataSpec) -> u64 {
    match (args.steps, args.epochs) {
        (Some(steps), _) => steps,
        (None, Some(epochs)) => epochs * spec.steps_per_epoch(),
        (None, None) => spec.steps_per_epoch(),
    }
}

/// The data workers, from the step the run resumes at.
fn start_loader(
    args: &Args,
    spec: DataSpec,
    first_step: u64,
    total_steps: u64,
) -> Result<loader::Loader, Failure> {
    loader::Loader::start(
        spec,
        args.workers as usize,
        first_step,
        total_steps.max(first_step),
    )
    .map_err(|e| Failure::Failed(e.to_string()))
}

/// The line that opens training: its steps, batch split and data workers.
fn log_plan(args: &Args, trainer: &Trainer, first_step: u64, total_steps: u64) {
    log(format!(
        "training steps {first_step}..{total_steps}: batch {} as micro-batch {} x {}, {} data worker{}",
        args.batch_size,
        trainer.micro_batch,
        trainer.grad_accum(),
        args.workers,
        if args.workers == 1 { "" } else { "s" }
    ));
}

/// The model on its device, its parameters (sorted by name) and their optimizer.
struct Built {
    config: ModelConfig,
    /// Owns the parameters' variables.
    store: nn::VarStore,
    model: Model,
    params: Vec<(String, Tensor)>,
    optimizer: AdamW,
}

/// Builds the model and its optimizer on the run's device, with the memory fraction and
/// autocast of a CUDA run set in between (as before the optimizer's state is allocated).
fn build_model(
    args: &Args,
    session: &Session,
    device_arg: DeviceArg,
    monitor: &mut Monitor,
) -> Result<Built, Failure> {
    let (device, cuda_index) = placed(device_arg);
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
        apply_fraction(args, session, index)?;
        if args.precision == Precision::Bf16 {
            alloc::autocast_bf16().map_err(|e| Failure::Failed(format!("bf16 autocast: {e}")))?;
        }
    }

    let optimizer = AdamW::new(
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

    Ok(Built {
        config,
        store,
        model,
        params,
        optimizer,
    })
}

/// The tch device of `device_arg`, and its CUDA index if it is one.
fn placed(device_arg: DeviceArg) -> (Device, Option<usize>) {
    match device_arg {
        DeviceArg::Cpu => (Device::Cpu, None),
        DeviceArg::Cuda(n) => (Device::Cuda(n), Some(n)),
    }
}

/// The micro-batch to start with: `--micro-batch`, or what fits the free memory (`auto`),
/// and never above what a resumed run had come down to.
fn choose_micro_batch(
    args: &Args,
    config: &ModelConfig,
    cuda_index: Option<usize>,
    monitor: &mut Monitor,
    resumed: Option<u32>,
) -> Result<u32, Failure> {
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
            let bf16 = args.precision == Precision::Bf16;
            let estimate =
                train::estimate_micro_batch(config, bf16, args.batch_size, free, grad_bytes);
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
    if let Some(resumed) = resumed.filter(|&m| m < micro_batch) {
        log(format!(
            "micro-batch {resumed}: the previous run recovered from an OOM down to it"
        ));
        micro_batch = resumed;
    }
    if args.empty_cache_every.is_some() && cuda_index.is_none() {
        log("--empty-cache-every has no effect on cpu: there is no device cache");
    }
    Ok(micro_batch)
}

/// `--memory-fraction`, or the fraction policy of gpuctl.toml, applied to the allocator.
fn apply_fraction(args: &Args, session: &Session, index: usize) -> Result<(), Failure> {
    let (fraction, source) = match args.memory_fraction {
        Some(fraction) => (fraction, "--memory-fraction".to_string()),
        None => {
            let user = nix::unistd::User::from_uid(nix::unistd::getuid())
                .ok()
                .flatten()
                .map(|u| u.name);
            // The policy names GPUs by NVML index or UUID: the GPU behind cuda:INDEX, as
            // CUDA_VISIBLE_DEVICES maps it; without NVML, the CUDA index stands for it.
            let (gpu, uuid) = match session.nvml() {
                Some(gpus) => {
                    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
                    let (place, _) = session.cuda_place(index, visible.as_deref())?;
                    let uuids = gpus.uuids()?;
                    let uuid = uuids.get(place.gpu as usize).cloned().flatten();
                    (place.gpu, uuid)
                }
                None => (index as u32, None),
            };
            match gpuctl_core::config::fraction_for(
                session.loaded(),
                gpu,
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
