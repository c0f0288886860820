//! Range items for drivers (copy, delete, a filtered count, export): splitting scanned
//! segments into [`RangeWork`] items ([`page_items`]), the one bounded way to re-read such an
//! item ([`read_item`]: at most [`MAX_ITEM_QUERIES`] queries and [`MAX_ITEM_ROWS`] rows, the
//! rest of a range that grew since it was scanned handed on as a [`RangeWork::After`] item),
//! and writing rows in same-partition batches ([`batches`]).
//!
//! Invariant: an item re-reads exactly its rows (its filter: `job::range`), never a row
//! outside.

use std::collections::HashSet;

use crate::app::job::range::{range_filter, range_filter_after};
use crate::app::job::{
    item_child, Begun, Driver, RangeWork, WorkError, WorkOutcome, WorkSplit, MAX_ITEM_QUERIES,
    MAX_ITEM_ROWS,
};
use crate::app::messages::ItemMessage;
use crate::app::state::{AppState, Counted};
use crate::storage::stores::Stores;
use crate::storage::{
    odata, BatchOperation, CompareOp, Entity, Filter, Query, StorageError, StorageErrorKind,
    TableStore, UnaddressableRow, MAX_BATCH_BYTES, MAX_BATCH_OPERATIONS, MAX_MESSAGE_TEXT,
    MAX_TAKE,
};

