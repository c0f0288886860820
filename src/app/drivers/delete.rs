//! The delete driver (`"driver": "delete"`): deletes every row of `sourceTable` in the scan's
//! key range (and matching its `filter`) with same-partition entity group transactions of
//! deletes, each row deleted with the ETag it was read with (`kit::deletes`). Without a filter, a prefix scan's prefix-query steps delete the
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
//! - A row changed since it was read is kept (`412`), and counted in `rowsChanged`.
//! - Delivery is at-least-once: rows already gone (an earlier or concurrent delivery deleted
//!   them) are tolerated. A transaction fails whole when one of its deletes finds no row (404)
//!   or a changed one (412); the batch's rows are then read again and only those still there
//!   unchanged are deleted, at most [`MAX_DELETE_ROUNDS`] times per batch (then the message is
//!   retried).
//! - `"dryRun": true` writes nothing: the scan's key ranges are read by work items (so that
//!   each names a sample of its rows as its result), counting `rowsMatched` and the
//!   transactions the real run would send (`plannedRequests`).
//! - `rowsWritten` counts the rows deleted by the execution that committed each item; a row
//!   deleted by an execution that died or lost the race is gone but not counted (a lower bound).
//! - Once the scan has ended (a cancel), a step or item starts no further batch
//!   (`kit::scan_ended`, kept fresh while it works: `work::watch`) and counts what it deleted.

use crate::app::pace::Meter;
use serde::{Deserialize, Serialize};

use std::sync::Arc;
use tokio::time::Instant;

use crate::app::config::Config;
use crate::app::error::ApiError;
use crate::app::job::{
    Begun, Driver, RangeWork, ScanContext, ScanRequest, Segment, Setup, StepWork, WorkError,
    WorkOutcome, WorkSplit, Worked,
};
use crate::app::messages::ItemMessage;
use crate::app::state::AppState;
use crate::scan::Strategy;
use crate::storage::stores::Stores;
use crate::storage::Entity;

use super::kit::deletes::{check_confirm, delete_read_rows, delete_rows};
pub use super::kit::deletes::{delete_batch, BatchDeleted, DeleteOptions, MAX_DELETE_ROUNDS};
use super::kit::range::{begin_range_item, page_items, unaddressable_error};

pub struct DeleteDriver;

fn is_false(b: &bool) -> bool {
    !b
}

/// The delete driver's request fields.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeleteFields {
    /// Must equal `sourceTable`: the caller says which table it means to empty (in range).
    pub confirm: String,
    /// Read and count, write nothing. Recorded only when set, so recorded deletes keep their
    /// format.
    #[serde(default, skip_serializing_if = "is_false")]
    pub dry_run: bool,
}

/// Where a delete of `request` works, for a real run: in the prefix scan's steps when it has
/// no filter, else in items; a dry run always in items (see the module).
fn step_work(request: &ScanRequest, dry_run: bool) -> (StepWork, bool) {
    let real_in_step = request.filter.is_none() && request.strategy == Strategy::Prefix;
    match real_in_step && !dry_run {
        true => (
            StepWork::Rows {
                select: Some(Vec::new()),
            },
            true,
        ),
        false => (StepWork::Items, real_in_step),
    }
}

impl Driver for DeleteDriver {
    const NAME: &'static str = "delete";
    const FILTER: bool = true;
    const CHANGES_SOURCE: bool = true;
    type Fields = DeleteFields;
    type Options = Option<DeleteOptions>;
    type Item = RangeWork;

    fn validate(
        fields: &DeleteFields,
        request: &ScanRequest,
        _config: &Config,
    ) -> Result<(), ApiError> {
        check_confirm(&fields.confirm, request)
    }

    fn setup(fields: &DeleteFields, request: &ScanRequest) -> Setup<Option<DeleteOptions>> {
        let (step_work, real_in_step) = step_work(request, fields.dry_run);
        let options = fields.dry_run.then_some(DeleteOptions {
            dry_run: true,
            real_in_step,
        });
        Setup {
            step_work,
            options: options.map(Some),
            ..Setup::default()
        }
    }

    fn segment(_: &ScanContext, rows: &[Entity]) -> Segment<RangeWork> {
        Segment {
            items: page_items(WorkSplit::Page, rows),
            ..Segment::default()
        }
    }

    async fn work_runs<S: Stores>(
        state: &AppState<S>,
        scan: &ScanContext,
        requests: &Arc<Meter>,
        runs: Vec<Vec<Entity>>,
        _until: Instant,
    ) -> Result<Worked, WorkError> {
        let source = state.counted_table(&scan.source.connection, requests)?;
        let rows = runs.concat();
        let counters = delete_rows(
            state,
            (&source, &scan.scan_id),
            &scan.source.table,
            rows,
            false,
        )
        .await?;
        Ok(Worked::from(counters))
    }

    async fn run<S: Stores>(
        state: &AppState<S>,
        begun: &Begun<ItemMessage>,
        item: RangeWork,
    ) -> Result<WorkOutcome, WorkError> {
        let options = begun.scan.options::<Option<DeleteOptions>>()?;
        let before = begun.requests.count();
        let (source, read, mut outcome) =
            begin_range_item::<Self, S>(state, begun, &item, Some(Vec::new())).await?;
        let reads = (begun.requests.count() - before) as i64;
        delete_read_rows(
            state,
            begun,
            (&source, options),
            read.rows,
            &mut outcome,
            reads,
        )
        .await?;
        if let Some(e) = unaddressable_error("deleted", &read.unaddressable) {
            return Err(e);
        }
        Ok(outcome)
    }
}
