//! A GPU's process lists, each in one NVML call where it fits.

use std::os::raw::c_uint;

use nvml_wrapper::Device;
use nvml_wrapper::error::{NvmlError, nvml_try};
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper_sys::bindings::{
    nvmlProcessInfo_t, nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE as INSUFFICIENT_SIZE,
    nvmlReturn_enum_NVML_SUCCESS as SUCCESS,
};

/// Which of a GPU's process lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessList {
    Compute,
    Graphics,
    /// The clients of the GPU's MPS server.
    Mps,
}

/// Entries asked for at first: more than a GPU lists but on the busiest servers (24 bytes
/// each).
const FIRST_ROOM: c_uint = 256;

/// One of `device`'s process lists. nvml-wrapper asks for the count first and then for the
/// list, two calls (and the driver walks its contexts twice); nvidia-smi asks once with
/// room to spare, as this does. A list that outgrew the room is asked again at the size
/// NVML said it needs, with headroom for processes started meanwhile.
pub fn processes(device: &Device<'_>, list: ProcessList) -> Result<Vec<ProcessInfo>, NvmlError> {
    let lib = device.nvml().lib();
    let get = match list {
        ProcessList::Compute => lib.nvmlDeviceGetComputeRunningProcesses_v3.as_ref(),
        ProcessList::Graphics => lib.nvmlDeviceGetGraphicsRunningProcesses_v3.as_ref(),
        ProcessList::Mps => lib.nvmlDeviceGetMPSComputeRunningProcesses_v3.as_ref(),
    }
    .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    let mut room = FIRST_ROOM;
    let mut code = SUCCESS;
    // A list still growing after the third try is left as NVML's error.
    for _ in 0..3 {
        // SAFETY: nvmlProcessInfo_t is plain integers, for which all zeroes are valid.
        let mut infos: Vec<nvmlProcessInfo_t> = vec![unsafe { std::mem::zeroed() }; room as usize];
        let mut count = room;
        // SAFETY: a valid device handle, and `count` the length of `infos`, as nvml.h says.
        code = unsafe { get(device.handle(), &mut count, infos.as_mut_ptr()) };
        match code {
            SUCCESS => {
                infos.truncate(count as usize);
                return Ok(infos.into_iter().map(ProcessInfo::from).collect());
            }
            // Grown meanwhile: NVML names the room it needs now.
            INSUFFICIENT_SIZE if count > room => {
                room = count.saturating_add(16);
            }
            _ => break,
        }
    }
    nvml_try(code).map(|()| Vec::new())
}
