//! Retention against Azurite, in-process (the app's router over the real storage adapters, queue
//! messages delivered as the host would): an ended scan (completed, failed, cancelled) loses its
//! work and counter rows `TABLESCAN_WORK_RETENTION` (a day here) after its end, not a second
//! earlier, keeping its final counters on its record, and loses its record
//! `TABLESCAN_SCAN_RETENTION` (30 days) after its end, its cleanup message hopping at most
//! `MAX_HOP` at a time; a cleanup delivered before its time does nothing and comes back then; a
//! late message of a cleaned or removed scan writes nothing; a message of a scan whose record
//! is missing is retried while the record may still appear (15 minutes from the id's time) and
//! dropped after; a status read of a removed scan is a 404 with a JSON body; a scan whose own
//! cleanup never ran is swept by another's.
//!
//! Time is the app's manual clock (`InProcessApp::on_clock`): the test moves it, and a delayed
//! queue message is delivered once the clock reaches its time (`HostQueues`), never by waiting.
//! Stored rows are read with the raw REST client (tests/support/raw.rs), not tablescan's tracker.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{json, Value};
use time::OffsetDateTime;

use support::account;
use support::raw::RawClient;
use support::router::{call, running_count_record, InProcessApp};
use tablescan::app::functions::scan_cleanup::MAX_HOP;
use tablescan::app::tracking::retention::started_by_key;
use tablescan::app::tracking::{NewWork, ScanState, Tracker};
use tablescan::clock::Clock;
use tablescan::storage::request_counts::RequestCounters;
use tablescan::storage::{BatchOperation, Entity, MessageEncoding, QueueStore, TableStore};

type TestApp = InProcessApp;

const HOUR: Duration = Duration::from_secs(3_600);
const DAY: Duration = Duration::from_secs(86_400);

/// When the tests' clock starts.
fn t0() -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap()
}

/// The app on the shared Azurite with its own tables and queues, on a manual clock at [`t0`];
/// work rows kept a day after a scan's end, records 30 days.
fn test_app() -> TestApp {
    InProcessApp::start(&[
        ("TABLESCAN_WORK_RETENTION", "1d"),
        ("TABLESCAN_SCAN_RETENTION", "30d"),
        ("TABLESCAN_TEST_FAIL_PREFIX", "zz"),
    ])
    .on_clock(Clock::manual(t0()))
}

/// The same app on another instance (nothing cached; the same clock).
fn another_instance(t: &TestApp) -> TestApp {
    t.another_instance()
}

/// Delivers one decoded queue message to `function` as the host would: its status and logs.
async fn deliver_logged(
    t: &TestApp,
    function: &str,
    decoded: &str,
    dequeue_count: u64,
) -> (StatusCode, Value) {
    let payload = support::router::queue_payload(function, decoded, dequeue_count, "m");
    call(&t.state, "POST", &format!("/{function}"), Some(payload)).await
}

/// Delivers one decoded queue message to `function` as the host would.
async fn deliver(t: &TestApp, function: &str, decoded: &str, dequeue_count: u64) -> StatusCode {
    deliver_logged(t, function, decoded, dequeue_count).await.0
}

/// Receives the visible messages of `queue`, deleting them: their decoded texts.
async fn take_messages(t: &TestApp, queue: &str) -> Vec<String> {
    let messages = match t
        .queues
        .get_messages(queue, 32, Duration::from_secs(30))
        .await
    {
        Ok(messages) => messages,
        Err(e) if e.is_not_found() => return Vec::new(),
        Err(e) => panic!("{e}"),
    };
    let mut texts = Vec::new();
    for m in messages {
        let decoded = MessageEncoding::Base64.decode(&m.text).unwrap();
        texts.push(String::from_utf8(decoded).unwrap());
        t.queues
            .delete_message(queue, &m.id, &m.pop_receipt)
            .await
            .unwrap();
    }
    texts
}

/// The scan-step messages of scan `id` waiting in the queue (taken off it).
async fn take_scan_messages(t: &TestApp, id: &str) -> Vec<String> {
    let all = take_messages(t, &t.prefix_queue).await;
    assert!(all.iter().all(|m| m.contains(id)), "only {id}'s: {all:?}");
    all
}

