//! Hostile inputs of issue 38 (item 7), against Azurite in-process (the app's router over the
//! real storage adapters): a query parameter given twice is refused naming it (not "last
//! wins"); a destination queue whose name starts with one of tablescan's own queues' is refused;
//! a destination queue deleted under a running enqueue fails the scan at the first delivery that
//! meets it, naming the queue.

use crate::support;

use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::json;

use support::account;
use support::raw::RawQueueClient;
use support::router::{call, queue_payload, InProcessApp};
use support::unique_name;
use tablescan::storage::request_counts::RequestCounters;
use tablescan::storage::{BatchOperation, Entity, QueueStore, TableStore};

/// `GET /api/scans` with a parameter given twice: 400 naming it, whichever the values (the
/// same value twice too), where it used to take the last one.
#[tokio::test]
async fn a_listing_parameter_given_twice_is_refused_naming_it() {
    let t = InProcessApp::start(&[]);
    for (query, field) in [
        ("state=completed&state=failed", "state"),
        ("state=running&state=running", "state"),
        ("top=1&top=2", "top"),
        ("top=5&state=running&top=5", "top"),
        (
            "continuationToken=a0&continuationToken=a1",
            "continuationToken",
        ),
        ("code=k&code=k", "code"),
        ("state=running&State=failed", "State"),
        ("top=1&%74op=2", "top"),
        ("top=1&&top=1", "top"),
        ("top", "top"),
        ("=1", ""),
    ] {
        let (status, body) = call(&t.state, "GET", &format!("/api/scans?{query}"), None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert_eq!(body["error"]["field"], field, "{query}: {body}");
    }
    for query in ["top=1&state=running", "state=failed", "", "&top=3&"] {
        let (status, body) = call(&t.state, "GET", &format!("/api/scans?{query}"), None).await;
        assert_eq!(status, StatusCode::OK, "{query}: {body}");
    }
}

/// A `destinationQueue` that starts with the name of one of tablescan's own queues (the step,
/// copy and cleanup queues, whatever follows) is refused naming the field, and no queue is
/// created; a name that only contains one is a destination like any other.
#[tokio::test]
async fn a_destination_queue_named_after_tablescans_own_is_refused() {
    let t = InProcessApp::start(&[]);
    let source = unique_name("Source");
    let own = [&t.prefix_queue, &t.copy_queue];
    let refused = own.iter().flat_map(|q| {
        [
            "",
            "-poison",
            "-poison-poison",
            "-cleanup-poison",
            "x",
            "-1",
        ]
        .map(|s| format!("{q}{s}"))
    });
    let raw = RawQueueClient::azurite();
    for queue in refused {
        let body = json!({"driver": "enqueue", "sourceTable": source, "destinationQueue": queue});
        let (status, reply) = call(&t.state, "POST", "/api/scans", Some(body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{queue}: {reply}");
        assert_eq!(
            reply["error"]["field"], "destinationQueue",
            "{queue}: {reply}"
        );
        if !own.contains(&&queue) {
            assert!(!raw.exists(&queue).await, "{queue} was created");
        }
    }
    let store = account().table_store(Arc::new(RequestCounters::new()));
    store.create_table(&source).await.unwrap();
    let inside = format!("my-{}", t.prefix_queue);
    let body = json!({"driver": "enqueue", "sourceTable": source, "destinationQueue": inside});
    let (status, reply) = call(&t.state, "POST", "/api/scans", Some(body)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{inside}: {reply}");
}

/// The destination queue is deleted after the enqueue started (it created it): the first
/// delivery whose put meets `QueueNotFound` fails the scan, naming the queue, instead of being
/// retried until the message is poisoned (five deliveries, about 140 s on a real host).
#[tokio::test]
async fn a_destination_queue_deleted_under_an_enqueue_fails_it_at_once_naming_it() {
    let t = InProcessApp::start(&[]);
    let store = account().table_store(Arc::new(RequestCounters::new()));
    let source = support::new_table(&store, "Source").await;
    for rk in ["1", "2", "3"] {
        let row = BatchOperation::Insert(Entity::new("p", rk));
        store.submit_batch(&source, "p", &[row]).await.unwrap();
    }
    let queue = unique_name("gone");
    let body = json!({"driver": "enqueue", "sourceTable": source, "destinationQueue": queue});
    let (status, started) = call(&t.state, "POST", "/api/scans", Some(body)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{started}");
    let id = started["id"].as_str().unwrap().to_string();
    assert!(
        t.queues.delete_queue(&queue).await.unwrap(),
        "the scan created {queue}"
    );

    // The steps run until the one that puts the rows (each delivered once).
    loop {
        let (id, text) = t.take_step_message().await.expect("a step that puts");
        let payload = queue_payload("PrefixScan", &text, 1, &id);
        let (status, reply) = call(&t.state, "POST", "/PrefixScan", Some(payload)).await;
        if !status.is_success() {
            assert!(reply.to_string().contains(&queue), "{reply}");
            break;
        }
    }
    let (_, scan) = call(&t.state, "GET", &format!("/api/scans/{id}"), None).await;
    assert_eq!(scan["state"], "failed", "after one delivery: {scan}");
    let error = scan["error"].as_str().unwrap_or_default();
    assert!(
        error.contains(&queue) && error.contains("does not exist"),
        "{scan}"
    );
    assert!(
        !RawQueueClient::azurite().exists(&queue).await,
        "not created again"
    );
}
