//! The life of one queue work item, shared by the PrefixScan and TableCopy functions:
//! decode → read the scan's recorded context and check the scan is running and the item
//! unfinished → execute (or adopt the outcome an earlier execution recorded) → register and
//! enqueue children → commit completion with counters → detect the end of the scan. See
//! `tracking` for why this is exact under at-least-once delivery.
//!
//! A message names only its scan and its work; what to read and write comes from the scan's
//! recorded [`ScanContext`], never from the message. Work of a scan that has ended is dropped:
//! its row is finished as `dropped`, so an ended scan leaves no pending rows behind.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use std::future::Future;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use futures::future::try_join_all;
use serde::{Deserialize, Serialize};

use crate::storage::{QueueStore, StorageError, TableStore};

use super::config::STORAGE_SETTING;
use super::functions::start_scan::recorded_context;
use super::functions::status::is_valid_scan_id;
use super::messages::{
    self, shard_of, ChildSpec, CopyMessage, MessageError, ScanContext, StepMessage, WorkMessage,
};
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
/// `functions/prefix_scan.rs`, copy items in `functions/table_copy.rs`), all run by [`run`].
pub trait Work: WorkMessage + Send + Sync {
    /// Does the work of one begun item; its outcome is committed by [`AppState::finish`].
    fn execute<T: TableStore + Clone, Q: QueueStore + Clone>(
        state: &AppState<T, Q>,
        begun: &Begun<Self>,
    ) -> impl Future<Output = Result<WorkOutcome, WorkError>> + Send;
}

/// The one execution path of every queue function: decode and check the item ([`AppState::begin`]),
/// execute it unless an earlier delivery recorded its outcome, then commit ([`AppState::finish`]).
pub async fn run<M: Work, T: TableStore + Clone, Q: QueueStore + Clone>(
    State(state): State<Arc<AppState<T, Q>>>,
    body: Bytes,
) -> InvocationResponse {
    let begun = match state.begin::<M>(&body).await {
        Ok(begun) => begun,
        Err(reply) => return reply,
    };
    let result = if begun.needs_execution() {
        M::execute(&state, &begun).await
    } else {
        Ok(WorkOutcome::default())
    };
    state.finish(begun, result).await
}

/// A child work item ready to be registered and queued.
struct ChildMessage {
    work: NewWork,
    queue: String,
    text: String,
}

