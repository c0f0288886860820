//! The import driver (`"driver": "import"`): restores an export (docs/export-format.md) into
//! `destinationTable`, in two phases. It scans no table. **Verification** (phase 0): the root
//! item reads the manifest and fans the parts out in chunks ([`PARTS_PER_ITEM`] items and the
//! next chunk item each), one verification item per part (or per [`VERIFY_SLICE_BYTES`] slice
//! of a longer one), which checks the part's SHA-256, inflates and parses every line, and checks
//! every row as the service would (keys, property names, each value a valid literal of its type,
//! the service's limits: `Entity::check_writable`) and the row count. It writes nothing.
//! **Writing** (phase 1, [`Driver::phase`]): started only once every verification item has
//! finished and none failed, it fans the parts out again, and each write item re-checks its
//! part's SHA-256 (the pin: a part changed since it was verified fails before any of its rows
//! is written), decodes only its own rows, and upserts them in same-partition entity group
//! transactions, every value passed through as the JSON text the export holds.
//!
//! Invariants:
//! - One manifest per import, the one checked at start: its SHA-256 is recorded with the scan
//!   and carried by every chunk item, and a chunk item that finds other bytes fails the scan
//!   instead of restoring another export or mixing two.
//! - Nothing is written unless every part verified: the write phase starts from the drained
//!   check of a scan with no failed item.
//! - Bounded: a chunk item queues at most [`PARTS_PER_ITEM`] items; a verification item checks
//!   lines until [`VERIFY_SLICE_BYTES`] are inflated past its start, a write item decodes at most
//!   [`MAX_ITEM_ROWS`] rows and [`WRITE_ITEM_BYTES`] of lines (the rest of a part is handed on
//!   to a child that skips the lines already done); neither keeps more than one line and its
//!   own rows in memory, and decoding runs on a blocking thread (`spawn_blocking`), never on
//!   the thread that answers the API.
//! - Idempotent: verification writes nothing, and upserts (replace) of the same rows rewrite
//!   them.
//! - Once the scan has ended (a cancel, a failed item), an item verifies no further part and
//!   starts no further batch (`kit::scan_ended`, kept fresh while it works: `work::watch`); a
//!   write item counts the rows it wrote.
//!
//! [`MAX_ITEM_ROWS`]: crate::app::job::MAX_ITEM_ROWS

use crate::app::pace::Meter;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use futures::stream::{self, StreamExt};
use serde::{Deserialize, Serialize};

use crate::app::config::Config;
use crate::app::error::ApiError;
use crate::app::export_format::{
    sha256_hex, ExportFormatError, ExportLayout, Manifest, ManifestPart, MAX_MANIFEST_BYTES,
    MAX_PART_BYTES,
};
use crate::app::job::request::{check_destination, default_connection};
use crate::app::job::{
    item_child, Begun, Driver, ScanContext, ScanRequest, Segment, Setup, TableRef, WorkError,
    WorkOutcome,
};
use crate::app::messages::{ChildSpec, ItemMessage};
use crate::app::state::AppState;
use crate::storage::blob::BlobStore;
use crate::storage::stores::Stores;
use crate::storage::{BatchOperation, Entity, StorageError, TableStore};

use super::kit::range::batches;
use super::kit::{check_blob_connection, check_container_field, scan_ended};

#[path = "import_decode.rs"]
mod decode;

use decode::{verify_lines, write_slice};

