//! A storage proxy for tests and benchmarks: sits between a client (the handler, the host) and
//! Azurite, counts every request by kind and table/queue, and injects faults the way Azure
//! produces them — 503 ServerBusy and 500 OperationTimedOut with the service's real error bodies,
//! slow responses, and connection resets before or after the request reached storage.
//!
//! It fronts the table and queue services, and the blob service too when started with
//! [`StorageProxy::start_with_blob`] (export and import): blob requests are counted by kind
//! ([`BlobRequestKind`]) and container, and faulted like the others.
//!
//! A test can also hold requests at a known point ([`StorageProxy::hold`], see `gate`): they
//! wait in the proxy until released, before any fault is drawn for them.

mod classify;
mod gate;
mod in_flight;
mod throttle;
mod timeline;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::net::TcpListener;
use tokio::sync::watch;

pub use gate::{Held, Hold};
pub use in_flight::{InFlight, InFlightMark};
pub use timeline::{Stamp, Timeline};

use classify::{any_kind_name, blob_kind_name, classify, kind_name, Kind, Service};

use crate::storage::blob::BlobRequestKind;
use crate::storage::connection::{DEVELOPMENT_ACCOUNT, DEVELOPMENT_ACCOUNT_KEY};
use crate::storage::request_counts::RequestKind;

/// Probabilities (0..=1) of each fault, applied per request of the selected kinds.
#[derive(Debug, Clone, Default)]
pub struct FaultPolicy {
    /// 503 ServerBusy without forwarding.
    pub server_busy: f64,
    /// 500 OperationTimedOut without forwarding.
    pub operation_timed_out: f64,
    /// Close the connection without forwarding.
    pub reset_before: f64,
    /// Forward, then close the connection instead of answering: the request took effect but the
    /// client cannot know (the hardest case for idempotency).
    pub reset_after: f64,
    /// Delay the response by a random time up to `max_delay`.
    pub delay: f64,
    pub max_delay: Duration,
    /// Only table and queue requests of these kinds are faulted. With `kinds` and `blob_kinds`
    /// both empty, requests of every kind are (blob requests included).
    pub kinds: Vec<RequestKind>,
    /// Only blob requests of these kinds are faulted (see `kinds`): a policy that names only
    /// `kinds` faults no blob request, one that names only `blob_kinds` no table or queue one.
    pub blob_kinds: Vec<BlobRequestKind>,
    /// Queue puts only: with this probability, forward the put 1..=`extra_copies` more times
    /// (at least once), as a producer that retried a put whose answer it lost would — every copy
    /// is a real message.
    pub duplicate_puts: f64,
    pub extra_copies: u32,
    /// Policies that replace this one for particular kinds (the first match wins), e.g. to spare
    /// queue receives from `reset_after`, which would hide messages for the 10-minute visibility.
    pub per_kind: Vec<(RequestKind, FaultPolicy)>,
    /// No failure, reset or delay is injected once this many have been (since the policy was
    /// set, at start or by `set_faults`): `Some(1)` faults only the first request that draws
    /// one (an answer lost once, then the retry goes through). `None`: no bound. Read from the
    /// policy in force for the request (a `per_kind` one's own), but counted over every request
    /// any of them selected.
    pub max_faults: Option<u64>,
    /// The first this many requests of the selected kinds (since the policy was set; counted as
    /// `max_faults` is) go through unfaulted: with `max_faults`, a fault aimed at the n-th
    /// request of a call.
    pub spare_first: u64,
}

impl FaultPolicy {
    /// No faults: count only.
    pub fn none() -> Self {
        FaultPolicy::default()
    }

    fn applies_to(&self, kind: Kind) -> bool {
        if self.kinds.is_empty() && self.blob_kinds.is_empty() {
            return true;
        }
        match kind {
            Kind::Storage(k) => self.kinds.contains(&k),
            Kind::Blob(k) => self.blob_kinds.contains(&k),
        }
    }

