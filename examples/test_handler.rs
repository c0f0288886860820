//! A tiny custom handler for testing `tablescan host` (not tablescan's handler).
//!
//! Environment:
//! - `FUNCTIONS_CUSTOMHANDLER_PORT` (required): port to listen on (127.0.0.1);
//! - `TEST_HANDLER_LOG`: file to append one JSON line per event: `start` (at start-up),
//!   `listening` (just before it serves), `request` (each request as it came), `done` (a payload
//!   invocation that answered, with its invocation id and status);
//! - `TEST_HANDLER_LISTEN_WHEN`: a file; the handler listens only once it exists (readiness
//!   tests: the test decides when the handler becomes ready);
//! - `TEST_HANDLER_EXIT_AT_START`: exit with this code right away (give-up tests).
//!
//! Payload-mode requests (`POST /{Function}` with a Data/Metadata envelope) are steered by the
//! trigger value, a JSON object with optional fields: `fail_until` (answer 500 while
//! DequeueCount < n), `crash_until` (exit while DequeueCount < n), `hang_until` (never answer while
//! DequeueCount < n), `hold` (a file: answer only once it exists, so the test decides when an
//! invocation ends, in any handler process), `status`, `raw` + `content_type` (answer that body),
//! `empty` (answer 200 with no body), `logs`, `outputs`, `return_value`. Other fields (a name, a
//! number) only tell invocations apart in the records. Nothing here sleeps for a set time: a
//! test that needs an invocation in flight holds it on a gate.
//! Any other request is echoed as JSON (method, path, query, headers, body), with the status
//! taken from an `x-test-status` header. `GET /stats` reports invocations in flight.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{to_bytes, Body};
use axum::extract::{Request, State};
use axum::response::Response;
use serde_json::{json, Value};

