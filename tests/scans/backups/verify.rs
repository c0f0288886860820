//! Imports verify every part before any row is written (issue 28), on Azurite through the local
//! Functions host and the real handler. The exports here are written by the test itself (its
//! own gzip, JSON text and SHA-256, never tablescan's encoder), and what the destination holds
//! is read with the test's own REST client (`support::raw`). The memory bound is counted in the
//! decoder's unit tests (`src/app/drivers/import_tests.rs`, bytes held while inflating) and
//! measured here on the handler process (its peak RSS, `VmHWM` in /proc/<pid>/status) by two
//! ignored measurements (docs/development.md, "Measurements").

use crate::support;

use std::io::Write;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::backup::{blobs, put, sha256_hex};
use support::e2e::TestApp;
use support::raw::RawClient;
use support::unique_name;
use tablescan::storage::azure_blob::AzureBlobStore;
use tablescan::storage::blob::BlobStore;

const TIMEOUT: Duration = Duration::from_secs(240);

/// Gzip of `text` (the test's own encoder, flate2 directly).
fn gzip(text: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(text).unwrap();
    gz.finish().unwrap()
}

/// Good rows `from..to` of partition `pk` as JSON lines, with typed values.
fn good_lines(pk: &str, from: usize, to: usize) -> String {
    let mut text = String::new();
    for i in from..to {
        text.push_str(&format!(
            r#"{{"PartitionKey":"{pk}","RowKey":"r{i:05}","N":{i},"Big":"{}","Big@odata.type":"Edm.Int64","When":"2020-01-01T00:00:00.1234567Z","When@odata.type":"Edm.DateTime","Id":"c56a4180-65aa-42ec-a945-5fd21dec0538","Id@odata.type":"Edm.Guid","Nan":"NaN","Nan@odata.type":"Edm.Double","Bin":"AAEC","Bin@odata.type":"Edm.Binary"}}"#,
            i as i64 * 1_000_000_007
        ));
        text.push('\n');
    }
    text
}

/// Uploads parts (name, compressed bytes, rows as listed) and their manifest under `prefix`.
async fn upload_export(
    store: &AzureBlobStore,
    container: &str,
    prefix: &str,
    parts: &[(&str, Vec<u8>, u64)],
) {
    store.create_container(container).await.unwrap();
    let mut listed = Vec::new();
    for (name, bytes, rows) in parts {
        let relative = format!("parts/s1/{name}.jsonl.gz");
        listed.push(json!({"name": relative, "rows": rows, "bytes": bytes.len(),
            "sha256": sha256_hex(bytes)}));
        let blob = format!("{prefix}/{relative}");
        put(store, container, &blob, bytes.clone(), "application/gzip").await;
    }
    let rows: u64 = parts.iter().map(|p| p.2).sum();
    let manifest = json!({"format": "tablescan-export/1", "sourceTable": "Source", "scanId": "s1",
        "rows": rows, "parts": listed, "startedAt": "2026-01-01T00:00:00Z",
        "completedAt": "2026-01-01T00:01:00Z"});
    let blob = format!("{prefix}/manifest.json");
    put(
        store,
        container,
        &blob,
        manifest.to_string(),
        "application/json",
    )
    .await;
}

/// Imports `container/prefix` into a new table; the final status and the table's name.
async fn import(app: &TestApp, container: &str, prefix: &str) -> (Value, String) {
    let table = unique_name("Restored");
    let body = json!({"driver": "import", "sourceContainer": container, "sourcePrefix": prefix,
        "destinationTable": table});
    let (code, reply, _) = app.post_scan(&body).await;
    assert_eq!(code, 202, "{reply}");
    let status = app
        .wait_for_end(reply["id"].as_str().unwrap(), TIMEOUT)
        .await;
    (status, table)
}

/// The app, the blob store and the test's raw table client on Azurite, and a new container name
/// starting with `prefix`.
async fn started(prefix: &str) -> (TestApp, AzureBlobStore, RawClient, String) {
    let app = TestApp::start(1, &[]).await;
    (app, blobs(), RawClient::azurite(), unique_name(prefix))
}

