//! Scan records: one row per scan in the scans table, PK = scan id (newest first), RK = `scan`.

use serde_json::{json, Value};
use time::OffsetDateTime;

use super::codec::{diagnostic, format_time, get_str, get_time, put_str, put_time};
use super::{again, claim_token, contention, Tracker};
use crate::app::job::context::ScanContext;
use crate::app::observe;
use crate::retry::Verdict;
use crate::storage::{
    odata, BatchOperation, CompareOp, Entity, Filter, Query, StorageError, StorageErrorKind,
    TableStore,
};

/// Most query pages one scan listing reads. The scans table holds only scan rows, so one page
/// of `top` rows normally answers; empty pages are the only reason to read more.
const MAX_LIST_PAGES: usize = 8;
pub(super) const SCAN_ROW: &str = "scan";
/// The scan record's property holding until when a completion step holds the scan's lease.
pub(super) const LEASE_PROPERTY: &str = "CompletionLeaseUntil";
/// The scan record's property naming the attempt that took the completion lease (a token).
const LEASE_BY_PROPERTY: &str = "CompletionLeaseBy";
/// The scan record's property naming the call that ended the scan (a token).
const ENDED_BY_PROPERTY: &str = "EndedBy";
/// How long a completion step's lease lasts: longer than any invocation may run (host.json's
/// `functionTimeout`, 10 minutes), so that a lease outlives the step that took it unless that
/// step's invocation died, and then it expires by itself.
pub const COMPLETION_LEASE: time::Duration = time::Duration::minutes(11);
/// Listing continuation tokens: `a<id>` goes on after that scan id; `f<key>` from that partition
/// key on (where the service said it would go on, when the page budget ran out).
const AFTER: &str = "a";
const FROM: &str = "f";

/// One page of a scan listing ([`Tracker::list_scans`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ScanPage {
    pub scans: Vec<ScanRecord>,
    /// Pass back (as `resume`, through [`parse_list_token`]) for the next page; `None`: no more.
    pub continuation: Option<String>,
}

