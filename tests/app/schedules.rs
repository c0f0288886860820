//! Schedules in-process against Azurite (the app's router over the real storage adapters, the
//! `Scheduler` invoked as the host would, on the app's manual clock): refusals at PUT write
//! nothing; exactly one scan per due time across two instances, duplicated firings and a
//! restart across due times (the latest missed one runs, once); an idle firing costs at most 2
//! storage requests; `overlap: skip` records the skip; a run that cannot start is a recorded
//! failed run and the schedule goes on. The oracle is the bookkeeping table read with the raw
//! REST client (tests/support/raw.rs), not tablescan's own reader.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::{json, Value};
use time::macros::datetime;
use time::OffsetDateTime;

use support::raw::{RawClient, RawEntity};
use support::router::{call, InProcessApp};
use tablescan::app::schedule::scan_id;
use tablescan::clock::Clock;
use tablescan::storage::request_counts::RequestCounters;
use tablescan::storage::{BatchOperation, Entity, TableStore};

/// When the tests' clock starts: 30 s past a minute.
const T0: OffsetDateTime = datetime!(2027-01-15 10:00:30 UTC);

fn test_app() -> InProcessApp {
    InProcessApp::start(&[]).on_clock(Clock::manual(T0))
}

/// The timer's invocation, as the host sends it (docs/custom-handler-protocol.md §12).
fn timer_payload() -> Value {
    json!({
        "Data": {"timer": {"Schedule": {"AdjustForDST": true}, "ScheduleStatus": null, "IsPastDue": false}},
        "Metadata": {"sys": {"MethodName": "Scheduler", "UtcNow": "2027-01-15T10:00:30Z", "RandGuid": "00000000-0000-0000-0000-000000000000"}}
    })
}

