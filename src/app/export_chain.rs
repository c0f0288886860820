//! Incremental exports (docs/backups.md): what a chain of exports adds to the
//! `tablescan-export/1` format — the manifest's chain fields, **key chunks** (the sorted keys of
//! the chain's state at one export, per key range) and **tombstone files** (keys the parent's
//! state held and the table no longer holds) — and the one merge that finds deletions. Pure:
//! bytes and keys in, bytes and keys out, no I/O.
//!
//! Invariants:
//! - **Keys are ordered as the service orders them**: (PartitionKey, RowKey), each compared by
//!   UTF-16 code unit ([`compare_keys`]); a key chunk's lines are strictly increasing.
//! - **The key chunks of one export are disjoint and sorted by first key**, so the chain's
//!   state at that export inside `[first_i, first_{i+1})` is exactly chunk `i`: a delta's tile
//!   reads one chunk, whatever ranges the parent's scan happened to make.
//! - **State = keys read ∪ keys written; tombstones = parent − state** ([`merge_tile`]): a key a
//!   delta wrote a row for is never also tombstoned by it, and every key a restore as of this
//!   export can hold is in its key state, so the next delta tombstones it once it is gone.

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};
use time::{Duration, OffsetDateTime};

use crate::app::export_format::{
    decode_part, encode_part, DecodeLimits, EncodedPart, ExportFormatError, ManifestPart,
};
use crate::storage::keys::compare_keys;
use crate::storage::Entity;

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

/// A blob of keys (a key chunk or a tombstone file): keys-only lines of the part format.
pub fn encode_keys<'a>(keys: impl IntoIterator<Item = &'a Key>) -> EncodedPart {
    let rows: Vec<Entity> = keys
        .into_iter()
        .map(|(pk, rk)| Entity::new(pk.clone(), rk.clone()))
        .collect();
    encode_part(&rows).expect("a keys-only line is always encodable")
}

/// The keys of a key chunk or tombstone file (SHA-256 and row count checked), in its order; a
/// chunk whose keys are not strictly increasing is refused.
pub fn decode_keys(bytes: &[u8], rows: u64, sha256: &str) -> Result<Vec<Key>, ExportFormatError> {
    let keys: Vec<Key> = decode_part(bytes, rows, sha256, &DecodeLimits::default())?
        .into_iter()
        .map(|e| (e.partition_key, e.row_key))
        .collect();
    if let Some(at) = keys
        .windows(2)
        .position(|w| compare(&w[0], &w[1]) != Ordering::Less)
    {
        return Err(ExportFormatError::BadLine {
            line: at as u64 + 2,
            message: "keys are not in increasing (PartitionKey, RowKey) order".into(),
        });
    }
    Ok(keys)
}

/// A bound of a key range: the key, and whether the range includes it.
pub type Bound<'a> = Option<(&'a Key, bool)>;

/// Whether `key` lies between `lower` and `upper` (`None`: unbounded).
pub fn in_range(key: &Key, lower: Bound, upper: Bound) -> bool {
    let above = lower.map_or(true, |(l, inclusive)| match compare(key, l) {
        Ordering::Greater => true,
        Ordering::Equal => inclusive,
        Ordering::Less => false,
    });
    let below = upper.map_or(true, |(u, inclusive)| match compare(key, u) {
        Ordering::Less => true,
        Ordering::Equal => inclusive,
        Ordering::Greater => false,
    });
    above && below
}

/// A tile's key state and tombstones: `state` = `read` ∪ `written` (sorted, once each),
/// `deleted` = `parent` − `state`. Each input is sorted by [`compare`]; memory is the inputs and
/// the outputs (a step's rows), never the table.
pub fn merge_tile(parent: &[Key], read: &[Key], written: &[Key]) -> (Vec<Key>, Vec<Key>) {
    let state = union(read, written);
    let mut deleted = Vec::new();
    let mut s = state.iter().peekable();
    for key in parent {
        while s.next_if(|k| compare(k, key) == Ordering::Less).is_some() {}
        if s.peek()
            .map_or(true, |k| compare(k, key) != Ordering::Equal)
        {
            deleted.push(key.clone());
        }
    }
    (state, deleted)
}

fn union(a: &[Key], b: &[Key]) -> Vec<Key> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        let next = match (a.get(i), b.get(j)) {
            (Some(x), Some(y)) => match compare(x, y) {
                Ordering::Less => {
                    i += 1;
                    x
                }
                Ordering::Greater => {
                    j += 1;
                    y
                }
                Ordering::Equal => {
                    i += 1;
                    j += 1;
                    x
                }
            },
            (Some(x), None) => {
                i += 1;
                x
            }
            (None, Some(y)) => {
                j += 1;
                y
            }
            (None, None) => unreachable!("the loop's condition"),
        };
        out.push(next.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(pk: &str, rk: &str) -> Key {
        (pk.to_string(), rk.to_string())
    }

    #[test]
    fn deletions_are_the_parent_keys_neither_read_nor_written() {
        let parent = [k("a", "1"), k("a", "2"), k("b", "1"), k("c", "1")];
        let read = [k("a", "1"), k("b", "0"), k("c", "1")];
        let written = [k("a", "2"), k("b", "0")];
        let (state, deleted) = merge_tile(&parent, &read, &written);
        assert_eq!(state, [k("a", "1"), k("a", "2"), k("b", "0"), k("c", "1")]);
        assert_eq!(deleted, [k("b", "1")]);
    }

    #[test]
    fn keys_are_ordered_by_utf16_code_unit() {
        // U+FFFD sorts after U+10000 in UTF-8 byte order but before it in UTF-16.
        let low = k("\u{fffd}", "");
        let high = k("\u{10000}", "");
        assert_eq!(compare(&high, &low), Ordering::Less);
        let (state, deleted) = merge_tile(
            &[high.clone(), low.clone()],
            std::slice::from_ref(&high),
            &[],
        );
        assert_eq!((state, deleted), (vec![high], vec![low]));
    }

    #[test]
    fn tiles_are_half_open() {
        let (l, u) = (k("b", ""), k("c", ""));
        assert!(in_range(&k("b", ""), Some((&l, true)), Some((&u, false))));
        assert!(!in_range(&k("b", ""), Some((&l, false)), Some((&u, false))));
        assert!(!in_range(&k("c", ""), Some((&l, true)), Some((&u, false))));
        assert!(in_range(&k("c", ""), Some((&l, true)), Some((&u, true))));
        assert!(in_range(&k("a", ""), None, Some((&u, false))));
        assert!(in_range(&k("z", ""), Some((&l, true)), None));
    }

    #[test]
    fn key_blobs_round_trip_and_refuse_disorder() {
        let keys = [k("a", "1"), k("a", "2")];
        let blob = encode_keys(&keys);
        assert_eq!(decode_keys(&blob.bytes, 2, &blob.sha256).unwrap(), keys);
        let backwards = encode_keys(&[k("b", ""), k("a", "")]);
        let e = decode_keys(&backwards.bytes, 2, &backwards.sha256).unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
    }

    #[test]
    fn scopes_name_the_field_that_differs() {
        let base = Scope::default();
        let other = Scope {
            select: Some(vec!["A".into()]),
            ..Scope::default()
        };
        assert_eq!(other.differing_field(&base), Some("select"));
        assert_eq!(base.differing_field(&base.clone()), None);
    }
}
