//! Conditional writes whose answer is lost, on Azurite through the fault proxy: the first
//! request of the kind under test takes effect and then its connection is reset (`reset_after`,
//! one fault in all), so the storage adapter retries it and the retry meets the write itself
//! (409: the row exists; 412: the ETag changed). Each claim, lease, end, registration and
//! re-queue round must know its own write. Before: a phase start's claim was taken for another
//! check's and the phase never started (an import stayed `running` with nothing pending, as CI
//! saw under storage faults); a completion lease held by nobody for 11 minutes; an end's hook
//! skipped; a poison message's round started and its message never put back; registering more
//! than 49 existing rows again failed as contention; an export or index build taking over a
//! cancelled scan's prefix was refused, the prefix left reserved by a scan with no record.
//! A stale phase claim's takeover is taken on a manual clock: ages are the clock's, not waited.
//! Rows are read back with the raw REST client (tests/support/raw.rs), not tablescan's parser.

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use serde_json::json;
use time::OffsetDateTime;

use support::raw::{self, RawClient};
use support::router::{call, queue_payload, running_count_record, InProcessApp};
use tablescan::app::tracking::{NewWork, ScanEndHook, ScanState, Tracker};
use tablescan::clock::Clock;
use tablescan::lab::proxy::{FaultPolicy, StorageProxy};
use tablescan::storage::azure_table::AzureTableStore;
use tablescan::storage::blob::{BlobRequestKind, BlobStore};
use tablescan::storage::connection::StorageAccount;
use tablescan::storage::request_counts::{RequestCounters, RequestKind};
use tablescan::storage::{BatchOperation, Entity, TableStore};

/// A proxy in front of the shared Azurite whose first entity group transaction takes effect
/// and loses its answer; nothing else is faulted.
async fn losing_one_answer() -> StorageProxy {
    support::faults::proxy(
        FaultPolicy {
            reset_after: 1.0,
            kinds: vec![RequestKind::Batch],
            max_faults: Some(1),
            ..FaultPolicy::default()
        },
        7,
    )
    .await
}

/// A table store through `proxy`.
fn through(proxy: &StorageProxy) -> AzureTableStore {
    StorageAccount::parse(&proxy.connection_string())
        .unwrap()
        .table_store(Arc::new(RequestCounters::new()))
}

/// A phase claim is taken over once it is 10 s old (`PHASE_CLAIM_TAKEOVER`: its claimer died
/// before registering the phase's root), by one check only; the takeover's answer lost (its
/// replace took effect, the retry met its own ETag: 412) is still the taker's.
#[tokio::test]
async fn a_stale_claims_takeover_whose_answer_was_lost_is_its_takers() {
    let (scans, work) = tracker_tables().await;
    let clock = Clock::manual(OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap());
    let direct = support::table_store().0;
    let direct = Tracker::new(&direct, &scans, &work).with_clock(&clock);
    assert!(direct.claim_phase_start(SCAN, 3, 1).await.unwrap());
    clock.advance(Duration::from_millis(9_999));
    assert!(
        !direct.claim_phase_start(SCAN, 3, 1).await.unwrap(),
        "not stale a millisecond before"
    );

    clock.advance(Duration::from_millis(1));
    // The insert passes (409: the claim is there); the takeover's replace loses its answer.
    let proxy = support::faults::proxy(
        FaultPolicy {
            reset_after: 1.0,
            kinds: vec![RequestKind::Batch],
            spare_first: 1,
            max_faults: Some(1),
            ..FaultPolicy::default()
        },
        7,
    )
    .await;
    let store = through(&proxy);
    let taker = Tracker::new(&store, &scans, &work).with_clock(&clock);
    assert!(
        taker.claim_phase_start(SCAN, 3, 1).await.unwrap(),
        "the takeover took effect: it is this check's"
    );
    assert_eq!(proxy.faults_injected(), 1, "{:?}", proxy.faults_by_kind());
    assert_eq!(
        proxy.count_of(RequestKind::Batch),
        3,
        "{:?}",
        proxy.counts()
    );
    assert!(
        !direct.claim_phase_start(SCAN, 3, 1).await.unwrap(),
        "taken over once: the new claim is fresh"
    );
    let row = claim_row(&work).await;
    assert_eq!(
        row.text("ClaimedAt"),
        Some("\"2027-01-15T08:00:10Z\""),
        "{row:?}"
    );
}

/// The claim row of phase 1 in shard 3 of [`SCAN`], as stored.
async fn claim_row(work: &str) -> raw::RawEntity {
    RawClient::azurite()
        .get_entity(work, &format!("{SCAN}-03"), "phase-1")
        .await
        .unwrap()
        .expect("the claim row")
}

/// A tracker's two tables, created straight on Azurite.
async fn tracker_tables() -> (String, String) {
    let (scans, work) = (support::unique_name("Scans"), support::unique_name("Work"));
    let direct = support::table_store().0;
    Tracker::new(&direct, &scans, &work)
        .ensure_tables()
        .await
        .unwrap();
    (scans, work)
}

