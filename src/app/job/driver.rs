//! The [`Driver`] trait: one kind of work a scan can do (the reference design's
//! `TableScanDriver`). The scan engine finds the work; the scan's driver says what becomes of
//! it. A driver is one module under `drivers/` implementing this trait, and one entry of the
//! registry (`drivers::registry`); nothing else names it.
//!
//! A driver decides, through its trait items:
//! - its part of a start request: its own fields ([`Driver::Fields`], camelCase, unknown fields
//!   refused), what it accepts of the common ones (`SCANS_TABLE`, `FILTER`, `SELECT`), checks
//!   with a 4xx naming the field ([`Driver::validate`]), what the scan records for it
//!   ([`Driver::setup`]: its target table, and its own settings as [`Driver::Options`]), and
//!   storage to prepare before the scan starts ([`Driver::prepare`], e.g. the destination);
//! - what the scan's root work is ([`Driver::root`]: the scan engine's root step, or the
//!   driver's own item for drivers that scan no table);
//! - what one scanned segment becomes ([`Driver::segment`]: counters and/or work items), or,
//!   for a driver that works in the scan's steps (`StepWork::Rows`), the work done on the rows
//!   a step read ([`Driver::work_rows`]: no work item, no queue message, no re-read);
//! - how one work item runs ([`Driver::run`], in the `TableCopy` function, which runs every
//!   driver's items): bounded like every invocation (at most [`MAX_ITEM_QUERIES`] queries and
//!   [`MAX_ITEM_ROWS`] rows for items that read a key range); the rest is handed on as new
//!   items (children of the outcome);
//! - optional further phases ([`Driver::phase`]): a phase starts (its root item registered and
//!   queued) only once every work item of the phases before it has finished and none failed,
//!   so a driver can check everything before it changes anything;
//! - an optional step once every work item has finished, before the scan is recorded
//!   `completed` ([`Driver::complete`]).
//!
//! Invariants:
//! - Work items ([`Driver::Item`]) and recorded settings ([`Driver::Options`]) are the
//!   driver's own serde types. An item's JSON text is its identity (the work row id hashes
//!   it), so serialization must be deterministic (structs and enums, no maps with unordered
//!   keys) and must never change for an item already queued; the same holds for the settings
//!   a recorded scan reads back.
//! - Every method runs under at-least-once delivery: [`Driver::run`] may run twice, or
//!   concurrently, for one item (only one execution's outcome counts), and
//!   [`Driver::complete`] may run more than once: both must be idempotent.
//! - A driver reads what to do from the scan's recorded [`ScanContext`] (never from a
//!   message), and keeps what it reuses across invocations in its own module
//!   (`AppState::driver_state`).

use crate::app::pace::Meter;
use std::future::Future;
use std::sync::Arc;
use tokio::time::Instant;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::app::config::Config;
use crate::app::error::ApiError;
use crate::app::job::begun::Begun;
use crate::app::job::context::{ScanContext, Setup};
use crate::app::job::error::WorkError;
use crate::app::job::outcome::{Segment, WorkOutcome, Worked};
use crate::app::job::request::{Accepts, ScanRequest};
use crate::app::messages::{ChildSpec, ItemJson, ItemMessage};
use crate::app::state::AppState;
use crate::app::tracking::Counters;
use crate::scan::Scanner;
use crate::storage::stores::Stores;
use crate::storage::{Entity, TableStore, MAX_TAKE};

/// Most queries one work item that reads a key range sends.
pub const MAX_ITEM_QUERIES: usize = 16;
/// Most rows one work item that reads a key range reads and writes (two pages: see
/// `drivers::kit::range::read_item`).
pub const MAX_ITEM_ROWS: usize = 2 * MAX_TAKE as usize;
/// Most [`Driver::step_rows`]: a step reads at most its row budget plus two pages, and a
/// delivery that adopted its outcome reads each of its ranges again in at most eight reads of
/// [`MAX_ITEM_ROWS`] (`drivers::kit::hooks`).
pub const MAX_STEP_ROWS: usize = 7 * MAX_ITEM_ROWS;
/// Bytes of row text (`Entity::text_len`) after which a step that works on its rows reads no
/// further page (`StepBudget::max_row_bytes`): a step holds its rows until its work is done,
/// and up to two dozen steps run at once on an instance, so what they hold is bounded by size
/// as well as by rows (8 MiB is 14,000 rows of 600 bytes, or 2,000 of 4 KiB).
pub const MAX_STEP_ROW_BYTES: usize = 8 << 20;
/// Most [`Driver::step_query_scale`]: 64 queries at the app's default budget, each one page.
pub const MAX_STEP_QUERY_SCALE: usize = 4;

