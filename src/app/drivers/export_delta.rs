//! Incremental exports (`since`, docs/backups.md): a delta scans no table with the prefix scan.
//! Its key space is tiled by the parent's key chunks (`export_chain`): a fan-out item
//! ([`DeltaWork::Tiles`]) reads the parent's manifest and queues one [`DeltaWork::Tile`] per
//! run of consecutive chunks holding up to [`TILE_KEYS`] keys, bounded by the first key of its
//! first chunk and of the next tile's (the first tile and the last are open-ended, so every key
//! of the chain's scope is in exactly one tile). A tile item:
//! 1. reads the keys of its range (`$select` of the keys only, the chain's filter and key
//!    range), at most [`MAX_TILE_KEYS`] of them: the rest of the tile is handed on;
//! 2. reads the rows of the range it covered whose `Timestamp` is at or after the watermark
//!    (one query with the service's filter, the chain's `select`);
//! 3. downloads its parent chunks (the parent's state there) and merges
//!    (`export_chain::merge_tile`): tombstones for the parent's keys neither read nor written;
//! 4. writes its part (the changed rows), its key chunk (the state) and its tombstone file.
//!
//! Invariants: memory is one tile's keys and changed rows (at most [`MAX_TILE_KEYS`] keys and the
//! parent's chunks of one tile), never the table; the parent's parts are never read; blob names
//! are the item's, so a redelivered tile rewrites the same blobs.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::app::error::ApiError;
use crate::app::export_chain::{
    decode_keys, in_range, merge_tile, Bound, Key, KeyChunk, Scope, WATERMARK_MARGIN,
};
use crate::app::export_format::{sha256_hex, ExportLayout, Manifest, MAX_MANIFEST_BYTES};
use crate::app::job::{item_child, Begun, ScanContext, WorkError, WorkOutcome, MAX_ITEM_QUERIES};
use crate::app::messages::ItemMessage;
use crate::app::state::AppState;
use crate::scan::ScanParameters;
use crate::storage::blob::BlobStore;
use crate::storage::keys::key_successor;
use crate::storage::odata::{self, Expr};
use crate::storage::stores::Stores;
use crate::storage::{CompareOp, Entity, Filter, Query, TableStore, MAX_TAKE};

use super::{write_item_blobs, ExportDriver, ExportOptions, ExportWork, RESERVATION_NAME};
use crate::app::drivers::kit::drop_nulls;
use crate::app::drivers::kit::range::unaddressable_error;

/// A tile groups parent chunks up to this many keys (at least one chunk).
pub const TILE_KEYS: u64 = 8_000;
/// A tile item reads at most this many keys; the rest of its tile is handed on.
pub const MAX_TILE_KEYS: usize = 10_000;
/// Most tiles one fan-out item queues (with the next fan-out item).
pub const TILES_PER_ITEM: usize = 200;
/// Most pages of keys a tile item reads (its changed rows get the rest of twice the item
/// budget).
const MAX_KEY_QUERIES: usize = MAX_ITEM_QUERIES;

/// The parent a delta continues from, as its scan records it (checked at start).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Since {
    pub prefix: String,
    /// SHA-256 of the parent's manifest: a fan-out item that finds other bytes fails.
    pub sha256: String,
    pub base: String,
    #[serde(with = "time::serde::rfc3339")]
    pub watermark: OffsetDateTime,
}

/// A delta's work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum DeltaWork {
    /// Tiles from the parent's chunk `start` on.
    Tiles { start: u64 },
    /// Keys at or after `from` (or after `after`) and before `to`; `chunks`: the parent's state
    /// there.
    Tile {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from: Option<Key>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<Key>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        to: Option<Key>,
        chunks: Vec<KeyChunk>,
    },
}

/// The scope a scan's request gives (compared with the chain's base).
pub fn scope_of(context: &ScanContext) -> Scope {
    Scope {
        filter: context.filter.clone(),
        select: context.select.clone(),
        partition_key_prefix: context.params.prefix.clone(),
        partition_key_lower_bound: context.params.lower.clone(),
        partition_key_upper_bound: context.params.upper.clone(),
    }
}

