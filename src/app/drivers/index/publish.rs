//! Who may switch a prefix's index, and the switch.
//!
//! - **Reservation** ([`reserve`], at start): `<prefix>index-build.json` names the build that
//!   holds the prefix, created with `If-None-Match: *`. A prefix held by a running build is
//!   refused (400 naming `destinationPrefix`); one whose build ended (completed, failed,
//!   cancelled, or a start that never recorded its scan) is taken over with `If-Match` on the
//!   reservation's ETag, so of two builds started at once exactly one wins.
//! - **Publication** ([`publish`]: phase 2's item [`publish_item`]; may run more than once):
//!   checks the reservation still names this build, lists the segment items' descriptors,
//!   writes the build's manifest (`If-None-Match: *`: a rerun leaves it as it is), then switches
//!   `<prefix>index.json` to it in ONE write, `If-Match` on the pointer's ETag as read (or
//!   `If-None-Match: *` for a prefix's first index). Until that write, lookups answer from the
//!   previous build; after it, from this one. A failed build never writes the pointer. The
//!   new pointer remembers the builds it supersedes and when (`superseded`: the replaced
//!   pointer's build at the switch's time, then the replaced pointer's own list), which is
//!   what `prune` measures a superseded build's grace from. Once it is switched, the item
//!   starts the cleanup (`prune`): this build's staging records, and old builds no lookup
//!   reads any more.

use std::sync::Arc;

use bytes::Bytes;
use serde::Serialize;
use time::OffsetDateTime;

use crate::app::error::ApiError;
use crate::app::index_files::{
    IndexLayout, IndexManifest, Pointer, Reservation, SegmentEntry, Superseded, JSON_CONTENT_TYPE,
    MANIFEST_FORMAT, MAX_POINTER_BYTES, MAX_SUPERSEDED, POINTER_FORMAT,
};
use crate::app::job::{Begun, ScanContext, WorkError, WorkOutcome};
use crate::app::messages::ItemMessage;
use crate::app::pace::Meter;
use crate::app::state::AppState;
use crate::app::tracking::retention::record_may_appear;
use crate::app::tracking::ScanState;
use crate::storage::blob::{BlobStore, BlobWrite, Downloaded, WriteCondition};
use crate::storage::stores::Stores;
use crate::storage::{StorageError, StorageErrorKind};

use super::{prune, IndexOptions};

/// Most segments one build may have (its manifest stays under a few MiB).
pub const MAX_SEGMENTS: usize = 20_000;

fn json<T: Serialize>(value: &T) -> Bytes {
    Bytes::from(serde_json::to_vec(value).expect("serializes"))
}

