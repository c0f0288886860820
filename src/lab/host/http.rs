//! The HTTP front: `http://127.0.0.1:{port}/{routePrefix}/{route}` for HTTP-triggered functions,
//! in proxying mode (§5.2), forwarding mode (§5.1) or payload mode (§3.4, §4.3). With several
//! instances, requests are spread round-robin, like the load balancer in front of a scaled-out
//! app.
//!
//! `authLevel` is not enforced: like Core Tools, every local request is accepted.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use bytes::Bytes;

use super::config::{FunctionConfig, HttpMode, LogLevel};
use super::invoke::{Invoker, RawRequest, RawResponse, HOST_VERSION};
use super::log::{user_category, HostLog};
use super::outputs::{effective_outputs, write_queue_outputs, OutputTarget, ResolvedOutput};
use super::payload::{http_output, http_payload, HttpRequestInfo, SysData};
use super::route::{path_segments, RouteTemplate};
use crate::storage::{MessageEncoding, QueueStore};

/// The host's request size limit (`maxRequestBodySize`, 100 MB).
const MAX_BODY: usize = 100 * 1024 * 1024;

pub struct HttpRoute<S> {
    pub function: Arc<FunctionConfig>,
    pub binding: String,
    pub template: RouteTemplate,
    pub methods: Option<Vec<String>>,
    /// How the request reaches the handler (proxied or forwarded only when the option is on and
    /// the function is HTTP-in/HTTP-out only).
    pub mode: HttpMode,
    pub outputs: Arc<Vec<ResolvedOutput<S>>>,
}

/// One instance as the front sees it.
pub struct FrontInstance {
    pub invoker: Arc<Invoker>,
    pub stopped: AtomicBool,
}

pub struct Front<S> {
    pub route_prefix: String,
    pub routes: Vec<HttpRoute<S>>,
    pub instances: Vec<Arc<FrontInstance>>,
    pub next: AtomicUsize,
    pub encoding: MessageEncoding,
    pub log: HostLog,
}

impl<S: QueueStore> Front<S> {
    pub fn router(self: Arc<Self>) -> axum::Router {
        axum::Router::new().fallback(handle::<S>).with_state(self)
    }

    fn pick_instance(&self) -> Option<Arc<FrontInstance>> {
        let n = self.instances.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..n)
            .map(|i| &self.instances[(start + i) % n])
            .find(|inst| {
                !inst.stopped.load(Ordering::SeqCst)
                    && !matches!(
                        inst.invoker.worker.state().status,
                        super::worker::WorkerStatus::Failed(_)
                            | super::worker::WorkerStatus::Stopped
                    )
            })
            .cloned()
    }

    fn find_route(
        &self,
        path: &str,
        method: &str,
    ) -> Result<(&HttpRoute<S>, BTreeMap<String, String>), StatusCode> {
        let mut segments = path_segments(path);
        if !self.route_prefix.is_empty() {
            let prefix = path_segments(&self.route_prefix);
            if segments.len() < prefix.len()
                || !segments
                    .iter()
                    .zip(&prefix)
                    .all(|(a, b)| a.eq_ignore_ascii_case(b))
            {
                return Err(StatusCode::NOT_FOUND);
            }
            segments.drain(..prefix.len());
        }
        let mut method_mismatch = false;
        for route in &self.routes {
            if let Some(values) = route.template.matches(&segments) {
                if route
                    .methods
                    .as_ref()
                    .map_or(true, |ms| ms.iter().any(|m| m.eq_ignore_ascii_case(method)))
                {
                    return Ok((route, values));
                }
                method_mismatch = true;
            }
        }
        Err(if method_mismatch {
            StatusCode::METHOD_NOT_ALLOWED
        } else {
            StatusCode::NOT_FOUND
        })
    }
}

/// Orders routes so literal ones win over parameterized ones and catch-alls come last.
pub fn sort_routes<S>(routes: &mut [HttpRoute<S>]) {
    routes.sort_by_key(|r| {
        (
            r.template.has_catch_all(),
            std::cmp::Reverse(r.template.literal_count()),
        )
    });
}

fn plain(status: StatusCode, text: impl Into<String>) -> Response {
    Response::builder()
        .status(status)
        .header("content-type", "text/plain; charset=utf-8")
        .body(Body::from(text.into()))
        .expect("response")
}

