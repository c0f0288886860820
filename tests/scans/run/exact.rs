//! `tablescan run` of each kind of work, checked exactly against the test's own reads: a copy,
//! an export and its restore, a delete; and requests refused with exit 2, naming the flag, with
//! nothing written.

use std::time::Duration;

use super::{plain, Names};
use crate::support;
use support::e2e::seed;
use support::faults::source_entities;
use support::raw::{self, RawClient};
use support::unique_name;

/// A run of a few hundred rows takes a few seconds; this only catches a hang.
const BOUND: Duration = Duration::from_secs(180);

#[tokio::test]
async fn a_copy_by_run_is_exact_and_its_progress_holds_no_control_codes() {
    let names = Names::new();
    let (store, _) = support::table_store();
    let (source, destination) = (unique_name("RunSrc"), unique_name("RunDst"));
    let rows = source_entities(500, 3);
    let count = rows.len();
    seed(&store, &source, rows).await;
    let args = [
        "run",
        "copy",
        "--source-table",
        &source,
        "--destination-table",
        &destination,
        "--json",
        "--status-interval",
        "1",
    ];
    let out = names.output(&args, BOUND).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let status = out.status();
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(status["rowsScanned"], count as u64, "{status}");
    assert_eq!(status["rowsWritten"], count as u64, "{status}");
    assert_eq!(status["failedWorkItems"], 0, "{status}");
    let id = status["id"].as_str().unwrap();
    assert!(
        out.stderr.contains(&format!("scan {id} is recorded")),
        "{}",
        out.stderr
    );
    // Not a terminal: plain lines, no control codes.
    assert!(plain(&out.stderr), "control codes in {:?}", out.stderr);
    let raw = RawClient::azurite();
    let problems = raw::diff(&raw.rows(&source).await, &raw.rows(&destination).await);
    assert!(problems.is_empty(), "{problems:?}");
}

#[tokio::test]
async fn an_export_and_its_restore_by_run_give_the_source_back() {
    let names = Names::new();
    let (store, _) = support::table_store();
    let (source, restored) = (unique_name("RunExp"), unique_name("RunImp"));
    let rows = source_entities(300, 5);
    let count = rows.len() as u64;
    seed(&store, &source, rows).await;
    let container = unique_name("runbackup");
    let export = [
        "run",
        "export",
        "--source-table",
        &source,
        "--destination-container",
        &container,
        "--destination-prefix",
        "nightly",
        "--json",
        "--quiet",
    ];
    let out = names.output(&export, BOUND).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.status()["rowsWritten"], count, "{}", out.stdout);
    let import = [
        "run",
        "import",
        "--source-container",
        &container,
        "--source-prefix",
        "nightly",
        "--destination-table",
        &restored,
        "--json",
        "--quiet",
    ];
    let out = names.output(&import, BOUND).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.status()["rowsWritten"], count, "{}", out.stdout);
    let raw = RawClient::azurite();
    let problems = raw::diff(&raw.rows(&source).await, &raw.rows(&restored).await);
    assert!(problems.is_empty(), "{problems:?}");
}

#[tokio::test]
async fn a_delete_by_run_removes_exactly_the_rows_in_range() {
    let names = Names::new();
    let (store, _) = support::table_store();
    let table = unique_name("RunDel");
    seed(&store, &table, source_entities(300, 9)).await;
    let raw = RawClient::azurite();
    let before = raw.rows(&table).await;
    let prefix = before[before.len() / 2].partition_key();
    let prefix: String = prefix.chars().take(2).collect();
    let args = [
        "run",
        "delete",
        "--source-table",
        &table,
        "--confirm",
        &table,
        "--partition-key-prefix",
        &prefix,
        "--json",
        "--quiet",
    ];
    let out = names.output(&args, BOUND).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let expected: Vec<_> = before
        .iter()
        .filter(|e| !e.partition_key().starts_with(&prefix))
        .cloned()
        .collect();
    let deleted = (before.len() - expected.len()) as u64;
    assert!(deleted > 0 && !expected.is_empty(), "prefix {prefix:?}");
    assert_eq!(out.status()["rowsScanned"], deleted, "{}", out.stdout);
    let problems = raw::diff(&expected, &raw.rows(&table).await);
    assert!(problems.is_empty(), "{problems:?}");
}

