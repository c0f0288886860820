//! `StartScan`: `POST /api/scans` — validates a scan request, records the scan, queues its root
//! step and answers `202 Accepted` with `Location: /api/scans/{id}`.
//!
//! The common fields (source, key range, scan shape) are checked here; the driver named by
//! `driver` checks its own fields and prepares its destination (`drivers::Driver`).
//!
//! Nothing is written before the whole request is valid. Order of writes: the driver's
//! preparation (e.g. the destination table), counters + root work row, then the root message,
//! then the scan record with the scan's context (what every work item reads and writes) — so a
//! visible scan always has its work, and work never runs before its context is recorded.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use serde_json::{Map, Value};

use crate::app::config::{Config, STORAGE_SETTING};
use crate::app::drivers::{
    check_connection, check_table, with_driver, Driver, DriverId, Setup, StepWork,
};
use crate::app::error::ApiError;
use crate::app::messages::{ScanContext, TableRef};
use crate::app::state::AppState;
use crate::app::tracking::{Counters, ScanRecord, ScanState};
use crate::app::validate;
use crate::scan::{ScanParameters, Strategy};
use crate::storage::{odata, Query, QueueStore, TableStore, MAX_TAKE};

use super::status::status_json;

/// Largest accepted request body.
pub const MAX_BODY: usize = 64 * 1024;

/// Why a Cosmos DB for Table account is refused as a source (it is accepted as a destination).
const COSMOS_SOURCE: &str = "names an Azure Cosmos DB for Table account, which does not return \
rows in key order. Both strategies rely on that order: the prefix strategy to discover partition \
keys, and the serial strategy to resume after the last key read once a step has read its pages. \
Either would silently miss or repeat rows, so a Cosmos DB for Table account is accepted as a \
destination only (copy or import into it)";

fn default_take() -> u32 {
    MAX_TAKE
}
fn default_true() -> bool {
    true
}
fn default_segments_first() -> u32 {
    ScanParameters::DEFAULT_SEGMENTS_PER_FIRST_PREFIX
}
fn default_segments_subsequent() -> u32 {
    ScanParameters::DEFAULT_SEGMENTS_PER_SUBSEQUENT_PREFIX
}

/// The request body's common fields, camelCase. Every other field belongs to the driver: they
/// are collected in `fields` and read by the driver as its [`Driver::Fields`] (which refuses
/// unknown ones); once validated, `fields` holds them as the driver read them (defaults
/// included), which is what the scan records.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScanRequest {
    pub driver: DriverId,
    /// Required by drivers that scan a table ([`Driver::SCANS_TABLE`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_table: Option<String>,
    #[serde(default)]
    pub strategy: Strategy,
    #[serde(default)]
    pub partition_key_prefix: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition_key_lower_bound: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition_key_upper_bound: Option<String>,
    #[serde(default = "default_take")]
    pub take_count: u32,
    #[serde(default = "default_true")]
    pub expand_partition_keys: bool,
    #[serde(default = "default_segments_first")]
    pub segments_per_first_prefix: u32,
    #[serde(default = "default_segments_subsequent")]
    pub segments_per_subsequent_prefix: u32,
    /// App-setting name of the source's connection (must be allowed by `TABLESCAN_CONNECTIONS`).
    #[serde(default = "default_connection")]
    pub source_connection: String,
    /// An OData condition on non-key properties, for drivers that take one ([`Driver::FILTER`]);
    /// recorded in its canonical form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    /// Properties a driver's re-read asks for besides the keys ([`Driver::SELECT`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub select: Option<Vec<String>>,
    /// The driver's own fields.
    #[serde(flatten)]
    pub fields: Map<String, Value>,
}

fn default_connection() -> String {
    STORAGE_SETTING.to_string()
}

/// The field named by a serde error at `path` (missing and unknown fields are reported at the
/// object itself: the name is taken from the message).
fn error_field(path: String, message: &str) -> String {
    if path == "." {
        message.split('`').nth(1).unwrap_or("body").to_string()
    } else {
        path
    }
}

/// Parses the body (a JSON object naming each key once: `body::parse_object`), naming the
/// offending field on error.
pub fn parse_request(body: &[u8]) -> Result<ScanRequest, ApiError> {
    request_from(crate::app::body::parse_object(body)?)
}

/// The request in a parsed body, naming the offending field on error.
fn request_from(value: Value) -> Result<ScanRequest, ApiError> {
    serde_path_to_error::deserialize::<_, ScanRequest>(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        ApiError::field(error_field(path, &inner), inner)
    })
}

/// The driver's own fields of a request, naming the offending field on error.
fn driver_fields<D: Driver>(request: &ScanRequest) -> Result<D::Fields, ApiError> {
    serde_path_to_error::deserialize::<_, D::Fields>(Value::Object(request.fields.clone())).map_err(
        |e| {
            let path = e.path().to_string();
            let inner = e.into_inner().to_string();
            ApiError::field(
                error_field(path, &inner),
                format!("{inner} (the {} driver)", D::NAME),
            )
        },
    )
}

