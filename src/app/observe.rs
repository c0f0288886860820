//! What an operator sees in Application Insights: one line per queue invocation, and a line when
//! a scan starts and when it ends. Design and queries: `docs/observability.md`; how the host
//! carries each line there: `docs/custom-handler-protocol.md` §11.
//!
//! Every line is `tablescan event=<event> key=value … [msg=<free text>]`: values before `msg`
//! hold no spaces, and `msg`, when present, is the last key and runs to the end of the line.
//!
//! Invariants:
//! - the line of a successful invocation (2xx) is its answer's only `Logs` entry: the host logs
//!   it under `Function.<Name>.User` at Information, inside the invocation (correlated with its
//!   request in Application Insights), and nowhere else;
//! - the line of a failed invocation (non-2xx, which the host retries and finally poisons) goes
//!   to stderr, which the host logs under `Host.Function.Console` at Error: it never relies on
//!   the `Logs` of a non-2xx answer, which the host drops;
//! - a scan's start and its end (completed, cancelled) go to stdout (Information); a failed end
//!   goes to stderr (Error);
//! - lines are written whole, one `write` each, and never carry secrets: the free text is
//!   scrubbed ([`crate::redact::scrub`]: SAS signatures, keys, tokens, secrets) before it is
//!   bounded in length.

use std::io::Write;
use std::time::Instant;

use axum::http::{HeaderMap, Uri};

use super::job::context::ScanContext;
use super::messages::{self, WorkMessage};
use super::protocol::{InvocationRequest, InvocationResponse};
use super::tracking::ScanState;

/// Every line starts with this word.
pub const PREFIX: &str = "tablescan";
/// The header carrying the host's invocation id (payload, forwarding and proxying modes).
pub const INVOCATION_ID_HEADER: &str = "x-azure-functions-invocationid";
/// The free text of a line is cut to this many characters.
const MAX_MSG_CHARS: usize = 1000;
/// A token value (ids, names) is cut to this many characters.
const MAX_TOKEN_CHARS: usize = 128;

/// One queue invocation, from its request to its answer.
#[derive(Debug)]
pub struct Invocation {
    function: String,
    invocation_id: String,
    kind: &'static str,
    scan: Option<String>,
    item: Option<String>,
    attempt: u64,
    max_attempts: u64,
    started: Instant,
}

impl Invocation {
    /// Notes what the request says: the function (its path), the host's invocation id, and, if
    /// the payload decodes, the scan, the work item and the delivery attempt. Decoding here is
    /// separate from the work's own: a payload that does not decode is still observed.
    pub fn start<M: WorkMessage>(
        uri: &Uri,
        headers: &HeaderMap,
        body: &[u8],
        max_attempts: u64,
    ) -> Self {
        let queued = serde_json::from_slice::<InvocationRequest>(body)
            .ok()
            .and_then(|r| r.queue_invocation().ok());
        let message = queued
            .as_ref()
            .and_then(|q| messages::decode::<M>(&q.message).ok());
        Invocation {
            function: uri.path().trim_start_matches('/').to_string(),
            invocation_id: headers
                .get(INVOCATION_ID_HEADER)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-")
                .to_string(),
            kind: M::NAME,
            scan: message.as_ref().map(|m| m.scan_id().to_string()),
            item: message.as_ref().map(messages::work_id),
            attempt: queued.map_or(0, |q| q.dequeue_count),
            max_attempts,
            started: Instant::now(),
        }
    }

    /// Makes `response` carry this invocation's line (see the module's invariants) and writes
    /// it to stderr when the invocation failed.
    pub fn finish(self, mut response: InvocationResponse) -> InvocationResponse {
        let outcome = if response.status.is_success() {
            "ok"
        } else if response.status.is_client_error() {
            "rejected"
        } else {
            "failed"
        };
        let line = format!(
            "{PREFIX} event=invocation fn={} kind={} scan={} item={} attempt={}/{} outcome={outcome} status={} ms={} invocation={} msg={}",
            token(&self.function),
            self.kind,
            token(self.scan.as_deref().unwrap_or("-")),
            token(self.item.as_deref().unwrap_or("-")),
            self.attempt,
            self.max_attempts,
            response.status.as_u16(),
            self.started.elapsed().as_millis(),
            token(&self.invocation_id),
            text(&response.logs.join("; ")),
        );
        if !response.status.is_success() {
            write_line(Stream::Stderr, &line);
        }
        response.logs = vec![line];
        response
    }
}