#[tokio::test]
async fn refused_flags_exit_2_name_the_flag_and_write_nothing() {
    let names = Names::new();
    let (store, _) = support::table_store();
    let source = unique_name("RunBad");
    seed(&store, &source, source_entities(20, 1)).await;
    let never = unique_name("RunNever");
    let cases: [(Vec<&str>, &str); 5] = [
        (
            vec![
                "copy",
                "--source-table",
                &source,
                "--destination-table",
                &never,
                "--take-count",
                "0",
            ],
            "--take-count",
        ),
        (
            vec![
                "copy",
                "--source-table",
                &source,
                "--destination-table",
                &source,
            ],
            "--destination-table",
        ),
        (
            vec!["delete", "--source-table", &source, "--confirm", "other"],
            "--confirm",
        ),
        (
            vec![
                "copy",
                "--source-table",
                &source,
                "--destination-table",
                &never,
                "--filter",
                "Downloads gt",
            ],
            "--filter",
        ),
        (
            vec![
                "copy",
                "--source-table",
                &source,
                "--destination-table",
                &never,
                "--select",
                "PartitionKey",
            ],
            "--select",
        ),
    ];
    for (args, flag) in cases {
        let mut all = vec!["run"];
        all.extend(args.iter().copied());
        let out = names.output(&all, BOUND).await;
        assert_eq!(out.code, Some(2), "{all:?}: {out:?}");
        assert!(
            out.stderr.contains(&format!("error: {flag}")),
            "{all:?}: {}",
            out.stderr
        );
    }
    // A flag clap itself refuses exits 2 too.
    let out = names
        .output(&["run", "copy", "--take-count", "many"], BOUND)
        .await;
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(out.stderr.contains("--take-count"), "{}", out.stderr);
    // Nothing written: no destination, no bookkeeping tables, no queues, source untouched.
    let raw = RawClient::azurite();
    for table in [&never, &names.scans_table, &names.work_table] {
        assert!(raw.read_all(table).await.is_err(), "{table} exists");
    }
    let queues = support::raw::RawQueueClient::azurite();
    for queue in [&names.prefix_queue, &names.copy_queue] {
        assert!(!queues.exists(queue).await, "{queue} exists");
    }
    assert_eq!(raw.rows(&source).await.len(), source_entities(20, 1).len());
}

/// `--connection NAME`: the account (the scan's source and the run's own queues and tables) is
/// the one in the variable NAME, with `AzureWebJobsStorage` unset; a name that holds nothing is
/// refused with exit 2, naming the flag.
#[tokio::test]
async fn connection_names_the_variable_holding_the_account() {
    let names = Names::new();
    let (store, _) = support::table_store();
    let source = unique_name("RunConn");
    let rows = source_entities(200, 5);
    let count = rows.len();
    seed(&store, &source, rows).await;
    let account = support::azurite().connection_string();
    let run = |connection: &'static str| {
        let mut command = names.command(&[
            "run",
            "count",
            "--source-table",
            &source,
            "--connection",
            connection,
            "--json",
        ]);
        command
            .env_remove("AzureWebJobsStorage")
            .env("TABLESCAN_RUN_TEST_ACCOUNT", &account);
        command
    };
    let output = |mut command: tokio::process::Command| async move {
        let out = tokio::time::timeout(BOUND, command.output())
            .await
            .expect("tablescan run --connection still running")
            .expect("tablescan output");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stdout, stderr) = output(run("TABLESCAN_RUN_TEST_ACCOUNT")).await;
    assert_eq!(code, Some(0), "{stderr}");
    let status: serde_json::Value = serde_json::from_str(stdout.trim()).expect("--json status");
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(status["rowsScanned"], count as u64, "{status}");

    let (code, _, stderr) = output(run("TABLESCAN_RUN_TEST_NOTHING")).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--connection"), "{stderr}");
}
