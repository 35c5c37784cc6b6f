//! MIG: modes, MIG device handles, and the GPU-instance / compute-instance queries, all
//! from the scenario's `[[gpu.mig]]` entries. Creating and destroying instances is not
//! modelled (those exports stay NOT_SUPPORTED stubs): the layout is the scenario's.

use super::*;
use crate::mig::{MAX_MIG_DEVICES, MigInstance, MigProfile};
use crate::sim::{ci_handle, ci_of, gi_handle, gi_of, mig_handle};

const DISABLED: c_uint = 0;
const ENABLED: c_uint = 1;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    d: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut current, pending => with_dev(d, None, |s, i| {
        let (Some(current), Some(pending)) = (current, pending) else {
            return NVML_ERROR_INVALID_ARGUMENT;
        };
        let g = s.gpu(i);
        let mode = |on: bool| if on { ENABLED } else { DISABLED };
        *current = mode(g.mig_mode);
        *pending = mode(g.mig_pending);
        NVML_SUCCESS
    }))
}

/// 7 on a MIG-enabled Hopper; "zero if MIG is not supported or enabled" (nvml.h).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    d: nvmlDevice_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut count => with_dev(d, None, |s, i| {
        let n = if s.gpu(i).mig_mode {
            MAX_MIG_DEVICES
        } else {
            0
        };
        put(count, n)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    d: nvmlDevice_t,
    is_mig: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut is_mig => with_target(d, None, |_, t| {
        put(is_mig, matches!(t, Target::Mig { .. }) as c_uint)
    }))
}

