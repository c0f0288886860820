//! The export driver (`"driver": "export"`): backs a table (its key range, its `filter`'s rows,
//! its `select`'s columns) up to Blob Storage in the `tablescan-export/1` format
//! (docs/export-format.md). Every scanned key range (up to 2,000 rows) becomes one [`RangeWork`] item; an item re-reads
//! its range (bounded like every range item) and writes its rows as one part blob,
//! `<prefix>parts/<scan id>/<work item id>.jsonl.gz`. Once every item has finished, the
//! completion step writes `<prefix>manifest.json` listing the parts.
//!
//! Invariants:
//! - **Deterministic names.** A part is named after its scan and work item only, so a
//!   redelivered item rewrites the same blob; it never adds a part.
//! - **The manifest counts what the committing execution wrote.** An item's part descriptors
//!   (name, rows, bytes, SHA-256) are its driver result, kept on its finished work row in the
//!   transaction that completes it (`Tracker::complete`), so exactly one execution's parts are
//!   counted per item, and `rowsWritten` is the manifest's `rows`. The completion step reads
//!   the descriptors back and checks each against the blob listing (name and size): a part
//!   rewritten by a concurrent duplicate execution that read different rows (the table changed
//!   in between) fails the export naming the part, instead of giving a manifest that lies.
//! - **Bounded.** An item writes at most [`MAX_ITEM_ROWS`] rows, in parts of at most
//!   [`PART_SPLIT_BYTES`] before compression (one blob request each); the completion step reads
//!   at most [`MAX_EXPORT_PARTS`] descriptors (one query per 1,000, one listing per 5,000).
//! - **One export per prefix.** At start the export reserves its prefix: it creates
//!   `<prefix>reservation.json` naming its scan id with `If-None-Match: *`, so of two exports
//!   started into one prefix exactly one wins; the other is refused (400 naming
//!   `destinationPrefix`), as is a prefix that already holds a manifest. A reservation whose
//!   export failed or was cancelled is taken over with `If-Match: <its ETag>` (again one winner).
//! - **A completed export's manifest is its own.** The completion step checks that the
//!   reservation still names its scan before writing the manifest, writes it once
//!   (`If-None-Match: *`), and when it finds one there (a completion step run again, or any
//!   other writer) reads its `scanId`: a manifest of another scan fails the export instead of
//!   completing it. So a completion step run again leaves the manifest as it is.
//!
//! [`MAX_ITEM_ROWS`]: crate::app::job::MAX_ITEM_ROWS

use crate::app::pace::Meter;
use std::collections::HashMap;

use bytes::Bytes;
use futures::future::try_join_all;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::app::config::Config;
use crate::app::error::ApiError;
use crate::app::export_format::{
    part_name, ExportLayout, Manifest, ManifestPart, PartEncoder, MANIFEST_CONTENT_TYPE,
    MAX_MANIFEST_BYTES, PART_CONTENT_TYPE, PART_SPLIT_BYTES,
};
use crate::app::job::request::default_connection;
use crate::app::job::{
    Begun, Driver, RangeWork, ScanContext, ScanRequest, Segment, Setup, WorkError, WorkOutcome,
    WorkSplit,
};
use crate::app::messages::ItemMessage;
use crate::app::state::AppState;
use crate::app::tracking::retention::record_may_appear;
use crate::app::tracking::ScanState;
use crate::storage::blob::{BlobStore, BlobWrite, WriteCondition, MAX_LIST_RESULTS};
use crate::storage::stores::Stores;
use crate::storage::{Entity, StorageError, StorageErrorKind};

use super::kit::range::{begin_range_item, page_items, unaddressable_error};
use super::kit::{check_blob_connection, check_container_field, drop_nulls};

/// Most parts one export may have: its manifest stays under `MAX_MANIFEST_BYTES` (about 200
/// bytes per part) and its completion step within seconds. At least 250 million rows (a part
/// holds up to 2,000); export a bigger table as several key ranges.
pub const MAX_EXPORT_PARTS: usize = 250_000;

pub struct ExportDriver;

/// The export driver's request fields.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExportFields {
    /// The container the export is written to (created if missing).
    pub destination_container: String,
    /// A "folder" in the container: the manifest is `<prefix>/manifest.json`.
    #[serde(default)]
    pub destination_prefix: String,
    /// App-setting name of the connection whose blob service is written.
    #[serde(default = "default_connection")]
    pub destination_connection: String,
}

