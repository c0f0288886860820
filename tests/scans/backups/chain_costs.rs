//! The costs of incremental exports (a measurement, not a test: `cargo test --release --test
//! scans -- --ignored backups::chain_costs`, docs/development.md "Measurements"). A table of
//! `TABLESCAN_CHAIN_ROWS` rows (default 100,000) is exported in full, then three times 1 % of
//! its rows are updated, 0.1 % deleted and 0.5 % inserted, each followed by a delta; it prints
//! the storage requests (`storageRequests` of each scan) against a keys-only count of the same
//! table, the blob bytes of each delta against the full export's, and the requests of restoring
//! the chain against restoring one full export of the final rows. The property each figure
//! protects is tested deterministically in `chains` and `chain_faults`.
//!
//! The watermark's margin is 60 s, so the measurement waits 61 s after seeding and after each
//! delta starts before changing rows: otherwise every row changed in the last minute would be in
//! the next delta too, which is correct but is not the scenario measured.

use crate::support;

use std::time::Duration;

use serde_json::{json, Value};
use support::backup::{blobs, list_all, start, SCAN_TIMEOUT};
use support::e2e::TestApp;
use support::faults::{seeded_source, source_entities};
use support::raw::{json_string, RawClient, RawEntity};
use support::unique_name;

const MARGIN: Duration = Duration::from_secs(61);

async fn run(app: &TestApp, body: Value) -> Value {
    let status = app
        .wait_for_end(&start(app, body).await, SCAN_TIMEOUT * 4)
        .await;
    assert_eq!(status["state"], "completed", "{status}");
    status
}

async fn export(
    app: &TestApp,
    source: &str,
    (container, prefix): (&str, &str),
    since: Option<&str>,
) -> (u64, u64) {
    let mut body = json!({"driver": "export", "sourceTable": source,
        "destinationContainer": container, "destinationPrefix": prefix});
    if let Some(since) = since {
        body["since"] = json!(since);
    }
    let status = run(app, body).await;
    let bytes: u64 = list_all(&blobs(), container, &format!("{prefix}/"))
        .await
        .values()
        .sum();
    (status["storageRequests"].as_u64().unwrap(), bytes)
}

async fn restore(app: &TestApp, (container, prefix): (&str, &str)) -> u64 {
    let body = json!({"driver": "import", "sourceContainer": container, "sourcePrefix": prefix,
        "destinationTable": unique_name("Cost")});
    run(app, body).await["storageRequests"].as_u64().unwrap()
}

/// 1 % updated, 0.1 % deleted, 0.5 % inserted (of `rows`), from `live` (updated in place).
async fn round(client: &RawClient, table: &str, live: &mut Vec<RawEntity>, round: usize) {
    let n = live.len();
    for i in (0..n).step_by(100) {
        let row = &live[(i + round * 37) % n];
        let mut text = format!(
            r#"{{"PartitionKey":{},"RowKey":{},"Round":{round}"#,
            row.partition_key_text, row.row_key_text
        );
        for (name, value) in row.properties.iter().filter(|(k, _)| k.as_str() != "Round") {
            text.push_str(&format!(",{}:{value}", json_string(name)));
        }
        text.push('}');
        client
            .upsert(table, (&row.partition_key(), &row.row_key()), &text)
            .await
            .unwrap();
    }
    for _ in 0..n / 1000 {
        let row = live.remove((round * 7919) % live.len());
        client
            .delete(table, &row.partition_key(), &row.row_key())
            .await
            .unwrap();
    }
    for i in 0..n / 200 {
        let (pk, rk) = (format!("new{round}-{}", i % 50), format!("{i:06}"));
        let text = format!(r#"{{"PartitionKey":"{pk}","RowKey":"{rk}","N":{i}}}"#);
        client.upsert(table, (&pk, &rk), &text).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement: requests and blob bytes of deltas and chain restores"]
async fn delta_and_chain_restore_costs() {
    let _alone = support::alone().await;
    let rows: u64 = std::env::var("TABLESCAN_CHAIN_ROWS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(100_000);
    let app = TestApp::start(1, &[]).await;
    let client = RawClient::azurite();
    let (source, mut live) = seeded_source(&app, source_entities(rows, 5)).await;
    let container = unique_name("costs");
    let count = run(&app, json!({"driver": "count", "sourceTable": source})).await;
    let count_requests = count["storageRequests"].as_u64().unwrap();
    tokio::time::sleep(MARGIN).await;
    let (full_requests, full_bytes) = export(&app, &source, (&container, "full"), None).await;
    let mut parent = "full".to_string();
    let mut deltas = Vec::new();
    for r in 1..=3 {
        tokio::time::sleep(MARGIN).await;
        round(&client, &source, &mut live, r).await;
        let name = format!("d{r}");
        let (requests, bytes) = export(&app, &source, (&container, &name), Some(&parent)).await;
        deltas.push((name.clone(), requests, bytes));
        parent = name;
    }
    let chain = restore(&app, (&container, &parent)).await;
    tokio::time::sleep(MARGIN).await;
    let (_, _) = export(&app, &source, (&container, "final"), None).await;
    let one = restore(&app, (&container, "final")).await;
    eprintln!("chain costs, {rows} rows: keys-only count {count_requests} requests; full export {full_requests} requests, {full_bytes} blob bytes");
    for (name, requests, bytes) in &deltas {
        eprintln!(
            "chain costs: {name}: {requests} requests ({:.2} x the count), {bytes} blob bytes ({:.2} % of the full export)",
            *requests as f64 / count_requests as f64,
            *bytes as f64 * 100.0 / full_bytes as f64
        );
    }
    eprintln!("chain costs: restoring base + 3 deltas {chain} requests, one full export of the final rows {one} ({:.3} x)", chain as f64 / one as f64);
    app.shutdown().await;
}
