//! Cancelled means stopped (issue 38), end to end: a scan of each driver that writes (enqueue,
//! copy, delete, import) is cancelled while its writes are in flight, and starts none after.
//!
//! Deterministic by construction: the fault proxy holds the scan's writes from its start (armed
//! before it), so the cancel certainly finds the scan writing (at least one write waiting at the
//! proxy) and nothing written yet. The cancel is answered by the one instance that runs the
//! work, whose invocations know of it at once (their instance's state cache: `work::watch`; the
//! watch's reads, which carry a cancel answered elsewhere within `work::watch::NOTICE`, are
//! tested in virtual time beside it). Once released, the writes an invocation had started before
//! the cancel finish, and no other starts: at most `in_flight` per invocation under way
//! (`allowed`), where the code before issue 38 wrote all `ROWS` (each test fails on it). Once
//! the app's queues have drained, the scan's counters say exactly what was written (the test's
//! own clients count it), and they are the same after the host has shut down (every invocation
//! finished). No test waits for a time: each waits for the event it needs, its bound only
//! catches a hang.

use crate::support;

use std::future::Future;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::backup::{start_export, Target};
use support::e2e::{seed, staged, TestApp};
use support::raw::{RawClient, RawQueueClient};
use support::{queue_store, unique_name};
use tablescan::app::drivers::enqueue::PUTS_IN_FLIGHT;
use tablescan::lab::proxy::{FaultPolicy, Hold, Stamp, StorageProxy};
use tablescan::storage::blob::BlobRequestKind;
use tablescan::storage::request_counts::RequestKind;
use tablescan::storage::{Entity, QueueStore};

/// Batches one copy, delete or import invocation sends at once (`TABLESCAN_COPY_CONCURRENCY`).
const BATCHES_IN_FLIGHT: usize = 8;
/// Invocations that can run at once: host.json here takes one message at a time from each of
/// the two work queues (`batchSize` 1, `newBatchThreshold` 0).
const INVOCATIONS: usize = 2;
/// Rows of each source, one write a row: far more than `allowed` lets through.
const ROWS: usize = 600;
/// Catches a hang only: these tests take 5 to 20 s.
const HANG: Duration = Duration::from_secs(300);

/// What may be written once the cancel has answered: the writes every invocation under way had
/// started (`in_flight` each), none started later.
fn allowed(in_flight: usize) -> usize {
    in_flight * INVOCATIONS
}

