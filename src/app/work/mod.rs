//! The life of one queue work item, shared by the PrefixScan and TableCopy functions:
//! decode → read the scan's recorded context and check the scan is running and the item
//! unfinished → execute (or adopt the outcome an earlier execution recorded) → register and
//! enqueue children → commit completion with counters → detect the end of the scan. See
//! `tracking` for why this is exact under at-least-once delivery.
//!
//! A message names only its scan and its work; what to read and write comes from the scan's
//! recorded [`ScanContext`], never from the message. Work of a scan that has ended is dropped:
//! its row is finished as `dropped`, so an ended scan leaves no pending rows behind.
//!
//! [`run`] is the one path of every kind of work: [`begin`] (decode, check, adopt), the work's
//! own [`Work::execute`], [`finish`] (commit); [`poison`] fails items for good.

mod begin;
mod finish;
mod poison;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use std::future::Future;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use futures::future::try_join_all;
use serde::{Deserialize, Serialize};

use crate::retry::{retry, Backoff, Failure, NoJitter};
use crate::storage::{Entity, QueueStore, StorageError, TableStore};

use super::config::STORAGE_SETTING;
use super::drivers::range::RangeWork;
use super::functions::start_scan::recorded_context;
use super::functions::status::is_valid_scan_id;
use super::messages::{
    self, ChildSpec, ItemMessage, MessageError, ScanContext, StepMessage, WorkMessage,
};
use super::observe;
use super::protocol::{InvocationRequest, InvocationResponse, QueueInvocation};
use super::state::{AppState, Counted};
use super::tracking::{Completion, Counters, NewWork, RecordError, ScanState, Tracker, WorkState};

/// What executing a work item produced: children to spawn and counters to add.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkOutcome {
    #[serde(rename = "c")]
    pub children: Vec<ChildSpec>,
    #[serde(rename = "d")]
    pub delta: Counters,
    /// The driver's result for this item, kept on its finished row (e.g. an export part's
    /// descriptor; read back with `Tracker::work_results`). Short: the row must fit an entity.
    #[serde(rename = "r", default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// The outcome's first driver work item lives in the item's own shard (registered in the
    /// transaction that recorded the outcome). Written by the version before [`first_grouped`]
    /// and still honoured when read; outcomes with neither flag (earlier versions) have their
    /// children in the shards their ids hash to.
    ///
    /// [`first_grouped`]: WorkOutcome::first_grouped
    #[serde(rename = "g", default, skip_serializing_if = "std::ops::Not::not")]
    pub grouped: bool,
    /// The outcome's first child, of either kind (a scan step's follow-up step, or a work
    /// item), lives in the item's own shard, registered in the transaction that recorded the
    /// outcome (what this version records). One, not all: siblings in one shard contend for its
    /// counter (in the simulator, every follow-up step in the parent's shard cost 4 % more
    /// requests and 6–20 s more at 3.56M rows than the registrations saved).
    #[serde(rename = "g1", default, skip_serializing_if = "std::ops::Not::not")]
    pub first_grouped: bool,
    /// Rows a scan step read for its driver to work on (scans that work in their steps), once
    /// the step's children are registered and queued, so that they start meanwhile. Never
    /// recorded: see `in_step`.
    #[serde(skip)]
    pub rows: Vec<Entity>,
    /// The key ranges of `rows`, one per run of contiguous rows, recorded with the outcome: a
    /// delivery that adopts the outcome (the recording one died, or lost the race) reads them
    /// again and works on them (`drivers::rework_range`), since it cannot know whether the
    /// recording delivery did.
    #[serde(rename = "ir", default, skip_serializing_if = "Vec::is_empty")]
    pub in_step: Vec<RangeWork>,
}

