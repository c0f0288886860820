//! The scan status document returned by the scan API.

use serde_json::{json, Value};
use time::OffsetDateTime;

use crate::app::tracking::{format_time, Counters, ScanRecord, ScanState};

/// `{"id", "state", ...parameters..., counters, times, error}` in camelCase.
///
/// Work-item figures: while a scan runs, `pendingWorkItems` are registered items not finished
/// yet. Once it has ended nothing more will run, so `pendingWorkItems` is 0 and
/// `droppedWorkItems` counts every item that will never run: those already dropped plus those
/// whose queued messages drop them as they are delivered, so the figure stays put while that
/// cleanup goes on (an item already executing when the scan ended may still finish and leave it).
///
/// `maxRequestsPerSecond` is the scan's rate limit (`null`: none); `requestsPerSecond` the rate
/// achieved: `storageRequests` over the time from `startedAt` to `completedAt` (or `now`, the
/// app's clock). `refusedRequests` counts the storage attempts the service refused for load
/// (503, 500 `OperationTimedOut`; each retried, not in `storageRequests`), and `pacing` (added
/// by `get_scan`) the adaptive rate each account settled at (docs/rate-limit.md).
///
/// `rowsChanged` counts rows a delete kept because they changed since they were read (a `412`
/// to the delete sent with the row's ETag), `rowsSkipped` rows an expire left alone because
/// their key holds no time it can read. A dry run (`"dryRun": true` among the parameters) also
/// has `estimatedStorageRequests`, what the real run would send (`get_scan` adds its
/// `sampleKeys`).
pub fn status_json(record: &ScanRecord, counters: &Counters, now: OffsetDateTime) -> Value {
    let (pending, dropped) = match record.state {
        ScanState::Running => (counters.pending(), counters.dropped),
        _ => (0, counters.dropped + counters.pending()),
    };
    let limit = record
        .context
        .as_ref()
        .and_then(|c| c.max_requests_per_second);
    let end = record.completed_at.unwrap_or(now);
    let elapsed = (end - record.started_at).as_seconds_f64();
    let rate = if elapsed > 0.0 {
        (counters.storage_requests as f64 / elapsed * 10.0).round() / 10.0
    } else {
        0.0
    };
    let mut status = json!({
        "id": record.id,
        "state": record.state.as_str(),
        "parameters": record.request,
        "rowsScanned": counters.rows_scanned,
        "rowsWritten": counters.rows_written,
        "rowsMatched": counters.rows_matched,
        "rowsChanged": counters.rows_changed,
        "rowsSkipped": counters.rows_skipped,
        "storageRequests": counters.storage_requests,
        "refusedRequests": counters.refused_requests,
        "maxRequestsPerSecond": limit,
        "requestsPerSecond": rate,
        "messagesProcessed": counters.messages,
        "messagesWritten": counters.messages_written,
        "pendingWorkItems": pending,
        "failedWorkItems": counters.failed,
        "droppedWorkItems": dropped,
        "startedAt": format_time(record.started_at),
        "completedAt": record.completed_at.map(format_time),
        "error": record.error,
    });
    if record.request.get("dryRun") == Some(&Value::Bool(true)) {
        // What the real run would send: the dry run's reads and its planned transactions.
        status["estimatedStorageRequests"] =
            json!(counters.storage_requests + counters.planned_requests);
    }
    status
}
