//! Scan bookkeeping: scan records, pending-work rows and sharded counters, kept exact under
//! at-least-once delivery.
//!
//! Layout (both tables live in the `AzureWebJobsStorage` account):
//! - scans table: one row per scan, PK = scan id (newest first), RK = `scan`.
//! - work table: per scan, `shards` partitions `{scanId}-{shard:02}`. Each holds one `counter` row
//!   and the rows of the work items whose id hashes to that shard.
//!
//! Invariants that make completion exact:
//! 1. A child's row is inserted (Insert, never upsert) in the same entity group transaction that
//!    adds 1 to `Created` on its shard's counter, so each work item is counted once however many
//!    times its parent runs. Rows are never deleted, only marked `done`/`failed`/`dropped`, so a
//!    late duplicate parent cannot resurrect a finished child.
//! 2. Executing a step is not deterministic (Azure may cut pages anywhere, so two executions of
//!    the same step can split its range differently). So the first execution to finish records
//!    its outcome (children + counters) on the item's row, guarded by the row's ETag
//!    (`pending` → `expanded`); every later or concurrent execution adopts the recorded outcome.
//! 3. Children are registered before their parent completes, and a parent completes (row marked
//!    done + `Completed += 1` + its row/request counters) in one transaction guarded by the row's
//!    ETag, so a duplicate completion fails instead of double counting.
//! 4. Hence Σ Created − Σ Completed is the number of unfinished items, never 0 early. It is
//!    read with a double collect (two passes over the monotonic counters that agree), which is a
//!    consistent snapshot.
//! 5. Once a scan has ended (cancelled or failed), a work item that meets it is finished without
//!    running (`dropped`, with `Completed` and `Dropped` += 1 in the same kind of transaction), so
//!    the queued messages clean up an ended scan's work rows as they are delivered.

use std::time::Duration;

use futures::future::try_join_all;
use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::storage::{
    BatchOperation, CompareOp, Entity, Filter, Properties, Query, StorageError, StorageErrorKind,
    TableStore,
};

use super::messages::{shard_of, ScanContext};
use crate::storage::entity::MAX_CUSTOM_PROPERTIES;

/// Most query pages one scan listing reads. The scans table holds only scan rows, so one page
/// of `top` rows normally answers; empty pages are the only reason to read more.
const MAX_LIST_PAGES: usize = 8;
const SCAN_ROW: &str = "scan";
const COUNTER_ROW: &str = "counter";
/// Optimistic-concurrency retries on a contended counter before giving up (the message retries).
const MAX_COUNTER_ATTEMPTS: usize = 50;

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
    /// What the scan's work items read and write, recorded at start (`None` on records written
    /// before contexts were recorded, or unreadable: derive it from `request`).
    pub context: Option<ScanContext>,
    pub shards: u32,
    pub started_at: OffsetDateTime,
    pub completed_at: Option<OffsetDateTime>,
    pub error: Option<String>,
    pub etag: String,
}

/// Counter values of one shard, or their sum over a scan.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Counters {
    /// Work items registered.
    pub created: i64,
    /// Work items finished (done, failed or dropped).
    pub completed: i64,
    /// Work items that failed for good (poisoned).
    pub failed: i64,
    pub rows_scanned: i64,
    pub rows_written: i64,
    pub storage_requests: i64,
    /// Queue messages whose work was committed.
    pub messages: i64,
    /// Work items finished without running because their scan had ended (cancelled or failed).
    /// Absent from counters and outcomes recorded by earlier versions: 0.
    #[serde(default)]
    pub dropped: i64,
}

const COUNTER_FIELDS: [&str; 8] = [
    "Created",
    "Completed",
    "Failed",
    "RowsScanned",
    "RowsWritten",
    "StorageRequests",
    "Messages",
    "Dropped",
];

impl Counters {
    fn values(&self) -> [i64; 8] {
        [
            self.created,
            self.completed,
            self.failed,
            self.rows_scanned,
            self.rows_written,
            self.storage_requests,
            self.messages,
            self.dropped,
        ]
    }

    fn from_values(v: [i64; 8]) -> Counters {
        Counters {
            created: v[0],
            completed: v[1],
            failed: v[2],
            rows_scanned: v[3],
            rows_written: v[4],
            storage_requests: v[5],
            messages: v[6],
            dropped: v[7],
        }
    }

