//! `maxRequestsPerSecond` on Azurite through the counting proxy: a copy run by two handler
//! instances under the local host, every request it causes stamped by the proxy as it arrives.
//!
//! - The test (`cargo test`) asserts only what does not depend on the machine's speed: both
//!   copies are exact, the unlimited one sends no limiter request, and the limited one paces
//!   through its schedule row (its requests name the row, the row holds a schedule, the status
//!   shows the limit and counts the requests). That the pacer holds the limit is tested in
//!   virtual time (`src/app/pace/memory_tests.rs`: two instances, leases, bursts, late tokens).
//! - The measurement (ignored: `cargo test --release --test scans rate_limit:: -- --ignored
//!   --nocapture`, docs/development.md, "Measurements") measures the rate in wall-clock windows
//!   and checks it against the figures it must show (docs/rate-limit.md, "Measured").
//!
//! The oracle is the proxy's own clock and classification, not the handler's counters: the
//! scan's requests are every request the proxy saw between the scan's `202` and its end except
//! the host's queue receives (`queue_get`: the host polls its queues whether or not a scan
//! runs); the schedule's own requests are those naming its row (`RowKey` `pace`).

use crate::support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::e2e::{staged, TestApp};
use support::faults::{proxy, seeded_source, source_entities, verify_copy};
use support::{table_store, unique_name};
use tablescan::lab::proxy::{FaultPolicy, Stamp, StorageProxy};

/// How a pace row's requests show in a URL or an entity group transaction's body.
const PACE_MARKS: [&str; 3] = ["RowKey='pace'", "RowKey=%27pace%27", "\"RowKey\":\"pace\""];

/// Requests per one-second window, sliding by 10 ms over `[from, to)`.
fn windows(stamps: &[Stamp], from: Instant, to: Instant) -> Vec<usize> {
    let mut times: Vec<Instant> = stamps.iter().map(|s| s.at).collect();
    times.sort_unstable();
    let step = Duration::from_millis(10);
    let mut out = Vec::new();
    let (mut lo, mut hi) = (0usize, 0usize);
    let mut t = from;
    // Bounded: `t` moves 10 ms a round towards `to`.
    while t + Duration::from_secs(1) <= to {
        while lo < times.len() && times[lo] < t {
            lo += 1;
        }
        while hi < times.len() && times[hi] < t + Duration::from_secs(1) {
            hi += 1;
        }
        out.push(hi.saturating_sub(lo));
        t += step;
    }
    out
}

