//! The scan API's read side against Azurite, in-process (the app's router over the real storage
//! adapters): `GET /api/scans/{id}` reads the record and the counter rows and writes nothing —
//! a scan found drained but still running gets one queued check, which the queue's delivery
//! (not the GET) turns into the end of the scan; `GET /api/scans` pages with `top` and
//! `continuationToken` and filters by `state`, and refuses bad values naming the parameter.
//! A completion step's lease holds the queued check back until it expires, on the app's clock
//! (a manual one the test moves).
//! Stored rows are compared with the raw REST client (tests/support/raw.rs), not tablescan's
//! own parser.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use serde_json::json;
use time::OffsetDateTime;

use support::account;
use support::raw::RawClient;
use support::router::{call, queue_payload, running_count_record, InProcessApp};
use tablescan::app::tracking::{Counters, ScanState, WorkState, COMPLETION_LEASE};
use tablescan::clock::Clock;
use tablescan::storage::request_counts::{RequestCounters, RequestCounts};
use tablescan::storage::{BatchOperation, Entity, MessageEncoding, QueueStore, TableStore};

type TestApp = InProcessApp;

/// The app on the shared Azurite with its own tables and queues, every request counted.
fn test_app() -> TestApp {
    InProcessApp::start(&[])
}

/// The requests `f` makes, by kind.
async fn counted<F: std::future::Future<Output = R>, R>(
    counters: &RequestCounters,
    f: F,
) -> (R, RequestCounts) {
    let before = counters.snapshot();
    let result = f.await;
    (result, counters.snapshot().since(&before))
}

/// A source table of `rows` rows in `rows` partitions.
async fn source_table(rows: usize) -> String {
    let store = account().table_store(Arc::new(RequestCounters::new()));
    let table = support::new_table(&store, "Source").await;
    for i in 0..rows {
        let pk = format!("p{i:03}");
        let entity = Entity::new(pk.clone(), "r");
        store
            .submit_batch(&table, &pk, &[BatchOperation::Insert(entity)])
            .await
            .unwrap();
    }
    table
}

/// Every row of the bookkeeping tables as the service stores them.
async fn bookkeeping_rows(t: &TestApp) -> Vec<support::raw::RawEntity> {
    let raw = RawClient::azurite();
    let mut rows = raw.rows(&t.scans_table).await;
    rows.extend(raw.rows(&t.work_table).await);
    rows
}

/// Scan `id`'s record as the service stores it.
async fn scan_record(t: &TestApp, id: &str) -> support::raw::RawEntity {
    RawClient::azurite()
        .get_entity(&t.scans_table, id, "scan")
        .await
        .unwrap()
        .expect("the scan record")
}

/// Finishes the scan's only unfinished work item (its root) as a worker would, without the
/// worker's end-of-scan check: the scan is then drained but still running, as when the worker
/// that finished last died before noticing.
async fn finish_root_without_ending_the_scan(t: &TestApp, scan_id: &str) {
    let pending = t.work_item_rows(scan_id).await;
    assert_eq!(pending.len(), 1, "only the root is registered");
    let (partition, work_id) = (pending[0].partition_key(), pending[0].row_key());
    let shard: u32 = partition.rsplit('-').next().unwrap().parse().unwrap();
    let tracker = t.state.tracker_on(t.state.bookkeeping());
    let Some(WorkState::Pending { etag }) =
        tracker.work_state(scan_id, shard, &work_id).await.unwrap()
    else {
        panic!("the root is pending")
    };
    tracker
        .complete(
            scan_id,
            shard,
            &work_id,
            &etag,
            Counters::default(),
            None,
            None,
            None,
        )
        .await
        .unwrap();
}

/// Delivers every message of the scan queue once, as the host would, and deletes those answered
/// with success. Returns how many were delivered.
async fn deliver_scan_queue(t: &TestApp) -> usize {
    let messages = t
        .queues
        .get_messages(&t.prefix_queue, 32, Duration::from_secs(30))
        .await
        .unwrap();
    for m in &messages {
        let decoded = String::from_utf8(MessageEncoding::Base64.decode(&m.text).unwrap()).unwrap();
        let payload = queue_payload("PrefixScan", &decoded, m.dequeue_count, &m.id);
        let (status, body) = call(&t.state, "POST", "/PrefixScan", Some(payload)).await;
        assert!(status.is_success(), "{status}: {body}");
        t.queues
            .delete_message(&t.prefix_queue, &m.id, &m.pop_receipt)
            .await
            .unwrap();
    }
    messages.len()
}

