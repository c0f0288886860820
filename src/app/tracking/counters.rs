//! Sharded counters: per scan, `shards` partitions `{scanId}-{shard:02}` of the work table, each
//! with one `counter` row; the sums say how much work is registered, finished, failed, dropped.

use futures::future::try_join_all;

use super::codec::work_row;
use super::codec::{get_str, get_time, int64, put_int64, put_str, put_time};
use super::records::ScanState;
use super::{claim_token, shard_partition, NewWork, Tracker};
use crate::storage::{
    BatchOperation, CompareOp, Entity, Filter, Query, StorageError, StorageErrorKind, TableStore,
};

const COUNTER_ROW: &str = "counter";

/// How old a phase start's claim must be before another drained check may take it over: the
/// claimer queues and registers the phase's root within milliseconds, and its own message is
/// delivered again only after the queue's 30-s visibility timeout if it dies in between.
const PHASE_CLAIM_TAKEOVER: time::Duration = time::Duration::seconds(10);

/// The property of a phase start's claim row holding when it was claimed.
const CLAIMED_AT: &str = "ClaimedAt";
/// The property of a phase start's claim row holding the claiming attempt's token.
const CLAIMED_BY: &str = "ClaimedBy";

/// Counter values of one shard, or their sum over a scan.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Counters {
    /// Work items registered.
    pub created: i64,
    /// Work items finished (done, failed or dropped).
    pub completed: i64,
    /// Work items that failed for good (poisoned).
    pub failed: i64,
    pub rows_scanned: i64,
    pub rows_written: i64,
    pub storage_requests: i64,
    /// Queue messages whose work was committed.
    pub messages: i64,
    /// Work items finished without running because their scan had ended (cancelled or failed).
    /// Absent from counters and outcomes recorded by earlier versions: 0.
    #[serde(default)]
    pub dropped: i64,
    /// Rows a scan's filter let through (every row read, without a filter). Absent from
    /// counters and outcomes recorded by earlier versions: 0.
    #[serde(default)]
    pub rows_matched: i64,
    /// Messages a driver put on a queue of the user's (the enqueue driver). Absent from
    /// counters and outcomes recorded by earlier versions: 0; left out of outcomes and counter
    /// rows while 0, so every other driver's recorded formats are unchanged.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub messages_written: i64,
    /// Attempts the storage service refused for load (503, 500 `OperationTimedOut`), each
    /// retried (issue 43). Absent from earlier versions' records: 0; left out while 0, as
    /// [`Counters::messages_written`].
    #[serde(default, skip_serializing_if = "is_zero")]
    pub refused_requests: i64,
    /// Rows a delete kept because they changed since they were read (the service answered
    /// `412` to the delete sent with the ETag read). Left out while 0, as
    /// [`Counters::messages_written`].
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rows_changed: i64,
    /// Rows an expire left alone because their time could not be read from their key. Left
    /// out while 0, as [`Counters::messages_written`].
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rows_skipped: i64,
    /// A dry run's storage requests the real run would send besides the dry run's own
    /// (its transactions, less the re-reads only the dry run sends; may be negative in one
    /// item). Left out while 0, as [`Counters::messages_written`].
    #[serde(default, skip_serializing_if = "is_zero")]
    pub planned_requests: i64,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// The counter row property of [`Counters::messages_written`], written only once it is not 0.
const MESSAGES_WRITTEN: &str = "MessagesWritten";
/// The counter row property of [`Counters::refused_requests`], written only once it is not 0.
const REFUSED_REQUESTS: &str = "RefusedRequests";
/// The counter row properties of the counters written only once they are not 0.
const ROWS_CHANGED: &str = "RowsChanged";
const ROWS_SKIPPED: &str = "RowsSkipped";
const PLANNED_REQUESTS: &str = "PlannedRequests";
const WRITTEN_ONCE_NOT_ZERO: [&str; 5] = [
    MESSAGES_WRITTEN,
    REFUSED_REQUESTS,
    ROWS_CHANGED,
    ROWS_SKIPPED,
    PLANNED_REQUESTS,
];