/// Most part items one chunk item queues (with the next chunk item).
pub const PARTS_PER_ITEM: usize = 200;
/// Most parts one verification item checks: one item's bookkeeping for many parts, so the
/// verification phase costs little more than a blob read per part.
pub const PARTS_PER_VERIFY: usize = 16;
/// A verification item stops after the line that brings what it inflated past its start to
/// this (its child continues): a few seconds of parsing at most.
pub const VERIFY_SLICE_BYTES: u64 = 64 * 1024 * 1024;
/// A write item stops after the line that brings its decoded lines to this (or after
/// [`MAX_ITEM_ROWS`] rows), so its rows in memory stay small whatever the lines hold.
///
/// [`MAX_ITEM_ROWS`]: crate::app::job::MAX_ITEM_ROWS
pub const WRITE_ITEM_BYTES: u64 = 8 * 1024 * 1024;

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
    /// Parts `start..` of the manifest (in its order): queues up to [`PARTS_PER_ITEM`] items
    /// (verification items, or with `write` write items) and the next chunk. `sha256`: the
    /// manifest's digest when the import started (`None` only in items of scans started before
    /// it was recorded: the root pins its read).
    Parts {
        start: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sha256: Option<String>,
        /// The write phase's chunk (phase 1); absent in the verification phase's.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        write: bool,
    },
    /// Verifies up to [`PARTS_PER_VERIFY`] parts, as the manifest lists them, in order; the
    /// first from line `skip + 1` on.
    Verify {
        parts: Vec<PartRef>,
        #[serde(default, skip_serializing_if = "is_zero")]
        skip: u64,
    },
    /// Writes one part, as the manifest lists it; its rows from `skip` on.
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
    const PHASES: u32 = 1;
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
    async fn prepare<S: Stores>(
        state: &AppState<S>,
        context: &mut ScanContext,
    ) -> Result<(), ApiError> {
        let requests = Meter::new();
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
            write: false,
        })
    }

    /// The write phase: the parts fanned out again, once every part verified.
    fn phase(context: &ScanContext, _: u32) -> Result<ChildSpec, WorkError> {
        let options: ImportOptions = context.options()?;
        item_child::<Self>(&ImportWork::Parts {
            start: 0,
            sha256: options.manifest_sha256,
            write: true,
        })
    }

    fn segment(_: &ScanContext, _: &[Entity]) -> Segment<ImportWork> {
        Segment::default()
    }

    async fn run<S: Stores>(
        state: &AppState<S>,
        begun: &Begun<ItemMessage>,
        item: ImportWork,
    ) -> Result<WorkOutcome, WorkError> {
        match item {
            ImportWork::Parts {
                start,
                sha256,
                write,
            } => fan_out(state, begun, start, sha256, write).await,
            ImportWork::Verify { parts, skip } => verify_parts(state, begun, parts, skip).await,
            ImportWork::Part {
                name,
                rows,
                bytes,
                sha256,
                skip,
            } => {
                let part = PartRef {
                    name,
                    rows,
                    bytes,
                    sha256,
                };
                restore_part(state, begun, part, skip).await
            }
        }
    }
}

/// The scan's manifest, parsed, and the SHA-256 of its bytes.
async fn read_manifest<S: Stores>(
    state: &AppState<S>,
    scan: &ScanContext,
    requests: &Arc<Meter>,
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

/// A chunk item: queues the parts `start..start + PARTS_PER_ITEM` (verification items, or
/// with `write` write items) and the next chunk.
async fn fan_out<S: Stores>(
    state: &AppState<S>,
    begun: &Begun<ItemMessage>,
    start: u64,
    expected: Option<String>,
    write: bool,
) -> Result<WorkOutcome, WorkError> {
    let (manifest, sha256) = read_manifest(state, &begun.scan, &begun.requests).await?;
    if let Some(expected) = expected.filter(|e| *e != sha256) {
        return Err(WorkError::Permanent(format!(
            "the manifest changed since the import started (its SHA-256 was {expected}, now {sha256}); start the import again"
        )));
    }
    let mut outcome = WorkOutcome::default();
    let start = usize::try_from(start).unwrap_or(usize::MAX);
    let chunk: Vec<&ManifestPart> = manifest
        .parts
        .iter()
        .skip(start)
        .take(PARTS_PER_ITEM)
        .collect();
    if write {
        for part in chunk {
            let item = PartRef::from(part).write_from(0);
            outcome.children.push(item_child::<ImportDriver>(&item)?);
        }
    } else {
        for group in chunk.chunks(PARTS_PER_VERIFY) {
            let parts = group.iter().map(|p| PartRef::from(*p)).collect();
            let item = ImportWork::Verify { parts, skip: 0 };
            outcome.children.push(item_child::<ImportDriver>(&item)?);
        }
    }
    let next = start.saturating_add(PARTS_PER_ITEM);
    if next < manifest.parts.len() {
        outcome
            .children
            .push(item_child::<ImportDriver>(&ImportWork::Parts {
                start: next as u64,
                sha256: Some(sha256),
                write,
            })?);
    }
    Ok(outcome)
}

/// A part as the manifest lists it (as a verification item carries it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartRef {
    name: String,
    rows: u64,
    bytes: u64,
    sha256: String,
}

