//! How a typed [`Driver`] becomes a registry entry ([`hooks`]): its types erased behind
//! [`DriverHooks`], with the parts every driver shares done here once — reading its fields and
//! recording its options, turning segments into work items, counting the rows a step worked
//! on, re-working an adopted step's ranges, parsing its items.

use crate::app::pace::Meter;
use std::marker::PhantomData;
use std::sync::Arc;
use tokio::time::Instant;

use crate::app::config::Config;
use crate::app::error::ApiError;
use crate::app::job::{
    accepts, item_child, Begun, BoxFuture, Driver, DriverHooks, RangeWork, ScanContext,
    ScanRequest, Setup, WorkError, WorkOutcome, Worked, MAX_STEP_QUERY_SCALE, MAX_STEP_ROWS,
};
use crate::app::messages::{ChildSpec, ItemMessage};
use crate::app::state::AppState;
use crate::storage::stores::Stores;
use crate::storage::{Entity, StorageError, StorageErrorKind, MAX_TAKE};

use super::range;

/// Driver `D` as a registry entry of an app over stores `S`.
pub fn hooks<D: Driver, S: Stores>() -> Box<dyn DriverHooks<AppState<S>>> {
    Box::new(Hooks::<D>(PhantomData))
}

struct Hooks<D>(PhantomData<fn() -> D>);

impl<D: Driver, S: Stores> DriverHooks<AppState<S>> for Hooks<D> {
    fn name(&self) -> &'static str {
        D::NAME
    }

    fn scans_table(&self) -> bool {
        D::SCANS_TABLE
    }

    fn completes(&self) -> bool {
        D::COMPLETES
    }

    fn phases(&self) -> u32 {
        D::PHASES
    }

    fn phase(&self, context: &ScanContext, n: u32) -> Result<ChildSpec, WorkError> {
        D::phase(context, n)
    }

    fn ends_phases(&self, n: u32, result: Option<&str>) -> bool {
        D::ends_phases(n, result)
    }

    fn changes_source(&self) -> bool {
        D::CHANGES_SOURCE
    }

    fn step_rows(&self, context: &ScanContext) -> usize {
        D::step_rows(context).min(MAX_STEP_ROWS)
    }

    fn step_query_scale(&self, context: &ScanContext) -> usize {
        D::step_query_scale(context).clamp(1, MAX_STEP_QUERY_SCALE)
    }

    fn plan(&self, request: &mut ScanRequest, config: &Config) -> Result<Setup, ApiError> {
        let fields: D::Fields = request.driver_fields(D::NAME)?;
        request.validate(accepts::<D>(), config)?;
        D::validate(&fields, request, config)?;
        let setup = D::setup(&fields, request).recorded();
        request.resolve_defaults(&setup);
        request.set_driver_fields(&fields);
        Ok(setup)
    }

    fn prepare<'a>(
        &'a self,
        state: &'a AppState<S>,
        context: &'a mut ScanContext,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        Box::pin(D::prepare(state, context))
    }

    fn root(&self, context: &ScanContext) -> Result<ChildSpec, WorkError> {
        D::root::<S::Table>(context)
    }

    fn segment(
        &self,
        context: &ScanContext,
        rows: &[Entity],
        outcome: &mut WorkOutcome,
    ) -> Result<(), WorkError> {
        let segment = D::segment(context, rows);
        outcome.delta = outcome.delta.plus(&segment.delta);
        for item in &segment.items {
            outcome.children.push(item_child::<D>(item)?);
        }
        Ok(())
    }

    fn work_rows<'a>(
        &'a self,
        state: &'a AppState<S>,
        scan: &'a ScanContext,
        requests: &'a Arc<Meter>,
        runs: Vec<Vec<Entity>>,
        until: Instant,
    ) -> BoxFuture<'a, Result<Worked, WorkError>> {
        Box::pin(work_rows::<D, S>(state, scan, requests, runs, until))
    }

    fn rework<'a>(
        &'a self,
        state: &'a AppState<S>,
        scan: &'a ScanContext,
        requests: &'a Arc<Meter>,
        range: &'a RangeWork,
        until: Instant,
    ) -> BoxFuture<'a, Result<Worked, WorkError>> {
        Box::pin(rework_range::<D, S>(state, scan, requests, range, until))
    }

    fn run<'a>(
        &'a self,
        state: &'a AppState<S>,
        begun: &'a Begun<ItemMessage>,
    ) -> BoxFuture<'a, Result<WorkOutcome, WorkError>> {
        Box::pin(async move {
            let item = begun.message.work.parse().map_err(|e| {
                WorkError::Permanent(format!(
                    "not a work item of the {} driver ({e}): {:?}",
                    D::NAME,
                    begun.message.work
                ))
            })?;
            D::run(state, begun, item).await
        })
    }

    fn complete<'a>(
        &'a self,
        state: &'a AppState<S>,
        context: &'a ScanContext,
    ) -> BoxFuture<'a, Result<(), WorkError>> {
        Box::pin(D::complete(state, context))
    }
}

