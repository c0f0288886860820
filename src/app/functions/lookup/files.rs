//! A lookup's reads of an index's files, each within the process's budget (`budget`) and each
//! checked before it is acted on: an index file is data, never a command.
//!
//! - The pointer and the manifest: bounded downloads, parsed, then checked
//!   (`index_files::check_pointer`, `check_manifest`); the manifest is kept as the list of its
//!   segments' blobs and sizes ([`Build`]), held in the lookup's bound.
//! - Each segment: its size first (one request, not made when its directory is cached), which
//!   must be what the manifest says; then its header (the first read), which says every size the
//!   rest will take, checked against the format's bounds; then ONE charge of the read budget
//!   for all of it (directory, its parse, the two body rows), waited for while holding nothing;
//!   then the reads. The directory is cached by bytes ([`DIRECTORY_CACHE_BYTES`]).
//!
//! Invariants:
//! - A file that cannot be used is a 409 naming it and saying why; 404 only for a pointer that
//!   does not exist (no index) or a build that is gone; storage errors stay storage errors.
//! - What a read holds is charged before the read: its length (a ranged read holds its range's
//!   bytes only, even where the blob adapter reads a larger window, `storage::azure_blob`).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::app::error::ApiError;
use crate::app::index_files::{
    check_manifest, check_pointer, IndexLayout, IndexManifest, Indexed, Pointer,
    MAX_MANIFEST_BYTES, MAX_POINTER_BYTES,
};
use crate::index::{
    IndexValue, KeyBounds, SegmentDirectory, SegmentHeader, DIRECTORY_FIXED_LEN, MAX_SEGMENT_BYTES,
};
use crate::storage::blob::BlobStore;
use crate::storage::{StorageError, StorageErrorKind};

use super::budget::{Budget, Charge, Held, HeldRefused, HELD_BUDGET, READ_BUDGET};

/// The first read of a segment: its header, and most directories whole.
const FIRST_READ: u64 = 64 * 1024;
/// The pieces a long directory is read in.
pub const DIRECTORY_PIECE: u64 = 4 << 20;
/// Bytes of directories kept per process.
pub const DIRECTORY_CACHE_BYTES: u64 = 8 << 20;
/// Largest directory cached (in memory bytes).
const MOST_CACHED_DIRECTORY: u64 = DIRECTORY_CACHE_BYTES / 4;
/// The first read of a manifest (about 1,500 segments); a longer one is read again whole.
const MANIFEST_FIRST_READ: u64 = 256 * 1024;
/// Held bytes per segment of a kept manifest, besides its name.
const SEGMENT_ENTRY_BYTES: u64 = 64;
/// Held bytes per candidate range, besides its keys.
const CANDIDATE_BYTES: u64 = 160;

/// The process's lookup memory: the budget and the directory cache (`AppState::driver_state`).
pub struct Memory {
    pub budget: Arc<Budget>,
    cache: Mutex<Cache>,
}

impl Default for Memory {
    fn default() -> Self {
        Memory {
            budget: Arc::new(Budget::new(READ_BUDGET, HELD_BUDGET)),
            cache: Mutex::new(Cache::default()),
        }
    }
}

/// Directories by `connection/container/blob`, oldest first out.
#[derive(Default)]
struct Cache {
    entries: HashMap<String, Arc<SegmentDirectory>>,
    order: VecDeque<String>,
    bytes: u64,
}

impl Memory {
    fn cached(&self, key: &str) -> Option<Arc<SegmentDirectory>> {
        self.cache.lock().unwrap().entries.get(key).cloned()
    }

    fn cache(&self, key: &str, directory: &Arc<SegmentDirectory>) {
        let size = directory.memory();
        let mut cache = self.cache.lock().unwrap();
        if size > MOST_CACHED_DIRECTORY || cache.entries.contains_key(key) {
            return;
        }
        while cache.bytes + size > DIRECTORY_CACHE_BYTES {
            let Some(oldest) = cache.order.pop_front() else {
                break;
            };
            if let Some(gone) = cache.entries.remove(&oldest) {
                cache.bytes -= gone.memory();
            }
        }
        cache.bytes += size;
        cache.order.push_back(key.to_string());
        cache.entries.insert(key.to_string(), directory.clone());
    }

