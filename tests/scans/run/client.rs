//! `tablescan scan` against the local host (`tablescan host` running the staged handler): it
//! starts a scan and watches it to its end, and cancels another, with `run`'s exit codes.

use std::time::Duration;

use super::{plain, Names};
use crate::support;
use support::e2e::{seed, TestApp};
use support::faults::source_entities;
use support::raw::{self, RawClient};
use support::unique_name;

/// A scan of these tables under the local host takes seconds; this only catches a hang.
const BOUND: Duration = Duration::from_secs(180);

#[tokio::test]
async fn scan_starts_watches_to_the_end_and_cancels_another_through_the_local_host() {
    let app = TestApp::start(1, &[]).await;
    let names = Names::new();
    let (source, destination) = (unique_name("CliSrc"), unique_name("CliDst"));
    let rows = source_entities(300, 7);
    let count = rows.len() as u64;
    seed(&app.store, &source, rows).await;
    let base = app.base.as_str();

    let out = names
        .line(&format!("scan start copy --source-table {source} --destination-table {destination} --app {base} --watch --json --status-interval 1"), BOUND)
        .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let mut stdout = out.stdout.lines();
    let id = stdout.next().unwrap().to_string();
    let status: serde_json::Value = serde_json::from_str(stdout.next().unwrap()).unwrap();
    assert_eq!(status["id"], id.as_str());
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(status["rowsWritten"], count, "{status}");
    assert!(plain(&out.stderr), "{:?}", out.stderr);
    let raw = RawClient::azurite();
    let problems = raw::diff(&raw.rows(&source).await, &raw.rows(&destination).await);
    assert!(problems.is_empty(), "{problems:?}");

    // Another scan, paced so that it is still running when cancelled.
    let other = unique_name("CliOther");
    let out = names
        .line(&format!("scan start copy --source-table {source} --destination-table {other} --max-requests-per-second 10 --app {base}"), BOUND)
        .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let other_id = out.stdout.trim().to_string();
    let out = names
        .output(
            &["scan", "cancel", &other_id, "--app", base, "--json"],
            BOUND,
        )
        .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.status()["state"], "cancelled", "{}", out.stdout);
    let out = names
        .output(
            &["scan", "watch", &other_id, "--app", base, "--quiet"],
            BOUND,
        )
        .await;
    assert_eq!(out.code, Some(1), "a cancelled scan: {out:?}");
    let out = names
        .output(&["scan", "status", &id, "--app", base, "--json"], BOUND)
        .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.status()["rowsWritten"], count);
    let out = names
        .output(&["scan", "list", "--app", base, "--json"], BOUND)
        .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let listed: Vec<_> = out.status()["scans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect();
    assert!(
        listed.contains(&id) && listed.contains(&other_id),
        "{listed:?}"
    );
    // Refusals are the API's, named as flags, exit 2.
    let out = names
        .line(
            &format!(
                "scan start copy --source-table {source} --destination-table {source} --app {base}"
            ),
            BOUND,
        )
        .await;
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(
        out.stderr.contains("error: --destination-table"),
        "{}",
        out.stderr
    );
    app.shutdown().await;
}