/// Index `index` of the GPU's MIG devices, which are numbered in GPU-instance-id order:
/// 0..n-1 exist, n..6 are empty slots (NOT_FOUND), 7 and up are INVALID_ARGUMENT.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    d: nvmlDevice_t,
    index: c_uint,
    out: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard!(mut out => with_dev(d, None, |s, i| {
        let g = s.gpu(i);
        if !g.mig_mode || out.is_none() || index >= MAX_MIG_DEVICES {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        match g.mig.get(index as usize) {
            None => NVML_ERROR_NOT_FOUND,
            Some(m) => put(out, mig_handle(i, m.gi, m.ci)),
        }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    d: nvmlDevice_t,
    out: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard!(mut out => with_target(d, None, |_, t| match t {
        Target::Mig { gpu, .. } => put(out, handle_of(gpu)),
        Target::Gpu(_) => NVML_ERROR_INVALID_ARGUMENT,
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    d: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut out => with_target(d, None, |_, t| match t {
        Target::Mig { gi, .. } => put(out, gi),
        Target::Gpu(_) => NVML_ERROR_INVALID_ARGUMENT,
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    d: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut out => with_target(d, None, |_, t| match t {
        Target::Mig { ci, .. } => put(out, ci),
        Target::Gpu(_) => NVML_ERROR_INVALID_ARGUMENT,
    }))
}

/// A MIG device's share of the GPU (what nvidia-smi's MIG devices table shows: SM, CE,
/// ENC, DEC, OFA, JPG). Whole GPUs answer NOT_SUPPORTED here.
fn attributes(d: nvmlDevice_t, out: Option<&mut nvmlDeviceAttributes_t>) -> nvmlReturn_t {
    with_target(d, None, |s, t| match t {
        Target::Gpu(_) => NVML_ERROR_NOT_SUPPORTED,
        Target::Mig { gpu, index, .. } => {
            let p = s.gpu(gpu).mig[index].profile;
            put(
                out,
                nvmlDeviceAttributes_t {
                    multiprocessorCount: p.sms,
                    sharedCopyEngineCount: p.copy_engines,
                    sharedDecoderCount: p.decoders,
                    sharedEncoderCount: p.encoders,
                    sharedJpegCount: p.jpegs,
                    sharedOfaCount: p.ofas,
                    gpuInstanceSliceCount: p.slices,
                    computeInstanceSliceCount: p.slices,
                    memorySizeMB: p.memory_mib,
                },
            )
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAttributes(
    d: nvmlDevice_t,
    out: *mut nvmlDeviceAttributes_t,
) -> nvmlReturn_t {
    guard!(mut out => attributes(d, out))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAttributes_v2(
    d: nvmlDevice_t,
    out: *mut nvmlDeviceAttributes_t,
) -> nvmlReturn_t {
    guard!(mut out => attributes(d, out))
}

/// `nvmlDeviceGetHandleByUUID` for a `MIG-` UUID.
pub(super) fn by_uuid(uuid: &str, out: Option<&mut nvmlDevice_t>) -> nvmlReturn_t {
    with_sim(|s| {
        if out.is_none() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        s.refresh();
        for g in &s.scenario.gpus {
            if !g.mig_mode {
                continue;
            }
            for m in &g.mig {
                if crate::mig::mig_uuid(&g.uuid, m.gi, m.ci).eq_ignore_ascii_case(uuid) {
                    if g.lost {
                        return NVML_ERROR_GPU_IS_LOST;
                    }
                    return put(out, mig_handle(g.index as usize, m.gi, m.ci));
                }
            }
        }
        NVML_ERROR_NOT_FOUND
    })
}

// ---------------------------------------------------------------------------------------
// GPU instances

/// Runs `f` on a MIG-enabled parent GPU with its profile table; MIG off: NOT_SUPPORTED.
fn with_mig_gpu(
    d: nvmlDevice_t,
    f: impl FnOnce(&mut Sim, usize, &'static [MigProfile]) -> nvmlReturn_t,
) -> nvmlReturn_t {
    with_dev(d, None, |s, i| {
        let g = s.gpu(i);
        match crate::mig::profiles_for(&g.name) {
            Some(table) if g.mig_mode => f(s, i, table),
            _ => NVML_ERROR_NOT_SUPPORTED,
        }
    })
}

/// The profile a client names by `NVML_GPU_INSTANCE_PROFILE_*`: INVALID_ARGUMENT out of
/// range, NOT_SUPPORTED for one this GPU does not offer (`+me`, 8 or 6 slices, ...).
fn profile_by_enum(table: &'static [MigProfile], p: c_uint) -> Result<&'static MigProfile, u32> {
    if p >= NVML_GPU_INSTANCE_PROFILE_COUNT {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    table
        .iter()
        .find(|x| x.nvml_profile == p)
        .ok_or(NVML_ERROR_NOT_SUPPORTED)
}

/// The profile a client names by the driver's profile id (`info.id`).
fn profile_by_id(table: &'static [MigProfile], id: c_uint) -> Result<&'static MigProfile, u32> {
    table
        .iter()
        .find(|x| x.id == id)
        .ok_or(NVML_ERROR_INVALID_ARGUMENT)
}

fn gi_profile_info(p: &MigProfile) -> nvmlGpuInstanceProfileInfo_t {
    nvmlGpuInstanceProfileInfo_t {
        id: p.id,
        isP2pSupported: 0,
        sliceCount: p.slices,
        instanceCount: p.instance_count,
        multiprocessorCount: p.sms,
        copyEngineCount: p.copy_engines,
        decoderCount: p.decoders,
        encoderCount: p.encoders,
        jpegCount: p.jpegs,
        ofaCount: p.ofas,
        memorySizeMB: p.memory_mib,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    d: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_t,
) -> nvmlReturn_t {
    guard!(mut info => with_mig_gpu(d, |_, _, table| {
        match profile_by_enum(table, profile) {
            Err(e) => e,
            Ok(p) => put(info, gi_profile_info(p)),
        }
    }))
}

// v3 drops a field of v2 and adds one: the same size and alignment, so the caller's struct
// of either version is what `&mut nvmlGpuInstanceProfileInfo_v2_t` covers.
const _: () = {
    use std::mem::{align_of, size_of};
    assert!(
        size_of::<nvmlGpuInstanceProfileInfo_v2_t>()
            == size_of::<nvmlGpuInstanceProfileInfo_v3_t>()
    );
    assert!(
        align_of::<nvmlGpuInstanceProfileInfo_v2_t>()
            == align_of::<nvmlGpuInstanceProfileInfo_v3_t>()
    );
};

/// The versioned profile info (v2 and v3 share the head; v3 drops isP2pSupported and adds
/// capabilities). The version decides the layout written.
fn put_gi_profile_v(
    p: &MigProfile,
    info: Option<&mut nvmlGpuInstanceProfileInfo_v2_t>,
) -> nvmlReturn_t {
    let Some(info) = info else {
        return NVML_ERROR_INVALID_ARGUMENT;
    };
    let version = info.version;
    let name = format!("MIG {}", p.name);
    if version == NVML_GPU_INSTANCE_PROFILE_INFO_V2 {
        let v = gi_profile_info(p);
        put(
            Some(info),
            nvmlGpuInstanceProfileInfo_v2_t {
                version,
                id: v.id,
                isP2pSupported: v.isP2pSupported,
                sliceCount: v.sliceCount,
                instanceCount: v.instanceCount,
                multiprocessorCount: v.multiprocessorCount,
                copyEngineCount: v.copyEngineCount,
                decoderCount: v.decoderCount,
                encoderCount: v.encoderCount,
                jpegCount: v.jpegCount,
                ofaCount: v.ofaCount,
                memorySizeMB: v.memorySizeMB,
                name: fill_chars(&name),
            },
        )
    } else if version == NVML_GPU_INSTANCE_PROFILE_INFO_V3 {
        let info = std::ptr::from_mut(info).cast::<nvmlGpuInstanceProfileInfo_v3_t>();
        // SAFETY: the caller's struct is a v3 (its version says so), of v2's size and
        // alignment (asserted above), and `info` comes from the only reference to it.
        unsafe {
            info.write(nvmlGpuInstanceProfileInfo_v3_t {
                version,
                id: p.id,
                sliceCount: p.slices,
                instanceCount: p.instance_count,
                multiprocessorCount: p.sms,
                copyEngineCount: p.copy_engines,
                decoderCount: p.decoders,
                encoderCount: p.encoders,
                jpegCount: p.jpegs,
                ofaCount: p.ofas,
                memorySizeMB: p.memory_mib,
                name: fill_chars(&name),
                capabilities: 0,
            })
        };
        NVML_SUCCESS
    } else {
        NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoV(
    d: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_v2_t,
) -> nvmlReturn_t {
    guard!(mut info => with_mig_gpu(d, |_, _, table| {
        match profile_by_enum(table, profile) {
            Err(e) => e,
            Ok(p) => put_gi_profile_v(p, info),
        }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoByIdV(
    d: nvmlDevice_t,
    profile_id: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_v2_t,
) -> nvmlReturn_t {
    guard!(mut info => with_mig_gpu(d, |_, _, table| {
        match profile_by_id(table, profile_id) {
            Err(e) => e,
            Ok(p) => put_gi_profile_v(p, info),
        }
    }))
}

/// Every placement the profile may take (occupied or not), as `nvidia-smi mig -lgipp`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    d: nvmlDevice_t,
    profile_id: c_uint,
    placements: *mut nvmlGpuInstancePlacement_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut count; buf placements => with_mig_gpu(d, |_, _, table| {
        match profile_by_id(table, profile_id) {
            Err(e) => e,
            Ok(p) => {
                let items: Vec<nvmlGpuInstancePlacement_t> = p
                    .starts
                    .iter()
                    .map(|&start| nvmlGpuInstancePlacement_t {
                        start,
                        size: p.mem_slices,
                    })
                    .collect();
                put_list(count, placements, &items)
            }
        }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceRemainingCapacity(
    d: nvmlDevice_t,
    profile_id: c_uint,
    count: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut count => with_mig_gpu(d, |s, i, table| {
        match profile_by_id(table, profile_id) {
            Err(e) => e,
            Ok(p) => {
                let n = crate::mig::remaining_capacity(p, &s.gpu(i).mig);
                put(count, n)
            }
        }
    }))
}

/// The GPU instances of one profile. `count` is output only: the caller's array holds the
/// profile's `instanceCount` (nvml.h), as pynvml and nvidia-smi size it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstances(
    d: nvmlDevice_t,
    profile_id: c_uint,
    instances: *mut nvmlGpuInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut count; buf instances => with_mig_gpu(d, |s, i, table| {
        let Some(count) = count else {
            return NVML_ERROR_INVALID_ARGUMENT;
        };
        let p = match profile_by_id(table, profile_id) {
            Err(e) => return e,
            Ok(p) => p,
        };
        let found: Vec<nvmlGpuInstance_t> = s
            .gpu(i)
            .mig
            .iter()
            .filter(|m| std::ptr::eq(m.profile, p))
            .map(|m| gi_handle(i, m.gi))
            .collect();
        if !found.is_empty() && instances.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        *count = found.len() as c_uint;
        // The array holds the profile's instanceCount, and no profile has more instances.
        if let Some(instances) = instances.slice(found.len()) {
            instances.copy_from_slice(&found);
        }
        NVML_SUCCESS
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(
    d: nvmlDevice_t,
    id: c_uint,
    out: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    guard!(mut out => with_mig_gpu(d, |s, i, _| {
        if out.is_none() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        match s.gpu(i).mig.iter().find(|m| m.gi == id) {
            None => NVML_ERROR_NOT_FOUND,
            Some(m) => put(out, gi_handle(i, m.gi)),
        }
    }))
}

/// Runs `f` for a GPU instance handle whose instance exists now (INVALID_ARGUMENT
/// otherwise), with the parent's checks (lost, hang, faults).
fn with_gi(
    gi: nvmlGpuInstance_t,
    f: impl FnOnce(&mut Sim, usize, MigInstance) -> nvmlReturn_t,
) -> nvmlReturn_t {
    let Some((gpu, id)) = gi_of(gi) else {
        return with_sim(|_| NVML_ERROR_INVALID_ARGUMENT);
    };
    let parent = if gpu < crate::scenario::MAX_GPUS {
        handle_of(gpu)
    } else {
        std::ptr::null_mut()
    };
    with_dev(parent, None, |s, i| {
        let g = s.gpu(i);
        match g.mig.iter().find(|m| m.gi == id) {
            Some(m) if g.mig_mode => {
                let m = m.clone();
                f(s, i, m)
            }
            _ => NVML_ERROR_INVALID_ARGUMENT,
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    gi: nvmlGpuInstance_t,
    info: *mut nvmlGpuInstanceInfo_t,
) -> nvmlReturn_t {
    guard!(mut info => with_gi(gi, |_, i, m| {
        put(
            info,
            nvmlGpuInstanceInfo_t {
                device: handle_of(i),
                id: m.gi,
                profileId: m.profile.id,
                placement: nvmlGpuInstancePlacement_t {
                    start: m.start,
                    size: m.profile.mem_slices,
                },
            },
        )
    }))
}

// ---------------------------------------------------------------------------------------
// Compute instances

/// The compute-instance profile a client names, on GPU instance `m`: the slice count it
/// stands for, if this instance offers it.
fn ci_profile(m: &MigInstance, profile: c_uint) -> Result<u32, u32> {
    if profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    match crate::mig::ci_profile_slices(profile) {
        Some(c) if crate::mig::ci_offered(m.profile.slices, c) => Ok(c),
        _ => Err(NVML_ERROR_NOT_SUPPORTED),
    }
}

fn ci_profile_info(m: &MigInstance, profile: c_uint, c: u32) -> nvmlComputeInstanceProfileInfo_t {
    let p = m.profile;
    nvmlComputeInstanceProfileInfo_t {
        id: profile,
        sliceCount: c,
        instanceCount: p.slices / c,
        multiprocessorCount: p.sms * c / p.slices,
        sharedCopyEngineCount: p.copy_engines,
        sharedDecoderCount: p.decoders,
        sharedEncoderCount: p.encoders,
        sharedJpegCount: p.jpegs,
        sharedOfaCount: p.ofas,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    gi: nvmlGpuInstance_t,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_t,
) -> nvmlReturn_t {
    guard!(mut info => with_gi(gi, |_, _, m| {
        if eng_profile != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        match ci_profile(&m, profile) {
            Err(e) => e,
            Ok(c) => put(info, ci_profile_info(&m, profile, c)),
        }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfoV(
    gi: nvmlGpuInstance_t,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_v2_t,
) -> nvmlReturn_t {
    // `info` stays a pointer: a v3 is larger than the v2 it is declared as, so no
    // `&mut` v2 may stand for it.
    guard!(with_gi(gi, |_, _, m| {
        if eng_profile != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED || info.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let c = match ci_profile(&m, profile) {
            Err(e) => return e,
            Ok(c) => c,
        };
        let v = ci_profile_info(&m, profile, c);
        // nvidia-smi names a CI spanning its GI as the GI, a smaller one `<c>c.<GI profile>`.
        let name = if c == m.profile.slices {
            format!("MIG {}", m.profile.name)
        } else {
            format!("MIG {c}c.{}", m.profile.name)
        };
        // SAFETY: non-null; the version is the first field of every version.
        let version = unsafe { std::ptr::addr_of!((*info).version).read_unaligned() };
        let v2 = nvmlComputeInstanceProfileInfo_v2_t {
            version,
            id: v.id,
            sliceCount: v.sliceCount,
            instanceCount: v.instanceCount,
            multiprocessorCount: v.multiprocessorCount,
            sharedCopyEngineCount: v.sharedCopyEngineCount,
            sharedDecoderCount: v.sharedDecoderCount,
            sharedEncoderCount: v.sharedEncoderCount,
            sharedJpegCount: v.sharedJpegCount,
            sharedOfaCount: v.sharedOfaCount,
            name: fill_chars(&name),
        };
        if version == NVML_COMPUTE_INSTANCE_PROFILE_INFO_V2 {
            // SAFETY: non-null, and the caller's struct is a v2 (its version says so).
            unsafe { info.write_unaligned(v2) };
            NVML_SUCCESS
        } else if version == NVML_COMPUTE_INSTANCE_PROFILE_INFO_V3 {
            // SAFETY: non-null, and the caller's struct is a v3 (its version says so).
            unsafe {
                info.cast::<nvmlComputeInstanceProfileInfo_v3_t>()
                    .write_unaligned(nvmlComputeInstanceProfileInfo_v3_t {
                        version,
                        id: v2.id,
                        sliceCount: v2.sliceCount,
                        instanceCount: v2.instanceCount,
                        multiprocessorCount: v2.multiprocessorCount,
                        sharedCopyEngineCount: v2.sharedCopyEngineCount,
                        sharedDecoderCount: v2.sharedDecoderCount,
                        sharedEncoderCount: v2.sharedEncoderCount,
                        sharedJpegCount: v2.sharedJpegCount,
                        sharedOfaCount: v2.sharedOfaCount,
                        name: v2.name,
                        capabilities: 0,
                    })
            };
            NVML_SUCCESS
        } else {
            NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        }
    }))
}

/// The one compute instance of each scenario GPU instance spans it: listed under the
/// profile of its GI's slice count, none under the others.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstances(
    gi: nvmlGpuInstance_t,
    profile: c_uint,
    out: *mut nvmlComputeInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    guard!(mut out, count => with_gi(gi, |_, i, m| {
        let Some(count) = count else {
            return NVML_ERROR_INVALID_ARGUMENT;
        };
        if let Err(e) = ci_profile(&m, profile) {
            return e;
        }
        let mine = profile == crate::mig::full_ci_profile(m.profile.slices);
        if mine && out.is_none() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        *count = mine as c_uint;
        if let (true, Some(out)) = (mine, out) {
            *out = ci_handle(i, m.gi, m.ci);
        }
        NVML_SUCCESS
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceById(
    gi: nvmlGpuInstance_t,
    id: c_uint,
    out: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    guard!(mut out => with_gi(gi, |_, i, m| {
        if out.is_none() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        if id != m.ci {
            return NVML_ERROR_NOT_FOUND;
        }
        put(out, ci_handle(i, m.gi, m.ci))
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
    gi: nvmlGpuInstance_t,
    profile: c_uint,
    count: *mut c_uint,
) -> nvmlReturn_t {
    // The one compute instance spans its GPU instance: no room for another.
    guard!(mut count => with_gi(gi, |_, _, m| match ci_profile(&m, profile) {
        Err(e) => e,
        Ok(_) => put(count, 0),
    }))
}

/// `info` stays a pointer: a v1 caller's struct is shorter than the one it is declared as.
///
/// # Safety
///
/// `info` is null, or a v2 struct (`v2`) or a v1 one (the 24-byte head) the caller owns.
unsafe fn ci_info(
    ci: nvmlComputeInstance_t,
    info: *mut nvmlComputeInstanceInfo_t,
    v2: bool,
) -> nvmlReturn_t {
    let Some((gpu, gi, id)) = ci_of(ci) else {
        return with_sim(|_| NVML_ERROR_INVALID_ARGUMENT);
    };
    with_gi(gi_handle(gpu, gi), |_, i, m| {
        if m.ci != id || info.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let full = nvmlComputeInstanceInfo_t {
            device: handle_of(i),
            gpuInstance: gi_handle(i, m.gi),
            id: m.ci,
            profileId: crate::mig::full_ci_profile(m.profile.slices),
            placement: nvmlComputeInstancePlacement_t {
                start: 0,
                size: m.profile.slices,
            },
        };
        if v2 {
            // SAFETY: non-null, and a v2 caller passes the whole struct.
            unsafe { info.write_unaligned(full) };
            return NVML_SUCCESS;
        }
        // v1 predates `placement`: write the 24-byte head only.
        // SAFETY: non-null, and a v1 caller's struct is that 24-byte head.
        unsafe {
            let p = info.cast::<u8>();
            std::ptr::copy_nonoverlapping(std::ptr::from_ref(&full).cast::<u8>(), p, 24);
        }
        NVML_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo(
    ci: nvmlComputeInstance_t,
    info: *mut nvmlComputeInstanceInfo_t,
) -> nvmlReturn_t {
    // SAFETY: the caller passes a v1 struct, or null.
    guard!(unsafe { ci_info(ci, info, false) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo_v2(
    ci: nvmlComputeInstance_t,
    info: *mut nvmlComputeInstanceInfo_t,
) -> nvmlReturn_t {
    // SAFETY: the caller passes a v2 struct, or null.
    guard!(unsafe { ci_info(ci, info, true) })
}
