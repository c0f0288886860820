//! Compact synthetic tables for the simulator.
//!
//! 35 M rows do not fit as `Entity` maps, so the source is a sorted list of partition keys with
//! row counts; row keys are generated from their index. Filters are evaluated by turning them
//! into ranges of global row indexes (with a linear fallback for shapes we do not recognise), so
//! a query costs O(log n + page) whatever the table size. Rows carry their keys only (their size
//! is the model's, not the entity's). The destination is a sink that only
//! remembers which source rows were written (a bitset), so the copy can still be verified.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::props;
use crate::storage::{
    compare_keys, BatchOperation, CompareOp, Continuation, Entity, Filter, KeyColumn, Page, Query,
    StorageError, StorageResult, TableStore, MAX_TAKE,
};

/// Row keys are versions like `01.2.3`, zero-padded so string order is index order.
pub const MAX_ROWS_PER_KEY: u64 = 9_999;

/// The row key of the `i`-th row of a partition.
pub fn row_key(i: u64) -> String {
    let b = row_key_bytes(i);
    // Six ASCII digits and dots.
    String::from_utf8(b.to_vec()).expect("ascii")
}

/// `row_key(i)` without allocating (`i` < 10,000).
fn row_key_bytes(i: u64) -> [u8; 6] {
    let d = |v: u64| b'0' + (v % 10) as u8;
    [d(i / 1000), d(i / 100), b'.', d(i / 10), b'.', d(i)]
}

/// The index whose row key is `rk`, if `rk` is one.
pub fn parse_row_key(rk: &str) -> Option<u64> {
    let b = rk.as_bytes();
    if b.len() != 6 || b[2] != b'.' || b[4] != b'.' {
        return None;
    }
    let mut v = 0u64;
    for &c in [b[0], b[1], b[3], b[5]].iter() {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v * 10 + (c - b'0') as u64;
    }
    Some(v)
}

/// Whether byte order equals UTF-16 order for comparisons with an ASCII key: true unless `v`
/// has a supplementary-plane character (4-byte UTF-8 sequence).
fn bmp_only(v: &str) -> bool {
    !v.bytes().any(|b| b >= 0xF0)
}

/// Half-open ranges of global row indexes, sorted and disjoint.
type Ranges = Vec<(u64, u64)>;

