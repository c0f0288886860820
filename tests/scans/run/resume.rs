//! A run interrupted mid-scan (SIGINT, or SIGKILL) and resumed with `--resume`, by one process
//! or by two at once, ends with exactly the source's rows and exact counters. The interruption
//! is armed on an event: the first progress line that shows rows written while work is still
//! pending. The scan is paced (`--max-requests-per-second 10`), so that after that line it
//! still has many seconds of requests to make.

use std::time::Duration;

use serde_json::Value;

use super::{figure, Names, Output, Running};
use crate::support;
use support::e2e::seed;
use support::faults::source_entities;
use support::raw::{self, RawClient};
use support::unique_name;

/// A paced run of these tables takes about a minute; this only catches a hang.
const BOUND: Duration = Duration::from_secs(400);
/// How long a killed run's messages stay invisible to the next run.
const VISIBILITY: &str = "3";

/// The source table (many partitions, so the copy is many work items) and its destination.
async fn tables() -> (String, String, usize) {
    let (store, _) = support::table_store();
    let (source, destination) = (unique_name("ResSrc"), unique_name("ResDst"));
    let rows = source_entities(1200, 21);
    let count = rows.len();
    seed(&store, &source, rows).await;
    (source, destination, count)
}

/// Starts a paced copy and waits until it has written rows and still has work pending.
async fn interruptible(names: &Names, source: &str, destination: &str) -> (Running, String) {
    let args = [
        "run",
        "copy",
        "--source-table",
        source,
        "--destination-table",
        destination,
        "--max-requests-per-second",
        "10",
        "--status-interval",
        "1",
        "--receive-visibility",
        VISIBILITY,
    ];
    let mut run = names.spawn(&args);
    let id = run.scan_id().await;
    run.line(
        "a progress line with rows written and work pending",
        BOUND,
        |l| {
            figure(l, "written").is_some_and(|n| n > 0)
                && figure(l, "work items pending").is_some_and(|n| n > 0)
        },
    )
    .await;
    (run, id)
}

/// Asserts the copy is exact: the scan's counters and the destination's rows.
async fn assert_exact(out: &Output, source: &str, destination: &str, count: usize) -> Value {
    assert_eq!(out.code, Some(0), "{out:?}");
    let status = out.status();
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(status["rowsScanned"], count as u64, "{status}");
    assert_eq!(status["rowsWritten"], count as u64, "{status}");
    assert_eq!(status["failedWorkItems"], 0, "{status}");
    let raw = RawClient::azurite();
    let problems = raw::diff(&raw.rows(source).await, &raw.rows(destination).await);
    assert!(problems.is_empty(), "{problems:?}");
    status
}

fn resume_args(id: &str) -> Vec<&str> {
    vec![
        "run",
        "--resume",
        id,
        "--json",
        "--quiet",
        "--receive-visibility",
        VISIBILITY,
    ]
}

#[tokio::test]
async fn sigint_mid_scan_then_resume_gives_the_exact_copy() {
    let names = Names::new();
    let (source, destination, count) = tables().await;
    let (run, id) = interruptible(&names, &source, &destination).await;
    run.signal(2);
    let out = run.finish(BOUND).await;
    assert_eq!(out.code, Some(130), "{out:?}");
    assert!(
        out.stderr.contains(&format!("tablescan run --resume {id}")),
        "{}",
        out.stderr
    );
    let out = names.output(&resume_args(&id), BOUND).await;
    assert_exact(&out, &source, &destination, count).await;
}

#[tokio::test]
async fn sigkill_mid_scan_then_resume_gives_the_exact_copy() {
    let names = Names::new();
    let (source, destination, count) = tables().await;
    let (run, id) = interruptible(&names, &source, &destination).await;
    run.signal(9);
    let out = run.finish(BOUND).await;
    assert_eq!(out.code, None, "killed: {out:?}");
    let out = names.output(&resume_args(&id), BOUND).await;
    assert_exact(&out, &source, &destination, count).await;
}

#[tokio::test]
async fn two_processes_resuming_one_scan_share_it_and_the_copy_is_exact() {
    let names = Names::new();
    let (source, destination, count) = tables().await;
    let (run, id) = interruptible(&names, &source, &destination).await;
    run.signal(9);
    run.finish(BOUND).await;
    let args = resume_args(&id);
    let (a, b) = tokio::join!(names.output(&args, BOUND), names.output(&args, BOUND));
    let first = assert_exact(&a, &source, &destination, count).await;
    let second = assert_exact(&b, &source, &destination, count).await;
    assert_eq!(first["rowsWritten"], second["rowsWritten"]);
}

/// A scan started by `tablescan run` and killed is finished by a function app on the same
/// account and names (here the local host running the staged app): the formats are the same.
#[tokio::test]
async fn a_scan_run_started_is_finished_by_the_function_app() {
    let names = Names::new();
    let (source, destination, count) = tables().await;
    let (run, id) = interruptible(&names, &source, &destination).await;
    run.signal(9);
    run.finish(BOUND).await;
    let env = names.env();
    let settings: Vec<(&str, &str)> = env
        .iter()
        .filter(|(k, _)| k.starts_with("TABLESCAN_"))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let app = support::e2e::TestApp::start(1, &settings).await;
    let status = app.wait_for_end(&id, BOUND).await;
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(status["rowsScanned"], count as u64, "{status}");
    assert_eq!(status["rowsWritten"], count as u64, "{status}");
    assert_eq!(status["failedWorkItems"], 0, "{status}");
    let raw = RawClient::azurite();
    let problems = raw::diff(&raw.rows(&source).await, &raw.rows(&destination).await);
    assert!(problems.is_empty(), "{problems:?}");
    app.shutdown().await;
}
