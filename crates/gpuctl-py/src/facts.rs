//! What gpuctl-core already knows, for `gpuctl.torch` to use rather than derive again: the
//! processes below a process as `gpuctl run` finds them, text escaped as every table and log
//! line escapes it, memory written as every message writes it, and the NVML GPU behind a
//! CUDA device index, each GPU named as `--gpu` names it.

use gpuctl_core::host::tree;
use gpuctl_core::session::{Session, SessionOptions};
use gpuctl_core::{text, units};
use pyo3::prelude::*;

use crate::outside_gil;

/// Registers this module's functions in `gpuctl._gpuctl`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(descendants, m)?)?;
    m.add_function(wrap_pyfunction!(escape, m)?)?;
    m.add_function(wrap_pyfunction!(bytes, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_place, m)?)?;
    Ok(())
}

/// Every process below `pid` (its children, theirs, and those orphaned to it as a
/// subreaper), sorted: core's process tree, the one `gpuctl run` ends leftovers from.
#[pyfunction]
fn descendants(py: Python<'_>, pid: u32) -> PyResult<Vec<u32>> {
    outside_gil(py, || {
        let mut pids: Vec<u32> = tree::descendants(pid).iter().map(|s| s.pid).collect();
        pids.sort_unstable();
        Ok(pids)
    })
}

/// `text` with its control and bidirectional characters written as escapes (`\e`, `\n`,
/// `\u{202e}`), as every table, log line and message of gpuctl shows what a process chose.
#[pyfunction]
fn escape(text: &str) -> String {
    text::escape(text).into_owned()
}

/// Memory as gpuctl's messages write it ("40.0 GiB", "512 MiB", "12 KiB", "100 B"), with
/// `decimals` digits from GiB up (the trainer's messages, and gpuctl.torch's, show 2).
#[pyfunction]
#[pyo3(signature = (value, decimals = 1))]
fn bytes(value: u64, decimals: usize) -> String {
    units::bytes_to(value, decimals)
}

/// The NVML GPU (and MIG GPU instance) behind CUDA device `index`, and how it was found
/// (core's [`Session::cuda_place`]). A CUDA device that is no GPU: `UsageError` saying why.
#[pyfunction]
#[pyo3(signature = (index, visible))]
fn cuda_place(
    py: Python<'_>,
    index: usize,
    visible: Option<String>,
) -> PyResult<(u32, Option<u32>, String)> {
    outside_gil(py, move || {
        let session = Session::open_with(&SessionOptions {
            config_optional: true,
            ..SessionOptions::default()
        })?;
        let (place, how) = session.cuda_place(index, visible.as_deref())?;
        Ok((place.gpu, place.gpu_instance, how))
    })
}
