//! `PrefixScan` (queue trigger): executes one scan step per message — a bounded handful of
//! queries — then queues its follow-up steps and hands every scanned segment to the scan's
//! driver (`drivers::Driver::segment`), which turns it into counters and/or work items (the
//! copy driver: one copy item per up to 2,000 scanned rows, adjacent segments joined; the count
//! driver: nothing more).

pub use crate::app::drivers::range::page_items as copy_work;
use crate::app::drivers::segment_outcome;
use crate::app::messages::{ChildSpec, StepMessage};
use crate::app::state::AppState;
use crate::app::work::{Begun, Work, WorkError, WorkOutcome};
use crate::scan::{Scanner, Step};
use crate::storage::{QueueStore, TableStore};

impl Work for StepMessage {
    async fn execute<T: TableStore + Clone, Q: QueueStore + Clone>(
        state: &AppState<T, Q>,
        begun: &Begun<Self>,
    ) -> Result<WorkOutcome, WorkError> {
        let message = &begun.message;
        let scan = &*begun.scan;
        if let (
            Some(prefix),
            Step::PartitionKeyQuery { partition_key, .. }
            | Step::PartitionKeyRange { partition_key, .. },
        ) = (&state.config.test_fail_prefix, &message.step)
        {
            if partition_key.starts_with(prefix.as_str()) {
                return Err(WorkError::Failed(format!(
                    "forced failure for partition {partition_key:?} (TABLESCAN_TEST_FAIL_PREFIX)"
                )));
            }
        }
        let source = state.counted_table(&scan.source.connection, &begun.requests)?;
        let scanner = Scanner::new(
            &source,
            &scan.source.table,
            &scan.params,
            state.config.step_budget,
        );
        let output = scanner.execute(&message.step).await?;

        let mut outcome = WorkOutcome::default();
        for step in joined_segments(output.steps) {
            match step {
                Step::Segment { entities, .. } => {
                    outcome.delta.rows_scanned += entities.len() as i64;
                    segment_outcome(scan, &entities, &mut outcome)?;
                }
                next => outcome.children.push(ChildSpec::Step(next)),
            }
        }
        Ok(outcome)
    }
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
