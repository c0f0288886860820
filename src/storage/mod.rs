//! Storage adapters: the table and queue interfaces tablescan runs on, their Azure implementations
//! (over `azure_data_tables` / `azure_storage_queues` 0.21). The in-memory stores for tests are
//! lab code (`crate::lab::memory`, with the `lab` feature).
//!
//! Nothing here knows about Azure Functions or about scans. The scan engine talks to [`TableStore`];
//! the function app and the local host talk to [`QueueStore`].
//!
//! The Azure side, each module depending only on those before it:
//! - `connection_string`: connection strings parsed into plain data (no HTTP, no SDK); `app_settings`:
//!   one connection read from app settings, a connection string or identity-based (keyless);
//! - `token`: Entra ID tokens for keyless connections, cached and single-flight;
//! - [`connection`]: [`connection::StorageAccount`], the settings with one pooled HTTP client,
//!   the [`retry_policy`] (the adapters' retries, through the crate's one retry loop) and (keyless) its token provider;
//! - `auth`: the one place a credential becomes SDK credentials or signed-path authorization;
//! - `azure`: what both adapters share (SDK options and pipeline, counted retried attempts, errors);
//! - `signed`: the lean signed path for table data requests;
//! - [`azure_table`], [`azure_queue`] and [`azure_blob`]: the adapters, each building its own
//!   clients from an account (they add `StorageAccount::table_store`, `queue_store` and
//!   `blob_store`).
//!
//! Blob Storage (export, import, indexes): [`blob`] is the [`blob::BlobStore`] interface and its
//! checks; the app holds its kind's store per connection ([`stores::Stores::Blob`]). (The export
//! file format is the export and import drivers', in `app::export_format`.)
//!
//! Invariants: the adapters never import each other or anything above them; only what is used
//! outside `storage` is `pub`; no text made here carries a secret.

mod app_settings;
mod auth;
mod azure;
pub mod azure_blob;
pub mod azure_queue;
pub mod azure_table;
pub mod blob;
pub mod connection;
mod connection_string;
pub mod entity;
pub mod keys;
mod names;
pub mod odata;
pub mod refused;
pub mod request_counts;
pub mod retry_policy;
mod signed;
pub mod stores;
mod token;
mod token_source;
mod writable;

use std::fmt;
use std::future::Future;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use entity::{
    is_read_only_property, Entity, Properties, ServiceEntity, UnaddressableRow, MAX_ENTITY_BYTES,
};
pub use keys::{compare_keys, key_successor};

/// Maximum `$top` Azure accepts for one query page.
pub const MAX_TAKE: u32 = 1000;
/// Maximum operations in one entity group transaction.
pub const MAX_BATCH_OPERATIONS: usize = 100;
/// Entity group transactions must be smaller than 4 MiB.
pub const MAX_BATCH_BYTES: usize = 4 * 1024 * 1024;

/// The two key columns a filter can constrain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum KeyColumn {
    PartitionKey,
    RowKey,
}

impl KeyColumn {
    pub fn name(self) -> &'static str {
        match self {
            KeyColumn::PartitionKey => "PartitionKey",
            KeyColumn::RowKey => "RowKey",
        }
    }
}

/// OData comparison operators on keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CompareOp {
    Eq,
    Gt,
    Ge,
    Lt,
    Le,
}

impl CompareOp {
    pub fn odata(self) -> &'static str {
        match self {
            CompareOp::Eq => "eq",
            CompareOp::Gt => "gt",
            CompareOp::Ge => "ge",
            CompareOp::Lt => "lt",
            CompareOp::Le => "le",
        }
    }
}

/// A `$filter` over the key columns, optionally with a condition on other properties. Built as
/// a tree so the in-memory table can evaluate exactly what the Azure adapter renders (with `'`
/// doubled), and comparisons are UTF-16 ordinal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Filter {
    Compare(KeyColumn, CompareOp, String),
    And(Vec<Filter>),
    Or(Vec<Filter>),
    /// A parsed row filter over non-key properties ([`odata::Expr`]), rendered canonically.
    Where(odata::Expr),
}

impl Filter {
    pub fn pk(op: CompareOp, value: impl Into<String>) -> Filter {
        Filter::Compare(KeyColumn::PartitionKey, op, value.into())
    }

