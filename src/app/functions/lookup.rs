//! `Lookup`: `POST /api/lookups` — the rows whose indexed property equals a value, found
//! through an index the index driver built (docs/index.md), without scanning the table.
//!
//! One call: reads the prefix's pointer and the build's manifest; per segment its directory
//! (cached in the process: segments never change once a manifest names them) and the two byte
//! spans that hold every range's candidate slots for the value; sorts the candidate ranges of
//! all segments by key and merges those that overlap; then asks the index's recorded source
//! table `(<range>) and (<property> eq <value>)` for at most [`RANGES_PER_CALL`] of them, and
//! hands a `continuationToken` back for the rest.
//!
//! Invariants:
//! - It never writes, and never trusts a candidate: every row it returns is one the service
//!   answered for `<property> eq <value>` whose property holds the value with its type (the
//!   index's equality: the Double `42.0` is not the Int32 `42`), with every value as the
//!   service's JSON text.
//! - A continuation token names its build, so the pages of one lookup come from one index even
//!   if a rebuild switches the pointer between them (builds are never changed once complete).
//! - Bounded: at most [`MAX_SEGMENTS_READ`] segments, [`RANGES_PER_CALL`] ranges and
//!   [`MAX_QUERIES_PER_RANGE`] queries per range per call.
//! - Only allowed connection names are accepted, never a connection string; the source table's
//!   connection is the one the build recorded, and must be allowed on this app too.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

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
use crate::app::index_files::{
    IndexLayout, IndexManifest, Pointer, MAX_MANIFEST_BYTES, MAX_POINTER_BYTES,
};
use crate::app::job::range::range_filter;
use crate::app::job::request::{check_connection, default_connection};
use crate::app::pace::Meter;
use crate::app::state::AppState;
use crate::index::{IndexValue, KeyBounds, SegmentDirectory, DIRECTORY_FIXED_LEN};
use crate::storage::blob::{check_container, BlobStore};
use crate::storage::odata::{Cmp, Expr};
use crate::storage::stores::Stores;
use crate::storage::{compare_keys, Entity, Filter, Query, StorageError, TableStore};

/// Largest accepted request body.
pub const MAX_BODY: usize = 16 * 1024;
/// Candidate ranges one call reads (the rest: `continuationToken`).
pub const RANGES_PER_CALL: usize = 16;
/// Queries one candidate range may take (pages of matches; a range holds about 2,000 rows).
pub const MAX_QUERIES_PER_RANGE: usize = 16;
/// Most segments a lookup reads (a build has a few per 10 million rows).
pub const MAX_SEGMENTS_READ: usize = 20_000;
/// Segments read at once.
const SEGMENTS_IN_FLIGHT: usize = 16;
/// Ranges queried at once.
const QUERIES_IN_FLIGHT: usize = 4;
/// The first read of a directory: enough for most directories whole.
const DIRECTORY_FIRST_READ: u64 = 64 * 1024;
/// Directories kept per process (the cache is cleared when it grows past this).
const MAX_CACHED_DIRECTORIES: usize = 4096;

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

/// Segment directories read by this process, by blob (segments never change).
#[derive(Default)]
struct Directories(Mutex<HashMap<String, Arc<SegmentDirectory>>>);

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
    let build = match &token {
        Some(token) => token.b.clone(),
        None => {
            let pointer =
                read_json::<Pointer, _>(&blobs, container, &layout.pointer(), MAX_POINTER_BYTES)
                    .await?
                    .ok_or_else(|| {
                        ApiError::NotFound(format!(
                            "no index at {container}/{}: build one with a scan of driver \"index\"",
                            layout.pointer()
                        ))
                    })?;
            pointer.build
        }
    };
    let manifest_name = layout.blob(&IndexLayout::manifest_name(&build));
    let manifest =
        read_json::<IndexManifest, _>(&blobs, container, &manifest_name, MAX_MANIFEST_BYTES)
            .await?
            .ok_or_else(|| {
                ApiError::NotFound(format!(
                    "index build {build} is gone ({container}/{manifest_name})"
                ))
            })?;
    if manifest.segments.len() > MAX_SEGMENTS_READ {
        return Err(ApiError::Conflict(format!(
            "the index has {} segments, over the {MAX_SEGMENTS_READ} a lookup reads",
            manifest.segments.len()
        )));
    }
    let cache = state.driver_state(Directories::default);
    let candidates = candidates(&blobs, container, layout, &manifest, value, &cache).await?;
    let next = token.map_or(0, |t| t.n).min(candidates.len());
    let end = (next + RANGES_PER_CALL).min(candidates.len());
    let rows = query_ranges(state, &manifest, value, &candidates[next..end], requests).await?;
    let continuation_token = (end < candidates.len()).then(|| {
        Token {
            b: build.clone(),
            n: end,
            h: value_tag(value),
        }
        .encode()
    });
    Ok(Answer {
        rows,
        ranges: manifest.ranges,
        candidate_ranges: candidates.len(),
        storage_requests: requests.count(),
        index: serde_json::json!({
            "property": manifest.property,
            "sourceTable": manifest.source_table,
            "rows": manifest.rows,
            "builtAt": crate::app::tracking::format_time(manifest.built_at),
            "build": build,
        }),
        continuation_token,
    })
}

/// A small JSON blob, `None` if it does not exist.
async fn read_json<J: serde::de::DeserializeOwned, B: BlobStore>(
    blobs: &B,
    container: &str,
    name: &str,
    max: u64,
) -> Result<Option<J>, ApiError> {
    let bytes = match blobs.download(container, name, max).await {
        Ok(found) => found.bytes,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| ApiError::Conflict(format!("{container}/{name} is not an index file: {e}")))
}

