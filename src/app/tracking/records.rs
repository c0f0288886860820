//! Scan records: one row per scan in the scans table, PK = scan id (newest first), RK = `scan`.

use serde_json::{json, Value};
use time::OffsetDateTime;

use super::codec::{diagnostic, format_time, get_str, get_time, put_str, put_time};
use super::{again, contention, Tracker};
use crate::app::job::context::ScanContext;
use crate::app::observe;
use crate::retry::Verdict;
use crate::storage::{
    BatchOperation, CompareOp, Entity, Filter, Query, StorageError, StorageErrorKind, TableStore,
};

/// Most query pages one scan listing reads. The scans table holds only scan rows, so one page
/// of `top` rows normally answers; empty pages are the only reason to read more.
const MAX_LIST_PAGES: usize = 8;
const SCAN_ROW: &str = "scan";

/// Lifecycle of a scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScanState {
    Running,
    Completed,
    Failed,
    Cancelled,
}

impl ScanState {
    pub fn as_str(self) -> &'static str {
        match self {
            ScanState::Running => "running",
            ScanState::Completed => "completed",
            ScanState::Failed => "failed",
            ScanState::Cancelled => "cancelled",
        }
    }

    fn parse(s: &str) -> Option<ScanState> {
        Some(match s {
            "running" => ScanState::Running,
            "completed" => ScanState::Completed,
            "failed" => ScanState::Failed,
            "cancelled" => ScanState::Cancelled,
            _ => return None,
        })
    }
}

/// A scan's record.
#[derive(Debug, Clone, PartialEq)]
pub struct ScanRecord {
    pub id: String,
    pub state: ScanState,
    /// The validated request, as JSON (no secrets: connections are app-setting names).
    pub request: Value,
    /// What the scan's work items read and write, recorded at start (`None` if unreadable: the
    /// scan's work cannot run).
    pub context: Option<ScanContext>,
    pub shards: u32,
    pub started_at: OffsetDateTime,
    pub completed_at: Option<OffsetDateTime>,
    pub error: Option<String>,
    pub etag: String,
}

impl ScanRecord {
    /// The context the scan's work items run with: the one recorded at start (a record without
    /// a usable one cannot run work).
    pub fn recorded_context(&self) -> Result<ScanContext, String> {
        match &self.context {
            Some(context) if context.scan_id == self.id && context.shards == self.shards => {
                Ok(context.clone())
            }
            _ => Err(format!(
                "scan {} has no usable recorded context (missing, unreadable or not its own)",
                self.id
            )),
        }
    }
}

