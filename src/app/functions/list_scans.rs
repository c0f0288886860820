//! `ListScans`: `GET /api/scans[?top=N][&state=S][&continuationToken=T]` — scans, newest first,
//! a page at a time: `{"scans": [status, ...], "continuationToken": T | null}`. Pass a non-null
//! `continuationToken` back (with the same `state`) for the next page.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::Json;
use futures::future::try_join_all;
use serde_json::{json, Value};

use crate::app::error::ApiError;
use crate::app::state::AppState;
use crate::app::tracking::{parse_list_token, ScanPage, ScanState};
use crate::storage::stores::Stores;

use super::status::status_json;

const DEFAULT_TOP: u32 = 20;
const MAX_TOP: u32 = 100;
/// The query parameters this function reads; any other is refused (a typo would otherwise list
/// everything silently), and so is one given twice (which value counts would be a guess).
const PARAMETERS: [&str; 4] = ["top", "state", "continuationToken", "code"];

/// The query's parameters by name: a 400 naming the first one that is unknown or given twice.
fn parameters(pairs: Vec<(String, String)>) -> Result<HashMap<String, String>, ApiError> {
    let mut query = HashMap::new();
    for (name, value) in pairs {
        if !PARAMETERS.contains(&name.as_str()) {
            return Err(ApiError::field(
                &name,
                format!(
                    "unknown query parameter; expected top, state or continuationToken, got {name:?}"
                ),
            ));
        }
        if query.contains_key(&name) {
            return Err(ApiError::field(
                &name,
                format!("{name} is given more than once; give it once"),
            ));
        }
        query.insert(name, value);
    }
    Ok(query)
}

pub async fn handle<S: Stores>(
    State(state): State<Arc<AppState<S>>>,
    Query(pairs): Query<Vec<(String, String)>>,
) -> Result<Json<Value>, ApiError> {
    let query = parameters(pairs)?;
    let top = match query.get("top") {
        None => DEFAULT_TOP,
        Some(v) => v
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=MAX_TOP).contains(n))
            .ok_or_else(|| ApiError::field("top", format!("must be 1..={MAX_TOP}, got {v:?}")))?,
    };
    let wanted = match query.get("state") {
        None => None,
        Some(v) => Some(ScanState::parse(v).ok_or_else(|| {
            ApiError::field(
                "state",
                format!("must be running, completed, failed or cancelled, got {v:?}"),
            )
        })?),
    };
    let resume = match query.get("continuationToken") {
        None => None,
        Some(v) => Some(parse_list_token(v).ok_or_else(|| {
            ApiError::field(
                "continuationToken",
                format!("not a token this API handed out: {v:?}"),
            )
        })?),
    };
    let tracker = state.tracker_on(state.bookkeeping());
    let page = match tracker.list_scans(top, wanted, resume).await {
        Err(e) if e.is_not_found() => ScanPage {
            scans: Vec::new(),
            continuation: None,
        }, // no scan was ever started
        other => other?,
    };
    let now = tracker.now();
    let scans =
        try_join_all(page.scans.iter().map(|r| {
            let tracker = &tracker;
            async move {
                Ok::<_, ApiError>(status_json(r, &tracker.totals(&r.id, r.shards).await?, now))
            }
        }))
        .await?;
    Ok(Json(
        json!({ "scans": scans, "continuationToken": page.continuation }),
    ))
}
