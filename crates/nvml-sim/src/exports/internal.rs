//! nvidia-smi's private entry points: the export table behind `nvmlInternalGetExportTable`.
//!
//! nvidia-smi (535) asks the library for one private table (the id below) right after
//! `nvmlInitWithFlags`, and refuses to run without it ("Mismatch in versions between
//! nvidia-smi and NVML"). The table is an array of words: word 0 is its size in bytes, every
//! other word a function pointer, called by position ("slot").
//!
//! How the slots were found: every slot gets its own trampoline (`slot::<N>`), and with
//! `NVML_SIM_TRACE` set each slot that is called and not modelled is named once. Running
//! nvidia-smi 535.309.01's views shows which slots each view calls and with what arguments
//! (a slot's arguments are read as six machine words: what a SysV caller leaves in the
//! argument registers, whatever it passed). A slot's meaning was then read from where its
//! answer lands in the output. The modelled slots:
//!
//! | slot | called as | meaning |
//! |---|---|---|
//! | 12 | `(const char *bus_id, unsigned *domain, unsigned *bus, unsigned *device, unsigned *function)` | parses a PCI bus id (`-i 00000000:18:00.0`); INVALID_ARGUMENT is "Invalid PCI bus id format" |
//! | 26 | `(const char *fmt, ...)` | the library's debug log: nvidia-smi reports each step through it (`"nvidia-smi %s: %s\n"`); nothing is written |
//! | 75 | `(unsigned index, unsigned *domain, unsigned *bus, unsigned *device)` | a GPU's PCI location by index: `-i BUS_ID` walks the GPUs with it, comparing what slot 12 parsed |
//! | 81 | `(unsigned index, nvmlDevice_t *out, 0x22)` | a handle by index, as `nvmlDeviceGetHandleByIndex_v2` |
//! | 213, 214, 215 | `(nvmlDevice_t, unsigned *count, record *out)` | the compute, MPS and graphics process lists (in that order): the size-query convention of the public lists, records of [`RECORD_SIZE`] bytes (below); GPU/compute instance ids at offsets 16/20 (`0xFFFFFFFF` without MIG); on a MIG device handle, that device's processes only |
//! | 209 | `(nvmlDevice_t, unsigned *uv)` | graphics voltage in µV (`-q`: Voltage) |
//! | 230 | `(nvmlDevice_t, unsigned *gen)` | the host's maximum PCIe generation (`-q`: Host Max) |
//! | 231 | `(nvmlDevice_t, char *buf, unsigned len)` | the GPU part number |
//! | 240 | `(nvmlDevice_t, int *margin)` | the T.Limit temperature: degrees below the maximum operating temperature; when it answers, `-q` also asks the T.Limit field values (193–196) |
//! | 242 | `(nvmlDevice_t, unsigned *mode)` | the addressing mode: 0 None, 1 HMM, 2 ATS |
//! | 243 | `(nvmlDevice_t, unsigned *mode)` | the sparse operation mode: 0 Disabled, 1 Enabled |
//!
//! Found this way and left NOT_SUPPORTED, because an HGX H100/H200 prints N/A there too:
//! 165 (the IBM NPU relaxed-ordering mode of POWER hosts), 226 (PCIe atomic capabilities),
//! 232 (deferred memory clocks), 237 (the FRU part number of OEM boards).
//!
//! Every slot not modelled answers NOT_SUPPORTED, which nvidia-smi prints as N/A, and is
//! traced.

use std::ffi::c_void;
use std::sync::OnceLock;

use super::*;
use crate::trace::{self, Gap};

/// The table id nvidia-smi 535 passes (16 bytes, as the CUDA export-table ids are).
const SMI_TABLE_ID: [u8; 16] = [
    0xc4, 0xfe, 0x3e, 0x6c, 0xc9, 0x8f, 0x6c, 0x4e, 0xa3, 0x27, 0xee, 0x69, 0x6e, 0x12, 0xf7, 0xc4,
];