impl<T: TableStore> Tracker<'_, T> {
    pub async fn insert_scan(&self, record: &ScanRecord) -> Result<(), StorageError> {
        let mut entity = Entity::new(record.id.clone(), SCAN_ROW);
        let p = &mut entity.properties;
        p.insert("State", json!(record.state.as_str()));
        p.insert("Request", json!(record.request.to_string()));
        p.insert("Shards", json!(record.shards));
        put_time(p, "StartedAt", record.started_at);
        if let Some(context) = &record.context {
            let context = serde_json::to_string(context).expect("contexts serialize");
            put_str(p, "Context", &context);
        }
        let inserted = match self
            .store
            .submit_batch(
                self.scans_table,
                &record.id,
                &[BatchOperation::Insert(entity)],
            )
            .await
        {
            // The adapter retried an insert that had succeeded (its answer was lost): it is ours
            // if it records the same request at the same time.
            Err(e) if e.kind == StorageErrorKind::Conflict => {
                match self.get_scan(&record.id).await? {
                    Some(existing)
                        if existing.request == record.request
                            && format_time(existing.started_at)
                                == format_time(record.started_at) =>
                    {
                        Ok(())
                    }
                    _ => Err(e),
                }
            }
            other => other,
        };
        if inserted.is_ok() {
            observe::scan_started(&record.id, record.context.as_ref());
        }
        inserted
    }

    fn parse_scan(entity: Entity, etag: String) -> Option<ScanRecord> {
        let p = &entity.properties;
        Some(ScanRecord {
            state: ScanState::parse(&get_str(p, "State")?)?,
            request: serde_json::from_str(&get_str(p, "Request")?).ok()?,
            context: get_str(p, "Context").and_then(|c| serde_json::from_str(&c).ok()),
            shards: p.get_value("Shards").and_then(|v| v.as_u64())? as u32,
            started_at: get_time(p, "StartedAt")?,
            completed_at: get_time(p, "CompletedAt"),
            error: get_str(p, "Error"),
            id: entity.partition_key,
            etag,
        })
    }

    pub async fn get_scan(&self, scan_id: &str) -> Result<Option<ScanRecord>, StorageError> {
        match self
            .store
            .get_entity(self.scans_table, scan_id, SCAN_ROW)
            .await
        {
            Ok(found) => Ok(found.and_then(|(e, etag)| Self::parse_scan(e, etag))),
            // No scans table yet: no scan was ever started.
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The most recent scans, newest first (scan ids sort newest first).
    pub async fn list_scans(&self, top: u32) -> Result<Vec<ScanRecord>, StorageError> {
        let query = Query {
            filter: Some(Filter::rk(CompareOp::Eq, SCAN_ROW)),
            top: Some(top),
            select: None,
            continuation: None,
        };
        let mut scans = Vec::new();
        let mut query = query;
        // Follow continuations past empty pages until we have `top` rows, the table ends, or
        // the page budget is spent (then the listing is cut short, and says so in the log).
        for _ in 0..MAX_LIST_PAGES {
            let page = self.store.query_page(self.scans_table, &query).await?;
            scans.extend(
                page.entities
                    .into_iter()
                    .filter_map(|e| Self::parse_scan(e, String::new())),
            );
            match page.continuation {
                Some(c) if scans.len() < top as usize => query.continuation = Some(c),
                _ => {
                    scans.truncate(top as usize);
                    return Ok(scans);
                }
            }
        }
        tracing::warn!(
            found = scans.len(),
            top,
            "listing stopped after {MAX_LIST_PAGES} pages of the scans table"
        );
        Ok(scans)
    }

    /// Moves a running scan to `state` (with `error`); returns false if it was no longer running.
    pub async fn finish_scan(
        &self,
        scan_id: &str,
        state: ScanState,
        error: Option<&str>,
    ) -> Result<bool, StorageError> {
        let mut schedule = contention();
        loop {
            let Some(record) = self.get_scan(scan_id).await? else {
                return Ok(false);
            };
            if record.state != ScanState::Running {
                return Ok(false);
            }
            let mut entity = Entity::new(scan_id, SCAN_ROW);
            entity.properties.insert("State", json!(state.as_str()));
            put_time(
                &mut entity.properties,
                "CompletedAt",
                OffsetDateTime::now_utc(),
            );
            if let Some(e) = error {
                entity.properties.insert("Error", json!(diagnostic(e)));
            }
            let op = BatchOperation::Merge {
                entity,
                etag: Some(record.etag),
            };
            match self
                .store
                .submit_batch(self.scans_table, scan_id, &[op])
                .await
            {
                Ok(()) => {
                    observe::scan_ended(scan_id, state, record.started_at, error);
                    return Ok(true);
                }
                Err(e) if e.kind == StorageErrorKind::PreconditionFailed => {
                    again(&mut schedule, Verdict::Retry, "scan record").await?
                }
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use crate::storage::{Continuation, Page, StorageResult};

    /// A scans table that only ever answers empty pages with a continuation.
    #[derive(Clone, Default)]
    struct Endless {
        queries: Arc<AtomicUsize>,
    }

    impl TableStore for Endless {
        async fn query_page(&self, _: &str, _: &Query) -> StorageResult<Page> {
            self.queries.fetch_add(1, Ordering::SeqCst);
            Ok(Page {
                continuation: Some(Continuation {
                    next_partition_key: "next".into(),
                    next_row_key: None,
                }),
                ..Page::default()
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
        let scans = Tracker::new(&endless, "Scans", "Work")
            .list_scans(100)
            .await
            .unwrap();
        assert!(scans.is_empty());
        assert_eq!(endless.queries.load(Ordering::SeqCst), MAX_LIST_PAGES);
    }
}
