//! Storage requests: the minimum a scan needs, and what a run made, classified by kind.
//!
//! Invariant: `Requests::total` is the sum of every counted request; data kinds count the source
//! and destination tables only, bookkeeping kinds the scans and work tables.

use std::collections::BTreeMap;

use serde::Serialize;

use super::variant::{Job, Variant, ENQUEUE_ROWS_PER_MESSAGE};
use crate::lab::proxy::Counts;
use crate::storage::{MAX_BATCH_OPERATIONS, MAX_TAKE};

/// The fewest storage requests that can read and write a table: one query per 1,000 rows, and
/// (to copy) one entity group transaction per partition key per 100 rows.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Minimum {
    pub rows: u64,
    pub reads: u64,
    pub batches: u64,
    pub partition_keys: u64,
}

impl Minimum {
    pub fn of(partition_sizes: impl IntoIterator<Item = u64>) -> Minimum {
        let (mut rows, mut batches, mut keys) = (0u64, 0u64, 0u64);
        for n in partition_sizes {
            rows += n;
            batches += n.div_ceil(MAX_BATCH_OPERATIONS as u64);
            keys += 1;
        }
        Minimum {
            rows,
            reads: rows.div_ceil(u64::from(MAX_TAKE)),
            batches,
            partition_keys: keys,
        }
    }

    /// The fewest requests for `job`: a copy or a delete reads and writes every batch; a count
    /// reads; an export reads and writes one part per 1,000 rows and a manifest; an import
    /// reads the manifest and those parts and writes every batch; an enqueue reads and puts one
    /// message per `rowsPerMessage` rows.
    pub(super) fn requests(&self, job: Job) -> u64 {
        match job {
            Job::Copy | Job::Delete => self.reads + self.batches,
            // An index build is judged against a count's requests (issue 29: ≤ 1.2 ×).
            Job::Count | Job::Index => self.reads,
            Job::Export => 2 * self.reads + 1,
            Job::Import => self.reads + 1 + self.batches,
            Job::Enqueue => self.reads + self.rows.div_ceil(ENQUEUE_ROWS_PER_MESSAGE),
        }
    }
}

impl Minimum {
    /// The fewest requests for `variant`: its job's, an enqueue's at its own `rowsPerMessage`.
    pub(super) fn requests_of(&self, variant: Variant) -> u64 {
        match variant.rows_per_message() {
            Some(n) => self.reads + self.rows.div_ceil(n),
            None => self.requests(variant.job()),
        }
    }
}

/// Storage requests of one variant, split by kind; table kinds count the data tables only,
/// `bookkeeping_*` the scans and work tables.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Requests {
    pub total: u64,
    pub query: u64,
    pub batch: u64,
    pub point_read: u64,
    pub table_admin: u64,
    pub bookkeeping: u64,
    pub bookkeeping_query: u64,
    pub bookkeeping_batch: u64,
    pub bookkeeping_point_read: u64,
    pub queue_put: u64,
    pub queue_get: u64,
    pub queue_delete: u64,
    pub queue_update: u64,
    pub queue_admin: u64,
    /// Blob Storage (export and import): Put Blob/Block/Block List; Get Blob/Properties/Block
    /// List; List Blobs; Create Container.
    pub blob_write: u64,
    pub blob_read: u64,
    pub blob_list: u64,
    pub blob_admin: u64,
}

impl Requests {
    /// Classifies the proxy's counts (delta over the run) given the bookkeeping table names.
    pub fn classify(counts: &Counts, bookkeeping_tables: &[&str]) -> Requests {
        let mut r = Requests::default();
        for ((kind, resource), &n) in counts {
            r.total += n;
            let bookkeeping = bookkeeping_tables
                .iter()
                .any(|t| t.eq_ignore_ascii_case(resource));
            let slot = match (kind.as_str(), bookkeeping) {
                ("query", false) => &mut r.query,
                ("batch", false) => &mut r.batch,
                ("point_read", false) => &mut r.point_read,
                ("query", true) => &mut r.bookkeeping_query,
                ("batch", true) => &mut r.bookkeeping_batch,
                ("point_read", true) => &mut r.bookkeeping_point_read,
                ("queue_put", _) => &mut r.queue_put,
                ("queue_get", _) => &mut r.queue_get,
                ("queue_delete", _) => &mut r.queue_delete,
                ("queue_update", _) => &mut r.queue_update,
                ("queue_admin", _) => &mut r.queue_admin,
                // Deletes (an index build's cleanup) count with the writes in the bench's columns.
                ("blob_write" | "blob_delete", _) => &mut r.blob_write,
                ("blob_read", _) => &mut r.blob_read,
                ("blob_list", _) => &mut r.blob_list,
                ("blob_admin", _) => &mut r.blob_admin,
                // Table create/delete: the destination and, at handler start, bookkeeping tables.
                _ => &mut r.table_admin,
            };
            *slot += n;
        }
        r.bookkeeping = r.bookkeeping_query + r.bookkeeping_batch + r.bookkeeping_point_read;
        r
    }