impl WorkOutcome {
    /// Whether child `i` lives in the recording item's own shard (see [`WorkOutcome::grouped`]
    /// and [`WorkOutcome::first_grouped`]); the others live where their ids hash.
    pub fn in_own_shard(&self, i: usize) -> bool {
        let first_item = || {
            self.children
                .iter()
                .position(|c| matches!(c, ChildSpec::Item(_)))
        };
        if self.first_grouped {
            return i == 0;
        }
        self.grouped && first_item() == Some(i)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WorkError {
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
    #[error("{0}")]
    Failed(String),
    /// Fails the same way on every attempt (a row that cannot be addressed, a record over the
    /// service's limits): recorded as failed at once instead of after every retry.
    #[error("{0}")]
    Permanent(String),
}

impl WorkError {
    /// Whether retrying cannot help: recorded as failed on the first attempt.
    pub fn is_permanent(&self) -> bool {
        match self {
            WorkError::Permanent(_) => true,
            WorkError::Storage(s) => s.kind == crate::storage::StorageErrorKind::InvalidInput,
            WorkError::Failed(_) => false,
        }
    }
}

impl From<crate::scan::ScanError> for WorkError {
    fn from(e: crate::scan::ScanError) -> Self {
        match e {
            crate::scan::ScanError::Storage(s) => WorkError::Storage(s),
            e @ crate::scan::ScanError::Unaddressable(_) => WorkError::Permanent(e.to_string()),
            other => WorkError::Failed(other.to_string()),
        }
    }
}

impl From<MessageError> for WorkError {
    fn from(e: MessageError) -> Self {
        WorkError::Failed(e.to_string())
    }
}

/// Where a begun item stands.
enum Progress {
    /// Not executed yet: execute it, then record the outcome under this ETag.
    Fresh { etag: String },
    /// An earlier execution recorded this outcome: finish it without executing again.
    Recorded { etag: String, outcome: WorkOutcome },
}

/// A decoded, unfinished work item.
pub struct Begun<M> {
    pub message: M,
    /// The scan's recorded context: what the item reads and writes.
    pub scan: Arc<ScanContext>,
    pub invocation: QueueInvocation,
    pub work_id: String,
    /// The counter shard of the item's row (see [`messages::shard_for`]).
    pub shard: u32,
    progress: Progress,
    /// Storage requests made on behalf of this item.
    pub requests: Arc<AtomicU64>,
}

impl<M> Begun<M> {
    /// Whether the item still has to be executed (no outcome was recorded by an earlier attempt).
    pub fn needs_execution(&self) -> bool {
        matches!(self.progress, Progress::Fresh { .. })
    }
}

/// Messages that belong to a scan.
/// A unit of queue work that knows how to run itself: one module per kind (scan steps in
/// `functions/prefix_scan.rs`, driver work items in `functions/table_copy.rs`), all run by [`run`].
pub trait Work: WorkMessage + Send + Sync {
    /// Does the work of one begun item; its outcome is committed by [`AppState::finish`].
    fn execute<T: TableStore + Clone, Q: QueueStore + Clone>(
        state: &AppState<T, Q>,
        begun: &Begun<Self>,
    ) -> impl Future<Output = Result<WorkOutcome, WorkError>> + Send;
}

/// The one execution path of every queue function: decode and check the item ([`AppState::begin`]),
/// execute it unless an earlier delivery recorded its outcome, then commit ([`AppState::finish`]).
/// Its outcome is observed as one line ([`observe::Invocation`]).
pub async fn run<M: Work, T: TableStore + Clone, Q: QueueStore + Clone>(
    State(state): State<Arc<AppState<T, Q>>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> InvocationResponse {
    let observed =
        observe::Invocation::start::<M>(&uri, &headers, &body, state.config.max_dequeue_count);
    observed.finish(execute::<M, T, Q>(&state, &body).await)
}

async fn execute<M: Work, T: TableStore + Clone, Q: QueueStore + Clone>(
    state: &AppState<T, Q>,
    body: &[u8],
) -> InvocationResponse {
    let begun = match state.begin::<M>(body).await {
        Ok(begun) => begun,
        Err(reply) => return reply,
    };
    let result = if begun.needs_execution() {
        M::execute(state, &begun).await
    } else {
        Ok(WorkOutcome::default())
    };
    state.finish(begun, result).await
}

/// A child work item ready to be registered and queued.
pub(crate) struct ChildMessage {
    pub(crate) work: NewWork,
    pub(crate) queue: String,
    pub(crate) text: String,
}

impl ChildMessage {
    fn new<M: WorkMessage>(message: &M, queue: &str, shards: u32) -> Result<Self, MessageError> {
        let id = messages::work_id(message);
        Ok(ChildMessage {
            work: NewWork {
                shard: messages::shard_for(message, &id, shards),
                id,
                kind: M::NAME,
            },
            queue: queue.to_string(),
            text: messages::encode(message)?,
        })
    }
}

/// Why a scan's context could not be had.
enum ScanLookupError {
    Storage(StorageError),
    /// The record exists but its context cannot be derived.
    Unusable(String),
}

/// The answer to an invocation with `line` saying what happened; the invocation's observed line
/// carries it (see [`observe`]).
fn reply(status: StatusCode, line: String) -> InvocationResponse {
    if status.is_success() {
        InvocationResponse::ok(vec![line])
    } else {
        InvocationResponse::failed(status, vec![line])
    }
}

/// On a message's last delivery, storage trouble must not leave the work item unrecorded (the host
/// would poison the message and the scan would wait for it forever), so transient errors are
/// retried for up to this long before giving up — far below the 10-minute execution limit.
const LAST_ATTEMPT_PATIENCE: Duration = Duration::from_secs(60);

/// 0.5 s doubling to 8 s, while a retry can still start within [`LAST_ATTEMPT_PATIENCE`].
const PATIENCE: Backoff =
    Backoff::new(u32::MAX, Duration::from_millis(500), Duration::from_secs(8))
        .with_deadline(LAST_ATTEMPT_PATIENCE);

/// Runs `op`, retrying transient storage errors with backoff for [`LAST_ATTEMPT_PATIENCE`] when
/// `last_attempt` (the storage adapter has already retried each call briefly).
async fn patiently<R, F, Fut>(last_attempt: bool, op: F) -> Result<R, StorageError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<R, StorageError>>,
{
    retry(&PATIENCE, NoJitter, op, |e: &StorageError| {
        last_attempt && e.is_transient()
    })
    .await
    .map_err(Failure::into_error)
}

/// The queue message of a host invocation payload; `Err` is the 400 reply for a bad payload.
fn queue_invocation(body: &[u8]) -> Result<QueueInvocation, InvocationResponse> {
    let request: InvocationRequest = serde_json::from_slice(body).map_err(|e| {
        reply(
            StatusCode::BAD_REQUEST,
            format!("invalid invocation payload: {e}"),
        )
    })?;
    request
        .queue_invocation()
        .map_err(|e| reply(StatusCode::BAD_REQUEST, e.to_string()))
}

fn parse_outcome(work_id: &str, json: &str) -> Result<WorkOutcome, WorkError> {
    serde_json::from_str(json)
        .map_err(|e| WorkError::Failed(format!("{work_id}: recorded outcome is unreadable: {e}")))
}

impl<T: TableStore + Clone, Q: QueueStore + Clone> AppState<T, Q> {
    /// A store for `connection` that counts requests into `requests`.
    pub fn counted_table(
        &self,
        connection: &str,
        requests: &Arc<AtomicU64>,
    ) -> Result<Counted<T>, WorkError> {
        let store = self.tables.get(connection).ok_or_else(|| {
            WorkError::Failed(format!(
                "connection {connection} is not configured on this app"
            ))
        })?;
        Ok(Counted::new(store.clone(), requests.clone()))
    }

    /// The queue message of a child of `scan`: its scan id and its work, nothing else. Scan
    /// steps go to the PrefixScan queue, driver work items to the TableCopy queue.
    pub(crate) fn child_message(
        &self,
        scan: &ScanContext,
        child: &ChildSpec,
    ) -> Result<ChildMessage, MessageError> {
        self.child_message_in(scan, child, None)
    }

    /// [`AppState::child_message`]; a driver work item names `shard` (its parent's) for its row.
    /// Steps always live in the shard their id hashes to, so the scan's tree spreads over the
    /// shards while each step's items share its own.
    pub(crate) fn child_message_in(
        &self,
        scan: &ScanContext,
        child: &ChildSpec,
        shard: Option<u32>,
    ) -> Result<ChildMessage, MessageError> {
        let scan_id = scan.scan_id.clone();
        match child {
            ChildSpec::Step(step) => ChildMessage::new(
                &StepMessage {
                    scan_id,
                    step: step.clone(),
                    shard,
                },
                &self.config.prefix_scan_queue,
                scan.shards,
            ),
            ChildSpec::Item(work) => ChildMessage::new(
                &ItemMessage {
                    scan_id,
                    work: work.clone(),
                    shard,
                },
                &self.config.table_copy_queue,
                scan.shards,
            ),
        }
    }
}