    pub fn plus(&self, other: &Counters) -> Counters {
        let (a, b) = (self.values(), other.values());
        Counters::from_values(std::array::from_fn(|i| a[i] + b[i]))
    }

    /// Work items registered but not yet finished.
    pub fn pending(&self) -> i64 {
        self.created - self.completed
    }

    /// Reads a counter row; a field that is there but unreadable is an error, never a zero
    /// (a zero `Created` would end a scan early). A missing field is 0 (rows written before
    /// the field existed).
    fn from_entity(entity: &Entity) -> Result<Counters, StorageError> {
        let mut values = [0i64; COUNTER_FIELDS.len()];
        for (value, field) in values.iter_mut().zip(COUNTER_FIELDS) {
            *value = int64(&entity.properties, field).ok_or_else(|| {
                StorageError::invalid_response(format!(
                    "counter row {} has an unreadable {field}",
                    entity.partition_key
                ))
            })?;
        }
        Ok(Counters::from_values(values))
    }

    fn to_entity(self, partition_key: &str) -> Entity {
        let mut entity = Entity::new(partition_key, COUNTER_ROW);
        for (name, value) in COUNTER_FIELDS.iter().zip(self.values()) {
            put_int64(&mut entity.properties, name, value);
        }
        entity
    }
}

/// An Int64 property (sent as a string, as the service's JSON does); `None` if unreadable.
fn int64(props: &Properties, name: &str) -> Option<i64> {
    match props.get_value(name) {
        None => Some(0),
        Some(Value::String(s)) => s.parse().ok(),
        Some(Value::Number(n)) => n.as_i64(),
        Some(_) => None,
    }
}

fn put_int64(props: &mut Properties, name: &str, value: i64) {
    props.insert(name, Value::String(value.to_string()));
    props.insert(
        format!("{name}@odata.type"),
        Value::String("Edm.Int64".into()),
    );
}

fn put_str(props: &mut Properties, name: &str, value: &str) {
    props.insert(name, Value::String(value.to_string()));
}

fn put_time(props: &mut Properties, name: &str, value: OffsetDateTime) {
    props.insert(name, Value::String(format_time(value)));
    props.insert(
        format!("{name}@odata.type"),
        Value::String("Edm.DateTime".into()),
    );
}

/// RFC 3339 in UTC with millisecond precision.
pub fn format_time(t: OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    let t = t
        .replace_nanosecond(t.millisecond() as u32 * 1_000_000)
        .unwrap_or(t);
    t.format(&Rfc3339).unwrap_or_default()
}

fn get_time(props: &Properties, name: &str) -> Option<OffsetDateTime> {
    props
        .get_str(name)
        .and_then(|s| OffsetDateTime::parse(&s, &Rfc3339).ok())
}

fn get_str(props: &Properties, name: &str) -> Option<String> {
    props.get_str(name)
}

/// State of one work item's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkState {
    /// Not yet executed (or executed without recording an outcome).
    Pending {
        etag: String,
    },
    /// Executed; its outcome (JSON) is recorded and must be used by whoever finishes it.
    Expanded {
        etag: String,
        outcome: String,
    },
    Finished,
}

/// Recorded outcomes are split over string properties of at most this many UTF-16 units (the
/// service allows 64 KiB of UTF-16, 32,768 units, per string); the row as a whole must still
/// fit the 1 MiB entity limit, which is checked before it is sent.
const OUTCOME_CHUNK_UNITS: usize = 32_000;
/// Longest diagnostic text (an error) stored on a record, in UTF-16 units: 16 KB of the
/// 64 KiB a string property may hold; longer texts are cut with a marker.
const MAX_DIAGNOSTIC_UNITS: usize = 8_000;

/// Why an outcome could not be recorded.
#[derive(Debug)]
pub enum RecordError {
    /// Another execution recorded or finished first: here is the row now.
    Lost(Option<WorkState>),
    Storage(StorageError),
}

impl From<StorageError> for RecordError {
    fn from(e: StorageError) -> Self {
        RecordError::Storage(e)
    }
}

/// Result of trying to complete a work item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// Committed; `shard_idle` says the shard had no unfinished items left afterwards.
    Committed { shard_idle: bool },
    /// Already completed: by another delivery, or by our own earlier attempt whose answer was
    /// lost. Nobody may have checked for the end of the scan yet, so the caller still must.
    Duplicate,
}

