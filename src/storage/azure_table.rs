//! [`TableStore`] over Azure Table Storage (and Azurite) with `azure_data_tables` 0.21.
//! Entities are parsed with [`super::entity::parse_service_entity`]: property values pass
//! through as the service's JSON text.
//!
//! Table create/delete go through the crate. Queries, point reads and entity group transactions
//! are built here and sent on the lean signed path (`signed`): they are the requests a
//! scan makes hundreds of times per 1,000 rows, and the SDK pipeline cost more CPU than the rest
//! of the handler. Building them here also fixes two crate defects: it puts keys into entity URLs
//! without doubling `'` (so keys with quotes address the wrong entity or fail), and its
//! transaction response drops each operation's error body, so a failed transaction looks like
//! success unless every status is checked, and the failing operation's index and error code are lost.
//!
//! Invariants:
//! - A store is built from a [`StorageAccount`] (`account.table_store(counters)`); its SDK client
//!   and its signed client share the account's pooled HTTP client and credential.
//! - Every attempt is counted as one request of its kind and transient failures are retried under
//!   the account's policy, so callers see final outcomes only.
//! - Keys in URLs have `'` doubled and are percent-encoded; property values are never re-encoded.
//! - A transaction is checked (shape, then the exact body size) before it is sent, is sent as the
//!   same body on every retry, and fails unless every operation succeeded, naming the failing one.
//! - A continuation header that is present is followed or is an error, never read as the end.

use std::sync::Arc;

use azure_data_tables::clients::{TableClient, TableServiceClient, TableServiceClientBuilder};
use azure_storage::clients::ServiceType;
use azure_storage::CloudLocation;
use bytes::Bytes;
use reqwest::Method;

use super::auth::sdk_credentials;
use super::azure::{client_options, map_sdk_error, percent_encode, Service};
use super::connection::StorageAccount;
use super::request_counts::{RequestCounters, RequestKind};
use super::signed::{odata_error_json, SignedTableClient, TableRequest};
use super::{
    check_batch_bytes, validate_batch_shape, BatchOperation, Continuation, Entity, Page, Query,
    ServiceEntity, StorageError, StorageErrorKind, StorageResult, TableStore, MAX_TAKE,
};

/// `Accept` for reads: full metadata, so every typed property comes with its `@odata.type`
/// (this is also what the crate's query builder sends, so point reads and queries agree).
const ACCEPT_FULL_METADATA: &str = "application/json;odata=fullmetadata";
const ACCEPT_MINIMAL_METADATA: &str = "application/json;odata=minimalmetadata";

impl StorageAccount {
    /// A table store over this account, counting requests in `counters`.
    pub fn table_store(&self, counters: Arc<RequestCounters>) -> AzureTableStore {
        AzureTableStore::new(self, counters)
    }
}

/// Azure Table Storage behind the [`TableStore`] interface. Cheap to clone; clones share the
/// HTTP connection pool and the request counters.
#[derive(Clone)]
pub struct AzureTableStore {
    service: Service,
    /// Queries, point reads and transactions: the lean signed path.
    signed: SignedTableClient,
    /// Table create/delete: the SDK.
    client: TableServiceClient,
}

impl AzureTableStore {
    pub(crate) fn new(account: &StorageAccount, counters: Arc<RequestCounters>) -> Self {
        let location = CloudLocation::Custom {
            account: account.account_name().to_string(),
            uri: account.table_endpoint().to_string(),
        };
        let client = TableServiceClientBuilder::with_location(location, sdk_credentials(account))
            .client_options(client_options(account))
            .build();
        AzureTableStore {
            service: Service::new(
                account,
                ServiceType::Table,
                account.table_endpoint(),
                counters,
            ),
            signed: SignedTableClient::new(account),
            client,
        }
    }

    /// The table service base URL.
    pub fn endpoint(&self) -> &str {
        &self.service.base
    }

    fn table(&self, table: &str) -> TableClient {
        self.client.table_client(table)
    }

