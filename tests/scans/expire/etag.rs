//! A row changed between its read and its delete survives, and is counted in `rowsChanged`:
//! at the storage layer with a store hook that changes the row just before the transaction
//! is sent, and end to end (delete and expire) with the proxy holding the scan's transactions
//! while the test changes the row. Deterministic: the change is made while the delete waits.

use std::sync::Mutex;

use serde_json::{json, Value};
use tablescan::app::drivers::delete::{delete_batch, BatchDeleted};
use tablescan::lab::proxy::{FaultPolicy, Hold, StorageProxy};
use tablescan::storage::azure_table::AzureTableStore;
use tablescan::storage::{BatchOperation, Entity, Page, Query, StorageResult, TableStore};

use super::{seed, HANG};
use crate::support;
use crate::support::e2e::TestApp;
use crate::support::raw::RawClient;
use crate::support::unique_name;

/// The body of the row the test changes.
const CHANGED: &str = r#"{"PartitionKey":"p","RowKey":"1970-01-06","V":"changed"}"#;
/// Its row key.
const CHANGED_KEY: (&str, &str) = ("p", "1970-01-06");

/// Azurite's store, but the first transaction first waits for `hook` (a change of a row).
struct ChangeFirst {
    inner: AzureTableStore,
    hook: Mutex<Option<futures::future::BoxFuture<'static, ()>>>,
}

impl TableStore for ChangeFirst {
    async fn query_page(&self, table: &str, query: &Query) -> StorageResult<Page> {
        self.inner.query_page(table, query).await
    }

    async fn submit_batch_with_etags(
        &self,
        table: &str,
        partition_key: &str,
        operations: &[BatchOperation],
    ) -> StorageResult<Vec<Option<String>>> {
        let hook = self.hook.lock().unwrap().take();
        if let Some(hook) = hook {
            hook.await;
        }
        self.inner
            .submit_batch_with_etags(table, partition_key, operations)
            .await
    }

    async fn get_entity(
        &self,
        table: &str,
        partition_key: &str,
        row_key: &str,
    ) -> StorageResult<Option<(Entity, String)>> {
        self.inner.get_entity(table, partition_key, row_key).await
    }

    async fn create_table(&self, table: &str) -> StorageResult<bool> {
        self.inner.create_table(table).await
    }

    async fn delete_table(&self, table: &str) -> StorageResult<bool> {
        self.inner.delete_table(table).await
    }
}

/// Ten rows in one partition, their row keys days of January 1970 (long expired).
fn ten_rows() -> Vec<(String, String)> {
    (1..=10)
        .map(|i| ("p".to_string(), format!("1970-01-{i:02}")))
        .collect()
}

/// The rows left in `table`: exactly the changed one, with its new value.
async fn only_the_changed_row_is_left(client: &RawClient, table: &str) {
    let rows = client.rows(table).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let key = (rows[0].partition_key(), rows[0].row_key());
    assert_eq!((key.0.as_str(), key.1.as_str()), CHANGED_KEY);
    assert_eq!(rows[0].text("V"), Some("\"changed\""), "{rows:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_keeps_a_row_changed_after_it_was_read() {
    let client = RawClient::azurite();
    let table = unique_name("Changed");
    seed(&client, &table, &ten_rows()).await;
    let (inner, counters) = support::table_store();
    let query = Query {
        select: Some(Vec::new()),
        ..Query::default()
    };
    let read = inner.query_page(&table, &query).await.unwrap().entities;
    assert!(
        read.iter().all(|r| r.etag.is_some()),
        "a query reports ETags"
    );
    let (hook_client, hook_table) = (client.clone(), table.clone());
    let store = ChangeFirst {
        inner,
        hook: Mutex::new(Some(Box::pin(async move {
            hook_client
                .replace(&hook_table, CHANGED_KEY, CHANGED)
                .await
                .unwrap();
        }))),
    };
    let ops = read
        .into_iter()
        .map(|r| BatchOperation::Delete {
            row_key: r.row_key,
            etag: r.etag,
        })
        .collect();
    let before = counters.snapshot().total();
    let done = delete_batch(&store, &table, "p", ops).await.unwrap();
    assert_eq!(
        done,
        BatchDeleted {
            deleted: 9,
            changed: 1
        }
    );
    // The failed transaction, the re-read, the transaction of the nine.
    assert_eq!(counters.snapshot().total() - before, 3);
    only_the_changed_row_is_left(&client, &table).await;
}

/// Starts `body` on a table of ten rows with every transaction to it held at the proxy,
/// changes one row while the first is held, lets them through; the final status.
async fn change_while_held(body: impl Fn(&str) -> Value) -> (Value, String) {
    let client = RawClient::azurite();
    let proxy: StorageProxy = support::faults::proxy(FaultPolicy::none(), 4001).await;
    let app = TestApp::start_through(1, Some(&proxy)).await;
    let table = unique_name("Held");
    seed(&client, &table, &ten_rows()).await;
    proxy.hold(Hold::writes_to(&table));
    let id = app.start_scan(&body(&table)).await;
    tokio::time::timeout(HANG, proxy.wait_held(|h| h.now > 0))
        .await
        .unwrap_or_else(|_| panic!("waited {HANG:?} for a transaction of {id} held"));
    client.replace(&table, CHANGED_KEY, CHANGED).await.unwrap();
    proxy.release();
    let status = app.wait_for_end(&id, HANG).await;
    app.shutdown().await;
    (status, table)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_keeps_a_row_changed_while_its_transaction_was_held() {
    let (status, table) =
        change_while_held(|t| json!({"driver": "delete", "sourceTable": t, "confirm": t})).await;
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(
        (&status["rowsWritten"], &status["rowsChanged"]),
        (&json!(9), &json!(1)),
        "{status}"
    );
    only_the_changed_row_is_left(&RawClient::azurite(), &table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expire_keeps_a_row_changed_while_its_transaction_was_held() {
    let (status, table) = change_while_held(|t| {
        json!({"driver": "expire", "sourceTable": t, "confirm": t, "olderThan": "1d",
               "keyTime": {"key": "RowKey", "format": "iso8601"}})
    })
    .await;
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(
        (&status["rowsWritten"], &status["rowsChanged"]),
        (&json!(9), &json!(1)),
        "{status}"
    );
    only_the_changed_row_is_left(&RawClient::azurite(), &table).await;
}

/// The issue's case: a filtered delete whose row no longer matches once changed. The range
/// items' re-read (with the filter) read it matching; the change lands while the transaction
/// waits; the row is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filtered_delete_keeps_a_row_that_stopped_matching() {
    let (status, table) = change_while_held(
        |t| json!({"driver": "delete", "sourceTable": t, "confirm": t, "filter": "V eq 'seeded'"}),
    )
    .await;
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(
        (&status["rowsWritten"], &status["rowsChanged"]),
        (&json!(9), &json!(1)),
        "{status}"
    );
    only_the_changed_row_is_left(&RawClient::azurite(), &table).await;
}