/// Two parts: 50 good rows, then 1,200 good rows and a row with 253 properties. Before: the
/// import failed with 1,250 rows written (`rowsWritten: 50`). Now nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_verifies_every_part_before_writing_any_row() {
    let (app, store, client, container) = started("verify").await;
    let mut second = good_lines("b", 0, 1200);
    let wide: Vec<String> = (0..253).map(|i| format!(r#""P{i}":{i}"#)).collect();
    second.push_str(&format!(
        r#"{{"PartitionKey":"b","RowKey":"wide",{}}}"#,
        wide.join(",")
    ));
    second.push('\n');
    let parts = [
        ("a", gzip(good_lines("a", 0, 50).as_bytes()), 50),
        ("b", gzip(second.as_bytes()), 1201),
    ];
    upload_export(&store, &container, "bad", &parts).await;
    let (status, table) = import(&app, &container, "bad").await;
    assert_eq!(status["state"], "failed", "{status}");
    for expected in [
        "parts/s1/b.jsonl.gz",
        "line 1201",
        "\"wide\"",
        "253 properties",
    ] {
        let error = status["error"].as_str().unwrap_or_default();
        assert!(error.contains(expected), "{expected:?} in {status}");
    }
    assert_eq!(status["rowsWritten"].as_i64(), Some(0), "{status}");
    assert_eq!(
        client.rows(&table).await.len(),
        0,
        "rows written before the failure"
    );

    app.shutdown().await;
}

/// The same export without the bad row restores exactly, typed values and all, and prints what
/// the import cost (the verification phase adds one item per part: a blob read and its
/// bookkeeping, no table write).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_good_import_restores_typed_values_and_prints_its_requests() {
    let (app, store, client, container) = started("verify").await;
    let parts = [
        ("a", gzip(good_lines("a", 0, 50).as_bytes()), 50),
        ("b", gzip(good_lines("b", 0, 1200).as_bytes()), 1200),
    ];
    upload_export(&store, &container, "good", &parts).await;
    let (status, table) = import(&app, &container, "good").await;
    assert_eq!(
        (status["state"].as_str(), status["rowsWritten"].as_i64()),
        (Some("completed"), Some(1250)),
        "{status}"
    );
    println!(
        "figures: good import of 1,250 rows in 2 parts: {} storage requests, {} messages",
        status["storageRequests"], status["messagesProcessed"]
    );
    let rows = client.rows(&table).await;
    assert_eq!(rows.len(), 1250);
    let row = rows
        .iter()
        .find(|r| r.key() == ("\"b\"", "\"r00007\""))
        .expect("row (b, r00007) restored");
    assert_eq!(row.text("Big"), Some("\"7000000049\""));
    assert_eq!(row.annotation("Big").as_deref(), Some("Edm.Int64"));
    assert_eq!(row.annotation("Nan").as_deref(), Some("Edm.Double"));
    app.shutdown().await;
}