/// A scan was recorded as started.
pub fn scan_started(scan_id: &str, context: Option<&ScanContext>) {
    let mut line = format!("{PREFIX} event=scan-start scan={}", token(scan_id));
    if let Some(c) = context {
        line.push_str(&format!(
            " driver={} strategy={} source={}/{}",
            serde_name(&c.driver),
            serde_name(&c.strategy),
            token(&c.source.connection),
            token(&c.source.table)
        ));
        if let Some(d) = &c.destination {
            line.push_str(&format!(
                " destination={}/{}",
                token(&d.connection),
                token(&d.table)
            ));
        }
    }
    write_line(Stream::Stdout, &line);
}

/// A running scan was recorded as ended in `state` (with `reason`), `took` after its start
/// (its recorded `CompletedAt` less its `StartedAt`).
pub fn scan_ended(scan_id: &str, state: ScanState, took: time::Duration, reason: Option<&str>) {
    let ms = took.whole_milliseconds().max(0);
    let mut line = format!(
        "{PREFIX} event=scan-end scan={} state={} ms={ms}",
        token(scan_id),
        state.as_str()
    );
    if let Some(reason) = reason {
        line.push_str(&format!(" msg={}", text(reason)));
    }
    let stream = if state == ScanState::Failed {
        Stream::Stderr
    } else {
        Stream::Stdout
    };
    write_line(stream, &line);
}