struct Handler {
    log: Option<Mutex<std::fs::File>>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

impl Handler {
    fn record(&self, line: Value) {
        if let Some(f) = &self.log {
            let mut text = line.to_string();
            text.push('\n');
            // One write per line: O_APPEND keeps lines from several processes whole.
            let _ = f.lock().unwrap().write_all(text.as_bytes());
        }
    }
}

fn respond(status: u16, content_type: Option<&str>, body: impl Into<Body>) -> Response {
    let mut r = Response::builder().status(status);
    if let Some(ct) = content_type {
        r = r.header("content-type", ct);
    }
    r.body(body.into()).unwrap()
}

/// The trigger value as commands: Data's first entry, un-double-encoded, or an HTTP body.
fn commands(envelope: &Value) -> Value {
    let Some(first) = envelope["Data"].as_object().and_then(|d| d.values().next()) else {
        return json!({});
    };
    let text = match first {
        Value::String(s) => serde_json::from_str::<String>(s).unwrap_or_else(|_| s.clone()),
        Value::Object(req) => req
            .get("Body")
            .and_then(Value::as_str)
            .unwrap_or("{}")
            .to_string(),
        _ => return json!({}),
    };
    serde_json::from_str::<Value>(&text)
        .ok()
        .filter(Value::is_object)
        .unwrap_or(json!({}))
}

async fn handle(State(h): State<Arc<Handler>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let body = to_bytes(body, 64 * 1024 * 1024).await.unwrap_or_default();
    let path = parts.uri.path().to_string();
    if parts.method == "GET" && path == "/" {
        return respond(200, Some("text/plain"), "ready");
    }
    if parts.method == "GET" && path == "/stats" {
        let stats = json!({
            "pid": std::process::id(),
            "in_flight": h.in_flight.load(Ordering::SeqCst),
            "max_in_flight": h.max_in_flight.load(Ordering::SeqCst),
        });
        return respond(200, Some("application/json"), stats.to_string());
    }
    let headers: Vec<Value> = parts
        .headers
        .iter()
        .map(|(k, v)| json!([k.as_str(), String::from_utf8_lossy(v.as_bytes())]))
        .collect();
    let text = String::from_utf8_lossy(&body).into_owned();
    h.record(json!({
        "event": "request",
        "pid": std::process::id(),
        "method": parts.method.as_str(),
        "path": path,
        "query": parts.uri.query(),
        "headers": headers,
        "body": text,
    }));
    let envelope: Option<Value> = serde_json::from_slice(&body)
        .ok()
        .filter(|v: &Value| v.get("Data").is_some() && v.get("Metadata").is_some());
    let Some(envelope) = envelope.filter(|_| parts.method == "POST") else {
        let status = parts
            .headers
            .get("x-test-status")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(200);
        let echo = json!({
            "method": parts.method.as_str(),
            "path": path,
            "query": parts.uri.query(),
            "headers": headers,
            "body": text,
        });
        let mut r = respond(status, Some("application/json"), echo.to_string());
        r.headers_mut().insert("x-test-echo", "1".parse().unwrap());
        return r;
    };

    let now = h.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    h.max_in_flight.fetch_max(now, Ordering::SeqCst);
    let response = invoke(&envelope).await;
    h.in_flight.fetch_sub(1, Ordering::SeqCst);
    // Recorded before the answer leaves: an invocation without `done` never answered.
    let invocation = parts
        .headers
        .get("x-azure-functions-invocationid")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    h.record(json!({
        "event": "done",
        "pid": std::process::id(),
        "invocation": invocation,
        "status": response.status().as_u16(),
    }));
    response
}

/// Waits until `path` exists (checked every 10 ms).
async fn until_exists(path: &str) {
    while !Path::new(path).exists() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn invoke(envelope: &Value) -> Response {
    let cmd = commands(envelope);
    let dequeue_count: u64 = envelope["Metadata"]["DequeueCount"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let below = |key: &str| {
        cmd.get(key)
            .and_then(Value::as_u64)
            .is_some_and(|n| dequeue_count < n)
    };
    if below("crash_until") {
        eprintln!("test handler: crashing on purpose (DequeueCount {dequeue_count})");
        std::process::exit(3);
    }
    if below("hang_until") {
        std::future::pending::<()>().await;
    }
    if let Some(gate) = cmd.get("hold").and_then(Value::as_str) {
        until_exists(gate).await;
    }
    if below("fail_until") {
        return respond(
            500,
            Some("application/json"),
            r#"{"error":"failing on purpose"}"#,
        );
    }
    if cmd.get("empty").and_then(Value::as_bool) == Some(true) {
        return respond(200, None, Body::empty());
    }
    if let Some(raw) = cmd.get("raw").and_then(Value::as_str) {
        let ct = cmd.get("content_type").and_then(Value::as_str);
        let status = cmd.get("status").and_then(Value::as_u64).unwrap_or(200) as u16;
        return respond(status, ct, raw.to_string());
    }
    let status = cmd.get("status").and_then(Value::as_u64).unwrap_or(200) as u16;
    let logs = cmd
        .get("logs")
        .cloned()
        .unwrap_or_else(|| json!([format!("handled {}", envelope["Metadata"]["Id"])]));
    let result = json!({
        "Outputs": cmd.get("outputs").cloned().unwrap_or(json!({})),
        "Logs": logs,
        "ReturnValue": cmd.get("return_value").cloned().unwrap_or(Value::Null),
    });
    respond(status, Some("application/json"), result.to_string())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if let Some(code) = std::env::var("TEST_HANDLER_EXIT_AT_START")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        eprintln!("test handler: exiting at start with code {code}");
        std::process::exit(code);
    }
    let port: u16 = std::env::var("FUNCTIONS_CUSTOMHANDLER_PORT")
        .expect("FUNCTIONS_CUSTOMHANDLER_PORT is set by the host")
        .parse()
        .expect("port number");
    let log = std::env::var("TEST_HANDLER_LOG").ok().map(|p| {
        Mutex::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .expect("open TEST_HANDLER_LOG"),
        )
    });
    let handler = Arc::new(Handler {
        log,
        in_flight: AtomicUsize::new(0),
        max_in_flight: AtomicUsize::new(0),
    });
    let env: serde_json::Map<String, Value> = std::env::vars()
        .filter(|(k, _)| k.starts_with("FUNCTIONS_") || k.starts_with("TEST_"))
        .map(|(k, v)| (k, Value::String(v)))
        .collect();
    handler.record(json!({
        "event": "start",
        "pid": std::process::id(),
        "args": std::env::args().skip(1).collect::<Vec<_>>(),
        "cwd": std::env::current_dir().map(|d| d.display().to_string()).unwrap_or_default(),
        "env": env,
    }));
    if let Ok(gate) = std::env::var("TEST_HANDLER_LISTEN_WHEN") {
        until_exists(&gate).await;
    }
    println!("test handler listening on 127.0.0.1:{port}");
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("bind");
    handler.record(json!({ "event": "listening", "pid": std::process::id() }));
    let app = axum::Router::new().fallback(handle).with_state(handler);
    axum::serve(listener, app).await.expect("serve");
}