const SLOTS: usize = 256;
const SLOT_PARSE_PCI_BUS_ID: usize = 12;
const SLOT_LOG: usize = 26;
const SLOT_PCI_LOCATION_BY_INDEX: usize = 75;
const SLOT_HANDLE_BY_INDEX: usize = 81;
const SLOT_VOLTAGE: usize = 209;
const SLOT_HOST_MAX_PCIE_GEN: usize = 230;
const SLOT_GPU_PART_NUMBER: usize = 231;
const SLOT_TLIMIT_TEMPERATURE: usize = 240;
const SLOT_ADDRESSING_MODE: usize = 242;
const SLOT_SPARSE_OPERATION_MODE: usize = 243;
/// The slots answered with a fixed value rather than from the scenario.
const FIXED_SLOTS: [usize; 6] = [
    SLOT_VOLTAGE,
    SLOT_HOST_MAX_PCIE_GEN,
    SLOT_GPU_PART_NUMBER,
    SLOT_TLIMIT_TEMPERATURE,
    SLOT_ADDRESSING_MODE,
    SLOT_SPARSE_OPERATION_MODE,
];
const SLOT_COMPUTE_PROCESSES: usize = 213;
// 214 is the MPS list and 215 the graphics list: with them the other way round, nvidia-smi
// shows an MPS client as `C+G` and no graphics process at all (tests/nvidia_smi.rs).
const SLOT_MPS_PROCESSES: usize = 214;
const SLOT_GRAPHICS_PROCESSES: usize = 215;

/// One process record of slots 213–215: the numeric head of `nvmlProcessDetail_v1_t` (pid,
/// used memory, GPU/compute instance ids, confidential-compute memory) and the process name
/// inline, NUL-terminated. Found by stamping every word of a record with its own offset and
/// reading back which offset each printed column came from. nvidia-smi drops a record with
/// an empty name from the default view.
#[repr(C)]
#[derive(Clone, Copy)]
struct ProcessRecord {
    pid: c_uint,
    _pad: c_uint,
    used_bytes: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
    used_protected_bytes: c_ulonglong,
    name: [c_char; 4096],
}

pub(super) const RECORD_SIZE: usize = 4128;
const _: () = {
    assert!(std::mem::size_of::<ProcessRecord>() == RECORD_SIZE);
    assert!(std::mem::offset_of!(ProcessRecord, used_bytes) == 8);
    assert!(std::mem::offset_of!(ProcessRecord, gpu_instance_id) == 16);
    assert!(std::mem::offset_of!(ProcessRecord, name) == 32);
};

type Args = [usize; 6];

/// Runs slot `slot` on the six words nvidia-smi passed it.
///
/// # Safety
///
/// `a` holds what the slot's contract (the table in the module docs) names: each pointer
/// null or valid for the call. Words a slot does not use are never read.
unsafe fn dispatch(slot: usize, a: Args) -> nvmlReturn_t {
    if FIXED_SLOTS.contains(&slot) {
        trace::gap(format_args!("export table slot {slot}"), Gap::Default);
    }
    match slot {
        SLOT_LOG => NVML_SUCCESS,
        // SAFETY: `a` is slot 12's arguments (this function's contract).
        SLOT_PARSE_PCI_BUS_ID => unsafe { parse_pci_bus_id(a) },
        // SAFETY: `a` is slot 75's arguments (this function's contract).
        SLOT_PCI_LOCATION_BY_INDEX => unsafe { pci_location(a) },
        // SAFETY: slot 81's second word is the out-parameter of a handle.
        SLOT_HANDLE_BY_INDEX => by_index(a[0] as c_uint, unsafe { out_arg(a[1]) }),
        // SAFETY: `a` is slot 213's arguments (this function's contract).
        SLOT_COMPUTE_PROCESSES => unsafe { process_list(a, is_compute) },
        // SAFETY: `a` is slot 215's arguments (this function's contract).
        SLOT_GRAPHICS_PROCESSES => unsafe { process_list(a, is_graphics) },
        // SAFETY: `a` is slot 214's arguments (this function's contract).
        SLOT_MPS_PROCESSES => unsafe { process_list(a, is_mps) },
        // SAFETY: in each fixed_uint slot the second word is an `unsigned *` (or `int *`).
        SLOT_VOLTAGE => unsafe { fixed_uint(a, |_, _| 670_000) },
        // SAFETY: as above.
        SLOT_HOST_MAX_PCIE_GEN => unsafe { fixed_uint(a, |_, _| 5) },
        SLOT_GPU_PART_NUMBER => {
            let (device, len) = (a[0] as nvmlDevice_t, a[2] as c_uint);
            // SAFETY: slot 231's second word is a buffer of `len` (the third) bytes.
            let buf = unsafe { Buf::new(a[1] as *mut c_char) };
            with_dev(device, None, |s, i| {
                // The part number begins with the PCI device id (0x2330 H100 SXM, 0x2335 H200).
                let part = format!("{:04X}-885-A1", s.gpu(i).pci_device_id >> 16);
                put_str(buf, len, &part)
            })
        }
        // SAFETY: as the other fixed_uint slots.
        SLOT_TLIMIT_TEMPERATURE => unsafe {
            fixed_uint(a, |s, i| {
                (super::details::GPU_MAX_OPERATING_C as i32 - temperature(s, i) as i32) as c_uint
            })
        },
        // SAFETY: as the other fixed_uint slots.
        SLOT_ADDRESSING_MODE => unsafe { fixed_uint(a, |_, _| 0) },
        // SAFETY: as the other fixed_uint slots.
        SLOT_SPARSE_OPERATION_MODE => unsafe { fixed_uint(a, |_, _| 0) },
        _ => {
            trace::gap(format_args!("export table slot {slot}"), Gap::NotModelled);
            unmodelled_slot()
        }
    }
}