fn percentile(values: &[usize], p: f64) -> usize {
    let mut v = values.to_vec();
    v.sort_unstable();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// One copy of `source` through `app`: the scan's stamps (see the module) from its `202` to
/// its recorded end, and how long that took.
struct Run {
    scan: Vec<Stamp>,
    pace: usize,
    from: Instant,
    to: Instant,
    status: serde_json::Value,
}

async fn copy(
    app: &TestApp,
    proxy: &StorageProxy,
    source: &str,
    source_rows: &[support::raw::RawEntity],
    limit: Option<u32>,
) -> Run {
    let destination = unique_name("Copy");
    let mut body = json!({"driver": "copy", "sourceTable": source, "destinationTable": destination, "takeCount": 100});
    if let Some(l) = limit {
        body["maxRequestsPerSecond"] = json!(l);
    }
    proxy.timeline().start(&PACE_MARKS);
    let (code, reply, _) = app.post_scan(&body).await;
    assert_eq!(code, 202, "{reply}");
    let from = Instant::now();
    let id = reply["id"].as_str().unwrap().to_string();
    let verdict = verify_copy(
        app,
        &id,
        source_rows,
        &destination,
        Duration::from_secs(600),
    )
    .await;
    assert!(verdict.problems.is_empty(), "{:?}", verdict.problems);
    let stamps = proxy.timeline().stamps();
    // The end: the scan's last request (the verification's status read and later polls are
    // not the scan's; the raw client does not go through the proxy).
    let (_, status) = app.get(&format!("/api/scans/{id}")).await;
    let scan: Vec<Stamp> = stamps
        .into_iter()
        .filter(|s| s.at >= from && s.kind != "queue_get")
        .collect();
    let to = scan.iter().map(|s| s.at).max().unwrap_or(from);
    let pace = scan.iter().filter(|s| s.marked).count();
    Run {
        scan,
        pace,
        from,
        to,
        status,
    }
}

/// The measurement: 12,000 rows copied without a limit, then at 100 requests/s; the limited
/// copy's 1-s windows (sliding by 10 ms) must show p99 ≤ 115, p50 ≥ 85, the busiest ≤ 100 plus
/// one chunk, and the limiter's requests ≤ 5 % (a loaded machine's send-time jitter shows in
/// the windows: hence a measurement, not a test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement: request rate in wall-clock windows (docs/development.md, Measurements)"]
async fn a_limited_copy_holds_its_rate_over_two_instances() {
    let _alone = support::alone().await;
    let (proxy, app) = two_instances(27).await;
    let (source, source_rows) = seeded_source(&app, source_entities(12_000, 27)).await;

    let free = copy(&app, &proxy, &source, &source_rows, None).await;
    let secs = (free.to - free.from).as_secs_f64();
    println!(
        "unlimited: {} requests in {secs:.1} s ({:.0}/s), p99 of 1-s windows {}, pace-row requests {}; status {} {}",
        free.scan.len(),
        free.scan.len() as f64 / secs,
        percentile(&windows(&free.scan, free.from, free.to), 0.99),
        free.pace,
        free.status["maxRequestsPerSecond"],
        free.status["requestsPerSecond"],
    );
    assert_eq!(
        free.pace, 0,
        "a scan without a limit uses no limiter request"
    );
    assert!(free.status["maxRequestsPerSecond"].is_null());

    let limit = 100;
    let run = copy(&app, &proxy, &source, &source_rows, Some(limit)).await;
    let secs = (run.to - run.from).as_secs_f64();
    let w = windows(&run.scan, run.from, run.to);
    let (p50, p99, max) = (
        percentile(&w, 0.5),
        percentile(&w, 0.99),
        percentile(&w, 1.0),
    );
    let overhead = run.pace as f64 / run.scan.len() as f64;
    println!(
        "limit {limit}/s: {} requests in {secs:.1} s ({:.1}/s); 1-s windows: p50 {p50}, p99 {p99}, max {max}; \
         pace-row requests {} ({:.1} %); status {} {}",
        run.scan.len(),
        run.scan.len() as f64 / secs,
        run.pace,
        overhead * 100.0,
        run.status["maxRequestsPerSecond"],
        run.status["requestsPerSecond"],
    );
    let mut kinds = std::collections::BTreeMap::new();
    for s in &run.scan {
        *kinds.entry(s.kind).or_insert(0) += 1;
    }
    println!("by kind: {kinds:?}");
    let l = f64::from(limit);
    // The windows slide by 10 ms, so one burst is in ~100 of them and the 99th percentile is
    // nearly the busiest: a stall of this loaded 2-core machine that sends a dozen requests
    // together shows in it (CI saw 112 once). The schedule's own bound is the limit plus one
    // chunk (docs/rate-limit.md); the median holds the rate.
    assert!((p99 as f64) <= l * 1.15, "p99 {p99} over {limit} + 15 %");
    assert!((p50 as f64) >= l * 0.85, "p50 {p50} under {limit} − 15 %");
    let bound = limit + tablescan::app::pace::chunk_for(limit);
    assert!(max <= bound as usize, "busiest window {max} over {bound}");
    assert!(overhead <= 0.05, "the limiter's own requests: {overhead}");
    assert_eq!(run.status["maxRequestsPerSecond"], limit);
    assert!(run.status["requestsPerSecond"].as_f64().unwrap() <= l * 1.1);
}

/// The proxy and a two-instance app on it.
async fn two_instances(seed: u64) -> (StorageProxy, TestApp) {
    let proxy = proxy(FaultPolicy::none(), seed).await;
    let connection = proxy.connection_string();
    let app = TestApp::start_in(
        staged("00:05:00"),
        2,
        &[("AzureWebJobsStorage", connection.as_str())],
        table_store().0,
        &[],
    )
    .await;
    (proxy, app)
}

/// Pacing is on for a limited copy and off for an unlimited one, over two instances, and
/// nothing here depends on the machine's speed: both copies are exact (`verify_copy`), the
/// unlimited scan sends no request to a schedule row, the limited one leases its schedule
/// (requests naming its row, which holds a `NextFreeAt` after the scan's start), and its
/// status shows the limit and counts the requests, the schedule's included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_copy_paces_through_its_schedule_row_and_stays_exact() {
    let (proxy, app) = two_instances(26).await;
    let (source, source_rows) = seeded_source(&app, source_entities(1_500, 26)).await;
    let free = copy(&app, &proxy, &source, &source_rows, None).await;
    assert_eq!(
        free.pace, 0,
        "a scan without a limit uses no limiter request"
    );
    assert!(
        free.status["maxRequestsPerSecond"].is_null(),
        "{}",
        free.status
    );

    let started_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    let limit = 200;
    let run = copy(&app, &proxy, &source, &source_rows, Some(limit)).await;
    let id = run.status["id"].as_str().unwrap();
    println!(
        "limit {limit}/s: {} requests seen by the proxy, {} naming the schedule row; status: {} storage requests",
        run.scan.len(),
        run.pace,
        run.status["storageRequests"]
    );
    assert!(
        run.pace >= 2,
        "the limited scan leased its schedule: {}",
        run.pace
    );
    assert_eq!(run.status["maxRequestsPerSecond"], limit, "{}", run.status);
    let counted = run.status["storageRequests"].as_u64().unwrap_or(0);
    assert!(
        counted >= run.pace as u64,
        "the scan counts its requests, the schedule's included: {counted} < {}",
        run.pace
    );
    let row = support::raw::RawClient::azurite()
        .get_entity(&app.names.work_table, &format!("{id}-00"), "pace")
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no schedule row for scan {id}"));
    let next: i64 = row
        .text("NextFreeAt")
        .map(support::raw::decode_string_lossy)
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("NextFreeAt of {row:?}"));
    assert!(
        next > started_us,
        "a schedule leased during the scan: {next} ≤ {started_us}"
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_out_of_range_is_refused_naming_the_field() {
    let app = TestApp::start(1, &[]).await;
    let source = support::new_table(&app.store, "Source").await;
    for bad in [
        json!(0),
        json!(9),
        json!(20_001),
        json!(-5),
        json!(12.5),
        json!("60"),
    ] {
        let body = json!({"driver": "count", "sourceTable": source, "maxRequestsPerSecond": bad});
        let (code, reply, _) = app.post_scan(&body).await;
        assert_eq!(code, 400, "{bad}: {reply}");
        assert_eq!(
            reply["error"]["field"], "maxRequestsPerSecond",
            "{bad}: {reply}"
        );
    }
}
