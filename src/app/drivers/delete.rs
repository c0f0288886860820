//! The delete driver (`"driver": "delete"`): deletes every row of `sourceTable` in the scan's
//! key range (and matching its `filter`) with same-partition entity group transactions of
//! deletes with `If-Match: *`. Without a filter, a prefix scan's prefix-query steps delete the
//! rows they read (keys only: [`StepWork::Rows`]); the pages of a partition too big for one
//! step, a serial scan's pages, and with a filter (which discovery cannot apply) every scanned
//! key range, become [`RangeWork`] items that re-read their range (keys only, with the filter:
//! bounded like every range item) and delete the rows they find.
//!
//! Safety rules (docs/api.md, "Delete safety rules"):
//! - The request must carry `"confirm"` equal to `sourceTable`, or nothing is written.
//! - Only rows a read of the scan returned are deleted: a step's own read, whose queries the
//!   scan engine keeps inside the scan's range (a row the service answers outside a query's
//!   range stops the step), or an item's
//!   re-read, whose filter covers exactly the item's key range (`job::range`); rows
//!   outside the range are never named.
//! - Delivery is at-least-once: rows already gone (an earlier or concurrent delivery deleted
//!   them) are tolerated. A transaction fails whole when one of its deletes finds no row (404);
//!   the batch's rows are then read again and only those still there are deleted, at most
//!   [`MAX_DELETE_ROUNDS`] times per batch (then the message is retried).
//! - `rowsWritten` counts the rows deleted by the execution that committed each item; a row
//!   deleted by an execution that died or lost the race is gone but not counted (a lower bound).
//! - Once the scan has ended (a cancel), a step or item starts no further batch
//!   (`kit::scan_ended`, kept fresh while it works: `work::watch`) and counts what it deleted.

use crate::app::pace::Meter;
use futures::stream::{self, StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};

use std::sync::Arc;

use crate::app::config::Config;
use crate::app::error::ApiError;
use crate::app::job::{
    Begun, Driver, RangeWork, ScanContext, ScanRequest, Segment, Setup, StepWork, WorkError,
    WorkOutcome, WorkSplit, MAX_ITEM_QUERIES,
};
use crate::app::messages::ItemMessage;
use crate::app::state::AppState;
use crate::scan::Strategy;
use crate::storage::stores::Stores;
use crate::storage::{
    BatchOperation, CompareOp, Entity, Filter, Query, StorageError, StorageErrorKind, TableStore,
    MAX_TAKE,
};

use super::kit::range::{batches_of, begin_range_item, page_items, unaddressable_error};
use super::kit::scan_ended;

/// Transactions tried per batch before the item gives up for this delivery (each after the
/// first re-reads which of the batch's rows are still there).
pub const MAX_DELETE_ROUNDS: usize = 3;

pub struct DeleteDriver;

/// The delete driver's request fields.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeleteFields {
    /// Must equal `sourceTable`: the caller says which table it means to empty (in range).
    pub confirm: String,
}

impl Driver for DeleteDriver {
    const NAME: &'static str = "delete";
    const FILTER: bool = true;
    const CHANGES_SOURCE: bool = true;
    type Fields = DeleteFields;
    type Options = ();
    type Item = RangeWork;

    fn validate(
        fields: &DeleteFields,
        request: &ScanRequest,
        _config: &Config,
    ) -> Result<(), ApiError> {
        if fields.confirm != request.source_table() {
            return Err(ApiError::field(
                "confirm",
                format!(
                    "must equal sourceTable ({:?}) to delete rows from it, got {:?}",
                    request.source_table(),
                    fields.confirm
                ),
            ));
        }
        Ok(())
    }

    fn setup(_: &DeleteFields, request: &ScanRequest) -> Setup<()> {
        let step_work = match (&request.filter, request.strategy) {
            (None, Strategy::Prefix) => StepWork::Rows {
                select: Some(Vec::new()),
            },
            _ => StepWork::Items,
        };
        Setup {
            step_work,
            ..Setup::default()
        }
    }

    fn segment(_: &ScanContext, rows: &[Entity]) -> Segment<RangeWork> {
        Segment {
            items: page_items(WorkSplit::Page, rows),
            ..Segment::default()
        }
    }

