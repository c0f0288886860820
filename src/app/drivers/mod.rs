//! Drivers: what a scan does with the rows it finds. The scan engine finds the work (the
//! `PrefixScan` function runs scan steps); the scan's driver says what becomes of it (the
//! reference design's `TableScanDriver`). Each driver is one module implementing [`Driver`] and
//! one line of [`drivers!`] below; nothing else names it.
//!
//! A driver decides, through its trait methods:
//! - its part of a start request: its own fields ([`Driver::Fields`], camelCase, unknown fields
//!   refused), checked with a 4xx naming the field ([`Driver::validate`]), what the scan records
//!   for it ([`Driver::setup`]), and storage to prepare before the scan starts
//!   ([`Driver::prepare`], e.g. the destination table);
//! - what the scan's root work is ([`Driver::root`]: the scan engine's root step, or the
//!   driver's own item for drivers that scan no table);
//! - what one scanned segment becomes ([`Driver::segment`]: counters and/or work items), or,
//!   for a driver that works in the scan's steps ([`Setup::step_work`]), the work done on the
//!   rows a step read ([`Driver::work_rows`]: no work item, no queue message, no re-read);
//! - how one work item runs ([`Driver::run`], in the `TableCopy` function, which runs every
//!   driver's items): bounded like every invocation (at most [`MAX_ITEM_QUERIES`] queries and
//!   [`MAX_ITEM_ROWS`] rows for items that read a key range); the rest is handed on as new items
//!   (children of the outcome);
//! - optional further phases ([`Driver::phase`]): a phase starts (its root item registered and
//!   queued) only once every work item of the phases before it has finished and none failed,
//!   so a driver can check everything before it changes anything;
//! - an optional step once every work item has finished, before the scan is recorded
//!   `completed` ([`Driver::complete`]).
//!
//! A driver keeps what it reuses across invocations (clients of another service) in its own
//! module, through `AppState::driver_state`.
//!
//! Invariants:
//! - Work items are the driver's own serde type ([`Driver::Item`]). Its JSON text is the item's
//!   identity (the work row id hashes it), so serialization must be deterministic (structs and
//!   enums, no maps with unordered keys) and must never change for an item already queued.
//! - Every method runs under at-least-once delivery: [`Driver::run`] may run twice, or
//!   concurrently, for one item (only one execution's outcome counts), and
//!   [`Driver::complete`] may run more than once: both must be idempotent.
//! - A driver reads what to do from the scan's recorded [`ScanContext`] (never from a message).

pub mod copy;
pub mod count;
pub mod delete;
pub mod export;
pub mod import;
pub mod range;
#[cfg(all(test, feature = "lab"))]
mod tests;

use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use serde::de::{self, DeserializeOwned};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::app::config::Config;
use crate::app::error::ApiError;
use crate::app::functions::start_scan::ScanRequest;
use crate::app::messages::{ChildSpec, ItemJson, ItemMessage, ScanContext, TableRef, WorkSplit};
use crate::app::state::AppState;
use crate::app::tracking::{Counters, ScanState, Tracker, WorkState};
use crate::app::work::{Begun, WorkError, WorkOutcome};
use crate::scan::Scanner;
use crate::storage::{
    odata, Entity, QueueStore, StorageError, StorageErrorKind, TableStore, MAX_TAKE,
};

/// Most queries one work item that reads a key range sends.
pub const MAX_ITEM_QUERIES: usize = 16;
/// Most rows one work item that reads a key range reads and writes (two pages: see
/// `range::read_item`).
pub const MAX_ITEM_ROWS: usize = 2 * MAX_TAKE as usize;

/// What a driver records on its scan at start (part of the [`ScanContext`]).
#[derive(Debug, Clone, Default)]
pub struct Setup {
    /// The table the driver writes, if any.
    pub destination: Option<TableRef>,
    /// How copy work is split (the copy driver's `workSplit`).
    pub work_split: WorkSplit,
    /// The driver's own settings, read back with [`ScanContext::options`].
    pub options: Option<Value>,
    /// Where the driver's work on scanned rows is done.
    pub step_work: StepWork,
}

