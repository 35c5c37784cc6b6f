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
mod events;
mod internal;
mod mig;

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

// ---------------------------------------------------------------------------------------
// Init and system

fn init() -> nvmlReturn_t {
    let mut guard = sim::lock();
    if let Some(s) = guard.as_mut() {
        s.refcount += 1;
        INIT_COUNT.store(s.refcount, std::sync::atomic::Ordering::SeqCst);
        return NVML_SUCCESS;
    }
    match Sim::open() {
        Ok(s) => {
            *guard = Some(s);
            INIT_COUNT.store(1, std::sync::atomic::Ordering::SeqCst);
            NVML_SUCCESS
        }
        Err(code) => code,
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit() -> nvmlReturn_t {
    guard!(init())
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    guard!(init())
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    guard!(init())
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    guard!({
        let mut guard = sim::lock();
        let Some(s) = guard.as_mut() else {
            return NVML_ERROR_UNINITIALIZED;
        };
        s.refcount -= 1;
        INIT_COUNT.store(s.refcount, std::sync::atomic::Ordering::SeqCst);
        if s.refcount == 0 {
            *guard = None;
        }
        NVML_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    std::panic::catch_unwind(|| {
        RETURN_CODES
            .iter()
            .find(|(_, code, _)| *code == result)
            .map(|(_, _, text)| text.as_ptr())
            .unwrap_or(c"Unknown Error".as_ptr())
    })
    .unwrap_or(c"Unknown Error".as_ptr())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard!(with_sim(|s| unsafe {
        put_str(version, length, &s.scenario.driver_version)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard!(with_sim(|s| unsafe {
        put_str(version, length, &s.scenario.nvml_version)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(v: *mut c_int) -> nvmlReturn_t {
    guard!(with_sim(|s| unsafe {
        put(v, s.scenario.cuda_driver_version)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(v: *mut c_int) -> nvmlReturn_t {
    guard!(with_sim(|s| unsafe {
        put(v, s.scenario.cuda_driver_version)
    }))
}

/// The process's name as the driver gives it: argv[0] from /proc/PID/cmdline, else comm.
fn process_name(pid: c_uint) -> Option<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .ok()
        .and_then(|c| {
            let first = c.split(|b| *b == 0).next()?.to_vec();
            (!first.is_empty()).then(|| String::from_utf8_lossy(&first).into_owned())
        })
        .or_else(|| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .ok()
                .map(|c| c.trim_end().to_string())
        })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetProcessName(
    pid: c_uint,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard!(with_sim(|_| match process_name(pid) {
        None => NVML_ERROR_NOT_FOUND,
        Some(n) => {
            let n: String = n
                .chars()
                .take((length as usize).saturating_sub(1))
                .collect();
            unsafe { put_str(name, length, &n) }
        }
    }))
}

// ---------------------------------------------------------------------------------------
// Device enumeration

unsafe fn count(out: *mut c_uint) -> nvmlReturn_t {
    with_sim(|s| {
        s.refresh();
        unsafe { put(out, s.scenario.gpus.len() as c_uint) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount(out: *mut c_uint) -> nvmlReturn_t {
    guard!(unsafe { count(out) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(out: *mut c_uint) -> nvmlReturn_t {
    guard!(unsafe { count(out) })
}

unsafe fn handle_where(
    out: *mut nvmlDevice_t,
    pick: impl Fn(&crate::scenario::Gpu) -> bool,
) -> nvmlReturn_t {
    with_sim(|s| {
        if out.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        s.refresh();
        match s.scenario.gpus.iter().find(|g| pick(g)) {
            None => NVML_ERROR_NOT_FOUND,
            Some(g) if g.lost => NVML_ERROR_GPU_IS_LOST,
            Some(g) => unsafe { put(out, handle_of(g.index as usize)) },
        }
    })
}

unsafe fn by_index(index: c_uint, out: *mut nvmlDevice_t) -> nvmlReturn_t {
    with_sim(|s| {
        s.refresh();
        if index as usize >= s.scenario.gpus.len() || out.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        if s.gpu(index as usize).lost {
            return NVML_ERROR_GPU_IS_LOST;
        }
        unsafe { put(out, handle_of(index as usize)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    out: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard!(unsafe { by_index(index, out) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    out: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard!(unsafe { by_index(index, out) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    out: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard!({
        let Some(uuid) = (unsafe { c_str(uuid) }) else {
            return with_sim(|_| NVML_ERROR_INVALID_ARGUMENT);
        };
        if uuid.len() > 4 && uuid[..4].eq_ignore_ascii_case("MIG-") {
            return unsafe { mig::by_uuid(uuid, out) };
        }
        unsafe { handle_where(out, |g| g.uuid.eq_ignore_ascii_case(uuid)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleBySerial(
    serial: *const c_char,
    out: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard!({
        let Some(serial) = (unsafe { c_str(serial) }) else {
            return with_sim(|_| NVML_ERROR_INVALID_ARGUMENT);
        };
        unsafe { handle_where(out, |g| g.serial == serial) }
    })
}

unsafe fn by_pci(bus_id: *const c_char, out: *mut nvmlDevice_t) -> nvmlReturn_t {
    let parsed = unsafe { c_str(bus_id) }.and_then(PciBusId::parse);
    match parsed {
        None => with_sim(|_| NVML_ERROR_INVALID_ARGUMENT),
        Some(p) => unsafe { handle_where(out, |g| g.pci == p) },
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(
    bus_id: *const c_char,
    out: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard!(unsafe { by_pci(bus_id, out) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus_id: *const c_char,
    out: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard!(unsafe { by_pci(bus_id, out) })
}

// ---------------------------------------------------------------------------------------
// Identity

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(d: nvmlDevice_t, out: *mut c_uint) -> nvmlReturn_t {
    // A MIG device answers its index under its parent: nvidia-smi prints it as "MIG Dev"
    // (found by answering a marker and reading where it landed) and lists no MIG device
    // whose index fails.
    guard!(with_target(d, None, |_, t| match t {
        Target::Gpu(i) => unsafe { put(out, i as c_uint) },
        Target::Mig { index, .. } => unsafe { put(out, index as c_uint) },
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    d: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(with_dev(d, Some(Feature::MinorNumber), |s, i| unsafe {
        put(out, s.gpu(i).minor)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    d: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard!(with_target(d, None, |s, t| {
        let n = match t {
            Target::Gpu(i) => s.gpu(i).name.clone(),
            Target::Mig { gpu, index, .. } => {
                let g = s.gpu(gpu);
                format!("{} MIG {}", g.name, g.mig[index].profile.name)
            }
        };
        unsafe { put_str(name, length, &n) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    d: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard!(with_target(d, None, |s, t| {
        let u = match t {
            Target::Gpu(i) => s.gpu(i).uuid.clone(),
            Target::Mig { gpu, gi, ci, .. } => crate::mig::mig_uuid(&s.gpu(gpu).uuid, gi, ci),
        };
        unsafe { put_str(uuid, length, &u) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSerial(
    d: nvmlDevice_t,
    serial: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard!(with_dev(d, Some(Feature::Serial), |s, i| unsafe {
        put_str(serial, length, &s.gpu(i).serial)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBrand(d: nvmlDevice_t, out: *mut c_uint) -> nvmlReturn_t {
    guard!(with_dev(d, Some(Feature::Brand), |_, _| unsafe {
        put(out, NVML_BRAND_NVIDIA)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetArchitecture(
    d: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(with_dev(d, Some(Feature::Architecture), |s, i| unsafe {
        put(out, s.gpu(i).architecture)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    d: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> nvmlReturn_t {
    guard!(with_dev(d, Some(Feature::CudaComputeCapability), |s, i| {
        if major.is_null() || minor.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let (a, b) = s.gpu(i).cuda_cc;
        unsafe {
            put(major, a);
            put(minor, b)
        }
    }))
}

fn pci_info(s: &Sim, i: usize) -> nvmlPciInfo_t {
    let g = s.gpu(i);
    nvmlPciInfo_t {
        busIdLegacy: fill_chars(&g.pci.legacy()),
        domain: g.pci.domain,
        bus: g.pci.bus,
        device: g.pci.device,
        pciDeviceId: g.pci_device_id,
        pciSubSystemId: g.pci_subsystem_id,
        busId: fill_chars(&g.pci.long()),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo(
    d: nvmlDevice_t,
    out: *mut nvmlPciInfo_v1_t,
) -> nvmlReturn_t {
    guard!(with_dev(d, Some(Feature::PciInfo), |s, i| {
        let g = s.gpu(i);
        let v1 = nvmlPciInfo_v1_t {
            busId: fill_chars(&g.pci.legacy()),
            domain: g.pci.domain,
            bus: g.pci.bus,
            device: g.pci.device,
            pciDeviceId: g.pci_device_id,
            pciSubSystemId: g.pci_subsystem_id,
            reserved: [0; 4],
        };
        unsafe { put(out, v1) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v2(
    d: nvmlDevice_t,
    out: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    guard!(with_dev(d, Some(Feature::PciInfo), |s, i| unsafe {
        put(out, pci_info(s, i))
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    d: nvmlDevice_t,
    out: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    guard!(with_dev(d, Some(Feature::PciInfo), |s, i| unsafe {
        put(out, pci_info(s, i))
    }))
}

// ---------------------------------------------------------------------------------------
// Memory, utilization, sensors

/// (total, reserved, free, used) in bytes: of the GPU, or of a MIG device's GPU instance.
fn memory_of(s: &mut Sim, t: Target) -> (u64, u64, u64, u64) {
    match t {
        Target::Gpu(i) => s.memory_bytes(i),
        Target::Mig { gpu, gi, .. } => s.mig_memory_bytes(gpu, gi),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    d: nvmlDevice_t,
    out: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    guard!(with_target(d, Some(Feature::Memory), |s, t| {
        if out.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let (total, _reserved, free, _used) = memory_of(s, t);
        // v1 folds the reserved memory into `used`.
        unsafe {
            put(
                out,
                nvmlMemory_t {
                    total,
                    free,
                    used: total - free,
                },
            )
        }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    d: nvmlDevice_t,
    out: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    guard!(with_target(d, Some(Feature::Memory), |s, t| {
        if out.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: non-null pointer to the caller's struct, whose first field is the version.
        let version = unsafe { std::ptr::addr_of!((*out).version).read_unaligned() };
        if version != NVML_MEMORY_V2 {
            return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        }
        let (total, reserved, free, used) = memory_of(s, t);
        unsafe {
            put(
                out,
                nvmlMemory_v2_t {
                    version,
                    total,
                    reserved,
                    free,
                    used,
                },
            )
        }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBAR1MemoryInfo(
    d: nvmlDevice_t,
    out: *mut nvmlBAR1Memory_t,
) -> nvmlReturn_t {
    guard!(with_target(d, Some(Feature::Bar1Memory), |s, t| {
        if out.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // A MIG device maps its share of the BAR1 aperture: its memory slices of eight.
        let (procs, total) = match t {
            Target::Gpu(_) => (procs_of(s, t, is_any).len() as u64, 262_144 * MIB),
            Target::Mig { gpu, index, .. } => (
                procs_of(s, t, is_any).len() as u64,
                262_144 / 8 * u64::from(s.gpu(gpu).mig[index].profile.mem_slices) * MIB,
            ),
        };
        let used = (1 + 2 * procs) * MIB;
        unsafe {
            put(
                out,
                nvmlBAR1Memory_t {
                    bar1Total: total,
                    bar1Free: total - used,
                    bar1Used: used,
                },
            )
        }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    d: nvmlDevice_t,
    out: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    guard!(with_dev(d, Some(Feature::Utilization), |s, i| {
        if out.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // A MIG-enabled GPU has no whole-GPU utilization counters (nor do its MIG devices).
        if s.gpu(i).mig_mode {
            return NVML_ERROR_NOT_SUPPORTED;
        }
        let (gpu, memory) = s.utilization(i);
        unsafe { put(out, nvmlUtilization_t { gpu, memory }) }
    }))
}

/// The GPU's core temperature (°C): the scenario's, else rising with utilization.
fn temperature(s: &mut Sim, i: usize) -> c_uint {
    match s.gpu(i).temperature_c {
        Some(t) => t,
        None => 30 + s.utilization(i).0 * 2 / 5,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    d: nvmlDevice_t,
    sensor: c_uint,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(with_dev(d, Some(Feature::Temperature), |s, i| {
        if sensor != NVML_TEMPERATURE_GPU || out.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let t = temperature(s, i);
        unsafe { put(out, t) }
    }))
}

fn power_usage(s: &mut Sim, i: usize) -> u32 {
    match s.gpu(i).power_mw {
        Some(p) => p,
        None => {
            let util = s.utilization(i).0;
            (72_000 + util * 6_000).min(s.gpu(i).power_limit_mw)
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    d: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(with_dev(d, Some(Feature::Power), |s, i| {
        if out.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let p = power_usage(s, i);
        unsafe { put(out, p) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimit(
    d: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(with_dev(d, Some(Feature::Power), |s, i| unsafe {
        put(out, s.gpu(i).power_limit_mw)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementDefaultLimit(
    d: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(with_dev(d, Some(Feature::Power), |s, i| unsafe {
        put(out, s.gpu(i).power_limit_mw)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEnforcedPowerLimit(
    d: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(with_dev(d, Some(Feature::Power), |s, i| unsafe {
        put(out, s.gpu(i).power_limit_mw)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFanSpeed(d: nvmlDevice_t, out: *mut c_uint) -> nvmlReturn_t {
    guard!(with_dev(d, Some(Feature::Fan), |s, i| {
        match s.gpu(i).fan_pct {
            None => NVML_ERROR_NOT_SUPPORTED,
            Some(f) => unsafe { put(out, f) },
        }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFanSpeed_v2(
    d: nvmlDevice_t,
    fan: c_uint,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(with_dev(d, Some(Feature::Fan), |s, i| {
        match s.gpu(i).fan_pct {
            None => NVML_ERROR_NOT_SUPPORTED,
            Some(_) if fan != 0 => NVML_ERROR_INVALID_ARGUMENT,
            Some(f) => unsafe { put(out, f) },
        }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPerformanceState(
    d: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(with_dev(
        d,
        Some(Feature::PerformanceState),
        |_, _| unsafe { put(out, 0) }
    ))
}

fn current_clock(s: &mut Sim, i: usize, kind: c_uint) -> Option<u32> {
    let busy = s.utilization(i).0 > 0;
    let st = s.gpu_state(i);
    let g = s.gpu(i);
    match kind {
        NVML_CLOCK_GRAPHICS | NVML_CLOCK_SM => {
            let mut c = if busy {
                st.applications_clocks
                    .map(|a| a.graphics_mhz)
                    .unwrap_or(g.max_graphics_mhz)
            } else {
                345
            };
            if let Some(r) = st.locked_clocks {
                c = c.clamp(r.min_mhz.min(r.max_mhz), r.max_mhz);
            }
            Some(c)
        }
        NVML_CLOCK_MEM => {
            let mut c = st
                .applications_clocks
                .map(|a| a.mem_mhz)
                .unwrap_or(g.max_memory_mhz);
            if let Some(r) = st.memory_locked_clocks {
                c = c.clamp(r.min_mhz.min(r.max_mhz), r.max_mhz);
            }
            Some(c)
        }
        NVML_CLOCK_VIDEO => Some(if busy { g.max_video_mhz } else { 765 }),
        _ => None,
    }
}

fn max_clock(s: &Sim, i: usize, kind: c_uint) -> Option<u32> {
    let g = s.gpu(i);
    match kind {
        NVML_CLOCK_GRAPHICS | NVML_CLOCK_SM => Some(g.max_graphics_mhz),
        NVML_CLOCK_MEM => Some(g.max_memory_mhz),
        NVML_CLOCK_VIDEO => Some(g.max_video_mhz),
        _ => None,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    d: nvmlDevice_t,
    kind: c_uint,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(with_dev(
        d,
        Some(Feature::Clocks),
        |s, i| match current_clock(s, i, kind) {
            None => NVML_ERROR_INVALID_ARGUMENT,
            Some(c) => unsafe { put(out, c) },
        }
    ))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(
    d: nvmlDevice_t,
    kind: c_uint,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(with_dev(d, Some(Feature::Clocks), |s, i| {
        match max_clock(s, i, kind) {
            None => NVML_ERROR_INVALID_ARGUMENT,
            Some(c) => unsafe { put(out, c) },
        }
    }))
}

// ---------------------------------------------------------------------------------------
// Processes

/// The processes a handle lists: all of the GPU's, or a MIG device's own.
fn procs_of(
    s: &mut Sim,
    t: Target,
    want: fn(crate::scenario::ProcKind) -> bool,
) -> Vec<sim::ProcNow> {
    let (i, only) = match t {
        Target::Gpu(i) => (i, None),
        Target::Mig { gpu, gi, ci, .. } => (gpu, Some((gi, ci))),
    };
    s.gpu_now(i)
        .procs
        .iter()
        .filter(|p| want(p.kind) && (only.is_none() || p.instance == only))
        .cloned()
        .collect()
}

unsafe fn running_v1(
    d: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
    want: fn(crate::scenario::ProcKind) -> bool,
) -> nvmlReturn_t {
    with_target(d, Some(Feature::Processes), |s, t| {
        let items: Vec<nvmlProcessInfo_v1_t> = procs_of(s, t, want)
            .into_iter()
            .map(|p| nvmlProcessInfo_v1_t {
                pid: p.pid,
                usedGpuMemory: p.used_bytes.unwrap_or(NVML_VALUE_NOT_AVAILABLE_ULL),
            })
            .collect();
        unsafe { put_list(count, infos, &items) }
    })
}

unsafe fn running_v2(
    d: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
    want: fn(crate::scenario::ProcKind) -> bool,
) -> nvmlReturn_t {
    with_target(d, Some(Feature::Processes), |s, t| {
        let items: Vec<nvmlProcessInfo_t> = procs_of(s, t, want)
            .into_iter()
            .map(|p| nvmlProcessInfo_t {
                pid: p.pid,
                usedGpuMemory: p.used_bytes.unwrap_or(NVML_VALUE_NOT_AVAILABLE_ULL),
                gpuInstanceId: p.instance.map_or(NO_INSTANCE_ID, |i| i.0),
                computeInstanceId: p.instance.map_or(NO_INSTANCE_ID, |i| i.1),
            })
            .collect();
        unsafe { put_list(count, infos, &items) }
    })
}

fn is_compute(k: crate::scenario::ProcKind) -> bool {
    k.compute()
}
fn is_graphics(k: crate::scenario::ProcKind) -> bool {
    k.graphics()
}
fn is_any(_: crate::scenario::ProcKind) -> bool {
    true
}
fn is_mps(_: crate::scenario::ProcKind) -> bool {
    false
}

macro_rules! process_queries {
    ($($v1:ident, $v2:ident, $v3:ident => $want:ident;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $v1(
            d: nvmlDevice_t,
            count: *mut c_uint,
            infos: *mut nvmlProcessInfo_v1_t,
        ) -> nvmlReturn_t {
            guard!(unsafe { running_v1(d, count, infos, $want) })
        }

        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $v2(
            d: nvmlDevice_t,
            count: *mut c_uint,
            infos: *mut nvmlProcessInfo_t,
        ) -> nvmlReturn_t {
            guard!(unsafe { running_v2(d, count, infos, $want) })
        }

        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $v3(
            d: nvmlDevice_t,
            count: *mut c_uint,
            infos: *mut nvmlProcessInfo_t,
        ) -> nvmlReturn_t {
            guard!(unsafe { running_v2(d, count, infos, $want) })
        }
    )*};
}

process_queries! {
    nvmlDeviceGetComputeRunningProcesses, nvmlDeviceGetComputeRunningProcesses_v2,
        nvmlDeviceGetComputeRunningProcesses_v3 => is_compute;
    nvmlDeviceGetGraphicsRunningProcesses, nvmlDeviceGetGraphicsRunningProcesses_v2,
        nvmlDeviceGetGraphicsRunningProcesses_v3 => is_graphics;
    nvmlDeviceGetMPSComputeRunningProcesses, nvmlDeviceGetMPSComputeRunningProcesses_v2,
        nvmlDeviceGetMPSComputeRunningProcesses_v3 => is_mps;
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    d: nvmlDevice_t,
    samples: *mut nvmlProcessUtilizationSample_t,
    count: *mut c_uint,
    last_seen: c_ulonglong,
) -> nvmlReturn_t {
    guard!(with_dev(d, Some(Feature::ProcessUtilization), |s, i| {
        if count.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        if s.gpu(i).mig_mode {
            return NVML_ERROR_NOT_SUPPORTED;
        }
        let now = sim::now_unix_us();
        let items: Vec<nvmlProcessUtilizationSample_t> = if last_seen >= now {
            Vec::new()
        } else {
            s.gpu_now(i)
                .procs
                .iter()
                .map(|p| nvmlProcessUtilizationSample_t {
                    pid: p.pid,
                    timeStamp: now,
                    smUtil: p.sm_pct,
                    memUtil: p.mem_pct,
                    encUtil: 0,
                    decUtil: 0,
                })
                .collect()
        };
        if items.is_empty() {
            unsafe { *count = 0 };
            return NVML_ERROR_NOT_FOUND;
        }
        unsafe { put_list(count, samples, &items) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetProcessesUtilizationInfo(
    d: nvmlDevice_t,
    info: *mut nvmlProcessesUtilizationInfo_t,
) -> nvmlReturn_t {
    guard!(with_dev(d, Some(Feature::ProcessUtilization), |s, i| {
        if info.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        if s.gpu(i).mig_mode {
            return NVML_ERROR_NOT_SUPPORTED;
        }
        // SAFETY: non-null pointer to the caller's struct.
        let info = unsafe { &mut *info };
        if info.version != NVML_PROCESSES_UTILIZATION_INFO_V1 {
            return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        }
        let now = sim::now_unix_us();
        let items: Vec<nvmlProcessUtilizationInfo_v1_t> = if info.lastSeenTimeStamp >= now {
            Vec::new()
        } else {
            s.gpu_now(i)
                .procs
                .iter()
                .map(|p| nvmlProcessUtilizationInfo_v1_t {
                    timeStamp: now,
                    pid: p.pid,
                    smUtil: p.sm_pct,
                    memUtil: p.mem_pct,
                    encUtil: 0,
                    decUtil: 0,
                    jpgUtil: 0,
                    ofaUtil: 0,
                })
                .collect()
        };
        if items.is_empty() {
            info.processSamplesCount = 0;
            return NVML_ERROR_NOT_FOUND;
        }
        unsafe { put_list(&mut info.processSamplesCount, info.procUtilArray, &items) }
    }))
}

// ---------------------------------------------------------------------------------------
// Settings (state file)

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(
    d: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(with_dev(d, Some(Feature::PersistenceMode), |s, i| {
        let on = s
            .gpu_state(i)
            .persistence_mode
            .unwrap_or(s.gpu(i).persistence_mode);
        unsafe { put(out, on as c_uint) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetPersistenceMode(
    d: nvmlDevice_t,
    mode: c_uint,
) -> nvmlReturn_t {
    guard!(with_dev(d, None, |s, i| {
        if let Err(e) = s.setting_allowed(i, Feature::PersistenceMode) {
            return e;
        }
        if mode > 1 {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        s.update_gpu_state(i, |g| g.persistence_mode = Some(mode == 1))
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeMode(
    d: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(with_dev(d, Some(Feature::ComputeMode), |s, i| {
        let mode = s
            .gpu_state(i)
            .compute_mode
            .as_deref()
            .and_then(ComputeMode::parse)
            .unwrap_or(s.gpu(i).compute_mode);
        unsafe { put(out, mode.to_nvml()) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetComputeMode(d: nvmlDevice_t, mode: c_uint) -> nvmlReturn_t {
    guard!(with_dev(d, None, |s, i| {
        if let Err(e) = s.setting_allowed(i, Feature::ComputeMode) {
            return e;
        }
        let Some(mode) = ComputeMode::from_nvml(mode) else {
            return NVML_ERROR_INVALID_ARGUMENT;
        };
        s.update_gpu_state(i, |g| g.compute_mode = Some(mode.as_str().to_string()))
    }))
}

fn app_clock(s: &mut Sim, i: usize, kind: c_uint, default: bool) -> Option<u32> {
    let set = if default {
        None
    } else {
        s.gpu_state(i).applications_clocks
    };
    let g = s.gpu(i);
    match kind {
        NVML_CLOCK_GRAPHICS | NVML_CLOCK_SM => {
            Some(set.map(|a| a.graphics_mhz).unwrap_or(g.max_graphics_mhz))
        }
        NVML_CLOCK_MEM => Some(set.map(|a| a.mem_mhz).unwrap_or(g.max_memory_mhz)),
        NVML_CLOCK_VIDEO => Some(g.max_video_mhz),
        _ => None,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetApplicationsClock(
    d: nvmlDevice_t,
    kind: c_uint,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(with_dev(d, Some(Feature::ApplicationsClocks), |s, i| {
        match app_clock(s, i, kind, false) {
            None => NVML_ERROR_INVALID_ARGUMENT,
            Some(c) => unsafe { put(out, c) },
        }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDefaultApplicationsClock(
    d: nvmlDevice_t,
    kind: c_uint,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(with_dev(d, Some(Feature::ApplicationsClocks), |s, i| {
        match app_clock(s, i, kind, true) {
            None => NVML_ERROR_INVALID_ARGUMENT,
            Some(c) => unsafe { put(out, c) },
        }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetApplicationsClocks(
    d: nvmlDevice_t,
    mem_mhz: c_uint,
    graphics_mhz: c_uint,
) -> nvmlReturn_t {
    guard!(with_dev(d, None, |s, i| {
        if let Err(e) = s.setting_allowed(i, Feature::ApplicationsClocks) {
            return e;
        }
        let g = s.gpu(i);
        if mem_mhz == 0
            || graphics_mhz == 0
            || mem_mhz > g.max_memory_mhz
            || graphics_mhz > g.max_graphics_mhz
        {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        s.update_gpu_state(i, |g| {
            g.applications_clocks = Some(AppClocks {
                mem_mhz,
                graphics_mhz,
            })
        })
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceResetApplicationsClocks(d: nvmlDevice_t) -> nvmlReturn_t {
    guard!(with_dev(d, None, |s, i| {
        if let Err(e) = s.setting_allowed(i, Feature::ApplicationsClocks) {
            return e;
        }
        s.update_gpu_state(i, |g| g.applications_clocks = None)
    }))
}

fn set_range(
    d: nvmlDevice_t,
    feature: Feature,
    min: c_uint,
    max: c_uint,
    store: fn(&mut crate::state::GpuState, Option<ClockRange>),
) -> nvmlReturn_t {
    with_dev(d, None, |s, i| {
        if let Err(e) = s.setting_allowed(i, feature) {
            return e;
        }
        // Symbolic limits (NVML_CLOCK_LIMIT_ID_*) sit at the top of the range.
        if min > max && max < 0xFFFF_FF00 {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        s.update_gpu_state(i, |g| {
            store(
                g,
                Some(ClockRange {
                    min_mhz: min,
                    max_mhz: max,
                }),
            )
        })
    })
}

fn reset_range(
    d: nvmlDevice_t,
    feature: Feature,
    store: fn(&mut crate::state::GpuState, Option<ClockRange>),
) -> nvmlReturn_t {
    with_dev(d, None, |s, i| {
        if let Err(e) = s.setting_allowed(i, feature) {
            return e;
        }
        s.update_gpu_state(i, |g| store(g, None))
    })
}

fn store_gpu_locked(g: &mut crate::state::GpuState, r: Option<ClockRange>) {
    g.locked_clocks = r;
}

fn store_mem_locked(g: &mut crate::state::GpuState, r: Option<ClockRange>) {
    g.memory_locked_clocks = r;
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceSetGpuLockedClocks(
    d: nvmlDevice_t,
    min_mhz: c_uint,
    max_mhz: c_uint,
) -> nvmlReturn_t {
    guard!(set_range(
        d,
        Feature::LockedClocks,
        min_mhz,
        max_mhz,
        store_gpu_locked
    ))
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceResetGpuLockedClocks(d: nvmlDevice_t) -> nvmlReturn_t {
    guard!(reset_range(d, Feature::LockedClocks, store_gpu_locked))
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceSetMemoryLockedClocks(
    d: nvmlDevice_t,
    min_mhz: c_uint,
    max_mhz: c_uint,
) -> nvmlReturn_t {
    guard!(set_range(
        d,
        Feature::MemoryLockedClocks,
        min_mhz,
        max_mhz,
        store_mem_locked
    ))
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceResetMemoryLockedClocks(d: nvmlDevice_t) -> nvmlReturn_t {
    guard!(reset_range(
        d,
        Feature::MemoryLockedClocks,
        store_mem_locked
    ))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAccountingMode(
    d: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(with_dev(d, Some(Feature::Accounting), |s, i| {
        let on = s.gpu_state(i).accounting_mode.unwrap_or(false);
        unsafe { put(out, on as c_uint) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetAccountingMode(
    d: nvmlDevice_t,
    mode: c_uint,
) -> nvmlReturn_t {
    guard!(with_dev(d, None, |s, i| {
        if let Err(e) = s.setting_allowed(i, Feature::Accounting) {
            return e;
        }
        if mode > 1 {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        s.update_gpu_state(i, |g| g.accounting_mode = Some(mode == 1))
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceClearAccountingPids(d: nvmlDevice_t) -> nvmlReturn_t {
    guard!(with_dev(d, None, |s, i| {
        if let Err(e) = s.setting_allowed(i, Feature::Accounting) {
            return e;
        }
        s.update_gpu_state(i, |g| g.accounting_pids.clear())
    }))
}

/// With accounting enabled: the recorded pids (kept after the processes end, until
/// cleared) plus the processes running now, which get recorded.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAccountingPids(
    d: nvmlDevice_t,
    count: *mut c_uint,
    pids: *mut c_uint,
) -> nvmlReturn_t {
    guard!(with_dev(d, Some(Feature::Accounting), |s, i| {
        if count.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let st = s.gpu_state(i);
        if !st.accounting_mode.unwrap_or(false) {
            return NVML_ERROR_NOT_SUPPORTED;
        }
        let mut list = st.accounting_pids.clone();
        for p in &s.gpu_now(i).procs {
            if !list.contains(&p.pid) {
                list.push(p.pid);
            }
        }
        if list != st.accounting_pids {
            let recorded = list.clone();
            let _ = s.update_gpu_state(i, |g| g.accounting_pids = recorded);
        }
        unsafe { put_list(count, pids, &list) }
    }))
}
