//! Work items' rows: in their shard's partition of the work table, `pending` → `expanded`
//! (outcome recorded) → `done`/`failed`/`dropped`, every change guarded by the row's ETag.

use futures::future::try_join_all;
use serde_json::json;

use super::codec::{get_str, put_str, utf16_chunks, work_row};
use super::counters::Counters;
use super::{again, contention, shard_partition, NewWork, Tracker};
use crate::retry::Verdict;
use crate::storage::entity::MAX_CUSTOM_PROPERTIES;
use crate::storage::{
    BatchOperation, Entity, StorageError, StorageErrorKind, TableStore, MAX_BATCH_OPERATIONS,
};

/// Recorded outcomes are split over string properties of at most this many UTF-16 units (the
/// service allows 64 KiB of UTF-16, 32,768 units, per string); the row as a whole must still
/// fit the 1 MiB entity limit, which is checked before it is sent.
const OUTCOME_CHUNK_UNITS: usize = 32_000;

/// State of one work item's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkState {
    /// Not yet executed (or executed without recording an outcome).
    Pending {
        etag: String,
    },
    /// Executed; its outcome (JSON) is recorded and must be used by whoever finishes it.
    Expanded {
        etag: String,
        outcome: String,
    },
    Finished,
}

/// Why an outcome could not be recorded.
#[derive(Debug)]
pub enum RecordError {
    /// Another execution recorded or finished first: here is the row now.
    Lost(Option<WorkState>),
    Storage(StorageError),
}

impl From<StorageError> for RecordError {
    fn from(e: StorageError) -> Self {
        RecordError::Storage(e)
    }
}

/// Result of trying to complete a work item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// Committed; `shard_idle` says the shard had no unfinished items left afterwards.
    Committed { shard_idle: bool },
    /// Already completed: by another delivery, or by our own earlier attempt whose answer was
    /// lost. Nobody may have checked for the end of the scan yet, so the caller still must.
    Duplicate,
}