    /// Bytes of the cached directories.
    pub fn cache_bytes(&self) -> u64 {
        self.cache.lock().unwrap().bytes
    }
}

/// A build as a lookup keeps it: what it indexed, its totals, its segments' blobs and sizes.
pub struct Build {
    pub indexed: Indexed,
    pub rows: u64,
    pub ranges: u64,
    pub built_at: time::OffsetDateTime,
    /// Blob names (with the prefix) and the sizes the manifest gives.
    pub segments: Vec<(String, u64)>,
    /// The manifest's blob name.
    pub manifest: String,
}

/// The files of one index, read for one lookup.
pub struct IndexFiles<'a, B> {
    pub blobs: &'a B,
    pub connection: &'a str,
    pub container: &'a str,
    pub layout: &'a IndexLayout,
    pub memory: &'a Memory,
}

/// 409: the file cannot be used, and why.
pub fn unusable(container: &str, name: &str, why: impl std::fmt::Display) -> ApiError {
    ApiError::Conflict(format!(
        "index file {container}/{name} cannot be used: {why}"
    ))
}

/// A refused held charge: 409 when this lookup keeps too much, 503 when other lookups do.
pub fn held_refused(refused: HeldRefused, what: &str) -> ApiError {
    match refused {
        HeldRefused::Lookup { bytes } => ApiError::Conflict(format!(
            "{what} would keep {bytes} bytes, over the {} a lookup keeps: the index is not one \
             a lookup can read (is the value in most of the table? scan it instead)",
            super::budget::HELD_PER_LOOKUP
        )),
        HeldRefused::Process => ApiError::Storage(StorageError::new(
            StorageErrorKind::Transient,
            "lookups running on this instance hold all the memory lookups may: try again shortly",
        )),
    }
}

impl<'a, B: BlobStore> IndexFiles<'a, B> {
    /// The pointer, `None` if there is none.
    pub async fn pointer(&self) -> Result<Option<Pointer>, ApiError> {
        let name = self.layout.pointer();
        let _charge = self.charge(2 * MAX_POINTER_BYTES, &name).await?;
        let pointer: Pointer = match self.fetch(&name, MAX_POINTER_BYTES).await? {
            Fetched::Missing => return Ok(None),
            Fetched::TooLarge(why) => return Err(unusable(self.container, &name, why)),
            Fetched::Bytes(bytes) => self.parse(&name, &bytes)?,
        };
        check_pointer(&pointer).map_err(|why| unusable(self.container, &name, why))?;
        Ok(Some(pointer))
    }

    /// Build `build`'s manifest, checked and kept in `held`; `None` if it is gone.
    pub async fn build(&self, build: &str, held: &mut Held) -> Result<Option<Build>, ApiError> {
        let name = self.layout.blob(&IndexLayout::manifest_name(build));
        let charge = self.charge(3 * MANIFEST_FIRST_READ, &name).await?;
        let mut fetched = self.fetch(&name, MANIFEST_FIRST_READ).await?;
        let mut _whole = None;
        if let Fetched::TooLarge(_) = fetched {
            drop(charge);
            // Read whole, up to the bound: the charge covers its bytes and the parsed list (at
            // most 20,000 entries of 48 bytes, and names from those bytes).
            _whole = Some(
                self.charge(2 * MAX_MANIFEST_BYTES + (2 << 20), &name)
                    .await?,
            );
            fetched = self.fetch(&name, MAX_MANIFEST_BYTES).await?;
        }
        let manifest: IndexManifest = match fetched {
            Fetched::Missing => return Ok(None),
            Fetched::TooLarge(why) => return Err(unusable(self.container, &name, why)),
            Fetched::Bytes(bytes) => self.parse(&name, &bytes)?,
        };
        check_manifest(&manifest, build).map_err(|why| unusable(self.container, &name, why))?;
        let segments: Vec<(String, u64)> = manifest
            .segments
            .iter()
            .map(|s| (self.layout.blob(&s.name), s.bytes))
            .collect();
        let keep: u64 = segments
            .iter()
            .map(|(n, _)| n.len() as u64 + SEGMENT_ENTRY_BYTES)
            .sum();
        held.add(keep)
            .map_err(|r| held_refused(r, &format!("the manifest {}/{name}", self.container)))?;
        Ok(Some(Build {
            indexed: manifest.indexed(),
            rows: manifest.rows,
            ranges: manifest.ranges,
            built_at: manifest.built_at,
            segments,
            manifest: name,
        }))
    }

