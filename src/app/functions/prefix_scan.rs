//! `PrefixScan` (queue trigger): executes one scan step per message — a bounded handful of
//! queries — then queues its follow-up steps and hands the rows to the driver: the count driver
//! counts them, the copy driver turns each scanned page into one copy work item.

use crate::app::messages::{ChildSpec, CopyWork, Driver, StepMessage, WorkSplit};
use crate::app::state::AppState;
use crate::app::work::{Begun, Work, WorkError, WorkOutcome};
use crate::scan::{Scanner, Step};
use crate::storage::{Entity, QueueStore, TableStore, MAX_MESSAGE_TEXT, MAX_TAKE};

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
        for step in output.steps {
            match step {
                Step::Segment { entities, .. } => {
                    outcome.delta.rows_scanned += entities.len() as i64;
                    if scan.driver == Driver::Copy {
                        outcome.children.extend(
                            copy_work(scan.work_split, &entities)
                                .into_iter()
                                .map(ChildSpec::Copy),
                        );
                    }
                }
                next => outcome.children.push(ChildSpec::Step(next)),
            }
        }
        Ok(outcome)
    }
}

/// Splits one scanned page (keys only, in order) into copy work items.
pub fn copy_work(split: WorkSplit, rows: &[Entity]) -> Vec<CopyWork> {
    match split {
        // A segment holds one page, or several when segmentsPerFirstPrefix > 1: cap each item at
        // what one page can hold, so a copy item never re-reads or writes more than 1,000 rows.
        WorkSplit::Page => rows
            .chunks(MAX_TAKE as usize)
            .map(|chunk| {
                let (first, last) = (&chunk[0], &chunk[chunk.len() - 1]);
                CopyWork::Range {
                    from: (first.partition_key.clone(), first.row_key.clone()),
                    to: (last.partition_key.clone(), last.row_key.clone()),
                }
            })
            .collect(),
        WorkSplit::PartitionKey => {
            let mut out = Vec::new();
            for group in rows.chunk_by(|a, b| a.partition_key == b.partition_key) {
                let row_keys: Vec<String> = group.iter().map(|e| e.row_key.clone()).collect();
                split_rows(&group[0].partition_key, row_keys, &mut out);
            }
            out
        }
    }
}

/// Bytes a copy message adds around its work: the envelope and the scan id (generous).
const ENVELOPE_ALLOWANCE: usize = 2048;

/// Halves a partition's row-key list until each message fits the queue (as the reference does).
fn split_rows(pk: &str, row_keys: Vec<String>, out: &mut Vec<CopyWork>) {
    let work = CopyWork::Rows {
        pk: pk.to_string(),
        row_keys,
    };
    let fits = || -> bool {
        // Size as it will be queued: envelope with a scan context, base64-encoded.
        let bytes = serde_json::to_vec(&work)
            .map(|v| v.len())
            .unwrap_or(usize::MAX);
        (bytes + ENVELOPE_ALLOWANCE) * 4 / 3 < MAX_MESSAGE_TEXT
    };
    if fits() {
        out.push(work);
        return;
    }
    let CopyWork::Rows { row_keys, .. } = work else {
        unreachable!()
    };
    if row_keys.len() == 1 {
        out.push(CopyWork::Rows {
            pk: pk.to_string(),
            row_keys,
        });
        return;
    }
    let mut first = row_keys;
    let second = first.split_off(first.len() / 2);
    split_rows(pk, first, out);
    split_rows(pk, second, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::messages::{self, CopyMessage};

    #[test]
    fn reference_split_is_one_item_per_partition_and_fits_the_queue() {
        let mut rows = vec![
            Entity::new("a", "1"),
            Entity::new("a", "2"),
            Entity::new("b", "1"),
        ];
        let items = copy_work(WorkSplit::PartitionKey, &rows);
        assert_eq!(items.len(), 2);
        rows.clear();
        for i in 0..1000 {
            rows.push(Entity::new("big", format!("{i:04}-{}", "r".repeat(200))));
        }
        let items = copy_work(WorkSplit::PartitionKey, &rows);
        assert!(items.len() >= 4, "{} items", items.len());
        let total: usize = items
            .iter()
            .map(|w| {
                if let CopyWork::Rows { row_keys, .. } = w {
                    row_keys.len()
                } else {
                    0
                }
            })
            .sum();
        assert_eq!(total, 1000);
        for work in items {
            messages::encode(&CopyMessage {
                scan_id: "x".into(),
                work,
            })
            .expect("fits in a queue message");
        }
        assert_eq!(copy_work(WorkSplit::Page, &rows).len(), 1);
        // Several pages in one segment (segmentsPerFirstPrefix > 1) still give items of ≤ 1,000 rows.
        let many: Vec<Entity> = (0..2500)
            .map(|i| Entity::new("p", format!("{i:05}")))
            .collect();
        let items = copy_work(WorkSplit::Page, &many);
        assert_eq!(items.len(), 3);
        assert_eq!(
            items[1],
            CopyWork::Range {
                from: ("p".into(), "01000".into()),
                to: ("p".into(), "01999".into())
            }
        );
    }
}
