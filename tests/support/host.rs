//! Shared helpers for the local host's tests (`tests/host/`): staging an app folder around the test handler
//! (`examples/test_handler.rs`), starting the host, reading what the handler recorded, gates that
//! hold the handler until the test opens them, and waiting for events.
//!
//! No helper here asserts how long anything took: waits end on an event, and their bound only
//! catches a hang (then they say what they waited for and what they saw last).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tablescan::lab::host::log::HostLog;
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
        // Longer than any test: an instance that gave up stays down unless a test asks otherwise.
        config.recycle_delay = Duration::from_secs(3600);
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

    /// The handler's records of one kind: `start`, `listening`, `request`, `done`.
    pub fn records(&self, event: &str) -> Vec<Value> {
        self.handler_records()
            .into_iter()
            .filter(|r| r["event"] == event)
            .collect()
    }

    pub fn requests(&self) -> Vec<Value> {
        self.records("request")
    }

    /// Invocation ids of the payload invocations the handler answered.
    pub fn done(&self) -> Vec<String> {
        self.records("done")
            .iter()
            .filter_map(|r| r["invocation"].as_str().map(str::to_string))
            .collect()
    }

    /// The port of the handler process `pid` (from its start record).
    pub fn handler_port(&self, pid: u64) -> String {
        let starts = self.records("start");
        let start = starts.iter().find(|r| r["pid"] == pid);
        let port = start.and_then(|r| r["env"]["FUNCTIONS_CUSTOMHANDLER_PORT"].as_str());
        port.unwrap_or_else(|| panic!("no start record of pid {pid}: {starts:?}"))
            .to_string()
    }

    /// A gate: a file the handler waits for (`{"hold": gate}` in a trigger value,
    /// `TEST_HANDLER_LISTEN_WHEN`) until the test opens it with [`open`].
    pub fn gate(&self, name: &str) -> String {
        self.dir.join(format!("gate-{name}")).display().to_string()
    }
}

/// Opens a gate made by [`App::gate`]: the handler waiting on it goes on.
pub fn open(gate: &str) {
    std::fs::write(gate, b"open").unwrap();
}

/// The invocation id the host sent with a recorded request.
pub fn invocation_id(request: &Value) -> &str {
    header(request, "x-azure-functions-invocationid").expect("an invocation id")
}

/// `GET /stats` of the handler process `pid`: invocations in flight and the most at once.
pub async fn handler_stats(app: &App, pid: u64) -> Value {
    let url = format!("http://127.0.0.1:{}/stats", app.handler_port(pid));
    let response = http_client().get(url).send().await.unwrap();
    serde_json::from_slice(&response.bytes().await.unwrap()).unwrap()
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

/// Polls `check` every 50 ms until it returns `Ok`. `bound` only catches a hang: past it, panics
/// with `what` it waited for and what `check` saw last (its last `Err`).
pub async fn wait_for<T, S, F, Fut>(what: &str, bound: Duration, mut check: F) -> T
where
    S: Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, S>>,
{
    let start = Instant::now();
    loop {
        let seen = match check().await {
            Ok(v) => return v,
            Err(seen) => seen,
        };
        if start.elapsed() > bound {
            panic!("no {what} after {bound:?} (a hang); last seen: {seen:#?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (hang bound `bound`) for a line of `log` containing `needle`; the line.
pub async fn wait_log(log: &HostLog, needle: &str, bound: Duration) -> String {
    wait_for(&format!("log line with {needle:?}"), bound, || {
        let lines = log.lines();
        let found = lines.iter().find(|l| l.contains(needle)).cloned();
        async move { found.ok_or(lines) }
    })
    .await
}

/// Index of the first of `lines` containing `needle`; panics (with the lines) if none does.
pub fn line_index(lines: &[String], needle: &str) -> usize {
    lines
        .iter()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle:?} in {lines:#?}"))
}

/// Asserts that a line with `first` comes before any line with `then` (both present).
pub fn assert_order(lines: &[String], first: &str, then: &str) {
    assert!(
        line_index(lines, first) < line_index(lines, then),
        "{first:?} should come before {then:?}: {lines:#?}"
    );
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

/// A `function.json` with an HTTP trigger on `route` for `methods` and an `http` output.
pub fn http_function(route: &str, methods: Value) -> Value {
    json!({ "bindings": [
        { "name": "req", "type": "httpTrigger", "direction": "in", "authLevel": "function", "route": route, "methods": methods },
        { "name": "res", "type": "http", "direction": "out" }
    ]})
}
