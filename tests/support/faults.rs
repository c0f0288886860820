//! Fault-suite helpers: datasets, the checks every faulted copy scan must pass (completed by the
//! workers themselves, destination = source, exact counters, empty queues and bookkeeping), and
//! the one-line summary per fault kind.
//!
//! Tables are read back with the test's own REST client ([`super::raw`]), never through
//! tablescan's entity parser: destination = source means the same property texts, byte for byte.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;
use tablescan::lab::dataset;
use tablescan::lab::proxy::{FaultPolicy, Hold, StorageProxy};
use tablescan::storage::request_counts::RequestKind;
use tablescan::storage::Entity;

use super::e2e::{seed, TestApp};
use super::raw::{self, RawClient, RawEntity};
use super::unique_name;

pub mod kills;

// Each test binary uses a part of them.
#[allow(unused_imports)]
pub use kills::{
    check_kills, failed_by_kills, kill_every_second_while_running, kill_while_running, Killer,
};

/// `rows` dataset rows (many small partitions, typed properties) plus keys that need escaping.
pub fn source_entities(rows: u64, seed: u64) -> Vec<Entity> {
    source_entities_with(rows, seed, &[])
}

/// [`source_entities`] plus one row for each of the `extra` (partition key, row key).
pub fn source_entities_with(rows: u64, seed: u64, extra: &[(&str, &str)]) -> Vec<Entity> {
    let mut all: Vec<Entity> = dataset::entities(rows, seed, dataset::RowsPerKey::default())
        .flatten()
        .collect();
    let awkward = [
        ("", "empty-pk"),
        ("it's", "o'clock"),
        ("Ünïcödé", "1"),
        ("\u{1F600}", "smile"),
    ];
    for (pk, rk) in awkward.iter().chain(extra) {
        let mut e = dataset::entity(pk, 0);
        e.row_key = rk.to_string();
        all.push(e);
    }
    all
}

/// Invocations of the two poison-queue functions so far.
pub fn poison_invocations(app: &TestApp) -> u64 {
    let stats = app.host.as_ref().unwrap().invocation_stats();
    ["PrefixScanPoison", "TableCopyPoison"]
        .iter()
        .filter_map(|f| stats.get(*f).map(|s| s.invocations))
        .sum()
}

/// The host's log lines about the work item a scan's `error` names (`work item <id> ...`, as a
/// failed item words it); none if it names none.
pub fn item_log_lines(app: &TestApp, error: &str) -> Vec<String> {
    let Some(item) = error
        .strip_prefix("work item ")
        .and_then(|rest| rest.split_whitespace().next())
    else {
        return Vec::new();
    };
    let lines = app.host().log_lines().into_iter();
    lines.filter(|l| l.contains(item)).collect()
}

/// Seeds a new uniquely named source table; returns its name and its rows in key order, as
/// read back raw (the texts a copy must reproduce).
pub async fn seeded_source(app: &TestApp, entities: Vec<Entity>) -> (String, Vec<RawEntity>) {
    let source = unique_name("Source");
    let expected = entities.len();
    seed(&app.store, &source, entities).await;
    let source_rows = RawClient::azurite().rows(&source).await;
    assert_eq!(source_rows.len(), expected, "seeded source");
    (source, source_rows)
}

/// A fault proxy in front of the shared Azurite's table, queue and blob services.
pub async fn proxy(policy: FaultPolicy, seed: u64) -> StorageProxy {
    let azurite = super::azurite();
    let address = |port: u16| format!("127.0.0.1:{port}").parse().unwrap();
    StorageProxy::start_with_blob(
        address(azurite.table_port()),
        address(azurite.queue_port()),
        address(azurite.blob_port()),
        policy,
        seed,
    )
    .await
    .expect("proxy starts")
}