/// Checks `since` (a completed export of the same table and scope, with key state) and what
/// the delta continues from; a 400 naming the field otherwise. Reads, never writes.
pub async fn check_since<B: BlobStore>(
    blobs: &B,
    container: &str,
    since: &str,
    context: &ScanContext,
) -> Result<Since, ApiError> {
    let refuse = |why: String| ApiError::field("since", format!("{container}/{since}: {why}"));
    let layout = ExportLayout::new(since).map_err(|e| refuse(e.to_string()))?;
    let bytes = match blobs
        .download(container, &layout.manifest_blob(), MAX_MANIFEST_BYTES)
        .await
    {
        Ok(d) => d.bytes,
        Err(e) if e.is_not_found() => {
            let reserved = blobs
                .properties(container, &layout.blob(RESERVATION_NAME))
                .await?;
            return Err(refuse(match reserved {
                Some(_) => "is an export that did not complete (it failed, was cancelled, or is still running): a delta continues only from a completed export".into(),
                None => "holds no export (no manifest.json)".into(),
            }));
        }
        Err(e) => return Err(e.into()),
    };
    let manifest = Manifest::parse(&bytes).map_err(|e| refuse(e.to_string()))?;
    if manifest.source_table != context.source.table {
        return Err(refuse(format!(
            "is an export of table {:?}, not of {:?}",
            manifest.source_table, context.source.table
        )));
    }
    let (Some(_), Some(started)) = (&manifest.keys, manifest.service_started_at) else {
        return Err(refuse(
            "was written before exports recorded their key state; take a full export to start a chain".into(),
        ));
    };
    let base_scope = manifest.scope.clone().unwrap_or_default();
    if let Some(field) = scope_of(context).differing_field(&base_scope) {
        return Err(ApiError::field(
            field,
            format!("differs from the chain's (the export at {container}/{since}): every delta of a chain uses its base's filter, select and key range"),
        ));
    }
    Ok(Since {
        prefix: since.to_string(),
        sha256: sha256_hex(&bytes),
        base: manifest.delta.map_or(since.to_string(), |d| d.base),
        watermark: started - WATERMARK_MARGIN,
    })
}

/// Runs one delta item.
pub async fn run<S: Stores>(
    state: &AppState<S>,
    begun: &Begun<ItemMessage>,
    work: DeltaWork,
) -> Result<WorkOutcome, WorkError> {
    let options: ExportOptions = begun.scan.options()?;
    let since = options
        .since
        .clone()
        .ok_or_else(|| WorkError::Permanent("a delta item of an export without `since`".into()))?;
    match work {
        DeltaWork::Tiles { start } => fan_out(state, begun, &options, &since, start).await,
        DeltaWork::Tile {
            from,
            after,
            to,
            chunks,
        } => {
            let tile = Tile {
                from,
                after,
                to,
                chunks,
            };
            run_tile(state, begun, &options, &since, tile).await
        }
    }
}

fn child(work: DeltaWork) -> Result<crate::app::messages::ChildSpec, WorkError> {
    item_child::<ExportDriver>(&ExportWork::Delta(work))
}

/// Queues the tiles of parent chunks `start..` (up to [`TILES_PER_ITEM`]) and the next fan-out.
async fn fan_out<S: Stores>(
    state: &AppState<S>,
    begun: &Begun<ItemMessage>,
    options: &ExportOptions,
    since: &Since,
    start: u64,
) -> Result<WorkOutcome, WorkError> {
    let blobs = state.blob_store(&options.connection, &begun.requests)?;
    let layout =
        ExportLayout::new(&since.prefix).map_err(|e| WorkError::Permanent(e.to_string()))?;
    let name = layout.manifest_blob();
    let bytes = match blobs
        .download(&options.container, &name, MAX_MANIFEST_BYTES)
        .await
    {
        Err(e) if e.is_not_found() => {
            return Err(WorkError::Permanent(format!(
                "the parent export's manifest {}/{name} vanished during the delta",
                options.container
            )))
        }
        other => other?.bytes,
    };
    if sha256_hex(&bytes) != since.sha256 {
        return Err(WorkError::Permanent(format!(
            "the parent export's manifest {}/{name} changed since the delta started",
            options.container
        )));
    }
    let manifest = Manifest::parse(&bytes).map_err(|e| WorkError::Permanent(e.to_string()))?;
    let chunks = manifest.keys.unwrap_or_default();
    let mut outcome = WorkOutcome::default();
    let mut i = usize::try_from(start).unwrap_or(usize::MAX);
    if chunks.is_empty() && i == 0 {
        let tile = tile_work(&chunks, 0, 0);
        outcome.children.push(child(tile)?);
    }
    let mut queued = 0;
    while i < chunks.len() && queued < TILES_PER_ITEM {
        let mut end = i + 1;
        let mut keys = chunks[i].rows;
        while end < chunks.len() && keys + chunks[end].rows <= TILE_KEYS {
            keys += chunks[end].rows;
            end += 1;
        }
        outcome.children.push(child(tile_work(&chunks, i, end))?);
        queued += 1;
        i = end;
    }
    if i < chunks.len() {
        outcome
            .children
            .push(child(DeltaWork::Tiles { start: i as u64 })?);
    }
    Ok(outcome)
}

