//! `TableCopy` (queue trigger): copies one work item — the rows of one scanned page — to the
//! destination. The key range is re-read once with every column, then written with
//! upsert-replace in same-partition entity group transactions (≤ 100 operations, < 4 MiB),
//! several in flight. Typed properties travel with their `@odata.type`; read-only metadata is
//! dropped. Re-running the item rewrites the same rows, so duplicates are harmless.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use futures::stream::{self, StreamExt, TryStreamExt};

use crate::app::messages::{CopyMessage, CopyWork};
use crate::app::protocol::InvocationResponse;
use crate::app::state::AppState;
use crate::app::work::{Begun, WorkError, WorkOutcome};
use crate::storage::{
    BatchOperation, CompareOp, Entity, Filter, Query, QueueStore, TableStore, MAX_BATCH_BYTES,
    MAX_BATCH_OPERATIONS, MAX_TAKE,
};

pub async fn handle<T: TableStore + Clone, Q: QueueStore + Clone>(
    State(state): State<Arc<AppState<T, Q>>>,
    body: Bytes,
) -> InvocationResponse {
    let begun = match state.begin::<CopyMessage>(&body).await {
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

/// The exact filter for rows from `from` to `to` inclusive in (PK, RK) order.
pub fn range_filter(from: &(String, String), to: &(String, String)) -> Filter {
    if from.0 == to.0 {
        return Filter::and(vec![
            Filter::pk(CompareOp::Eq, from.0.clone()),
            Filter::rk(CompareOp::Ge, from.1.clone()),
            Filter::rk(CompareOp::Le, to.1.clone()),
        ]);
    }
    Filter::or(vec![
        Filter::and(vec![
            Filter::pk(CompareOp::Eq, from.0.clone()),
            Filter::rk(CompareOp::Ge, from.1.clone()),
        ]),
        Filter::and(vec![
            Filter::pk(CompareOp::Gt, from.0.clone()),
            Filter::pk(CompareOp::Lt, to.0.clone()),
        ]),
        Filter::and(vec![
            Filter::pk(CompareOp::Eq, to.0.clone()),
            Filter::rk(CompareOp::Le, to.1.clone()),
        ]),
    ])
}

/// Splits rows (in key order) into same-partition batches within the transaction limits.
pub fn batches(rows: Vec<Entity>) -> Vec<(String, Vec<BatchOperation>)> {
    // Leave headroom under 4 MiB for the multipart framing of each operation.
    const BUDGET: usize = MAX_BATCH_BYTES - 512 * 1024;
    let mut out: Vec<(String, Vec<BatchOperation>)> = Vec::new();
    let mut bytes = 0usize;
    for row in rows {
        let size = row.wire_size() + 512;
        let fits = out.last().is_some_and(|(pk, ops)| {
            *pk == row.partition_key && ops.len() < MAX_BATCH_OPERATIONS && bytes + size < BUDGET
        });
        if !fits {
            out.push((row.partition_key.clone(), Vec::new()));
            bytes = 0;
        }
        bytes += size;
        out.last_mut()
            .expect("pushed above")
            .1
            .push(BatchOperation::Upsert(row));
    }
    out
}

async fn execute<T: TableStore + Clone, Q: QueueStore + Clone>(
    state: &AppState<T, Q>,
    begun: &Begun<CopyMessage>,
) -> Result<WorkOutcome, WorkError> {
    let scan = &*begun.scan;
    let destination = scan
        .destination
        .as_ref()
        .ok_or_else(|| WorkError::Failed("copy work without a destination".into()))?;
    let (filter, expected) = match &begun.message.work {
        CopyWork::Range { from, to } => (range_filter(from, to), None),
        CopyWork::Rows { pk, row_keys } => {
            let (first, last) = (row_keys.first(), row_keys.last());
            let (Some(first), Some(last)) = (first, last) else {
                return Ok(WorkOutcome::default());
            };
            let filter = Filter::and(vec![
                Filter::pk(CompareOp::Eq, pk.clone()),
                Filter::rk(CompareOp::Ge, first.clone()),
                Filter::rk(CompareOp::Le, last.clone()),
            ]);
            (
                filter,
                Some(row_keys.iter().collect::<std::collections::HashSet<_>>()),
            )
        }
    };
    let first_pk = match &begun.message.work {
        CopyWork::Range { from, .. } => &from.0,
        CopyWork::Rows { pk, .. } => pk,
    };
    if let Some(prefix) = &state.config.test_fail_prefix {
        if first_pk.starts_with(prefix.as_str()) {
            return Err(WorkError::Failed(format!(
                "forced failure for partition {first_pk:?} (TABLESCAN_TEST_FAIL_PREFIX)"
            )));
        }
    }
    let source = state.counted_table(&scan.source.connection, &begun.requests)?;
    let target = state.counted_table(&destination.connection, &begun.requests)?;

    let mut query = Query {
        filter: Some(filter),
        top: Some(MAX_TAKE),
        select: None,
        continuation: None,
    };
    let mut rows = Vec::new();
    loop {
        let page = source.query_page(&scan.source.table, &query).await?;
        rows.extend(page.entities);
        match page.continuation {
            Some(c) => query.continuation = Some(c),
            None => break,
        }
    }
    if let Some(expected) = expected {
        rows.retain(|e| expected.contains(&e.row_key));
        if rows.len() != expected.len() {
            return Err(WorkError::Failed(format!(
                "expected {} rows of partition {first_pk:?}, found {}",
                expected.len(),
                rows.len()
            )));
        }
    }
    let written = rows.len() as i64;
    let target = &target;
    stream::iter(batches(rows))
        .map(|(pk, ops)| async move { target.submit_batch(&destination.table, &pk, &ops).await })
        .buffer_unordered(state.config.copy_concurrency)
        .try_collect::<Vec<()>>()
        .await?;
    let mut outcome = WorkOutcome::default();
    outcome.delta.rows_written = written;
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn batches_respect_partition_count_and_size() {
        let mut rows = Vec::new();
        for pk in ["a", "b"] {
            for i in 0..150 {
                rows.push(Entity::new(pk, format!("{i:03}")));
            }
        }
        let sizes: Vec<(String, usize)> = batches(rows)
            .into_iter()
            .map(|(pk, ops)| (pk, ops.len()))
            .collect();
        assert_eq!(
            sizes,
            vec![
                ("a".into(), 100),
                ("a".into(), 50),
                ("b".into(), 100),
                ("b".into(), 50)
            ]
        );

        let big: Vec<Entity> = (0..10)
            .map(|i| {
                let mut e = Entity::new("p", format!("{i}"));
                e.properties
                    .insert("Blob".into(), json!("x".repeat(900_000)));
                e
            })
            .collect();
        let groups = batches(big);
        assert!(groups.len() >= 3, "{} batches for 9 MB", groups.len());
        for (pk, ops) in &groups {
            crate::storage::validate_batch(pk, ops).unwrap();
        }
    }

    #[test]
    fn range_filter_is_exact() {
        let f = range_filter(&("b".into(), "5".into()), &("d".into(), "2".into()));
        let inside = [("b", "5"), ("b", "9"), ("c", "0"), ("d", "0"), ("d", "2")];
        let outside = [("b", "4"), ("a", "9"), ("d", "3"), ("e", "0")];
        assert!(inside.iter().all(|(p, r)| f.matches(p, r)));
        assert!(outside.iter().all(|(p, r)| !f.matches(p, r)));
        let same = range_filter(&("b".into(), "2".into()), &("b".into(), "4".into()));
        assert!(same.matches("b", "3") && !same.matches("b", "5") && !same.matches("c", "3"));
    }
}
