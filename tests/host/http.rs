//! `tablescan host` with HTTP triggers and handler supervision, against the test handler
//! (real processes, real sockets). Queue behaviour is in `tests/host/queue.rs`.
//!
//! Each test proves its behaviour by the events that make it (log lines, the handler's records,
//! which process answered), never by how long it took: when the host's delays matter (function
//! timeout, recycle delay), their durations are unit-tested on tokio's paused clock
//! (`src/lab/host/invoke.rs`, `src/lab/host/worker.rs`). `LONG` only catches a hang.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::support::host::*;
use serde_json::{json, Value};
use tablescan::lab::host::{Host, HostConfig, NoStorage, RunningHost};

const LONG: Duration = Duration::from_secs(60);

fn http_fn(route: &str, methods: Value) -> Value {
    json!({ "bindings": [
        { "name": "req", "type": "httpTrigger", "direction": "in", "authLevel": "function", "route": route, "methods": methods },
        { "name": "res", "type": "http", "direction": "out" }
    ]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_passes_method_path_query_headers_and_body() {
    let app = App::new(json!({}), json!({ "enableForwardingHttpRequest": true }))
        .function("Echo", http_fn("items/{id}", json!(["post", "get"])));
    let host = app.start_http().await.unwrap();
    let base = format!("http://{}", host.http_addr());
    let client = http_client();

    let response = client
        .post(format!("{base}/api/items/42?b=2&a=x%20y&a=z"))
        .header("X-Custom", "custom value")
        .header("User-Agent", "tester/1")
        .header("X-Test-Status", "418")
        .header("Content-Type", "text/plain")
        .body("hello body")
        .send()
        .await
        .unwrap();
    // Non-2xx is not a failure in forwarding mode: the handler's answer comes back as is.
    assert_eq!(response.status().as_u16(), 418);
    assert_eq!(response.headers()["x-test-echo"], "1");
    let echo: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    assert_eq!(echo["method"], "POST");
    assert_eq!(echo["path"], "/api/items/42");
    // Query rebuilt from the parsed dictionary: repeated keys joined with ',' and re-encoded.
    assert_eq!(echo["query"], "b=2&a=x%20y%2Cz");
    assert_eq!(echo["body"], "hello body");
    assert_eq!(header(&echo, "x-custom"), Some("custom value"));
    assert_eq!(header(&echo, "content-type"), Some("text/plain"));
    assert_eq!(header(&echo, "content-length"), Some("10"));
    assert_eq!(
        header(&echo, "host"),
        Some(host.http_addr().to_string().as_str())
    );
    assert_host_headers(&echo, "tester/1 Azure-Functions-Host/4.0.0.0");

    let response = client
        .get(format!("{base}/api/items/7"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let echo: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    assert_eq!(echo["method"], "GET");
    assert_eq!(echo["body"], "");
    assert_eq!(echo["query"], Value::Null);

    // Method not in function.json, unknown route, missing prefix.
    assert_eq!(
        client
            .delete(format!("{base}/api/items/7"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        405
    );
    assert_eq!(
        client
            .get(format!("{base}/api/nothing"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        404
    );
    assert_eq!(
        client
            .get(format!("{base}/items/7"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        404
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payload_mode_wraps_the_request_and_builds_the_response_from_res() {
    let app = App::new(
        json!({ "extensions": { "http": { "routePrefix": "v1" } } }),
        json!({}),
    )
    .function("MakeThing", http_fn("things/{kind}", json!(["post"])));
    let host = app.start_http().await.unwrap();
    let base = format!("http://{}", host.http_addr());
    let commands = json!({
        "outputs": { "res": { "statusCode": "201", "headers": { "Location": "/v1/things/x/1" }, "body": "made" } },
        "logs": ["made a thing"]
    });
    let response = http_client()
        .post(format!("{base}/v1/things/gadget?color=red"))
        .header("Content-Type", "application/json")
        .body(commands.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 201);
    assert_eq!(response.headers()["location"], "/v1/things/x/1");
    assert_eq!(response.text().await.unwrap(), "made");

    let requests = app.requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    let r = &requests[0];
    assert_eq!(r["method"], "POST");
    assert_eq!(r["path"], "/MakeThing");
    assert_eq!(
        header(r, "content-type"),
        Some("application/json; charset=utf-8")
    );
    assert_eq!(header(r, "transfer-encoding"), Some("chunked"));
    assert_eq!(header(r, "content-length"), None);
    assert_eq!(
        header(r, "user-agent"),
        Some("Azure-Functions-Host/4.0.0.0")
    );
    assert_eq!(header(r, "x-azure-functions-hostversion"), Some("4.0.0.0"));
    assert!(header(r, "x-azure-functions-invocationid").is_some());
    let envelope: Value = serde_json::from_str(r["body"].as_str().unwrap()).unwrap();
    let req = &envelope["Data"]["req"];
    assert_eq!(req["Method"], "POST");
    assert_eq!(
        req["Url"],
        format!("http://{}/v1/things/gadget?color=red", host.http_addr())
    );
    assert_eq!(req["Query"], json!({ "color": "red" }));
    assert_eq!(req["Params"], json!({ "kind": "gadget" }));
    assert_eq!(req["Body"], commands.to_string());
    assert_eq!(req["Headers"]["Content-Type"], json!(["application/json"]));
    assert_eq!(
        req["Identities"][0]["AuthenticationType"],
        "WebJobsAuthLevel"
    );
    let meta = &envelope["Metadata"];
    assert_eq!(meta["Headers"]["Content-Type"], "application/json");
    assert_eq!(meta["kind"], "\"gadget\"");
    assert_eq!(meta["sys"]["MethodName"], "MakeThing");
    assert!(has_log(&host, "made a thing"), "{:?}", host.log_lines());

    // A failing handler (non-2xx in payload mode) gives the caller a 500.
    let response = http_client()
        .post(format!("{base}/v1/things/gadget"))
        .header("Content-Type", "application/json")
        .body(json!({ "status": 400 }).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 500);
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_for_a_handler_that_listens_late_and_passes_worker_settings() {
    let app = App::new(
        json!({}),
        json!({ "enableForwardingHttpRequest": true,
                "description": { "arguments": ["--port", "%FUNCTIONS_CUSTOMHANDLER_PORT%", "%NOT_SET_ANYWHERE%x"] } }),
    )
    .function("Echo", http_fn("echo", json!(["get"])));
    let listen = app.gate("listen");
    let app = app.setting("TEST_HANDLER_LISTEN_WHEN", &listen);
    std::fs::write(
        app.dir.join("local.settings.json"),
        r#"{"IsEncrypted":false,"Values":{"TEST_FROM_LOCAL":"yes"}}"#,
    )
    .unwrap();
    let host = app.start_http().await.unwrap();
    // Sent while the handler cannot listen (its gate is closed): the host holds it until readiness.
    let url = format!("http://{}/api/echo", host.http_addr());
    let request = tokio::spawn(async move { http_client().get(url).send().await.unwrap() });
    wait_log(&host.log(), "Executing 'Echo' (GET /api/echo)", LONG).await;
    assert!(app.records("listening").is_empty());
    assert!(!request.is_finished(), "held, not answered");
    open(&listen);
    let response = request.await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    // The host took the request before the handler was ready, and forwarded it once it was.
    assert_order(&host.log_lines(), "Executing 'Echo'", "ready after");
    let events: Vec<Value> = app
        .handler_records()
        .iter()
        .map(|r| r["event"].clone())
        .collect();
    assert_eq!(events, ["start", "listening", "request"]);

    let start = app
        .handler_records()
        .into_iter()
        .find(|r| r["event"] == "start")
        .unwrap();
    let env = &start["env"];
    let port = env["FUNCTIONS_CUSTOMHANDLER_PORT"].as_str().unwrap();
    assert_eq!(start["args"], json!(["--port", port, "x"]));
    assert_eq!(env["FUNCTIONS_HTTPWORKER_PORT"], port);
    let worker_id = env["FUNCTIONS_CUSTOMHANDLER_WORKER_ID"].as_str().unwrap();
    assert!(uuid::Uuid::parse_str(worker_id).is_ok());
    assert_eq!(env["FUNCTIONS_HTTPWORKER_ID"], worker_id);
    let root = std::fs::canonicalize(&app.dir)
        .unwrap()
        .display()
        .to_string();
    assert_eq!(env["FUNCTIONS_APP_ROOT_PATH"], root);
    assert_eq!(start["cwd"], root);
    assert_eq!(env["TEST_FROM_LOCAL"], "yes");
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_a_crashed_or_killed_handler() {
    let app = App::new(json!({}), json!({})).function("Work", http_fn("work", json!(["post"])));
    let host = app.start_http().await.unwrap();
    host.wait_ready(LONG).await.unwrap();
    let url = format!("http://{}/api/work", host.http_addr());
    let client = http_client();
    let first_pid = host.handler_pids()[0].unwrap();

    // The handler exits in the middle of the invocation: the caller gets a 500, the host restarts it.
    let response = client
        .post(&url)
        .body(json!({ "crash_until": 99 }).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 500);
    let second_pid = restarted_after(&host, first_pid, "a restarted handler").await;
    host.wait_ready(LONG).await.unwrap();
    let response = client.post(&url).body("{}").send().await.unwrap();
    assert_eq!(
        response.status().as_u16(),
        200,
        "no `res` value: an empty 200"
    );

    // Killed from outside.
    kill_process(second_pid);
    restarted_after(&host, second_pid, "another restart").await;
    host.wait_ready(LONG).await.unwrap();
    answers_200(&client, &url, 1).await;
    // The handler's stderr is forwarded (by a task of its own: waited for).
    wait_log(&host.log(), "crashing on purpose", LONG).await;
    // Logged before the restart that `restarted_after` saw.
    assert!(
        has_log(&host, "killed by signal 9"),
        "{:?}",
        host.log_lines()
    );
    host.shutdown().await;
}

/// Waits for the host to give up on an instance, with the host's message.
async fn expect_give_up(host: &RunningHost, what: &str) {
    let error = tokio::time::timeout(LONG, host.failed())
        .await
        .unwrap_or_else(|_| panic!("{what}: no give-up (a hang); log: {:#?}", host.log_lines()));
    assert!(
        error
            .to_string()
            .contains("Exceeded http worker restart retry count"),
        "{error}"
    );
}

/// Waits until instance 0 runs a handler other than `pid` (the host restarted it); its pid.
async fn restarted_after(host: &RunningHost, pid: u32, what: &str) -> u32 {
    wait_for(what, LONG, || {
        let pids = host.handler_pids();
        async move { pids[0].filter(|p| *p != pid).ok_or(pids) }
    })
    .await
}

/// Kills instance 0's handler `times` times, each once it is ready; waits for each restart when
/// `restarts` (an instance that gives up at the last kill does not restart but after its recycle
/// delay). The last pid killed.
async fn kill_handler(host: &RunningHost, times: usize, restarts: bool) -> u32 {
    let mut pid = 0;
    for kill in 0..times {
        host.wait_ready(LONG).await.unwrap();
        pid = host.handler_pids()[0].unwrap();
        kill_process(pid);
        if restarts || kill + 1 < times {
            restarted_after(host, pid, "a restarted handler").await;
        }
    }
    pid
}

/// Pids of the handlers that recorded a request.
fn request_pids(app: &App) -> BTreeSet<u64> {
    app.requests()
        .iter()
        .map(|r| r["pid"].as_u64().unwrap())
        .collect()
}

/// `times` POSTs to `url`, each answered 200.
async fn answers_200(client: &reqwest::Client, url: &str, times: usize) {
    for _ in 0..times {
        let response = client.post(url).body("{}").send().await.unwrap();
        assert_eq!(response.status().as_u16(), 200);
    }
}

/// Starts a host without storage (HTTP triggers only) with `config`.
async fn start_with(config: HostConfig) -> RunningHost {
    Host::start::<NoStorage, _>(config, |_| Err("no storage in this test".into()))
        .await
        .unwrap()
}

/// Three kills within 30 minutes end one host instance, not the host: the other instance keeps
/// serving while the failed one is down (its recycle delay, an hour here, outlasts the test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_gave_up_stays_down_while_the_others_serve() {
    let app = App::new(json!({}), json!({})).function("Work", http_fn("work", json!(["post"])));
    let host = start_with(app.config(2)).await;
    kill_handler(&host, 3, false).await;
    expect_give_up(&host, "instance 0 gives up").await;
    let serving = host.handler_pids()[1].unwrap();
    answers_200(
        &http_client(),
        &format!("http://{}/api/work", host.http_addr()),
        4,
    )
    .await;
    assert_eq!(request_pids(&app), BTreeSet::from([u64::from(serving)]));
    assert_eq!(host.handler_pids()[0], None, "instance 0 is down");
    assert!(!has_log(&host, "recycling"), "{:?}", host.log_lines());
    host.shutdown().await;
}

/// After its recycle delay (its length is `worker.rs`'s paused-time test; none here) an instance
/// that gave up starts a fresh handler, serves again, and counts errors afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_gave_up_is_recycled_with_a_fresh_handler() {
    let app = App::new(json!({}), json!({})).function("Work", http_fn("work", json!(["post"])));
    let mut config = app.config(1);
    config.recycle_delay = Duration::ZERO;
    let host = start_with(config).await;
    let url = format!("http://{}/api/work", host.http_addr());
    let client = http_client();
    let given_up = "Exceeded http worker restart retry count";
    kill_handler(&host, 3, true).await;
    assert_order(
        &host.log_lines(),
        given_up,
        "[i0] recycling the host instance",
    );
    host.wait_ready(LONG).await.unwrap();
    let fresh = host.handler_pids()[0].unwrap();
    answers_200(&client, &url, 2).await;
    assert_eq!(request_pids(&app), BTreeSet::from([u64::from(fresh)]));
    // One more kill is the fresh instance's first error: a restart, not another give-up.
    kill_handler(&host, 1, true).await;
    host.wait_ready(LONG).await.unwrap();
    answers_200(&client, &url, 1).await;
    let lines = host.log_lines();
    let give_ups = lines.iter().filter(|l| l.contains(given_up)).count();
    assert_eq!(give_ups, 1, "{lines:#?}");
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gives_up_after_three_handler_failures() {
    // The instance then stays down for its recycle delay, an hour (`App::config`): no more starts.
    let app = App::new(json!({}), json!({}))
        .function("Work", http_fn("work", json!(["post"])))
        .setting("TEST_HANDLER_EXIT_AT_START", "2");
    let host = app.start_http().await.unwrap();
    expect_give_up(&host, "the host gives up").await;
    let exits = host
        .log_lines()
        .iter()
        .filter(|l| {
            l.starts_with(
                "ERROR [i0] handler error: handler exited before it was ready (exit code 2)",
            )
        })
        .count();
    assert_eq!(exits, 3, "{:?}", host.log_lines());
    let response = http_client()
        .post(format!("http://{}/api/work", host.http_addr()))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 503);
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_timeout_restarts_the_handler() {
    let app = App::new(json!({ "functionTimeout": "00:00:02" }), json!({}))
        .function("Work", http_fn("work", json!(["post"])));
    let host = app.start_http().await.unwrap();
    host.wait_ready(LONG).await.unwrap();
    let url = format!("http://{}/api/work", host.http_addr());
    let pid = host.handler_pids()[0].unwrap();
    let client = http_client();

    let hung = client
        .post(&url)
        .body(json!({ "hang_until": 99 }).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(hung.status().as_u16(), 500);
    // Ended by the function timeout, which the host names, and not by an answer: the handler
    // never finished it. (That the timeout fires at functionTimeout: `invoke.rs`'s unit tests.)
    let id = invocation_id(&app.requests()[0]).to_string();
    assert!(app.done().is_empty(), "{:?}", app.handler_records());
    let lines = host.log_lines();
    let timeout = line_index(
        &lines,
        &format!("Timeout value of 2s exceeded by function 'Work' (Id: '{id}'). A function timeout has occurred. Restarting worker process"),
    );
    assert!(
        timeout
            < line_index(
                &lines,
                &format!("[{id}] invocation failed: function timeout")
            ),
        "{lines:#?}"
    );
    restarted_after(&host, pid, "the handler restart").await;
    host.wait_ready(LONG).await.unwrap();
    answers_200(&client, &url, 1).await;
    host.shutdown().await;
}

/// A timeout restart kills the handler with everything in flight on it: the other invocation
/// fails too, unanswered. Which event ends it (the first one's restart, not a deadline of its own)
/// and when is `invoke.rs`'s paused-time test: here the two deadlines are a few milliseconds
/// apart, and a restart on a loaded machine can take longer than that, so either may fire first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_invocations_fail_when_another_one_times_out() {
    let app = App::new(json!({ "functionTimeout": "00:00:03" }), json!({}))
        .function("Work", http_fn("work", json!(["post"])));
    let host = app.start_http().await.unwrap();
    host.wait_ready(LONG).await.unwrap();
    let url = format!("http://{}/api/work", host.http_addr());
    // Both hang: only a timeout (and its restart) can end them.
    let first = hang(&url, "times-out-first");
    let first_request = request_named(&app, "times-out-first").await;
    let second = hang(&url, "in-flight-second");
    let second_request = request_named(&app, "in-flight-second").await;
    // The second must reach the handler within functionTimeout (3 s) of the first, which takes
    // milliseconds: that is this test's hang margin.
    let pid = first_request["pid"].as_u64().unwrap();
    assert_eq!(
        second_request["pid"], pid,
        "the second invocation reached the handler only after the first one's timeout restarted it"
    );
    assert_eq!(first.await.unwrap(), 500);
    assert_eq!(second.await.unwrap(), 500);
    let lines = host.log_lines();
    for request in [&first_request, &second_request] {
        line_index(
            &lines,
            &format!("[{}] invocation failed: ", invocation_id(request)),
        );
    }
    line_index(
        &lines,
        "A function timeout has occurred. Restarting worker process",
    );
    assert!(
        app.done().is_empty(),
        "neither answered: {:?}",
        app.handler_records()
    );
    restarted_after(&host, pid as u32, "the handler restart").await;
    host.shutdown().await;
}

/// Posts a trigger value that never answers, named `name`; its status.
fn hang(url: &str, name: &str) -> tokio::task::JoinHandle<u16> {
    let request = http_client()
        .post(url)
        .body(json!({ "hang_until": 99, "name": name }).to_string());
    tokio::spawn(async move { request.send().await.unwrap().status().as_u16() })
}

/// Waits for the handler's record of the request whose trigger value is named `name`.
async fn request_named(app: &App, name: &str) -> Value {
    wait_for(&format!("request {name} at the handler"), LONG, || {
        let requests = app.requests();
        let found = requests
            .iter()
            .find(|r| r["body"].as_str().unwrap_or("").contains(name))
            .cloned();
        async move { found.ok_or(requests) }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_answer_is_flagged_and_treated_as_a_hang() {
    let app = App::new(json!({ "functionTimeout": "00:00:01" }), json!({}))
        .function("Work", http_fn("work", json!(["post"])));
    let host = app.start_http().await.unwrap();
    host.wait_ready(LONG).await.unwrap();
    let pid = host.handler_pids()[0].unwrap();
    let response = http_client()
        .post(format!("http://{}/api/work", host.http_addr()))
        .body(json!({ "empty": true }).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 500);
    // The handler answered; the host flagged the answer, then ended the invocation by its
    // function timeout (waiting it out: `invoke.rs`'s unit test) and restarted the handler.
    let id = invocation_id(&app.requests()[0]).to_string();
    assert_eq!(app.done(), [id.as_str()]);
    let lines = host.log_lines();
    let flagged = line_index(&lines, &format!("[{id}] !!! "));
    assert!(
        lines[flagged].contains("empty body or `null`"),
        "{lines:#?}"
    );
    assert!(
        flagged
            < line_index(
                &lines,
                &format!("(Id: '{id}'). A function timeout has occurred")
            ),
        "{lines:#?}"
    );
    restarted_after(&host, pid, "the handler restart").await;
    host.shutdown().await;
}

#[tokio::test]
async fn bad_configuration_is_refused_with_file_and_field() {
    let app = App::new(json!({}), json!({})).function(
        "Bad",
        json!({ "bindings": [{ "name": "req", "type": "httpTrigger", "direction": "in", "methods": ["yell"] }] }),
    );
    let error = app.start_http().await.err().expect("refused").to_string();
    assert!(
        error.contains("Bad/function.json") && error.contains("bindings[0].methods[0]"),
        "{error}"
    );

    let app = App::new(json!({}), json!({})).function(
        "Q",
        json!({ "bindings": [{ "name": "m", "type": "queueTrigger", "direction": "in", "queueName": "%QUEUE_SETTING%" }] }),
    );
    let error = app.start_http().await.err().expect("refused").to_string();
    assert!(
        error.contains("QUEUE_SETTING") && error.contains("Q/function.json"),
        "{error}"
    );
}

/// Proxying mode (`enableProxyingHttpRequest`, which wins over forwarding): the original path and
/// query untouched, the body even when chunked, `Host` replaced by the handler's address with the
/// caller's in `X-Forwarded-Host`, `X-Forwarded-For`/`-Proto` set, `X-Forwarded-Prefix` removed,
/// the invocation id in both invocation headers, `User-Agent` left alone, any status an answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxying_passes_the_request_as_it_came() {
    let app = App::new(
        json!({}),
        json!({ "enableProxyingHttpRequest": true, "enableForwardingHttpRequest": true }),
    )
    .function("Echo", http_fn("items/{id}", json!(["post"])));
    let host = app.start_http().await.unwrap();
    assert!(
        has_log(&host, "Echo: [POST]") && has_log(&host, "(proxied)"),
        "{:?}",
        host.log_lines()
    );
    let public = host.http_addr().to_string();
    let chunks: Vec<Result<&'static str, std::io::Error>> = vec![Ok("hello "), Ok("body")];
    let response = http_client()
        .post(format!("http://{public}/api/items/42?b=2&a=x%20y&a=z"))
        .header("User-Agent", "tester/1")
        .header("X-Test-Status", "418")
        .header("X-Forwarded-Prefix", "/spoofed")
        .header("X-Forwarded-Host", "spoofed.example")
        .header("X-Azure-Functions-InvocationId", "spoofed")
        .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 418);
    let echo: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    assert_eq!(echo["path"], "/api/items/42");
    assert_eq!(echo["query"], "b=2&a=x%20y&a=z");
    assert_eq!(echo["body"], "hello body", "a chunked body is proxied");
    let handler_host = header(&echo, "host").unwrap();
    assert!(
        handler_host.starts_with("127.0.0.1:") && handler_host != public,
        "{handler_host}"
    );
    assert_eq!(header(&echo, "x-forwarded-host"), Some(public.as_str()));
    assert_eq!(header(&echo, "x-forwarded-for"), Some("127.0.0.1"));
    assert_eq!(header(&echo, "x-forwarded-proto"), Some("http"));
    assert_eq!(header(&echo, "x-forwarded-prefix"), None);
    let id = assert_host_headers(&echo, "tester/1");
    assert_eq!(header(&echo, "x-ms-invocation-id"), Some(id));
    host.shutdown().await;
}
