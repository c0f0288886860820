//! Reading a segment: its fixed header (the first [`DIRECTORY_FIXED_LEN`] bytes, enough to know
//! every size a lookup will read), its directory (kept as its own bytes, decoded on demand), and
//! the candidate ranges of a value from the two body rows it reads. Layout byte by byte:
//! docs/index-format.md, "Segment file".
//!
//! Invariants this module keeps:
//! 1. **Bounds before bytes**: [`SegmentHeader::parse`] refuses a header whose directory, body
//!    row, bucket sizes or whole segment would be over the format's bounds
//!    ([`MAX_DIRECTORY_BYTES`], [`MAX_ROW_SLOTS`], [`MAX_BUCKET_SIZE`] slots a bucket,
//!    [`MAX_SEGMENT_RANGES`], [`MAX_SEGMENT_BYTES`]), so a reader knows the most it will read
//!    and hold before it reads more than 32 bytes.
//! 2. **Every byte a lookup relies on is checked**: the directory by its checksum; in version 2,
//!    each body row by its own checksum, verified on the rows a lookup reads. A version 1 body has
//!    no checksum (docs/compatibility.md: still read).
//! 3. A parsed directory holds its bytes and 12 bytes per range ([`SegmentDirectory::memory`]
//!    says how many in all): keys are decoded only for the ranges asked for.

use bytes::Bytes;

use super::codec::{self, Reader};
use super::filter::MAX_BUCKET_SIZE;
use super::hash::{value_hash, Placement};
use super::segment::{
    row_checksum, DIRECTORY_FIXED_LEN, DIRECTORY_LEN_OFFSET, FLAG_ALWAYS_CANDIDATE,
    MAX_DIRECTORY_BYTES, MAX_ROW_SLOTS, MAX_SEGMENT_BYTES, MAX_SEGMENT_RANGES, SEGMENT_MAGIC,
    SEGMENT_VERSION,
};
use super::staging::KeyBounds;
use super::{FormatError, IndexValue};

/// The earlier segment version still read: its body rows have no checksum.
pub const SEGMENT_VERSION_1: u16 = 1;
/// Bytes of a version 2 body row's checksum.
pub(crate) const ROW_CHECKSUM_LEN: u64 = 8;

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
}

/// A segment's first [`DIRECTORY_FIXED_LEN`] bytes: its version and every size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    pub version: u16,
    /// Bytes of the directory, `D`; the body starts here.
    pub directory_len: u64,
    /// Buckets per range, `B`.
    pub buckets: u32,
    /// Ranges, `R`.
    pub ranges: u32,
    /// Slots per body row, `S = Σ b_i`.
    pub row_slots: u32,
}

impl SegmentHeader {
    /// Reads the header from a segment's first bytes (at least [`DIRECTORY_FIXED_LEN`]) and
    /// checks it against the format's bounds (invariant 1).
    pub fn parse(prefix: &[u8]) -> Result<SegmentHeader, FormatError> {
        let mut reader = Reader::new(prefix, "segment");
        let version = codec::check_preamble(
            &mut reader,
            SEGMENT_MAGIC,
            &[SEGMENT_VERSION_1, SEGMENT_VERSION],
        )?;
        let directory_len = u64::from(reader.u32()?);
        let buckets = reader.u32()?;
        let ranges = reader.u32()?;
        let row_slots = reader.u32()?;
        let reserved = reader.u32()?;
        let header = SegmentHeader {
            version,
            directory_len,
            buckets,
            ranges,
            row_slots,
        };
        let too = |what: String| Err(FormatError::new(what));
        if buckets == 0 || reserved != 0 {
            return too(format!(
                "a segment of {buckets} buckets and reserved field {reserved} is not valid in \
                 version {version}"
            ));
        }
        if directory_len < (DIRECTORY_FIXED_LEN + 8) as u64 {
            return too(format!(
                "a segment directory of {directory_len} bytes is too short"
            ));
        }
        if directory_len > MAX_DIRECTORY_BYTES as u64 {
            return too(format!(
                "its directory is {directory_len} bytes, over the {MAX_DIRECTORY_BYTES} a \
                 segment's directory may be"
            ));
        }
        if ranges as usize > MAX_SEGMENT_RANGES {
            return too(format!(
                "it has {ranges} ranges, over the {MAX_SEGMENT_RANGES} a segment may have"
            ));
        }
        let most_slots = u64::from(ranges) * u64::from(MAX_BUCKET_SIZE);
        if u64::from(row_slots) > most_slots.min(MAX_ROW_SLOTS as u64) {
            return too(format!(
                "its body rows are {row_slots} slots, over the {} its {ranges} ranges may have \
                 (at most {MAX_BUCKET_SIZE} a bucket, {MAX_ROW_SLOTS} a row)",
                most_slots.min(MAX_ROW_SLOTS as u64)
            ));
        }
        if header.segment_len() > MAX_SEGMENT_BYTES as u64 {
            return too(format!(
                "it would be {} bytes, over the {MAX_SEGMENT_BYTES} a segment may be",
                header.segment_len()
            ));
        }
        Ok(header)
    }

