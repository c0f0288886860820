//! The fault suite for backups (issue 14): export scans (table → Blob Storage) and import scans
//! (export → table) through the local Functions host and the real handler on Azurite while
//! handlers are SIGKILLed, every queue message is stored two or three times, and storage
//! (tables, queues and blobs, through `tablescan::proxy`) throttles, times out, delays and
//! resets connections. Then a part corrupted after its export must fail the import, naming it.
//!
//! The oracles share nothing with tablescan's export format code: the manifest is read as
//! generic JSON (`serde_json::Value`), every part's bytes are hashed here (`sha2`) and inflated
//! here (`flate2`), and each line is parsed as generic JSON. Blobs are read and listed with
//! tablescan's `AzureBlobStore` straight on Azurite (bytes and names only, never through the
//! proxy or the format's decoder). Restored tables are read with the raw REST client
//! (`support::raw`) and compared with the source text for text.
//!
//! One line per fault kind and scan (`faults: export-storage-faults: scans 1, faults …`), visible
//! with `cargo test --test faults_backup -- --nocapture`.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use support::e2e::TestApp;
use support::faults::{
    check_kills, kill_more_while_running, proxy, seeded_source, source_entities, storage_faults,
    unfinished_bookkeeping, wait_queues_settle, wait_recorded_end, Summary, Verdict,
};
use support::raw::{self, RawClient, RawEntity};
use support::unique_name;
use tablescan::proxy::{FaultPolicy, StorageProxy};
use tablescan::storage::azure_blob::AzureBlobStore;
use tablescan::storage::blob::{BlobRequestCounters, BlobStore, BlobWrite, MAX_LIST_RESULTS};
use tablescan::storage::counters::RequestKind;

/// Generous bound for one small faulted scan on a loaded 2-core machine.
const SCAN_TIMEOUT: Duration = Duration::from_secs(240);
/// Larger than any blob these tests write.
const MAX_BLOB_BYTES: u64 = 64 * 1024 * 1024;

/// The test's blob client: straight on Azurite, for bytes and listings only.
fn blobs() -> AzureBlobStore {
    support::account()
        .blob_store(Arc::new(BlobRequestCounters::new()))
        .expect("Azurite has a blob endpoint")
}

/// The blob's bytes, or `None` if there is no such blob.
async fn download(blobs: &AzureBlobStore, container: &str, name: &str) -> Option<Bytes> {
    match blobs.download(container, name, MAX_BLOB_BYTES).await {
        Ok(d) => Some(d.bytes),
        Err(e) if e.is_not_found() => None,
        Err(e) => panic!("download {container}/{name}: {e}"),
    }
}

