//! What every request to the handler goes through, as tower layers (tower-http), outermost
//! first:
//! - a panic in a handler becomes a `500` with the API's JSON error body, which the host logs and,
//!   for a queue trigger, retries — not a reset connection;
//! - headers that carry a credential are marked sensitive before anything can trace them;
//! - one span per request, named `invocation`, with the function's path and the host's
//!   invocation id (its start and end traced at DEBUG, failures too: a failed invocation writes
//!   its own line), so the handler's diagnostics can be matched with the invocation
//!   ([`observe::invocation_span`]);
//! - a request still running at [`INVOCATION_TIMEOUT`] is answered `503` (transient: the
//!   host retries a queue message), before the host's own function timeout would kill it.
//!
//! Invariant: [`INVOCATION_TIMEOUT`] stays below `functionTimeout` in host.json (tested in
//! tests/deploy/function_defs.rs).

use std::any::Any;
use std::time::Duration;

use axum::http::header::{AUTHORIZATION, COOKIE, PROXY_AUTHORIZATION, SET_COOKIE};
use axum::http::{HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::sensitive_headers::SetSensitiveRequestHeadersLayer;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::{DefaultOnFailure, TraceLayer};
use tracing::Level;

use super::error::ApiError;
use super::observe;

/// How long one request may run: 30 s below host.json's `functionTimeout` of 10 minutes, so
/// the answer (a retry) reaches the host before it gives up on the invocation.
pub const INVOCATION_TIMEOUT: Duration = Duration::from_secs(9 * 60 + 30);

/// Request headers that may carry a credential: the host's function key, an HTTP trigger
/// caller's `Authorization` or cookies, and App Service authentication's principal.
fn sensitive_headers() -> [HeaderName; 6] {
    [
        AUTHORIZATION,
        PROXY_AUTHORIZATION,
        COOKIE,
        SET_COOKIE,
        HeaderName::from_static("x-functions-key"),
        HeaderName::from_static("x-ms-client-principal"),
    ]
}

/// `router` with every layer above.
pub fn apply<S: Clone + Send + Sync + 'static>(router: Router<S>) -> Router<S> {
    router
        .layer(TimeoutLayer::with_status_code(
            StatusCode::SERVICE_UNAVAILABLE,
            INVOCATION_TIMEOUT,
        ))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(observe::invocation_span)
                // A failed invocation already writes its own line to stderr (observe.rs).
                .on_failure(DefaultOnFailure::new().level(Level::DEBUG)),
        )
        .layer(SetSensitiveRequestHeadersLayer::new(sensitive_headers()))
        .layer(CatchPanicLayer::custom(panicked))
}

/// The answer to a request whose handler panicked (the panic's text is logged, not returned).
fn panicked(panic: Box<dyn Any + Send + 'static>) -> Response {
    let text = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("a panic without a message");
    ApiError::Panicked(text.to_string()).into_response()
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use axum::routing::get;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::*;

    async fn call(router: Router, path: &str) -> (StatusCode, String) {
        let request = Request::builder().uri(path).body(Body::empty()).unwrap();
        let response = apply(router).oneshot(request).await.unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn a_panicking_handler_answers_a_json_500() {
        let router = Router::new().route("/p", get(|| async { panic!("boom") as &'static str }));
        let (status, body) = call(router, "/p").await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["error"]["code"], "InternalError", "{body}");
        assert!(
            !body.contains("boom"),
            "the panic's text is not returned: {body}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_past_the_timeout_answers_503() {
        let router = Router::new().route(
            "/slow",
            get(|| async {
                tokio::time::sleep(INVOCATION_TIMEOUT + Duration::from_secs(1)).await;
                "late"
            }),
        );
        let (status, _) = call(router, "/slow").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        let quick = Router::new().route("/quick", get(|| async { "ok" }));
        assert_eq!(call(quick, "/quick").await, (StatusCode::OK, "ok".into()));
    }
}
