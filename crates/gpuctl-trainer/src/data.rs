//! The training data, generated deterministically (nothing is downloaded): a synthetic
//! language over `vocab` tokens, an order-one Markov chain whose successors and their weights
//! come from the seed. Sample `k` is a function of (seed, k) alone, and the order of samples
//! in an epoch a function of (seed, epoch), so any step's batch can be rebuilt anywhere: in a
//! data-loader worker, after an OOM, or after a resume.

/// Successors each token may have, and how likely each is: a learnable structure whose
/// entropy (about 1.2 nats) is far below log(vocab).
const SUCCESSORS: usize = 4;
const WEIGHTS: [u64; SUCCESSORS] = [50, 25, 15, 10];

/// What defines the data of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataSpec {
    pub seed: u64,
    pub vocab: u32,
    /// Tokens a model sees per sample; each sample has one more, the last target.
    pub length: u32,
    /// Samples per epoch.
    pub dataset_size: u64,
    /// Samples per optimizer step (the effective batch).
    pub batch_size: u32,
}

impl DataSpec {
    pub fn steps_per_epoch(&self) -> u64 {
        self.dataset_size / u64::from(self.batch_size)
    }

    /// The tokens of the batch for optimizer step `step`: `batch_size` rows of `length + 1`.
    pub fn batch(&self, step: u64, order: &mut EpochOrder) -> Vec<u32> {
        let per_epoch = self.steps_per_epoch();
        let epoch = step / per_epoch;
        let first = (step % per_epoch) * u64::from(self.batch_size);
        let order = order.for_epoch(self, epoch);
        let mut tokens = Vec::with_capacity((self.batch_size * (self.length + 1)) as usize);
        for position in first..first + u64::from(self.batch_size) {
            self.sample_into(order[position as usize], &mut tokens);
        }
        tokens
    }

    /// Appends sample `index`'s `length + 1` tokens.
    pub fn sample_into(&self, index: u64, out: &mut Vec<u32>) {
        let mut rng = SplitMix64::new(mix(self.seed ^ 0x5eed_da7a, index));
        let mut token = (rng.next() % u64::from(self.vocab)) as u32;
        out.push(token);
        for _ in 0..self.length {
            token = self.successor(token, rng.next());
            out.push(token);
        }
    }

    /// The token after `token`, chosen by `draw` among its weighted successors.
    fn successor(&self, token: u32, draw: u64) -> u32 {
        let total: u64 = WEIGHTS.iter().sum();
        let mut pick = draw % total;
        let mut choice = 0;
        for (i, weight) in WEIGHTS.iter().enumerate() {
            if pick < *weight {
                choice = i;
                break;
            }
            pick -= weight;
        }
        let successor = mix(
            self.seed,
            u64::from(token) * SUCCESSORS as u64 + choice as u64,
        );
        (successor % u64::from(self.vocab)) as u32
    }
}

/// The order of samples in the current epoch, kept while steps stay in it.
#[derive(Debug, Default)]
pub struct EpochOrder {
    epoch: Option<u64>,
    order: Vec<u64>,
}

impl EpochOrder {
    fn for_epoch(&mut self, spec: &DataSpec, epoch: u64) -> &[u64] {
        if self.epoch != Some(epoch) {
            // A shuffle keyed by (seed, epoch): every worker computes the same one.
            let key = mix(spec.seed ^ 0xe70c, epoch);
            self.order = (0..spec.dataset_size).collect();
            self.order.sort_by_cached_key(|&i| mix(key, i));
            self.epoch = Some(epoch);
        }
        &self.order
    }
}

/// SplitMix64: tiny, fast, and the same everywhere.
struct SplitMix64(u64);

impl SplitMix64 {
    fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

fn mix(a: u64, b: u64) -> u64 {
    SplitMix64::new(a ^ b.wrapping_mul(0xd6e8_feb8_6659_fd93)).next()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> DataSpec {
        DataSpec {
            seed: 7,
            vocab: 64,
            length: 16,
            dataset_size: 64,
            batch_size: 8,
        }
    }

    #[test]
    fn a_batch_is_the_same_wherever_it_is_built() {
        let spec = spec();
        let (mut a, mut b) = (EpochOrder::default(), EpochOrder::default());
        // Built in a different order, by a different "worker": the same tokens.
        let later = spec.batch(11, &mut a);
        let first = spec.batch(0, &mut a);
        assert_eq!(spec.batch(0, &mut b), first);
        assert_eq!(spec.batch(11, &mut b), later);
        assert_eq!(first.len(), 8 * 17);
        assert!(first.iter().all(|&t| t < 64));
    }

    #[test]
    fn an_epoch_visits_every_sample_once_in_a_new_order() {
        let spec = spec();
        let mut order = EpochOrder::default();
        let epoch0 = order.for_epoch(&spec, 0).to_vec();
        let epoch1 = order.for_epoch(&spec, 1).to_vec();
        let mut sorted = epoch0.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..64).collect::<Vec<_>>());
        assert_ne!(epoch0, epoch1);
        assert_eq!(spec.steps_per_epoch(), 8);
    }

    #[test]
    fn the_language_has_structure_to_learn() {
        // Each token has at most four successors.
        let spec = spec();
        let mut tokens = Vec::new();
        for k in 0..200 {
            spec.sample_into(k, &mut tokens);
        }
        let mut successors =
            std::collections::HashMap::<u32, std::collections::HashSet<u32>>::new();
        for sample in tokens.chunks(17) {
            for pair in sample.windows(2) {
                successors.entry(pair[0]).or_default().insert(pair[1]);
            }
        }
        assert!(successors.values().all(|s| s.len() <= SUCCESSORS));
        assert!(successors.len() > 32, "most tokens occur");
    }
}
