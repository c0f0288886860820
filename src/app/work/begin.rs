//! Beginning a work item: decode its message, find its scan's state and recorded context,
//! and decide whether it still has to run (or adopt an earlier delivery's recorded outcome).

use super::*;
use crate::app::pace::Meter;
use crate::app::tracking::retention::{record_may_appear, start_in_progress};

impl<S: Stores> Runner<'_, S> {
    /// The state and recorded context of scan `scan_id` (`None`: no such scan, or not recorded
    /// yet). Served from the cache when it can be trusted; a record read refreshes both.
    /// `patient`: retry storage trouble as on a last attempt (see [`patiently`]).
    pub(super) async fn scan_of<T: TableStore>(
        &self,
        tracker: &Tracker<'_, T>,
        scan_id: &str,
        patient: bool,
    ) -> Result<Option<(ScanState, Arc<ScanContext>)>, ScanLookupError> {
        if let (Some(state), Some(context)) = (
            self.app.scan_states.get(scan_id),
            self.app.scan_states.context(scan_id),
        ) {
            return Ok(Some((state, context)));
        }
        let Some(record) = patiently(patient, || tracker.get_scan(scan_id))
            .await
            .map_err(ScanLookupError::Storage)?
        else {
            return Ok(None);
        };
        let context = Arc::new(
            self.usable_context(&record)
                .map_err(ScanLookupError::Unusable)?,
        );
        self.app.scan_states.put(scan_id, record.state);
        self.app.scan_states.put_context(context.clone());
        Ok(Some((record.state, context)))
    }

    /// Finishes an unfinished work item of an ended scan as dropped. With `spare_marked`, a row
    /// a last delivery marked is left to that delivery (tracking invariant 6). Says what it did;
    /// idempotent under redelivery.
    pub(super) async fn drop_work_item<T: TableStore>(
        &self,
        tracker: &Tracker<'_, T>,
        scan: &ScanContext,
        (work_id, shard_hint): (&str, Option<u32>),
        last_attempt: bool,
        spare_marked: bool,
    ) -> Result<DropOutcome, StorageError> {
        let shard = messages::item_shard(shard_hint, work_id, scan.shards);
        let state = patiently(last_attempt, || {
            tracker.work_state_marked(&scan.scan_id, shard, work_id)
        })
        .await?;
        let etag = match state {
            Some((_, true)) if spare_marked => return Ok(DropOutcome::Spared),
            Some((WorkState::Pending { etag } | WorkState::Expanded { etag, .. }, _)) => etag,
            Some((WorkState::Finished, _)) | None => return Ok(DropOutcome::Finished),
        };
        let completion = patiently(last_attempt, || {
            tracker.drop_work(&scan.scan_id, shard, work_id, &etag)
        })
        .await?;
        Ok(match completion {
            Completion::Committed { .. } => DropOutcome::Dropped,
            Completion::Duplicate => DropOutcome::Finished,
        })
    }

    /// The live queue of messages of type `M` (where a re-queued or deferred one goes back).
    pub(super) fn live_queue<M: WorkMessage>(&self) -> &str {
        if M::NAME == StepMessage::NAME {
            &self.app.config.prefix_scan_queue
        } else {
            &self.app.config.table_copy_queue
        }
    }

    /// A message whose scan is not recorded yet on its last delivery, or poisoned so (a start
    /// still writing the record: the starter queues the root first, and under storage trouble
    /// its request can outlast every delivery): `message` is put back on `queue`, as it came,
    /// delivered after [`poison::REQUEUE_DELAY`], and this delivery succeeds. Dropping it would
    /// leave the scan running with no root, for ever. Bounded: once the record can no longer
    /// appear (`record_may_appear`, 15 minutes after the id's start) the message is dropped.
    pub(super) async fn defer_unrecorded(
        &self,
        queue: &str,
        message: &str,
        work_id: &str,
        scan_id: &str,
    ) -> InvocationResponse {
        let text = messages::queue_text(message.as_bytes());
        let delay = poison::REQUEUE_DELAY;
        match self.app.queues.put_message(queue, &text, delay).await {
            Ok(()) => reply(
                StatusCode::OK,
                format!(
                    "{work_id}: scan {scan_id} is not recorded yet on the message's last delivery; \
                     put back, delivered in {} s",
                    delay.as_secs()
                ),
            ),
            Err(e) => reply(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("{work_id}: scan {scan_id} is not recorded yet, and its message could not be put back: {e}"),
            ),
        }
    }

    /// Decodes an invocation and checks that its work is still to be done. `Err` is the reply to
    /// send right away (malformed message, duplicate, dropped scan).
    pub async fn begin<M: WorkMessage>(&self, body: &[u8]) -> Result<Begun<M>, InvocationResponse> {
        let (invocation, message) = decode::<M>(body)?;
        let scan_id = message.scan_id().to_string();
        let work_id = messages::work_id(&message);
        let requests = Meter::new();
        let store = self
            .app
            .counted_table(STORAGE_SETTING, &requests)
            .map_err(|e| reply(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        let tracker = self.app.tracker_on(&store);
        let last_attempt = invocation.dequeue_count >= self.app.config.max_dequeue_count;
        let hint = message.shard_hint();
        let live = (self.live_queue::<M>(), invocation.message.as_str());
        let scan = self
            .running_scan(&tracker, (&scan_id, &work_id, hint), last_attempt, live)
            .await?;
        self.admit::<M>(&scan, &requests, &invocation, &work_id)
            .await?;
        let shard = messages::item_shard(hint, &work_id, scan.shards);
        let progress = progress_of(self, &tracker, &scan, &work_id, shard, last_attempt).await?;
        Ok(Begun {
            message,
            scan,
            invocation,
            work_id,
            shard,
            progress,
            requests,
        })
    }

    /// The recorded context of the item's scan if the scan is running. An ended scan's item is
    /// dropped here; a scan not recorded yet is retried, and on the last attempt put back on its
    /// live queue (`live`: the queue and the message's text; [`Runner::defer_unrecorded`]).
    async fn running_scan<T: TableStore>(
        &self,
        tracker: &Tracker<'_, T>,
        (scan_id, work_id, shard_hint): (&str, &str, Option<u32>),
        last_attempt: bool,
        (queue, message): (&str, &str),
    ) -> Result<Arc<ScanContext>, InvocationResponse> {
        let (state, scan) = match self.scan_of(tracker, scan_id, last_attempt).await {
            Ok(Some(found)) => found,
            // Or the scan's record was removed (its retention ended): it will not come back.
            Ok(None) if !record_may_appear(scan_id, tracker.now()) => {
                return Err(reply(
                    StatusCode::OK,
                    format!("{work_id}: scan {scan_id} does not exist; dropping the message"),
                ))
            }
            Ok(None) if last_attempt && start_in_progress(scan_id, tracker.now()) => {
                return Err(self
                    .defer_unrecorded(queue, message, work_id, scan_id)
                    .await)
            }
            Ok(None) if last_attempt => {
                return Err(reply(
                    StatusCode::OK,
                    format!(
                    "{work_id}: scan {scan_id} cannot be recorded any more; dropping the message"
                ),
                ))
            }
            // The starter writes the record right after queuing the root: retry until it exists.
            Ok(None) => {
                return Err(reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("{work_id}: scan {scan_id} is not recorded yet"),
                ))
            }
            Err(ScanLookupError::Storage(e)) => return Err(storage_failure(work_id, e)),
            Err(ScanLookupError::Unusable(e)) => {
                return Err(reply(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("{work_id}: {e}"),
                ))
            }
        };
        if state == ScanState::Running {
            return Ok(scan);
        }
        // A duplicate copy of the message of an item whose last delivery is under way leaves
        // the item to it: that delivery may be recording the failure that ended the scan.
        let dropped = self
            .drop_work_item(tracker, &scan, (work_id, shard_hint), last_attempt, true)
            .await
            .map_err(|e| storage_failure(work_id, e))?;
        Err(reply(
            StatusCode::OK,
            format!(
                "{work_id}: scan {scan_id} is {}; {}",
                state.as_str(),
                match dropped {
                    DropOutcome::Dropped => "dropped its work item",
                    DropOutcome::Finished => "no unfinished work item to drop",
                    DropOutcome::Spared =>
                        "its work item is left to its last delivery, which marked it",
                }
            ),
        ))
    }
}

