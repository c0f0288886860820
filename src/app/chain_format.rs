//! What a chain of exports records (docs/backups.md, docs/export-format.md): the delta
//! manifest's format name and chain fields, the key-chunk and tombstone folders, the chain's
//! limits, and the key order. Plain data, so that the export format (`export_format`, which
//! reads and writes the manifest) and the chain's logic (`export_chain`) both use it and
//! neither imports the other.

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};
use time::{Duration, OffsetDateTime};

use crate::storage::keys::compare_keys;

/// One part in the manifest (a part, a key chunk or a tombstone file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestPart {
    /// Relative to the export's prefix.
    pub name: String,
    pub rows: u64,
    /// The blob's size.
    pub bytes: u64,
    /// Lowercase hex SHA-256 of the blob's bytes.
    pub sha256: String,
}

/// A delta's manifest `format`: a reader that knows only `tablescan-export/1` refuses it instead
/// of restoring a delta's changed rows as if they were the whole table.
pub const DELTA_FORMAT: &str = "tablescan-export-delta/1";
/// The folder of key chunks (`keys/<scan>/<item>.jsonl.gz`, named like the item's part).
pub const KEYS_FOLDER: &str = "keys";
/// The folder of tombstone files (`deleted/<scan>/<item>.jsonl.gz`).
pub const DELETED_FOLDER: &str = "deleted";
/// The watermark is the parent's service start time minus this: room for skew between the
/// storage front ends that stamped the rows and the one that dated the parent's start.
pub const WATERMARK_MARGIN: Duration = Duration::seconds(60);
/// Most members of one chain (its base and deltas) an import restores.
pub const MAX_CHAIN_MEMBERS: usize = 64;

/// A (PartitionKey, RowKey) pair.
pub type Key = (String, String);

/// The service's order of two keys.
pub fn compare(a: &Key, b: &Key) -> Ordering {
    compare_keys(&a.0, &b.0).then_with(|| compare_keys(&a.1, &b.1))
}

/// What a chain was taken of: every member must have the same (a delta of another scope would
/// tombstone every row outside its own).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Scope {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub select: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub partition_key_prefix: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition_key_lower_bound: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition_key_upper_bound: Option<String>,
}

impl Scope {
    /// The request field that differs from `base`'s, if any (named in a refusal).
    pub fn differing_field(&self, base: &Scope) -> Option<&'static str> {
        if self.filter != base.filter {
            Some("filter")
        } else if self.select != base.select {
            Some("select")
        } else if self.partition_key_prefix != base.partition_key_prefix {
            Some("partitionKeyPrefix")
        } else if self.partition_key_lower_bound != base.partition_key_lower_bound {
            Some("partitionKeyLowerBound")
        } else if self.partition_key_upper_bound != base.partition_key_upper_bound {
            Some("partitionKeyUpperBound")
        } else {
            None
        }
    }
}

/// One key chunk as a manifest lists it: a part-like blob of keys-only lines, and its first key
/// (the index a delta tiles the key space by).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyChunk {
    pub name: String,
    pub first: Key,
    pub rows: u64,
    pub bytes: u64,
    pub sha256: String,
}

impl KeyChunk {
    /// The chunk as a part descriptor (for downloading and verifying it like one).
    pub fn as_part(&self) -> ManifestPart {
        ManifestPart {
            name: self.name.clone(),
            rows: self.rows,
            bytes: self.bytes,
            sha256: self.sha256.clone(),
        }
    }
}

/// The parent a delta continues from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParentRef {
    /// The parent's prefix, as its `since` named it, in the same container.
    pub prefix: String,
    /// Lowercase hex SHA-256 of the parent's manifest bytes.
    pub sha256: String,
}

/// What a delta's manifest adds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeltaInfo {
    pub parent: ParentRef,
    /// The chain's base (a full export's prefix).
    pub base: String,
    /// Rows whose `Timestamp` is at or after this are in the delta's parts.
    #[serde(with = "time::serde::rfc3339")]
    pub watermark: OffsetDateTime,
    /// Tombstones in `deleted` (the sum of their `rows`).
    pub deleted_rows: u64,
    /// The tombstone files, in name order.
    pub deleted: Vec<ManifestPart>,
}
