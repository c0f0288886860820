//! Measurements (`cargo test --release -- --ignored`, docs/development.md): the requests an
//! expire sends to its source table on 100,000 rows, against the minimum of deleting exactly
//! the expired rows. The property each figure rests on is tested deterministically in `keys`
//! (a PartitionKey time reads only the expired keys).

use serde_json::json;
use tablescan::lab::proxy::{FaultPolicy, StorageProxy};
use tablescan::storage::Entity;

use super::{key_text, unix_now, DAY};
use crate::support;
use crate::support::e2e::TestApp;
use crate::support::unique_name;

/// Rows, partitions, and the partitions expired (1%).
const ROWS: i64 = 100_000;
const PARTITIONS: i64 = 1_000;
const EXPIRED_PARTITIONS: i64 = 10;

/// Queries and transactions `proxy` saw on `table` since `before`.
fn requests_on(proxy: &StorageProxy, table: &str) -> (u64, u64) {
    let counts = proxy.counts();
    let of = |kind: &str| {
        counts
            .iter()
            .filter(|((k, t), _)| k == kind && t == table)
            .map(|(_, n)| *n)
            .sum::<u64>()
    };
    (of("query"), of("batch"))
}

/// 100,000 rows in 1,000 partitions of 100; the first 10 partitions 60 days old, the rest a
/// day old; partition keys in `ticks`, a `CreatedAt` DateTime of the same time.
fn rows() -> Vec<Entity> {
    let now = unix_now();
    (0..ROWS)
        .map(|i| {
            let p = i / (ROWS / PARTITIONS);
            let days = if p < EXPIRED_PARTITIONS { -60 } else { -1 };
            let at = now + days * DAY + p;
            let mut e = Entity::new(key_text("ticks", at), format!("{:05}", i % 100));
            e.properties
                .insert("CreatedAt", json!(key_text("iso8601", at)));
            e.properties
                .insert("CreatedAt@odata.type", json!("Edm.DateTime"));
            e
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement: requests of an expire of 1% of 100,000 rows against the minimum"]
async fn expire_requests_against_the_minimum() {
    let proxy = support::faults::proxy(FaultPolicy::none(), 4002).await;
    let app = TestApp::start_through(1, Some(&proxy)).await;
    let expired = (ROWS / PARTITIONS * EXPIRED_PARTITIONS) as u64;
    // The fewest requests that delete exactly the expired rows: a query per 1,000 of them and a
    // transaction per partition per 100.
    let minimum = expired.div_ceil(1000)
        + (EXPIRED_PARTITIONS as u64) * ((ROWS / PARTITIONS) as u64).div_ceil(100);
    // A filtered delete's fewest: every key read (discovery cannot filter), each 1,000-key
    // page read again with the condition, and the transactions.
    let filtered = 2 * (ROWS as u64).div_ceil(1000) + minimum - expired.div_ceil(1000);
    for (name, body, floor) in [
        (
            "keyTime on PartitionKey",
            json!({"keyTime": {"key": "PartitionKey", "format": "ticks"}}),
            minimum,
        ),
        (
            "timeProperty (a filtered delete's path)",
            json!({"timeProperty": "CreatedAt"}),
            filtered,
        ),
    ] {
        let table = unique_name("Costs");
        support::e2e::seed(&app.store, &table, rows()).await;
        let mut request =
            json!({"driver": "expire", "sourceTable": table, "confirm": table, "olderThan": "30d"});
        for (k, v) in body.as_object().unwrap() {
            request[k] = v.clone();
        }
        let (_, status) = app
            .scan_until_end(&request, std::time::Duration::from_secs(600))
            .await;
        assert_eq!(status["rowsWritten"], expired, "{status}");
        let (queries, batches) = requests_on(&proxy, &table);
        // The seeding's transactions went straight to Azurite, not through the proxy.
        let sent = queries + batches;
        println!(
            "{name}: {queries} queries + {batches} transactions = {sent} requests to the source \
             table; minimum {floor}; ratio {:.2}; rowsScanned {}, storageRequests {}",
            sent as f64 / floor as f64,
            status["rowsScanned"],
            status["storageRequests"]
        );
    }
    app.shutdown().await;
}