    async fn query_once(&self, table: &str, query: &Query) -> StorageResult<Page> {
        let path = format!("{}()", percent_encode(table));
        let query_string = query_string(query);
        let response = self
            .signed
            .send(
                TableRequest {
                    method: Method::GET,
                    path: &path,
                    query: &query_string,
                    content_type: "",
                    accept: ACCEPT_FULL_METADATA,
                    body: None,
                },
                || format!("query on table {table}"),
            )
            .await?;
        // A token that is there but unreadable is an error: read as "no token", it would end
        // the query early and silently drop the rest of the range.
        let header = |name: &str| -> StorageResult<Option<String>> {
            response
                .headers
                .get(name)
                .map(|v| {
                    v.to_str().map(str::to_string).map_err(|_| {
                        StorageError::invalid_response(format!(
                            "query on table {table} returned an unreadable {name} header"
                        ))
                    })
                })
                .transpose()
        };
        let continuation = match header("x-ms-continuation-nextpartitionkey")? {
            Some(next_partition_key) => Some(Continuation {
                next_partition_key,
                next_row_key: header("x-ms-continuation-nextrowkey")?,
            }),
            None => None,
        };
        let body: QueryBody = serde_json::from_slice(&response.body).map_err(|e| {
            StorageError::invalid_response(format!(
                "query on table {table} returned invalid JSON: {e}"
            ))
        })?;
        let mut page = Page {
            continuation,
            ..Page::default()
        };
        for entity in body.value {
            match entity {
                ServiceEntity::Entity(e) => page.entities.push(e),
                ServiceEntity::Unaddressable(row) => page.unaddressable.push(row),
            }
        }
        Ok(page)
    }

    async fn get_once(
        &self,
        table: &str,
        partition_key: &str,
        row_key: &str,
    ) -> StorageResult<Option<(Entity, String)>> {
        let path = entity_path(table, partition_key, row_key);
        let result = self
            .signed
            .send(
                TableRequest {
                    method: Method::GET,
                    path: &path,
                    query: "",
                    content_type: "",
                    accept: ACCEPT_FULL_METADATA,
                    body: None,
                },
                || format!("point read in table {table}"),
            )
            .await;
        let response = match result {
            Ok(response) => response,
            // A missing entity is an answer; a missing table is an error.
            Err(error)
                if error.kind == StorageErrorKind::NotFound
                    && error.code.as_deref() != Some("TableNotFound") =>
            {
                return Ok(None)
            }
            Err(error) => return Err(error),
        };
        let etag = response
            .headers
            .get("etag")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .ok_or_else(|| StorageError::invalid_response("point read response without an ETag"))?;
        let entity: ServiceEntity = serde_json::from_slice(&response.body).map_err(|e| {
            StorageError::invalid_response(format!("point read returned invalid JSON: {e}"))
        })?;
        match entity {
            ServiceEntity::Entity(entity) => Ok(Some((entity, etag))),
            ServiceEntity::Unaddressable(row) => Err(StorageError::invalid_response(format!(
                "point read in table {table} returned an unaddressable {row}"
            ))),
        }
    }

    /// The `Date` of an answer to a query that matches no row (`PartitionKey lt ''`).
    async fn date_once(&self, table: &str) -> StorageResult<Option<time::OffsetDateTime>> {
        let path = format!("{}()", percent_encode(table));
        let query = Query {
            filter: Some(super::Filter::pk(super::CompareOp::Lt, "")),
            top: Some(1),
            select: Some(Vec::new()),
            continuation: None,
        };
        let response = self
            .signed
            .send(
                TableRequest {
                    method: Method::GET,
                    path: &path,
                    query: &query_string(&query),
                    content_type: "",
                    accept: ACCEPT_MINIMAL_METADATA,
                    body: None,
                },
                || format!("clock read on table {table}"),
            )
            .await?;
        let date = response.headers.get("date").and_then(|v| v.to_str().ok());
        let date = date
            .and_then(|d| httpdate::parse_http_date(d).ok())
            .ok_or_else(|| {
                StorageError::invalid_response(format!(
                    "table {table} answered without a readable Date"
                ))
            })?;
        Ok(Some(time::OffsetDateTime::from(date)))
    }

