//! Phase 1 of an index build: staging records become segment files, in bounded items.
//!
//! - A chunk item (`Assemble`) lists ONE page of the build's staging folder (from its marker),
//!   groups consecutive records into segments of about [`SEGMENT_STAGING_BYTES`] of records
//!   (by the listing's sizes: no record is read), and queues one segment item per group and
//!   the chunk item of the next page. A group never spans two pages.
//! - A segment item lists the page again and takes the records named `first` to `last`
//!   (a record written since — a late duplicate of a step whose table changed — is included if
//!   it falls in between, and is otherwise a copy of rows another record holds), reads them,
//!   sorts their ranges by key and merges ranges that overlap (the union of their values), builds
//!   the segment (`crate::index::build_segment`) and writes it, named after its first record.
//!   Its descriptor (`SegmentEntry`) is the item's result, which the completion step lists.
//! - A page that is the only one and makes one group (every build of up to about 3 million
//!   distinct values per range summed: all small builds) is built by the chunk item itself, the
//!   same way: one item, one listing.

use std::cmp::Ordering;

use bytes::Bytes;
use futures::stream::{self, StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};

use crate::app::index_files::{IndexLayout, SegmentEntry};
use crate::app::job::{item_child, Begun, WorkError, WorkOutcome};
use crate::app::messages::ItemMessage;
use crate::app::state::AppState;
use crate::index::{build_segment, decode_staging, StagedRange, MAX_STAGING_BYTES};
use crate::storage::blob::{BlobProperties, BlobStore, BlobWrite, MAX_LIST_RESULTS};
use crate::storage::compare_keys;
use crate::storage::stores::Stores;

use super::super::kit::scan_ended;
use super::stage::BINARY_CONTENT_TYPE;
use super::{prune, publish, BuildWork, IndexDriver, IndexOptions, IndexWork};

/// A segment item reads about this many bytes of staging records (a record past it starts the
/// next segment): 8 bytes per distinct value of a range, so about 3 million values, whose
/// segment (about 2.5 bytes per value) is built in a second or two.
pub const SEGMENT_STAGING_BYTES: u64 = 24 << 20;
/// Staging records a segment item reads at once.
const READS_IN_FLIGHT: usize = 16;
/// Pages a segment item lists to find its records (its own page, and one more if records were
/// added before its last one since the chunk listed it).
const MAX_SEGMENT_LISTINGS: usize = 2;

/// The chunk item: one page of records → segment items, and the next page's chunk. A build
/// whose records fit one page and one segment (every small build) has its segment built here,
/// the page's records read at once: no segment item, no second listing.
pub async fn chunk<S: Stores>(
    state: &AppState<S>,
    begun: &Begun<ItemMessage>,
    marker: Option<String>,
) -> Result<WorkOutcome, WorkError> {
    let scan = &*begun.scan;
    let options: IndexOptions = scan.options()?;
    let folder = options.layout()?.staging_folder(&scan.scan_id);
    let blobs = state.blob_store(&options.connection, &begun.requests)?;
    let page = blobs
        .list(
            &options.container,
            &folder,
            MAX_LIST_RESULTS,
            marker.as_deref(),
        )
        .await?;
    let groups = groups(&page.blobs, SEGMENT_STAGING_BYTES);
    if page.next_marker.is_none() && groups.len() == 1 {
        let names = page.blobs.into_iter().map(|b| b.name).collect();
        return build_and_publish(state, begun, names).await;
    }
    let mut outcome = WorkOutcome::default();
    for (first, last) in groups {
        let work = IndexWork::Build(BuildWork::Segment {
            marker: marker.clone(),
            first,
            last,
        });
        outcome.children.push(item_child::<IndexDriver>(&work)?);
    }
    if let Some(next) = page.next_marker {
        let work = IndexWork::Build(BuildWork::Assemble { marker: Some(next) });
        outcome.children.push(item_child::<IndexDriver>(&work)?);
    }
    Ok(outcome)
}

/// Consecutive blobs grouped while their sizes add up to at most `bound` (a group holds at
/// least one): each group's first and last name.
pub fn groups(blobs: &[BlobProperties], bound: u64) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut size = 0u64;
    for blob in blobs {
        match out.last_mut() {
            Some(group) if size + blob.size <= bound => {
                group.1 = blob.name.clone();
                size += blob.size;
            }
            _ => {
                out.push((blob.name.clone(), blob.name.clone()));
                size = blob.size;
            }
        }
    }
    out
}