    /// The policy in force for `kind` (`per_kind` names table and queue kinds only).
    fn for_kind(&self, kind: Kind) -> &FaultPolicy {
        let Kind::Storage(storage) = kind else {
            return self;
        };
        self.per_kind
            .iter()
            .find(|(k, _)| *k == storage)
            .map(|(_, p)| p.for_kind(kind))
            .unwrap_or(self)
    }
}

/// Request counts by kind and by the table or queue they addressed.
pub type Counts = BTreeMap<(String, String), u64>;

struct Shared {
    faults: Mutex<FaultPolicy>,
    rng: Mutex<StdRng>,
    counts: Mutex<Counts>,
    injected: AtomicU64,
    /// Requests of the selected kinds, and faults injected, since the policy was set.
    tally: Mutex<(u64, u64)>,
    /// Faults injected by request kind (`kind_name`/`blob_kind_name`).
    injected_by_kind: Mutex<BTreeMap<&'static str, u64>>,
    duplicated: AtomicU64,
    /// Table and blob requests in flight (queue requests, mostly the host's polls, are not).
    in_flight: InFlight,
    /// When each request arrived, once started (rate measurements).
    timeline: Timeline,
    /// Requests held until a test lets them through.
    gate: gate::Gate,
    /// Table requests above a set rate refused (`throttle`).
    throttle: throttle::Throttle,
    client: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
}

/// A running proxy for one Azurite (table and queue services, and optionally blobs). Stops
/// when dropped.
pub struct StorageProxy {
    table_addr: SocketAddr,
    queue_addr: SocketAddr,
    blob_addr: Option<SocketAddr>,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
}

fn error_response(
    service: Service,
    status: StatusCode,
    code: &str,
    message: &str,
) -> Response<Full<Bytes>> {
    let request_id = uuid::Uuid::new_v4();
    let (content_type, body) = match service {
        Service::Table => (
            "application/json;odata=minimalmetadata;streaming=true;charset=utf-8",
            serde_json::json!({"odata.error": {"code": code, "message": {"lang": "en-US", "value": format!("{message}\nRequestId:{request_id}")}}}).to_string(),
        ),
        Service::Queue | Service::Blob => (
            "application/xml",
            format!("<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>{code}</Code><Message>{message}\nRequestId:{request_id}</Message></Error>"),
        ),
    };
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .header("x-ms-error-code", code)
        .header("x-ms-request-id", request_id.to_string())
        .body(Full::new(Bytes::from(body)))
        .expect("valid response")
}

/// The queue service's answer to a receive that finds no message (in the API version the
/// request named, with the headers the service always sends).
fn no_messages(version: Option<&hyper::header::HeaderValue>) -> Response<Full<Bytes>> {
    let date = httpdate::fmt_http_date(std::time::SystemTime::now());
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/xml")
        .header("x-ms-request-id", uuid::Uuid::new_v4().to_string())
        .header(
            "x-ms-version",
            version
                .cloned()
                .unwrap_or(hyper::header::HeaderValue::from_static("2019-12-12")),
        )
        .header("date", date)
        .header("server", "Windows-Azure-Queue/1.0 Microsoft-HTTPAPI/2.0")
        .body(Full::new(Bytes::from_static(
            b"<?xml version=\"1.0\" encoding=\"utf-8\"?><QueueMessagesList></QueueMessagesList>",
        )))
        .expect("valid response")
}

enum Fault {
    None,
    ServerBusy,
    TimedOut,
    ResetBefore,
    ResetAfter,
    Delay(Duration),
}

