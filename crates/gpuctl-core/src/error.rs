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
    /// A request that cannot be carried out as given: a bad value.
    #[error("{0}")]
    Usage(String),
    /// A request that selects no process: it must give at least one of `fields`, named as
    /// the request names them. A front words them as its users give them
    /// ([`CoreError::worded`]: `--pid` on the command line, `pids=` in Python).
    #[error("no process selected: give {}", either(fields.iter().copied()))]
    NothingSelected { fields: &'static [&'static str] },
    /// The configuration could not be read or is not trusted.
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file gpuctl writes could not be written; `hint` says what to do where the cause
    /// is a permission (" (… run as root)"), else it is empty.
    #[error("cannot write {path}: {source}{hint}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
        hint: &'static str,
    },
}

pub type Result<T, E = CoreError> = std::result::Result<T, E>;

impl CoreError {
    /// The documented exit status of a command that stopped on this error.
    pub fn exit(&self) -> Exit {
        match self {
            CoreError::NvmlUnavailable { .. } => Exit::Unavailable,
            CoreError::GpuSelector(_)
            | CoreError::BadSetting(_)
            | CoreError::Usage(_)
            | CoreError::NothingSelected { .. } => Exit::Usage,
            CoreError::Config(error) => config_exit(error),
            CoreError::Nvml { .. } | CoreError::Io { .. } | CoreError::Write { .. } => Exit::Failed,
        }
    }
}

impl CoreError {
    /// This error in a front's own words: `word` names a request field as the front's users
    /// give it (`pids`: `--pid`, `pids=`), `None` for a field the front does not offer. An
    /// error that names no field is returned as it is; the exit status stays the same.
    pub fn worded(self, word: impl Fn(&str) -> Option<&'static str>) -> CoreError {
        match self {
            CoreError::NothingSelected { fields } => CoreError::Usage(format!(
                "no process selected: give {}",
                either(fields.iter().filter_map(|field| word(field)))
            )),
            other => other,
        }
    }
}

/// "a, b or c".
fn either<'a>(words: impl Iterator<Item = &'a str>) -> String {
    let words: Vec<&str> = words.collect();
    match words.split_last() {
        None => String::new(),
        Some((last, [])) => last.to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

/// A configuration file that is invalid or not trusted is bad input, like a bad option.
pub(crate) fn config_exit(_: &ConfigError) -> Exit {
    Exit::Usage
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_front_words_the_fields_it_offers_and_keeps_the_exit() {
        let nothing = || CoreError::NothingSelected {
            fields: &["pids", "gpus", "all"],
        };
        assert_eq!(
            nothing().to_string(),
            "no process selected: give pids, gpus or all"
        );
        let flag = |field: &str| match field {
            "pids" => Some("--pid"),
            "gpus" => Some("--gpu"),
            "all" => Some("--all"),
            _ => None,
        };
        let worded = nothing().worded(flag);
        assert_eq!(
            worded.to_string(),
            "no process selected: give --pid, --gpu or --all"
        );
        assert_eq!(worded.exit(), Exit::Usage);
        // Python offers no `all`: it is left out, not named in the wrong words.
        let keyword = |field: &str| (field == "pids").then_some("pids=");
        assert_eq!(
            nothing().worded(keyword).to_string(),
            "no process selected: give pids="
        );
        // An error naming no field is left as it is.
        let other = CoreError::GpuSelector("no GPU matches '9'".into());
        assert_eq!(other.worded(flag).to_string(), "no GPU matches '9'");
    }
}
