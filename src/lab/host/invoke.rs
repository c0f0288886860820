//! Sending one invocation to the handler: payload mode (§3), forwarding mode (§5.1) and proxying
//! mode (§5.2), with the function timeout that restarts the handler (§6).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::log::HostLog;
use super::payload::{parse_invocation_response, InvocationResult, ResponseProblem};
use super::worker::Worker;
use crate::redact::error_chain;

/// What this host reports as its version (`X-Azure-Functions-HostVersion`, `User-Agent`).
pub const HOST_VERSION: &str = "4.0.0.0";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InvokeError {
    /// No ready handler (stopped or given up).
    Unavailable(String),
    /// The invocation exceeded functionTimeout; the handler was restarted.
    Timeout,
    /// The handler was restarted or died while this invocation ran.
    HandlerRestarted,
    /// Connection-level failure talking to the handler.
    Transport(String),
    /// The handler refused the connection (nothing was sent).
    Connect(String),
    /// The handler answered, but not a result the host accepts.
    Response(ResponseProblem),
}

impl std::fmt::Display for InvokeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InvokeError::Unavailable(w) => write!(f, "handler unavailable: {w}"),
            InvokeError::Timeout => f.write_str("function timeout"),
            InvokeError::HandlerRestarted => {
                f.write_str("the handler process was restarted during the invocation")
            }
            InvokeError::Transport(e) | InvokeError::Connect(e) => {
                write!(f, "request to handler failed: {e}")
            }
            InvokeError::Response(p) => write!(f, "{p}"),
        }
    }
}

/// The host's proxy retries a request the handler's socket refused this many times in all
/// (`RetryProxyHandler.MaxRetries`), waiting 50 ms, doubling up to 250 ms, in between.
pub const PROXY_ATTEMPTS: u32 = 10;
const PROXY_FIRST_DELAY: Duration = Duration::from_millis(50);
const PROXY_MAX_DELAY: Duration = Duration::from_millis(250);

/// An HTTP request sent to the handler as it is (forwarding and proxying modes).
#[derive(Debug, Clone)]
pub struct RawRequest {
    pub method: reqwest::Method,
    /// Path and query on the handler.
    pub path_and_query: String,
    pub headers: reqwest::header::HeaderMap,
    pub body: Option<Bytes>,
}

/// A handler's raw HTTP answer (forwarding and proxying modes).
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Bytes,
}

/// Sends invocations to one instance's handler.
pub struct Invoker {
    pub worker: Arc<Worker>,
    client: reqwest::Client,
    pub function_timeout: Duration,
    pub log: HostLog,
    pub label: String,
}

impl Invoker {
    pub fn new(
        worker: Arc<Worker>,
        function_timeout: Duration,
        log: HostLog,
        label: String,
    ) -> Invoker {
        let client = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            // The host's HttpClient timeout is functionTimeout + 1 minute; ours fires first anyway.
            .timeout(function_timeout + Duration::from_secs(60))
            .build()
            .expect("http client");
        Invoker {
            worker,
            client,
            function_timeout,
            log,
            label,
        }
    }

    /// Runs `send` against the current handler under the function timeout. On timeout, or when
    /// the handler answers with no result (which the real host waits out), the handler is
    /// restarted, failing every invocation in flight on it.
    async fn run<T, F, Fut>(
        &self,
        function: &str,
        invocation_id: &str,
        send: F,
    ) -> Result<T, InvokeError>
    where
        F: FnOnce(reqwest::Client, u16) -> Fut,
        Fut: std::future::Future<Output = Result<T, InvokeError>>,
    {
        let deadline = Instant::now() + self.function_timeout;
        // Waiting for a (re)starting handler counts against the timeout but cannot trigger a restart.
        let (generation, port) = match tokio::time::timeout_at(deadline, self.worker.ready()).await
        {
            Ok(Ok(ready)) => ready,
            Ok(Err(why)) => return Err(InvokeError::Unavailable(why)),
            Err(_) => {
                return Err(InvokeError::Unavailable(
                    "handler not ready within functionTimeout".into(),
                ))
            }
        };
        let outcome = tokio::select! {
            r = send(self.client.clone(), port) => Some(r),
            _ = tokio::time::sleep_until(deadline) => None,
            _ = self.worker.generation_ended(generation) => return Err(InvokeError::HandlerRestarted),
        };
        match outcome {
            Some(Err(InvokeError::Response(ResponseProblem::NoResult))) => {
                self.log.error(format!(
                    "{} [{function}] [{invocation_id}] !!! {} (waiting out functionTimeout like the host)",
                    self.label,
                    ResponseProblem::NoResult
                ));
                tokio::select! {
                    _ = tokio::time::sleep_until(deadline) => {}
                    _ = self.worker.generation_ended(generation) => return Err(InvokeError::HandlerRestarted),
                }
                self.timeout_restart(function, invocation_id, generation);
                Err(InvokeError::Timeout)
            }
            Some(r) => r,
            None => {
                self.timeout_restart(function, invocation_id, generation);
                Err(InvokeError::Timeout)
            }
        }
    }

