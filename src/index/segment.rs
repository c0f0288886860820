//! The segment file: a directory (the ranges and their filters' shapes) and a bucket-major
//! body, so that one value's candidate ranges, across every range of the segment, are in two
//! contiguous byte spans. Layout byte by byte: docs/index-format.md, "Segment".
//!
//! Invariants this module keeps:
//! 1. Ranges are in key order and do not overlap (each range's first key ≤ its last key <
//!    the next range's first key, in the service's key order).
//! 2. Body row `j` (bucket `j` of every range) starts at `directory_len + j·row_len`, and holds
//!    range 0's `b_0` slots, then range 1's `b_1`, …; `row_len = 2·Σ b_i`.
//! 3. The directory is self-delimiting: its length is at a fixed offset
//!    ([`DIRECTORY_LEN_OFFSET`]) and it ends with its own checksum; a segment is never modified
//!    after it is written, so a reader may cache the directory.
//! 4. Building is bounded: at most [`MAX_SEGMENT_RANGES`] ranges, [`MAX_SEGMENT_VALUES`]
//!    distinct values and [`MAX_SEGMENT_BYTES`] bytes.

use std::cmp::Ordering;

use super::codec::{self, put_u16, put_u32, put_u64, Reader};
use super::filter::{bucket_count, fill};
use super::hash::{value_hash, Placement, HASH_ID};
use super::staging::{KeyBounds, StagedRange};
use super::{FormatError, IndexValue};
use crate::storage::compare_keys;

/// First bytes of a segment file.
pub const SEGMENT_MAGIC: &[u8; 8] = b"TSIDXSEG";
/// The segment version this build writes and reads.
pub const SEGMENT_VERSION: u16 = 1;
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
/// The segment size a build should plan for (what one invocation reads and writes in seconds):
/// about 6 million distinct values at 2.5 bytes each.
pub const RECOMMENDED_SEGMENT_BYTES: usize = 16 << 20;

/// Bit 0 of a range's flags: the range did not fit its filter and is a candidate for every value.
const FLAG_ALWAYS_CANDIDATE: u32 = 1;

/// One range as the directory describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeEntry {
    pub keys: KeyBounds,
    /// Rows indexed (holding the property), duplicates counted.
    pub rows: u64,
    /// Distinct values (hashes) staged.
    pub distinct: u32,
    /// Slots per bucket, `b_i` (0 for an empty or always-candidate range).
    pub bucket_size: u32,
    /// The range is a candidate for every value (its values did not fit a filter).
    pub always_candidate: bool,
    /// Slot offset of this range within a body row.
    slot_offset: u32,
}

