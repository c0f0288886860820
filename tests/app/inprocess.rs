//! The function app's router in-process (`oneshot`): protocol handling, API validation, and the
//! whole work-item lifecycle driven by a test pump that delivers queue messages like the host
//! does — including duplicate deliveries. Storage here is the in-memory store: these are fast
//! logic tests; the end-to-end tests run the real binary under the local host on Azurite.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::support::stores::forward_table_store;
use tablescan::app::config::Config;
use tablescan::app::server::app;
use tablescan::app::state::AppState;
use tablescan::lab::memory::{MemoryQueueStore, MemoryStores};
use tablescan::lab::memory::{MemoryTableStore, Pagination};
use tablescan::storage::stores::Stores;
use tablescan::storage::{
    BatchOperation, Entity, MessageEncoding, QueueStore, StorageResult, TableStore,
};

type State = Arc<AppState<MemoryStores>>;
/// The app over any table store (a fault-injecting one), with the in-memory queues.
type AnyState<S> = Arc<AppState<S>>;

fn state_with(tables: MemoryTableStore, extra: &[(&str, &str)]) -> (State, MemoryQueueStore) {
    let mut settings: BTreeMap<String, String> = BTreeMap::new();
    settings.insert(
        "AzureWebJobsStorage".into(),
        "UseDevelopmentStorage=true".into(),
    );
    settings.insert("TABLESCAN_COUNTER_SHARDS".into(), "4".into());
    for (k, v) in extra {
        settings.insert(k.to_string(), v.to_string());
    }
    let config = Config::from_lookup(|k| settings.get(k).cloned()).unwrap();
    let queues = MemoryQueueStore::new();
    let mut map = BTreeMap::new();
    map.insert("AzureWebJobsStorage".to_string(), tables);
    (app_state(config, map, &queues), queues)
}

async fn call<S: Stores<Queue = MemoryQueueStore>>(
    state: &AnyState<S>,
    method: &str,
    uri: &str,
    content_type: Option<&str>,
    body: Vec<u8>,
) -> (StatusCode, Value) {
    let mut builder = Request::builder().method(method).uri(uri);
    if let Some(ct) = content_type {
        builder = builder.header("content-type", ct);
    }
    let response = app(state.clone())
        .oneshot(builder.body(Body::from(body)).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let ct = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string());
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        ct.as_deref(),
        Some("application/json"),
        "every response is JSON ({method} {uri} → {status})"
    );
    (status, serde_json::from_slice(&bytes).expect("JSON body"))
}

async fn post_json(state: &State, uri: &str, body: Value) -> (StatusCode, Value) {
    call(
        state,
        "POST",
        uri,
        Some("application/json"),
        body.to_string().into_bytes(),
    )
    .await
}

/// Builds the host's payload for a queue message exactly as docs/custom-handler-protocol.md §3.3.
fn host_payload(function: &str, decoded: &str, dequeue_count: u64, id: &str) -> Vec<u8> {
    crate::support::router::queue_payload(function, decoded, dequeue_count, id)
        .to_string()
        .into_bytes()
}

/// The work queues and the functions that consume them.
const WORK_QUEUES: [(&str, &str); 2] = [
    ("tablescan-prefixscan", "PrefixScan"),
    ("tablescan-tablecopy", "TableCopy"),
];

/// The app over `map`'s tables and `queues`, with every registered driver.
fn app_state<S: Stores<Queue = MemoryQueueStore>>(
    config: Config,
    map: BTreeMap<String, S::Table>,
    queues: &MemoryQueueStore,
) -> std::sync::Arc<AppState<S>> {
    AppState::new(
        config,
        map,
        queues.clone(),
        tablescan::app::drivers::registry(),
    )
}

/// Delivers messages until both queues are empty. With `duplicates`, each message is delivered
/// twice concurrently before it is deleted. Returns invocations made.
async fn pump<S: Stores<Queue = MemoryQueueStore>>(
    state: &AnyState<S>,
    queues: &MemoryQueueStore,
    duplicates: bool,
    max_dequeue: u64,
) -> usize {
    pump_some(
        state,
        queues,
        &WORK_QUEUES,
        duplicates,
        max_dequeue,
        usize::MAX,
    )
    .await
}

/// Like [`pump`], over the given queues only, stopping after `limit` messages.
async fn pump_some<S: Stores<Queue = MemoryQueueStore>>(
    state: &AnyState<S>,
    queues: &MemoryQueueStore,
    which: &[(&str, &str)],
    duplicates: bool,
    max_dequeue: u64,
    limit: usize,
) -> usize {
    let mut invocations = 0;
    let mut delivered = 0;
    for _ in 0..10_000 {
        let mut any = false;
        for &(queue, function) in which {
            let messages = queues
                .get_messages(queue, 32, std::time::Duration::ZERO)
                .await
                .unwrap_or_default();
            for m in messages {
                if delivered == limit {
                    return invocations;
                }
                delivered += 1;
                any = true;
                let decoded =
                    String::from_utf8(MessageEncoding::Base64.decode(&m.text).unwrap()).unwrap();
                let payload = host_payload(function, &decoded, m.dequeue_count, &m.id);
                let uri = format!("/{function}");
                let (status, _) = if duplicates {
                    let (a, b) = tokio::join!(
                        call(
                            state,
                            "POST",
                            &uri,
                            Some("application/json"),
                            payload.clone()
                        ),
                        call(
                            state,
                            "POST",
                            &uri,
                            Some("application/json"),
                            payload.clone()
                        )
                    );
                    invocations += 1;
                    if a.0.is_success() {
                        a
                    } else {
                        b
                    }
                } else {
                    call(state, "POST", &uri, Some("application/json"), payload).await
                };
                invocations += 1;
                if status.is_success() || m.dequeue_count >= max_dequeue {
                    queues
                        .delete_message(queue, &m.id, &m.pop_receipt)
                        .await
                        .unwrap();
                }
            }
        }
        if !any {
            return invocations;
        }
    }
    panic!("queues never drained");
}

/// The decoded JSON of every message waiting in `queue` (left in place).
async fn peek_all(queues: &MemoryQueueStore, queue: &str) -> Vec<String> {
    queues
        .get_messages(queue, 32, std::time::Duration::ZERO)
        .await
        .unwrap_or_default()
        .iter()
        .map(|m| String::from_utf8(MessageEncoding::Base64.decode(&m.text).unwrap()).unwrap())
        .collect()
}

/// Delivers one decoded message to `function` as the host would.
async fn deliver(
    state: &State,
    function: &str,
    decoded: &str,
    dequeue: u64,
) -> (StatusCode, Value) {
    let payload = host_payload(function, decoded, dequeue, "manual");
    call(
        state,
        "POST",
        &format!("/{function}"),
        Some("application/json"),
        payload,
    )
    .await
}

/// Work rows of a scan that are not finished (`pending` or `expanded`).
fn unfinished_work_rows(tables: &MemoryTableStore, scan_id: &str) -> Vec<Entity> {
    tables
        .rows("TablescanWork")
        .into_iter()
        .filter(|e| e.partition_key.starts_with(scan_id) && e.row_key != "counter")
        .filter(|e| {
            matches!(
                e.properties.get_str("State").as_deref(),
                Some("pending" | "expanded")
            )
        })
        .collect()
}