    async fn charge(&self, bytes: u64, name: &str) -> Result<Charge, ApiError> {
        self.memory.budget.read(bytes).await.ok_or_else(|| {
            unusable(
                self.container,
                name,
                format!(
                    "reading it takes {bytes} bytes, over the {} lookups read at once",
                    self.memory.budget.read_total()
                ),
            )
        })
    }

    /// A file of at most `max` bytes.
    async fn fetch(&self, name: &str, max: u64) -> Result<Fetched, ApiError> {
        match self.blobs.download(self.container, name, max).await {
            Ok(found) => Ok(Fetched::Bytes(found.bytes)),
            Err(e) if e.is_not_found() => Ok(Fetched::Missing),
            // The only input the download refuses here is the size (the names are checked).
            Err(e) if e.kind == StorageErrorKind::InvalidInput => Ok(Fetched::TooLarge(e.message)),
            Err(e) => Err(e.into()),
        }
    }

    /// 409 unless the bytes are the JSON expected.
    fn parse<J: DeserializeOwned>(&self, name: &str, bytes: &[u8]) -> Result<J, ApiError> {
        serde_json::from_slice(bytes).map_err(|e| {
            unusable(
                self.container,
                name,
                format!("it is not an index file: {e}"),
            )
        })
    }

    /// The candidate ranges of `value` in segment `name` (listed as `declared` bytes), its
    /// directory from the cache or read (see the module documentation).
    pub async fn candidates(
        &self,
        name: &str,
        declared: u64,
        value: &IndexValue,
    ) -> Result<Vec<KeyBounds>, ApiError> {
        let key = format!("{}/{}/{name}", self.connection, self.container);
        let (size, mut want) = match self.memory.cached(&key) {
            Some(d) => (d.segment_len(), d.memory() + spans_transient(d.header())),
            None => {
                let size = self.size(name, declared).await?;
                (size, first_want(size))
            }
        };
        for _ in 0..3 {
            let charge = self.charge(want, name).await?;
            match self.attempt(&key, name, size, value, &charge).await? {
                Step::Done(keys) => return Ok(keys),
                Step::Need(more) => want = more,
            }
        }
        Err(unusable(
            self.container,
            name,
            "it changed while it was read",
        ))
    }

    /// The segment's size, which must be what its manifest lists.
    async fn size(&self, name: &str, declared: u64) -> Result<u64, ApiError> {
        let properties = self.blobs.properties(self.container, name).await?;
        let Some(properties) = properties else {
            return Err(unusable(self.container, name, "it is missing"));
        };
        if properties.size != declared || declared > MAX_SEGMENT_BYTES as u64 {
            return Err(unusable(
                self.container,
                name,
                format!(
                    "it is {} bytes; its manifest lists {declared}",
                    properties.size
                ),
            ));
        }
        Ok(declared)
    }

