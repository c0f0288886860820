//! A secondary index for one property of a table: which key ranges may hold a value, answered
//! from two contiguous reads per segment of the index, however many ranges it has.
//!
//! Pure: no I/O, no HTTP, no Azure types, no async (the driver that builds an index and the
//! lookup function are in `crate::app`). The structure: one cuckoo filter of 16-bit
//! fingerprints per key range, every range of a segment with the same number of buckets `B`
//! and its own bucket size, stored bucket-major (bucket `j` of every range together), so a
//! value's candidate ranges are found by reading two rows of the body. The format, byte by
//! byte, and why: docs/index-format.md.
//!
//! - [`IndexValue`]: typed values (EDM type and exact value), from a stored property or a
//!   filter literal, back to a literal, and their canonical bytes;
//! - [`hash`]: the fixed hash of those bytes, the fingerprint and the two buckets;
//! - [`StagedRange`], [`encode_staging`], [`decode_staging`]: what a scan step writes about
//!   the ranges it read (bounds, rows, value hashes);
//! - [`build_segment`], [`SegmentHeader`], [`SegmentDirectory`]: a segment file from staged
//!   ranges; its header (every size a reader will read, checked against the bounds before
//!   anything else is read) and its directory (spans to read for a value, and the candidate
//!   ranges they give, each row's checksum verified).
//!
//! Invariant of the whole module: **no false negatives**. A range holding a value is always
//! among its candidates: canonicalisation only merges values (`value.rs`), an insertion never
//! drops a fingerprint (`filter.rs`), and the layout is read exactly as it is written
//! (`segment.rs`). A false positive costs one query that returns nothing.

mod codec;
mod directory;
mod filter;
pub mod hash;
mod segment;
mod staging;
mod value;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod value_tests;

pub use codec::MAX_KEY_BYTES;
pub use directory::{RangeEntry, SegmentDirectory, SegmentHeader, SEGMENT_VERSION_1};
pub use filter::{bucket_count, DESIGN_FP_RATE, MAX_BUCKET_SIZE, MAX_KICKS};
pub use segment::{
    build_segment, DIRECTORY_FIXED_LEN, DIRECTORY_LEN_OFFSET, MAX_DIRECTORY_BYTES, MAX_ROW_SLOTS,
    MAX_SEGMENT_BYTES, MAX_SEGMENT_RANGES, MAX_SEGMENT_VALUES, RECOMMENDED_SEGMENT_BYTES,
    SEGMENT_MAGIC, SEGMENT_VERSION,
};
pub use staging::{
    decode_staging, encode_staging, KeyBounds, StagedRange, MAX_STAGING_BYTES, MAX_STAGING_HASHES,
    MAX_STAGING_RANGES, STAGING_MAGIC, STAGING_VERSION,
};
pub use value::{IndexValue, ValueError};

/// A segment or staging file that cannot be built or read; the text says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FormatError(pub String);

impl FormatError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        FormatError(message.into())
    }
}
