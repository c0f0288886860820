//! Payload mode of the custom-handler protocol: request bodies the host sends (§3) and how it
//! reads the handler's answer (§4), byte for byte where the host pins it.

use std::collections::BTreeMap;

use base64::Engine;
use serde::Serialize;
use serde_json::{Map, Value};
use time::OffsetDateTime;

use crate::storage::ReceivedMessage;

/// `SystemBindingData`, sent as `Metadata.sys` (field order as the host serializes it).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub struct SysData {
    pub method_name: String,
    pub utc_now: String,
    pub rand_guid: String,
}

impl SysData {
    pub fn now(function: &str) -> SysData {
        SysData {
            method_name: function.to_string(),
            utc_now: utc_now_string(OffsetDateTime::now_utc()),
            rand_guid: uuid::Uuid::new_v4().to_string(),
        }
    }
}

/// `DateTime.UtcNow` as Json.NET writes it: 7 fractional digits and `Z`.
pub fn utc_now_string(t: OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:07}Z",
        t.year(),
        t.month() as u8,
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.nanosecond() / 100
    )
}

/// A `DateTimeOffset` after the host's `ToString()`/`Parse` round trip: no fractional seconds,
/// explicit `+00:00`.
pub fn iso_seconds(t: OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}+00:00",
        t.year(),
        t.month() as u8,
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// A .NET string value as the host sends it: the JSON encoding of the string, as a JSON string
/// (so `hello` arrives as `"\"hello\""`).
pub fn double_encoded(s: &str) -> Value {
    Value::String(serde_json::to_string(s).expect("strings always serialize"))
}

/// The queue trigger's value: text (default) or raw bytes (`dataType: binary`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueItem {
    Text(String),
    Binary(Vec<u8>),
}

impl QueueItem {
    /// The message body as the trigger binding sees it (`BinaryData.ToValidUTF8String()` for text).
    pub fn from_bytes(bytes: Vec<u8>, binary: bool) -> QueueItem {
        if binary {
            QueueItem::Binary(bytes)
        } else {
            QueueItem::Text(String::from_utf8_lossy(&bytes).into_owned())
        }
    }

