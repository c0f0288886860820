//! The copy driver (`"driver": "copy"`): upserts the rows of the scanned key range into
//! `destinationTable` in same-partition entity group transactions (≤ 100 operations, < 4 MiB),
//! several in flight. Typed properties travel with their `@odata.type`, as the service's JSON
//! text; read-only metadata is dropped. Re-running a step or item rewrites the same rows, so
//! duplicates are harmless.
//!
//! Where the rows are read: without a `filter`, a prefix scan's prefix-query steps read every
//! column (or the `select`ed ones) and write what they read ([`StepWork::Rows`]); the pages of
//! a partition too big for one step, a serial scan's pages, and with a `filter` (which
//! discovery cannot apply) or the reference design's `workSplit: "partitionKey"` every scanned
//! key range, become [`RangeWork`] items (up to 2,000 rows) that re-read their range, with the
//! filter (bounded: see `range::read_item`), and write what they find.
//!
//! Once the scan has ended (cancelled, or failed by another item), a step or item starts no
//! further batch (`kit::scan_ended`, kept fresh while it works: `work::watch`) and counts the
//! rows it wrote.

use crate::app::pace::Meter;
use futures::stream::{self, StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};

use std::sync::Arc;

use crate::app::config::Config;
use crate::app::error::ApiError;
use crate::app::job::request::{check_destination, default_connection};
use crate::app::job::{
    Begun, Driver, RangeWork, ScanContext, ScanRequest, Segment, Setup, StepWork, TableRef,
    WorkError, WorkOutcome, WorkSplit,
};
use crate::app::messages::ItemMessage;
use crate::app::state::AppState;
use crate::scan::Strategy;
use crate::storage::stores::Stores;
use crate::storage::{Entity, TableStore};

use super::kit::range::{batches, begin_range_item, page_items, unaddressable_error};
use super::kit::{drop_nulls, scan_ended};

pub struct CopyDriver;

/// The copy driver's request fields.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CopyFields {
    /// Created if missing; rows are upserted (replace).
    pub destination_table: String,
    /// App-setting name of the destination's connection.
    #[serde(default = "default_connection")]
    pub destination_connection: String,
    /// How copy work is split: `page` (default) or `partitionKey` (the reference design).
    #[serde(default)]
    pub work_split: WorkSplit,
}

impl Driver for CopyDriver {
    const NAME: &'static str = "copy";
    const FILTER: bool = true;
    const SELECT: bool = true;
    type Fields = CopyFields;
    type Options = ();
    type Item = RangeWork;

    fn validate(
        fields: &CopyFields,
        request: &ScanRequest,
        config: &Config,
    ) -> Result<(), ApiError> {
        if fields.work_split == WorkSplit::PartitionKey {
            for (field, given) in [
                ("filter", request.filter.is_some()),
                ("select", request.select.is_some()),
            ] {
                if given {
                    return Err(ApiError::field(
                        field,
                        "cannot be combined with workSplit \"partitionKey\" (the reference design's split, kept for comparison only)",
                    ));
                }
            }
        }
        check_destination(
            config,
            &fields.destination_connection,
            &fields.destination_table,
        )?;
        // Compared by the table service the connections resolve to, not by setting name, and
        // by table name up to case (Azure table names are case-insensitive).
        if config.same_table(
            (&request.source_connection, request.source_table()),
            (&fields.destination_connection, &fields.destination_table),
        ) {
            return Err(ApiError::field(
                "destinationTable",
                "must differ from the source table (the two connections reach the same storage account, and table names are case-insensitive)",
            ));
        }
        Ok(())
    }

    fn setup(fields: &CopyFields, request: &ScanRequest) -> Setup<()> {
        let in_step = fields.work_split == WorkSplit::Page
            && request.filter.is_none()
            && request.strategy == Strategy::Prefix;
        Setup {
            destination: Some(TableRef {
                connection: fields.destination_connection.clone(),
                table: fields.destination_table.clone(),
            }),
            work_split: fields.work_split,
            step_work: match in_step {
                true => StepWork::Rows {
                    select: request.select.clone(),
                },
                false => StepWork::Items,
            },
            ..Setup::default()
        }
    }

    async fn prepare<S: Stores>(
        state: &AppState<S>,
        context: &mut ScanContext,
    ) -> Result<(), ApiError> {
        if let Some(dst) = &context.destination {
            state.tables[&dst.connection]
                .create_table(&dst.table)
                .await?;
        }
        Ok(())
    }

    fn segment(context: &ScanContext, rows: &[Entity]) -> Segment<RangeWork> {
        Segment {
            items: page_items(context.work_split, rows),
            ..Segment::default()
        }
    }

    async fn work_rows<S: Stores>(
        state: &AppState<S>,
        scan: &ScanContext,
        requests: &Arc<Meter>,
        rows: Vec<Entity>,
    ) -> Result<i64, WorkError> {
        upsert(state, scan, requests, rows).await
    }

    async fn run<S: Stores>(
        state: &AppState<S>,
        begun: &Begun<ItemMessage>,
        item: RangeWork,
    ) -> Result<WorkOutcome, WorkError> {
        let scan = &*begun.scan;
        let (_, read, mut outcome) =
            begin_range_item::<Self, S>(state, begun, &item, scan.select.clone()).await?;
        let written = upsert(state, scan, &begun.requests, read.rows).await?;
        // Every other row is written; a row that cannot be addressed fails the item, named exactly.
        if let Some(e) = unaddressable_error("copied", &read.unaddressable) {
            return Err(e);
        }
        outcome.delta.rows_written = written;
        Ok(outcome)
    }
}

/// Upserts `rows` (read from the scan's source, in key order) into the scan's destination;
/// returns how many were written.
async fn upsert<S: Stores>(
    state: &AppState<S>,
    scan: &ScanContext,
    requests: &Arc<Meter>,
    mut rows: Vec<Entity>,
) -> Result<i64, WorkError> {
    let destination = scan
        .destination
        .as_ref()
        .ok_or_else(|| WorkError::Failed("copy work without a destination".into()))?;
    let target = &state.counted_table(&destination.connection, requests)?;
    if scan.select.is_some() {
        // Writing back a selected property's null would be refused or invent a property.
        rows.iter_mut().for_each(drop_nulls);
    }
    // Once the scan has ended no batch starts (`kit::scan_ended`): the rows written count.
    let written: Vec<usize> = stream::iter(batches(rows))
        .map(|(pk, ops)| async move {
            if scan_ended(state, &scan.scan_id) {
                return Ok(0);
            }
            target.submit_batch(&destination.table, &pk, &ops).await?;
            Ok::<_, WorkError>(ops.len())
        })
        .buffer_unordered(state.config.copy_concurrency)
        .try_collect()
        .await?;
    Ok(written.iter().sum::<usize>() as i64)
}
