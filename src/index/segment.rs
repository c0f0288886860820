//! Writing a segment file: a directory (the ranges and their filters' shapes) and a
//! bucket-major body, so that one value's candidate ranges, across every range of the segment,
//! are in two contiguous byte spans. Layout byte by byte: docs/index-format.md, "Segment"; the
//! reader is `directory.rs`.
//!
//! Invariants this module keeps:
//! 1. Ranges are in key order and do not overlap (each range's first key ≤ its last key <
//!    the next range's first key, in the service's key order).
//! 2. Body row `j` (bucket `j` of every range) starts at `directory_len + j·(2·S + 8)`, and
//!    holds range 0's `b_0` slots, then range 1's `b_1`, …, `S = Σ b_i` slots of 2 bytes, then
//!    the row's checksum (XXH3-64 of its slots, seeded with `j`): every byte a lookup reads is
//!    checked (version 2; version 1 rows had no checksum).
//! 3. The directory is self-delimiting: its length is at a fixed offset
//!    ([`DIRECTORY_LEN_OFFSET`]) and it ends with its own checksum; a segment is never modified
//!    after it is written, so a reader may cache the directory.
//! 4. Building is bounded, by the bounds a reader enforces: at most [`MAX_SEGMENT_RANGES`]
//!    ranges, [`MAX_SEGMENT_VALUES`] distinct values, [`MAX_DIRECTORY_BYTES`] of directory,
//!    [`MAX_ROW_SLOTS`] slots a body row and [`MAX_SEGMENT_BYTES`] bytes.

use std::cmp::Ordering;

use super::codec::{put_u16, put_u32, put_u64};
use super::filter::{bucket_count, fill};
use super::hash::{value_hash, HASH_ID};
use super::staging::StagedRange;
use super::FormatError;
use crate::storage::compare_keys;

/// Bit 0 of a range's flags: the range did not fit its filter and is a candidate for every value.
pub(crate) const FLAG_ALWAYS_CANDIDATE: u32 = 1;

/// A version 2 body row's checksum: XXH3-64 of its slot bytes, seeded with the row's index, so
/// a row read from the wrong place does not match either.
pub(crate) fn row_checksum(j: u32, slots: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(slots, u64::from(j))
}

/// First bytes of a segment file.
pub const SEGMENT_MAGIC: &[u8; 8] = b"TSIDXSEG";
/// The segment version this build writes (it reads version 1 too).
pub const SEGMENT_VERSION: u16 = 2;
/// Where the directory's length (`u32`, little-endian) is: read the first
/// [`DIRECTORY_FIXED_LEN`] bytes, then the whole directory.
pub const DIRECTORY_LEN_OFFSET: usize = 12;
/// Bytes of the directory's fixed part (before the range entries).
pub const DIRECTORY_FIXED_LEN: usize = 32;
/// Most ranges in one segment.
pub const MAX_SEGMENT_RANGES: usize = 65_536;
/// Most distinct values (hashes) in one segment, all ranges together.
pub const MAX_SEGMENT_VALUES: usize = 8 << 20;
/// Largest segment file.
pub const MAX_SEGMENT_BYTES: usize = 64 << 20;
/// Largest directory (a build's are about 80 bytes a range: ~250 KiB for 3,000 ranges).
pub const MAX_DIRECTORY_BYTES: usize = 16 << 20;
/// Most slots in a body row, all ranges together (a row of 1 MiB; a build's are about three
/// slots a range, under 200,000 slots).
pub const MAX_ROW_SLOTS: usize = 1 << 19;
/// The segment size a build should plan for (what one invocation reads and writes in seconds):
/// about 6 million distinct values at 2.5 bytes each.
pub const RECOMMENDED_SEGMENT_BYTES: usize = 16 << 20;

