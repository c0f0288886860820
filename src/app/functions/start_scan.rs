//! `StartScan`: `POST /api/scans` — validates a scan request, records the scan, queues its root
//! step and answers `202 Accepted` with `Location: /api/scans/{id}`.
//!
//! Nothing is written before the whole request is valid. Order of writes: counters + root work
//! row, then the root message, then the scan record with the scan's context (what every work
//! item reads and writes) — so a visible scan always has its work, and work never runs before
//! its context is recorded.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{to_bytes, Body};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::app::config::STORAGE_SETTING;
use crate::app::error::ApiError;
use crate::app::messages::{
    self, Driver, ScanContext, StepMessage, TableRef, WorkMessage, WorkSplit,
};
use crate::app::state::AppState;
use crate::app::tracking::{Counters, NewWork, ScanRecord, ScanState};
use crate::app::validate;
use crate::scan::{ScanParameters, Scanner, Strategy};
use crate::storage::{Query, QueueStore, TableStore, MAX_TAKE};

use super::status::status_json;

/// Largest accepted request body.
pub const MAX_BODY: usize = 64 * 1024;

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

/// The request body, camelCase. Unknown fields are rejected.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScanRequest {
    pub driver: Driver,
    pub source_table: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination_table: Option<String>,
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
    /// How copy work is split: `page` (default) or `partitionKey` (the reference design).
    #[serde(default)]
    pub work_split: WorkSplit,
    /// App-setting name of the source's connection (must be allowed by `TABLESCAN_CONNECTIONS`).
    #[serde(default = "default_connection")]
    pub source_connection: String,
    /// App-setting name of the destination's connection.
    #[serde(default = "default_connection")]
    pub destination_connection: String,
}

fn default_connection() -> String {
    STORAGE_SETTING.to_string()
}

/// Parses the body, naming the offending field on error.
pub fn parse_request(body: &[u8]) -> Result<ScanRequest, ApiError> {
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| ApiError::InvalidJson(e.to_string()))?;
    if !value.is_object() {
        return Err(ApiError::InvalidJson("expected a JSON object".into()));
    }
    serde_path_to_error::deserialize::<_, ScanRequest>(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        // Missing and unknown fields are reported at the object itself; take the name from the message.
        let field = if path == "." {
            inner.split('`').nth(1).unwrap_or("body").to_string()
        } else {
            path
        };
        ApiError::field(field, inner)
    })
}