fn intersect(a: &Ranges, b: &Ranges) -> Ranges {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() && j < b.len() {
        let lo = a[i].0.max(b[j].0);
        let hi = a[i].1.min(b[j].1);
        if lo < hi {
            out.push((lo, hi));
        }
        if a[i].1 < b[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

fn union(mut all: Ranges) -> Ranges {
    all.retain(|r| r.0 < r.1);
    all.sort_unstable();
    let mut out: Ranges = Vec::with_capacity(all.len());
    for r in all {
        match out.last_mut() {
            Some(last) if r.0 <= last.1 => last.1 = last.1.max(r.1),
            _ => out.push(r),
        }
    }
    out
}

/// A read-only synthetic table: partition keys (sorted in UTF-16 order) and their row counts.
pub struct SyntheticTable {
    keys: Vec<Box<str>>,
    /// Every partition key is ASCII (then byte order is UTF-16 order against BMP-only values).
    ascii: bool,
    /// `starts[i]` is the global index of partition `i`'s first row; `starts[n]` is the total.
    starts: Vec<u64>,
    /// Rows carry the simulated properties (`props`) when selected; otherwise keys only.
    properties: bool,
}

/// Above this many partitions in range, a RowKey comparison is evaluated linearly instead.
const MAX_RK_PARTITIONS: u64 = 4096;

impl SyntheticTable {
    /// Builds a table from (partition key, row count) pairs in any order.
    pub fn new(mut partitions: Vec<(String, u64)>) -> Self {
        partitions.sort_by(|a, b| compare_keys(&a.0, &b.0));
        partitions.dedup_by(|a, b| a.0 == b.0);
        let mut starts = Vec::with_capacity(partitions.len() + 1);
        let mut keys = Vec::with_capacity(partitions.len());
        let mut total = 0u64;
        for (pk, count) in partitions {
            assert!((1..=MAX_ROWS_PER_KEY).contains(&count));
            starts.push(total);
            total += count;
            keys.push(pk.into_boxed_str());
        }
        starts.push(total);
        let ascii = keys.iter().all(|k| k.is_ascii());
        SyntheticTable {
            keys,
            ascii,
            starts,
            properties: false,
        }
    }

    /// The same table whose rows carry the simulated properties (`props`).
    pub fn with_properties(mut self) -> Self {
        self.properties = true;
        self
    }

    /// The global index of the row (pk, rk), if the table has it.
    pub fn row_of(&self, pk: &str, rk: &str) -> Option<u64> {
        let p = self.partition_index(pk)?;
        let count = self.starts[p + 1] - self.starts[p];
        parse_row_key(rk)
            .filter(|&i| i < count && row_key(i) == rk)
            .map(|i| self.starts[p] + i)
    }

    pub fn total_rows(&self) -> u64 {
        *self.starts.last().unwrap()
    }

    pub fn partitions(&self) -> usize {
        self.keys.len()
    }

    /// Rows in each partition, in key order.
    pub fn partition_sizes(&self) -> impl Iterator<Item = u64> + '_ {
        self.starts.windows(2).map(|w| w[1] - w[0])
    }

    /// Every row as an entity (small tables only: for tests against `MemoryTableStore`).
    pub fn entities(&self) -> Vec<Entity> {
        (0..self.total_rows()).map(|i| self.entity(i)).collect()
    }

    fn partition_of(&self, row: u64) -> usize {
        self.starts.partition_point(|&s| s <= row) - 1
    }

    /// Row `row` as an entity. Rows carry their keys only: the model charges a full row's
    /// size (`Model::full_row_bytes`) for latency, and a property map per row (a B-tree node of
    /// ~600 bytes) was the simulator's biggest allocation churn.
    pub fn entity(&self, row: u64) -> Entity {
        let p = self.partition_of(row);
        Entity::new(&*self.keys[p], row_key(row - self.starts[p]))
    }

    /// First partition whose key is >= `v` (or > `v` when `strict`).
    fn pk_bound(&self, v: &str, strict: bool) -> usize {
        let fast = self.ascii && bmp_only(v);
        self.keys.partition_point(|k| {
            let o = if fast {
                k.as_bytes().cmp(v.as_bytes())
            } else {
                compare_keys(k, v)
            };
            if strict {
                o.is_le()
            } else {
                o.is_lt()
            }
        })
    }

    /// Index within a partition of `count` rows of the first row key >= `v` (> when `strict`).
    fn rk_bound(count: u64, v: &str, strict: bool) -> u64 {
        let fast = bmp_only(v);
        let (mut lo, mut hi) = (0u64, count);
        while lo < hi {
            let mid = (lo + hi) / 2;
            let k = row_key_bytes(mid);
            let o = if fast {
                k.as_slice().cmp(v.as_bytes())
            } else {
                compare_keys(std::str::from_utf8(&k).expect("ascii"), v)
            };
            if (strict && o.is_le()) || (!strict && o.is_lt()) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    fn op_range(total: u64, lo_ge: u64, lo_gt: u64, op: CompareOp) -> (u64, u64) {
        match op {
            CompareOp::Eq => (lo_ge, lo_gt),
            CompareOp::Gt => (lo_gt, total),
            CompareOp::Ge => (lo_ge, total),
            CompareOp::Lt => (0, lo_ge),
            CompareOp::Le => (0, lo_gt),
        }
    }

    /// The partition index of key `pk`, if it exists.
    pub fn partition_index(&self, pk: &str) -> Option<usize> {
        let p = self.pk_bound(pk, false);
        (p < self.keys.len() && &*self.keys[p] == pk).then_some(p)
    }

    /// The global index of the first row at or after (pk, rk) in key order.
    fn position(&self, pk: &str, rk: &str) -> u64 {
        let p = self.pk_bound(pk, false);
        if p >= self.keys.len() {
            return self.total_rows();
        }
        if &*self.keys[p] != pk {
            return self.starts[p];
        }
        let count = self.starts[p + 1] - self.starts[p];
        self.starts[p] + Self::rk_bound(count, rk, false)
    }

    /// Rows matching `filter` within `dom`, as ranges; `None` if the shape is not supported.
    fn ranges(&self, filter: &Filter, dom: (u64, u64)) -> Option<Ranges> {
        match filter {
            Filter::Compare(KeyColumn::PartitionKey, op, v) => {
                let n = self.keys.len() as u64;
                let (a, b) = Self::op_range(
                    n,
                    self.pk_bound(v, false) as u64,
                    self.pk_bound(v, true) as u64,
                    *op,
                );
                let (lo, hi) = (self.starts[a as usize], self.starts[b as usize]);
                Some(intersect(&vec![(lo, hi)], &vec![dom]))
            }
            Filter::Compare(KeyColumn::RowKey, op, v) => {
                if dom.0 >= dom.1 {
                    return Some(Vec::new());
                }
                let (first, last) = (self.partition_of(dom.0), self.partition_of(dom.1 - 1));
                if (last - first) as u64 >= MAX_RK_PARTITIONS {
                    return None;
                }
                let mut out = Vec::new();
                for p in first..=last {
                    let count = self.starts[p + 1] - self.starts[p];
                    let (a, b) = Self::op_range(
                        count,
                        Self::rk_bound(count, v, false),
                        Self::rk_bound(count, v, true),
                        *op,
                    );
                    let r = (self.starts[p] + a, self.starts[p] + b);
                    out.push((r.0.max(dom.0), r.1.min(dom.1)));
                }
                Some(union(out))
            }
            Filter::And(parts) => {
                // Partition-key comparisons first: they narrow the domain cheaply.
                let mut ordered: Vec<&Filter> = parts.iter().collect();
                ordered.sort_by_key(|f| !matches!(f, Filter::Compare(KeyColumn::PartitionKey, ..)));
                let mut current = vec![dom];
                for part in ordered {
                    let Some(&(lo, _)) = current.first() else {
                        break;
                    };
                    let hull = (lo, current.last().unwrap().1);
                    current = intersect(&current, &self.ranges(part, hull)?);
                }
                Some(current)
            }
            Filter::Or(parts) => {
                let mut all = Vec::new();
                for part in parts {
                    all.extend(self.ranges(part, dom)?);
                }
                Some(union(all))
            }
            // Row filters on other properties: every row here, checked row by row (`select`).
            Filter::Where(_) if self.properties => Some(vec![dom]),
            Filter::Where(_) => None,
        }
    }

    /// Rows from `dom` matching `filter`: up to `limit`, plus whether more remain.
    fn select(&self, filter: Option<&Filter>, dom: (u64, u64), limit: usize) -> (Vec<u64>, bool) {
        let ranges = match filter {
            None => Some(vec![dom]),
            Some(f) => self.ranges(f, dom),
        };
        // No large up-front capacity: most queries return a few rows, and allocations of a
        // KiB or more make glibc consolidate its free lists (a hot spot in profiles).
        let mut rows = Vec::new();
        // A condition on the simulated properties: checked on each row of the key ranges.
        let residual = filter.filter(|f| self.properties && props::has_where(f));
        let keep = |i: u64| {
            residual.map_or(true, |f| {
                let mut e = self.entity(i);
                props::add(&mut e, i, None);
                f.matches_entity(&e)
            })
        };
        match ranges {
            Some(ranges) => {
                for (lo, hi) in ranges {
                    for i in (lo..hi).filter(|&i| keep(i)) {
                        if rows.len() == limit {
                            return (rows, true);
                        }
                        rows.push(i);
                    }
                }
                (rows, false)
            }
            None => {
                // Linear fallback: correct for any filter, slow on big tables.
                let f = filter.expect("no filter always has ranges");
                for i in dom.0..dom.1 {
                    let p = self.partition_of(i);
                    if f.matches(&self.keys[p], &row_key(i - self.starts[p])) && keep(i) {
                        if rows.len() == limit {
                            return (rows, true);
                        }
                        rows.push(i);
                    }
                }
                (rows, false)
            }
        }
    }

    /// One query page, as Azure would return it (full pages, a continuation iff more rows).
    pub fn query(&self, query: &Query) -> StorageResult<Page> {
        let top = query.top.unwrap_or(MAX_TAKE);
        if top == 0 || top > MAX_TAKE {
            return Err(StorageError::from_status(
                400,
                Some("InvalidInput".into()),
                format!("$top {top} out of 1..=1000"),
            ));
        }
        let start = match &query.continuation {
            None => 0,
            Some(c) => self.position(
                &c.next_partition_key,
                c.next_row_key.as_deref().unwrap_or(""),
            ),
        };
        let (rows, more) = self.select(
            query.filter.as_ref(),
            (start, self.total_rows()),
            top as usize,
        );
        let continuation = if more {
            // The next matching row is where the service would resume.
            let (next, _) = self.select(
                query.filter.as_ref(),
                (rows.last().unwrap() + 1, self.total_rows()),
                1,
            );
            next.first().map(|&i| {
                let e = self.entity(i);
                Continuation {
                    next_partition_key: e.partition_key,
                    next_row_key: Some(e.row_key),
                }
            })
        } else {
            None
        };
        let mut entities = Vec::with_capacity(rows.len());
        let mut p = rows.first().map_or(0, |&i| self.partition_of(i));
        for i in rows {
            while self.starts[p + 1] <= i {
                p += 1;
            }
            let mut e = Entity::new(&*self.keys[p], row_key(i - self.starts[p]));
            if self.properties {
                props::add(&mut e, i, query.select.as_deref());
            }
            entities.push(e);
        }
        Ok(Page {
            entities,
            continuation,
            ..Page::default()
        })
    }
}

/// The destination: remembers which source rows were written, and anything else written.
pub struct Sink {
    source: Arc<SyntheticTable>,
    written: Mutex<Vec<u64>>,
    unique: AtomicU64,
    /// Upserts of keys that do not exist in the source (must stay 0).
    extras: AtomicU64,
    /// Upserts in total, repeats included.
    writes: AtomicU64,
}

impl Sink {
    pub fn new(source: Arc<SyntheticTable>) -> Self {
        let words = source.total_rows().div_ceil(64) as usize;
        Sink {
            source,
            written: Mutex::new(vec![0; words]),
            unique: AtomicU64::new(0),
            extras: AtomicU64::new(0),
            writes: AtomicU64::new(0),
        }
    }

    /// Distinct source rows written so far.
    pub fn unique_rows(&self) -> u64 {
        self.unique.load(Ordering::Relaxed)
    }

    pub fn extra_rows(&self) -> u64 {
        self.extras.load(Ordering::Relaxed)
    }

    pub fn total_writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// Whether every source row was written and nothing else.
    pub fn verified(&self) -> bool {
        self.unique_rows() == self.source.total_rows() && self.extra_rows() == 0
    }

    pub fn write(&self, operations: &[BatchOperation]) -> StorageResult<()> {
        let mut keys = Vec::with_capacity(operations.len());
        for op in operations {
            let BatchOperation::Upsert(e) = op else {
                return Err(StorageError::invalid_input(
                    "the simulated destination only accepts upserts",
                ));
            };
            keys.push((e.partition_key.as_str(), e.row_key.as_str()));
        }
        self.record(keys);
        Ok(())
    }

    /// Records rows written to the destination (a table's upserts, or the rows of a queue
    /// message), by their keys.
    pub fn record<'a>(&self, keys: impl IntoIterator<Item = (&'a str, &'a str)>) {
        let mut bits = self.written.lock().unwrap();
        // Batches are single-partition: look the partition up once per run of one key.
        let mut partition: Option<(&str, Option<usize>)> = None;
        for (pk, rk) in keys {
            self.writes.fetch_add(1, Ordering::Relaxed);
            let p = match partition {
                Some((last, p)) if last == pk => p,
                _ => {
                    let p = self.source.partition_index(pk);
                    partition = Some((pk, p));
                    p
                }
            };
            let index = p.and_then(|p| {
                let count = self.source.starts[p + 1] - self.source.starts[p];
                parse_row_key(rk)
                    .filter(|&i| i < count)
                    .map(|i| self.source.starts[p] + i)
            });
            match index {
                Some(i) => {
                    let (w, b) = ((i / 64) as usize, i % 64);
                    if bits[w] & (1 << b) == 0 {
                        bits[w] |= 1 << b;
                        self.unique.fetch_add(1, Ordering::Relaxed);
                    }
                }
                None => {
                    self.extras.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// Source and destination as one `TableStore` (the sink ignores reads).
#[derive(Clone)]
pub struct SyntheticStore {
    pub source_table: String,
    pub destination_table: String,
    pub source: Arc<SyntheticTable>,
    pub sink: Arc<Sink>,
}

impl TableStore for SyntheticStore {
    async fn query_page(&self, table: &str, query: &Query) -> StorageResult<Page> {
        if table == self.source_table {
            self.source.query(query)
        } else {
            Ok(Page::default())
        }
    }
    async fn submit_batch_with_etags(
        &self,
        table: &str,
        pk: &str,
        operations: &[BatchOperation],
    ) -> StorageResult<Vec<Option<String>>> {
        if table != self.destination_table {
            return Err(StorageError::invalid_input("the source is read-only"));
        }
        if operations.is_empty() || operations.len() > crate::storage::MAX_BATCH_OPERATIONS {
            return Err(StorageError::invalid_input("bad batch size"));
        }
        if operations
            .iter()
            .any(|op| op.entity().is_some_and(|e| e.partition_key != pk))
        {
            return Err(StorageError::invalid_input("batch mixes partition keys"));
        }
        self.sink
            .write(operations)
            .map(|()| vec![None; operations.len()])
    }
    async fn get_entity(
        &self,
        _table: &str,
        _pk: &str,
        _rk: &str,
    ) -> StorageResult<Option<(Entity, String)>> {
        Err(StorageError::invalid_input(
            "point reads of the synthetic tables are not modelled",
        ))
    }
    async fn create_table(&self, _table: &str) -> StorageResult<bool> {
        Ok(false)
    }
    async fn delete_table(&self, _table: &str) -> StorageResult<bool> {
        Ok(false)
    }
}

/// Shared dotted prefixes of NuGet package ids, most popular first (weights are Zipf-like).
const OWNERS: &[&str] = &[
    "microsoft",
    "system",
    "azure",
    "awssdk",
    "nuget",
    "xamarin",
    "google",
    "serilog",
    "orleans",
    "akka",
    "nservicebus",
    "devexpress",
    "telerik",
    "syncfusion",
    "fluentvalidation",
    "newtonsoft",
    "castle",
    "autofac",
    "humanizer",
    "abp",
];
const SECOND: &[&str] = &[
    "aspnetcore",
    "extensions",
    "entityframeworkcore",
    "data",
    "identity",
    "storage",
    "net",
    "windows",
    "build",
    "codeanalysis",
    "runtime",
    "text",
    "io",
    "security",
    "collections",
    "core",
    "client",
    "abstractions",
    "mvc",
    "logging",
];
const SYLLABLES: &[&str] = &[
    "ka", "lo", "mi", "net", "ser", "vo", "tra", "zen", "qu", "ix", "ar", "po", "lin", "dex", "or",
    "fy", "sta", "ru", "be", "cor",
];

fn word(rng: &mut StdRng) -> String {
    (0..rng.gen_range(2..=4))
        .map(|_| SYLLABLES[rng.gen_range(0..SYLLABLES.len())])
        .collect()
}

/// A Zipf-like pick among `n` items (item 0 most likely).
fn zipf(rng: &mut StdRng, n: usize) -> usize {
    let u: f64 = rng.gen_range(0.0..1.0);
    (((n as f64 + 1.0).powf(u) - 1.0) as usize).min(n - 1)
}

fn package_id(rng: &mut StdRng) -> String {
    let shape = rng.gen_range(0..100);
    if shape < 35 {
        // Long tail: owner-less ids, sometimes dotted.
        let mut id = word(rng);
        if rng.gen_bool(0.4) {
            id.push('.');
            id.push_str(&word(rng));
        }
        id
    } else {
        let owner = OWNERS[zipf(rng, OWNERS.len())];
        let mut id = owner.to_string();
        for depth in 0..rng.gen_range(1..=3) {
            id.push('.');
            if depth == 0 && rng.gen_bool(0.6) {
                id.push_str(SECOND[zipf(rng, SECOND.len())]);
            } else {
                id.push_str(&word(rng));
            }
        }
        id
    }
}

/// Versions per id: a skewed (Pareto-like) count with the given mean, at least 1.
fn versions(rng: &mut StdRng, mean: f64) -> u64 {
    // Pareto with shape 1.6 has mean xm * 1.6 / 0.6; pick xm to hit the mean (before capping).
    let shape = 1.6;
    let xm = mean * (shape - 1.0) / shape;
    let u: f64 = rng.gen_range(f64::EPSILON..1.0);
    let v = xm / u.powf(1.0 / shape);
    (v.round() as u64).clamp(1, MAX_ROWS_PER_KEY)
}

/// A NuGet-like table of exactly `rows` rows: lowercase package ids as partition keys (shared
/// dotted prefixes, skewed), versions as row keys. Deterministic for `seed`.
pub fn nuget_like(rows: u64, mean_versions: f64, seed: u64) -> SyntheticTable {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut seen: HashSet<String> = HashSet::new();
    let mut partitions = Vec::new();
    let mut total = 0u64;
    while total < rows {
        let id = package_id(&mut rng);
        if !seen.insert(id.clone()) {
            continue;
        }
        let n = versions(&mut rng, mean_versions).min(rows - total);
        total += n;
        partitions.push((id, n));
    }
    SyntheticTable::new(partitions)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::memory::MemoryTableStore;

    fn random_filter(rng: &mut StdRng, keys: &[String], depth: u32) -> Filter {
        let ops = [
            CompareOp::Eq,
            CompareOp::Gt,
            CompareOp::Ge,
            CompareOp::Lt,
            CompareOp::Le,
        ];
        let op = ops[rng.gen_range(0..ops.len())];
        match rng.gen_range(0..if depth == 0 { 2 } else { 4 }) {
            0 => {
                let k = &keys[rng.gen_range(0..keys.len())];
                // Sometimes a key that is not in the table.
                let v = if rng.gen_bool(0.3) {
                    format!("{k}\u{FFFF}")
                } else {
                    k.clone()
                };
                Filter::pk(op, v)
            }
            1 => Filter::rk(op, row_key(rng.gen_range(0..12))),
            2 => Filter::and(
                (0..rng.gen_range(1..4))
                    .map(|_| random_filter(rng, keys, depth - 1))
                    .collect(),
            ),
            _ => Filter::or(
                (0..rng.gen_range(1..4))
                    .map(|_| random_filter(rng, keys, depth - 1))
                    .collect(),
            ),
        }
    }

    #[test]
    fn row_keys_sort_in_index_order() {
        for i in 0..MAX_ROWS_PER_KEY {
            assert!(compare_keys(&row_key(i), &row_key(i + 1)).is_lt(), "{i}");
            assert_eq!(
                row_key(i),
                format!("{:02}.{}.{}", i / 100, (i / 10) % 10, i % 10)
            );
            assert_eq!(parse_row_key(&row_key(i)), Some(i));
        }
        assert_eq!(parse_row_key("1.2.3"), None);
        assert_eq!(parse_row_key("0a.2.3"), None);
    }

    #[test]
    fn queries_match_the_in_memory_table_for_random_filters() {
        let table = nuget_like(400, 3.0, 11);
        let memory = MemoryTableStore::default();
        memory.load("t", table.entities());
        let keys: Vec<String> = table.keys.iter().map(|k| k.to_string()).collect();
        let mut rng = StdRng::seed_from_u64(5);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        for case in 0..400 {
            let filter = (case % 10 != 0).then(|| random_filter(&mut rng, &keys, 3));
            let top = [1, 7, 50, 1000][case % 4];
            let select = (case % 3 == 0).then(Vec::new);
            let read_all = |store: &dyn Fn(&Query) -> Page| {
                let mut q = Query {
                    filter: filter.clone(),
                    top: Some(top),
                    select: select.clone(),
                    continuation: None,
                };
                let mut out = Vec::new();
                loop {
                    let page = store(&q);
                    assert!(page.entities.len() <= top as usize);
                    out.extend(page.entities);
                    match page.continuation {
                        Some(c) => q.continuation = Some(c),
                        None => return out,
                    }
                }
            };
            let ours = read_all(&|q| table.query(q).unwrap());
            let theirs = read_all(&|q| rt.block_on(memory.query_page("t", q)).unwrap());
            let keys_of = |v: &[Entity]| -> Vec<(String, String)> {
                v.iter()
                    .map(|e| (e.partition_key.clone(), e.row_key.clone()))
                    .collect()
            };
            assert_eq!(keys_of(&ours), keys_of(&theirs), "filter {filter:?}");
            if select.is_none() {
                assert_eq!(ours, theirs);
            }
        }
    }

    #[test]
    fn generator_is_deterministic_exact_and_skewed() {
        let a = nuget_like(20_000, 14.0, 3);
        let b = nuget_like(20_000, 14.0, 3);
        assert_eq!(a.total_rows(), 20_000);
        assert_eq!(a.keys, b.keys);
        assert_eq!(a.starts, b.starts);
        assert_ne!(nuget_like(20_000, 14.0, 4).keys, a.keys);
        let mean = a.total_rows() as f64 / a.partitions() as f64;
        assert!((8.0..20.0).contains(&mean), "mean {mean}");
        let microsoft = a
            .keys
            .iter()
            .filter(|k| k.starts_with("microsoft."))
            .count();
        assert!(microsoft * 20 > a.partitions(), "shared prefixes dominate");
        let max = (0..a.partitions())
            .map(|p| a.starts[p + 1] - a.starts[p])
            .max()
            .unwrap();
        assert!(max > 100, "a long tail of versions: max {max}");
    }

    #[test]
    fn sink_counts_unique_rows_and_extras() {
        let table = Arc::new(nuget_like(50, 3.0, 1));
        let sink = Sink::new(table.clone());
        let rows = table.entities();
        let ops: Vec<BatchOperation> = rows.iter().cloned().map(BatchOperation::Upsert).collect();
        sink.write(&ops[..10]).unwrap();
        sink.write(&ops[5..]).unwrap();
        assert!(sink.verified());
        assert_eq!(sink.total_writes(), 55);
        sink.write(&[BatchOperation::Upsert(Entity::new("nope", "1"))])
            .unwrap();
        assert!(!sink.verified());
    }
}