    pub fn rk(op: CompareOp, value: impl Into<String>) -> Filter {
        Filter::Compare(KeyColumn::RowKey, op, value.into())
    }

    /// `a and b and ...`, flattening single-element lists.
    pub fn and(mut parts: Vec<Filter>) -> Filter {
        if parts.len() == 1 {
            parts.pop().unwrap()
        } else {
            Filter::And(parts)
        }
    }

    /// `a or b or ...`, flattening single-element lists.
    pub fn or(mut parts: Vec<Filter>) -> Filter {
        if parts.len() == 1 {
            parts.pop().unwrap()
        } else {
            Filter::Or(parts)
        }
    }

    /// Evaluates the filter on an entity: keys with the service's ordering (UTF-16 code units),
    /// other properties as [`odata::Expr::matches`].
    pub fn matches_entity(&self, entity: &Entity) -> bool {
        match self {
            Filter::Where(expr) => expr.matches(entity),
            Filter::And(parts) => parts.iter().all(|f| f.matches_entity(entity)),
            Filter::Or(parts) => parts.iter().any(|f| f.matches_entity(entity)),
            key => key.matches(&entity.partition_key, &entity.row_key),
        }
    }

    /// Evaluates the filter on a row's keys with the service's ordering (UTF-16 code units); a
    /// condition on other properties ([`Filter::Where`]) counts as met.
    pub fn matches(&self, partition_key: &str, row_key: &str) -> bool {
        match self {
            Filter::Compare(column, op, value) => {
                let key = match column {
                    KeyColumn::PartitionKey => partition_key,
                    KeyColumn::RowKey => row_key,
                };
                let ord = compare_keys(key, value);
                match op {
                    CompareOp::Eq => ord.is_eq(),
                    CompareOp::Gt => ord.is_gt(),
                    CompareOp::Ge => ord.is_ge(),
                    CompareOp::Lt => ord.is_lt(),
                    CompareOp::Le => ord.is_le(),
                }
            }
            Filter::And(parts) => parts.iter().all(|f| f.matches(partition_key, row_key)),
            Filter::Or(parts) => parts.iter().any(|f| f.matches(partition_key, row_key)),
            Filter::Where(_) => true,
        }
    }

    /// The OData `$filter` text. String literals have `'` doubled; every sub-expression is
    /// parenthesised so precedence never matters.
    pub fn to_odata(&self) -> String {
        match self {
            Filter::Compare(column, op, value) => {
                format!(
                    "{} {} '{}'",
                    column.name(),
                    op.odata(),
                    value.replace('\'', "''")
                )
            }
            Filter::And(parts) => join_odata(parts, "and"),
            Filter::Or(parts) => join_odata(parts, "or"),
            Filter::Where(expr) => expr.render(),
        }
    }
}

fn join_odata(parts: &[Filter], op: &str) -> String {
    parts
        .iter()
        .map(|p| format!("({})", p.to_odata()))
        .collect::<Vec<_>>()
        .join(&format!(" {op} "))
}

impl fmt::Display for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_odata())
    }
}

/// The service's continuation token (`x-ms-continuation-NextPartitionKey` / `NextRowKey`).
/// Opaque: only ever followed within one step, never persisted or put in a message.
/// `next_row_key` may be absent (the service sends NextPartitionKey alone at partition boundaries).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Continuation {
    pub next_partition_key: String,
    pub next_row_key: Option<String>,
}

/// One query request: filter, page size, projection and where to continue.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Query {
    pub filter: Option<Filter>,
    /// `$top`, 1..=1000. `None` lets the service choose (up to 1000).
    pub top: Option<u32>,
    /// `$select`; `None` means every column. When given, PartitionKey and RowKey are always added.
    pub select: Option<Vec<String>>,
    pub continuation: Option<Continuation>,
}

/// One page of query results. A page may be short or even empty and still carry a continuation:
/// only the absence of a continuation means the query is finished.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Page {
    pub entities: Vec<Entity>,
    /// Rows of this page whose keys cannot be addressed (see [`UnaddressableRow`]); they are
    /// not in `entities`, and whoever reads the page must report them.
    pub unaddressable: Vec<UnaddressableRow>,
    pub continuation: Option<Continuation>,
}