/// Builds a segment from staged ranges in key order (see the module's invariants for the
/// bounds; an error names the one exceeded or the ranges out of order).
pub fn build_segment(ranges: &[StagedRange]) -> Result<Vec<u8>, FormatError> {
    check_ranges(ranges)?;
    let distinct: Vec<u64> = ranges.iter().map(|r| r.hashes.len() as u64).collect();
    let buckets = bucket_count(&distinct);
    let filters: Vec<_> = ranges.iter().map(|r| fill(&r.hashes, buckets)).collect();
    let row_slots: u64 = filters.iter().map(|f| u64::from(f.bucket_size)).sum();
    let mut out = Vec::new();
    out.extend_from_slice(SEGMENT_MAGIC);
    put_u16(&mut out, SEGMENT_VERSION);
    put_u16(&mut out, HASH_ID);
    put_u32(&mut out, 0); // directory length, set below
    put_u32(&mut out, buckets);
    put_u32(&mut out, ranges.len() as u32);
    put_u32(&mut out, row_slots as u32);
    put_u32(&mut out, 0); // reserved
    for (range, filter) in ranges.iter().zip(&filters) {
        put_u32(&mut out, filter.bucket_size);
        put_u32(
            &mut out,
            if filter.always_candidate {
                FLAG_ALWAYS_CANDIDATE
            } else {
                0
            },
        );
        put_u32(&mut out, range.hashes.len() as u32);
        put_u64(&mut out, range.rows);
        range.keys.encode(&mut out)?;
    }
    let directory_len = out.len() + 8;
    let stride = row_slots * 2 + 8;
    let total = directory_len as u64 + u64::from(buckets) * stride;
    if directory_len > MAX_DIRECTORY_BYTES
        || row_slots > MAX_ROW_SLOTS as u64
        || total > MAX_SEGMENT_BYTES as u64
    {
        return Err(FormatError::new(format!(
            "the segment would be {total} bytes, with a directory of {directory_len} bytes and              body rows of {row_slots} slots, over the {MAX_SEGMENT_BYTES},              {MAX_DIRECTORY_BYTES} and {MAX_ROW_SLOTS} allowed: split its ranges over more              segments"
        )));
    }
    out[DIRECTORY_LEN_OFFSET..DIRECTORY_LEN_OFFSET + 4]
        .copy_from_slice(&(directory_len as u32).to_le_bytes());
    let checksum = value_hash(&out);
    put_u64(&mut out, checksum);
    out.reserve(total as usize - out.len());
    for j in 0..buckets as usize {
        let row = out.len();
        for f in &filters {
            let b = f.bucket_size as usize;
            for &slot in &f.slots[j * b..(j + 1) * b] {
                put_u16(&mut out, slot);
            }
        }
        let checksum = row_checksum(j as u32, &out[row..]);
        put_u64(&mut out, checksum);
    }
    Ok(out)
}

fn check_ranges(ranges: &[StagedRange]) -> Result<(), FormatError> {
    let values: usize = ranges.iter().map(|r| r.hashes.len()).sum();
    if ranges.len() > MAX_SEGMENT_RANGES || values > MAX_SEGMENT_VALUES {
        return Err(FormatError::new(format!(
            "a segment holds at most {MAX_SEGMENT_RANGES} ranges and {MAX_SEGMENT_VALUES} \
             distinct values ({} ranges, {values} values)",
            ranges.len()
        )));
    }
    let key = |pk: &str, rk: &str, qk: &str, sk: &str| {
        compare_keys(pk, qk).then_with(|| compare_keys(rk, sk))
    };
    for (i, r) in ranges.iter().enumerate() {
        let k = &r.keys;
        let inverted = key(
            &k.first_partition_key,
            &k.first_row_key,
            &k.last_partition_key,
            &k.last_row_key,
        ) == Ordering::Greater;
        let unsorted = r.hashes.windows(2).any(|w| w[0] >= w[1]);
        let overlaps = ranges.get(i + 1).is_some_and(|next| {
            let n = &next.keys;
            key(
                &k.last_partition_key,
                &k.last_row_key,
                &n.first_partition_key,
                &n.first_row_key,
            ) != Ordering::Less
        });
        if inverted || unsorted || overlaps {
            return Err(FormatError::new(format!(
                "range {i} of the segment {}",
                if inverted {
                    "ends before it starts"
                } else if unsorted {
                    "has hashes that are not ascending and distinct (use StagedRange::new)"
                } else {
                    "does not end before the next range starts (ranges must be in key order)"
                }
            )));
        }
    }
    Ok(())
}