const COUNTER_FIELDS: [&str; 14] = [
    "Created",
    "Completed",
    "Failed",
    "RowsScanned",
    "RowsWritten",
    "StorageRequests",
    "Messages",
    "Dropped",
    "RowsMatched",
    MESSAGES_WRITTEN,
    REFUSED_REQUESTS,
    ROWS_CHANGED,
    ROWS_SKIPPED,
    PLANNED_REQUESTS,
];

impl Counters {
    fn values(&self) -> [i64; 14] {
        [
            self.created,
            self.completed,
            self.failed,
            self.rows_scanned,
            self.rows_written,
            self.storage_requests,
            self.messages,
            self.dropped,
            self.rows_matched,
            self.messages_written,
            self.refused_requests,
            self.rows_changed,
            self.rows_skipped,
            self.planned_requests,
        ]
    }

    fn from_values(v: [i64; 14]) -> Counters {
        Counters {
            created: v[0],
            completed: v[1],
            failed: v[2],
            rows_scanned: v[3],
            rows_written: v[4],
            storage_requests: v[5],
            messages: v[6],
            dropped: v[7],
            rows_matched: v[8],
            messages_written: v[9],
            refused_requests: v[10],
            rows_changed: v[11],
            rows_skipped: v[12],
            planned_requests: v[13],
        }
    }

    pub fn plus(&self, other: &Counters) -> Counters {
        let (a, b) = (self.values(), other.values());
        Counters::from_values(std::array::from_fn(|i| a[i] + b[i]))
    }

    /// Work items registered but not yet finished.
    pub fn pending(&self) -> i64 {
        self.created - self.completed
    }

    /// Reads a counter row; a field that is there but unreadable is an error, never a zero
    /// (a zero `Created` would end a scan early). A missing field is 0 (rows written before
    /// the field existed).
    pub(super) fn from_entity(entity: &Entity) -> Result<Counters, StorageError> {
        let mut values = [0i64; COUNTER_FIELDS.len()];
        for (value, field) in values.iter_mut().zip(COUNTER_FIELDS) {
            *value = int64(&entity.properties, field).ok_or_else(|| {
                StorageError::invalid_response(format!(
                    "counter row {} has an unreadable {field}",
                    entity.partition_key
                ))
            })?;
        }
        Ok(Counters::from_values(values))
    }

    pub(super) fn to_entity(self, partition_key: &str) -> Entity {
        let mut entity = Entity::new(partition_key, COUNTER_ROW);
        for (name, value) in COUNTER_FIELDS.iter().zip(self.values()) {
            if !WRITTEN_ONCE_NOT_ZERO.contains(name) || value != 0 {
                put_int64(&mut entity.properties, name, value);
            }
        }
        entity
    }
}