/// Where a driver's work on scanned rows is done (recorded on the scan: `ScanContext::in_step`).
#[derive(Debug, Clone, Default, PartialEq)]
pub enum StepWork {
    /// Scan steps read keys only; each segment becomes counters and/or work items
    /// ([`Driver::segment`]), and the items read what they need.
    #[default]
    Items,
    /// A prefix scan's prefix-query steps read `select` (`None`: every column; `Some(vec![])`:
    /// the keys) and do the driver's work on the rows they read ([`Driver::work_rows`]),
    /// reading at most [`MAX_ITEM_ROWS`] rows (plus the page that crosses it and a partition's
    /// page read inline: `StepBudget::max_rows`), so that they are bounded like a work item.
    /// This saves each work item's queue message, bookkeeping and re-read; the price is that
    /// such a step's follow-up steps are queued after its rows are written rather than before.
    /// Steps that walk one partition (and serial scans) read keys only and make items
    /// ([`Driver::segment`]), so a huge partition is still written by many invocations.
    Rows { select: Option<Vec<String>> },
}

/// What one scanned segment becomes: counters to add and work items to queue.
#[derive(Debug)]
pub struct Segment<I> {
    pub delta: Counters,
    pub items: Vec<I>,
}

impl<I> Default for Segment<I> {
    fn default() -> Self {
        Segment {
            delta: Counters::default(),
            items: Vec::new(),
        }
    }
}

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

    /// The driver's own request fields; `#[serde(rename_all = "camelCase",
    /// deny_unknown_fields)]` so an unknown field is a 4xx naming it.
    type Fields: Serialize + DeserializeOwned + Send + Sync;
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
    fn setup(fields: &Self::Fields, request: &ScanRequest) -> Setup;

    /// Storage to prepare before the scan is recorded (idempotent), e.g. the destination table.
    /// It may add what it learned to the context's `options` (e.g. the digest of what it
    /// checked), which the scan then records.
    fn prepare<T: TableStore + Clone, Q: QueueStore + Clone>(
        state: &AppState<T, Q>,
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
    /// [`StepWork::Rows`]), returning how many rows it wrote (`rowsWritten`; every row it is
    /// given counts as matched, and the step counts `rowsScanned`). At most a step's row budget;
    /// may run more than once for the same rows (at-least-once delivery), so it must be
    /// idempotent.
    fn work_rows<T: TableStore + Clone, Q: QueueStore + Clone>(
        state: &AppState<T, Q>,
        scan: &ScanContext,
        requests: &Arc<AtomicU64>,
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

    /// Runs one work item of this driver (bounded; hands the rest on as children).
    fn run<T: TableStore + Clone, Q: QueueStore + Clone>(
        state: &AppState<T, Q>,
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

    /// Runs once every work item of the scan has finished (none failed), before the scan is
    /// recorded `completed`; may run more than once. An error leaves the scan running (the next
    /// drained check, e.g. a status read, tries again); a permanent one fails it.
    fn complete<T: TableStore + Clone, Q: QueueStore + Clone>(
        state: &AppState<T, Q>,
        context: &ScanContext,
    ) -> impl Future<Output = Result<(), WorkError>> + Send {
        let _ = (state, context);
        async { Ok(()) }
    }
}

/// The registration list: one line per driver (`Variant => module::Type`). It defines
/// [`DriverId`] (how scans name their driver) and `with_driver!` (static dispatch on it).
macro_rules! drivers {
    ($($variant:ident => $module:ident :: $ty:ident),* $(,)?) => {
        /// A registered driver, as named in requests (`"driver"`) and recorded on scans.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum DriverId {
            $($variant),*
        }

        impl DriverId {
            /// Every registered driver.
            pub const ALL: &'static [DriverId] = &[$(DriverId::$variant),*];

            /// The driver's name (`Driver::NAME`).
            pub fn name(self) -> &'static str {
                match self {
                    $(DriverId::$variant => <$module::$ty as Driver>::NAME),*
                }
            }
        }

        /// `with_driver!(id, D => expr)`: evaluates `expr` with the type `D` bound to the
        /// driver type registered for `id`.
        macro_rules! with_driver {
            ($id:expr, $D:ident => $body:expr) => {
                match $id {
                    $($crate::app::drivers::DriverId::$variant => {
                        #[allow(dead_code)]
                        type $D = $crate::app::drivers::$module::$ty;
                        $body
                    })*
                }
            };
        }
        pub(crate) use with_driver;
    };
}

drivers! {
    Copy => copy::CopyDriver,
    Count => count::CountDriver,
    Delete => delete::DeleteDriver,
    Export => export::ExportDriver,
    Import => import::ImportDriver,
}

impl DriverId {
    pub fn from_name(name: &str) -> Option<DriverId> {
        DriverId::ALL.iter().copied().find(|d| d.name() == name)
    }
}

