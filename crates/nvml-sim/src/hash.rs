//! The stable hash every derived name is made from: the UUIDs of GPUs and MIG instances a
//! scenario leaves out, and the default state file. A leaf: `scenario` and `mig` both use
//! it, and it uses neither.

/// FNV-1a of `bytes`, its offset basis xored with `seed` (two seeds: two independent halves
/// of a UUID).
pub fn fnv1a(seed: u64, bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A stable 64-bit hash (FNV-1a), used for derived UUIDs and the default state-file name.
pub fn stable_hash(bytes: &[u8]) -> u64 {
    fnv1a(0, bytes)
}