/// A segment's directory: everything but the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentDirectory {
    /// Buckets per range, `B`.
    pub buckets: u32,
    /// Bytes of the directory; the body starts here.
    pub directory_len: u64,
    /// Slots per body row, `Σ b_i`.
    pub row_slots: u32,
    ranges: Vec<RangeEntry>,
}

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
    let total = directory_len as u64 + u64::from(buckets) * row_slots * 2;
    if total > MAX_SEGMENT_BYTES as u64 {
        return Err(FormatError::new(format!(
            "the segment would be {total} bytes, over the {MAX_SEGMENT_BYTES} allowed: \
             split its ranges over more segments"
        )));
    }
    out[DIRECTORY_LEN_OFFSET..DIRECTORY_LEN_OFFSET + 4]
        .copy_from_slice(&(directory_len as u32).to_le_bytes());
    let checksum = value_hash(&out);
    put_u64(&mut out, checksum);
    out.reserve(total as usize - out.len());
    for j in 0..buckets as usize {
        for f in &filters {
            let b = f.bucket_size as usize;
            for &slot in &f.slots[j * b..(j + 1) * b] {
                put_u16(&mut out, slot);
            }
        }
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

impl SegmentDirectory {
    /// The directory's length in bytes, from the first [`DIRECTORY_FIXED_LEN`] (or more)
    /// bytes of a segment (checks the magic, version and hash id).
    pub fn directory_len(prefix: &[u8]) -> Result<usize, FormatError> {
        let mut reader = Reader::new(prefix, "segment");
        codec::check_preamble(&mut reader, SEGMENT_MAGIC, SEGMENT_VERSION)?;
        let len = reader.u32()? as usize;
        if len < DIRECTORY_FIXED_LEN + 8 {
            return Err(FormatError::new(format!(
                "a segment directory of {len} bytes is too short"
            )));
        }
        Ok(len)
    }

    /// Parses the directory from the segment's first bytes (at least the directory; more,
    /// such as the whole segment, is fine).
    pub fn parse(bytes: &[u8]) -> Result<SegmentDirectory, FormatError> {
        let len = Self::directory_len(bytes)?;
        if bytes.len() < len {
            return Err(FormatError::new(format!(
                "the segment directory is {len} bytes; {} were given",
                bytes.len()
            )));
        }
        let (body, checksum) = bytes[..len].split_at(len - 8);
        if value_hash(body).to_le_bytes() != checksum {
            return Err(FormatError::new(
                "the segment directory's checksum does not match",
            ));
        }
        let mut reader = Reader::new(body, "segment directory");
        reader.take(DIRECTORY_LEN_OFFSET + 4)?;
        let buckets = reader.u32()?;
        let count = reader.u32()? as usize;
        let row_slots = reader.u32()?;
        let reserved = reader.u32()?;
        if buckets == 0 || count > MAX_SEGMENT_RANGES || reserved != 0 {
            return Err(FormatError::new(format!(
                "a segment of {buckets} buckets, {count} ranges and reserved field {reserved} is \
                 not valid in version {SEGMENT_VERSION}"
            )));
        }
        let mut ranges = Vec::with_capacity(count);
        let mut slot_offset = 0u32;
        for _ in 0..count {
            let bucket_size = reader.u32()?;
            let flags = reader.u32()?;
            let distinct = reader.u32()?;
            let rows = reader.u64()?;
            let keys = KeyBounds::decode(&mut reader)?;
            if flags & !FLAG_ALWAYS_CANDIDATE != 0 {
                return Err(FormatError::new(format!(
                    "a segment range has flags {flags:#x}, unknown in version {SEGMENT_VERSION}"
                )));
            }
            ranges.push(RangeEntry {
                keys,
                rows,
                distinct,
                bucket_size,
                always_candidate: flags & FLAG_ALWAYS_CANDIDATE != 0,
                slot_offset,
            });
            slot_offset = slot_offset
                .checked_add(bucket_size)
                .ok_or_else(|| FormatError::new("the segment's bucket sizes overflow"))?;
        }
        if slot_offset != row_slots || reader.position() != body.len() {
            return Err(FormatError::new(
                "the segment directory's ranges do not add up",
            ));
        }
        Ok(SegmentDirectory {
            buckets,
            directory_len: len as u64,
            row_slots,
            ranges,
        })
    }

    /// The ranges, in key order.
    pub fn ranges(&self) -> &[RangeEntry] {
        &self.ranges
    }

    /// Bytes of one body row (one bucket of every range).
    pub fn row_len(&self) -> u64 {
        u64::from(self.row_slots) * 2
    }

    /// The whole segment's length in bytes.
    pub fn segment_len(&self) -> u64 {
        self.directory_len + u64::from(self.buckets) * self.row_len()
    }

    /// The two byte spans `(offset, length)` of the segment (absolute offsets in the blob) that
    /// hold every range's candidate slots for `value`: bucket 1's row, then bucket 2's (they may
    /// be the same span; a span of length 0 needs no read).
    pub fn bucket_spans(&self, value: &IndexValue) -> [(u64, u64); 2] {
        self.bucket_spans_for_hash(value.index_hash())
    }

    /// [`SegmentDirectory::bucket_spans`] for a value's index hash.
    pub fn bucket_spans_for_hash(&self, hash: u64) -> [(u64, u64); 2] {
        let p = Placement::of(hash, self.buckets);
        let row = |j: u32| {
            (
                self.directory_len + u64::from(j) * self.row_len(),
                self.row_len(),
            )
        };
        [row(p.bucket1), row(p.bucket2)]
    }

    /// The ranges (indexes into [`SegmentDirectory::ranges`], ascending) that may hold `value`,
    /// given the bytes of its two [`SegmentDirectory::bucket_spans`].
    pub fn candidates(
        &self,
        value: &IndexValue,
        row1: &[u8],
        row2: &[u8],
    ) -> Result<Vec<usize>, FormatError> {
        self.candidates_for_hash(value.index_hash(), row1, row2)
    }

    /// [`SegmentDirectory::candidates`] for a value's index hash.
    pub fn candidates_for_hash(
        &self,
        hash: u64,
        row1: &[u8],
        row2: &[u8],
    ) -> Result<Vec<usize>, FormatError> {
        let want = self.row_len() as usize;
        if row1.len() != want || row2.len() != want {
            return Err(FormatError::new(format!(
                "a segment bucket row is {want} bytes; {} and {} were given",
                row1.len(),
                row2.len()
            )));
        }
        let fp = Placement::of(hash, self.buckets).fingerprint.to_le_bytes();
        let holds = |row: &[u8], r: &RangeEntry| {
            let start = r.slot_offset as usize * 2;
            row[start..start + r.bucket_size as usize * 2]
                .chunks_exact(2)
                .any(|slot| slot == fp)
        };
        Ok(self
            .ranges
            .iter()
            .enumerate()
            .filter(|(_, r)| r.always_candidate || holds(row1, r) || holds(row2, r))
            .map(|(i, _)| i)
            .collect())
    }
}
