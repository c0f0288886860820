//! The custom handler's HTTP server: a route for every function in the catalog, the host's
//! readiness probe (`GET /`), JSON errors for everything else, graceful shutdown.

use std::future::Future;
use std::sync::Arc;

use std::collections::BTreeMap;

use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, on, MethodFilter, MethodRouter};
use axum::{Json, Router};
use serde_json::json;
use tokio::net::TcpListener;

use crate::storage::stores::Stores;

use super::catalog::{Handler, WorkKind, FUNCTIONS};
use super::error::ApiError;
use super::functions::{
    cancel_scan, get_scan, list_scans, lookup, poisoned, scan_cleanup, start_scan,
};
use super::layers;
use super::messages::{ItemMessage, StepMessage};
use super::schedule;
use super::state::AppState;
use super::work;

/// Queue payloads: a ≤ 64 KiB message, JSON-escaped twice by the host, plus metadata.
const MAX_INVOCATION_BODY: usize = 1024 * 1024;

/// The handler's router, built from the function catalog. Tests call it in-process with
/// `oneshot`.
pub fn app<S: Stores>(state: Arc<AppState<S>>) -> Router {
    let mut routes: BTreeMap<String, MethodRouter<Arc<AppState<S>>>> = BTreeMap::new();
    for spec in FUNCTIONS {
        let method =
            Method::from_bytes(spec.method().as_bytes()).expect("catalog methods are valid");
        let filter = MethodFilter::try_from(method).expect("catalog methods are routable");
        let route = route::<S>(spec.handler, filter);
        let merged = match routes.remove(&spec.path()) {
            Some(existing) => existing.merge(route),
            None => route,
        };
        routes.insert(spec.path(), merged);
    }
    let router = routes
        .into_iter()
        .fold(
            Router::new().route("/", get(ready)),
            |router, (path, route)| router.route(&path, route),
        )
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_INVOCATION_BODY));
    layers::apply(router).with_state(state)
}

/// The route of each kind of function for `filter` (the one place a new function is wired in).
fn route<S: Stores>(handler: Handler, filter: MethodFilter) -> MethodRouter<Arc<AppState<S>>> {
    match handler {
        Handler::StartScan => on(filter, start_scan::handle::<S>),
        Handler::ListScans => on(filter, list_scans::handle::<S>),
        Handler::GetScan => on(filter, get_scan::handle::<S>),
        Handler::CancelScan => on(filter, cancel_scan::handle::<S>),
        Handler::Lookup => on(filter, lookup::handle::<S>),
        Handler::Work(WorkKind::Step) => on(filter, work::run::<StepMessage, S>),
        Handler::Work(WorkKind::Copy) => on(filter, work::run::<ItemMessage, S>),
        Handler::Poison(WorkKind::Step) => on(filter, poisoned::handle::<StepMessage, S>),
        Handler::Poison(WorkKind::Copy) => on(filter, poisoned::handle::<ItemMessage, S>),
        Handler::Cleanup => on(filter, scan_cleanup::handle::<S>),
        Handler::PutSchedule => on(filter, schedule::api::put::<S>),
        Handler::ListSchedules => on(filter, schedule::api::list::<S>),
        Handler::GetSchedule => on(filter, schedule::api::get::<S>),
        Handler::DeleteSchedule => on(filter, schedule::api::delete::<S>),
        Handler::Scheduler => on(filter, schedule::fire::handle::<S>),
    }
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
pub async fn run<S: Stores>(
    listener: TcpListener,
    state: Arc<AppState<S>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, app(state))
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(all(test, feature = "lab"))]
mod tests {
    use std::collections::BTreeMap;

    use axum::body::Body;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::*;
    use crate::app::config::Config;
    use crate::lab::memory::{MemoryQueueStore, MemoryStores};
    use crate::lab::memory::{MemoryTableStore, Pagination};

    /// Every catalog function is routed at its path and method (whatever its handler answers to
    /// an empty request, it is not the router's "no function" or "method not allowed").
    #[tokio::test]
    async fn every_catalog_function_is_routed() {
        let config = Config::from_lookup(|k| {
            (k == "AzureWebJobsStorage").then(|| "UseDevelopmentStorage=true".to_string())
        })
        .unwrap();
        let mut tables = BTreeMap::new();
        tables.insert(
            "AzureWebJobsStorage".to_string(),
            MemoryTableStore::new(Pagination::default()),
        );
        let state = AppState::<MemoryStores>::new(
            config,
            tables,
            MemoryQueueStore::new(),
            crate::app::drivers::registry(),
        );
        for spec in FUNCTIONS {
            let path = spec
                .path()
                .replace("{id}", "0000000000000-00000000")
                .replace("{name}", "nightly");
            let request = axum::http::Request::builder()
                .method(spec.method())
                .uri(&path)
                .body(Body::empty())
                .unwrap();
            let response = app(state.clone()).oneshot(request).await.unwrap();
            let status = response.status();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            let text = String::from_utf8_lossy(&body);
            assert!(
                status != StatusCode::METHOD_NOT_ALLOWED && !text.contains("no function at"),
                "{} {} {path} → {status} {text}",
                spec.name,
                spec.method()
            );
        }
    }
}
