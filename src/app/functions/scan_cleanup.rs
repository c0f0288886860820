//! `ScanCleanup` (queue trigger on `<scan step queue>-cleanup`): removes what an ended scan
//! leaves behind once its retention periods end (docs/retention.md).
//!
//! The end of every scan queues one cleanup message, invisible for `TABLESCAN_WORK_RETENTION`
//! (at most [`MAX_HOP`] at a time). Its delivery records the scan's final counters on its record,
//! deletes its work rows a bounded number at a time (queuing itself again until none is left),
//! notes `WorkRemovedAt`, sweeps a few expired records of other scans, and queues itself once
//! more for when the record's own retention ends, when it deletes the record. Every delivery is
//! idempotent: it reads where the scan stands and does the next step. Nothing runs while no scan
//! ends: there is no timer.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::app::job::is_valid_scan_id;
use crate::app::protocol::{InvocationRequest, InvocationResponse};
use crate::app::state::AppState;
use crate::app::tracking::retention::Due;
use crate::app::tracking::{ScanEndHook, ScanState, Tracker};
use crate::storage::stores::Stores;
use crate::storage::{QueueStore, StorageError, TableStore};

/// Longest delay of one cleanup message: below the queue's 7-day message time-to-live, which a
/// message's visibility delay may not reach. Longer periods take several hops.
pub const MAX_HOP: Duration = Duration::from_secs(6 * 86_400);
/// Delay before the next delivery of a cleanup that has more rows to delete.
const MORE_WORK_DELAY: Duration = Duration::from_secs(1);

/// The cleanup message: `{"scan": "<scanId>"}` (base64 on the queue, as the host expects).
#[derive(Debug, Serialize, Deserialize)]
struct CleanupMessage {
    scan: String,
}

pub async fn handle<S: Stores>(
    State(state): State<Arc<AppState<S>>>,
    body: Bytes,
) -> InvocationResponse {
    let (status, line) = match cleanup_scan_id(&body) {
        Err(line) => (StatusCode::OK, line),
        Ok(scan_id) => match state.clean_scan(&scan_id).await {
            Ok(line) => (StatusCode::OK, line),
            Err(e) => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("cleanup of scan {scan_id}: storage: {e}"),
            ),
        },
    };
    if status.is_success() {
        tracing::info!("{line}");
        InvocationResponse::ok(vec![line])
    } else {
        tracing::warn!("{line}");
        InvocationResponse::failed(status, vec![line])
    }
}

/// The scan id of a cleanup invocation; `Err`: why it names none (dropped: it never will).
fn cleanup_scan_id(body: &[u8]) -> Result<String, String> {
    let request: InvocationRequest = serde_json::from_slice(body)
        .map_err(|e| format!("dropped a cleanup invocation with an invalid payload: {e}"))?;
    let invocation = request
        .queue_invocation()
        .map_err(|e| format!("dropped a cleanup invocation: {e}"))?;
    let message: CleanupMessage = serde_json::from_str(&invocation.message)
        .map_err(|e| format!("dropped an undecodable cleanup message: {e}"))?;
    if !is_valid_scan_id(&message.scan) {
        return Err(format!(
            "dropped a cleanup message: {:?} is not a scan id",
            message.scan
        ));
    }
    Ok(message.scan)
}

impl<S: Stores> AppState<S> {
    /// Queues the cleanup of `scan_id`, visible after `delay` (at most [`MAX_HOP`]); creates
    /// the cleanup queue on first use.
    pub async fn queue_cleanup(&self, scan_id: &str, delay: Duration) -> Result<(), StorageError> {
        let json = serde_json::to_string(&CleanupMessage {
            scan: scan_id.to_string(),
        })
        .expect("a cleanup message serializes");
        let text = crate::app::messages::queue_text(json.as_bytes());
        let (queue, delay) = (&self.config.cleanup_queue, delay.min(MAX_HOP));
        match self.queues.put_message(queue, &text, delay).await {
            Err(e) if e.is_not_found() => {
                self.queues.create_queue(queue).await?;
                self.queues.put_message(queue, &text, delay).await
            }
            other => other,
        }
    }

    /// One cleanup delivery for `scan_id`: does what is due (see the module) and says what.
    pub async fn clean_scan(&self, scan_id: &str) -> Result<String, StorageError> {
        let tracker = self.tracker_on(self.bookkeeping());
        let now = tracker.now();
        let Some(kept) = tracker.get_kept(scan_id).await? else {
            return Ok(format!(
                "scan {scan_id} has no record (removed, or never existed): nothing to clean"
            ));
        };
        let record = &kept.record;
        if record.state == ScanState::Running {
            return Ok(format!(
                "scan {scan_id} is running: its end queues its cleanup"
            ));
        }
        let ended = record.completed_at.unwrap_or(record.started_at);
        let retention = self.config.retention;
        match retention.due(ended, kept.work_removed_at.is_some(), now) {
            Due::Wait(delay) => {
                self.queue_cleanup(scan_id, delay).await?;
                Ok(format!(
                    "scan {scan_id}: nothing due; again in {}s",
                    delay.as_secs()
                ))
            }
            Due::RemoveWork => {
                tracker.keep_final_counters(&kept).await?;
                if !tracker.remove_some_work(scan_id, record.shards).await? {
                    self.queue_cleanup(scan_id, MORE_WORK_DELAY).await?;
                    return Ok(format!(
                        "scan {scan_id}: removed some work rows; more next delivery"
                    ));
                }
                tracker.mark_work_removed(scan_id).await?;
                let swept = self.sweep_expired(&tracker, now).await?;
                let delay = match retention.due(ended, true, now) {
                    Due::Wait(delay) => delay,
                    _ => Duration::ZERO,
                };
                self.queue_cleanup(scan_id, delay).await?;
                Ok(format!(
                    "scan {scan_id}: work rows removed, final counters kept on its record; \
                     {swept} expired record(s) of other scans swept"
                ))
            }
            Due::RemoveRecord => {
                tracker.delete_record(scan_id).await?;
                Ok(format!("scan {scan_id}: record removed"))
            }
        }
    }

    /// Deletes up to `SWEEP_RECORDS` expired records whose work rows are gone, and queues the
    /// cleanup of those whose rows are not (a scan that ended before this version, or whose
    /// cleanup message was lost): the records of scans whose own cleanup never ran.
    async fn sweep_expired<T: TableStore>(
        &self,
        tracker: &Tracker<'_, T>,
        now: OffsetDateTime,
    ) -> Result<usize, StorageError> {
        let expired = tracker
            .expired_records(now - self.config.retention.scan)
            .await?;
        for kept in &expired {
            match kept.work_removed_at {
                Some(_) => tracker.delete_record(&kept.record.id).await?,
                None => self.queue_cleanup(&kept.record.id, Duration::ZERO).await?,
            }
        }
        Ok(expired.len())
    }
}

/// The end of a scan queues its cleanup (best effort: if the put fails, the sweep finds the
/// record once it expires and cleans up then).
impl<S: Stores> ScanEndHook for AppState<S> {
    fn scan_ended<'b>(&'b self, scan_id: &'b str) -> BoxFuture<'b, ()> {
        Box::pin(async move {
            if let Err(e) = self
                .queue_cleanup(scan_id, self.config.retention.work)
                .await
            {
                tracing::warn!(scan = %scan_id, error = %e, "could not queue the retention cleanup of an ended scan; the sweep removes its rows once its record expires");
            }
        })
    }
}
