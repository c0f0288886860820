//! Sharded counters: per scan, `shards` partitions `{scanId}-{shard:02}` of the work table, each
//! with one `counter` row; the sums say how much work is registered, finished, failed, dropped.

use futures::future::try_join_all;

use super::codec::{int64, put_int64};
use super::records::ScanState;
use super::work_rows::work_row;
use super::{shard_partition, NewWork, Tracker, JITTER};
use crate::app::messages::shard_of;
use crate::storage::{BatchOperation, Entity, StorageError, StorageErrorKind, TableStore};

const COUNTER_ROW: &str = "counter";

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
}

const COUNTER_FIELDS: [&str; 9] = [
    "Created",
    "Completed",
    "Failed",
    "RowsScanned",
    "RowsWritten",
    "StorageRequests",
    "Messages",
    "Dropped",
    "RowsMatched",
];

impl Counters {
    fn values(&self) -> [i64; 9] {
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
        ]
    }

    fn from_values(v: [i64; 9]) -> Counters {
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
            put_int64(&mut entity.properties, name, value);
        }
        entity
    }
}

impl<T: TableStore> Tracker<'_, T> {
    /// Registers a new scan's counters and root work item. The scan record is written separately
    /// by [`Tracker::insert_scan`] after the root message is queued, so a record never exists
    /// without its work.
    pub async fn create_scan_work(
        &self,
        scan_id: &str,
        shards: u32,
        root: &NewWork,
    ) -> Result<(), StorageError> {
        let root_shard = shard_of(&root.id, shards);
        try_join_all((0..shards).map(|shard| async move {
            let pk = shard_partition(scan_id, shard);
            let mut ops = Vec::new();
            let mut counters = Counters::default();
            if shard == root_shard {
                ops.push(BatchOperation::Insert(work_row(&pk, root)));
                counters.created = 1;
            }
            ops.push(BatchOperation::Insert(counters.to_entity(&pk)));
            match self.store.submit_batch(self.work_table, &pk, &ops).await {
                // A retry of our own write whose answer was lost: the scan id is fresh, so the
                // rows (inserted together, atomically) are ours.
                Err(e) if e.kind == StorageErrorKind::Conflict => {
                    self.read_counter(scan_id, shard).await.map(|_| ())
                }
                other => other,
            }
        }))
        .await?;
        Ok(())
    }

    pub(super) async fn read_counter(
        &self,
        scan_id: &str,
        shard: u32,
    ) -> Result<(Counters, String), StorageError> {
        let pk = shard_partition(scan_id, shard);
        match self
            .store
            .get_entity(self.work_table, &pk, COUNTER_ROW)
            .await?
        {
            Some((entity, etag)) => Ok((Counters::from_entity(&entity)?, etag)),
            None => Err(StorageError::new(
                StorageErrorKind::NotFound,
                format!("counter row of {pk} is missing"),
            )),
        }
    }

    /// Every shard's counters, read concurrently.
    pub async fn shard_counters(
        &self,
        scan_id: &str,
        shards: u32,
    ) -> Result<Vec<Counters>, StorageError> {
        try_join_all(
            (0..shards).map(|s| async move { self.read_counter(scan_id, s).await.map(|(c, _)| c) }),
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
        if let Some(shard) = shard {
            if self.read_counter(scan_id, shard).await?.0.pending() != 0 {
                return Ok(false);
            }
        }
        self.finish_if_drained(scan_id, shards).await
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
    async fn drained(&self, scan_id: &str, shards: u32) -> Result<Option<Counters>, StorageError> {
        // Per shard, Created ≥ Completed always (a child is counted in its own shard before it
        // can finish there), so any busy shard settles the answer: read one shard at a time and
        // stop at the first busy one, starting with the shard this thread last found busy in
        // this scan (busy shards stay busy for a while: most checks end after one read), then
        // from a random one. The order of the reads does not matter for the answer.
        let start = JITTER.with(|j| {
            use rand::Rng;
            j.borrow_mut().gen_range(0..shards.max(1))
        });
        let hint = BUSY_HINT.with(|h| h.borrow().get(scan_id).copied());
        let mut order: Vec<u32> = hint.into_iter().filter(|&s| s < shards).collect();
        order.extend(
            (0..shards)
                .map(|i| (start + i) % shards)
                .filter(|&s| Some(s) != hint),
        );
        let mut first = vec![Counters::default(); shards as usize];
        for s in order {
            let (c, _) = self.read_counter(scan_id, s).await?;
            if c.pending() != 0 {
                remember_busy(scan_id, s);
                return Ok(None);
            }
            first[s as usize] = c;
        }
        let second = self.shard_counters(scan_id, shards).await?;
        Ok((first == second).then(|| second.iter().fold(Counters::default(), |a, c| a.plus(c))))
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