/// The filter that resumes a listing from one of its continuation tokens; `None` if `token` is
/// not one (tokens carry a scan id or partition key: hex digits and `-`, at most 64).
pub fn parse_list_token(token: &str) -> Option<Filter> {
    let kind = token.get(..1)?;
    let key = token.get(1..)?;
    let is_key =
        (1..=64).contains(&key.len()) && key.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
    match kind {
        AFTER if is_key => Some(Filter::pk(CompareOp::Gt, key)),
        FROM if is_key => Some(Filter::pk(CompareOp::Ge, key)),
        _ => None,
    }
}

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

    pub fn parse(s: &str) -> Option<ScanState> {
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

    pub(super) fn parse_scan(entity: Entity, etag: String) -> Option<ScanRecord> {
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
        Ok(self.get_scan_and_lease(scan_id).await?.map(|(r, _)| r))
    }

    /// The scan's record and, if a completion step holds the lease on it, until when
    /// ([`Tracker::take_completion_lease`]). One point read.
    pub async fn get_scan_and_lease(
        &self,
        scan_id: &str,
    ) -> Result<Option<(ScanRecord, Option<OffsetDateTime>)>, StorageError> {
        self.get_scan_with(scan_id, |e| get_time(&e.properties, LEASE_PROPERTY))
            .await
    }

    /// The scan's record and what `mark` reads from its row (a property the record leaves
    /// out). One point read.
    async fn get_scan_with<R>(
        &self,
        scan_id: &str,
        mark: impl FnOnce(&Entity) -> R,
    ) -> Result<Option<(ScanRecord, R)>, StorageError> {
        match self
            .store
            .get_entity(self.scans_table, scan_id, SCAN_ROW)
            .await
        {
            Ok(found) => Ok(found.and_then(|(e, etag)| {
                let marked = mark(&e);
                Self::parse_scan(e, etag).map(|r| (r, marked))
            })),
            // No scans table yet: no scan was ever started.
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Takes the lease that lets one execution run a driver's completion step for the scan,
    /// until `now + COMPLETION_LEASE`: `false` if the scan is no longer running or another
    /// execution holds an unexpired lease (or took it between our read and write: the merge is
    /// conditional on the record's ETag). The lease names this attempt (`CompletionLeaseBy`, a
    /// token): a 412 on our merge is read back, since the adapter retries a merge whose answer
    /// was lost and the retry then fails on our own write's ETag; without the token the step
    /// would run nowhere until the lease expired. One read and at most one merge of the record
    /// (and one more read after a 412).
    pub async fn take_completion_lease(&self, scan_id: &str) -> Result<bool, StorageError> {
        let now = self.now();
        let Some((record, lease)) = self.get_scan_and_lease(scan_id).await? else {
            return Ok(false);
        };
        if record.state != ScanState::Running || lease.is_some_and(|until| until > now) {
            return Ok(false);
        }
        let token = claim_token();
        match self
            .set_lease(
                scan_id,
                now + COMPLETION_LEASE,
                Some(&token),
                Some(record.etag),
            )
            .await
        {
            Err(e) if e.kind == StorageErrorKind::PreconditionFailed => {
                // Ours if it holds our token: that merge was conditional on the running record.
                let held = self.store.get_entity(self.scans_table, scan_id, SCAN_ROW);
                Ok(held.await?.is_some_and(|(e, _)| {
                    get_str(&e.properties, LEASE_BY_PROPERTY).as_deref() == Some(token.as_str())
                }))
            }
            other => other.map(|()| true),
        }
    }

    /// Gives the completion lease up (it expires now), after a completion step failed, so that
    /// the next delivery may try again at once.
    pub async fn release_completion_lease(&self, scan_id: &str) -> Result<(), StorageError> {
        self.set_lease(scan_id, self.now(), None, None).await
    }

    async fn set_lease(
        &self,
        scan_id: &str,
        until: OffsetDateTime,
        by: Option<&str>,
        etag: Option<String>,
    ) -> Result<(), StorageError> {
        let mut entity = Entity::new(scan_id, SCAN_ROW);
        put_time(&mut entity.properties, LEASE_PROPERTY, until);
        if let Some(by) = by {
            put_str(&mut entity.properties, LEASE_BY_PROPERTY, by);
        }
        let op = BatchOperation::Merge { entity, etag };
        self.store
            .submit_batch(self.scans_table, scan_id, &[op])
            .await
    }

    /// One page of the scans, newest first (scan ids sort newest first): at most `top` records,
    /// only those in `state` if given, from where `resume` says ([`parse_list_token`]). The
    /// page's `continuation` is set when more records may follow. Reads `top + 1` rows to know
    /// whether more follow, and at most [`MAX_LIST_PAGES`] query pages (empty pages are the only
    /// reason to read more than one; with a state filter the service may return few per page).
    pub async fn list_scans(
        &self,
        top: u32,
        state: Option<ScanState>,
        resume: Option<Filter>,
    ) -> Result<ScanPage, StorageError> {
        let mut filters = vec![Filter::rk(CompareOp::Eq, SCAN_ROW)];
        filters.extend(resume);
        if let Some(state) = state {
            let expr = odata::parse(&format!("State eq '{}'", state.as_str()))
                .expect("a state filter parses");
            filters.push(Filter::Where(expr));
        }
        let mut query = Query {
            filter: Some(Filter::and(filters)),
            top: Some(top + 1),
            select: None,
            continuation: None,
        };
        let top = top as usize;
        let mut scans = Vec::new();
        for _ in 0..MAX_LIST_PAGES {
            let page = self.store.query_page(self.scans_table, &query).await?;
            scans.extend(
                page.entities
                    .into_iter()
                    .filter_map(|e| Self::parse_scan(e, String::new())),
            );
            if scans.len() > top {
                scans.truncate(top);
                let continuation = scans.last().map(|last| format!("{AFTER}{}", last.id));
                return Ok(ScanPage {
                    scans,
                    continuation,
                });
            }
            match page.continuation {
                Some(c) => query.continuation = Some(c),
                None => {
                    return Ok(ScanPage {
                        scans,
                        continuation: None,
                    })
                }
            }
        }
        tracing::warn!(
            found = scans.len(),
            top,
            "listing stopped after {MAX_LIST_PAGES} pages of the scans table; the answer's continuationToken goes on from there"
        );
        let continuation = query
            .continuation
            .map(|c| format!("{FROM}{}", c.next_partition_key));
        Ok(ScanPage {
            scans,
            continuation,
        })
    }

    /// Moves a running scan to `state` (with `error`); returns false if it was no longer running.
    /// The end names this call (`EndedBy`, a token): a merge that met a 412 after an earlier
    /// attempt of it took effect (the adapter retried it: its answer was lost) reads the record
    /// back, knows its own end by the token, and counts it as this call's (its `on_end` hook
    /// runs, and a cancel is answered as done); another call's end, even the same state at the
    /// same millisecond, is not.
    pub async fn finish_scan(
        &self,
        scan_id: &str,
        state: ScanState,
        error: Option<&str>,
    ) -> Result<bool, StorageError> {
        let mut schedule = contention();
        let token = claim_token();
        let stored = error.map(diagnostic);
        // Set when the contention attempts are used up: the record is read once more, since
        // the last attempt's answer may have been lost as well.
        let mut stopped: Option<StorageError> = None;
        loop {
            let Some((record, by)) = self.get_scan_and_ender(scan_id).await? else {
                return Ok(false);
            };
            // The token is this call's own: only one of its merges can have written it.
            if by.as_deref() == Some(token.as_str()) {
                let ended_at = record.completed_at.unwrap_or(record.started_at);
                self.scan_ended(scan_id, state, ended_at - record.started_at, error)
                    .await;
                return Ok(true);
            }
            if let Some(stop) = stopped {
                return Err(stop);
            }
            if record.state != ScanState::Running {
                return Ok(false);
            }
            let ended_at = self.now();
            let mut entity = Entity::new(scan_id, SCAN_ROW);
            entity.properties.insert("State", json!(state.as_str()));
            put_time(&mut entity.properties, "CompletedAt", ended_at);
            if let Some(e) = &stored {
                entity.properties.insert("Error", json!(e));
            }
            put_str(&mut entity.properties, ENDED_BY_PROPERTY, &token);
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
                    self.scan_ended(scan_id, state, ended_at - record.started_at, error)
                        .await;
                    return Ok(true);
                }
                Err(e) if e.kind == StorageErrorKind::PreconditionFailed => {
                    stopped = again(&mut schedule, Verdict::Retry, "scan record")
                        .await
                        .err();
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// A scan's record and the token of the call that ended it (`EndedBy`; none while it runs,
    /// or if a version before the token ended it).
    async fn get_scan_and_ender(
        &self,
        scan_id: &str,
    ) -> Result<Option<(ScanRecord, Option<String>)>, StorageError> {
        self.get_scan_with(scan_id, |e| get_str(&e.properties, ENDED_BY_PROPERTY))
            .await
    }

    /// What follows the end of a scan recorded by this call, `took` after its start: the event,
    /// then the `on_end` hook.
    async fn scan_ended(
        &self,
        scan_id: &str,
        state: ScanState,
        took: time::Duration,
        error: Option<&str>,
    ) {
        observe::scan_ended(scan_id, state, took, error);
        if let Some(hook) = self.on_end {
            hook.scan_ended(scan_id).await;
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
        async fn submit_batch_with_etags(
            &self,
            _: &str,
            _: &str,
            _: &[BatchOperation],
        ) -> StorageResult<Vec<Option<String>>> {
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
        let page = Tracker::new(&endless, "Scans", "Work")
            .list_scans(100, None, None)
            .await
            .unwrap();
        assert!(page.scans.is_empty());
        assert_eq!(page.continuation.as_deref(), Some("fnext"));
        assert_eq!(endless.queries.load(Ordering::SeqCst), MAX_LIST_PAGES);
    }
}