/// The segment item: lists records `first..=last` again and builds their segment ([`build`]).
pub async fn segment<S: Stores>(
    state: &AppState<S>,
    begun: &Begun<ItemMessage>,
    marker: Option<String>,
    first: &str,
    last: &str,
) -> Result<WorkOutcome, WorkError> {
    let scan = &*begun.scan;
    let options: IndexOptions = scan.options()?;
    let folder = options.layout()?.staging_folder(&scan.scan_id);
    let blobs = state.blob_store(&options.connection, &begun.requests)?;
    let container = &options.container;
    let mut names = Vec::new();
    let mut marker = marker;
    for _ in 0..MAX_SEGMENT_LISTINGS {
        let page = blobs
            .list(container, &folder, MAX_LIST_RESULTS, marker.as_deref())
            .await?;
        let past = page.blobs.last().is_some_and(|b| b.name.as_str() >= last);
        names.extend(
            page.blobs
                .into_iter()
                .map(|b| b.name)
                .filter(|n| n.as_str() >= first && n.as_str() <= last),
        );
        match page.next_marker {
            Some(next) if !past => marker = Some(next),
            _ => break,
        }
    }
    if names.first().map(String::as_str) != Some(first) {
        return Err(WorkError::Permanent(format!(
            "staging record {container}/{first} is missing: was the build's staging folder changed?"
        )));
    }
    build(state, begun, names).await
}

/// A small build's whole phase 1, and what phase 2 would do: this item's segment is the
/// build's only one, so it publishes the build itself (`publish::publish`, with its segment),
/// then runs the first page of the cleanup (further pages are its children). Its result, the
/// segment's descriptor marked `published` ([`PublishedSegment`]), ends the build's phases
/// (`IndexDriver::ends_phases`): phase 2 does not start.
///
/// At least once: the records were listed before the pointer is read, so a delivery that finds
/// the build unpublished read the listing before any record was deleted (the cleanup deletes
/// them only after the switch); it reads them all (a record deleted since is an error, and the
/// retry finds the build published) and builds the same segment, byte for byte (the build is
/// deterministic), so rewriting it is harmless. A delivery that finds the build published
/// builds nothing (its records may be gone) and only cleans up.
async fn build_and_publish<S: Stores>(
    state: &AppState<S>,
    begun: &Begun<ItemMessage>,
    names: Vec<String>,
) -> Result<WorkOutcome, WorkError> {
    let scan = &*begun.scan;
    let entry = if publish::is_published(state, scan, &begun.requests).await? {
        None
    } else {
        let Some(entry) = build_segment_of(state, begun, names).await? else {
            return Ok(WorkOutcome::default());
        };
        // A build cancelled meanwhile is never switched to.
        if scan_ended(state, &scan.scan_id) {
            return Ok(WorkOutcome::default());
        }
        publish::publish(
            state,
            scan,
            &begun.requests,
            Some(std::slice::from_ref(&entry)),
        )
        .await?;
        Some(entry)
    };
    let mut outcome = prune::cleanup(state, begun, None).await;
    let result = PublishedSegment {
        published: true,
        segment: entry,
    };
    outcome.result = Some(serde_json::to_string(&result).expect("a result serializes"));
    Ok(outcome)
}

/// Reads the staging records `names` (in name order, at least one), writes their segment
/// (named after the first), and returns its descriptor as the item's result.
async fn build<S: Stores>(
    state: &AppState<S>,
    begun: &Begun<ItemMessage>,
    names: Vec<String>,
) -> Result<WorkOutcome, WorkError> {
    let entry = build_segment_of(state, begun, names).await?;
    Ok(WorkOutcome {
        result: entry.map(|e| serde_json::to_string(&e).expect("an entry serializes")),
        ..WorkOutcome::default()
    })
}

/// Reads the staging records `names` (in name order) and writes their segment (named after the
/// first): its descriptor (`None` for no records).
async fn build_segment_of<S: Stores>(
    state: &AppState<S>,
    begun: &Begun<ItemMessage>,
    names: Vec<String>,
) -> Result<Option<SegmentEntry>, WorkError> {
    let scan = &*begun.scan;
    let options: IndexOptions = scan.options()?;
    let layout = options.layout()?;
    let blobs = state.blob_store(&options.connection, &begun.requests)?;
    let container = &options.container;
    let Some(first) = names.first().cloned() else {
        return Ok(None);
    };
    let records: Vec<Vec<StagedRange>> = stream::iter(names)
        .map(|name| {
            let blobs = &blobs;
            async move {
                // The scan ended: no further read, and no segment (below).
                if scan_ended(state, &scan.scan_id) {
                    return Ok(Vec::new());
                }
                let record = blobs
                    .download(container, &name, MAX_STAGING_BYTES as u64)
                    .await?;
                decode_staging(&record.bytes).map_err(|e| {
                    WorkError::Permanent(format!("staging record {container}/{name}: {e}"))
                })
            }
        })
        .buffered(READS_IN_FLIGHT)
        .try_collect()
        .await?;
    if scan_ended(state, &scan.scan_id) {
        return Ok(None);
    }
    let ranges = merged(records.into_iter().flatten().collect());
    let entry = write_segment(&blobs, &options, &layout, &scan.scan_id, &first, &ranges).await?;
    Ok(Some(entry))
}

/// The result of a small build's assembly item, which published the build
/// ([`build_and_publish`]): `{"published": true, "segment": {…}}` (`segment`: its descriptor,
/// absent when a delivery found the build published by an earlier one).
#[derive(Debug, Serialize, Deserialize)]
pub struct PublishedSegment {
    pub published: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment: Option<SegmentEntry>,
}

