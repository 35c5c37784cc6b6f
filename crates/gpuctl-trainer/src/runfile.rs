//! The run file and startup cleanup live in gpuctl-core (`gpuctl_core::runfile`), shared with
//! the Python package's `RunGuard`: one format and one lock for every front.

pub use gpuctl_core::runfile::*;