    fn to_value(&self) -> Value {
        match self {
            QueueItem::Text(s) => double_encoded(s),
            QueueItem::Binary(b) => {
                Value::String(base64::engine::general_purpose::STANDARD.encode(b))
            }
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct QueueMetadata<'a> {
    dequeue_count: String,
    expiration_time: String,
    id: Value,
    insertion_time: String,
    next_visible_time: String,
    pop_receipt: Value,
    #[serde(rename = "sys")]
    sys: &'a SysData,
}

#[derive(Serialize)]
struct Envelope<M: Serialize> {
    #[serde(rename = "Data")]
    data: Map<String, Value>,
    #[serde(rename = "Metadata")]
    metadata: M,
}

/// The body of a queue-trigger invocation (§3.3).
pub fn queue_payload(
    binding: &str,
    item: &QueueItem,
    message: &ReceivedMessage,
    sys: &SysData,
) -> String {
    let mut data = Map::new();
    data.insert(binding.to_string(), item.to_value());
    let metadata = QueueMetadata {
        // A long goes through JSON serialization and is sent as that text in a string.
        dequeue_count: message.dequeue_count.to_string(),
        expiration_time: iso_seconds(message.expiration_time),
        id: double_encoded(&message.id),
        insertion_time: iso_seconds(message.insertion_time),
        next_visible_time: iso_seconds(message.next_visible_time),
        pop_receipt: double_encoded(&message.pop_receipt),
        sys,
    };
    serde_json::to_string(&Envelope { data, metadata }).expect("payload serializes")
}

/// What the host knows about an incoming HTTP request, for the wrapped `req` object (§3.4).
#[derive(Debug, Clone)]
pub struct HttpRequestInfo {
    pub url: String,
    pub method: String,
    /// Parsed query, repeated keys joined with `,`.
    pub query: BTreeMap<String, String>,
    /// Header names as received, values in arrival order.
    pub headers: Vec<(String, Vec<String>)>,
    pub params: BTreeMap<String, String>,
    pub content_type: Option<String>,
    /// Only set when the request had `Content-Length > 0`.
    pub body: Option<Vec<u8>>,
}

/// The claims identity Core Tools attaches locally (requests are treated as admin-level there).
fn local_identity() -> Value {
    serde_json::json!({
        "AuthenticationType": "WebJobsAuthLevel",
        "IsAuthenticated": true,
        "Actor": null,
        "BootstrapContext": null,
        "Claims": [{
            "Issuer": "LOCAL AUTHORITY",
            "OriginalIssuer": "LOCAL AUTHORITY",
            "Properties": {},
            "Type": "http://schemas.microsoft.com/2017/07/functions/claims/authlevel",
            "Value": "Admin",
            "ValueType": "http://www.w3.org/2001/XMLSchema#string"
        }],
        "Label": null,
        "Name": null,
        "NameClaimType": "http://schemas.xmlsoap.org/ws/2005/05/identity/claims/name",
        "RoleClaimType": "http://schemas.microsoft.com/ws/2008/06/identity/claims/role"
    })
}

/// The body of an HTTP-trigger invocation in payload mode (§3.4).
pub fn http_payload(binding: &str, req: &HttpRequestInfo, sys: &SysData) -> String {
    let query: Map<String, Value> = req
        .query
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    let params: Map<String, Value> = req
        .params
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    let headers_multi: Map<String, Value> = req
        .headers
        .iter()
        .map(|(k, vs)| {
            (
                k.clone(),
                Value::Array(vs.iter().cloned().map(Value::String).collect()),
            )
        })
        .collect();
    let headers_single: Map<String, Value> = req
        .headers
        .iter()
        .map(|(k, vs)| (k.clone(), Value::String(vs.join(","))))
        .collect();

    let mut r = Map::new();
    r.insert("Url".into(), Value::String(req.url.clone()));
    r.insert("Method".into(), Value::String(req.method.clone()));
    r.insert("Query".into(), Value::Object(query.clone()));
    r.insert("Headers".into(), Value::Object(headers_multi));
    r.insert("Params".into(), Value::Object(params.clone()));
    r.insert("Identities".into(), Value::Array(vec![local_identity()]));
    if let Some(body) = &req.body {
        let ct = req
            .content_type
            .as_deref()
            .unwrap_or("")
            .to_ascii_lowercase();
        // Binary uploads travel as base64, everything else as text.
        let text = if ct.starts_with("application/octet-stream") || ct.starts_with("multipart/") {
            base64::engine::general_purpose::STANDARD.encode(body)
        } else {
            String::from_utf8_lossy(body).into_owned()
        };
        r.insert("Body".into(), Value::String(text));
    }

    let mut data = Map::new();
    data.insert(binding.to_string(), Value::Object(r));
    let mut metadata = Map::new();
    metadata.insert("Query".into(), Value::Object(query));
    metadata.insert("Headers".into(), Value::Object(headers_single));
    metadata.insert("Params".into(), Value::Object(params));
    for (k, v) in &req.params {
        metadata
            .entry(k.clone())
            .or_insert_with(|| double_encoded(v));
    }
    metadata.insert(
        "sys".into(),
        serde_json::to_value(sys).expect("sys serializes"),
    );
    let mut envelope = Map::new();
    envelope.insert("Data".into(), Value::Object(data));
    envelope.insert("Metadata".into(), Value::Object(metadata));
    Value::Object(envelope).to_string()
}

/// The parsed handler answer (`HttpScriptInvocationResult`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InvocationResult {
    pub return_value: Option<Value>,
    pub outputs: Map<String, Value>,
    pub logs: Vec<String>,
}

/// Why an answer did not complete the invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponseProblem {
    /// Non-2xx: the host's `EnsureSuccessStatusCode` throws.
    Status(u16),
    /// Not `application/json` / `text/json`.
    MediaType(String),
    /// Not a JSON object the host can bind.
    InvalidBody(String),
    /// Empty body or `null`: the real host never completes the invocation (it hangs until
    /// `functionTimeout`, then restarts the handler).
    NoResult,
}