/// Every blob whose name starts with `prefix`, with its size.
async fn list_all(blobs: &AzureBlobStore, container: &str, prefix: &str) -> BTreeMap<String, u64> {
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

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A part's lines as generic JSON: inflated here (every gzip member), split on `\n` only.
fn part_lines(bytes: &[u8]) -> Result<Vec<Value>, String> {
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
fn line_key(line: &Value) -> Option<(String, String)> {
    Some((
        line["PartitionKey"].as_str()?.to_string(),
        line["RowKey"].as_str()?.to_string(),
    ))
}

/// Where a test's export goes.
struct Target {
    container: String,
    prefix: String,
}

impl Target {
    fn new(label: &str) -> Target {
        Target {
            container: unique_name("backup"),
            prefix: format!("faults/{label}"),
        }
    }

    fn blob(&self, relative: &str) -> String {
        format!("{}/{relative}", self.prefix)
    }
}

/// Starts a scan; no retry (the API must answer 202 once even when storage faults hit it).
async fn start(app: &TestApp, body: Value) -> String {
    let (status, reply, _) = app.post_scan(&body).await;
    assert_eq!(status, 202, "POST /api/scans {body}: {reply}");
    reply["id"].as_str().unwrap().to_string()
}

async fn start_export(app: &TestApp, source: &str, take: u32, target: &Target) -> String {
    start(
        app,
        json!({"driver": "export", "sourceTable": source, "takeCount": take,
            "destinationContainer": target.container, "destinationPrefix": target.prefix}),
    )
    .await
}

async fn start_import(app: &TestApp, target: &Target, destination: &str) -> String {
    start(
        app,
        json!({"driver": "import", "sourceContainer": target.container,
            "sourcePrefix": target.prefix, "destinationTable": destination}),
    )
    .await
}

/// Status fields that must hold these values once a scan has ended.
fn check_status(v: &mut Verdict, status: &Value, expected: &[(&str, i64)]) {
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
async fn check_ended_clean(app: &TestApp, id: &str, v: &mut Verdict) -> Value {
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
async fn verify_export(
    app: &TestApp,
    id: &str,
    source_rows: &[RawEntity],
    target: &Target,
) -> (Verdict, Option<Value>) {
    let mut v = Verdict::default();
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
    let blobs = blobs();
    let Some(bytes) = download(&blobs, &target.container, &target.blob("manifest.json")).await
    else {
        v.lost = source_rows.len();
        v.problems.push(format!("no manifest; status {status}"));
        return (v, None);
    };
    let manifest: Value = serde_json::from_slice(&bytes).expect("the manifest is JSON");
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

/// Checks every part the manifest lists (name, size, SHA-256, rows) and returns the blob names
/// and how often each key appears across the parts.
async fn check_parts(
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
fn check_keys(
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
async fn verify_import(
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

/// The faults a backup run is under.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Handlers SIGKILLed during the export and again during the import (3 instances).
    Crash,
    /// Every queue put stored two or three times, two instances.
    Duplicates,
    /// Throttling, timeouts, resets and delays on every kind of request, blobs included.
    Storage,
}

impl Fault {
    fn label(self) -> &'static str {
        match self {
            Fault::Crash => "handler-crash",
            Fault::Duplicates => "duplicate-delivery",
            Fault::Storage => "storage-faults",
        }
    }

    async fn proxy(self) -> Option<StorageProxy> {
        match self {
            Fault::Crash => None,
            Fault::Duplicates => Some(
                proxy(
                    FaultPolicy {
                        duplicate_puts: 1.0,
                        extra_copies: 2,
                        kinds: vec![RequestKind::QueuePut],
                        ..FaultPolicy::default()
                    },
                    23,
                )
                .await,
            ),
            Fault::Storage => Some(proxy(storage_faults(0.04), 29).await),
        }
    }
}

/// Faults so far: kills, extra queue messages, or injected storage faults (blob ones apart).
fn faults_so_far(fault: Fault, kills: &[usize], proxy: Option<&StorageProxy>) -> (u64, u64) {
    let blob = |p: &StorageProxy| {
        p.faults_by_kind()
            .iter()
            .filter(|(k, _)| k.starts_with("blob_"))
            .map(|(_, n)| n)
            .sum::<u64>()
    };
    match (fault, proxy) {
        (Fault::Duplicates, Some(p)) => (p.duplicates_put(), 0),
        (Fault::Storage, Some(p)) => (p.faults_injected(), blob(p)),
        _ => (kills.iter().sum::<usize>() as u64, 0),
    }
}

/// Exports a seeded table under `fault`, verifies the export, restores it into a new table
/// under the same fault, and verifies the restore.
async fn backup_fault_run(fault: Fault, rows: u64, take: u32) {
    let instances = if matches!(fault, Fault::Crash) { 3 } else { 2 };
    let proxy = fault.proxy().await;
    let connection = proxy.as_ref().map(|p| p.connection_string());
    let settings: Vec<(&str, &str)> = connection
        .iter()
        .map(|c| ("AzureWebJobsStorage", c.as_str()))
        .collect();
    let app = TestApp::start(instances, &settings).await;
    let (source, source_rows) = seeded_source(&app, source_entities(rows, 91)).await;
    let target = Target::new(fault.label());
    let mut kills = vec![0usize; instances];

    let export = start_export(&app, &source, take, &target).await;
    if matches!(fault, Fault::Crash) {
        // One kill per instance here, one more in the import: the host gives up after 3.
        kill_more_while_running(&app, &export, &mut kills, 1).await;
    }
    let (export_verdict, manifest) = verify_export(&app, &export, &source_rows, &target).await;
    let (export_faults, export_blob_faults) = faults_so_far(fault, &kills, proxy.as_ref());
    let mut summary = Summary::new(format!("export-{}", fault.label()));
    summary.faults = export_faults;
    summary.add(&export_verdict);
    summary.report(&[&export_verdict]);
    let manifest_rows = manifest.as_ref().and_then(|m| m["rows"].as_i64()).unwrap();

    let destination = unique_name("Restored");
    let import = start_import(&app, &target, &destination).await;
    if matches!(fault, Fault::Crash) {
        kill_more_while_running(&app, &import, &mut kills, 2).await;
    }
    let import_verdict =
        verify_import(&app, &import, &source_rows, &destination, manifest_rows).await;
    let (all_faults, all_blob_faults) = faults_so_far(fault, &kills, proxy.as_ref());
    let mut summary = Summary::new(format!("import-{}", fault.label()));
    summary.faults = all_faults - export_faults;
    summary.add(&import_verdict);
    if let Some(p) = &proxy {
        let counts = p.counts();
        let of = |prefix: &str| -> u64 {
            counts
                .iter()
                .filter(|((k, _), _)| k.starts_with(prefix))
                .map(|(_, n)| n)
                .sum()
        };
        eprintln!(
            "{}: {} requests through the proxy, {} of them blob requests; blob faults {export_blob_faults} in the export, {} in the import; faults by kind {:?}",
            fault.label(),
            of(""),
            of("blob_"),
            all_blob_faults - export_blob_faults,
            p.faults_by_kind()
        );
    }
    summary.report(&[&import_verdict]);
    match fault {
        Fault::Crash => {
            eprintln!("kills per instance after the export and the import: {kills:?}");
            assert!(
                export_faults > 0 && all_faults > export_faults,
                "the export or the import ended before a kill"
            );
            check_kills(&app, &kills).await;
        }
        Fault::Storage => {
            assert!(
                export_blob_faults > 0 && all_blob_faults > export_blob_faults,
                "no blob fault in the export or none in the import"
            );
        }
        Fault::Duplicates => assert!(export_faults > 0 && all_faults > export_faults),
    }
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_and_import_with_handler_crashes() {
    backup_fault_run(Fault::Crash, 400, 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_and_import_with_duplicate_delivery() {
    backup_fault_run(Fault::Duplicates, 300, 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_and_import_with_storage_faults() {
    backup_fault_run(Fault::Storage, 300, 5).await;
}

/// Imports the export after its part `name` was overwritten with `corrupted`; the import must
/// fail naming the part, and write none of `part_keys` (the part's rows) nor `injected`.
async fn import_corrupted(
    app: &TestApp,
    target: &Target,
    name: &str,
    corrupted: Bytes,
    part_keys: &[(String, String)],
    injected: Option<&(String, String)>,
) -> String {
    blobs()
        .upload(
            &target.container,
            &target.blob(name),
            corrupted,
            &BlobWrite::new("application/gzip"),
        )
        .await
        .unwrap();
    let destination = unique_name("Restored");
    let import = start_import(app, target, &destination).await;
    let status = app.wait_for_end(&import, SCAN_TIMEOUT).await;
    let error = status["error"].as_str().unwrap_or_default().to_string();
    assert_eq!(status["state"], "failed", "{status}");
    assert!(
        error.contains(name),
        "the error names the part {name}: {status}"
    );
    assert!(status["failedWorkItems"].as_i64() >= Some(1), "{status}");
    let restored = RawClient::azurite().rows(&destination).await;
    let written: BTreeSet<(String, String)> = restored
        .iter()
        .map(|e| (e.partition_key(), e.row_key()))
        .collect();
    let from_part: Vec<&(String, String)> =
        part_keys.iter().filter(|k| written.contains(*k)).collect();
    assert!(
        from_part.is_empty(),
        "rows of the corrupted part were written: {from_part:?}"
    );
    assert!(
        !injected.is_some_and(|k| written.contains(k)),
        "{injected:?} written"
    );
    eprintln!(
        "corrupted part {name} ({} rows): import {} with {error:?}; {} rows of other parts restored",
        part_keys.len(),
        status["state"],
        restored.len()
    );
    error
}

/// A part overwritten after its export fails the import naming the part, and none of its rows
/// is written: the same number of bytes with one flipped (the SHA-256 check), then a valid gzip
/// of its own lines with one value changed and a row added (bigger than the manifest says).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_part_fails_the_import_naming_it() {
    let app = TestApp::start(2, &[]).await;
    let (source, source_rows) = seeded_source(&app, source_entities(150, 97)).await;
    let target = Target::new("corrupted");
    let export = start_export(&app, &source, 10, &target).await;
    let (verdict, manifest) = verify_export(&app, &export, &source_rows, &target).await;
    assert!(verdict.problems.is_empty(), "{:?}", verdict.problems);
    let manifest = manifest.unwrap();
    let parts = manifest["parts"].as_array().unwrap();
    assert!(parts.len() >= 3, "{manifest}");
    // The part with the most rows, so that "none of its rows" means something.
    let part = parts.iter().max_by_key(|p| p["rows"].as_u64()).unwrap();
    let name = part["name"].as_str().unwrap().to_string();
    let original = download(&blobs(), &target.container, &target.blob(&name))
        .await
        .unwrap();
    let mut lines = part_lines(&original).unwrap();
    let part_keys: Vec<(String, String)> = lines.iter().filter_map(line_key).collect();

    let mut flipped = original.to_vec();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x01;
    let error = import_corrupted(&app, &target, &name, flipped.into(), &part_keys, None).await;
    assert!(error.contains("SHA-256"), "{error}");

    lines[0]["Corrupted"] = json!("yes");
    let injected = ("zz-injected".to_string(), "1".to_string());
    lines.push(json!({"PartitionKey": injected.0, "RowKey": injected.1, "Note": "not exported"}));
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    for line in &lines {
        writeln!(gz, "{line}").unwrap();
    }
    let rewritten = Bytes::from(gz.finish().unwrap());
    assert_ne!(rewritten, original);
    import_corrupted(&app, &target, &name, rewritten, &part_keys, Some(&injected)).await;
    app.shutdown().await;
}
