//! Where a secondary index lives in Blob Storage, and its two small JSON files (the pointer and
//! a build's manifest): what the index driver writes (`drivers/index`) and the lookup function
//! reads (`functions/lookup`), kept here because neither may import the other. The segment files
//! themselves are `crate::index`'s format; all of it is docs/index-format.md and docs/index.md.
//!
//! Layout under a prefix `P` (normalized as an export's: empty, or ending with `/`):
//! - `P index.json`: the pointer, naming the build lookups answer from. Written only by a
//!   build's completion step, in one conditional write (`If-Match` on the ETag read, or
//!   `If-None-Match: *` for the first build), so a lookup sees the old build or the new one,
//!   never a half-built one.
//! - `P index-build.json`: the reservation: which build may switch the pointer (one at a time).
//! - `P builds/<scan id>/staging/<name>.rec`: the scan steps' staging records (phase 0).
//! - `P builds/<scan id>/segments/<name>.seg`: the segment files (phase 1), immutable once the
//!   build's manifest names them.
//! - `P builds/<scan id>/manifest.json`: the build's manifest, written before the pointer.
//!
//! Invariant: these names and the JSON fields below are a stored format: never change them.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::app::export_format::{ExportFormatError, ExportLayout};

/// The pointer's `format`.
pub const POINTER_FORMAT: &str = "tablescan-index-pointer/1";
/// A manifest's `format`.
pub const MANIFEST_FORMAT: &str = "tablescan-index/1";
/// Largest pointer or reservation read back (ours are about 200 bytes).
pub const MAX_POINTER_BYTES: u64 = 64 * 1024;
/// Largest manifest read back: about 150 bytes per segment.
pub const MAX_MANIFEST_BYTES: u64 = 8 * 1024 * 1024;
/// Content type of the JSON files.
pub const JSON_CONTENT_TYPE: &str = "application/json";

/// The blobs of the indexes under one prefix.
#[derive(Debug, Clone)]
pub struct IndexLayout(ExportLayout);

impl IndexLayout {
    /// The index under `prefix` (the export's prefix rules: at most 512 characters, no leading
    /// `/`, a valid blob name once completed).
    pub fn new(prefix: &str) -> Result<Self, ExportFormatError> {
        ExportLayout::new(prefix).map(IndexLayout)
    }

    pub fn pointer(&self) -> String {
        self.0.blob("index.json")
    }

    pub fn reservation(&self) -> String {
        self.0.blob("index-build.json")
    }

    /// `builds/<scan id>/`, relative to the prefix.
    fn build(scan_id: &str) -> String {
        format!("builds/{scan_id}/")
    }

    /// The folder of a build's staging records (a listing prefix).
    pub fn staging_folder(&self, scan_id: &str) -> String {
        self.0.blob(&format!("{}staging/", Self::build(scan_id)))
    }

    /// A staging record, by its name (`staging_name`).
    pub fn staging(&self, scan_id: &str, name: &str) -> String {
        format!("{}{name}.rec", self.staging_folder(scan_id))
    }

    /// A segment file, relative to the prefix (as the manifest lists it).
    pub fn segment_name(scan_id: &str, name: &str) -> String {
        format!("{}segments/{name}.seg", Self::build(scan_id))
    }

    /// A build's manifest, relative to the prefix (as the pointer names it).
    pub fn manifest_name(scan_id: &str) -> String {
        format!("{}manifest.json", Self::build(scan_id))
    }

    /// The blob of a name relative to the prefix.
    pub fn blob(&self, relative: &str) -> String {
        self.0.blob(relative)
    }
}

/// `P index.json`: the build lookups answer from.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pointer {
    pub format: String,
    /// The build's scan id.
    pub build: String,
    /// Its manifest, relative to the prefix.
    pub manifest: String,
    #[serde(with = "time::serde::rfc3339")]
    pub switched_at: OffsetDateTime,
    /// The builds this pointer named before, most recent first, each with when it was
    /// superseded (at most [`MAX_SUPERSEDED`]; absent in pointers of earlier versions): how long
    /// a build was kept for lookups paging through it is measured from there
    /// (`drivers/index/prune`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub superseded: Vec<Superseded>,
}

/// Most superseded builds a pointer remembers (an older one is known to have been superseded
/// no later than the oldest remembered).
pub const MAX_SUPERSEDED: usize = 100;

/// A build a pointer named before, and when the pointer moved away from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Superseded {
    pub build: String,
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
}

/// `P index-build.json`: the build that holds the prefix.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reservation {
    pub format: String,
    pub scan_id: String,
    #[serde(with = "time::serde::rfc3339")]
    pub reserved_at: OffsetDateTime,
}

/// One segment file of a build, as its manifest lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SegmentEntry {
    /// Relative to the prefix.
    pub name: String,
    /// Key ranges it holds a filter for.
    pub ranges: u64,
    /// Rows holding the property in those ranges.
    pub rows: u64,
    pub bytes: u64,
}

/// `P builds/<scan id>/manifest.json`: what one build indexed.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IndexManifest {
    pub format: String,
    pub scan_id: String,
    pub property: String,
    pub source_table: String,
    /// The app-setting name of the source's connection (never a connection string).
    pub source_connection: String,
    /// Rows holding the property when their range was read.
    pub rows: u64,
    pub ranges: u64,
    /// In name order.
    pub segments: Vec<SegmentEntry>,
    #[serde(with = "time::serde::rfc3339")]
    pub started_at: OffsetDateTime,
    /// When the build completed: rows written after `startedAt` may be missing.
    #[serde(with = "time::serde::rfc3339")]
    pub built_at: OffsetDateTime,
}
