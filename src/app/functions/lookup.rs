//! `Lookup`: `POST /api/lookups` — the rows whose indexed property equals a value, found
//! through an index the index driver built (docs/index.md), without scanning the table.
//!
//! One call: reads the prefix's pointer and the build's manifest; per segment its directory
//! (cached in the process: segments never change once a manifest names them) and the two byte
//! spans that hold every range's candidate slots for the value (`files`); sorts the candidate
//! ranges of all segments by key and merges those that overlap; then asks the index's recorded
//! source table `(<range>) and (<property> eq <value>)` for at most [`RANGES_PER_CALL`] of
//! them (a value too long for a filter: the ranges' rows, compared here), and hands a
//! `continuationToken` back for the rest.
//!
//! Invariants:
//! - It never writes, and never trusts a candidate: every row it returns is one the service
//!   answered for the range whose property holds the value with its type (the index's equality:
//!   the Double `42.0` is not the Int32 `42`), with every value as the service's JSON text.
//! - It never trusts an index file either (`files`, `index_files::check_*`): every name it acts
//!   on is checked first, the source table as a scan's is (the service's rules, an allowed
//!   connection, none of tablescan's bookkeeping tables), and a pointer that records what its
//!   build indexed must agree with the manifest. A file that cannot be used is a 409 naming it.
//! - Its memory of index files is bounded for the whole process (`budget`), whatever the files
//!   say.
//! - A continuation token names its build, so the pages of one lookup come from one index even
//!   if a rebuild switches the pointer between them (builds are never changed once complete).
//! - Bounded: at most `index_files::MAX_SEGMENTS` segments, [`RANGES_PER_CALL`] ranges and
//!   [`MAX_QUERIES_PER_RANGE`] queries per range per call.
//! - Only allowed connection names are accepted, never a connection string; the source table's
//!   connection is the one the build recorded, and must be allowed on this app too.

mod budget;
mod files;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use bytes::Bytes;
use futures::stream::{self, StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::app::error::ApiError;
use crate::app::index_files::IndexLayout;
use crate::app::job::range::range_filter;
use crate::app::job::request::{check_connection, default_connection};
use crate::app::pace::Meter;
use crate::app::state::AppState;
use crate::index::{IndexValue, KeyBounds};
use crate::storage::blob::check_container;
use crate::storage::odata::{Cmp, Expr, MAX_FILTER_CHARS};
use crate::storage::stores::Stores;
use crate::storage::{compare_keys, Entity, Filter, Query, TableStore};

use budget::{Held, HELD_PER_LOOKUP};
use files::{held_refused, unusable, Build, IndexFiles, Memory};

/// Largest accepted request body: a value as long as the service stores (a 64 KiB binary is
/// 128 Ki hex digits; a string of 32 Ki characters, JSON-escaped, up to 192 KiB).
pub const MAX_BODY: usize = 256 * 1024;
/// Candidate ranges one call reads (the rest: `continuationToken`).
pub const RANGES_PER_CALL: usize = 16;
/// Queries one candidate range may take (pages of matches; a range holds about 2,000 rows).
pub const MAX_QUERIES_PER_RANGE: usize = 16;
/// Segments read at once (within the process's budget: `budget`).
const SEGMENTS_IN_FLIGHT: usize = 16;
/// Ranges queried at once.
const QUERIES_IN_FLIGHT: usize = 4;
/// Longest value literal a lookup puts in a filter (`<property> eq <literal>`); a longer value
/// (a string or binary) is found by reading its candidate ranges and comparing each row here.
pub const MAX_FILTER_LITERAL_CHARS: usize = MAX_FILTER_CHARS - 48;

/// The request body.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct LookupRequest {
    source_container: String,
    #[serde(default)]
    source_prefix: String,
    value: String,
    #[serde(default = "default_connection")]
    source_connection: String,
    #[serde(default)]
    continuation_token: Option<String>,
}

/// A continuation token's content (base64url of its JSON): the build, the next candidate, and
/// the value's hash (a token is refused for another value).
#[derive(Debug, Serialize, Deserialize)]
struct Token {
    b: String,
    n: usize,
    h: String,
}

