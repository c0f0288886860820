//! End-to-end harness: the real `tablescan` binary staged as a function app, run by the local
//! Functions host (`tablescan::lab::host`), on the shared Azurite, with unique queue and table names.

use std::time::{Duration, Instant};

use serde_json::Value;
use tablescan::lab::host::{Host, HostConfig, RunningHost};
use tablescan::scan::{list, ScanParameters, Strategy};
use tablescan::storage::azure_table::AzureTableStore;
use tablescan::storage::{Entity, QueueStore, TableStore};

use super::{queue_store, table_store, unique_name};

/// Unique names for one test's app.
#[derive(Debug, Clone)]
pub struct Names {
    pub prefix_queue: String,
    pub copy_queue: String,
    pub scans_table: String,
    pub work_table: String,
}

pub struct TestApp {
    pub host: Option<RunningHost>,
    pub base: String,
    pub client: reqwest::Client,
    pub store: AzureTableStore,
    pub names: Names,
    pub dir: tempfile::TempDir,
    /// The host's configuration, to start it again ([`TestApp::redeploy`]).
    pub config: HostConfig,
}

/// Makes the staged host.json fast for tests: quick polling, immediate retry of failed messages.
fn tune_host_json(dir: &std::path::Path, function_timeout: &str) {
    let path = dir.join("host.json");
    let mut host: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let queues = &mut host["extensions"]["queues"];
    queues["maxPollingInterval"] = "00:00:00.200".into();
    queues["visibilityTimeout"] = "00:00:00".into();
    host["functionTimeout"] = function_timeout.into();
    std::fs::write(&path, serde_json::to_string_pretty(&host).unwrap()).unwrap();
}

/// The handler binary the tests stage: the one in `TABLESCAN_TEST_BIN` if set (a copy kept apart
/// from a target directory other checkouts build into: there `target/debug/tablescan` is the last
/// one built), else Cargo's. Every test that stages the app reads it here.
pub fn handler_binary() -> std::path::PathBuf {
    std::env::var_os("TABLESCAN_TEST_BIN")
        .map(Into::into)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_tablescan").into())
}

/// The app staged in a new folder from [`handler_binary`], with quick polling, no queue
/// visibility timeout and host.json's `functionTimeout` set to `function_timeout`.
pub fn staged(function_timeout: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    tablescan::deploy::stage::stage(dir.path(), &handler_binary()).expect("stage");
    tune_host_json(dir.path(), function_timeout);
    dir
}

impl TestApp {
    /// Stages the app, starts `instances` host instances with `settings` added.
    pub async fn start(instances: usize, settings: &[(&str, &str)]) -> TestApp {
        let connection = super::azurite().connection_string();
        Self::start_on(
            instances,
            &[("AzureWebJobsStorage", connection.as_str())],
            table_store().0,
            settings,
        )
        .await
    }

    /// [`TestApp::start`] with the app's storage reached through `proxy` when there is one (a
    /// fault run), straight otherwise.
    pub async fn start_through(
        instances: usize,
        proxy: Option<&tablescan::lab::proxy::StorageProxy>,
    ) -> TestApp {
        let connection = proxy.map(|p| p.connection_string());
        let settings: Vec<(&str, &str)> = connection
            .iter()
            .map(|c| ("AzureWebJobsStorage", c.as_str()))
            .collect();
        Self::start(instances, &settings).await
    }

    /// [`TestApp::start`] with the app's own storage given as `storage` settings (a connection
    /// string, or identity-based `AzureWebJobsStorage__*`), and `store` to seed and read tables.
    pub async fn start_on(
        instances: usize,
        storage: &[(&str, &str)],
        store: AzureTableStore,
        settings: &[(&str, &str)],
    ) -> TestApp {
        TestApp::start_in(staged("00:01:00"), instances, storage, store, settings).await
    }

    /// Stages the handler ([`handler_binary`]) with host.json's queue `visibilityTimeout`,
    /// `maxDequeueCount` (and the handler's `TABLESCAN_MAX_DEQUEUE_COUNT`) and `functionTimeout`
    /// set, quick polling, and starts `instances` host instances on the app storage `storage` with
    /// `settings` added.
    pub async fn start_tuned(
        instances: usize,
        storage: &str,
        host: (u64, &str, &str),
        settings: &[(&str, &str)],
    ) -> TestApp {
        Self::start_tuned_with(instances, storage, host, settings, |_| {}).await
    }

