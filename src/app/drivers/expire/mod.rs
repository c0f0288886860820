//! The expire driver (`"driver": "expire"`): TTL for Table Storage (docs/expire.md). Deletes
//! every row of `sourceTable` (in the scan's key range, matching its `filter`) whose time is
//! older than a cutoff, `olderThan` before the Table service's clock when the scan starts.
//!
//! - **The cutoff** is read once, at start (`prepare`): the `Date` of a storage answer about
//!   the source table, less `olderThan`. It is recorded in the scan's context (`o.cutoff`) and
//!   shown among its parameters (`parameters.cutoff`): every step, item and retry uses it.
//! - **The time** of a row is, exactly one of: its `Timestamp` (the default) or a DateTime
//!   property (`timeProperty`), as a condition `<name> lt datetime'<cutoff>'` joined to the
//!   scan's `filter` (so the service tests it, in every range item's re-read, as a filtered
//!   delete); or its key (`keyTime`, [`key_time`]): read from each row's key here.
//! - **A time in the PartitionKey narrows the scan** to the expired keys' bounds
//!   ([`key_time::expired_range`]): live partitions are never read. A time in the RowKey is read
//!   from each row (the scan reads every partition's keys).
//! - **A key that holds no time is left alone** and counted (`rowsSkipped`), never deleted;
//!   a key of a time not older than the cutoff is left alone (not matched).
//! - Otherwise as `delete` (`kit::deletes`): `confirm` must equal `sourceTable`, each row is
//!   deleted with the ETag it was read with (a changed row is kept: `rowsChanged`), and
//!   `"dryRun": true` writes nothing.

pub mod key_time;
mod older_than;

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::app::config::Config;
use crate::app::error::ApiError;
use crate::app::job::{
    Begun, Driver, RangeWork, ScanContext, ScanRequest, Segment, Setup, StepWork, WorkError,
    WorkOutcome, WorkSplit, Worked,
};
use crate::app::messages::ItemMessage;
use crate::app::pace::Meter;
use crate::app::state::AppState;
use crate::app::tracking::Counters;
use crate::scan::Strategy;
use crate::storage::stores::Stores;
use crate::storage::{compare_keys, odata, Entity, TableStore};

use super::kit::deletes::{check_confirm, delete_read_rows, delete_rows, DeleteOptions};
use super::kit::range::{begin_range_item, page_items, unaddressable_error};
use key_time::{age, expired_range, KeyAge, KeyTime, TimeKey};

pub use older_than::parse_older_than;

pub struct ExpireDriver;

fn is_false(b: &bool) -> bool {
    !b
}

/// The expire driver's request fields.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExpireFields {
    /// Must equal `sourceTable`.
    pub confirm: String,
    /// How old a row must be to go: a whole number of `s`, `m`, `h` or `d`, at least a minute.
    pub older_than: String,
    /// A DateTime property holding the row's time (instead of `Timestamp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_property: Option<String>,
    /// The key holding the row's time, and how it is written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_time: Option<KeyTime>,
    /// Read and count, write nothing.
    #[serde(default, skip_serializing_if = "is_false")]
    pub dry_run: bool,
    /// Set by the scan (the absolute cutoff it recorded), refused in a request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cutoff: Option<String>,
}

/// Where a row's time is read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum TimeSource {
    /// `Timestamp` or a DateTime property: a condition joined to the scan's filter.
    Property(String),
    /// A key, read here.
    Key(KeyTime),
}

/// What an expire records (the context's `o`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExpireOptions {
    pub time: TimeSource,
    /// `olderThan` in seconds.
    pub older_than_seconds: i64,
    /// The cutoff (`yyyy-MM-ddTHH:mm:ss.fffffffZ`), set when the scan starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cutoff: Option<String>,
    /// The cutoff as .NET ticks.
    #[serde(default)]
    pub cutoff_ticks: i64,
    #[serde(flatten)]
    pub deletes: DeleteOptions,
}

impl Driver for ExpireDriver {
    const NAME: &'static str = "expire";
    const FILTER: bool = true;
    const CHANGES_SOURCE: bool = true;
    const COUNTS_MATCHED: bool = true;
    type Fields = ExpireFields;
    type Options = ExpireOptions;
    type Item = RangeWork;

