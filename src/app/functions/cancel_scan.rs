//! `CancelScan`: `DELETE /api/scans/{id}` — the scan ends `cancelled`; its pending work is
//! dropped by the queue functions as they meet it.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::Json;
use serde_json::Value;

use crate::app::error::ApiError;
use crate::app::job::is_valid_scan_id;
use crate::app::state::AppState;
use crate::app::tracking::ScanState;
use crate::storage::stores::Stores;

use super::get_scan::scan_status;

pub async fn handle<S: Stores>(
    State(state): State<Arc<AppState<S>>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let tracker = state.tracker_on(state.bookkeeping());
    if !is_valid_scan_id(&id) {
        return Err(ApiError::NotFound(format!("no scan with id {id:?}")));
    }
    let record = tracker
        .get_scan(&id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no scan with id {id:?}")))?;
    if record.state != ScanState::Running
        || !tracker
            .finish_scan(&id, ScanState::Cancelled, Some("cancelled by request"))
            .await?
    {
        let now = tracker
            .get_scan(&id)
            .await?
            .map(|r| r.state)
            .unwrap_or(record.state);
        return Err(ApiError::Conflict(format!(
            "scan {id} is already {}",
            now.as_str()
        )));
    }
    state.scan_states.put(&id, ScanState::Cancelled);
    Ok(Json(scan_status(&tracker, &id, &state.drivers).await?))
}