impl Shared {
    fn pick_fault(&self, kind: Kind) -> Fault {
        let policy = self.faults.lock().unwrap().for_kind(kind).clone();
        if !policy.applies_to(kind) {
            return Fault::None;
        }
        let mut tally = self.tally.lock().unwrap();
        tally.0 += 1;
        if tally.0 <= policy.spare_first || policy.max_faults.is_some_and(|max| tally.1 >= max) {
            return Fault::None;
        }
        let mut rng = self.rng.lock().unwrap();
        let mut roll = |p: f64| p > 0.0 && rng.gen_bool(p.min(1.0));
        let fault = if roll(policy.server_busy) {
            Fault::ServerBusy
        } else if roll(policy.operation_timed_out) {
            Fault::TimedOut
        } else if roll(policy.reset_before) {
            Fault::ResetBefore
        } else if roll(policy.reset_after) {
            Fault::ResetAfter
        } else if roll(policy.delay) && !policy.max_delay.is_zero() {
            Fault::Delay(Duration::from_millis(
                rng.gen_range(0..=policy.max_delay.as_millis() as u64),
            ))
        } else {
            Fault::None
        };
        if !matches!(fault, Fault::None) {
            tally.1 += 1;
            self.injected.fetch_add(1, Ordering::Relaxed);
            *self
                .injected_by_kind
                .lock()
                .unwrap()
                .entry(any_kind_name(kind))
                .or_default() += 1;
        }
        fault
    }

    /// Extra copies to put of a queue message that is being forwarded.
    fn pick_duplicates(&self, kind: Kind) -> u32 {
        if kind != Kind::Storage(RequestKind::QueuePut) {
            return 0;
        }
        let policy = self.faults.lock().unwrap().for_kind(kind).clone();
        let p = policy.duplicate_puts;
        if !policy.applies_to(kind) || p <= 0.0 || !self.rng.lock().unwrap().gen_bool(p.min(1.0)) {
            return 0;
        }
        let copies = self
            .rng
            .lock()
            .unwrap()
            .gen_range(1..=policy.extra_copies.max(1));
        self.injected
            .fetch_add(u64::from(copies), Ordering::Relaxed);
        self.duplicated
            .fetch_add(u64::from(copies), Ordering::Relaxed);
        copies
    }
}

#[derive(Debug)]
struct Reset;

impl std::fmt::Display for Reset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection reset by the fault proxy")
    }
}

impl std::error::Error for Reset {}

