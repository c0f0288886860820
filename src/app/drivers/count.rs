//! The count driver (`"driver": "count"`): counts the rows the scan finds. Without a filter the
//! scan's own discovery counts them (no work items: `rowsScanned` = `rowsMatched`); with a
//! filter, each scanned page becomes an item that re-reads its keys with the filter, so
//! `rowsMatched` counts the matching rows (one more query per page than an unfiltered count).

use serde::{Deserialize, Serialize};

use crate::app::config::Config;
use crate::app::error::ApiError;
use crate::app::job::{
    Begun, Driver, RangeWork, ScanContext, ScanRequest, Segment, Setup, WorkError, WorkOutcome,
    WorkSplit,
};
use crate::app::messages::ItemMessage;
use crate::app::state::AppState;
use crate::storage::stores::Stores;
use crate::storage::Entity;

use super::kit::range::{begin_range_item, page_items, unaddressable_error};

pub struct CountDriver;

/// A driver without fields of its own (any field but the common ones is refused).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoFields {}

impl Driver for CountDriver {
    const NAME: &'static str = "count";
    const FILTER: bool = true;
    type Fields = NoFields;
    type Options = ();
    type Item = RangeWork;

    fn validate(_: &NoFields, _: &ScanRequest, _: &Config) -> Result<(), ApiError> {
        Ok(())
    }

    fn setup(_: &NoFields, _: &ScanRequest) -> Setup<()> {
        Setup::default()
    }

    /// Without a filter, every scanned row matches: counted here. With one, discovery still
    /// sees every key (it must, to find the ranges), and each page becomes an item that counts
    /// the rows of its range the filter lets through.
    fn segment(context: &ScanContext, rows: &[Entity]) -> Segment<RangeWork> {
        let mut segment = Segment::default();
        if context.filter.is_some() {
            segment.items = page_items(WorkSplit::Page, rows);
        } else {
            segment.delta.rows_matched = rows.len() as i64;
        }
        segment
    }

    /// Counts the rows of one range that match the scan's filter (keys only).
    async fn run<S: Stores>(
        state: &AppState<S>,
        begun: &Begun<ItemMessage>,
        item: RangeWork,
    ) -> Result<WorkOutcome, WorkError> {
        let (_, read, outcome) =
            begin_range_item::<Self, S>(state, begun, &item, Some(Vec::new())).await?;
        if let Some(e) = unaddressable_error("counted", &read.unaddressable) {
            return Err(e);
        }
        Ok(outcome)
    }
}
