//! An in-memory ordered table store for unit and property tests of the scan algorithm.
//!
//! Rows are ordered by (PartitionKey, RowKey) in UTF-16 code-unit order, as Azure orders them.
//! On demand it imitates Azure's pagination quirks: pages shorter than `$top`, empty pages that
//! still carry a continuation, and continuations with NextPartitionKey but no NextRowKey.
//! It is never a stand-in for Azurite in integration tests.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::{Arc, Mutex};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::storage::request_counts::{RequestCounters, RequestKind};
use crate::storage::{
    compare_keys, validate_batch, BatchOperation, Continuation, Entity, Page, Query, StorageError,
    StorageErrorKind, StorageResult, TableStore, MAX_TAKE,
};

/// A key wrapper ordered by UTF-16 code units.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Utf16Key(String);

impl Ord for Utf16Key {
    fn cmp(&self, other: &Self) -> Ordering {
        compare_keys(&self.0, &other.0)
    }
}

impl PartialOrd for Utf16Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

type RowMap = BTreeMap<(Utf16Key, Utf16Key), (Entity, u64)>;

/// How to imitate Azure's pagination. The default is the well-behaved case: full pages, a
/// continuation only when more rows exist.
#[derive(Debug, Clone, Default)]
pub struct Pagination {
    /// Probability of returning an empty page with a continuation instead of rows.
    pub empty_page_probability: f64,
    /// Probability of cutting a page short at a random length.
    pub short_page_probability: f64,
    /// Probability of returning a continuation on the last page (the next page is then empty).
    pub trailing_token_probability: f64,
    /// Probability of omitting NextRowKey when the next row starts its partition.
    pub omit_row_key_probability: f64,
    /// Seed for the quirks' random choices, so failures reproduce.
    pub seed: u64,
}

impl Pagination {
    /// Every quirk at once, with the given probability each.
    pub fn adversarial(seed: u64, probability: f64) -> Self {
        Pagination {
            empty_page_probability: probability,
            short_page_probability: probability,
            trailing_token_probability: probability,
            omit_row_key_probability: 0.5,
            seed,
        }
    }
}

struct State {
    tables: HashMap<String, RowMap>,
    rng: StdRng,
    next_etag: u64,
}

/// The in-memory table store. Cloning shares the same data.
#[derive(Clone)]
pub struct MemoryTableStore {
    state: Arc<Mutex<State>>,
    pagination: Pagination,
    counters: Arc<RequestCounters>,
}

impl Default for MemoryTableStore {
    fn default() -> Self {
        Self::new(Pagination::default())
    }
}

impl MemoryTableStore {
    pub fn new(pagination: Pagination) -> Self {
        let rng = StdRng::seed_from_u64(pagination.seed);
        MemoryTableStore {
            state: Arc::new(Mutex::new(State {
                tables: HashMap::new(),
                rng,
                next_etag: 1,
            })),
            pagination,
            counters: Arc::new(RequestCounters::new()),
        }
    }

    pub fn counters(&self) -> &Arc<RequestCounters> {
        &self.counters
    }

    /// Inserts (or replaces) rows directly, creating the table if needed; not counted as requests.
    pub fn load(&self, table: &str, entities: impl IntoIterator<Item = Entity>) {
        let mut state = self.state.lock().unwrap();
        let mut etag = state.next_etag;
        let rows = state.tables.entry(table.to_string()).or_default();
        for entity in entities {
            let key = (
                Utf16Key(entity.partition_key.clone()),
                Utf16Key(entity.row_key.clone()),
            );
            rows.insert(key, (entity, etag));
            etag += 1;
        }
        state.next_etag = etag;
    }

    /// All rows of a table in (PK, RK) order.
    pub fn rows(&self, table: &str) -> Vec<Entity> {
        let state = self.state.lock().unwrap();
        state
            .tables
            .get(table)
            .map(|rows| rows.values().map(|(e, _)| e.clone()).collect())
            .unwrap_or_default()
    }

    fn not_found(table: &str) -> StorageError {
        let mut err = StorageError::from_status(
            404,
            Some("TableNotFound".into()),
            format!("table {table} not found"),
        );
        err.kind = StorageErrorKind::NotFound;
        err
    }
}