/// What an export scan records (its `ScanContext::options`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExportOptions {
    pub connection: String,
    pub container: String,
    /// As requested; normalized by `ExportLayout`.
    pub prefix: String,
    /// When the scan's storage was prepared, on the app's clock (`Driver::prepare`).
    #[serde(with = "time::serde::rfc3339")]
    pub started_at: OffsetDateTime,
}

impl ExportOptions {
    fn layout(&self) -> Result<ExportLayout, WorkError> {
        ExportLayout::new(&self.prefix).map_err(|e| WorkError::Permanent(e.to_string()))
    }
}

impl Driver for ExportDriver {
    const NAME: &'static str = "export";
    const FILTER: bool = true;
    const SELECT: bool = true;
    const COMPLETES: bool = true;
    type Fields = ExportFields;
    type Options = ExportOptions;
    type Item = RangeWork;

    fn validate(fields: &ExportFields, _: &ScanRequest, config: &Config) -> Result<(), ApiError> {
        check_container_field("destinationContainer", &fields.destination_container)?;
        ExportLayout::new(&fields.destination_prefix)
            .map_err(|e| ApiError::field("destinationPrefix", e.to_string()))?;
        check_blob_connection(
            config,
            "destinationConnection",
            &fields.destination_connection,
        )
    }

    fn setup(fields: &ExportFields, _: &ScanRequest) -> Setup<ExportOptions> {
        let options = ExportOptions {
            connection: fields.destination_connection.clone(),
            container: fields.destination_container.clone(),
            prefix: fields.destination_prefix.clone(),
            // The app's clock is not at hand here: `prepare` sets it.
            started_at: OffsetDateTime::UNIX_EPOCH,
        };
        Setup {
            options: Some(options),
            ..Setup::default()
        }
    }

    async fn prepare<S: Stores>(
        state: &AppState<S>,
        context: &mut ScanContext,
    ) -> Result<(), ApiError> {
        let mut options: ExportOptions = context
            .options()
            .map_err(|e| ApiError::field("body", e.to_string()))?;
        options.started_at = state.clock.now();
        context.set_options(&options);
        let layout = options
            .layout()
            .map_err(|e| ApiError::field("destinationPrefix", e.to_string()))?;
        let blobs = state.blob_store(&options.connection, &Meter::new())?;
        let manifest = layout.manifest_blob();
        blobs.create_container(&options.container).await?;
        if blobs
            .properties(&options.container, &manifest)
            .await?
            .is_some()
        {
            return Err(ApiError::field(
                "destinationPrefix",
                format!(
                    "{}/{manifest} already exists: this prefix holds an export; choose another prefix",
                    options.container
                ),
            ));
        }
        reserve(state, &blobs, &options, &layout, &context.scan_id).await
    }

    fn segment(_: &ScanContext, rows: &[Entity]) -> Segment<RangeWork> {
        Segment {
            items: page_items(WorkSplit::Page, rows),
            ..Segment::default()
        }
    }

    async fn run<S: Stores>(
        state: &AppState<S>,
        begun: &Begun<ItemMessage>,
        item: RangeWork,
    ) -> Result<WorkOutcome, WorkError> {
        let scan = &*begun.scan;
        let options: ExportOptions = scan.options()?;
        let layout = options.layout()?;
        let blobs = state.blob_store(&options.connection, &begun.requests)?;
        let (_, mut read, mut outcome) =
            begin_range_item::<Self, S>(state, begun, &item, scan.select.clone()).await?;
        if scan.select.is_some() {
            read.rows.iter_mut().for_each(drop_nulls);
        }
        let parts = encode_parts(&scan.scan_id, &begun.work_id, &read.rows)?;
        let write = BlobWrite::new(PART_CONTENT_TYPE);
        try_join_all(parts.iter().map(|(part, bytes)| {
            let name = layout.blob(&part.name);
            let (blobs, write, container) = (&blobs, &write, &options.container);
            async move { blobs.upload(container, &name, bytes.clone(), write).await }
        }))
        .await?;
        if let Some(e) = unaddressable_error("exported", &read.unaddressable) {
            return Err(e);
        }
        outcome.delta.rows_written = read.rows.len() as i64;
        if !parts.is_empty() {
            let descriptors: Vec<&ManifestPart> = parts.iter().map(|(p, _)| p).collect();
            outcome.result = Some(serde_json::to_string(&descriptors).expect("parts serialize"));
        }
        Ok(outcome)
    }