/// Builds and writes the segment of `ranges`, named after its first record.
async fn write_segment<B: BlobStore>(
    blobs: &B,
    options: &IndexOptions,
    layout: &IndexLayout,
    scan_id: &str,
    first: &str,
    ranges: &[StagedRange],
) -> Result<SegmentEntry, WorkError> {
    let stem = first
        .rsplit('/')
        .next()
        .and_then(|n| n.strip_suffix(".rec"))
        .unwrap_or(first);
    let name = IndexLayout::segment_name(scan_id, stem);
    let ranges_owned = ranges.to_vec();
    let bytes = tokio::task::spawn_blocking(move || build_segment(&ranges_owned))
        .await
        .map_err(|e| WorkError::Failed(format!("building segment {name}: {e}")))?
        .map_err(|e| WorkError::Permanent(format!("building segment {name}: {e}")))?;
    let entry = SegmentEntry {
        name: name.clone(),
        ranges: ranges.len() as u64,
        rows: ranges.iter().map(|r| r.rows).sum(),
        bytes: bytes.len() as u64,
    };
    blobs
        .upload(
            &options.container,
            &layout.blob(&name),
            Bytes::from(bytes),
            &BlobWrite::new(BINARY_CONTENT_TYPE),
        )
        .await?;
    Ok(entry)
}

/// (PartitionKey, RowKey) order of two key pairs, as the service sorts them.
fn key_order(a: (&str, &str), b: (&str, &str)) -> Ordering {
    compare_keys(a.0, b.0).then_with(|| compare_keys(a.1, b.1))
}

/// `ranges` in key order, those that overlap merged into one (bounds: the union; values: the
/// union; rows: the larger count, as overlapping ranges are rereads of the same rows).
pub fn merged(mut ranges: Vec<StagedRange>) -> Vec<StagedRange> {
    let first = |r: &StagedRange| {
        (
            r.keys.first_partition_key.clone(),
            r.keys.first_row_key.clone(),
        )
    };
    ranges.sort_by(|a, b| {
        let (a, b) = (first(a), first(b));
        key_order((&a.0, &a.1), (&b.0, &b.1))
    });
    let mut out: Vec<StagedRange> = Vec::with_capacity(ranges.len());
    for range in ranges {
        let Some(last) = out.last_mut() else {
            out.push(range);
            continue;
        };
        let (l, r) = (&last.keys, &range.keys);
        let overlaps = key_order(
            (&r.first_partition_key, &r.first_row_key),
            (&l.last_partition_key, &l.last_row_key),
        ) != Ordering::Greater;
        if !overlaps {
            out.push(range);
            continue;
        }
        if key_order(
            (&r.last_partition_key, &r.last_row_key),
            (&l.last_partition_key, &l.last_row_key),
        ) == Ordering::Greater
        {
            last.keys.last_partition_key = r.last_partition_key.clone();
            last.keys.last_row_key = r.last_row_key.clone();
        }
        let mut hashes = std::mem::take(&mut last.hashes);
        hashes.extend(range.hashes);
        *last = StagedRange::new(last.keys.clone(), last.rows.max(range.rows), hashes);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::KeyBounds;

    fn blob(name: &str, size: u64) -> BlobProperties {
        BlobProperties {
            name: name.into(),
            size,
            etag: String::new(),
            content_type: None,
            content_encoding: None,
        }
    }

    #[test]
    fn groups_are_bounded_and_cover_every_record_once() {
        let blobs: Vec<_> = [5, 5, 5, 20, 1, 1]
            .iter()
            .enumerate()
            .map(|(i, s)| blob(&format!("r{i}"), *s))
            .collect();
        assert_eq!(
            groups(&blobs, 10),
            vec![
                ("r0".into(), "r1".into()),
                ("r2".into(), "r2".into()),
                ("r3".into(), "r3".into()),
                ("r4".into(), "r5".into())
            ]
        );
        assert!(groups(&[], 10).is_empty());
    }

    fn range(first: (&str, &str), last: (&str, &str), hashes: &[u64]) -> StagedRange {
        StagedRange::new(
            KeyBounds::new(first, last),
            hashes.len() as u64,
            hashes.to_vec(),
        )
    }

    #[test]
    fn overlapping_ranges_merge_and_others_sort() {
        let out = merged(vec![
            range(("b", "1"), ("b", "9"), &[3]),
            range(("a", "1"), ("a", "5"), &[1]),
            range(("b", "5"), ("c", "0"), &[2, 3]),
            range(("c", "1"), ("c", "2"), &[4]),
        ]);
        assert_eq!(out.len(), 3);
        assert_eq!(out[0].keys.first_partition_key, "a");
        assert_eq!(out[1].keys, KeyBounds::new(("b", "1"), ("c", "0")));
        assert_eq!(out[1].hashes, vec![2, 3]);
        assert_eq!(out[2].hashes, vec![4]);
    }
}
