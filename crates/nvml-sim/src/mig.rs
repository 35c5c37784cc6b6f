//! MIG: the GPU-instance profiles of H100 80GB and H200, and the layout rules (slices,
//! placements, ids) a scenario's `[[gpu.mig]]` entries are checked against.

use crate::types::*;

/// Most MIG devices (GPU instance + compute instance pairs) a GPU can hold on Hopper.
pub const MAX_MIG_DEVICES: u32 = 7;
/// Compute slices of a Hopper GPU.
pub const COMPUTE_SLICES: u32 = 7;
/// Memory slices: the placement axis (`nvmlGpuInstancePlacement_t.start/size`).
pub const MEMORY_SLICES: u32 = 8;
/// GPU instance ids run 0..=14 on an 8-memory-slice GPU (the driver's numbering of the
/// placement tree: 1 whole, 2 halves, 4 quarters, 8 eighths, minus the last eighth).
pub const MAX_GI_ID: u32 = 14;
/// Compute instance ids within a GPU instance: 0..=7.
pub const MAX_CI_ID: u32 = 7;

/// One GPU-instance profile, as `nvidia-smi mig -lgip` lists it.
#[derive(Debug)]
pub struct MigProfile {
    /// `1g.10gb`: what the MIG device's name ends with.
    pub name: &'static str,
    /// The `NVML_GPU_INSTANCE_PROFILE_*` value a client asks about.
    pub nvml_profile: u32,
    /// The driver's profile id (`nvmlGpuInstanceProfileInfo_t.id`, nvidia-smi's "ID"
    /// column, `nvmlGpuInstanceInfo_t.profileId`): 19 for 1g.10gb, not the enum value.
    pub id: u32,
    /// Compute slices (the `Ng` of the name).
    pub slices: u32,
    /// Memory slices taken on the placement axis.
    pub mem_slices: u32,
    /// Where an instance may start on the placement axis (`nvidia-smi mig -lgipp`).
    pub starts: &'static [u32],
    pub instance_count: u32,
    pub memory_mib: u64,
    pub sms: u32,
    pub copy_engines: u32,
    pub decoders: u32,
    pub encoders: u32,
    pub jpegs: u32,
    pub ofas: u32,
}

const P: u32 = NVML_GPU_INSTANCE_PROFILE_1_SLICE;

macro_rules! profile {
    ($name:literal, $enum:expr, $id:literal, $slices:literal, $mem:literal, $starts:expr,
     $count:literal, $mib:literal, $sms:literal, $ce:literal, $dec:literal, $jpeg:literal, $ofa:literal) => {
        MigProfile {
            name: $name,
            nvml_profile: $enum,
            id: $id,
            slices: $slices,
            mem_slices: $mem,
            starts: $starts,
            instance_count: $count,
            memory_mib: $mib,
            sms: $sms,
            copy_engines: $ce,
            decoders: $dec,
            encoders: 0,
            jpegs: $jpeg,
            ofas: $ofa,
        }
    };
}

const ONE: &[u32] = &[0, 1, 2, 3, 4, 5, 6];
const TWO: &[u32] = &[0, 2, 4, 6];
const TWO_G: &[u32] = &[0, 2, 4];
const HALF: &[u32] = &[0, 4];
const FIRST: &[u32] = &[0];

/// H100 80GB (SXM5 and PCIe), driver 535/570 `nvidia-smi mig -lgip`: memory 9.75, 19.62,
/// 39.50 and 79.25 GiB, SMs 16/26/32/60/64/132.
pub static H100_80GB: [MigProfile; 6] = [
    profile!("1g.10gb", P, 19, 1, 1, ONE, 7, 9984, 16, 1, 1, 1, 0),
    profile!(
        "1g.20gb",
        NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2,
        15,
        1,
        2,
        TWO,
        4,
        20096,
        26,
        1,
        1,
        1,
        0
    ),
    profile!(
        "2g.20gb",
        NVML_GPU_INSTANCE_PROFILE_2_SLICE,
        14,
        2,
        2,
        TWO_G,
        3,
        20096,
        32,
        2,
        2,
        2,
        0
    ),
    profile!(
        "3g.40gb",
        NVML_GPU_INSTANCE_PROFILE_3_SLICE,
        9,
        3,
        4,
        HALF,
        2,
        40448,
        60,
        3,
        3,
        3,
        0
    ),
    profile!(
        "4g.40gb",
        NVML_GPU_INSTANCE_PROFILE_4_SLICE,
        5,
        4,
        4,
        FIRST,
        1,
        40448,
        64,
        4,
        4,
        4,
        0
    ),
    profile!(
        "7g.80gb",
        NVML_GPU_INSTANCE_PROFILE_7_SLICE,
        0,
        7,
        8,
        FIRST,
        1,
        81152,
        132,
        8,
        7,
        7,
        1
    ),
];