async fn handle<S: QueueStore>(State(front): State<Arc<Front<S>>>, request: Request) -> Response {
    let client = request
        .extensions()
        .get::<ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip());
    let (parts, body) = request.into_parts();
    let path = parts.uri.path().to_string();
    let method = parts.method.as_str().to_string();
    let (route, params) = match front.find_route(&path, &method) {
        Ok(found) => found,
        Err(status) if path == "/" && method == "GET" => {
            let _ = status;
            return plain(
                StatusCode::OK,
                "Your Functions host (tablescan host, a local stand-in) is running.\n",
            );
        }
        Err(status) => return plain(status, format!("no function answers {method} {path}\n")),
    };
    let Some(instance) = front.pick_instance() else {
        return plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "no host instance is running\n",
        );
    };
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => {
            return plain(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("cannot read request body: {e}\n"),
            )
        }
    };
    let function = &route.function.name;
    let invocation_id = uuid::Uuid::new_v4().to_string();
    let tag = format!("{} [{function}] [{invocation_id}]", instance.invoker.label);
    let content_length: Option<u64> = parts
        .headers
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok());
    // Forwarding and payload mode only pass a body on when the request declared
    // Content-Length > 0; the proxy streams whatever comes.
    let body = match content_length {
        _ if route.mode == HttpMode::Proxy => Some(body),
        Some(n) if n > 0 => Some(body),
        _ => {
            if !body.is_empty() {
                front.log.warn(format!(
                    "{tag} request body of {} bytes sent without Content-Length (chunked) is dropped, as the host does",
                    body.len()
                ));
            }
            None
        }
    };
    front
        .log
        .info(format!("{tag} Executing '{function}' ({method} {path})"));
    let started = std::time::Instant::now();
    let response = match route.mode {
        HttpMode::Forward => forward(&front, &instance, route, &invocation_id, &parts, body).await,
        HttpMode::Proxy => {
            let request = proxied_request(&parts, body, client, &invocation_id);
            let answer = instance
                .invoker
                .proxy(&route.function.name, &invocation_id, request)
                .await;
            raw_answer(&front.log, &tag, answer)
        }
        HttpMode::Payload => {
            payload(
                &front,
                &instance,
                route,
                &invocation_id,
                &parts,
                body,
                params,
                &tag,
            )
            .await
        }
    };
    let (status, failed) = (
        response.status(),
        response.extensions().get::<Failed>().is_some(),
    );
    front.log.info(format!(
        "{tag} Executed '{function}' ({}, {} ms, HTTP {})",
        if failed { "Failed" } else { "Succeeded" },
        started.elapsed().as_millis(),
        status.as_u16()
    ));
    response
}

/// Marks a response the host produced because the invocation failed.
#[derive(Clone, Copy)]
struct Failed;

fn failure(front_log: &HostLog, tag: &str, why: impl std::fmt::Display) -> Response {
    front_log.error(format!("{tag} invocation failed: {why}"));
    let mut r = Response::builder()
        .status(StatusCode::INTERNAL_SERVER_ERROR)
        .body(Body::empty())
        .expect("response");
    r.extensions_mut().insert(Failed);
    r
}

const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
];