/// Bookkeeping over a table store.
pub struct Tracker<'a, T: TableStore> {
    store: &'a T,
    scans_table: &'a str,
    work_table: &'a str,
}

/// A child work item to register: its id and its queue message text.
pub struct NewWork {
    pub id: String,
    pub kind: &'static str,
}

fn shard_partition(scan_id: &str, shard: u32) -> String {
    format!("{scan_id}-{shard:02}")
}

thread_local! {
    /// Jitter source for contention backoff and for where drained checks start: random per thread, but re-seedable so the
    /// single-threaded simulator (`tablescan simulate`) is deterministic for a given seed.
    static JITTER: std::cell::RefCell<rand::rngs::StdRng> =
        std::cell::RefCell::new(rand::SeedableRng::from_entropy());
}

/// Re-seeds this thread's contention-backoff jitter (used by the simulator for determinism).
pub fn seed_backoff_jitter(seed: u64) {
    JITTER.with(|j| *j.borrow_mut() = rand::SeedableRng::seed_from_u64(seed));
}

fn backoff(attempt: usize) -> Duration {
    use rand::Rng;
    let base = 5u64 << attempt.min(6);
    Duration::from_millis(base + JITTER.with(|j| j.borrow_mut().gen_range(0..base)))
}

impl<'a, T: TableStore> Tracker<'a, T> {
    pub fn new(store: &'a T, scans_table: &'a str, work_table: &'a str) -> Self {
        Tracker {
            store,
            scans_table,
            work_table,
        }
    }

    /// Creates the bookkeeping tables if missing.
    pub async fn ensure_tables(&self) -> Result<(), StorageError> {
        self.store.create_table(self.scans_table).await?;
        self.store.create_table(self.work_table).await?;
        Ok(())
    }

