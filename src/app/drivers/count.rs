//! The count driver (`"driver": "count"`): counts the rows the scan finds. Without a filter the
//! scan's own discovery counts them (no work items: `rowsScanned`).

use serde::{Deserialize, Serialize};

use crate::app::config::Config;
use crate::app::error::ApiError;
use crate::app::functions::start_scan::ScanRequest;
use crate::app::messages::{ItemMessage, ScanContext};
use crate::app::state::AppState;
use crate::app::work::{Begun, WorkError, WorkOutcome};
use crate::storage::{Entity, QueueStore, TableStore};

use super::range::{read_item, unaddressable_error, RangeWork};
use super::{item_child, Driver, Segment, Setup};

pub struct CountDriver;

/// A driver without fields of its own (any field but the common ones is refused).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoFields {}

impl Driver for CountDriver {
    const NAME: &'static str = "count";
    type Fields = NoFields;
    type Item = RangeWork;

    fn validate(_: &NoFields, _: &ScanRequest, _: &Config) -> Result<(), ApiError> {
        Ok(())
    }

    fn setup(_: &NoFields, _: &ScanRequest) -> Setup {
        Setup::default()
    }

    fn segment(_: &ScanContext, rows: &[Entity]) -> Segment<RangeWork> {
        let mut segment = Segment::default();
        segment.delta.rows_matched = rows.len() as i64;
        segment
    }

    /// Counts the rows of one range (keys only).
    async fn run<T: TableStore + Clone, Q: QueueStore + Clone>(
        state: &AppState<T, Q>,
        begun: &Begun<ItemMessage>,
        item: RangeWork,
    ) -> Result<WorkOutcome, WorkError> {
        let scan = &*begun.scan;
        let source = state.counted_table(&scan.source.connection, &begun.requests)?;
        let spec = super::read_spec(state, scan, Some(Vec::new()));
        let read = read_item(&source, &scan.source.table, &item, &spec).await?;
        let mut outcome = WorkOutcome::default();
        if let Some(next) = &read.next {
            outcome.children.push(item_child::<Self>(next)?);
        }
        if let Some(e) = unaddressable_error("counted", &read.unaddressable) {
            return Err(e);
        }
        outcome.delta.rows_matched = read.rows.len() as i64;
        Ok(outcome)
    }
}
