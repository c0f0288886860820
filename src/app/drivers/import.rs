//! The import driver (`"driver": "import"`): restores an export (docs/export-format.md) into
//! `destinationTable`, in parallel, one work item per part. It scans no table: its root item
//! reads the manifest and fans the parts out in chunks ([`PARTS_PER_ITEM`] part items and the
//! next chunk item each); a part item downloads its part, verifies its SHA-256 and row count
//! against the manifest **before writing anything** (a mismatch fails the scan naming the
//! part), and upserts its rows in same-partition entity group transactions, every value passed
//! through as the JSON text the export holds.
//!
//! Invariants:
//! - One manifest per import, the one checked at start: its SHA-256 is recorded with the scan
//!   and carried by every chunk item, and a chunk item that finds other bytes fails the scan
//!   instead of restoring another export or mixing two.
//! - Bounded: a chunk item queues at most [`PARTS_PER_ITEM`] items; a part item writes at most
//!   [`MAX_ITEM_ROWS`] rows (a longer part, written by another tool, is continued by a child
//!   item that skips the rows already written) and inflates at most what the format allows.
//! - Idempotent: upserts (replace) of the same rows, so a redelivered item rewrites them.
//!
//! [`MAX_ITEM_ROWS`]: crate::app::job::MAX_ITEM_ROWS

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use futures::stream::{self, StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};

use crate::app::config::Config;
use crate::app::error::ApiError;
use crate::app::job::request::{check_destination, default_connection};
use crate::app::job::{
    item_child, Begun, Driver, ScanContext, ScanRequest, Segment, Setup, TableRef, WorkError,
    WorkOutcome, MAX_ITEM_ROWS,
};
use crate::app::messages::{ChildSpec, ItemMessage};
use crate::app::state::AppState;
use crate::storage::blob::BlobStore;
use crate::storage::export_format::{
    decode_part, sha256_hex, DecodeLimits, ExportLayout, Manifest, MAX_MANIFEST_BYTES,
    MAX_PART_DECOMPRESSED_BYTES,
};
use crate::storage::{Entity, QueueStore, TableStore};

use super::kit::range::batches;
use super::kit::{check_blob_connection, check_container_field};

/// Most part items one chunk item queues (with the next chunk item).
pub const PARTS_PER_ITEM: usize = 200;

pub struct ImportDriver;

/// The import driver's request fields (the export's account is `sourceConnection`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImportFields {
    pub source_container: String,
    /// The export's prefix: its manifest is `<prefix>/manifest.json`.
    #[serde(default)]
    pub source_prefix: String,
    /// Created if missing; rows are upserted (replace).
    pub destination_table: String,
    #[serde(default = "default_connection")]
    pub destination_connection: String,
}

/// What an import scan records (its `ScanContext::options`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImportOptions {
    pub container: String,
    pub prefix: String,
    /// The SHA-256 of the manifest `prepare` checked: every chunk item must find these bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_sha256: Option<String>,
}

/// One unit of an import.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum ImportWork {
    /// Parts `start..` of the manifest (in its order): queues up to [`PARTS_PER_ITEM`] part
    /// items and the next chunk. `sha256`: the manifest's digest when the import started
    /// (`None` only in items of scans started before it was recorded: the root pins its read).
    Parts {
        start: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sha256: Option<String>,
    },
    /// One part, as the manifest lists it; its rows from `skip` on.
    Part {
        name: String,
        rows: u64,
        bytes: u64,
        sha256: String,
        #[serde(default, skip_serializing_if = "is_zero")]
        skip: u64,
    },
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl ImportOptions {
    fn layout(&self) -> Result<ExportLayout, WorkError> {
        ExportLayout::new(&self.prefix).map_err(|e| WorkError::Permanent(e.to_string()))
    }
}

impl Driver for ImportDriver {
    const NAME: &'static str = "import";
    const SCANS_TABLE: bool = false;
    type Fields = ImportFields;
    type Options = ImportOptions;
    type Item = ImportWork;

