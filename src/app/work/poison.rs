//! Failing a work item for good: on its last delivery, or when the host moved its message to
//! the poison queue after a last delivery that began (it marked the item's row) and recorded no
//! outcome. A poison message alone proves nothing: anyone who can write the queues can forge one.

use super::*;

impl<S: Stores> Runner<'_, S> {
    /// Completes an unfinished work item as failed and fails its scan, retrying storage trouble
    /// patiently. `Ok(false)`: the item was already finished (or never registered), nothing done.
    pub(super) async fn fail_work_item(
        &self,
        scan: &ScanContext,
        work_id: &str,
        shard: u32,
        reason: &str,
    ) -> Result<bool, StorageError> {
        let store = self.app.bookkeeping();
        let tracker = self.app.tracker_on(store);
        let state = patiently(true, || tracker.work_state(&scan.scan_id, shard, work_id)).await?;
        let etag = match state {
            Some(WorkState::Pending { etag } | WorkState::Expanded { etag, .. }) => etag,
            Some(WorkState::Finished) | None => return Ok(false),
        };
        // The scan fails first: once the item is completed the scan may look drained, and a
        // drained check in between must find it failed, not running (it would complete it).
        patiently(true, || {
            tracker.finish_scan(&scan.scan_id, ScanState::Failed, Some(reason))
        })
        .await?;
        self.app.scan_states.put(&scan.scan_id, ScanState::Failed);
        patiently(true, || {
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
        Ok(true)
    }

    /// Settles a message the host moved to `<queue>-poison` after its last failed delivery. If
    /// its work item is still unfinished and its last delivery marked its row before working
    /// (tracking invariant 7), no delivery recorded an outcome (the handler was killed or timed
    /// out every time): the item is recorded as failed and its scan fails, instead of running
    /// forever — or, if the scan has already ended, the item is dropped. An unfinished item
    /// without the mark has not exhausted its deliveries: the message is forged (or its last
    /// delivery never got as far as the mark), and it is dropped with a warning; the scan goes on.
    /// Idempotent: a finished item is left alone (the usual case — the last delivery recorded its
    /// own failure). A message that cannot be decoded, or names no recorded scan, has no work
    /// item to settle and is dropped with a warning.
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
                .drop_work_item(&tracker, &scan, &work_id, message.shard_hint(), true)
                .await
            {
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
        let shard = messages::shard_for(&message, &work_id, scan.shards);
        match patiently(true, || tracker.work_state_marked(scan_id, shard, &work_id)).await {
            // Not marked by a last delivery: the item has deliveries left (or its last one has
            // not begun), so the message is forged or early. Failing the scan on it would let
            // anyone who can write a queue stop any scan.
            Ok(Some((WorkState::Pending { .. } | WorkState::Expanded { .. }, false))) => {
                tracing::warn!(work = %work_id, scan = %scan_id, "ignored a poisoned message whose work item has not exhausted its deliveries (forged, or early); the scan goes on");
                return reply(
                    StatusCode::OK,
                    format!(
                        "{work_id}: ignored a poisoned message of scan {scan_id}: its work item \
                         has not exhausted its deliveries (no last delivery marked it); the scan \
                         goes on"
                    ),
                );
            }
            Ok(_) => {}
            Err(e) => {
                return reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("{work_id}: could not read the poisoned item: {e}"),
                )
            }
        }
        let reason = format!(
            "work item {work_id} ({}) was poisoned: its last delivery began and no delivery \
             recorded an outcome (handler killed or timed out)",
            M::NAME
        );
        match self.fail_work_item(&scan, &work_id, shard, &reason).await {
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
}