impl<T: TableStore> Tracker<'_, T> {
    /// Registers a new scan's root work item with its shard's counter. The other shards' counter
    /// rows are created by the first registration in each (see [`Tracker::counter_or_new`]): a
    /// missing counter row means no work was ever registered in that shard. The scan record is
    /// written separately by [`Tracker::insert_scan`] after the root message is queued, so a
    /// record never exists without its work.
    pub async fn create_scan_work(
        &self,
        scan_id: &str,
        shards: u32,
        root: &NewWork,
    ) -> Result<(), StorageError> {
        let shard = root.shard;
        debug_assert!(
            shard < shards.max(1),
            "the root's shard is one of the scan's"
        );
        let pk = shard_partition(scan_id, shard);
        let counters = Counters {
            created: 1,
            ..Counters::default()
        };
        let ops = [
            BatchOperation::Insert(work_row(&pk, root, self.now())),
            BatchOperation::Insert(counters.to_entity(&pk)),
        ];
        match self.store.submit_batch(self.work_table, &pk, &ops).await {
            // A retry of our own write whose answer was lost: the scan id is fresh, so the rows
            // (inserted together, atomically) are ours.
            Err(e) if e.kind == StorageErrorKind::Conflict => {
                self.read_counter(scan_id, shard).await.map(|_| ())
            }
            other => other,
        }
    }

    /// A shard's counter row, which must exist (the shard holds a registered work item).
    pub(super) async fn read_counter(
        &self,
        scan_id: &str,
        shard: u32,
    ) -> Result<(Counters, String), StorageError> {
        match self.counter_or_new(scan_id, shard).await? {
            (counters, Some(etag)) => Ok((counters, etag)),
            (_, None) => Err(StorageError::new(
                StorageErrorKind::NotFound,
                format!(
                    "counter row of {} is missing",
                    shard_partition(scan_id, shard)
                ),
            )),
        }
    }

    /// A shard's counters and the counter row's ETag, or zeros and `None` if no work was ever
    /// registered in the shard (its row is inserted, not replaced, by the first registration).
    pub(super) async fn counter_or_new(
        &self,
        scan_id: &str,
        shard: u32,
    ) -> Result<(Counters, Option<String>), StorageError> {
        let pk = shard_partition(scan_id, shard);
        match self
            .store
            .get_entity(self.work_table, &pk, COUNTER_ROW)
            .await?
        {
            Some((entity, etag)) => Ok((Counters::from_entity(&entity)?, Some(etag))),
            None => Ok((Counters::default(), None)),
        }
    }

    /// Every shard's counters (zeros where none was registered yet), collected by one query over
    /// the scan's shard partitions (`RowKey eq 'counter'`), following its continuations; if the
    /// service keeps cutting it short, by point reads instead. Each shard is read once, so two
    /// collects one after the other that agree are a consistent snapshot of the monotonic counters.
    pub async fn shard_counters(
        &self,
        scan_id: &str,
        shards: u32,
    ) -> Result<Vec<Counters>, StorageError> {
        let partitions: Vec<String> = (0..shards).map(|s| shard_partition(scan_id, s)).collect();
        let (Some(first), Some(last)) = (partitions.first(), partitions.last()) else {
            return Ok(Vec::new());
        };
        let mut query = Query {
            filter: Some(Filter::and(vec![
                Filter::pk(CompareOp::Ge, first.clone()),
                Filter::pk(CompareOp::Le, last.clone()),
                Filter::rk(CompareOp::Eq, COUNTER_ROW),
            ])),
            top: None,
            select: None,
            continuation: None,
        };
        let mut counters = vec![Counters::default(); shards as usize];
        // Bounded: the counter rows are at most `shards` rows; a page or two more than that means
        // the service is cutting the query at partition boundaries.
        for _ in 0..shards as usize + 2 {
            let page = self.store.query_page(self.work_table, &query).await?;
            for entity in &page.entities {
                if let Some(s) = partitions.iter().position(|p| *p == entity.partition_key) {
                    counters[s] = Counters::from_entity(entity)?;
                }
            }
            match page.continuation {
                None => return Ok(counters),
                Some(c) => query.continuation = Some(c),
            }
        }
        try_join_all(
            (0..shards)
                .map(|s| async move { self.counter_or_new(scan_id, s).await.map(|(c, _)| c) }),
        )
        .await
    }

    /// Sum of all shards' counters (not a snapshot; fine for display).
    pub async fn totals(&self, scan_id: &str, shards: u32) -> Result<Counters, StorageError> {
        Ok(self
            .shard_counters(scan_id, shards)
            .await?
            .iter()
            .fold(Counters::default(), |a, c| a.plus(c)))
    }

    /// Marks the scan completed if its work is drained. `shard` (the one whose item just
    /// finished) is checked first, which is cheap and usually says no. Returns whether this
    /// call completed the scan.
    pub async fn complete_if_drained(
        &self,
        scan_id: &str,
        shards: u32,
        shard: Option<u32>,
    ) -> Result<bool, StorageError> {
        let between = || async { Ok(Some(())) };
        match self.drained_around(scan_id, shards, shard, between).await? {
            Some((totals, ())) => self.finish_drained(scan_id, &totals).await,
            None => Ok(false),
        }
    }

    /// Ends a running scan whose work has all finished: `completed`, or `failed` if any work
    /// item failed (a scan with a failed item is never `completed`, whichever of the failing
    /// delivery and a drained check gets there first). Returns whether this call ended it.
    pub async fn finish_if_drained(
        &self,
        scan_id: &str,
        shards: u32,
    ) -> Result<bool, StorageError> {
        let Some(totals) = self.drained(scan_id, shards).await? else {
            return Ok(false);
        };
        self.finish_drained(scan_id, &totals).await
    }

    /// Ends a running scan judged drained with `totals` (a snapshot [`Tracker::drained`] or
    /// [`Tracker::drained_around`] took): `failed` if any work item failed, else `completed`.
    /// Returns whether this call ended it.
    pub async fn finish_drained(
        &self,
        scan_id: &str,
        totals: &Counters,
    ) -> Result<bool, StorageError> {
        if totals.failed > 0 {
            let reason = format!(
                "{} work item(s) failed; see the failed work rows of scan {scan_id}",
                totals.failed
            );
            return self
                .finish_scan(scan_id, ScanState::Failed, Some(&reason))
                .await;
        }
        self.finish_scan(scan_id, ScanState::Completed, None).await
    }

    /// Whether every registered work item has finished, judged on a consistent snapshot: two
    /// collections of the (monotonic) counters that agree exactly.
    pub async fn is_drained(&self, scan_id: &str, shards: u32) -> Result<bool, StorageError> {
        Ok(self.drained(scan_id, shards).await?.is_some())
    }

    /// The scan's totals if every registered work item has finished (see [`Tracker::is_drained`]).
    pub async fn drained(
        &self,
        scan_id: &str,
        shards: u32,
    ) -> Result<Option<Counters>, StorageError> {
        let between = || async { Ok(Some(())) };
        let judged = self.drained_around(scan_id, shards, None, between).await?;
        Ok(judged.map(|(totals, ())| totals))
    }

    /// The scan's totals if every registered work item has finished, with what `between` read
    /// while the scan was drained. `shard` (the one whose item just finished), then the shard
    /// this thread last found busy, are point-read first: any busy shard settles the answer
    /// (per shard, Created ≥ Completed always: a child is counted in its own shard before it
    /// can finish there). Otherwise every shard is collected (one query each, see
    /// `shard_counters`); if none is busy `between` runs (`None` from it: no judgement, e.g.
    /// it found work running), then every shard is collected again. Two collects that agree
    /// exactly are a consistent snapshot of the monotonic counters: each shard's counters held
    /// their values from its first read to its second, so throughout the time `between` ran.
    /// What `between` saw is therefore seen together with a drained scan, e.g. an item it found
    /// finished had registered all its children before, and they are counted, and finished.
    pub async fn drained_around<R, F>(
        &self,
        scan_id: &str,
        shards: u32,
        shard: Option<u32>,
        between: impl FnOnce() -> F,
    ) -> Result<Option<(Counters, R)>, StorageError>
    where
        F: std::future::Future<Output = Result<Option<R>, StorageError>>,
    {
        let hint = BUSY_HINT.with(|h| h.borrow().get(scan_id).copied());
        let first_reads = [shard, hint.filter(|&s| Some(s) != shard)];
        for s in first_reads.into_iter().flatten().filter(|&s| s < shards) {
            if self.counter_or_new(scan_id, s).await?.0.pending() != 0 {
                return Ok(None);
            }
        }
        let first = self.shard_counters(scan_id, shards).await?;
        if let Some(busy) = first.iter().position(|c| c.pending() != 0) {
            remember_busy(scan_id, busy as u32);
            return Ok(None);
        }
        let Some(seen) = between().await? else {
            return Ok(None);
        };
        let second = self.shard_counters(scan_id, shards).await?;
        let totals = second.iter().fold(Counters::default(), |a, c| a.plus(c));
        Ok((first == second).then_some((totals, seen)))
    }

    /// Claims the start of phase `phase` of a scan judged drained, so that of the drained
    /// checks that judged it at once only one queues the phase's root: the claim row
    /// `phase-<n>` in the root's shard partition (`ClaimedAt`, `ClaimedBy`: this attempt's
    /// token), inserted (`If-None-Match`). `false`: another check claimed it less than
    /// [`PHASE_CLAIM_TAKEOVER`] ago (it is starting the phase). An older claim is taken over
    /// with `If-Match` on its ETag (its claimer died or failed before registering the root,
    /// which the caller found missing). A 409 or 412 on our own write is read back: the
    /// adapter retries a write whose answer was lost, and the retry then finds our own claim,
    /// which the token tells apart (else the phase would never start: the claimer would think
    /// another check was starting it, and its delivery would succeed).
    /// A claim is never a registration: a crash after it leaves the scan drained and the phase
    /// unstarted, and a later drained check starts it.
    pub async fn claim_phase_start(
        &self,
        scan_id: &str,
        shard: u32,
        phase: u32,
    ) -> Result<bool, StorageError> {
        let pk = shard_partition(scan_id, shard);
        let row = format!("phase-{phase}");
        let now = self.now();
        let token = claim_token();
        let mut claim = Entity::new(&pk, &row);
        put_time(&mut claim.properties, CLAIMED_AT, now);
        put_str(&mut claim.properties, CLAIMED_BY, &token);
        let insert = [BatchOperation::Insert(claim.clone())];
        match self.store.submit_batch(self.work_table, &pk, &insert).await {
            Ok(()) => return Ok(true),
            Err(e) if e.kind == StorageErrorKind::Conflict => {}
            Err(e) => return Err(e),
        }
        let ours = |held: &Entity| {
            get_str(&held.properties, CLAIMED_BY).as_deref() == Some(token.as_str())
        };
        let Some((held, etag)) = self.store.get_entity(self.work_table, &pk, &row).await? else {
            return Ok(false);
        };
        if ours(&held) {
            return Ok(true);
        }
        let claimed = get_time(&held.properties, CLAIMED_AT);
        if claimed.is_some_and(|at| at + PHASE_CLAIM_TAKEOVER > now) {
            return Ok(false);
        }
        let replace = [BatchOperation::Replace {
            entity: claim,
            etag: Some(etag),
        }];
        match self
            .store
            .submit_batch(self.work_table, &pk, &replace)
            .await
        {
            Ok(()) => Ok(true),
            Err(e) if e.kind == StorageErrorKind::PreconditionFailed => {
                let held = self.store.get_entity(self.work_table, &pk, &row).await?;
                Ok(held.is_some_and(|(held, _)| ours(&held)))
            }
            Err(e) => Err(e),
        }
    }
}

