//! Calling the app's router in-process, as the Functions host would over HTTP.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

use tablescan::app::config::Config;
use tablescan::app::server::app;
use tablescan::app::state::AppState;
use tablescan::storage::azure_queue::AzureQueueStore;
use tablescan::storage::connection::StorageAccount;
use tablescan::storage::request_counts::RequestCounters;
use tablescan::storage::stores::{AzureStores, Stores};

use super::{account, azurite, unique_name};

/// Sends `method uri` (with a JSON `body`, if any) to the app; its status and JSON body.
pub async fn call<S: Stores>(
    state: &Arc<AppState<S>>,
    method: &str,
    uri: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut request = Request::builder().method(method).uri(uri);
    if body.is_some() {
        request = request.header("content-type", "application/json");
    }
    let body = body.map_or_else(Body::empty, |b| Body::from(b.to_string()));
    let response = app(state.clone())
        .oneshot(request.body(body).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).expect("a JSON body"))
}

/// The host's invocation payload for one delivery of a queue message to `function` (its decoded
/// text, dequeue count and id), exactly as docs/custom-handler-protocol.md §3.3 describes it.
pub fn queue_payload(function: &str, decoded: &str, dequeue_count: u64, id: &str) -> Value {
    serde_json::json!({
        "Data": { "message": serde_json::to_string(decoded).unwrap() },
        "Metadata": {
            "DequeueCount": dequeue_count.to_string(),
            "Id": format!("\"{id}\""),
            "PopReceipt": "\"pop\"",
            "InsertionTime": "2026-11-22T00:00:00+00:00",
            "sys": { "MethodName": function, "UtcNow": "2026-11-22T00:00:00Z", "RandGuid": "00000000-0000-0000-0000-000000000000" }
        }
    })
}

/// The app in-process on the shared Azurite over the real storage adapters, with queues and
/// bookkeeping tables of its own (unique names), every request counted.
pub struct InProcessApp {
    pub state: Arc<AppState<AzureStores>>,
    pub counters: Arc<RequestCounters>,
    pub queues: AzureQueueStore,
    pub prefix_queue: String,
    pub copy_queue: String,
    pub scans_table: String,
    pub work_table: String,
    /// The account its table store reaches (Azurite, or a fault proxy in front of it).
    tables_account: StorageAccount,
}

impl InProcessApp {
    /// A new app; `extra` app settings are added to its own names and 4 counter shards.
    pub fn start(extra: &[(&str, &str)]) -> Self {
        Self::start_with_tables(account(), extra)
    }

    /// [`InProcessApp::start`] with its table requests (bookkeeping and scanned tables) sent
    /// to `tables` (e.g. a fault proxy's account); queues stay on Azurite.
    pub fn start_with_tables(tables: StorageAccount, extra: &[(&str, &str)]) -> Self {
        let (prefix_queue, copy_queue) = (unique_name("ps"), unique_name("tc"));
        let (scans_table, work_table) = (unique_name("Scans"), unique_name("Work"));
        let connection = azurite().connection_string();
        let mut settings: BTreeMap<&str, &str> = BTreeMap::from([
            ("AzureWebJobsStorage", connection.as_str()),
            ("TABLESCAN_PREFIXSCAN_QUEUE", prefix_queue.as_str()),
            ("TABLESCAN_TABLECOPY_QUEUE", copy_queue.as_str()),
            ("TABLESCAN_SCANS_TABLE", scans_table.as_str()),
            ("TABLESCAN_WORK_TABLE", work_table.as_str()),
            ("TABLESCAN_COUNTER_SHARDS", "4"),
        ]);
        settings.extend(extra.iter().copied());
        let config = Config::from_lookup(|k| settings.get(k).map(|v| v.to_string())).unwrap();
        let counters = Arc::new(RequestCounters::new());
        let queues = account().queue_store(counters.clone());
        InProcessApp {
            state: Self::state(config, &tables, &counters, &queues),
            counters,
            queues,
            prefix_queue,
            copy_queue,
            scans_table,
            work_table,
            tables_account: tables,
        }
    }

    /// The work-item rows of scan `scan_id` (its counter rows aside) as the service stores
    /// them, read with the raw client.
    pub async fn work_item_rows(&self, scan_id: &str) -> Vec<super::raw::RawEntity> {
        let rows = super::raw::RawClient::azurite()
            .rows(&self.work_table)
            .await;
        rows.into_iter()
            .filter(|e| e.partition_key().starts_with(scan_id) && e.row_key() != "counter")
            .collect()
    }

    /// Receives one message of the prefix-scan queue (hidden for 5 minutes): its id and
    /// decoded text, or `None` if none is visible.
    pub async fn take_step_message(&self) -> Option<(String, String)> {
        use tablescan::storage::{MessageEncoding, QueueStore};
        let got = self
            .queues
            .get_messages(&self.prefix_queue, 1, std::time::Duration::from_secs(300))
            .await
            .unwrap();
        let message = got.into_iter().next()?;
        let text = MessageEncoding::Base64.decode(&message.text).unwrap();
        Some((message.id, String::from_utf8(text).unwrap()))
    }

    /// The same app on another instance (nothing cached; its table requests counted apart).
    pub fn another_instance(&self) -> Self {
        let counters = Arc::new(RequestCounters::new());
        InProcessApp {
            state: Self::state(
                self.state.config.clone(),
                &self.tables_account,
                &counters,
                &self.queues,
            ),
            counters,
            queues: self.queues.clone(),
            prefix_queue: self.prefix_queue.clone(),
            copy_queue: self.copy_queue.clone(),
            scans_table: self.scans_table.clone(),
            work_table: self.work_table.clone(),
            tables_account: self.tables_account.clone(),
        }
    }

    fn state(
        config: Config,
        tables: &StorageAccount,
        counters: &Arc<RequestCounters>,
        queues: &AzureQueueStore,
    ) -> Arc<AppState<AzureStores>> {
        let own = "AzureWebJobsStorage".to_string();
        let blob_counters = Arc::new(tablescan::storage::blob::BlobRequestCounters::default());
        let blobs = BTreeMap::from([(own.clone(), tables.blob_store(blob_counters))]);
        let tables = BTreeMap::from([(own.clone(), tables.table_store(counters.clone()))]);
        let queues = BTreeMap::from([(own, queues.clone())]);
        AppState::with_connections(
            config,
            tables,
            queues,
            blobs,
            tablescan::app::drivers::registry(),
        )
    }
}

/// The record of a running count scan of `Source` with `shards` counter shards, started at
/// `started_at`, as a test writes it straight into the scans table.
pub fn running_count_record(
    id: &str,
    shards: u32,
    started_at: time::OffsetDateTime,
) -> tablescan::app::tracking::ScanRecord {
    tablescan::app::tracking::ScanRecord {
        id: id.to_string(),
        state: tablescan::app::tracking::ScanState::Running,
        request: serde_json::json!({"driver": "count", "sourceTable": "Source"}),
        context: None,
        shards,
        started_at,
        completed_at: None,
        error: None,
        etag: String::new(),
    }
}