/// The candidate ranges of every segment, in key order, those that overlap merged.
async fn candidates<B: BlobStore>(
    blobs: &B,
    container: &str,
    layout: &IndexLayout,
    manifest: &IndexManifest,
    value: &IndexValue,
    cache: &Directories,
) -> Result<Vec<KeyBounds>, ApiError> {
    let per_segment: Vec<Vec<KeyBounds>> = stream::iter(manifest.segments.clone())
        .map(|segment| {
            let name = layout.blob(&segment.name);
            async move {
                let directory = directory(blobs, container, &name, cache).await?;
                let [(o1, l1), (o2, l2)] = directory.bucket_spans(value);
                let row1 = blobs.download_range(container, &name, o1, l1).await?;
                let row2 = match (o2, l2) == (o1, l1) {
                    true => row1.clone(),
                    false => blobs.download_range(container, &name, o2, l2).await?,
                };
                let found = directory
                    .candidates(value, &row1, &row2)
                    .map_err(|e| unreadable(container, &name, e))?;
                Ok::<_, ApiError>(
                    found
                        .into_iter()
                        .map(|i| directory.ranges()[i].keys.clone())
                        .collect(),
                )
            }
        })
        .buffered(SEGMENTS_IN_FLIGHT)
        .try_collect()
        .await?;
    Ok(merge(per_segment.into_iter().flatten().collect()))
}

fn unreadable(container: &str, name: &str, e: impl std::fmt::Display) -> ApiError {
    ApiError::Conflict(format!(
        "index segment {container}/{name} is unreadable: {e}"
    ))
}

/// A segment's directory: from the process's cache, or read (one ranged read, two for a
/// directory longer than [`DIRECTORY_FIRST_READ`]).
async fn directory<B: BlobStore>(
    blobs: &B,
    container: &str,
    name: &str,
    cache: &Directories,
) -> Result<Arc<SegmentDirectory>, ApiError> {
    let key = format!("{container}/{name}");
    if let Some(found) = cache.0.lock().unwrap().get(&key) {
        return Ok(found.clone());
    }
    let mut bytes = blobs
        .download_range(container, name, 0, DIRECTORY_FIRST_READ)
        .await
        .map_err(|e| missing_segment(container, name, e))?;
    if bytes.len() < DIRECTORY_FIXED_LEN {
        return Err(unreadable(
            container,
            name,
            "it is shorter than a directory",
        ));
    }
    let len =
        SegmentDirectory::directory_len(&bytes).map_err(|e| unreadable(container, name, e))?;
    if len > bytes.len() {
        bytes = blobs.download_range(container, name, 0, len as u64).await?;
    }
    let parsed =
        Arc::new(SegmentDirectory::parse(&bytes).map_err(|e| unreadable(container, name, e))?);
    let mut entries = cache.0.lock().unwrap();
    if entries.len() >= MAX_CACHED_DIRECTORIES {
        entries.clear();
    }
    entries.insert(key, parsed.clone());
    Ok(parsed)
}

fn missing_segment(container: &str, name: &str, e: StorageError) -> ApiError {
    match e.is_not_found() {
        true => ApiError::Conflict(format!("index segment {container}/{name} is missing")),
        false => e.into(),
    }
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
/// order, each as the service's JSON text.
async fn query_ranges<S: Stores>(
    state: &AppState<S>,
    manifest: &IndexManifest,
    value: &IndexValue,
    ranges: &[KeyBounds],
    requests: &Arc<Meter>,
) -> Result<Vec<Box<RawValue>>, ApiError> {
    let source = state
        .counted_table(&manifest.source_connection, requests)
        .map_err(|e| ApiError::Conflict(format!("the index's source: {e}")))?;
    let literal = value
        .to_odata()
        .map_err(|e| ApiError::field("value", e.to_string()))?;
    let condition = Expr::Compare {
        property: manifest.property.clone(),
        op: Cmp::Eq,
        literal,
    };
    let wanted = value.canonical_bytes();
    let pages: Vec<Vec<Box<RawValue>>> = stream::iter(ranges.to_vec())
        .map(|range| {
            let filter = Filter::and(vec![
                range_filter(
                    &(range.first_partition_key.clone(), range.first_row_key.clone()),
                    &(range.last_partition_key.clone(), range.last_row_key.clone()),
                ),
                Filter::Where(condition.clone()),
            ]);
            let (source, table) = (&source, &manifest.source_table);
            let (property, wanted) = (&manifest.property, &wanted);
            async move {
                let mut query = Query {
                    filter: Some(filter),
                    ..Query::default()
                };
                let mut rows = Vec::new();
                for _ in 0..MAX_QUERIES_PER_RANGE {
                    let page = source.query_page(table, &query).await?;
                    for entity in page.entities.iter().filter(|e| holds(e, property, wanted)) {
                        rows.push(serde_json::value::to_raw_value(&entity.wire()).expect("an entity serializes"));
                    }
                    match page.continuation {
                        Some(next) => query.continuation = Some(next),
                        None => return Ok::<_, ApiError>(rows),
                    }
                }
                Err(ApiError::Conflict(format!(
                    "a candidate range holds more than {MAX_QUERIES_PER_RANGE} pages of matches; the table grew since the index was built: rebuild it"
                )))
            }
        })
        .buffered(QUERIES_IN_FLIGHT)
        .try_collect()
        .await?;
    Ok(pages.into_iter().flatten().collect())
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