impl Serialize for DriverId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for DriverId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        DriverId::from_name(&name).ok_or_else(|| {
            let known: Vec<&str> = DriverId::ALL.iter().map(|d| d.name()).collect();
            de::Error::custom(format!(
                "unknown driver {name:?}, expected one of: {}",
                known.join(", ")
            ))
        })
    }
}

/// The default of a driver's `…Connection` fields: the app's own storage account.
pub fn default_connection() -> String {
    crate::app::config::STORAGE_SETTING.to_string()
}

/// Checks a table a driver writes: its name, its connection (allowed), and that it is none of
/// tablescan's bookkeeping tables; a 4xx names `destinationTable` or `destinationConnection`.
pub fn check_destination(config: &Config, connection: &str, table: &str) -> Result<(), ApiError> {
    crate::app::validate::table_name(table).map_err(|m| ApiError::field("destinationTable", m))?;
    check_connection(config, "destinationConnection", connection)?;
    check_table(config, "destinationTable", connection, table)
}

/// Refuses a connection name that is not an allowed app setting (`TABLESCAN_CONNECTIONS`).
pub fn check_connection(config: &Config, field: &str, name: &str) -> Result<(), ApiError> {
    if config.connections.contains_key(name) {
        return Ok(());
    }
    Err(ApiError::field(
        field,
        format!("{name:?} is not an allowed connection; name an app setting listed in TABLESCAN_CONNECTIONS"),
    ))
}

/// Refuses tablescan's own bookkeeping table names (up to case) on every connection.
pub fn check_table(
    config: &Config,
    field: &str,
    connection: &str,
    table: &str,
) -> Result<(), ApiError> {
    if config.is_bookkeeping_table(connection, table) {
        return Err(ApiError::field(
            field,
            format!(
                "{table} is the name of one of tablescan's bookkeeping tables, refused on every connection"
            ),
        ));
    }
    Ok(())
}

/// How a range item of `scan` is re-read: `select` (`None`: every column; `Some(vec![])`: keys
/// only), the scan's filter, and the test-only failure switch.
pub fn read_spec<T, Q>(
    state: &AppState<T, Q>,
    scan: &ScanContext,
    select: Option<Vec<String>>,
) -> Result<range::ReadSpec, WorkError> {
    Ok(range::ReadSpec {
        select,
        filter: scan.row_filter()?,
        fail_prefix: state.config.test_fail_prefix.clone(),
    })
}

/// A driver's item as a child of an outcome (or a scan's root).
pub fn item_child<D: Driver>(item: &D::Item) -> Result<ChildSpec, WorkError> {
    Ok(ChildSpec::Item(ItemJson::from_item(item)?))
}

impl ScanContext {
    /// The scan's `filter`, parsed (it was checked at start: failing now is permanent).
    pub fn row_filter(&self) -> Result<Option<odata::Expr>, WorkError> {
        self.filter
            .as_deref()
            .map(odata::parse)
            .transpose()
            .map_err(|e| {
                WorkError::Permanent(format!("scan {} has an unusable filter: {e}", self.scan_id))
            })
    }

    /// The driver's own settings recorded at start ([`Setup::options`]).
    pub fn options<O: DeserializeOwned>(&self) -> Result<O, WorkError> {
        serde_json::from_value(self.options.clone().unwrap_or(Value::Null)).map_err(|e| {
            WorkError::Permanent(format!(
                "scan {} has unreadable {} driver settings: {e}",
                self.scan_id,
                self.driver.name()
            ))
        })
    }
}

/// What one scanned segment becomes under the scan's driver, as an outcome to add to.
pub fn segment_outcome(
    context: &ScanContext,
    rows: &[Entity],
    outcome: &mut WorkOutcome,
) -> Result<(), WorkError> {
    with_driver!(context.driver, D => {
        let segment = D::segment(context, rows);
        outcome.delta = outcome.delta.plus(&segment.delta);
        for item in &segment.items {
            outcome.children.push(item_child::<D>(item)?);
        }
        Ok(())
    })
}

/// Does the scan's driver's work on the rows one of its steps read ([`Driver::work_rows`]);
/// every row counts as matched (scans with a filter do not work in steps).
pub async fn work_rows<T: TableStore + Clone, Q: QueueStore + Clone>(
    state: &AppState<T, Q>,
    scan: &ScanContext,
    requests: &Arc<AtomicU64>,
    rows: Vec<Entity>,
) -> Result<Counters, WorkError> {
    let matched = rows.len() as i64;
    let written = with_driver!(scan.driver, D => D::work_rows(state, scan, requests, rows).await)?;
    Ok(Counters {
        rows_matched: matched,
        rows_written: written,
        ..Counters::default()
    })
}

