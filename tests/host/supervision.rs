//! `tablescan host` supervising the handler, against the test handler (real processes, real
//! sockets): restarts after a crash or a kill, giving up after three errors and recycling, the
//! function timeout and what it does to invocations in flight.
//!
//! Each test proves its behaviour by the events that make it (log lines, the handler's records,
//! which process answered), never by how long it took: the host's delays (function timeout,
//! recycle delay, the 30-minute error window) are unit-tested on tokio's paused clock
//! (`src/lab/host/invoke.rs`, `src/lab/host/worker.rs`). `LONG` only catches a hang.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::support::host::*;
use serde_json::{json, Value};
use tablescan::lab::host::{Host, HostConfig, NoStorage, RunningHost};

const LONG: Duration = Duration::from_secs(60);

/// An app with one HTTP function, `Work` (payload mode), and `host_json` merged into its
/// host.json, started and ready; the function's URL.
async fn work_app(host_json: Value) -> (App, RunningHost, String) {
    let app =
        App::new(host_json, json!({})).function("Work", http_function("work", json!(["post"])));
    let host = app.start_http().await.unwrap();
    host.wait_ready(LONG).await.unwrap();
    let url = format!("http://{}/api/work", host.http_addr());
    (app, host, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_a_crashed_or_killed_handler() {
    let (_app, host, url) = work_app(json!({})).await;
    let client = http_client();
    let first_pid = host.handler_pids()[0].unwrap();

    // The handler exits in the middle of the invocation: the caller gets a 500, the host restarts it.
    assert_eq!(post(&url, json!({ "crash_until": 99 })).await, 500);
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

/// POSTs trigger value `commands` to `url`; the status.
async fn post(url: &str, commands: Value) -> u16 {
    let request = http_client().post(url).body(commands.to_string());
    request.send().await.unwrap().status().as_u16()
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
    let app =
        App::new(json!({}), json!({})).function("Work", http_function("work", json!(["post"])));
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
    let app =
        App::new(json!({}), json!({})).function("Work", http_function("work", json!(["post"])));
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
        .function("Work", http_function("work", json!(["post"])))
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
    assert_eq!(
        post(&format!("http://{}/api/work", host.http_addr()), json!({})).await,
        503
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_timeout_restarts_the_handler() {
    let (app, host, url) = work_app(json!({ "functionTimeout": "00:00:02" })).await;
    let pid = host.handler_pids()[0].unwrap();
    let client = http_client();

    assert_eq!(post(&url, json!({ "hang_until": 99 })).await, 500);
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
    let (app, host, url) = work_app(json!({ "functionTimeout": "00:00:03" })).await;
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
    let (app, host, url) = work_app(json!({ "functionTimeout": "00:00:01" })).await;
    let pid = host.handler_pids()[0].unwrap();
    assert_eq!(post(&url, json!({ "empty": true })).await, 500);
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