/// The app on one instance taking one message at a time from each queue, its storage behind
/// `proxy`.
async fn app(proxy: &StorageProxy) -> TestApp {
    let dir = staged("00:05:00");
    let path = dir.path().join("host.json");
    let mut host: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    host["extensions"]["queues"]["batchSize"] = 1.into();
    host["extensions"]["queues"]["newBatchThreshold"] = 0.into();
    std::fs::write(&path, host.to_string()).unwrap();
    let storage = proxy.connection_string();
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
        tokio::time::sleep(Duration::from_millis(100)).await;
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

/// What a cancel left: the writes once the queues drained, and the scan's status then.
struct Cancelled {
    settled: usize,
    status: Value,
}

/// Starts `body` with `hold` armed at `proxy`, waits until a write is held, cancels the scan,
/// lets the writes through and waits for the app's queues to drain. Checks that the held writes
/// went through and at most `allowed(in_flight)` were made in all, and that the scan's status
/// does not change until the host has shut down.
async fn cancel_while_writing<F, Fut>(
    (mut app, proxy): (TestApp, StorageProxy),
    (body, hold): (Value, Hold),
    in_flight: usize,
    written: F,
) -> Cancelled
where
    F: Fn() -> Fut,
    Fut: Future<Output = usize>,
{
    proxy.hold(hold);
    let id = app.start_scan(&body).await;
    let path = format!("/api/scans/{id}");
    let held = proxy.wait_held(|h| h.now > 0);
    tokio::time::timeout(HANG, held)
        .await
        .unwrap_or_else(|_| panic!("waited {HANG:?} for a write of {id} held at the proxy"));
    let (status, answer) = app.delete(&path).await;
    assert_eq!(
        (status, &answer["state"]),
        (200, &json!("cancelled")),
        "{answer}"
    );
    let at_answer = proxy.held();
    assert_eq!(written().await, 0, "a write passed the hold");
    proxy.release();
    wait_for("the app's queues to drain", || async {
        let left = app.queued_messages().await;
        (left == 0).then_some(()).ok_or(format!("{left} messages"))
    })
    .await;
    let settled = written().await;
    let (_, status) = app.get(&path).await;
    eprintln!(
        "{id}: {} writes held when the cancel answered, {settled} made in all",
        at_answer.now
    );
    assert!(
        settled <= allowed(in_flight),
        "{settled} writes after the cancel answered, more than the {} started before it: {status}",
        allowed(in_flight)
    );
    assert!(
        settled as u64 >= at_answer.now,
        "the writes held at the answer: {at_answer:?}, {settled} made"
    );
    assert_eq!(status["state"], "cancelled", "{status}");
    assert_eq!(status["pendingWorkItems"], 0, "{status}");
    // Every invocation finishes before the host stops: nothing more may change.
    app.redeploy().await;
    let (_, again) = app.get(&path).await;
    app.shutdown().await;
    assert_eq!(again, status, "the ended scan's status changed");
    assert_eq!(written().await, settled, "writes after the queues drained");
    Cancelled { settled, status }
}

/// The proxy (counting only) and the app behind it.
async fn app_behind_proxy(seed: u64) -> (TestApp, StorageProxy) {
    let proxy = support::faults::proxy(FaultPolicy::none(), seed).await;
    (app(&proxy).await, proxy)
}

/// The case of issue 38: an enqueue at one row a message. Its puts stop, and `rowsWritten` and
/// `messagesWritten` are the messages on the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_enqueue_stops_putting() {
    let (app, proxy) = app_behind_proxy(381).await;
    let source = unique_name("Source");
    let rows = (0..ROWS)
        .map(|i| Entity::new("p", format!("{i:04}")))
        .collect();
    seed(&app.store, &source, rows).await;
    let queue = unique_name("rows");
    let body = json!({"driver": "enqueue", "sourceTable": source, "destinationQueue": queue});
    let puts = Hold {
        kinds: vec![RequestKind::QueuePut],
        resources: vec![queue.clone()],
        ..Hold::default()
    };
    let queues = queue_store().0;
    let count = || async { queues.approximate_count(&queue).await.unwrap_or(0) as usize };
    let cancelled = cancel_while_writing((app, proxy), (body, puts), PUTS_IN_FLIGHT, count).await;
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
}

/// A copy: no batch starts once the cancel is known; `rowsWritten` is the destination's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_copy_stops_writing() {
    let (app, proxy) = app_behind_proxy(382).await;
    let (source, destination) = (unique_name("Source"), unique_name("Copy"));
    seed(&app.store, &source, one_row_a_partition()).await;
    let body = json!({"driver": "copy", "sourceTable": source, "destinationTable": destination});
    let hold = Hold::writes_to(&destination);
    let count = || async { rows_of(&destination).await };
    let cancelled =
        cancel_while_writing((app, proxy), (body, hold), BATCHES_IN_FLIGHT, count).await;
    assert_eq!(
        cancelled.status["rowsWritten"], cancelled.settled,
        "{}",
        cancelled.status
    );
}

/// A delete: no batch starts once the cancel is known; `rowsWritten` is the rows deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_delete_stops_deleting() {
    let (app, proxy) = app_behind_proxy(383).await;
    let source = unique_name("Doomed");
    seed(&app.store, &source, one_row_a_partition()).await;
    let body = json!({"driver": "delete", "sourceTable": source, "confirm": source});
    let hold = Hold::writes_to(&source);
    let deleted = || async { ROWS - rows_of(&source).await };
    let cancelled =
        cancel_while_writing((app, proxy), (body, hold), BATCHES_IN_FLIGHT, deleted).await;
    assert_eq!(
        cancelled.status["rowsWritten"], cancelled.settled,
        "{}",
        cancelled.status
    );
}

/// An import (of an export made first): its write items start no batch once the cancel is
/// known; `rowsWritten` is the destination's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_import_stops_writing() {
    let (app, proxy) = app_behind_proxy(384).await;
    let source = unique_name("Source");
    seed(&app.store, &source, one_row_a_partition()).await;
    let target = Target::new("cancel");
    let export = start_export(&app, &source, 1000, &target).await;
    let exported = app.wait_for_end(&export, HANG).await;
    assert_eq!(exported["state"], "completed", "{exported}");
    let destination = unique_name("Restored");
    let body = json!({"driver": "import", "sourceContainer": target.container,
        "sourcePrefix": target.prefix, "destinationTable": destination});
    let hold = Hold::writes_to(&destination);
    let count = || async { rows_of(&destination).await };
    let cancelled =
        cancel_while_writing((app, proxy), (body, hold), BATCHES_IN_FLIGHT, count).await;
    assert_eq!(
        cancelled.status["rowsWritten"], cancelled.settled,
        "{}",
        cancelled.status
    );
}