/// A value that is no literal of its type, or a name given twice, fails the import naming the
/// part and the line, with nothing written (Azurite would store such values as they are).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_of_the_wrong_type_and_names_given_twice_are_refused_naming_the_line() {
    let (app, store, client, container) = started("literals").await;
    let cases = [
        (
            "int64",
            r#""V":"abc","V@odata.type":"Edm.Int64""#,
            "not a valid Edm.Int64",
        ),
        (
            "datetime",
            r#""V":"yesterday","V@odata.type":"Edm.DateTime""#,
            "not a valid Edm.DateTime",
        ),
        (
            "guid",
            r#""V":"nope","V@odata.type":"Edm.Guid""#,
            "not a valid Edm.Guid",
        ),
        (
            "twice",
            r#""PartitionKey":"other","V":1"#,
            "\"PartitionKey\" is given twice",
        ),
    ];
    for (prefix, bad, _) in &cases {
        let mut text = good_lines("p", 0, 3);
        text.push_str(&format!(r#"{{"PartitionKey":"p","RowKey":"bad",{bad}}}"#));
        text.push('\n');
        upload_export(
            &store,
            &container,
            prefix,
            &[("x", gzip(text.as_bytes()), 4)],
        )
        .await;
    }
    let imports = cases
        .iter()
        .map(|(prefix, _, _)| import(&app, &container, prefix));
    let ended = futures::future::join_all(imports).await;
    for ((prefix, _, expected), (status, table)) in cases.iter().zip(ended) {
        assert_eq!(status["state"], "failed", "{prefix}: {status}");
        let error = status["error"].as_str().unwrap_or_default();
        for want in [*expected, "line 4", "parts/s1/x.jsonl.gz"] {
            assert!(error.contains(want), "{prefix}: {want:?} in {status}");
        }
        assert_eq!(client.rows(&table).await.len(), 0, "{prefix}: rows written");
    }
    app.shutdown().await;
}

/// The handler's pid and its peak RSS (KiB) once it has answered the API: one refused request
/// first, so the baseline is a handler that has served.
async fn handler_baseline(app: &TestApp, container: &str) -> (u32, u64) {
    let (code, other, _) = app
        .post_scan(&json!({"driver": "import", "sourceContainer": container,
            "sourcePrefix": "nothing-here", "destinationTable": unique_name("Other")}))
        .await;
    assert_eq!(code, 400, "{other}");
    let pid = app.host().handler_pids()[0].expect("the handler runs");
    (pid, peak_rss_kib(pid))
}

/// The handler's peak resident set (`VmHWM`), in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A crafted part under `container/bomb`: gzip that inflates past the 256 MiB bound (300 MiB of
/// 1 KiB lines, as copies of one compressed 1 MiB member: an export's reader takes concatenated
/// members as one stream), listed with its true hash and `rows: 10^9`. Its compressed size.
async fn upload_bomb(store: &AzureBlobStore, container: &str) -> usize {
    let line = format!(
        r#"{{"PartitionKey":"p","RowKey":"r","S":"{}"}}"#,
        "x".repeat(1000)
    ) + "\n";
    let block = line.repeat(1024);
    let member = gzip(block.as_bytes());
    let bytes = member.repeat(300 * 1024 * 1024 / block.len());
    let size = bytes.len();
    upload_export(store, container, "bomb", &[("x", bytes, 1_000_000_000)]).await;
    size
}

/// Starts the import of `container/bomb`; its scan id.
async fn start_bomb_import(app: &TestApp, container: &str) -> String {
    let body = json!({"driver": "import", "sourceContainer": container, "sourcePrefix": "bomb",
        "destinationTable": unique_name("Bombed")});
    let (code, reply, _) = app.post_scan(&body).await;
    assert_eq!(code, 202, "{reply}");
    reply["id"].as_str().unwrap().to_string()
}

/// The import of the crafted part failed naming it and the bound.
fn assert_failed_at_the_bound(status: &Value) {
    assert_eq!(status["state"], "failed", "{status}");
    let error = status["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("parts/s1/x.jsonl.gz") && error.contains("bound"),
        "{status}"
    );
}

/// The keys of the work rows that a last delivery marked before running and that are not
/// finished yet: the items running now (every delivery is the last with `maxDequeueCount` 1).
async fn running_items(client: &RawClient, work_table: &str) -> Vec<(String, String)> {
    let rows = client.rows(work_table).await;
    rows.iter()
        .filter(|r| {
            r.text("State") == Some("\"pending\"") && r.text("LastDelivery") == Some("true")
        })
        .map(|r| (r.partition_key(), r.row_key()))
        .collect()
}

/// The crafted part's import fails naming the part and the bound, and the API answers status
/// reads while the part is being inflated (decoding runs on a blocking thread; the handler's
/// runtime has one thread, so inflating on it would hold every read until the item ends). The
/// event checked, not a latency: a status read sent after a verification item's row was marked
/// by its delivery (`maxDequeueCount` 1: every delivery marks its row before it runs) and
/// answered while that row is still unfinished, several times within one item's run. Memory is
/// counted in the decoder's unit tests (`import_tests.rs`); RSS and latency are measured below.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_that_inflates_past_the_bound_fails_naming_it_and_status_reads_answer_meanwhile() {
    let connection = support::azurite().connection_string();
    let app = TestApp::start_tuned(1, &connection, (1, "00:00:00", "00:05:00"), &[]).await;
    let (store, client, container) = (blobs(), RawClient::azurite(), unique_name("bomb"));
    upload_bomb(&store, &container).await;
    let id = start_bomb_import(&app, &container).await;
    // Reads answered within one item's run, by item; the most in any one run.
    let mut answered: std::collections::BTreeMap<(String, String), u32> = Default::default();
    let deadline = Instant::now() + TIMEOUT;
    let last = loop {
        let before = running_items(&client, &app.names.work_table).await;
        let (_, status) = app.get(&format!("/api/scans/{id}")).await;
        let after = running_items(&client, &app.names.work_table).await;
        for item in before.iter().filter(|i| after.contains(i)) {
            *answered.entry(item.clone()).or_default() += 1;
        }
        if status["state"] != "running" {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the import still running after {TIMEOUT:?}: {status}; reads answered within an item's run: {answered:?}"
        );
    };
    println!("crafted part: status reads answered within an item's run: {answered:?}");
    assert_failed_at_the_bound(&last);
    let most = answered.values().copied().max().unwrap_or(0);
    assert!(
        most >= 3,
        "status reads answered while an item ran: {answered:?} (the import ended: {last})"
    );
    app.shutdown().await;
}