async fn start_count_scan(t: &TestApp) -> String {
    let source = source_table(3).await;
    let (status, body) = call(
        &t.state,
        "POST",
        "/api/scans",
        Some(json!({"driver": "count", "sourceTable": source, "takeCount": 2})),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    body["id"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn a_status_read_reads_the_record_and_counters_and_queues_at_most_one_check() {
    let t = test_app();
    let id = start_count_scan(&t).await;
    let path = format!("/api/scans/{id}");

    // Running with work pending: one point read and one query, nothing written.
    let rows = bookkeeping_rows(&t).await;
    let ((status, body), requests) = counted(&t.counters, call(&t.state, "GET", &path, None)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (body["state"].clone(), body["pendingWorkItems"].clone()),
        (json!("running"), json!(1))
    );
    let reads_only = RequestCounts {
        point_read: 1,
        query: 1,
        ..RequestCounts::default()
    };
    assert_eq!(requests, reads_only, "a status read of a running scan");
    assert_eq!(
        bookkeeping_rows(&t).await,
        rows,
        "a status read writes no row"
    );

    // Drained but running (its last worker died before ending it): the GET still only reads,
    // and queues one check; it does not end the scan itself.
    finish_root_without_ending_the_scan(&t, &id).await;
    let rows = bookkeeping_rows(&t).await;
    let ((_, body), requests) = counted(&t.counters, call(&t.state, "GET", &path, None)).await;
    assert_eq!(
        (body["state"].clone(), body["pendingWorkItems"].clone()),
        (json!("running"), json!(0))
    );
    assert_eq!(
        requests,
        RequestCounts {
            queue_put: 1,
            ..reads_only
        },
        "reads plus one queued check"
    );
    assert_eq!(bookkeeping_rows(&t).await, rows, "the GET wrote no row");
    // Polling again at once queues nothing more.
    let (_, requests) = counted(&t.counters, call(&t.state, "GET", &path, None)).await;
    assert_eq!(requests, reads_only, "a second read right after");

    // The queue's delivery ends the scan: the original root message and the queued check (both
    // find the root finished; whichever comes first ends the scan).
    assert_eq!(deliver_scan_queue(&t).await, 2);
    let record = scan_record(&t, &id).await;
    assert_eq!(record.text("State"), Some("\"completed\""), "{record:?}");
    let ((_, body), requests) = counted(&t.counters, call(&t.state, "GET", &path, None)).await;
    assert_eq!(body["state"], "completed", "{body}");
    assert_eq!(requests, reads_only, "an ended scan's status read");
}

/// Takes scan `id`'s completion lease (asserting `why` it is free), which is then held.
async fn take_and_hold_the_lease(t: &TestApp, id: &str, why: &str) {
    let tracker = t.state.tracker_on(t.state.bookkeeping());
    assert!(tracker.take_completion_lease(id).await.unwrap(), "{why}");
    assert!(
        !tracker.take_completion_lease(id).await.unwrap(),
        "and then held"
    );
}

#[tokio::test]
async fn a_status_read_queues_nothing_while_a_completion_step_holds_the_lease() {
    let t = test_app();
    let id = start_count_scan(&t).await;
    finish_root_without_ending_the_scan(&t, &id).await;
    take_and_hold_the_lease(&t, &id, "the lease is free").await;
    let tracker = t.state.tracker_on(t.state.bookkeeping());
    let record = scan_record(&t, &id).await;
    assert_eq!(
        record.annotation("CompletionLeaseUntil").as_deref(),
        Some("Edm.DateTime"),
        "{record:?}"
    );

    let path = format!("/api/scans/{id}");
    let ((_, body), requests) = counted(&t.counters, call(&t.state, "GET", &path, None)).await;
    assert_eq!(body["state"], "running", "{body}");
    assert_eq!(requests.queue_put, 0, "the lease holder will end the scan");

    tracker.release_completion_lease(&id).await.unwrap();
    assert!(
        tracker.take_completion_lease(&id).await.unwrap(),
        "free again once released"
    );
    tracker.release_completion_lease(&id).await.unwrap();
    let (_, requests) = counted(&t.counters, call(&t.state, "GET", &path, None)).await;
    assert_eq!(
        requests.queue_put, 1,
        "with the lease released, the GET queues the check"
    );
}

/// A completion step's lease expires by itself [`COMPLETION_LEASE`] after it was taken (its
/// invocation died): until then a status read queues nothing and no other step takes it; from
/// then on a status read queues the drained check, and another step takes the lease.
#[tokio::test]
async fn an_expired_completion_lease_no_longer_holds_the_scan() {
    let start = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
    let t = test_app().on_clock(Clock::manual(start));
    let id = start_count_scan(&t).await;
    finish_root_without_ending_the_scan(&t, &id).await;
    take_and_hold_the_lease(&t, &id, "the lease is free").await;
    let tracker = t.state.tracker_on(t.state.bookkeeping());
    let path = format!("/api/scans/{id}");

    let tick = Duration::from_millis(1);
    t.clock()
        .advance(Duration::try_from(COMPLETION_LEASE).unwrap() - tick);
    assert!(
        !tracker.take_completion_lease(&id).await.unwrap(),
        "held a millisecond before it expires"
    );
    let (_, requests) = counted(&t.counters, call(&t.state, "GET", &path, None)).await;
    assert_eq!(
        requests.queue_put, 0,
        "the lease holder may still end the scan"
    );

    t.clock().advance(tick);
    let ((_, body), requests) = counted(&t.counters, call(&t.state, "GET", &path, None)).await;
    assert_eq!(body["state"], "running", "{body}");
    assert_eq!(requests.queue_put, 1, "expired: the GET queues the check");
    take_and_hold_the_lease(&t, &id, "another step takes the expired lease").await;
    let record = scan_record(&t, &id).await;
    assert_eq!(
        record.text("CompletionLeaseUntil"),
        Some("\"2027-01-15T08:22:00Z\""),
        "{record:?}"
    );
}

/// Five scans, newest first: running, completed, running, failed, running.
async fn five_scans(t: &TestApp) -> Vec<String> {
    let tracker = t.state.tracker_on(t.state.bookkeeping());
    tracker.ensure_tables().await.unwrap();
    let ids: Vec<String> = (0..5)
        .map(|i| format!("{:013}-0000000{i}", 9_000 + i))
        .collect();
    let ends = [
        None,
        Some(ScanState::Completed),
        None,
        Some(ScanState::Failed),
        None,
    ];
    for (id, end) in ids.iter().zip(ends) {
        let record = running_count_record(id, 2, OffsetDateTime::now_utc());
        tracker.insert_scan(&record).await.unwrap();
        if let Some(state) = end {
            assert!(tracker.finish_scan(id, state, None).await.unwrap());
        }
    }
    ids
}

/// Follows a listing from `first` to its end; the ids of each page.
async fn pages(t: &TestApp, first: &str) -> Vec<Vec<String>> {
    let mut pages = Vec::new();
    let mut uri = first.to_string();
    for _ in 0..10 {
        let (status, body) = call(&t.state, "GET", &uri, None).await;
        assert_eq!(status, StatusCode::OK, "{uri}: {body}");
        let ids = body["scans"].as_array().unwrap().iter();
        pages.push(ids.map(|s| s["id"].as_str().unwrap().to_string()).collect());
        match body["continuationToken"].as_str() {
            None => return pages,
            Some(token) => {
                assert!(body.get("continuationToken").is_some());
                uri = format!("{first}&continuationToken={token}");
            }
        }
    }
    panic!("the listing never ended");
}

#[tokio::test]
async fn listings_page_with_a_continuation_token_and_filter_by_state() {
    let t = test_app();
    let (status, body) = call(&t.state, "GET", "/api/scans", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"scans": [], "continuationToken": null}),
        "before any scan"
    );

    let ids = five_scans(&t).await;
    let all = pages(&t, "/api/scans?top=2").await;
    assert_eq!(
        all,
        vec![ids[0..2].to_vec(), ids[2..4].to_vec(), ids[4..5].to_vec()]
    );
    assert_eq!(
        pages(&t, "/api/scans?top=5").await,
        vec![ids.clone()],
        "no token after the last"
    );
    let running = pages(&t, "/api/scans?top=2&state=running").await;
    assert_eq!(
        running,
        vec![vec![ids[0].clone(), ids[2].clone()], vec![ids[4].clone()]]
    );
    let failed = pages(&t, "/api/scans?state=failed").await;
    assert_eq!(failed, vec![vec![ids[3].clone()]]);
    let (_, body) = call(&t.state, "GET", "/api/scans?state=completed", None).await;
    assert_eq!(body["scans"][0]["state"], "completed", "{body}");
}

#[tokio::test]
async fn bad_listing_parameters_are_refused_naming_them() {
    let t = test_app();
    for (query, field) in [
        ("top=0", "top"),
        ("top=101", "top"),
        ("top=ten", "top"),
        ("state=done", "state"),
        ("state=Running", "state"),
        ("continuationToken=zz", "continuationToken"),
        ("continuationToken=a", "continuationToken"),
        ("continuationToken=q0123", "continuationToken"),
        ("stat=running", "stat"),
    ] {
        let (status, body) = call(&t.state, "GET", &format!("/api/scans?{query}"), None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert_eq!(body["error"]["field"], field, "{query}: {body}");
    }
    for path in [
        "/api/scans/not-a-scan!",
        "/api/scans/0123456789abc-00000000",
    ] {
        let (status, body) = call(&t.state, "GET", path, None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
    }
}
