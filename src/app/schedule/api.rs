//! `PUT`, `GET` and `DELETE /api/schedules/{name}` and `GET /api/schedules` (docs/api.md,
//! "Schedules").
//!
//! Invariant: a PUT writes nothing until the whole schedule is valid: its name, its cron
//! expression, `keep`, and its scan body, checked by `start_scan::check` exactly as
//! `POST /api/scans` checks a body (a refusal names the field, `scan.<field>` for the body's).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use time::OffsetDateTime;

use crate::app::error::ApiError;
use crate::app::functions::start_scan;
use crate::app::state::AppState;
use crate::app::tracking::format_time;
use crate::storage::stores::Stores;

use super::store::{Outcome, Run, Schedule, ScheduleStore};
use super::{is_valid_name, scan_body_at, ScheduleDef, DUE_TIME_PLACEHOLDER, MAX_NAME};
use crate::cron::Cron;

/// Largest schedule body: a scan body and a few fields.
const MAX_BODY: usize = 64 * 1024;
/// How many runs `GET /api/schedules/{name}` shows.
pub const SHOWN_RUNS: usize = 20;
/// A claimed run whose scan has no record this long after its due time did not start (its
/// starter stopped between the claim and the scan's record).
const START_GRACE: time::Duration = time::Duration::minutes(10);
/// What a skipped run shows as its state.
pub const SKIPPED: &str = "skipped: previous run still running";

/// The schedule rows of the app's bookkeeping table.
pub fn schedules<S: Stores>(state: &AppState<S>) -> ScheduleStore<'_, S::Table> {
    ScheduleStore {
        store: state.bookkeeping(),
        table: &state.config.scans_table,
    }
}

fn check_name(name: &str) -> Result<(), ApiError> {
    if is_valid_name(name) {
        Ok(())
    } else {
        Err(ApiError::field(
            "name",
            format!("must be 1 to {MAX_NAME} letters, digits or '-'"),
        ))
    }
}

/// Checks a schedule as a PUT would, writing nothing; returns its parsed expression.
pub fn check_def<S: Stores>(state: &AppState<S>, def: &ScheduleDef) -> Result<Cron, ApiError> {
    let cron = Cron::parse(&def.cron).map_err(|e| ApiError::field("cron", e))?;
    let now = state.clock.now();
    // The body is checked as the run at the next due time will send it.
    let due = cron.next_after(now).unwrap_or(now);
    start_scan::check(state, scan_body_at(&def.scan, due)).map_err(|e| match e {
        ApiError::InvalidField { field, message } => ApiError::InvalidField {
            field: format!("scan.{field}"),
            message,
        },
        other => other,
    })?;
    if let Some(keep) = def.keep {
        let prefix = def.scan.get("destinationPrefix").and_then(Value::as_str);
        if def.scan.get("driver").and_then(Value::as_str) != Some("export") {
            return Err(ApiError::field("keep", "applies to export scans only"));
        }
        if keep == 0 {
            return Err(ApiError::field("keep", "must be at least 1"));
        }
        if !prefix.is_some_and(|p| p.contains(DUE_TIME_PLACEHOLDER)) {
            return Err(ApiError::field(
                "keep",
                format!("needs {DUE_TIME_PLACEHOLDER} in scan.destinationPrefix, so that each run has a prefix of its own"),
            ));
        }
    }
    Ok(cron)
}

