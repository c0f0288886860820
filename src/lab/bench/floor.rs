//! The floors: each job's data requests sent by a bare client — the storage adapters alone, no
//! Functions host, no queues, no bookkeeping, no HTTP protocol between host and handler — so
//! that the handler's CPU per storage request can be reported as a ratio to what the same data
//! requests cost on this machine (the goal: at most 1.5× the floor).
//!
//! One floor per job, each sending what that job must send however it is organised:
//! - **copy**: reads the source in pages of 1,000 rows (every column) and upserts the rows into a
//!   scratch table in same-partition batches, eight in flight, as a copy item does;
//! - **export**: reads the same pages and writes each as one gzip JSON Lines part (the export
//!   format's encoder: the part's body is part of the request);
//! - **import**: downloads those parts, decodes and checks them, and upserts their rows into a
//!   second scratch table;
//! - **delete**: reads that table's keys in pages and deletes every row in same-partition
//!   batches.
//!
//! The bare client talks to Azurite through a counting proxy of its own, as the handler does in
//! every variant (the caller checks that the proxy saw the requests the client counted).
//! Batches are sent eight at a time (one work item's `TABLESCAN_COPY_CONCURRENCY`) in the passes
//! before and after the variants. A third pass, right after each variant, sends them as many at
//! a time as that variant's handler had requests in flight on average (the proxy's gauge): on
//! this machine the bare client's own CPU per request grows with the requests in flight, so only
//! that pass compares the handler with the same requests sent the same way, and the difference
//! is its bookkeeping (`bench::passes`).
//!
//! The floors run on an OS thread of their own with a current-thread runtime, so that thread's
//! scheduler accounting (`/proc/thread-self/schedstat`) is all the CPU the requests took:
//! building, signing, sending, parsing, encoding. Passes 1 and 2 run before and after all the
//! variants, because CPU per request on a shared machine drifts over minutes (frequency, cache,
//! Azurite's own load on the other core); a variant that writes batches is judged against its
//! pass-3 floor, the others (counts, the export) against the mean of passes 1 and 2.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use futures::stream::{self, StreamExt, TryStreamExt};
use serde::Serialize;

use super::variant::Job;
use crate::app::drivers::kit::range::{batches, batches_of};
use crate::app::export_format::{decode_part, encode_part, DecodeLimits, PART_CONTENT_TYPE};
use crate::lab::proxy::InFlight;
use crate::storage::azure_blob::AzureBlobStore;
use crate::storage::azure_table::AzureTableStore;
use crate::storage::blob::{BlobRequestCounters, BlobStore, BlobWrite};
use crate::storage::connection::{ConnectionSettings, StorageAccount};
use crate::storage::request_counts::RequestCounters;
use crate::storage::{BatchOperation, Entity, Query, TableStore, MAX_TAKE};

/// Batches in flight in passes 1 and 2 (the handler's default `TABLESCAN_COPY_CONCURRENCY`).
pub const FLOOR_IN_FLIGHT: usize = 8;

/// The most batches in flight a floor sends with.
pub const MAX_FLOOR_IN_FLIGHT: usize = 256;

/// What a bare client measured for one job.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Floor {
    /// Which job's data requests these were (copies and counts are judged against the copy's).
    pub job: FloorJob,
    /// 1 before the variants, 2 after them (both [`FLOOR_IN_FLIGHT`] batches at a time); 3 right
    /// after `variant`, as many at a time as its handler had requests in flight.
    pub pass: u8,
    /// The variant a pass-3 floor was matched to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variant: Option<&'static str>,
    /// Batches sent at a time (the export sends its parts one at a time).
    pub in_flight: usize,
    /// Requests in flight on average, as the floors' proxy saw them (below `in_flight`: each
    /// page's last batches drain before the next page's start).
    pub mean_in_flight: f64,
    pub rows: u64,
    /// Table and blob requests sent.
    pub requests: u64,
    pub wall_seconds: f64,
    /// CPU of the client's thread per request, in microseconds (`None` without `/proc`).
    pub cpu_us_per_request: Option<f64>,
    /// CPU of the client's thread per 1,000 rows, in milliseconds.
    pub cpu_ms_per_1000_rows: Option<f64>,
}

/// The jobs that have a floor of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FloorJob {
    Copy,
    Export,
    Import,
    Delete,
}

impl FloorJob {
    /// The floor a variant of `job` is judged against.
    pub fn of(job: Job) -> FloorJob {
        match job {
            // An enqueue's puts have no floor of their own yet: judged like a count, against the
            // copy floor's CPU per request (queries and batches).
            Job::Copy | Job::Count | Job::Enqueue | Job::Index => FloorJob::Copy,
            Job::Export => FloorJob::Export,
            Job::Import => FloorJob::Import,
            Job::Delete => FloorJob::Delete,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            FloorJob::Copy => "copy",
            FloorJob::Export => "export",
            FloorJob::Import => "import",
            FloorJob::Delete => "delete",
        }
    }
}