impl Token {
    fn encode(&self) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(serde_json::to_vec(self).expect("a token serializes"))
    }

    fn decode(text: &str, value: &IndexValue) -> Result<Token, ApiError> {
        let bad = |why: &str| {
            ApiError::field(
                "continuationToken",
                format!("{why}: send back the token a lookup of the same value answered"),
            )
        };
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(text)
            .map_err(|_| bad("not a continuation token"))?;
        let token: Token =
            serde_json::from_slice(&bytes).map_err(|_| bad("not a continuation token"))?;
        if token.h != value_tag(value) || !crate::app::job::is_valid_scan_id(&token.b) {
            return Err(bad("the token belongs to a lookup of another value"));
        }
        Ok(token)
    }
}

fn value_tag(value: &IndexValue) -> String {
    format!("{:016x}", value.index_hash())
}

pub async fn handle<S: Stores>(
    State(state): State<Arc<AppState<S>>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = crate::app::body::json_object(&headers, body, MAX_BODY).await?;
    let request: LookupRequest = serde_path_to_error::deserialize(body).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        let field = match path.as_str() {
            "." => inner.split('`').nth(1).unwrap_or("body").to_string(),
            _ => path,
        };
        ApiError::field(field, inner)
    })?;
    check_container(&request.source_container)
        .map_err(|e| ApiError::field("sourceContainer", e.message))?;
    let layout = IndexLayout::new(&request.source_prefix)
        .map_err(|e| ApiError::field("sourcePrefix", e.to_string()))?;
    check_connection(
        &state.config,
        "sourceConnection",
        &request.source_connection,
    )?;
    let value = IndexValue::from_literal(&request.value)
        .map_err(|e| ApiError::field("value", format!("not a filter literal: {e}")))?;
    let token = request
        .continuation_token
        .as_deref()
        .map(|t| Token::decode(t, &value))
        .transpose()?;
    let requests = Meter::new();
    let answer = lookup(&state, &request, &layout, &value, token, &requests).await?;
    Ok(json_response(answer))
}

/// The answer's body: its rows are the service's JSON text, kept as they are.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Answer {
    rows: Vec<Box<RawValue>>,
    ranges: u64,
    candidate_ranges: usize,
    storage_requests: u64,
    index: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    continuation_token: Option<String>,
}

fn json_response(answer: Answer) -> Response {
    let body = serde_json::to_vec(&answer).expect("an answer serializes");
    (
        [(header::CONTENT_TYPE, "application/json")],
        Bytes::from(body),
    )
        .into_response()
}

async fn lookup<S: Stores>(
    state: &AppState<S>,
    request: &LookupRequest,
    layout: &IndexLayout,
    value: &IndexValue,
    token: Option<Token>,
    requests: &Arc<Meter>,
) -> Result<Answer, ApiError> {
    let blobs = state.blob_store(&request.source_connection, requests)?;
    let container = &request.source_container;
    let memory = state.driver_state(Memory::default);
    let files = IndexFiles {
        blobs: &blobs,
        connection: &request.source_connection,
        container,
        layout,
        memory: &memory,
    };
    let mut held = memory.budget.hold(HELD_PER_LOOKUP);
    let (build_id, recorded) = match &token {
        Some(token) => (token.b.clone(), None),
        None => {
            let pointer = files.pointer().await?.ok_or_else(|| {
                ApiError::NotFound(format!(
                    "no index at {container}/{}: build one with a scan of driver \"index\"",
                    layout.pointer()
                ))
            })?;
            (pointer.build, pointer.indexed)
        }
    };
    let build = files.build(&build_id, &mut held).await?.ok_or_else(|| {
        ApiError::NotFound(format!(
            "index build {build_id} is gone ({container}/{})",
            layout.blob(&IndexLayout::manifest_name(&build_id))
        ))
    })?;
    check_source(state, container, layout, &build, recorded.as_ref())?;
    let candidates = candidates(&files, &build, value, &mut held).await?;
    let next = token.map_or(0, |t| t.n).min(candidates.len());
    let end = (next + RANGES_PER_CALL).min(candidates.len());
    let rows = query_ranges(state, &build, value, &candidates[next..end], requests).await?;
    tracing::debug!(
        held = held.bytes(),
        process_in_use = memory.budget.in_use(),
        process_peak = memory.budget.peak(),
        cache = memory.cache_bytes(),
        "lookup memory"
    );
    let continuation_token = (end < candidates.len()).then(|| {
        Token {
            b: build_id.clone(),
            n: end,
            h: value_tag(value),
        }
        .encode()
    });
    Ok(Answer {
        rows,
        ranges: build.ranges,
        candidate_ranges: candidates.len(),
        storage_requests: requests.count(),
        index: serde_json::json!({
            "property": build.indexed.property,
            "sourceTable": build.indexed.source_table,
            "sourceConnection": build.indexed.source_connection,
            "rows": build.rows,
            "builtAt": crate::app::tracking::format_time(build.built_at),
            "build": build_id,
        }),
        continuation_token,
    })
}

