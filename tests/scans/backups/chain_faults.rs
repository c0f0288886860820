//! The fault suite over a delta and a chain restore: a full export, then changes (updates,
//! deletes, inserts), then a delta **under the fault** (handlers SIGKILLed while its blob writes
//! are held, every queue message stored two or three times, or storage faults on tables, queues
//! and blobs), then the restore of the chain **under the same fault**. Nothing is lost (the
//! restore equals the table, read raw), the delta's tombstones are exactly the deleted keys, and
//! the counters are exact: the delta's `rowsScanned` is the table's rows, its `rowsWritten` its
//! manifest's `rows`, and the restore's `rowsWritten` the base's rows + the delta's rows and
//! tombstones.
//!
//! Oracles: `support::raw` for the table, generic JSON and flate2 for the files
//! (`support::backup::part_lines`), never tablescan's format code.

use crate::support;

use std::collections::BTreeSet;

use serde_json::{json, Value};
use support::backup::{blobs, download, line_key, part_lines, start, SCAN_TIMEOUT};
use support::e2e::TestApp;
use support::faults::kills::deliveries_budget;
use support::faults::{
    app_behind, check_kills, proxy, seeded_source, source_entities, start_then_arm, storage_faults,
    Killer,
};
use support::raw::{self, json_string, RawClient, RawEntity};
use support::unique_name;
use tablescan::lab::proxy::{FaultPolicy, Hold, StorageProxy};
use tablescan::storage::request_counts::RequestKind;

type Key = (String, String);

#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    Crash,
    Duplicates,
    Storage,
}

async fn fault_proxy(fault: Fault) -> StorageProxy {
    match fault {
        Fault::Crash => proxy(FaultPolicy::none(), 43).await,
        Fault::Duplicates => {
            let policy = FaultPolicy {
                duplicate_puts: 1.0,
                extra_copies: 2,
                kinds: vec![RequestKind::QueuePut],
                ..FaultPolicy::default()
            };
            proxy(policy, 47).await
        }
        Fault::Storage => proxy(storage_faults(0.04), 53).await,
    }
}

