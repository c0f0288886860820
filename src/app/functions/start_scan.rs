//! `StartScan`: `POST /api/scans` — validates a scan request, records the scan, queues its root
//! step and answers `202 Accepted` with `Location: /api/scans/{id}`.
//!
//! The driver named by `driver` is found in the app's registry (`AppState::drivers`); it reads
//! and checks its own fields and the common ones it accepts (`job::request`), and prepares its
//! destination (`Driver::prepare`). This handler names no driver.
//!
//! Nothing is written before the whole request is valid. Order of writes: the driver's
//! preparation (e.g. the destination table), counters + root work row, then the root message,
//! then the scan record with the scan's context (what every work item reads and writes) — so a
//! visible scan always has its work, and work never runs before its context is recorded.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::Value;
use time::OffsetDateTime;

use crate::app::error::ApiError;
use crate::app::job::request::request_from;
use crate::app::job::ScanRequest;
use crate::app::state::AppState;
use crate::app::tracking::{Counters, ScanRecord, ScanState};
use crate::app::work::Runner;
use crate::storage::stores::Stores;
use crate::storage::{Query, QueueStore, TableStore};

use super::status::status_json;

/// Largest accepted request body.
pub const MAX_BODY: usize = 64 * 1024;

/// A new scan id for a scan started at `now`: inverted milliseconds so ids sort newest first,
/// plus randomness.
fn new_scan_id(now: OffsetDateTime) -> String {
    let millis = (now.unix_timestamp_nanos() / 1_000_000) as u64;
    format!(
        "{:013}-{:08x}",
        9_999_999_999_999u64.saturating_sub(millis),
        rand::random::<u32>()
    )
}

pub async fn handle<S: Stores>(
    State(state): State<Arc<AppState<S>>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = crate::app::body::json_object(&headers, body, MAX_BODY).await?;
    let request = request_from(body, &state.drivers.names())?;
    start(&state, request, None).await
}

/// Checks a `POST /api/scans` body exactly as the handler does before it writes anything (the
/// request's fields, then the driver's plan); writes nothing. Schedules check their scan with it.
pub fn check<S: Stores>(state: &AppState<S>, body: Value) -> Result<ScanRequest, ApiError> {
    let mut request = request_from(body, &state.drivers.names())?;
    let driver = state
        .drivers
        .get(request.driver.as_str())
        .ok_or_else(|| ApiError::field("driver", "is not a registered driver"))?;
    driver.plan(&mut request, &state.config)?;
    Ok(request)
}

/// Starts the scan `body` describes under the id `scan_id` (the scheduler's, derived from a
/// schedule and its due time) instead of a new random one.
pub async fn start_as<S: Stores>(
    state: &AppState<S>,
    body: Value,
    scan_id: String,
) -> Result<Response, ApiError> {
    let request = request_from(body, &state.drivers.names())?;
    start(state, request, Some(scan_id)).await
}

/// Starts a scan: the driver validates, prepares, then the root work and the scan are recorded.
async fn start<S: Stores>(
    state: &AppState<S>,
    mut request: ScanRequest,
    scan_id: Option<String>,
) -> Result<Response, ApiError> {
    let driver = state
        .drivers
        .get(request.driver.as_str())
        .ok_or_else(|| ApiError::field("driver", "is not a registered driver"))?;
    let setup = driver.plan(&mut request, &state.config)?;
    if driver.scans_table() {
        source_must_exist(state, &request).await?;
    }

    let started_at = state.clock.now();
    let scan_id = scan_id.unwrap_or_else(|| new_scan_id(started_at));
    let mut context = request.context(&scan_id, state.config.counter_shards, setup);
    driver.prepare(state, &mut context).await?;
    request.record_prepared(&context);
    let tracker = state.tracker_on(state.bookkeeping());
    tracker.ensure_tables().await?;
    for queue in [
        &state.config.prefix_scan_queue,
        &state.config.table_copy_queue,
    ] {
        state.queues.create_queue(queue).await?;
    }

    let root = driver
        .root(&context)
        .map_err(|e| ApiError::field("driver", e.to_string()))?;
    let root = Runner::new(state)
        .child_message(&context, &root)
        .map_err(|e| ApiError::field("body", e.to_string()))?;
    tracker
        .create_scan_work(&scan_id, state.config.counter_shards, &root.work)
        .await?;
    state
        .queues
        .put_message(&root.queue, &root.text, Duration::ZERO)
        .await?;
    let record = ScanRecord {
        id: scan_id.clone(),
        state: ScanState::Running,
        request: serde_json::to_value(&request).expect("requests serialize"),
        context: Some(context),
        shards: state.config.counter_shards,
        started_at,
        completed_at: None,
        error: None,
        etag: String::new(),
    };
    tracker.insert_scan(&record).await?;
    tracing::info!(scan = %scan_id, driver = driver.name(), strategy = ?request.strategy, source = %request.source_table(), "scan started");
    let counters = Counters {
        created: 1,
        ..Counters::default()
    };
    let location = format!("/api/scans/{scan_id}");
    Ok((
        StatusCode::ACCEPTED,
        [(header::LOCATION, location)],
        Json(status_json(&record, &counters, started_at)),
    )
        .into_response())
}

/// A 4xx naming `sourceTable` if the source table does not exist.
async fn source_must_exist<S: Stores>(
    state: &AppState<S>,
    request: &ScanRequest,
) -> Result<(), ApiError> {
    let probe = Query {
        filter: None,
        top: Some(1),
        select: Some(vec!["PartitionKey".into()]),
        continuation: None,
    };
    match state.tables[&request.source_connection]
        .query_page(request.source_table(), &probe)
        .await
    {
        Err(e) if e.is_not_found() => Err(ApiError::field(
            "sourceTable",
            format!("table {} does not exist", request.source_table()),
        )),
        other => other.map(|_| ()).map_err(ApiError::from),
    }
}