async fn fire(t: &InProcessApp) {
    let (status, body) = call(&t.state, "POST", "/Scheduler", Some(timer_payload())).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

async fn put(t: &InProcessApp, name: &str, body: Value) -> (StatusCode, Value) {
    call(
        &t.state,
        "PUT",
        &format!("/api/schedules/{name}"),
        Some(body),
    )
    .await
}

/// A new source table of 3 rows.
async fn source_table() -> String {
    let store = support::account().table_store(Arc::new(RequestCounters::new()));
    let source = support::new_table(&store, "Source").await;
    for i in 0..3 {
        let pk = format!("p{i:03}");
        let op = BatchOperation::Insert(Entity::new(pk.clone(), "r"));
        store.submit_batch(&source, &pk, &[op]).await.unwrap();
    }
    source
}

/// Every row of the app's scans table (none if it does not exist yet).
async fn bookkeeping(t: &InProcessApp) -> Vec<RawEntity> {
    RawClient::azurite()
        .read_all(&t.scans_table)
        .await
        .unwrap_or_default()
}

/// Schedule `name`'s run rows: due time → (outcome, scan id).
async fn runs(t: &InProcessApp, name: &str) -> BTreeMap<String, (String, String)> {
    let partition = format!("~runs-{name}");
    let mut runs = BTreeMap::new();
    for row in bookkeeping(t).await {
        if row.partition_key() == partition {
            let due = string(&row, "Due");
            let outcome = string(&row, "Outcome");
            let scan = string(&row, "ScanId");
            assert!(
                runs.insert(due, (outcome, scan)).is_none(),
                "one row per due time"
            );
        }
    }
    runs
}

/// A String property's value, as the service stores it ("" when absent).
fn string(row: &RawEntity, name: &str) -> String {
    row.text(name)
        .map(|t| serde_json::from_str(t).expect("a JSON string"))
        .unwrap_or_default()
}

/// The ids of the scans recorded.
async fn scans(t: &InProcessApp) -> Vec<String> {
    let rows = bookkeeping(t).await;
    rows.iter()
        .filter(|r| r.row_key() == "scan" && !r.partition_key().starts_with('~'))
        .map(|r| r.partition_key())
        .collect()
}

#[tokio::test]
async fn refusals_at_put_write_nothing() {
    let t = test_app();
    let source = source_table().await;
    let count = json!({"driver": "count", "sourceTable": source});
    let refusals = [
        (
            "nightly",
            json!({"cron": "0 0 3 * *", "scan": count}),
            "cron",
        ),
        (
            "nightly",
            json!({"cron": "0 0 3 * * 7", "scan": count}),
            "cron",
        ),
        (
            "nightly",
            json!({"cron": "0 0 3 * * *", "scan": {"driver": "delete", "sourceTable": source}}),
            "scan.confirm",
        ),
        (
            "nightly",
            json!({"cron": "0 0 3 * * *", "scan": {"driver": "count", "sourceTable": source, "colour": 1}}),
            "scan.colour",
        ),
        (
            "nightly",
            json!({"cron": "0 0 3 * * *", "scan": {"driver": "nope", "sourceTable": source}}),
            "scan.driver",
        ),
        (
            "nightly",
            json!({"cron": "0 0 3 * * *", "scan": count, "overlap": "sometimes"}),
            "overlap",
        ),
        (
            "nightly",
            json!({"cron": "0 0 3 * * *", "scan": count, "keep": 3}),
            "keep",
        ),
        (
            "nightly",
            json!({"cron": "0 0 3 * * *", "scan": count, "every": 1}),
            "every",
        ),
        (
            "nightly_2",
            json!({"cron": "0 0 3 * * *", "scan": count}),
            "name",
        ),
        (
            &"n".repeat(64),
            json!({"cron": "0 0 3 * * *", "scan": count}),
            "name",
        ),
    ];
    for (name, body, field) in refusals {
        let (status, answer) = put(&t, name, body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        let message = answer["error"].to_string();
        assert!(
            message.contains(field),
            "{body}: {field} not named in {answer}"
        );
    }
    let written: Vec<_> = bookkeeping(&t)
        .await
        .iter()
        .map(|r| r.key().0.to_string())
        .collect();
    assert!(written.is_empty(), "a refused PUT wrote {written:?}");
    let (status, _) = put(&t, "n-1", json!({"cron": "0 0 3 * * *", "scan": count})).await;
    assert_eq!(status, StatusCode::CREATED);
}

#[tokio::test]
async fn one_scan_per_due_time_across_instances_duplicates_and_a_restart() {
    let a = test_app();
    let b = a.another_instance();
    let source = source_table().await;
    // No schedule yet, and no bookkeeping table: one query, answered 404.
    let before = a.counters.snapshot().total();
    fire(&a).await;
    let empty = a.counters.snapshot().total() - before;
    assert!(
        empty <= 2,
        "an idle firing with no table sent {empty} storage requests"
    );
    eprintln!("idle firing, no table yet: {empty} storage request(s)");
    let body = json!({"cron": "0 * * * * *", "overlap": "allow",
        "scan": {"driver": "count", "sourceTable": source}});
    let (status, schedule) = put(&a, "every-minute", body).await;
    assert_eq!(status, StatusCode::CREATED, "{schedule}");
    assert_eq!(schedule["nextDue"], "2027-01-15T10:01:00Z");

    // Idle: nothing is due before 10:01:00; a firing costs at most 2 requests.
    let before = a.counters.snapshot().total();
    fire(&a).await;
    let idle = a.counters.snapshot().total() - before;
    assert!(idle <= 2, "an idle firing sent {idle} storage requests");
    eprintln!("idle firing: {idle} storage request(s)");
    assert!(runs(&a, "every-minute").await.is_empty());

    // Due: two instances fire at once, and one fires twice.
    a.clock().set(datetime!(2027-01-15 10:01:00.400 UTC));
    futures::join!(fire(&a), fire(&b), fire(&a));
    fire(&b).await;
    let first = runs(&a, "every-minute").await;
    let due1 = "20270115T100100Z";
    let id1 = scan_id("every-minute", datetime!(2027-01-15 10:01:00 UTC));
    assert_eq!(
        first,
        BTreeMap::from([(due1.to_string(), ("started".into(), id1.clone()))])
    );
    assert_eq!(scans(&a).await, vec![id1.clone()]);

    // A restart across due times: the app was down from 10:01:30 to 10:07:10 (an instance
    // with nothing cached, on the same storage). 10:02 to 10:06 were missed: only the latest
    // missed due time runs, once, whatever the duplicate firings.
    a.clock().set(datetime!(2027-01-15 10:07:10 UTC));
    let restarted = a.another_instance();
    futures::join!(fire(&restarted), fire(&restarted), fire(&b));
    let after = runs(&a, "every-minute").await;
    let id7 = scan_id("every-minute", datetime!(2027-01-15 10:07:00 UTC));
    assert_eq!(
        after,
        BTreeMap::from([
            (due1.to_string(), ("started".into(), id1.clone())),
            (
                "20270115T100700Z".to_string(),
                ("started".into(), id7.clone())
            ),
        ])
    );
    let mut recorded = scans(&a).await;
    recorded.sort();
    let mut expected = vec![id1, id7];
    expected.sort();
    assert_eq!(recorded, expected, "exactly one scan per due time");

    let (status, shown) = call(&a.state, "GET", "/api/schedules/every-minute", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(shown["nextDue"], "2027-01-15T10:08:00Z");
    assert_eq!(shown["lastRuns"][0]["dueTime"], "2027-01-15T10:07:00Z");
    assert_eq!(shown["lastRuns"][0]["state"], "running");
}

#[tokio::test]
async fn overlap_skip_is_recorded_and_a_run_that_cannot_start_fails_without_stopping_the_schedule()
{
    let t = test_app();
    let source = source_table().await;
    let (status, _) = put(
        &t,
        "skipper",
        json!({"cron": "0 * * * * *",
        "scan": {"driver": "count", "sourceTable": source}}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    // Its table is gone by the time it runs: the PUT cannot know, the run cannot start.
    let (status, _) = put(
        &t,
        "gone",
        json!({"cron": "0 * * * * *",
        "scan": {"driver": "count", "sourceTable": "Missing0table"}}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);

    t.clock().set(datetime!(2027-01-15 10:01:00 UTC));
    fire(&t).await;
    // The first count scan is still running (no work delivered): 10:02 is skipped.
    t.clock().set(datetime!(2027-01-15 10:02:00 UTC));
    fire(&t).await;
    let skipper = runs(&t, "skipper").await;
    assert_eq!(skipper["20270115T100100Z"].0, "started");
    assert_eq!(skipper["20270115T100200Z"].0, "skipped");
    let (_, shown) = call(&t.state, "GET", "/api/schedules/skipper", None).await;
    assert_eq!(
        shown["lastRuns"][0]["state"],
        "skipped: previous run still running"
    );
    assert_eq!(shown["lastRuns"][0]["scanId"], Value::Null);
    assert_eq!(shown["lastRuns"][1]["state"], "running");

    let gone = runs(&t, "gone").await;
    assert_eq!(gone.len(), 2, "{gone:?}");
    assert!(
        gone.values().all(|(outcome, _)| outcome == "failed"),
        "{gone:?}"
    );
    let (_, shown) = call(&t.state, "GET", "/api/schedules/gone", None).await;
    let state = shown["lastRuns"][0]["state"].as_str().unwrap();
    assert!(state.starts_with("failed: sourceTable"), "{state}");
    assert_eq!(shown["nextDue"], "2027-01-15T10:03:00Z");

    // Listing and deleting.
    let (_, all) = call(&t.state, "GET", "/api/schedules", None).await;
    let names: Vec<_> = all["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].clone())
        .collect();
    assert_eq!(names, [json!("gone"), json!("skipper")]);
    let (status, _) = call(&t.state, "DELETE", "/api/schedules/gone", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(runs(&t, "gone").await.is_empty());
    let (status, _) = call(&t.state, "GET", "/api/schedules/gone", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}
