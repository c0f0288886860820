//! Cancelled means stopped (issue 38), end to end: a scan of each driver that writes (enqueue,
//! copy, delete, import), paced at 10 requests a second so that it is certainly writing when the
//! cancel is sent, stops writing once the cancel has answered: what is written afterwards is at
//! most what the rule allows (`work::watch::NOTICE` × the limit, plus the units the invocations
//! under way had started: `allowed`), counted by the test's own clients. Once the app's queues
//! have drained (the invocations under way stopped and committed, the queued work met the ended
//! scan), the scan's counters say exactly what was written, and they are the same after the
//! host has shut down (every invocation finished). No test waits for a time: each waits for
//! the event it needs, its bound only catches a hang.

use crate::support;

use std::future::Future;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::backup::{start_export, Target};
use support::e2e::{seed, staged, TestApp};
use support::raw::{RawClient, RawQueueClient};
use support::{queue_store, unique_name};
use tablescan::app::drivers::enqueue::PUTS_IN_FLIGHT;
use tablescan::app::work::watch::NOTICE;
use tablescan::storage::{Entity, QueueStore};

/// The scans' rate limit: slow enough that each runs for a minute.
const LIMIT: u32 = 10;
/// Batches one copy, delete or import invocation sends at once (`TABLESCAN_COPY_CONCURRENCY`).
const BATCHES_IN_FLIGHT: usize = 8;
/// Invocations that can run at once: host.json here takes one message at a time from each of
/// the two work queues (`batchSize` 1, `newBatchThreshold` 0).
const INVOCATIONS: usize = 2;
/// Rows of each source: 60 s of writes at the limit, one write a row.
const ROWS: usize = 600;
/// Catches a hang only: these tests take 5 to 20 s (a minute on the code before issue 38).
const HANG: Duration = Duration::from_secs(300);

/// What the rule allows after a cancel's answer: the writes `NOTICE` lasts at the limit, and
/// those every invocation under way had started (`in_flight` each).
fn allowed(in_flight: usize) -> usize {
    (NOTICE.as_secs_f64() * f64::from(LIMIT)).ceil() as usize + in_flight * INVOCATIONS
}

/// The app on one instance taking one message at a time from each queue.
async fn app() -> TestApp {
    let dir = staged("00:05:00");
    let path = dir.path().join("host.json");
    let mut host: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    host["extensions"]["queues"]["batchSize"] = 1.into();
    host["extensions"]["queues"]["newBatchThreshold"] = 0.into();
    std::fs::write(&path, host.to_string()).unwrap();
    let storage = support::azurite().connection_string();
    let concurrency = BATCHES_IN_FLIGHT.to_string();
    let settings = [("TABLESCAN_COPY_CONCURRENCY", concurrency.as_str())];
    let store = support::table_store().0;
    TestApp::start_in(
        dir,
        1,
        &[("AzureWebJobsStorage", &storage)],
        store,
        &settings,
    )
    .await
}

