//! Schedules end to end: the real handler under the local host on Azurite, its `Scheduler`
//! timer made fast with `TABLESCAN_SCHEDULER_SCHEDULE` (every second, on each of two instances,
//! so every occurrence fires twice). Exactly one scan per due time across the two instances,
//! the duplicate firings and a restart; `keep` deletes the oldest exports of a schedule, never
//! a running one's. The oracle is the bookkeeping table and the container, read with the raw
//! clients (tests/support/raw.rs, the test's blob listing), after the host stopped.
//!
//! No wall-clock assertion: each test waits for the runs it needs (rows in the table), with
//! bounds that only catch a hang.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{json, Value};

use support::backup::{blobs, list_all};
use support::e2e::{seed, TestApp};
use support::host::wait_for;
use support::raw::{RawClient, RawEntity};
use tablescan::storage::Entity;

/// Catches a hang only: a run every 2 s is due many times within it.
const LONG: Duration = Duration::from_secs(180);

async fn app() -> TestApp {
    TestApp::start(2, &[("TABLESCAN_SCHEDULER_SCHEDULE", "*/1 * * * * *")]).await
}

async fn put(app: &TestApp, name: &str, body: Value) -> (u16, Value) {
    let answer = app
        .client
        .put(format!("{}/api/schedules/{name}", app.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    (answer.status().as_u16(), answer.json().await.unwrap())
}

/// A new source table of `rows` rows.
async fn source(app: &TestApp, rows: usize) -> String {
    let table = support::unique_name("Src");
    let entities = (0..rows)
        .map(|i| {
            let mut e = Entity::new(format!("p{:02}", i % 4), format!("r{i:04}"));
            e.properties.insert("N", json!(i));
            e
        })
        .collect();
    seed(&app.store, &table, entities).await;
    table
}

fn string(row: &RawEntity, name: &str) -> String {
    row.text(name)
        .map(|t| serde_json::from_str(t).expect("a JSON string"))
        .unwrap_or_default()
}

/// The bookkeeping table's rows.
async fn bookkeeping(app: &TestApp) -> Vec<RawEntity> {
    RawClient::azurite()
        .read_all(&app.names.scans_table)
        .await
        .unwrap_or_default()
}

/// Schedule `name`'s runs: due stamp → its row.
fn runs(rows: &[RawEntity], name: &str) -> BTreeMap<String, RawEntity> {
    let partition = format!("~runs-{name}");
    rows.iter()
        .filter(|r| r.partition_key() == partition)
        .map(|r| (string(r, "Due"), r.clone()))
        .collect()
}

/// Scan records: id → state.
fn scans(rows: &[RawEntity]) -> BTreeMap<String, String> {
    rows.iter()
        .filter(|r| r.row_key() == "scan" && !r.partition_key().starts_with('~'))
        .map(|r| (r.partition_key(), string(r, "State")))
        .collect()
}

/// Waits until schedule `name` has at least `n` runs that started a scan.
async fn wait_started(app: &TestApp, name: &str, n: usize) -> usize {
    wait_for(&format!("{n} started runs of {name}"), LONG, || async {
        let rows = bookkeeping(app).await;
        let started = runs(&rows, name)
            .values()
            .filter(|r| string(r, "Outcome") == "started")
            .count();
        if started >= n {
            Ok(started)
        } else {
            Err(runs(&rows, name).keys().cloned().collect::<Vec<_>>())
        }
    })
    .await
}

#[tokio::test]
async fn exactly_one_scan_per_due_time_across_instances_duplicate_firings_and_a_restart() {
    let mut app = app().await;
    let table = source(&app, 8).await;
    let (status, answer) = put(
        &app,
        "every-2s",
        json!({"cron": "*/2 * * * * *", "overlap": "allow",
            "scan": {"driver": "count", "sourceTable": table}}),
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    let before = wait_started(&app, "every-2s", 3).await;
    // A restart: the host stops (due times pass while it is down) and starts again.
    app.redeploy().await;
    wait_started(&app, "every-2s", before + 3).await;
    let table_name = app.names.scans_table.clone();
    app.shutdown().await;

    let rows = RawClient::azurite().rows(&table_name).await;
    let runs = runs(&rows, "every-2s");
    let scans = scans(&rows);
    let mut started = BTreeSet::new();
    for (due, run) in &runs {
        let outcome = string(run, "Outcome");
        // Every due time the app saw was started (overlap allow, a table that exists), or was
        // being started when the host stopped.
        assert!(
            outcome == "started" || outcome == "starting",
            "{due}: {outcome}"
        );
        let id = string(run, "ScanId");
        assert!(
            started.insert(id.clone()),
            "scan {id} started for two due times"
        );
        if outcome == "started" {
            assert!(scans.contains_key(&id), "{due}: its scan {id} is recorded");
        }
    }
    // Exactly one scan per due time: every recorded scan is one run's, no run has two.
    let recorded: BTreeSet<_> = scans.keys().cloned().collect();
    assert!(
        recorded.is_subset(&started),
        "scans of no run: {:?}",
        recorded.difference(&started)
    );
    assert!(runs.len() >= before + 3, "{} runs", runs.len());
    eprintln!(
        "{} due times, {} scans, duplicate firings absorbed",
        runs.len(),
        recorded.len()
    );
}

#[tokio::test]
async fn keep_deletes_the_oldest_exports_never_a_running_one() {
    let app = app().await;
    let table = source(&app, 20).await;
    let container = support::unique_name("nightly");
    let (status, answer) = put(
        &app,
        "exports",
        json!({"cron": "*/2 * * * * *", "keep": 2,
            "scan": {"driver": "export", "sourceTable": table,
                "destinationContainer": container, "destinationPrefix": "daily/{dueTime}"}}),
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    // Wait until the scheduler pruned at least two runs' exports.
    wait_for("two pruned exports", LONG, || async {
        let rows = bookkeeping(&app).await;
        let pruned = runs(&rows, "exports")
            .values()
            .filter(|r| r.text("Pruned") == Some("true"))
            .count();
        if pruned >= 2 {
            Ok(())
        } else {
            Err(runs(&rows, "exports")
                .into_iter()
                .map(|(d, r)| (d, string(&r, "Outcome")))
                .collect::<Vec<_>>())
        }
    })
    .await;
    let table_name = app.names.scans_table.clone();
    app.shutdown().await;

    let rows = RawClient::azurite().rows(&table_name).await;
    let scans = scans(&rows);
    let listed = list_all(&blobs(), &container, "daily/").await;
    let prefixes: BTreeSet<String> = listed
        .keys()
        .map(|name| name.split('/').take(2).collect::<Vec<_>>().join("/"))
        .collect();
    let mut completed_kept = 0;
    // Newest first.
    for (due, run) in runs(&rows, "exports").iter().rev() {
        let prefix = string(run, "Prefix");
        assert_eq!(prefix, format!("daily/{due}"));
        let state = scans
            .get(&string(run, "ScanId"))
            .cloned()
            .unwrap_or_default();
        if run.text("Pruned") == Some("true") {
            assert!(
                !prefixes.contains(&prefix),
                "{prefix} was pruned but has blobs"
            );
            assert_ne!(state, "running", "{prefix}: a running export was pruned");
        } else if state == "completed" && completed_kept < 2 {
            completed_kept += 1;
            assert!(
                listed.contains_key(&format!("{prefix}/manifest.json")),
                "{prefix}: one of the 2 newest completed exports lost its manifest"
            );
        }
    }
    assert_eq!(completed_kept, 2, "two completed exports are kept");
}
