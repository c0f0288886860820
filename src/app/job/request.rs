//! A scan request as data: its common fields ([`ScanRequest`]: source, key range, scan
//! shape, `filter`, `select`), checked for a driver by what it accepts ([`Accepts`]), the
//! driver's own fields kept apart for it to read (`Driver::Fields`), the checks of a table,
//! a connection or a destination any driver uses, and the context a started scan records.
//!
//! Checks run without storage and name the offending field (a 4xx); nothing here writes.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::app::config::{Config, STORAGE_SETTING};
use crate::app::error::ApiError;
use crate::app::job::context::{DriverName, ScanContext, Setup, StepWork, TableRef};
use crate::app::pace::{MAX_LIMIT, MIN_LIMIT};
use crate::app::validate;
use crate::scan::{ScanParameters, Strategy};
use crate::storage::{odata, MAX_TAKE};

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

/// The request body's common fields, camelCase. Every other field belongs to the driver: they
/// are collected in `fields` and read by the driver as its `Driver::Fields` (which refuses
/// unknown ones); once validated, `fields` holds them as the driver read them (defaults
/// included), which is what the scan records.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScanRequest {
    pub driver: DriverName,
    /// Required by drivers that scan a table (`Accepts::scans_table`).
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
    /// `None` when the request names none, until planned: then the driver's default or the
    /// engine's ([`ScanRequest::resolve_defaults`]). Recorded as a number either way.
    #[serde(default, serialize_with = "first_segments_or_default")]
    pub segments_per_first_prefix: Option<u32>,
    /// As `segments_per_first_prefix`.
    #[serde(default, serialize_with = "segments_or_default")]
    pub segments_per_subsequent_prefix: Option<u32>,
    /// App-setting name of the source's connection (must be allowed by `TABLESCAN_CONNECTIONS`).
    #[serde(default = "default_connection")]
    pub source_connection: String,
    /// An OData condition on non-key properties, for drivers that take one (`Accepts::filter`);
    /// recorded in its canonical form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    /// Properties a driver's re-read asks for besides the keys (`Accepts::select`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub select: Option<Vec<String>>,
    /// The scan's storage request rate limit, across every instance working on it (`app::pace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_requests_per_second: Option<u32>,
    /// The driver's own fields.
    #[serde(flatten)]
    pub fields: Map<String, Value>,
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
/// offending field on error; `drivers` are the names a request may give as `driver`.
pub fn parse_request(body: &[u8], drivers: &[&str]) -> Result<ScanRequest, ApiError> {
    request_from(crate::app::body::parse_object(body)?, drivers)
}

/// The request in a parsed body, naming the offending field on error; a `driver` that is none
/// of `drivers` is refused first.
pub fn request_from(value: Value, drivers: &[&str]) -> Result<ScanRequest, ApiError> {
    if let Some(name) = value.get("driver").and_then(Value::as_str) {
        if !drivers.contains(&name) {
            return Err(ApiError::field(
                "driver",
                format!(
                    "unknown driver {name:?}, expected one of: {}",
                    drivers.join(", ")
                ),
            ));
        }
    }
    serde_path_to_error::deserialize::<_, ScanRequest>(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        ApiError::field(error_field(path, &inner), inner)
    })
}

/// What a driver accepts of the common fields.
#[derive(Debug, Clone, Copy)]
pub struct Accepts {
    /// The driver's name (for messages).
    pub driver: &'static str,
    /// Whether the scan engine scans `sourceTable` (`false`: no `sourceTable`, no scan field).
    pub scans_table: bool,
    /// Whether `filter` is taken.
    pub filter: bool,
    /// Whether `select` is taken.
    pub select: bool,
}

/// Records an unplanned `segmentsPerSubsequentPrefix` as the engine's default, as before the
/// field could be left to the driver (the recorded request's format is unchanged).
fn segments_or_default<S: serde::Serializer>(v: &Option<u32>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u32(v.unwrap_or(ScanParameters::DEFAULT_SEGMENTS_PER_SUBSEQUENT_PREFIX))
}

/// As [`segments_or_default`], for `segmentsPerFirstPrefix`.
fn first_segments_or_default<S: serde::Serializer>(
    v: &Option<u32>,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.serialize_u32(v.unwrap_or(ScanParameters::DEFAULT_SEGMENTS_PER_FIRST_PREFIX))
}

impl ScanRequest {
    /// The source table (empty for drivers that scan none).
    pub fn source_table(&self) -> &str {
        self.source_table.as_deref().unwrap_or_default()
    }