/// Polls `check` until it gives `Some`; panics after [`HANG`] saying what it waited for and
/// what it saw last (`check`'s `Err`).
async fn wait_for<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let start = Instant::now();
    loop {
        let last = match check().await {
            Ok(found) => return found,
            Err(seen) => seen,
        };
        assert!(
            start.elapsed() < HANG,
            "waited {HANG:?} for {what}; last seen: {last}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `ROWS` rows of about 100 bytes, each in a partition of its own (one batch a row).
fn one_row_a_partition() -> Vec<Entity> {
    (0..ROWS)
        .map(|i| {
            let mut e = Entity::new(format!("k{i:04}"), "r");
            e.properties.insert("Text", json!("x".repeat(100)));
            e
        })
        .collect()
}

/// What a cancel left: the writes counted when it answered, after the queues drained, and the
/// scan's status then.
struct Cancelled {
    at_answer: usize,
    settled: usize,
    status: Value,
}

/// Starts `body`, waits until `written` says 20 writes were made, cancels the scan, then waits
/// for the app's queues to drain. Checks that at most `allowed(in_flight)` writes followed the
/// answer, and that the scan's counters do not change until the host has shut down.
async fn cancel_while_writing<F, Fut>(
    mut app: TestApp,
    body: Value,
    in_flight: usize,
    written: F,
) -> Cancelled
where
    F: Fn() -> Fut,
    Fut: Future<Output = usize>,
{
    let id = app.start_scan(&body).await;
    let path = format!("/api/scans/{id}");
    wait_for("20 writes", || async {
        let n = written().await;
        (n >= 20).then_some(()).ok_or(format!("{n} writes"))
    })
    .await;
    let (status, answer) = app.delete(&path).await;
    let at_answer = written().await;
    assert_eq!(
        (status, &answer["state"]),
        (200, &json!("cancelled")),
        "{answer}"
    );
    wait_for("the app's queues to drain", || async {
        let left = app.queued_messages().await;
        (left == 0).then_some(()).ok_or(format!("{left} messages"))
    })
    .await;
    let settled = written().await;
    let (_, status) = app.get(&path).await;
    eprintln!(
        "{id}: {at_answer} writes when the cancel answered, {settled} once the queues drained"
    );
    assert!(
        settled - at_answer <= allowed(in_flight),
        "{} writes after the cancel answered, more than the {} allowed: {status}",
        settled - at_answer,
        allowed(in_flight)
    );
    assert!(settled < ROWS, "the scan was not cut short: {status}");
    assert_eq!(status["state"], "cancelled", "{status}");
    assert_eq!(status["pendingWorkItems"], 0, "{status}");
    // Every invocation finishes before the host stops: nothing more may change.
    app.redeploy().await;
    let (_, again) = app.get(&path).await;
    app.shutdown().await;
    assert_eq!(again, status, "the ended scan's status changed");
    assert_eq!(written().await, settled, "writes after the queues drained");
    Cancelled {
        at_answer,
        settled,
        status,
    }
}

/// The case of issue 38: an enqueue at one row a message. Its puts stop within the rule, and
/// `rowsWritten` and `messagesWritten` are the messages on the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_enqueue_stops_putting() {
    let app = app().await;
    let source = unique_name("Source");
    let rows = (0..ROWS)
        .map(|i| Entity::new("p", format!("{i:04}")))
        .collect();
    seed(&app.store, &source, rows).await;
    let queue = unique_name("rows");
    let body = json!({"driver": "enqueue", "sourceTable": source, "destinationQueue": queue,
        "maxRequestsPerSecond": LIMIT});
    let queues = queue_store().0;
    let count = || async { queues.approximate_count(&queue).await.unwrap_or(0) as usize };
    let cancelled = cancel_while_writing(app, body, PUTS_IN_FLIGHT, count).await;
    let messages = RawQueueClient::azurite()
        .receive_all(&queue, 2 * ROWS)
        .await;
    assert_eq!(messages.len(), cancelled.settled);
    for field in ["rowsWritten", "messagesWritten"] {
        assert_eq!(
            cancelled.status[field],
            messages.len(),
            "{field}: {}",
            cancelled.status
        );
    }
    assert!(cancelled.at_answer >= 20);
}

/// A copy: no batch starts once the cancel is known; `rowsWritten` is the destination's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_copy_stops_writing() {
    let app = app().await;
    let (source, destination) = (unique_name("Source"), unique_name("Copy"));
    seed(&app.store, &source, one_row_a_partition()).await;
    let body = json!({"driver": "copy", "sourceTable": source, "destinationTable": destination,
        "maxRequestsPerSecond": LIMIT});
    let count = || async { rows_of(&destination).await };
    let cancelled = cancel_while_writing(app, body, BATCHES_IN_FLIGHT, count).await;
    assert_eq!(
        cancelled.status["rowsWritten"], cancelled.settled,
        "{}",
        cancelled.status
    );
}

/// A delete: no batch starts once the cancel is known; `rowsWritten` is the rows deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_delete_stops_deleting() {
    let app = app().await;
    let source = unique_name("Doomed");
    seed(&app.store, &source, one_row_a_partition()).await;
    let body = json!({"driver": "delete", "sourceTable": source, "confirm": source,
        "maxRequestsPerSecond": LIMIT});
    let deleted = || async { ROWS - rows_of(&source).await };
    let cancelled = cancel_while_writing(app, body, BATCHES_IN_FLIGHT, deleted).await;
    assert_eq!(
        cancelled.status["rowsWritten"], cancelled.settled,
        "{}",
        cancelled.status
    );
}

/// An import (of an export made unpaced first): its write items start no batch once the cancel
/// is known; `rowsWritten` is the destination's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_import_stops_writing() {
    let app = app().await;
    let source = unique_name("Source");
    seed(&app.store, &source, one_row_a_partition()).await;
    let target = Target::new("cancel");
    let export = start_export(&app, &source, 1000, &target).await;
    let exported = app.wait_for_end(&export, HANG).await;
    assert_eq!(exported["state"], "completed", "{exported}");
    let destination = unique_name("Restored");
    let body = json!({"driver": "import", "sourceContainer": target.container,
        "sourcePrefix": target.prefix, "destinationTable": destination,
        "maxRequestsPerSecond": LIMIT});
    let count = || async { rows_of(&destination).await };
    let cancelled = cancel_while_writing(app, body, BATCHES_IN_FLIGHT, count).await;
    assert_eq!(
        cancelled.status["rowsWritten"], cancelled.settled,
        "{}",
        cancelled.status
    );
}

/// Rows of `table` read by the raw client (none if it does not exist yet).
async fn rows_of(table: &str) -> usize {
    RawClient::azurite()
        .read_all(table)
        .await
        .map_or(0, |rows| rows.len())
}
