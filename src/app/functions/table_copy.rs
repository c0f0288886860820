//! `TableCopy` (queue trigger): copies one work item — the rows of one scanned page — to the
//! destination. The key range is re-read once with every column, then written with
//! upsert-replace in same-partition entity group transactions (≤ 100 operations, < 4 MiB),
//! several in flight. Typed properties travel with their `@odata.type`; read-only metadata is
//! dropped. Re-running the item rewrites the same rows, so duplicates are harmless.

use futures::stream::{self, StreamExt, TryStreamExt};

use std::collections::HashSet;

use crate::app::messages::{ChildSpec, CopyMessage, CopyWork};
use crate::app::state::AppState;
use crate::app::work::{Begun, Work, WorkError, WorkOutcome};
use crate::storage::{
    BatchOperation, CompareOp, Entity, Filter, Query, QueueStore, StorageError, StorageErrorKind,
    TableStore, UnaddressableRow, MAX_BATCH_BYTES, MAX_BATCH_OPERATIONS, MAX_TAKE,
};

/// The exact filter for rows from `from` to `to` inclusive in (PK, RK) order.
pub fn range_filter(from: &(String, String), to: &(String, String)) -> Filter {
    key_range_filter(from, CompareOp::Ge, to)
}

/// The exact filter for rows after `after` (exclusive) up to `to` inclusive in (PK, RK) order.
pub fn range_filter_after(after: &(String, String), to: &(String, String)) -> Filter {
    key_range_filter(after, CompareOp::Gt, to)
}