    /// [`TestApp::start_tuned`] with the local host's own configuration changed by `tweak` (a
    /// shorter receive visibility, say).
    pub async fn start_tuned_with(
        instances: usize,
        storage: &str,
        (max_dequeue_count, visibility_timeout, function_timeout): (u64, &str, &str),
        settings: &[(&str, &str)],
        tweak: impl FnOnce(&mut HostConfig),
    ) -> TestApp {
        let dir = staged(function_timeout);
        let path = dir.path().join("host.json");
        let mut host: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        host["extensions"]["queues"]["visibilityTimeout"] = visibility_timeout.into();
        host["extensions"]["queues"]["maxDequeueCount"] = max_dequeue_count.into();
        std::fs::write(&path, serde_json::to_string_pretty(&host).unwrap()).unwrap();
        let max = max_dequeue_count.to_string();
        let mut all = vec![("TABLESCAN_MAX_DEQUEUE_COUNT", max.as_str())];
        all.extend_from_slice(settings);
        let storage = [("AzureWebJobsStorage", storage)];
        TestApp::start_in_with(dir, instances, &storage, table_store().0, &all, tweak).await
    }

    /// Starts `instances` host instances on an app already in `dir` (staged, or a package
    /// unzipped), on the app storage `storage` (see [`TestApp::start_on`]) with `settings` added.
    /// `dir` is used as it is.
    pub async fn start_in(
        dir: tempfile::TempDir,
        instances: usize,
        storage: &[(&str, &str)],
        store: AzureTableStore,
        settings: &[(&str, &str)],
    ) -> TestApp {
        Self::start_in_with(dir, instances, storage, store, settings, |_| {}).await
    }

    /// [`TestApp::start_in`] with the local host's configuration changed by `tweak` last.
    async fn start_in_with(
        dir: tempfile::TempDir,
        instances: usize,
        storage: &[(&str, &str)],
        store: AzureTableStore,
        settings: &[(&str, &str)],
        tweak: impl FnOnce(&mut HostConfig),
    ) -> TestApp {
        let names = Names {
            prefix_queue: unique_name("ps"),
            copy_queue: unique_name("tc"),
            scans_table: unique_name("Scans"),
            work_table: unique_name("Work"),
        };
        let mut config = HostConfig::new(dir.path());
        config.listen = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        config.instances = instances;
        config.inherit_env = true;
        config.capture_logs = true;
        let mut all = storage.to_vec();
        all.extend([
            ("TABLESCAN_PREFIXSCAN_QUEUE", names.prefix_queue.as_str()),
            ("TABLESCAN_TABLECOPY_QUEUE", names.copy_queue.as_str()),
            ("TABLESCAN_SCANS_TABLE", names.scans_table.as_str()),
            ("TABLESCAN_WORK_TABLE", names.work_table.as_str()),
            ("TABLESCAN_COUNTER_SHARDS", "4"),
            ("RUST_LOG", "warn"),
        ]);
        all.extend_from_slice(settings);
        for (k, v) in all {
            config.settings.insert(k.to_string(), v.to_string());
        }
        tweak(&mut config);
        let host = start_host(config.clone()).await;
        host.wait_ready(Duration::from_secs(60))
            .await
            .expect("handler ready");
        let base = format!("http://{}", host.http_addr());
        TestApp {
            host: Some(host),
            base,
            client: reqwest::Client::new(),
            store,
            names,
            dir,
            config,
        }
    }

    /// A redeployment of the same version: stops the running host (no new work is taken,
    /// invocations in flight finish, the handlers stop), then starts a new one, with new
    /// handler processes, on the same app, storage, queues and tables.
    pub async fn redeploy(&mut self) {
        if let Some(host) = self.host.take() {
            host.shutdown().await;
        }
        let host = start_host(self.config.clone()).await;
        host.wait_ready(Duration::from_secs(60))
            .await
            .expect("handler ready");
        self.base = format!("http://{}", host.http_addr());
        self.host = Some(host);
    }

    pub fn host(&self) -> &RunningHost {
        self.host.as_ref().expect("host running")
    }

