//! The modelled NVML entry points. Every body runs under `guard!` (catch_unwind), so no
//! panic crosses the C boundary: a panic becomes NVML_ERROR_UNKNOWN.

#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)]

use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong};

use crate::scenario::{ComputeMode, Feature, PciBusId};
use crate::sim::{self, INIT_COUNT, Sim, handle_of, index_of};
use crate::state::{AppClocks, ClockRange};
use crate::types::*;

/// Runs an export's body under catch_unwind. The forms with `mut` and `buf` first take the
/// pointer parameters they name, once, into what the body works on:
///
/// - `mut p, q => body`: each out-pointer becomes an `Option<&mut T>` (`None` for null);
/// - `buf b => body`: each caller array (a string, a list) becomes a [`Buf`], sliced where
///   its length is known;
/// - `mut p; buf b => body`: both.
///
/// The null check stays in the body ([`put`], `let Some(..) else`), where each export has
/// always made it: after the device checks (uninitialized, lost, hang, injected fault,
/// unsupported), whose return codes come first.
macro_rules! guard {
    (mut $($p:ident),+ ; buf $($b:ident),+ => $body:expr) => {
        guard!(mut $($p),+ => guard!(@buf $($b),+ => $body))
    };
    (mut $($p:ident),+ => $body:expr) => {
        guard!({
            // SAFETY: NVML's contract for an out-parameter: null, or the address of a `T`
            // the caller owns for the call (aligned, as every C object is) and no one else
            // touches meanwhile. Each is a distinct parameter, so no two alias.
            let ($($p,)+) = unsafe { ($($p.as_mut(),)+) };
            $body
        })
    };
    (buf $($b:ident),+ => $body:expr) => {
        guard!(guard!(@buf $($b),+ => $body))
    };
    (@buf $($b:ident),+ => $body:expr) => {{
        // SAFETY: NVML's contract for a caller array: null, or as many writable elements as
        // the call's length (or count) argument says, which is what `Buf::new` asks.
        let ($($b,)+) = unsafe { ($(Buf::new($b),)+) };
        $body
    }};
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
mod health;
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

/// Writes `v` to an out-parameter; a null one is INVALID_ARGUMENT.
fn put<T>(out: Option<&mut T>, v: T) -> nvmlReturn_t {
    match out {
        None => NVML_ERROR_INVALID_ARGUMENT,
        Some(out) => {
            *out = v;
            NVML_SUCCESS
        }
    }
}

/// A caller's array (a string buffer, a list). How many elements it holds is another
/// argument, read in the body, so it stays a pointer until [`Buf::slice`] is given that.
struct Buf<T>(*mut T);

impl<T> Buf<T> {
    /// # Safety
    ///
    /// `p` is null, or points to as many writable `T` as the call's length or count
    /// argument says (or nvml.h fixes), owned by the caller for the call.
    unsafe fn new(p: *mut T) -> Self {
        Buf(p)
    }

    fn is_null(&self) -> bool {
        self.0.is_null()
    }

    /// The array as the `len` elements the caller said it holds; `None` when null.
    fn slice<'a>(self, len: usize) -> Option<&'a mut [T]> {
        // SAFETY: non-null, and `Buf::new`'s contract is that it holds `len` elements;
        // `self` is consumed, so the slice is the only view of it.
        (!self.0.is_null()).then(|| unsafe { std::slice::from_raw_parts_mut(self.0, len) })
    }
}

/// Copies `s` and a NUL into a caller buffer of `len` bytes.
fn put_str(buf: Buf<c_char>, len: c_uint, s: &str) -> nvmlReturn_t {
    if buf.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if s.len() + 1 > len as usize {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    let Some(buf) = buf.slice(s.len() + 1) else {
        return NVML_ERROR_INVALID_ARGUMENT;
    };
    for (o, b) in buf.iter_mut().zip(s.bytes().chain([0])) {
        *o = b as c_char;
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
fn put_list<T: Copy>(count: Option<&mut c_uint>, out: Buf<T>, items: &[T]) -> nvmlReturn_t {
    let Some(count) = count else {
        return NVML_ERROR_INVALID_ARGUMENT;
    };
    let cap = *count as usize;
    *count = items.len() as c_uint;
    if items.is_empty() {
        return NVML_SUCCESS;
    }
    if cap < items.len() {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    match out.slice(items.len()) {
        None => NVML_ERROR_INSUFFICIENT_SIZE,
        Some(out) => {
            out.copy_from_slice(items);
            NVML_SUCCESS
        }
    }
}

/// # Safety
///
/// `p` is null or a NUL-terminated string that outlives `'a`.
unsafe fn c_str<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null, and NVML callers pass NUL-terminated strings.
    unsafe { CStr::from_ptr(p) }.to_str().ok()
}