    fn validate(
        fields: &ImportFields,
        request: &ScanRequest,
        config: &Config,
    ) -> Result<(), ApiError> {
        check_container_field("sourceContainer", &fields.source_container)?;
        ExportLayout::new(&fields.source_prefix)
            .map_err(|e| ApiError::field("sourcePrefix", e.to_string()))?;
        check_blob_connection(config, "sourceConnection", &request.source_connection)?;
        check_destination(
            config,
            &fields.destination_connection,
            &fields.destination_table,
        )
    }

    fn setup(fields: &ImportFields, _: &ScanRequest) -> Setup<ImportOptions> {
        let options = ImportOptions {
            container: fields.source_container.clone(),
            prefix: fields.source_prefix.clone(),
            manifest_sha256: None,
        };
        Setup {
            destination: Some(TableRef {
                connection: fields.destination_connection.clone(),
                table: fields.destination_table.clone(),
            }),
            options: Some(options),
            ..Setup::default()
        }
    }

    /// Reads and checks the manifest (a 4xx naming `sourcePrefix` if there is none or it is
    /// not an export's), records its SHA-256, then creates the destination table.
    async fn prepare<T: TableStore + Clone, Q: QueueStore + Clone>(
        state: &AppState<T, Q>,
        context: &mut ScanContext,
    ) -> Result<(), ApiError> {
        let requests = Arc::new(AtomicU64::new(0));
        let (_, sha256) = read_manifest(state, context, &requests)
            .await
            .map_err(|e| match e {
                WorkError::Storage(s) if s.is_transient() => ApiError::Storage(s),
                e => ApiError::field("sourcePrefix", e.to_string()),
            })?;
        let mut options: ImportOptions = context
            .options()
            .map_err(|e| ApiError::field("body", e.to_string()))?;
        options.manifest_sha256 = Some(sha256);
        context.set_options(&options);
        if let Some(dst) = &context.destination {
            state.tables[&dst.connection]
                .create_table(&dst.table)
                .await?;
        }
        Ok(())
    }

    fn root<T: TableStore>(context: &ScanContext) -> Result<ChildSpec, WorkError> {
        let options: ImportOptions = context.options()?;
        item_child::<Self>(&ImportWork::Parts {
            start: 0,
            sha256: options.manifest_sha256,
        })
    }

    fn segment(_: &ScanContext, _: &[Entity]) -> Segment<ImportWork> {
        Segment::default()
    }

    async fn run<T: TableStore + Clone, Q: QueueStore + Clone>(
        state: &AppState<T, Q>,
        begun: &Begun<ItemMessage>,
        item: ImportWork,
    ) -> Result<WorkOutcome, WorkError> {
        match item {
            ImportWork::Parts { start, sha256 } => fan_out(state, begun, start, sha256).await,
            ImportWork::Part {
                name,
                rows,
                bytes,
                sha256,
                skip,
            } => {
                let part = PartRef {
                    name: &name,
                    rows,
                    bytes,
                    sha256: &sha256,
                };
                restore_part(state, begun, part, skip).await
            }
        }
    }
}

/// The scan's manifest, parsed, and the SHA-256 of its bytes.
async fn read_manifest<T: TableStore + Clone, Q: QueueStore + Clone>(
    state: &AppState<T, Q>,
    scan: &ScanContext,
    requests: &Arc<AtomicU64>,
) -> Result<(Manifest, String), WorkError> {
    let options: ImportOptions = scan.options()?;
    let blobs = state.blob_store(&scan.source.connection, requests)?;
    let name = options.layout()?.manifest_blob();
    let where_ = format!("{}/{name}", options.container);
    let downloaded = match blobs
        .download(&options.container, &name, MAX_MANIFEST_BYTES)
        .await
    {
        Err(e) if e.is_not_found() => {
            return Err(WorkError::Permanent(format!(
                "no export manifest at {where_}"
            )))
        }
        other => other?,
    };
    let manifest = Manifest::parse(&downloaded.bytes)
        .map_err(|e| WorkError::Permanent(format!("{where_}: {e}")))?;
    Ok((manifest, sha256_hex(&downloaded.bytes)))
}