/// Unreserved characters stay, everything else is percent-encoded (as `UrlEncoder` does).
fn encode_component(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Parses a query string; repeated keys are joined with `,` (`StringValues.ToString()`),
/// first-appearance order kept.
pub fn parse_query(query: Option<&str>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let Some(q) = query.filter(|q| !q.is_empty()) else {
        return out;
    };
    let url = reqwest::Url::parse(&format!("http://x/?{q}")).expect("query parses");
    for (k, v) in url.query_pairs() {
        match out.iter_mut().find(|(key, _)| key.as_str() == k.as_ref()) {
            Some((_, existing)) => {
                existing.push(',');
                existing.push_str(&v);
            }
            None => out.push((k.into_owned(), v.into_owned())),
        }
    }
    out
}

async fn forward<S: QueueStore>(
    front: &Front<S>,
    instance: &FrontInstance,
    route: &HttpRoute<S>,
    invocation_id: &str,
    parts: &axum::http::request::Parts,
    body: Option<Bytes>,
) -> Response {
    let tag = format!(
        "{} [{}] [{invocation_id}]",
        instance.invoker.label, route.function.name
    );
    let query = parse_query(parts.uri.query());
    let mut path_and_query = parts.uri.path().to_string();
    if !query.is_empty() {
        let q: Vec<String> = query
            .iter()
            .map(|(k, v)| format!("{}={}", encode_component(k), encode_component(v)))
            .collect();
        path_and_query.push('?');
        path_and_query.push_str(&q.join("&"));
    }
    let mut headers = copy_headers(&parts.headers, |_| true);
    if let Some(len) = body.as_ref().map(|b| b.len()) {
        headers.insert("content-length", HeaderValue::from(len));
    }
    let agent = match parts
        .headers
        .get("user-agent")
        .and_then(|v| v.to_str().ok())
    {
        Some(ua) => format!("{ua} Azure-Functions-Host/{HOST_VERSION}"),
        None => format!("Azure-Functions-Host/{HOST_VERSION}"),
    };
    headers.insert(
        "user-agent",
        HeaderValue::from_str(&agent).unwrap_or(HeaderValue::from_static("Azure-Functions-Host")),
    );
    add_invocation_headers(&mut headers, invocation_id, false);
    let request = RawRequest {
        method: parts.method.clone(),
        path_and_query,
        headers,
        body,
    };
    let answer = instance
        .invoker
        .forward(&route.function.name, invocation_id, request)
        .await;
    raw_answer(&front.log, &tag, answer)
}

/// The request the host's proxy sends (§5.2): the original path and query untouched, every
/// header but the hop-by-hop ones and `Host`, `X-Forwarded-For`/`-Proto`/`-Host` set from the
/// caller (`X-Forwarded-Prefix` removed: the host has no path base), the invocation headers set,
/// and the body whatever its framing.
fn proxied_request(
    parts: &axum::http::request::Parts,
    body: Option<Bytes>,
    client: Option<std::net::IpAddr>,
    invocation_id: &str,
) -> RawRequest {
    const SET_BY_PROXY: [&str; 5] = [
        "host",
        "x-forwarded-for",
        "x-forwarded-proto",
        "x-forwarded-host",
        "x-forwarded-prefix",
    ];
    let mut headers = copy_headers(&parts.headers, |name| !SET_BY_PROXY.contains(&name));
    let client = client.map_or_else(|| "127.0.0.1".to_string(), |ip| ip.to_string());
    if let Ok(v) = HeaderValue::from_str(&client) {
        headers.insert("x-forwarded-for", v);
    }
    headers.insert("x-forwarded-proto", HeaderValue::from_static("http"));
    if let Some(host) = parts.headers.get("host") {
        headers.insert("x-forwarded-host", host.clone());
    }
    add_invocation_headers(&mut headers, invocation_id, true);
    RawRequest {
        method: parts.method.clone(),
        path_and_query: parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.path().to_string(), |p| p.as_str().to_string()),
        headers,
        body,
    }
}

/// The caller's headers without the hop-by-hop ones and those `keep` refuses.
fn copy_headers(from: &HeaderMap, keep: impl Fn(&str) -> bool) -> reqwest::header::HeaderMap {
    let mut headers = reqwest::header::HeaderMap::new();
    for (name, value) in from {
        if !HOP_BY_HOP.contains(&name.as_str()) && keep(name.as_str()) {
            headers.append(name.clone(), value.clone());
        }
    }
    headers
}

/// `X-Azure-Functions-HostVersion` and `X-Azure-Functions-InvocationId`, and in proxying mode
/// also `x-ms-invocation-id`, replacing any the caller sent.
fn add_invocation_headers(
    headers: &mut reqwest::header::HeaderMap,
    invocation_id: &str,
    proxy: bool,
) {
    let id = HeaderValue::from_str(invocation_id).expect("uuid is a header value");
    headers.insert(
        "x-azure-functions-hostversion",
        HeaderValue::from_static(HOST_VERSION),
    );
    headers.insert("x-azure-functions-invocationid", id.clone());
    if proxy {
        headers.insert("x-ms-invocation-id", id);
    }
}

