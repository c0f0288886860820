//! Finishing a work item: record its outcome, register and queue its children, commit its
//! completion with its counters, and notice the end of the scan.

use super::*;
use crate::app::drivers::kit::scan_ended;
use crate::app::tracking::MAX_FOLDED_CHILDREN;
use crate::storage::stores::Stores;
use crate::storage::Entity;

/// Tokens a paced commit takes before settling its outcome (the work row's read and write and
/// the counter's, in the usual case).
const SETTLE_TOKENS: u32 = 4;
/// Tokens it takes before its completion's transaction (a counter read and the write).
const COMPLETE_TOKENS: u32 = 2;
/// Tokens a hand-off takes before recording its outcome (the write, and its read-back where the
/// store reports no ETag), besides a counter read and write for each shard its items land in.
const HAND_OFF_TOKENS: u32 = 2;

impl<S: Stores> Runner<'_, S> {
    /// Commits a work item's result (or its failure on the last attempt) and builds the reply.
    /// `result` is ignored when an earlier execution's outcome was recorded.
    pub async fn finish<M: WorkMessage>(
        &self,
        begun: Begun<M>,
        result: Result<Executed, WorkError>,
    ) -> InvocationResponse {
        let scan_id = begun.scan.scan_id.clone();
        match self.commit(&begun, result).await {
            Ok(line) => reply(StatusCode::OK, line),
            Err(e) => {
                // A transient storage error on the last delivery is not the item's own failure:
                // it is left unrecorded (the row keeps its last delivery's mark), the host
                // poisons the message, and the poison function re-queues it (`poison`).
                let last = begun.invocation.dequeue_count >= self.app.config.max_dequeue_count;
                let transient = matches!(&e, WorkError::Storage(s) if s.is_transient());
                if e.is_permanent() || (last && !transient) {
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
        self.fail_work_item(&begun.scan, &begun.work_id, begun.shard, &reason)
            .await
            .map(|_| ())
    }

    async fn commit<M: WorkMessage>(
        &self,
        begun: &Begun<M>,
        result: Result<Executed, WorkError>,
    ) -> Result<String, WorkError> {
        let scan = &*begun.scan;
        let (mut result, mut rows) = match result {
            Ok(executed) => (Ok(executed.outcome), executed.rows),
            Err(e) => (Err(e), Vec::new()),
        };
        // Its scan ended while it ran (`watch`): it commits what it did and queues nothing
        // more — no child, no work on its rows. (An outcome an earlier delivery recorded may
        // have registered children already: their messages are queued, to be dropped.)
        if scan_ended(self.app, &scan.scan_id) && matches!(begun.progress, Progress::Fresh { .. }) {
            if let Ok(outcome) = &mut result {
                outcome.children.clear();
                outcome.in_step.clear();
            }
            rows.clear();
        }
        // The commit's requests must not wait between an optimistic read and its write: they
        // take their tokens ahead (pace module, invariant 1).
        begun.requests.prepay(SETTLE_TOKENS).await?;
        let store = self.app.prepaid_bookkeeping(&begun.requests);
        let tracker = self.app.tracker_on(&store);
        let own = begun.shard;
        let Settled {
            etag,
            outcome,
            counter,
            children,
            folded,
        } = match self.settle(&tracker, begun, result, &mut rows).await? {
            Ok(settled) => settled,
            Err(answer) => return Ok(answer),
        };

        // With a counter, the record registered the first `folded` own-shard children.
        let folded = counter.is_some().then_some((own, folded));
        self.register_and_queue(&tracker, begun, &children, folded)
            .await?;
        let worked = self.work_in_step(begun, &outcome, rows).await?;
        let handed_off = worked.handed_off.len();
        let result = outcome.result.clone();
        let (etag, counter, mut delta) = match handed_off == 0 {
            true => (etag, counter, outcome.delta.plus(&worked.counters)),
            false => {
                let (etag, delta) = self
                    .hand_off(&tracker, begun, &etag, outcome, worked)
                    .await?;
                (etag, None, delta)
            }
        };
        // Count the completion's own transaction (and counter read) too.
        delta.storage_requests =
            begun.requests.count() as i64 + if counter.is_some() { 1 } else { 2 };
        delta.refused_requests = begun.requests.refused() as i64;
        begun.requests.prepay(COMPLETE_TOKENS).await?;
        let completion = tracker
            .complete(
                &scan.scan_id,
                own,
                &begun.work_id,
                &etag,
                delta,
                None,
                result.as_deref(),
                counter,
            )
            .await?;
        if completion == Completion::Duplicate
            && !matches!(
                tracker
                    .work_state(&scan.scan_id, own, &begun.work_id)
                    .await?,
                Some(WorkState::Finished) | None
            )
        {
            // Not finished, only changed: a concurrent delivery recorded an outcome after this
            // one read the row, which this one must adopt, not answer as done (its message
            // would be deleted with the other delivery's outcome unfinished if that one dies).
            // Try again, reading the row.
            return Err(changed_under(&begun.work_id));
        }
        self.notice_end(&tracker, scan, own, completion).await?;
        match completion {
            Completion::Duplicate => Ok(format!(
                "{}: completed concurrently by another delivery",
                begun.work_id
            )),
            Completion::Committed { .. } => Ok(format!(
                "{}: done ({} children, {} rows scanned, {} rows written)",
                begun.work_id,
                children.len() + handed_off,
                delta.rows_scanned,
                delta.rows_written
            )),
        }
    }

    /// Settles which outcome of this item counts: a recorded one (this delivery adopts it), this
    /// delivery's own (recorded first when it has children or its step work changes what it
    /// read), or another delivery's that got there first (this delivery's step rows are then
    /// dropped). `Err(answer)`: nothing is left for this delivery to do.
    async fn settle<M: WorkMessage, T: TableStore>(
        &self,
        tracker: &Tracker<'_, T>,
        begun: &Begun<M>,
        result: Result<WorkOutcome, WorkError>,
        rows: &mut Vec<Entity>,
    ) -> Result<Result<Settled, String>, WorkError> {
        let scan = &*begun.scan;
        let own = begun.shard;
        let (etag, outcome, counter, children, folded) = match (&begun.progress, result) {
            (Progress::Recorded { etag, outcome }, _) => {
                let children = self.children_of(scan, own, outcome)?;
                (etag.clone(), outcome.clone(), None, children, 0)
            }
            // Without children there is nothing two executions could disagree on but counters,
            // and only one completion can commit: no need to record the outcome first — unless
            // the step's own work changes what it read (a delete): a duplicate delivery reading
            // after it would count fewer rows, so the first reading is recorded before working.
            (Progress::Fresh { etag }, Ok(outcome))
                if outcome.children.is_empty()
                    && (outcome.in_step.is_empty()
                        || !self.app.drivers.of(scan)?.changes_source()) =>
            {
                (etag.clone(), outcome, None, Vec::new(), 0)
            }
            (Progress::Fresh { etag }, Ok(mut outcome)) => {
                outcome.first_grouped = true;
                let children = self.children_of(scan, own, &outcome)?;
                // The children in the item's own shard are registered with the outcome.
                let folded: Vec<&NewWork> = children
                    .iter()
                    .map(|c| &c.work)
                    .filter(|w| w.shard == own)
                    .take(MAX_FOLDED_CHILDREN)
                    .collect();
                let json = serde_json::to_string(&outcome).expect("outcomes serialize");
                match tracker
                    .record_outcome(&scan.scan_id, own, &begun.work_id, etag, &json, &folded)
                    .await
                {
                    Ok(recorded) => {
                        let n = folded.len();
                        (recorded.etag, outcome, recorded.counter, children, n)
                    }
                    // Another execution got there first: its outcome is the one that counts.
                    // Its step rows are its to work on: this delivery's are dropped, and its
                    // ranges read again (`work_in_step`).
                    Err(RecordError::Lost(Some(WorkState::Expanded { etag, outcome }))) => {
                        rows.clear();
                        let outcome = parse_outcome(&begun.work_id, &outcome)?;
                        let children = self.children_of(scan, own, &outcome)?;
                        (etag, outcome, None, children, 0)
                    }
                    // Still pending under another ETag than the one this delivery read (it
                    // changed in between without being recorded). Try again, reading the row.
                    Err(RecordError::Lost(Some(WorkState::Pending { .. }))) => {
                        return Err(changed_under(&begun.work_id))
                    }
                    Err(RecordError::Lost(_)) => {
                        return Ok(Err(format!(
                            "{}: finished by another delivery",
                            begun.work_id
                        )))
                    }
                    Err(RecordError::Storage(e)) => return Err(e.into()),
                }
            }
            // On the last delivery `finish` records the failure (see `record_failure`).
            (Progress::Fresh { .. }, Err(e)) => return Err(e),
        };
        Ok(Ok(Settled {
            etag,
            outcome,
            counter,
            children,
            folded,
        }))
    }

    /// Ends the scan if this completion drained it. Checked also after a duplicate completion:
    /// it may have been this delivery's own commit whose answer was lost, and then nobody else
    /// would notice.
    async fn notice_end<T: TableStore>(
        &self,
        tracker: &Tracker<'_, T>,
        scan: &ScanContext,
        own: u32,
        completion: Completion,
    ) -> Result<(), WorkError> {
        let scan_completed = match completion {
            Completion::Committed { shard_idle: false } => false,
            Completion::Committed { shard_idle: true } => {
                self.complete_if_drained(tracker, scan, None).await?
            }
            Completion::Duplicate => self.complete_if_drained(tracker, scan, Some(own)).await?,
        };
        if scan_completed {
            tracing::info!(scan = %scan.scan_id, "scan completed");
        }
        Ok(())
    }

    /// A scan step's work on the rows it read, done by the scan's driver after the step's
    /// children were queued: on the `rows` in memory, or, for an adopted outcome, on its
    /// recorded ranges read again. A paced driver stops starting work `hand_off_after` from
    /// here and hands the rest on (`job::Worked`; [`Runner::hand_off`]).
    async fn work_in_step<M: WorkMessage>(
        &self,
        begun: &Begun<M>,
        outcome: &WorkOutcome,
        rows: Vec<Entity>,
    ) -> Result<Worked, WorkError> {
        // An outcome adopted from an earlier delivery keeps its ranges: skipped once the scan
        // ended, as a driver's work stops then (`watch`).
        if outcome.in_step.is_empty() || scan_ended(self.app, &begun.scan.scan_id) {
            return Ok(Worked::default());
        }
        let until = tokio::time::Instant::now() + self.app.config.hand_off_after;
        let (scan, requests) = (&*begun.scan, &begun.requests);
        let driver = self.app.drivers.of(scan)?;
        if !rows.is_empty() {
            let runs = runs_of(rows, &outcome.in_step);
            return driver
                .work_rows(self.app, scan, requests, runs, until)
                .await;
        }
        let mut total = Worked::default();
        for range in &outcome.in_step {
            let worked = driver
                .rework(self.app, scan, requests, range, until)
                .await?;
            total = total.plus(worked);
        }
        Ok(total)
    }

    /// Hands the rows a step's work did not reach to the items `worked` names: records the
    /// step's outcome under `etag` (again, or for the first time if the step had no children
    /// and so recorded none: `pending` → `expanded`), with those items as more children, no
    /// in-step ranges (each row is put, or an item's) and what was worked counted, so that a
    /// delivery adopting it only registers and queues the children again and completes; then
    /// registers and queues the new children. Returns the row's new ETag and the outcome's
    /// counters. A row changed since `etag` is another delivery's now: this one is retried (its
    /// puts were at-least-once duplicates).
    async fn hand_off<M: WorkMessage, T: TableStore>(
        &self,
        tracker: &Tracker<'_, T>,
        begun: &Begun<M>,
        etag: &str,
        mut outcome: WorkOutcome,
        worked: Worked,
    ) -> Result<(String, Counters), WorkError> {
        let scan = &*begun.scan;
        let first_new = outcome.children.len();
        outcome.delta = outcome.delta.plus(&worked.counters);
        outcome.in_step.clear();
        outcome.children.extend(worked.handed_off);
        let json = serde_json::to_string(&outcome).expect("outcomes serialize");
        let (id, own) = (&begun.work_id, begun.shard);
        let children = self.children_of(scan, own, &outcome)?;
        let shards: std::collections::BTreeSet<u32> =
            children[first_new..].iter().map(|c| c.work.shard).collect();
        let tokens = HAND_OFF_TOKENS + 2 * shards.len() as u32;
        begun.requests.prepay(tokens).await?;
        let etag = tracker
            .rewrite_outcome(&scan.scan_id, own, id, etag, &json)
            .await?
            .ok_or_else(|| changed_under(id))?;
        self.register_and_queue(tracker, begun, &children[first_new..], None)
            .await?;
        tracing::info!(work = %id, scan = %scan.scan_id, rows = worked.rows_handed_off, items = children.len() - first_new, "a step handed rows on to items of their own");
        Ok((etag, outcome.delta))
    }

    /// Registers `children` (except, with `folded` = `(shard, n)`, the first `n` children in
    /// `shard`, registered with the outcome), then queues them all. Registering is idempotent
    /// (rows already there are left alone), so a delivery that adopted a recorded outcome
    /// registers every child again.
    async fn register_and_queue<M: WorkMessage, T: TableStore>(
        &self,
        tracker: &Tracker<'_, T>,
        begun: &Begun<M>,
        children: &[ChildMessage],
        folded: Option<(u32, usize)>,
    ) -> Result<(), WorkError> {
        let (folded_shard, mut skip) = folded.unwrap_or((u32::MAX, 0));
        let new_work: Vec<&NewWork> = children
            .iter()
            .map(|c| &c.work)
            .filter(|w| {
                let was_folded = w.shard == folded_shard && skip > 0;
                skip -= usize::from(was_folded);
                !was_folded
            })
            .collect();
        tracker
            .register_children(&begun.scan.scan_id, &new_work)
            .await?;
        let queues = Counted::new(self.app.queues.clone(), begun.requests.clone());
        try_join_all(
            children
                .iter()
                .map(|c| queues.put_message(&c.queue, &c.text, Duration::ZERO)),
        )
        .await?;
        Ok(())
    }

    /// The messages of an outcome's children: those the outcome puts in `own` shard there (see
    /// [`WorkOutcome::in_own_shard`]), every other child in the shard its id hashes to. Not every
    /// item: the items of one step finish at about the same time and would contend for one
    /// counter (measured in the simulator: all items in the parent's shard cost more requests in
    /// retries than their registrations saved).
    fn children_of(
        &self,
        scan: &ScanContext,
        own: u32,
        outcome: &WorkOutcome,
    ) -> Result<Vec<ChildMessage>, MessageError> {
        outcome
            .children
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let shard = outcome.in_own_shard(i).then_some(own);
                self.child_message_in(scan, c, shard)
            })
            .collect()
    }
}

