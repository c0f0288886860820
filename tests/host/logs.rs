//! What reaches the host's log, as on its way to Application Insights
//! (`docs/custom-handler-protocol.md` §11, `docs/observability.md`):
//! - the local host logs an invocation's `Logs` only from a 2xx answer, under
//!   `Function.<Name>.User` at Information; the handler's stdout under `Host.Function.Console` at
//!   Information and its stderr there at Error; host.json `logging.logLevel` filters them
//!   (against the test handler, `examples/test_handler.rs`);
//! - the real handler, run by the local host on Azurite, leaves for a scan with a failing and
//!   succeeding work items: each failure on stderr with its scan, item and outcome, the
//!   successes in `Logs`, the scan's start and end, and no secret anywhere.

use crate::support;

use std::time::Duration;

use crate::support::host::{has_log, http_client, wait_for, App};
use serde_json::{json, Value};
use support::e2e::{seed, TestApp};
use support::unique_name;
use tablescan::lab::dataset;
use tablescan::storage::connection::DEVELOPMENT_ACCOUNT_KEY;
use tablescan::storage::Entity;

const HANG: Duration = Duration::from_secs(30);

/// An HTTP function the host wraps in a payload (no forwarding): its answer's `Logs` count.
fn payload_fn() -> Value {
    json!({ "bindings": [
        { "name": "req", "type": "httpTrigger", "direction": "in", "authLevel": "anonymous", "route": "work", "methods": ["post"] },
        { "name": "res", "type": "http", "direction": "out" }
    ]})
}