    async fn batch_once(
        &self,
        table: &str,
        body: &BatchBody,
    ) -> StorageResult<Vec<Option<String>>> {
        let response = self
            .signed
            .send(
                TableRequest {
                    method: Method::POST,
                    path: "$batch",
                    query: "",
                    content_type: &body.content_type,
                    accept: ACCEPT_MINIMAL_METADATA,
                    body: Some(body.bytes.clone()),
                },
                || format!("entity group transaction on table {table}"),
            )
            .await?;
        let text = std::str::from_utf8(&response.body).map_err(|_| {
            StorageError::invalid_response("entity group transaction response is not UTF-8")
        })?;
        let parts = parse_batch_response(text);
        batch_outcome(body.operations, &parts)?;
        Ok(parts
            .into_iter()
            .map(|part| {
                part.headers
                    .into_iter()
                    .find(|(name, _)| name.eq_ignore_ascii_case("etag"))
                    .map(|(_, value)| value)
            })
            .collect())
    }
}

/// `$filter`, `$top`, `$select` and the continuation, percent-encoded.
fn query_string(query: &Query) -> String {
    let mut pairs: Vec<(&str, String)> = Vec::with_capacity(5);
    if let Some(filter) = &query.filter {
        pairs.push(("$filter", filter.to_odata()));
    }
    if let Some(top) = query.top {
        pairs.push(("$top", top.to_string()));
    }
    if let Some(columns) = select_list(&query.select) {
        pairs.push(("$select", columns));
    }
    if let Some(continuation) = &query.continuation {
        pairs.push(("NextPartitionKey", continuation.next_partition_key.clone()));
        if let Some(row_key) = &continuation.next_row_key {
            pairs.push(("NextRowKey", row_key.clone()));
        }
    }
    let mut out = String::new();
    for (name, value) in pairs {
        if !out.is_empty() {
            out.push('&');
        }
        out.push_str(name);
        out.push('=');
        out.push_str(&percent_encode(&value));
    }
    out
}

/// A query response: `{"odata.metadata": .., "value": [entity, ..]}`.
#[derive(serde::Deserialize)]
struct QueryBody {
    value: Vec<ServiceEntity>,
}

impl TableStore for AzureTableStore {
    async fn query_page(&self, table: &str, query: &Query) -> StorageResult<Page> {
        if let Some(top) = query.top {
            if top == 0 || top > MAX_TAKE {
                return Err(StorageError::invalid_input(format!(
                    "$top must be 1..={MAX_TAKE}, got {top}"
                )));
            }
        }
        self.service
            .attempts(RequestKind::Query, || self.query_once(table, query))
            .await
    }

    async fn submit_batch_with_etags(
        &self,
        table: &str,
        partition_key: &str,
        operations: &[BatchOperation],
    ) -> StorageResult<Vec<Option<String>>> {
        // The shape is checked first; the size limit applies to the exact body we send.
        validate_batch_shape(partition_key, operations)?;
        let body = build_batch_body(&self.service.base, table, partition_key, operations)?;
        check_batch_bytes(body.bytes.len())?;
        self.service
            .attempts(RequestKind::Batch, || self.batch_once(table, &body))
            .await
    }

    async fn get_entity(
        &self,
        table: &str,
        partition_key: &str,
        row_key: &str,
    ) -> StorageResult<Option<(Entity, String)>> {
        self.service
            .attempts(RequestKind::PointRead, || {
                self.get_once(table, partition_key, row_key)
            })
            .await
    }

    async fn service_time(&self, table: &str) -> StorageResult<Option<time::OffsetDateTime>> {
        self.service
            .attempts(RequestKind::Query, || self.date_once(table))
            .await
    }

