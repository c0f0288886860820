//! `GetScan`: `GET /api/scans/{id}` — state, parameters and exact counters of one scan.
//!
//! Invariant: cheap however big the scan, and it never writes. It costs one point read of the
//! record and one query of the counter rows; a running scan whose counters show every work item
//! finished (its last worker died before ending it, or its completion step keeps failing) gets
//! one queue put on top: its drained check, queued ([`Runner::queue_drained_check`]), at most
//! once per [`NUDGE_INTERVAL`] per scan and instance, and not while a completion step holds the
//! scan's lease. The GET answers what it read; queued work ends the scan.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use axum::extract::{Path, State};
use axum::Json;
use serde_json::Value;

use crate::app::error::ApiError;
use crate::app::job::{is_valid_scan_id, Drivers};
use crate::app::state::AppState;
use crate::app::tracking::retention::Kept;
use crate::app::tracking::{format_time, Counters, ScanRecord, ScanState, Tracker};
use crate::app::work::Runner;
use crate::storage::stores::Stores;
use crate::storage::TableStore;

use super::status::status_json;

/// Shortest time between two drained checks one instance queues for the same scan.
const NUDGE_INTERVAL: Duration = Duration::from_secs(30);
/// Most scans whose last queued check an instance remembers (the map is cleared when full).
const NUDGES_REMEMBERED: usize = 256;

static NUDGED: Mutex<Option<HashMap<String, Instant>>> = Mutex::new(None);

pub async fn handle<S: Stores>(
    State(state): State<Arc<AppState<S>>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let tracker = state.tracker_on(state.bookkeeping());
    if !is_valid_scan_id(&id) {
        return Err(not_found(&id));
    }
    let kept = tracker.get_kept(&id).await?.ok_or_else(|| not_found(&id))?;
    let (record, lease) = (&kept.record, kept.lease);
    let counters = counters_of(&tracker, &kept).await?;
    let leased = lease.is_some_and(|until| until > tracker.now());
    if record.state == ScanState::Running
        && counters.created > 0
        && counters.pending() == 0
        && !leased
        && first_nudge_in_a_while(&id)
    {
        let runner = Runner::new(&state);
        let queued = match runner.usable_context(record) {
            Ok(context) => runner.queue_drained_check(&context).await,
            Err(e) => Err(ApiError::field("id", e)),
        };
        if let Err(e) = queued {
            tracing::warn!(scan = %id, error = %e, "could not queue the drained check of a scan found drained but running");
        }
    }
    let mut status = status_json(record, &counters, tracker.now());
    // Only a scan the service refused (`refusedRequests`) was ever paced: the others' status
    // costs no query of their pacing rows.
    let mut rates = serde_json::Map::new();
    if counters.refused_requests > 0 {
        let (work, now) = (&state.config.work_table, crate::app::pace::now_us());
        rates = crate::app::pace::adaptive::rates_of(state.bookkeeping(), work, &id, now).await?;
    }
    status["pacing"] = Value::Object(rates);
    if status.get("estimatedStorageRequests").is_some() && kept.work_removed_at.is_none() {
        status["sampleKeys"] = sample_keys(&tracker, record).await?;
    }
    if let Some(at) = kept.work_removed_at {
        status["workRowsRemovedAt"] = Value::from(format_time(at));
    }
    Ok(Json(status))
}

/// A scan's counters: those kept on its record once its cleanup began (its counter rows may be
/// gone), else its counter rows' sums (one query).
async fn counters_of<S: TableStore>(
    tracker: &Tracker<'_, S>,
    kept: &Kept,
) -> Result<Counters, ApiError> {
    Ok(match kept.final_counters {
        Some(counters) => counters,
        None => tracker.totals(&kept.record.id, kept.record.shards).await?,
    })
}

/// A dry run's sample of the rows it would delete: the first [`SAMPLE_KEYS`] keys its work
/// items named as their results (one query over its shard partitions, one page).
async fn sample_keys<S: TableStore>(
    tracker: &Tracker<'_, S>,
    record: &ScanRecord,
) -> Result<Value, ApiError> {
    let results = tracker
        .some_work_results(&record.id, record.shards, SAMPLE_KEYS as u32)
        .await?;
    let keys = results
        .iter()
        .filter_map(|r| serde_json::from_str::<Vec<Value>>(r).ok())
        .flatten()
        .take(SAMPLE_KEYS);
    Ok(Value::Array(keys.collect()))
}

/// Keys a dry run's status names (`drivers::kit::deletes::SAMPLE_KEYS`, which a handler may
/// not import: each item's result names up to as many).
const SAMPLE_KEYS: usize = 20;

/// Whether this instance has not queued a drained check of `id` within [`NUDGE_INTERVAL`]
/// (and records that it now does).
fn first_nudge_in_a_while(id: &str) -> bool {
    let mut guard = NUDGED.lock().unwrap_or_else(|p| p.into_inner());
    let map = guard.get_or_insert_with(HashMap::new);
    let now = Instant::now();
    if map
        .get(id)
        .is_some_and(|at| now.duration_since(*at) < NUDGE_INTERVAL)
    {
        return false;
    }
    if map.len() >= NUDGES_REMEMBERED {
        map.clear();
    }
    map.insert(id.to_string(), now);
    true
}

fn not_found(id: &str) -> ApiError {
    ApiError::NotFound(format!(
        "no scan with id {id:?}: it never existed, or it ended longer ago than \
         TABLESCAN_SCAN_RETENTION and its record was removed"
    ))
}

/// Reads a scan's status for a cancel's answer and the benchmark; a running scan whose work has
/// all finished is ended here too (in case the worker that finished last died before noticing)
/// — unless its driver has a completion step or phases, which only queued work runs.
pub async fn scan_status<S: TableStore, A>(
    tracker: &Tracker<'_, S>,
    id: &str,
    drivers: &Drivers<A>,
) -> Result<Value, ApiError> {
    let (mut record, counters) = read_status(tracker, id).await?;
    let completes = record
        .recorded_context()
        .ok()
        .and_then(|c| {
            drivers
                .get(c.driver.as_str())
                .map(|d| d.completes() || d.phases() > 0)
        })
        .unwrap_or(true);
    if record.state == ScanState::Running
        && counters.pending() == 0
        && !completes
        && tracker.finish_if_drained(id, record.shards).await?
    {
        record = tracker.get_scan(id).await?.unwrap_or(record);
    }
    Ok(status_json(&record, &counters, tracker.now()))
}

async fn read_status<S: TableStore>(
    tracker: &Tracker<'_, S>,
    id: &str,
) -> Result<(ScanRecord, Counters), ApiError> {
    if !is_valid_scan_id(id) {
        return Err(not_found(id));
    }
    let kept = tracker.get_kept(id).await?.ok_or_else(|| not_found(id))?;
    let counters = counters_of(tracker, &kept).await?;
    Ok((kept.record, counters))
}