    async fn complete<S: Stores>(
        state: &AppState<S>,
        context: &ScanContext,
    ) -> Result<(), WorkError> {
        write_manifest(state, context).await
    }
}

/// The item's rows as parts (none for no rows): the first named after the item, any further
/// one (past [`PART_SPLIT_BYTES`]) after the item and its number.
fn encode_parts(
    scan_id: &str,
    work_id: &str,
    rows: &[Entity],
) -> Result<Vec<(ManifestPart, Bytes)>, WorkError> {
    let permanent = |e: crate::app::export_format::ExportFormatError| {
        WorkError::Permanent(format!("exporting {work_id}: {e}"))
    };
    let mut parts = Vec::new();
    let mut encoder = PartEncoder::new();
    let close = |encoder: PartEncoder, parts: &mut Vec<(ManifestPart, Bytes)>| {
        let id = match parts.len() {
            0 => work_id.to_string(),
            n => format!("{work_id}-{n}"),
        };
        let encoded = encoder.finish();
        let part = ManifestPart {
            name: part_name(scan_id, &id).map_err(permanent)?,
            rows: encoded.rows,
            bytes: encoded.bytes.len() as u64,
            sha256: encoded.sha256,
        };
        parts.push((part, encoded.bytes));
        Ok::<(), WorkError>(())
    };
    for row in rows {
        if encoder.decompressed_bytes() >= PART_SPLIT_BYTES {
            close(std::mem::take(&mut encoder), &mut parts)?;
        }
        encoder.push(row).map_err(permanent)?;
    }
    if encoder.rows() > 0 {
        close(encoder, &mut parts)?;
    }
    Ok(parts)
}

/// The completion step: reads every item's part descriptors, checks them against the blobs
/// listed under the scan's parts folder, and writes the manifest — once: the step may run
/// again (a late duplicate delivery, a status read), and then finds the manifest there (the
/// prefix held none when the export started) and leaves it, so its bytes never change.
async fn write_manifest<S: Stores>(
    state: &AppState<S>,
    context: &ScanContext,
) -> Result<(), WorkError> {
    let options: ExportOptions = context.options()?;
    let layout = options.layout()?;
    let requests = Meter::new();
    if let Some(pacer) = state.pacer_for(context) {
        requests.pace_by(pacer);
    }
    let blobs = state.blob_store(&options.connection, &requests)?;
    let manifest_blob = layout.manifest_blob();
    if blobs
        .properties(&options.container, &manifest_blob)
        .await?
        .is_some()
    {
        return check_own_manifest(&blobs, &options.container, &manifest_blob, context).await;
    }
    check_own_reservation(&blobs, &options.container, &layout, &context.scan_id).await?;
    let tracker = state.tracker_on(state.bookkeeping());
    let results = tracker
        .work_results(&context.scan_id, context.shards, MAX_EXPORT_PARTS)
        .await?;
    let mut parts: Vec<ManifestPart> = Vec::with_capacity(results.len());
    for result in &results {
        let listed: Vec<ManifestPart> = serde_json::from_str(result).map_err(|e| {
            WorkError::Permanent(format!("an export part record is unreadable: {e}"))
        })?;
        parts.extend(listed);
    }
    if parts.len() > MAX_EXPORT_PARTS {
        return Err(WorkError::Permanent(format!(
            "the export has more than {MAX_EXPORT_PARTS} parts; export the table as several key ranges"
        )));
    }
    let folder = layout.blob(&format!("parts/{}/", context.scan_id));
    let sizes = listed_sizes(&blobs, &options.container, &folder, parts.len()).await?;
    for part in &parts {
        let blob = layout.blob(&part.name);
        match sizes.get(&blob) {
            Some(&size) if size == part.bytes => {}
            found => {
                return Err(WorkError::Permanent(format!(
                    "part {blob} is {} but its work item wrote {} bytes: it was rewritten by a concurrent duplicate delivery that read different rows (was the table written during the export?); run the export again",
                    found.map_or("missing".to_string(), |s| format!("{s} bytes")),
                    part.bytes
                )))
            }
        }
    }
    let manifest = Manifest::new(
        &context.source.table,
        &context.scan_id,
        parts,
        options.started_at,
        state.clock.now(),
    );
    let json = manifest.to_json();
    if json.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(WorkError::Permanent(format!(
            "the manifest would be {} bytes, over the {MAX_MANIFEST_BYTES}-byte bound readers accept; export the table as several key ranges",
            json.len()
        )));
    }
    let write = BlobWrite::new(MANIFEST_CONTENT_TYPE).with_condition(WriteCondition::IfNotExists);
    match blobs
        .upload(
            &options.container,
            &manifest_blob,
            Bytes::from(json),
            &write,
        )
        .await
    {
        // Written first by a concurrent run of this step (then it is the export's), or by
        // anything else (then the export fails).
        Err(e) if e.kind == StorageErrorKind::Conflict => {
            check_own_manifest(&blobs, &options.container, &manifest_blob, context).await
        }
        other => other.map(|_| ()).map_err(WorkError::from),
    }
}

