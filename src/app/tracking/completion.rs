//! Finishing work items' rows: `pending`/`expanded` → `done`/`failed`/`dropped`, atomically with
//! their shard's counter row and guarded by the row's ETag (invariant 3 in [`super`]); and the
//! driver results kept on finished rows.

use futures::future::try_join_all;

use super::codec::{diagnostic, get_str, put_str, put_time};
use super::counters::Counters;
use super::work_rows::{Completion, WorkState, RESULT_PROPERTY};
use super::{again, contention, shard_partition, Tracker};
use crate::retry::Verdict;
use crate::storage::{
    BatchOperation, CompareOp, Entity, Filter, Query, StorageError, StorageErrorKind, TableStore,
    MAX_TAKE,
};

impl<T: TableStore> Tracker<'_, T> {
    /// Marks a work item finished (or failed) and adds its counters, atomically with its shard's
    /// counter row. `delta.completed` is set here. `result`: the driver's result for the item
    /// (a short string, see [`RESULT_PROPERTY`]), kept on its finished row. `counter`: the
    /// shard's counter as this item last wrote it (see [`Tracker::record_outcome`]), tried
    /// before reading it again.
    #[allow(clippy::too_many_arguments)]
    pub async fn complete(
        &self,
        scan_id: &str,
        shard: u32,
        work_id: &str,
        work_etag: &str,
        mut delta: Counters,
        failure: Option<&str>,
        result: Option<&str>,
        counter: Option<(Counters, String)>,
    ) -> Result<Completion, StorageError> {
        delta.failed = i64::from(failure.is_some());
        delta.messages = 1;
        let state = if failure.is_some() { "failed" } else { "done" };
        let finish = Finish {
            state,
            error: failure,
            result,
            counter,
        };
        self.finish_work(scan_id, shard, work_id, work_etag, delta, finish)
            .await
    }

    /// The driver results kept on the finished rows of scan `scan_id` ([`Tracker::complete`]'s
    /// `result`), in no particular order: one query over the scan's shard partitions, a page
    /// per 1,000 results (and wherever the service cuts a page at a partition boundary); if
    /// the service keeps cutting it short, one query per shard instead, the shards read
    /// concurrently. More than `max` results is an error (the caller's bound).
    pub async fn work_results(
        &self,
        scan_id: &str,
        shards: u32,
        max: usize,
    ) -> Result<Vec<String>, StorageError> {
        let has_result = has_result();
        let every_shard = every_shard_result(scan_id, shards);
        // Bounded: a page per 1,000 results, plus one per partition boundary the service may
        // cut at, plus the last.
        let pages = max / MAX_TAKE as usize + shards as usize + 2;
        let all = self.results_of(every_shard, max, pages).await?;
        let out = match all {
            Some(out) => out,
            None => {
                let reads = (0..shards).map(|shard| {
                    let filter = Filter::and(vec![
                        Filter::pk(CompareOp::Eq, shard_partition(scan_id, shard)),
                        Filter::Where(has_result.clone()),
                    ]);
                    self.results_of(filter, max, usize::MAX)
                });
                let mut out = Vec::new();
                for results in try_join_all(reads).await? {
                    out.extend(results.unwrap_or_default());
                    if out.len() > max {
                        break;
                    }
                }
                out
            }
        };
        if out.len() > max {
            return Err(StorageError::invalid_input(format!(
                "scan {scan_id} has more than {max} work item results"
            )));
        }
        Ok(out)
    }

    /// Some of the driver results of scan `scan_id` (a dry run's sample): the first `n` one
    /// query over its shard partitions finds (`$top` `n`), following its continuations for at
    /// most a page per shard and two more; fewer if it has fewer.
    pub async fn some_work_results(
        &self,
        scan_id: &str,
        shards: u32,
        n: u32,
    ) -> Result<Vec<String>, StorageError> {
        let mut query = Query {
            filter: Some(every_shard_result(scan_id, shards)),
            top: Some(n.clamp(1, MAX_TAKE)),
            select: Some(vec![RESULT_PROPERTY.to_string()]),
            continuation: None,
        };
        let mut out = Vec::new();
        for _ in 0..shards as usize + 2 {
            let page = self.store.query_page(self.work_table, &query).await?;
            let results = page.entities.iter();
            out.extend(results.filter_map(|e| get_str(&e.properties, RESULT_PROPERTY)));
            match page.continuation {
                Some(c) if out.len() < n as usize => query.continuation = Some(c),
                _ => break,
            }
        }
        out.truncate(n as usize);
        Ok(out)
    }

    /// The results matching `filter`, at most `max + 1` of them; `None` if `pages` query pages
    /// did not reach the end.
    async fn results_of(
        &self,
        filter: Filter,
        max: usize,
        pages: usize,
    ) -> Result<Option<Vec<String>>, StorageError> {
        let mut query = Query {
            filter: Some(filter),
            top: Some(MAX_TAKE),
            select: Some(vec![RESULT_PROPERTY.to_string()]),
            continuation: None,
        };
        let mut out = Vec::new();
        // Bounded by `pages`, and by `max` for a single partition: there each page but the
        // last holds rows, at most 1,000 of them.
        for _ in 0..pages {
            let page = self.store.query_page(self.work_table, &query).await?;
            out.extend(
                page.entities
                    .iter()
                    .filter_map(|e| get_str(&e.properties, RESULT_PROPERTY)),
            );
            match page.continuation {
                Some(c) if out.len() <= max => query.continuation = Some(c),
                _ => return Ok(Some(out)),
            }
        }
        Ok(None)
    }

    /// Finishes a work item of an ended scan without running it: its row is marked `dropped`
    /// and `Completed` and `Dropped` grow by one, atomically with its shard's counter row and
    /// guarded by the row's ETag, so a redelivery or a concurrent completion cannot count it
    /// twice.
    pub async fn drop_work(
        &self,
        scan_id: &str,
        shard: u32,
        work_id: &str,
        work_etag: &str,
    ) -> Result<Completion, StorageError> {
        let delta = Counters {
            dropped: 1,
            ..Counters::default()
        };
        let finish = Finish {
            state: "dropped",
            error: None,
            result: None,
            counter: None,
        };
        self.finish_work(scan_id, shard, work_id, work_etag, delta, finish)
            .await
    }

    /// Replaces an unfinished row (at `work_etag`) with a finished one in `finish.state` and adds
    /// `delta` plus one completion to the shard's counter, in one transaction.
    async fn finish_work(
        &self,
        scan_id: &str,
        shard: u32,
        work_id: &str,
        work_etag: &str,
        mut delta: Counters,
        finish: Finish<'_>,
    ) -> Result<Completion, StorageError> {
        let Finish {
            state,
            error,
            result,
            mut counter,
        } = finish;
        let pk = shard_partition(scan_id, shard);
        delta.completed = 1;
        let what = format!("counter of {pk}");
        let mut schedule = contention();
        loop {
            let (counters, counter_etag) = match counter.take() {
                Some(known) => known,
                None => self.read_counter(scan_id, shard).await?,
            };
            let updated = counters.plus(&delta);
            let mut row = Entity::new(pk.clone(), work_id);
            put_str(&mut row.properties, "State", state);
            put_time(&mut row.properties, "FinishedAt", self.now());
            if let Some(e) = error {
                put_str(&mut row.properties, "Error", &diagnostic(e));
            }
            if let Some(result) = result {
                put_str(&mut row.properties, RESULT_PROPERTY, result);
            }
            if let Err(e) = row.check_limits() {
                return Err(StorageError::invalid_input(format!(
                    "the result of {work_id} cannot be recorded: {}",
                    e.message
                )));
            }
            let ops = [
                // Replace, not merge: the recorded outcome is no longer needed.
                BatchOperation::Replace {
                    entity: row,
                    etag: Some(work_etag.to_string()),
                },
                BatchOperation::Replace {
                    entity: updated.to_entity(&pk),
                    etag: Some(counter_etag),
                },
            ];
            match self.store.submit_batch(self.work_table, &pk, &ops).await {
                Ok(()) => {
                    return Ok(Completion::Committed {
                        shard_idle: updated.pending() == 0,
                    })
                }
                Err(e)
                    if matches!(
                        e.kind,
                        StorageErrorKind::PreconditionFailed | StorageErrorKind::NotFound
                    ) =>
                {
                    match e.failed_operation {
                        Some(0) => return Ok(Completion::Duplicate),
                        Some(_) => {}
                        None => match self.work_state(scan_id, shard, work_id).await? {
                            Some(
                                WorkState::Pending { etag } | WorkState::Expanded { etag, .. },
                            ) if etag == work_etag => {}
                            _ => return Ok(Completion::Duplicate),
                        },
                    }
                    again(&mut schedule, Verdict::Retry, &what).await?;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// How [`Tracker::finish_work`] finishes a row: its state, error, and the counter as last known.
struct Finish<'a> {
    state: &'a str,
    error: Option<&'a str>,
    /// A driver's result for the item ([`RESULT_PROPERTY`]).
    result: Option<&'a str>,
    counter: Option<(Counters, String)>,
}

/// A finished work row with a driver result.
fn has_result() -> crate::storage::odata::Expr {
    crate::storage::odata::parse(&format!("{RESULT_PROPERTY} gt ''")).expect("a valid condition")
}

/// The finished work rows of every shard of scan `scan_id` with a driver result.
fn every_shard_result(scan_id: &str, shards: u32) -> Filter {
    Filter::and(vec![
        Filter::pk(CompareOp::Ge, shard_partition(scan_id, 0)),
        Filter::pk(CompareOp::Le, shard_partition(scan_id, shards.max(1) - 1)),
        Filter::Where(has_result()),
    ])
}
