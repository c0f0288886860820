//! `PrefixScan` (queue trigger): executes one scan step per message — a bounded handful of
//! queries — then queues its follow-up steps and hands every scanned segment to the scan's
//! driver: either as segments (`Driver::segment`), which it turns into counters and/or
//! work items (a filtered copy: one copy item per up to 2,000 scanned rows, adjacent segments
//! joined; the count driver: nothing more), or, for scans that work in their steps
//! (`ScanContext::in_step`: an unfiltered prefix copy or delete), as rows and their key ranges,
//! which the driver works on once the step's children are queued (`Driver::work_rows`, run by
//! `work::Runner::finish`). The driver is the one the scan records, found in the app's
//! registry. Only prefix-query steps work on their rows, reading at most the driver's
//! `Driver::step_rows` rows (`MAX_ITEM_ROWS` unless it asks for more; plus two pages; and at
//! most `MAX_STEP_ROW_BYTES` of row text) with the
//! columns the driver needs; a step that walks one partition (or a serial scan's chain) still
//! reads keys only and makes work items, so a huge partition is still written by many
//! invocations at once.

use crate::app::job::{
    Begun, Executed, RangeWork, ScanContext, WorkError, MAX_ITEM_ROWS, MAX_STEP_ROW_BYTES,
};
use crate::app::messages::{ChildSpec, StepMessage};
use crate::app::state::AppState;
use crate::app::work::Work;
use crate::scan::{Scanner, Step, StepBudget};
use crate::storage::stores::Stores;
use crate::storage::TableStore;

impl Work for StepMessage {
    async fn execute<S: Stores>(
        state: &AppState<S>,
        begun: &Begun<Self>,
    ) -> Result<Executed, WorkError> {
        let scan = &*begun.scan;
        let source = state.counted_table(&scan.source.connection, &begun.requests)?;
        let mut done = Executed::default();
        match &begun.message.step {
            // The root runs the scan's initial steps (known without a query) in its own
            // invocation, as the reference design does: the partition whose key equals the
            // prefix is empty in most tables, and neither costs a message of its own. Each
            // runs on its own budget, so the root does at most twice a step's work.
            Step::Start => {
                let scanner = scanner(state, scan, &source, &Step::Start);
                for step in scanner.execute(&Step::Start).await?.steps {
                    run_step(state, scan, &source, &step, &mut done).await?;
                }
            }
            step => run_step(state, scan, &source, step, &mut done).await?,
        }
        // The driver works on the rows once the children are queued (`Runner::finish`).
        Ok(done)
    }
}

/// Whether `step` of `scan` does the driver's work on its rows: prefix queries of scans that
/// work in their steps (see the module documentation).
fn works_in_step(scan: &ScanContext, step: &Step) -> bool {
    scan.in_step && matches!(step, Step::Start | Step::PrefixQuery { .. })
}

/// The scanner for `step`: with the scan's columns and a row budget where the step works on
/// its rows, keys only and the step budget otherwise.
fn scanner<'a, S: Stores, T: TableStore>(
    state: &AppState<S>,
    scan: &'a ScanContext,
    source: &'a T,
    step: &Step,
) -> Scanner<'a, T> {
    let budget = state.config.step_budget;
    if works_in_step(scan, step) {
        let driver = state.drivers.of(scan).ok();
        let rows = driver.map_or(MAX_ITEM_ROWS, |d| d.step_rows(scan));
        let scale = driver.map_or(1, |d| d.step_query_scale(scan));
        let budget = StepBudget {
            max_queries: budget.max_queries.saturating_mul(scale),
            ..budget.with_max_rows(rows, MAX_STEP_ROW_BYTES)
        };
        return Scanner::new(source, &scan.source.table, &scan.params, budget);
    }
    if scan.in_step {
        return Scanner::new(source, &scan.source.table, &scan.params, budget)
            .with_select(Some(vec!["PartitionKey".into(), "RowKey".into()]));
    }
    Scanner::new(source, &scan.source.table, &scan.params, budget)
}

/// Executes one step, adding its follow-up steps, counters and work items to `done`, or, where
/// the step works on its rows, the rows and their key ranges.
async fn run_step<S: Stores, T: TableStore>(
    state: &AppState<S>,
    scan: &ScanContext,
    source: &T,
    step: &Step,
    done: &mut Executed,
) -> Result<(), WorkError> {
    if let (
        Some(prefix),
        Step::PartitionKeyQuery { partition_key, .. }
        | Step::PartitionKeyRange { partition_key, .. },
    ) = (&state.config.test_fail_prefix, step)
    {
        if partition_key.starts_with(prefix.as_str()) {
            return Err(WorkError::Failed(format!(
                "forced failure for partition {partition_key:?} (TABLESCAN_TEST_FAIL_PREFIX)"
            )));
        }
    }
    let in_step = works_in_step(scan, step);
    let driver = state.drivers.of(scan)?;
    let output = scanner(state, scan, source, step).execute(step).await?;
    let outcome = &mut done.outcome;
    for step in joined_segments(output.steps) {
        match step {
            Step::Segment { entities, .. } => {
                outcome.delta.rows_scanned += entities.len() as i64;
                if let (true, Some(first), Some(last)) =
                    (in_step, entities.first(), entities.last())
                {
                    outcome.in_step.push(RangeWork::Range {
                        from: (first.partition_key.clone(), first.row_key.clone()),
                        to: (last.partition_key.clone(), last.row_key.clone()),
                    });
                    done.rows.extend(entities);
                } else {
                    driver.segment(scan, &entities, outcome)?;
                }
            }
            next => outcome.children.push(ChildSpec::Step(next)),
        }
    }
    Ok(())
}

/// Joins segments that follow each other in a step's output into one. The engine's output is in
/// (PK, RK) order and every key between two segments belongs to a follow-up step listed between
/// them, so adjacent segments are contiguous: no row lies between them, and the driver may make
/// one work item of both (a page and the rest of its last partition read inline, or the pages
/// of one query).
pub fn joined_segments(steps: Vec<Step>) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::with_capacity(steps.len());
    for step in steps {
        match (out.last_mut(), step) {
            (Some(Step::Segment { entities, .. }), Step::Segment { entities: more, .. }) => {
                entities.extend(more)
            }
            (_, step) => out.push(step),
        }
    }
    out
}