/// Updates every 7th row, deletes every 11th (not updated), inserts `inserts` new rows; the
/// keys deleted.
async fn change(
    client: &RawClient,
    table: &str,
    rows: &[RawEntity],
    inserts: usize,
) -> BTreeSet<Key> {
    let mut deleted = BTreeSet::new();
    for (i, row) in rows.iter().enumerate() {
        let (pk, rk) = (row.partition_key(), row.row_key());
        if i % 7 == 0 {
            let mut text = format!(
                r#"{{"PartitionKey":{},"RowKey":{},"Changed":{i}"#,
                row.partition_key_text, row.row_key_text
            );
            for (name, value) in &row.properties {
                text.push_str(&format!(",{}:{value}", json_string(name)));
            }
            text.push('}');
            client
                .upsert(table, (&pk, &rk), &text)
                .await
                .expect("update");
        } else if i % 11 == 0 {
            assert!(client.delete(table, &pk, &rk).await.expect("delete"));
            deleted.insert((pk, rk));
        }
    }
    for n in 0..inserts {
        let (pk, rk) = (format!("new{}", n % 3), format!("{n:04}"));
        let text = format!(r#"{{"PartitionKey":"{pk}","RowKey":"{rk}","N":{n}}}"#);
        client
            .upsert(table, (&pk, &rk), &text)
            .await
            .expect("insert");
    }
    deleted
}

async fn manifest(container: &str, prefix: &str) -> Value {
    let bytes = download(&blobs(), container, &format!("{prefix}/manifest.json"))
        .await
        .unwrap_or_else(|| panic!("{container}/{prefix}/manifest.json"));
    serde_json::from_slice(&bytes).unwrap()
}

async fn file_keys(container: &str, prefix: &str, files: &Value) -> BTreeSet<Key> {
    let mut keys = BTreeSet::new();
    for file in files.as_array().into_iter().flatten() {
        let name = format!("{prefix}/{}", file["name"].as_str().unwrap());
        let bytes = download(&blobs(), container, &name).await.expect("listed");
        for line in part_lines(&bytes).unwrap() {
            assert!(keys.insert(line_key(&line).unwrap()), "{name}: a key twice");
        }
    }
    keys
}

/// Holds blob writes to `container` (under [`Fault::Crash`]) once the scan `start` returned,
/// kills handlers while they wait, and releases them; the scan's id.
async fn under(
    fault: Fault,
    (app, proxy, killer): (&TestApp, &StorageProxy, &mut Killer),
    body: Value,
    hold: Hold,
    round: usize,
) -> String {
    if fault != Fault::Crash {
        return start(app, body).await;
    }
    let id = start_then_arm(app, proxy, start(app, body), |_| proxy.hold(hold)).await;
    // A small delta is one tile item, redelivered to any instance (maybe the one killed):
    // one kill of it; the restore's many items take the rest.
    let most = if round == 1 { 1 } else { usize::MAX };
    let count = deliveries_budget(&killer.kills, round).min(most);
    killer.kill(app, Some(proxy), count, round, None).await;
    proxy.release();
    id
}

async fn chain_fault_run(fault: Fault, rows: u64) {
    let _alone = support::alone().await;
    let instances = if fault == Fault::Crash { 3 } else { 2 };
    let proxy = fault_proxy(fault).await;
    let app = match fault {
        Fault::Crash => app_behind(&proxy, instances).await,
        _ => TestApp::start_through(instances, Some(&proxy)).await,
    };
    let client = RawClient::azurite();
    let (source, before) = seeded_source(&app, source_entities(rows, 97)).await;
    let container = unique_name("chainfault");
    let body = json!({"driver": "export", "sourceTable": source, "takeCount": 50,
        "destinationContainer": container, "destinationPrefix": "base"});
    let base = app
        .wait_for_end(&start(&app, body).await, SCAN_TIMEOUT)
        .await;
    assert_eq!(base["state"], "completed", "{base}");
    let deleted = change(&client, &source, &before, 9).await;
    let now = client.rows(&source).await;

    let mut killer = Killer::new(&app);
    let body = json!({"driver": "export", "sourceTable": source, "since": "base",
        "destinationContainer": container, "destinationPrefix": "delta"});
    let hold = Hold::blob_writes_to(&container);
    let id = under(fault, (&app, &proxy, &mut killer), body, hold, 1).await;
    let delta = app.wait_for_end(&id, SCAN_TIMEOUT).await;
    assert_eq!(delta["state"], "completed", "{fault:?}: {delta}");
    let m = manifest(&container, "delta").await;
    assert_eq!(
        delta["rowsScanned"].as_u64(),
        Some(now.len() as u64),
        "{delta}"
    );
    assert_eq!(delta["rowsWritten"], m["rows"], "{delta}");
    let tombstones = file_keys(&container, "delta", &m["delta"]["deleted"]).await;
    assert_eq!(
        tombstones, deleted,
        "{fault:?}: the tombstones are the deleted keys"
    );
    let parts = file_keys(&container, "delta", &m["parts"]).await;
    let table: BTreeSet<Key> = now
        .iter()
        .map(|e| (e.partition_key(), e.row_key()))
        .collect();
    assert!(
        parts.is_subset(&table),
        "{fault:?}: a delta row not in the table"
    );

    let destination = unique_name("ChainRestored");
    let body = json!({"driver": "import", "sourceContainer": container, "sourcePrefix": "delta",
        "destinationTable": destination});
    let hold = Hold::writes_to(&destination);
    let id = under(fault, (&app, &proxy, &mut killer), body, hold, 2).await;
    let restore = app.wait_for_end(&id, SCAN_TIMEOUT).await;
    assert_eq!(restore["state"], "completed", "{fault:?}: {restore}");
    let written = base["rowsWritten"].as_u64().unwrap()
        + m["rows"].as_u64().unwrap()
        + m["delta"]["deletedRows"].as_u64().unwrap();
    assert_eq!(restore["rowsWritten"].as_u64(), Some(written), "{restore}");
    let restored = client.rows(&destination).await;
    assert_eq!(
        raw::diff(&now, &restored),
        Vec::<String>::new(),
        "{fault:?}"
    );
    match fault {
        Fault::Crash => check_kills(&app, &killer.kills).await,
        Fault::Duplicates => assert!(proxy.duplicates_put() > 0),
        Fault::Storage => assert!(proxy.faults_injected() > 0),
    }
    eprintln!(
        "chain faults {fault:?}: delta {} rows, {} tombstones; restore wrote {written}",
        m["rows"], m["delta"]["deletedRows"]
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delta_and_its_chain_restore_with_handler_crashes() {
    chain_fault_run(Fault::Crash, 1200).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delta_and_its_chain_restore_with_duplicate_delivery() {
    chain_fault_run(Fault::Duplicates, 300).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delta_and_its_chain_restore_with_storage_faults() {
    chain_fault_run(Fault::Storage, 600).await;
}
