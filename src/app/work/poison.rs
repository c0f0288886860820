//! Failing a work item for good: on its last delivery, or when the host moved its message to
//! the poison queue after a last delivery that began (it marked the item's row) and recorded no
//! outcome — after re-queuing it for a few more rounds of deliveries first.
//!
//! Invariants:
//! 1. A poison message alone proves nothing: anyone who can write the queues can forge one. Only
//!    an unfinished row marked by a last delivery (`LastDelivery`, tracking invariant 7) proves
//!    the item exhausted its deliveries, so only a marked row ever fails an item here.
//! 2. A marked unfinished row means no delivery recorded an outcome: the handler was killed,
//!    timed out, or storage failed the whole delivery (a transient storage error on the last
//!    delivery is left unrecorded for this, see `finish`). The item's own code did not fail: it
//!    records its own failures on its last delivery, and a finished row is left alone. So the
//!    message is put back on its live queue, delayed ([`round_delay`]), at most
//!    [`REQUEUE_ROUNDS`] times; a marked row past that fails the item and its scan. An unmarked
//!    unfinished row (a last delivery that died before marking it, or never reached the
//!    handler; or a forged or early message) is re-queued within the same bound, which fails
//!    nothing: a re-queued message is one more delivery of an unfinished item. Past the bound,
//!    a poison message for an unmarked row is ignored.
//! 3. A round starts with one merge under the row's ETag that clears the mark and records the
//!    round (`Requeues`) and the poison message's id (`RequeuedBy`); only the delivery whose
//!    merge succeeded puts the message, after it. So of concurrent deliveries only one starts a
//!    round, and a second delivery of the same poison message finds its own id and starts no
//!    other; if that redelivery finds the row still unmarked, its earlier attempt may have died
//!    between merge and put, and it puts the message again (at worst a duplicate live copy of an
//!    unfinished item, which completion's ETag counts once, as any duplicate delivery). A
//!    delivery whose merge failed on the ETag reads the row again, and if the round it tried to
//!    start is there under its id, its own merge took effect and only the answer was lost (the
//!    adapter retried it): it puts the message as if the merge had answered.
//! 4. The re-queued copy carries its round in its envelope (`r`, `messages::with_round`; 0 on
//!    its driver's message), and only a poison message of the row's current round (`Requeues`)
//!    can start the next. So duplicate live copies of one item, poisoned in the same round (a
//!    parent delivered twice, or invariant 3's second put), start one round between them, not
//!    one each; a copy of an earlier round, or of a round never started (forged), does nothing.

use super::*;
use crate::app::tracking::retention::start_in_progress;
use crate::app::tracking::RowMarks;

/// How many times an item whose last delivery began and recorded no outcome is re-queued
/// before it fails (each time for a whole new round of host.json's `maxDequeueCount`
/// deliveries).
pub const REQUEUE_ROUNDS: u32 = 3;

/// The delay before round 1's first delivery; each later round waits twice as long as the one
/// before (10 s, 20 s, 40 s).
pub const REQUEUE_DELAY: Duration = Duration::from_secs(10);

/// The delay before the first delivery of re-queue round `round` (1-based).
pub fn round_delay(round: u32) -> Duration {
    REQUEUE_DELAY * 2u32.pow(round.clamp(1, 8) - 1)
}

/// Most times a delivery reads an item's row again because it changed under its write (while
/// a poison delivery started a round, or a failure was recorded).
const MAX_ROUND_ATTEMPTS: u32 = 5;

