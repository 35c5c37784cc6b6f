//! The trainer's options, as PyTorch training scripts name them, and the checks of them
//! that clap cannot make (`validate`, `cuda_only`).

use std::path::PathBuf;

use clap::{Parser, ValueEnum};

use crate::failure::Failure;

#[derive(Debug, Clone, Parser)]
#[command(
    name = "gpuctl-trainer",
    version,
    // A launcher's defaults, then the job's own choices: the last one given wins.
    args_override_self = true,
    about = "Reference trainer on libtorch: startup cleanup of a crashed previous run, memory \
             monitoring, and OOM recovery that keeps the effective batch",
    after_help = gpuctl_core::exit::help(gpuctl_core::exit::TRAINER)
)]
pub struct Args {
    /// Optimizer steps to run (in all, counting steps a resumed checkpoint already did).
    #[arg(long, conflicts_with = "epochs", value_parser = clap::value_parser!(u64).range(1..))]
    pub steps: Option<u64>,

    /// Epochs to run instead of --steps (an epoch is --dataset-size samples).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub epochs: Option<u64>,

    /// Samples per optimizer step: the effective batch, whatever the micro-batch.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    pub batch_size: u32,

    /// Samples per forward/backward pass: a number, or `auto` to pick it from an estimate of
    /// activation and logit memory against free memory. Default: the whole batch.
    #[arg(long, value_name = "N|auto", value_parser = parse_micro_batch)]
    pub micro_batch: Option<MicroBatch>,

    /// Tokens per sample (the context length).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(2..=65536))]
    pub max_length: u32,

    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(2..=1_000_000))]
    pub vocab_size: u32,

    /// Transformer blocks.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub layers: u32,

    /// Model width (embedding size); a multiple of --heads.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub width: u32,

    /// Attention heads.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub heads: u32,

    /// Samples in the generated dataset (one epoch).
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..))]
    pub dataset_size: u64,

    #[arg(long, default_value_t = 3e-4, value_parser = parse_positive)]
    pub lr: f64,

    #[arg(long, default_value_t = 0.01, value_parser = parse_non_negative)]
    pub weight_decay: f64,

    /// Clip the gradients' global norm to this; 0 turns clipping off.
    #[arg(long, default_value_t = 1.0, value_parser = parse_non_negative)]
    pub clip_grad: f64,

    /// fp32, or bf16 (autocast on CUDA).
    #[arg(long, value_enum, default_value_t = Precision::Fp32)]
    pub precision: Precision,

    /// cpu, cuda or cuda:N. Default: cuda:0 when CUDA is available, else cpu.
    #[arg(long, value_parser = parse_device)]
    pub device: Option<DeviceArg>,

    #[arg(long, default_value_t = 0)]
    pub seed: u64,

    /// Data-loader worker processes (0: prepare batches in the trainer itself).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(0..=64))]
    pub workers: u32,

    /// Directory for checkpoints (and the run file).
    #[arg(long, value_name = "DIR")]
    pub checkpoint: Option<PathBuf>,

    /// Save a checkpoint every N steps (and always at the end); 0: only at the end.
    #[arg(long, default_value_t = 100, value_name = "N")]
    pub checkpoint_every: u64,

    /// Continue from the newest checkpoint in --checkpoint.
    #[arg(long, requires = "checkpoint")]
    pub resume: bool,

    /// Cap the caching allocator at this share of the GPU's memory (overrides the fraction
    /// policy of gpuctl.toml). CUDA only.
    #[arg(long, value_name = "F", value_parser = parse_fraction)]
    pub memory_fraction: Option<f64>,

    /// Empty the CUDA cache every N steps (the common recipe; off by default, kept so its
    /// cost can be measured).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub empty_cache_every: Option<u64>,

    /// Write the per-micro-step memory trace (CSV) here.
    #[arg(long, value_name = "FILE")]
    pub memory_trace: Option<PathBuf>,

    /// Draw memory over steps (PNG) here.
    #[arg(long, value_name = "FILE")]
    pub memory_plot: Option<PathBuf>,

    /// The run's name: a run of the same name cleans up what a crashed one left.
    #[arg(long, default_value = "gpuctl-trainer")]
    pub run_name: String,

    /// Log a progress line every N steps.
    #[arg(long, default_value_t = 10, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub log_every: u64,

    /// CPU threads for libtorch's operators (default: libtorch's choice).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub threads: Option<u32>,

    /// Seconds startup cleanup waits for a previous run's memory to become allocatable.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    pub cleanup_wait: u64,

    /// For testing without a GPU: every micro-batch above N samples fails with an
    /// out-of-memory error, through the same recovery path as a real one (0: every one
    /// fails, down to micro-batch 1).
    #[arg(long, value_name = "N")]
    pub inject_oom_above: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MicroBatch {
    Auto,
    Fixed(u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Precision {
    Fp32,
    Bf16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceArg {
    Cpu,
    Cuda(usize),
}

impl std::fmt::Display for DeviceArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceArg::Cpu => f.write_str("cpu"),
            DeviceArg::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

fn parse_micro_batch(text: &str) -> Result<MicroBatch, String> {
    if text == "auto" {
        return Ok(MicroBatch::Auto);
    }
    match text.parse::<u32>() {
        Ok(n) if n >= 1 => Ok(MicroBatch::Fixed(n)),
        _ => Err(format!("{text:?} is neither a positive number nor `auto`")),
    }
}

fn parse_device(text: &str) -> Result<DeviceArg, String> {
    match text {
        "cpu" => Ok(DeviceArg::Cpu),
        "cuda" => Ok(DeviceArg::Cuda(0)),
        _ => text
            .strip_prefix("cuda:")
            .and_then(|n| n.parse::<usize>().ok())
            .map(DeviceArg::Cuda)
            .ok_or_else(|| format!("{text:?}: expected cpu, cuda or cuda:N")),
    }
}

fn parse_positive(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("{text:?} is not a positive number")),
    }
}

fn parse_non_negative(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("{text:?} is not a number of at least 0")),
    }
}

fn parse_fraction(text: &str) -> Result<f64, String> {
    gpuctl_core::config::parse_fraction(text)
}

pub fn validate(args: &Args) -> Result<(), Failure> {
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
pub fn cuda_only(args: &Args, why: &str) -> Result<(), Failure> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_parse_as_users_write_them() {
        assert_eq!(parse_micro_batch("auto"), Ok(MicroBatch::Auto));
        assert_eq!(parse_micro_batch("4"), Ok(MicroBatch::Fixed(4)));
        assert!(parse_micro_batch("0").is_err());
        assert_eq!(parse_device("cuda:3"), Ok(DeviceArg::Cuda(3)));
        assert_eq!(parse_device("cuda"), Ok(DeviceArg::Cuda(0)));
        assert!(parse_device("gpu").is_err());
        assert!(parse_positive("0").is_err());
        assert!(parse_fraction("1.5").is_err());
    }
}