pub async fn put<S: Stores>(
    State(state): State<Arc<AppState<S>>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    check_name(&name)?;
    let body = crate::app::body::json_object(&headers, body, MAX_BODY).await?;
    let def: ScheduleDef = serde_path_to_error::deserialize(body).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { "body".into() } else { path };
        ApiError::field(field, e.into_inner().to_string())
    })?;
    let cron = check_def(&state, &def)?;
    let next_due = cron.next_after(state.clock.now());
    state
        .tracker_on(state.bookkeeping())
        .ensure_tables()
        .await?;
    let store = schedules(&state);
    let existing = store.get(&name).await?;
    match store.put(&name, &def, next_due, existing.as_ref()).await {
        Err(e)
            if e.kind == crate::storage::StorageErrorKind::Conflict
                || e.kind == crate::storage::StorageErrorKind::PreconditionFailed =>
        {
            return Err(ApiError::Conflict(format!(
                "schedule {name} was changed by another request meanwhile; send it again"
            )))
        }
        other => other?,
    }
    let status = if existing.is_some() {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    let schedule = Schedule {
        name,
        def,
        next_due,
        last_due: existing.as_ref().and_then(|e| e.last_due),
        last_scan: existing.and_then(|e| e.last_scan),
        etag: String::new(),
    };
    Ok((status, Json(schedule_json(&schedule))).into_response())
}

pub async fn list<S: Stores>(
    State(state): State<Arc<AppState<S>>>,
) -> Result<Json<Value>, ApiError> {
    let all = schedules(&state).list().await?;
    Ok(Json(json!({
        "schedules": all.iter().map(schedule_json).collect::<Vec<_>>()
    })))
}

pub async fn get<S: Stores>(
    State(state): State<Arc<AppState<S>>>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let store = schedules(&state);
    let found = if is_valid_name(&name) {
        store.get(&name).await?
    } else {
        None
    };
    let schedule = found.ok_or_else(|| ApiError::NotFound(format!("no schedule {name}")))?;
    let runs = store.runs(&name, SHOWN_RUNS).await?;
    let tracker = state.tracker_on(state.bookkeeping());
    let now = state.clock.now();
    let mut shown = Vec::new();
    for run in &runs {
        let scan_state = match &run.scan_id {
            Some(id) if run.outcome != Outcome::Skipped => tracker
                .get_scan(id)
                .await?
                .map(|r| r.state.as_str().to_string()),
            _ => None,
        };
        shown.push(run_json(run, scan_state, now));
    }
    let mut body = schedule_json(&schedule);
    body["lastRuns"] = Value::Array(shown);
    Ok(Json(body))
}

pub async fn delete<S: Stores>(
    State(state): State<Arc<AppState<S>>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let existed = is_valid_name(&name) && schedules(&state).delete(&name).await?;
    if existed {
        Ok(Json(json!({ "name": name, "deleted": true })).into_response())
    } else {
        Err(ApiError::NotFound(format!("no schedule {name}")))
    }
}

/// A schedule as the API shows it.
pub fn schedule_json(s: &Schedule) -> Value {
    let mut body = json!({
        "name": s.name,
        "cron": s.def.cron,
        "scan": s.def.scan,
        "overlap": s.def.overlap.as_str(),
        "nextDue": s.next_due.map(format_time),
        "lastDue": s.last_due.map(format_time),
        "lastScan": s.last_scan,
    });
    if let Some(keep) = s.def.keep {
        body["keep"] = keep.into();
    }
    body
}

/// The state a run shows: its scan's, or why it has none.
pub fn run_state(run: &Run, scan_state: Option<String>, now: OffsetDateTime) -> String {
    match (run.outcome, scan_state) {
        (Outcome::Skipped, _) => SKIPPED.into(),
        (_, Some(state)) => state,
        (Outcome::Failed, None) => format!(
            "failed: {}",
            run.error.as_deref().unwrap_or("the scan did not start")
        ),
        (Outcome::Started, None) => "ended (its record was removed after its retention)".into(),
        (Outcome::Starting, None) if now - run.due > START_GRACE => {
            "failed: did not start (the instance starting it stopped)".into()
        }
        (Outcome::Starting, None) => "starting".into(),
    }
}

fn run_json(run: &Run, scan_state: Option<String>, now: OffsetDateTime) -> Value {
    let mut body = json!({
        "dueTime": format_time(run.due),
        "scanId": if run.outcome == Outcome::Skipped { None } else { run.scan_id.clone() },
        "state": run_state(run, scan_state, now),
    });
    if let Some(prefix) = &run.prefix {
        body["destinationPrefix"] = prefix.clone().into();
        body["pruned"] = run.pruned.into();
    }
    body
}
