//! `GetScan`: `GET /api/scans/{id}` — state, parameters and exact counters of one scan.
//! Cheap however big the scan: one point read of the record and one per counter shard.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::Json;
use serde_json::Value;

use crate::app::error::ApiError;
use crate::app::job::{is_valid_scan_id, Drivers};
use crate::app::state::AppState;
use crate::app::tracking::{Counters, ScanRecord, ScanState, Tracker};
use crate::app::work::Runner;
use crate::storage::{QueueStore, StorageError, TableStore};

use super::status::status_json;

pub async fn handle<T: TableStore + Clone, Q: QueueStore + Clone>(
    State(state): State<Arc<AppState<T, Q>>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let tracker = state.tracker_on(state.bookkeeping());
    let (mut record, counters) = read_status(&tracker, &id).await?;
    if record.state == ScanState::Running && counters.pending() == 0 {
        // Ended through the driver, which may have a completion step to run first.
        let runner = Runner::new(&state);
        let context = runner
            .usable_context(&record)
            .map_err(|e| ApiError::Storage(StorageError::invalid_response(e)))?;
        if runner.complete_if_drained(&tracker, &context, None).await? {
            record = tracker.get_scan(&id).await?.unwrap_or(record);
        }
    }
    Ok(Json(status_json(&record, &counters)))
}

/// Reads a scan's status; a running scan whose work has all finished is ended here too (in case
/// the worker that finished last died before noticing) — unless its driver has a completion
/// step, which only the app (`handle`) can run.
pub async fn scan_status<S: TableStore, A>(
    tracker: &Tracker<'_, S>,
    id: &str,
    drivers: &Drivers<A>,
) -> Result<Value, ApiError> {
    let (mut record, counters) = read_status(tracker, id).await?;
    let completes = record
        .recorded_context()
        .ok()
        .and_then(|c| drivers.get(c.driver.as_str()).map(|d| d.completes()))
        .unwrap_or(true);
    if record.state == ScanState::Running
        && counters.pending() == 0
        && !completes
        && tracker.finish_if_drained(id, record.shards).await?
    {
        record = tracker.get_scan(id).await?.unwrap_or(record);
    }
    Ok(status_json(&record, &counters))
}

async fn read_status<S: TableStore>(
    tracker: &Tracker<'_, S>,
    id: &str,
) -> Result<(ScanRecord, Counters), ApiError> {
    if !is_valid_scan_id(id) {
        return Err(ApiError::NotFound(format!("no scan with id {id:?}")));
    }
    let record = tracker
        .get_scan(id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no scan with id {id:?}")))?;
    let counters = tracker.totals(id, record.shards).await?;
    Ok((record, counters))
}