impl std::fmt::Display for ResponseProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ResponseProblem::Status(s) => write!(f, "handler answered HTTP {s}"),
            ResponseProblem::MediaType(t) => {
                write!(f, "handler answered with content type {t:?}; the host only reads application/json or text/json")
            }
            ResponseProblem::InvalidBody(e) => write!(f, "handler answered an invalid body: {e}"),
            ResponseProblem::NoResult => f.write_str(
                "handler answered an empty body or `null`: the real host never completes such an invocation; \
                 it hangs until functionTimeout and then restarts the handler. Always return a JSON object",
            ),
        }
    }
}

fn is_json_media_type(content_type: &str) -> bool {
    let media = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    media == "application/json" || media == "text/json"
}

/// Reads the handler's answer as the host does (§4.1).
pub fn parse_invocation_response(
    status: u16,
    content_type: Option<&str>,
    body: &[u8],
) -> Result<InvocationResult, ResponseProblem> {
    if !(200..300).contains(&status) {
        return Err(ResponseProblem::Status(status));
    }
    // Zero-length content yields the default value (null) whatever the content type.
    if body.is_empty() {
        return Err(ResponseProblem::NoResult);
    }
    match content_type {
        Some(ct) if is_json_media_type(ct) => {}
        Some(ct) => return Err(ResponseProblem::MediaType(ct.to_string())),
        None => return Err(ResponseProblem::MediaType("(none)".into())),
    }
    let text = std::str::from_utf8(body)
        .map_err(|e| ResponseProblem::InvalidBody(format!("not UTF-8: {e}")))?;
    let text = text.trim_start_matches('\u{feff}');
    if text.trim().is_empty() {
        return Err(ResponseProblem::NoResult);
    }
    let value: Value = serde_json::from_str(text)
        .map_err(|e| ResponseProblem::InvalidBody(format!("invalid JSON: {e}")))?;
    let object = match value {
        Value::Null => return Err(ResponseProblem::NoResult),
        Value::Object(o) => o,
        other => {
            return Err(ResponseProblem::InvalidBody(format!(
                "expected a JSON object with Outputs/Logs/ReturnValue, got {}",
                kind_of(&other)
            )))
        }
    };
    let mut result = InvocationResult::default();
    // Top-level names are matched case-insensitively (Json.NET); Outputs keys are not.
    for (key, value) in object {
        match key.to_ascii_lowercase().as_str() {
            "returnvalue" => result.return_value = (!value.is_null()).then_some(value),
            "outputs" => match value {
                Value::Null => {}
                Value::Object(o) => result.outputs = o,
                other => {
                    return Err(ResponseProblem::InvalidBody(format!(
                        "Outputs must be an object, got {}",
                        kind_of(&other)
                    )))
                }
            },
            "logs" => match value {
                Value::Null => {}
                Value::Array(items) => {
                    for item in items {
                        match item {
                            Value::String(s) => result.logs.push(s),
                            Value::Null => {}
                            Value::Bool(_) | Value::Number(_) => result.logs.push(item.to_string()),
                            other => {
                                return Err(ResponseProblem::InvalidBody(format!(
                                    "Logs must hold strings, got {}",
                                    kind_of(&other)
                                )))
                            }
                        }
                    }
                }
                other => {
                    return Err(ResponseProblem::InvalidBody(format!(
                        "Logs must be an array, got {}",
                        kind_of(&other)
                    )))
                }
            },
            _ => {}
        }
    }
    Ok(result)
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `Convert.FromBase64String` acceptance: whitespace ignored, length a multiple of 4, padding
/// only at the end.
pub fn dotnet_base64(s: &str) -> Option<Vec<u8>> {
    let compact: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    if compact.len() % 4 != 0 {
        return None;
    }
    base64::engine::general_purpose::STANDARD
        .decode(compact)
        .ok()
}

/// `JToken.ToString()`: indented JSON for objects and arrays, raw text for strings.
fn dotnet_to_string(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(s.as_bytes().to_vec()),
        // .NET prints booleans capitalized.
        Value::Bool(b) => Some(if *b {
            b"True".to_vec()
        } else {
            b"False".to_vec()
        }),
        Value::Number(n) => Some(n.to_string().into_bytes()),
        Value::Object(_) | Value::Array(_) => {
            Some(serde_json::to_string_pretty(v).expect("json").into_bytes())
        }
    }
}