/// Most scans whose last busy shard a thread remembers (the map is cleared when full).
const BUSY_HINTS: usize = 64;

thread_local! {
    /// Per scan, the shard this thread's last drained check found busy: where the next check
    /// starts. Per thread, so the single-threaded simulator stays deterministic.
    static BUSY_HINT: std::cell::RefCell<std::collections::HashMap<String, u32>> =
        Default::default();
}

pub(super) fn remember_busy(scan_id: &str, shard: u32) {
    BUSY_HINT.with(|h| {
        let mut h = h.borrow_mut();
        if h.len() >= BUSY_HINTS && !h.contains_key(scan_id) {
            h.clear();
        }
        h.insert(scan_id.to_string(), shard);
    });
}

#[cfg(all(test, feature = "lab"))]
mod tests {
    use super::*;
    use crate::clock::Clock;
    use crate::lab::memory::MemoryTableStore;

    const SCAN: &str = "8204246420161-ca332e2c";

    async fn store() -> MemoryTableStore {
        let store = MemoryTableStore::default();
        store.create_table("Work").await.unwrap();
        store
    }

    /// Of the checks that claim a phase at once, one wins; a claim is taken over once it is
    /// [`PHASE_CLAIM_TAKEOVER`] old, by one check, and only one (times on a manual clock).
    #[tokio::test]
    async fn a_phase_is_claimed_once_and_a_stale_claim_taken_over_once() {
        let store = store().await;
        let clock =
            Clock::manual(time::OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap());
        let tracker = Tracker::new(&store, "Scans", "Work").with_clock(&clock);
        assert!(tracker.claim_phase_start(SCAN, 3, 1).await.unwrap());
        assert!(!tracker.claim_phase_start(SCAN, 3, 1).await.unwrap());
        assert!(tracker.claim_phase_start(SCAN, 3, 2).await.unwrap());

        let just_before = PHASE_CLAIM_TAKEOVER - time::Duration::milliseconds(1);
        clock.advance(just_before.try_into().unwrap());
        assert!(
            !tracker.claim_phase_start(SCAN, 3, 1).await.unwrap(),
            "not yet stale"
        );
        clock.advance(std::time::Duration::from_millis(1));
        assert!(
            tracker.claim_phase_start(SCAN, 3, 1).await.unwrap(),
            "stale: taken over"
        );
        assert!(
            !tracker.claim_phase_start(SCAN, 3, 1).await.unwrap(),
            "once"
        );
        let pk = shard_partition(SCAN, 3);
        let (row, _) = store
            .get_entity("Work", &pk, "phase-1")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(get_time(&row.properties, CLAIMED_AT), Some(clock.now()));
    }