/// Whether the driver's step work changes the rows a scan reads ([`Driver::CHANGES_SOURCE`]).
pub fn changes_source(driver: DriverId) -> bool {
    with_driver!(driver, D => D::CHANGES_SOURCE)
}

/// How long a phase's root message stays invisible: time for its work row to be registered
/// after the message is queued (a delivery before that is retried: it finds no work row).
const PHASE_START_DELAY: std::time::Duration = std::time::Duration::from_secs(1);

/// Reads of a range that grew since it was scanned, before [`rework_range`] gives up for this
/// delivery.
const MAX_REWORK_ROUNDS: usize = 8;

/// Reads one key range of a step's rows again and does the driver's work on them
/// ([`work_rows`]): for a delivery that adopted a step's recorded outcome, whose rows the
/// recording delivery may not have worked on. A range that grew since it was scanned is read
/// to its end (within [`MAX_REWORK_ROUNDS`] reads of [`range::read_item`]).
pub async fn rework_range<T: TableStore + Clone, Q: QueueStore + Clone>(
    state: &AppState<T, Q>,
    scan: &ScanContext,
    requests: &Arc<AtomicU64>,
    range: &range::RangeWork,
) -> Result<Counters, WorkError> {
    let source = state.counted_table(&scan.source.connection, requests)?;
    // What the step read: its columns, no filter (scans with a filter do not work in steps).
    let spec = range::ReadSpec {
        select: scan.params.select.clone(),
        ..range::ReadSpec::default()
    };
    let mut total = Counters::default();
    let mut next = Some(range.clone());
    for _ in 0..MAX_REWORK_ROUNDS {
        let Some(work) = next.take() else {
            return Ok(total);
        };
        let read = range::read_item(&source, &scan.source.table, &work, &spec).await?;
        if let Some(e) = range::unaddressable_error("worked on", &read.unaddressable) {
            return Err(e);
        }
        total = total.plus(&work_rows(state, scan, requests, read.rows).await?);
        next = read.next;
    }
    match next {
        None => Ok(total),
        Some(_) => Err(WorkError::Storage(StorageError::new(
            StorageErrorKind::Transient,
            "a scanned range kept growing while it was read again; trying again later",
        ))),
    }
}

/// Runs one work item with the scan's driver.
pub async fn run_item<T: TableStore + Clone, Q: QueueStore + Clone>(
    state: &AppState<T, Q>,
    begun: &Begun<ItemMessage>,
) -> Result<WorkOutcome, WorkError> {
    with_driver!(begun.scan.driver, D => {
        let item = begun.message.work.parse().map_err(|e| {
            WorkError::Permanent(format!(
                "not a work item of the {} driver ({e}): {:?}",
                D::NAME,
                begun.message.work
            ))
        })?;
        D::run(state, begun, item).await
    })
}

impl<T: TableStore + Clone, Q: QueueStore + Clone> AppState<T, Q> {
    /// Ends the scan if all its work has finished (see `Tracker::complete_if_drained`; `shard`:
    /// check that shard first), running its driver's completion step first when it has one.
    pub(crate) async fn complete_if_drained<S: TableStore>(
        &self,
        tracker: &Tracker<'_, S>,
        scan: &ScanContext,
        shard: Option<u32>,
    ) -> Result<bool, StorageError> {
        with_driver!(scan.driver, D => self.complete_drained_as::<D, S>(tracker, scan, shard).await)
    }

    /// Queues the drained check of a scan that a status read found running with no pending
    /// work: its root work message once more (one queue put). Its delivery finds the root
    /// finished and, like any duplicate delivery, runs the drained check and the driver's
    /// completion step; a status read never runs them itself.
    pub(crate) async fn queue_drained_check(&self, scan: &ScanContext) -> Result<(), ApiError> {
        let unusable = |e: String| ApiError::Storage(StorageError::invalid_response(e));
        let root = with_driver!(scan.driver, D => D::root::<T>(scan))
            .map_err(|e| unusable(e.to_string()))?;
        let message = self
            .child_message(scan, &root)
            .map_err(|e| unusable(e.to_string()))?;
        self.queues
            .put_message(&message.queue, &message.text, std::time::Duration::ZERO)
            .await?;
        Ok(())
    }