fn project(entity: &Entity, select: &Option<Vec<String>>) -> Entity {
    match select {
        None => entity.clone(),
        Some(columns) => {
            let mut out = Entity::new(entity.partition_key.clone(), entity.row_key.clone());
            for column in columns {
                if let Some(v) = entity.properties.get(column) {
                    out.properties.insert_raw(column.clone(), v.to_owned());
                    let annotation = format!("{column}@odata.type");
                    if let Some(t) = entity.properties.get(&annotation) {
                        out.properties.insert_raw(annotation, t.to_owned());
                    }
                }
            }
            out
        }
    }
}

impl TableStore for MemoryTableStore {
    async fn query_page(&self, table: &str, query: &Query) -> StorageResult<Page> {
        // Yield like real I/O would, so concurrent callers interleave between requests.
        tokio::task::yield_now().await;
        self.counters.record(RequestKind::Query);
        if let Some(top) = query.top {
            if top == 0 || top > MAX_TAKE {
                return Err(StorageError::from_status(
                    400,
                    Some("InvalidInput".into()),
                    format!("$top {top} out of 1..=1000"),
                ));
            }
        }
        let mut state = self.state.lock().unwrap();
        let State { tables, rng, .. } = &mut *state;
        let rows = tables.get(table).ok_or_else(|| Self::not_found(table))?;
        let limit = query.top.unwrap_or(MAX_TAKE) as usize;
        let p = &self.pagination;

        let start = match &query.continuation {
            None => Bound::Unbounded,
            Some(c) => match &c.next_row_key {
                Some(rk) => {
                    Bound::Included((Utf16Key(c.next_partition_key.clone()), Utf16Key(rk.clone())))
                }
                None => Bound::Included((
                    Utf16Key(c.next_partition_key.clone()),
                    Utf16Key(String::new()),
                )),
            },
        };
        // Azure sends NextPartitionKey alone when the next row starts its partition; resuming
        // from (pk, "") is then exact because "" is the smallest row key.
        let continuation_at = |pk: &str, rk: &str, rng: &mut StdRng| {
            let key = (Utf16Key(pk.to_string()), Utf16Key(rk.to_string()));
            let starts_partition = rows
                .range(..key)
                .next_back()
                .map_or(true, |((prev_pk, _), _)| prev_pk.0 != pk);
            let omit = starts_partition && rng.gen_bool(p.omit_row_key_probability.clamp(0.0, 1.0));
            Continuation {
                next_partition_key: pk.to_string(),
                next_row_key: (!omit).then(|| rk.to_string()),
            }
        };

        let mut iter = rows
            .range((start, Bound::Unbounded))
            .filter(|(_, (e, _))| query.filter.as_ref().map_or(true, |f| f.matches_entity(e)));

        let peek_first = iter.clone().next().map(|(_, (e, _))| e);
        if let Some(first) = peek_first {
            if rng.gen_bool(p.empty_page_probability.clamp(0.0, 1.0)) {
                let continuation = Some(continuation_at(&first.partition_key, &first.row_key, rng));
                return Ok(Page {
                    entities: Vec::new(),
                    continuation,
                    ..Page::default()
                });
            }
        }
        let limit = if limit > 1 && rng.gen_bool(p.short_page_probability.clamp(0.0, 1.0)) {
            rng.gen_range(1..limit)
        } else {
            limit
        };
        let entities: Vec<Entity> = iter
            .by_ref()
            .take(limit)
            .map(|(_, (e, tag))| Entity {
                etag: Some(tag.to_string()),
                ..project(e, &query.select)
            })
            .collect();
        let continuation = match iter.next() {
            Some((_, (next, _))) => Some(continuation_at(&next.partition_key, &next.row_key, rng)),
            None if !entities.is_empty()
                && rng.gen_bool(p.trailing_token_probability.clamp(0.0, 1.0)) =>
            {
                // A token past the last row: the next page is empty and final.
                let last = entities.last().unwrap();
                let mut after = last.row_key.clone();
                after.push('\u{0}');
                Some(Continuation {
                    next_partition_key: last.partition_key.clone(),
                    next_row_key: Some(after),
                })
            }
            None => None,
        };
        Ok(Page {
            entities,
            continuation,
            ..Page::default()
        })
    }

