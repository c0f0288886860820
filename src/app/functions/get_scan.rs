//! `GetScan`: `GET /api/scans/{id}` — state, parameters and exact counters of one scan.
//! Cheap however big the scan: one point read of the record and one per counter shard.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::Json;
use serde_json::Value;

use crate::app::drivers::{with_driver, Driver};
use crate::app::error::ApiError;
use crate::app::functions::start_scan::recorded_context;
use crate::app::state::AppState;
use crate::app::tracking::{Counters, ScanRecord, ScanState, Tracker};
use crate::storage::{QueueStore, StorageError, TableStore};

use super::status::{is_valid_scan_id, status_json};

pub async fn handle<T: TableStore + Clone, Q: QueueStore + Clone>(
    State(state): State<Arc<AppState<T, Q>>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let tracker = state.tracker_on(state.bookkeeping());
    let (mut record, counters) = read_status(&tracker, &id).await?;
    if record.state == ScanState::Running && counters.pending() == 0 {
        // Ended through the driver, which may have a completion step to run first.
        let context = recorded_context(&record)
            .map_err(|e| ApiError::Storage(StorageError::invalid_response(e)))?;
        if state.complete_if_drained(&tracker, &context, None).await? {
            record = tracker.get_scan(&id).await?.unwrap_or(record);
        }
    }
    Ok(Json(status_json(&record, &counters)))
}

/// Reads a scan's status; a running scan whose work has all finished is ended here too (in case
/// the worker that finished last died before noticing) — unless its driver has a completion
/// step, which only the app (`handle`) can run.
pub async fn scan_status<S: TableStore>(
    tracker: &Tracker<'_, S>,
    id: &str,
) -> Result<Value, ApiError> {
    let (mut record, counters) = read_status(tracker, id).await?;
    let completes = recorded_context(&record)
        .map(|c| with_driver!(c.driver, D => D::COMPLETES))
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
