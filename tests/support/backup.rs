//! Export and import checks for the fault suite (`tests/scans/backups/faults.rs`), independent of
//! tablescan's export format code: the manifest is read as generic JSON, every part is hashed
//! here (`sha2`) and inflated here (`flate2`) and its lines parsed as generic JSON; restored
//! tables are read with the raw REST client ([`super::raw`]). Blobs are read and listed with
//! tablescan's `AzureBlobStore` straight on Azurite (bytes and names only).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tablescan::storage::azure_blob::AzureBlobStore;
use tablescan::storage::blob::{BlobRequestCounters, BlobStore, BlobWrite, MAX_LIST_RESULTS};

use super::e2e::TestApp;
use super::faults::{unfinished_bookkeeping, wait_queues_settle, wait_recorded_end, Verdict};
use super::raw::{self, RawClient, RawEntity};
use super::unique_name;

/// Generous bound for one small faulted scan on a loaded 2-core machine.
pub const SCAN_TIMEOUT: Duration = Duration::from_secs(240);
/// Larger than any blob these tests write.
pub const MAX_BLOB_BYTES: u64 = 64 * 1024 * 1024;

/// The test's blob client: straight on Azurite, for bytes and listings only.
pub fn blobs() -> AzureBlobStore {
    super::account()
        .blob_store(Arc::new(BlobRequestCounters::new()))
        .expect("Azurite has a blob endpoint")
}

/// Uploads `bytes` as the blob `name` in `container`, unconditionally, as `content_type`.
pub async fn put(
    store: &AzureBlobStore,
    container: &str,
    name: &str,
    bytes: impl Into<Bytes>,
    content_type: &str,
) {
    let write = BlobWrite::new(content_type);
    store
        .upload(container, name, bytes.into(), &write)
        .await
        .unwrap();
}

/// The blob's bytes, or `None` if there is no such blob.
pub async fn download(blobs: &AzureBlobStore, container: &str, name: &str) -> Option<Bytes> {
    match blobs.download(container, name, MAX_BLOB_BYTES).await {
        Ok(d) => Some(d.bytes),
        Err(e) if e.is_not_found() => None,
        Err(e) => panic!("download {container}/{name}: {e}"),
    }
}