/// The build's source as a scan's source is checked: an allowed connection, none of
/// tablescan's bookkeeping tables (its name by the service's rules: `index_files`), and what
/// the pointer recorded, if it did. 409 naming the manifest.
fn check_source<S: Stores>(
    state: &AppState<S>,
    container: &str,
    layout: &IndexLayout,
    build: &Build,
    recorded: Option<&crate::app::index_files::Indexed>,
) -> Result<(), ApiError> {
    let source = &build.indexed;
    let why = if !state
        .config
        .connections
        .contains_key(&source.source_connection)
    {
        format!(
            "its source connection {:?} is not allowed on this app (TABLESCAN_CONNECTIONS)",
            source.source_connection
        )
    } else if state
        .config
        .is_bookkeeping_table(&source.source_connection, &source.source_table)
    {
        format!(
            "its source table {} is one of tablescan's bookkeeping tables, refused on every \
             connection",
            source.source_table
        )
    } else if recorded.is_some_and(|r| r != source) {
        format!(
            "it says the build indexed {source}, but the pointer {container}/{} says {}",
            layout.pointer(),
            recorded.expect("some")
        )
    } else {
        return Ok(());
    };
    Err(unusable(container, &build.manifest, why))
}

/// The candidate ranges of every segment, in key order, those that overlap merged; each
/// segment's kept in `held`.
async fn candidates<B: crate::storage::blob::BlobStore>(
    files: &IndexFiles<'_, B>,
    build: &Build,
    value: &IndexValue,
    held: &mut Held,
) -> Result<Vec<KeyBounds>, ApiError> {
    let mut results = stream::iter(build.segments.iter().cloned())
        .map(|(name, bytes)| async move { files.candidates(&name, bytes, value).await })
        .buffer_unordered(SEGMENTS_IN_FLIGHT);
    let mut all = Vec::new();
    while let Some(found) = results.next().await {
        let found = found?;
        held.add(files::candidate_bytes(&found))
            .map_err(|r| held_refused(r, "the value's candidate ranges"))?;
        all.extend(found);
    }
    Ok(merge(all))
}

fn key_cmp(a: (&str, &str), b: (&str, &str)) -> std::cmp::Ordering {
    compare_keys(a.0, b.0).then_with(|| compare_keys(a.1, b.1))
}

/// Ranges in key order, those that overlap (rereads of a step: see `drivers/index`) merged.
fn merge(mut ranges: Vec<KeyBounds>) -> Vec<KeyBounds> {
    ranges.sort_by(|a, b| {
        key_cmp(
            (&a.first_partition_key, &a.first_row_key),
            (&b.first_partition_key, &b.first_row_key),
        )
    });
    let mut out: Vec<KeyBounds> = Vec::with_capacity(ranges.len());
    for range in ranges {
        match out.last_mut() {
            Some(last)
                if key_cmp(
                    (&range.first_partition_key, &range.first_row_key),
                    (&last.last_partition_key, &last.last_row_key),
                )
                .is_le() =>
            {
                if key_cmp(
                    (&range.last_partition_key, &range.last_row_key),
                    (&last.last_partition_key, &last.last_row_key),
                )
                .is_gt()
                {
                    last.last_partition_key = range.last_partition_key;
                    last.last_row_key = range.last_row_key;
                }
            }
            _ => out.push(range),
        }
    }
    out
}