impl ScanRequest {
    /// The source table (empty for drivers that scan none).
    pub fn source_table(&self) -> &str {
        self.source_table.as_deref().unwrap_or_default()
    }

    /// Checks the common fields for driver `D`, without storage; returns the scan parameters.
    /// `filter` is replaced by its canonical form.
    pub fn validate<D: Driver>(&mut self, config: &Config) -> Result<ScanParameters, ApiError> {
        self.check_filter_and_select::<D>()?;
        let params = self.params();
        if !D::SCANS_TABLE {
            self.refuse_scan_fields(D::NAME)?;
            check_connection(config, "sourceConnection", &self.source_connection)?;
            return Ok(params);
        }
        let source = self
            .source_table
            .as_deref()
            .ok_or_else(|| ApiError::field("sourceTable", "missing field `sourceTable`"))?;
        validate::table_name(source).map_err(|m| ApiError::field("sourceTable", m))?;
        check_connection(config, "sourceConnection", &self.source_connection)?;
        check_table(config, "sourceTable", &self.source_connection, source)?;
        if config.is_cosmos_table(&self.source_connection) {
            return Err(ApiError::field("sourceConnection", COSMOS_SOURCE));
        }
        validate::key(&self.partition_key_prefix)
            .map_err(|m| ApiError::field("partitionKeyPrefix", m))?;
        for (field, bound) in [
            ("partitionKeyLowerBound", &self.partition_key_lower_bound),
            ("partitionKeyUpperBound", &self.partition_key_upper_bound),
        ] {
            if let Some(b) = bound {
                validate::key(b).map_err(|m| ApiError::field(field, m))?;
            }
        }
        params
            .validate()
            .map_err(|e| ApiError::field(e.field, e.message))?;
        Ok(params)
    }

    /// `filter` parsed and re-rendered canonically, `select` checked; each only for a driver
    /// that takes it.
    fn check_filter_and_select<D: Driver>(&mut self) -> Result<(), ApiError> {
        if let Some(filter) = &self.filter {
            if !D::FILTER {
                return Err(ApiError::field(
                    "filter",
                    format!("is not used by the {} driver", D::NAME),
                ));
            }
            let expr =
                odata::parse(filter).map_err(|e| ApiError::field("filter", e.to_string()))?;
            self.filter = Some(expr.render());
        }
        if let Some(select) = &self.select {
            if !D::SELECT {
                return Err(ApiError::field(
                    "select",
                    format!("is not used by the {} driver", D::NAME),
                ));
            }
            validate::select(select).map_err(|m| ApiError::field("select", m))?;
        }
        Ok(())
    }

    /// A driver that scans no table takes none of the scan's fields.
    fn refuse_scan_fields(&self, driver: &str) -> Result<(), ApiError> {
        let defaults = ScanParameters {
            select: Some(Vec::new()),
            ..ScanParameters::default()
        };
        let params = self.params();
        let given = [
            ("sourceTable", self.source_table.is_some()),
            ("strategy", self.strategy != Strategy::default()),
            ("partitionKeyPrefix", params.prefix != defaults.prefix),
            ("partitionKeyLowerBound", params.lower.is_some()),
            ("partitionKeyUpperBound", params.upper.is_some()),
            ("takeCount", params.take != default_take()),
            ("expandPartitionKeys", !params.expand_partition_keys),
            (
                "segmentsPerFirstPrefix",
                params.segments_per_first_prefix
                    != ScanParameters::DEFAULT_SEGMENTS_PER_FIRST_PREFIX,
            ),
            (
                "segmentsPerSubsequentPrefix",
                params.segments_per_subsequent_prefix
                    != ScanParameters::DEFAULT_SEGMENTS_PER_SUBSEQUENT_PREFIX,
            ),
        ];
        match given.iter().find(|(_, given)| *given) {
            Some((field, _)) => Err(ApiError::field(
                *field,
                format!("is not used by the {driver} driver, which scans no table"),
            )),
            None => Ok(()),
        }
    }

    /// The scan parameters this request asks for (unchecked: see [`ScanRequest::validate`]).
    fn params(&self) -> ScanParameters {
        ScanParameters {
            prefix: self.partition_key_prefix.clone(),
            lower: self.partition_key_lower_bound.clone(),
            upper: self.partition_key_upper_bound.clone(),
            take: self.take_count,
            // Keys only while scanning; items re-read what they need. A driver that works in
            // the steps says what its steps read instead (`context`).
            select: Some(Vec::new()),
            expand_partition_keys: self.expand_partition_keys,
            // tablescan's design: small partitions are read where they are discovered.
            inline_first_partition_page: true,
            segments_per_first_prefix: self.segments_per_first_prefix,
            segments_per_subsequent_prefix: self.segments_per_subsequent_prefix,
        }
    }

