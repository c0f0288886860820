//! The scan status document returned by the scan API.

use serde_json::{json, Value};

use crate::app::tracking::{format_time, Counters, ScanRecord, ScanState};

/// `{"id", "state", ...parameters..., counters, times, error}` in camelCase.
///
/// Work-item figures: while a scan runs, `pendingWorkItems` are registered items not finished
/// yet. Once it has ended nothing more will run, so `pendingWorkItems` is 0 and
/// `droppedWorkItems` counts every item that will never run: those already dropped plus those
/// whose queued messages drop them as they are delivered, so the figure stays put while that
/// cleanup goes on (an item already executing when the scan ended may still finish and leave it).
pub fn status_json(record: &ScanRecord, counters: &Counters) -> Value {
    let (pending, dropped) = match record.state {
        ScanState::Running => (counters.pending(), counters.dropped),
        _ => (0, counters.dropped + counters.pending()),
    };
    json!({
        "id": record.id,
        "state": record.state.as_str(),
        "parameters": record.request,
        "rowsScanned": counters.rows_scanned,
        "rowsWritten": counters.rows_written,
        "rowsMatched": counters.rows_matched,
        "storageRequests": counters.storage_requests,
        "messagesProcessed": counters.messages,
        "messagesWritten": counters.messages_written,
        "pendingWorkItems": pending,
        "failedWorkItems": counters.failed,
        "droppedWorkItems": dropped,
        "startedAt": format_time(record.started_at),
        "completedAt": record.completed_at.map(format_time),
        "error": record.error,
    })
}