async fn invoke(host: &tablescan::lab::host::RunningHost, commands: Value) -> u16 {
    http_client()
        .post(format!("http://{}/api/work", host.http_addr()))
        .header("Content-Type", "application/json")
        .body(commands.to_string())
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// Waits for a captured line containing every one of `needles`. The bound (a line comes within
/// milliseconds of what makes it) only catches a hang: then the test fails with the whole log.
async fn line_with(host: &tablescan::lab::host::RunningHost, needles: &[&str]) -> String {
    wait_for(&format!("line with {needles:?}"), HANG, || {
        let lines = host.log_lines();
        let found = lines
            .iter()
            .find(|l| needles.iter().all(|n| l.contains(n)))
            .cloned();
        async move { found.ok_or(lines) }
    })
    .await
}

/// Fails the test (with the whole log) if a line contains `needle`.
fn expect_no_line(host: &tablescan::lab::host::RunningHost, needle: &str) {
    assert!(
        !has_log(host, needle),
        "{needle:?} in {:#?}",
        host.log_lines()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_only_from_successful_answers_under_the_hosts_categories() {
    let app = App::new(json!({}), json!({})).function("Work", payload_fn());
    let host = app.start_http().await.unwrap();
    let listening = line_with(&host, &["test handler listening"]).await;
    assert!(
        listening.starts_with("INFO ")
            && listening.contains("[Host.Function.Console] test handler listening"),
        "stdout is logged at Information under Host.Function.Console: {listening}"
    );

    assert_eq!(
        invoke(&host, json!({"logs": ["kept: a 2xx answer"]})).await,
        200
    );
    let kept = line_with(&host, &["kept: a 2xx answer"]).await;
    assert!(
        kept.starts_with("INFO ")
            && kept.contains("[Work] [")
            && kept.ends_with("[Function.Work.User] kept: a 2xx answer"),
        "{kept}"
    );
    // A non-2xx answer fails the invocation: its Logs are never read.
    assert_eq!(
        invoke(
            &host,
            json!({"logs": ["dropped: a 500 answer"], "status": 500})
        )
        .await,
        500
    );
    line_with(&host, &["Executed 'Work' (Failed"]).await;
    expect_no_line(&host, "dropped: a 500 answer");

    // stderr: Error under Host.Function.Console (the handler then exits and is restarted).
    assert_eq!(invoke(&host, json!({"crash_until": 2})).await, 500);
    let crash = line_with(&host, &["crashing on purpose"]).await;
    assert!(
        crash.starts_with("ERROR ")
            && crash.contains("[Host.Function.Console] test handler: crashing"),
        "{crash}"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_json_log_levels_filter_what_the_handler_says() {
    let levels = json!({"logging": {"logLevel": {
        "default": "Information",
        "Function.Work.User": "Warning",
        "Host.Function.Console": "Error"
    }}});
    let app = App::new(levels, json!({})).function("Work", payload_fn());
    let host = app.start_http().await.unwrap();
    assert_eq!(
        invoke(&host, json!({"logs": ["an Information log"]})).await,
        200
    );
    assert_eq!(invoke(&host, json!({"crash_until": 2})).await, 500);
    // The stderr line (Error) passes the filter; the stdout line and the Logs do not.
    line_with(&host, &["[Host.Function.Console] test handler: crashing"]).await;
    line_with(&host, &["Executed 'Work' (Succeeded"]).await;
    expect_no_line(&host, "an Information log");
    expect_no_line(&host, "test handler listening");
    host.shutdown().await;
}

/// The repository's host.json, as the host reads it, keeps what `docs/observability.md` needs:
/// every queue function's success lines, the handler's console lines (failures, scan bounds), the
/// request records; and drops the per-invocation `Executing`/`Executed` noise. HTTP-only
/// functions are proxied (forwarding is the fallback for hosts without proxying).
#[test]
fn host_json_keeps_what_operators_need() {
    use tablescan::app::catalog::{Trigger, FUNCTIONS};
    use tablescan::lab::host::config::{load_app, HttpMode, LogLevel};
    let dir = tempfile::tempdir().unwrap();
    tablescan::deploy::stage::stage(
        dir.path(),
        std::path::Path::new(env!("CARGO_BIN_EXE_tablescan")),
    )
    .expect("stage");
    let app = load_app(dir.path()).unwrap();
    assert_eq!(app.http_mode, HttpMode::Proxy);
    let log = &app.logging;
    let queue_functions: Vec<&str> = FUNCTIONS
        .iter()
        .filter(|f| matches!(f.trigger, Trigger::Queue { .. }))
        .map(|f| f.name)
        .collect();
    assert_eq!(queue_functions.len(), 5, "{queue_functions:?}");
    for name in queue_functions {
        assert!(
            log.enabled(&format!("Function.{name}.User"), LogLevel::Information),
            "{name}"
        );
        assert!(
            !log.enabled(&format!("Function.{name}"), LogLevel::Information),
            "{name}"
        );
        assert!(
            log.enabled(&format!("Function.{name}"), LogLevel::Warning),
            "{name}"
        );
    }
    for level in [LogLevel::Information, LogLevel::Warning, LogLevel::Error] {
        assert!(log.enabled("Host.Function.Console", level));
    }
    assert!(log.enabled("Host.Results", LogLevel::Information));
    assert!(log.enabled("Host.Aggregator", LogLevel::Trace));
    assert!(!log.enabled("Host.General", LogLevel::Information));
    let host: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("host.json")).unwrap())
            .unwrap();
    let excluded = host["logging"]["applicationInsights"]["samplingSettings"]["excludedTypes"]
        .as_str()
        .unwrap();
    for kind in ["Request", "Exception", "Trace"] {
        assert!(excluded.split(';').any(|t| t == kind), "{excluded}");
    }
}

fn source_entities() -> Vec<Entity> {
    let mut all: Vec<Entity> = dataset::entities(200, 5, dataset::RowsPerKey::default())
        .flatten()
        .collect();
    // Partitions bigger than a page are read by partition-key steps, the ones that fail.
    for i in 0..120 {
        all.push(dataset::entity("System.Failing", i));
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_handler_leaves_failures_successes_and_scan_bounds_in_the_hosts_log() {
    // Partitions starting with "System." fail on every delivery: the scan fails, and the work of
    // the other partitions succeeds meanwhile.
    let app = TestApp::start(1, &[("TABLESCAN_TEST_FAIL_PREFIX", "System.")]).await;
    let source = unique_name("Source");
    seed(&app.store, &source, source_entities()).await;
    let destination = unique_name("Dest");
    let (id, status) = app.scan_until_end(&json!({"driver": "copy", "sourceTable": source, "destinationTable": destination, "takeCount": 50}), Duration::from_secs(120)).await;
    assert_eq!(status["state"], "failed", "{status}");
    let host = app.host();
    let scan = format!("scan={id} ");

    let start = line_with(host, &["tablescan event=scan-start", &scan]).await;
    let expected = format!(
        "[Host.Function.Console] tablescan event=scan-start scan={id} driver=copy strategy=prefix source=AzureWebJobsStorage/{source} destination=AzureWebJobsStorage/{destination}"
    );
    assert!(
        start.starts_with("INFO ") && start.ends_with(&expected),
        "{start}"
    );
    let end = line_with(host, &["tablescan event=scan-end", &scan, "state=failed"]).await;
    assert!(
        logged(
            &end,
            "ERROR ",
            &[
                "[Host.Function.Console] tablescan event=scan-end",
                " ms=",
                "System."
            ]
        ),
        "{end}"
    );

    // A failure: on stderr (Error), with its scan, item, attempt, outcome, duration and reason.
    let failure = line_with(
        host,
        &["event=invocation fn=PrefixScan", &scan, "outcome=failed"],
    )
    .await;
    assert!(
        failure.starts_with("ERROR ")
            && failure.contains(
                "[Host.Function.Console] tablescan event=invocation fn=PrefixScan kind=scan-step "
            )
            && failure.contains(" item=s-")
            && failure.contains(" status=500 ms=")
            && failure.contains(" invocation=")
            && failure.contains("forced failure for partition \"System."),
        "{failure}"
    );
    // Its answer's Logs were dropped by the host: no failure under the user category.
    assert!(
        !host
            .log_lines()
            .iter()
            .any(|l| l.contains("[Function.PrefixScan.User]") && l.contains("outcome=failed")),
        "{:?}",
        host.log_lines()
    );
    // Successes: the answer's Logs, under the function's user category (host.json keeps them).
    let success = line_with(
        host,
        &[
            "[Function.PrefixScan.User] tablescan event=invocation",
            &scan,
            "outcome=ok",
        ],
    )
    .await;
    assert!(
        logged(
            &success,
            "INFO ",
            &[" kind=scan-step ", " attempt=1/5 ", " status=200 ms="]
        ),
        "{success}"
    );

    // Nothing secret: not the account key, nor any connection string.
    let all = host.log_lines().join("\n");
    assert!(!all.contains(DEVELOPMENT_ACCOUNT_KEY) && !all.contains("AccountKey="));
    app.shutdown().await;
}

/// Whether `line` is at `level` (`"INFO "`, `"ERROR "`) and holds every one of `parts`.
fn logged(line: &str, level: &str, parts: &[&str]) -> bool {
    line.starts_with(level) && parts.iter().all(|p| line.contains(p))
}
