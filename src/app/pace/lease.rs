//! The scan's shared schedule: one row per rate-limited scan, holding the time its next token is
//! free (`NextFreeAt`), leased in chunks by conditional replace (docs/rate-limit.md).
//!
//! Invariants:
//! 1. A chunk is granted only by a write conditional on the ETag of the row as read (or as this
//!    instance last wrote it), so two grants never overlap: each moves `NextFreeAt` forward from
//!    what the other left.
//! 2. A solo chunk (longer: `solo_span_us`) is granted only when the row is still as this
//!    instance last wrote it (its ETag) and that span has ended: no other instance leased since,
//!    and this one did not use all it had. An instance sending well below the limit alone then
//!    leases about once per solo span instead of once per chunk's 50 ms (docs/rate-limit.md).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use serde_json::json;

use crate::storage::{BatchOperation, Entity, StorageError, StorageErrorKind, TableStore};

/// The schedule row's key in the scan's shard-0 partition of the work table
/// (`{scanId}-00`), where the retention cleanup deletes it with the scan's work rows.
pub const PACE_ROW: &str = "pace";
/// The row's property: the schedule's next free time, in microseconds since the Unix epoch,
/// as decimal digits (a string: JSON numbers would be read as 32-bit or double).
pub const NEXT_FREE_AT: &str = "NextFreeAt";
/// Most read-and-write rounds one grant tries before reporting contention (each round lost
/// means another instance got a chunk: the scan goes on).
const MAX_ROUNDS: u32 = 8;

/// A granted chunk: its tokens' times run from `start` (microseconds since the epoch) for
/// `span_us`, one every `1/limit` s; `requests` is what the grant cost in storage requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub start: i64,
    pub span_us: i64,
    pub requests: u64,
}

/// What a lease from memory did ([`TableSchedule::take_as_written`]).
enum FromMemory {
    Granted(Grant),
    /// Nothing sent: this instance wrote no row, or its chunk has not ended.
    NotTried,
    /// Another instance wrote the row since: the conditional write lost (one request).
    Lost,
}

type Granting<'a> = Pin<Box<dyn Future<Output = Result<Grant, StorageError>> + Send + 'a>>;

/// Where a scan's schedule lives (object-safe, so a pacer needs no store type).
pub trait Schedule: Send + Sync {
    /// Takes `span_us` microseconds of the schedule from `max(NextFreeAt, now_us)` on, or
    /// `solo_span_us` from `now_us` for a solo chunk (invariant 2).
    fn grant(&self, now_us: i64, span_us: i64, solo_span_us: i64) -> Granting<'_>;
}

/// The schedule row of scan `scan_id` in `table` (the work table) of `store`, as this instance
/// last wrote it.
pub struct TableSchedule<T> {
    pub store: T,
    pub table: String,
    pub scan_id: String,
    /// `NextFreeAt` and the ETag of this instance's last write of the row.
    written: Mutex<Option<(i64, String)>>,
    /// Whether this instance's last lease found the row as it had written it before (or made
    /// it): no other instance leased in between.
    alone: AtomicBool,
}

impl<T> TableSchedule<T> {
    pub fn new(store: T, table: impl Into<String>, scan_id: impl Into<String>) -> Self {
        TableSchedule {
            store,
            table: table.into(),
            scan_id: scan_id.into(),
            written: Mutex::new(None),
            alone: AtomicBool::new(false),
        }
    }
}

/// The partition holding a scan's schedule row: its shard-0 partition of the work table.
pub fn pace_partition(scan_id: &str) -> String {
    format!("{scan_id}-00")
}

impl<T: TableStore> TableSchedule<T> {
    async fn read(&self) -> Result<Option<(i64, String)>, StorageError> {
        let found = self
            .store
            .get_entity(&self.table, &pace_partition(&self.scan_id), PACE_ROW)
            .await?;
        let Some((entity, etag)) = found else {
            return Ok(None);
        };
        let next = entity
            .properties
            .get_str(NEXT_FREE_AT)
            .and_then(|s| s.parse::<i64>().ok())
            .ok_or_else(|| {
                StorageError::new(
                    StorageErrorKind::InvalidResponse,
                    format!("the pace row of scan {} is unreadable", self.scan_id),
                )
            })?;
        Ok(Some((next, etag)))
    }