/// One kind of work a scan can do. See the module documentation.
pub trait Driver: Send + Sync + 'static {
    /// The request's `"driver"` value, and how the scan records it.
    const NAME: &'static str;
    /// Whether the scan engine scans `sourceTable` for this driver. `false`: the request has no
    /// `sourceTable` nor any scan field, and [`Driver::root`] must give the driver's own item.
    const SCANS_TABLE: bool = true;
    /// Whether the driver accepts `filter` (applied in the key ranges it re-reads).
    const FILTER: bool = false;
    /// Whether the driver accepts `select` (the properties its re-read asks for).
    const SELECT: bool = false;
    /// Whether [`Driver::complete`] does anything (saves the drained checks it needs otherwise).
    const COMPLETES: bool = false;
    /// How many phases follow the root's ([`Driver::phase`]).
    const PHASES: u32 = 0;
    /// Whether [`Driver::work_rows`] changes the rows a scan reads (a delete): a step then
    /// records what it read before working on it, so that a duplicate delivery reading after
    /// the work adopts the first reading (its `rowsScanned`) instead of counting fewer rows.
    const CHANGES_SOURCE: bool = false;
    /// Whether [`Driver::work_runs`] counts the rows it matched itself (`rowsMatched`: an
    /// expire, whose own test of each row's time leaves live rows alone); otherwise every row
    /// a step gives it, and does not hand off, counts as matched.
    const COUNTS_MATCHED: bool = false;
    /// Rows after which a step that works on its rows (`StepWork::Rows`) reads no further page
    /// (`StepBudget::max_rows`; the step's query budget and [`MAX_STEP_ROW_BYTES`] bound it
    /// too). A driver whose cost is per step rather than per row (the index: one blob per
    /// step; an enqueue of many rows a message) may ask for more, up to [`MAX_STEP_ROWS`], what
    /// a delivery that adopted the step's outcome reads again.
    fn step_rows(context: &ScanContext) -> usize {
        let _ = context;
        MAX_ITEM_ROWS
    }

    /// How many times the app's query budget (`StepBudget::max_queries`) a step that works on
    /// its rows may send, 1..=[`MAX_STEP_QUERY_SCALE`]: in a table of many small partitions a
    /// step's queries run out long before its rows, so a driver with a cost per step asks for
    /// more (each query is one page; a step of 64 stays within seconds).
    fn step_query_scale(context: &ScanContext) -> usize {
        let _ = context;
        1
    }

    /// The driver's own request fields; `#[serde(rename_all = "camelCase",
    /// deny_unknown_fields)]` so an unknown field is a 4xx naming it.
    type Fields: Serialize + DeserializeOwned + Send + Sync;
    /// The driver's own recorded settings (the context's `o`, read back with
    /// `ScanContext::options`), e.g. a blob container or a queue on any allowed connection;
    /// `()` for none.
    type Options: Serialize + DeserializeOwned + Send + Sync;
    /// One unit of this driver's work (deterministic serialization: it is the item's identity).
    type Item: Serialize + DeserializeOwned + Send + Sync;

    /// Checks the driver's fields against the rest of the request, without storage; a 4xx names
    /// the field ([`ApiError::field`]).
    fn validate(
        fields: &Self::Fields,
        request: &ScanRequest,
        config: &Config,
    ) -> Result<(), ApiError>;

    /// What the scan records for this driver (after [`Driver::validate`] accepted it).
    fn setup(fields: &Self::Fields, request: &ScanRequest) -> Setup<Self::Options>;

    /// Storage to prepare before the scan is recorded (idempotent), e.g. the destination table.
    /// It may add what it learned to the context's options (`ScanContext::set_options`, e.g.
    /// the digest of what it checked), which the scan then records.
    fn prepare<S: Stores>(
        state: &AppState<S>,
        context: &mut ScanContext,
    ) -> impl Future<Output = Result<(), ApiError>> + Send {
        let _ = (state, context);
        async { Ok(()) }
    }

    /// The scan's root work item: by default the scan engine's root step (`T`: the store the
    /// scan will read).
    fn root<T: TableStore>(context: &ScanContext) -> Result<ChildSpec, WorkError> {
        Ok(ChildSpec::Step(Scanner::<T>::root(context.strategy)))
    }

    /// What one scanned segment (rows with keys only, in key order) becomes. The scan counts
    /// `rowsScanned` itself.
    fn segment(context: &ScanContext, rows: &[Entity]) -> Segment<Self::Item>;

    /// Does this driver's work on rows a scan step read (scans recorded with
    /// `StepWork::Rows`), returning how many rows it wrote (`rowsWritten`; every row it is
    /// given counts as matched, and the step counts `rowsScanned`). At most a step's row budget;
    /// may run more than once for the same rows (at-least-once delivery), so it must be
    /// idempotent.
    fn work_rows<S: Stores>(
        state: &AppState<S>,
        scan: &ScanContext,
        requests: &Arc<Meter>,
        rows: Vec<Entity>,
    ) -> impl Future<Output = Result<i64, WorkError>> + Send {
        let _ = (state, scan, requests, rows);
        async {
            Err(WorkError::Permanent(format!(
                "the {} driver does no work in scan steps",
                Self::NAME
            )))
        }
    }

    /// The counters a step's work on its rows adds (`rowsMatched` aside, which the adapter
    /// counts), the rows given as the step's contiguous runs (no row of the table lies between a
    /// run's first and last row but the run's own; runs in key order). By default,
    /// [`Driver::work_rows`] on the runs joined, counting its rows written. A driver that
    /// records key ranges (the index) or writes more than rows (the enqueue driver's messages)
    /// implements this one instead, with the same contract. A driver whose work is paced may
    /// stop starting work at `until` and hand the rows it did not reach to work items of its
    /// own ([`Worked::handed_off`]); the others ignore it.
    fn work_runs<S: Stores>(
        state: &AppState<S>,
        scan: &ScanContext,
        requests: &Arc<Meter>,
        runs: Vec<Vec<Entity>>,
        until: Instant,
    ) -> impl Future<Output = Result<Worked, WorkError>> + Send {
        let _ = until;
        async move {
            let rows_written = Self::work_rows(state, scan, requests, runs.concat()).await?;
            Ok(Worked::from(Counters {
                rows_written,
                ..Counters::default()
            }))
        }
    }

    /// Runs one work item of this driver (bounded; hands the rest on as children).
    fn run<S: Stores>(
        state: &AppState<S>,
        begun: &Begun<ItemMessage>,
        item: Self::Item,
    ) -> impl Future<Output = Result<WorkOutcome, WorkError>> + Send;

    /// The root work item of phase `n` (`1..=PHASES`; phase 0's is [`Driver::root`]). It is
    /// started by the drained check that finds every item of phases `0..n` finished and none
    /// failed, and the scan completes only once it and all it spawned have finished too. The
    /// item must depend only on the scan's context: its JSON is its identity, so concurrent
    /// drained checks start it once.
    fn phase(context: &ScanContext, n: u32) -> Result<ChildSpec, WorkError> {
        let _ = context;
        Err(WorkError::Permanent(format!(
            "the {} driver has no phase {n}",
            Self::NAME
        )))
    }

    /// Whether phase `n`'s root, finished with `result` (its `WorkOutcome::result`), did what
    /// the phases after it would have done, so that none of them starts (e.g. the index's
    /// assembly of a small build, which publishes it itself). Read by the drained check that
    /// found the root finished; the phases after it then count as done.
    fn ends_phases(n: u32, result: Option<&str>) -> bool {
        let _ = (n, result);
        false
    }

    /// Runs once every work item of the scan has finished (none failed), before the scan is
    /// recorded `completed`; may run more than once. An error leaves the scan running (the next
    /// drained check, e.g. a status read, tries again); a permanent one fails it.
    fn complete<S: Stores>(
        state: &AppState<S>,
        context: &ScanContext,
    ) -> impl Future<Output = Result<(), WorkError>> + Send {
        let _ = (state, context);
        async { Ok(()) }
    }
}

/// What driver `D` accepts of a request's common fields.
pub fn accepts<D: Driver>() -> Accepts {
    Accepts {
        driver: D::NAME,
        scans_table: D::SCANS_TABLE,
        filter: D::FILTER,
        select: D::SELECT,
    }
}

/// A driver's item as a child of an outcome (or a scan's root).
pub fn item_child<D: Driver>(item: &D::Item) -> Result<ChildSpec, WorkError> {
    Ok(ChildSpec::Item(ItemJson::from_item(item)?))
}
