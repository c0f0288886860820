//! Per-kind counts of storage requests, so benchmarks and scan status can report requests per
//! 1,000 rows. Every adapter increments exactly one counter per HTTP request it sends (retries
//! included: each attempt is a billable transaction).

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// The kinds of storage request tablescan distinguishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    /// Table query (one page).
    Query,
    /// Entity group transaction.
    Batch,
    /// Point read of one entity.
    PointRead,
    /// Table create/delete and other table-service calls.
    TableAdmin,
    QueuePut,
    QueueGet,
    QueueDelete,
    QueueUpdate,
    /// Queue create/delete/metadata.
    QueueAdmin,
}

/// Thread-safe request counters; cheap to share behind an `Arc`.
#[derive(Debug, Default)]
pub struct RequestCounters {
    query: AtomicU64,
    batch: AtomicU64,
    point_read: AtomicU64,
    table_admin: AtomicU64,
    queue_put: AtomicU64,
    queue_get: AtomicU64,
    queue_delete: AtomicU64,
    queue_update: AtomicU64,
    queue_admin: AtomicU64,
}

/// A point-in-time copy of [`RequestCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RequestCounts {
    pub query: u64,
    pub batch: u64,
    pub point_read: u64,
    pub table_admin: u64,
    pub queue_put: u64,
    pub queue_get: u64,
    pub queue_delete: u64,
    pub queue_update: u64,
    pub queue_admin: u64,
}

impl RequestCounters {
    pub fn new() -> Self {
        Self::default()
    }

    fn cell(&self, kind: RequestKind) -> &AtomicU64 {
        match kind {
            RequestKind::Query => &self.query,
            RequestKind::Batch => &self.batch,
            RequestKind::PointRead => &self.point_read,
            RequestKind::TableAdmin => &self.table_admin,
            RequestKind::QueuePut => &self.queue_put,
            RequestKind::QueueGet => &self.queue_get,
            RequestKind::QueueDelete => &self.queue_delete,
            RequestKind::QueueUpdate => &self.queue_update,
            RequestKind::QueueAdmin => &self.queue_admin,
        }
    }

    /// Records one request of `kind`.
    pub fn record(&self, kind: RequestKind) {
        self.cell(kind).fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> RequestCounts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        RequestCounts {
            query: get(&self.query),
            batch: get(&self.batch),
            point_read: get(&self.point_read),
            table_admin: get(&self.table_admin),
            queue_put: get(&self.queue_put),
            queue_get: get(&self.queue_get),
            queue_delete: get(&self.queue_delete),
            queue_update: get(&self.queue_update),
            queue_admin: get(&self.queue_admin),
        }
    }
}

impl RequestCounts {
    pub fn total(&self) -> u64 {
        self.table_total() + self.queue_total()
    }

    pub fn table_total(&self) -> u64 {
        self.query + self.batch + self.point_read + self.table_admin
    }

    pub fn queue_total(&self) -> u64 {
        self.queue_put + self.queue_get + self.queue_delete + self.queue_update + self.queue_admin
    }

    /// Field-wise difference `self - earlier` (saturating).
    pub fn since(&self, earlier: &RequestCounts) -> RequestCounts {
        RequestCounts {
            query: self.query.saturating_sub(earlier.query),
            batch: self.batch.saturating_sub(earlier.batch),
            point_read: self.point_read.saturating_sub(earlier.point_read),
            table_admin: self.table_admin.saturating_sub(earlier.table_admin),
            queue_put: self.queue_put.saturating_sub(earlier.queue_put),
            queue_get: self.queue_get.saturating_sub(earlier.queue_get),
            queue_delete: self.queue_delete.saturating_sub(earlier.queue_delete),
            queue_update: self.queue_update.saturating_sub(earlier.queue_update),
            queue_admin: self.queue_admin.saturating_sub(earlier.queue_admin),
        }
    }
}
