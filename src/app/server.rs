//! The custom handler's HTTP server: routes for every function in the catalog, the host's
//! readiness probe (`GET /`), JSON errors for everything else, graceful shutdown.

use std::future::Future;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use tokio::net::TcpListener;

use crate::storage::{QueueStore, TableStore};

use super::error::ApiError;
use super::functions::{
    cancel_scan, get_scan, list_scans, poisoned, prefix_scan, start_scan, table_copy,
};
use super::messages::{CopyMessage, StepMessage};
use super::state::AppState;

/// Queue payloads: a ≤ 64 KiB message, JSON-escaped twice by the host, plus metadata.
const MAX_INVOCATION_BODY: usize = 1024 * 1024;

/// The handler's router. Tests call it in-process with `oneshot`.
pub fn app<T: TableStore + Clone, Q: QueueStore + Clone>(state: Arc<AppState<T, Q>>) -> Router {
    Router::new()
        .route("/", get(ready))
        .route(
            "/api/scans",
            post(start_scan::handle::<T, Q>).get(list_scans::handle::<T, Q>),
        )
        .route(
            "/api/scans/{id}",
            get(get_scan::handle::<T, Q>).delete(cancel_scan::handle::<T, Q>),
        )
        .route("/PrefixScan", post(prefix_scan::handle::<T, Q>))
        .route("/TableCopy", post(table_copy::handle::<T, Q>))
        .route(
            "/PrefixScanPoison",
            post(poisoned::handle::<StepMessage, T, Q>),
        )
        .route(
            "/TableCopyPoison",
            post(poisoned::handle::<CopyMessage, T, Q>),
        )
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_INVOCATION_BODY))
        .with_state(state)
}

/// The host polls `GET /` until it gets any answer; answer at once.
async fn ready() -> Json<serde_json::Value> {
    Json(json!({ "status": "ready" }))
}

async fn method_not_allowed(request: Request) -> Response {
    ApiError::MethodNotAllowed {
        method: request.method().to_string(),
        path: request.uri().path().to_string(),
    }
    .into_response()
}

async fn not_found(request: Request) -> Response {
    let body = json!({ "error": { "code": "NotFound", "message": format!("no function at {}", request.uri().path()) } });
    (StatusCode::NOT_FOUND, Json(body)).into_response()
}

/// Serves `app` on `listener` until `shutdown` resolves, then lets requests in flight finish.
pub async fn run<T: TableStore + Clone, Q: QueueStore + Clone>(
    listener: TcpListener,
    state: Arc<AppState<T, Q>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, app(state))
        .with_graceful_shutdown(shutdown)
        .await
}
