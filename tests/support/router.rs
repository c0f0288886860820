//! Calling the app's router in-process, as the Functions host would over HTTP.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

use tablescan::app::server::app;
use tablescan::app::state::AppState;
use tablescan::storage::{QueueStore, TableStore};

/// Sends `method uri` (with a JSON `body`, if any) to the app; its status and JSON body.
pub async fn call<T: TableStore + Clone, Q: QueueStore + Clone>(
    state: &Arc<AppState<T, Q>>,
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