/// The handler's raw answer as the caller's response (any status is an answer), or the host's
/// own 500 when the invocation failed.
fn raw_answer(
    log: &HostLog,
    tag: &str,
    answer: Result<RawResponse, super::invoke::InvokeError>,
) -> Response {
    match answer {
        Ok(raw) => {
            let mut response = Response::builder().status(raw.status);
            for (name, value) in &raw.headers {
                if !HOP_BY_HOP.contains(&name.as_str()) {
                    response = response.header(name, value);
                }
            }
            response
                .body(Body::from(raw.body))
                .unwrap_or_else(|e| failure(log, tag, e))
        }
        Err(e) => failure(log, tag, e),
    }
}

fn title_case(name: &str) -> String {
    name.split('-')
        .map(|w| {
            let mut c = w.chars();
            match c.next() {
                Some(f) => f.to_ascii_uppercase().to_string() + c.as_str(),
                None => String::new(),
            }
        })
        .collect::<Vec<_>>()
        .join("-")
}

fn group_headers(headers: &HeaderMap) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for (name, value) in headers {
        // hyper lower-cases names; Title-Case is what clients usually send and Kestrel keeps.
        let name = title_case(name.as_str());
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        match out.iter_mut().find(|(n, _)| *n == name) {
            Some((_, vs)) => vs.push(value),
            None => out.push((name, vec![value])),
        }
    }
    out
}

#[allow(clippy::too_many_arguments)]
async fn payload<S: QueueStore>(
    front: &Front<S>,
    instance: &FrontInstance,
    route: &HttpRoute<S>,
    invocation_id: &str,
    parts: &axum::http::request::Parts,
    body: Option<Bytes>,
    params: BTreeMap<String, String>,
    tag: &str,
) -> Response {
    let host = parts
        .headers
        .get("host")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("localhost");
    let info = HttpRequestInfo {
        url: format!(
            "http://{host}{}{}",
            parts.uri.path(),
            parts
                .uri
                .query()
                .map(|q| format!("?{q}"))
                .unwrap_or_default()
        ),
        method: parts.method.as_str().to_string(),
        query: parse_query(parts.uri.query()).into_iter().collect(),
        headers: group_headers(&parts.headers),
        params,
        content_type: parts
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
        body: body.map(|b| b.to_vec()),
    };
    let sys = SysData::now(&route.function.name);
    let envelope = http_payload(&route.binding, &info, &sys);
    let result = match instance
        .invoker
        .invoke_payload(&route.function.name, invocation_id, envelope)
        .await
    {
        Ok(r) => r,
        Err(e) => return failure(&front.log, tag, e),
    };
    let category = user_category(&route.function.name);
    for line in &result.logs {
        front
            .log
            .category(LogLevel::Information, &category, tag, line);
    }
    let values = effective_outputs(&route.outputs, &result);
    if let Err(e) = write_queue_outputs(&route.outputs, &values, front.encoding).await {
        return failure(&front.log, tag, e);
    }
    let Some(http) = route
        .outputs
        .iter()
        .find(|o| matches!(o.target, OutputTarget::Http))
    else {
        return Response::builder()
            .status(StatusCode::NO_CONTENT)
            .body(Body::empty())
            .expect("response");
    };
    let out = match http_output(values.get(&http.name)) {
        Ok(o) => o,
        Err(e) => return failure(&front.log, tag, e),
    };
    let mut response = Response::builder().status(out.status);
    let mut has_type = false;
    for (name, value) in &out.headers {
        let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) else {
            return failure(&front.log, tag, format!("invalid response header {name:?}"));
        };
        has_type |= n == "content-type";
        response = response.header(n, v);
    }
    if !has_type && !out.body.is_empty() {
        response = response.header("content-type", "text/plain; charset=utf-8");
    }
    response
        .body(Body::from(out.body))
        .unwrap_or_else(|e| failure(&front.log, tag, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parsing_joins_repeats() {
        assert_eq!(
            parse_query(Some("a=1&b=x%20y&a=2&c")),
            vec![
                ("a".into(), "1,2".into()),
                ("b".into(), "x y".into()),
                ("c".into(), "".into())
            ]
        );
        assert_eq!(encode_component("x y/ü"), "x%20y%2F%C3%BC");
        assert_eq!(
            title_case("x-azure-functions-invocationid"),
            "X-Azure-Functions-Invocationid"
        );
    }
}
