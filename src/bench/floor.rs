//! The floor: a copy's data requests sent by a bare client — the storage adapter alone, no
//! Functions host, no queues, no bookkeeping, no HTTP protocol between host and handler — so
//! that the handler's CPU per storage request can be reported as a ratio to what the requests
//! themselves cost on this machine (the goal: at most 1.5× the floor).
//!
//! The floor reads the source in pages of 1,000 rows (every column) and upserts the rows into
//! a scratch table in same-partition batches, eight in flight, as a copy item does. It runs on
//! an OS thread of its own with a current-thread runtime, so that thread's scheduler accounting
//! (`/proc/thread-self/schedstat`) is all the CPU the requests took: building, signing,
//! sending, parsing.

use std::sync::Arc;
use std::time::Instant;

use futures::stream::{self, StreamExt, TryStreamExt};
use serde::Serialize;

use crate::app::drivers::range::batches;
use crate::storage::connection::{ConnectionSettings, StorageAccount};
use crate::storage::counters::RequestCounters;
use crate::storage::{Query, TableStore, MAX_TAKE};

/// Batches in flight (the handler's default `TABLESCAN_COPY_CONCURRENCY`).
const CONCURRENCY: usize = 8;

/// What the bare client measured.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Floor {
    pub rows: u64,
    /// Queries and batches sent.
    pub requests: u64,
    pub wall_seconds: f64,
    /// CPU of the client's thread per request, in microseconds (`None` without `/proc`).
    pub cpu_us_per_request: Option<f64>,
}

/// CPU nanoseconds of the calling thread, from the scheduler's accounting.
fn thread_cpu_nanos() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// Copies `source` into `destination` (created) with a bare client on its own thread.
pub fn measure_floor(
    settings: ConnectionSettings,
    source: String,
    destination: String,
) -> Result<Floor, String> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        runtime.block_on(async move {
            let counters = Arc::new(RequestCounters::new());
            let store = StorageAccount::new(settings).table_store(counters.clone());
            store
                .create_table(&destination)
                .await
                .map_err(|e| e.to_string())?;
            let before = (counters.snapshot().total(), thread_cpu_nanos());
            let started = Instant::now();
            let rows = copy(&store, &source, &destination).await?;
            let wall_seconds = started.elapsed().as_secs_f64();
            let requests = counters.snapshot().total() - before.0;
            let cpu = thread_cpu_nanos().zip(before.1).map(|(a, b)| a - b);
            Ok(Floor {
                rows,
                requests,
                wall_seconds,
                cpu_us_per_request: cpu.map(|ns| ns as f64 / 1000.0 / requests.max(1) as f64),
            })
        })
    })
    .join()
    .map_err(|_| "the floor measurement panicked".to_string())?
}

/// Pages through `source` and upserts every page's rows into `destination`.
async fn copy<S: TableStore>(store: &S, source: &str, destination: &str) -> Result<u64, String> {
    let mut query = Query {
        filter: None,
        top: Some(MAX_TAKE),
        select: None,
        continuation: None,
    };
    let mut rows = 0u64;
    // Bounded by the table: every page but the last holds rows.
    loop {
        let page = store
            .query_page(source, &query)
            .await
            .map_err(|e| format!("floor: reading {source}: {e}"))?;
        rows += page.entities.len() as u64;
        stream::iter(batches(page.entities))
            .map(|(pk, ops)| async move { store.submit_batch(destination, &pk, &ops).await })
            .buffer_unordered(CONCURRENCY)
            .try_collect::<Vec<()>>()
            .await
            .map_err(|e| format!("floor: writing {destination}: {e}"))?;
        match page.continuation {
            Some(c) => query.continuation = Some(c),
            None => return Ok(rows),
        }
    }
}