    /// [`AppState::complete_if_drained`] for a scan of driver `D`.
    async fn complete_drained_as<D: Driver, S: TableStore>(
        &self,
        tracker: &Tracker<'_, S>,
        scan: &ScanContext,
        shard: Option<u32>,
    ) -> Result<bool, StorageError> {
        if D::COMPLETES || D::PHASES > 0 {
            // Judged once, and the scan is completed only on that judgement: a scan found busy
            // here must not be completed by the check below if its last item finishes in
            // between (that item's own check then runs the step), or it would end `completed`
            // before its completion step ran. Once drained, only a phase start adds work.
            let Some(totals) = tracker.drained(&scan.scan_id, scan.shards).await? else {
                return Ok(false);
            };
            if totals.failed == 0 {
                if !self.phases_done::<D, S>(tracker, scan).await? {
                    return Ok(false);
                }
                if D::COMPLETES {
                    // One execution at a time runs the step: the one holding the scan's completion
                    // lease (see docs/architecture.md, "Ending a scan"); the others leave it to it.
                    if !tracker.take_completion_lease(&scan.scan_id).await? {
                        return Ok(false);
                    }
                    match self.run_completion::<D, S>(tracker, scan).await {
                        Ok(Some(ended)) => return Ok(ended),
                        Ok(None) => {}
                        Err(e) => {
                            // The next delivery may try again at once (else the lease expires).
                            if let Err(r) = tracker.release_completion_lease(&scan.scan_id).await {
                                tracing::warn!(scan = %scan.scan_id, error = %r, "could not release the completion lease");
                            }
                            return Err(e);
                        }
                    }
                }
            }
        }
        tracker
            .complete_if_drained(&scan.scan_id, scan.shards, shard)
            .await
    }

    /// Whether every phase of `D` after the root's has run ([`Driver::phase`]), on a scan found
    /// drained with no failure. The first phase whose root item is not finished answers
    /// `false`; if its root is not registered either, it is started here: queued (after
    /// [`PHASE_START_DELAY`]) and then registered, so a crash in between leaves nothing
    /// registered and unqueued (the scan still looks drained, and the next drained check
    /// starts it again). Starting twice is harmless: the id hashes the item, registering an
    /// existing row leaves it alone, and a second message is a duplicate delivery. `true`
    /// (every root finished) is sound because a finished item registered its children first:
    /// the caller's later drained judgement sees all a phase spawned.
    async fn phases_done<D: Driver, S: TableStore>(
        &self,
        tracker: &Tracker<'_, S>,
        scan: &ScanContext,
    ) -> Result<bool, StorageError> {
        let unusable = |e: String| StorageError::invalid_input(e);
        for n in 1..=D::PHASES {
            let root = D::phase(scan, n).map_err(|e| unusable(e.to_string()))?;
            let message = self
                .child_message_in(scan, &root, None)
                .map_err(|e| unusable(e.to_string()))?;
            let work = &message.work;
            match tracker
                .work_state(&scan.scan_id, work.shard, &work.id)
                .await?
            {
                Some(WorkState::Finished) => continue,
                Some(_) => return Ok(false),
                None => {
                    self.queues
                        .put_message(&message.queue, &message.text, PHASE_START_DELAY)
                        .await?;
                    tracker.register_children(&scan.scan_id, &[work]).await?;
                    tracing::info!(scan = %scan.scan_id, phase = n, "phase started");
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// Runs `D`'s completion step. `Some(ended)`: it failed for good and the scan was failed
    /// (`ended` as `Tracker::finish_scan` says); any other error is returned as transient (the
    /// scan stays running, and the next drained check tries again).
    async fn run_completion<D: Driver, S: TableStore>(
        &self,
        tracker: &Tracker<'_, S>,
        scan: &ScanContext,
    ) -> Result<Option<bool>, StorageError> {
        match D::complete(self, scan).await {
            Ok(()) => Ok(None),
            Err(e) if e.is_permanent() => {
                let reason = format!("the {} driver's completion step failed: {e}", D::NAME);
                tracker
                    .finish_scan(&scan.scan_id, ScanState::Failed, Some(&reason))
                    .await
                    .map(Some)
            }
            Err(WorkError::Storage(e)) => Err(e),
            Err(e) => Err(StorageError::new(
                StorageErrorKind::Transient,
                format!("the {} driver's completion step: {e}", D::NAME),
            )),
        }
    }
}