impl<S: Stores> Runner<'_, S> {
    /// Paces the item's requests by its scan's rate limit, if it has one (`app::pace`): the
    /// item runs once this instance's backlog of the scan's tokens is at most [`ADMIT_BACKLOG`],
    /// waiting for that at most [`MAX_ADMIT_WAIT`]; after that its message is queued again,
    /// visible once the backlog has passed, and this delivery ends (`Err`: the reply).
    pub(super) async fn admit<M: WorkMessage>(
        &self,
        scan: &ScanContext,
        requests: &Meter,
        invocation: &QueueInvocation,
        work_id: &str,
    ) -> Result<(), InvocationResponse> {
        self.app.adapt(scan, requests);
        let Some(pacer) = self.app.pacer_for(scan) else {
            return Ok(());
        };
        requests.pace_by(pacer.clone());
        // The host's delete of this delivery's message.
        pacer.charge(1);
        let deadline = tokio::time::Instant::now() + MAX_ADMIT_WAIT;
        // Bounded by the deadline.
        loop {
            let backlog = pacer.backlog();
            if backlog <= ADMIT_BACKLOG {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep((backlog - ADMIT_BACKLOG).min(Duration::from_secs(1))).await;
        }
        let delay = (pacer.backlog() + Duration::from_millis(rand::random::<u64>() % 5_000))
            .min(MAX_DEFERRAL);
        let queue = if M::NAME == messages::StepMessage::NAME {
            &self.app.config.prefix_scan_queue
        } else {
            &self.app.config.table_copy_queue
        };
        // The put, and the next delivery's share of a receive, are the scan's requests too.
        pacer.charge(2);
        // The host gave the message decoded: encode it again as tablescan's queues hold it.
        let text = messages::queue_text(invocation.message.as_bytes());
        self.app
            .queues
            .put_message(queue, &text, delay)
            .await
            .map_err(|e| storage_failure(work_id, e))?;
        Err(reply(
            StatusCode::OK,
            format!(
                "{work_id}: scan {} is at its maxRequestsPerSecond ({}/s): message queued again, visible in {} s",
                scan.scan_id,
                pacer.limit(),
                delay.as_secs()
            ),
        ))
    }
}