/// Rows whose RowKey compares with `start_op` to the start row's within its partition, the
/// partitions in between, and the end partition's rows up to `to` inclusive.
fn key_range_filter(
    start: &(String, String),
    start_op: CompareOp,
    to: &(String, String),
) -> Filter {
    if start.0 == to.0 {
        return Filter::and(vec![
            Filter::pk(CompareOp::Eq, start.0.clone()),
            Filter::rk(start_op, start.1.clone()),
            Filter::rk(CompareOp::Le, to.1.clone()),
        ]);
    }
    Filter::or(vec![
        Filter::and(vec![
            Filter::pk(CompareOp::Eq, start.0.clone()),
            Filter::rk(start_op, start.1.clone()),
        ]),
        Filter::and(vec![
            Filter::pk(CompareOp::Gt, start.0.clone()),
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

/// Most queries one copy invocation sends. Its range held at most 1,000 rows when it was
/// scanned, but pages may come back short or empty, and rows may have been inserted since.
const MAX_COPY_QUERIES: usize = 16;
/// Most rows one copy invocation reads and writes; the rest of a range that grew since it was
/// scanned is handed on as a new work item ([`CopyWork::After`]). Two pages, not one: a range
/// scanned as one full page comes back as 1,000 rows *with* a continuation (the service sends
/// one whenever `$top` is reached), and reading its empty last page costs one query, where
/// handing it on would cost a whole work item.
const MAX_COPY_ROWS: usize = 2 * MAX_TAKE as usize;

/// What one copy item reads: its filter, the rows it must find (reference split only), and the
/// end of its range (ranges that grew can be continued; named rows cannot).
struct Plan<'a> {
    filter: Filter,
    expected: Option<HashSet<&'a String>>,
    end: Option<&'a (String, String)>,
    first_pk: &'a str,
}

fn plan(work: &CopyWork) -> Option<Plan<'_>> {
    Some(match work {
        CopyWork::Range { from, to } => Plan {
            filter: range_filter(from, to),
            expected: None,
            end: Some(to),
            first_pk: &from.0,
        },
        CopyWork::After { after, to } => Plan {
            filter: range_filter_after(after, to),
            expected: None,
            end: Some(to),
            first_pk: &after.0,
        },
        CopyWork::Rows { pk, row_keys } => {
            let (first, last) = (row_keys.first()?, row_keys.last()?);
            Plan {
                filter: Filter::and(vec![
                    Filter::pk(CompareOp::Eq, pk.clone()),
                    Filter::rk(CompareOp::Ge, first.clone()),
                    Filter::rk(CompareOp::Le, last.clone()),
                ]),
                expected: Some(row_keys.iter().collect()),
                end: None,
                first_pk: pk,
            }
        }
    })
}

/// Rows read for one copy item, within [`MAX_COPY_QUERIES`] and [`MAX_COPY_ROWS`].
struct Read {
    rows: Vec<Entity>,
    unaddressable: Vec<UnaddressableRow>,
    /// Whether the range has rows beyond `rows` (the budget ran out first).
    more: bool,
}

async fn read_range<S: TableStore>(
    source: &S,
    table: &str,
    filter: Filter,
) -> Result<Read, WorkError> {
    let mut query = Query {
        filter: Some(filter),
        top: Some(MAX_TAKE),
        select: None,
        continuation: None,
    };
    let mut read = Read {
        rows: Vec::new(),
        unaddressable: Vec::new(),
        more: false,
    };
    for _ in 0..MAX_COPY_QUERIES {
        let page = source.query_page(table, &query).await?;
        read.rows.extend(page.entities);
        read.unaddressable.extend(page.unaddressable);
        match page.continuation {
            None => return Ok(read),
            Some(c) if read.rows.len() >= MAX_COPY_ROWS => {
                let _ = c;
                read.more = true;
                return Ok(read);
            }
            Some(c) => query.continuation = Some(c),
        }
    }
    read.more = true;
    Ok(read)
}

impl Work for CopyMessage {
    async fn execute<T: TableStore + Clone, Q: QueueStore + Clone>(
        state: &AppState<T, Q>,
        begun: &Begun<Self>,
    ) -> Result<WorkOutcome, WorkError> {
        let scan = &*begun.scan;
        let destination = scan
            .destination
            .as_ref()
            .ok_or_else(|| WorkError::Failed("copy work without a destination".into()))?;
        let Some(plan) = plan(&begun.message.work) else {
            return Ok(WorkOutcome::default());
        };
        if let Some(prefix) = &state.config.test_fail_prefix {
            if plan.first_pk.starts_with(prefix.as_str()) {
                return Err(WorkError::Failed(format!(
                    "forced failure for partition {:?} (TABLESCAN_TEST_FAIL_PREFIX)",
                    plan.first_pk
                )));
            }
        }
        let source = state.counted_table(&scan.source.connection, &begun.requests)?;
        let target = state.counted_table(&destination.connection, &begun.requests)?;

        let Read {
            mut rows,
            unaddressable,
            more,
        } = read_range(&source, &scan.source.table, plan.filter).await?;
        let mut outcome = WorkOutcome::default();
        if let Some(expected) = &plan.expected {
            rows.retain(|e| expected.contains(&e.row_key));
            if rows.len() != expected.len() {
                return Err(WorkError::Failed(format!(
                    "expected {} rows of partition {:?}, found {}{}",
                    expected.len(),
                    plan.first_pk,
                    rows.len(),
                    if more { " within the read budget" } else { "" }
                )));
            }
        } else if more {
            let (Some(last), Some(end)) = (rows.last(), plan.end) else {
                return Err(WorkError::Storage(StorageError::new(
                    StorageErrorKind::Transient,
                    format!("no rows in {MAX_COPY_QUERIES} pages of the range; trying again later"),
                )));
            };
            outcome.children.push(ChildSpec::Copy(CopyWork::After {
                after: (last.partition_key.clone(), last.row_key.clone()),
                to: end.clone(),
            }));
        }
        let written = rows.len() as i64;
        let target = &target;
        stream::iter(batches(rows))
            .map(
                |(pk, ops)| async move { target.submit_batch(&destination.table, &pk, &ops).await },
            )
            .buffer_unordered(state.config.copy_concurrency)
            .try_collect::<Vec<()>>()
            .await?;
        // Every other row is written; a row that cannot be addressed fails the item, named exactly.
        if let Some(first) = unaddressable.first() {
            return Err(WorkError::Permanent(format!(
                "copied every other row, but {first}{}",
                match unaddressable.len() {
                    1 => String::new(),
                    n => format!(" (and {} more such rows)", n - 1),
                }
            )));
        }
        outcome.delta.rows_written = written;
        Ok(outcome)
    }
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
                e.properties.insert("Blob", json!("x".repeat(30_000)));
                for i in 0..28 {
                    e.properties
                        .insert(format!("B{i}"), json!("y".repeat(16_000)));
                }
                e
            })
            .collect();
        let groups = batches(big);
        assert!(groups.len() >= 2, "{} batches for 4.8 MB", groups.len());
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
        let after = range_filter_after(&("b".into(), "5".into()), &("d".into(), "2".into()));
        assert!(!after.matches("b", "5") && after.matches("b", "6") && after.matches("d", "2"));
        assert!(!after.matches("d", "3") && after.matches("c", "") && !after.matches("a", "9"));
        let same = range_filter_after(&("b".into(), "2".into()), &("b".into(), "4".into()));
        assert!(same.matches("b", "3") && !same.matches("b", "2") && !same.matches("b", "5"));
        let same = range_filter(&("b".into(), "2".into()), &("b".into(), "4".into()));
        assert!(same.matches("b", "3") && !same.matches("b", "5") && !same.matches("c", "3"));
    }
}
