//! Scan bookkeeping: scan records, pending-work rows and sharded counters, kept exact under
//! at-least-once delivery.
//!
//! Layout (both tables live in the `AzureWebJobsStorage` account):
//! - scans table: one row per scan, PK = scan id (newest first), RK = `scan`.
//! - work table: per scan, `shards` partitions `{scanId}-{shard:02}`. Each holds the rows of the
//!   work items registered there and, once the first is, one `counter` row. A step or driver
//!   work item lives in the shard its message names (`"h"`: a parent's first child goes to the
//!   parent's shard, the others where their ids hash; messages queued by earlier versions name
//!   none and hash too, except the first *item* of a step, which the previous version put in its
//!   parent's shard: see `WorkOutcome::grouped`). Every instance working on one scan must run
//!   the same version: an older one adopting a newer outcome would register its children
//!   elsewhere.
//!
//! Invariants that make completion exact:
//! 1. A child's row is inserted (Insert, never upsert) in the same entity group transaction that
//!    adds 1 to `Created` on its shard's counter, so each work item is counted once however many
//!    times its parent runs. Rows are never deleted while anything may still run for their scan,
//!    only marked `done`/`failed`/`dropped`, so a late duplicate parent cannot resurrect a
//!    finished child. Only [`retention`] deletes them: an ended scan's, a retention period after
//!    its end, once its record holds the final counters (the record outlives the rows, so a late
//!    message finds the scan ended and writes nothing; see `retention`'s invariants). A shard's counter row is inserted
//!    by the first such transaction in the shard (the root's at start), never otherwise: a
//!    missing counter row means nothing was ever registered there, i.e. zero.
//! 2. Executing a step is not deterministic (Azure may cut pages anywhere, so two executions of
//!    the same step can split its range differently). So the first execution to finish records
//!    its outcome (children + counters) on the item's row, guarded by the row's ETag
//!    (`pending` → `expanded`); every later or concurrent execution adopts the recorded outcome.
//!    One change of a recorded outcome is allowed, by the execution that holds the row's ETag:
//!    an enqueue step handing the rows it did not put to items of their own records its outcome
//!    again (`expanded` → `expanded`, or `pending` → `expanded` if it had recorded none) with
//!    those items as more children and no in-step ranges, before it registers them
//!    (`Tracker::rewrite_outcome`); an execution that adopts the second one has no in-step
//!    ranges to work on: it registers and queues the children and completes.
//!    The children that live in the item's own shard are registered (as in 1) in that same
//!    transaction, so they are exactly the recorded outcome's: a losing execution's transaction
//!    fails as a whole and registers nothing. The others are registered after it, idempotently
//!    (rows already there are left alone), by whichever execution goes on to complete the item.
//! 3. Children are registered before their parent completes, and a parent completes (row marked
//!    done + `Completed += 1` + its row/request counters) in one transaction guarded by the row's
//!    ETag, so a duplicate completion fails instead of double counting. (The completion may try
//!    the counter row's ETag from the recording transaction first; a stale one fails the whole
//!    transaction, and the counter is read again.)
//! 4. Hence Σ Created − Σ Completed is the number of unfinished items, never 0 early. It is
//!    read with a double collect (two passes over the monotonic counters that agree; each pass
//!    one query over the scan's shard partitions, reading each counter row once), which is a
//!    consistent snapshot. A counter row that appears between the passes makes them differ.
//! 5. A step that works on the rows it read (`ScanContext::in_step`) does that work after it
//!    recorded its outcome and queued its children, and before it completes; the outcome records
//!    the rows' key ranges, and an execution that adopts it works on those ranges again (the
//!    recording one may have died before or during the work). A step whose work changes what it
//!    reads (a delete) records its outcome even without children, so its `rowsScanned` is the
//!    first reading's, not a duplicate's that ran after some rows were deleted.
//! 6. Once a scan has ended (cancelled or failed), a work item that meets it is finished without
//!    running (`dropped`, with `Completed` and `Dropped` += 1 in the same kind of transaction), so
//!    the queued messages clean up an ended scan's work rows as they are delivered — unless a
//!    last delivery marked its row (invariant 7): that delivery may be recording the failure
//!    that ended the scan, and a duplicate copy of the item's message must not drop the row
//!    under it. The marked row is finished by that delivery, or dropped by its poison message.
//! 7. A work item's delivery whose dequeue count reached the maximum marks the item's row
//!    (`LastDelivery`, merged under the row's ETag) before it works, and only then (or, on an
//!    earlier delivery, just before it records a failure no retry can fix: invariant 6); a
//!    redelivery finding the mark does not write it again. The poison functions fail only an
//!    unfinished item so marked: a message in a poison queue is no proof that its item
//!    exhausted its deliveries (it may be forged), the mark is. The mark costs one request, on
//!    last deliveries and before an early failure no retry can fix only.
//!    Before failing such an item they re-queue it for a few more rounds (`work::poison`):
//!    each round starts with one merge under the row's ETag that clears the mark and counts
//!    the round (`Requeues`, `RequeuedBy`); only a marked row past the last round fails.
//! 8. The storage adapters retry a request whose answer was lost, so a conditional write can
//!    meet itself: 409 (its insert is there) or 412 (its own merge changed the ETag). Where
//!    that would read as another worker's win, the write is known by a read-back: a claim
//!    token (`ClaimedBy` on a phase claim, `CompletionLeaseBy` on the completion lease,
//!    `EndedBy` on a scan's end), a poison round's `RequeuedBy`, rows that a
//!    registration finds there already (looked up, not failed one transaction each), an
//!    outcome compared with its own. A check that took a lost answer for another's win would
//!    succeed and delete its message, and nothing would resume the scan.
//!
//! Time: every time the tracker stores or compares (a scan's start and end, a work row's
//! `CreatedAt`/`FinishedAt`, a phase claim's age, the completion lease) is [`Tracker::now`], the
//! clock it was given (`crate::clock`; the app's, through `AppState::tracker_on`).
//!
//! The module is split by concern: [`records`] (scan records), [`counters`] (sharded counters
//! and the drained check), [`work_rows`] (work items' rows), [`codec`] (how values are stored in
//! properties) and [`retention`] (what an ended scan keeps, and for how long).

