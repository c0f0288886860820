//! The Azure Functions custom-handler protocol, as the host (v4) implements it.
//!
//! Queue-trigger invocations arrive as `POST /{FunctionName}` with `{"Data": {...}, "Metadata": {...}}`
//! where every string value is JSON-encoded twice (`hello` → `"\"hello\""`), numbers arrive as
//! strings (`"DequeueCount": "1"`) and `Id`/`PopReceipt` carry embedded quotes. Every response must
//! be a JSON object with `Content-Type: application/json` — an empty body hangs the invocation — and
//! any failure must be a non-2xx status so the host retries the message and finally poisons it.
//! The facts and their sources: `docs/custom-handler-protocol.md` (§3 requests, §4 responses,
//! §7 queues).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};

/// The binding name of the queue trigger in every queue function's function.json.
pub const QUEUE_BINDING: &str = "message";

/// The host's invocation request (payload mode).
#[derive(Debug, Clone, Deserialize)]
pub struct InvocationRequest {
    #[serde(rename = "Data", default)]
    pub data: Map<String, Value>,
    #[serde(rename = "Metadata", default)]
    pub metadata: Map<String, Value>,
}

/// What tablescan needs from a queue-trigger invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueInvocation {
    /// The message text, decoded from the host's double encoding (already base64-decoded by the host).
    pub message: String,
    pub dequeue_count: u64,
    pub id: Option<String>,
}

/// Why an invocation payload could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid invocation payload: {0}")]
pub struct PayloadError(pub String);

/// Undoes the host's string encoding: a JSON string whose content is itself a JSON string literal.
/// A value that is not double-encoded (as in the public docs' examples) is taken as it is.
pub fn decode_string_value(value: &Value) -> Option<String> {
    match value {
        Value::String(outer) => match serde_json::from_str::<Value>(outer) {
            Ok(Value::String(inner)) => Some(inner),
            _ => Some(outer.clone()),
        },
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

impl InvocationRequest {
    /// Extracts the queue message and its delivery metadata.
    pub fn queue_invocation(&self) -> Result<QueueInvocation, PayloadError> {
        let raw = self
            .data
            .get(QUEUE_BINDING)
            .ok_or_else(|| PayloadError(format!("Data.{QUEUE_BINDING} is missing")))?;
        let message = match raw {
            Value::String(_) => decode_string_value(raw).expect("strings decode"),
            // dataType-less object payloads are not what the host sends, but are unambiguous.
            Value::Object(_) => raw.to_string(),
            other => {
                return Err(PayloadError(format!(
                    "Data.{QUEUE_BINDING} is a {}, expected a string",
                    kind(other)
                )))
            }
        };
        let dequeue_count = match self.metadata.get("DequeueCount") {
            None => 1,
            Some(v) => decode_string_value(v)
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    PayloadError(format!("Metadata.DequeueCount is not a count: {v}"))
                })?,
        };
        let id = self.metadata.get("Id").and_then(decode_string_value);
        Ok(QueueInvocation {
            message,
            dequeue_count,
            id,
        })
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The handler's reply to an invocation: always a JSON object.
#[derive(Debug, Clone)]
pub struct InvocationResponse {
    pub status: StatusCode,
    pub logs: Vec<String>,
}

impl InvocationResponse {
    pub fn ok(logs: Vec<String>) -> Self {
        InvocationResponse {
            status: StatusCode::OK,
            logs,
        }
    }

    /// A failure: the host will retry the message (and poison it after `maxDequeueCount`).
    pub fn failed(status: StatusCode, logs: Vec<String>) -> Self {
        InvocationResponse { status, logs }
    }
}

impl IntoResponse for InvocationResponse {
    fn into_response(self) -> Response {
        let body = json!({ "Outputs": {}, "Logs": self.logs, "ReturnValue": null });
        (self.status, Json(body)).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_the_reference_queue_payload() {
        // The example of docs/custom-handler-protocol.md §3.3, verbatim.
        let body = r#"{"Data":{"message":"\"{\\\"orderId\\\":42,\\\"sku\\\":\\\"A-1\\\"}\""},"Metadata":{"DequeueCount":"1","ExpirationTime":"2024-11-01T12:00:00+00:00","Id":"\"800ae4b3-bdd2-4c08-badd-f08e5a34b865\"","InsertionTime":"2024-10-25T12:00:00+00:00","NextVisibleTime":"2024-10-25T12:10:00+00:00","PopReceipt":"\"AgAAAAMAAAAAAAAAAgtnj8x+1QE=\"","sys":{"MethodName":"MyQueueFunction","UtcNow":"2024-10-25T12:00:00.1234567Z","RandGuid":"24ad4c06-24ad-4e5b-8294-3da9714877e9"}}}"#;
        let request: InvocationRequest = serde_json::from_str(body).unwrap();
        let invocation = request.queue_invocation().unwrap();
        assert_eq!(invocation.message, r#"{"orderId":42,"sku":"A-1"}"#);
        assert_eq!(invocation.dequeue_count, 1);
        assert_eq!(
            invocation.id.as_deref(),
            Some("800ae4b3-bdd2-4c08-badd-f08e5a34b865")
        );
    }

    #[test]
    fn tolerates_single_encoding_and_numeric_counts_but_rejects_garbage() {
        let request: InvocationRequest = serde_json::from_value(
            json!({"Data": {"message": "{\"a\":1}"}, "Metadata": {"DequeueCount": 3}}),
        )
        .unwrap();
        let invocation = request.queue_invocation().unwrap();
        assert_eq!(invocation.message, "{\"a\":1}");
        assert_eq!(invocation.dequeue_count, 3);
        let missing: InvocationRequest = serde_json::from_value(json!({"Data": {}})).unwrap();
        assert!(missing
            .queue_invocation()
            .unwrap_err()
            .0
            .contains("Data.message"));
        let bad_count: InvocationRequest = serde_json::from_value(
            json!({"Data": {"message": "\"x\""}, "Metadata": {"DequeueCount": "\"many\""}}),
        )
        .unwrap();
        assert!(bad_count
            .queue_invocation()
            .unwrap_err()
            .0
            .contains("DequeueCount"));
        let array: InvocationRequest =
            serde_json::from_value(json!({"Data": {"message": [1]}})).unwrap();
        assert!(array.queue_invocation().is_err());
    }
}
