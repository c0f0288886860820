//! `GetScan`: `GET /api/scans/{id}` — state, parameters and exact counters of one scan.
//! Cheap however big the scan: one point read of the record and one per counter shard.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::Json;
use serde_json::Value;

use crate::app::error::ApiError;
use crate::app::state::AppState;
use crate::app::tracking::{ScanState, Tracker};
use crate::storage::{QueueStore, TableStore};

use super::status::{is_valid_scan_id, status_json};

pub async fn handle<T: TableStore + Clone, Q: QueueStore + Clone>(
    State(state): State<Arc<AppState<T, Q>>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(
        scan_status(&state.tracker_on(state.bookkeeping()), &id).await?,
    ))
}

/// Reads a scan's status; a running scan whose work has all finished is ended here too (in case
/// the worker that finished last died before noticing).
pub async fn scan_status<S: TableStore>(
    tracker: &Tracker<'_, S>,
    id: &str,
) -> Result<Value, ApiError> {
    if !is_valid_scan_id(id) {
        return Err(ApiError::NotFound(format!("no scan with id {id:?}")));
    }
    let mut record = tracker
        .get_scan(id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no scan with id {id:?}")))?;
    let counters = tracker.totals(id, record.shards).await?;
    if record.state == ScanState::Running
        && counters.pending() == 0
        && tracker.finish_if_drained(id, record.shards).await?
    {
        record = tracker.get_scan(id).await?.unwrap_or(record);
    }
    Ok(status_json(&record, &counters))
}
