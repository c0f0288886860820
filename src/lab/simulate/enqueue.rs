//! The enqueue driver in the simulator (issue 26): the destination queue as a sink, and the
//! figures of an enqueue run against its minimum and against the queue's rate (its floor is
//! `summary::enqueue_floor`, its report section `report::enqueue_section`).
//!
//! Invariants:
//! - **The destination queue stores nothing.** A put to it is admitted against the queue's
//!   message rate (2,000/s: puts beyond it answer `503 ServerBusy` and are retried with the
//!   adapters' policy, every attempt counted, as for every queue of the model), then its rows
//!   are recorded in the run's [`Sink`] by their keys and the text is dropped: 35 million
//!   messages would not fit in memory, and no consumer is modelled.
//! - **Decoded independently of tablescan's message code**: base64, then a JSON parser that
//!   reads the keys of each row of `rows`, as a consumer would.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use base64::Engine;
use serde::{Deserialize, Serialize};

use crate::storage::request_counts::RequestCounts;
use crate::storage::{StorageError, StorageResult, MAX_TAKE};

use super::data::{Sink, SyntheticTable};
use super::model::Model;

/// The queue the simulated enqueue scans put their rows on.
pub const DESTINATION_QUEUE: &str = "rows-to-process";

/// An enqueue scan's destination: its name, and the sink that records the rows put on it.
pub struct QueueSink {
    pub queue: String,
    sink: Arc<Sink>,
    /// Messages accepted by the queue.
    messages: AtomicU64,
    /// Rows in those messages, repeats included.
    rows: AtomicU64,
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow)]
    rows: Vec<Keys<'a>>,
}

#[derive(Deserialize)]
struct Keys<'a> {
    #[serde(rename = "PartitionKey", borrow)]
    partition_key: Cow<'a, str>,
    #[serde(rename = "RowKey", borrow)]
    row_key: Cow<'a, str>,
}

impl QueueSink {
    pub fn new(queue: &str, sink: Arc<Sink>) -> Self {
        QueueSink {
            queue: queue.to_string(),
            sink,
            messages: AtomicU64::new(0),
            rows: AtomicU64::new(0),
        }
    }

    /// Records one accepted message (base64 of `{"scanId", "rows": [...]}`); its row count.
    pub fn accept(&self, text: &str) -> StorageResult<usize> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|e| StorageError::invalid_input(format!("a message is not base64: {e}")))?;
        let message: Message = serde_json::from_slice(&bytes)
            .map_err(|e| StorageError::invalid_input(format!("a message is not JSON: {e}")))?;
        let n = message.rows.len();
        self.sink.record(
            message
                .rows
                .iter()
                .map(|k| (k.partition_key.as_ref(), k.row_key.as_ref())),
        );
        self.messages.fetch_add(1, Ordering::Relaxed);
        self.rows.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }

    pub fn messages(&self) -> u64 {
        self.messages.load(Ordering::Relaxed)
    }

    pub fn rows(&self) -> u64 {
        self.rows.load(Ordering::Relaxed)
    }
}

/// An enqueue scenario's figures (simulated), beside its minimum and the queue's floor.
#[derive(Debug, Clone, Serialize)]
pub struct EnqueueFigures {
    pub rows_per_message: u32,
    /// Messages the destination queue accepted (a step's puts again after a redelivery too).
    pub messages: u64,
    /// Rows in those messages beyond one per source row (redeliveries).
    pub duplicate_rows: u64,
    /// Puts to the destination refused by its message rate (503), each retried.
    pub refused_puts: u64,
    /// The fewest messages: one per `rows_per_message` rows.
    pub minimum_messages: u64,
    /// The fewest requests: one query per 1,000 rows read plus one put per message.
    pub minimum_requests: u64,
    /// The queue's rate alone: `minimum_messages` ÷ messages per second.
    pub queue_floor_seconds: f64,
    /// Every request of the run (tables and queues, every attempt, the host's receives too).
    pub requests: u64,
    /// Those the service admitted (not refused by a rate).
    pub admitted_requests: u64,
    /// `admitted_requests` ÷ `minimum_requests` (goal ≤ 1.10).
    pub admitted_ratio_to_minimum: f64,
    /// `requests` ÷ `minimum_requests`, refused attempts included.
    pub ratio_to_minimum: f64,
    /// `requests` by kind, tables and queues (where the requests beyond the minimum go).
    pub by_kind: RequestCounts,
}

/// The figures of an enqueue run of `source` at `rows_per_message`.
pub fn figures(
    source: &SyntheticTable,
    model: &Model,
    rows_per_message: u32,
    queue: &QueueSink,
    refused_puts: u64,
    (requests, refused): (u64, u64),
    by_kind: RequestCounts,
) -> EnqueueFigures {
    let rows = source.total_rows();
    let minimum_messages = rows.div_ceil(u64::from(rows_per_message.max(1)));
    let minimum_requests = rows.div_ceil(u64::from(MAX_TAKE)) + minimum_messages;
    let admitted = requests - refused;
    EnqueueFigures {
        rows_per_message,
        messages: queue.messages(),
        duplicate_rows: queue.rows().saturating_sub(rows),
        refused_puts,
        minimum_messages,
        minimum_requests,
        queue_floor_seconds: minimum_messages as f64 / model.queue_messages_per_sec,
        requests,
        admitted_requests: admitted,
        admitted_ratio_to_minimum: admitted as f64 / minimum_requests as f64,
        ratio_to_minimum: requests as f64 / minimum_requests as f64,
        by_kind,
    }
}