impl From<&ManifestPart> for PartRef {
    fn from(part: &ManifestPart) -> Self {
        PartRef {
            name: part.name.clone(),
            rows: part.rows,
            bytes: part.bytes,
            sha256: part.sha256.clone(),
        }
    }
}

impl PartRef {
    fn write_from(&self, skip: u64) -> ImportWork {
        ImportWork::Part {
            name: self.name.clone(),
            rows: self.rows,
            bytes: self.bytes,
            sha256: self.sha256.clone(),
            skip,
        }
    }
}

/// A part's bytes, downloaded (at most the size the manifest lists), and how to name it in an
/// error.
struct Fetched {
    bytes: Bytes,
    /// `container/blob`.
    blob: String,
}

impl Fetched {
    fn failed(&self, why: impl std::fmt::Display) -> WorkError {
        WorkError::Permanent(format!(
            "part {} (listed in the manifest): {why}",
            self.blob
        ))
    }
}

/// Downloads a part the manifest lists.
async fn fetch_part<S: Stores>(
    state: &AppState<S>,
    begun: &Begun<ItemMessage>,
    part: &PartRef,
) -> Result<Fetched, WorkError> {
    let scan = &*begun.scan;
    let options: ImportOptions = scan.options()?;
    let blobs = state.blob_store(&scan.source.connection, &begun.requests)?;
    let name = options.layout()?.blob(&part.name);
    let mut fetched = Fetched {
        bytes: Bytes::new(),
        blob: format!("{}/{name}", options.container),
    };
    if part.bytes > MAX_PART_BYTES {
        return Err(fetched.failed(format!(
            "{} bytes, over the {MAX_PART_BYTES}-byte bound on a part (an export writes none \
             bigger)",
            part.bytes
        )));
    }
    fetched.bytes = match blobs.download(&options.container, &name, part.bytes).await {
        Err(e) if e.is_not_found() => return Err(fetched.failed("missing")),
        Err(e) if e.is_transient() => return Err(e.into()),
        Err(e) => return Err(fetched.failed(e)),
        Ok(d) => d.bytes,
    };
    Ok(fetched)
}

/// Runs CPU-heavy decoding on a blocking thread, never on the thread that answers the API.
async fn off_thread<R: Send + 'static>(
    work: impl FnOnce() -> Result<R, ExportFormatError> + Send + 'static,
) -> Result<Result<R, ExportFormatError>, WorkError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| WorkError::Failed(format!("decoding a part stopped: {e}")))
}

/// A verification item: verifies its parts in order (the first from line `skip + 1`), one
/// downloaded at a time, until [`VERIFY_SLICE_BYTES`] are inflated; the rest is handed on.
/// Writes nothing.
async fn verify_parts<S: Stores>(
    state: &AppState<S>,
    begun: &Begun<ItemMessage>,
    parts: Vec<PartRef>,
    mut skip: u64,
) -> Result<WorkOutcome, WorkError> {
    let mut outcome = WorkOutcome::default();
    let mut budget = VERIFY_SLICE_BYTES;
    for (i, listed) in parts.iter().enumerate() {
        // The scan ended (`kit::scan_ended`): nothing more to verify.
        if scan_ended(state, &begun.scan.scan_id) {
            break;
        }
        if budget == 0 {
            let rest = parts[i..].to_vec();
            let next = ImportWork::Verify { parts: rest, skip };
            outcome.children.push(item_child::<ImportDriver>(&next)?);
            break;
        }
        let part = listed.clone();
        let fetched = fetch_part(state, begun, &part).await?;
        let (bytes, slice) = (fetched.bytes.clone(), part.clone());
        let verified = off_thread(move || verify_lines(&bytes, &slice, skip, budget))
            .await?
            .map_err(|e| fetched.failed(e))?;
        budget = budget.saturating_sub(verified.inflated.max(1));
        skip = 0;
        if !verified.ended {
            let rest = parts[i..].to_vec();
            let next = ImportWork::Verify {
                parts: rest,
                skip: verified.lines,
            };
            outcome.children.push(item_child::<ImportDriver>(&next)?);
            break;
        }
    }
    Ok(outcome)
}

