//! Maps and sets keyed by pids and process identities, with a multiply-rotate hash instead
//! of std's SipHash. A watchdog loop over 8 GPUs × 256 processes hashes a few thousand pids;
//! SipHash, built to resist keys chosen by an attacker, cost more than the lookups it served.
//! Pids are handed out by the kernel and bounded by `pid_max`, so there is no flooding to
//! defend against, and a multiply spreads consecutive pids over the high bits that
//! hashbrown's groups read.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// A map keyed by pid or [`crate::act::Identity`].
pub type PidMap<K, V> = HashMap<K, V, BuildHasherDefault<PidHasher>>;
/// A set of pids or [`crate::act::Identity`]s.
pub type PidSet<K> = HashSet<K, BuildHasherDefault<PidHasher>>;

/// The Fx hash (Firefox, rustc): each word is mixed in by a rotate, an xor and a multiply by
/// an odd constant.
#[derive(Debug, Default, Clone, Copy)]
pub struct PidHasher {
    state: u64,
}

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl PidHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.state = (self.state.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for PidHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word) ^ ((rest.len() as u64) << 59));
        }
    }

    #[inline]
    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    #[inline]
    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.state
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::act::Identity;

    #[test]
    fn consecutive_pids_spread_over_the_high_bits() {
        // hashbrown picks a bucket from the low bits (a multiply by an odd number maps
        // consecutive pids to distinct low bits) and tags entries with the top 7, which must
        // vary too.
        let hash = |pid: u32| {
            let mut hasher = PidHasher::default();
            hasher.write_u32(pid);
            hasher.finish()
        };
        let tags: HashSet<u64> = (1000..1128).map(|pid| hash(pid) >> 57).collect();
        assert!(tags.len() > 32, "{} distinct tags", tags.len());
        let low: HashSet<u64> = (1000..1128).map(|pid| hash(pid) & 127).collect();
        assert!(low.len() == 128, "{} distinct low bits", low.len());
    }

    #[test]
    fn maps_keyed_by_identity_find_what_they_hold() {
        let mut map: PidMap<Identity, u32> = PidMap::default();
        for pid in 1..2000 {
            map.insert(Identity::new(pid, u64::from(pid) * 7), pid);
        }
        assert_eq!(map.len(), 1999);
        assert_eq!(map.get(&Identity::new(1234, 1234 * 7)), Some(&1234));
        assert_eq!(map.get(&Identity::new(1234, 1)), None);
        let bytes: PidSet<&[u8]> = [&b"a"[..], b"ab", b"abcdefghi", b"abcdefgh"]
            .into_iter()
            .collect();
        assert!(bytes.contains(&b"abcdefghi"[..]) && !bytes.contains(&b"b"[..]));
    }
}