    /// One try within `charge`: the directory (cached, or read), then the value's two body rows.
    async fn attempt(
        &self,
        key: &str,
        name: &str,
        size: u64,
        value: &IndexValue,
        charge: &Charge,
    ) -> Result<Step, ApiError> {
        let directory = match self.memory.cached(key) {
            Some(d) => d,
            None => match self.directory(name, size, charge).await? {
                Ok(d) => {
                    self.memory.cache(key, &d);
                    d
                }
                Err(more) => return Ok(Step::Need(more)),
            },
        };
        let need = directory.memory() + spans_transient(directory.header());
        if need > charge.bytes() {
            return Ok(Step::Need(need));
        }
        let bad = |e| unusable(self.container, name, e);
        let found = if directory.row_slots == 0 {
            directory.candidates(value, &[], &[]).map_err(bad)?
        } else {
            let [(o1, l1), (o2, l2)] = directory.bucket_spans(value);
            let row1 = self.row(name, o1, l1).await?;
            let row2 = match (o2, l2) == (o1, l1) {
                true => row1.clone(),
                false => self.row(name, o2, l2).await?,
            };
            directory.candidates(value, &row1, &row2).map_err(bad)?
        };
        Ok(Step::Done(
            found.into_iter().map(|i| directory.range(i).keys).collect(),
        ))
    }

    /// Reads and parses the directory within `charge`, or says how much it needs.
    async fn directory(
        &self,
        name: &str,
        size: u64,
        charge: &Charge,
    ) -> Result<Result<Arc<SegmentDirectory>, u64>, ApiError> {
        let bad = |e| unusable(self.container, name, e);
        let first = self.range(name, 0, FIRST_READ.min(size)).await?;
        if first.len() < DIRECTORY_FIXED_LEN {
            return Err(bad("it is shorter than a segment header".to_string()));
        }
        let header = SegmentHeader::parse(&first).map_err(|e| bad(e.to_string()))?;
        if header.segment_len() != size {
            return Err(bad(format!(
                "it is {size} bytes; its header says {}",
                header.segment_len()
            )));
        }
        let need = segment_need(&header, size);
        if need > charge.bytes() {
            return Ok(Err(need));
        }
        let len = header.directory_len;
        let bytes = if len <= first.len() as u64 {
            Bytes::copy_from_slice(&first[..len as usize])
        } else {
            drop(first);
            // Read in pieces into one buffer of the directory's size: the directory and one
            // piece at a time (one 16-MiB read was measured at 33 MiB of peak RSS before the
            // adapter kept one buffer a read).
            let mut directory = Vec::with_capacity(len as usize);
            while (directory.len() as u64) < len {
                let at = directory.len() as u64;
                let piece = self.range(name, at, DIRECTORY_PIECE.min(len - at)).await?;
                if piece.is_empty() {
                    return Err(bad("it ends inside its directory".to_string()));
                }
                directory.extend_from_slice(&piece);
            }
            Bytes::from(directory)
        };
        let directory = SegmentDirectory::from_bytes(bytes).map_err(|e| bad(e.to_string()))?;
        Ok(Ok(Arc::new(directory)))
    }

    /// A body row, copied out of the read (which may be a slice of a larger network chunk).
    async fn row(&self, name: &str, offset: u64, len: u64) -> Result<Bytes, ApiError> {
        let read = self.range(name, offset, len).await?;
        Ok(Bytes::copy_from_slice(&read))
    }

    /// Bytes `offset..offset + len` of a segment (409 if it is missing).
    async fn range(&self, name: &str, offset: u64, len: u64) -> Result<Bytes, ApiError> {
        match self
            .blobs
            .download_range(self.container, name, offset, len)
            .await
        {
            Ok(bytes) => Ok(bytes),
            Err(e) if e.is_not_found() => Err(unusable(self.container, name, "it is missing")),
            Err(e) => Err(e.into()),
        }
    }
}

/// A small file's download.
enum Fetched {
    Missing,
    /// Over the bound (the store's message).
    TooLarge(String),
    Bytes(Bytes),
}

