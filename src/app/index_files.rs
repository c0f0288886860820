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
//! Invariants:
//! - These names and the JSON fields below are a stored format: never change them (a field
//!   added is optional, and ignored by readers that do not know it).
//! - A reader trusts nothing in these files: [`check_pointer`] and [`check_manifest`] check every
//!   name and bound a lookup will act on (the build named, the manifest's path, the source
//!   table by the service's rules, the property, each segment's name and size) before anything
//!   is read through them. What a caller's configuration decides (allowed connections,
//!   bookkeeping tables) is the lookup's to check.

use serde::{Deserialize, Deserializer, Serialize};
use time::OffsetDateTime;

use crate::app::export_format::{ExportFormatError, ExportLayout};
use crate::index::MAX_SEGMENT_BYTES;
use crate::storage::odata;

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
/// Most segments one build may have (its manifest stays under a few MiB).
pub const MAX_SEGMENTS: usize = 20_000;
/// Longest segment file name (without `.seg`) a manifest may list: a build names them after
/// a staging record (32 hex digits).
pub const MAX_SEGMENT_STEM: usize = 64;

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

    /// The stem of a segment of build `scan_id` as a manifest lists it (relative to the prefix):
    /// `builds/<scan id>/segments/<stem>.seg`, the stem 1 to [`MAX_SEGMENT_STEM`] letters,
    /// digits, `-` or `_`; `None` for anything else.
    pub fn segment_stem<'a>(scan_id: &str, name: &'a str) -> Option<&'a str> {
        let folder = format!("{}segments/", Self::build(scan_id));
        let stem = name.strip_prefix(&folder)?.strip_suffix(".seg")?;
        let valid = (1..=MAX_SEGMENT_STEM).contains(&stem.len())
            && stem
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        valid.then_some(stem)
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
    /// What the build indexed (absent in pointers of earlier versions): a lookup checks the
    /// manifest says the same, and answers which table it searched.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub indexed: Option<Indexed>,
}

/// What a build indexed: the property of a table on a connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Indexed {
    pub property: String,
    pub source_table: String,
    /// The app-setting name of the source's connection (never a connection string).
    pub source_connection: String,
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
    /// In name order (at most [`MAX_SEGMENTS`]: a longer list is refused while it is read).
    #[serde(deserialize_with = "bounded_segments")]
    pub segments: Vec<SegmentEntry>,
    #[serde(with = "time::serde::rfc3339")]
    pub started_at: OffsetDateTime,
    /// When the build completed: rows written after `startedAt` may be missing.
    #[serde(with = "time::serde::rfc3339")]
    pub built_at: OffsetDateTime,
}

impl std::fmt::Display for Indexed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "property {} of table {} (connection {})",
            self.property, self.source_table, self.source_connection
        )
    }
}

impl IndexManifest {
    /// What the build indexed.
    pub fn indexed(&self) -> Indexed {
        Indexed {
            property: self.property.clone(),
            source_table: self.source_table.clone(),
            source_connection: self.source_connection.clone(),
        }
    }
}