/// A slot's word as the out-parameter its contract names there (`None` for null).
///
/// # Safety
///
/// `w` is null or the address of a `T` the caller owns for the call.
unsafe fn out_arg<'a, T>(w: usize) -> Option<&'a mut T> {
    // SAFETY: as this function's contract.
    unsafe { (w as *mut T).as_mut() }
}

/// # Safety
///
/// `a` is slot 12's arguments: a NUL-terminated string and four `unsigned *` (or nulls).
unsafe fn parse_pci_bus_id(a: Args) -> nvmlReturn_t {
    // SAFETY: as this function's contract; the four out-parameters are distinct.
    let (bus_id, parts) = unsafe {
        (
            c_str(a[0] as *const c_char),
            [a[1], a[2], a[3], a[4]].map(|w| out_arg::<c_uint>(w)),
        )
    };
    let [Some(domain), Some(bus), Some(device), Some(function)] = parts else {
        return NVML_ERROR_INVALID_ARGUMENT;
    };
    match bus_id.and_then(PciBusId::parse) {
        None => NVML_ERROR_INVALID_ARGUMENT,
        Some(id) => {
            *domain = id.domain;
            *bus = id.bus;
            *device = id.device;
            *function = id.function;
            NVML_SUCCESS
        }
    }
}

/// # Safety
///
/// `a` is slot 75's arguments: an index and three `unsigned *` (or nulls).
unsafe fn pci_location(a: Args) -> nvmlReturn_t {
    // SAFETY: as this function's contract; the three out-parameters are distinct.
    let parts = unsafe { [a[1], a[2], a[3]].map(|w| out_arg::<c_uint>(w)) };
    with_sim(|s| {
        s.refresh();
        let index = a[0] as c_uint as usize;
        if index >= s.scenario.gpus.len() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let [Some(domain), Some(bus), Some(device)] = parts else {
            return NVML_ERROR_INVALID_ARGUMENT;
        };
        // A lost GPU's location is still known (the driver enumerated it at load), so
        // `-i BUS_ID` of a healthy GPU passes it by.
        let pci = s.gpu(index).pci;
        *domain = pci.domain;
        *bus = pci.bus;
        *device = pci.device;
        NVML_SUCCESS
    })
}

/// A slot of shape `(nvmlDevice_t, unsigned *out)` answered without a scenario key.
///
/// # Safety
///
/// `a[1]` is null or the address of an `unsigned` the caller owns for the call.
unsafe fn fixed_uint(a: Args, value: impl FnOnce(&mut Sim, usize) -> c_uint) -> nvmlReturn_t {
    // SAFETY: as this function's contract.
    let out = unsafe { out_arg::<c_uint>(a[1]) };
    with_dev(a[0] as nvmlDevice_t, None, |s, i| {
        let v = value(s, i);
        put(out, v)
    })
}

fn unmodelled_slot() -> nvmlReturn_t {
    crate::unmodelled()
}