impl ChildMessage {
    fn new<M: WorkMessage>(message: &M, queue: &str) -> Result<Self, MessageError> {
        Ok(ChildMessage {
            work: NewWork {
                id: messages::work_id(message),
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

fn reply(status: StatusCode, line: String) -> InvocationResponse {
    if status.is_success() {
        tracing::info!("{line}");
        InvocationResponse::ok(vec![line])
    } else {
        tracing::warn!("{line}");
        InvocationResponse::failed(status, vec![line])
    }
}

/// On a message's last delivery, storage trouble must not leave the work item unrecorded (the host
/// would poison the message and the scan would wait for it forever), so transient errors are
/// retried for up to this long before giving up — far below the 10-minute execution limit.
const LAST_ATTEMPT_PATIENCE: Duration = Duration::from_secs(60);

/// Runs `op`, retrying transient storage errors with backoff for [`LAST_ATTEMPT_PATIENCE`] when
/// `last_attempt` (the storage adapter has already retried each call briefly).
async fn patiently<R, F, Fut>(last_attempt: bool, op: F) -> Result<R, StorageError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<R, StorageError>>,
{
    let deadline = tokio::time::Instant::now() + LAST_ATTEMPT_PATIENCE;
    let mut delay = Duration::from_millis(500);
    loop {
        match op().await {
            Err(e)
                if last_attempt
                    && e.is_transient()
                    && tokio::time::Instant::now() + delay < deadline =>
            {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(8));
            }
            other => return other,
        }
    }
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

    /// The queue message of a child of `scan`: its scan id and its work, nothing else.
    fn child_message(
        &self,
        scan: &ScanContext,
        child: &ChildSpec,
    ) -> Result<ChildMessage, MessageError> {
        let scan_id = scan.scan_id.clone();
        match child {
            ChildSpec::Step(step) => ChildMessage::new(
                &StepMessage {
                    scan_id,
                    step: step.clone(),
                },
                &self.config.prefix_scan_queue,
            ),
            ChildSpec::Copy(work) => ChildMessage::new(
                &CopyMessage {
                    scan_id,
                    work: work.clone(),
                },
                &self.config.table_copy_queue,
            ),
        }
    }

    /// The state and recorded context of scan `scan_id` (`None`: no such scan, or not recorded
    /// yet). Served from the cache when it can be trusted; a record read refreshes both.
    /// `patient`: retry storage trouble as on a last attempt (see [`patiently`]).
    async fn scan_of<S: TableStore>(
        &self,
        tracker: &Tracker<'_, S>,
        scan_id: &str,
        patient: bool,
    ) -> Result<Option<(ScanState, Arc<ScanContext>)>, ScanLookupError> {
        if let (Some(state), Some(context)) = (
            self.scan_states.get(scan_id),
            self.scan_states.context(scan_id),
        ) {
            return Ok(Some((state, context)));
        }
        let Some(record) = patiently(patient, || tracker.get_scan(scan_id))
            .await
            .map_err(ScanLookupError::Storage)?
        else {
            return Ok(None);
        };
        let context = Arc::new(recorded_context(&record).map_err(ScanLookupError::Unusable)?);
        self.scan_states.put(scan_id, record.state);
        self.scan_states.put_context(context.clone());
        Ok(Some((record.state, context)))
    }

    /// Finishes an unfinished work item of an ended scan as dropped. `Ok(false)`: it was already
    /// finished (or never registered); nothing done. Idempotent under redelivery.
    async fn drop_work_item<S: TableStore>(
        &self,
        tracker: &Tracker<'_, S>,
        scan: &ScanContext,
        work_id: &str,
        last_attempt: bool,
    ) -> Result<bool, StorageError> {
        let state = patiently(last_attempt, || {
            tracker.work_state(&scan.scan_id, scan.shards, work_id)
        })
        .await?;
        let etag = match state {
            Some(WorkState::Pending { etag } | WorkState::Expanded { etag, .. }) => etag,
            Some(WorkState::Finished) | None => return Ok(false),
        };
        let completion = patiently(last_attempt, || {
            tracker.drop_work(&scan.scan_id, scan.shards, work_id, &etag)
        })
        .await?;
        Ok(matches!(completion, Completion::Committed { .. }))
    }

    /// Decodes an invocation and checks that its work is still to be done. `Err` is the reply to
    /// send right away (malformed message, duplicate, dropped scan).
    pub async fn begin<M: WorkMessage>(&self, body: &[u8]) -> Result<Begun<M>, InvocationResponse> {
        let invocation = queue_invocation(body)?;
        // A message that cannot be decoded never will be: fail it so the host poisons it.
        let rejected = |e: String| {
            reply(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("rejected {} message: {e}", M::NAME),
            )
        };
        let (message, sent_context): (M, _) =
            messages::decode_with_legacy_context(&invocation.message)
                .map_err(|e| rejected(e.to_string()))?;
        let scan_id = message.scan_id().to_string();
        if !is_valid_scan_id(&scan_id) {
            return Err(rejected(format!("{scan_id:?} is not a scan id")));
        }
        let work_id = messages::work_id(&message);
        let requests = Arc::new(AtomicU64::new(0));
        let store = self
            .counted_table(STORAGE_SETTING, &requests)
            .map_err(|e| reply(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        let tracker = self.tracker_on(&store);
        let last_attempt = invocation.dequeue_count >= self.config.max_dequeue_count;
        let storage_failure = |e: StorageError| {
            reply(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("{work_id}: storage: {e}"),
            )
        };
        let (state, scan) = match self.scan_of(&tracker, &scan_id, last_attempt).await {
            Ok(Some(found)) => found,
            Ok(None) if last_attempt => {
                return Err(reply(
                    StatusCode::OK,
                    format!("{work_id}: scan {scan_id} does not exist; dropping the message"),
                ))
            }
            // The starter writes the record right after queuing the root: retry until it exists.
            Ok(None) => {
                return Err(reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("{work_id}: scan {scan_id} is not recorded yet"),
                ))
            }
            Err(ScanLookupError::Storage(e)) => return Err(storage_failure(e)),
            Err(ScanLookupError::Unusable(e)) => {
                return Err(reply(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("{work_id}: {e}"),
                ))
            }
        };
        if sent_context.is_some_and(|sent| sent != *scan) {
            tracing::warn!(work = %work_id, scan = %scan_id, "a v1 message carries a scan context that differs from the scan's recorded one (forged or stale); it is ignored and the recorded context is used");
        }
        if state != ScanState::Running {
            let dropped = self
                .drop_work_item(&tracker, &scan, &work_id, last_attempt)
                .await
                .map_err(storage_failure)?;
            return Err(reply(
                StatusCode::OK,
                format!(
                    "{work_id}: scan {scan_id} is {}; {}",
                    state.as_str(),
                    if dropped {
                        "dropped its work item"
                    } else {
                        "no unfinished work item to drop"
                    }
                ),
            ));
        }
        let progress = match patiently(last_attempt, || {
            tracker.work_state(&scan.scan_id, scan.shards, &work_id)
        })
        .await
        .map_err(storage_failure)?
        {
            Some(WorkState::Pending { etag }) => Progress::Fresh { etag },
            Some(WorkState::Expanded { etag, outcome }) => {
                let outcome = parse_outcome(&work_id, &outcome)
                    .map_err(|e| reply(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
                Progress::Recorded { etag, outcome }
            }
            Some(WorkState::Finished) => {
                // The delivery that finished it may have died before checking for the end of
                // the scan (handler killed between the two): check on its behalf.
                let completed = tracker
                    .complete_if_drained(
                        &scan.scan_id,
                        scan.shards,
                        Some(shard_of(&work_id, scan.shards)),
                    )
                    .await
                    .map_err(storage_failure)?;
                return Err(reply(
                    StatusCode::OK,
                    format!(
                        "{work_id}: already done (duplicate delivery){}",
                        if completed { "; scan completed" } else { "" }
                    ),
                ));
            }
            None => {
                return Err(reply(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    format!(
                        "{work_id}: no work row for this message in scan {}",
                        scan.scan_id
                    ),
                ))
            }
        };
        Ok(Begun {
            message,
            scan,
            invocation,
            work_id,
            progress,
            requests,
        })
    }

    /// Commits a work item's result (or its failure on the last attempt) and builds the reply.
    /// `result` is ignored when an earlier execution's outcome was recorded.
    pub async fn finish<M: WorkMessage>(
        &self,
        begun: Begun<M>,
        result: Result<WorkOutcome, WorkError>,
    ) -> InvocationResponse {
        let scan_id = begun.scan.scan_id.clone();
        match self.commit(&begun, result).await {
            Ok(line) => reply(StatusCode::OK, line),
            Err(e) => {
                if begun.invocation.dequeue_count >= self.config.max_dequeue_count
                    || e.is_permanent()
                {
                    if let Err(record) = self.record_failure(&begun, &e).await {
                        tracing::error!(work = %begun.work_id, scan = %scan_id, error = %record, "could not record the failure of a poisoned work item; the scan will not end by itself");
                    }
                }
                let status = match &e {
                    WorkError::Storage(s) if s.is_transient() => StatusCode::SERVICE_UNAVAILABLE,
                    _ => StatusCode::INTERNAL_SERVER_ERROR,
                };
                reply(
                    status,
                    format!(
                        "{} (scan {scan_id}, attempt {}): {e}",
                        begun.work_id, begun.invocation.dequeue_count
                    ),
                )
            }
        }
    }

    /// Records a work item that failed its last delivery as failed, and its scan as failed —
    /// unless it is already finished (e.g. the failure path of `commit` did it).
    async fn record_failure<M: WorkMessage>(
        &self,
        begun: &Begun<M>,
        error: &WorkError,
    ) -> Result<(), StorageError> {
        let reason = format!(
            "work item {} ({}) failed after {} attempts: {error}",
            begun.work_id,
            M::NAME,
            begun.invocation.dequeue_count
        );
        self.fail_work_item(&begun.scan, &begun.work_id, &reason)
            .await
            .map(|_| ())
    }

    /// Completes an unfinished work item as failed and fails its scan, retrying storage trouble
    /// patiently. `Ok(false)`: the item was already finished (or never registered), nothing done.
    async fn fail_work_item(
        &self,
        scan: &ScanContext,
        work_id: &str,
        reason: &str,
    ) -> Result<bool, StorageError> {
        let store = self.bookkeeping();
        let tracker = self.tracker_on(store);
        let state = patiently(true, || {
            tracker.work_state(&scan.scan_id, scan.shards, work_id)
        })
        .await?;
        let etag = match state {
            Some(WorkState::Pending { etag } | WorkState::Expanded { etag, .. }) => etag,
            Some(WorkState::Finished) | None => return Ok(false),
        };
        patiently(true, || {
            tracker.complete(
                &scan.scan_id,
                scan.shards,
                work_id,
                &etag,
                Counters::default(),
                Some(reason),
            )
        })
        .await?;
        patiently(true, || {
            tracker.finish_scan(&scan.scan_id, ScanState::Failed, Some(reason))
        })
        .await?;
        self.scan_states.put(&scan.scan_id, ScanState::Failed);
        Ok(true)
    }

    /// Settles a message the host moved to `<queue>-poison` after its last failed delivery. If
    /// its work item is still unfinished, no delivery recorded an outcome (the handler was killed
    /// or timed out every time, or storage stayed unreachable): the item is recorded as failed
    /// and its scan fails, instead of running forever — or, if the scan has already ended, the
    /// item is dropped. Idempotent: a finished item is left alone (the usual case — the last
    /// delivery recorded its own failure). A message that cannot be decoded, or names no
    /// recorded scan, has no work item to settle and is dropped with a warning.
    pub async fn settle_poisoned<M: WorkMessage>(&self, body: &[u8]) -> InvocationResponse {
        let invocation = match queue_invocation(body) {
            Ok(invocation) => invocation,
            Err(reply) => return reply,
        };
        let message = match messages::decode::<M>(&invocation.message) {
            Ok(message) if is_valid_scan_id(message.scan_id()) => message,
            Ok(message) => {
                return reply(
                    StatusCode::OK,
                    format!(
                        "dropped an undecodable poisoned {} message: {:?} is not a scan id",
                        M::NAME,
                        message.scan_id()
                    ),
                )
            }
            Err(e) => {
                return reply(
                    StatusCode::OK,
                    format!("dropped an undecodable poisoned {} message: {e}", M::NAME),
                )
            }
        };
        let work_id = messages::work_id(&message);
        let scan_id = message.scan_id();
        let tracker = self.tracker_on(self.bookkeeping());
        let (state, scan) = match self.scan_of(&tracker, scan_id, true).await {
            Ok(Some(found)) => found,
            Ok(None) => {
                return reply(
                    StatusCode::OK,
                    format!("{work_id}: poisoned message of scan {scan_id}, which does not exist"),
                )
            }
            Err(ScanLookupError::Storage(e)) => {
                return reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("{work_id}: could not read scan {scan_id}: {e}"),
                )
            }
            // Its work cannot run: end the scan rather than leave it running forever.
            Err(ScanLookupError::Unusable(e)) => {
                return match tracker
                    .finish_scan(scan_id, ScanState::Failed, Some(&e))
                    .await
                {
                    Ok(_) => reply(StatusCode::OK, format!("{work_id}: {e}; scan failed")),
                    Err(storage) => reply(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("{work_id}: {e}; could not fail the scan: {storage}"),
                    ),
                }
            }
        };
        if state != ScanState::Running {
            return match self.drop_work_item(&tracker, &scan, &work_id, true).await {
                Ok(true) => reply(
                    StatusCode::OK,
                    format!(
                        "{work_id}: poisoned message of a {} scan; dropped its work item",
                        state.as_str()
                    ),
                ),
                Ok(false) => reply(
                    StatusCode::OK,
                    format!("{work_id}: poisoned message of a finished work item; nothing to do"),
                ),
                Err(e) => reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("{work_id}: could not drop the poisoned item: {e}"),
                ),
            };
        }
        let reason = format!(
            "work item {work_id} ({}) was poisoned: every delivery failed without recording an \
             outcome (handler killed or timed out, or storage unreachable)",
            M::NAME
        );
        match self.fail_work_item(&scan, &work_id, &reason).await {
            Ok(true) => reply(
                StatusCode::OK,
                format!(
                    "{work_id}: recorded as failed; scan {scan_id} failed if it was still running"
                ),
            ),
            Ok(false) => reply(
                StatusCode::OK,
                format!("{work_id}: poisoned message of a finished work item; nothing to do"),
            ),
            // Transient or not, the host retries; it keeps the message while this fails.
            Err(e) => reply(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("{work_id}: could not record the poisoned item: {e}"),
            ),
        }
    }

    async fn commit<M: WorkMessage>(
        &self,
        begun: &Begun<M>,
        result: Result<WorkOutcome, WorkError>,
    ) -> Result<String, WorkError> {
        let scan = &*begun.scan;
        let store = self.counted_table(STORAGE_SETTING, &begun.requests)?;
        let tracker = self.tracker_on(&store);
        let (etag, outcome) = match (&begun.progress, result) {
            (Progress::Recorded { etag, outcome }, _) => (etag.clone(), outcome.clone()),
            // Without children there is nothing two executions could disagree on but counters,
            // and only one completion can commit: no need to record the outcome first.
            (Progress::Fresh { etag }, Ok(outcome)) if outcome.children.is_empty() => {
                (etag.clone(), outcome)
            }
            (Progress::Fresh { etag }, Ok(outcome)) => {
                let json = serde_json::to_string(&outcome).expect("outcomes serialize");
                match tracker
                    .record_outcome(&scan.scan_id, scan.shards, &begun.work_id, etag, &json)
                    .await
                {
                    Ok(etag) => (etag, outcome),
                    // Another execution got there first: its outcome is the one that counts.
                    Err(RecordError::Lost(Some(WorkState::Expanded { etag, outcome }))) => {
                        (etag, parse_outcome(&begun.work_id, &outcome)?)
                    }
                    Err(RecordError::Lost(_)) => {
                        return Ok(format!("{}: finished by another delivery", begun.work_id))
                    }
                    Err(RecordError::Storage(e)) => return Err(e.into()),
                }
            }
            // On the last delivery `finish` records the failure (see `record_failure`).
            (Progress::Fresh { .. }, Err(e)) => return Err(e),
        };

        let children = outcome
            .children
            .iter()
            .map(|c| self.child_message(scan, c))
            .collect::<Result<Vec<_>, _>>()?;
        let new_work: Vec<&NewWork> = children.iter().map(|c| &c.work).collect();
        tracker
            .register_children(&scan.scan_id, scan.shards, &new_work)
            .await?;
        let queues = Counted::new(self.queues.clone(), begun.requests.clone());
        try_join_all(
            children
                .iter()
                .map(|c| queues.put_message(&c.queue, &c.text, Duration::ZERO)),
        )
        .await?;
        let mut delta = outcome.delta;
        // Count the completion's own counter read and transaction too.
        delta.storage_requests = begun.requests.load(Ordering::Relaxed) as i64 + 2;
        let completion = tracker
            .complete(
                &scan.scan_id,
                scan.shards,
                &begun.work_id,
                &etag,
                delta,
                None,
            )
            .await?;
        // Check for the end of the scan also after a duplicate completion: it may have been our
        // own commit whose answer was lost, and then nobody else would notice.
        let scan_completed = match completion {
            Completion::Committed { shard_idle: false } => false,
            Completion::Committed { shard_idle: true } => {
                tracker
                    .complete_if_drained(&scan.scan_id, scan.shards, None)
                    .await?
            }
            Completion::Duplicate => {
                tracker
                    .complete_if_drained(
                        &scan.scan_id,
                        scan.shards,
                        Some(shard_of(&begun.work_id, scan.shards)),
                    )
                    .await?
            }
        };
        if scan_completed {
            tracing::info!(scan = %scan.scan_id, "scan completed");
        }
        match completion {
            Completion::Duplicate => Ok(format!(
                "{}: completed concurrently by another delivery",
                begun.work_id
            )),
            Completion::Committed { .. } => Ok(format!(
                "{}: done ({} children, {} rows scanned, {} rows written)",
                begun.work_id,
                children.len(),
                delta.rows_scanned,
                delta.rows_written
            )),
        }
    }
}