/// The tile of chunks `start..end`: from the first key of chunk `start` (unbounded for the
/// first) to the first key of chunk `end` (unbounded past the last).
fn tile_work(chunks: &[KeyChunk], start: usize, end: usize) -> DeltaWork {
    DeltaWork::Tile {
        from: (start > 0).then(|| chunks[start].first.clone()),
        after: None,
        to: chunks.get(end).map(|c| c.first.clone()),
        chunks: chunks.get(start..end).unwrap_or_default().to_vec(),
    }
}

struct Tile {
    from: Option<Key>,
    after: Option<Key>,
    to: Option<Key>,
    chunks: Vec<KeyChunk>,
}

impl Tile {
    fn lower(&self) -> Bound<'_> {
        match (&self.after, &self.from) {
            (Some(after), _) => Some((after, false)),
            (None, Some(from)) => Some((from, true)),
            (None, None) => None,
        }
    }
}

/// Rows after (or at) `key` when `lower`, else before (or at) it.
fn key_bound(key: &Key, lower: bool, inclusive: bool) -> Filter {
    use CompareOp::*;
    let (pk_op, rk_op) = match (lower, inclusive) {
        (true, true) => (Gt, Ge),
        (true, false) => (Gt, Gt),
        (false, true) => (Lt, Le),
        (false, false) => (Lt, Lt),
    };
    Filter::or(vec![
        Filter::pk(pk_op, key.0.clone()),
        Filter::and(vec![
            Filter::pk(Eq, key.0.clone()),
            Filter::rk(rk_op, key.1.clone()),
        ]),
    ])
}

/// The filter of rows in the chain's key range between `lower` and `upper`, matching `row`.
fn range_query_filter(
    params: &ScanParameters,
    lower: Bound,
    upper: Bound,
    row: Option<Expr>,
) -> Option<Filter> {
    let mut parts = Vec::new();
    if !params.prefix.is_empty() {
        parts.push(Filter::pk(CompareOp::Ge, params.prefix.clone()));
        if let Some(end) = key_successor(&params.prefix) {
            parts.push(Filter::pk(CompareOp::Lt, end));
        }
    }
    if let Some(l) = &params.lower {
        parts.push(Filter::pk(CompareOp::Gt, l.clone()));
    }
    if let Some(u) = &params.upper {
        parts.push(Filter::pk(CompareOp::Lt, u.clone()));
    }
    if let Some((key, inclusive)) = lower {
        parts.push(key_bound(key, true, inclusive));
    }
    if let Some((key, inclusive)) = upper {
        parts.push(key_bound(key, false, inclusive));
    }
    parts.extend(row.map(Filter::Where));
    (!parts.is_empty()).then(|| Filter::and(parts))
}

/// What a tile's key read found: the keys, and where the rest of the tile starts if the read
/// stopped first (the next key, inclusive, when no key was read).
struct KeysRead {
    keys: Vec<Key>,
    rest_from: Option<Key>,
}

async fn read_keys<T: TableStore>(
    source: &T,
    scan: &ScanContext,
    tile: &Tile,
) -> Result<KeysRead, WorkError> {
    let upper = tile.to.as_ref().map(|k| (k, false));
    let filter = range_query_filter(&scan.params, tile.lower(), upper, scan.row_filter()?);
    let mut query = Query {
        filter,
        top: Some(MAX_TAKE),
        select: Some(Vec::new()),
        continuation: None,
    };
    let mut keys = Vec::new();
    // Bounded: at most MAX_KEY_QUERIES pages, and stops past MAX_TILE_KEYS keys.
    for queries in 1.. {
        let page = source.query_page(&scan.source.table, &query).await?;
        if let Some(e) = unaddressable_error("exported", &page.unaddressable) {
            return Err(e);
        }
        keys.extend(
            page.entities
                .into_iter()
                .map(|e| (e.partition_key, e.row_key)),
        );
        match page.continuation {
            None => break,
            Some(c) if keys.len() >= MAX_TILE_KEYS || queries >= MAX_KEY_QUERIES => {
                let next = (c.next_partition_key, c.next_row_key.unwrap_or_default());
                return Ok(KeysRead {
                    rest_from: Some(next),
                    keys,
                });
            }
            Some(c) => query.continuation = Some(c),
        }
    }
    Ok(KeysRead {
        keys,
        rest_from: None,
    })
}