/// The proxy lost exactly one answer, and the adapter sent that transaction twice.
fn lost_one(proxy: &StorageProxy) {
    assert_eq!(proxy.faults_injected(), 1, "{:?}", proxy.faults_by_kind());
    assert_eq!(
        proxy.count_of(RequestKind::Batch),
        2,
        "{:?}",
        proxy.counts()
    );
}

const SCAN: &str = "8204197617253-058a4b93";

#[tokio::test]
async fn a_phase_claim_whose_answer_was_lost_is_its_claimers() {
    let (scans, work) = tracker_tables().await;
    let proxy = losing_one_answer().await;
    let store = through(&proxy);
    let tracker = Tracker::new(&store, &scans, &work);
    assert!(
        tracker.claim_phase_start(SCAN, 3, 1).await.unwrap(),
        "the insert took effect: the claim is this check's"
    );
    lost_one(&proxy);
    assert!(
        !tracker.claim_phase_start(SCAN, 3, 1).await.unwrap(),
        "another check finds it claimed"
    );
    let row = claim_row(&work).await;
    let by = row.text("ClaimedBy").expect("ClaimedBy");
    assert_eq!(by.len(), 18, "a quoted 16-digit token: {by}");
}

/// A tracker's tables holding one running scan's record (written straight on Azurite).
async fn running_scan() -> (String, String) {
    let (scans, work) = tracker_tables().await;
    let direct = support::table_store().0;
    let record = running_count_record(SCAN, 4, OffsetDateTime::now_utc());
    Tracker::new(&direct, &scans, &work)
        .insert_scan(&record)
        .await
        .unwrap();
    (scans, work)
}

#[tokio::test]
async fn a_completion_lease_whose_answer_was_lost_is_its_takers() {
    let (scans, work) = running_scan().await;
    let proxy = losing_one_answer().await;
    let store = through(&proxy);
    let tracker = Tracker::new(&store, &scans, &work);
    assert!(tracker.take_completion_lease(SCAN).await.unwrap());
    lost_one(&proxy);
    assert!(!tracker.take_completion_lease(SCAN).await.unwrap(), "held");
    let row = RawClient::azurite()
        .get_entity(&scans, SCAN, "scan")
        .await
        .unwrap()
        .unwrap();
    assert!(row.text("CompletionLeaseBy").is_some(), "{row:?}");
}

/// Counts the ends it is told about.
#[derive(Default)]
struct Ends(AtomicUsize);

impl ScanEndHook for Ends {
    fn scan_ended<'b>(&'b self, _: &'b str) -> futures::future::BoxFuture<'b, ()> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async {})
    }
}

#[tokio::test]
async fn a_scan_end_whose_answer_was_lost_is_its_enders() {
    let (scans, work) = running_scan().await;
    let proxy = losing_one_answer().await;
    let store = through(&proxy);
    let ends = Ends::default();
    let tracker = Tracker::new(&store, &scans, &work).with_end_hook(&ends);
    let ended = tracker.finish_scan(SCAN, ScanState::Cancelled, Some("asked"));
    assert!(ended.await.unwrap(), "this call ended it");
    lost_one(&proxy);
    assert_eq!(ends.0.load(Ordering::SeqCst), 1, "its end hook ran");
    let again = tracker.finish_scan(SCAN, ScanState::Cancelled, Some("asked"));
    assert!(!again.await.unwrap(), "a second end finds it ended");
    assert_eq!(ends.0.load(Ordering::SeqCst), 1);
    let row = RawClient::azurite()
        .get_entity(&scans, SCAN, "scan")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.text("State"), Some("\"cancelled\""), "{row:?}");
}

/// A registration of 90 children in one shard whose answer was lost, and then the same 90
/// registered again (an adopted outcome registers its children again): the counter counts
/// them once. Before, the retry failed one transaction per existing row, 49 at most.
#[tokio::test]
async fn registering_rows_that_are_there_already_counts_them_once() {
    let (scans, work) = tracker_tables().await;
    let children: Vec<NewWork> = (0..90)
        .map(|i| NewWork {
            id: format!("t-{i:04}"),
            kind: "item",
            shard: 2,
        })
        .collect();
    let refs: Vec<&NewWork> = children.iter().collect();
    let proxy = losing_one_answer().await;
    let store = through(&proxy);
    let tracker = Tracker::new(&store, &scans, &work);
    tracker.register_children(SCAN, &refs).await.unwrap();
    lost_one(&proxy);
    tracker.register_children(SCAN, &refs).await.unwrap();
    let counter = RawClient::azurite()
        .get_entity(&work, &format!("{SCAN}-02"), "counter")
        .await
        .unwrap()
        .expect("the counter row");
    assert_eq!(
        raw::integer(counter.text("Created")),
        Some(90),
        "{counter:?}"
    );
    let rows = RawClient::azurite().rows(&work).await;
    assert_eq!(rows.len(), 91, "90 work rows and the counter");
}