fn source_rows() -> Vec<Entity> {
    let mut rows = Vec::new();
    for (i, pk) in [
        "",
        "Microsoft.A",
        "Microsoft.AspNet",
        "Microsoft.AspNet.Mvc",
        "System.X",
        "it's",
        "Z\u{FFFF}",
        "\u{1F600}",
    ]
    .iter()
    .enumerate()
    {
        for v in 0..(3 + i * 7) {
            let mut e = Entity::new(*pk, format!("{v}.0.{i}"));
            e.properties
                .insert("Downloads", json!(format!("{}", v * 1000)));
            e.properties
                .insert("Downloads@odata.type", json!("Edm.Int64"));
            e.properties.insert("Listed", json!(v % 2 == 0));
            e.properties
                .insert("Title", json!(format!("package {pk} v{v}")));
            rows.push(e);
        }
    }
    rows
}

/// Delete scans (optionally filtered) under concurrent duplicate deliveries and adversarial
/// pages: the rows in range (and matching) are gone, every other row is left, the scan completes.
/// The expected rows come from the test's own key and value checks.
#[tokio::test]
async fn delete_scans_complete_with_duplicate_deliveries() {
    type Keep = fn(&Entity) -> bool;
    let in_prefix: Keep = |e| e.partition_key.starts_with("Microsoft.");
    let cases: [(Value, Keep); 3] = [
        (json!({"partitionKeyPrefix": "Microsoft."}), |e| {
            !e.partition_key.starts_with("Microsoft.")
        }),
        (json!({"partitionKeyUpperBound": "Microsoft.AspNet"}), |e| {
            e.partition_key
                .encode_utf16()
                .cmp("Microsoft.AspNet".encode_utf16())
                .is_ge()
        }),
        (
            json!({"partitionKeyPrefix": "Microsoft.", "filter": "Listed eq true and Downloads ge 2000L"}),
            |e| {
                // Row keys are "{v}.0.{i}"; Listed is v even, Downloads v * 1000.
                let v: u32 = e.row_key.split('.').next().unwrap().parse().unwrap();
                !(e.partition_key.starts_with("Microsoft.") && v % 2 == 0 && v >= 2)
            },
        ),
    ];
    assert!(source_rows().iter().any(in_prefix));
    for (extra, keep) in cases {
        let tables = MemoryTableStore::new(Pagination::adversarial(11, 0.2));
        tables.load("Source", source_rows());
        let (state, queues) = state_with(tables.clone(), &[]);
        let mut body = json!({"driver": "delete", "sourceTable": "Source", "confirm": "Source", "takeCount": 3});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (status, reply) = post_json(&state, "/api/scans", body.clone()).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
        let id = reply["id"].as_str().unwrap().to_string();
        pump(&state, &queues, true, 5).await;
        let (_, status) = call(&state, "GET", &format!("/api/scans/{id}"), None, vec![]).await;
        assert_eq!(status["state"], "completed", "{body} → {status}");
        let expected: Vec<Entity> = source_rows().into_iter().filter(keep).collect();
        let left = tables.rows("Source");
        let key = |e: &Entity| (e.partition_key.clone(), e.row_key.clone());
        let mut want: Vec<_> = expected.iter().map(key).collect();
        let mut got: Vec<_> = left.iter().map(key).collect();
        want.sort();
        got.sort();
        assert_eq!(got, want, "{body}");
        let deleted = (source_rows().len() - expected.len()) as i64;
        assert!(status["rowsWritten"].as_i64() <= Some(deleted), "{status}");
        assert_eq!(status["failedWorkItems"], 0, "{status}");
    }
}

#[tokio::test]
async fn copy_scan_completes_exactly_with_duplicate_deliveries() {
    for (duplicates, strategy, take, split) in [
        (false, "prefix", 2, "page"),
        (true, "prefix", 3, "page"),
        (true, "serial", 5, "page"),
        (true, "prefix", 4, "partitionKey"),
    ] {
        let tables = MemoryTableStore::new(Pagination::adversarial(7, 0.2));
        tables.load("Source", source_rows());
        let (state, queues) = state_with(tables.clone(), &[]);
        let (status, body) = post_json(&state, "/api/scans", json!({
            "driver": "copy", "sourceTable": "Source", "destinationTable": "Dest", "strategy": strategy, "takeCount": take, "workSplit": split
        }))
        .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        let id = body["id"].as_str().unwrap().to_string();
        assert_eq!(body["state"], "running");

        pump(&state, &queues, duplicates, 5).await;
        let (status, body) = call(&state, "GET", &format!("/api/scans/{id}"), None, vec![]).await;
        assert_eq!(status, StatusCode::OK);
        let total = source_rows().len() as i64;
        assert_eq!(body["state"], "completed", "{body}");
        assert_eq!(body["rowsScanned"], total, "{body}");
        assert_eq!(body["rowsWritten"], total, "{body}");
        assert_eq!(body["pendingWorkItems"], 0);
        assert_eq!(body["failedWorkItems"], 0);
        assert!(body["completedAt"].is_string());
        assert_eq!(
            tables.rows("Dest"),
            tables.rows("Source"),
            "destination equals source ({strategy}, dup {duplicates})"
        );
        assert_only_cleanup_queued(&state, &queues);
    }
}

