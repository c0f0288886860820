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
//! - An export never overwrites another: a prefix that already holds a manifest is refused at
//!   start (400 naming `destinationPrefix`). Its own manifest is written once (`If-None-Match:
//!   *`): a completion step run again leaves it as it is.
//!
//! [`MAX_ITEM_ROWS`]: crate::app::job::MAX_ITEM_ROWS

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use bytes::Bytes;
use futures::future::try_join_all;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::app::config::Config;
use crate::app::error::ApiError;
use crate::app::job::request::default_connection;
use crate::app::job::{
    Begun, Driver, RangeWork, ScanContext, ScanRequest, Segment, Setup, WorkError, WorkOutcome,
    WorkSplit,
};
use crate::app::messages::ItemMessage;
use crate::app::state::AppState;
use crate::storage::blob::{BlobStore, BlobWrite, WriteCondition, MAX_LIST_RESULTS};
use crate::storage::export_format::{
    part_name, ExportLayout, Manifest, ManifestPart, PartEncoder, MANIFEST_CONTENT_TYPE,
    MAX_MANIFEST_BYTES, PART_CONTENT_TYPE,
};
use crate::storage::{Entity, QueueStore, StorageError, StorageErrorKind, TableStore};

use super::kit::range::{begin_range_item, page_items, unaddressable_error};
use super::kit::{check_blob_connection, check_container_field, drop_nulls};

/// A part is closed and a new one started past this many bytes before compression, so that
/// one upload stays well within one request (`blob::MAX_REQUEST_BODY_BYTES`) and a part within
/// what a reader inflates (`export_format::MAX_PART_DECOMPRESSED_BYTES`).
pub const PART_SPLIT_BYTES: u64 = 48 * 1024 * 1024;
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
            started_at: OffsetDateTime::now_utc(),
        };
        Setup {
            options: Some(options),
            ..Setup::default()
        }
    }

    async fn prepare<T: TableStore + Clone, Q: QueueStore + Clone>(
        state: &AppState<T, Q>,
        context: &mut ScanContext,
    ) -> Result<(), ApiError> {
        let options: ExportOptions = context
            .options()
            .map_err(|e| ApiError::field("body", e.to_string()))?;
        let layout = options
            .layout()
            .map_err(|e| ApiError::field("destinationPrefix", e.to_string()))?;
        let blobs = state.blob_store(&options.connection, &Arc::new(AtomicU64::new(0)))?;
        let manifest = layout.manifest_blob();
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
        blobs.create_container(&options.container).await?;
        Ok(())
    }

    fn segment(_: &ScanContext, rows: &[Entity]) -> Segment<RangeWork> {
        Segment {
            items: page_items(WorkSplit::Page, rows),
            ..Segment::default()
        }
    }

    async fn run<T: TableStore + Clone, Q: QueueStore + Clone>(
        state: &AppState<T, Q>,
        begun: &Begun<ItemMessage>,
        item: RangeWork,
    ) -> Result<WorkOutcome, WorkError> {
        let scan = &*begun.scan;
        let options: ExportOptions = scan.options()?;
        let layout = options.layout()?;
        let blobs = state.blob_store(&options.connection, &begun.requests)?;
        let (_, mut read, mut outcome) =
            begin_range_item::<Self, T, Q>(state, begun, &item, scan.select.clone()).await?;
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

    async fn complete<T: TableStore + Clone, Q: QueueStore + Clone>(
        state: &AppState<T, Q>,
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
    let permanent = |e: crate::storage::export_format::ExportFormatError| {
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
async fn write_manifest<T: TableStore + Clone, Q: QueueStore + Clone>(
    state: &AppState<T, Q>,
    context: &ScanContext,
) -> Result<(), WorkError> {
    let options: ExportOptions = context.options()?;
    let layout = options.layout()?;
    let requests = Arc::new(AtomicU64::new(0));
    let blobs = state.blob_store(&options.connection, &requests)?;
    let manifest_blob = layout.manifest_blob();
    if blobs
        .properties(&options.container, &manifest_blob)
        .await?
        .is_some()
    {
        return Ok(());
    }
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
        OffsetDateTime::now_utc(),
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
        // A concurrent run of this step wrote it first: its manifest is the export's.
        Err(e) if e.kind == StorageErrorKind::Conflict => Ok(()),
        other => other.map(|_| ()).map_err(WorkError::from),
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
