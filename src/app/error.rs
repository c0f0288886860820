//! Error policy.
//!
//! - **HTTP API** ([`ApiError`]): a request the caller got wrong is a 4xx with a JSON body
//!   `{"error": {"code", "message", "field"?}}` naming the field, and nothing is written to
//!   storage. Storage failures are 503 (transient: retry later) or 500, logged once here.
//! - **Queue invocations** (`work` module): any failure is a non-2xx reply, so the Functions host
//!   retries the message and finally moves it to `<queue>-poison`. Transient storage errors have
//!   already been retried inside the storage adapter. On the last delivery attempt a failing work
//!   item is recorded as failed and the scan ends `failed` with the reason, so a scan never hangs
//!   in `running`. Duplicate deliveries are successes (200) that do nothing.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::storage::{StorageError, StorageErrorKind};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A request field is missing, of the wrong type or out of range.
    #[error("{field}: {message}")]
    InvalidField { field: String, message: String },
    /// The body is not JSON at all.
    #[error("the request body is not valid JSON: {0}")]
    InvalidJson(String),
    #[error("the request body must be JSON (Content-Type: application/json)")]
    UnsupportedMediaType,
    #[error("the request body is larger than {0} bytes")]
    PayloadTooLarge(usize),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("method {method} is not allowed on {path}")]
    MethodNotAllowed { method: String, path: String },
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
    /// A handler panicked (the text is logged, never returned: it may quote data).
    #[error("the handler failed unexpectedly")]
    Panicked(String),
}

impl ApiError {
    pub fn field(field: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::InvalidField {
            field: field.into(),
            message: message.into(),
        }
    }

    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::InvalidField { .. } => (StatusCode::BAD_REQUEST, "InvalidField"),
            ApiError::InvalidJson(_) => (StatusCode::BAD_REQUEST, "InvalidJson"),
            ApiError::UnsupportedMediaType => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "UnsupportedMediaType")
            }
            ApiError::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "PayloadTooLarge"),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "NotFound"),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "Conflict"),
            ApiError::MethodNotAllowed { .. } => {
                (StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed")
            }
            ApiError::Storage(e) if e.kind == StorageErrorKind::Transient => {
                (StatusCode::SERVICE_UNAVAILABLE, "StorageUnavailable")
            }
            ApiError::Storage(_) => (StatusCode::INTERNAL_SERVER_ERROR, "StorageError"),
            ApiError::Panicked(_) => (StatusCode::INTERNAL_SERVER_ERROR, "InternalError"),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        if let ApiError::Panicked(text) = &self {
            tracing::error!(panic = %text, "a handler panicked");
        } else if status.is_server_error() {
            tracing::error!(error = %self, "API request failed");
        }
        let mut error = json!({ "code": code, "message": self.to_string() });
        if let ApiError::InvalidField { field, .. } = &self {
            error["field"] = json!(field);
        }
        let mut response = (status, Json(json!({ "error": error }))).into_response();
        if matches!(self, ApiError::PayloadTooLarge(_)) {
            // The rest of the body was never read, so this connection cannot carry another
            // request: say so, or a client reusing it sees its next request fail.
            response.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
        }
        response
    }
}