/// Where one pass of the floors reads and writes.
#[derive(Debug, Clone)]
pub struct FloorTargets {
    pub source: String,
    /// The copy floor's destination (created).
    pub copy_destination: String,
    /// The export floor's container (created) and the import floor's source.
    pub container: String,
    /// The import floor's destination (created), which the delete floor empties.
    pub import_destination: String,
}

/// Runs the floors of `jobs` (export is run for import, import for delete: each reads what the
/// one before wrote) on a thread of their own, in the order copy, export, import, delete, and
/// returns every floor it ran, the ones run only for the next one's sake included. `in_flight`
/// sets a job's batches at a time ([`FLOOR_IN_FLIGHT`] for a job it does not name).
pub fn measure_floors(
    settings: ConnectionSettings,
    targets: FloorTargets,
    jobs: Vec<FloorJob>,
    in_flight: BTreeMap<FloorJob, usize>,
    gauge: InFlight,
    pass: u8,
) -> Result<Vec<Floor>, String> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let client = Client::new(settings, gauge)?;
        runtime.block_on(run_floors(client, targets, jobs, in_flight, pass))
    })
    .join()
    .map_err(|_| "the floor measurement panicked".to_string())?
}

async fn run_floors<T: TableStore, B: BlobStore>(
    client: Client<T, B>,
    targets: FloorTargets,
    jobs: Vec<FloorJob>,
    in_flight: BTreeMap<FloorJob, usize>,
    pass: u8,
) -> Result<Vec<Floor>, String> {
    let n = |job| {
        in_flight
            .get(&job)
            .copied()
            .unwrap_or(FLOOR_IN_FLIGHT)
            .clamp(1, MAX_FLOOR_IN_FLIGHT)
    };
    // Each of export, import and delete reads what the floor before it wrote.
    let wanted = |job: FloorJob| match job {
        FloorJob::Copy => jobs.contains(&FloorJob::Copy),
        _ => jobs.iter().any(|j| *j >= job),
    };
    let mut floors = Vec::new();
    let mut parts = Vec::new();
    // What the floors write to is made before the measured runs (at most three requests).
    let t = &targets;
    if wanted(FloorJob::Copy) {
        client.create_table(&t.copy_destination).await?;
    }
    if wanted(FloorJob::Import) {
        client.create_table(&t.import_destination).await?;
    }
    if wanted(FloorJob::Export) {
        client
            .blobs
            .create_container(&t.container)
            .await
            .map_err(|e| format!("floor: creating container {}: {e}", t.container))?;
    }
    if wanted(FloorJob::Copy) {
        let run = client.copy(&t.source, &t.copy_destination, n(FloorJob::Copy));
        floors.push(
            client
                .measure(FloorJob::Copy, pass, n(FloorJob::Copy), run)
                .await?,
        );
    }
    if wanted(FloorJob::Export) {
        let run = client.export(&targets.source, &targets.container, &mut parts);
        floors.push(client.measure(FloorJob::Export, pass, 1, run).await?);
    }
    if wanted(FloorJob::Import) {
        let (job, t) = (FloorJob::Import, &targets);
        let run = client.import(&t.container, &parts, &t.import_destination, n(job));
        floors.push(client.measure(job, pass, n(job), run).await?);
    }
    if wanted(FloorJob::Delete) {
        let run = client.delete(&targets.import_destination, n(FloorJob::Delete));
        floors.push(
            client
                .measure(FloorJob::Delete, pass, n(FloorJob::Delete), run)
                .await?,
        );
    }
    Ok(floors)
}

/// CPU nanoseconds of the calling thread, from the scheduler's accounting.
fn thread_cpu_nanos() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// A part the export floor wrote: its blob name, rows and checksum.
struct FloorPart {
    name: String,
    rows: u64,
    bytes: u64,
    sha256: String,
}

/// The bare client: one table store and one blob store, each counting its requests, and the
/// gauge of its requests in flight at its proxy.
struct Client<T, B> {
    tables: T,
    blobs: B,
    table_counters: Arc<RequestCounters>,
    blob_counters: Arc<BlobRequestCounters>,
    gauge: InFlight,
}

impl Client<AzureTableStore, AzureBlobStore> {
    fn new(settings: ConnectionSettings, gauge: InFlight) -> Result<Self, String> {
        let account = StorageAccount::new(settings);
        let table_counters = Arc::new(RequestCounters::new());
        let blob_counters = Arc::new(BlobRequestCounters::new());
        Ok(Client {
            tables: account.table_store(table_counters.clone()),
            blobs: account
                .blob_store(blob_counters.clone())
                .map_err(|e| e.to_string())?,
            table_counters,
            blob_counters,
            gauge,
        })
    }
}

impl<T: TableStore, B: BlobStore> Client<T, B> {
    fn requests(&self) -> u64 {
        self.table_counters.snapshot().total() + self.blob_counters.snapshot().total()
    }

