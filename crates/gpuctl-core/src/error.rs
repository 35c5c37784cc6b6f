//! Errors of the core library. Binaries map them to exit codes.

use std::path::PathBuf;

use crate::config::ConfigError;
use crate::exit::Exit;

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
    /// A request that cannot be carried out as given: no selector, a bad value.
    #[error("{0}")]
    Usage(String),
    /// The configuration could not be read or is not trusted.
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = CoreError> = std::result::Result<T, E>;

impl CoreError {
    /// The documented exit status of a command that stopped on this error.
    pub fn exit(&self) -> Exit {
        match self {
            CoreError::NvmlUnavailable { .. } => Exit::Unavailable,
            CoreError::GpuSelector(_) | CoreError::BadSetting(_) | CoreError::Usage(_) => {
                Exit::Usage
            }
            CoreError::Config(error) => config_exit(error),
            CoreError::Nvml { .. } | CoreError::Io { .. } => Exit::Failed,
        }
    }
}

/// A configuration file that is invalid or not trusted is bad input, like a bad option.
fn config_exit(_: &ConfigError) -> Exit {
    Exit::Usage
}

/// The exit status an error documents, for every binary: the first error of core's own
/// kinds in its chain of causes decides; anything else is a failed operation.
pub fn exit_of(error: &(dyn std::error::Error + 'static)) -> Exit {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if let Some(core) = error.downcast_ref::<CoreError>() {
            return core.exit();
        }
        if let Some(config) = error.downcast_ref::<ConfigError>() {
            return config_exit(config);
        }
        cause = error.source();
    }
    Exit::Failed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_has_its_documented_exit_through_any_wrapping() {
        let unavailable = CoreError::NvmlUnavailable {
            library: "libnvidia-ml.so.1".into(),
            reason: "not found".into(),
            hint: "",
        };
        assert_eq!(exit_of(&unavailable), Exit::Unavailable);
        assert_eq!(exit_of(&CoreError::Usage("x".into())), Exit::Usage);
        assert_eq!(exit_of(&CoreError::GpuSelector("x".into())), Exit::Usage);
        let config = ConfigError::Value("bad".into());
        assert_eq!(exit_of(&config), Exit::Usage);
        assert_eq!(exit_of(&CoreError::from(config)), Exit::Usage);
        let io = std::io::Error::other("disk");
        assert_eq!(exit_of(&io), Exit::Failed);
        // Found as the cause of another error (as anyhow's context wraps it).
        #[derive(Debug, thiserror::Error)]
        #[error("while doing it")]
        struct Context(#[source] CoreError);
        assert_eq!(exit_of(&Context(CoreError::Usage("y".into()))), Exit::Usage);
    }
}
