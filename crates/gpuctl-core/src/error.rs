//! Errors of the core library. Binaries map them to exit codes.

use std::path::PathBuf;

/// Failures that stop a whole operation. Per-GPU and per-process problems are not errors:
/// they are reported inside the snapshot so the other GPUs are still shown.
#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    /// The NVML library could not be loaded or initialised.
    #[error("NVML is unavailable ({library}): {reason}. {hint}")]
    NvmlUnavailable {
        library: String,
        reason: String,
        hint: &'static str,
    },
    /// An NVML call that the whole operation needs failed.
    #[error("NVML call {call} failed: {reason}")]
    Nvml { call: &'static str, reason: String },
    /// A `--gpu` selector matched no GPU, or more than one.
    #[error("{0}")]
    GpuSelector(String),
    /// A setting from the environment that cannot be read.
    #[error("{0}")]
    BadSetting(String),
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = CoreError> = std::result::Result<T, E>;
