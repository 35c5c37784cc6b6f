//! This process's view of a GPU through the CUDA driver (libcuda, loaded at run time): free
//! and total memory of its context, which startup cleanup waits on. It lives here, not in
//! gpuctl-core, so the CLI and the watchdog do not link cudarc. It uses the device's primary
//! context, the one PyTorch and the CUDA runtime use, so asking creates no second context (a
//! context costs hundreds of MiB).

use cudarc::driver::CudaContext;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaMemory {
    pub free_bytes: u64,
    pub total_bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error(
        "no CUDA driver library (libcuda.so) could be loaded: is the NVIDIA driver installed, \
         and is this a machine with a GPU?"
    )]
    NoDriver,
    #[error("CUDA device {ordinal}: {reason}")]
    Driver { ordinal: usize, reason: String },
}

/// Free and total memory of CUDA device `ordinal` (as CUDA numbers devices: after
/// CUDA_VISIBLE_DEVICES) in this process's primary context.
pub fn memory(ordinal: usize) -> Result<CudaMemory, CudaError> {
    // SAFETY: only probes whether the library loads; nothing is called in it.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(CudaError::NoDriver);
    }
    let driver = |reason: String| CudaError::Driver { ordinal, reason };
    // cudarc panics when the driver lacks a symbol it expects (a driver older than its
    // bindings); that is an error to report, not a crash.
    std::panic::catch_unwind(|| {
        let context = CudaContext::new(ordinal).map_err(|e| driver(e.to_string()))?;
        let (free, total) = context.mem_get_info().map_err(|e| driver(e.to_string()))?;
        Ok(CudaMemory {
            free_bytes: free as u64,
            total_bytes: total as u64,
        })
    })
    .unwrap_or_else(|_| {
        Err(driver(
            "the CUDA driver lacks a function gpuctl needs (is the driver older than CUDA 12?)"
                .into(),
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_the_error_says_so() {
        // SAFETY: as in `memory`.
        if unsafe { cudarc::driver::sys::is_culib_present() } {
            eprintln!("skipped: this machine has a CUDA driver (scripts/gpu covers it)");
            return;
        }
        let error = memory(0).unwrap_err();
        assert!(matches!(error, CudaError::NoDriver));
        assert!(error.to_string().contains("libcuda.so"), "{error}");
    }
}
