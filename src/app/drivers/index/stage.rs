//! Phase 0 of an index build: the rows one scan step or range item read (keys and the indexed
//! property only) become ONE staging record, `builds/<scan id>/staging/<name>.rec`, named after
//! the first row's keys, so a redelivery rewrites the same blob.

use std::sync::Arc;

use bytes::Bytes;

use crate::app::export_format::sha256_hex;
use crate::app::job::{item_child, Begun, RangeWork, ScanContext, WorkError, WorkOutcome};
use crate::app::messages::ItemMessage;
use crate::app::pace::Meter;
use crate::app::state::AppState;
use crate::index::{encode_staging, IndexValue, KeyBounds, StagedRange};
use crate::storage::blob::{BlobStore, BlobWrite};
use crate::storage::stores::Stores;
use crate::storage::Entity;

use super::super::kit::range::{read_item, unaddressable_error};
use super::super::kit::{read_spec, scan_ended};
use super::{IndexDriver, IndexOptions, IndexWork};

/// Most rows in one key range of the index (a lookup reads a candidate range with one filtered
/// query of about this many rows): a step's rows become ranges of at most this many.
pub const RANGE_ROWS: usize = 2000;
/// Content type of staging records and segments.
pub const BINARY_CONTENT_TYPE: &str = "application/octet-stream";

/// A staging record's name (without folder and extension): the first 32 hex digits of the
/// SHA-256 of its first row's keys as a JSON array.
pub fn staging_name(first: &Entity) -> String {
    let keys = serde_json::to_vec(&[&first.partition_key, &first.row_key]).expect("keys");
    sha256_hex(&keys)[..32].to_string()
}

/// `rows` (in key order, read with the property selected) as ranges of at most [`RANGE_ROWS`]
/// rows, each with its bounds and its values' hashes; ranges without a value are left out.
pub fn staged_ranges(property: &str, rows: &[Entity]) -> Result<Vec<StagedRange>, WorkError> {
    let mut ranges = Vec::new();
    for chunk in rows.chunks(RANGE_ROWS) {
        let mut values = Vec::new();
        for row in chunk {
            if !row
                .properties
                .get(property)
                .is_some_and(|v| v.get() != "null")
            {
                continue;
            }
            let value = IndexValue::from_property(&row.properties, property).map_err(|e| {
                WorkError::Permanent(format!(
                    "row (PartitionKey {:?}, RowKey {:?}): its {property} cannot be indexed: {e}",
                    row.partition_key, row.row_key
                ))
            })?;
            values.extend(value);
        }
        if values.is_empty() {
            continue;
        }
        let (first, last) = (&chunk[0], &chunk[chunk.len() - 1]);
        let keys = KeyBounds::new(
            (&first.partition_key, &first.row_key),
            (&last.partition_key, &last.row_key),
        );
        ranges.push(StagedRange::from_values(keys, values.iter()));
    }
    Ok(ranges)
}

/// Writes the staging record of `runs` (contiguous runs of rows, in key order; nothing if no
/// row holds the property); returns how many rows it indexed.
pub async fn stage<S: Stores>(
    state: &AppState<S>,
    scan: &ScanContext,
    requests: &Arc<Meter>,
    runs: &[Vec<Entity>],
) -> Result<i64, WorkError> {
    let options: IndexOptions = scan.options()?;
    let Some(first) = runs.iter().find_map(|run| run.first()) else {
        return Ok(0);
    };
    let mut ranges = Vec::new();
    for run in runs {
        ranges.extend(staged_ranges(&options.property, run)?);
    }
    if ranges.is_empty() {
        return Ok(0);
    }
    // The scan ended (`kit::scan_ended`): no record is written, none counted.
    if scan_ended(state, &scan.scan_id) {
        return Ok(0);
    }
    let indexed: u64 = ranges.iter().map(|r| r.rows).sum();
    let record = encode_staging(&ranges)
        .map_err(|e| WorkError::Permanent(format!("a staging record: {e}")))?;
    let name = options
        .layout()?
        .staging(&scan.scan_id, &staging_name(first));
    let blobs = state.blob_store(&options.connection, requests)?;
    blobs
        .upload(
            &options.container,
            &name,
            Bytes::from(record),
            &BlobWrite::new(BINARY_CONTENT_TYPE),
        )
        .await?;
    Ok(indexed as i64)
}

/// A range item (a partition too big for one step, or a serial scan's page): re-reads its range
/// with the property selected, within the bounds of every range item, stages what it read, and
/// hands the rest of a range that grew on.
pub async fn stage_item<S: Stores>(
    state: &AppState<S>,
    begun: &Begun<ItemMessage>,
    item: &RangeWork,
) -> Result<WorkOutcome, WorkError> {
    let scan = &*begun.scan;
    let options: IndexOptions = scan.options()?;
    let source = state.counted_table(&scan.source.connection, &begun.requests)?;
    let spec = read_spec(state, scan, Some(vec![options.property.clone()]))?;
    let read = read_item(&source, &scan.source.table, item, &spec).await?;
    let mut outcome = WorkOutcome::default();
    if let Some(next) = read.next {
        outcome
            .children
            .push(item_child::<IndexDriver>(&IndexWork::Range(next))?);
    }
    let rows = read.rows.len();
    outcome.delta.rows_written = stage(state, scan, &begun.requests, &[read.rows]).await?;
    outcome.delta.rows_matched = rows as i64;
    if let Some(e) = unaddressable_error("indexed", &read.unaddressable) {
        return Err(e);
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn row(pk: &str, rk: &str, owner: Option<serde_json::Value>) -> Entity {
        let mut e = Entity::new(pk, rk);
        if let Some(v) = owner {
            e.properties.insert("Owner", v);
        }
        e
    }

    #[test]
    fn rows_become_ranges_of_bounded_size_without_empty_ones() {
        let mut rows: Vec<Entity> = (0..RANGE_ROWS + 10)
            .map(|i| row("p", &format!("{i:05}"), Some(json!(format!("o{}", i % 7)))))
            .collect();
        rows.extend((0..RANGE_ROWS).map(|i| row("q", &format!("{i:05}"), Some(json!(null)))));
        let ranges = staged_ranges("Owner", &rows).unwrap();
        assert_eq!(ranges.len(), 2, "the chunk of nulls is left out");
        assert_eq!(ranges[0].rows, RANGE_ROWS as u64);
        assert_eq!(ranges[0].hashes.len(), 7);
        assert_eq!(ranges[1].keys.first_row_key, format!("{RANGE_ROWS:05}"));
        // The second range covers every row of its chunk, those without the property included.
        assert_eq!(ranges[1].keys.last_partition_key, "q");
        assert_eq!(ranges[1].rows, 10);
    }

    #[test]
    fn a_staging_name_depends_on_the_first_keys_only() {
        let a = staging_name(&row("p", "1", None));
        assert_eq!(a, staging_name(&row("p", "1", Some(json!(1)))));
        assert_ne!(a, staging_name(&row("p1", "", None)));
        assert_eq!(a.len(), 32);
    }
}
