//! What gpuctl-core already knows, for `gpuctl.torch` to use rather than derive again: the
//! processes below a process as `gpuctl run` finds them, text escaped as every table and log
//! line escapes it, memory written as every message writes it, and the NVML GPU behind a
//! CUDA device index, each GPU named as `--gpu` names it.

use gpuctl_core::CoreError;
use gpuctl_core::host::tree;
use gpuctl_core::nvml::Place;
use gpuctl_core::session::{Session, SessionOptions};
use gpuctl_core::{text, units};
use pyo3::prelude::*;

use crate::{Failure, outside_gil};

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

/// The NVML GPU (and MIG GPU instance) behind CUDA device `index`, and how it was found.
/// CUDA numbers what CUDA_VISIBLE_DEVICES (`visible`) names, in its order, up to the first
/// entry that names nothing; each entry is resolved as `--gpu` resolves a name (an index, a
/// GPU UUID or a unique prefix of it, a MIG UUID). Without it, the index is NVML's. A CUDA
/// device that is no GPU: `UsageError` saying why.
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
        let (place, how) = match visible {
            None => (
                place_of(&session, &index.to_string(), |why| {
                    format!("NVML has no GPU {index} (CUDA_VISIBLE_DEVICES is not set): {why}")
                })?,
                "NVML's index (CUDA_VISIBLE_DEVICES is not set)".to_string(),
            ),
            Some(visible) => visible_place(&session, index, &visible)?,
        };
        let how = match place.gpu_instance {
            Some(instance) => format!("{how}, MIG instance {}/{instance}", place.gpu),
            None => how,
        };
        Ok((place.gpu, place.gpu_instance, how))
    })
}

/// CUDA device `index` among those `visible` (CUDA_VISIBLE_DEVICES) names.
fn visible_place(
    session: &Session,
    index: usize,
    visible: &str,
) -> Result<(Place, String), Failure> {
    let shown = text::escape(visible);
    let entries: Vec<&str> = match visible.trim() {
        "" => Vec::new(),
        _ => visible.split(',').map(str::trim).collect(),
    };
    let Some(wanted) = entries.get(index) else {
        return Err(Failure::usage(format!(
            "CUDA_VISIBLE_DEVICES={shown} makes no cuda:{index} visible"
        )));
    };
    for earlier in &entries[..index] {
        place_of(session, earlier, |why| {
            format!(
                "CUDA_VISIBLE_DEVICES={shown} makes no cuda:{index} visible: CUDA stops at '{}', \
                 which names no GPU ({why})",
                text::escape(earlier)
            )
        })?;
    }
    let place = place_of(session, wanted, |why| {
        format!(
            "no GPU NVML lists matches '{}' of CUDA_VISIBLE_DEVICES={shown} ({why})",
            text::escape(wanted)
        )
    })?;
    Ok((place, format!("CUDA_VISIBLE_DEVICES={shown}")))
}

/// The place `name` names, through the session; a name that names none is `worded`'s usage
/// error, any other failure (NVML's) its own.
fn place_of(
    session: &Session,
    name: &str,
    worded: impl FnOnce(&str) -> String,
) -> Result<Place, Failure> {
    match session.places(&[name.to_string()]) {
        Ok(places) => places
            .and_then(|places| places.into_iter().next())
            .ok_or_else(|| Failure::usage(worded("an empty name"))),
        Err(CoreError::GpuSelector(why)) => Err(Failure::usage(worded(&why))),
        Err(other) => Err(other.into()),
    }
}