/// The manifest's segment list, refused past [`MAX_SEGMENTS`] entries while it is read (so a
/// forged manifest of tiny entries is not held whole before it is counted).
fn bounded_segments<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<SegmentEntry>, D::Error> {
    struct Bounded;
    impl<'de> serde::de::Visitor<'de> for Bounded {
        type Value = Vec<SegmentEntry>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "a list of at most {MAX_SEGMENTS} segments")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(entry) = seq.next_element()? {
                if out.len() == MAX_SEGMENTS {
                    return Err(serde::de::Error::custom(format!(
                        "more than {MAX_SEGMENTS} segments"
                    )));
                }
                out.push(entry);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(Bounded)
}

/// Refuses a property name an index build refuses: a key property, `Timestamp`, or a name a
/// filter cannot compare (`Owner` is fine; `Owner eq 1` is not one name).
pub fn check_property(property: &str) -> Result<(), String> {
    if property == "Timestamp" {
        return Err("Timestamp is set by the service; index a property of your own".into());
    }
    match odata::parse(&format!("{property} eq 0")) {
        Ok(odata::Expr::Compare { property: p, .. }) if p == property => Ok(()),
        Ok(_) => Err(format!("{property:?} is not one property name")),
        Err(e) => Err(format!(
            "{property:?} is not a non-key property name a filter can compare ({e})"
        )),
    }
}

/// Checks a pointer read back (see the module's invariants): its format, the build it names (a
/// scan id), and that its manifest is that build's.
pub fn check_pointer(pointer: &Pointer) -> Result<(), String> {
    if pointer.format != POINTER_FORMAT {
        return Err(format!(
            "its format is {:?}; this build reads {POINTER_FORMAT:?}",
            pointer.format
        ));
    }
    if !crate::app::job::is_valid_scan_id(&pointer.build) {
        return Err(format!(
            "it names build {:?}, which is not a scan id",
            pointer.build
        ));
    }
    if pointer.manifest != IndexLayout::manifest_name(&pointer.build) {
        return Err(format!(
            "it names manifest {:?}; build {}'s is {:?}",
            pointer.manifest,
            pointer.build,
            IndexLayout::manifest_name(&pointer.build)
        ));
    }
    match &pointer.indexed {
        Some(indexed) => check_indexed(indexed),
        None => Ok(()),
    }
}

/// Checks a manifest read back as build `build`'s (see the module's invariants): its format and
/// build, what it indexed, and every segment: named in the build's folder, listed once in name
/// order, at most [`MAX_SEGMENT_BYTES`].
pub fn check_manifest(manifest: &IndexManifest, build: &str) -> Result<(), String> {
    if manifest.format != MANIFEST_FORMAT {
        return Err(format!(
            "its format is {:?}; this build reads {MANIFEST_FORMAT:?}",
            manifest.format
        ));
    }
    if manifest.scan_id != build {
        return Err(format!(
            "it is build {:?}'s manifest, not build {build}'s",
            manifest.scan_id
        ));
    }
    check_indexed(&manifest.indexed())?;
    for (i, segment) in manifest.segments.iter().enumerate() {
        if IndexLayout::segment_stem(build, &segment.name).is_none() {
            return Err(format!(
                "it lists segment {:?}, which is not a segment of build {build} \
                 (builds/{build}/segments/<name>.seg)",
                segment.name
            ));
        }
        if i > 0 && manifest.segments[i - 1].name >= segment.name {
            return Err(format!(
                "it lists segment {:?} twice or out of name order",
                segment.name
            ));
        }
        if segment.bytes > MAX_SEGMENT_BYTES as u64 {
            return Err(format!(
                "it lists segment {:?} of {} bytes, over the {MAX_SEGMENT_BYTES} a segment may be",
                segment.name, segment.bytes
            ));
        }
    }
    Ok(())
}

/// The table by the service's naming rules, and the property as a build accepts it.
fn check_indexed(indexed: &Indexed) -> Result<(), String> {
    crate::app::validate::table_name(&indexed.source_table)
        .map_err(|e| format!("its source table: {e}"))?;
    check_property(&indexed.property).map_err(|e| format!("its property: {e}"))?;
    if indexed.source_connection.is_empty() || indexed.source_connection.len() > 256 {
        return Err("its source connection is not an app-setting name".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_names_are_in_their_builds_folder() {
        let build = "8204684855781-5306e88b";
        let name = IndexLayout::segment_name(build, "0123456789abcdef0123456789abcdef");
        assert!(IndexLayout::segment_stem(build, &name).is_some());
        for bad in [
            "builds/8204684855781-5306e88b/segments/../../x.seg",
            "builds/8204684855781-5306e88b/segments/a/b.seg",
            "builds/8204684855781-5306e88b/segments/.seg",
            "builds/other/segments/a.seg",
            "../builds/8204684855781-5306e88b/segments/a.seg",
            "builds/8204684855781-5306e88b/segments/a.seg/",
        ] {
            assert!(IndexLayout::segment_stem(build, bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn only_one_comparable_non_key_property_is_a_property() {
        check_property("Owner").unwrap();
        for bad in [
            "PartitionKey",
            "RowKey",
            "Timestamp",
            "Owner eq 1 or V",
            "",
            "a b",
            "V)",
        ] {
            assert!(check_property(bad).is_err(), "{bad}");
        }
    }
}
