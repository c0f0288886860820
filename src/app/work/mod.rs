//! The life of one queue work item, shared by the PrefixScan and TableCopy functions:
//! decode → read the scan's recorded context and check the scan is running and the item
//! unfinished → execute (or adopt the outcome an earlier execution recorded) → register and
//! enqueue children → commit completion with counters → detect the end of the scan. See
//! `tracking` for why this is exact under at-least-once delivery.
//!
//! A message names only its scan and its work; what to read and write comes from the scan's
//! recorded [`ScanContext`], never from the message. Work of a scan that has ended is dropped:
//! its row is finished as `dropped`, so an ended scan leaves no pending rows behind (a row a
//! last delivery marked is left to that delivery, or to its poison message).
//!
//! The life cycle is one type, [`Runner`], which knows no driver: a scan's driver is reached
//! through the app's registry (`AppState::drivers`) by the name its context records, for the
//! work a step does on its rows, the re-work of an adopted step's ranges, whether that work
//! changes the source, and the completion step. [`run`] is the one path of every kind of work:
//! [`begin`] (decode, check, adopt), the work's own [`Work::execute`], [`finish`] (commit);
//! [`poison`] fails items for good; [`complete`] ends a drained scan.

#[cfg(all(test, feature = "lab"))]
mod admit_tests;
mod begin;
mod complete;
mod finish;
mod poison;
pub mod watch;
#[cfg(all(test, feature = "lab"))]
mod watch_tests;

use std::sync::Arc;
use std::time::Duration;

use std::future::Future;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use futures::future::try_join_all;

use crate::retry::{retry, Backoff, Failure, NoJitter};
use crate::storage::stores::Stores;
use crate::storage::{QueueStore, StorageError, TableStore};

use super::config::STORAGE_SETTING;
use super::job::{
    is_valid_scan_id, Begun, Executed, Progress, ScanContext, WorkError, WorkOutcome, Worked,
};
use super::messages::{self, ChildSpec, ItemMessage, MessageError, StepMessage, WorkMessage};
use super::observe;
use super::protocol::{InvocationRequest, InvocationResponse, QueueInvocation};
use super::state::{AppState, Counted};
use super::tracking::{Completion, Counters, NewWork, RecordError, ScanState, Tracker, WorkState};

/// A unit of queue work that knows how to run itself: one module per kind (scan steps in
/// `functions/prefix_scan.rs`, driver work items in `functions/table_copy.rs`), all run by [`run`].
pub trait Work: WorkMessage + Send + Sync {
    /// Does the work of one begun item; its outcome is committed by [`Runner::finish`].
    fn execute<S: Stores>(
        state: &AppState<S>,
        begun: &Begun<Self>,
    ) -> impl Future<Output = Result<Executed, WorkError>> + Send;
}

/// The life cycle of work items, over the app's state: what [`run`] does for every kind of
/// work, what `PrefixScanPoison`/`TableCopyPoison` do for poisoned messages, and what the
/// start and status handlers need of it (the root's message, ending a drained scan).
pub struct Runner<'a, S: Stores> {
    app: &'a AppState<S>,
}

impl<'a, S: Stores> Runner<'a, S> {
    pub fn new(app: &'a AppState<S>) -> Self {
        Runner { app }
    }
}

/// The one execution path of every queue function: decode and check the item ([`Runner::begin`]),
/// execute it unless an earlier delivery recorded its outcome, then commit ([`Runner::finish`]).
/// Its outcome is observed as one line ([`observe::Invocation`]).
pub async fn run<M: Work, S: Stores>(
    State(state): State<Arc<AppState<S>>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> InvocationResponse {
    let observed =
        observe::Invocation::start::<M>(&uri, &headers, &body, state.config.max_dequeue_count);
    observed.finish(execute::<M, S>(&state, &body).await)
}

async fn execute<M: Work, S: Stores>(state: &AppState<S>, body: &[u8]) -> InvocationResponse {
    let runner = Runner::new(state);
    let begun = match runner.begin::<M>(body).await {
        Ok(begun) => begun,
        Err(reply) => return reply,
    };
    // While it works, the invocation keeps learning whether its scan ended (`watch`).
    let (scan, requests) = (begun.scan.clone(), begun.requests.clone());
    let work = async {
        let result = if begun.needs_execution() {
            M::execute(state, &begun).await
        } else {
            Ok(Executed::default())
        };
        runner.finish(begun, result).await
    };
    watch::watching(state, &scan.scan_id, &requests, work).await
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

/// What [`Runner::drop_work_item`] did with an ended scan's work item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DropOutcome {
    /// Its row is now `dropped`.
    Dropped,
    /// It was finished already (or never registered): nothing done.
    Finished,
    /// A last delivery marked its row: left to that delivery, or to its poison message.
    Spared,
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

impl<S: Stores> Runner<'_, S> {
    /// The queue message of a child of `scan`: its scan id and its work, nothing else. Scan
    /// steps go to the PrefixScan queue, driver work items to the TableCopy queue.
    pub(crate) fn child_message(
        &self,
        scan: &ScanContext,
        child: &ChildSpec,
    ) -> Result<ChildMessage, MessageError> {
        self.child_message_in(scan, child, None)
    }

    /// [`Runner::child_message`]; a driver work item names `shard` (its parent's) for its row.
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
                &self.app.config.prefix_scan_queue,
                scan.shards,
            ),
            ChildSpec::Item(work) => ChildMessage::new(
                &ItemMessage {
                    scan_id,
                    work: work.clone(),
                    shard,
                },
                &self.app.config.table_copy_queue,
                scan.shards,
            ),
        }
    }
}