    /// The driver's own fields of the request (`F`: its `Driver::Fields`, which refuses unknown
    /// ones), naming the offending field on error.
    pub fn driver_fields<F: DeserializeOwned>(&self, driver: &str) -> Result<F, ApiError> {
        serde_path_to_error::deserialize::<_, F>(Value::Object(self.fields.clone())).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner().to_string();
            ApiError::field(
                error_field(path, &inner),
                format!("{inner} (the {driver} driver)"),
            )
        })
    }

    /// Records the driver's fields as the driver read them (defaults included).
    pub fn set_driver_fields<F: Serialize>(&mut self, fields: &F) {
        self.fields = match serde_json::to_value(fields).expect("driver fields serialize") {
            Value::Object(map) => map,
            _ => Map::new(),
        };
    }

    /// Checks the common fields for a driver that accepts `accepts`, without storage; returns
    /// the scan parameters. `filter` is replaced by its canonical form.
    pub fn validate(
        &mut self,
        accepts: Accepts,
        config: &Config,
    ) -> Result<ScanParameters, ApiError> {
        check_rate_limit(self.max_requests_per_second)?;
        self.check_filter_and_select(accepts)?;
        let params = self.params();
        if !accepts.scans_table {
            self.refuse_scan_fields(accepts.driver)?;
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
    fn check_filter_and_select(&mut self, accepts: Accepts) -> Result<(), ApiError> {
        if let Some(filter) = &self.filter {
            if !accepts.filter {
                return Err(ApiError::field(
                    "filter",
                    format!("is not used by the {} driver", accepts.driver),
                ));
            }
            let expr =
                odata::parse(filter).map_err(|e| ApiError::field("filter", e.to_string()))?;
            self.filter = Some(expr.render());
        }
        if let Some(select) = &self.select {
            if !accepts.select {
                return Err(ApiError::field(
                    "select",
                    format!("is not used by the {} driver", accepts.driver),
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
            segments_per_first_prefix: self
                .segments_per_first_prefix
                .unwrap_or(ScanParameters::DEFAULT_SEGMENTS_PER_FIRST_PREFIX),
            segments_per_subsequent_prefix: self
                .segments_per_subsequent_prefix
                .unwrap_or(ScanParameters::DEFAULT_SEGMENTS_PER_SUBSEQUENT_PREFIX),
        }
    }

    /// Fills the fields the request left out whose default is the driver's (`setup`).
    pub fn resolve_defaults(&mut self, setup: &Setup) {
        let first = setup
            .default_segments_per_first_prefix
            .unwrap_or(ScanParameters::DEFAULT_SEGMENTS_PER_FIRST_PREFIX);
        self.segments_per_first_prefix.get_or_insert(first);
        let segments = setup
            .default_segments_per_subsequent_prefix
            .unwrap_or(ScanParameters::DEFAULT_SEGMENTS_PER_SUBSEQUENT_PREFIX);
        self.segments_per_subsequent_prefix.get_or_insert(segments);
    }

    /// Adds to the recorded request what the driver's `prepare` fixed for the whole scan and
    /// its caller should see among the scan's parameters: an expire's absolute `cutoff` (the
    /// context's `o.cutoff`).
    pub fn record_prepared(&mut self, context: &ScanContext) {
        let cutoff = context.options.as_ref().and_then(|o| o.get("cutoff"));
        if let Some(cutoff) = cutoff.filter(|c| c.is_string()) {
            self.fields.insert("cutoff".into(), cutoff.clone());
        }
    }

    /// The context every work item of scan `scan_id` runs with.
    pub fn context(&self, scan_id: &str, shards: u32, setup: Setup) -> ScanContext {
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
            driver: self.driver.clone(),
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
            max_requests_per_second: self
                .max_requests_per_second
                .or(setup.default_max_requests_per_second),
        }
    }
}

/// Refuses a `maxRequestsPerSecond` outside `MIN_LIMIT..=MAX_LIMIT` (serde already refused
/// anything but a non-negative integer).
fn check_rate_limit(limit: Option<u32>) -> Result<(), ApiError> {
    match limit {
        Some(l) if !(MIN_LIMIT..=MAX_LIMIT).contains(&l) => Err(ApiError::field(
            "maxRequestsPerSecond",
            format!("must be {MIN_LIMIT}..={MAX_LIMIT} storage requests per second, got {l}"),
        )),
        _ => Ok(()),
    }
}

/// The default of a driver's `…Connection` fields: the app's own storage account.
pub fn default_connection() -> String {
    STORAGE_SETTING.to_string()
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