/// # Safety
///
/// `a` is the arguments of slot 213, 214 or 215: a device, an `unsigned *count` and an
/// array of `*count` records (or nulls).
unsafe fn process_list(a: Args, want: fn(&sim::ProcNow) -> bool) -> nvmlReturn_t {
    let device = a[0] as nvmlDevice_t;
    // SAFETY: as this function's contract.
    let (count, out) = unsafe {
        (
            out_arg::<c_uint>(a[1]),
            Buf::new(a[2] as *mut ProcessRecord),
        )
    };
    with_target(device, Some(Feature::Processes), |s, t| {
        let records: Vec<ProcessRecord> = procs_of(s, t, want)
            .into_iter()
            .map(|p| ProcessRecord {
                pid: p.pid,
                _pad: 0,
                used_bytes: p.used_bytes.unwrap_or(NVML_VALUE_NOT_AVAILABLE_ULL),
                gpu_instance_id: p.instance.map_or(NO_INSTANCE_ID, |i| i.0),
                compute_instance_id: p.instance.map_or(NO_INSTANCE_ID, |i| i.1),
                used_protected_bytes: 0,
                // The driver knows the task itself, whatever pid its namespace gives it.
                name: fill_chars(&process_name(p.real_pid).unwrap_or_default()),
            })
            .collect();
        put_list(count, out, &records)
    })
}

/// One trampoline per slot, so a call says which slot it came through.
extern "C" fn slot<const N: usize>(
    a0: usize,
    a1: usize,
    a2: usize,
    a3: usize,
    a4: usize,
    a5: usize,
) -> nvmlReturn_t {
    // SAFETY: nvidia-smi calls slot N with the arguments its contract names (module docs);
    // the words past them are whatever its registers held, and go unread.
    guard!(unsafe { dispatch(N, [a0, a1, a2, a3, a4, a5]) })
}

type SlotFn = extern "C" fn(usize, usize, usize, usize, usize, usize) -> nvmlReturn_t;

macro_rules! sixteen {
    ($hi:literal) => {
        [
            slot::<{ $hi * 16 }> as SlotFn,
            slot::<{ $hi * 16 + 1 }>,
            slot::<{ $hi * 16 + 2 }>,
            slot::<{ $hi * 16 + 3 }>,
            slot::<{ $hi * 16 + 4 }>,
            slot::<{ $hi * 16 + 5 }>,
            slot::<{ $hi * 16 + 6 }>,
            slot::<{ $hi * 16 + 7 }>,
            slot::<{ $hi * 16 + 8 }>,
            slot::<{ $hi * 16 + 9 }>,
            slot::<{ $hi * 16 + 10 }>,
            slot::<{ $hi * 16 + 11 }>,
            slot::<{ $hi * 16 + 12 }>,
            slot::<{ $hi * 16 + 13 }>,
            slot::<{ $hi * 16 + 14 }>,
            slot::<{ $hi * 16 + 15 }>,
        ]
    };
}

fn table() -> &'static [usize; SLOTS] {
    static TABLE: OnceLock<[usize; SLOTS]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let rows: [[SlotFn; 16]; 16] = [
            sixteen!(0),
            sixteen!(1),
            sixteen!(2),
            sixteen!(3),
            sixteen!(4),
            sixteen!(5),
            sixteen!(6),
            sixteen!(7),
            sixteen!(8),
            sixteen!(9),
            sixteen!(10),
            sixteen!(11),
            sixteen!(12),
            sixteen!(13),
            sixteen!(14),
            sixteen!(15),
        ];
        let mut words = [0usize; SLOTS];
        for (word, f) in words.iter_mut().zip(rows.iter().flatten()) {
            *word = *f as usize;
        }
        words[0] = SLOTS * std::mem::size_of::<usize>();
        words
    })
}

/// `nvmlReturn_t nvmlInternalGetExportTable(const void **table, const void *id)`: the table
/// for nvidia-smi's id; any other id is one the sim does not know (INVALID_ARGUMENT, as the
/// library answers an unknown id).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInternalGetExportTable(
    out: *mut *const c_void,
    id: *const c_void,
) -> nvmlReturn_t {
    guard!(mut out => {
        if out.is_none() || id.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: an export-table id is 16 bytes.
        let id = unsafe { std::slice::from_raw_parts(id.cast::<u8>(), 16) };
        if id != SMI_TABLE_ID {
            trace::gap(
                format_args!("nvmlInternalGetExportTable({id:02x?})"),
                Gap::NotModelled,
            );
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        put(out, table().as_ptr().cast())
    })
}
