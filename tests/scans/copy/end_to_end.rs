//! End to end: scans started over HTTP through the local Functions host, executed by the real
//! handler binary, on Azurite. Destination equals source row for row and property for property
//! (read back by the test's own REST client and compared as raw JSON text, never through
//! tablescan's parser), and the counters are exact.

use crate::support;

use std::time::Duration;

use serde_json::{json, Value};
use support::e2e::{seed, TestApp};
use support::faults::source_entities_with;
use support::raw::{self, RawClient};
use support::unique_name;
use tablescan::lab::dataset;
use tablescan::storage::Entity;

/// A small dataset with realistic keys plus adversarial ones.
fn source_entities() -> Vec<Entity> {
    source_entities_with(
        400,
        11,
        &[("Z\u{FFFF}", "max"), ("Microsoft.", "exact-prefix")],
    )
}

/// Rows written as JSON text by the raw client: doubles that need all 17 significant digits (a
/// parser that is not correctly rounded changes them in the last bit), a whole double and an
/// Int64 that must keep their types.
fn raw_rows() -> Vec<String> {
    let doubles = support::raw::HARD_DOUBLES;
    (0..4)
        .map(|i| {
            format!(
                "{{\"PartitionKey\":\"Raw.Doubles\",\"RowKey\":\"{i}\",\"D\":{},\"D@odata.type\":\"Edm.Double\",\"N\":\"{i}\",\"N@odata.type\":\"Edm.Int64\"}}",
                doubles[i]
            )
        })
        .collect()
}

async fn start_scan(app: &TestApp, body: Value) -> String {
    let (status, reply, location) = app.post_scan(&body).await;
    assert_eq!(status, 202, "{reply}");
    let id = reply["id"].as_str().unwrap().to_string();
    assert_eq!(
        location.as_deref(),
        Some(format!("/api/scans/{id}").as_str())
    );
    id
}

fn assert_counters(status: &Value, scanned: usize, written: usize) {
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(status["rowsScanned"], scanned as i64, "{status}");
    assert_eq!(status["rowsWritten"], written as i64, "{status}");
    assert_eq!(status["pendingWorkItems"], 0, "{status}");
    assert_eq!(status["failedWorkItems"], 0, "{status}");
    assert!(status["messagesProcessed"].as_i64().unwrap() >= 1);
    assert!(status["storageRequests"].as_i64().unwrap() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_and_count_scans_are_exact() {
    let app = TestApp::start(1, &[]).await;
    let client = RawClient::azurite();
    let source = unique_name("Source");
    let entities = source_entities();
    seed(&app.store, &source, entities.clone()).await;
    let extra = raw_rows();
    for body in &extra {
        client.insert(&source, body).await.expect("raw insert");
    }
    let source_rows = client.rows(&source).await;
    assert_eq!(source_rows.len(), entities.len() + extra.len());

    // Prefix copy (small pages so discovery really recurses) and serial copy.
    for (strategy, take) in [("prefix", 7), ("serial", 50)] {
        let destination = unique_name("Dest");
        let id = start_scan(&app, json!({"driver": "copy", "sourceTable": source, "destinationTable": destination, "strategy": strategy, "takeCount": take})).await;
        let status = app.wait_for_end(&id, Duration::from_secs(180)).await;
        assert_counters(&status, source_rows.len(), source_rows.len());
        let copied = client.rows(&destination).await;
        assert_eq!(copied.len(), source_rows.len(), "{strategy} copy row count");
        assert_eq!(
            raw::diff(&source_rows, &copied),
            Vec::<String>::new(),
            "{strategy} copy equals source"
        );
    }

    // Count with a prefix and bounds.
    let expected = source_rows
        .iter()
        .map(|e| e.partition_key())
        .filter(|pk| {
            pk.starts_with("Microsoft.")
                && pk.as_str() > "Microsoft.AspNetCore"
                && pk.as_str() < "Microsoft.Extensions.Z"
        })
        .count();
    assert!(expected > 0);
    let id = start_scan(&app, json!({"driver": "count", "sourceTable": source, "partitionKeyPrefix": "Microsoft.", "partitionKeyLowerBound": "Microsoft.AspNetCore", "partitionKeyUpperBound": "Microsoft.Extensions.Z", "takeCount": 5})).await;
    let status = app.wait_for_end(&id, Duration::from_secs(120)).await;
    assert_counters(&status, expected, 0);

    // The list shows the newest scan first.
    let (status, list) = app.get("/api/scans").await;
    assert_eq!(status, 200);
    assert_eq!(list["scans"][0]["id"], id.as_str());
    assert_eq!(
        app.queued_messages().await,
        0,
        "no message left in any queue"
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_and_poison() {
    let app = TestApp::start(1, &[("TABLESCAN_TEST_FAIL_PREFIX", "System.")]).await;
    let source = unique_name("Source");
    // A partition bigger than a step reads of it: its rest is a partition-key step, which fails.
    let mut all = source_entities();
    all.extend((0..400).map(|i| dataset::entity("System.Failing", i)));
    seed(&app.store, &source, all).await;

    // A poisoned work item fails the scan with the failing item and its error, within bounded time.
    let destination = unique_name("Dest");
    let id = start_scan(&app, json!({"driver": "copy", "sourceTable": source, "destinationTable": destination, "takeCount": 20})).await;
    let status = app.wait_for_end(&id, Duration::from_secs(120)).await;
    assert_eq!(status["state"], "failed", "{status}");
    assert!(
        status["error"].as_str().unwrap().contains("System."),
        "{status}"
    );
    // Every partition under the prefix fails, so several items may exhaust their attempts before
    // the workers learn that the scan has failed; each is counted, none is lost.
    assert!(status["failedWorkItems"].as_i64().unwrap() >= 1, "{status}");

    // Cancel: the scan ends cancelled and stays so.
    let id = start_scan(
        &app,
        json!({"driver": "count", "sourceTable": source, "takeCount": 1}),
    )
    .await;
    let (code, body) = app.delete(&format!("/api/scans/{id}")).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["state"], "cancelled");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, body) = app.get(&format!("/api/scans/{id}")).await;
    assert_eq!(body["state"], "cancelled");
    let (code, _) = app.delete(&format!("/api/scans/{id}")).await;
    assert_eq!(code, 409);
    app.shutdown().await;
}