    /// Requests the handler itself makes (everything but the host's queue receives, deletes,
    /// visibility updates and queue creation).
    pub fn handler_made(&self) -> u64 {
        self.data() + self.table_admin + self.blob_admin + self.bookkeeping + self.queue_put
    }

    /// Reads and writes of the source and destination tables, and of an export's blobs.
    pub fn data(&self) -> u64 {
        self.query
            + self.batch
            + self.point_read
            + self.blob_write
            + self.blob_read
            + self.blob_list
    }

    pub(super) fn per_1000(&self, rows: u64) -> BTreeMap<&'static str, f64> {
        let f = |n: u64| per_1000(n, rows);
        BTreeMap::from([
            ("total", f(self.total)),
            ("data", f(self.data())),
            ("query", f(self.query)),
            ("batch", f(self.batch)),
            ("point_read", f(self.point_read)),
            ("table_admin", f(self.table_admin)),
            ("bookkeeping", f(self.bookkeeping)),
            ("bookkeeping_query", f(self.bookkeeping_query)),
            ("bookkeeping_batch", f(self.bookkeeping_batch)),
            ("bookkeeping_point_read", f(self.bookkeeping_point_read)),
            ("queue_put", f(self.queue_put)),
            ("queue_get", f(self.queue_get)),
            ("queue_delete", f(self.queue_delete)),
            ("queue_update", f(self.queue_update)),
            ("queue_admin", f(self.queue_admin)),
            ("blob_write", f(self.blob_write)),
            ("blob_read", f(self.blob_read)),
            ("blob_list", f(self.blob_list)),
            ("blob_admin", f(self.blob_admin)),
        ])
    }
}

pub(super) fn per_1000(n: u64, rows: u64) -> f64 {
    n as f64 * 1000.0 / rows.max(1) as f64
}

pub(super) fn delta(after: &Counts, before: &Counts) -> Counts {
    after
        .iter()
        .map(|(k, n)| (k.clone(), n - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimum_counts_reads_and_batches_per_partition() {
        let m = Minimum::of([1, 100, 101, 250]);
        assert_eq!(
            (m.reads, m.batches, m.partition_keys),
            (1, 1 + 1 + 2 + 3, 4)
        );
        assert_eq!(Minimum::of(std::iter::repeat(3).take(1000)).reads, 3);
        assert_eq!(m.requests(Job::Copy), 8);
        assert_eq!(m.requests(Job::Delete), 8);
        assert_eq!(m.requests(Job::Count), 1);
        assert_eq!(m.requests(Job::Export), 3);
        assert_eq!(m.requests(Job::Import), 9);
        assert_eq!(m.requests(Job::Enqueue), 1 + 452_u64.div_ceil(32));
        assert_eq!(
            m.requests_of(Variant::PrefixEnqueue),
            1 + 452_u64.div_ceil(32)
        );
        assert_eq!(m.requests_of(Variant::PrefixEnqueueOne), 1 + 452);
        assert_eq!(m.requests_of(Variant::PrefixCopy), 8);
    }

    #[test]
    fn requests_split_data_bookkeeping_and_queues() {
        let counts: Counts = [
            (("query", "Src"), 3),
            (("batch", "Dst"), 10),
            (("point_read", "Work"), 4),
            (("batch", "work"), 2),
            (("query", "Scans"), 1),
            (("table_admin", ""), 2),
            (("queue_get", "q-ps"), 7),
            (("queue_put", "q-tc"), 5),
            (("blob_write", "c"), 2),
            (("blob_read", "c"), 1),
        ]
        .into_iter()
        .map(|((k, r), n)| ((k.to_string(), r.to_string()), n))
        .collect();
        let r = Requests::classify(&counts, &["Scans", "Work"]);
        assert_eq!((r.query, r.batch, r.point_read, r.data()), (3, 10, 0, 16));
        assert_eq!((r.blob_write, r.blob_read), (2, 1));
        assert_eq!(
            (r.bookkeeping, r.bookkeeping_point_read, r.bookkeeping_batch),
            (7, 4, 2)
        );
        assert_eq!(
            (r.queue_get, r.queue_put, r.table_admin, r.total),
            (7, 5, 2, 37)
        );
        assert_eq!(r.per_1000(2000)["total"], 18.5);
    }
}
