//! The index's fixed hash and what the filters derive from it: a 16-bit fingerprint and two
//! candidate buckets (partial-key cuckoo hashing for any number of buckets).
//!
//! Invariants this module keeps (a file format: docs/index-format.md, "Hash", under
//! [`HASH_ID`]; never change them, add a new hash id instead):
//! 1. `value_hash` is XXH3-64 with seed 0 of the canonical bytes.
//! 2. The fingerprint is `(hash >> 32) % 65535 + 1`: over 1..=65535 (uniform within 2^-32),
//!    never 0 (0 is an empty slot); from the hash's high half, independent of bucket 1.
//! 3. Bucket 1 is `((hash & 0xFFFF_FFFF) * B) >> 32` (a multiply-shift reduction: any `B` from
//!    1 to 2^32, no power of two needed). The alternate of bucket `i` is
//!    `(mix(fp) + B - i) % B` with `mix(fp) = XXH3-64(fp as 2 little-endian bytes, seed 0) % B`:
//!    the same formula maps each bucket of a pair to the other, so a fingerprint can be moved
//!    (kicked) knowing only its bucket, as partial-key cuckoo hashing needs. (The usual
//!    `i xor hash(fp)` only works when `B` is a power of two.)

use xxhash_rust::xxh3::xxh3_64;

/// The id of this hash and derivation, recorded in every segment and staging file.
pub const HASH_ID: u16 = 1;

/// The index hash of canonical value bytes ([`super::IndexValue::canonical_bytes`]).
pub fn value_hash(canonical: &[u8]) -> u64 {
    xxh3_64(canonical)
}

/// Where one value lives in a filter of `buckets` buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// 1..=65535.
    pub fingerprint: u16,
    /// Bucket 1 (`< buckets`).
    pub bucket1: u32,
    /// Bucket 2 (`< buckets`), [`alternate_bucket`] of bucket 1; may equal it.
    pub bucket2: u32,
}

impl Placement {
    /// The placement of a value of index hash `hash` among `buckets` (≥ 1) buckets.
    pub fn of(hash: u64, buckets: u32) -> Placement {
        assert!(buckets >= 1, "a filter has at least one bucket");
        let fingerprint = fingerprint(hash);
        let bucket1 = (((hash & 0xFFFF_FFFF) * u64::from(buckets)) >> 32) as u32;
        Placement {
            fingerprint,
            bucket1,
            bucket2: alternate_bucket(bucket1, fingerprint, buckets),
        }
    }
}

/// The 16-bit fingerprint of an index hash (invariant 2).
pub fn fingerprint(hash: u64) -> u16 {
    ((hash >> 32) % 65535 + 1) as u16
}

/// The other bucket of the pair holding `bucket` for `fingerprint` (invariant 3): an
/// involution, `alternate_bucket(alternate_bucket(i, f, b), f, b) == i`.
pub fn alternate_bucket(bucket: u32, fingerprint: u16, buckets: u32) -> u32 {
    let b = u64::from(buckets);
    let mix = xxh3_64(&fingerprint.to_le_bytes()) % b;
    ((mix + b - u64::from(bucket) % b) % b) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_xxh3_64_seed_0() {
        // Published XXH3-64 test vector: the empty input with seed 0.
        assert_eq!(value_hash(b""), 0x2D06_8005_38D3_94C2);
    }

    #[test]
    fn fingerprints_are_never_zero_and_buckets_pair_up() {
        for buckets in [1u32, 2, 3, 7, 100, 1000, 65_537, u32::MAX] {
            for seed in 0..2000u64 {
                let h = xxh3_64(&seed.to_le_bytes());
                let p = Placement::of(h, buckets);
                assert_ne!(p.fingerprint, 0);
                assert!(p.bucket1 < buckets && p.bucket2 < buckets);
                assert_eq!(
                    alternate_bucket(p.bucket2, p.fingerprint, buckets),
                    p.bucket1
                );
            }
        }
        assert_eq!(fingerprint(0), 1);
        assert_eq!(fingerprint(0xFFFF_FFFF), 1);
        assert_eq!(fingerprint(65534 << 32), 65535);
        assert_eq!(fingerprint(65535 << 32), 1);
    }
}