/// What one try of a segment gave.
enum Step {
    Done(Vec<KeyBounds>),
    /// The charge this segment needs (its sizes, once known).
    Need(u64),
}

/// The first charge of an uncached segment of `size` bytes: its first read, a directory of
/// that size parsed, and its two body rows (read and copied out) of that size.
fn first_want(size: u64) -> u64 {
    FIRST_READ + FIRST_READ / 4 + 3 * FIRST_READ.min(size)
}

/// The whole charge of an uncached segment: its parsed directory, kept throughout, and the
/// larger of what reading the directory and reading the rows hold besides (one after the other).
fn segment_need(header: &SegmentHeader, size: u64) -> u64 {
    SegmentDirectory::memory_for(header)
        + directory_transient(header, size).max(spans_transient(header))
}

/// What reading the directory holds besides its bytes: the first read, then (for a longer
/// directory, read in pieces into one buffer) one piece.
fn directory_transient(header: &SegmentHeader, size: u64) -> u64 {
    let first = FIRST_READ.min(size);
    let len = header.directory_len;
    match len <= FIRST_READ {
        true => first,
        false => first.max(DIRECTORY_PIECE.min(len)),
    }
}

/// What reading a value's two body rows holds: one read, and the two rows copied out of the
/// reads (nothing when the rows have no slots).
fn spans_transient(header: &SegmentHeader) -> u64 {
    match header.row_slots {
        0 => 0,
        _ => {
            let stride = header.row_stride();
            3 * stride
        }
    }
}

/// The held bytes of candidate ranges.
pub fn candidate_bytes(ranges: &[KeyBounds]) -> u64 {
    ranges
        .iter()
        .map(|k| {
            (k.first_partition_key.len()
                + k.first_row_key.len()
                + k.last_partition_key.len()
                + k.last_row_key.len()) as u64
                + CANDIDATE_BYTES
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{MAX_DIRECTORY_BYTES, MAX_ROW_SLOTS, MAX_SEGMENT_RANGES};

    fn header(directory_len: u64, buckets: u32, ranges: u32, row_slots: u32) -> SegmentHeader {
        SegmentHeader {
            version: 2,
            directory_len,
            buckets,
            ranges,
            row_slots,
        }
    }

    /// The largest charge any header within the format's bounds asks for fits the read budget
    /// (so no segment waits for more than there is), and a small segment's is small.
    #[test]
    fn the_largest_segment_charge_fits_the_read_budget() {
        let size = MAX_SEGMENT_BYTES as u64;
        let mut most = 0;
        for len in [
            FIRST_READ,
            DIRECTORY_PIECE - 1,
            DIRECTORY_PIECE,
            MAX_DIRECTORY_BYTES as u64,
        ] {
            let h = header(len, 1, MAX_SEGMENT_RANGES as u32, MAX_ROW_SLOTS as u32);
            most = most.max(segment_need(&h, size));
        }
        assert!(most <= READ_BUDGET, "{most}");
        assert!(first_want(size) <= READ_BUDGET);
        let small = 40_000;
        let h = header(2_000, 300, 20, 60);
        assert!(segment_need(&h, small) <= 2 * small);
        assert!(first_want(small) < 4 * FIRST_READ);
    }

    /// Reads cost their lengths, not the blob's size nor the emulator's 4-MiB window: a small
    /// directory and short rows of the largest segment are a small charge.
    #[test]
    fn a_small_directory_of_a_large_segment_is_a_small_charge() {
        let size = MAX_SEGMENT_BYTES as u64;
        let h = header(2_000, 300, 20, 60);
        let need = segment_need(&h, size);
        assert!(need <= FIRST_READ + 4_000, "{need}");
        let h = header(FIRST_READ + 1, 300, 20, 60);
        let need = segment_need(&h, size);
        assert!(need <= 3 * FIRST_READ, "{need}");
        assert!(first_want(size) <= 5 * FIRST_READ);
    }
}