/// A count scan of a new 3-row table whose partition keys start with `prefix` (`zz`: its range
/// items fail every attempt), with `filter` if given (a filtered count works in range items).
async fn start_count_scan(t: &TestApp, prefix: &str, filter: Option<&str>) -> String {
    let store = account().table_store(Arc::new(RequestCounters::new()));
    let source = support::new_table(&store, "Source").await;
    for i in 0..3 {
        let pk = format!("{prefix}{i:03}");
        let op = BatchOperation::Insert(Entity::new(pk.clone(), "r"));
        store.submit_batch(&source, &pk, &[op]).await.unwrap();
    }
    let mut body = json!({"driver": "count", "sourceTable": source, "takeCount": 2});
    if let Some(filter) = filter {
        body["filter"] = json!(filter);
    }
    let (status, body) = call(&t.state, "POST", "/api/scans", Some(body)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    body["id"].as_str().unwrap().to_string()
}

async fn status(t: &TestApp, id: &str) -> (StatusCode, Value) {
    call(&t.state, "GET", &format!("/api/scans/{id}"), None).await
}

/// A scan that completed: its step messages delivered until none is left.
async fn completed_scan(t: &TestApp) -> String {
    let id = start_count_scan(t, "p", None).await;
    for _ in 0..20 {
        let messages = take_scan_messages(t, &id).await;
        if messages.is_empty() {
            break;
        }
        for m in messages {
            assert_eq!(deliver(t, "PrefixScan", &m, 1).await, StatusCode::OK);
        }
    }
    assert_eq!(status(t, &id).await.1["state"], "completed");
    id
}

/// A scan cancelled with its root message still queued: returns its id and that message.
async fn cancelled_scan(t: &TestApp) -> (String, String) {
    let id = start_count_scan(t, "p", None).await;
    let (code, body) = call(&t.state, "DELETE", &format!("/api/scans/{id}"), None).await;
    assert_eq!(code, StatusCode::OK, "{body}");
    let mut messages = take_scan_messages(t, &id).await;
    assert_eq!(messages.len(), 1, "the root");
    (id, messages.remove(0))
}

/// A scan failed by a work item failing its last delivery.
async fn failed_scan(t: &TestApp) -> String {
    let id = start_count_scan(t, "zz", Some("Flag eq true")).await;
    let last = t.state.config.max_dequeue_count;
    for _ in 0..10 {
        for m in take_scan_messages(t, &id).await {
            assert_eq!(deliver(t, "PrefixScan", &m, 1).await, StatusCode::OK);
        }
        for m in take_messages(t, &t.copy_queue).await {
            deliver(t, "TableCopy", &m, last).await;
        }
        if status(t, &id).await.1["state"] == "failed" {
            return id;
        }
    }
    panic!("scan {id} did not fail");
}

/// The rows of the work table in scan `id`'s partitions.
async fn work_rows(t: &TestApp, id: &str) -> usize {
    let rows = RawClient::azurite().rows(&t.work_table).await;
    rows.iter()
        .filter(|r| r.partition_key().starts_with(&format!("{id}-")))
        .count()
}

async fn record(t: &TestApp, id: &str) -> Option<support::raw::RawEntity> {
    RawClient::azurite()
        .get_entity(&t.scans_table, id, "scan")
        .await
        .unwrap()
}

/// Delivers the visible cleanup messages as the host would (and those their deliveries queue
/// at once), until none is visible; how many.
async fn deliver_cleanups(t: &TestApp) -> usize {
    let mut delivered = 0;
    // Bounded: each delivery queues at most one message at once (a record swept, then removed).
    for _ in 0..100 {
        let messages = take_messages(t, &t.state.config.cleanup_queue).await;
        if messages.is_empty() {
            return delivered;
        }
        for m in messages {
            let (status, logs) = deliver_logged(t, "ScanCleanup", &m, 1).await;
            assert_eq!(status, StatusCode::OK, "{m}: {logs}");
            delivered += 1;
        }
    }
    panic!("cleanups kept queuing more cleanups at once");
}

/// Moves the clock to `at`, delivering on the way each delayed message at its time, as the host
/// would (a cleanup that hops queues the next one: it is delivered in turn if due by `at`).
async fn run_until(t: &TestApp, at: OffsetDateTime) {
    while let Some(due) = t.host_queues.next_due().filter(|due| *due <= at) {
        t.clock().set(due.max(t.clock().now()));
        t.release_due().await;
        deliver_cleanups(t).await;
    }
    t.clock().set(at);
    deliver_cleanups(t).await;
}

/// Lets time pass, delayed message by delayed message (the clock moved to the next one's time,
/// then what is due delivered), until `done` holds. Fails naming `what` if nothing more is
/// queued, or after 100 messages.
async fn clean_until<F, Fut>(t: &TestApp, what: &str, done: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..100 {
        if done().await {
            return;
        }
        let Some(due) = t.host_queues.next_due() else {
            panic!("never {what}: no cleanup is queued any more");
        };
        run_until(t, due).await;
    }
    panic!(
        "never {what} after 100 cleanup messages; held: {:?}",
        t.host_queues.held()
    );
}

/// Whether the record of every scan of `ids` notes its work rows removed.
async fn work_removed(t: &TestApp, ids: &[&str]) -> bool {
    for id in ids {
        let kept = record(t, id).await;
        if !kept.is_some_and(|r| r.text("WorkRemovedAt").is_some()) {
            return false;
        }
    }
    true
}

#[tokio::test]
async fn ended_scans_lose_their_work_rows_then_their_records() {
    let t = test_app();
    // Ended at t0, t0 + 1 h and t0 + 2 h.
    let completed = completed_scan(&t).await;
    t.clock().advance(HOUR);
    let (cancelled, late_root) = cancelled_scan(&t).await;
    t.clock().advance(HOUR);
    let failed = failed_scan(&t).await;
    let ids = [completed.as_str(), cancelled.as_str(), failed.as_str()];
    let mut before = Vec::new();
    for id in ids {
        assert!(work_rows(&t, id).await > 0, "{id} has work rows");
        before.push(status(&t, id).await.1);
    }
    assert_eq!(before[0]["rowsScanned"], 3, "{}", before[0]);
    let held = t.host_queues.held();
    let dues: Vec<OffsetDateTime> = held.iter().map(|m| m.due).collect();
    let day = time::Duration::days(1);
    assert_eq!(
        dues,
        [t0() + day, t0() + day + HOUR, t0() + day + 2 * HOUR],
        "each end queued its cleanup, due a day after it: {held:?}"
    );

    // A second before the work retention ends nothing is due. A cleanup delivered early (a
    // duplicate) does nothing and comes back when it is due.
    run_until(&t, t0() + day - Duration::from_secs(1)).await;
    for id in ids {
        assert!(work_rows(&t, id).await > 0, "{id} keeps its work rows");
        assert!(record(&t, id)
            .await
            .unwrap()
            .text("FinalCounters")
            .is_none());
    }
    let (status_code, logs) = deliver_logged(&t, "ScanCleanup", &held[0].decoded(), 1).await;
    assert_eq!(status_code, StatusCode::OK, "{logs}");
    assert!(
        logs.to_string().contains("nothing due; again in 1s"),
        "{logs}"
    );
    assert!(work_rows(&t, &completed).await > 0);
    assert_eq!(t.host_queues.held().len(), 4, "the early one came back");

    // At the end of the completed scan's work retention, its rows go; not yet the others'.
    run_until(&t, t0() + day).await;
    assert!(work_removed(&t, &[&completed]).await);
    assert_eq!(work_rows(&t, &completed).await, 0);
    assert!(work_rows(&t, &cancelled).await > 0, "ended an hour later");

    // Then every scan's: work and counter rows gone, records kept with final counters.
    clean_until(&t, "work rows removed", || work_removed(&t, &ids)).await;
    assert_eq!(
        t.clock().now(),
        t0() + day + 2 * HOUR,
        "at the last scan's time"
    );
    for (id, before) in ids.iter().zip(&before) {
        assert_eq!(work_rows(&t, id).await, 0, "{id}'s work rows");
        let kept = record(&t, id).await.unwrap();
        assert!(kept.text("FinalCounters").is_some(), "{kept:?}");
        let (code, mut now) = status(&t, id).await;
        assert_eq!(code, StatusCode::OK, "{now}");
        assert!(now["workRowsRemovedAt"].is_string(), "{now}");
        now.as_object_mut().unwrap().remove("workRowsRemovedAt");
        assert_eq!(&now, before, "the kept summary is what the status showed");
    }

    // A late duplicate of the cancelled scan's root: the scan is ended, nothing to drop.
    assert_eq!(
        deliver(&t, "PrefixScan", &late_root, 1).await,
        StatusCode::OK
    );
    assert_eq!(work_rows(&t, &cancelled).await, 0, "no row came back");

    // The records stay until 30 days after each end (their cleanups hop at most `MAX_HOP`),
    // then go; a status read is a 404 with a JSON body.
    let month = time::Duration::days(30);
    assert!(t
        .host_queues
        .held()
        .iter()
        .all(|m| m.due - t.clock().now() <= MAX_HOP));
    run_until(&t, t0() + month - Duration::from_secs(1)).await;
    for id in ids {
        assert!(record(&t, id).await.is_some(), "{id}'s record is kept");
    }
    clean_until(&t, "records removed", || async {
        let mut none = true;
        for id in ids {
            none &= record(&t, id).await.is_none();
        }
        none
    })
    .await;
    assert_eq!(
        t.clock().now(),
        t0() + month + 2 * HOUR,
        "at the last scan's time"
    );
    assert!(t.host_queues.held().is_empty(), "nothing more is queued");
    for id in ids {
        let (code, body) = status(&t, id).await;
        assert_eq!(code, StatusCode::NOT_FOUND, "{body}");
        assert_eq!(body["error"]["code"], "NotFound", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("record was removed"), "{message}");
    }
    late_messages_of_missing_scans_write_nothing(&t, &cancelled, &late_root).await;
}

/// A late message of a removed scan writes nothing. This instance remembers the scan ended and
/// drops it; another instance (which never saw the scan) drops it too, its id being older than
/// any start in progress. A message of a scan whose record is missing but whose id is recent (a
/// start in progress) is retried until its record can no longer appear, 15 minutes after the
/// id's time, or until its last delivery; then it is dropped.
async fn late_messages_of_missing_scans_write_nothing(t: &TestApp, removed: &str, late_root: &str) {
    assert_eq!(deliver(t, "PrefixScan", late_root, 1).await, StatusCode::OK);
    let t = another_instance(t);
    assert_eq!(
        deliver(&t, "PrefixScan", late_root, 1).await,
        StatusCode::OK
    );
    let fresh = format!("{}-00000000", started_by_key(t.clock().now()));
    let fresh_root = late_root.replace(removed, &fresh);
    let attempts = t.state.config.max_dequeue_count;
    assert_eq!(
        deliver(&t, "PrefixScan", &fresh_root, 1).await,
        StatusCode::SERVICE_UNAVAILABLE,
        "its start may be in progress"
    );
    assert_eq!(
        deliver(&t, "PrefixScan", &fresh_root, attempts).await,
        StatusCode::OK,
        "its last delivery"
    );
    t.clock()
        .advance(Duration::from_secs(15 * 60) - Duration::from_millis(1));
    assert_eq!(
        deliver(&t, "PrefixScan", &fresh_root, 1).await,
        StatusCode::SERVICE_UNAVAILABLE,
        "just under 15 minutes after its id's time"
    );
    t.clock().advance(Duration::from_millis(1));
    assert_eq!(
        deliver(&t, "PrefixScan", &fresh_root, 1).await,
        StatusCode::OK,
        "15 minutes after its id's time"
    );
    for id in [removed, fresh.as_str()] {
        assert_eq!(work_rows(&t, id).await, 0);
        assert!(record(&t, id).await.is_none());
    }
}

#[tokio::test]
async fn a_scan_whose_cleanup_never_ran_is_swept_by_another_scans_cleanup() {
    let t = test_app();
    // A scan ended without queuing a cleanup (as by an earlier version): a tracker without the
    // app's end hook, on the app's clock.
    let store = t.state.bookkeeping();
    let bare = Tracker::new(
        store,
        &t.state.config.scans_table,
        &t.state.config.work_table,
    )
    .with_clock(t.clock());
    bare.ensure_tables().await.unwrap();
    let started = t0() - time::Duration::hours(1);
    let legacy = format!("{}-0000beef", started_by_key(started));
    let root = NewWork {
        id: "root".into(),
        kind: "step",
        shard: 1,
    };
    bare.create_scan_work(&legacy, 4, &root).await.unwrap();
    bare.insert_scan(&running_count_record(&legacy, 4, started))
        .await
        .unwrap();
    assert!(bare
        .finish_scan(&legacy, ScanState::Cancelled, None)
        .await
        .unwrap());
    assert_eq!(work_rows(&t, &legacy).await, 2, "root and counter");
    assert!(
        take_messages(&t, &t.state.config.cleanup_queue)
            .await
            .is_empty()
            && t.host_queues.held().is_empty(),
        "no cleanup was queued"
    );

    // Once its record has expired (30 days after its end), another scan's cleanup sweeps it:
    // the other's end queues its cleanup, due a day later, which sweeps.
    t.clock().advance(30 * DAY);
    let (other, _) = cancelled_scan(&t).await;
    clean_until(&t, "the legacy scan swept", || async {
        record(&t, &legacy).await.is_none()
    })
    .await;
    assert_eq!(
        t.clock().now(),
        t0() + time::Duration::days(31),
        "at the other's cleanup"
    );
    assert_eq!(work_rows(&t, &legacy).await, 0, "its rows went first");
    assert_eq!(work_rows(&t, &other).await, 0);
}