    /// Runs one floor and measures its requests, wall time and CPU; `run` returns the rows.
    async fn measure(
        &self,
        job: FloorJob,
        pass: u8,
        in_flight: usize,
        run: impl std::future::Future<Output = Result<u64, String>>,
    ) -> Result<Floor, String> {
        let before = (self.requests(), thread_cpu_nanos());
        let mark = self.gauge.mark();
        let started = Instant::now();
        let rows = run.await?;
        let mean_in_flight = self.gauge.mean_since(&mark);
        let wall_seconds = started.elapsed().as_secs_f64();
        let requests = self.requests() - before.0;
        let cpu = thread_cpu_nanos().zip(before.1).map(|(a, b)| a - b);
        Ok(Floor {
            job,
            pass,
            variant: None,
            in_flight,
            mean_in_flight,
            rows,
            requests,
            wall_seconds,
            cpu_us_per_request: cpu.map(|ns| ns as f64 / 1000.0 / requests.max(1) as f64),
            cpu_ms_per_1000_rows: cpu.map(|ns| ns as f64 / 1e6 / rows.max(1) as f64 * 1000.0),
        })
    }

    /// Reads `table` a page at a time (keys only with `select` `Some(vec![])`) and hands each
    /// page's rows to `each` while the next page is read (as the handler's items overlap);
    /// returns the rows read.
    async fn pages<F: std::future::Future<Output = Result<(), String>>>(
        &self,
        table: &str,
        select: Option<Vec<String>>,
        mut each: impl FnMut(Vec<Entity>) -> F,
    ) -> Result<u64, String> {
        let mut query = Query {
            filter: None,
            top: Some(MAX_TAKE),
            select,
            continuation: None,
        };
        let read = |query: Query| async move {
            self.tables
                .query_page(table, &query)
                .await
                .map_err(|e| format!("floor: reading {table}: {e}"))
        };
        let mut page = read(query.clone()).await?;
        let mut rows = 0u64;
        // Bounded by the table: every page but the last holds rows.
        loop {
            rows += page.entities.len() as u64;
            let Some(c) = page.continuation.take() else {
                each(page.entities).await?;
                return Ok(rows);
            };
            query.continuation = Some(c);
            let (done, next) = futures::join!(each(page.entities), read(query.clone()));
            done?;
            page = next?;
        }
    }

    /// Sends `batches` to `table`, `in_flight` at a time.
    async fn submit(
        &self,
        table: &str,
        batches: Vec<(String, Vec<BatchOperation>)>,
        in_flight: usize,
    ) -> Result<(), String> {
        stream::iter(batches)
            .map(|(pk, ops)| async move { self.tables.submit_batch(table, &pk, &ops).await })
            .buffer_unordered(in_flight)
            .try_collect::<Vec<()>>()
            .await
            .map(drop)
            .map_err(|e| format!("floor: writing {table}: {e}"))
    }

    async fn copy(&self, source: &str, destination: &str, n: usize) -> Result<u64, String> {
        self.pages(source, None, |rows| {
            self.submit(destination, batches(rows), n)
        })
        .await
    }

    async fn export(
        &self,
        source: &str,
        container: &str,
        parts: &mut Vec<FloorPart>,
    ) -> Result<u64, String> {
        let parts = std::cell::RefCell::new(parts);
        self.pages(source, None, |rows| {
            let name = format!("floor/part-{:05}.jsonl.gz", parts.borrow().len());
            let parts = &parts;
            async move {
                let encoded = encode_part(&rows).map_err(|e| format!("floor: encoding: {e}"))?;
                let bytes = encoded.bytes.len() as u64;
                let write = BlobWrite::new(PART_CONTENT_TYPE);
                self.blobs
                    .upload(container, &name, encoded.bytes, &write)
                    .await
                    .map_err(|e| format!("floor: writing {name}: {e}"))?;
                parts.borrow_mut().push(FloorPart {
                    name,
                    rows: encoded.rows,
                    bytes,
                    sha256: encoded.sha256,
                });
                Ok(())
            }
        })
        .await
    }

    async fn import(
        &self,
        container: &str,
        parts: &[FloorPart],
        destination: &str,
        n: usize,
    ) -> Result<u64, String> {
        let mut rows = 0;
        for part in parts {
            let downloaded = self
                .blobs
                .download(container, &part.name, part.bytes)
                .await
                .map_err(|e| format!("floor: reading {}: {e}", part.name))?;
            let decoded = decode_part(
                &downloaded.bytes,
                part.rows,
                &part.sha256,
                &DecodeLimits::default(),
            )
            .map_err(|e| format!("floor: decoding {}: {e}", part.name))?;
            rows += decoded.len() as u64;
            self.submit(destination, batches(decoded), n).await?;
        }
        Ok(rows)
    }

    async fn delete(&self, table: &str, n: usize) -> Result<u64, String> {
        let delete = |row: Entity| BatchOperation::Delete {
            row_key: row.row_key,
            etag: None,
        };
        self.pages(table, Some(Vec::new()), |rows| {
            self.submit(table, batches_of(rows, delete), n)
        })
        .await
    }

    async fn create_table(&self, table: &str) -> Result<(), String> {
        self.tables
            .create_table(table)
            .await
            .map(drop)
            .map_err(|e| format!("floor: creating {table}: {e}"))
    }
}