    fn timeout_restart(&self, function: &str, invocation_id: &str, generation: u64) {
        self.log.error(format!(
            "{} [{function}] [{invocation_id}] Timeout value of {:?} exceeded by function '{function}' (Id: '{invocation_id}'). \
             A function timeout has occurred. Restarting worker process executing invocationId '{invocation_id}'.",
            self.label, self.function_timeout
        ));
        self.worker.restart(
            generation,
            format!("function timeout in {function} ({invocation_id})"),
        );
    }

    /// Payload mode: `POST /{function}` with the envelope, chunked, with the host headers.
    pub async fn invoke_payload(
        &self,
        function: &str,
        invocation_id: &str,
        body: String,
    ) -> Result<InvocationResult, InvokeError> {
        let f = function.to_string();
        let id = invocation_id.to_string();
        self.run(function, invocation_id, move |client, port| async move {
            // A one-chunk stream has no known length, so the body goes out chunked like the host's.
            let stream =
                futures::stream::once(async move { Ok::<_, std::io::Error>(Bytes::from(body)) });
            let response = client
                .post(format!("http://127.0.0.1:{port}/{f}"))
                .header("X-Azure-Functions-HostVersion", HOST_VERSION)
                .header("X-Azure-Functions-InvocationId", &id)
                .header("User-Agent", format!("Azure-Functions-Host/{HOST_VERSION}"))
                .header("Content-Type", "application/json; charset=utf-8")
                .body(reqwest::Body::wrap_stream(stream))
                .send()
                .await
                .map_err(transport)?;
            let status = response.status().as_u16();
            let content_type = response
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let bytes = response.bytes().await.map_err(transport)?;
            parse_invocation_response(status, content_type.as_deref(), &bytes)
                .map_err(InvokeError::Response)
        })
        .await
    }

    /// Forwarding mode: the original request to the same path on the handler; any answer
    /// (including non-2xx) is the result.
    pub async fn forward(
        &self,
        function: &str,
        invocation_id: &str,
        request: RawRequest,
    ) -> Result<RawResponse, InvokeError> {
        self.run(function, invocation_id, move |client, port| {
            send_raw(client, port, request)
        })
        .await
    }

    /// Proxying mode: like [`Invoker::forward`], but a refused connection is retried, as the
    /// host's proxy does (up to [`PROXY_ATTEMPTS`] attempts).
    pub async fn proxy(
        &self,
        function: &str,
        invocation_id: &str,
        request: RawRequest,
    ) -> Result<RawResponse, InvokeError> {
        self.run(function, invocation_id, move |client, port| async move {
            let mut delay = PROXY_FIRST_DELAY;
            let mut attempt = 1;
            loop {
                match send_raw(client.clone(), port, request.clone()).await {
                    Err(InvokeError::Connect(_)) if attempt < PROXY_ATTEMPTS => {
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(PROXY_MAX_DELAY);
                        attempt += 1;
                    }
                    other => return other,
                }
            }
        })
        .await
    }
}

/// Sends `request` to the handler on `port` and reads its whole answer.
async fn send_raw(
    client: reqwest::Client,
    port: u16,
    request: RawRequest,
) -> Result<RawResponse, InvokeError> {
    let mut outgoing = client
        .request(
            request.method,
            format!("http://127.0.0.1:{port}{}", request.path_and_query),
        )
        .headers(request.headers);
    if let Some(body) = request.body {
        outgoing = outgoing.body(body);
    }
    let response = outgoing.send().await.map_err(transport)?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.bytes().await.map_err(transport)?;
    Ok(RawResponse {
        status,
        headers,
        body,
    })
}

/// A failed exchange with the handler; [`InvokeError::Connect`] when nothing could be sent.
fn transport(e: reqwest::Error) -> InvokeError {
    if e.is_connect() {
        InvokeError::Connect(error_chain(&e))
    } else {
        InvokeError::Transport(error_chain(&e))
    }
}