/// The span of one request (`layers`' trace layer makes it): every tracing event of a request
/// is logged inside a span naming the function's path and the host's invocation id, so the
/// handler's diagnostics on stdout and stderr can be matched with the invocation.
pub fn invocation_span<B>(request: &axum::http::Request<B>) -> tracing::Span {
    let id = request
        .headers()
        .get(INVOCATION_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(token)
        .unwrap_or_else(|| "-".to_string());
    tracing::info_span!("invocation", path = %request.uri().path(), id = %id)
}

#[derive(Debug, Clone, Copy)]
enum Stream {
    Stdout,
    Stderr,
}

/// Whether the lines meant for stdout are written (see [`drop_stdout_lines`]).
static STDOUT_LINES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Drops the lines meant for stdout (a scan's start and successful end) from now on: in
/// `tablescan run` stdout is the command's own output (`--json`), and the run says itself when
/// its scan starts and ends. Lines meant for stderr (failures) are still written.
pub fn drop_stdout_lines() {
    STDOUT_LINES.store(false, std::sync::atomic::Ordering::Relaxed);
}

/// Writes one whole line (a single `write_all` under the stream's lock, so lines from
/// concurrent invocations never interleave). Losing a log line must not fail an invocation.
fn write_line(stream: Stream, line: &str) {
    if matches!(stream, Stream::Stdout) && !STDOUT_LINES.load(std::sync::atomic::Ordering::Relaxed)
    {
        return;
    }
    let mut bytes = Vec::with_capacity(line.len() + 1);
    bytes.extend_from_slice(line.as_bytes());
    bytes.push(b'\n');
    let _ = match stream {
        Stream::Stdout => std::io::stdout().lock().write_all(&bytes),
        Stream::Stderr => std::io::stderr().lock().write_all(&bytes),
    };
}

/// A value without spaces or `=`, bounded in length (`-` when empty).
fn token(value: &str) -> String {
    let cleaned: String = value
        .chars()
        .take(MAX_TOKEN_CHARS)
        .map(|c| {
            if c.is_whitespace() || c.is_control() || c == '=' {
                '_'
            } else {
                c
            }
        })
        .collect();
    if cleaned.is_empty() {
        "-".to_string()
    } else {
        cleaned
    }
}

/// Free text on one line, scrubbed of secrets and bounded in length.
fn text(value: &str) -> String {
    let one_line: String = value
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let scrubbed = crate::redact::scrub(&one_line);
    if scrubbed.chars().count() > MAX_MSG_CHARS {
        let cut: String = scrubbed.chars().take(MAX_MSG_CHARS).collect();
        format!("{cut}…")
    } else {
        scrubbed
    }
}

/// The serde name of a unit enum value (`copy`, `prefix`).
fn serde_name<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => token(&s),
        _ => "-".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::messages::StepMessage;
    use crate::scan::Step;
    use axum::http::StatusCode;

    fn payload(message_text: &str, dequeue: &str) -> Vec<u8> {
        // The host's double string encoding (docs/custom-handler-protocol.md §3.2).
        let inner = serde_json::to_string(message_text).unwrap();
        serde_json::json!({"Data": {"message": inner}, "Metadata": {"DequeueCount": dequeue}})
            .to_string()
            .into_bytes()
    }

    fn step() -> StepMessage {
        StepMessage {
            scan_id: "0000000000001-abcdef01".into(),
            step: Step::PartitionKeyQuery {
                partition_key: "p".into(),
                row_key_skip: None,
                depth: 1,
            },
            shard: None,
        }
    }

    #[test]
    fn a_success_line_replaces_the_logs_and_names_everything() {
        let message = step();
        let json = String::from_utf8(
            crate::storage::MessageEncoding::Base64
                .decode(&messages::encode(&message).unwrap())
                .unwrap(),
        )
        .unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(INVOCATION_ID_HEADER, "inv-1".parse().unwrap());
        let observed = Invocation::start::<StepMessage>(
            &"/PrefixScan".parse().unwrap(),
            &headers,
            &payload(&json, "\"2\""),
            5,
        );
        let response = observed.finish(InvocationResponse::ok(vec!["done\nfine".into()]));
        assert_eq!(response.logs.len(), 1);
        let line = &response.logs[0];
        let expected = format!(
            "tablescan event=invocation fn=PrefixScan kind=scan-step scan=0000000000001-abcdef01 item={} attempt=2/5 outcome=ok status=200 ms=",
            messages::work_id(&message)
        );
        assert!(line.starts_with(&expected), "{line}");
        assert!(line.ends_with(" invocation=inv-1 msg=done fine"), "{line}");
    }

    #[test]
    fn undecodable_payloads_and_failures_are_still_observed() {
        let observed = Invocation::start::<StepMessage>(
            &"/PrefixScan".parse().unwrap(),
            &HeaderMap::new(),
            b"not json",
            5,
        );
        let response = observed.finish(InvocationResponse::failed(
            StatusCode::BAD_REQUEST,
            vec!["invalid invocation payload".into()],
        ));
        assert_eq!(response.status, StatusCode::BAD_REQUEST);
        let line = &response.logs[0];
        assert!(
            line.contains(" scan=- item=- attempt=0/5 outcome=rejected status=400 ")
                && line.contains(" invocation=- msg=invalid invocation payload"),
            "{line}"
        );
        let copy = Invocation::start::<crate::app::messages::ItemMessage>(
            &"/TableCopy".parse().unwrap(),
            &HeaderMap::new(),
            &payload("{}", "1"),
            5,
        );
        let line = copy
            .finish(InvocationResponse::failed(
                StatusCode::SERVICE_UNAVAILABLE,
                vec![],
            ))
            .logs
            .remove(0);
        assert!(
            line.contains(
                "fn=TableCopy kind=table-copy scan=- item=- attempt=1/5 outcome=failed status=503"
            ),
            "{line}"
        );
    }

    #[test]
    fn secrets_and_layout_breakers_never_reach_a_line() {
        let t =
            text("GET https://a/t?sv=1&sig=SECRET&x=1 AccountKey=KEY==;Name=a Bearer eyJhbGc rest");
        assert!(
            !t.contains("SECRET") && !t.contains("KEY==") && !t.contains("eyJ"),
            "{t}"
        );
        assert!(t.contains("sig=***&x=1") && t.contains("Bearer ***"), "{t}");
        assert_eq!(token("a b=c\nd"), "a_b_c_d");
        assert_eq!(token(""), "-");
        let long = text(&"x".repeat(5000));
        assert_eq!(long.chars().count(), MAX_MSG_CHARS + 1);
        assert_eq!(
            serde_name(&crate::app::job::context::DriverName::new("copy")),
            "copy"
        );
    }
}