    /// Registers a new scan's counters and root work item. The scan record is written separately
    /// by [`Tracker::insert_scan`] after the root message is queued, so a record never exists
    /// without its work.
    pub async fn create_scan_work(
        &self,
        scan_id: &str,
        shards: u32,
        root: &NewWork,
    ) -> Result<(), StorageError> {
        let root_shard = shard_of(&root.id, shards);
        try_join_all((0..shards).map(|shard| async move {
            let pk = shard_partition(scan_id, shard);
            let mut ops = Vec::new();
            let mut counters = Counters::default();
            if shard == root_shard {
                ops.push(BatchOperation::Insert(work_row(&pk, root)));
                counters.created = 1;
            }
            ops.push(BatchOperation::Insert(counters.to_entity(&pk)));
            match self.store.submit_batch(self.work_table, &pk, &ops).await {
                // A retry of our own write whose answer was lost: the scan id is fresh, so the
                // rows (inserted together, atomically) are ours.
                Err(e) if e.kind == StorageErrorKind::Conflict => {
                    self.read_counter(scan_id, shard).await.map(|_| ())
                }
                other => other,
            }
        }))
        .await?;
        Ok(())
    }

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
        match self
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
        }
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
        for attempt in 0..MAX_COUNTER_ATTEMPTS {
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
                Ok(()) => return Ok(true),
                Err(e) if e.kind == StorageErrorKind::PreconditionFailed => {
                    tokio::time::sleep(backoff(attempt)).await
                }
                Err(e) => return Err(e),
            }
        }
        Err(StorageError::new(
            StorageErrorKind::Transient,
            "scan record stayed contended",
        ))
    }

    async fn read_counter(
        &self,
        scan_id: &str,
        shard: u32,
    ) -> Result<(Counters, String), StorageError> {
        let pk = shard_partition(scan_id, shard);
        match self
            .store
            .get_entity(self.work_table, &pk, COUNTER_ROW)
            .await?
        {
            Some((entity, etag)) => Ok((Counters::from_entity(&entity)?, etag)),
            None => Err(StorageError::new(
                StorageErrorKind::NotFound,
                format!("counter row of {pk} is missing"),
            )),
        }
    }

    /// Every shard's counters, read concurrently.
    pub async fn shard_counters(
        &self,
        scan_id: &str,
        shards: u32,
    ) -> Result<Vec<Counters>, StorageError> {
        try_join_all(
            (0..shards).map(|s| async move { self.read_counter(scan_id, s).await.map(|(c, _)| c) }),
        )
        .await
    }

    /// Sum of all shards' counters (not a snapshot; fine for display).
    pub async fn totals(&self, scan_id: &str, shards: u32) -> Result<Counters, StorageError> {
        Ok(self
            .shard_counters(scan_id, shards)
            .await?
            .iter()
            .fold(Counters::default(), |a, c| a.plus(c)))
    }

    /// Marks the scan completed if its work is drained. `shard` (the one whose item just
    /// finished) is checked first, which is cheap and usually says no. Returns whether this
    /// call completed the scan.
    pub async fn complete_if_drained(
        &self,
        scan_id: &str,
        shards: u32,
        shard: Option<u32>,
    ) -> Result<bool, StorageError> {
        if let Some(shard) = shard {
            if self.read_counter(scan_id, shard).await?.0.pending() != 0 {
                return Ok(false);
            }
        }
        Ok(self.is_drained(scan_id, shards).await?
            && self
                .finish_scan(scan_id, ScanState::Completed, None)
                .await?)
    }

    /// Whether every registered work item has finished, judged on a consistent snapshot: two
    /// collections of the (monotonic) counters that agree exactly.
    pub async fn is_drained(&self, scan_id: &str, shards: u32) -> Result<bool, StorageError> {
        // Per shard, Created ≥ Completed always (a child is counted in its own shard before it
        // can finish there), so any busy shard settles the answer: read a few shards at a time,
        // from a random one, and stop at the first busy one. Most checks end after a few reads.
        const GROUP: u32 = 4;
        let start = JITTER.with(|j| {
            use rand::Rng;
            j.borrow_mut().gen_range(0..shards.max(1))
        });
        let mut first = vec![Counters::default(); shards as usize];
        let order: Vec<u32> = (0..shards).map(|i| (start + i) % shards).collect();
        for group in order.chunks(GROUP as usize) {
            let read =
                try_join_all(group.iter().map(|&s| async move {
                    self.read_counter(scan_id, s).await.map(|(c, _)| (s, c))
                }))
                .await?;
            for (s, c) in read {
                if c.pending() != 0 {
                    return Ok(false);
                }
                first[s as usize] = c;
            }
        }
        let second = self.shard_counters(scan_id, shards).await?;
        Ok(first == second)
    }

    /// Reads a work item's row.
    pub async fn work_state(
        &self,
        scan_id: &str,
        shards: u32,
        work_id: &str,
    ) -> Result<Option<WorkState>, StorageError> {
        let pk = shard_partition(scan_id, shard_of(work_id, shards));
        Ok(self
            .store
            .get_entity(self.work_table, &pk, work_id)
            .await?
            .map(
                |(entity, etag)| match get_str(&entity.properties, "State").as_deref() {
                    Some("pending") => WorkState::Pending { etag },
                    Some("expanded") => {
                        let outcome: String = (0..MAX_CUSTOM_PROPERTIES)
                            .map_while(|i| get_str(&entity.properties, &format!("Outcome{i}")))
                            .collect();
                        WorkState::Expanded { etag, outcome }
                    }
                    _ => WorkState::Finished,
                },
            ))
    }

    /// Records an item's outcome (`pending` → `expanded`) if no other execution did first.
    /// Returns the row's new ETag.
    pub async fn record_outcome(
        &self,
        scan_id: &str,
        shards: u32,
        work_id: &str,
        pending_etag: &str,
        outcome: &str,
    ) -> Result<String, RecordError> {
        let pk = shard_partition(scan_id, shard_of(work_id, shards));
        let mut row = Entity::new(pk.clone(), work_id);
        row.properties.insert("State", json!("expanded"));
        for (i, chunk) in utf16_chunks(outcome, OUTCOME_CHUNK_UNITS).enumerate() {
            row.properties.insert(format!("Outcome{i}"), json!(chunk));
        }
        if let Err(e) = row.check_limits() {
            return Err(RecordError::Storage(StorageError::invalid_input(format!(
                "the outcome of {work_id} cannot be recorded: {}",
                e.message
            ))));
        }
        let op = BatchOperation::Merge {
            entity: row,
            etag: Some(pending_etag.to_string()),
        };
        match self
            .store
            .submit_batch_with_etags(self.work_table, &pk, &[op])
            .await
        {
            // The row's new ETag, for the completion that follows.
            Ok(etags) if etags.first().is_some_and(Option::is_some) => {
                Ok(etags.into_iter().next().flatten().expect("checked"))
            }
            // The store did not report it: read it back.
            Ok(_) => match self.work_state(scan_id, shards, work_id).await? {
                Some(WorkState::Expanded { etag, .. }) => Ok(etag),
                other => Err(RecordError::Lost(other)),
            },
            Err(e)
                if matches!(
                    e.kind,
                    StorageErrorKind::PreconditionFailed | StorageErrorKind::NotFound
                ) =>
            {
                Err(RecordError::Lost(
                    self.work_state(scan_id, shards, work_id).await?,
                ))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Registers children: inserts each missing row together with its shard's `Created` count.
    /// Rows that already exist (from an earlier attempt of the same parent) are left alone.
    pub async fn register_children(
        &self,
        scan_id: &str,
        shards: u32,
        children: &[NewWork],
    ) -> Result<(), StorageError> {
        let mut by_shard: std::collections::BTreeMap<u32, Vec<&NewWork>> = Default::default();
        for child in children {
            by_shard
                .entry(shard_of(&child.id, shards))
                .or_default()
                .push(child);
        }
        let groups: Vec<(u32, Vec<&NewWork>)> = by_shard
            .into_iter()
            .flat_map(|(shard, items)| {
                items
                    .chunks(99)
                    .map(|c| (shard, c.to_vec()))
                    .collect::<Vec<_>>()
            })
            .collect();
        try_join_all(
            groups
                .into_iter()
                .map(|(shard, items)| self.register_group(scan_id, shard, items)),
        )
        .await?;
        Ok(())
    }

    async fn register_group(
        &self,
        scan_id: &str,
        shard: u32,
        mut items: Vec<&NewWork>,
    ) -> Result<(), StorageError> {
        let pk = shard_partition(scan_id, shard);
        for attempt in 0..MAX_COUNTER_ATTEMPTS {
            if items.is_empty() {
                return Ok(());
            }
            let (counters, etag) = self.read_counter(scan_id, shard).await?;
            let mut ops: Vec<BatchOperation> = items
                .iter()
                .map(|w| BatchOperation::Insert(work_row(&pk, w)))
                .collect();
            let updated = Counters {
                created: counters.created + items.len() as i64,
                ..counters
            };
            ops.push(BatchOperation::Replace {
                entity: updated.to_entity(&pk),
                etag: Some(etag),
            });
            match self.store.submit_batch(self.work_table, &pk, &ops).await {
                Ok(()) => return Ok(()),
                Err(e) if e.kind == StorageErrorKind::PreconditionFailed => {
                    tokio::time::sleep(backoff(attempt)).await
                }
                Err(e) if e.kind == StorageErrorKind::Conflict => match e.failed_operation {
                    Some(i) if i < items.len() => {
                        items.remove(i);
                    }
                    _ => {
                        // The service did not say which insert failed: look them up.
                        let mut missing = Vec::new();
                        for item in items {
                            if self
                                .store
                                .get_entity(self.work_table, &pk, &item.id)
                                .await?
                                .is_none()
                            {
                                missing.push(item);
                            }
                        }
                        items = missing;
                    }
                },
                Err(e) => return Err(e),
            }
        }
        Err(StorageError::new(
            StorageErrorKind::Transient,
            format!("counter of {pk} stayed contended"),
        ))
    }

    /// Marks a work item finished (or failed) and adds its counters, atomically with its shard's
    /// counter row. `delta.completed` is set here.
    pub async fn complete(
        &self,
        scan_id: &str,
        shards: u32,
        work_id: &str,
        work_etag: &str,
        mut delta: Counters,
        failure: Option<&str>,
    ) -> Result<Completion, StorageError> {
        delta.failed = i64::from(failure.is_some());
        delta.messages = 1;
        let state = if failure.is_some() { "failed" } else { "done" };
        self.finish_work(scan_id, shards, work_id, work_etag, delta, state, failure)
            .await
    }

    /// Finishes a work item of an ended scan without running it: its row is marked `dropped`
    /// and `Completed` and `Dropped` grow by one, atomically with its shard's counter row and
    /// guarded by the row's ETag, so a redelivery or a concurrent completion cannot count it
    /// twice.
    pub async fn drop_work(
        &self,
        scan_id: &str,
        shards: u32,
        work_id: &str,
        work_etag: &str,
    ) -> Result<Completion, StorageError> {
        let delta = Counters {
            dropped: 1,
            ..Counters::default()
        };
        self.finish_work(scan_id, shards, work_id, work_etag, delta, "dropped", None)
            .await
    }

    /// Replaces an unfinished row (at `work_etag`) with a finished one in `state` and adds
    /// `delta` plus one completion to the shard's counter, in one transaction.
    #[allow(clippy::too_many_arguments)]
    async fn finish_work(
        &self,
        scan_id: &str,
        shards: u32,
        work_id: &str,
        work_etag: &str,
        mut delta: Counters,
        state: &str,
        error: Option<&str>,
    ) -> Result<Completion, StorageError> {
        let shard = shard_of(work_id, shards);
        let pk = shard_partition(scan_id, shard);
        delta.completed = 1;
        for attempt in 0..MAX_COUNTER_ATTEMPTS {
            let (counters, counter_etag) = self.read_counter(scan_id, shard).await?;
            let updated = counters.plus(&delta);
            let mut row = Entity::new(pk.clone(), work_id);
            put_str(&mut row.properties, "State", state);
            put_time(&mut row.properties, "FinishedAt", OffsetDateTime::now_utc());
            if let Some(e) = error {
                put_str(&mut row.properties, "Error", &diagnostic(e));
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
                        None => match self.work_state(scan_id, shards, work_id).await? {
                            Some(
                                WorkState::Pending { etag } | WorkState::Expanded { etag, .. },
                            ) if etag == work_etag => {}
                            _ => return Ok(Completion::Duplicate),
                        },
                    }
                    tokio::time::sleep(backoff(attempt)).await;
                }
                Err(e) => return Err(e),
            }
        }
        Err(StorageError::new(
            StorageErrorKind::Transient,
            format!("counter of {pk} stayed contended"),
        ))
    }
}