    fn validate(f: &ExpireFields, request: &ScanRequest, _: &Config) -> Result<(), ApiError> {
        check_confirm(&f.confirm, request)?;
        if f.cutoff.is_some() {
            return Err(ApiError::field(
                "cutoff",
                "is set by the scan (the service's clock at its start, less olderThan); give olderThan",
            ));
        }
        parse_older_than(&f.older_than).map_err(|m| ApiError::field("olderThan", m))?;
        if let Some(name) = &f.time_property {
            crate::app::validate::select(std::slice::from_ref(name))
                .map_err(|m| ApiError::field("timeProperty", m))?;
            if ["PartitionKey", "RowKey"].contains(&name.as_str()) {
                return Err(ApiError::field(
                    "timeProperty",
                    "a key holds no DateTime: give keyTime to read a time from a key",
                ));
            }
        }
        let Some(key_time) = &f.key_time else {
            return Ok(());
        };
        if f.time_property.is_some() {
            return Err(ApiError::field(
                "keyTime",
                "give one of timeProperty and keyTime (or neither: Timestamp), not both",
            ));
        }
        crate::app::validate::key(&key_time.prefix)
            .map_err(|m| ApiError::field("keyTime.prefix", m))?;
        let scan_prefix = &request.partition_key_prefix;
        let compatible = key_time.prefix.starts_with(scan_prefix.as_str())
            || scan_prefix.starts_with(key_time.prefix.as_str());
        if key_time.key == TimeKey::PartitionKey && !compatible {
            return Err(ApiError::field(
                "keyTime.prefix",
                format!(
                    "no partition key starts with both it and partitionKeyPrefix {scan_prefix:?}"
                ),
            ));
        }
        Ok(())
    }

    fn setup(f: &ExpireFields, request: &ScanRequest) -> Setup<ExpireOptions> {
        let time = match (&f.key_time, &f.time_property) {
            (Some(key), _) => TimeSource::Key(key.clone()),
            (None, Some(name)) => TimeSource::Property(name.clone()),
            (None, None) => TimeSource::Property("Timestamp".into()),
        };
        // Keys are tested here, so a prefix scan without a filter deletes in its steps; a
        // condition on a property is the service's, in range items' re-reads.
        let real_in_step = matches!(time, TimeSource::Key(_))
            && request.filter.is_none()
            && request.strategy == Strategy::Prefix;
        let step_work = match real_in_step && !f.dry_run {
            true => StepWork::Rows {
                select: Some(Vec::new()),
            },
            false => StepWork::Items,
        };
        let older_than_seconds = parse_older_than(&f.older_than).unwrap_or_default();
        let deletes = DeleteOptions {
            dry_run: f.dry_run,
            real_in_step,
        };
        Setup {
            step_work,
            options: Some(ExpireOptions {
                time,
                older_than_seconds,
                cutoff: None,
                cutoff_ticks: 0,
                deletes,
            }),
            ..Setup::default()
        }
    }

    async fn prepare<S: Stores>(
        state: &AppState<S>,
        context: &mut ScanContext,
    ) -> Result<(), ApiError> {
        let mut options: ExpireOptions = context
            .options()
            .map_err(|e| ApiError::field("olderThan", e.to_string()))?;
        let source = &state.tables[&context.source.connection];
        let now = match source.service_time(&context.source.table).await? {
            Some(now) => now,
            None => state.clock.now(),
        };
        let cutoff = now - time::Duration::seconds(options.older_than_seconds);
        let ticks = key_time::ticks(cutoff);
        let text = key_time::format_time(key_time::KeyFormat::Iso8601, ticks)
            .ok_or_else(|| ApiError::field("olderThan", "reaches before the year 1"))?;
        match &options.time {
            TimeSource::Property(name) => join_condition(context, name, &text)?,
            TimeSource::Key(key) if key.key == TimeKey::PartitionKey => {
                narrow_partitions(context, key, ticks)
            }
            TimeSource::Key(_) => {}
        }
        options.cutoff = Some(text);
        options.cutoff_ticks = ticks as i64;
        context.set_options(&options);
        Ok(())
    }

    fn segment(_: &ScanContext, rows: &[Entity]) -> Segment<RangeWork> {
        Segment {
            items: page_items(WorkSplit::Page, rows),
            ..Segment::default()
        }
    }