/// The app on `instances` host instances with its storage behind `proxy`, and a function
/// timeout (10 minutes) that no delivery here reaches, not even one held at the proxy while
/// handlers are killed: a timeout would restart a handler besides the test's own kills.
pub async fn app_behind(proxy: &StorageProxy, instances: usize) -> TestApp {
    let host = (5, "00:00:00", "00:10:00");
    TestApp::start_tuned(instances, &proxy.connection_string(), host, &[]).await
}

/// Starts a scan with `start` while no delivery can begin (the proxy holds receives from the
/// app's queues), then calls `arm` with what `start` returned, which arms the faults or holds the scan's work must meet and
/// lets the receives through (a `hold` of its own, or `release`): the scan's first delivery
/// comes after them, and the start's own requests (an export's reservation, the source's
/// existence check) are not faulted or held. Returns what `start` returned (the scan's id).
pub async fn start_then_arm<T>(
    app: &TestApp,
    proxy: &StorageProxy,
    start: impl std::future::Future<Output = T>,
    arm: impl FnOnce(&T),
) -> T {
    proxy.hold(Hold {
        kinds: vec![RequestKind::QueueGet],
        resources: vec![app.names.prefix_queue.clone(), app.names.copy_queue.clone()],
        ..Hold::default()
    });
    let id = start.await;
    arm(&id);
    id
}

/// `entities` and a partition `pk` of `rows` rows: more than a prefix-query step reads, so the
/// copy walks it in a step of its own that makes work items (`TableCopy` invocations).
pub fn with_big_partition(mut entities: Vec<Entity>, pk: &str, rows: u32) -> Vec<Entity> {
    entities.extend((0..rows).map(|i| dataset::entity(pk, i)));
    entities
}

/// Starts a copy scan; `take` small so there are many work items. No retry: the API must
/// answer 202 once even when storage faults hit the start (see the lost-answers regression).
pub async fn start_copy(app: &TestApp, source: &str, destination: &str, take: u32) -> String {
    let body = json!({"driver": "copy", "sourceTable": source, "destinationTable": destination, "takeCount": take});
    let (status, reply, _) = app.post_scan(&body).await;
    assert_eq!(status, 202, "POST /api/scans: {reply}");
    reply["id"].as_str().unwrap().to_string()
}

/// The scan's recorded state, read from the scans table (not through the API, whose GET would
/// itself finish a drained scan and so hide a scan the workers left running).
pub async fn recorded_state(app: &TestApp, id: &str) -> Option<String> {
    RawClient::azurite()
        .get_entity(&app.names.scans_table, id, "scan")
        .await
        .unwrap_or_else(|e| panic!("read scan record: {e}"))
        .and_then(|e| e.text("State").map(raw::decode_string_lossy))
}

