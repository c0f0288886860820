//! Work that meets an ended scan, against Azurite in-process (the app's router over the real
//! storage adapters): a row a last delivery marked is not dropped by a duplicate copy of its
//! item's message — that delivery may be recording the very failure that ended the scan (tracking
//! invariant 6) — and the poison message of a last delivery that died drops it. Rows are read
//! with the raw REST client (tests/support/raw.rs), not tablescan's own parser.

use crate::support;

use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::json;

use support::account;
use support::router::{call, queue_payload, InProcessApp};
use tablescan::app::tracking::WorkState;
use tablescan::storage::request_counts::RequestCounters;
use tablescan::storage::{BatchOperation, Entity, TableStore};

/// Delivers `text` to `function` once (dequeue count 1, message `id`), as the host would; the
/// successful reply as text.
async fn deliver(t: &InProcessApp, function: &str, text: &str, id: &str) -> String {
    let payload = queue_payload(function, text, 1, id);
    let (status, reply) = call(&t.state, "POST", &format!("/{function}"), Some(payload)).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    reply.to_string()
}

/// The only work row of `scan_id` (its counters aside) as the service stores it.
async fn the_work_row(t: &InProcessApp, scan_id: &str) -> support::raw::RawEntity {
    let rows = t.work_item_rows(scan_id).await;
    assert_eq!(rows.len(), 1, "one work row: {rows:?}");
    rows.into_iter().next().unwrap()
}

/// A scan cancelled while its root's last delivery runs (it marked the root's row): a duplicate
/// copy of the root's message meets the ended scan and leaves the row to that delivery; the
/// status shows the unfinished item as dropped; the poison message of that delivery (it died)
/// drops the row.
#[tokio::test]
async fn a_duplicate_copy_leaves_the_row_a_last_delivery_marked() {
    let t = InProcessApp::start(&[]);
    let store = account().table_store(Arc::new(RequestCounters::new()));
    let source = support::new_table(&store, "Source").await;
    for pk in ["a", "b", "c"] {
        let row = BatchOperation::Insert(Entity::new(pk, "r"));
        store.submit_batch(&source, pk, &[row]).await.unwrap();
    }
    let body = json!({"driver": "count", "sourceTable": source, "takeCount": 2});
    let (status, started) = call(&t.state, "POST", "/api/scans", Some(body)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{started}");
    let id = started["id"].as_str().unwrap().to_string();
    let (root_id, text) = t.take_step_message().await.expect("the root's message");

    // The root's last delivery marks its row before it works, as `work::begin` does.
    let row = the_work_row(&t, &id).await;
    let (partition, work_id) = (row.partition_key(), row.row_key());
    let shard: u32 = partition.rsplit('-').next().unwrap().parse().unwrap();
    let tracker = t.state.tracker_on(t.state.bookkeeping());
    let Some(WorkState::Pending { etag }) = tracker.work_state(&id, shard, &work_id).await.unwrap()
    else {
        panic!("the root is pending")
    };
    let marked = tracker.mark_last_delivery(&id, shard, &work_id, &etag);
    assert!(marked.await.unwrap().is_some(), "marked");
    let (status, cancelled) = call(&t.state, "DELETE", &format!("/api/scans/{id}"), None).await;
    assert!(status.is_success(), "{status}: {cancelled}");
    assert_eq!(cancelled["state"], "cancelled", "{cancelled}");

    // A duplicate copy (its own dequeue count) meets the ended scan: the row is left alone.
    let reply = deliver(&t, "PrefixScan", &text, &root_id).await;
    assert!(reply.contains("left to its last delivery"), "{reply}");
    let row = the_work_row(&t, &id).await;
    assert_eq!(row.text("State"), Some("\"pending\""), "{row:?}");
    assert_eq!(row.text("LastDelivery"), Some("true"), "{row:?}");
    let (_, scan) = call(&t.state, "GET", &format!("/api/scans/{id}"), None).await;
    assert_eq!(scan["pendingWorkItems"], 0, "{scan}");
    assert_eq!(scan["droppedWorkItems"], 1, "{scan}");

    // That delivery died: the host moves its message to the poison queue, whose function
    // drops the row of the ended scan.
    let reply = deliver(&t, "PrefixScanPoison", &text, &root_id).await;
    assert!(reply.contains("dropped its work item"), "{reply}");
    let row = the_work_row(&t, &id).await;
    assert_eq!(row.text("State"), Some("\"dropped\""), "{row:?}");
    let (_, scan) = call(&t.state, "GET", &format!("/api/scans/{id}"), None).await;
    assert_eq!(scan["droppedWorkItems"], 1, "{scan}");
    assert_eq!(scan["failedWorkItems"], 0, "{scan}");
}