/// Staging records an index build's segment item reads at once (`READS_IN_FLIGHT` in
/// `app::drivers::index::assemble`).
const STAGING_READS_IN_FLIGHT: usize = 16;

/// An index build cancelled while its assembly reads the staging records (phase 1): it reads
/// at most what it had started, writes no segment and never switches the prefix's pointer to
/// the cancelled build (the code before issue 38 built and published it); its status does not
/// change afterwards. Phase 1's items wait hidden on the copy queue (phase 0 here is steps only,
/// on the step queue: one row a partition, a prefix scan) until the proxy holds the container's
/// blob reads; then the assembly's first read (after its listing) is held. That an assembly of many records starts
/// no further read is `work::watch_tests`, in virtual time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_index_build_is_never_published() {
    let (mut app, proxy) = app_behind_proxy(385).await;
    let source = unique_name("Source");
    let rows = one_row_a_partition().into_iter().enumerate();
    let rows = rows.map(|(i, mut e)| {
        e.properties.insert("Owner", json!(format!("o{}", i % 7)));
        e
    });
    seed(&app.store, &source, rows.collect()).await;
    let container = unique_name("idx");
    let body = json!({"driver": "index", "sourceTable": source, "property": "Owner",
        "destinationContainer": container, "destinationPrefix": "owner"});
    let items = app.names.copy_queue.clone();
    proxy.hide_messages(&[&items]);
    proxy.timeline().start(&[]);
    let id = app.start_scan(&body).await;
    let path = format!("/api/scans/{id}");
    let queues = queue_store().0;
    wait_for("phase 1 queued", || async {
        let queued = queues.approximate_count(&items).await.unwrap_or(0);
        (queued > 0).then_some(()).ok_or(format!("{queued} items"))
    })
    .await;
    proxy.hold(Hold {
        blob_kinds: vec![BlobRequestKind::Read],
        resources: vec![container.clone()],
        ..Hold::default()
    });
    proxy.hide_messages(&[]);
    let held = proxy.wait_held(|h| h.now > 0);
    tokio::time::timeout(HANG, held)
        .await
        .unwrap_or_else(|_| panic!("waited {HANG:?} for a read of {id}'s staging records held"));
    // What is held is phase 1's: its items list the staging records (phase 0 lists nothing).
    let stamps = proxy.timeline().stamps();
    let listed = |s: &&Stamp| s.resource == container && s.kind == "blob_list";
    assert!(
        stamps.iter().any(|s| listed(&s)),
        "phase 1 listed nothing: {stamps:?}"
    );
    let (status, answer) = app.delete(&path).await;
    assert_eq!(
        (status, &answer["state"]),
        (200, &json!("cancelled")),
        "{answer}"
    );
    let at_answer = proxy.count_of_blob(BlobRequestKind::Read);
    proxy.release();
    wait_for("the app's queues to drain", || async {
        let left = app.queued_messages().await;
        (left == 0).then_some(()).ok_or(format!("{left} messages"))
    })
    .await;
    let later = proxy.count_of_blob(BlobRequestKind::Read) - at_answer;
    let blobs = support::backup::blobs();
    let names = support::backup::list_all(&blobs, &container, "owner/").await;
    let allowed = (STAGING_READS_IN_FLIGHT * INVOCATIONS) as u64;
    eprintln!(
        "{id}: {later} blob reads after the cancel answered, {} blobs staged",
        names.len()
    );
    assert!(
        later <= allowed,
        "{later} reads after the cancel answered (at most {allowed})"
    );
    let published = |n: &String| n.ends_with("index.json") || n.contains("/segments/");
    assert!(!names.keys().any(published), "{names:?}");
    assert!(
        names.keys().any(|n| n.ends_with(".rec")),
        "records staged: {names:?}"
    );
    let (_, ended) = app.get(&path).await;
    assert_eq!(ended["state"], "cancelled", "{ended}");
    app.redeploy().await;
    let (_, again) = app.get(&path).await;
    app.shutdown().await;
    assert_eq!(again, ended, "the ended scan's status changed");
}

/// Rows of `table` read by the raw client (none if it does not exist yet).
async fn rows_of(table: &str) -> usize {
    RawClient::azurite()
        .read_all(table)
        .await
        .map_or(0, |rows| rows.len())
}