/// H200 141GB: the same GH100 slices (ids, SMs, engines, placements as H100); memory
/// 16.00 GiB for 1g.18gb as its `-lgip` shows, the other sizes chosen in proportion (no
/// published `-lgip` of them was found; see README).
pub static H200_141GB: [MigProfile; 6] = [
    profile!("1g.18gb", P, 19, 1, 1, ONE, 7, 16384, 16, 1, 1, 1, 0),
    profile!(
        "1g.35gb",
        NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2,
        15,
        1,
        2,
        TWO,
        4,
        32768,
        26,
        1,
        1,
        1,
        0
    ),
    profile!(
        "2g.35gb",
        NVML_GPU_INSTANCE_PROFILE_2_SLICE,
        14,
        2,
        2,
        TWO_G,
        3,
        32768,
        32,
        2,
        2,
        2,
        0
    ),
    profile!(
        "3g.71gb",
        NVML_GPU_INSTANCE_PROFILE_3_SLICE,
        9,
        3,
        4,
        HALF,
        2,
        71424,
        60,
        3,
        3,
        3,
        0
    ),
    profile!(
        "4g.71gb",
        NVML_GPU_INSTANCE_PROFILE_4_SLICE,
        5,
        4,
        4,
        FIRST,
        1,
        71424,
        64,
        4,
        4,
        4,
        0
    ),
    profile!(
        "7g.141gb",
        NVML_GPU_INSTANCE_PROFILE_7_SLICE,
        0,
        7,
        8,
        FIRST,
        1,
        142848,
        132,
        8,
        7,
        7,
        1
    ),
];

/// The profiles of a GPU by its name; `None`: the sim does not model MIG on it.
pub fn profiles_for(name: &str) -> Option<&'static [MigProfile]> {
    let n = name.to_ascii_uppercase();
    if n.contains("H100") {
        Some(&H100_80GB)
    } else if n.contains("H200") {
        Some(&H200_141GB)
    } else {
        None
    }
}

/// One GPU instance with its one compute instance: a MIG device.
#[derive(Debug, Clone)]
pub struct MigInstance {
    pub profile: &'static MigProfile,
    /// GPU instance id.
    pub gi: u32,
    /// Compute instance id within the GPU instance.
    pub ci: u32,
    /// Start on the memory-slice axis.
    pub start: u32,
}

/// A `[[gpu.mig]]` entry before layout: profile name, optional GI and CI ids.
#[derive(Debug, Clone)]
pub struct MigRequest {
    pub profile: String,
    pub gpu_instance: Option<u32>,
    pub compute_instance: Option<u32>,
}