/// A rate-limited item starts once this instance's backlog of its scan's tokens is at most this
/// long, so each of its requests waits about this long at most.
pub(super) const ADMIT_BACKLOG: Duration = Duration::from_secs(5);
/// How long an item waits to start before its message is queued again (well within host.json's
/// 10-minute `functionTimeout`, with the item's own work still to do).
pub(super) const MAX_ADMIT_WAIT: Duration = Duration::from_secs(120);
/// How long a delivery of a phase's root that finds no work row waits for its registration
/// before it reads the row again (see `Runner::start_phase`).
const PHASE_REGISTRATION_WAIT: Duration = Duration::from_secs(1);
/// Longest delay of a message queued again.
const MAX_DEFERRAL: Duration = Duration::from_secs(600);

/// The invocation and its decoded message. A message that cannot be decoded never will be: it
/// is rejected so the host poisons it.
fn decode<M: WorkMessage>(body: &[u8]) -> Result<(QueueInvocation, M), InvocationResponse> {
    let invocation = queue_invocation(body)?;
    let rejected = |e: String| {
        reply(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("rejected {} message: {e}", M::NAME),
        )
    };
    let message: M = messages::decode(&invocation.message).map_err(|e| rejected(e.to_string()))?;
    if !is_valid_scan_id(message.scan_id()) {
        return Err(rejected(format!(
            "{:?} is not a scan id",
            message.scan_id()
        )));
    }
    Ok((invocation, message))
}

fn storage_failure(work_id: &str, e: StorageError) -> InvocationResponse {
    reply(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("{work_id}: storage: {e}"),
    )
}