async fn handle(
    service: Service,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Reset> {
    let _in_flight = (service != Service::Queue).then(|| shared.in_flight.enter());
    let (parts, body) = request.into_parts();
    let body = body.collect().await.map_err(|_| Reset)?.to_bytes();
    let path = parts.uri.path().to_string();
    let query = parts.uri.query().unwrap_or("").to_string();
    let (kind, resource) = classify(service, &parts.method, &path, &query, &body);
    shared.timeline.record(
        any_kind_name(kind),
        &resource,
        &format!("{path}?{query}"),
        &body,
    );
    *shared
        .counts
        .lock()
        .unwrap()
        .entry((any_kind_name(kind).to_string(), resource.clone()))
        .or_default() += 1;

    if shared.gate.hides(kind, &resource) {
        return Ok(no_messages(parts.headers.get("x-ms-version")));
    }
    shared.gate.pass(kind, &resource).await;
    if shared.throttle.refuses(service) {
        return Ok(throttle::over_the_limit(service));
    }
    let fault = shared.pick_fault(kind);
    match fault {
        Fault::ServerBusy => {
            return Ok(error_response(
                service,
                StatusCode::SERVICE_UNAVAILABLE,
                "ServerBusy",
                "The server is busy.",
            ))
        }
        Fault::TimedOut => {
            return Ok(error_response(
                service,
                StatusCode::INTERNAL_SERVER_ERROR,
                "OperationTimedOut",
                "Operation could not be completed within the specified time.",
            ))
        }
        Fault::ResetBefore => return Err(Reset),
        Fault::Delay(d) => tokio::time::sleep(d).await,
        Fault::None | Fault::ResetAfter => {}
    }
    let uri = format!(
        "http://{upstream}{}",
        parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/")
    );
    let build = |body: Bytes| {
        let mut forward = Request::builder().method(parts.method.clone()).uri(&uri);
        for (name, value) in &parts.headers {
            if name != hyper::header::HOST {
                forward = forward.header(name, value);
            }
        }
        // Azurite checks the Host header against the URL it signs; keep the client's view of it.
        if let Some(host) = parts.headers.get(hyper::header::HOST) {
            forward = forward.header(hyper::header::HOST, host);
        }
        forward.body(Full::new(body)).map_err(|_| Reset)
    };
    for _ in 0..shared.pick_duplicates(kind) {
        let copy = shared
            .client
            .request(build(body.clone())?)
            .await
            .map_err(|_| Reset)?;
        // Drain it so the pooled connection can be reused.
        let _ = copy.into_body().collect().await;
    }
    let forward = build(body)?;
    let response = shared.client.request(forward).await.map_err(|_| Reset)?;
    let (parts, body) = response.into_parts();
    let body = body.collect().await.map_err(|_| Reset)?.to_bytes();
    if matches!(fault, Fault::ResetAfter) {
        return Err(Reset);
    }
    Ok(Response::from_parts(parts, Full::new(body)))
}

async fn serve(
    listener: TcpListener,
    service: Service,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.changed() => return,
        };
        let Ok((stream, _)) = accepted else { continue };
        let shared = shared.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| handle(service, upstream, shared.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

impl StorageProxy {
    /// Starts proxies on free loopback ports in front of Azurite's table and queue services.
    pub async fn start(
        table_upstream: SocketAddr,
        queue_upstream: SocketAddr,
        faults: FaultPolicy,
        seed: u64,
    ) -> std::io::Result<StorageProxy> {
        Self::start_services(table_upstream, queue_upstream, None, faults, seed).await
    }

    /// [`StorageProxy::start`], and a third proxy in front of Azurite's blob service: the
    /// connection string then names it as `BlobEndpoint`.
    pub async fn start_with_blob(
        table_upstream: SocketAddr,
        queue_upstream: SocketAddr,
        blob_upstream: SocketAddr,
        faults: FaultPolicy,
        seed: u64,
    ) -> std::io::Result<StorageProxy> {
        Self::start_services(
            table_upstream,
            queue_upstream,
            Some(blob_upstream),
            faults,
            seed,
        )
        .await
    }

    async fn start_services(
        table_upstream: SocketAddr,
        queue_upstream: SocketAddr,
        blob_upstream: Option<SocketAddr>,
        faults: FaultPolicy,
        seed: u64,
    ) -> std::io::Result<StorageProxy> {
        let table_listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let queue_listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let blob_listener = match blob_upstream {
            Some(_) => Some(TcpListener::bind(("127.0.0.1", 0)).await?),
            None => None,
        };
        let shared = Arc::new(Shared {
            faults: Mutex::new(faults),
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            counts: Mutex::new(Counts::new()),
            injected: AtomicU64::new(0),
            tally: Mutex::new((0, 0)),
            injected_by_kind: Mutex::new(BTreeMap::new()),
            duplicated: AtomicU64::new(0),
            in_flight: InFlight::default(),
            timeline: Timeline::default(),
            gate: gate::Gate::default(),
            throttle: Default::default(),
            client: Client::builder(TokioExecutor::new()).build_http(),
        });
        let (stop, _) = watch::channel(false);
        let proxy = StorageProxy {
            table_addr: table_listener.local_addr()?,
            queue_addr: queue_listener.local_addr()?,
            blob_addr: blob_listener.as_ref().map(|l| l.local_addr()).transpose()?,
            shared: shared.clone(),
            stop,
        };
        let listeners = [
            (Some(table_listener), Service::Table, Some(table_upstream)),
            (Some(queue_listener), Service::Queue, Some(queue_upstream)),
            (blob_listener, Service::Blob, blob_upstream),
        ];
        for (listener, service, upstream) in listeners {
            if let (Some(listener), Some(upstream)) = (listener, upstream) {
                tokio::spawn(serve(
                    listener,
                    service,
                    upstream,
                    shared.clone(),
                    proxy.stop.subscribe(),
                ));
            }
        }
        Ok(proxy)
    }

    /// The gauge of table and blob requests in flight through this proxy.
    pub fn timeline(&self) -> &Timeline {
        &self.shared.timeline
    }

    pub fn in_flight(&self) -> &InFlight {
        &self.shared.in_flight
    }

    /// A connection string for the development account that goes through this proxy (its
    /// `BlobEndpoint` too when it fronts the blob service).
    pub fn connection_string(&self) -> String {
        let blob = self
            .blob_addr
            .map(|a| format!("BlobEndpoint=http://{a}/{DEVELOPMENT_ACCOUNT};"))
            .unwrap_or_default();
        format!(
            "DefaultEndpointsProtocol=http;AccountName={DEVELOPMENT_ACCOUNT};AccountKey={DEVELOPMENT_ACCOUNT_KEY};TableEndpoint=http://{}/{DEVELOPMENT_ACCOUNT};QueueEndpoint=http://{}/{DEVELOPMENT_ACCOUNT};{blob}",
            self.table_addr, self.queue_addr
        )
    }

    /// Replaces the fault policy (e.g. to turn faults off before verifying).
    pub fn set_faults(&self, faults: FaultPolicy) {
        *self.shared.faults.lock().unwrap() = faults;
        *self.shared.tally.lock().unwrap() = (0, 0);
    }

    /// From now on, the requests `hold` matches wait in the proxy (counted, see [`Held`]) until
    /// another hold that does not match them replaces it, or [`StorageProxy::release`]. Held
    /// requests are checked before faults are drawn, and forwarded unchanged once let through.
    pub fn hold(&self, hold: Hold) {
        self.shared.gate.set(Some(hold));
    }

    /// Lets every held request through, and holds no more.
    pub fn release(&self) {
        self.shared.gate.set(None);
    }

    /// Receives from `queues` find no message (answered by the proxy: the messages wait
    /// untouched, and the host polling them can stop) until another call; `&[]` shows them all.
    pub fn hide_messages(&self, queues: &[&str]) {
        self.shared.gate.hide(queues);
    }

    /// Requests held so far (waiting now, and in all).
    pub fn held(&self) -> Held {
        *self.shared.gate.held().borrow()
    }

    /// Waits until the requests held satisfy `until` (e.g. `|h| h.now >= 1`); the count then.
    /// Unbounded: a test wraps it in its own bound.
    pub async fn wait_held(&self, until: impl FnMut(&Held) -> bool) -> Held {
        let mut held = self.shared.gate.held();
        let seen = *held
            .wait_for(until)
            .await
            .expect("the gate lives as long as the proxy");
        seen
    }

    /// Requests seen so far, by (kind, table or queue).
    pub fn counts(&self) -> Counts {
        self.shared.counts.lock().unwrap().clone()
    }

    /// Requests seen so far of one kind, over all tables and queues.
    pub fn count_of(&self, kind: RequestKind) -> u64 {
        let name = kind_name(kind);
        self.counts()
            .iter()
            .filter(|((k, _), _)| k == name)
            .map(|(_, n)| n)
            .sum()
    }

    /// Blob requests seen so far of one kind, over all containers.
    pub fn count_of_blob(&self, kind: BlobRequestKind) -> u64 {
        let name = blob_kind_name(kind);
        self.counts()
            .iter()
            .filter(|((k, _), _)| k == name)
            .map(|(_, n)| n)
            .sum()
    }

    /// Faults injected so far by request kind (`"query"`, `"blob_write"`, …; duplicated puts
    /// are not included).
    pub fn faults_by_kind(&self) -> BTreeMap<&'static str, u64> {
        self.shared.injected_by_kind.lock().unwrap().clone()
    }

    /// Faults injected so far (each extra copy of a duplicated put counts as one).
    pub fn faults_injected(&self) -> u64 {
        self.shared.injected.load(Ordering::Relaxed)
    }

    /// Extra queue messages created by `duplicate_puts`.
    pub fn duplicates_put(&self) -> u64 {
        self.shared.duplicated.load(Ordering::Relaxed)
    }
}

impl Drop for StorageProxy {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

#[cfg(test)]
mod tests;
