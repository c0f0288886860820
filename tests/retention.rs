//! Retention against Azurite, in-process (the app's router over the real storage adapters, queue
//! messages delivered as the host would): an ended scan (completed, failed, cancelled) loses its
//! work and counter rows after `TABLESCAN_WORK_RETENTION`, keeping its final counters on its
//! record, and loses its record after `TABLESCAN_SCAN_RETENTION` (both set to seconds here); a
//! late message of a cleaned or removed scan writes nothing; a status read of a removed scan is a
//! 404 with a JSON body; a scan whose own cleanup never ran is swept by another's. Stored rows
//! are read with the raw REST client (tests/support/raw.rs), not tablescan's tracker.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use serde_json::{json, Value};
use time::OffsetDateTime;

use support::raw::RawClient;
use support::router::{call, InProcessApp};
use support::account;
use tablescan::app::tracking::retention::started_by_key;
use tablescan::app::tracking::{NewWork, ScanRecord, ScanState, Tracker};
use tablescan::storage::request_counts::RequestCounters;
use tablescan::storage::{BatchOperation, Entity, MessageEncoding, QueueStore, TableStore};

type TestApp = InProcessApp;

/// The app on the shared Azurite with its own tables and queues; work rows kept 1 s after a
/// scan's end, records 3 s.
fn test_app() -> TestApp {
    InProcessApp::start(&[
        ("TABLESCAN_WORK_RETENTION", "1s"),
        ("TABLESCAN_SCAN_RETENTION", "3s"),
        ("TABLESCAN_TEST_FAIL_PREFIX", "zz"),
    ])
}

/// The same app on another instance (nothing cached).
fn another_instance(t: &TestApp) -> TestApp {
    t.another_instance()
}

/// Delivers one decoded queue message to `function` as the host would.
async fn deliver(t: &TestApp, function: &str, decoded: &str, dequeue_count: u64) -> StatusCode {
    let payload = json!({
        "Data": { "message": serde_json::to_string(decoded).unwrap() },
        "Metadata": {
            "DequeueCount": dequeue_count.to_string(),
            "Id": "\"m\"",
            "PopReceipt": "\"pop\"",
            "InsertionTime": "2026-11-22T00:00:00+00:00",
            "sys": { "MethodName": function, "UtcNow": "2026-11-22T00:00:00Z", "RandGuid": "00000000-0000-0000-0000-000000000000" }
        }
    });
    call(&t.state, "POST", &format!("/{function}"), Some(payload))
        .await
        .0
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

/// Delivers cleanup messages as they become visible until `done` holds (at most 30 s).
async fn clean_until<F, Fut>(t: &TestApp, what: &str, done: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !done().await {
        assert!(start.elapsed() < Duration::from_secs(30), "never: {what}");
        for m in take_messages(t, &t.state.config.cleanup_queue).await {
            assert_eq!(
                deliver(t, "ScanCleanup", &m, 1).await,
                StatusCode::OK,
                "{m}"
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn ended_scans_lose_their_work_rows_then_their_records() {
    let t = test_app();
    let completed = completed_scan(&t).await;
    let (cancelled, late_root) = cancelled_scan(&t).await;
    let failed = failed_scan(&t).await;
    let ids = [completed.clone(), cancelled.clone(), failed.clone()];
    let mut before = Vec::new();
    for id in &ids {
        assert!(work_rows(&t, id).await > 0, "{id} has work rows");
        before.push(status(&t, id).await.1);
    }
    assert_eq!(before[0]["rowsScanned"], 3, "{}", before[0]);

    // After the work retention: work and counter rows gone, records kept with final counters.
    clean_until(&t, "work rows removed", || async {
        let mut all = true;
        for id in &ids {
            all &= record(&t, id)
                .await
                .is_some_and(|r| r.text("WorkRemovedAt").is_some());
        }
        all
    })
    .await;
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

    // After the scan retention: the records go; a status read is a 404 with a JSON body.
    clean_until(&t, "records removed", || async {
        let mut none = true;
        for id in &ids {
            none &= record(&t, id).await.is_none();
        }
        none
    })
    .await;
    for id in &ids {
        let (code, body) = status(&t, id).await;
        assert_eq!(code, StatusCode::NOT_FOUND, "{body}");
        assert_eq!(body["error"]["code"], "NotFound", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("record was removed"), "{message}");
    }

    // A late message of a removed scan writes nothing. This instance remembers the scan ended
    // and drops it; another instance (which never saw the scan) retries it while its record could
    // still appear (a start in progress) and drops it on its last delivery; a message of a scan
    // whose id is older than any start is dropped at once.
    assert_eq!(
        deliver(&t, "PrefixScan", &late_root, 1).await,
        StatusCode::OK
    );
    let t = another_instance(&t);
    let attempts = t.state.config.max_dequeue_count;
    assert_eq!(
        deliver(&t, "PrefixScan", &late_root, 1).await,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(
        deliver(&t, "PrefixScan", &late_root, attempts).await,
        StatusCode::OK
    );
    let old_id = format!(
        "{}-00000000",
        started_by_key(OffsetDateTime::now_utc() - time::Duration::hours(1))
    );
    let old_root = late_root.replace(&cancelled, &old_id);
    assert_eq!(
        deliver(&t, "PrefixScan", &old_root, 1).await,
        StatusCode::OK
    );
    assert_eq!(work_rows(&t, &cancelled).await, 0);
    assert_eq!(work_rows(&t, &old_id).await, 0);
    assert!(record(&t, &old_id).await.is_none());
}

#[tokio::test]
async fn a_scan_whose_cleanup_never_ran_is_swept_by_another_scans_cleanup() {
    let t = test_app();
    // A scan ended without queuing a cleanup (as by an earlier version): a tracker without the
    // app's end hook.
    let store = t.state.bookkeeping();
    let bare = Tracker::new(
        store,
        &t.state.config.scans_table,
        &t.state.config.work_table,
    );
    bare.ensure_tables().await.unwrap();
    let legacy = format!(
        "{}-0000beef",
        started_by_key(OffsetDateTime::now_utc() - time::Duration::hours(1))
    );
    let root = NewWork {
        id: "root".into(),
        kind: "step",
        shard: 1,
    };
    bare.create_scan_work(&legacy, 4, &root).await.unwrap();
    let record_of = ScanRecord {
        id: legacy.clone(),
        state: ScanState::Running,
        request: json!({"driver": "count", "sourceTable": "Source"}),
        context: None,
        shards: 4,
        started_at: OffsetDateTime::now_utc() - time::Duration::hours(1),
        completed_at: None,
        error: None,
        etag: String::new(),
    };
    bare.insert_scan(&record_of).await.unwrap();
    assert!(bare
        .finish_scan(&legacy, ScanState::Cancelled, None)
        .await
        .unwrap());
    assert_eq!(work_rows(&t, &legacy).await, 2, "root and counter");
    assert!(
        take_messages(&t, &t.state.config.cleanup_queue)
            .await
            .is_empty(),
        "no cleanup was queued"
    );

    // Once its record has expired, another scan's cleanup sweeps it.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (other, _) = cancelled_scan(&t).await;
    clean_until(&t, "the legacy scan swept", || async {
        record(&t, &legacy).await.is_none()
    })
    .await;
    assert_eq!(work_rows(&t, &legacy).await, 0, "its rows went first");
    assert_eq!(work_rows(&t, &other).await, 0);
}
