//! The staging record: what a scan step writes about the key ranges it read, for the
//! assembly of a segment later ([`super::build_segment`] takes these ranges).
//!
//! A record holds, per range, its inclusive key bounds, how many rows it indexed, and the
//! sorted, distinct 64-bit index hashes of their values: not the values. Hashes are all the
//! assembly needs (fingerprint and buckets derive from them), they are 8 bytes whatever the value
//! (a String or Binary value can be 64 KiB), and the hash is fixed by the format (hash id), so a
//! record written by one build is assembled by the next. Layout: docs/index-format.md.
//!
//! Invariants: an encoded record is at most [`MAX_STAGING_BYTES`]; decoding checks the
//! checksum, the bounds and that hashes are strictly ascending before returning anything.

use super::codec::{self, put_str, put_u16, put_u32, put_u64, Reader};
use super::hash::{value_hash, HASH_ID};
use super::{FormatError, IndexValue};

/// First bytes of a staging record.
pub const STAGING_MAGIC: &[u8; 8] = b"TSIDXSTG";
/// The staging record version this build writes and reads.
pub const STAGING_VERSION: u16 = 1;
/// Most ranges in one record.
pub const MAX_STAGING_RANGES: usize = 4096;
/// Most hashes in one record, all ranges together (8 MiB of hashes).
pub const MAX_STAGING_HASHES: usize = 1 << 20;
/// Largest encoded record: preamble, every range's keys at their longest, the hashes, checksum.
pub const MAX_STAGING_BYTES: usize =
    16 + MAX_STAGING_RANGES * (4 * (4 + codec::MAX_KEY_BYTES) + 12) + 8 * MAX_STAGING_HASHES + 8;

/// A key range's inclusive bounds: the first and the last row (PartitionKey, RowKey) it covers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeyBounds {
    pub first_partition_key: String,
    pub first_row_key: String,
    pub last_partition_key: String,
    pub last_row_key: String,
}

impl KeyBounds {
    pub fn new(first: (&str, &str), last: (&str, &str)) -> Self {
        KeyBounds {
            first_partition_key: first.0.into(),
            first_row_key: first.1.into(),
            last_partition_key: last.0.into(),
            last_row_key: last.1.into(),
        }
    }

    pub(crate) fn encode(&self, out: &mut Vec<u8>) -> Result<(), FormatError> {
        put_str(out, &self.first_partition_key)?;
        put_str(out, &self.first_row_key)?;
        put_str(out, &self.last_partition_key)?;
        put_str(out, &self.last_row_key)
    }

    pub(crate) fn decode(reader: &mut Reader<'_>) -> Result<Self, FormatError> {
        Ok(KeyBounds {
            first_partition_key: reader.string()?,
            first_row_key: reader.string()?,
            last_partition_key: reader.string()?,
            last_row_key: reader.string()?,
        })
    }
}

/// One key range as staged: bounds, rows indexed (rows holding the property, duplicates
/// counted), and the distinct index hashes of their values, ascending.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StagedRange {
    pub keys: KeyBounds,
    pub rows: u64,
    /// Ascending and distinct ([`StagedRange::new`] makes them so).
    pub hashes: Vec<u64>,
}

impl StagedRange {
    /// A range from hashes in any order, duplicates allowed.
    pub fn new(keys: KeyBounds, rows: u64, mut hashes: Vec<u64>) -> Self {
        hashes.sort_unstable();
        hashes.dedup();
        StagedRange { keys, rows, hashes }
    }

    /// A range from its rows' values (one per indexed row).
    pub fn from_values<'a>(
        keys: KeyBounds,
        values: impl IntoIterator<Item = &'a IndexValue>,
    ) -> Self {
        let hashes: Vec<u64> = values
            .into_iter()
            .map(|v| value_hash(&v.canonical_bytes()))
            .collect();
        let rows = hashes.len() as u64;
        Self::new(keys, rows, hashes)
    }
}

/// Encodes ranges as one staging record; an error over the bounds or for hashes that are not
/// ascending and distinct.
pub fn encode_staging(ranges: &[StagedRange]) -> Result<Vec<u8>, FormatError> {
    check_counts(ranges.len(), ranges.iter().map(|r| r.hashes.len()).sum())?;
    let mut out = Vec::new();
    out.extend_from_slice(STAGING_MAGIC);
    put_u16(&mut out, STAGING_VERSION);
    put_u16(&mut out, HASH_ID);
    put_u32(&mut out, ranges.len() as u32);
    for range in ranges {
        if range.hashes.windows(2).any(|w| w[0] >= w[1]) {
            return Err(FormatError::new(
                "a staged range's hashes must be ascending and distinct (use StagedRange::new)",
            ));
        }
        range.keys.encode(&mut out)?;
        put_u64(&mut out, range.rows);
        put_u32(&mut out, range.hashes.len() as u32);
        for &h in &range.hashes {
            put_u64(&mut out, h);
        }
    }
    let checksum = value_hash(&out);
    put_u64(&mut out, checksum);
    Ok(out)
}

/// Decodes a staging record (see the module's invariants).
pub fn decode_staging(bytes: &[u8]) -> Result<Vec<StagedRange>, FormatError> {
    if bytes.len() > MAX_STAGING_BYTES {
        return Err(FormatError::new(format!(
            "a staging record of {} bytes is over the {MAX_STAGING_BYTES} allowed",
            bytes.len()
        )));
    }
    let body_len = bytes
        .len()
        .checked_sub(8)
        .ok_or_else(|| FormatError::new("a staging record shorter than its checksum"))?;
    let (body, checksum) = bytes.split_at(body_len);
    if value_hash(body).to_le_bytes() != checksum {
        return Err(FormatError::new(
            "the staging record's checksum does not match",
        ));
    }
    let mut reader = Reader::new(body, "staging record");
    codec::check_preamble(&mut reader, STAGING_MAGIC, &[STAGING_VERSION])?;
    let count = reader.u32()? as usize;
    check_counts(count, 0)?;
    let mut ranges = Vec::with_capacity(count);
    let mut total = 0usize;
    for _ in 0..count {
        let keys = KeyBounds::decode(&mut reader)?;
        let rows = reader.u64()?;
        let n = reader.u32()? as usize;
        total += n;
        check_counts(count, total)?;
        let raw = reader.take(n * 8)?;
        let hashes: Vec<u64> = raw
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        if hashes.windows(2).any(|w| w[0] >= w[1]) {
            return Err(FormatError::new(
                "the staging record's hashes are not ascending and distinct",
            ));
        }
        ranges.push(StagedRange { keys, rows, hashes });
    }
    if reader.position() != body.len() {
        return Err(FormatError::new(
            "the staging record has bytes after its last range",
        ));
    }
    Ok(ranges)
}

fn check_counts(ranges: usize, hashes: usize) -> Result<(), FormatError> {
    if ranges > MAX_STAGING_RANGES || hashes > MAX_STAGING_HASHES {
        return Err(FormatError::new(format!(
            "a staging record holds at most {MAX_STAGING_RANGES} ranges and \
             {MAX_STAGING_HASHES} hashes ({ranges} ranges, {hashes} hashes)"
        )));
    }
    Ok(())
}