    pub async fn post_scan(&self, body: &Value) -> (u16, Value, Option<String>) {
        let response = self.post("/api/scans", body).await;
        let status = response.status().as_u16();
        let location = response
            .headers()
            .get("location")
            .map(|v| v.to_str().unwrap().to_string());
        (status, response.json().await.unwrap(), location)
    }

    /// Starts a scan that must be accepted (202); its id.
    pub async fn start_scan(&self, body: &Value) -> String {
        let (status, reply, _) = self.post_scan(body).await;
        assert_eq!(status, 202, "{body} → {reply}");
        reply["id"].as_str().unwrap().to_string()
    }

    /// Starts a scan that must be accepted (202) and waits until it ends (or panics after
    /// `timeout`); its id and its final status.
    pub async fn scan_until_end(&self, body: &Value, timeout: Duration) -> (String, Value) {
        let id = self.start_scan(body).await;
        let end = self.wait_for_end(&id, timeout).await;
        (id, end)
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.send(reqwest::Method::GET, path).await
    }

    pub async fn delete(&self, path: &str) -> (u16, Value) {
        self.send(reqwest::Method::DELETE, path).await
    }

    /// `POST path` with the JSON `body`; the answer as it came.
    pub async fn post(&self, path: &str, body: &Value) -> reqwest::Response {
        let url = format!("{}{path}", self.base);
        self.client.post(url).json(body).send().await.unwrap()
    }

    /// `method path` with no body; the status and the JSON body.
    async fn send(&self, method: reqwest::Method, path: &str) -> (u16, Value) {
        let response = self
            .client
            .request(method, format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.json().await.unwrap())
    }

    /// Polls a scan until it leaves `running` (or panics after `timeout`).
    pub async fn wait_for_end(&self, id: &str, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let (status, body) = self.get(&format!("/api/scans/{id}")).await;
            assert_eq!(status, 200, "{body}");
            // A failing work item fails its scan first and is counted right after (see
            // `work::poison`), so a failed scan's status is final once its failure is counted.
            let counted = body["state"] != "failed" || body["failedWorkItems"].as_i64() > Some(0);
            if body["state"] != "running" && counted {
                return body;
            }
            if Instant::now() > deadline {
                let logs = self.host().log_lines();
                let tail = logs[logs.len().saturating_sub(40)..].join("\n");
                panic!("scan {id} still running after {timeout:?}: {body}\n--- host log tail ---\n{tail}");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Approximate message count of every queue of the app, poison queues included.
    pub async fn queued_messages(&self) -> u64 {
        let queues = queue_store().0;
        let mut total = 0;
        for q in [&self.names.prefix_queue, &self.names.copy_queue] {
            for name in [q.clone(), format!("{q}-poison")] {
                total += queues.approximate_count(&name).await.unwrap_or(0);
            }
        }
        total
    }

    pub async fn shutdown(mut self) {
        if let Some(host) = self.host.take() {
            host.shutdown().await;
        }
    }
}

/// Starts the local host with `config`, its queue bindings on the storage their connections name.
async fn start_host(config: HostConfig) -> RunningHost {
    Host::start(config, |connection| {
        Ok(
            tablescan::storage::connection::StorageAccount::new(connection.clone()).queue_store(
                std::sync::Arc::new(tablescan::storage::request_counts::RequestCounters::new()),
            ),
        )
    })
    .await
    .expect("host starts")
}

/// Every row of a table in key order.
pub async fn rows(store: &AzureTableStore, table: &str) -> Vec<Entity> {
    let mut all = Vec::new();
    list(
        store,
        table,
        &ScanParameters::default(),
        Strategy::Serial,
        |segment| {
            all.extend(segment);
            Ok(())
        },
    )
    .await
    .expect("read table");
    all
}

/// Seeds `table` with `entities` (any order) in same-partition batches.
pub async fn seed(store: &AzureTableStore, table: &str, entities: Vec<Entity>) {
    store.create_table(table).await.unwrap();
    let mut sorted = entities;
    sorted.sort_by(|a, b| {
        tablescan::storage::compare_keys(&a.partition_key, &b.partition_key)
            .then(tablescan::storage::compare_keys(&a.row_key, &b.row_key))
    });
    for (pk, ops) in tablescan::app::drivers::kit::range::batches(sorted) {
        store.submit_batch(table, &pk, &ops).await.unwrap();
    }
}