/// One operation of an entity group transaction.
#[derive(Debug, Clone, PartialEq)]
pub enum BatchOperation {
    /// Insert; fails with 409 if the entity exists.
    Insert(Entity),
    /// Insert or replace (upsert-replace), unconditional.
    Upsert(Entity),
    /// Replace an existing entity; `etag: None` means `If-Match: *`.
    Replace {
        entity: Entity,
        etag: Option<String>,
    },
    /// Merge into an existing entity; `etag: None` means `If-Match: *`.
    Merge {
        entity: Entity,
        etag: Option<String>,
    },
    /// Delete an existing entity; `etag: None` means `If-Match: *`.
    Delete {
        row_key: String,
        etag: Option<String>,
    },
}

impl BatchOperation {
    pub fn row_key(&self) -> &str {
        match self {
            BatchOperation::Insert(e) | BatchOperation::Upsert(e) => &e.row_key,
            BatchOperation::Replace { entity, .. } | BatchOperation::Merge { entity, .. } => {
                &entity.row_key
            }
            BatchOperation::Delete { row_key, .. } => row_key,
        }
    }

    pub fn entity(&self) -> Option<&Entity> {
        match self {
            BatchOperation::Insert(e) | BatchOperation::Upsert(e) => Some(e),
            BatchOperation::Replace { entity, .. } | BatchOperation::Merge { entity, .. } => {
                Some(entity)
            }
            BatchOperation::Delete { .. } => None,
        }
    }
}

/// Checks the entity-group-transaction rules Azure enforces (Azurite does not enforce all of them):
/// 1..=100 operations, one partition key, each RowKey once, under 4 MiB.
pub fn validate_batch(
    partition_key: &str,
    operations: &[BatchOperation],
) -> Result<(), StorageError> {
    validate_batch_shape(partition_key, operations)?;
    let bytes: usize = operations
        .iter()
        .map(|op| op.entity().map_or(0, Entity::wire_size) + 512)
        .sum();
    check_batch_bytes(bytes)
}

/// The rules of [`validate_batch`] but the body size, for adapters that check the exact body
/// size. Every entity is also held to the service's per-entity limits
/// ([`Entity::check_limits`]), so a record that cannot be stored fails here, before it is sent.
pub(crate) fn validate_batch_shape(
    partition_key: &str,
    operations: &[BatchOperation],
) -> Result<(), StorageError> {
    if operations.is_empty() || operations.len() > MAX_BATCH_OPERATIONS {
        return Err(StorageError::invalid_input(format!(
            "an entity group transaction needs 1 to {MAX_BATCH_OPERATIONS} operations, got {}",
            operations.len()
        )));
    }
    let mut seen = std::collections::HashSet::with_capacity(operations.len());
    for (index, op) in operations.iter().enumerate() {
        if let Some(entity) = op.entity() {
            entity.check_limits().map_err(|mut e| {
                e.failed_operation = Some(index);
                e
            })?;
            if entity.partition_key != partition_key {
                return Err(StorageError::invalid_input(format!(
                    "entity group transaction mixes partition keys {partition_key:?} and {:?}",
                    entity.partition_key
                )));
            }
        }
        if !seen.insert(op.row_key()) {
            return Err(StorageError::invalid_input(format!(
                "entity group transaction names RowKey {:?} twice",
                op.row_key()
            )));
        }
    }
    Ok(())
}

/// A transaction body must stay under 4 MiB.
pub(crate) fn check_batch_bytes(bytes: usize) -> Result<(), StorageError> {
    if bytes >= MAX_BATCH_BYTES {
        return Err(StorageError::invalid_input(format!(
            "entity group transaction is about {bytes} bytes, over the 4 MiB limit"
        )));
    }
    Ok(())
}

/// What went wrong talking to storage. `status` and `code` come from the service when it answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageError {
    pub kind: StorageErrorKind,
    /// HTTP status, when the service answered.
    pub status: Option<u16>,
    /// The service's error code (`x-ms-error-code` or the body's `odata.error.code`), e.g. `TableNotFound`.
    pub code: Option<String>,
    pub message: String,
    /// For a failed entity group transaction: the index of the operation that failed.
    pub failed_operation: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageErrorKind {
    /// 404: table, entity, queue or message not found.
    NotFound,
    /// 409: already exists (entity, table, queue).
    Conflict,
    /// 412: ETag / If-Match failed.
    PreconditionFailed,
    /// Retryable: 408, 429, 500, 503, timeouts and connection errors.
    Transient,
    /// Any other 4xx: the request itself is wrong; not retried.
    Rejected,
    /// Our own validation refused the request before sending it.
    InvalidInput,
    /// The service answered something we could not understand.
    InvalidResponse,
}

