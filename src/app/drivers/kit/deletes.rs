//! Deleting rows a scan read (the delete and expire drivers): same-partition entity group
//! transactions of deletes, each row deleted with the ETag it was read with.
//!
//! Invariants:
//! - **A row is deleted only as it was read.** Every delete carries the row's ETag from the
//!   read that returned it (`If-Match`; `*` only for a row whose store reported none). A row
//!   changed since (an update, a merge, a replace) fails its delete with `412`: it is kept and
//!   counted in `rowsChanged`, never an error.
//! - **A transaction fails whole** when one of its deletes finds no row (404: an earlier or
//!   concurrent delivery deleted it) or a changed one (412). Both are resolved the same way:
//!   the batch's rows are read again (one keys-only query over its row-key span) and only the
//!   rows still there with the ETag they were read with are deleted; the others are gone (not
//!   counted) or changed (counted). At most [`MAX_DELETE_ROUNDS`] transactions per batch, then
//!   the message is retried. So a batch costs one transaction, plus one query and one
//!   transaction per round some of its rows changed or vanished in.
//! - **A dry run writes nothing**: it counts the transactions the real run would send
//!   (`plannedRequests`) and the rows it would delete, and names a sample of them.
//! - Once the scan has ended (a cancel), no batch starts (`kit::scan_ended`).

use std::collections::HashMap;

use futures::stream::{self, StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};

use crate::app::error::ApiError;
use crate::app::job::{Begun, ScanRequest, WorkError, WorkOutcome, MAX_ITEM_QUERIES};
use crate::app::messages::ItemMessage;
use crate::app::state::AppState;
use crate::app::tracking::Counters;
use crate::storage::stores::Stores;
use crate::storage::{
    BatchOperation, CompareOp, Entity, Filter, Query, StorageError, StorageErrorKind, TableStore,
    MAX_TAKE,
};

use super::range::batches_of;
use super::scan_ended;

/// Transactions tried per batch before the item gives up for this delivery (each after the
/// first re-reads which of the batch's rows are still there, unchanged).
pub const MAX_DELETE_ROUNDS: usize = 3;
/// Most keys a dry run names (`sampleKeys` in its status).
pub const SAMPLE_KEYS: usize = 20;

/// What a deleting driver records for its deletes (in the context's `o`): only a dry run
/// records anything, so a delete's recorded context is unchanged.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeleteOptions {
    /// Write nothing (see the module).
    #[serde(default)]
    pub dry_run: bool,
    /// Whether the real run would delete in its steps (a dry run's items then subtract their
    /// re-reads from the requests the real run is estimated to send).
    #[serde(default)]
    pub real_in_step: bool,
}

/// The 4xx unless `confirm` names `sourceTable`.
pub fn check_confirm(confirm: &str, request: &ScanRequest) -> Result<(), ApiError> {
    if confirm != request.source_table() {
        return Err(ApiError::field(
            "confirm",
            format!(
                "must equal sourceTable ({:?}) to delete rows from it, got {confirm:?}",
                request.source_table(),
            ),
        ));
    }
    Ok(())
}

/// Deletes the rows an item read (`reads`: the storage requests its read took) and adds what it
/// did to `outcome`; a dry run (`options`) writes nothing and names a sample of them as the
/// item's result.
pub async fn delete_read_rows<S: Stores, T: TableStore>(
    state: &AppState<S>,
    begun: &Begun<ItemMessage>,
    (source, options): (&T, Option<DeleteOptions>),
    rows: Vec<Entity>,
    outcome: &mut WorkOutcome,
    reads: i64,
) -> Result<(), WorkError> {
    let scan = &begun.scan;
    let options = options.unwrap_or_default();
    if options.dry_run {
        outcome.result = sample_keys(&rows);
    }
    let table = &scan.source.table;
    let mut done =
        delete_rows(state, (source, &scan.scan_id), table, rows, options.dry_run).await?;
    if options.dry_run && options.real_in_step {
        done.planned_requests -= reads;
    }
    outcome.delta = outcome.delta.plus(&done);
    Ok(())
}