fn work_row(partition_key: &str, work: &NewWork) -> Entity {
    let mut row = Entity::new(partition_key, work.id.clone());
    row.properties.insert("State", json!("pending"));
    row.properties.insert("Kind", json!(work.kind));
    put_time(&mut row.properties, "CreatedAt", OffsetDateTime::now_utc());
    row
}

/// Splits `text` into pieces of at most `max_units` UTF-16 units, never inside a character.
fn utf16_chunks(text: &str, max_units: usize) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut units = 0;
        let end = rest
            .char_indices()
            .find(|(_, c)| {
                units += c.len_utf16();
                units > max_units
            })
            .map_or(rest.len(), |(i, _)| i);
        let (chunk, tail) = rest.split_at(end);
        rest = tail;
        Some(chunk)
    })
}

/// A diagnostic text cut to [`MAX_DIAGNOSTIC_UNITS`] UTF-16 units, with a marker saying so.
fn diagnostic(text: &str) -> String {
    let total = text.encode_utf16().count();
    if total <= MAX_DIAGNOSTIC_UNITS {
        return text.to_string();
    }
    let marker = format!(" … [truncated: {total} UTF-16 units in all]");
    let keep = MAX_DIAGNOSTIC_UNITS - marker.encode_utf16().count();
    let head = utf16_chunks(text, keep).next().unwrap_or("");
    format!("{head}{marker}")
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

    #[test]
    fn chunks_and_diagnostics_are_measured_in_utf16_units() {
        let text = format!("{}{}", "a".repeat(5), "\u{1F600}".repeat(3));
        let chunks: Vec<&str> = utf16_chunks(&text, 6).collect();
        assert_eq!(chunks.concat(), text);
        assert!(chunks.iter().all(|c| c.encode_utf16().count() <= 6));
        let wide = "\u{1F600}".repeat(MAX_DIAGNOSTIC_UNITS);
        let cut = diagnostic(&wide);
        assert!(cut.encode_utf16().count() <= MAX_DIAGNOSTIC_UNITS);
        assert!(cut.ends_with(&format!(
            "[truncated: {} UTF-16 units in all]",
            2 * MAX_DIAGNOSTIC_UNITS
        )));
        assert_eq!(diagnostic("short"), "short");
    }
}
