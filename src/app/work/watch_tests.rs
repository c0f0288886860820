//! The watch in virtual time, on the in-memory stores: a cancel answered by another instance
//! stops an enqueue's puts within [`NOTICE`], and the ended scan's counters say what was put and
//! change no more; the cache trusts a running state as long as [`CACHE_TRUST`] says.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tokio::task::JoinHandle;
use tower::ServiceExt;

use super::watch::{CACHE_TRUST, CHECK_INTERVAL, NOTICE};
use super::*;
use crate::app::config::Config;
use crate::app::drivers::enqueue::PUTS_IN_FLIGHT;
use crate::app::messages::StepMessage;
use crate::app::pace::Meter;
use crate::lab::memory::{MemoryBlobStore, MemoryQueueStore, MemoryStores, MemoryTableStore};
use crate::storage::blob::BlobStore;
use crate::storage::{Entity, MessageEncoding};

type App = Arc<AppState<MemoryStores>>;

const LIMIT: u32 = 10;
const DESTINATION: &str = "rows";

/// One instance of the app over the shared in-memory `tables`, `queues` and `blobs`.
fn instance(tables: &MemoryTableStore, queues: &MemoryQueueStore, blobs: &MemoryBlobStore) -> App {
    let settings = BTreeMap::from([
        ("AzureWebJobsStorage", "UseDevelopmentStorage=true"),
        ("TABLESCAN_COUNTER_SHARDS", "4"),
    ]);
    let config = Config::from_lookup(|k| settings.get(k).map(|v| v.to_string())).unwrap();
    let own = STORAGE_SETTING.to_string();
    AppState::with_connections(
        config,
        [(own.clone(), tables.clone())].into(),
        [(own.clone(), queues.clone())].into(),
        [(own, Ok(blobs.clone()))].into(),
        crate::app::drivers::registry(),
    )
}

/// Two instances of one app (nothing shared but storage).
fn two_instances() -> (
    App,
    App,
    MemoryTableStore,
    MemoryQueueStore,
    MemoryBlobStore,
) {
    let (tables, queues) = (MemoryTableStore::default(), MemoryQueueStore::default());
    let blobs = MemoryBlobStore::new();
    let a = instance(&tables, &queues, &blobs);
    let b = instance(&tables, &queues, &blobs);
    (a, b, tables, queues, blobs)
}

async fn call(app: &App, method: &str, uri: &str, body: Option<Value>) -> (StatusCode, Value) {
    let mut request = Request::builder().method(method).uri(uri);
    if body.is_some() {
        request = request.header("content-type", "application/json");
    }
    let body = body.map_or_else(Body::empty, |b| Body::from(b.to_string()));
    let response = crate::app::server::app(app.clone())
        .oneshot(request.body(body).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap())
}

/// Takes every visible message of the app's work queues and delivers each on `app` in a task
/// of its own, as the host would (first delivery).
async fn deliver_visible(app: &App, queues: &MemoryQueueStore) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    let config = &app.config;
    for (queue, step) in [
        (&config.prefix_scan_queue, true),
        (&config.table_copy_queue, false),
    ] {
        let got = queues
            .get_messages(queue, 32, Duration::from_secs(600))
            .await
            .unwrap();
        for message in got {
            let text = MessageEncoding::Base64.decode(&message.text).unwrap();
            let payload = json!({
                "Data": {"message": serde_json::to_string(&String::from_utf8(text).unwrap()).unwrap()},
                "Metadata": {"DequeueCount": "1", "Id": format!("\"{}\"", message.id)},
            })
            .to_string();
            let (app, queues, queue) = (app.clone(), queues.clone(), queue.clone());
            tasks.push(tokio::spawn(async move {
                let reply = match step {
                    true => execute::<StepMessage, _>(&app, payload.as_bytes()).await,
                    false => execute::<messages::ItemMessage, _>(&app, payload.as_bytes()).await,
                };
                assert!(reply.status.is_success(), "{:?}", reply.logs);
                queues
                    .delete_message(&queue, &message.id, &message.pop_receipt)
                    .await
                    .unwrap();
            }));
        }
    }
    tasks
}