/// What deleting one batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchDeleted {
    /// Rows this call deleted (rows already gone are not counted).
    pub deleted: usize,
    /// Rows kept because they changed since they were read.
    pub changed: usize,
}

/// Deletes `rows` (keys, in key order, with the ETags they were read with) from `table`,
/// several transactions in flight; a dry run (`dry_run`) sends none. Returns the counters:
/// `rowsWritten` (deleted), `rowsChanged`, and for a dry run `plannedRequests` (transactions).
pub async fn delete_rows<S: Stores, T: TableStore>(
    state: &AppState<S>,
    (source, scan_id): (&T, &str),
    table: &str,
    rows: Vec<Entity>,
    dry_run: bool,
) -> Result<Counters, WorkError> {
    let batches = batches_of(rows, delete_op);
    if dry_run {
        return Ok(Counters {
            planned_requests: batches.len() as i64,
            ..Counters::default()
        });
    }
    // Once the scan has ended (`kit::scan_ended`) no batch starts: the rows deleted count.
    let done: Vec<BatchDeleted> = stream::iter(batches)
        .map(|(pk, ops)| async move {
            match scan_ended(state, scan_id) {
                true => Ok(BatchDeleted::default()),
                false => delete_batch(source, table, &pk, ops).await,
            }
        })
        .buffer_unordered(state.config.copy_concurrency)
        .try_collect()
        .await?;
    Ok(Counters {
        rows_written: done.iter().map(|d| d.deleted as i64).sum(),
        rows_changed: done.iter().map(|d| d.changed as i64).sum(),
        ..Counters::default()
    })
}

/// A dry run's sample of the rows it would delete: up to [`SAMPLE_KEYS`] `[PartitionKey,
/// RowKey]` pairs as JSON (a work item's result), `None` for no rows.
pub fn sample_keys(rows: &[Entity]) -> Option<String> {
    let keys: Vec<[&str; 2]> = rows
        .iter()
        .take(SAMPLE_KEYS)
        .map(|r| [r.partition_key.as_str(), r.row_key.as_str()])
        .collect();
    (!keys.is_empty()).then(|| serde_json::to_string(&keys).expect("keys serialize"))
}

/// The delete of one row read with its ETag (`If-Match: *` only for a row read without one).
fn delete_op(row: Entity) -> BatchOperation {
    BatchOperation::Delete {
        row_key: row.row_key,
        etag: row.etag,
    }
}

/// Whether a failed transaction failed on one of its rows: gone (404, and not because the table
/// is) or changed since it was read (412).
fn row_gone_or_changed(e: &StorageError) -> bool {
    match e.kind {
        StorageErrorKind::NotFound => e.code.as_deref() != Some("TableNotFound"),
        StorageErrorKind::PreconditionFailed => true,
        _ => false,
    }
}