/// The function timeout on tokio's paused clock, against a worker without a process
/// ([`Worker::without_process`]): what ends an invocation, and when.
#[cfg(test)]
mod tests {
    use std::future::pending;

    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(3);

    fn invoker(port: Option<u16>) -> (Invoker, Arc<std::sync::Mutex<Vec<String>>>, HostLog) {
        let (worker, restarts) = Worker::without_process(port);
        let log = HostLog::new(true, Default::default());
        let invoker = Invoker::new(worker, TIMEOUT, log.clone(), "[i0]".into());
        (invoker, restarts, log)
    }

    /// Lets the worker's task act on what it was sent (the paused clock jumps ahead when idle).
    async fn settle() {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_invocation_ends_at_the_function_timeout_and_restarts_its_handler() {
        let (invoker, restarts, log) = invoker(Some(1));
        let start = Instant::now();
        let ended = invoker
            .run("Work", "a", |_, _| pending::<Result<(), _>>())
            .await;
        assert_eq!(ended, Err(InvokeError::Timeout));
        assert_eq!(start.elapsed(), TIMEOUT);
        settle().await;
        assert_eq!(*restarts.lock().unwrap(), ["function timeout in Work (a)"]);
        assert_eq!(invoker.worker.state().generation, 2);
        let lines = log.lines();
        assert!(
            lines[0].contains("Timeout value of 3s exceeded by function 'Work' (Id: 'a')")
                && lines[0].contains("Restarting worker process executing invocationId 'a'"),
            "{lines:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_invocation_in_flight_fails_at_another_ones_timeout_restart_not_at_its_own() {
        let (invoker, restarts, log) = invoker(Some(1));
        let first = invoker.run("Work", "a", |_, _| pending::<Result<(), _>>());
        let second = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let started = Instant::now();
            let ended = invoker
                .run("Work", "b", |_, _| pending::<Result<(), _>>())
                .await;
            (ended, started.elapsed())
        };
        let (first, (second, second_ran)) = tokio::join!(first, second);
        assert_eq!(first, Err(InvokeError::Timeout));
        assert_eq!(second, Err(InvokeError::HandlerRestarted));
        assert_eq!(
            second_ran,
            TIMEOUT - Duration::from_secs(1),
            "ended with the first"
        );
        settle().await;
        assert_eq!(*restarts.lock().unwrap(), ["function timeout in Work (a)"]);
        assert_eq!(log.lines().len(), 1, "one timeout: {:?}", log.lines());
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_without_result_is_waited_out_to_the_timeout_then_restarts() {
        let (invoker, restarts, log) = invoker(Some(1));
        let start = Instant::now();
        let ended = invoker
            .run("Work", "a", |_, _| async {
                tokio::time::sleep(Duration::from_millis(200)).await;
                Err::<(), _>(InvokeError::Response(ResponseProblem::NoResult))
            })
            .await;
        assert_eq!(ended, Err(InvokeError::Timeout));
        assert_eq!(
            start.elapsed(),
            TIMEOUT,
            "waited out from the invocation's start"
        );
        settle().await;
        assert_eq!(restarts.lock().unwrap().len(), 1);
        let lines = log.lines();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].contains("!!!") && lines[0].contains("waiting out functionTimeout"));
        assert!(lines[1].contains("A function timeout has occurred"));
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_before_the_timeout_is_the_result_and_restarts_nothing() {
        let (invoker, restarts, log) = invoker(Some(1));
        let start = Instant::now();
        let ended = invoker
            .run("Work", "a", |_, port| async move {
                tokio::time::sleep(TIMEOUT - Duration::from_millis(1)).await;
                Ok(port)
            })
            .await;
        assert_eq!(ended, Ok(1));
        assert_eq!(start.elapsed(), TIMEOUT - Duration::from_millis(1));
        settle().await;
        assert!(restarts.lock().unwrap().is_empty());
        assert_eq!(invoker.worker.state().generation, 1);
        assert!(log.lines().is_empty(), "{:?}", log.lines());
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_for_a_starting_handler_counts_against_the_timeout_but_restarts_nothing() {
        let (invoker, restarts, _) = invoker(None);
        let start = Instant::now();
        let ended = invoker.run("Work", "a", |_, _| async { Ok(()) }).await;
        assert!(
            matches!(&ended, Err(InvokeError::Unavailable(why)) if why.contains("not ready within functionTimeout")),
            "{ended:?}"
        );
        assert_eq!(start.elapsed(), TIMEOUT);
        settle().await;
        assert!(restarts.lock().unwrap().is_empty());
    }
}