/// Lays out a GPU's instances: checks profiles, ids and slices, places every instance and
/// assigns the missing GI ids. The result is sorted by GI id (the MIG device index order).
pub fn layout(gpu_name: &str, requests: &[MigRequest]) -> Result<Vec<MigInstance>, String> {
    if requests.is_empty() {
        return Ok(Vec::new());
    }
    let Some(table) = profiles_for(gpu_name) else {
        return Err(format!(
            "MIG is modelled on H100 80GB and H200 only, not on '{gpu_name}'"
        ));
    };
    let mut profiles = Vec::with_capacity(requests.len());
    for k in 0..requests.len() {
        profiles.push(checked_profile(table, requests, k, gpu_name)?);
    }
    let slices: u32 = profiles.iter().map(|p| p.slices).sum();
    if slices > COMPUTE_SLICES || requests.len() as u32 > MAX_MIG_DEVICES {
        return Err(format!(
            "the MIG instances take {slices} compute slices ({}); a GPU has {COMPUTE_SLICES}",
            joined(requests)
        ));
    }
    let mut starts = vec![0u32; profiles.len()];
    if !place(&profiles, 0, 0, &mut starts) {
        return Err(format!(
            "the MIG instances {} do not fit the GPU's {MEMORY_SLICES} memory slices together",
            joined(requests)
        ));
    }
    let mut taken: Vec<u32> = requests.iter().filter_map(|r| r.gpu_instance).collect();
    let mut out = Vec::with_capacity(requests.len());
    for (k, r) in requests.iter().enumerate() {
        let gi = match r.gpu_instance {
            Some(gi) => gi,
            None => {
                let gi = (1..=MAX_GI_ID)
                    .find(|id| !taken.contains(id))
                    .expect("7 instances leave a free id");
                taken.push(gi);
                gi
            }
        };
        out.push(MigInstance {
            profile: profiles[k],
            gi,
            ci: r.compute_instance.unwrap_or(0),
            start: starts[k],
        });
    }
    out.sort_by_key(|m| m.gi);
    Ok(out)
}

/// Request `k`'s profile, with its ids checked (in range, no GI id used twice).
fn checked_profile(
    table: &'static [MigProfile],
    requests: &[MigRequest],
    k: usize,
    gpu_name: &str,
) -> Result<&'static MigProfile, String> {
    let r = &requests[k];
    let Some(p) = table.iter().find(|p| p.name == r.profile) else {
        let names = table.iter().map(|p| p.name).collect::<Vec<_>>().join(", ");
        return Err(format!(
            "mig[{k}]: unknown profile '{}' for {gpu_name} (one of {names})",
            r.profile,
        ));
    };
    if let Some(gi) = r.gpu_instance
        && gi > MAX_GI_ID
    {
        return Err(format!(
            "mig[{k}]: gpu_instance must be in 0..={MAX_GI_ID}, not {gi}"
        ));
    }
    if let Some(ci) = r.compute_instance
        && ci > MAX_CI_ID
    {
        return Err(format!(
            "mig[{k}]: compute_instance must be in 0..={MAX_CI_ID}, not {ci}"
        ));
    }
    if let Some(gi) = r.gpu_instance
        && requests[..k].iter().any(|o| o.gpu_instance == Some(gi))
    {
        return Err(format!("mig[{k}]: gpu_instance {gi} is used twice"));
    }
    Ok(p)
}

/// The requests' profile names, as `1g.18gb + 3g.71gb`.
fn joined(requests: &[MigRequest]) -> String {
    requests
        .iter()
        .map(|r| r.profile.as_str())
        .collect::<Vec<_>>()
        .join(" + ")
}

/// Backtracking placement: each instance, in entry order, at the lowest start that lets
/// every later one fit too. `used` is a bit mask of the memory slices taken.
fn place(profiles: &[&MigProfile], k: usize, used: u32, starts: &mut [u32]) -> bool {
    let Some(p) = profiles.get(k) else {
        return true;
    };
    for &start in p.starts {
        let mask = ((1u32 << p.mem_slices) - 1) << start;
        if used & mask == 0 {
            starts[k] = start;
            if place(profiles, k + 1, used | mask, starts) {
                return true;
            }
        }
    }
    false
}

/// How many more instances of `p` fit beside `existing` (first fit, as they would be made
/// one after another).
pub fn remaining_capacity(p: &MigProfile, existing: &[MigInstance]) -> u32 {
    let mut used = existing.iter().fold(0u32, |m, i| {
        m | (((1u32 << i.profile.mem_slices) - 1) << i.start)
    });
    let mut slices: u32 = existing.iter().map(|i| i.profile.slices).sum();
    let mut count = existing.len() as u32;
    let mut n = 0;
    for &start in p.starts {
        let mask = ((1u32 << p.mem_slices) - 1) << start;
        if used & mask == 0 && slices + p.slices <= COMPUTE_SLICES && count < MAX_MIG_DEVICES {
            used |= mask;
            slices += p.slices;
            count += 1;
            n += 1;
        }
    }
    n
}

