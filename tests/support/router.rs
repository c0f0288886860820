//! Calling the app's router in-process, as the Functions host would over HTTP; the app's queues
//! with the host's visibility delays kept on the app's clock ([`HostQueues`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

use tablescan::app::config::Config;
use tablescan::app::server::app;
use tablescan::app::state::AppState;
use tablescan::clock::Clock;
use tablescan::storage::azure_blob::AzureBlobStore;
use tablescan::storage::azure_queue::AzureQueueStore;
use tablescan::storage::azure_table::AzureTableStore;
use tablescan::storage::connection::StorageAccount;
use tablescan::storage::request_counts::RequestCounters;
use tablescan::storage::stores::Stores;
use tablescan::storage::{QueueStore, ReceivedMessage, StorageResult};
use time::OffsetDateTime;

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
/// bookkeeping tables of its own (unique names), every request counted. On the system's clock,
/// or on a test's ([`InProcessApp::on_clock`]).
pub struct InProcessApp {
    pub state: Arc<AppState<InProcessStores>>,
    pub counters: Arc<RequestCounters>,
    /// The app's queues on Azurite, as the host reads them.
    pub queues: AzureQueueStore,
    /// The same queues as the app writes them (delayed messages held on its clock, if a test's).
    pub host_queues: HostQueues,
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
        let host_queues = HostQueues::service(queues.clone());
        InProcessApp {
            state: Self::state(config, &tables, &counters, &host_queues),
            counters,
            queues,
            host_queues,
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

    /// This app on `clock` (a manual one the test moves): the app's time of day is the clock's,
    /// and its delayed queue messages wait on it, until [`InProcessApp::release_due`] finds
    /// their time has come.
    pub fn on_clock(self, clock: Clock) -> Self {
        let host_queues = HostQueues::on_clock(self.queues.clone(), clock.clone());
        let config = self.state.config.clone();
        let state = Self::state(config, &self.tables_account, &self.counters, &host_queues);
        InProcessApp {
            state: state.on_clock(clock),
            host_queues,
            ..self
        }
    }

    /// The app's clock (see [`InProcessApp::on_clock`]).
    pub fn clock(&self) -> &Clock {
        &self.state.clock
    }

    /// Puts the delayed messages whose time has come on their queues (see [`HostQueues`]).
    pub async fn release_due(&self) -> usize {
        self.host_queues.release_due().await
    }

    /// The same app on another instance (nothing cached; its table requests counted apart; the
    /// same clock and held messages).
    pub fn another_instance(&self) -> Self {
        let counters = Arc::new(RequestCounters::new());
        let config = self.state.config.clone();
        let state = Self::state(config, &self.tables_account, &counters, &self.host_queues);
        InProcessApp {
            state: state.on_clock(self.state.clock.clone()),
            counters,
            queues: self.queues.clone(),
            host_queues: self.host_queues.clone(),
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
        queues: &HostQueues,
    ) -> Arc<AppState<InProcessStores>> {
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

/// The stores of an [`InProcessApp`]: Azurite's, its queues seen through [`HostQueues`].
pub struct InProcessStores;

impl Stores for InProcessStores {
    type Table = AzureTableStore;
    type Queue = HostQueues;
    type Blob = AzureBlobStore;
}

/// A message put with a visibility delay, held until the clock reaches `due`.
#[derive(Debug, Clone, PartialEq)]
pub struct HeldMessage {
    pub queue: String,
    /// As put (base64, as the host expects).
    pub text: String,
    pub due: OffsetDateTime,
}

impl HeldMessage {
    /// Its text as the host decodes it for the function.
    pub fn decoded(&self) -> String {
        let bytes = tablescan::storage::MessageEncoding::Base64.decode(&self.text);
        String::from_utf8(bytes.unwrap()).unwrap()
    }
}

/// The app's queues (Azurite's), with the visibility delays of its puts kept on the app's
/// clock, as the host's queue would keep them. On the system's clock ([`HostQueues::service`])
/// a delayed put goes to Azurite with its delay: the service hides the message, in real time.
/// On a test's clock ([`HostQueues::on_clock`]) it is held here, due at the clock's time plus
/// its delay, and [`HostQueues::release_due`] puts it on Azurite visible at once when the
/// clock has reached that time: "a day later" is a test that moves the clock a day.
/// Everything else (puts without delay, receives, deletes) goes to Azurite as it is.
#[derive(Clone)]
pub struct HostQueues {
    inner: AzureQueueStore,
    /// The clock and the held messages; `None`: delays are the service's.
    held: Option<(Clock, Arc<Mutex<Vec<HeldMessage>>>)>,
}

impl HostQueues {
    /// Delays kept by the service (real time).
    pub fn service(inner: AzureQueueStore) -> Self {
        HostQueues { inner, held: None }
    }

    /// Delays kept on `clock`.
    pub fn on_clock(inner: AzureQueueStore, clock: Clock) -> Self {
        HostQueues {
            inner,
            held: Some((clock, Arc::default())),
        }
    }

    fn list(&self) -> &Mutex<Vec<HeldMessage>> {
        &self.held.as_ref().expect("delays kept on a clock").1
    }

    /// The messages held, soonest due first.
    pub fn held(&self) -> Vec<HeldMessage> {
        let mut held = self.list().lock().unwrap().clone();
        held.sort_by_key(|m| m.due);
        held
    }

    /// When the next held message is due (`None`: none is held).
    pub fn next_due(&self) -> Option<OffsetDateTime> {
        self.held().first().map(|m| m.due)
    }

    /// Puts every held message that is due by the clock's time on its queue, visible at once,
    /// soonest due first; how many.
    pub async fn release_due(&self) -> usize {
        let now = self.held.as_ref().expect("delays kept on a clock").0.now();
        let due: Vec<HeldMessage> = {
            let mut held = self.list().lock().unwrap();
            let (due, later) = held.drain(..).partition(|m| m.due <= now);
            *held = later;
            due
        };
        let mut due = due;
        due.sort_by_key(|m| m.due);
        for m in &due {
            self.inner
                .put_message(&m.queue, &m.text, Duration::ZERO)
                .await
                .unwrap();
        }
        due.len()
    }
}

impl QueueStore for HostQueues {
    async fn create_queue(&self, queue: &str) -> StorageResult<()> {
        self.inner.create_queue(queue).await
    }
    async fn delete_queue(&self, queue: &str) -> StorageResult<bool> {
        self.inner.delete_queue(queue).await
    }
    async fn put_message(&self, queue: &str, text: &str, delay: Duration) -> StorageResult<()> {
        let Some((clock, held)) = self.held.as_ref().filter(|_| !delay.is_zero()) else {
            return self.inner.put_message(queue, text, delay).await;
        };
        // As the service: a put to a missing queue fails (the app then creates it).
        self.inner.approximate_count(queue).await?;
        held.lock().unwrap().push(HeldMessage {
            queue: queue.to_string(),
            text: text.to_string(),
            due: clock.now() + delay,
        });
        Ok(())
    }
    async fn put_message_never_expiring(&self, queue: &str, text: &str) -> StorageResult<()> {
        self.inner.put_message_never_expiring(queue, text).await
    }
    async fn get_messages(
        &self,
        queue: &str,
        max: u8,
        visibility: Duration,
    ) -> StorageResult<Vec<ReceivedMessage>> {
        self.inner.get_messages(queue, max, visibility).await
    }
    async fn delete_message(&self, queue: &str, id: &str, pop_receipt: &str) -> StorageResult<()> {
        self.inner.delete_message(queue, id, pop_receipt).await
    }
    async fn update_message(
        &self,
        queue: &str,
        id: &str,
        pop: &str,
        visibility: Duration,
        text: Option<&str>,
    ) -> StorageResult<String> {
        self.inner
            .update_message(queue, id, pop, visibility, text)
            .await
    }
    async fn approximate_count(&self, queue: &str) -> StorageResult<u64> {
        self.inner.approximate_count(queue).await
    }
}