    /// Bytes of one body row as read: one bucket of every range (`2·S`), then, in version 2,
    /// its checksum.
    pub fn row_stride(&self) -> u64 {
        let checksum = match self.version {
            SEGMENT_VERSION_1 => 0,
            _ => ROW_CHECKSUM_LEN,
        };
        u64::from(self.row_slots) * 2 + checksum
    }

    /// The whole segment's length in bytes.
    pub fn segment_len(&self) -> u64 {
        self.directory_len + u64::from(self.buckets) * self.row_stride()
    }

    /// The two byte spans `(offset, length)` of the segment (absolute offsets in the blob) that
    /// hold every range's candidate slots for a value of index hash `hash`: bucket 1's row, then
    /// bucket 2's (they may be the same span). A lookup reads nothing when `S = 0`.
    pub fn bucket_spans_for_hash(&self, hash: u64) -> [(u64, u64); 2] {
        let p = Placement::of(hash, self.buckets);
        let row = |j: u32| {
            (
                self.directory_len + u64::from(j) * self.row_stride(),
                self.row_stride(),
            )
        };
        [row(p.bucket1), row(p.bucket2)]
    }
}

/// Where one range's entry is in the directory's bytes, and what a lookup needs of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    /// Offset of the entry (its bucket size field) in the directory.
    at: u32,
    /// Slot offset of the range within a body row.
    slot_offset: u32,
    bucket_size: u8,
    always_candidate: bool,
}

/// A segment's directory: everything but the body (see the module's invariants).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentDirectory {
    header: SegmentHeader,
    /// Buckets per range, `B`.
    pub buckets: u32,
    /// Bytes of the directory; the body starts here.
    pub directory_len: u64,
    /// Slots per body row, `Σ b_i`.
    pub row_slots: u32,
    bytes: Bytes,
    entries: Vec<Entry>,
}

impl SegmentDirectory {
    /// The directory's length in bytes, from the first [`DIRECTORY_FIXED_LEN`] (or more)
    /// bytes of a segment (checks the whole header: [`SegmentHeader::parse`]).
    pub fn directory_len(prefix: &[u8]) -> Result<usize, FormatError> {
        Ok(SegmentHeader::parse(prefix)?.directory_len as usize)
    }

    /// Parses the directory from the segment's first bytes (at least the directory; more,
    /// such as the whole segment, is fine), copying it.
    pub fn parse(bytes: &[u8]) -> Result<SegmentDirectory, FormatError> {
        let len = Self::directory_len(bytes)?;
        let end = len.min(bytes.len());
        Self::from_bytes(Bytes::copy_from_slice(&bytes[..end]))
    }

    /// Parses the directory from the segment's first bytes, keeping them (not copied; bytes
    /// past the directory are dropped from the view, not from memory).
    pub fn from_bytes(bytes: Bytes) -> Result<SegmentDirectory, FormatError> {
        let header = SegmentHeader::parse(&bytes)?;
        let len = header.directory_len as usize;
        if bytes.len() < len {
            return Err(FormatError::new(format!(
                "the segment directory is {len} bytes; {} were given",
                bytes.len()
            )));
        }
        let bytes = bytes.slice(..len);
        let (body, checksum) = bytes.split_at(len - 8);
        if value_hash(body).to_le_bytes() != checksum {
            return Err(FormatError::new(
                "the segment directory's checksum does not match",
            ));
        }
        let entries = entries(&header, body)?;
        Ok(SegmentDirectory {
            header,
            buckets: header.buckets,
            directory_len: header.directory_len,
            row_slots: header.row_slots,
            bytes,
            entries,
        })
    }

    pub fn header(&self) -> &SegmentHeader {
        &self.header
    }

    /// Bytes this directory holds in memory (its bytes and its entries).
    pub fn memory(&self) -> u64 {
        (self.bytes.len()
            + self.entries.capacity() * std::mem::size_of::<Entry>()
            + std::mem::size_of::<Self>()) as u64
    }

    /// Bytes a directory of this header holds once parsed, at most ([`Self::memory`]).
    pub fn memory_for(header: &SegmentHeader) -> u64 {
        header.directory_len
            + u64::from(header.ranges) * std::mem::size_of::<Entry>() as u64
            + std::mem::size_of::<Self>() as u64
    }

    /// How many ranges.
    pub fn range_count(&self) -> usize {
        self.entries.len()
    }

    /// Range `i`, decoded (`i < range_count()`).
    pub fn range(&self, i: usize) -> RangeEntry {
        let e = self.entries[i];
        let mut reader = Reader::new(&self.bytes[e.at as usize..], "segment directory");
        let mut read = || -> Result<RangeEntry, FormatError> {
            let (bucket_size, _flags) = (reader.u32()?, reader.u32()?);
            let distinct = reader.u32()?;
            let rows = reader.u64()?;
            Ok(RangeEntry {
                keys: KeyBounds::decode(&mut reader)?,
                rows,
                distinct,
                bucket_size,
                always_candidate: e.always_candidate,
            })
        };
        read().expect("checked when the directory was parsed")
    }