impl StorageError {
    pub fn new(kind: StorageErrorKind, message: impl Into<String>) -> Self {
        StorageError {
            kind,
            status: None,
            code: None,
            message: message.into(),
            failed_operation: None,
        }
    }

    pub fn invalid_input(message: impl Into<String>) -> Self {
        Self::new(StorageErrorKind::InvalidInput, message)
    }

    pub fn invalid_response(message: impl Into<String>) -> Self {
        Self::new(StorageErrorKind::InvalidResponse, message)
    }

    /// Classifies an HTTP status from the service.
    pub fn from_status(status: u16, code: Option<String>, message: impl Into<String>) -> Self {
        let kind = match status {
            404 => StorageErrorKind::NotFound,
            409 => StorageErrorKind::Conflict,
            412 => StorageErrorKind::PreconditionFailed,
            408 | 429 | 500 | 502 | 503 | 504 => StorageErrorKind::Transient,
            _ => StorageErrorKind::Rejected,
        };
        StorageError {
            kind,
            status: Some(status),
            code,
            message: message.into(),
            failed_operation: None,
        }
    }

    pub fn is_transient(&self) -> bool {
        self.kind == StorageErrorKind::Transient
    }

    pub fn is_not_found(&self) -> bool {
        self.kind == StorageErrorKind::NotFound
    }
}

impl fmt::Display for StorageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.status, &self.code) {
            (Some(status), Some(code)) => write!(f, "{} (HTTP {status}, {code})", self.message),
            (Some(status), None) => write!(f, "{} (HTTP {status})", self.message),
            _ => f.write_str(&self.message),
        }?;
        if let Some(index) = self.failed_operation {
            write!(f, " [batch operation {index}]")?;
        }
        Ok(())
    }
}

impl std::error::Error for StorageError {}

pub type StorageResult<T> = Result<T, StorageError>;

/// A table service: the operations tablescan needs, nothing more.
///
/// Implementations count every request they send (see [`request_counts`]), and retry transient failures
/// themselves, so callers see only final outcomes.
pub trait TableStore: Send + Sync + 'static {
    /// Runs one query request and returns one page (which may be short or empty with a continuation).
    fn query_page(
        &self,
        table: &str,
        query: &Query,
    ) -> impl Future<Output = StorageResult<Page>> + Send;

    /// Submits one entity group transaction; succeeds only if every operation succeeded, and
    /// returns each operation's new ETag where the store reports one (`None` for deletes, and
    /// from stores that cannot say). The ETags save a read-back when the caller must update the
    /// row again under optimistic concurrency. A failed transaction reports the failing
    /// operation in `StorageError::failed_operation`.
    fn submit_batch_with_etags(
        &self,
        table: &str,
        partition_key: &str,
        operations: &[BatchOperation],
    ) -> impl Future<Output = StorageResult<Vec<Option<String>>>> + Send;

    /// [`TableStore::submit_batch_with_etags`] for callers that need no ETags.
    fn submit_batch(
        &self,
        table: &str,
        partition_key: &str,
        operations: &[BatchOperation],
    ) -> impl Future<Output = StorageResult<()>> + Send {
        async move {
            self.submit_batch_with_etags(table, partition_key, operations)
                .await
                .map(|_| ())
        }
    }

    /// Point read; `Ok(None)` when the entity does not exist. Returns the entity and its ETag.
    fn get_entity(
        &self,
        table: &str,
        partition_key: &str,
        row_key: &str,
    ) -> impl Future<Output = StorageResult<Option<(Entity, String)>>> + Send;

    /// The service's clock: the `Date` of one cheap answer about `table` (a query that matches
    /// no row). `Ok(None)` from stores without a clock of their own (in-memory and simulated
    /// ones): the caller then uses its own. Counted as a query where it is sent.
    fn service_time(
        &self,
        table: &str,
    ) -> impl Future<Output = StorageResult<Option<time::OffsetDateTime>>> + Send {
        let _ = table;
        async { Ok(None) }
    }

    /// Creates the table; `Ok(false)` if it already existed.
    fn create_table(&self, table: &str) -> impl Future<Output = StorageResult<bool>> + Send;

    /// Deletes the table; `Ok(false)` if it did not exist.
    fn delete_table(&self, table: &str) -> impl Future<Output = StorageResult<bool>> + Send;
}

