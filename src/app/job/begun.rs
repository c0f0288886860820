//! A begun work item ([`Begun`]): its message, its scan's recorded context, and where it stands
//! (to execute, or with an outcome an earlier delivery recorded).

use crate::app::pace::Meter;
use std::sync::Arc;

use crate::app::job::context::ScanContext;
use crate::app::job::outcome::WorkOutcome;
use crate::app::protocol::QueueInvocation;

/// Where a begun item stands.
pub enum Progress {
    /// Not executed yet: execute it, then record the outcome under this ETag.
    Fresh { etag: String },
    /// An earlier execution recorded this outcome: finish it without executing again.
    Recorded { etag: String, outcome: WorkOutcome },
}

/// A decoded, unfinished work item.
pub struct Begun<M> {
    pub message: M,
    /// The scan's recorded context: what the item reads and writes.
    pub scan: Arc<ScanContext>,
    pub invocation: QueueInvocation,
    pub work_id: String,
    /// The counter shard of the item's row (see `messages::shard_for`).
    pub shard: u32,
    /// Set by the runner (`work::Runner::begin`).
    pub progress: Progress,
    /// Storage requests made on behalf of this item.
    pub requests: Arc<Meter>,
}

impl<M> Begun<M> {
    /// Whether the item still has to be executed (no outcome was recorded by an earlier attempt).
    pub fn needs_execution(&self) -> bool {
        matches!(self.progress, Progress::Fresh { .. })
    }
}