#[tokio::test]
async fn count_scan_with_prefix_and_bounds() {
    let tables = MemoryTableStore::default();
    tables.load("Source", source_rows());
    let (state, queues) = state_with(tables.clone(), &[]);
    let (status, body) = post_json(
        &state,
        "/api/scans",
        json!({
            "driver": "count", "sourceTable": "Source", "partitionKeyPrefix": "Microsoft.",
            "partitionKeyLowerBound": "Microsoft.A", "takeCount": 1
        }),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let id = body["id"].as_str().unwrap().to_string();
    pump(&state, &queues, false, 5).await;
    let (_, body) = call(&state, "GET", &format!("/api/scans/{id}"), None, vec![]).await;
    let expected = source_rows()
        .iter()
        .filter(|e| {
            e.partition_key.starts_with("Microsoft.") && e.partition_key.as_str() > "Microsoft.A"
        })
        .count();
    assert_eq!(body["state"], "completed");
    assert_eq!(body["rowsScanned"], expected as i64);
    assert_eq!(body["rowsWritten"], 0);
    assert!(tables.rows("Dest").is_empty());
}

#[tokio::test]
async fn poisoned_work_fails_the_scan_with_a_reason() {
    let tables = MemoryTableStore::default();
    tables.load("Source", source_rows());
    let (state, queues) = state_with(tables.clone(), &[("TABLESCAN_TEST_FAIL_PREFIX", "System.")]);
    let (_, body) = post_json(&state, "/api/scans", json!({"driver": "copy", "sourceTable": "Source", "destinationTable": "Dest", "takeCount": 2})).await;
    let id = body["id"].as_str().unwrap().to_string();
    pump(&state, &queues, false, 5).await;
    let (_, body) = call(&state, "GET", &format!("/api/scans/{id}"), None, vec![]).await;
    assert_eq!(body["state"], "failed", "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("System."),
        "{body}"
    );
    assert_eq!(body["failedWorkItems"], 1);
}

#[tokio::test]
async fn cancel_drops_pending_work() {
    let tables = MemoryTableStore::default();
    tables.load("Source", source_rows());
    let (state, queues) = state_with(tables.clone(), &[]);
    let (_, body) = post_json(
        &state,
        "/api/scans",
        json!({"driver": "copy", "sourceTable": "Source", "destinationTable": "Dest", "takeCount": 2}),
    )
    .await;
    let id = body["id"].as_str().unwrap().to_string();
    // Run part of the scan, so steps and copy items are queued on both queues.
    pump_some(&state, &queues, &WORK_QUEUES, false, 5, 6).await;
    let (_, before) = call(&state, "GET", &format!("/api/scans/{id}"), None, vec![]).await;
    let queued = before["pendingWorkItems"].as_i64().unwrap();
    assert!(queued >= 2, "{before}");
    assert!(!peek_all(&queues, "tablescan-tablecopy").await.is_empty());
    let leftovers = [
        (
            "PrefixScan",
            peek_all(&queues, "tablescan-prefixscan").await,
        ),
        ("TableCopy", peek_all(&queues, "tablescan-tablecopy").await),
    ];

    let (status, body) = call(&state, "DELETE", &format!("/api/scans/{id}"), None, vec![]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["state"], "cancelled");
    // An ended scan has nothing pending: what was queued will never run.
    assert_eq!(body["pendingWorkItems"], 0, "{body}");
    assert_eq!(body["droppedWorkItems"], queued, "{body}");
    assert_eq!(unfinished_work_rows(&tables, &id).len() as i64, queued);

    // The queued messages clean up as they are delivered (twice each, concurrently).
    pump(&state, &queues, true, 5).await;
    assert_only_cleanup_queued(&state, &queues);
    assert!(
        unfinished_work_rows(&tables, &id).is_empty(),
        "no pending work rows remain"
    );
    let (_, after) = call(&state, "GET", &format!("/api/scans/{id}"), None, vec![]).await;
    assert_eq!(after["state"], "cancelled");
    assert_eq!(after["pendingWorkItems"], 0, "{after}");
    assert_eq!(after["droppedWorkItems"], queued, "{after}");
    assert_eq!(after["failedWorkItems"], 0, "{after}");
    for field in ["rowsScanned", "rowsWritten", "messagesProcessed"] {
        assert_eq!(after[field], before[field], "{field}: {after}");
    }
    let tracker = state.tracker_on(state.bookkeeping());
    let totals = tracker.totals(&id, 4).await.unwrap();
    assert_eq!((totals.pending(), totals.dropped), (0, queued));

    // Redeliveries, and the poison functions meeting the same messages, change nothing.
    for (function, texts) in &leftovers {
        for text in texts {
            let (status, reply) = deliver(&state, function, text, 2).await;
            assert_eq!(status, StatusCode::OK, "{reply}");
            let (status, reply) = deliver(&state, &format!("{function}Poison"), text, 1).await;
            assert_eq!(status, StatusCode::OK, "{reply}");
        }
    }
    assert_only_cleanup_queued(&state, &queues);
    assert_eq!(tracker.totals(&id, 4).await.unwrap(), totals);
    let (_, again) = call(&state, "GET", &format!("/api/scans/{id}"), None, vec![]).await;
    assert_eq!(again, after);

    let (status, body) = call(&state, "DELETE", &format!("/api/scans/{id}"), None, vec![]).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (status, body) = call(&state, "GET", "/api/scans", None, vec![]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["scans"][0]["id"], id.as_str());
    assert_eq!(body["scans"][0]["droppedWorkItems"], queued);
}

/// A poisoned message of a scan that has ended is dropped, not failed: the ended scan keeps its
/// state and its figures stay meaningful.
#[tokio::test]
async fn poisoned_work_of_a_cancelled_scan_is_dropped() {
    let tables = MemoryTableStore::default();
    tables.load("Source", source_rows());
    let (state, queues) = state_with(tables.clone(), &[]);
    let (_, body) = post_json(
        &state,
        "/api/scans",
        json!({"driver": "count", "sourceTable": "Source", "takeCount": 2}),
    )
    .await;
    let id = body["id"].as_str().unwrap().to_string();
    let root = peek_all(&queues, "tablescan-prefixscan").await;
    let (status, _) = call(&state, "DELETE", &format!("/api/scans/{id}"), None, vec![]).await;
    assert_eq!(status, StatusCode::OK);
    for _ in 0..2 {
        let (status, reply) = deliver(&state, "PrefixScanPoison", &root[0], 1).await;
        assert_eq!(status, StatusCode::OK, "{reply}");
    }
    let (_, scan) = call(&state, "GET", &format!("/api/scans/{id}"), None, vec![]).await;
    assert_eq!(scan["state"], "cancelled", "{scan}");
    assert_eq!(scan["failedWorkItems"], 0, "{scan}");
    assert_eq!(scan["droppedWorkItems"], 1, "{scan}");
    assert!(unfinished_work_rows(&tables, &id).is_empty());
}

/// A re-sent real work item whose message names another destination, other parameters or
/// another driver changes nothing: work runs with the scan's recorded context, so nothing is
/// written to the forged table and the scan completes exactly into its real destination.
#[tokio::test]
async fn forged_scan_context_in_a_message_changes_nothing() {
    let tables = MemoryTableStore::default();
    tables.load("Source", source_rows());
    let (state, queues) = state_with(tables.clone(), &[]);
    let (_, body) = post_json(
        &state,
        "/api/scans",
        json!({"driver": "copy", "sourceTable": "Source", "destinationTable": "Dest", "takeCount": 3}),
    )
    .await;
    let id = body["id"].as_str().unwrap().to_string();
    let record = state
        .tracker_on(state.bookkeeping())
        .get_scan(&id)
        .await
        .unwrap()
        .unwrap();
    let mut forged_context = serde_json::to_value(record.context.unwrap()).unwrap();
    for (field, value) in [
        ("sh", json!(1)),
        ("dr", json!("count")),
        ("st", json!("serial")),
        ("dst", json!({"c": "AzureWebJobsStorage", "t": "Hijack3"})),
    ] {
        forged_context[field] = value;
    }
    forged_context["p"]["prefix"] = json!("Microsoft.");
    forged_context["p"]["take"] = json!(1);
    // Steps run until copy items are queued; then forge a pending step and pending copy items:
    // as v1 messages with a whole forged context (refused: only v2 is read), and as v2 messages
    // with extra context fields (ignored).
    // A work item's text is its identity: a re-sent item keeps it byte for byte (only the
    // envelope around it is forged).
    let forge = |decoded: &str| -> Vec<String> {
        #[derive(serde::Deserialize)]
        struct Data {
            w: Box<serde_json::value::RawValue>,
        }
        #[derive(serde::Deserialize)]
        struct Envelope {
            n: String,
            d: Data,
        }
        let envelope: Envelope = serde_json::from_str(decoded).unwrap();
        let (n, w) = (json!(envelope.n), envelope.d.w.get());
        let v1 = format!(r#"{{"n":{n},"v":1,"d":{{"s":{forged_context},"w":{w}}}}}"#);
        let v2 = decoded.replacen(r#""d":{"#, r#""d":{"dst":{"t":"Hijack3"},"dr":"count","#, 1);
        assert_ne!(v2, decoded);
        vec![v1, v2]
    };
    pump_some(&state, &queues, &WORK_QUEUES[..1], false, 5, 2).await;
    let copies = peek_all(&queues, "tablescan-tablecopy").await;
    let steps = peek_all(&queues, "tablescan-prefixscan").await;
    assert!(!copies.is_empty() && !steps.is_empty());
    for text in forge(&copies[0])
        .iter()
        .chain(&forge(&copies[copies.len() - 1]))
    {
        let (status, reply) = deliver(&state, "TableCopy", text, 1).await;
        assert_forged_reply(text, status, &reply);
    }
    for text in forge(&steps[0]) {
        let (status, reply) = deliver(&state, "PrefixScan", &text, 1).await;
        assert_forged_reply(&text, status, &reply);
    }
    assert!(tables.rows("Hijack3").is_empty());
    pump(&state, &queues, true, 5).await;
    let (_, body) = call(&state, "GET", &format!("/api/scans/{id}"), None, vec![]).await;
    let total = source_rows().len() as i64;
    assert_eq!(body["state"], "completed", "{body}");
    assert_eq!(body["rowsScanned"], total, "{body}");
    assert_eq!(body["rowsWritten"], total, "{body}");
    assert_eq!(body["pendingWorkItems"], 0, "{body}");
    assert_eq!(tables.rows("Dest"), tables.rows("Source"));
    assert!(
        tables.rows("Hijack3").is_empty(),
        "nothing written to the forged table"
    );
    // A forged message for work the scan never had is refused (422), as before.
    let mut unknown: Value = serde_json::from_str(&copies[0]).unwrap();
    unknown["d"]["w"] = json!({"kind": "range", "from": ["a", "0"], "to": ["a", "9"]});
    let (status, reply) = deliver(&state, "TableCopy", &unknown.to_string(), 1).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{reply}");
    assert!(tables.rows("Hijack3").is_empty());
}

/// A forged message: one of another version (v1 carried a whole context) is refused naming its
/// version, writing nothing; a v2 one with extra context fields runs as its scan says.
fn assert_forged_reply(text: &str, status: StatusCode, reply: &Value) {
    if text.contains(r#""v":1"#) {
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{reply}");
        assert!(reply.to_string().contains("v1, expected"), "{reply}");
    } else {
        assert_eq!(status, StatusCode::OK, "{reply}");
    }
}

/// A scan whose record has no usable context runs no work: its message is answered with an
/// error naming why (the host retries, then poisons it), and nothing is written.
#[tokio::test]
async fn a_scan_recorded_without_a_context_runs_no_work() {
    use tablescan::storage::{BatchOperation, TableStore};
    let tables = MemoryTableStore::default();
    tables.load("Source", source_rows());
    let (state, queues) = state_with(tables.clone(), &[]);
    let (_, body) = post_json(
        &state,
        "/api/scans",
        json!({"driver": "copy", "sourceTable": "Source", "destinationTable": "Dest", "takeCount": 4, "partitionKeyPrefix": "Microsoft."}),
    )
    .await;
    let id = body["id"].as_str().unwrap().to_string();
    let (record, _) = tables
        .get_entity("TablescanScans", &id, "scan")
        .await
        .unwrap()
        .unwrap();
    let mut without = record.clone();
    without.properties.remove("Context");
    tables
        .submit_batch(
            "TablescanScans",
            &id,
            &[BatchOperation::Replace {
                entity: without,
                etag: None,
            }],
        )
        .await
        .unwrap();
    let messages = queues
        .get_messages("tablescan-prefixscan", 1, std::time::Duration::ZERO)
        .await
        .unwrap();
    let root =
        String::from_utf8(MessageEncoding::Base64.decode(&messages[0].text).unwrap()).unwrap();
    let (status, reply) = deliver(&state, "PrefixScan", &root, 1).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{reply}");
    assert!(
        reply.to_string().contains("no usable recorded context"),
        "{reply}"
    );
    assert!(tables.rows("Dest").is_empty());
}

/// Bookkeeping tables are never a scan's source or destination, on any connection that reaches
/// the app's own account; source and destination are compared by the account the connections
/// resolve to and by table name up to case.
#[tokio::test]
async fn scans_never_touch_bookkeeping_tables_or_rewrite_their_source() {
    let own_by_endpoint = format!(
        "AccountName=devstoreaccount1;AccountKey={};TableEndpoint=http://127.0.0.1:10002/DEVSTOREACCOUNT1/;QueueEndpoint=http://127.0.0.1:10001/devstoreaccount1",
        tablescan::storage::connection::DEVELOPMENT_ACCOUNT_KEY
    );
    let other_account = format!(
        "DefaultEndpointsProtocol=https;AccountName=other;AccountKey={}",
        tablescan::storage::connection::DEVELOPMENT_ACCOUNT_KEY
    );
    let tables = MemoryTableStore::default();
    tables.load("Source", source_rows());
    let other = MemoryTableStore::default();
    other.load("Source", source_rows());
    let mut settings: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in [
        (
            "AzureWebJobsStorage",
            "UseDevelopmentStorage=true".to_string(),
        ),
        ("TABLESCAN_CONNECTIONS", "Alias,Other".to_string()),
        ("Alias", own_by_endpoint),
        ("Other", other_account),
    ] {
        settings.insert(k.into(), v);
    }
    let config = Config::from_lookup(|k| settings.get(k).cloned()).unwrap();
    let queues = MemoryQueueStore::new();
    let map: BTreeMap<String, MemoryTableStore> = [
        ("AzureWebJobsStorage".to_string(), tables.clone()),
        ("Alias".to_string(), tables.clone()),
        ("Other".to_string(), other.clone()),
    ]
    .into_iter()
    .collect();
    let state = app_state::<MemoryStores>(config, map, &queues);
    let copy = |extra: Value| {
        let mut body =
            json!({"driver": "copy", "sourceTable": "Source", "destinationTable": "Dest"});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let cases: Vec<(Value, &str)> = vec![
        (
            copy(json!({"destinationTable": "TablescanScans"})),
            "destinationTable",
        ),
        (
            copy(json!({"destinationTable": "tablescanwork"})),
            "destinationTable",
        ),
        (
            copy(json!({"destinationTable": "TABLESCANSCANS", "destinationConnection": "Alias"})),
            "destinationTable",
        ),
        (
            json!({"driver": "count", "sourceTable": "TablescanWork"}),
            "sourceTable",
        ),
        (
            json!({"driver": "count", "sourceTable": "tablescanscans", "sourceConnection": "Alias"}),
            "sourceTable",
        ),
        (
            copy(
                json!({"sourceTable": "TablescanWork", "sourceConnection": "Alias", "destinationConnection": "Other"}),
            ),
            "sourceTable",
        ),
        (
            copy(json!({"destinationTable": "SOURCE"})),
            "destinationTable",
        ),
        (
            copy(json!({"destinationTable": "source", "destinationConnection": "Alias"})),
            "destinationTable",
        ),
        (
            copy(json!({"sourceConnection": "Alias", "destinationTable": "Source"})),
            "destinationTable",
        ),
        // tablescan's own table names are refused on every connection, whatever its account.
        (
            copy(json!({"destinationConnection": "Other", "destinationTable": "TablescanScans"})),
            "destinationTable",
        ),
    ];
    for (body, field) in cases {
        let (status, reply) = post_json(&state, "/api/scans", body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} → {reply}");
        assert_eq!(reply["error"]["field"], field, "{body} → {reply}");
    }
    assert!(tables.rows("TablescanScans").is_empty());
    assert!(tables.rows("TablescanWork").is_empty());
    assert!(queues.is_empty());
    // Another account's table of the source's name is an ordinary table.
    for body in [
        copy(json!({"destinationConnection": "Other", "destinationTable": "Source"})),
        copy(json!({"destinationConnection": "Other", "destinationTable": "Copied"})),
        json!({"driver": "count", "sourceConnection": "Other", "sourceTable": "Source"}),
    ] {
        let (status, reply) = post_json(&state, "/api/scans", body.clone()).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body} → {reply}");
    }
    pump(&state, &queues, false, 5).await;
    assert_eq!(other.rows("Copied"), tables.rows("Source"));
    assert!(other.rows("TablescanScans").is_empty());
    assert_eq!(tables.rows("TablescanScans").len(), 3, "three scan records");
}

#[tokio::test]
async fn bad_requests_get_4xx_naming_the_field_and_write_nothing() {
    let tables = MemoryTableStore::default();
    tables.load("Source", source_rows());
    let (state, queues) = state_with(tables.clone(), &[]);
    let base = json!({"driver": "copy", "sourceTable": "Source", "destinationTable": "Dest"});
    let with = |k: &str, v: Value| crate::support::with_field(&base, k, v);
    let without = |k: &str| crate::support::without_field(&base, k);
    let cases: Vec<(Value, &str)> = vec![
        (with("takeCount", json!(0)), "takeCount"),
        (with("takeCount", json!(1001)), "takeCount"),
        (with("takeCount", json!("ten")), "takeCount"),
        (with("driver", json!("drop")), "driver"),
        (without("driver"), "driver"),
        (without("sourceTable"), "sourceTable"),
        (without("destinationTable"), "destinationTable"),
        (with("sourceTable", json!("bad-name")), "sourceTable"),
        (with("sourceTable", json!("Missing")), "sourceTable"),
        (
            with("destinationTable", json!("source")),
            "destinationTable",
        ),
        (with("surprise", json!(1)), "surprise"),
        (
            with("partitionKeyPrefix", json!("a/b")),
            "partitionKeyPrefix",
        ),
        (
            with("partitionKeyLowerBound", json!("x#")),
            "partitionKeyLowerBound",
        ),
        (
            with("partitionKeyUpperBound", json!("\u{1}")),
            "partitionKeyUpperBound",
        ),
        (
            json!({"driver": "copy", "sourceTable": "Source", "destinationTable": "Dest", "partitionKeyLowerBound": "b", "partitionKeyUpperBound": "a"}),
            "partitionKeyLowerBound",
        ),
        (
            with("segmentsPerFirstPrefix", json!(0)),
            "segmentsPerFirstPrefix",
        ),
        (
            with(
                "sourceConnection",
                json!("DefaultEndpointsProtocol=https;AccountName=x;AccountKey=y"),
            ),
            "sourceConnection",
        ),
        (
            json!({"driver": "count", "sourceTable": "Source", "destinationTable": "Dest"}),
            "destinationTable",
        ),
    ];
    for (body, field) in cases {
        let (status, reply) = post_json(&state, "/api/scans", body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} → {reply}");
        assert_eq!(reply["error"]["field"], field, "{body} → {reply}");
    }
    let (status, reply) = call(
        &state,
        "POST",
        "/api/scans",
        Some("application/json"),
        b"{not json".to_vec(),
    )
    .await;
    assert_eq!(
        (status, reply["error"]["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("InvalidJson"))
    );
    let (status, _) = call(
        &state,
        "POST",
        "/api/scans",
        Some("text/plain"),
        base.to_string().into_bytes(),
    )
    .await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let huge = json!({"driver": "count", "sourceTable": "Source", "partitionKeyPrefix": "x".repeat(100_000)});
    let (status, _) = post_json(&state, "/api/scans", huge).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    let (status, reply) = call(
        &state,
        "GET",
        "/api/scans/0000000000000-deadbeef",
        None,
        vec![],
    )
    .await;
    assert_eq!(
        (status, reply["error"]["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("NotFound"))
    );
    let (status, _) = call(&state, "GET", "/api/scans/../etc", None, vec![]).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, reply) = call(
        &state,
        "PUT",
        "/api/scans",
        Some("application/json"),
        b"{}".to_vec(),
    )
    .await;
    assert_eq!(
        (status, reply["error"]["code"].as_str()),
        (StatusCode::METHOD_NOT_ALLOWED, Some("MethodNotAllowed"))
    );
    // Nothing was written: no bookkeeping tables, no destination, no queue messages.
    assert!(tables.rows("Dest").is_empty());
    assert!(tables.rows("TablescanScans").is_empty());
    assert!(queues.is_empty());
}

#[tokio::test]
async fn queue_functions_reject_malformed_invocations_with_json_errors() {
    let (state, _) = state_with(MemoryTableStore::default(), &[]);
    let (status, _) = call(&state, "GET", "/", None, vec![]).await;
    assert_eq!(status, StatusCode::OK);
    let cases: Vec<Vec<u8>> = vec![
        b"not json".to_vec(),
        json!({"Data": {}}).to_string().into_bytes(),
        host_payload(
            "PrefixScan",
            "{\"n\":\"scan-step\",\"v\":9,\"d\":{}}",
            1,
            "a",
        ),
        host_payload(
            "PrefixScan",
            "{\"n\":\"table-copy\",\"v\":1,\"d\":{}}",
            1,
            "a",
        ),
        host_payload(
            "PrefixScan",
            "{\"n\":\"scan-step\",\"v\":1,\"d\":{\"s\":",
            1,
            "a",
        ),
    ];
    for payload in cases {
        let (status, body) = call(
            &state,
            "POST",
            "/PrefixScan",
            Some("application/json"),
            payload.clone(),
        )
        .await;
        assert!(
            status.is_client_error() || status.is_server_error(),
            "{}",
            String::from_utf8_lossy(&payload)
        );
        assert!(body["Logs"][0].as_str().is_some(), "{body}");
        assert!(body.get("Outputs").is_some());
    }
}

/// A table store whose inserts (or, with `upserts`, upserts) into one table always fail with a
/// transient error once armed.
#[derive(Clone)]
struct FailingInserts {
    inner: MemoryTableStore,
    table: String,
    armed: Arc<std::sync::atomic::AtomicBool>,
    upserts: bool,
}

impl tablescan::storage::TableStore for FailingInserts {
    forward_table_store!(inner: query_page);
    async fn submit_batch_with_etags(
        &self,
        t: &str,
        pk: &str,
        ops: &[BatchOperation],
    ) -> StorageResult<Vec<Option<String>>> {
        let inserting = ops.iter().any(|o| match o {
            BatchOperation::Insert(_) => !self.upserts,
            BatchOperation::Upsert(_) => self.upserts,
            _ => false,
        });
        if t == self.table && inserting && self.armed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(tablescan::storage::StorageError::from_status(
                503,
                Some("ServerBusy".into()),
                "injected",
            ));
        }
        self.inner.submit_batch_with_etags(t, pk, ops).await
    }
    forward_table_store!(inner: get_entity, create_table, delete_table);
}

/// [`FailingInserts`] with the in-memory queues and blobs.
struct FailingStores;

impl Stores for FailingStores {
    type Table = FailingInserts;
    type Queue = MemoryQueueStore;
    type Blob = tablescan::lab::memory::MemoryBlobStore;
}

/// The app over `tables` behind [`FailingInserts`] for `table` (disarmed: arm it with the flag
/// returned), with default settings and in-memory queues.
fn failing_app(
    tables: &MemoryTableStore,
    table: &str,
    upserts: bool,
) -> (
    AnyState<FailingStores>,
    MemoryQueueStore,
    Arc<std::sync::atomic::AtomicBool>,
) {
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let store = FailingInserts {
        inner: tables.clone(),
        table: table.into(),
        armed: armed.clone(),
        upserts,
    };
    let settings = BTreeMap::from([(
        "AzureWebJobsStorage".to_string(),
        "UseDevelopmentStorage=true".to_string(),
    )]);
    let config = Config::from_lookup(|k| settings.get(k).cloned()).unwrap();
    let queues = MemoryQueueStore::new();
    let map = BTreeMap::from([("AzureWebJobsStorage".to_string(), store)]);
    (app_state(config, map, &queues), queues, armed)
}

/// Storage failing every delivery of a work item, the last one included, is not the item's own
/// failure: its last delivery leaves the row marked and unrecorded, and the poison function
/// re-queues the message for another round instead of failing the scan (issue 27, part 8);
/// the scan does not hang either, since after its rounds the poison function fails it.
#[tokio::test]
async fn a_bookkeeping_failure_on_the_last_attempt_is_re_queued_instead_of_hanging() {
    let tables = MemoryTableStore::default();
    tables.load("Source", source_rows());
    let (state, queues, armed) = failing_app(&tables, "TablescanWork", false);
    let request = json!({"driver": "count", "sourceTable": "Source", "takeCount": 2})
        .to_string()
        .into_bytes();
    let response = app(state.clone())
        .oneshot(
            Request::builder()
                .method("POST")
                .uri("/api/scans")
                .header("content-type", "application/json")
                .body(Body::from(request))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let body: Value =
        serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    let id = body["id"].as_str().unwrap().to_string();
    // From now on the root step can never register its children.
    armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut last_status = None;
    let mut last_payload = Vec::new();
    for attempt in 1..=5u64 {
        let messages = queues
            .get_messages("tablescan-prefixscan", 1, std::time::Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(messages.len(), 1, "attempt {attempt}");
        let m = &messages[0];
        assert_eq!(m.dequeue_count, attempt);
        let decoded = String::from_utf8(MessageEncoding::Base64.decode(&m.text).unwrap()).unwrap();
        let payload = host_payload("PrefixScan", &decoded, m.dequeue_count, &m.id);
        last_payload = host_payload("PrefixScanPoison", &decoded, 1, "p1");
        let response = app(state.clone())
            .oneshot(
                Request::builder()
                    .method("POST")
                    .uri("/PrefixScan")
                    .header("content-type", "application/json")
                    .body(Body::from(payload))
                    .unwrap(),
            )
            .await
            .unwrap();
        last_status = Some(response.status());
        assert!(
            !response.status().is_success(),
            "attempt {attempt} must fail"
        );
    }
    assert!(last_status.unwrap().is_server_error());
    let response = app(state.clone())
        .oneshot(
            Request::builder()
                .uri(format!("/api/scans/{id}"))
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let body: Value =
        serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(body["state"], "running", "{body}");
    assert_eq!(body["failedWorkItems"], 0, "{body}");
    // The host poisons the message; the poison function puts it back for round 1 (delayed).
    let (status, reply) = call(
        &state,
        "POST",
        "/PrefixScanPoison",
        Some("application/json"),
        last_payload,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert!(
        reply.to_string().contains("re-queued for round 1"),
        "{reply}"
    );
    // The original (this test is the host and never moved it) and the re-queued copy.
    assert_eq!(
        queues
            .approximate_count("tablescan-prefixscan")
            .await
            .unwrap(),
        2,
        "the message is back on its queue"
    );
}

/// The poison-queue function settles a message whose item no delivery recorded: it re-queues
/// the message for another round of deliveries, three times; then, once the item's last
/// delivery marked its row (as it does before it works, so a delivery killed in the middle
/// leaves the mark), the item and its scan fail with a reason. A poison message for an unmarked
/// row (forged, early, or a last delivery that died before marking) is re-queued within the
/// same rounds and fails nothing, and is ignored once they are used. A second delivery of a
/// poison message starts no round (a redelivery of the one that started the current round puts
/// the message again: its earlier attempt may have died before its put); an undecodable
/// message changes nothing.
#[tokio::test]
async fn poison_queue_function_re_queues_an_unrecorded_item_then_fails_it_once() {
    let tables = MemoryTableStore::default();
    tables.load("Source", source_rows());
    let (state, queues) = state_with(tables.clone(), &[]);
    let (_, body) = post_json(
        &state,
        "/api/scans",
        json!({"driver": "count", "sourceTable": "Source", "takeCount": 2}),
    )
    .await;
    let id = body["id"].as_str().unwrap().to_string();
    let messages = queues
        .get_messages(
            "tablescan-prefixscan",
            1,
            std::time::Duration::from_secs(3600),
        )
        .await
        .unwrap();
    let decoded =
        String::from_utf8(MessageEncoding::Base64.decode(&messages[0].text).unwrap()).unwrap();
    // A copy re-queued for round `round` carries it in its envelope (`r`; absent: round 0).
    let settle = |message_id: &str, dequeue_count: u64, round: u64| {
        let text = if round == 0 {
            decoded.clone()
        } else {
            decoded.replacen("\"v\":2,", &format!("\"v\":2,\"r\":{round},"), 1)
        };
        let payload = host_payload("PrefixScanPoison", &text, dequeue_count, message_id);
        let state = state.clone();
        async move {
            let (status, reply) = call(
                &state,
                "POST",
                "/PrefixScanPoison",
                Some("application/json"),
                payload,
            )
            .await;
            assert_eq!(status, StatusCode::OK, "{reply}");
            reply.to_string()
        }
    };
    let scan_state = || async {
        let (_, scan) = call(&state, "GET", &format!("/api/scans/{id}"), None, vec![]).await;
        scan
    };
    let work_table = state.config.work_table.clone();
    let root = tables
        .rows(&work_table)
        .into_iter()
        .find(|e| e.row_key != "counter")
        .unwrap();
    let root_row = || {
        tables
            .rows(&work_table)
            .into_iter()
            .find(|e| e.row_key == root.row_key)
            .unwrap()
    };
    // The root's last delivery marks its row, then dies.
    let mark = || {
        let mut mark = Entity::new(root.partition_key.clone(), root.row_key.clone());
        mark.properties.insert("LastDelivery", json!(true));
        let tables = tables.clone();
        let (table, pk) = (work_table.clone(), root.partition_key.clone());
        async move {
            tables
                .submit_batch(
                    &table,
                    &pk,
                    &[BatchOperation::Merge {
                        entity: mark,
                        etag: None,
                    }],
                )
                .await
                .unwrap()
        }
    };
    let queued = || async {
        queues
            .approximate_count("tablescan-prefixscan")
            .await
            .unwrap()
    };
    let before = queued().await;

    // Unmarked (forged, early, or a last delivery that died before marking): round 1, no failure.
    let reply = settle("f1", 1, 0).await;
    assert!(
        reply.contains("re-queued for round 1") && reply.contains("nothing is failed"),
        "{reply}"
    );
    assert_eq!(queued().await, before + 1);
    // Its redelivery: the round is its own; the row still unmarked, it puts the message again.
    let reply = settle("f1", 2, 0).await;
    assert!(reply.contains("re-queued for round 1"), "{reply}");
    assert_eq!(queued().await, before + 2);
    // A second delivery of the same message otherwise starts nothing.
    let reply = settle("f1", 1, 0).await;
    assert!(
        reply.contains("already started re-queue round 1"),
        "{reply}"
    );
    // Another copy of round 0 (a duplicate live copy, poisoned too) starts no round.
    let reply = settle("d1", 1, 0).await;
    assert!(
        reply.contains("a poisoned copy of re-queue round 0"),
        "{reply}"
    );
    assert_eq!(queued().await, before + 2);
    for round in 2..=3u64 {
        mark().await;
        let message = format!("p{round}");
        let reply = settle(&message, 1, round - 1).await;
        assert!(
            reply.contains(&format!("re-queued for round {round}")),
            "{reply}"
        );
        let reply = settle(&message, 1, round - 1).await;
        assert!(reply.contains("already started re-queue round"), "{reply}");
        assert_eq!(
            queued().await,
            before + round + 1,
            "round {round}: no duplicate"
        );
        assert_eq!(scan_state().await["state"], "running", "round {round}");
    }
    let row = root_row();
    assert_eq!(row.properties.get_value("Requeues"), Some(json!(3)));
    assert_eq!(row.properties.get_value("LastDelivery"), Some(json!(false)));
    assert_eq!(row.properties.get_str("RequeuedBy").as_deref(), Some("p3"));
    // Rounds used: an unmarked row's poison message is ignored, the scan goes on.
    let reply = settle("f2", 1, 3).await;
    assert!(
        reply.contains("ignored") && reply.contains("not exhausted"),
        "{reply}"
    );
    assert_eq!(scan_state().await["state"], "running", "a forged message");
    // The fourth round's last delivery dies too: the item fails, once.
    mark().await;
    for delivery in ["first", "second"] {
        settle("p4", 1, 3).await;
        let scan = scan_state().await;
        assert_eq!(scan["state"], "failed", "{delivery}: {scan}");
        assert_eq!(scan["failedWorkItems"], 1, "{delivery}: {scan}");
        let error = scan["error"].as_str().unwrap();
        assert!(
            error.contains("was poisoned") && error.contains("in 4 rounds"),
            "{scan}"
        );
    }
    assert_eq!(queued().await, before + 4);
    let garbage = host_payload("TableCopyPoison", "not an envelope", 1, "p2");
    let (status, reply) = call(
        &state,
        "POST",
        "/TableCopyPoison",
        Some("application/json"),
        garbage,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
}

/// A copy item reads at most two pages of its range (16 queries at most); rows inserted into the
/// range after it was scanned make it grow, and the rest is handed on as a new item, so the copy
/// still completes with every row and no invocation reads without bound.
#[tokio::test]
async fn copy_ranges_that_grew_after_the_scan_are_handed_on_and_copied_whole() {
    let tables = MemoryTableStore::default();
    let first: Vec<Entity> = (0..10)
        .map(|i| Entity::new("grow", format!("{:05}", i * 1000)))
        .collect();
    tables.load("Source", first);
    let (state, queues) = state_with(tables.clone(), &[]);
    let (status, body) = post_json(
        &state,
        "/api/scans",
        json!({"driver": "copy", "sourceTable": "Source", "destinationTable": "Dest", "strategy": "serial"}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let id = body["id"].as_str().unwrap().to_string();
    // Scan only: the one copy item covers ("grow", "00000")..=("grow", "09000").
    pump_some(&state, &queues, &WORK_QUEUES[..1], false, 5, usize::MAX).await;
    // 4,500 rows appear inside that range before the copy runs.
    let grown: Vec<Entity> = (0..9000)
        .filter(|i| i % 2 == 1)
        .map(|i| Entity::new("grow", format!("{i:05}")))
        .collect();
    let grown_count = grown.len() as i64;
    tables.load("Source", grown);
    let copy_invocations = pump(&state, &queues, false, 5).await;
    let (_, body) = call(&state, "GET", &format!("/api/scans/{id}"), None, vec![]).await;
    assert_eq!(body["state"], "completed", "{body}");
    assert_eq!(body["rowsWritten"], 10 + grown_count, "{body}");
    assert_eq!(tables.rows("Dest"), tables.rows("Source"));
    assert!(
        copy_invocations >= 3,
        "4,510 rows at 2,000 per item need at least 3 copy items, got {copy_invocations}"
    );
}

/// A prefix step of a copy records its outcome and queues its children before it writes the
/// rows it read; when the writes fail, the next delivery adopts the recorded outcome and must
/// read those rows' ranges again and write them (the recording delivery wrote nothing).
#[tokio::test]
async fn a_step_whose_writes_fail_after_its_outcome_is_recorded_is_finished_by_the_next_delivery() {
    let tables = MemoryTableStore::default();
    tables.load("Source", source_rows());
    let (state, queues, armed) = failing_app(&tables, "Dest", true);
    let (status, body) = call(
        &state,
        "POST",
        "/api/scans",
        Some("application/json"),
        json!({"driver": "copy", "sourceTable": "Source", "destinationTable": "Dest", "takeCount": 4})
            .to_string()
            .into_bytes(),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let id = body["id"].as_str().unwrap().to_string();

    // The root's first delivery: it reads rows, records its outcome and queues its children,
    // then its writes fail.
    armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let root = peek_all(&queues, "tablescan-prefixscan").await;
    assert_eq!(root.len(), 1);
    let payload = host_payload("PrefixScan", &root[0], 1, "first");
    let (status, _) = call(
        &state,
        "POST",
        "/PrefixScan",
        Some("application/json"),
        payload,
    )
    .await;
    assert!(status.is_server_error(), "{status}");
    assert!(tables.rows("Dest").is_empty());
    let queued = peek_all(&queues, "tablescan-prefixscan").await;
    assert!(
        queued.len() > 1,
        "the children were queued before the writes: {queued:?}"
    );
    let recorded: Vec<Entity> = tables
        .rows("TablescanWork")
        .into_iter()
        .filter(|e| e.properties.get_str("State").as_deref() == Some("expanded"))
        .collect();
    assert_eq!(recorded.len(), 1, "the root's outcome is recorded");

    // Every later delivery (the root's included) runs with working writes.
    armed.store(false, std::sync::atomic::Ordering::SeqCst);
    pump(&state, &queues, false, 5).await;
    let (_, body) = call(&state, "GET", &format!("/api/scans/{id}"), None, vec![]).await;
    assert_eq!(body["state"], "completed", "{body}");
    let source = tables.rows("Source");
    assert_eq!(body["rowsScanned"], source.len() as i64, "{body}");
    assert_eq!(body["rowsWritten"], source.len() as i64, "{body}");
    assert_eq!(tables.rows("Dest"), source);
}

/// The app over `own` (the app's storage, `UseDevelopmentStorage=true`) and the allowed
/// connections `extra` (app-setting name, connection string, the store it reaches).
fn state_with_connections(
    own: &MemoryTableStore,
    extra: &[(&str, String, &MemoryTableStore)],
) -> (State, MemoryQueueStore) {
    let mut settings: BTreeMap<String, String> = BTreeMap::new();
    settings.insert(
        "AzureWebJobsStorage".into(),
        "UseDevelopmentStorage=true".into(),
    );
    settings.insert("TABLESCAN_COUNTER_SHARDS".into(), "4".into());
    let names: Vec<&str> = extra.iter().map(|(name, _, _)| *name).collect();
    settings.insert("TABLESCAN_CONNECTIONS".into(), names.join(","));
    let mut map = BTreeMap::new();
    map.insert("AzureWebJobsStorage".to_string(), own.clone());
    for (name, connection, store) in extra {
        settings.insert(name.to_string(), connection.clone());
        map.insert(name.to_string(), (*store).clone());
    }
    let config = Config::from_lookup(|k| settings.get(k).cloned()).unwrap();
    let queues = MemoryQueueStore::new();
    (app_state(config, map, &queues), queues)
}

/// POSTs `body` as it is (not re-serialized: duplicate keys survive) and expects a 400 naming
/// `field`.
async fn refused_raw(state: &State, body: &str, field: &str) {
    let (status, reply) = call(
        state,
        "POST",
        "/api/scans",
        Some("application/json"),
        body.as_bytes().to_vec(),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body} → {reply}");
    assert_eq!(reply["error"]["field"], field, "{body} → {reply}");
    assert_eq!(reply["error"]["code"], "InvalidField", "{body} → {reply}");
}

#[tokio::test]
async fn duplicate_keys_in_a_request_body_are_refused_and_nothing_is_written() {
    let tables = MemoryTableStore::default();
    tables.load("Source", source_rows());
    let (state, queues) = state_with(tables.clone(), &[]);
    for (body, field) in [
        // Last-one-wins would run a delete.
        (
            r#"{"driver":"count","sourceTable":"Source","driver":"delete","confirm":"Source"}"#,
            "driver",
        ),
        // The same key spelled with an escape is the same key.
        (
            r#"{"driver":"count","sourceTable":"Source","\u0064river":"delete","confirm":"Source"}"#,
            "driver",
        ),
        (
            r#"{"driver":"copy","sourceTable":"Source","destinationTable":"Dest","destinationTable":"Source"}"#,
            "destinationTable",
        ),
        (
            r#"{"driver":"count","sourceTable":"Source","extra":{"a":1,"b":[{"c":1,"c":2}]}}"#,
            "extra.b[0].c",
        ),
        (
            r#"{"driver":"delete","sourceTable":"Source","confirm":"Other","confirm":"Source"}"#,
            "confirm",
        ),
    ] {
        refused_raw(&state, body, field).await;
    }
    assert_eq!(tables.rows("Source"), {
        let other = MemoryTableStore::default();
        other.load("Source", source_rows());
        other.rows("Source")
    });
    assert!(tables.rows("Dest").is_empty());
    assert!(tables.rows("TablescanScans").is_empty());
    assert!(tables.rows("TablescanWork").is_empty());
    assert!(queues.is_empty());
    // Keys that differ only in case are different keys (and `Driver` is then unknown).
    refused_raw(
        &state,
        r#"{"driver":"count","sourceTable":"Source","Driver":"delete"}"#,
        "Driver",
    )
    .await;
}

#[tokio::test]
async fn host_aliases_of_one_account_are_one_account() {
    let key = tablescan::storage::connection::DEVELOPMENT_ACCOUNT_KEY;
    let alias = |host: &str| {
        format!(
            "AccountName=devstoreaccount1;AccountKey={key};TableEndpoint=http://{host}:10002/devstoreaccount1;QueueEndpoint=http://{host}:10001/devstoreaccount1"
        )
    };
    let tables = MemoryTableStore::default();
    tables.load("Source", source_rows());
    let (state, queues) = state_with_connections(
        &tables,
        &[
            ("ByName", alias("localhost"), &tables),
            ("ByIpv6", alias("[::1]"), &tables),
        ],
    );
    for (body, field) in [
        (
            json!({"driver": "count", "sourceTable": "TablescanWork", "sourceConnection": "ByName"}),
            "sourceTable",
        ),
        (
            json!({"driver": "count", "sourceTable": "tablescanwork", "sourceConnection": "ByIpv6"}),
            "sourceTable",
        ),
        (
            json!({"driver": "copy", "sourceTable": "Source", "destinationTable": "TablescanScans", "destinationConnection": "ByName"}),
            "destinationTable",
        ),
        (
            json!({"driver": "delete", "sourceTable": "TablescanWork", "confirm": "TablescanWork", "sourceConnection": "ByName"}),
            "sourceTable",
        ),
        (
            json!({"driver": "copy", "sourceTable": "Source", "destinationTable": "source", "destinationConnection": "ByName"}),
            "destinationTable",
        ),
        (
            json!({"driver": "copy", "sourceTable": "Source", "sourceConnection": "ByIpv6", "destinationTable": "Source", "destinationConnection": "ByName"}),
            "destinationTable",
        ),
        (
            json!({"driver": "import", "sourceContainer": "backups", "destinationTable": "TABLESCANSCANS", "destinationConnection": "ByIpv6"}),
            "destinationTable",
        ),
    ] {
        let (status, reply) = post_json(&state, "/api/scans", body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} → {reply}");
        assert_eq!(reply["error"]["field"], field, "{body} → {reply}");
    }
    assert!(tables.rows("TablescanScans").is_empty());
    assert!(tables.rows("TablescanWork").is_empty());
    assert!(tables.rows("source").is_empty());
    assert!(queues.is_empty());
}

#[tokio::test]
async fn cosmos_table_accounts_are_refused_as_a_source_and_accepted_as_a_destination() {
    let key = tablescan::storage::connection::DEVELOPMENT_ACCOUNT_KEY;
    let tables = MemoryTableStore::default();
    tables.load("Source", source_rows());
    let cosmos = MemoryTableStore::default();
    cosmos.load("Source", source_rows());
    let (state, queues) = state_with_connections(
        &tables,
        &[
            (
                "Cosmos",
                format!("DefaultEndpointsProtocol=https;AccountName=prod;AccountKey={key};TableEndpoint=https://prod.table.cosmos.azure.com:443/;"),
                &cosmos,
            ),
            (
                "CosmosLegacy",
                format!("DefaultEndpointsProtocol=https;AccountName=prod;AccountKey={key};TableEndpoint=https://prod.table.cosmosdb.azure.com;"),
                &cosmos,
            ),
        ],
    );
    for body in [
        json!({"driver": "count", "sourceTable": "Source", "sourceConnection": "Cosmos"}),
        json!({"driver": "count", "sourceTable": "Source", "sourceConnection": "Cosmos", "strategy": "serial"}),
        json!({"driver": "copy", "sourceTable": "Source", "sourceConnection": "CosmosLegacy", "destinationTable": "Back"}),
        json!({"driver": "delete", "sourceTable": "Source", "confirm": "Source", "sourceConnection": "Cosmos"}),
    ] {
        let (status, reply) = post_json(&state, "/api/scans", body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} → {reply}");
        assert_eq!(
            reply["error"]["field"], "sourceConnection",
            "{body} → {reply}"
        );
        let message = reply["error"]["message"].as_str().unwrap();
        assert!(message.contains("key order"), "{message}");
    }
    assert!(queues.is_empty());
    assert!(tables.rows("TablescanScans").is_empty());
    assert!(tables.rows("Back").is_empty());
    assert_eq!(cosmos.rows("Source").len(), tables.rows("Source").len());
    // As a destination it is an ordinary table service.
    let body = json!({"driver": "copy", "sourceTable": "Source", "destinationTable": "Copied", "destinationConnection": "Cosmos"});
    let (status, reply) = post_json(&state, "/api/scans", body).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    pump(&state, &queues, false, 5).await;
    assert_eq!(cosmos.rows("Copied"), tables.rows("Source"));
}

/// Every work queue is empty, and the ended scans' cleanup messages (delayed by the work
/// retention: docs/retention.md) are all that is queued.
fn assert_only_cleanup_queued<S: Stores>(state: &AppState<S>, queues: &MemoryQueueStore) {
    let config = &state.config;
    assert_eq!(queues.len(&config.prefix_scan_queue), 0);
    assert_eq!(queues.len(&config.table_copy_queue), 0);
    assert!(
        queues.len(&config.cleanup_queue) >= 1,
        "the ended scan's cleanup is queued"
    );
}