impl ScanRequest {
    /// Checks everything that does not need storage; returns the scan parameters.
    pub fn validate<T, Q>(&self, state: &AppState<T, Q>) -> Result<ScanParameters, ApiError> {
        validate::table_name(&self.source_table).map_err(|m| ApiError::field("sourceTable", m))?;
        match (self.driver, &self.destination_table) {
            (Driver::Copy, None) => {
                return Err(ApiError::field(
                    "destinationTable",
                    "is required for the copy driver",
                ))
            }
            (Driver::Count, Some(_)) => {
                return Err(ApiError::field(
                    "destinationTable",
                    "is only used by the copy driver",
                ))
            }
            (Driver::Copy, Some(dst)) => {
                validate::table_name(dst).map_err(|m| ApiError::field("destinationTable", m))?;
            }
            (Driver::Count, None) => {
                if self.work_split != WorkSplit::Page {
                    return Err(ApiError::field(
                        "workSplit",
                        "is only used by the copy driver",
                    ));
                }
            }
        }
        for (field, name) in [
            ("sourceConnection", &self.source_connection),
            ("destinationConnection", &self.destination_connection),
        ] {
            if !state.config.connections.contains_key(name) {
                return Err(ApiError::field(
                    field,
                    format!("{name:?} is not an allowed connection; name an app setting listed in TABLESCAN_CONNECTIONS"),
                ));
            }
        }
        // Compared by the table service the connections resolve to, not by setting name, and
        // by table name up to case (Azure table names are case-insensitive).
        let config = &state.config;
        for (field, connection, table) in [
            (
                "sourceTable",
                &self.source_connection,
                Some(&self.source_table),
            ),
            (
                "destinationTable",
                &self.destination_connection,
                self.destination_table.as_ref(),
            ),
        ] {
            if let Some(table) = table {
                if config.is_bookkeeping_table(connection, table) {
                    return Err(ApiError::field(
                        field,
                        format!("{table} is one of tablescan's bookkeeping tables on the app's own storage account"),
                    ));
                }
            }
        }
        if let Some(dst) = &self.destination_table {
            if config.same_table(
                (&self.source_connection, &self.source_table),
                (&self.destination_connection, dst),
            ) {
                return Err(ApiError::field(
                    "destinationTable",
                    "must differ from the source table (the two connections reach the same storage account, and table names are case-insensitive)",
                ));
            }
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
        let params = self.params();
        params
            .validate()
            .map_err(|e| ApiError::field(e.field, e.message))?;
        Ok(params)
    }

    /// The scan parameters this request asks for (unchecked: see [`ScanRequest::validate`]).
    fn params(&self) -> ScanParameters {
        ScanParameters {
            prefix: self.partition_key_prefix.clone(),
            lower: self.partition_key_lower_bound.clone(),
            upper: self.partition_key_upper_bound.clone(),
            take: self.take_count,
            // Copy and count read keys only while scanning; copy re-reads each page's rows once.
            select: Some(Vec::new()),
            expand_partition_keys: self.expand_partition_keys,
            segments_per_first_prefix: self.segments_per_first_prefix,
            segments_per_subsequent_prefix: self.segments_per_subsequent_prefix,
        }
    }

    /// The context every work item of scan `scan_id` runs with.
    fn context(&self, scan_id: &str, shards: u32) -> ScanContext {
        ScanContext {
            scan_id: scan_id.to_string(),
            shards,
            driver: self.driver,
            strategy: self.strategy,
            source: TableRef {
                connection: self.source_connection.clone(),
                table: self.source_table.clone(),
            },
            destination: self.destination_table.clone().map(|table| TableRef {
                connection: self.destination_connection.clone(),
                table,
            }),
            params: self.params(),
            work_split: self.work_split,
        }
    }
}

/// The context a scan's work items run with: the one recorded at start, or for a record written
/// before contexts were recorded, the same context derived from its recorded request (as that
/// version put into its messages).
pub fn recorded_context(record: &ScanRecord) -> Result<ScanContext, String> {
    if let Some(context) = &record.context {
        if context.scan_id == record.id && context.shards == record.shards {
            return Ok(context.clone());
        }
    }
    let request: ScanRequest = serde_json::from_value(record.request.clone())
        .map_err(|e| format!("scan {} has an unreadable recorded request: {e}", record.id))?;
    Ok(request.context(&record.id, record.shards))
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
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .eq_ignore_ascii_case("application/json")
        });
    if !is_json {
        return Err(ApiError::UnsupportedMediaType);
    }
    let body = to_bytes(body, MAX_BODY)
        .await
        .map_err(|_| ApiError::PayloadTooLarge(MAX_BODY))?;
    let request = parse_request(&body)?;
    request.validate(&state)?;

    let source = &state.tables[&request.source_connection];
    let probe = Query {
        filter: None,
        top: Some(1),
        select: Some(vec!["PartitionKey".into()]),
        continuation: None,
    };
    match source.query_page(&request.source_table, &probe).await {
        Err(e) if e.is_not_found() => {
            return Err(ApiError::field(
                "sourceTable",
                format!("table {} does not exist", request.source_table),
            ))
        }
        other => {
            other?;
        }
    }
    if let (Driver::Copy, Some(dst)) = (request.driver, &request.destination_table) {
        state.tables[&request.destination_connection]
            .create_table(dst)
            .await?;
    }

    let tracker = state.tracker_on(state.bookkeeping());
    tracker.ensure_tables().await?;
    state
        .queues
        .create_queue(&state.config.prefix_scan_queue)
        .await?;
    state
        .queues
        .create_queue(&state.config.table_copy_queue)
        .await?;

    let scan_id = new_scan_id();
    let root = StepMessage {
        scan_id: scan_id.clone(),
        step: Scanner::<T>::root(request.strategy),
    };
    let text = messages::encode(&root).map_err(|e| ApiError::field("body", e.to_string()))?;
    let root_work = NewWork {
        id: messages::work_id(&root),
        kind: StepMessage::NAME,
    };
    tracker
        .create_scan_work(&scan_id, state.config.counter_shards, &root_work)
        .await?;
    state
        .queues
        .put_message(&state.config.prefix_scan_queue, &text, Duration::ZERO)
        .await?;
    let record = ScanRecord {
        id: scan_id.clone(),
        state: ScanState::Running,
        request: serde_json::to_value(&request).expect("requests serialize"),
        context: Some(request.context(&scan_id, state.config.counter_shards)),
        shards: state.config.counter_shards,
        started_at: OffsetDateTime::now_utc(),
        completed_at: None,
        error: None,
        etag: String::new(),
    };
    tracker.insert_scan(&record).await?;
    tracing::info!(scan = %scan_id, driver = ?request.driver, strategy = ?request.strategy, source = %request.source_table, "scan started");
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