    async fn work_rows<S: Stores>(
        state: &AppState<S>,
        scan: &ScanContext,
        requests: &Arc<Meter>,
        rows: Vec<Entity>,
    ) -> Result<i64, WorkError> {
        let source = state.counted_table(&scan.source.connection, requests)?;
        delete_rows(state, (&source, &scan.scan_id), &scan.source.table, rows).await
    }

    async fn run<S: Stores>(
        state: &AppState<S>,
        begun: &Begun<ItemMessage>,
        item: RangeWork,
    ) -> Result<WorkOutcome, WorkError> {
        let (source, read, mut outcome) =
            begin_range_item::<Self, S>(state, begun, &item, Some(Vec::new())).await?;
        let scan = &begun.scan;
        let deleted = delete_rows(
            state,
            (&source, &scan.scan_id),
            &scan.source.table,
            read.rows,
        )
        .await?;
        if let Some(e) = unaddressable_error("deleted", &read.unaddressable) {
            return Err(e);
        }
        outcome.delta.rows_written = deleted;
        Ok(outcome)
    }
}

/// Deletes `rows` (keys, in key order) from `table`, several transactions in flight; returns
/// how many this call deleted (rows already gone are not counted).
async fn delete_rows<S: Stores, T: TableStore>(
    state: &AppState<S>,
    (source, scan_id): (&T, &str),
    table: &str,
    rows: Vec<Entity>,
) -> Result<i64, WorkError> {
    // Once the scan has ended no batch starts (`kit::scan_ended`): the rows deleted count.
    let deleted: Vec<usize> = stream::iter(batches_of(rows, delete_op))
        .map(|(pk, ops)| async move {
            match scan_ended(state, scan_id) {
                true => Ok(0),
                false => delete_batch(source, table, &pk, ops).await,
            }
        })
        .buffer_unordered(state.config.copy_concurrency)
        .try_collect()
        .await?;
    Ok(deleted.iter().sum::<usize>() as i64)
}

fn delete_op(row: Entity) -> BatchOperation {
    BatchOperation::Delete {
        row_key: row.row_key,
        etag: None,
    }
}

/// Whether a failed transaction failed because a row it deletes is already gone (and not,
/// say, because the table is).
fn row_gone(e: &StorageError) -> bool {
    e.kind == StorageErrorKind::NotFound && e.code.as_deref() != Some("TableNotFound")
}

/// Deletes one same-partition batch of deletes, tolerating rows already gone; returns how many
/// it deleted.
pub async fn delete_batch<S: TableStore>(
    store: &S,
    table: &str,
    pk: &str,
    mut ops: Vec<BatchOperation>,
) -> Result<usize, WorkError> {
    for round in 0..MAX_DELETE_ROUNDS {
        if round > 0 {
            ops = still_there(store, table, pk, ops).await?;
        }
        if ops.is_empty() {
            return Ok(0);
        }
        match store.submit_batch(table, pk, &ops).await {
            Ok(()) => return Ok(ops.len()),
            Err(e) if row_gone(&e) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(WorkError::Storage(StorageError::new(
        StorageErrorKind::Transient,
        format!(
            "rows of partition {pk:?} kept vanishing under {MAX_DELETE_ROUNDS} delete transactions (another deleter?); trying again later"
        ),
    )))
}

/// The operations of `ops` whose rows still exist: one keys-only query over the batch's
/// row-key span, within [`MAX_ITEM_QUERIES`] pages.
async fn still_there<S: TableStore>(
    store: &S,
    table: &str,
    pk: &str,
    ops: Vec<BatchOperation>,
) -> Result<Vec<BatchOperation>, WorkError> {
    let (Some(first), Some(last)) = (ops.first(), ops.last()) else {
        return Ok(ops);
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
    let mut present = std::collections::HashSet::new();
    for _ in 0..MAX_ITEM_QUERIES {
        let page = store.query_page(table, &query).await?;
        present.extend(page.entities.into_iter().map(|e| e.row_key));
        match page.continuation {
            Some(c) => query.continuation = Some(c),
            None => {
                return Ok(ops
                    .into_iter()
                    .filter(|op| present.contains(op.row_key()))
                    .collect())
            }
        }
    }
    Err(WorkError::Storage(StorageError::new(
        StorageErrorKind::Transient,
        format!("re-reading partition {pk:?} took too many pages; trying again later"),
    )))
}