    /// Writes `NextFreeAt = next` (conditional on `etag`; inserting without one) and remembers
    /// what it wrote.
    async fn write(&self, next: i64, etag: Option<String>) -> Result<(), StorageError> {
        let mut entity = Entity::new(pace_partition(&self.scan_id), PACE_ROW);
        entity
            .properties
            .insert(NEXT_FREE_AT, json!(next.to_string()));
        let op = match etag {
            Some(etag) => BatchOperation::Replace {
                entity,
                etag: Some(etag),
            },
            None => BatchOperation::Insert(entity),
        };
        let etags = self
            .store
            .submit_batch_with_etags(&self.table, &pace_partition(&self.scan_id), &[op])
            .await;
        let written = etags
            .as_ref()
            .ok()
            .and_then(|e| e.first().cloned().flatten());
        *self.written.lock().unwrap() = written.map(|etag| (next, etag));
        etags.map(|_| ())
    }

    /// A solo grant from the row as this instance last wrote it, without reading it, if that
    /// chunk has ended.
    async fn take_as_written(
        &self,
        now_us: i64,
        solo_span_us: i64,
    ) -> Result<FromMemory, StorageError> {
        let written = self.written.lock().unwrap().clone();
        let Some((_, etag)) = written.filter(|(next, _)| *next <= now_us) else {
            return Ok(FromMemory::NotTried);
        };
        match self.write(now_us + solo_span_us, Some(etag)).await {
            Ok(()) => Ok(FromMemory::Granted(Grant {
                start: now_us,
                span_us: solo_span_us,
                requests: 1,
            })),
            Err(e)
                if matches!(
                    e.kind,
                    StorageErrorKind::PreconditionFailed | StorageErrorKind::Conflict
                ) =>
            {
                Ok(FromMemory::Lost)
            }
            Err(e) => Err(e),
        }
    }

    async fn take(
        &self,
        now_us: i64,
        span_us: i64,
        solo_span_us: i64,
    ) -> Result<Grant, StorageError> {
        let mut requests = 0;
        // Only while this instance leases alone: with others leasing, the row is seldom as it
        // wrote it, and a write from memory would cost a request more than the read and write.
        if self.alone.load(Ordering::Relaxed) {
            match self.take_as_written(now_us, solo_span_us).await? {
                FromMemory::Granted(grant) => return Ok(grant),
                FromMemory::NotTried => {}
                FromMemory::Lost => {
                    // Its write lost: another instance leased.
                    self.alone.store(false, Ordering::Relaxed);
                    requests += 1;
                }
            }
        }
        for _ in 0..MAX_ROUNDS {
            requests += 1;
            let seen = self.read().await?;
            let written = self.written.lock().unwrap().clone().map(|(_, etag)| etag);
            // A row this instance made or last wrote: no one else leased since.
            let mine = matches!((&seen, &written), (Some((_, seen)), Some(w)) if seen == w);
            let next = seen.as_ref().map_or(now_us, |(next, _)| *next);
            let seen_none = seen.is_none();
            let (start, span_us) = match mine && next <= now_us {
                true => (now_us, solo_span_us),
                false => (next.max(now_us), span_us),
            };
            requests += 1;
            match self
                .write(start + span_us, seen.map(|(_, etag)| etag))
                .await
            {
                Ok(()) => {
                    self.alone.store(mine || seen_none, Ordering::Relaxed);
                    return Ok(Grant {
                        start,
                        span_us,
                        requests,
                    });
                }
                // Another instance took a chunk (or made the row) in between: read again.
                Err(e)
                    if matches!(
                        e.kind,
                        StorageErrorKind::PreconditionFailed | StorageErrorKind::Conflict
                    ) => {}
                Err(e) => return Err(e),
            }
        }
        Err(StorageError::new(
            StorageErrorKind::Transient,
            format!(
                "the pace row of scan {} changed {MAX_ROUNDS} times while leasing",
                self.scan_id
            ),
        ))
    }
}

impl<T: TableStore> Schedule for TableSchedule<T> {
    fn grant(&self, now_us: i64, span_us: i64, solo_span_us: i64) -> Granting<'_> {
        Box::pin(self.take(now_us, span_us, solo_span_us))
    }
}