    async fn work_runs<S: Stores>(
        state: &AppState<S>,
        scan: &ScanContext,
        requests: &Arc<Meter>,
        runs: Vec<Vec<Entity>>,
        _until: Instant,
    ) -> Result<Worked, WorkError> {
        let options: ExpireOptions = scan.options()?;
        let source = state.counted_table(&scan.source.connection, requests)?;
        let (expired, mut counters) = sort_rows(&options, runs.concat());
        let table = &scan.source.table;
        let done = delete_rows(state, (&source, &scan.scan_id), table, expired, false).await?;
        counters = counters.plus(&done);
        Ok(Worked::from(counters))
    }

    async fn run<S: Stores>(
        state: &AppState<S>,
        begun: &Begun<ItemMessage>,
        item: RangeWork,
    ) -> Result<WorkOutcome, WorkError> {
        let options: ExpireOptions = begun.scan.options()?;
        let before = begun.requests.count();
        let (source, read, mut outcome) =
            begin_range_item::<Self, S>(state, begun, &item, Some(Vec::new())).await?;
        let reads = (begun.requests.count() - before) as i64;
        let (expired, counters) = sort_rows(&options, read.rows);
        outcome.delta.rows_matched = counters.rows_matched;
        outcome.delta.rows_skipped = counters.rows_skipped;
        let deletes = Some(options.deletes.clone());
        delete_read_rows(
            state,
            begun,
            (&source, deletes),
            expired,
            &mut outcome,
            reads,
        )
        .await?;
        if let Some(e) = unaddressable_error("expired", &read.unaddressable) {
            return Err(e);
        }
        Ok(outcome)
    }
}

/// The rows of `rows` that are expired, and the counters of the sorting: `rowsMatched` (the
/// expired) and `rowsSkipped` (keys without a time). Rows read under a property's condition
/// are all expired: the service tested them.
fn sort_rows(options: &ExpireOptions, rows: Vec<Entity>) -> (Vec<Entity>, Counters) {
    let TimeSource::Key(key_time) = &options.time else {
        let rows_matched = rows.len() as i64;
        return (
            rows,
            Counters {
                rows_matched,
                ..Counters::default()
            },
        );
    };
    let cutoff = i128::from(options.cutoff_ticks);
    let mut counters = Counters::default();
    let mut expired = Vec::with_capacity(rows.len());
    for row in rows {
        let key = match key_time.key {
            TimeKey::PartitionKey => &row.partition_key,
            TimeKey::RowKey => &row.row_key,
        };
        match age(key_time, key, cutoff) {
            KeyAge::Expired => expired.push(row),
            KeyAge::Live => {}
            KeyAge::Unreadable => counters.rows_skipped += 1,
        }
    }
    counters.rows_matched = expired.len() as i64;
    (expired, counters)
}

/// Joins `<name> lt datetime'<cutoff>'` to the scan's filter (canonical form).
fn join_condition(context: &mut ScanContext, name: &str, cutoff: &str) -> Result<(), ApiError> {
    let condition = format!("{name} lt datetime'{cutoff}'");
    let text = match &context.filter {
        Some(filter) => format!("({condition}) and ({filter})"),
        None => condition,
    };
    let expr = odata::parse(&text).map_err(|e| ApiError::field("timeProperty", e.to_string()))?;
    context.filter = Some(expr.render());
    Ok(())
}

/// Keeps the scan's partitions within the bounds of the expired keys: the longer of the two
/// prefixes (`validate` checked one starts with the other), the higher lower bound and the
/// lower upper bound (both exclusive).
fn narrow_partitions(context: &mut ScanContext, key_time: &KeyTime, cutoff: i128) {
    let params = &mut context.params;
    if key_time.prefix.len() > params.prefix.len() {
        params.prefix = key_time.prefix.clone();
    }
    let range = expired_range(key_time, cutoff);
    if let Some(after) = range.after {
        let higher = params
            .lower
            .as_ref()
            .is_some_and(|l| compare_keys(l, &after).is_ge());
        if !higher {
            params.lower = Some(after);
        }
    }
    if let Some(before) = range.before {
        let lower = params
            .upper
            .as_ref()
            .is_some_and(|u| compare_keys(u, &before).is_le());
        if !lower {
            params.upper = Some(before);
        }
    }
}