    /// Every range, decoded, in key order.
    pub fn ranges(&self) -> Vec<RangeEntry> {
        (0..self.range_count()).map(|i| self.range(i)).collect()
    }

    /// The whole segment's length in bytes.
    pub fn segment_len(&self) -> u64 {
        self.header.segment_len()
    }

    /// See [`SegmentHeader::bucket_spans_for_hash`].
    pub fn bucket_spans(&self, value: &IndexValue) -> [(u64, u64); 2] {
        self.header.bucket_spans_for_hash(value.index_hash())
    }

    /// See [`SegmentHeader::bucket_spans_for_hash`].
    pub fn bucket_spans_for_hash(&self, hash: u64) -> [(u64, u64); 2] {
        self.header.bucket_spans_for_hash(hash)
    }

    /// The ranges (indexes, ascending) that may hold `value`, given the bytes of its two
    /// [`SegmentDirectory::bucket_spans`].
    pub fn candidates(
        &self,
        value: &IndexValue,
        row1: &[u8],
        row2: &[u8],
    ) -> Result<Vec<usize>, FormatError> {
        self.candidates_for_hash(value.index_hash(), row1, row2)
    }

    /// [`SegmentDirectory::candidates`] for a value's index hash: checks each row's length and,
    /// in version 2, its checksum (an error names the row). A segment whose rows have no slots
    /// (`S = 0`) needs none read: empty rows give its always-candidate ranges.
    pub fn candidates_for_hash(
        &self,
        hash: u64,
        row1: &[u8],
        row2: &[u8],
    ) -> Result<Vec<usize>, FormatError> {
        if self.row_slots == 0 && row1.is_empty() && row2.is_empty() {
            // No slots: only the always-candidate ranges (nothing of the body is relied on).
            return Ok(self.always_candidates());
        }
        let want = self.header.row_stride() as usize;
        if row1.len() != want || row2.len() != want {
            return Err(FormatError::new(format!(
                "a segment bucket row is {want} bytes; {} and {} were given",
                row1.len(),
                row2.len()
            )));
        }
        let p = Placement::of(hash, self.buckets);
        let slots1 = self.check_row(p.bucket1, row1)?;
        let slots2 = self.check_row(p.bucket2, row2)?;
        let fp = p.fingerprint.to_le_bytes();
        let holds = |row: &[u8], e: &Entry| {
            let start = e.slot_offset as usize * 2;
            row[start..start + usize::from(e.bucket_size) * 2]
                .chunks_exact(2)
                .any(|slot| slot == fp)
        };
        Ok(self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.always_candidate || holds(slots1, e) || holds(slots2, e))
            .map(|(i, _)| i)
            .collect())
    }

    fn always_candidates(&self) -> Vec<usize> {
        (0..self.entries.len())
            .filter(|&i| self.entries[i].always_candidate)
            .collect()
    }

    /// Row `j`'s slots, its checksum checked (version 2).
    fn check_row<'a>(&self, j: u32, row: &'a [u8]) -> Result<&'a [u8], FormatError> {
        if self.header.version == SEGMENT_VERSION_1 {
            return Ok(row);
        }
        let (slots, checksum) = row.split_at(row.len() - ROW_CHECKSUM_LEN as usize);
        if row_checksum(j, slots).to_le_bytes() != checksum {
            return Err(FormatError::new(format!(
                "body row {j}'s checksum does not match: the segment is damaged"
            )));
        }
        Ok(slots)
    }
}

/// The range entries of a checked directory (`body`: the directory without its checksum).
fn entries(header: &SegmentHeader, body: &[u8]) -> Result<Vec<Entry>, FormatError> {
    let mut reader = Reader::new(body, "segment directory");
    reader.take(DIRECTORY_LEN_OFFSET + 4 + 16)?;
    let mut entries = Vec::with_capacity(header.ranges as usize);
    let mut slot_offset = 0u32;
    for _ in 0..header.ranges {
        let at = reader.position() as u32;
        let bucket_size = reader.u32()?;
        let flags = reader.u32()?;
        reader.take(4 + 8)?;
        for _ in 0..4 {
            reader.str_ref()?;
        }
        if flags & !FLAG_ALWAYS_CANDIDATE != 0 {
            return Err(FormatError::new(format!(
                "a segment range has flags {flags:#x}, unknown in version {}",
                header.version
            )));
        }
        if bucket_size > MAX_BUCKET_SIZE {
            return Err(FormatError::new(format!(
                "a segment range has buckets of {bucket_size} slots, over the {MAX_BUCKET_SIZE} \
                 allowed"
            )));
        }
        entries.push(Entry {
            at,
            slot_offset,
            bucket_size: bucket_size as u8,
            always_candidate: flags & FLAG_ALWAYS_CANDIDATE != 0,
        });
        slot_offset += bucket_size; // at most 65,536 × 64: no overflow
    }
    if slot_offset != header.row_slots || reader.position() != body.len() {
        return Err(FormatError::new(
            "the segment directory's ranges do not add up",
        ));
    }
    Ok(entries)
}