    /// What runs between the two collects is judged with the scan drained only if no counter
    /// changed meanwhile: work registered while it ran (a phase another check started) makes
    /// the collects differ, and there is no judgement.
    #[tokio::test]
    async fn work_registered_between_the_collects_leaves_no_judgement() {
        let store = store().await;
        let tracker = Tracker::new(&store, "Scans", "Work");
        let root = NewWork {
            id: "s-root".into(),
            kind: "step",
            shard: 0,
        };
        tracker.create_scan_work(SCAN, 2, &root).await.unwrap();
        let pk = shard_partition(SCAN, 0);
        let (mut counters, _) = tracker.read_counter(SCAN, 0).await.unwrap();
        counters.completed = 1;
        let op = BatchOperation::Upsert(counters.to_entity(&pk));
        store.submit_batch("Work", &pk, &[op]).await.unwrap();

        let quiet = || async { Ok(Some("seen")) };
        let judged = tracker.drained_around(SCAN, 2, Some(0), quiet).await;
        let (totals, seen) = judged.unwrap().expect("drained");
        assert_eq!((totals.created, totals.completed, seen), (1, 1, "seen"));

        let busy = || async { Ok(None::<()>) };
        let judged = tracker.drained_around(SCAN, 2, None, busy).await.unwrap();
        assert!(judged.is_none(), "no judgement when `between` gives none");

        let phase = NewWork {
            id: "t-phase".into(),
            kind: "item",
            shard: 1,
        };
        let starts = || async {
            tracker.register_children(SCAN, &[&phase]).await?;
            Ok(Some(()))
        };
        let judged = tracker.drained_around(SCAN, 2, None, starts).await.unwrap();
        assert!(judged.is_none(), "work registered in between is seen");
        assert!(tracker.drained(SCAN, 2).await.unwrap().is_none());
    }
}