/// A poison delivery whose merge starting re-queue round 1 took effect and lost its answer
/// puts the message back on its live queue, as after an answer.
#[tokio::test]
async fn a_poison_round_whose_answer_was_lost_puts_the_message_back() {
    let proxy = support::faults::proxy(FaultPolicy::none(), 7).await;
    let account = StorageAccount::parse(&proxy.connection_string()).unwrap();
    let start = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
    let t = InProcessApp::start_with_tables(account, &[]).on_clock(Clock::manual(start));
    let store = support::table_store().0;
    let source = support::new_table(&store, "Source").await;
    let row = BatchOperation::Insert(Entity::new("a", "r"));
    store.submit_batch(&source, "a", &[row]).await.unwrap();
    let body = json!({"driver": "count", "sourceTable": source});
    let (status, started) = call(&t.state, "POST", "/api/scans", Some(body)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{started}");
    let (_, text) = t.take_step_message().await.expect("the root's message");

    proxy.set_faults(FaultPolicy {
        reset_after: 1.0,
        kinds: vec![RequestKind::Batch],
        max_faults: Some(1),
        ..FaultPolicy::default()
    });
    let payload = queue_payload("PrefixScanPoison", &text, 1, "poison-1");
    let (status, reply) = call(&t.state, "POST", "/PrefixScanPoison", Some(payload)).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(proxy.faults_injected(), 1, "{:?}", proxy.faults_by_kind());
    assert!(
        reply.to_string().contains("re-queued for round 1"),
        "{reply}"
    );
    let row = t.work_item_rows(started["id"].as_str().unwrap()).await;
    assert_eq!(row[0].text("RequeuedBy"), Some("\"poison-1\""), "{row:?}");
    // Round 1 is delivered 10 s after it starts (`work::poison::round_delay`), on the clock.
    let held = t.host_queues.held();
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(
        (held[0].queue.as_str(), held[0].due),
        (t.prefix_queue.as_str(), start + Duration::from_secs(10))
    );
    t.clock().advance(Duration::from_millis(9_999));
    assert_eq!(t.release_due().await, 0, "not before its time");
    t.clock().advance(Duration::from_millis(1));
    assert_eq!(t.release_due().await, 1);
    let (_, back) = t
        .take_step_message()
        .await
        .expect("the message is back on its live queue");
    let back: serde_json::Value = serde_json::from_str(&back).unwrap();
    assert_eq!(back["r"], 1, "in round 1: {back}");
}

/// A start that takes over a prefix reserved by a cancelled scan, the takeover's answer lost
/// (the create before it goes through: it finds the reservation): the start is accepted and the
/// reservation names it. Before, it was refused (400, "another export took over … first") and
/// the prefix stayed reserved by a scan that never got a record. For an export and for an
/// index build (`reservation` names the prefix's reservation blob).
#[tokio::test]
async fn a_reservation_takeover_whose_answer_was_lost_is_its_starters() {
    for (driver, reservation, format) in [
        ("export", "reservation.json", "tablescan-export/1"),
        ("index", "index-build.json", "tablescan-index-pointer/1"),
    ] {
        let proxy = support::faults::proxy(FaultPolicy::none(), 7).await;
        let connection = proxy.connection_string();
        let account = StorageAccount::parse(&connection).unwrap();
        let t = InProcessApp::start_with_tables(account, &[("AzureWebJobsStorage", &connection)]);
        let store = support::table_store().0;
        let source = support::new_table(&store, "Source").await;
        let row = BatchOperation::Insert(Entity::new("a", "r"));
        store.submit_batch(&source, "a", &[row]).await.unwrap();
        let mut holder = running_count_record(SCAN, 4, OffsetDateTime::now_utc());
        holder.state = ScanState::Cancelled;
        let tracker = t.state.tracker_on(t.state.bookkeeping());
        tracker.ensure_tables().await.unwrap();
        tracker.insert_scan(&holder).await.unwrap();
        let blobs = support::backup::blobs();
        let container = support::unique_name("taken");
        blobs.create_container(&container).await.unwrap();
        let name = format!("p/{reservation}");
        let held = json!({"format": format, "scanId": SCAN, "reservedAt": "2026-11-27T00:00:00Z"});
        support::backup::put(
            &blobs,
            &container,
            &name,
            held.to_string(),
            "application/json",
        )
        .await;

        // The create (409: it is there) goes through; the takeover's answer is lost.
        proxy.set_faults(FaultPolicy {
            reset_after: 1.0,
            blob_kinds: vec![BlobRequestKind::Write],
            spare_first: 1,
            max_faults: Some(1),
            ..FaultPolicy::default()
        });
        let mut body = json!({"driver": driver, "sourceTable": source,
            "destinationContainer": container, "destinationPrefix": "p"});
        if driver == "index" {
            body["property"] = json!("V");
        }
        let (status, started) = call(&t.state, "POST", "/api/scans", Some(body)).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{driver}: {started}");
        assert_eq!(proxy.faults_injected(), 1, "{:?}", proxy.faults_by_kind());
        let now = support::backup::download(&blobs, &container, &name).await;
        let now: serde_json::Value = serde_json::from_slice(&now.unwrap()).unwrap();
        assert_eq!(now["scanId"], started["id"], "{driver}: {now}");
    }
}