/// Every blob whose name starts with `prefix`, with its size.
pub async fn list_all(
    blobs: &AzureBlobStore,
    container: &str,
    prefix: &str,
) -> BTreeMap<String, u64> {
    let mut all = BTreeMap::new();
    let mut marker: Option<String> = None;
    loop {
        let page = blobs
            .list(container, prefix, MAX_LIST_RESULTS, marker.as_deref())
            .await
            .unwrap_or_else(|e| panic!("list {container}/{prefix}: {e}"));
        all.extend(page.blobs.into_iter().map(|b| (b.name, b.size)));
        match page.next_marker {
            Some(next) => marker = Some(next),
            None => return all,
        }
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A part's lines as generic JSON: inflated here (every gzip member), split on `\n` only.
pub fn part_lines(bytes: &[u8]) -> Result<Vec<Value>, String> {
    let mut text = Vec::new();
    flate2::read::MultiGzDecoder::new(bytes)
        .read_to_end(&mut text)
        .map_err(|e| format!("not gzip: {e}"))?;
    let mut lines: Vec<&[u8]> = text.split(|b| *b == b'\n').collect();
    if lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    lines
        .iter()
        .enumerate()
        .map(|(i, l)| serde_json::from_slice(l).map_err(|e| format!("line {}: {e}", i + 1)))
        .collect()
}

/// A line's keys, as the JSON strings decode.
pub fn line_key(line: &Value) -> Option<(String, String)> {
    Some((
        line["PartitionKey"].as_str()?.to_string(),
        line["RowKey"].as_str()?.to_string(),
    ))
}

/// Where a test's export goes.
pub struct Target {
    pub container: String,
    pub prefix: String,
}

impl Target {
    pub fn new(label: &str) -> Target {
        Target {
            container: unique_name("backup"),
            prefix: format!("faults/{label}"),
        }
    }

    pub fn blob(&self, relative: &str) -> String {
        format!("{}/{relative}", self.prefix)
    }
}

/// Starts a scan; no retry (the API must answer 202 once even when storage faults hit it).
pub async fn start(app: &TestApp, body: Value) -> String {
    let (status, reply, _) = app.post_scan(&body).await;
    assert_eq!(status, 202, "POST /api/scans {body}: {reply}");
    reply["id"].as_str().unwrap().to_string()
}

pub async fn start_export(app: &TestApp, source: &str, take: u32, target: &Target) -> String {
    start(
        app,
        json!({"driver": "export", "sourceTable": source, "takeCount": take,
            "destinationContainer": target.container, "destinationPrefix": target.prefix}),
    )
    .await
}

pub async fn start_import(app: &TestApp, target: &Target, destination: &str) -> String {
    start(
        app,
        json!({"driver": "import", "sourceContainer": target.container,
            "sourcePrefix": target.prefix, "destinationTable": destination}),
    )
    .await
}

/// Status fields that must hold these values once a scan has ended.
pub fn check_status(v: &mut Verdict, status: &Value, expected: &[(&str, i64)]) {
    if status["state"] != "completed" {
        v.problems.push(format!("status says {}", status["state"]));
    }
    for (field, want) in expected {
        if status[*field].as_i64() != Some(*want) {
            v.mismatches += 1;
            v.problems
                .push(format!("{field} is {} (expected {want})", status[*field]));
        }
    }
}

/// The scan ended `completed`, with no work left in bookkeeping or queues.
pub async fn check_ended_clean(app: &TestApp, id: &str, v: &mut Verdict) -> Value {
    let state = wait_recorded_end(app, id, SCAN_TIMEOUT).await;
    if state != "completed" {
        let (_, status) = app.get(&format!("/api/scans/{id}")).await;
        v.problems
            .push(format!("scan {id} ended {state}: {}", status["error"]));
    }
    let (unfinished, pending) = unfinished_bookkeeping(app, id).await;
    if !unfinished.is_empty() || pending != 0 {
        v.problems.push(format!(
            "bookkeeping not empty: {pending} pending by counters, unfinished rows {unfinished:?}"
        ));
    }
    let left = wait_queues_settle(app, 0, Duration::from_secs(90)).await;
    if left != 0 {
        v.problems
            .push(format!("{left} message(s) left in the queues"));
    }
    let (code, status) = app.get(&format!("/api/scans/{id}")).await;
    assert_eq!(code, 200, "{status}");
    status
}

/// Every check of an export: completed; the manifest (generic JSON) lists parts whose `rows` sum
/// to the source's rows and to `rowsWritten`; every part exists with the listed size and
/// SHA-256; the parts' lines hold every source key exactly once and nothing else; the parts
/// folder holds no blob the manifest leaves out. Returns the verdict (`rows_copied`: distinct
/// source keys found, `lost`: source keys found in no part) and the manifest.
pub async fn verify_export(
    app: &TestApp,
    id: &str,
    source_rows: &[RawEntity],
    target: &Target,
) -> (Verdict, Option<Value>) {
    let mut v = Verdict::default();
    let blobs = blobs();
    let manifest_blob = target.blob("manifest.json");
    // The manifest as the scan ended, and again once late duplicates have drained.
    wait_recorded_end(app, id, SCAN_TIMEOUT).await;
    let at_end = download(&blobs, &target.container, &manifest_blob).await;
    let status = check_ended_clean(app, id, &mut v).await;
    let n = source_rows.len() as i64;
    check_status(
        &mut v,
        &status,
        &[
            ("rowsScanned", n),
            ("rowsWritten", n),
            ("failedWorkItems", 0),
            ("pendingWorkItems", 0),
        ],
    );
    let Some(bytes) = download(&blobs, &target.container, &manifest_blob).await else {
        v.lost = source_rows.len();
        v.problems.push(format!("no manifest; status {status}"));
        return (v, None);
    };
    let manifest: Value = serde_json::from_slice(&bytes).expect("the manifest is JSON");
    if let Some(problem) = written_once(&status, &manifest, at_end.as_deref(), &bytes) {
        v.problems.push(problem);
    }
    let (names, keys) = check_parts(&mut v, &blobs, target, id, &manifest).await;
    for (field, want) in [
        ("rows", n),
        ("rowsWritten", status["rowsWritten"].as_i64().unwrap_or(-1)),
    ] {
        if manifest["rows"].as_i64() != Some(want) {
            v.mismatches += 1;
            v.problems.push(format!(
                "manifest rows {} but {field} is {want}",
                manifest["rows"]
            ));
        }
    }
    if manifest["format"] != "tablescan-export/1" || manifest["scanId"] != id {
        v.problems.push(format!(
            "manifest format/scanId: {} {}",
            manifest["format"], manifest["scanId"]
        ));
    }
    check_keys(&mut v, source_rows, &keys);
    // Nothing under the scan's parts folder that the manifest leaves out.
    let listed = list_all(
        &blobs,
        &target.container,
        &target.blob(&format!("parts/{id}/")),
    )
    .await;
    let unlisted: Vec<&String> = listed.keys().filter(|b| !names.contains(*b)).collect();
    if !unlisted.is_empty() {
        v.problems.push(format!(
            "blobs under parts/{id}/ not in the manifest: {unlisted:?}"
        ));
    }
    let everything = list_all(&blobs, &target.container, &target.blob("")).await;
    eprintln!(
        "{id}: manifest {} rows in {} parts; {} blobs under the prefix, {} under parts/{id}/",
        manifest["rows"],
        names.len(),
        everything.len(),
        listed.len()
    );
    (v, Some(manifest))
}

/// The manifest is written before the scan is recorded `completed` and never after: the bytes
/// read when the scan ended are the bytes read once the queues drained, and its `completedAt`
/// is not later than the scan's.
pub fn written_once(
    status: &Value,
    manifest: &Value,
    at_end: Option<&[u8]>,
    now: &[u8],
) -> Option<String> {
    let time = |t: &Value| {
        t.as_str().and_then(|t| {
            time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()
        })
    };
    let (written, completed) = (time(&manifest["completedAt"]), time(&status["completedAt"]));
    if at_end != Some(now) {
        let before = at_end.map(|b| serde_json::from_slice::<Value>(b).ok());
        Some(format!(
            "the manifest was rewritten after the scan was recorded completed at {}: completedAt {} when the scan ended, {} once the queues drained",
            status["completedAt"],
            before.flatten().map_or(Value::Null, |m| m["completedAt"].clone()),
            manifest["completedAt"]
        ))
    } else if written.is_none() || completed.is_none() || written > completed {
        Some(format!(
            "the manifest's completedAt {} is after the scan's {}",
            manifest["completedAt"], status["completedAt"]
        ))
    } else {
        None
    }
}

/// Checks every part the manifest lists (name, size, SHA-256, rows) and returns the blob names
/// and how often each key appears across the parts.
pub async fn check_parts(
    v: &mut Verdict,
    blobs: &AzureBlobStore,
    target: &Target,
    id: &str,
    manifest: &Value,
) -> (BTreeSet<String>, BTreeMap<(String, String), usize>) {
    let parts = manifest["parts"].as_array().cloned().unwrap_or_default();
    let mut names = BTreeSet::new();
    let mut keys: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut sum = 0;
    for part in &parts {
        let name = part["name"].as_str().unwrap_or_default();
        let rows = part["rows"].as_u64().unwrap_or(0);
        sum += rows;
        if !name.starts_with(&format!("parts/{id}/")) || !names.insert(target.blob(name)) {
            v.problems
                .push(format!("part name {name:?} (repeated or misplaced)"));
        }
        let Some(bytes) = download(blobs, &target.container, &target.blob(name)).await else {
            v.problems.push(format!("part {name} is missing"));
            continue;
        };
        if part["bytes"].as_u64() != Some(bytes.len() as u64)
            || part["sha256"] != sha256_hex(&bytes)
        {
            v.mismatches += 1;
            v.problems.push(format!(
                "part {name}: {} bytes, SHA-256 {}; the manifest says {part}",
                bytes.len(),
                sha256_hex(&bytes)
            ));
        }
        match part_lines(&bytes) {
            Ok(lines) => {
                if lines.len() as u64 != rows {
                    v.mismatches += 1;
                    v.problems.push(format!(
                        "part {name} has {} lines, manifest {rows}",
                        lines.len()
                    ));
                }
                for line in &lines {
                    match line_key(line) {
                        Some(key) => *keys.entry(key).or_default() += 1,
                        None => v
                            .problems
                            .push(format!("part {name}: line without keys {line}")),
                    }
                }
            }
            Err(e) => v.problems.push(format!("part {name}: {e}")),
        }
    }
    let names_in_order: Vec<&str> = parts.iter().filter_map(|p| p["name"].as_str()).collect();
    if !names_in_order.windows(2).all(|w| w[0] < w[1]) {
        v.problems
            .push("manifest parts are not in name order".into());
    }
    if Some(sum) != manifest["rows"].as_u64() {
        v.mismatches += 1;
        v.problems.push(format!(
            "parts' rows sum to {sum}, manifest rows {}",
            manifest["rows"]
        ));
    }
    (names, keys)
}

/// Every source key exactly once across the parts, and no other key.
pub fn check_keys(
    v: &mut Verdict,
    source_rows: &[RawEntity],
    keys: &BTreeMap<(String, String), usize>,
) {
    let source: BTreeSet<(String, String)> = source_rows
        .iter()
        .map(|e| (e.partition_key(), e.row_key()))
        .collect();
    let lost: Vec<_> = source.iter().filter(|k| !keys.contains_key(*k)).collect();
    let twice: Vec<_> = keys.iter().filter(|(_, n)| **n > 1).collect();
    let foreign: Vec<_> = keys.keys().filter(|k| !source.contains(*k)).collect();
    v.lost += lost.len();
    v.rows_copied = source.len() - lost.len();
    v.mismatches += twice.len() + foreign.len();
    if !lost.is_empty() || !twice.is_empty() || !foreign.is_empty() {
        v.problems.push(format!(
            "keys in the parts: {} lost {:?}, {} more than once {:?}, {} not in the source {:?}",
            lost.len(),
            lost.iter().take(10).collect::<Vec<_>>(),
            twice.len(),
            twice.iter().take(10).collect::<Vec<_>>(),
            foreign.len(),
            foreign.iter().take(10).collect::<Vec<_>>()
        ));
    }
}

/// Every check of an import: completed; `rowsWritten` is the manifest's rows; the restored
/// table equals the source (raw texts).
pub async fn verify_import(
    app: &TestApp,
    id: &str,
    source_rows: &[RawEntity],
    destination: &str,
    manifest_rows: i64,
) -> Verdict {
    let mut v = Verdict::default();
    let status = check_ended_clean(app, id, &mut v).await;
    check_status(
        &mut v,
        &status,
        &[
            ("rowsWritten", manifest_rows),
            ("failedWorkItems", 0),
            ("pendingWorkItems", 0),
        ],
    );
    let restored = RawClient::azurite().rows(destination).await;
    let present: BTreeSet<(&str, &str)> = restored.iter().map(|e| e.key()).collect();
    v.lost = source_rows
        .iter()
        .filter(|e| !present.contains(&e.key()))
        .count();
    v.rows_copied = restored.len();
    let differences = raw::diff(source_rows, &restored);
    if !differences.is_empty() {
        v.mismatches += differences.len();
        v.problems.push(format!(
            "restored table differs from the source: {:?}",
            &differences[..differences.len().min(20)]
        ));
    }
    v
}