/// Deletes one same-partition batch of deletes, tolerating rows already gone and keeping rows
/// changed since they were read (see the module's invariants).
pub async fn delete_batch<S: TableStore>(
    store: &S,
    table: &str,
    pk: &str,
    mut ops: Vec<BatchOperation>,
) -> Result<BatchDeleted, WorkError> {
    let mut changed = 0;
    for round in 0..MAX_DELETE_ROUNDS {
        if round > 0 {
            let (unchanged, changed_now) = still_there(store, table, pk, ops).await?;
            ops = unchanged;
            changed += changed_now;
        }
        if ops.is_empty() {
            return Ok(BatchDeleted {
                deleted: 0,
                changed,
            });
        }
        match store.submit_batch(table, pk, &ops).await {
            Ok(()) => {
                return Ok(BatchDeleted {
                    deleted: ops.len(),
                    changed,
                })
            }
            Err(e) if row_gone_or_changed(&e) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(WorkError::Storage(StorageError::new(
        StorageErrorKind::Transient,
        format!(
            "rows of partition {pk:?} kept vanishing or changing under {MAX_DELETE_ROUNDS} delete transactions (another writer?); trying again later"
        ),
    )))
}

/// The operations of `ops` whose rows are still there with the ETag they were read with, and
/// how many are there with another (changed): one keys-only query over the batch's row-key
/// span, within [`MAX_ITEM_QUERIES`] pages.
async fn still_there<S: TableStore>(
    store: &S,
    table: &str,
    pk: &str,
    ops: Vec<BatchOperation>,
) -> Result<(Vec<BatchOperation>, usize), WorkError> {
    let (Some(first), Some(last)) = (ops.first(), ops.last()) else {
        return Ok((ops, 0));
    };
    let mut query = Query {
        filter: Some(Filter::and(vec![
            Filter::pk(CompareOp::Eq, pk),
            Filter::rk(CompareOp::Ge, first.row_key()),
            Filter::rk(CompareOp::Le, last.row_key()),
        ])),
        top: Some(MAX_TAKE),
        select: Some(Vec::new()),
        continuation: None,
    };
    let mut present: HashMap<String, Option<String>> = HashMap::new();
    for _ in 0..MAX_ITEM_QUERIES {
        let page = store.query_page(table, &query).await?;
        present.extend(page.entities.into_iter().map(|e| (e.row_key, e.etag)));
        match page.continuation {
            Some(c) => query.continuation = Some(c),
            None => return Ok(unchanged(ops, &present)),
        }
    }
    Err(WorkError::Storage(StorageError::new(
        StorageErrorKind::Transient,
        format!("re-reading partition {pk:?} took too many pages; trying again later"),
    )))
}

/// `ops` split by what a re-read found (`present`: row key → ETag now): those whose row is
/// there unchanged (or was read without an ETag), and how many are there changed. Rows not
/// there are dropped.
fn unchanged(
    ops: Vec<BatchOperation>,
    present: &HashMap<String, Option<String>>,
) -> (Vec<BatchOperation>, usize) {
    let mut changed = 0;
    let kept = ops
        .into_iter()
        .filter(|op| {
            let BatchOperation::Delete { row_key, etag } = op else {
                return false;
            };
            match (present.get(row_key), etag) {
                (None, _) => false,
                (Some(_), None) => true,
                (Some(now), Some(read)) if now.as_ref() == Some(read) => true,
                (Some(_), Some(_)) => {
                    changed += 1;
                    false
                }
            }
        })
        .collect();
    (kept, changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(rk: &str, etag: Option<&str>) -> BatchOperation {
        BatchOperation::Delete {
            row_key: rk.into(),
            etag: etag.map(str::to_string),
        }
    }

    #[test]
    fn a_re_read_keeps_unchanged_rows_drops_gone_ones_and_counts_changed_ones() {
        let present: HashMap<String, Option<String>> = [
            ("a".to_string(), Some("1".to_string())),
            ("b".to_string(), Some("9".to_string())),
            ("d".to_string(), Some("4".to_string())),
        ]
        .into();
        let ops = vec![
            op("a", Some("1")),
            op("b", Some("2")),
            op("c", Some("3")),
            op("d", None),
        ];
        let (kept, changed) = unchanged(ops, &present);
        assert_eq!(kept, vec![op("a", Some("1")), op("d", None)]);
        assert_eq!(changed, 1, "b changed; c is gone");
    }

    #[test]
    fn a_sample_names_at_most_twenty_keys() {
        let rows: Vec<Entity> = (0..30)
            .map(|i| Entity::new("p", format!("{i:02}")))
            .collect();
        let sample: Vec<[String; 2]> = serde_json::from_str(&sample_keys(&rows).unwrap()).unwrap();
        assert_eq!(sample.len(), SAMPLE_KEYS);
        assert_eq!(sample[0], ["p".to_string(), "00".to_string()]);
        assert_eq!(sample_keys(&[]), None);
    }
}
