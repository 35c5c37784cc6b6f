//! How the trainer speaks on stderr: a progress line (`log`), and the failure that ends a
//! run, with its exit status (`Failure`).

use gpuctl_core::exit::Exit;

/// A failure, with its exit status (documented in --help and docs/guide/trainer.md).
#[derive(Debug)]
pub enum Failure {
    Failed(String),
    Usage(String),
    NoCuda(String),
    NotFree(String),
    OutOfMemory(String),
    /// What gpuctl-core refused, with the status its kind documents.
    Core(gpuctl_core::CoreError),
}

impl From<gpuctl_core::CoreError> for Failure {
    fn from(error: gpuctl_core::CoreError) -> Failure {
        Failure::Core(error)
    }
}

impl Failure {
    pub fn exit(&self) -> Exit {
        match self {
            Failure::Failed(_) => Exit::Failed,
            Failure::Usage(_) => Exit::Usage,
            Failure::NoCuda(_) => Exit::Unavailable,
            Failure::NotFree(_) => Exit::NotClean,
            Failure::OutOfMemory(_) => Exit::OutOfMemory,
            Failure::Core(error) => error.exit(),
        }
    }

    pub fn message(&self) -> String {
        match self {
            Failure::Failed(m)
            | Failure::Usage(m)
            | Failure::NoCuda(m)
            | Failure::NotFree(m)
            | Failure::OutOfMemory(m) => m.clone(),
            Failure::Core(error) => error.to_string(),
        }
    }
}

/// One line on stderr, prefixed with the program's name.
pub fn log(line: impl AsRef<str>) {
    eprintln!("gpuctl-trainer: {}", line.as_ref());
}