    async fn create_table(&self, table: &str) -> StorageResult<bool> {
        let result = self
            .service
            .attempts(RequestKind::TableAdmin, || async {
                self.table(table)
                    .create()
                    .await
                    .map_err(|e| map_sdk_error(&format!("create table {table}"), e))
            })
            .await;
        match result {
            Ok(_) => Ok(true),
            Err(e)
                if e.kind == StorageErrorKind::Conflict
                    && e.code.as_deref() == Some("TableAlreadyExists") =>
            {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    async fn delete_table(&self, table: &str) -> StorageResult<bool> {
        let result = self
            .service
            .attempts(RequestKind::TableAdmin, || async {
                self.table(table)
                    .delete()
                    .await
                    .map_err(|e| map_sdk_error(&format!("delete table {table}"), e))
            })
            .await;
        match result {
            Ok(_) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// `$select` with PartitionKey and RowKey always included.
fn select_list(select: &Option<Vec<String>>) -> Option<String> {
    let columns = select.as_ref()?;
    let mut all: Vec<&str> = vec!["PartitionKey", "RowKey"];
    for column in columns {
        if !all.contains(&column.as_str()) {
            all.push(column);
        }
    }
    Some(all.join(","))
}

/// The entity's URL path: `table(PartitionKey='..',RowKey='..')` with `'` doubled inside the key
/// literals (OData string syntax) and then everything but unreserved characters percent-encoded.
pub(crate) fn entity_path(table: &str, partition_key: &str, row_key: &str) -> String {
    format!(
        "{}(PartitionKey='{}',RowKey='{}')",
        percent_encode(table),
        percent_encode(&partition_key.replace('\'', "''")),
        percent_encode(&row_key.replace('\'', "''"))
    )
}

/// A serialized entity group transaction, built once and re-sent unchanged on retries.
struct BatchBody {
    /// `multipart/mixed; boundary=batch_..`
    content_type: String,
    bytes: Bytes,
    operations: usize,
}

/// Builds the multipart/mixed body of an entity group transaction (one changeset, CRLF lines).
fn build_batch_body(
    base: &str,
    table: &str,
    partition_key: &str,
    operations: &[BatchOperation],
) -> StorageResult<BatchBody> {
    use std::io::Write;
    let batch_boundary = format!("batch_{}", uuid::Uuid::new_v4());
    let changeset = format!("changeset_{}", uuid::Uuid::new_v4());
    let table_url = format!("{base}/{}", percent_encode(table));
    let encoded_partition_key = percent_encode(&partition_key.replace('\'', "''"));
    let mut out: Vec<u8> = Vec::with_capacity(512 + operations.len() * 1024);
    // Writes into a Vec cannot fail.
    let _ = write!(
        out,
        "--{batch_boundary}\r\nContent-Type: multipart/mixed; boundary={changeset}\r\n\r\n"
    );
    let mut json: Vec<u8> = Vec::with_capacity(1024);
    for op in operations {
        let (method, if_match, entity) = match op {
            BatchOperation::Insert(e) => ("POST", None, Some(e)),
            BatchOperation::Upsert(e) => ("PUT", None, Some(e)),
            BatchOperation::Replace { entity, etag } => {
                ("PUT", Some(etag.as_deref().unwrap_or("*")), Some(entity))
            }
            BatchOperation::Merge { entity, etag } => {
                ("MERGE", Some(etag.as_deref().unwrap_or("*")), Some(entity))
            }
            BatchOperation::Delete { etag, .. } => {
                ("DELETE", Some(etag.as_deref().unwrap_or("*")), None)
            }
        };
        let _ = write!(
            out,
            "--{changeset}\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n\r\n{method} {table_url}"
        );
        if !matches!(op, BatchOperation::Insert(_)) {
            let _ = write!(
                out,
                "(PartitionKey='{encoded_partition_key}',RowKey='{}')",
                percent_encode(&op.row_key().replace('\'', "''"))
            );
        }
        let _ = write!(
            out,
            " HTTP/1.1\r\nAccept: {ACCEPT_MINIMAL_METADATA}\r\nDataServiceVersion: 3.0\r\n"
        );
        if let Some(if_match) = if_match {
            let _ = write!(out, "If-Match: {if_match}\r\n");
        }
        match entity {
            Some(entity) => {
                json.clear();
                serde_json::to_writer(&mut json, &entity.wire()).map_err(|e| {
                    StorageError::invalid_input(format!("entity cannot be serialized: {e}"))
                })?;
                escape_line_separators(&mut json);
                let _ = write!(
                    out,
                    "Content-Type: application/json\r\nPrefer: return-no-content\r\nContent-Length: {}\r\n\r\n",
                    json.len()
                );
                out.extend_from_slice(&json);
                out.extend_from_slice(b"\r\n");
            }
            None => out.extend_from_slice(b"\r\n"),
        }
    }
    let _ = write!(out, "--{changeset}--\r\n--{batch_boundary}--\r\n");
    Ok(BatchBody {
        content_type: format!("multipart/mixed; boundary={batch_boundary}"),
        bytes: Bytes::from(out),
        operations: operations.len(),
    })
}

/// Writes U+2028 and U+2029 as `\u2028`/`\u2029`: the same JSON (they can only occur inside
/// strings), but Azurite's transaction parser loses an operation whose body holds them raw.
fn escape_line_separators(json: &mut Vec<u8>) {
    const LS: [u8; 3] = [0xE2, 0x80, 0xA8];
    const PS: [u8; 3] = [0xE2, 0x80, 0xA9];
    if !json.windows(3).any(|w| w == LS || w == PS) {
        return;
    }
    let mut out = Vec::with_capacity(json.len() + 16);
    let mut i = 0;
    while i < json.len() {
        match json.get(i..i + 3) {
            Some(w) if w == LS => out.extend_from_slice(b"\\u2028"),
            Some(w) if w == PS => out.extend_from_slice(b"\\u2029"),
            _ => {
                out.push(json[i]);
                i += 1;
                continue;
            }
        }
        i += 3;
    }
    *json = out;
}

/// One operation's response inside a batch response.
#[derive(Debug, Clone, PartialEq)]
struct SubResponse {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

/// Splits a batch response into its `HTTP/1.1 ...` parts, in order. Boundaries need not be
/// known: every part starts with a status line, and its body ends at the next `--` boundary line.
fn parse_batch_response(text: &str) -> Vec<SubResponse> {
    enum State {
        Outside,
        Headers,
        Body,
    }
    let mut parts: Vec<SubResponse> = Vec::new();
    let mut state = State::Outside;
    for line in text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l)) {
        if let Some(rest) = line.strip_prefix("HTTP/1.1 ") {
            let status = rest
                .split_whitespace()
                .next()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            parts.push(SubResponse {
                status,
                headers: Vec::new(),
                body: String::new(),
            });
            state = State::Headers;
            continue;
        }
        match state {
            State::Outside => {}
            State::Headers if line.is_empty() => state = State::Body,
            State::Headers => {
                if let (Some(part), Some((name, value))) = (parts.last_mut(), line.split_once(':'))
                {
                    part.headers
                        .push((name.trim().to_string(), value.trim().to_string()));
                }
            }
            State::Body if line.starts_with("--") => state = State::Outside,
            State::Body => {
                if let Some(part) = parts.last_mut() {
                    if !part.body.is_empty() {
                        part.body.push('\n');
                    }
                    part.body.push_str(line);
                }
            }
        }
    }
    parts
}

/// Decides a transaction's outcome from its operation responses: any non-2xx part fails the
/// whole transaction, reported with the service's code and (from the `index:` prefix of the
/// error message) the failing operation.
fn batch_outcome(operations: usize, parts: &[SubResponse]) -> StorageResult<()> {
    if let Some(failed) = parts.iter().find(|p| !(200..300).contains(&p.status)) {
        let (code, detail) = odata_error(&failed.body);
        let (index, detail) = split_operation_index(&detail);
        let index = index
            .or_else(|| (operations == 1).then_some(0))
            .filter(|i| *i < operations);
        let mut error = StorageError::from_status(
            failed.status,
            code,
            format!(
                "entity group transaction failed: {}",
                detail.lines().next().unwrap_or("").trim()
            ),
        );
        error.failed_operation = index;
        return Err(error);
    }
    if parts.len() != operations {
        return Err(StorageError::invalid_response(format!(
            "entity group transaction answered {} operations out of {operations}",
            parts.len()
        )));
    }
    Ok(())
}

/// `(code, message)` from `{"odata.error":{"code":..,"message":{"value":..}}}`.
fn odata_error(body: &str) -> (Option<String>, String) {
    let body = body.trim();
    odata_error_json(body.as_bytes()).unwrap_or_else(|| (None, body.chars().take(200).collect()))
}

/// Splits `"3:The specified entity already exists."` into `(Some(3), "The specified ...")`.
fn split_operation_index(message: &str) -> (Option<usize>, String) {
    if let Some((prefix, rest)) = message.split_once(':') {
        if !prefix.is_empty() && prefix.bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(index) = prefix.parse() {
                return (Some(index), rest.to_string());
            }
        }
    }
    (None, message.to_string())
}

#[cfg(test)]
#[path = "azure_table_tests.rs"]
mod tests;