/// Does `D`'s work on the rows one of a scan's steps read, as its contiguous runs
/// ([`Driver::work_runs`]); every row it did not hand off counts as matched (scans with a
/// filter do not work in steps): the items the others went to count them when they read them
/// (the step counted them scanned).
async fn work_rows<D: Driver, S: Stores>(
    state: &AppState<S>,
    scan: &ScanContext,
    requests: &Arc<Meter>,
    runs: Vec<Vec<Entity>>,
    until: Instant,
) -> Result<Worked, WorkError> {
    let given = runs.iter().map(Vec::len).sum::<usize>() as i64;
    // The scan ended (`super::scan_ended`): no work starts.
    if super::scan_ended(state, &scan.scan_id) {
        return Ok(Worked::default());
    }
    let mut worked = D::work_runs(state, scan, requests, runs, until).await?;
    if !D::COUNTS_MATCHED {
        worked.counters.rows_matched = given - worked.rows_handed_off;
    }
    Ok(worked)
}

/// Reads of a range that grew since it was scanned, before [`rework_range`] gives up for this
/// delivery.
const MAX_REWORK_ROUNDS: usize = 8;
// A step's rows (its row budget plus two pages) are read again within those rounds.
const _: () = assert!(
    MAX_STEP_ROWS + 2 * MAX_TAKE as usize <= MAX_REWORK_ROUNDS * crate::app::job::MAX_ITEM_ROWS
);

/// Reads one key range of a step's rows again and does `D`'s work on them ([`work_rows`]): for
/// a delivery that adopted a step's recorded outcome, whose rows the recording delivery may
/// not have worked on. A range that grew since it was scanned is read to its end (within
/// [`MAX_REWORK_ROUNDS`] reads of [`range::read_item`]).
async fn rework_range<D: Driver, S: Stores>(
    state: &AppState<S>,
    scan: &ScanContext,
    requests: &Arc<Meter>,
    range: &RangeWork,
    until: Instant,
) -> Result<Worked, WorkError> {
    let source = state.counted_table(&scan.source.connection, requests)?;
    // What the step read: its columns, no filter (scans with a filter do not work in steps).
    let spec = range::ReadSpec {
        select: scan.params.select.clone(),
        ..range::ReadSpec::default()
    };
    let mut total = Worked::default();
    let mut next = Some(range.clone());
    for _ in 0..MAX_REWORK_ROUNDS {
        let Some(work) = next.take() else {
            return Ok(total);
        };
        if super::scan_ended(state, &scan.scan_id) {
            return Ok(total);
        }
        let read = range::read_item(&source, &scan.source.table, &work, &spec).await?;
        if let Some(e) = range::unaddressable_error("worked on", &read.unaddressable) {
            return Err(e);
        }
        // Past `until`, a paced driver starts no more work: it hands this read's rows on whole
        // (read only to be handed on: a rare path, an adopted outcome's range that grew).
        let worked = work_rows::<D, S>(state, scan, requests, vec![read.rows], until).await?;
        total = total.plus(worked);
        next = read.next;
    }
    match next {
        None => Ok(total),
        Some(_) => Err(WorkError::Storage(StorageError::new(
            StorageErrorKind::Transient,
            "a scanned range kept growing while it was read again; trying again later",
        ))),
    }
}