/// A chunk item: queues the parts `start..start + PARTS_PER_ITEM` and the next chunk.
async fn fan_out<T: TableStore + Clone, Q: QueueStore + Clone>(
    state: &AppState<T, Q>,
    begun: &Begun<ItemMessage>,
    start: u64,
    expected: Option<String>,
) -> Result<WorkOutcome, WorkError> {
    let (manifest, sha256) = read_manifest(state, &begun.scan, &begun.requests).await?;
    if let Some(expected) = expected.filter(|e| *e != sha256) {
        return Err(WorkError::Permanent(format!(
            "the manifest changed since the import started (its SHA-256 was {expected}, now {sha256}); start the import again"
        )));
    }
    let mut outcome = WorkOutcome::default();
    let start = usize::try_from(start).unwrap_or(usize::MAX);
    for part in manifest.parts.iter().skip(start).take(PARTS_PER_ITEM) {
        outcome
            .children
            .push(item_child::<ImportDriver>(&ImportWork::Part {
                name: part.name.clone(),
                rows: part.rows,
                bytes: part.bytes,
                sha256: part.sha256.clone(),
                skip: 0,
            })?);
    }
    let next = start.saturating_add(PARTS_PER_ITEM);
    if next < manifest.parts.len() {
        outcome
            .children
            .push(item_child::<ImportDriver>(&ImportWork::Parts {
                start: next as u64,
                sha256: Some(sha256),
            })?);
    }
    Ok(outcome)
}

/// A part as the manifest lists it.
struct PartRef<'a> {
    name: &'a str,
    rows: u64,
    bytes: u64,
    sha256: &'a str,
}

/// A part item: downloads and verifies the part, then upserts its rows from `skip` on (at most
/// [`MAX_ITEM_ROWS`]; the rest is handed on).
async fn restore_part<T: TableStore + Clone, Q: QueueStore + Clone>(
    state: &AppState<T, Q>,
    begun: &Begun<ItemMessage>,
    part: PartRef<'_>,
    skip: u64,
) -> Result<WorkOutcome, WorkError> {
    let scan = &*begun.scan;
    let options: ImportOptions = scan.options()?;
    let destination = scan
        .destination
        .as_ref()
        .ok_or_else(|| WorkError::Failed("import work without a destination".into()))?;
    let blobs = state.blob_store(&scan.source.connection, &begun.requests)?;
    let blob = options.layout()?.blob(part.name);
    let failed = |why: String| {
        WorkError::Permanent(format!(
            "part {}/{blob} (listed in the manifest): {why}",
            options.container
        ))
    };
    if part.bytes > MAX_PART_DECOMPRESSED_BYTES {
        return Err(failed(format!(
            "{} bytes, over the {MAX_PART_DECOMPRESSED_BYTES}-byte bound",
            part.bytes
        )));
    }
    let downloaded = match blobs.download(&options.container, &blob, part.bytes).await {
        Err(e) if e.is_not_found() => return Err(failed("missing".into())),
        Err(e) if e.is_transient() => return Err(e.into()),
        Err(e) => return Err(failed(e.to_string())),
        Ok(d) => d,
    };
    let rows = decode_part(
        &downloaded.bytes,
        part.rows,
        part.sha256,
        &DecodeLimits::default(),
    )
    .map_err(|e| failed(e.to_string()))?;
    let skip = usize::try_from(skip).unwrap_or(usize::MAX);
    let mut outcome = WorkOutcome::default();
    let rows: Vec<Entity> = rows.into_iter().skip(skip).collect();
    let (rows, more) = match rows.len() > MAX_ITEM_ROWS {
        true => (rows.into_iter().take(MAX_ITEM_ROWS).collect(), true),
        false => (rows, false),
    };
    if more {
        outcome
            .children
            .push(item_child::<ImportDriver>(&ImportWork::Part {
                name: part.name.to_string(),
                rows: part.rows,
                bytes: part.bytes,
                sha256: part.sha256.to_string(),
                skip: (skip + MAX_ITEM_ROWS) as u64,
            })?);
    }
    let count = rows.len() as i64;
    let target = state.counted_table(&destination.connection, &begun.requests)?;
    let target = &target;
    stream::iter(batches(rows))
        .map(|(pk, ops)| async move { target.submit_batch(&destination.table, &pk, &ops).await })
        .buffer_unordered(state.config.copy_concurrency)
        .try_collect::<Vec<()>>()
        .await?;
    outcome.delta.rows_scanned = count;
    outcome.delta.rows_matched = count;
    outcome.delta.rows_written = count;
    Ok(outcome)
}
