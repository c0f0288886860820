//! Fault-suite helpers: datasets, the checks every faulted copy scan must pass (completed by the
//! workers themselves, destination = source, exact counters, empty queues and bookkeeping), and
//! the one-line summary per fault kind.
//!
//! Tables are read back with the test's own REST client ([`super::raw`]), never through
//! tablescan's entity parser: destination = source means the same property texts, byte for byte.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rand::Rng;
use serde_json::json;
use tablescan::lab::dataset;
use tablescan::lab::proxy::{FaultPolicy, StorageProxy};
use tablescan::storage::request_counts::RequestKind;
use tablescan::storage::Entity;

use super::e2e::{seed, TestApp};
use super::raw::{self, RawClient, RawEntity};
use super::unique_name;

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
        } else if e.row_key() != "pace" && !e.row_key().starts_with("phase-") {
            // (`pace`: a rate-limited scan's schedule row, docs/rate-limit.md; `phase-<n>`: a
            // phase start's claim, docs/architecture.md, "Ending a scan".)
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

/// `kill -9 pid`.
pub fn sigkill(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -9 {pid}");
}

/// Kills handlers (at most `per_instance` times each, at most 4 in all) while scan `id` runs;
/// returns the kills per instance.
pub async fn kill_while_running(
    app: &TestApp,
    id: &str,
    instances: usize,
    per_instance: usize,
) -> Vec<usize> {
    let mut kills = vec![0usize; instances];
    kill_more_while_running(app, id, &mut kills, per_instance).await;
    kills
}

/// The instance of the latest invocation that the host's log shows started and not yet ended
/// (lines tagged `[i<instance>] [<function>] [<invocation id>]`).
fn in_flight_instance(lines: &[String]) -> Option<usize> {
    let mut open: Vec<(String, usize)> = Vec::new();
    for l in lines {
        let groups: Vec<&str> = l
            .split('[')
            .skip(1)
            .filter_map(|g| g.split(']').next())
            .collect();
        let instance = groups
            .iter()
            .find_map(|g| g.strip_prefix('i')?.parse::<usize>().ok());
        let id = groups
            .iter()
            .find(|g| g.len() == 36 && g.matches('-').count() == 4);
        let (Some(instance), Some(id)) = (instance, id) else {
            continue;
        };
        if l.contains("Executing '") {
            open.push((id.to_string(), instance));
        } else if l.contains("Executed '") {
            open.retain(|(o, _)| o != id);
        }
    }
    open.last().map(|(_, i)| *i)
}

/// Kills handlers while scan `id` runs, adding to `kills` (the kills per instance so far, of
/// earlier scans on the same app): at most 4 kills in this call, and no instance past
/// `per_instance` kills in all (the host gives up on an instance after 3 handler errors).
/// Returns the kills made by this call.
pub async fn kill_more_while_running(
    app: &TestApp,
    id: &str,
    kills: &mut [usize],
    per_instance: usize,
) -> usize {
    // Each kill fails at most one delivery of each message in flight, and kills chase the newest
    // invocation, so five kills can fail one message on all of host.json's 5 deliveries: it is
    // then poisoned and the scan rightly fails. A run that must end exact kills at most 4 times.
    const MAX_DELIVERIES: usize = 5;
    let room: usize = kills.iter().map(|k| per_instance.saturating_sub(*k)).sum();
    let budget = room.min(MAX_DELIVERIES - 1);
    let mut made = 0;
    while made < budget {
        if !running_after_pause(app, id, 200..900).await {
            break;
        }
        let pids = app.host().handler_pids();
        let candidates: Vec<(usize, u32)> = pids
            .iter()
            .enumerate()
            .filter_map(|(i, pid)| pid.filter(|_| kills[i] < per_instance).map(|p| (i, p)))
            .collect();
        if candidates.is_empty() {
            continue;
        }
        // Prefer an instance with an invocation in flight (waiting up to a second for one), else
        // the one that started an invocation last, so that kills hit work in flight.
        let mut busy = None;
        for _ in 0..40 {
            busy = in_flight_instance(&app.host().log_lines());
            if busy.is_some_and(|b| candidates.iter().any(|(i, _)| *i == b)) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let busy = busy.or_else(|| {
            app.host().log_lines().iter().rev().find_map(|l| {
                let rest = l.split("[i").nth(1)?;
                l.contains("Executing '")
                    .then(|| rest.split(']').next()?.parse::<usize>().ok())
                    .flatten()
            })
        });
        let (i, pid) = candidates
            .iter()
            .copied()
            .find(|(i, _)| Some(*i) == busy)
            .unwrap_or_else(|| candidates[rand::thread_rng().gen_range(0..candidates.len())]);
        sigkill(pid);
        kills[i] += 1;
        made += 1;
    }
    made
}

/// Invocations the host's log shows failed because their handler was killed. They fail at once
/// and their messages are released (visibilityTimeout), not left invisible for the 10-minute
/// receive visibility.
pub fn failed_by_kills(app: &TestApp) -> usize {
    app.host()
        .log_lines()
        .iter()
        .filter(|l| {
            l.contains("Failed")
                && (l.contains("handler process was restarted")
                    || l.contains("request to handler failed"))
        })
        .count()
}

/// After a crash run: every killed handler was restarted once per kill, there were at least
/// two kills, and some hit an invocation in flight (so redelivery was exercised).
pub async fn check_kills(app: &TestApp, kills: &[usize]) {
    let host = app.host();
    host.wait_ready(Duration::from_secs(60))
        .await
        .expect("every killed handler was restarted");
    let generations = host.handler_generations();
    let failed_by_kill = failed_by_kills(app);
    eprintln!(
        "handler-crash: kills per instance {kills:?}, generations {generations:?}, invocations failed by kills {failed_by_kill}"
    );
    for (i, k) in kills.iter().enumerate() {
        assert_eq!(
            generations[i],
            1 + *k as u64,
            "instance {i} restarted once per kill"
        );
    }
    assert!(
        kills.iter().sum::<usize>() >= 2,
        "the scan ended before the handlers could be killed twice; make it longer"
    );
    assert!(
        failed_by_kill > 0,
        "no kill hit an invocation in flight; the test did not exercise redelivery"
    );
}

/// Sleeps a random number of milliseconds in `pause_ms`, then says whether scan `id` still runs.
async fn running_after_pause(app: &TestApp, id: &str, pause_ms: std::ops::Range<u64>) -> bool {
    let pause = rand::thread_rng().gen_range(pause_ms);
    tokio::time::sleep(Duration::from_millis(pause)).await;
    recorded_state(app, id).await.as_deref() == Some("running")
}

/// Kills a running handler of a random instance about once a second while scan `id` runs, at
/// most `max` times and with no limit per instance: an instance killed three times gives up and
/// is recycled by the host. Returns the kills.
pub async fn kill_every_second_while_running(app: &TestApp, id: &str, max: usize) -> usize {
    let mut made = 0;
    while made < max {
        if !running_after_pause(app, id, 700..1300).await {
            break;
        }
        let running: Vec<u32> = app.host().handler_pids().into_iter().flatten().collect();
        if running.is_empty() {
            continue;
        }
        sigkill(running[rand::thread_rng().gen_range(0..running.len())]);
        made += 1;
    }
    made
}