/// The blob that reserves a prefix for one export, relative to the prefix.
pub const RESERVATION_NAME: &str = "reservation.json";
/// Largest reservation blob read back (ours are about 150 bytes).
const MAX_RESERVATION_BYTES: u64 = 64 * 1024;

/// `<prefix>reservation.json`: which export holds the prefix (docs/export-format.md).
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Reservation {
    format: String,
    scan_id: String,
    #[serde(with = "time::serde::rfc3339")]
    reserved_at: OffsetDateTime,
}

/// Only what is checked of a blob that names its export: its `scanId` (a manifest's or a
/// reservation's; any other field is ignored).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ScanIdOnly {
    scan_id: String,
}

/// Reserves the prefix for scan `scan_id` (see the module's invariants): creates the
/// reservation if there is none, takes over one whose export failed or was cancelled, and
/// refuses the prefix otherwise (400 naming `destinationPrefix`).
async fn reserve<S: Stores, B: BlobStore>(
    state: &AppState<S>,
    blobs: &B,
    options: &ExportOptions,
    layout: &ExportLayout,
    scan_id: &str,
) -> Result<(), ApiError> {
    let container = &options.container;
    let name = layout.blob(RESERVATION_NAME);
    let refuse = |why: String| {
        ApiError::field(
            "destinationPrefix",
            format!("{container}/{name}: {why}; choose another prefix"),
        )
    };
    let body = Bytes::from(
        serde_json::to_vec(&Reservation {
            format: crate::app::export_format::FORMAT.to_string(),
            scan_id: scan_id.to_string(),
            reserved_at: state.clock.now(),
        })
        .expect("a reservation serializes"),
    );
    let create = BlobWrite::new(MANIFEST_CONTENT_TYPE).with_condition(WriteCondition::IfNotExists);
    match blobs.upload(container, &name, body.clone(), &create).await {
        Ok(_) => return Ok(()),
        Err(e) if e.kind == StorageErrorKind::Conflict => {}
        Err(e) => return Err(e.into()),
    }
    let held = match blobs
        .download(container, &name, MAX_RESERVATION_BYTES)
        .await
    {
        Ok(held) => held,
        Err(e) if e.is_not_found() => {
            return Err(refuse(
                "was reserved and released meanwhile; try again".into(),
            ))
        }
        Err(e) => return Err(e.into()),
    };
    let holder = serde_json::from_slice::<ScanIdOnly>(&held.bytes)
        .map_err(|e| {
            refuse(format!(
                "the prefix is reserved, by an unreadable reservation ({e})"
            ))
        })?
        .scan_id;
    if holder == scan_id {
        // This start's own reservation: an earlier attempt of the create succeeded but its
        // answer was lost (the adapter retried it).
        return Ok(());
    }
    let tracker = state.tracker_on(state.bookkeeping());
    match tracker.get_scan(&holder).await?.map(|r| r.state) {
        Some(ScanState::Failed | ScanState::Cancelled) => {}
        // A start that reserved and then failed before recording its scan: its record can no
        // longer appear (a start runs within one request), so the prefix is free.
        None if !record_may_appear(&holder, tracker.now()) => {}
        Some(held_state) => {
            return Err(refuse(format!(
                "the prefix is reserved by export {holder}, which is {}",
                held_state.as_str()
            )))
        }
        None => {
            return Err(refuse(format!(
                "the prefix is reserved by scan {holder}, which is still starting (if its start \
                 failed, the prefix is free 15 minutes after it began)"
            )))
        }
    }
    // Its export ended without a manifest: take the prefix over, if nobody else does first.
    let take_over = BlobWrite::new(MANIFEST_CONTENT_TYPE)
        .with_condition(WriteCondition::IfMatch(held.properties.etag));
    match blobs.upload(container, &name, body, &take_over).await {
        Ok(_) => Ok(()),
        // Ours if it names this start: the adapter retried a takeover whose answer was lost.
        Err(e) if e.kind == StorageErrorKind::PreconditionFailed => {
            let now = match blobs
                .download(container, &name, MAX_RESERVATION_BYTES)
                .await
            {
                Ok(held) => Some(held.bytes),
                Err(e) if e.is_not_found() => None,
                Err(e) => return Err(e.into()),
            };
            let named = now.and_then(|b| serde_json::from_slice::<ScanIdOnly>(&b).ok());
            if named.is_some_and(|r| r.scan_id == scan_id) {
                return Ok(());
            }
            Err(refuse(format!(
                "another export took over the reservation of export {holder} first"
            )))
        }
        Err(e) => Err(e.into()),
    }
}