/// The measurement of the crafted part: the handler's peak RSS over its baseline (must be at
/// most 64 MiB; measured 3–4 MiB) and the slowest status read meanwhile (must be under
/// max(2 s, half the import's time); measured 0.17 s). Before: +405 MiB and reads of 1.1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement: handler peak RSS and status-read latency (docs/development.md, Measurements)"]
async fn a_part_that_inflates_past_the_bound_costs_little_memory_and_blocks_nothing() {
    let _alone = support::alone().await;
    let app = TestApp::start(1, &[]).await;
    let store = blobs();
    let container = unique_name("bomb");
    let size = upload_bomb(&store, &container).await;
    let (pid, baseline) = handler_baseline(&app, &container).await;
    let id = start_bomb_import(&app, &container).await;
    let mut slowest = Duration::ZERO;
    let started = Instant::now();
    let deadline = started + TIMEOUT;
    let status = loop {
        let asked = Instant::now();
        let (_, status) = app.get(&format!("/api/scans/{id}")).await;
        slowest = slowest.max(asked.elapsed());
        if status["state"] != "running" {
            break status;
        }
        assert!(Instant::now() < deadline, "still running: {status}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let took = started.elapsed();
    let peak = peak_rss_kib(pid);
    println!(
        "measurement: crafted part: {size} bytes compressed; handler peak RSS {} MiB before, {} MiB after (+{} MiB, bound 64); slowest status read {slowest:?} of an import that took {took:?} (bound {:?})",
        baseline / 1024,
        peak / 1024,
        (peak - baseline) / 1024,
        Duration::from_secs(2).max(took / 2),
    );
    assert_failed_at_the_bound(&status);
    assert!(
        peak - baseline <= 64 * 1024,
        "peak RSS grew {} KiB",
        peak - baseline
    );
    // Blocked, a status read would wait out most of the inflating; on a loaded machine an
    // unblocked one can still take 2 s (CI once read 2.15 s), so the bound is relative to the
    // import's own time, with 2 s as its floor.
    let bound = Duration::from_secs(2).max(took / 2);
    assert!(
        slowest < bound,
        "a status read took {slowest:?} (bound {bound:?}; the import took {took:?})"
    );
    app.shutdown().await;
}

/// A part listed bigger than any export writes (here 54 MiB of random bytes, listed
/// with their true size and hash) is refused naming the part before it is downloaded: a part is
/// held whole while its SHA-256 is checked, so the bound is what keeps it to tens of MiB, not
/// the 256 MiB a part may inflate to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_listed_bigger_than_an_export_writes_is_refused_unread() {
    use rand::RngCore;
    let app = TestApp::start(1, &[]).await;
    let store = blobs();
    let container = unique_name("huge");
    let mut bytes = vec![0u8; 54 * 1024 * 1024];
    rand::thread_rng().fill_bytes(&mut bytes);
    upload_export(&store, &container, "huge", &[("big", bytes, 10)]).await;
    let (status, table) = import(&app, &container, "huge").await;
    assert_eq!(status["state"], "failed", "{status}");
    let error = status["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("parts/s1/big.jsonl.gz") && error.contains("bound on a part"),
        "{status}"
    );
    assert_eq!(status["rowsWritten"].as_i64(), Some(0), "{status}");
    assert!(
        RawClient::azurite().rows(&table).await.is_empty(),
        "rows written"
    );
    app.shutdown().await;
}

/// The worst part an import accepts: as big as an export may write (just under 13 MiB as
/// stored), of lines that barely compress (two 29 KB random base64 strings each), valid and
/// listed with its true hash, uploaded under `container/dense`. Its size and rows.
async fn upload_dense(store: &AzureBlobStore, container: &str) -> (usize, u64) {
    use base64::Engine;
    use rand::RngCore;
    let mut noise = vec![0u8; 22_000];
    let mut rows = 0u64;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    loop {
        // Two strings of 29,336 characters: under the 64 KiB (32,768 UTF-16 units) a value holds.
        let mut random = || {
            rand::thread_rng().fill_bytes(&mut noise);
            base64::engine::general_purpose::STANDARD.encode(&noise)
        };
        let (v, w) = (random(), random());
        let line =
            format!(r#"{{"PartitionKey":"p{rows:04}","RowKey":"r","V":"{v}","W":"{w}"}}"#) + "\n";
        gz.write_all(line.as_bytes()).unwrap();
        rows += 1;
        if gz.get_ref().len() > 11 * 1024 * 1024 {
            break;
        }
    }
    let bytes = gz.finish().unwrap();
    assert!(bytes.len() < 13 * 1024 * 1024, "{} bytes", bytes.len());
    let size = bytes.len();
    upload_export(store, container, "dense", &[("dense", bytes, rows)]).await;
    (size, rows)
}

/// The worst part an import accepts restores every row (the part is held whole while its
/// SHA-256 is checked, and a write item takes at most 8 MiB of its lines: counted in
/// `import_tests.rs`; the handler's RSS is measured below).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_biggest_incompressible_part_restores_every_row() {
    let (app, store, client, container) = started("dense").await;
    let (_, rows) = upload_dense(&store, &container).await;
    let (status, table) = import(&app, &container, "dense").await;
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(status["rowsWritten"].as_u64(), Some(rows), "{status}");
    assert_eq!(client.rows(&table).await.len() as u64, rows);
    app.shutdown().await;
}

/// The measurement of the worst part: the handler's peak RSS over its baseline must stay within
/// 64 MiB (measured +39 to +42 MiB), every row restored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement: handler peak RSS (docs/development.md, Measurements)"]
async fn the_biggest_incompressible_part_costs_at_most_64_mib() {
    let _alone = support::alone().await;
    let (app, store, client, container) = started("dense").await;
    let (size, rows) = upload_dense(&store, &container).await;
    let (pid, baseline) = handler_baseline(&app, &container).await;
    let (status, table) = import(&app, &container, "dense").await;
    let peak = peak_rss_kib(pid);
    println!(
        "measurement: dense part: {size} bytes stored, {rows} rows; handler peak RSS {} MiB before, {} MiB after (+{} MiB, bound 64)",
        baseline / 1024,
        peak / 1024,
        (peak - baseline) / 1024
    );
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(client.rows(&table).await.len() as u64, rows);
    assert!(
        peak - baseline <= 64 * 1024,
        "peak RSS grew {} KiB",
        peak - baseline
    );
    app.shutdown().await;
}