/// A message as received from a queue. `text` is the message text exactly as stored (for
/// Functions, base64 of the payload); decode it with [`MessageEncoding::decode`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedMessage {
    pub id: String,
    pub pop_receipt: String,
    pub dequeue_count: u64,
    pub text: String,
    /// RFC 3339 / RFC 1123 times as the service reported them, converted to `time::OffsetDateTime`.
    pub insertion_time: time::OffsetDateTime,
    pub expiration_time: time::OffsetDateTime,
    pub next_visible_time: time::OffsetDateTime,
}

/// How message payloads are stored in the queue. Functions queue triggers expect base64 by default
/// (`extensions.queues.messageEncoding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MessageEncoding {
    #[default]
    Base64,
    None,
}

impl MessageEncoding {
    pub fn encode(self, payload: &[u8]) -> String {
        use base64::Engine;
        match self {
            MessageEncoding::Base64 => base64::engine::general_purpose::STANDARD.encode(payload),
            MessageEncoding::None => String::from_utf8_lossy(payload).into_owned(),
        }
    }

    pub fn decode(self, text: &str) -> Result<Vec<u8>, String> {
        use base64::Engine;
        match self {
            MessageEncoding::Base64 => base64::engine::general_purpose::STANDARD
                .decode(text.trim())
                .map_err(|e| format!("message is not valid base64: {e}")),
            MessageEncoding::None => Ok(text.as_bytes().to_vec()),
        }
    }
}

/// A queue service: the operations tablescan and the local Functions host need.
pub trait QueueStore: Send + Sync + 'static {
    /// Creates the queue if missing (idempotent).
    fn create_queue(&self, queue: &str) -> impl Future<Output = StorageResult<()>> + Send;

    /// Deletes the queue; `Ok(false)` if it did not exist.
    fn delete_queue(&self, queue: &str) -> impl Future<Output = StorageResult<bool>> + Send;

    /// Puts a message whose text is `text` verbatim (encode first with [`MessageEncoding::encode`]),
    /// invisible for `visibility_delay`. Messages must be at most 64 KiB of text.
    fn put_message(
        &self,
        queue: &str,
        text: &str,
        visibility_delay: Duration,
    ) -> impl Future<Output = StorageResult<()>> + Send;

    /// Puts a message that never expires (`messagettl=-1`; otherwise the service drops a
    /// message after seven days), visible at once; `text` as for [`QueueStore::put_message`].
    /// For messages a consumer may read long after they were put (a driver's output queue).
    fn put_message_never_expiring(
        &self,
        queue: &str,
        text: &str,
    ) -> impl Future<Output = StorageResult<()>> + Send;

    /// Receives up to `max` (1..=32) messages, hiding them for `visibility_timeout`.
    fn get_messages(
        &self,
        queue: &str,
        max: u8,
        visibility_timeout: Duration,
    ) -> impl Future<Output = StorageResult<Vec<ReceivedMessage>>> + Send;

    /// Deletes a received message.
    fn delete_message(
        &self,
        queue: &str,
        id: &str,
        pop_receipt: &str,
    ) -> impl Future<Output = StorageResult<()>> + Send;

    /// Changes a received message's visibility (and optionally its text); returns the new pop receipt.
    fn update_message(
        &self,
        queue: &str,
        id: &str,
        pop_receipt: &str,
        visibility_timeout: Duration,
        text: Option<&str>,
    ) -> impl Future<Output = StorageResult<String>> + Send;

    /// The service's approximate message count.
    fn approximate_count(&self, queue: &str) -> impl Future<Output = StorageResult<u64>> + Send;
}

/// Maximum queue message text (64 KiB).
pub const MAX_MESSAGE_TEXT: usize = 64 * 1024;