/// A write item: re-checks the part's SHA-256 (it was verified with these bytes), then upserts
/// its rows from `skip` on (see [`write_slice`]; the rest is handed on).
async fn restore_part<S: Stores>(
    state: &AppState<S>,
    begun: &Begun<ItemMessage>,
    part: PartRef,
    skip: u64,
) -> Result<WorkOutcome, WorkError> {
    let scan = &*begun.scan;
    let destination = scan
        .destination
        .as_ref()
        .ok_or_else(|| WorkError::Failed("import work without a destination".into()))?;
    let fetched = fetch_part(state, begun, &part).await?;
    let (bytes, slice) = (fetched.bytes.clone(), part.clone());
    let rows = off_thread(move || write_slice(&bytes, &slice, skip))
        .await?
        .map_err(|e| fetched.failed(e))?;
    drop(fetched.bytes);
    let mut outcome = WorkOutcome::default();
    let next = skip + rows.len() as u64;
    if next < part.rows {
        outcome
            .children
            .push(item_child::<ImportDriver>(&part.write_from(next))?);
    }
    let count = rows.len() as i64;
    let target = state.counted_table(&destination.connection, &begun.requests)?;
    let concurrency = state.config.copy_concurrency;
    let lines = (skip + 1, next);
    let ended = || scan_ended(state, &scan.scan_id);
    let written = write_rows(&target, &destination.table, rows, (concurrency, &ended))
        .await
        .map_err(|(written, e)| write_failed(&fetched.blob, lines, written, e))?;
    outcome.delta.rows_scanned = count;
    outcome.delta.rows_matched = count;
    outcome.delta.rows_written = written as i64;
    Ok(outcome)
}

/// Upserts `rows` in batches, `concurrency` at a time, starting none once `ended()` (the scan
/// ended: `kit::scan_ended`); returns the rows written. On a failure no further batch is sent,
/// the ones in flight are awaited, and the error comes with the rows written (exactly: every
/// batch sent has answered).
async fn write_rows<S: TableStore>(
    target: &S,
    table: &str,
    rows: Vec<Entity>,
    (concurrency, ended): (usize, &(dyn Fn() -> bool + Sync)),
) -> Result<u64, (u64, StorageError)> {
    let stop = AtomicBool::new(false);
    let stop = &stop;
    let results: Vec<Result<u64, StorageError>> = stream::iter(batches(rows))
        .map(|(pk, ops)| async move {
            if stop.load(Ordering::Relaxed) || ended() {
                return Ok(0);
            }
            match target.submit_batch(table, &pk, &ops).await {
                Ok(()) => Ok(ops.len() as u64),
                Err(e) => {
                    stop.store(true, Ordering::Relaxed);
                    Err(name_failed_row(e, &ops))
                }
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let written = results.iter().filter_map(|r| r.as_ref().ok()).sum();
    match results.into_iter().find_map(Result::err) {
        Some(e) => Err((written, e)),
        None => Ok(written),
    }
}

/// The batch's error, naming the row the service refused when it said which.
fn name_failed_row(mut e: StorageError, ops: &[BatchOperation]) -> StorageError {
    if let Some(BatchOperation::Upsert(row)) = e.failed_operation.and_then(|i| ops.get(i)) {
        e.message = format!(
            "row ({:?}, {:?}): {}",
            row.partition_key, row.row_key, e.message
        );
    }
    e
}

/// A write item's failure: permanent for every answer but a transient one (408, 429, 5xx,
/// timeouts: retried), the error saying how many of the item's rows were written before it.
fn write_failed(blob: &str, lines: (u64, u64), written: u64, e: StorageError) -> WorkError {
    let message = format!(
        "part {blob}, lines {}..={}: {written} of them were written before the service refused a batch (the import's rowsWritten does not count them): {e}",
        lines.0, lines.1
    );
    match e.is_transient() {
        true => WorkError::Storage(StorageError { message, ..e }),
        false => WorkError::Permanent(message),
    }
}

#[cfg(test)]
#[path = "import_tests.rs"]
mod tests;