mod codec;
mod completion;
mod counters;
mod records;
pub mod retention;
mod work_rows;

use std::time::Duration;

use crate::clock::{Clock, SYSTEM};
use crate::retry::{Backoff, Jitter, Schedule, Step, Verdict};
use crate::storage::{StorageError, StorageErrorKind, TableStore};

pub use codec::format_time;
pub use counters::Counters;
pub use records::{parse_list_token, ScanPage, ScanRecord, ScanState, COMPLETION_LEASE};
pub use work_rows::{
    Completion, RecordError, Recorded, RowMarks, WorkState, LAST_DELIVERY_PROPERTY,
    MAX_FOLDED_CHILDREN, REQUEUED_BY_PROPERTY, REQUEUES_PROPERTY, RESULT_PROPERTY,
};

/// Optimistic-concurrency retries on a contended row before giving up (the message retries).
const MAX_COUNTER_ATTEMPTS: u32 = 50;

/// Bookkeeping over a table store.
pub struct Tracker<'a, T: TableStore> {
    store: &'a T,
    scans_table: &'a str,
    work_table: &'a str,
    /// Told when this tracker ends a scan (queues its retention cleanup).
    on_end: Option<&'a dyn ScanEndHook>,
    /// Where its time of day comes from.
    clock: &'a Clock,
}

/// What is told when a tracker ends a scan ([`Tracker::with_end_hook`]). Best effort: it
/// cannot fail the end, which is already recorded.
pub trait ScanEndHook: Sync {
    fn scan_ended<'b>(&'b self, scan_id: &'b str) -> futures::future::BoxFuture<'b, ()>;
}

/// A child work item to register: its id, kind and the shard its row goes to.
pub struct NewWork {
    pub id: String,
    pub kind: &'static str,
    pub shard: u32,
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

/// A random token naming one attempt to claim something (a phase start, a completion lease),
/// stored with the claim: the adapters retry a write whose answer was lost, and a retry that
/// then finds the claim taken (409 or 412) reads it back and knows it by its token as its own.
/// Drawn from the thread's RNG, not [`JITTER`]: its value changes nothing, and drawing it there
/// would shift the simulator's seeded sequence.
fn claim_token() -> String {
    use rand::Rng;
    format!("{:016x}", rand::thread_rng().gen::<u64>())
}

/// Re-seeds this thread's contention-backoff jitter (used by the simulator for determinism).
pub fn seed_backoff_jitter(seed: u64) {
    JITTER.with(|j| *j.borrow_mut() = rand::SeedableRng::seed_from_u64(seed));
}

/// Backoff on a row contended under optimistic concurrency (HTTP 412): 10 ms doubling to
/// 640 ms, at most [`MAX_COUNTER_ATTEMPTS`] attempts.
const CONTENTION: Backoff = Backoff::new(
    MAX_COUNTER_ATTEMPTS,
    Duration::from_millis(10),
    Duration::from_millis(640),
);

/// Contention jitter: half the ceiling plus a uniform draw below the other half, from this
/// thread's [`JITTER`] (seedable for the simulator).
fn contention_jitter(ceiling: Duration) -> Duration {
    use rand::Rng;
    let base = (ceiling.as_millis() as u64 / 2).max(1);
    Duration::from_millis(base + JITTER.with(|j| j.borrow_mut().gen_range(0..base)))
}

/// A fresh contention schedule for one optimistic-concurrency loop.
fn contention() -> Schedule<fn(Duration) -> Duration> {
    CONTENTION.schedule(contention_jitter as fn(Duration) -> Duration)
}

/// After a failed attempt on a contended row: waits (or not, for [`Verdict::RetryNow`]) before
/// the next one, or gives up with a transient error once the attempts are used up.
async fn again<J: Jitter>(
    schedule: &mut Schedule<J>,
    verdict: Verdict,
    what: &str,
) -> Result<(), StorageError> {
    match schedule.after_failure(verdict) {
        Step::Sleep(delay) => {
            tokio::time::sleep(delay).await;
            Ok(())
        }
        Step::Now => Ok(()),
        Step::Stop | Step::Exhausted => Err(StorageError::new(
            StorageErrorKind::Transient,
            format!("{what} stayed contended"),
        )),
    }
}

impl<'a, T: TableStore> Tracker<'a, T> {
    /// Bookkeeping in `scans_table` and `work_table` of `store`, on the system's clock.
    pub fn new(store: &'a T, scans_table: &'a str, work_table: &'a str) -> Self {
        Tracker {
            store,
            scans_table,
            work_table,
            on_end: None,
            clock: &SYSTEM,
        }
    }

    /// This tracker, reading the time of day from `clock`.
    pub fn with_clock(mut self, clock: &'a Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The time of day on this tracker's clock.
    pub fn now(&self) -> time::OffsetDateTime {
        self.clock.now()
    }

    /// This tracker, telling `hook` about every scan it ends.
    pub fn with_end_hook(mut self, hook: &'a dyn ScanEndHook) -> Self {
        self.on_end = Some(hook);
        self
    }

    /// Creates the bookkeeping tables if missing.
    pub async fn ensure_tables(&self) -> Result<(), StorageError> {
        self.store.create_table(self.scans_table).await?;
        self.store.create_table(self.work_table).await?;
        Ok(())
    }
}
