//! Verifies `prefix-enqueue`: reads the destination queue straight from Azurite (not through the
//! counting proxy) and counts its messages and the distinct rows they carry, decoding each
//! message with base64 and serde_json only, not with tablescan's own message code.
//!
//! Invariant: the drain is bounded: at most one receive per message the scan says it wrote, plus
//! a few for duplicates (at-least-once delivery may put a step's messages twice).

use std::collections::BTreeSet;
use std::time::Duration;

use base64::Engine;
use serde_json::Value;

use crate::storage::QueueStore;

/// The most messages one receive returns (the Queue service's limit).
const MESSAGES_PER_GET: u8 = 32;

/// Messages and distinct (PartitionKey, RowKey) rows found on the queue.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct QueueContent {
    pub messages: u64,
    pub distinct_rows: u64,
}

/// Receives every message of `queue` (hidden for ten minutes, so each is received once) and
/// counts them and the distinct rows in them.
pub(super) async fn read_queue(
    queues: &impl QueueStore,
    queue: &str,
    expected_messages: u64,
) -> Result<QueueContent, String> {
    let mut keys = BTreeSet::new();
    let mut messages = 0u64;
    let bound = expected_messages * 2 + 16;
    for _ in 0..bound {
        let got = queues
            .get_messages(queue, MESSAGES_PER_GET, Duration::from_secs(600))
            .await
            .map_err(|e| format!("reading queue {queue}: {e}"))?;
        if got.is_empty() {
            return Ok(QueueContent {
                messages,
                distinct_rows: keys.len() as u64,
            });
        }
        for m in got {
            messages += 1;
            for row in message_rows(&m.text)? {
                keys.insert(row);
            }
        }
    }
    Err(format!(
        "queue {queue} still had messages after {bound} receives"
    ))
}

/// The (PartitionKey, RowKey) of every row in one base64-encoded message.
fn message_rows(text: &str) -> Result<Vec<(String, String)>, String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|e| format!("a message is not base64: {e}"))?;
    let body: Value =
        serde_json::from_slice(&bytes).map_err(|e| format!("a message is not JSON: {e}"))?;
    let rows = body["rows"]
        .as_array()
        .ok_or("a message without a rows array")?;
    rows.iter()
        .map(
            |r| match (r["PartitionKey"].as_str(), r["RowKey"].as_str()) {
                (Some(p), Some(k)) => Ok((p.to_string(), k.to_string())),
                _ => Err(format!("a row without keys: {r}")),
            },
        )
        .collect()
}

/// The verdict: every source row on the queue, and at least as many messages as the scan says
/// it wrote (duplicates allowed).
pub(super) fn enqueue_verdict(found: &QueueContent, status: &Value, rows: u64) -> (bool, String) {
    let written = status["rowsWritten"].as_i64().unwrap_or(-1);
    let sent = status["messagesWritten"].as_i64().unwrap_or(-1);
    let ok = found.distinct_rows == rows && written == rows as i64 && found.messages as i64 >= sent;
    (
        ok,
        format!(
            "the queue holds {} messages with {} distinct rows; rowsWritten {written}, messagesWritten {sent}; source {rows} rows",
            found.messages, found.distinct_rows
        ),
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn rows_are_read_from_base64_json() {
        let text = base64::engine::general_purpose::STANDARD
            .encode(r#"{"scanId":"s","rows":[{"PartitionKey":"a","RowKey":"1","X":2}]}"#);
        assert_eq!(message_rows(&text).unwrap(), [("a".into(), "1".into())]);
        assert!(message_rows("not base64!").is_err());
        let found = QueueContent {
            messages: 3,
            distinct_rows: 10,
        };
        let status = json!({"rowsWritten": 10, "messagesWritten": 3});
        assert!(enqueue_verdict(&found, &status, 10).0);
        assert!(!enqueue_verdict(&found, &status, 11).0);
        assert!(
            !enqueue_verdict(
                &found,
                &json!({"rowsWritten": 10, "messagesWritten": 4}),
                10
            )
            .0
        );
    }
}