    /// The context every work item of scan `scan_id` runs with.
    fn context(&self, scan_id: &str, shards: u32, setup: Setup) -> ScanContext {
        let mut params = self.params();
        let in_step = match setup.step_work {
            StepWork::Items => false,
            StepWork::Rows { select } => {
                params.select = select;
                true
            }
        };
        ScanContext {
            scan_id: scan_id.to_string(),
            shards,
            driver: self.driver,
            strategy: self.strategy,
            source: TableRef {
                connection: self.source_connection.clone(),
                table: self.source_table().to_string(),
            },
            destination: setup.destination,
            params,
            work_split: setup.work_split,
            filter: self.filter.clone(),
            select: self.select.clone(),
            options: setup.options,
            in_step,
        }
    }
}

/// The context a scan's work items run with: the one recorded at start (a record without a
/// usable one cannot run work).
pub fn recorded_context(record: &ScanRecord) -> Result<ScanContext, String> {
    match &record.context {
        Some(context) if context.scan_id == record.id && context.shards == record.shards => {
            Ok(context.clone())
        }
        _ => Err(format!(
            "scan {} has no usable recorded context (missing, unreadable or not its own)",
            record.id
        )),
    }
}

/// A new scan id: inverted milliseconds so ids sort newest first, plus randomness.
fn new_scan_id() -> String {
    let millis = (OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as u64;
    format!(
        "{:013}-{:08x}",
        9_999_999_999_999u64.saturating_sub(millis),
        rand::random::<u32>()
    )
}

pub async fn handle<T: TableStore + Clone, Q: QueueStore + Clone>(
    State(state): State<Arc<AppState<T, Q>>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let request = request_from(crate::app::body::json_object(&headers, body, MAX_BODY).await?)?;
    with_driver!(request.driver, D => start::<D, T, Q>(&state, request).await)
}

/// Starts a scan of driver `D`: validates, prepares, records the root work and the scan.
async fn start<D: Driver, T: TableStore + Clone, Q: QueueStore + Clone>(
    state: &AppState<T, Q>,
    mut request: ScanRequest,
) -> Result<Response, ApiError> {
    let fields = driver_fields::<D>(&request)?;
    request.validate::<D>(&state.config)?;
    D::validate(&fields, &request, &state.config)?;
    let setup = D::setup(&fields, &request);
    request.fields = match serde_json::to_value(&fields).expect("driver fields serialize") {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    if D::SCANS_TABLE {
        source_must_exist(state, &request).await?;
    }

    let scan_id = new_scan_id();
    let mut context = request.context(&scan_id, state.config.counter_shards, setup);
    D::prepare(state, &mut context).await?;
    let tracker = state.tracker_on(state.bookkeeping());
    tracker.ensure_tables().await?;
    for queue in [
        &state.config.prefix_scan_queue,
        &state.config.table_copy_queue,
    ] {
        state.queues.create_queue(queue).await?;
    }

    let root = D::root::<T>(&context).map_err(|e| ApiError::field("driver", e.to_string()))?;
    let root = state
        .child_message(&context, &root)
        .map_err(|e| ApiError::field("body", e.to_string()))?;
    tracker
        .create_scan_work(&scan_id, state.config.counter_shards, &root.work)
        .await?;
    state
        .queues
        .put_message(&root.queue, &root.text, Duration::ZERO)
        .await?;
    let record = ScanRecord {
        id: scan_id.clone(),
        state: ScanState::Running,
        request: serde_json::to_value(&request).expect("requests serialize"),
        context: Some(context),
        shards: state.config.counter_shards,
        started_at: OffsetDateTime::now_utc(),
        completed_at: None,
        error: None,
        etag: String::new(),
    };
    tracker.insert_scan(&record).await?;
    tracing::info!(scan = %scan_id, driver = D::NAME, strategy = ?request.strategy, source = %request.source_table(), "scan started");
    let counters = Counters {
        created: 1,
        ..Counters::default()
    };
    let location = format!("/api/scans/{scan_id}");
    Ok((
        StatusCode::ACCEPTED,
        [(header::LOCATION, location)],
        Json(status_json(&record, &counters)),
    )
        .into_response())
}

/// A 4xx naming `sourceTable` if the source table does not exist.
async fn source_must_exist<T: TableStore + Clone, Q: QueueStore + Clone>(
    state: &AppState<T, Q>,
    request: &ScanRequest,
) -> Result<(), ApiError> {
    let probe = Query {
        filter: None,
        top: Some(1),
        select: Some(vec!["PartitionKey".into()]),
        continuation: None,
    };
    match state.tables[&request.source_connection]
        .query_page(request.source_table(), &probe)
        .await
    {
        Err(e) if e.is_not_found() => Err(ApiError::field(
            "sourceTable",
            format!("table {} does not exist", request.source_table()),
        )),
        other => other.map(|_| ()).map_err(ApiError::from),
    }
}
