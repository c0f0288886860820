//! `Scheduler` (timer trigger, schedule `%TABLESCAN_SCHEDULER_SCHEDULE%`): starts the scans
//! that are due. The timer's payload (`Data.timer`: `Schedule`, `ScheduleStatus`, `IsPastDue`)
//! only shows in the log: what is due is decided from the schedules' rows and the app's clock,
//! so a late, duplicated or missed firing changes nothing (docs/schedules.md).
//!
//! Order for one due schedule (invariants of `super`): read its row (for its ETag), decide,
//! claim the due time (insert its run row), then start the scan or record the skip, record the
//! outcome on the run row, move the schedule to its next due time, prune old exports.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::Value;
use time::OffsetDateTime;

use crate::app::functions::start_scan;
use crate::app::protocol::{InvocationRequest, InvocationResponse};
use crate::app::state::AppState;
use crate::app::tracking::ScanState;
use crate::storage::stores::Stores;
use crate::storage::StorageError;

use super::api::schedules;
use super::decide::{decide, Action, LastRun};
use super::store::{Outcome, Run, Schedule, ScheduleStore};
use super::{scan_body_at, scan_id, stamp, Overlap};
use crate::cron::Cron;

/// The timer binding's name in `function-defs/Scheduler/function.json`.
pub const TIMER_BINDING: &str = "timer";

pub async fn handle<S: Stores>(
    State(state): State<Arc<AppState<S>>>,
    body: Bytes,
) -> InvocationResponse {
    let past_due = serde_json::from_slice::<InvocationRequest>(&body)
        .ok()
        .and_then(|r| r.data.get(TIMER_BINDING).cloned())
        .and_then(|t| t.get("IsPastDue").and_then(Value::as_bool))
        .unwrap_or(false);
    match fire(&state).await {
        Ok(mut lines) => {
            if past_due {
                lines.insert(0, "the timer fired past due".into());
            }
            for line in &lines {
                tracing::info!("{line}");
            }
            InvocationResponse::ok(lines)
        }
        Err(e) => {
            let line = format!("scheduler: storage: {e}");
            tracing::warn!("{line}");
            InvocationResponse::failed(StatusCode::SERVICE_UNAVAILABLE, vec![line])
        }
    }
}

/// One firing: every due schedule (one query when none is due). A schedule whose handling
/// fails is logged and left for the next firing; the others go on.
pub async fn fire<S: Stores>(state: &AppState<S>) -> Result<Vec<String>, StorageError> {
    let now = state.clock.now();
    let store = schedules(state);
    let due = store.due_schedules(now).await?;
    let mut lines = Vec::new();
    for schedule in due {
        let line = match fire_one(state, &store, &schedule.name, now).await {
            Ok(line) => line,
            Err(e) => format!("schedule {}: storage: {e}", schedule.name),
        };
        lines.push(line);
    }
    Ok(lines)
}

/// Handles one schedule found due: returns what happened, as a log line.
async fn fire_one<S: Stores>(
    state: &AppState<S>,
    store: &ScheduleStore<'_, S::Table>,
    name: &str,
    now: OffsetDateTime,
) -> Result<String, StorageError> {
    let Some(schedule) = store.get(name).await? else {
        return Ok(format!("schedule {name}: deleted meanwhile"));
    };
    let cron = match Cron::parse(&schedule.def.cron) {
        Ok(cron) => cron,
        Err(e) => {
            store.advance(&schedule, None, None).await?;
            return Ok(format!("schedule {name}: stopped: cron {e}"));
        }
    };
    let last = last_run(state, &schedule).await?;
    let decision = decide(&cron, schedule.def.overlap, schedule.next_due, last, now);
    let Some((due, action)) = decision.due else {
        store.advance(&schedule, decision.next_due, None).await?;
        return Ok(format!("schedule {name}: nothing due"));
    };
    let body = scan_body_at(&schedule.def.scan, due);
    let id = scan_id(name, due);
    let mut run = Run {
        due,
        outcome: match action {
            Action::Start => Outcome::Starting,
            Action::Skip => Outcome::Skipped,
        },
        scan_id: Some(id.clone()),
        error: None,
        prefix: export_prefix(&body),
        claim: uuid::Uuid::new_v4().to_string(),
        pruned: false,
    };
    if !store.claim_run(name, &run).await? {
        store.advance(&schedule, decision.next_due, None).await?;
        return Ok(format!(
            "schedule {name}: due {} already claimed",
            stamp(due)
        ));
    }
    let line = match action {
        Action::Skip => {
            store.advance(&schedule, decision.next_due, None).await?;
            format!(
                "schedule {name}: due {} skipped: previous run still running",
                stamp(due)
            )
        }
        Action::Start => match start_scan::start_as(state, body, id.clone()).await {
            Ok(_) => {
                run.outcome = Outcome::Started;
                store.update_run(name, &run).await?;
                store
                    .advance(&schedule, decision.next_due, Some((due, &id)))
                    .await?;
                format!("schedule {name}: due {} started scan {id}", stamp(due))
            }
            Err(e) => {
                run.outcome = Outcome::Failed;
                run.error = Some(e.to_string());
                store.update_run(name, &run).await?;
                store.advance(&schedule, decision.next_due, None).await?;
                format!("schedule {name}: due {} failed to start: {e}", stamp(due))
            }
        },
    };
    let kept = super::keep::after_run(state, store, &schedule).await;
    Ok(match kept {
        Ok(note) => format!("{line}{note}"),
        Err(e) => format!("{line}; pruning old runs: {e}"),
    })
}

/// The state of the schedule's last started scan (read only when overlap is `skip`).
async fn last_run<S: Stores>(
    state: &AppState<S>,
    schedule: &Schedule,
) -> Result<LastRun, StorageError> {
    let (Overlap::Skip, Some(id)) = (schedule.def.overlap, &schedule.last_scan) else {
        return Ok(LastRun::None);
    };
    let tracker = state.tracker_on(state.bookkeeping());
    Ok(match tracker.get_scan(id).await? {
        None => LastRun::None,
        Some(record) if record.state == ScanState::Running => LastRun::Running,
        Some(_) => LastRun::Ended,
    })
}

/// An export run's destination prefix, as its scan writes it.
fn export_prefix(body: &Value) -> Option<String> {
    (body.get("driver").and_then(Value::as_str) == Some("export"))
        .then(|| body.get("destinationPrefix").and_then(Value::as_str))
        .flatten()
        .map(str::to_string)
}
