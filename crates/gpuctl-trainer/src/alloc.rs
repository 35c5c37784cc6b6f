//! The allocator bridge's safe face: libtorch's caching device allocator (empty the cache,
//! statistics, peak marks, free memory, the per-process fraction) and the CUDA autocast
//! dtype, none of which tch exposes. The C++ side (shim/alloc_shim.cpp) catches every
//! exception at the boundary and hands back its message.

use std::ffi::{CStr, c_char, c_int};

/// The caching allocator's figures for one device, in bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocatorStats {
    pub allocated_bytes: i64,
    pub allocated_peak_bytes: i64,
    pub reserved_bytes: i64,
    pub reserved_peak_bytes: i64,
    pub active_bytes: i64,
    /// cudaMalloc failures that forced the cache to be emptied and the call retried.
    pub num_alloc_retries: i64,
    pub num_ooms: i64,
}

unsafe extern "C" {
    fn gpuctl_shim_has_cuda() -> c_int;
    fn gpuctl_empty_cache(error: *mut c_char, error_size: usize) -> c_int;
    fn gpuctl_device_stats(
        device: c_int,
        out: *mut AllocatorStats,
        error: *mut c_char,
        error_size: usize,
    ) -> c_int;
    fn gpuctl_reset_peak_stats(device: c_int, error: *mut c_char, error_size: usize) -> c_int;
    fn gpuctl_memory_info(
        device: c_int,
        free_bytes: *mut u64,
        total_bytes: *mut u64,
        error: *mut c_char,
        error_size: usize,
    ) -> c_int;
    fn gpuctl_set_memory_fraction(
        fraction: f64,
        device: c_int,
        error: *mut c_char,
        error_size: usize,
    ) -> c_int;
    fn gpuctl_autocast_dtype_bf16(error: *mut c_char, error_size: usize) -> c_int;
    fn gpuctl_count_host_allocations(error: *mut c_char, error_size: usize) -> c_int;
    fn gpuctl_host_stats(current: *mut i64, peak: *mut i64);
    fn gpuctl_host_reset_peak();
}

/// A libtorch error, as its message's first part (without the C++ backtrace).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AllocError(pub String);

/// Calls a shim function with an error buffer; a non-zero return carries the message.
fn call(f: impl FnOnce(*mut c_char, usize) -> c_int) -> Result<(), AllocError> {
    let mut buffer = [0 as c_char; 512];
    if f(buffer.as_mut_ptr(), buffer.len()) == 0 {
        return Ok(());
    }
    // SAFETY: the shim writes a NUL-terminated message of at most `buffer.len()` bytes
    // (snprintf), and the buffer starts zeroed.
    let message = unsafe { CStr::from_ptr(buffer.as_ptr()) };
    Err(AllocError(message.to_string_lossy().into_owned()))
}

/// Whether the bridge was compiled with the CUDA allocator (needed for the memory fraction).
pub fn has_cuda() -> bool {
    // SAFETY: no arguments, no state.
    unsafe { gpuctl_shim_has_cuda() != 0 }
}

/// Returns the allocator's unused cached blocks to the driver (`torch.cuda.empty_cache()`).
pub fn empty_cache() -> Result<(), AllocError> {
    // SAFETY: the error buffer is valid for its length.
    call(|error, size| unsafe { gpuctl_empty_cache(error, size) })
}

/// `torch.cuda.memory_stats(device)`'s aggregate figures.
pub fn device_stats(device: usize) -> Result<AllocatorStats, AllocError> {
    let mut stats = AllocatorStats::default();
    // SAFETY: `stats` is a repr(C) mirror of the shim's struct, valid for writing.
    call(|error, size| unsafe { gpuctl_device_stats(device as c_int, &mut stats, error, size) })?;
    Ok(stats)
}

/// `torch.cuda.reset_peak_memory_stats(device)`.
pub fn reset_peak_stats(device: usize) -> Result<(), AllocError> {
    // SAFETY: as in `empty_cache`.
    call(|error, size| unsafe { gpuctl_reset_peak_stats(device as c_int, error, size) })
}

/// Free and total device memory as the allocator's device sees it (`cudaMemGetInfo`).
pub fn memory_info(device: usize) -> Result<(u64, u64), AllocError> {
    let (mut free, mut total) = (0u64, 0u64);
    // SAFETY: both outputs are valid for writing.
    call(|error, size| unsafe {
        gpuctl_memory_info(device as c_int, &mut free, &mut total, error, size)
    })?;
    Ok((free, total))
}

/// `torch.cuda.set_per_process_memory_fraction(fraction, device)`: allocations beyond this
/// share of the device fail as out of memory.
pub fn set_memory_fraction(fraction: f64, device: usize) -> Result<(), AllocError> {
    // SAFETY: as in `empty_cache`.
    call(|error, size| unsafe {
        gpuctl_set_memory_fraction(fraction, device as c_int, error, size)
    })
}

/// Makes CUDA autocast compute in bfloat16 (its default is float16).
pub fn autocast_bf16() -> Result<(), AllocError> {
    // SAFETY: as in `empty_cache`.
    call(|error, size| unsafe { gpuctl_autocast_dtype_bf16(error, size) })
}

/// Routes libtorch's CPU tensor allocations through a counting allocator, so that
/// `host_stats` has figures. Call before the first tensor is made: earlier ones are not
/// counted (each storage keeps the deleter it was allocated with, so none is uncounted twice).
pub fn count_host_allocations() -> Result<(), AllocError> {
    // SAFETY: as in `empty_cache`.
    call(|error, size| unsafe { gpuctl_count_host_allocations(error, size) })
}

/// Bytes of CPU tensor storage alive now, and the peak since the last reset.
pub fn host_stats() -> (i64, i64) {
    let (mut current, mut peak) = (0i64, 0i64);
    // SAFETY: two valid outputs; the shim only loads two atomics.
    unsafe { gpuctl_host_stats(&mut current, &mut peak) };
    (current, peak)
}

/// Starts the host peak over from what is alive now.
pub fn host_reset_peak() {
    // SAFETY: no arguments; stores to an atomic.
    unsafe { gpuctl_host_reset_peak() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_an_accelerator_errors_come_back_as_messages() {
        if tch::Cuda::is_available() {
            eprintln!("skipped: this machine has CUDA (scripts/gpu covers it)");
            return;
        }
        // No CUDA runtime loaded: libtorch throws, and the message crosses the boundary.
        let error = device_stats(0).unwrap_err();
        assert!(!error.0.is_empty());
        assert!(!error.0.contains("Exception raised from"), "{error}");
        assert!(empty_cache().is_err());
    }
}
