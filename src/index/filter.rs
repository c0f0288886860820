//! Aligned cuckoo filters: one per key range of a segment, all with the same number of buckets
//! `B`, each with its own bucket size `b_i` (slots per bucket).
//!
//! Invariants this module keeps:
//! 1. **Every distinct hash of a range is findable**: after [`fill`], its fingerprint is in one
//!    of its two buckets, or the range is marked `always_candidate` (it then answers "maybe" to
//!    every value). Nothing is ever dropped; a failed insertion restarts the range with a bigger
//!    bucket.
//! 2. `B` gives every range a theoretical false-positive rate of at most [`DESIGN_FP_RATE`]:
//!    a probe matches each occupied slot of its two buckets with probability 1/65535, and the
//!    two buckets hold `2·n_i/B` fingerprints on average, so `fp_i ≈ 2·n_i / (B·65535)`,
//!    whatever `b_i` is (the seed's `2·b/2^16` times the occupancy `n_i/(b_i·B)`).
//! 3. Deterministic: the same hashes and `B` give the same slots (a fixed pseudo-random
//!    sequence chooses the kicks), so a rebuilt segment is byte-identical.

use super::hash::{alternate_bucket, Placement};

/// The theoretical false-positive rate per range the bucket count is chosen for: below the
/// 1e-4 goal so that a measured rate stays under it.
pub const DESIGN_FP_RATE: f64 = 0.9e-4;
/// Most relocations one insertion tries before the range restarts with a bigger bucket size.
pub const MAX_KICKS: u32 = 500;
/// Largest bucket size; a range that does not fit (only adversarial values could cause it) is
/// stored as "always a candidate" instead, so it costs a read per lookup, never a miss.
pub const MAX_BUCKET_SIZE: u32 = 64;

/// Conservative occupancy a bucket size reaches with [`MAX_KICKS`] (the cuckoo filter paper
/// reports 50%, 84%, 95%, 98% for b = 1, 2, 4, 8 with unbounded effort).
fn max_load(bucket_size: u32) -> f64 {
    match bucket_size {
        0 => 0.0,
        1 => 0.45,
        2 => 0.80,
        3 => 0.88,
        4 => 0.92,
        _ => 0.94,
    }
}

/// The bucket size predicted for `distinct` values in `buckets` buckets.
pub(crate) fn predicted_bucket_size(distinct: u64, buckets: u32) -> u32 {
    if distinct == 0 {
        return 0;
    }
    (1..MAX_BUCKET_SIZE)
        .find(|&b| distinct as f64 <= max_load(b) * f64::from(b) * f64::from(buckets))
        .unwrap_or(MAX_BUCKET_SIZE)
}

/// The number of buckets for ranges of these distinct value counts: the smallest `B` meeting
/// [`DESIGN_FP_RATE`] for the biggest range, or, up to twice that, the one with the fewest
/// predicted slots in total (a bigger `B` can let every range use a smaller bucket size).
pub fn bucket_count(distinct: &[u64]) -> u32 {
    let largest = distinct.iter().copied().max().unwrap_or(0);
    let least = (2.0 * largest as f64 / (65535.0 * DESIGN_FP_RATE)).ceil();
    let least = least.clamp(1.0, f64::from(u32::MAX / 2)) as u32;
    let predicted = |b: u32| -> u64 {
        distinct
            .iter()
            .map(|&n| u64::from(predicted_bucket_size(n, b)))
            .sum::<u64>()
            * u64::from(b)
    };
    // At most 64 candidates, evenly spread over [least, 2·least].
    let step = (least / 64).max(1);
    (0..=64u32)
        .map(|k| least.saturating_add(k * step))
        .take_while(|&b| b <= least.saturating_mul(2))
        .min_by_key(|&b| (predicted(b), b))
        .unwrap_or(least)
}

/// One range's filter: `bucket_size` slots per bucket, bucket `j`'s slots at
/// `slots[j·bucket_size ..][..bucket_size]`, 0 for empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RangeFilter {
    pub bucket_size: u32,
    pub slots: Vec<u16>,
    pub always_candidate: bool,
}

/// Builds the filter of a range from its hashes (duplicates allowed; stored once) in `buckets`
/// buckets: the predicted bucket size first, one more on each failed insertion (invariant 1).
pub(crate) fn fill(hashes: &[u64], buckets: u32) -> RangeFilter {
    let mut bucket_size = predicted_bucket_size(hashes.len() as u64, buckets);
    if hashes.is_empty() {
        return RangeFilter {
            bucket_size: 0,
            slots: Vec::new(),
            always_candidate: false,
        };
    }
    while bucket_size <= MAX_BUCKET_SIZE {
        if let Some(slots) = try_fill(hashes, buckets, bucket_size) {
            return RangeFilter {
                bucket_size,
                slots,
                always_candidate: false,
            };
        }
        bucket_size += 1;
    }
    RangeFilter {
        bucket_size: 0,
        slots: Vec::new(),
        always_candidate: true,
    }
}

/// One insertion attempt at a fixed bucket size; `None` when an insertion runs out of kicks.
fn try_fill(hashes: &[u64], buckets: u32, bucket_size: u32) -> Option<Vec<u16>> {
    let size = bucket_size as usize;
    let mut slots = vec![0u16; buckets as usize * size];
    let mut rng = SplitMix64(0x7461_626C_6573_6361 ^ hashes.len() as u64);
    for &hash in hashes {
        let p = Placement::of(hash, buckets);
        let bucket = |i: u32| (i as usize * size)..((i as usize + 1) * size);
        let (b1, b2) = (bucket(p.bucket1), bucket(p.bucket2));
        if slots[b1.clone()].contains(&p.fingerprint) || slots[b2.clone()].contains(&p.fingerprint)
        {
            continue; // Already findable: a value with the same fingerprint and buckets.
        }
        if place(&mut slots[b1], p.fingerprint) || place(&mut slots[b2], p.fingerprint) {
            continue;
        }
        let start = if rng.next() & 1 == 0 {
            p.bucket1
        } else {
            p.bucket2
        };
        kick(&mut slots, size, buckets, start, p.fingerprint, &mut rng)?;
    }
    Some(slots)
}

/// Puts `fingerprint` in an empty slot of `bucket`, if there is one.
fn place(bucket: &mut [u16], fingerprint: u16) -> bool {
    match bucket.iter_mut().find(|s| **s == 0) {
        Some(slot) => {
            *slot = fingerprint;
            true
        }
        None => false,
    }
}

/// Cuckoo relocation: evict a random slot of the full `bucket`, move the evicted fingerprint
/// to its alternate bucket, repeat; `None` after [`MAX_KICKS`] relocations.
fn kick(
    slots: &mut [u16],
    size: usize,
    buckets: u32,
    mut bucket: u32,
    mut fingerprint: u16,
    rng: &mut SplitMix64,
) -> Option<()> {
    for _ in 0..MAX_KICKS {
        let victim = bucket as usize * size + (rng.next() % size as u64) as usize;
        std::mem::swap(&mut slots[victim], &mut fingerprint);
        bucket = alternate_bucket(bucket, fingerprint, buckets);
        let start = bucket as usize * size;
        if place(&mut slots[start..start + size], fingerprint) {
            return Some(());
        }
    }
    None
}

/// SplitMix64, a fixed public generator, hand-written (five lines) because the slots must not
/// change with a random crate's version (invariant 3).
pub(crate) struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}