/// The scan id a blob of this export names (its reservation or its manifest); `Ok(None)` if
/// the blob does not exist.
async fn named_scan<B: BlobStore>(
    blobs: &B,
    container: &str,
    name: &str,
    max_bytes: u64,
) -> Result<Option<String>, WorkError> {
    let bytes = match blobs.download(container, name, max_bytes).await {
        Ok(found) => found.bytes,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    serde_json::from_slice::<ScanIdOnly>(&bytes)
        .map(|named| Some(named.scan_id))
        .map_err(|e| WorkError::Permanent(format!("{container}/{name} is unreadable: {e}")))
}

/// `Ok` if the prefix's reservation names this scan: another export took it over (this one
/// was recorded as ended meanwhile) or it was deleted, and this export must not write the
/// prefix's manifest.
async fn check_own_reservation<B: BlobStore>(
    blobs: &B,
    container: &str,
    layout: &ExportLayout,
    scan_id: &str,
) -> Result<(), WorkError> {
    let name = layout.blob(RESERVATION_NAME);
    match named_scan(blobs, container, &name, MAX_RESERVATION_BYTES).await? {
        Some(holder) if holder == scan_id => Ok(()),
        holder => Err(WorkError::Permanent(format!(
            "{container}/{name} {}: the prefix is not this export's, so it writes no manifest",
            holder.map_or("is missing".to_string(), |h| format!("names export {h}"))
        ))),
    }
}

/// `Ok` if the manifest there was written by this scan; otherwise the export fails rather than
/// complete with a manifest that is not its own.
async fn check_own_manifest<B: BlobStore>(
    blobs: &B,
    container: &str,
    manifest: &str,
    context: &ScanContext,
) -> Result<(), WorkError> {
    match named_scan(blobs, container, manifest, MAX_MANIFEST_BYTES).await? {
        Some(writer) if writer == context.scan_id => Ok(()),
        writer => Err(WorkError::Permanent(format!(
            "{container}/{manifest} {}, not by this one: this export has no manifest",
            writer.map_or("vanished".to_string(), |w| format!(
                "was written by export {w}"
            ))
        ))),
    }
}

/// The sizes of the blobs under `folder`, by name: at most `expected` + one page of them.
async fn listed_sizes<B: BlobStore>(
    blobs: &B,
    container: &str,
    folder: &str,
    expected: usize,
) -> Result<HashMap<String, u64>, StorageError> {
    let mut sizes = HashMap::with_capacity(expected);
    let mut marker: Option<String> = None;
    // Bounded: stops once more blobs than expected have been listed.
    loop {
        let page = blobs
            .list(container, folder, MAX_LIST_RESULTS, marker.as_deref())
            .await?;
        sizes.extend(page.blobs.into_iter().map(|b| (b.name, b.size)));
        match page.next_marker {
            Some(next) if sizes.len() <= expected => marker = Some(next),
            _ => return Ok(sizes),
        }
    }
}