/// Waits (generously) until the workers move the scan out of `running`; returns the state.
pub async fn wait_recorded_end(app: &TestApp, id: &str, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(state) = recorded_state(app, id).await {
            if state != "running" {
                return state;
            }
        }
        if Instant::now() > deadline {
            let (_, status) = app.get(&format!("/api/scans/{id}")).await;
            let logs = app.host().log_lines();
            let tail = logs[logs.len().saturating_sub(60)..].join("\n");
            panic!("scan {id} still recorded running after {timeout:?}; status now {status}\n--- host log tail ---\n{tail}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What the checks of one scan found.
#[derive(Debug, Default)]
pub struct Verdict {
    pub rows_copied: usize,
    pub lost: usize,
    pub mismatches: usize,
    pub problems: Vec<String>,
}

impl Verdict {
    fn problem(&mut self, p: String) {
        self.problems.push(p);
    }
}

/// Work rows of a scan that are not `done`, and Σ created − Σ completed over its counter rows.
pub async fn unfinished_bookkeeping(app: &TestApp, id: &str) -> (Vec<String>, i64) {
    let all = RawClient::azurite().rows(&app.names.work_table).await;
    let prefix = format!("{id}-");
    let mut unfinished = Vec::new();
    let mut pending = 0i64;
    let int = |e: &RawEntity, name: &str| -> i64 { raw::integer(e.text(name)).unwrap_or(0) };
    for e in all
        .iter()
        .filter(|e| e.partition_key().starts_with(&prefix))
    {
        if e.row_key() == "counter" {
            pending += int(e, "Created") - int(e, "Completed");
        } else if !e.row_key().starts_with("pace") && !e.row_key().starts_with("phase-") {
            // (`pace`: a rate-limited scan's schedule row; `pace-<connection>`: an account's
            // adaptive rate, written once the account refused the scan, docs/rate-limit.md;
            // `phase-<n>`: a phase start's claim, docs/architecture.md, "Ending a scan".)
            let state = e.text("State").map(raw::decode_string_lossy);
            if state.as_deref() != Some("done") {
                unfinished.push(format!("{} is {state:?}", e.row_key()));
            }
        }
    }
    (unfinished, pending)
}

/// Waits until only `expected` messages are left in the app's queues and poison queues. Late
/// duplicates of finished work may still be in flight when the scan completes; they must drain.
pub async fn wait_queues_settle(app: &TestApp, expected: u64, timeout: Duration) -> u64 {
    let deadline = Instant::now() + timeout;
    loop {
        let left = app.queued_messages().await;
        if left == expected || Instant::now() > deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Every check of a faulted copy scan: completed by the workers; destination equals source row
/// for row and property for property (the raw texts, byte for byte); exact counters; no work
/// left in bookkeeping or queues.
pub async fn verify_copy(
    app: &TestApp,
    id: &str,
    source_rows: &[RawEntity],
    destination: &str,
    timeout: Duration,
) -> Verdict {
    verify_copy_with(app, id, source_rows, destination, timeout, 0).await
}

/// [`verify_copy`] when `expected_left` messages (other scans' poison) may stay in the queues.
pub async fn verify_copy_with(
    app: &TestApp,
    id: &str,
    source_rows: &[RawEntity],
    destination: &str,
    timeout: Duration,
    expected_left: u64,
) -> Verdict {
    let mut v = Verdict::default();
    let state = wait_recorded_end(app, id, timeout).await;
    if state != "completed" {
        v.problem(format!("scan {id} ended {state}"));
    }
    let (code, status) = app.get(&format!("/api/scans/{id}")).await;
    assert_eq!(code, 200, "{status}");
    let n = source_rows.len() as i64;
    for (field, want) in [
        ("rowsScanned", n),
        ("rowsWritten", n),
        ("failedWorkItems", 0),
        ("pendingWorkItems", 0),
    ] {
        if status[field].as_i64() != Some(want) {
            v.mismatches += 1;
            v.problem(format!("{field} is {} (expected {want})", status[field]));
        }
    }
    if status["state"] != "completed" {
        v.problem(format!("status says {}", status["state"]));
    }

    let copied = RawClient::azurite().rows(destination).await;
    v.rows_copied = copied.len();
    let by_key: BTreeMap<(&str, &str), &RawEntity> = copied.iter().map(|e| (e.key(), e)).collect();
    for row in source_rows {
        match by_key.get(&row.key()) {
            None => v.lost += 1,
            Some(got) => {
                let differences = raw::diff_entity(row, got);
                if !differences.is_empty() {
                    v.mismatches += 1;
                    v.problem(format!(
                        "row ({}, {}) differs: {differences:?}",
                        row.partition_key_text, row.row_key_text
                    ));
                }
            }
        }
    }
    if v.lost > 0 {
        v.problem(format!("{} source rows missing in {destination}", v.lost));
    }
    if copied.len() + v.lost != source_rows.len() {
        v.mismatches += 1;
        v.problem(format!(
            "{destination} has {} rows, source {}",
            copied.len(),
            source_rows.len()
        ));
    }

    let (unfinished, pending) = unfinished_bookkeeping(app, id).await;
    if !unfinished.is_empty() || pending != 0 {
        v.problem(format!(
            "bookkeeping not empty: {pending} pending by counters, unfinished rows {unfinished:?}"
        ));
    }
    let left = wait_queues_settle(app, expected_left, Duration::from_secs(90)).await;
    if left != expected_left {
        v.problem(format!(
            "{left} message(s) left in the queues (expected {expected_left})"
        ));
    }
    v
}

/// Prints what the host's log says about the work items a failed verdict names (their lines,
/// at most 30, and how many function timeouts and handler restarts the run had), so that a
/// failure seen only in CI's output can be explained. Prints nothing for a clean verdict.
pub fn explain(app: &TestApp, verdict: &Verdict) {
    if verdict.problems.is_empty() {
        return;
    }
    let items: Vec<&str> = verdict
        .problems
        .iter()
        .filter_map(|p| p.split("work item ").nth(1)?.split_whitespace().next())
        .collect();
    let lines = app.host().log_lines();
    let count = |needle: &str| lines.iter().filter(|l| l.contains(needle)).count();
    eprintln!(
        "host log: {} lines, {} function timeouts, {} handler exits; lines naming {items:?}:",
        lines.len(),
        count("function timeout"),
        count("restarting it")
    );
    let naming = lines
        .iter()
        .filter(|l| items.iter().any(|i| l.contains(i)))
        .take(30);
    for line in naming {
        eprintln!("  {}", line.chars().take(400).collect::<String>());
    }
}

/// One line of the suite's report.
pub struct Summary {
    pub kind: String,
    pub scans: usize,
    pub faults: u64,
    pub rows: usize,
    pub lost: usize,
    pub mismatches: usize,
}

impl Summary {
    pub fn new(kind: impl Into<String>) -> Summary {
        Summary {
            kind: kind.into(),
            scans: 0,
            faults: 0,
            rows: 0,
            lost: 0,
            mismatches: 0,
        }
    }

    pub fn add(&mut self, v: &Verdict) {
        self.scans += 1;
        self.rows += v.rows_copied;
        self.lost += v.lost;
        self.mismatches += v.mismatches;
    }

    pub fn line(&self) -> String {
        format!(
            "faults: {}: scans {}, faults {}, rows {}, lost {}, mismatches {}",
            self.kind, self.scans, self.faults, self.rows, self.lost, self.mismatches
        )
    }

    /// Prints the line (always, so a failing run still reports), then asserts the verdicts.
    pub fn report(&self, verdicts: &[&Verdict]) {
        eprintln!("{}", self.line());
        let problems: Vec<&String> = verdicts.iter().flat_map(|v| &v.problems).collect();
        assert!(
            self.lost == 0 && self.mismatches == 0 && problems.is_empty(),
            "{}\n{problems:#?}",
            self.line()
        );
    }
}

/// A fault proxy that stores every queue put (tablescan's own and a driver's) two or three times.
pub async fn duplicating_proxy(seed: u64) -> StorageProxy {
    let policy = FaultPolicy {
        duplicate_puts: 1.0,
        extra_copies: 2,
        kinds: vec![RequestKind::QueuePut],
        ..FaultPolicy::default()
    };
    proxy(policy, seed).await
}

/// Azure's transient faults on a fraction of every kind of request from the handler and the host.
pub fn storage_faults(rate: f64) -> FaultPolicy {
    let base = FaultPolicy {
        server_busy: rate,
        operation_timed_out: rate,
        reset_before: rate * 0.5,
        reset_after: rate,
        delay: rate * 3.0,
        max_delay: Duration::from_millis(300),
        ..FaultPolicy::default()
    };
    // A lost receive answer hides its messages for the 10-minute receive visibility (as in
    // Azure): correct but far too slow for the suite, so receives get every fault but that one.
    let receive = FaultPolicy {
        reset_after: 0.0,
        ..base.clone()
    };
    FaultPolicy {
        per_kind: vec![(RequestKind::QueueGet, receive)],
        ..base
    }
}