impl<T: TableStore> Tracker<'_, T> {
    /// Reads a work item's row (in shard `shard`).
    pub async fn work_state(
        &self,
        scan_id: &str,
        shard: u32,
        work_id: &str,
    ) -> Result<Option<WorkState>, StorageError> {
        Ok(self
            .work_state_marked(scan_id, shard, work_id)
            .await?
            .map(|(state, _)| state))
    }

    /// Reads a work item's row, and whether a last delivery marked it
    /// ([`Tracker::mark_last_delivery`]).
    pub async fn work_state_marked(
        &self,
        scan_id: &str,
        shard: u32,
        work_id: &str,
    ) -> Result<Option<(WorkState, bool)>, StorageError> {
        Ok(self
            .work_state_rounds(scan_id, shard, work_id)
            .await?
            .map(|(state, marks)| (state, marks.marked)))
    }

    /// Reads a work item's row and its marks: whether a last delivery marked it, and its
    /// re-queue rounds ([`Tracker::start_round`]).
    pub async fn work_state_rounds(
        &self,
        scan_id: &str,
        shard: u32,
        work_id: &str,
    ) -> Result<Option<(WorkState, RowMarks)>, StorageError> {
        let pk = shard_partition(scan_id, shard);
        Ok(self
            .store
            .get_entity(self.work_table, &pk, work_id)
            .await?
            .map(|(entity, etag)| {
                let props = &entity.properties;
                let marked = props.get_value(LAST_DELIVERY_PROPERTY) == Some(json!(true));
                let marks = RowMarks {
                    marked,
                    rounds: props
                        .get_value(REQUEUES_PROPERTY)
                        .and_then(|v| v.as_u64())
                        .map_or(0, |n| n.min(u64::from(u32::MAX)) as u32),
                    requeued_by: get_str(props, REQUEUED_BY_PROPERTY),
                    result: get_str(props, RESULT_PROPERTY),
                };
                let state = match get_str(props, "State").as_deref() {
                    Some("pending") => WorkState::Pending { etag },
                    Some("expanded") => {
                        // An empty chunk ends it (`rewrite_outcome`).
                        let outcome: String = (0..MAX_CUSTOM_PROPERTIES)
                            .map_while(|i| {
                                get_str(props, &format!("Outcome{i}")).filter(|c| !c.is_empty())
                            })
                            .collect();
                        WorkState::Expanded { etag, outcome }
                    }
                    _ => WorkState::Finished,
                };
                (state, marks)
            }))
    }

    /// Marks an unfinished row (at `etag`) as being run by its item's last delivery
    /// ([`LAST_DELIVERY_PROPERTY`]), merged so that a recorded outcome stays. Returns the row's
    /// new ETag, or `None` if the row changed (or went) since it was read: read it again.
    /// Idempotent: marking a marked row changes nothing but its ETag.
    pub async fn mark_last_delivery(
        &self,
        scan_id: &str,
        shard: u32,
        work_id: &str,
        etag: &str,
    ) -> Result<Option<String>, StorageError> {
        let mut row = Entity::new(shard_partition(scan_id, shard), work_id);
        row.properties.insert(LAST_DELIVERY_PROPERTY, json!(true));
        self.merge_at(row, etag).await
    }

    /// Starts re-queue round `round` of an unfinished row (at `etag`): clears a last delivery's
    /// mark (`LastDelivery` false) and records the round ([`REQUEUES_PROPERTY`]) and the poison
    /// message that started it (`by`, [`REQUEUED_BY_PROPERTY`]) in one merge under the ETag, so
    /// that of concurrent poison deliveries only one starts it. Returns the row's new ETag, or
    /// `None` if the row changed (or went) since it was read.
    pub async fn start_round(
        &self,
        scan_id: &str,
        shard: u32,
        work_id: &str,
        etag: &str,
        (round, by): (u32, &str),
    ) -> Result<Option<String>, StorageError> {
        let mut row = Entity::new(shard_partition(scan_id, shard), work_id);
        row.properties.insert(LAST_DELIVERY_PROPERTY, json!(false));
        row.properties.insert(REQUEUES_PROPERTY, json!(round));
        put_str(&mut row.properties, REQUEUED_BY_PROPERTY, by);
        self.merge_at(row, etag).await
    }

    /// Merges `row` under `etag`: its new ETag, or `None` if it changed or went.
    async fn merge_at(&self, row: Entity, etag: &str) -> Result<Option<String>, StorageError> {
        let pk = row.partition_key.clone();
        let ops = [BatchOperation::Merge {
            entity: row,
            etag: Some(etag.to_string()),
        }];
        match self
            .store
            .submit_batch_with_etags(self.work_table, &pk, &ops)
            .await
        {
            Ok(etags) => match etags.into_iter().next().flatten() {
                Some(etag) => Ok(Some(etag)),
                // The store did not report it: the caller reads the row again.
                None => Ok(None),
            },
            Err(e)
                if matches!(
                    e.kind,
                    StorageErrorKind::PreconditionFailed | StorageErrorKind::NotFound
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Records an item's outcome (`pending` → `expanded`) if no other execution did first, and
    /// registers `children` (rows of the item's own shard, at most [`MAX_FOLDED_CHILDREN`]) in
    /// the same transaction, with their `Created` count on the shard's counter. Returns the row's
    /// new ETag and, when children were registered, the counter as written (for the completion).
    pub async fn record_outcome(
        &self,
        scan_id: &str,
        shard: u32,
        work_id: &str,
        pending_etag: &str,
        outcome: &str,
        children: &[&NewWork],
    ) -> Result<Recorded, RecordError> {
        let pk = shard_partition(scan_id, shard);
        let row = expanded_row(&pk, work_id, outcome, false)?;
        let what = format!("counter of {pk}");
        let mut schedule = contention();
        loop {
            let mut ops = vec![BatchOperation::Merge {
                entity: row.clone(),
                etag: Some(pending_etag.to_string()),
            }];
            let counter = match children.len() {
                0 => None,
                n => {
                    let (counters, etag) = self.counter_or_new(scan_id, shard).await?;
                    let updated = Counters {
                        created: counters.created + n as i64,
                        ..counters
                    };
                    ops.extend(
                        children
                            .iter()
                            .map(|w| BatchOperation::Insert(work_row(&pk, w, self.now()))),
                    );
                    ops.push(counter_write(&pk, updated, etag));
                    Some(updated)
                }
            };
            match self
                .store
                .submit_batch_with_etags(self.work_table, &pk, &ops)
                .await
            {
                Ok(etags) => {
                    let counter = counter.zip(etags.last().cloned().flatten());
                    return match etags.into_iter().next().flatten() {
                        Some(etag) => Ok(Recorded { etag, counter }),
                        // The store did not report it: read it back.
                        None => match self.work_state(scan_id, shard, work_id).await? {
                            Some(WorkState::Expanded { etag, .. }) => Ok(Recorded {
                                etag,
                                counter: None,
                            }),
                            other => Err(RecordError::Lost(other)),
                        },
                    };
                }
                Err(e)
                    if matches!(
                        e.kind,
                        StorageErrorKind::PreconditionFailed | StorageErrorKind::NotFound
                    ) && e.failed_operation.unwrap_or(0) == 0 =>
                {
                    match self.work_state(scan_id, shard, work_id).await? {
                        // Our row is as we read it: the counter was what changed (the service
                        // did not say which operation failed).
                        Some(WorkState::Pending { etag })
                            if etag == pending_etag && !children.is_empty() =>
                        {
                            again(&mut schedule, Verdict::Retry, &what).await?
                        }
                        other => return Err(RecordError::Lost(other)),
                    }
                }
                // The counter row changed (or was created) since it was read.
                Err(e)
                    if matches!(
                        e.kind,
                        StorageErrorKind::PreconditionFailed | StorageErrorKind::Conflict
                    ) && e.failed_operation == Some(ops.len() - 1) =>
                {
                    again(&mut schedule, Verdict::Retry, &what).await?
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Records `outcome` on an unfinished row at `etag` (a step handing rows on to items,
    /// `job::Worked`; again on an expanded row, or first on a pending one), in one merge:
    /// `State` expanded, the outcome's chunks, and an empty chunk after them, where reading
    /// stops, since the row may hold a longer outcome's chunks. Returns the row's new ETag, or
    /// `None` if the row changed (or went) since it was read.
    pub async fn rewrite_outcome(
        &self,
        scan_id: &str,
        shard: u32,
        work_id: &str,
        etag: &str,
        outcome: &str,
    ) -> Result<Option<String>, StorageError> {
        let row = expanded_row(&shard_partition(scan_id, shard), work_id, outcome, true)?;
        if let Some(etag) = self.merge_at(row, etag).await? {
            return Ok(Some(etag));
        }
        // Changed, or written without the store reporting the new ETag: read it back.
        Ok(match self.work_state(scan_id, shard, work_id).await? {
            Some(WorkState::Expanded { etag, outcome: now }) if now == outcome => Some(etag),
            _ => None,
        })
    }

    /// Registers children: inserts each missing row together with its shard's `Created` count.
    /// Rows that already exist (from an earlier attempt of the same parent) are left alone.
    pub async fn register_children(
        &self,
        scan_id: &str,
        children: &[&NewWork],
    ) -> Result<(), StorageError> {
        let mut by_shard: std::collections::BTreeMap<u32, Vec<&NewWork>> = Default::default();
        for child in children {
            by_shard.entry(child.shard).or_default().push(child);
        }
        let groups: Vec<(u32, Vec<&NewWork>)> = by_shard
            .into_iter()
            .flat_map(|(shard, items)| {
                items
                    // Each transaction also updates the shard's counter row.
                    .chunks(MAX_BATCH_OPERATIONS - 1)
                    .map(|c| (shard, c.to_vec()))
                    .collect::<Vec<_>>()
            })
            .collect();
        let busy = groups.first().map(|(shard, _)| *shard);
        try_join_all(
            groups
                .into_iter()
                .map(|(shard, items)| self.register_group(scan_id, shard, items)),
        )
        .await?;
        // A shard that just got unfinished work: where this thread's next drained check starts.
        if let Some(shard) = busy {
            super::counters::remember_busy(scan_id, shard);
        }
        Ok(())
    }

    async fn register_group(
        &self,
        scan_id: &str,
        shard: u32,
        mut items: Vec<&NewWork>,
    ) -> Result<(), StorageError> {
        let pk = shard_partition(scan_id, shard);
        let what = format!("counter of {pk}");
        let mut schedule = contention();
        loop {
            if items.is_empty() {
                return Ok(());
            }
            let (counters, etag) = self.counter_or_new(scan_id, shard).await?;
            let mut ops: Vec<BatchOperation> = items
                .iter()
                .map(|w| BatchOperation::Insert(work_row(&pk, w, self.now())))
                .collect();
            let updated = Counters {
                created: counters.created + items.len() as i64,
                ..counters
            };
            ops.push(counter_write(&pk, updated, etag));
            match self.store.submit_batch(self.work_table, &pk, &ops).await {
                Ok(()) => return Ok(()),
                Err(e) if e.kind == StorageErrorKind::PreconditionFailed => {
                    again(&mut schedule, Verdict::Retry, &what).await?
                }
                // Another registration created the counter row first: read it again.
                Err(e)
                    if e.kind == StorageErrorKind::Conflict
                        && e.failed_operation == Some(items.len()) =>
                {
                    again(&mut schedule, Verdict::Retry, &what).await?
                }
                // Rows already there: registered by another execution, by an adopted outcome's
                // first execution, or by this transaction's earlier attempt whose answer was lost
                // (then all of them). Look the rest up at once rather than failing one
                // transaction per existing row (a group holds up to 99, more than the attempts).
                Err(e) if e.kind == StorageErrorKind::Conflict => {
                    again(&mut schedule, Verdict::RetryNow, &what).await?;
                    if let Some(i) = e.failed_operation.filter(|&i| i < items.len()) {
                        items.remove(i);
                    }
                    items = self.missing_rows(&pk, items).await?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Of `items`, those with no row in partition `pk` yet (point reads, a few at a time).
    async fn missing_rows<'w>(
        &self,
        pk: &str,
        items: Vec<&'w NewWork>,
    ) -> Result<Vec<&'w NewWork>, StorageError> {
        let mut missing = Vec::new();
        for chunk in items.chunks(MISSING_ROW_READS) {
            let reads = chunk
                .iter()
                .map(|w| self.store.get_entity(self.work_table, pk, &w.id));
            let rows = try_join_all(reads).await?;
            let absent = chunk.iter().zip(rows).filter(|(_, row)| row.is_none());
            missing.extend(absent.map(|(w, _)| *w));
        }
        Ok(missing)
    }
}

/// Point reads [`Tracker::missing_rows`] keeps in flight.
const MISSING_ROW_READS: usize = 8;

/// The property of a finished row holding its driver's result ([`Tracker::complete`]).
pub const RESULT_PROPERTY: &str = "Result";

/// The Boolean property a work item's last delivery sets on its unfinished row before it runs
/// ([`Tracker::mark_last_delivery`]): the poison functions fail only an item so marked, since
/// only a delivery with the queue's own dequeue count can prove the item exhausted its
/// deliveries (a message in a poison queue proves nothing: anyone who can write queues can put
/// one there). Finishing the row replaces it, mark included.
pub const LAST_DELIVERY_PROPERTY: &str = "LastDelivery";

/// The `Edm.Int32` property counting the times the poison functions re-queued an unfinished
/// item whose last delivery began and recorded no outcome ([`Tracker::start_round`]). Absent:
/// never re-queued. Finishing the row replaces it too.
pub const REQUEUES_PROPERTY: &str = "Requeues";

/// The string property naming the queue message id of the poison message that started the
/// row's latest re-queue round ([`Tracker::start_round`]): a redelivery of that same message
/// knows the round is its own.
pub const REQUEUED_BY_PROPERTY: &str = "RequeuedBy";

/// A work row's marks ([`Tracker::work_state_rounds`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RowMarks {
    /// A last delivery marked the row (`LastDelivery`) since its latest round started.
    pub marked: bool,
    /// Re-queue rounds started (`Requeues`; 0 when never).
    pub rounds: u32,
    /// The poison message that started the latest round (`RequeuedBy`).
    pub requeued_by: Option<String>,
    /// The driver's result on a finished row (`Result`).
    pub result: Option<String>,
}

/// What [`Tracker::record_outcome`] wrote: the row's new ETag, and the shard's counter with its
/// ETag when children were registered with it.
#[derive(Debug)]
pub struct Recorded {
    pub etag: String,
    pub counter: Option<(Counters, String)>,
}

/// Most children registered in the transaction that records their parent's outcome (with the
/// parent's row and the counter row, a transaction holds at most 100 operations).
pub const MAX_FOLDED_CHILDREN: usize = MAX_BATCH_OPERATIONS - 2;

/// Writes a shard's counter: replaces the row read at `etag`, or inserts it (the shard's first
/// registration).
fn counter_write(pk: &str, counters: Counters, etag: Option<String>) -> BatchOperation {
    match etag {
        Some(etag) => BatchOperation::Replace {
            entity: counters.to_entity(pk),
            etag: Some(etag),
        },
        None => BatchOperation::Insert(counters.to_entity(pk)),
    }
}

/// The merge that records `outcome` on a work row: `State` expanded and the outcome in
/// `Outcome0`, `Outcome1`, … chunks, then, when `ended`, an empty chunk where reading stops
/// (`Tracker::rewrite_outcome`). Checked against the entity limits before it is sent.
fn expanded_row(
    pk: &str,
    work_id: &str,
    outcome: &str,
    ended: bool,
) -> Result<Entity, StorageError> {
    let mut row = Entity::new(pk, work_id);
    row.properties.insert("State", json!("expanded"));
    let mut chunks = 0;
    for (i, chunk) in utf16_chunks(outcome, OUTCOME_CHUNK_UNITS).enumerate() {
        row.properties.insert(format!("Outcome{i}"), json!(chunk));
        chunks = i + 1;
    }
    if ended {
        row.properties.insert(format!("Outcome{chunks}"), json!(""));
    }
    row.check_limits().map_err(|e| {
        StorageError::invalid_input(format!(
            "the outcome of {work_id} cannot be recorded: {}",
            e.message
        ))
    })?;
    Ok(row)
}