/// The rows between `lower` and `upper` changed at or after the watermark.
async fn read_changed<T: TableStore>(
    source: &T,
    scan: &ScanContext,
    since: &Since,
    (lower, upper): (Bound<'_>, Bound<'_>),
) -> Result<Vec<Entity>, WorkError> {
    let at = since
        .watermark
        .format(&time::format_description::well_known::Rfc3339)
        .map_err(|e| WorkError::Permanent(format!("the watermark: {e}")))?;
    let changed = odata::parse(&format!("Timestamp ge datetime'{at}'"))
        .map_err(|e| WorkError::Permanent(format!("the watermark's filter: {e}")))?;
    let row = match scan.row_filter()? {
        Some(f) => Expr::And(Box::new(f), Box::new(changed)),
        None => changed,
    };
    let mut query = Query {
        filter: range_query_filter(&scan.params, lower, upper, Some(row)),
        top: Some(MAX_TAKE),
        select: scan.select.clone(),
        continuation: None,
    };
    let mut rows = Vec::new();
    // Bounded: the range held at most MAX_TILE_KEYS keys when read; a range that grew past
    // what this many pages hold fails the item, which is retried.
    for _ in 0..4 * MAX_ITEM_QUERIES {
        let page = source.query_page(&scan.source.table, &query).await?;
        if let Some(e) = unaddressable_error("exported", &page.unaddressable) {
            return Err(e);
        }
        rows.extend(page.entities);
        match page.continuation {
            None => {
                if scan.select.is_some() {
                    rows.iter_mut().for_each(drop_nulls);
                }
                return Ok(rows);
            }
            Some(c) => query.continuation = Some(c),
        }
    }
    Err(WorkError::Failed(
        "the tile's changed rows did not fit its budget of pages".into(),
    ))
}

/// The parent's keys between `lower` and `upper` (its chunks of the tile, downloaded).
async fn parent_keys<B: BlobStore>(
    blobs: &B,
    container: &str,
    since: &Since,
    chunks: &[KeyChunk],
    (lower, upper): (Bound<'_>, Bound<'_>),
) -> Result<Vec<Key>, WorkError> {
    let layout =
        ExportLayout::new(&since.prefix).map_err(|e| WorkError::Permanent(e.to_string()))?;
    let mut keys = Vec::new();
    for chunk in chunks {
        let name = layout.blob(&chunk.name);
        let broken = |why: String| {
            WorkError::Permanent(format!("the parent's key chunk {container}/{name}: {why}"))
        };
        let bytes: Bytes = match blobs.download(container, &name, chunk.bytes).await {
            Err(e) if e.is_not_found() => return Err(broken("missing".into())),
            other => other?.bytes,
        };
        let decoded =
            decode_keys(&bytes, chunk.rows, &chunk.sha256).map_err(|e| broken(e.to_string()))?;
        keys.extend(decoded.into_iter().filter(|k| in_range(k, lower, upper)));
    }
    Ok(keys)
}

async fn run_tile<S: Stores>(
    state: &AppState<S>,
    begun: &Begun<ItemMessage>,
    options: &ExportOptions,
    since: &Since,
    tile: Tile,
) -> Result<WorkOutcome, WorkError> {
    let scan = &*begun.scan;
    let source = state.counted_table(&scan.source.connection, &begun.requests)?;
    let blobs = state.blob_store(&options.connection, &begun.requests)?;
    let read = read_keys(&source, scan, &tile).await?;
    let mut outcome = WorkOutcome::default();
    let upper: Bound = match (&read.rest_from, read.keys.last()) {
        (None, _) => tile.to.as_ref().map(|k| (k, false)),
        (Some(_), Some(last)) => Some((last, true)),
        (Some(next), None) => Some((next, false)),
    };
    if let Some(next) = &read.rest_from {
        let (from, after) = match read.keys.last() {
            Some(last) => (None, Some(last.clone())),
            None => (Some(next.clone()), None),
        };
        outcome.children.push(child(DeltaWork::Tile {
            from,
            after,
            to: tile.to.clone(),
            chunks: tile.chunks.clone(),
        })?);
    }
    let bounds = (tile.lower(), upper);
    let rows = read_changed(&source, scan, since, bounds).await?;
    let parent = parent_keys(&blobs, &options.container, since, &tile.chunks, bounds).await?;
    let written: Vec<Key> = rows
        .iter()
        .map(|r| (r.partition_key.clone(), r.row_key.clone()))
        .collect();
    let (keys, deleted) = merge_tile(&parent, &read.keys, &written);
    outcome.delta.rows_scanned = read.keys.len() as i64;
    outcome.delta.rows_matched = rows.len() as i64;
    outcome.delta.rows_written = rows.len() as i64;
    let result = write_item_blobs(
        &blobs,
        options,
        &scan.scan_id,
        &begun.work_id,
        &rows,
        &keys,
        &deleted,
    )
    .await?;
    outcome.result = result;
    Ok(outcome)
}
