//! The scan's shared schedule: one row per rate-limited scan, holding the time its next token is
//! free (`NextFreeAt`), leased in chunks by conditional replace (docs/rate-limit.md).
//!
//! Invariant: a chunk is granted only by a write conditional on the ETag of the row as read, so
//! two grants never overlap: each moves `NextFreeAt` forward from what the other left.

use std::future::Future;
use std::pin::Pin;

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

/// A granted chunk: its tokens' times run from `start` (microseconds since the epoch), one
/// every `1/limit` s; `requests` is what the grant cost in storage requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub start: i64,
    pub requests: u64,
}

type Granting<'a> = Pin<Box<dyn Future<Output = Result<Grant, StorageError>> + Send + 'a>>;

/// Where a scan's schedule lives (object-safe, so a pacer needs no store type).
pub trait Schedule: Send + Sync {
    /// Takes `span_us` microseconds of the schedule from `max(NextFreeAt, now_us)` on.
    fn grant(&self, now_us: i64, span_us: i64) -> Granting<'_>;
}

/// The schedule row of scan `scan_id` in `table` (the work table) of `store`.
pub struct TableSchedule<T> {
    pub store: T,
    pub table: String,
    pub scan_id: String,
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
        self.store
            .submit_batch(&self.table, &pace_partition(&self.scan_id), &[op])
            .await
    }

    async fn take(&self, now_us: i64, span_us: i64) -> Result<Grant, StorageError> {
        let mut requests = 0;
        for _ in 0..MAX_ROUNDS {
            requests += 1;
            let seen = self.read().await?;
            let start = seen
                .as_ref()
                .map_or(now_us, |(next, _)| (*next).max(now_us));
            requests += 1;
            match self
                .write(start + span_us, seen.map(|(_, etag)| etag))
                .await
            {
                Ok(()) => return Ok(Grant { start, requests }),
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
    fn grant(&self, now_us: i64, span_us: i64) -> Granting<'_> {
        Box::pin(self.take(now_us, span_us))
    }
}
