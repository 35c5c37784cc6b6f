//! The training loop, from the first step to the summary line: checkpoints, the memory
//! outputs, and the stop signals that end a run early.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Instant;

use serde::Serialize;
use tch::Tensor;

use crate::cli::{Args, DeviceArg};
use crate::failure::{Failure, log};
use crate::resume::Resumed;
use crate::train::{self, TrainError, Trainer};
use crate::{alloc, checkpoint, loader, plot, runfile};

/// The signal that asked this run to stop (SIGTERM from Slurm or systemd, SIGINT), if any;
/// 0 until one comes.
static STOP_SIGNAL: LazyLock<Arc<AtomicUsize>> = LazyLock::new(|| Arc::new(AtomicUsize::new(0)));

/// SIGTERM and SIGINT store their number: the loop finishes its step, checkpoints, stops.
pub fn handle_stop_signals() -> Result<(), Failure> {
    for signal in [libc::SIGTERM, libc::SIGINT] {
        signal_hook::flag::register_usize(signal, Arc::clone(&STOP_SIGNAL), signal as usize)
            .map_err(|e| Failure::Failed(format!("cannot handle signal {signal}: {e}")))?;
    }
    Ok(())
}

/// The stop signal received so far, 0 for none.
fn stop_signal() -> i32 {
    STOP_SIGNAL.load(Ordering::SeqCst) as i32
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

/// What the training loop needs to know of the run besides its options.
pub struct Steps {
    pub total: u64,
    pub per_epoch: u64,
    pub fingerprint: checkpoint::Fingerprint,
    pub device: DeviceArg,
}

/// Where the training loop stopped.
pub struct Ended {
    pub step: u64,
    pub samples_seen: u64,
    pub last_loss: Option<f64>,
    /// The stop signal's name, when one stopped the run early.
    pub stopped_by: Option<String>,
    /// How long the loop ran.
    pub seconds: f64,
}

/// The training loop: one step a batch until the last step or a stop signal, logging,
/// emptying the cache and checkpointing as asked.
pub fn train_loop(
    args: &Args,
    run: &Steps,
    trainer: &mut Trainer,
    loader: &mut loader::Loader,
    resumed: &Resumed,
) -> Result<Ended, Failure> {
    let started = Instant::now();
    let start_step = resumed.step;
    let mut samples_seen = resumed.samples_seen;
    let mut last_loss = None;
    let mut step = start_step;
    let mut stopped_by = None;
    let mut window = (Instant::now(), 0u64);
    let mut saved_at = None;
    while step < run.total {
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
                    save_checkpoint(dir, trainer, step, samples_seen, last_loss, run.fingerprint)?;
                }
                stopped_by = Some(stop_name(stop));
                log(format!("{}: stopping after step {step}", stop_name(stop)));
                break;
            }
            Err(e) => return Err(Failure::Failed(e.to_string())),
        };
        let loss = run_step(args, run, trainer, step, &tokens)?;
        step += 1;
        samples_seen += u64::from(args.batch_size);
        window.1 += 1;
        last_loss = Some(loss);
        if !loss.is_finite() {
            return Err(Failure::Failed(format!(
                "the loss is {loss} at step {step}: training diverged (lower --lr?)"
            )));
        }
        after_step(args, run, trainer, step, loss, &mut window)?;
        let stop = stop_signal();
        let save_now = args.checkpoint_every > 0 && step.is_multiple_of(args.checkpoint_every);
        if let Some(dir) = &args.checkpoint
            && (save_now || stop != 0 || step == run.total)
        {
            save_checkpoint(dir, trainer, step, samples_seen, last_loss, run.fingerprint)?;
            saved_at = Some(step);
        }
        if stop != 0 {
            log(format!("{}: stopping after step {step}", stop_name(stop)));
            stopped_by = Some(stop_name(stop));
            break;
        }
    }
    Ok(Ended {
        step,
        samples_seen,
        last_loss,
        stopped_by,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// One optimizer step on a batch of `tokens`; on failure the memory outputs are written
/// before the error returns.
fn run_step(
    args: &Args,
    run: &Steps,
    trainer: &mut Trainer,
    step: u64,
    tokens: &[u32],
) -> Result<f64, Failure> {
    let samples = Tensor::from_slice(&tokens.iter().map(|&t| i64::from(t)).collect::<Vec<_>>())
        .view([i64::from(args.batch_size), i64::from(args.max_length) + 1]);
    trainer
        .step(step, &samples, &mut |line| log(line))
        .map_err(|error| {
            write_memory_outputs(args, trainer, &run.device);
            match error {
                TrainError::OutOfMemory(message) => Failure::OutOfMemory(message),
                TrainError::Failed(message) => Failure::Failed(message),
            }
        })
}

/// After step `step` (counted from 1): the cache emptied, the progress line (`window`: since
/// when, and how many steps since the last one) and the epoch's memory milestone, as asked.
fn after_step(
    args: &Args,
    run: &Steps,
    trainer: &mut Trainer,
    step: u64,
    loss: f64,
    window: &mut (Instant, u64),
) -> Result<(), Failure> {
    if let (Some(every), Some(index)) = (args.empty_cache_every, trainer.cuda_index)
        && step.is_multiple_of(every)
    {
        alloc::empty_cache()
            .map_err(|e| Failure::Failed(format!("empty_cache on cuda:{index}: {e}")))?;
    }
    if step.is_multiple_of(args.log_every) || step == run.total {
        let rate = window.1 as f64 * f64::from(args.batch_size)
            / window.0.elapsed().as_secs_f64().max(1e-9);
        log(format!(
            "step {step}/{} loss {loss:.4} micro-batch {} x {} {rate:.0} samples/s",
            run.total,
            trainer.micro_batch,
            trainer.grad_accum()
        ));
        *window = (Instant::now(), 0);
    }
    if step.is_multiple_of(run.per_epoch) {
        log(format!(
            "memory [epoch {} done]: {}",
            step / run.per_epoch,
            trainer.monitor.milestone()
        ));
        // Each epoch's log shows its own peak; the summary keeps the run's.
        trainer.monitor.reset_peak();
    }
    Ok(())
}

/// The end of a run: the last memory milestone, the memory outputs, the summary line, the
/// run file removed; a run a signal stopped exits with 128 + its number.
pub fn finish(
    args: &Args,
    run: &Steps,
    trainer: &mut Trainer,
    resumed: &Resumed,
    ended: &Ended,
    loader: loader::Loader,
    run_file: runfile::RunFile,
) {
    log(format!("memory [end]: {}", trainer.monitor.milestone()));
    drop(loader);
    write_memory_outputs(args, trainer, &run.device);
    let (peak, source) = trainer.monitor.peak();
    let steps_this_run = ended.step - resumed.step;
    let summary = Summary {
        steps: ended.step,
        samples_seen: ended.samples_seen,
        final_loss: ended.last_loss,
        micro_batch: trainer.micro_batch,
        grad_accum: trainer.grad_accum(),
        oom_recoveries: trainer.oom_recoveries,
        param_checksum: train::param_checksum(&trainer.params),
        peak_memory_bytes: peak,
        peak_memory_source: source,
        device: run.device.to_string(),
        precision: if trainer.bf16 { "bf16" } else { "fp32" },
        steps_this_run,
        seconds: ended.seconds,
        samples_per_second: steps_this_run as f64 * f64::from(args.batch_size)
            / ended.seconds.max(1e-9),
        stopped_by: ended.stopped_by.clone(),
        memory_hook_seconds: trainer.monitor.spent().as_secs_f64(),
    };
    println!(
        "{}",
        serde_json::to_string(&summary).expect("the summary serializes")
    );
    run_file.finish();
    if let Some(name) = &ended.stopped_by {
        let code = if name == "SIGINT" { 130 } else { 143 };
        std::process::exit(code);
    }
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