/// The messages one queue output value produces (§4.2): base64 strings become bytes (unless
/// `dataType: binary`), arrays and JSON-looking strings fan out, everything else is one message.
pub fn queue_output_messages(value: &Value, binary: bool) -> Result<Vec<Vec<u8>>, String> {
    if let Value::String(s) = value {
        if !binary {
            if let Some(bytes) = dotnet_base64(s) {
                return Ok(vec![bytes]);
            }
        }
        let t = s.trim();
        let looks_json =
            (t.starts_with('{') && t.ends_with('}')) || (t.starts_with('[') && t.ends_with(']'));
        if looks_json {
            let parsed: Value = serde_json::from_str(t)
                .map_err(|e| format!("output looks like JSON but is not: {e}"))?;
            return Ok(match &parsed {
                Value::Array(items) => items.iter().filter_map(dotnet_to_string).collect(),
                other => dotnet_to_string(other).into_iter().collect(),
            });
        }
        return Ok(vec![s.as_bytes().to_vec()]);
    }
    Ok(match value {
        Value::Array(items) => items.iter().filter_map(dotnet_to_string).collect(),
        other => dotnet_to_string(other).into_iter().collect(),
    })
}

/// An HTTP response built from an `http` output binding value (§4.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpOutput {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

pub fn http_output(value: Option<&Value>) -> Result<HttpOutput, String> {
    let object = match value {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(o)) => o.clone(),
        // The host re-parses `value.ToString()`, so a string holding a JSON object works too.
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(Value::Object(o)) => o,
            _ => {
                return Err(format!(
                    "failed to deserialize the http output {s:?} into a response object"
                ))
            }
        },
        Some(other) => {
            return Err(format!(
                "http output must be an object, got {}",
                kind_of(other)
            ))
        }
    };
    let get = |k: &str| {
        object
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(k))
            .map(|(_, v)| v)
    };
    let status = match get("statusCode") {
        None | Some(Value::Null) => 200,
        Some(Value::Number(n)) => n
            .as_u64()
            .filter(|s| (100..1000).contains(s))
            .ok_or("bad statusCode")? as u16,
        Some(Value::String(s)) => s
            .trim()
            .parse::<u16>()
            .ok()
            .filter(|s| (100..1000).contains(s))
            .ok_or(format!("bad statusCode {s:?}"))?,
        Some(other) => {
            return Err(format!(
                "statusCode must be a number or string, got {}",
                kind_of(other)
            ))
        }
    };
    let mut headers = Vec::new();
    match get("headers") {
        None | Some(Value::Null) => {}
        Some(Value::Object(h)) => {
            for (k, v) in h {
                let text = match v {
                    Value::String(s) => s.clone(),
                    other => String::from_utf8(dotnet_to_string(other).unwrap_or_default())
                        .unwrap_or_default(),
                };
                headers.push((k.clone(), text));
            }
        }
        Some(_) => return Err("headers must be an object".into()),
    }
    let body = match get("body") {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => dotnet_to_string(v).unwrap_or_default(),
    };
    Ok(HttpOutput {
        status,
        headers,
        body,
    })
}

#[cfg(test)]
#[path = "payload_tests.rs"]
mod tests;