impl<S: Stores> Runner<'_, S> {
    /// Completes an unfinished work item as failed and fails its scan, retrying storage trouble
    /// patiently. `Ok(false)`: the item was already finished (or never registered) when first
    /// read, nothing done.
    pub(super) async fn fail_work_item(
        &self,
        scan: &ScanContext,
        work_id: &str,
        shard: u32,
        reason: &str,
    ) -> Result<bool, StorageError> {
        let store = self.app.bookkeeping();
        let tracker = self.app.tracker_on(store);
        let read = || {
            patiently(true, || {
                tracker.work_state_marked(&scan.scan_id, shard, work_id)
            })
        };
        let mut state = read().await?;
        let mut scan_failed = false;
        // Bounded: the row changes under this only when a concurrent delivery of the item marks
        // or finishes it (a duplicate copy of its message, tracking invariant 6).
        for _ in 0..MAX_ROUND_ATTEMPTS {
            let (mut etag, marked) = match state {
                Some((WorkState::Pending { etag } | WorkState::Expanded { etag, .. }, marked)) => {
                    (etag, marked)
                }
                Some((WorkState::Finished, _)) | None => return Ok(scan_failed),
            };
            if !marked {
                // A failure no retry can fix, before the last delivery: marked like a last
                // delivery's row, so that a duplicate copy of the message meeting the scan this
                // fails leaves the row to this delivery (tracking invariant 6).
                let mark = || tracker.mark_last_delivery(&scan.scan_id, shard, work_id, &etag);
                match patiently(true, mark).await? {
                    Some(new_etag) => etag = new_etag,
                    None => {
                        state = read().await?;
                        continue;
                    }
                }
            }
            if !scan_failed {
                // The scan fails first: once the item is completed the scan may look drained,
                // and a drained check in between must find it failed, not running (it would
                // complete it).
                patiently(true, || {
                    tracker.finish_scan(&scan.scan_id, ScanState::Failed, Some(reason))
                })
                .await?;
                self.app.scan_states.put(&scan.scan_id, ScanState::Failed);
                scan_failed = true;
            }
            let completion = patiently(true, || {
                tracker.complete(
                    &scan.scan_id,
                    shard,
                    work_id,
                    &etag,
                    Counters::default(),
                    Some(reason),
                    None,
                    None,
                )
            })
            .await?;
            if completion != Completion::Duplicate {
                return Ok(true);
            }
            // Its row changed since it was read: read it again.
            state = read().await?;
        }
        Err(StorageError::new(
            crate::storage::StorageErrorKind::Transient,
            format!("the row of {work_id} kept changing while its failure was recorded"),
        ))
    }

    /// Settles a message the host moved to `<queue>-poison` after its last failed delivery. If
    /// its work item is still unfinished and its last delivery marked its row before working
    /// (tracking invariant 7), no delivery recorded an outcome (the handler was killed or timed
    /// out every time, or storage failed it): the message is re-queued for another round of
    /// deliveries, and after [`REQUEUE_ROUNDS`] rounds the item is recorded as failed and its
    /// scan fails, instead of running forever — or, if the scan has already ended, the item is
    /// dropped. An unfinished item without the mark has not exhausted its deliveries: the message
    /// is forged (or its last delivery never got as far as the mark), and it is dropped with a
    /// warning; the scan goes on. Idempotent: a finished item is left alone (the usual case — the
    /// last delivery recorded its own failure). A message that cannot be decoded, or names no
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
        let tracker = self.app.tracker_on(self.app.bookkeeping());
        let (state, scan) = match self.scan_of(&tracker, scan_id, true).await {
            Ok(Some(found)) => found,
            // A start still writing the record (its root's put back failed on the last delivery).
            Ok(None) if start_in_progress(scan_id, tracker.now()) => {
                let queue = self.live_queue::<M>();
                return self
                    .defer_unrecorded(queue, &invocation.message, &work_id, scan_id)
                    .await;
            }
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
            return match self
                .drop_work_item(
                    &tracker,
                    &scan,
                    (&work_id, message.shard_hint()),
                    true,
                    false,
                )
                .await
            {
                Ok(DropOutcome::Dropped) => reply(
                    StatusCode::OK,
                    format!(
                        "{work_id}: poisoned message of a {} scan; dropped its work item",
                        state.as_str()
                    ),
                ),
                Ok(DropOutcome::Finished | DropOutcome::Spared) => reply(
                    StatusCode::OK,
                    format!("{work_id}: poisoned message of a finished work item; nothing to do"),
                ),
                Err(e) => reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("{work_id}: could not drop the poisoned item: {e}"),
                ),
            };
        }
        let shard = messages::shard_for(&message, &work_id, scan.shards);
        self.settle_unfinished::<M>(&invocation, &scan, &work_id, shard)
            .await
    }

    /// [`Runner::settle_poisoned`] for an item of a running scan: re-queue it, fail it, or
    /// ignore the message (module invariants 1-3).
    async fn settle_unfinished<M: WorkMessage>(
        &self,
        invocation: &QueueInvocation,
        scan: &ScanContext,
        work_id: &str,
        shard: u32,
    ) -> InvocationResponse {
        let scan_id = scan.scan_id.as_str();
        let tracker = self.app.tracker_on(self.app.bookkeeping());
        let read_row = || patiently(true, || tracker.work_state_rounds(scan_id, shard, work_id));
        // This poison message's id ("" if the host gave none: then never recognised as such).
        let me = invocation.id.clone().unwrap_or_default();
        // The round this copy was delivered in (0: its driver's message; module invariant 4).
        let of_round = messages::round_of(&invocation.message);
        let mut read = read_row().await;
        // The round this delivery's own merge may have started (its answer lost: the adapter
        // retried it and the retry found the ETag the merge itself changed), and whether the
        // row was marked before it.
        let mut merged: Option<(u32, bool)> = None;
        for _ in 0..MAX_ROUND_ATTEMPTS {
            let (etag, marks) = match read {
                Err(e) => {
                    return reply(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("{work_id}: could not read the poisoned item: {e}"),
                    )
                }
                Ok(None | Some((WorkState::Finished, _))) => {
                    return reply(
                        StatusCode::OK,
                        format!(
                            "{work_id}: poisoned message of a finished work item; nothing to do"
                        ),
                    )
                }
                Ok(Some((
                    WorkState::Pending { etag } | WorkState::Expanded { etag, .. },
                    marks,
                ))) => (etag, marks),
            };
            // This delivery's merge started the round: put the message, as after an answer.
            if let Some((round, marked)) = merged.filter(|(round, _)| {
                !me.is_empty()
                    && *round == marks.rounds
                    && marks.requeued_by.as_deref() == Some(&me)
            }) {
                return self.requeue::<M>(invocation, work_id, round, marked).await;
            }
            // This message started the round already.
            if !me.is_empty() && marks.requeued_by.as_deref() == Some(me.as_str()) {
                return self
                    .already_requeued::<M>(invocation, work_id, &marks)
                    .await;
            }
            // A copy of an earlier round (a duplicate, or another delivery just started the
            // next round) or of a round never started (forged): only the current round's
            // message starts the next.
            if marks.rounds != of_round {
                return reply(
                    StatusCode::OK,
                    format!(
                        "{work_id}: nothing to do: a poisoned copy of re-queue round {of_round}, \
                         its work item is in round {}",
                        marks.rounds
                    ),
                );
            }
            if marks.rounds >= REQUEUE_ROUNDS {
                if marks.marked {
                    return self.fail_poisoned::<M>(scan, work_id, shard).await;
                }
                return ignored(work_id, scan_id, marks.rounds);
            }
            let round = marks.rounds + 1;
            match patiently(true, || {
                tracker.start_round(scan_id, shard, work_id, &etag, (round, &me))
            })
            .await
            {
                Ok(Some(_)) => {
                    return self
                        .requeue::<M>(invocation, work_id, round, marks.marked)
                        .await
                }
                // Changed since read: another delivery started a round, or a live delivery
                // recorded an outcome or marked the row.
                Ok(None) => {
                    merged = Some((round, marks.marked));
                    read = read_row().await
                }
                Err(e) => {
                    return reply(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("{work_id}: could not start a new round of deliveries: {e}"),
                    )
                }
            }
        }
        reply(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{work_id}: its row kept changing while the poisoned message was settled"),
        )
    }

    /// Fails a marked item whose re-queue rounds are used up, and its scan.
    async fn fail_poisoned<M: WorkMessage>(
        &self,
        scan: &ScanContext,
        work_id: &str,
        shard: u32,
    ) -> InvocationResponse {
        let reason = format!(
            "work item {work_id} ({}) was poisoned: its last delivery began and no delivery \
             recorded an outcome (handler killed, timed out, or storage unavailable), in {} \
             rounds of deliveries",
            M::NAME,
            REQUEUE_ROUNDS + 1
        );
        match self.fail_work_item(scan, work_id, shard, &reason).await {
            Ok(true) => reply(
                StatusCode::OK,
                format!(
                    "{work_id}: recorded as failed after {REQUEUE_ROUNDS} re-queues; scan {} \
                     failed if it was still running",
                    scan.scan_id
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

    /// A poisoned message whose item is in the round this message started. A redelivery of it,
    /// the row still unmarked, puts the message again: its earlier attempt may have died before
    /// its put (module invariant 3). Otherwise nothing is done.
    async fn already_requeued<M: WorkMessage>(
        &self,
        invocation: &QueueInvocation,
        work_id: &str,
        marks: &RowMarks,
    ) -> InvocationResponse {
        if !marks.marked && invocation.dequeue_count > 1 {
            return self
                .requeue::<M>(invocation, work_id, marks.rounds, true)
                .await;
        }
        reply(
            StatusCode::OK,
            format!(
                "{work_id}: nothing to do: this message already started re-queue round {}",
                marks.rounds
            ),
        )
    }

    /// Puts the poisoned message back on its live queue for re-queue round `round`, as the host
    /// delivered it with the round in its envelope (the same work item, a fresh dequeue count).
    async fn requeue<M: WorkMessage>(
        &self,
        invocation: &QueueInvocation,
        work_id: &str,
        round: u32,
        marked: bool,
    ) -> InvocationResponse {
        let queue = self.live_queue::<M>();
        let text = match messages::with_round(&invocation.message, round) {
            Ok(json) => messages::queue_text(json.as_bytes()),
            // Unreachable: the message was decoded from this text.
            Err(e) => {
                return reply(
                    StatusCode::OK,
                    format!("dropped an undecodable poisoned {} message: {e}", M::NAME),
                )
            }
        };
        let delay = round_delay(round);
        match self.app.queues.put_message(queue, &text, delay).await {
            Ok(()) => {
                let why = if marked {
                    "its last delivery began and recorded no outcome (handler killed, timed out, \
                     or storage unavailable)"
                } else {
                    // Forged, early, or a last delivery that died before it marked the row.
                    tracing::warn!(work = %work_id, round, "re-queued a poisoned message whose work item has not exhausted its deliveries as far as its row shows (forged, early, or its last delivery died before marking it); nothing is failed");
                    "no last delivery marked its row (forged, early, or the last delivery died \
                     before marking it); nothing is failed"
                };
                reply(
                    StatusCode::OK,
                    format!(
                        "{work_id}: {why}; re-queued for round {round} of {REQUEUE_ROUNDS}, \
                         delivered in {} s",
                        delay.as_secs()
                    ),
                )
            }
            // The host delivers the poison message again, which puts it again (module invariant 3).
            Err(e) => reply(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "{work_id}: could not re-queue the poisoned message for round {round}: {e}"
                ),
            ),
        }
    }
}

/// The reply to a poisoned message whose unfinished item no last delivery marked, after its
/// re-queue rounds are used: it has not exhausted its deliveries as far as its row shows
/// (forged, or early), and failing the scan on it would let anyone who can write a queue stop
/// any scan.
fn ignored(work_id: &str, scan_id: &str, rounds: u32) -> InvocationResponse {
    tracing::warn!(work = %work_id, scan = %scan_id, "ignored a poisoned message whose work item has not exhausted its deliveries (forged, or early); the scan goes on");
    reply(
        StatusCode::OK,
        format!(
            "{work_id}: ignored a poisoned message of scan {scan_id}: its work item has not \
             exhausted its deliveries (no last delivery marked it) and its {rounds} re-queue \
             rounds are used; the scan goes on"
        ),
    )
}
