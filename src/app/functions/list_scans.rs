//! `ListScans`: `GET /api/scans[?top=N]` — the most recent scans, newest first.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::Json;
use futures::future::try_join_all;
use serde_json::{json, Value};

use crate::app::error::ApiError;
use crate::app::state::AppState;
use crate::storage::{QueueStore, TableStore};

use super::status::status_json;

const DEFAULT_TOP: u32 = 20;
const MAX_TOP: u32 = 100;

pub async fn handle<T: TableStore + Clone, Q: QueueStore + Clone>(
    State(state): State<Arc<AppState<T, Q>>>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let top = match query.get("top") {
        None => DEFAULT_TOP,
        Some(v) => v
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=MAX_TOP).contains(n))
            .ok_or_else(|| ApiError::field("top", format!("must be 1..={MAX_TOP}, got {v:?}")))?,
    };
    let tracker = state.tracker_on(state.bookkeeping());
    let records = match tracker.list_scans(top).await {
        Err(e) if e.is_not_found() => Vec::new(), // no scan was ever started
        other => other?,
    };
    let scans = try_join_all(records.iter().map(|r| {
        let tracker = &tracker;
        async move { Ok::<_, ApiError>(status_json(r, &tracker.totals(&r.id, r.shards).await?)) }
    }))
    .await?;
    Ok(Json(json!({ "scans": scans })))
}