/// Where the item's row stands: to execute, or with an outcome recorded by an earlier delivery.
/// A finished item (a duplicate delivery) and an item with no row are answered right away.
async fn progress_of<S: Stores, T: TableStore>(
    app: &Runner<'_, S>,
    tracker: &Tracker<'_, T>,
    scan: &ScanContext,
    work_id: &str,
    shard: u32,
    last_attempt: bool,
) -> Result<Progress, InvocationResponse> {
    let read_row = || async {
        patiently(last_attempt, || {
            tracker.work_state_marked(&scan.scan_id, shard, work_id)
        })
        .await
        .map_err(|e| storage_failure(work_id, e))
    };
    let mut read = read_row().await?;
    if read.is_none() && app.is_phase_root(scan, work_id, shard) {
        // A phase's root is queued just before its row is registered (`Runner::start_phase`):
        // this delivery may have come first. It waits for the registration once.
        tokio::time::sleep(PHASE_REGISTRATION_WAIT).await;
        read = read_row().await?;
    }
    let state = match read {
        Some((state, false)) if last_attempt => {
            mark_last_delivery(tracker, scan, work_id, shard, state)
                .await
                .map_err(|e| storage_failure(work_id, e))?
        }
        read => read.map(|(state, _)| state),
    };
    match state {
        Some(WorkState::Pending { etag }) => Ok(Progress::Fresh { etag }),
        Some(WorkState::Expanded { etag, outcome }) => {
            let outcome = parse_outcome(work_id, &outcome)
                .map_err(|e| reply(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
            Ok(Progress::Recorded { etag, outcome })
        }
        Some(WorkState::Finished) => {
            // The delivery that finished it may have died before checking for the end of the
            // scan (handler killed between the two): check on its behalf.
            let completed = app
                .complete_if_drained(tracker, scan, Some(shard))
                .await
                .map_err(|e| storage_failure(work_id, e))?;
            Err(reply(
                StatusCode::OK,
                format!(
                    "{work_id}: already done (duplicate delivery){}",
                    if completed { "; scan completed" } else { "" }
                ),
            ))
        }
        None => Err(reply(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "{work_id}: no work row for this message in scan {}",
                scan.scan_id
            ),
        )),
    }
}

/// Most times the last delivery reads its row again to mark it (each time because the row
/// changed in between: a concurrent duplicate delivery recorded or finished it).
const MAX_MARK_ATTEMPTS: u32 = 5;

/// On the last delivery: marks the unfinished item's row before the item runs (tracking
/// invariant 7), so that if this delivery dies too, the poison function knows the item really
/// exhausted its deliveries. Returns the row's state with its new ETag (or the state a
/// concurrent delivery left it in).
async fn mark_last_delivery<T: TableStore>(
    tracker: &Tracker<'_, T>,
    scan: &ScanContext,
    work_id: &str,
    shard: u32,
    mut state: WorkState,
) -> Result<Option<WorkState>, StorageError> {
    for _ in 0..MAX_MARK_ATTEMPTS {
        let etag = match &state {
            WorkState::Pending { etag } | WorkState::Expanded { etag, .. } => etag.clone(),
            WorkState::Finished => return Ok(Some(state)),
        };
        let marked = patiently(true, || {
            tracker.mark_last_delivery(&scan.scan_id, shard, work_id, &etag)
        })
        .await?;
        if let Some(new_etag) = marked {
            return Ok(Some(match state {
                WorkState::Pending { .. } => WorkState::Pending { etag: new_etag },
                WorkState::Expanded { outcome, .. } => WorkState::Expanded {
                    etag: new_etag,
                    outcome,
                },
                WorkState::Finished => WorkState::Finished,
            }));
        }
        match patiently(true, || {
            tracker.work_state_marked(&scan.scan_id, shard, work_id)
        })
        .await?
        {
            Some((now, false)) => state = now,
            other => return Ok(other.map(|(now, _)| now)),
        }
    }
    Err(StorageError::new(
        crate::storage::StorageErrorKind::Transient,
        format!("the row of {work_id} kept changing while its last delivery marked it"),
    ))
}

/// A delivery of a phase's root that comes before its registration (the message is queued
/// first, visible at once) waits for the row once; any other item with no row is answered at
/// once. In paused (virtual) time, on the in-memory stores.
#[cfg(all(test, feature = "lab"))]
mod tests {
    use super::*;
    use crate::app::config::STORAGE_SETTING;
    use crate::app::drivers::tests::test_context;
    use crate::app::job::DriverName;
    use crate::lab::memory::{MemoryQueueStore, MemoryStores, MemoryTableStore};

    #[tokio::test(start_paused = true)]
    async fn a_phase_root_delivered_before_its_registration_waits_for_it_once() {
        let config = crate::app::config::emulator_only();
        let tables = [(STORAGE_SETTING.to_string(), MemoryTableStore::default())].into();
        let drivers = crate::app::drivers::registry();
        let state =
            AppState::<MemoryStores>::new(config, tables, MemoryQueueStore::default(), drivers);
        let store = state.bookkeeping();
        store.create_table(&state.config.work_table).await.unwrap();
        let tracker = state.tracker_on(store);
        let scan = ScanContext {
            driver: DriverName::new("index"),
            ..test_context("8000000000000-phase000")
        };
        let runner = Runner::new(&state);
        let phase = state.drivers.of(&scan).unwrap().phase(&scan, 1).unwrap();
        let root = runner.child_message_in(&scan, &phase, None).unwrap().work;
        assert!(runner.is_phase_root(&scan, &root.id, root.shard));
        assert!(!runner.is_phase_root(&scan, "t-other", root.shard));

        // Not a phase root: no row is answered at once.
        let started = tokio::time::Instant::now();
        let early = progress_of(&runner, &tracker, &scan, "t-other", root.shard, false).await;
        assert_eq!(
            early.err().map(|r| r.status),
            Some(StatusCode::UNPROCESSABLE_ENTITY)
        );
        assert!(started.elapsed() < Duration::from_millis(100));

        // The root, never registered: answered after one wait.
        let started = tokio::time::Instant::now();
        let missing = progress_of(&runner, &tracker, &scan, &root.id, root.shard, false).await;
        assert_eq!(
            missing.err().map(|r| r.status),
            Some(StatusCode::UNPROCESSABLE_ENTITY)
        );
        assert!(started.elapsed() >= PHASE_REGISTRATION_WAIT);

        // The root, registered while its delivery waits: it goes on.
        let (register, deliver) = tokio::join!(
            async {
                tokio::time::sleep(PHASE_REGISTRATION_WAIT / 4).await;
                tracker.register_children(&scan.scan_id, &[&root]).await
            },
            progress_of(&runner, &tracker, &scan, &root.id, root.shard, false)
        );
        register.unwrap();
        assert!(matches!(deliver, Ok(Progress::Fresh { .. })));
    }
}
