//! The scan API as both commands reach it: the app's own router called in this process
//! (`tablescan run`: no HTTP, no socket) or a deployed app over HTTPS (`tablescan scan`). Both
//! answer with the status code and JSON body the API defines, so starting, reading, cancelling
//! and listing scans, and turning refusals into exit codes, are written once ([`Api`]).
//!
//! Invariants: a 4xx answer is a refusal (exit 2, its field named as a flag), anything else
//! that is not a success is a failure (exit 1); the function key is sent only as the
//! `x-functions-key` header and never printed.

use std::future::Future;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Method, Request};
use serde_json::{Map, Value};
use tower::ServiceExt;

use super::flags::flag_message;
use super::Exit;
use crate::app::state::AppState;
use crate::storage::stores::Stores;

/// Largest answer read (a list page is the biggest: tens of KiB).
const MAX_ANSWER: usize = 16 * 1024 * 1024;

/// What went wrong, and the exit code it means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub exit: Exit,
    pub message: String,
}

impl Refusal {
    pub fn failed(message: impl Into<String>) -> Self {
        Refusal {
            exit: Exit::Failed,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Refusal {
            exit: Exit::Invalid,
            message: message.into(),
        }
    }
}

/// Where the scan API is: `call` sends one request and returns the status and the JSON body.
pub trait Api: Send + Sync {
    fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> impl Future<Output = Result<(u16, Value), String>> + Send;
}

/// The app's router in this process.
pub struct Local {
    router: axum::Router,
}

impl Local {
    pub fn new<S: Stores>(state: Arc<AppState<S>>) -> Self {
        Local {
            router: crate::app::server::app(state),
        }
    }

    /// One request through the router, as the Functions host would forward it.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, String)],
        body: Vec<u8>,
    ) -> Result<(u16, Vec<u8>), String> {
        let mut request = Request::builder().method(method).uri(path);
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        let request = request.body(Body::from(body)).map_err(|e| e.to_string())?;
        let response = match self.router.clone().oneshot(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        };
        let status = response.status().as_u16();
        let bytes = axum::body::to_bytes(response.into_body(), MAX_ANSWER)
            .await
            .map_err(|e| format!("reading the app's answer: {e}"))?;
        Ok((status, bytes.to_vec()))
    }
}

impl Api for Local {
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<(u16, Value), String> {
        let json = [(
            header::CONTENT_TYPE.as_str(),
            "application/json".to_string(),
        )];
        let bytes = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
        let (status, answer) = self.send(method, path, &json, bytes).await?;
        Ok((status, parse_answer(&answer)))
    }
}

/// A deployed app (or `tablescan host`, or `func start`) over HTTP(S).
pub struct Remote {
    client: reqwest::Client,
    base: String,
    key: Option<String>,
}

impl Remote {
    /// `app` is the app's URL (`https://APP.azurewebsites.net`, `http://localhost:7071`).
    pub fn new(app: &str, key: Option<String>) -> Result<Self, Refusal> {
        let base = app.trim_end_matches('/').to_string();
        let parsed = reqwest::Url::parse(&base)
            .map_err(|e| Refusal::invalid(format!("--app: {app:?} is not a URL: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(Refusal::invalid(format!("--app: {app:?} is not http(s)")));
        }
        let client = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(60))
            .build()
            .map_err(|e| Refusal::failed(format!("HTTP client: {e}")))?;
        Ok(Remote { client, base, key })
    }
}

impl Api for Remote {
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<(u16, Value), String> {
        let method =
            reqwest::Method::from_bytes(method.as_str().as_bytes()).map_err(|e| e.to_string())?;
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        if let Some(key) = &self.key {
            request = request.header("x-functions-key", key);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.map_err(|e| {
            // reqwest's message names the URL, never the key (it is a header).
            format!("{} {path}: {e}", self.base)
        })?;
        let status = response.status().as_u16();
        let bytes = response.bytes().await.map_err(|e| e.to_string())?;
        Ok((status, parse_answer(&bytes)))
    }
}

fn parse_answer(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| Value::from(String::from_utf8_lossy(bytes).into_owned()))
}

/// A refusal from an answer that is not a success: 4xx are invalid requests (their field named
/// as a flag), the rest failures.
fn refusal(status: u16, answer: &Value) -> Refusal {
    let error = answer.get("error");
    let field = error.and_then(|e| e.get("field")).and_then(Value::as_str);
    let message = error
        .and_then(|e| e.get("message"))
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| answer.to_string());
    let message = flag_message(field, &message);
    match status {
        400..=499 => Refusal::invalid(message),
        _ => Refusal::failed(format!("HTTP {status}: {message}")),
    }
}

async fn expect<A: Api>(
    api: &A,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> Result<Value, Refusal> {
    let (status, answer) = api
        .call(method, path, body)
        .await
        .map_err(Refusal::failed)?;
    match status {
        200..=299 => Ok(answer),
        _ => Err(refusal(status, &answer)),
    }
}

/// Starts a scan; its status as `POST /api/scans` answers it.
pub async fn start<A: Api>(api: &A, body: Map<String, Value>) -> Result<Value, Refusal> {
    expect(api, Method::POST, "/api/scans", Some(Value::Object(body))).await
}

/// A scan's status, as `GET /api/scans/{id}` answers it.
pub async fn status<A: Api>(api: &A, id: &str) -> Result<Value, Refusal> {
    expect(
        api,
        Method::GET,
        &format!("/api/scans/{}", encode(id)),
        None,
    )
    .await
}

/// Cancels a scan; its status after the cancel.
pub async fn cancel<A: Api>(api: &A, id: &str) -> Result<Value, Refusal> {
    expect(
        api,
        Method::DELETE,
        &format!("/api/scans/{}", encode(id)),
        None,
    )
    .await
}

/// One page of `GET /api/scans`.
pub async fn list<A: Api>(api: &A, query: &str) -> Result<Value, Refusal> {
    expect(api, Method::GET, &format!("/api/scans{query}"), None).await
}

/// A scan id in a path: ids are digits, letters and `-`; anything else is percent-encoded so
/// that the API, not the path, refuses it.
fn encode(id: &str) -> String {
    id.bytes()
        .map(|b| match b {
            b'0'..=b'9' | b'a'..=b'z' | b'A'..=b'Z' | b'-' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