/// The transient error of a delivery whose work row changed under it without being finished:
/// the message is retried, and its next delivery reads the row.
fn changed_under(work_id: &str) -> WorkError {
    WorkError::Storage(StorageError::new(
        crate::storage::StorageErrorKind::Transient,
        format!("{work_id}: its work row changed under this delivery; trying again"),
    ))
}

/// A step's rows (in key order) cut into its contiguous runs, as its outcome records them (one
/// range per run, in order); rows past the last run's end, if any, form one more run.
fn runs_of(rows: Vec<Entity>, ranges: &[crate::app::job::RangeWork]) -> Vec<Vec<Entity>> {
    let mut runs = Vec::with_capacity(ranges.len());
    let mut rest = rows.into_iter().peekable();
    for range in ranges {
        let crate::app::job::RangeWork::Range { to, .. } = range else {
            continue;
        };
        let mut run = Vec::new();
        for row in rest.by_ref() {
            let last = (&row.partition_key, &row.row_key) == (&to.0, &to.1);
            run.push(row);
            if last {
                break;
            }
        }
        runs.push(run);
    }
    if rest.peek().is_some() {
        runs.push(rest.collect());
    }
    runs.retain(|run| !run.is_empty());
    runs
}

/// The outcome of an item that counts, as `commit` goes on with it.
struct Settled {
    /// The work row's ETag.
    etag: String,
    outcome: WorkOutcome,
    /// The counter row the outcome's record read (its counters and ETag), if it did.
    counter: Option<(Counters, String)>,
    children: Vec<ChildMessage>,
    /// How many of the first own-shard children the record registered.
    folded: usize,
}