/// The blob, or `None` if it does not exist.
async fn read<B: BlobStore>(
    blobs: &B,
    container: &str,
    name: &str,
) -> Result<Option<Downloaded>, StorageError> {
    match blobs.download(container, name, MAX_POINTER_BYTES).await {
        Ok(found) => Ok(Some(found)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Reserves the prefix for build `scan_id` (see the module documentation).
pub async fn reserve<S: Stores, B: BlobStore>(
    state: &AppState<S>,
    blobs: &B,
    options: &IndexOptions,
    layout: &IndexLayout,
    scan_id: &str,
) -> Result<(), ApiError> {
    let (container, name) = (&options.container, layout.reservation());
    let refuse = |why: String| {
        ApiError::field(
            "destinationPrefix",
            format!(
                "{container}/{name}: {why}; try again once it has ended, or choose another prefix"
            ),
        )
    };
    let body = json(&Reservation {
        format: POINTER_FORMAT.to_string(),
        scan_id: scan_id.to_string(),
        reserved_at: state.clock.now(),
    });
    let create = BlobWrite::new(JSON_CONTENT_TYPE).with_condition(WriteCondition::IfNotExists);
    match blobs.upload(container, &name, body.clone(), &create).await {
        Ok(_) => return Ok(()),
        Err(e) if e.kind == StorageErrorKind::Conflict => {}
        Err(e) => return Err(e.into()),
    }
    let Some(held) = read(blobs, container, &name).await? else {
        return Err(refuse("was released meanwhile".into()));
    };
    let holder = serde_json::from_slice::<Reservation>(&held.bytes)
        .map_err(|e| refuse(format!("is unreadable ({e})")))?
        .scan_id;
    if holder == scan_id {
        return Ok(());
    }
    let tracker = state.tracker_on(state.bookkeeping());
    match tracker.get_scan(&holder).await?.map(|r| r.state) {
        Some(ScanState::Running) => {
            return Err(refuse(format!("index build {holder} is running")));
        }
        None if record_may_appear(&holder, tracker.now()) => {
            return Err(refuse(format!("index build {holder} is starting")));
        }
        _ => {}
    }
    let take_over = BlobWrite::new(JSON_CONTENT_TYPE)
        .with_condition(WriteCondition::IfMatch(held.properties.etag));
    match blobs.upload(container, &name, body, &take_over).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind == StorageErrorKind::PreconditionFailed => {
            // Ours if it names this build: the adapter retried a takeover whose answer was lost.
            let now = read(blobs, container, &name).await?;
            let named = now.and_then(|b| serde_json::from_slice::<Reservation>(&b.bytes).ok());
            if named.is_some_and(|r| r.scan_id == scan_id) {
                return Ok(());
            }
            Err(refuse(format!(
                "another build took the prefix over from build {holder} first"
            )))
        }
        Err(e) => Err(e.into()),
    }
}

/// Phase 2's item: [`publish`], then the first page of the cleanup (`prune`; further pages are
/// its children).
pub async fn publish_item<S: Stores>(
    state: &AppState<S>,
    begun: &Begun<ItemMessage>,
) -> Result<WorkOutcome, WorkError> {
    publish(state, &begun.scan, &begun.requests, None).await?;
    Ok(prune::cleanup(state, begun, None).await)
}

/// Whether `<prefix>index.json` names this build (one read): it was published.
pub async fn is_published<S: Stores>(
    state: &AppState<S>,
    context: &ScanContext,
    requests: &Arc<Meter>,
) -> Result<bool, WorkError> {
    let options: IndexOptions = context.options()?;
    let blobs = state.blob_store(&options.connection, requests)?;
    let pointer = read(&blobs, &options.container, &options.layout()?.pointer()).await?;
    let named = pointer.and_then(|found| serde_json::from_slice::<Pointer>(&found.bytes).ok());
    Ok(named.is_some_and(|p| p.build == context.scan_id))
}

/// The switch (see the module documentation); its blob requests count in `requests` (the
/// item's). `known`: the build's segments, when the caller built them all (a small build's
/// assembly item); else they are read from the segment items' results.
pub async fn publish<S: Stores>(
    state: &AppState<S>,
    context: &ScanContext,
    requests: &Arc<Meter>,
    known: Option<&[SegmentEntry]>,
) -> Result<(), WorkError> {
    let options: IndexOptions = context.options()?;
    let layout = options.layout()?;
    let blobs = state.blob_store(&options.connection, requests)?;
    let container = &options.container;
    let scan_id = &context.scan_id;
    let reservation = layout.reservation();
    let holder = match read(&blobs, container, &reservation).await? {
        Some(found) => serde_json::from_slice::<Reservation>(&found.bytes)
            .map(|r| r.scan_id)
            .unwrap_or_default(),
        None => String::new(),
    };
    if &holder != scan_id {
        return Err(WorkError::Permanent(format!(
            "{container}/{reservation} does not name this build (it names {holder:?}): the prefix is not this build's, so it switches no index"
        )));
    }
    let pointer_name = layout.pointer();
    let current = read(&blobs, container, &pointer_name).await?;
    let manifest_name = IndexLayout::manifest_name(scan_id);
    let previous = current
        .as_ref()
        .and_then(|found| serde_json::from_slice::<Pointer>(&found.bytes).ok());
    if previous.as_ref().is_some_and(|p| &p.build == scan_id) {
        return Ok(());
    }
    write_manifest(state, &blobs, context, &options, &layout, known).await?;
    let switched_at = state.clock.now();
    let pointer = json(&Pointer {
        format: POINTER_FORMAT.to_string(),
        build: scan_id.clone(),
        manifest: manifest_name,
        switched_at,
        superseded: superseded_after(previous, switched_at),
    });
    let condition = match current {
        Some(found) => WriteCondition::IfMatch(found.properties.etag),
        None => WriteCondition::IfNotExists,
    };
    let write = BlobWrite::new(JSON_CONTENT_TYPE).with_condition(condition);
    match blobs
        .upload(container, &pointer_name, pointer, &write)
        .await
    {
        Ok(_) => Ok(()),
        // A concurrent run of this step switched it first (the next run finds it done).
        Err(e)
            if matches!(
                e.kind,
                StorageErrorKind::Conflict | StorageErrorKind::PreconditionFailed
            ) =>
        {
            Err(WorkError::Storage(StorageError::new(
                StorageErrorKind::Transient,
                format!("{container}/{pointer_name} changed while it was switched; trying again"),
            )))
        }
        Err(e) => Err(e.into()),
    }
}

/// The builds the new pointer remembers: the one it replaces (superseded `now`), then those the
/// replaced pointer remembered, at most [`MAX_SUPERSEDED`].
pub fn superseded_after(previous: Option<Pointer>, now: OffsetDateTime) -> Vec<Superseded> {
    let Some(previous) = previous else {
        return Vec::new();
    };
    let mut list = vec![Superseded {
        build: previous.build,
        at: now,
    }];
    list.extend(previous.superseded);
    list.truncate(MAX_SUPERSEDED);
    list
}

/// Writes the build's manifest from its segment items' results (once: a rerun finds it).
async fn write_manifest<S: Stores, B: BlobStore>(
    state: &AppState<S>,
    blobs: &B,
    context: &ScanContext,
    options: &IndexOptions,
    layout: &IndexLayout,
    known: Option<&[SegmentEntry]>,
) -> Result<(), WorkError> {
    let mut segments = match known {
        Some(known) => known.to_vec(),
        None => segment_results(state, context).await?,
    };
    segments.sort_by(|a, b| a.name.cmp(&b.name));
    segments.dedup_by(|a, b| a.name == b.name);
    let manifest = IndexManifest {
        format: MANIFEST_FORMAT.to_string(),
        scan_id: context.scan_id.clone(),
        property: options.property.clone(),
        source_table: context.source.table.clone(),
        source_connection: context.source.connection.clone(),
        rows: segments.iter().map(|s| s.rows).sum(),
        ranges: segments.iter().map(|s| s.ranges).sum(),
        segments,
        started_at: options.started_at,
        built_at: state.clock.now(),
    };
    let write = BlobWrite::new(JSON_CONTENT_TYPE).with_condition(WriteCondition::IfNotExists);
    let name = layout.blob(&IndexLayout::manifest_name(&context.scan_id));
    match blobs
        .upload(&options.container, &name, json(&manifest), &write)
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind == StorageErrorKind::Conflict => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The segment items' descriptors, from their results.
async fn segment_results<S: Stores>(
    state: &AppState<S>,
    context: &ScanContext,
) -> Result<Vec<SegmentEntry>, WorkError> {
    let tracker = state.tracker_on(state.bookkeeping());
    let results = tracker
        .work_results(&context.scan_id, context.shards, MAX_SEGMENTS + 1)
        .await?;
    if results.len() > MAX_SEGMENTS {
        return Err(WorkError::Permanent(format!(
            "the index has more than {MAX_SEGMENTS} segments; index the table as several key ranges"
        )));
    }
    let mut segments = Vec::with_capacity(results.len());
    for result in &results {
        let entry: SegmentEntry = serde_json::from_str(result).map_err(|e| {
            WorkError::Permanent(format!("a segment descriptor is unreadable: {e}"))
        })?;
        segments.push(entry);
    }
    Ok(segments)
}
