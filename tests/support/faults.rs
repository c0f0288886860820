//! Fault-suite helpers: datasets, the checks every faulted copy scan must pass (completed by the
//! workers themselves, destination = source, exact counters, empty queues and bookkeeping), and
//! the one-line summary per fault kind.
//!
//! Tables are read back with the test's own REST client ([`super::raw`]), never through
//! tablescan's entity parser: destination = source means the same property texts, byte for byte.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;
use tablescan::dataset;
use tablescan::proxy::{FaultPolicy, StorageProxy};
use tablescan::storage::Entity;

use super::e2e::{seed, TestApp};
use super::raw::{self, RawClient, RawEntity};
use super::unique_name;

/// `rows` dataset rows (many small partitions, typed properties) plus keys that need escaping.
pub fn source_entities(rows: u64, seed: u64) -> Vec<Entity> {
    let mut all: Vec<Entity> = dataset::entities(rows, seed, dataset::RowsPerKey::default())
        .flatten()
        .collect();
    for (pk, rk) in [
        ("", "empty-pk"),
        ("it's", "o'clock"),
        ("Ünïcödé", "1"),
        ("\u{1F600}", "smile"),
    ] {
        let mut e = dataset::entity(pk, 0);
        e.row_key = rk.to_string();
        all.push(e);
    }
    all
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

/// A fault proxy in front of the shared Azurite.
pub async fn proxy(policy: FaultPolicy, seed: u64) -> StorageProxy {
    let azurite = super::azurite();
    let table = format!("127.0.0.1:{}", azurite.table_port())
        .parse()
        .unwrap();
    let queue = format!("127.0.0.1:{}", azurite.queue_port())
        .parse()
        .unwrap();
    StorageProxy::start(table, queue, policy, seed)
        .await
        .expect("proxy starts")
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
        } else {
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

/// One line of the suite's report.
pub struct Summary {
    pub kind: &'static str,
    pub scans: usize,
    pub faults: u64,
    pub rows: usize,
    pub lost: usize,
    pub mismatches: usize,
}

impl Summary {
    pub fn new(kind: &'static str) -> Summary {
        Summary {
            kind,
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
