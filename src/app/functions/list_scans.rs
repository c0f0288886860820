//! `ListScans`: `GET /api/scans[?top=N]` — the most recent scans, newest first.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::Json;
use futures::future::try_join_all;
use serde_json::{json, Value};

use crate::app::error::ApiError;
use crate::app::state::AppState;
use crate::storage::{
    BatchOperation, Entity, Page, Query as TableQuery, QueueStore, StorageResult, TableStore,
};

use super::status::status_json;

const DEFAULT_TOP: u32 = 20;
const MAX_TOP: u32 = 100;

/// Most query pages one listing reads. The scans table holds only scan rows, so one page of
/// `top` rows normally answers; empty pages (at partition-server boundaries) are the only reason
/// to read more, and however many the table's shape would produce, a listing stops here.
const MAX_LIST_PAGES: usize = 8;

pub async fn handle<T: TableStore + Clone, Q: QueueStore + Clone>(
    State(state): State<Arc<AppState<T, Q>>>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let top = match query.get("top") {
        None => DEFAULT_TOP,
        Some(v) => v
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=MAX_TOP).contains(n))
            .ok_or_else(|| ApiError::field("top", format!("must be 1..={MAX_TOP}, got {v:?}")))?,
    };
    let capped = PageCapped::new(state.bookkeeping().clone(), MAX_LIST_PAGES);
    let records = match state.tracker_on(&capped).list_scans(top).await {
        Err(e) if e.is_not_found() => Vec::new(), // no scan was ever started
        other => other?,
    };
    if capped.cut() {
        tracing::warn!(
            found = records.len(),
            top,
            "listing stopped after {MAX_LIST_PAGES} pages of the scans table"
        );
    }
    let tracker = state.tracker_on(state.bookkeeping());
    let scans = try_join_all(records.iter().map(|r| {
        let tracker = &tracker;
        async move { Ok::<_, ApiError>(status_json(r, &tracker.totals(&r.id, r.shards).await?)) }
    }))
    .await?;
    Ok(Json(json!({ "scans": scans })))
}

/// A store that answers at most `max_pages` queries, the last without its continuation, so a
/// caller that follows continuations stops there.
struct PageCapped<T> {
    inner: T,
    max_pages: usize,
    pages: AtomicUsize,
    cut: AtomicBool,
}

impl<T> PageCapped<T> {
    fn new(inner: T, max_pages: usize) -> Self {
        PageCapped {
            inner,
            max_pages: max_pages.max(1),
            pages: AtomicUsize::new(0),
            cut: AtomicBool::new(false),
        }
    }

    /// Whether a continuation was dropped.
    fn cut(&self) -> bool {
        self.cut.load(Ordering::SeqCst)
    }
}

impl<T: TableStore> TableStore for PageCapped<T> {
    async fn query_page(&self, table: &str, query: &TableQuery) -> StorageResult<Page> {
        let n = self.pages.fetch_add(1, Ordering::SeqCst) + 1;
        if n > self.max_pages {
            // Only a caller ignoring the missing continuation gets here.
            self.cut.store(true, Ordering::SeqCst);
            return Ok(Page {
                entities: Vec::new(),
                continuation: None,
            });
        }
        let mut page = self.inner.query_page(table, query).await?;
        if n == self.max_pages && page.continuation.take().is_some() {
            self.cut.store(true, Ordering::SeqCst);
        }
        Ok(page)
    }
    async fn submit_batch(
        &self,
        table: &str,
        partition_key: &str,
        operations: &[BatchOperation],
    ) -> StorageResult<()> {
        self.inner
            .submit_batch(table, partition_key, operations)
            .await
    }
    async fn get_entity(
        &self,
        table: &str,
        partition_key: &str,
        row_key: &str,
    ) -> StorageResult<Option<(Entity, String)>> {
        self.inner.get_entity(table, partition_key, row_key).await
    }
    async fn create_table(&self, table: &str) -> StorageResult<bool> {
        self.inner.create_table(table).await
    }
    async fn delete_table(&self, table: &str) -> StorageResult<bool> {
        self.inner.delete_table(table).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::tracking::Tracker;
    use crate::storage::Continuation;

    /// A scans table that only ever answers empty pages with a continuation.
    #[derive(Clone, Default)]
    struct Endless {
        queries: Arc<AtomicUsize>,
    }

    impl TableStore for Endless {
        async fn query_page(&self, _: &str, _: &TableQuery) -> StorageResult<Page> {
            self.queries.fetch_add(1, Ordering::SeqCst);
            Ok(Page {
                entities: Vec::new(),
                continuation: Some(Continuation {
                    next_partition_key: "next".into(),
                    next_row_key: None,
                }),
            })
        }
        async fn submit_batch(&self, _: &str, _: &str, _: &[BatchOperation]) -> StorageResult<()> {
            unreachable!()
        }
        async fn get_entity(
            &self,
            _: &str,
            _: &str,
            _: &str,
        ) -> StorageResult<Option<(Entity, String)>> {
            unreachable!()
        }
        async fn create_table(&self, _: &str) -> StorageResult<bool> {
            unreachable!()
        }
        async fn delete_table(&self, _: &str) -> StorageResult<bool> {
            unreachable!()
        }
    }

    #[tokio::test]
    async fn a_listing_reads_a_bounded_number_of_pages() {
        let endless = Endless::default();
        let capped = PageCapped::new(endless.clone(), MAX_LIST_PAGES);
        let scans = Tracker::new(&capped, "Scans", "Work")
            .list_scans(MAX_TOP)
            .await
            .unwrap();
        assert!(scans.is_empty());
        assert!(capped.cut());
        assert_eq!(endless.queries.load(Ordering::SeqCst), MAX_LIST_PAGES);
    }
}