    async fn submit_batch_with_etags(
        &self,
        table: &str,
        partition_key: &str,
        operations: &[BatchOperation],
    ) -> StorageResult<Vec<Option<String>>> {
        // Yield like real I/O would, so concurrent callers interleave between requests.
        tokio::task::yield_now().await;
        self.counters.record(RequestKind::Batch);
        validate_batch(partition_key, operations)?;
        let mut state = self.state.lock().unwrap();
        let mut etag = state.next_etag;
        let rows = state
            .tables
            .get_mut(table)
            .ok_or_else(|| Self::not_found(table))?;
        // Check every operation first: a transaction applies all or nothing.
        for (index, op) in operations.iter().enumerate() {
            let key = (
                Utf16Key(partition_key.to_string()),
                Utf16Key(op.row_key().to_string()),
            );
            let existing = rows.get(&key).map(|(_, tag)| tag.to_string());
            let fail = |status: u16, code: &str| {
                let mut err = StorageError::from_status(
                    status,
                    Some(code.into()),
                    format!("batch operation {index} failed"),
                );
                err.failed_operation = Some(index);
                Err(err)
            };
            match op {
                BatchOperation::Insert(_) if existing.is_some() => {
                    return fail(409, "EntityAlreadyExists")
                }
                BatchOperation::Replace { etag, .. }
                | BatchOperation::Merge { etag, .. }
                | BatchOperation::Delete { etag, .. } => match (&existing, etag) {
                    (None, _) => return fail(404, "ResourceNotFound"),
                    (Some(current), Some(expected)) if current != expected => {
                        return fail(412, "UpdateConditionNotSatisfied")
                    }
                    _ => {}
                },
                _ => {}
            }
        }
        let mut etags = Vec::with_capacity(operations.len());
        for op in operations {
            let key = (
                Utf16Key(partition_key.to_string()),
                Utf16Key(op.row_key().to_string()),
            );
            etags.push((!matches!(op, BatchOperation::Delete { .. })).then(|| etag.to_string()));
            match op {
                BatchOperation::Insert(e)
                | BatchOperation::Upsert(e)
                | BatchOperation::Replace { entity: e, .. } => {
                    rows.insert(key, (e.clone(), etag));
                }
                BatchOperation::Merge { entity, .. } => {
                    let slot = rows.get_mut(&key).expect("checked above");
                    for (k, v) in &entity.properties {
                        slot.0.properties.insert_raw(k, v.to_owned());
                    }
                    slot.1 = etag;
                }
                BatchOperation::Delete { .. } => {
                    rows.remove(&key);
                }
            }
            etag += 1;
        }
        state.next_etag = etag;
        Ok(etags)
    }

    async fn get_entity(
        &self,
        table: &str,
        partition_key: &str,
        row_key: &str,
    ) -> StorageResult<Option<(Entity, String)>> {
        // Yield like real I/O would, so concurrent callers interleave between requests.
        tokio::task::yield_now().await;
        self.counters.record(RequestKind::PointRead);
        let state = self.state.lock().unwrap();
        let rows = state
            .tables
            .get(table)
            .ok_or_else(|| Self::not_found(table))?;
        let key = (
            Utf16Key(partition_key.to_string()),
            Utf16Key(row_key.to_string()),
        );
        Ok(rows.get(&key).map(|(e, tag)| (e.clone(), tag.to_string())))
    }

    async fn create_table(&self, table: &str) -> StorageResult<bool> {
        // Yield like real I/O would, so concurrent callers interleave between requests.
        tokio::task::yield_now().await;
        self.counters.record(RequestKind::TableAdmin);
        let mut state = self.state.lock().unwrap();
        if state.tables.contains_key(table) {
            return Ok(false);
        }
        state.tables.insert(table.to_string(), RowMap::new());
        Ok(true)
    }

    async fn delete_table(&self, table: &str) -> StorageResult<bool> {
        // Yield like real I/O would, so concurrent callers interleave between requests.
        tokio::task::yield_now().await;
        self.counters.record(RequestKind::TableAdmin);
        Ok(self.state.lock().unwrap().tables.remove(table).is_some())
    }
}
