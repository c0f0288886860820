//! Shared helpers for the local host's tests (`tests/host/`): staging an app folder around the test handler
//! (`examples/test_handler.rs`), starting the host, and waiting for conditions.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tablescan::lab::host::{Host, HostConfig, HostError, NoStorage, RunningHost};

/// The test handler binary: the one in `TABLESCAN_TEST_HANDLER` if set (a copy kept apart from a
/// target directory other checkouts build into), else the one `cargo test` builds next to the
/// test binaries.
pub fn test_handler() -> PathBuf {
    if let Some(path) = std::env::var_os("TABLESCAN_TEST_HANDLER") {
        return path.into();
    }
    let exe = std::env::current_exe().expect("test exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let handler = dir.join("examples").join("test_handler");
    assert!(
        handler.is_file(),
        "{} is missing: run `cargo test` (it builds examples) or `cargo build --example test_handler`",
        handler.display()
    );
    handler
}

/// A staged function app in a fresh temporary folder.
pub struct App {
    pub dir: PathBuf,
    pub handler_log: PathBuf,
    pub settings: BTreeMap<String, String>,
}

impl App {
    /// `host_extra` is merged into host.json at the top level (e.g. functionTimeout, extensions).
    pub fn new(host_extra: Value, custom_handler_extra: Value) -> App {
        let dir =
            std::env::temp_dir().join(format!("tablescan-host-test-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut custom = json!({ "description": { "defaultExecutablePath": test_handler().display().to_string() } });
        merge(&mut custom, custom_handler_extra);
        let mut host = json!({ "version": "2.0", "customHandler": custom });
        merge(&mut host, host_extra);
        std::fs::write(
            dir.join("host.json"),
            serde_json::to_string_pretty(&host).unwrap(),
        )
        .unwrap();
        let handler_log = dir.join("handler-log.jsonl");
        let mut settings = BTreeMap::new();
        settings.insert(
            "TEST_HANDLER_LOG".to_string(),
            handler_log.display().to_string(),
        );
        App {
            dir,
            handler_log,
            settings,
        }
    }

    pub fn function(self, name: &str, function_json: Value) -> App {
        std::fs::create_dir_all(self.dir.join(name)).unwrap();
        std::fs::write(
            self.dir.join(name).join("function.json"),
            function_json.to_string(),
        )
        .unwrap();
        self
    }

    pub fn setting(mut self, key: &str, value: &str) -> App {
        self.settings.insert(key.to_string(), value.to_string());
        self
    }

    pub fn config(&self, instances: usize) -> HostConfig {
        let mut config = HostConfig::new(&self.dir);
        config.listen = SocketAddr::from(([127, 0, 0, 1], 0));
        config.instances = instances;
        config.settings = self.settings.clone();
        config.capture_logs = true;
        config.drain_timeout = Duration::from_secs(20);
        config
    }

    /// Starts an app without queue triggers.
    pub async fn start_http(&self) -> Result<RunningHost, HostError> {
        Host::start::<NoStorage, _>(self.config(1), |_| {
            Err("no storage in this test".to_string())
        })
        .await
    }

    /// Every JSON line the handler(s) recorded so far.
    pub fn handler_records(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.handler_log).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    pub fn requests(&self) -> Vec<Value> {
        self.handler_records()
            .into_iter()
            .filter(|r| r["event"] == "request")
            .collect()
    }
}

impl Drop for App {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn merge(base: &mut Value, extra: Value) {
    if let (Value::Object(b), Value::Object(e)) = (base, extra) {
        for (k, v) in e {
            match b.get_mut(&k) {
                Some(existing) if existing.is_object() && v.is_object() => merge(existing, v),
                _ => {
                    b.insert(k, v);
                }
            }
        }
    }
}

/// Polls `check` every 50 ms until it returns `Some`, or panics after `deadline` with `what`.
pub async fn wait_for<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if start.elapsed() > deadline {
            panic!("timed out after {deadline:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Header value from a recorded request (`headers` is a list of `[name, value]`).
pub fn header<'a>(request: &'a Value, name: &str) -> Option<&'a str> {
    request["headers"]
        .as_array()?
        .iter()
        .find(|h| h[0].as_str() == Some(name))
        .and_then(|h| h[1].as_str())
}

pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// Kills a process with SIGKILL.
pub fn kill_process(pid: u32) {
    let status = std::process::Command::new("kill")
        .arg("-9")
        .arg(pid.to_string())
        .status()
        .expect("kill");
    assert!(status.success(), "kill -9 {pid} failed");
}

pub fn has_log(host: &RunningHost, needle: &str) -> bool {
    host.log_lines().iter().any(|l| l.contains(needle))
}

/// The headers the host puts on every request to the handler: `User-Agent` as the handler must
/// see it (`user_agent`), the host version, and an invocation id that is a UUID (returned).
pub fn assert_host_headers<'a>(request: &'a Value, user_agent: &str) -> &'a str {
    assert_eq!(header(request, "user-agent"), Some(user_agent));
    assert_eq!(
        header(request, "x-azure-functions-hostversion"),
        Some("4.0.0.0")
    );
    let id = header(request, "x-azure-functions-invocationid").unwrap();
    assert!(uuid::Uuid::parse_str(id).is_ok(), "{id}");
    id
}