/// An enqueue of 300 rows at one row a message, paced at 10 requests a second, runs on
/// instance A; B answers its cancel once A has put 20 messages. A's invocations learn of it by
/// reading the record (A's cache knows nothing of B's answer): within [`NOTICE`] they start no
/// put, so at most `NOTICE × limit` puts (and those in flight) follow the answer. The scan's
/// final counters are the messages on the queue, and draining its queued work changes them
/// no more.
#[tokio::test(start_paused = true)]
async fn a_cancel_answered_by_another_instance_stops_the_puts_within_notice() {
    let (a, b, tables, queues, _) = two_instances();
    tables.load(
        "Source",
        (0..300).map(|i| Entity::new("p", format!("{i:03}"))),
    );
    let request = json!({"driver": "enqueue", "sourceTable": "Source",
        "destinationQueue": DESTINATION, "maxRequestsPerSecond": LIMIT});
    let (status, started) = call(&a, "POST", "/api/scans", Some(request)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{started}");
    let id = started["id"].as_str().unwrap().to_string();

    let mut running = Vec::new();
    while queues.len(DESTINATION) < 20 {
        running.extend(deliver_visible(&a, &queues).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, cancelled) = call(&b, "DELETE", &format!("/api/scans/{id}"), None).await;
    assert_eq!(status, StatusCode::OK, "{cancelled}");
    let (answered, at_answer) = (tokio::time::Instant::now(), queues.len(DESTINATION));
    for task in running {
        task.await.unwrap();
    }
    let put = queues.len(DESTINATION);
    let allowed = (NOTICE.as_secs_f64() * f64::from(LIMIT)).ceil() as usize + PUTS_IN_FLIGHT;
    assert!(
        put - at_answer <= allowed,
        "{} puts after the cancel answered (at most {allowed}); the invocations ended {:?} after it",
        put - at_answer,
        answered.elapsed()
    );
    eprintln!(
        "at answer {at_answer}, put {put}, ended after {:?}",
        answered.elapsed()
    );
    assert!(put < 300, "the scan was not cut short: {put} messages");

    let (_, ended) = call(&b, "GET", &format!("/api/scans/{id}"), None).await;
    assert_eq!(ended["state"], "cancelled", "{ended}");
    assert_eq!(ended["messagesWritten"], put, "{ended}");
    assert_eq!(ended["rowsWritten"], put, "{ended}");
    // What was queued meets the ended scan and is dropped: the counters stay.
    while queues.len(&a.config.prefix_scan_queue) + queues.len(&a.config.table_copy_queue) > 0 {
        for task in deliver_visible(&a, &queues).await {
            task.await.unwrap();
        }
    }
    let (_, drained) = call(&b, "GET", &format!("/api/scans/{id}"), None).await;
    for field in [
        "rowsScanned",
        "rowsMatched",
        "rowsWritten",
        "messagesWritten",
    ] {
        assert_eq!(drained[field], ended[field], "{field}: {drained}");
    }
    assert_eq!(queues.len(DESTINATION), put);
}

/// An index build of about 150 staging records (a serial scan of 1,200 rows, one a page: one
/// record per step), paced at 10 requests a second, is cancelled by instance B while A's assembly item reads
/// the records: A reads at most the rule's allowance more and neither writes the segment nor
/// switches the prefix's pointer to the cancelled build.
#[tokio::test(start_paused = true)]
async fn a_cancelled_index_build_stops_its_assembly_and_is_never_published() {
    let (a, b, tables, queues, blobs) = two_instances();
    let rows = (0..1200).map(|i| {
        let mut e = Entity::new(format!("k{i:04}"), "r");
        e.properties.insert("Owner", json!(format!("o{}", i % 7)));
        e
    });
    tables.load("Source", rows);
    let request = json!({"driver": "index", "sourceTable": "Source", "property": "Owner",
        "destinationContainer": "idx", "destinationPrefix": "owner", "strategy": "serial",
        "takeCount": 1, "maxRequestsPerSecond": LIMIT});
    let (status, started) = call(&a, "POST", "/api/scans", Some(request)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{started}");
    let id = started["id"].as_str().unwrap().to_string();
    let reads = || blobs.counters().snapshot().read;
    let before = reads();

    // Phase 0 writes the records; phase 1's item reads them, 16 at a time at the limit.
    let mut running: Vec<JoinHandle<()>> = Vec::new();
    while reads() < before + 30 {
        running.retain(|task| !task.is_finished());
        let (_, now) = call(&b, "GET", &format!("/api/scans/{id}"), None).await;
        assert_eq!(
            now["state"], "running",
            "ended before its assembly read 30 records"
        );
        running.extend(deliver_visible(&a, &queues).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, cancelled) = call(&b, "DELETE", &format!("/api/scans/{id}"), None).await;
    assert_eq!(status, StatusCode::OK, "{cancelled}");
    let at_answer = reads();
    for task in running {
        task.await.unwrap();
    }
    let allowed = (NOTICE.as_secs_f64() * f64::from(LIMIT)).ceil() as u64 + 16;
    assert!(
        reads() - at_answer <= allowed,
        "{} reads after the cancel answered (at most {allowed})",
        reads() - at_answer
    );
    let written = blobs.list("idx", "owner/", 5000, None).await.unwrap();
    let names: Vec<&str> = written.blobs.iter().map(|b| b.name.as_str()).collect();
    let published = |n: &&str| n.ends_with("index.json") || n.contains("/segments/");
    assert!(!names.iter().any(published), "{names:?}");
    assert!(names.len() > 100, "the staging records: {}", names.len());
    let (_, ended) = call(&b, "GET", &format!("/api/scans/{id}"), None).await;
    assert_eq!(ended["state"], "cancelled", "{ended}");
}

/// The watch skips its read while the cache holds a running state younger than [`CACHE_TRUST`]
/// (its bound [`NOTICE`] counts on it): the cache trusts one exactly that long. An ended state
/// is kept, even against a `running` read that began before the end was recorded (a work
/// item's beginning, or a watch, racing a cancel this instance answered).
#[tokio::test(start_paused = true)]
async fn the_cache_trusts_a_running_state_as_long_as_the_watch_assumes() {
    let cache = crate::app::state::ScanStateCache::default();
    cache.put("s", ScanState::Running);
    tokio::time::sleep(CACHE_TRUST - Duration::from_millis(1)).await;
    assert_eq!(cache.get("s"), Some(ScanState::Running));
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(cache.get("s"), None);
    cache.put("s", ScanState::Cancelled);
    tokio::time::sleep(CACHE_TRUST * 100).await;
    assert_eq!(cache.get("s"), Some(ScanState::Cancelled));
    cache.put("s", ScanState::Running);
    assert_eq!(cache.get("s"), Some(ScanState::Cancelled));
}

/// What the watch costs (module invariant 4): eight invocations of one scan working together on
/// an instance for a minute read its record about once every [`CHECK_INTERVAL`] between them,
/// not once each; an invocation shorter than that, begun with a fresh state, reads nothing; and
/// the watch stops reading once its invocation has returned.
#[tokio::test(start_paused = true)]
async fn the_watch_reads_about_once_per_interval_per_instance_and_only_while_working() {
    let (a, _, tables, _, _) = two_instances();
    tables.load("Source", [Entity::new("p", "r")]);
    let request = json!({"driver": "count", "sourceTable": "Source"});
    let (status, started) = call(&a, "POST", "/api/scans", Some(request)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{started}");
    let id = started["id"].as_str().unwrap().to_string();
    let reads = || tables.counters().snapshot().point_read;

    // Begun with a fresh state (as `begin` leaves it), shorter than an interval: no read.
    a.scan_states.put(&id, ScanState::Running);
    let before = reads();
    let short = tokio::time::sleep(CHECK_INTERVAL - Duration::from_millis(1));
    watch::watching(&a, &id, &Meter::new(), short).await;
    assert_eq!(reads() - before, 0, "a short invocation read the record");

    // Eight at once, started a quarter of a second apart, working a minute each.
    let before = reads();
    let work = Duration::from_secs(60);
    let invocations = (0..8u32).map(|i| {
        let (a, id) = (a.clone(), id.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(250) * i).await;
            watch::watching(&a, &id, &Meter::new(), tokio::time::sleep(work)).await
        })
    });
    for task in invocations.collect::<Vec<_>>() {
        task.await.unwrap();
    }
    let read = reads() - before;
    let bound = (work.as_secs_f64() / CHECK_INTERVAL.as_secs_f64()).ceil() as u64 + 2;
    assert!(read <= bound, "{read} reads in a minute (at most {bound})");
    assert!(
        read >= bound - 4,
        "the watch did not keep the state fresh: {read} reads"
    );

    // Nothing is working any more: no read.
    let idle = reads();
    tokio::time::sleep(work).await;
    assert_eq!(reads(), idle, "the watch read with no invocation working");
}
