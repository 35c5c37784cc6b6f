//! The modelled NVML entry points. Every body runs under `guard!` (catch_unwind), so no
//! panic crosses the C boundary: a panic becomes NVML_ERROR_UNKNOWN.

#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)]

use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong};

use crate::scenario::{ComputeMode, Feature, PciBusId};
use crate::sim::{self, INIT_COUNT, Sim, handle_of, index_of};
use crate::state::{AppClocks, ClockRange};
use crate::types::*;

macro_rules! guard {
    ($body:expr) => {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> nvmlReturn_t { $body })) {
            Ok(code) => code,
            Err(_) => NVML_ERROR_UNKNOWN,
        }
    };
}

const MIB: u64 = 1024 * 1024;

mod board;
mod details;
mod enumeration;
mod events;
mod identity;
mod internal;
mod mig;
mod processes;
mod sensors;
mod settings;
mod system;

// The helpers more than one module answers from (details.rs and the export table reuse the
// public queries' models).
use enumeration::by_index;
use processes::{is_any, is_compute, is_graphics, is_mps, procs_of};
use sensors::{current_clock, max_clock, power_usage, temperature};
use settings::app_clock;
use system::process_name;

fn with_sim(f: impl FnOnce(&mut Sim) -> nvmlReturn_t) -> nvmlReturn_t {
    let mut guard = sim::lock();
    match guard.as_mut() {
        None => NVML_ERROR_UNINITIALIZED,
        Some(s) => f(s),
    }
}

/// What a device handle names: a whole GPU (by index) or a MIG device on one.
#[derive(Debug, Clone, Copy)]
enum Target {
    Gpu(usize),
    Mig {
        gpu: usize,
        gi: u32,
        ci: u32,
        /// Its index under the parent (`nvmlDeviceGetMigDeviceHandleByIndex`).
        index: usize,
    },
}

/// Runs `f` for a valid, present (not lost) device; checks `feature` is supported. A GPU
/// with `hang_ms` blocks the call that long first, outside the sim's lock, so calls on other
/// GPUs go on meanwhile (as a real driver lets them, mostly). The scenario is read again
/// while blocked: lowering hang_ms (to 0) lets blocked calls answer, as a GPU that recovers
/// does. A call that does not hang takes the lock once.
///
/// A MIG device handle goes through its parent GPU's checks (lost, hang, faults,
/// `unsupported`); one whose instance no longer exists (the scenario changed) is
/// INVALID_ARGUMENT, as the driver answers a handle of a destroyed instance.
fn with_target(
    device: nvmlDevice_t,
    feature: Option<Feature>,
    f: impl FnOnce(&mut Sim, Target) -> nvmlReturn_t,
) -> nvmlReturn_t {
    let started = std::time::Instant::now();
    let mut f = Some(f);
    loop {
        let mut blocked_for = None;
        let code = with_sim(|s| {
            let (index, mig) = match (index_of(device), sim::mig_of(device)) {
                (Some(i), _) => (i, None),
                (None, Some((gpu, gi, ci))) => (gpu, Some((gi, ci))),
                (None, None) => return NVML_ERROR_INVALID_ARGUMENT,
            };
            s.refresh();
            if index >= s.scenario.gpus.len() || s.gpu(index).lost {
                return NVML_ERROR_GPU_IS_LOST;
            }
            let hang = std::time::Duration::from_millis(s.gpu(index).hang_ms);
            if let Some(left) = hang
                .checked_sub(started.elapsed())
                .filter(|left| !left.is_zero())
            {
                blocked_for = Some(left);
                return NVML_SUCCESS;
            }
            if let Some(fault) = s.inject_fault() {
                return fault;
            }
            let target = match mig {
                None => Target::Gpu(index),
                Some((gi, ci)) => {
                    let g = s.gpu(index);
                    match g.mig_instance(gi, ci) {
                        Some((k, _)) if g.mig_mode => Target::Mig {
                            gpu: index,
                            gi,
                            ci,
                            index: k,
                        },
                        _ => return NVML_ERROR_INVALID_ARGUMENT,
                    }
                }
            };
            if let Some(feature) = feature
                && !s.gpu(index).supports(feature)
            {
                return NVML_ERROR_NOT_SUPPORTED;
            }
            match f.take() {
                Some(f) => f(s, target),
                None => NVML_ERROR_UNKNOWN,
            }
        });
        match blocked_for {
            Some(left) => std::thread::sleep(left.min(std::time::Duration::from_millis(20))),
            None => return code,
        }
    }
}

/// [`with_target`] for a query of the whole GPU: on a MIG device handle it is
/// NOT_SUPPORTED, as the driver answers most queries there (temperature, power, clocks,
/// PCI, ...); the queries a MIG device answers use `with_target`.
fn with_dev(
    device: nvmlDevice_t,
    feature: Option<Feature>,
    f: impl FnOnce(&mut Sim, usize) -> nvmlReturn_t,
) -> nvmlReturn_t {
    with_target(device, feature, |s, t| match t {
        Target::Gpu(i) => f(s, i),
        Target::Mig { .. } => NVML_ERROR_NOT_SUPPORTED,
    })
}

/// `with_dev` for an answer that does not come from the scenario: traced as a default.
fn fixed(
    name: &str,
    device: nvmlDevice_t,
    f: impl FnOnce(&mut Sim, usize) -> nvmlReturn_t,
) -> nvmlReturn_t {
    crate::trace::gap(name, crate::trace::Gap::Default);
    with_dev(device, None, f)
}

/// Writes `v` through `p`; a null `p` is INVALID_ARGUMENT.
unsafe fn put<T>(p: *mut T, v: T) -> nvmlReturn_t {
    if p.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: the caller passes a pointer to a writable T (the NVML contract).
    unsafe { p.write_unaligned(v) };
    NVML_SUCCESS
}

/// Copies `s` and a NUL into a caller buffer of `len` bytes.
unsafe fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> nvmlReturn_t {
    if buf.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if s.len() + 1 > len as usize {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    // SAFETY: the buffer holds at least `len` >= s.len() + 1 bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), s.len());
        *buf.add(s.len()) = 0;
    }
    NVML_SUCCESS
}

fn fill_chars<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (o, b) in out.iter_mut().zip(s.bytes().take(N - 1)) {
        *o = b as c_char;
    }
    out
}

/// The size-query convention of NVML list functions: with a null buffer or a count too
/// small, write the needed count and return INSUFFICIENT_SIZE; an empty list is SUCCESS
/// with count 0.
unsafe fn put_list<T: Copy>(count: *mut c_uint, out: *mut T, items: &[T]) -> nvmlReturn_t {
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: count is non-null and points to a c_uint (NVML contract).
    unsafe {
        let cap = *count as usize;
        *count = items.len() as c_uint;
        if items.is_empty() {
            return NVML_SUCCESS;
        }
        if out.is_null() || cap < items.len() {
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        std::ptr::copy_nonoverlapping(items.as_ptr(), out, items.len());
    }
    NVML_SUCCESS
}

unsafe fn c_str<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null, and NVML callers pass NUL-terminated strings.
    unsafe { CStr::from_ptr(p) }.to_str().ok()
}
