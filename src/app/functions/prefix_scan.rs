//! `PrefixScan` (queue trigger): executes one scan step per message — a bounded handful of
//! queries — then queues its follow-up steps and hands the rows to the driver: the count driver
//! counts them, the copy driver turns each scanned page into one copy work item.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;

use crate::app::messages::{ChildSpec, CopyWork, Driver, StepMessage};
use crate::app::protocol::InvocationResponse;
use crate::app::state::AppState;
use crate::app::work::{Begun, WorkError, WorkOutcome};
use crate::scan::{Scanner, Step};
use crate::storage::{QueueStore, TableStore};

pub async fn handle<T: TableStore + Clone, Q: QueueStore + Clone>(
    State(state): State<Arc<AppState<T, Q>>>,
    body: Bytes,
) -> InvocationResponse {
    let begun = match state.begin::<StepMessage>(&body).await {
        Ok(begun) => begun,
        Err(reply) => return reply,
    };
    let result = if begun.needs_execution() {
        execute(&state, &begun).await
    } else {
        Ok(WorkOutcome::default())
    };
    state.finish(begun, result).await
}

async fn execute<T: TableStore + Clone, Q: QueueStore + Clone>(
    state: &AppState<T, Q>,
    begun: &Begun<StepMessage>,
) -> Result<WorkOutcome, WorkError> {
    let message = &begun.message;
    let scan = &message.scan;
    if let (Some(prefix), Step::PartitionKeyQuery { partition_key, .. }) =
        (&state.config.test_fail_prefix, &message.step)
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
    for step in output.steps {
        match step {
            Step::Segment { entities, .. } => {
                outcome.delta.rows_scanned += entities.len() as i64;
                if scan.driver == Driver::Copy {
                    let (first, last) = (&entities[0], &entities[entities.len() - 1]);
                    let work = CopyWork::Range {
                        from: (first.partition_key.clone(), first.row_key.clone()),
                        to: (last.partition_key.clone(), last.row_key.clone()),
                    };
                    outcome.children.push(ChildSpec::Copy(work));
                }
            }
            next => outcome.children.push(ChildSpec::Step(next)),
        }
    }
    Ok(outcome)
}