/// The rows of `ranges` whose property equals `value`, read from the index's source, in key
/// order, each as the service's JSON text. The filter is `(<range>) and (<property> eq
/// <value>)`, or only the range for a value whose literal is longer than
/// [`MAX_FILTER_LITERAL_CHARS`] (every row is compared here in both cases). A source table
/// that no longer exists is a 404 naming it.
async fn query_ranges<S: Stores>(
    state: &AppState<S>,
    build: &Build,
    value: &IndexValue,
    ranges: &[KeyBounds],
    requests: &Arc<Meter>,
) -> Result<Vec<Box<RawValue>>, ApiError> {
    let source = &build.indexed;
    let table = state
        .counted_table(&source.source_connection, requests)
        .map_err(|e| ApiError::Conflict(format!("the index's source: {e}")))?;
    let literal = value
        .to_odata()
        .map_err(|e| ApiError::field("value", e.to_string()))?;
    let condition = (literal.render().chars().count() <= MAX_FILTER_LITERAL_CHARS).then(|| {
        Filter::Where(Expr::Compare {
            property: source.property.clone(),
            op: Cmp::Eq,
            literal,
        })
    });
    let wanted = value.canonical_bytes();
    let pages: Vec<Vec<Box<RawValue>>> = stream::iter(ranges.to_vec())
        .map(|range| {
            let bounds = range_filter(
                &(
                    range.first_partition_key.clone(),
                    range.first_row_key.clone(),
                ),
                &(range.last_partition_key.clone(), range.last_row_key.clone()),
            );
            let filter = match &condition {
                Some(c) => Filter::and(vec![bounds, c.clone()]),
                None => bounds,
            };
            read_range(&table, source, filter, &wanted)
        })
        .buffered(QUERIES_IN_FLIGHT)
        .try_collect()
        .await?;
    Ok(pages.into_iter().flatten().collect())
}

/// The rows `filter` gives whose property holds `wanted` (canonical bytes), at most
/// [`MAX_QUERIES_PER_RANGE`] pages.
async fn read_range<T: TableStore>(
    table: &T,
    source: &crate::app::index_files::Indexed,
    filter: Filter,
    wanted: &[u8],
) -> Result<Vec<Box<RawValue>>, ApiError> {
    let mut query = Query {
        filter: Some(filter),
        ..Query::default()
    };
    let mut rows = Vec::new();
    for _ in 0..MAX_QUERIES_PER_RANGE {
        let page = match table.query_page(&source.source_table, &query).await {
            Ok(page) => page,
            Err(e) if e.is_not_found() => {
                return Err(ApiError::NotFound(format!(
                    "the index's source table {} (connection {}) does not exist: it was deleted \
                     after the index was built",
                    source.source_table, source.source_connection
                )))
            }
            Err(e) => return Err(e.into()),
        };
        for entity in page
            .entities
            .iter()
            .filter(|e| holds(e, &source.property, wanted))
        {
            rows.push(
                serde_json::value::to_raw_value(&entity.wire()).expect("an entity serializes"),
            );
        }
        match page.continuation {
            Some(next) => query.continuation = Some(next),
            None => return Ok(rows),
        }
    }
    Err(ApiError::Conflict(format!(
        "a candidate range holds more than {MAX_QUERIES_PER_RANGE} pages of rows to compare; the \
         table grew since the index was built: rebuild it"
    )))
}

/// Whether `entity`'s property is the value (type and value, as the index keys it): the
/// service may also answer `eq` with a number of another type (Azurite matches the Int32 `42`
/// with the Double `42.0`), which the index keeps apart.
fn holds(entity: &Entity, property: &str, wanted: &[u8]) -> bool {
    matches!(
        IndexValue::from_property(&entity.properties, property),
        Ok(Some(v)) if v.canonical_bytes() == wanted
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kb(a: (&str, &str), b: (&str, &str)) -> KeyBounds {
        KeyBounds::new(a, b)
    }

    #[test]
    fn candidates_sort_and_overlaps_merge() {
        let out = merge(vec![
            kb(("c", ""), ("c", "9")),
            kb(("a", "1"), ("b", "2")),
            kb(("b", "0"), ("b", "1")),
            kb(("b", "2"), ("b", "5")),
        ]);
        assert_eq!(
            out,
            vec![kb(("a", "1"), ("b", "5")), kb(("c", ""), ("c", "9"))]
        );
    }
}