/// The compute-instance profiles (`NVML_COMPUTE_INSTANCE_PROFILE_*`, by slice count) a GPU
/// instance of `gi_slices` offers: 1, 2, 3, 4 and 7 slices up to its own size (a 4-slice
/// instance has no 3-slice one).
pub fn ci_profile_slices(ci_profile: u32) -> Option<u32> {
    match ci_profile {
        NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE => Some(1),
        NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE => Some(2),
        NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE => Some(3),
        NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE => Some(4),
        NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE => Some(7),
        _ => None,
    }
}

pub fn ci_offered(gi_slices: u32, ci_slices: u32) -> bool {
    ci_slices <= gi_slices && !(gi_slices == 4 && ci_slices == 3)
}

/// The compute-instance profile spanning a whole GPU instance of `slices`.
pub fn full_ci_profile(slices: u32) -> u32 {
    match slices {
        1 => NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
        2 => NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
        3 => NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
        4 => NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
        _ => NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
    }
}

/// `MIG-` + a UUID derived from the parent's UUID and the GI/CI ids: stable across runs and
/// reloads, shaped as the driver's (version nibble 5, RFC 4122 variant).
pub fn mig_uuid(parent_uuid: &str, gi: u32, ci: u32) -> String {
    let key = format!("{}/{gi}/{ci}", parent_uuid.to_ascii_lowercase());
    // FNV-1a of near-identical keys differs in few bits: a splitmix64 finalizer spreads them.
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let a = mix(crate::hash::stable_hash(key.as_bytes()));
    let b = mix(crate::hash::stable_hash(format!("mig:{key}").as_bytes()));
    let mut hex: Vec<u8> = format!("{a:016x}{b:016x}").into_bytes();
    hex[12] = b'5';
    hex[16] = b"89ab"[(hex[16] as usize) % 4];
    let hex = String::from_utf8(hex).expect("hex");
    format!(
        "MIG-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(p: &str) -> MigRequest {
        MigRequest {
            profile: p.into(),
            gpu_instance: None,
            compute_instance: None,
        }
    }

    #[test]
    fn balanced_layout_backtracks() {
        let l = layout(
            "NVIDIA H100 80GB HBM3",
            &[
                req("3g.40gb"),
                req("2g.20gb"),
                req("1g.10gb"),
                req("1g.10gb"),
            ],
        )
        .unwrap();
        let got: Vec<_> = l.iter().map(|m| (m.profile.name, m.gi, m.start)).collect();
        assert_eq!(
            got,
            [
                ("3g.40gb", 1, 4),
                ("2g.20gb", 2, 0),
                ("1g.10gb", 3, 2),
                ("1g.10gb", 4, 3)
            ]
        );
    }

    #[test]
    fn limits() {
        let h = "NVIDIA H100 80GB HBM3";
        assert!(layout(h, &[req("4g.40gb"), req("4g.40gb")]).is_err());
        assert!(layout(h, &[req("3g.40gb"), req("3g.40gb"), req("1g.10gb")]).is_err());
        assert!(
            layout(h, &[req("1g.18gb")])
                .unwrap_err()
                .contains("unknown profile")
        );
        assert!(layout("NVIDIA A100", &[req("1g.10gb")]).is_err());
        assert_eq!(layout(h, &vec![req("1g.10gb"); 7]).unwrap().len(), 7);
        let l = layout("NVIDIA H200", &[req("3g.71gb"), req("3g.71gb")]).unwrap();
        assert_eq!(remaining_capacity(&H200_141GB[0], &l), 0);
        assert_eq!(remaining_capacity(&H200_141GB[0], &l[..1]), 3);
    }

    #[test]
    fn uuid_shape() {
        let u = mig_uuid("GPU-11111111-2222-3333-4444-555555555555", 1, 0);
        assert_eq!(u.len(), 40);
        assert!(u.starts_with("MIG-") && &u[18..19] == "5", "{u}");
        assert_ne!(
            u,
            mig_uuid("GPU-11111111-2222-3333-4444-555555555555", 2, 0)
        );
    }
}