/// Splits one scanned segment (keys only, in order) into range work items.
pub fn page_items(split: WorkSplit, rows: &[Entity]) -> Vec<RangeWork> {
    match split {
        // A segment holds one page, or several (segmentsPerFirstPrefix > 1, a page joined with
        // the rest of its last partition, the pages of one query): items of up to
        // MAX_ITEM_ROWS rows, so each is re-read in as few pages as its rows need (a read stops
        // at the item's last key) and the per-item bookkeeping is paid per 2,000 rows.
        WorkSplit::Page => rows
            .chunks(MAX_ITEM_ROWS)
            .map(|chunk| {
                let (first, last) = (&chunk[0], &chunk[chunk.len() - 1]);
                RangeWork::Range {
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

/// Bytes a message adds around its work: the envelope and the scan id (generous).
const ENVELOPE_ALLOWANCE: usize = 2048;

/// Halves a partition's row-key list until each message fits the queue (as the reference does).
fn split_rows(pk: &str, row_keys: Vec<String>, out: &mut Vec<RangeWork>) {
    let work = RangeWork::Rows {
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
    let RangeWork::Rows { row_keys, .. } = work else {
        unreachable!()
    };
    if row_keys.len() == 1 {
        out.push(RangeWork::Rows {
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

/// Splits rows (in key order) into same-partition batches of `op(row)` within the transaction
/// limits.
pub fn batches_of(
    rows: Vec<Entity>,
    op: impl Fn(Entity) -> BatchOperation,
) -> Vec<(String, Vec<BatchOperation>)> {
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
        out.last_mut().expect("pushed above").1.push(op(row));
    }
    out
}

/// Upserts of `rows` in same-partition batches (see [`batches_of`]).
pub fn batches(rows: Vec<Entity>) -> Vec<(String, Vec<BatchOperation>)> {
    batches_of(rows, BatchOperation::Upsert)
}

/// What one range item reads: its filter, the rows it must find (reference split only), and the
/// end of its range (ranges that grew can be continued; named rows cannot).
struct Plan<'a> {
    filter: Filter,
    expected: Option<HashSet<&'a String>>,
    end: Option<&'a (String, String)>,
    first_pk: &'a str,
}

fn plan(work: &RangeWork) -> Option<Plan<'_>> {
    Some(match work {
        RangeWork::Range { from, to } => Plan {
            filter: range_filter(from, to),
            expected: None,
            end: Some(to),
            first_pk: &from.0,
        },
        RangeWork::After { after, to } => Plan {
            filter: range_filter_after(after, to),
            expected: None,
            end: Some(to),
            first_pk: &after.0,
        },
        RangeWork::Rows { pk, row_keys } => {
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

/// How a range item is re-read.
#[derive(Debug, Clone, Default)]
pub struct ReadSpec {
    /// `$select`: `None` reads every column, `Some(vec![])` the keys only.
    pub select: Option<Vec<String>>,
    /// The scan's row filter, applied by the service inside the item's key range.
    pub filter: Option<odata::Expr>,
    /// `TABLESCAN_TEST_FAIL_PREFIX`: items starting in a partition with this prefix fail.
    pub fail_prefix: Option<String>,
}

/// The rows of one range item, read within the bounds.
#[derive(Debug, Default)]
pub struct ItemRows {
    pub rows: Vec<Entity>,
    /// Rows whose keys cannot be addressed: the driver handles the others, then fails the item
    /// naming them ([`unaddressable_error`]).
    pub unaddressable: Vec<UnaddressableRow>,
    /// The rest of the range, when the bounds ran out first: hand it on as a child.
    pub next: Option<RangeWork>,
}

/// Re-reads one range item within [`MAX_ITEM_QUERIES`] and [`MAX_ITEM_ROWS`]. Two pages, not
/// one: a range scanned as one full page comes back as 1,000 rows *with* a continuation (the
/// service sends one whenever `$top` is reached), and reading its empty last page costs one
/// query, where handing it on would cost a whole work item.
pub async fn read_item<S: TableStore>(
    source: &S,
    table: &str,
    work: &RangeWork,
    spec: &ReadSpec,
) -> Result<ItemRows, WorkError> {
    let Some(plan) = plan(work) else {
        return Ok(ItemRows::default());
    };
    if let Some(prefix) = &spec.fail_prefix {
        if plan.first_pk.starts_with(prefix.as_str()) {
            return Err(WorkError::Failed(format!(
                "forced failure for partition {:?} (TABLESCAN_TEST_FAIL_PREFIX)",
                plan.first_pk
            )));
        }
    }
    // `(<key range>) and (<filter>)`, both rendered from their parsed forms.
    let filter = match &spec.filter {
        Some(expr) => Filter::and(vec![plan.filter, Filter::Where(expr.clone())]),
        None => plan.filter,
    };
    let mut query = Query {
        filter: Some(filter),
        top: Some(MAX_TAKE),
        select: spec.select.clone(),
        continuation: None,
    };
    let mut read = ItemRows::default();
    let mut more = true;
    for _ in 0..MAX_ITEM_QUERIES {
        let page = source.query_page(table, &query).await?;
        read.rows.extend(page.entities);
        read.unaddressable.extend(page.unaddressable);
        match page.continuation {
            None => {
                more = false;
                break;
            }
            // The range's last key was read: nothing can follow it (saves the empty last page
            // of an item whose rows fill whole pages).
            Some(_) if ends_range(&read.rows, plan.end) => {
                more = false;
                break;
            }
            Some(_) if read.rows.len() >= MAX_ITEM_ROWS => break,
            Some(c) => query.continuation = Some(c),
        }
    }
    if let Some(expected) = &plan.expected {
        read.rows.retain(|e| expected.contains(&e.row_key));
        if read.rows.len() != expected.len() {
            return Err(WorkError::Failed(format!(
                "expected {} rows of partition {:?}, found {}{}",
                expected.len(),
                plan.first_pk,
                read.rows.len(),
                if more { " within the read budget" } else { "" }
            )));
        }
    } else if more {
        let (Some(last), Some(end)) = (read.rows.last(), plan.end) else {
            return Err(WorkError::Storage(StorageError::new(
                StorageErrorKind::Transient,
                format!("no rows in {MAX_ITEM_QUERIES} pages of the range; trying again later"),
            )));
        };
        read.next = Some(RangeWork::After {
            after: (last.partition_key.clone(), last.row_key.clone()),
            to: end.clone(),
        });
    }
    Ok(read)
}

/// Whether the last row read is the range's inclusive end key (rows come in key order, so no
/// row of the range can follow).
fn ends_range(rows: &[Entity], end: Option<&(String, String)>) -> bool {
    match (rows.last(), end) {
        (Some(last), Some((pk, rk))) => last.partition_key == *pk && last.row_key == *rk,
        _ => false,
    }
}

/// What a driver's range item starts with: its source table (counted for the item), its rows
/// (read by [`read_item`] with `select` and the scan's filter), and its outcome so far — the
/// rest of a range that grew handed on as a child of driver `D`, `rowsMatched` counted.
pub async fn begin_range_item<D: Driver<Item = RangeWork>, S: Stores>(
    state: &AppState<S>,
    begun: &Begun<ItemMessage>,
    item: &RangeWork,
    select: Option<Vec<String>>,
) -> Result<(Counted<S::Table>, ItemRows, WorkOutcome), WorkError> {
    let scan = &*begun.scan;
    let source = state.counted_table(&scan.source.connection, &begun.requests)?;
    let spec = super::read_spec(state, scan, select)?;
    let read = read_item(&source, &scan.source.table, item, &spec).await?;
    let mut outcome = WorkOutcome::default();
    if let Some(next) = &read.next {
        outcome.children.push(item_child::<D>(next)?);
    }
    outcome.delta.rows_matched = read.rows.len() as i64;
    Ok((source, read, outcome))
}

/// The error of an item whose other rows were handled but some could not be addressed.
pub fn unaddressable_error(done: &str, unaddressable: &[UnaddressableRow]) -> Option<WorkError> {
    let first = unaddressable.first()?;
    Some(WorkError::Permanent(format!(
        "{done} every other row, but {first}{}",
        match unaddressable.len() {
            1 => String::new(),
            n => format!(" (and {} more such rows)", n - 1),
        }
    )))
}

/// The key ranges of the rows of `runs` after the first `done` (in order), for work items to
/// read them again: the rest of the run the cut falls in (after its last done row), then each
/// later run whole. They cover exactly those rows among the table's rows as read (a run is
/// contiguous: no row lies between its first and last but its own), and rows inserted among
/// them since.
pub fn rest_of(runs: &[Vec<Entity>], done: usize) -> Vec<RangeWork> {
    let key = |row: &Entity| (row.partition_key.clone(), row.row_key.clone());
    let mut skip = done;
    let mut rest = Vec::new();
    for run in runs {
        let (Some(first), Some(last)) = (run.first(), run.last()) else {
            continue;
        };
        if skip >= run.len() {
            skip -= run.len();
            continue;
        }
        rest.push(match skip {
            0 => RangeWork::Range {
                from: key(first),
                to: key(last),
            },
            n => RangeWork::After {
                after: key(&run[n - 1]),
                to: key(last),
            },
        });
        skip = 0;
    }
    rest
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::messages::{self, ItemJson, ItemMessage};
    use proptest::prelude::*;
    use serde_json::json;

    proptest! {
        /// `rest_of` against an oracle: a table of keys (partition keys that are prefixes of
        /// each other, empty ones), runs cut from it with rows between them left to other
        /// steps, and any number of rows done: the rest's ranges match exactly the rows of the
        /// runs after the first `done`, and no row between or outside the runs.
        #[test]
        fn the_rest_covers_exactly_the_rows_not_done(
            keys in proptest::collection::btree_set(
                (prop::sample::select(vec!["", "a", "ab", "b", "b\u{0}"]), "[0-9]{0,2}"),
                1..40,
            ),
            cuts in proptest::collection::vec(0usize..4, 1..40),
            done in 0usize..45,
        ) {
            let table: Vec<(String, String)> = keys
                .into_iter()
                .map(|(pk, rk)| (pk.to_string(), rk))
                .collect();
            // Each key goes to the current run (0), ends it (1), is left to another step
            // between runs (2), or starts a new run (3).
            let mut runs: Vec<Vec<Entity>> = vec![Vec::new()];
            for (i, (pk, rk)) in table.iter().enumerate() {
                match cuts[i % cuts.len()] {
                    2 => runs.push(Vec::new()),
                    c => {
                        if c == 3 {
                            runs.push(Vec::new());
                        }
                        runs.last_mut().unwrap().push(Entity::new(pk.clone(), rk.clone()));
                        if c == 1 {
                            runs.push(Vec::new());
                        }
                    }
                }
            }
            let in_runs: Vec<&Entity> = runs.iter().flatten().collect();
            let expected: Vec<(String, String)> = in_runs
                .iter()
                .skip(done)
                .map(|e| (e.partition_key.clone(), e.row_key.clone()))
                .collect();
            let filters: Vec<Filter> = rest_of(&runs, done)
                .iter()
                .map(|w| plan(w).expect("a range").filter)
                .collect();
            let covered: Vec<(String, String)> = table
                .iter()
                .filter(|(pk, rk)| filters.iter().any(|f| f.matches(pk, rk)))
                .cloned()
                .collect();
            prop_assert_eq!(covered, expected);
        }
    }

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
    fn reference_split_is_one_item_per_partition_and_fits_the_queue() {
        let mut rows = vec![
            Entity::new("a", "1"),
            Entity::new("a", "2"),
            Entity::new("b", "1"),
        ];
        let items = page_items(WorkSplit::PartitionKey, &rows);
        assert_eq!(items.len(), 2);
        rows.clear();
        for i in 0..1000 {
            rows.push(Entity::new("big", format!("{i:04}-{}", "r".repeat(200))));
        }
        let items = page_items(WorkSplit::PartitionKey, &rows);
        assert!(items.len() >= 4, "{} items", items.len());
        let total: usize = items
            .iter()
            .map(|w| {
                if let RangeWork::Rows { row_keys, .. } = w {
                    row_keys.len()
                } else {
                    0
                }
            })
            .sum();
        assert_eq!(total, 1000);
        for work in items {
            messages::encode(&ItemMessage {
                scan_id: "x".into(),
                work: ItemJson::from_item(&work).unwrap(),
                shard: Some(15),
            })
            .expect("fits in a queue message");
        }
        assert_eq!(page_items(WorkSplit::Page, &rows).len(), 1);
        // Several pages in one segment (segmentsPerFirstPrefix > 1, joined segments) give items
        // of ≤ 2,000 rows.
        let many: Vec<Entity> = (0..4500)
            .map(|i| Entity::new("p", format!("{i:05}")))
            .collect();
        let items = page_items(WorkSplit::Page, &many);
        assert_eq!(items.len(), 3);
        assert_eq!(
            items[1],
            RangeWork::Range {
                from: ("p".into(), "02000".into()),
                to: ("p".into(), "03999".into())
            }
        );
    }
}
