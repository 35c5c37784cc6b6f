//! What an NVML query's error means for one field of a GPU's snapshot: the figures
//! (`read.rs`) and the health (`health.rs`) read their fields alike.

use nvml_wrapper::error::NvmlError;

/// `Ok(None)` for a field this GPU or driver does not offer; `Err` only for a lost GPU.
pub(super) fn optional<T>(result: Result<T, NvmlError>) -> Result<Option<T>, NvmlError> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(NvmlError::GpuLost) => Err(NvmlError::GpuLost),
        Err(_) => Ok(None),
    }
}
