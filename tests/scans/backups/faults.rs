//! The fault suite for backups (issue 14): export scans (table → Blob Storage) and import scans
//! (export → table) through the local Functions host and the real handler on Azurite while
//! handlers are SIGKILLed, every queue message is stored two or three times, and storage
//! (tables, queues and blobs, through `tablescan::lab::proxy`) throttles, times out, delays and
//! resets connections. Then a part corrupted after its export must fail the import, naming it.
//!
//! The oracles share nothing with tablescan's export format code: the manifest is read as
//! generic JSON (`serde_json::Value`), every part's bytes are hashed here (`sha2`) and inflated
//! here (`flate2`), and each line is parsed as generic JSON. Blobs are read and listed with
//! tablescan's `AzureBlobStore` straight on Azurite (bytes and names only, never through the
//! proxy or the format's decoder). Restored tables are read with the raw REST client
//! (`support::raw`) and compared with the source text for text.
//!
//! One line per fault kind and scan (`faults: export-storage-faults: scans 1, faults …`), visible
//! with `cargo test --test scans backups:: -- --nocapture`.

use crate::support;

use std::collections::BTreeSet;
use std::io::Write;

use bytes::Bytes;
use serde_json::json;
use support::backup::{
    blobs, download, line_key, part_lines, start_export, start_import, verify_export,
    verify_import, Target, SCAN_TIMEOUT,
};
use support::e2e::TestApp;
use support::faults::kills::deliveries_budget;
use support::faults::{
    app_behind, check_kills, explain, proxy, seeded_source, source_entities, start_then_arm,
    storage_faults, Killer, Summary,
};
use support::raw::{self, RawClient};
use support::unique_name;
use tablescan::lab::proxy::{FaultPolicy, Hold, StorageProxy};
use tablescan::storage::blob::{BlobStore, BlobWrite};
use tablescan::storage::request_counts::RequestKind;

/// The faults a backup run is under.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Handlers SIGKILLed during the export and again during the import (3 instances), the
    /// scan's writes held at the proxy meanwhile.
    Crash,
    /// Every queue put stored two or three times, two instances.
    Duplicates,
    /// Throttling, timeouts, resets and delays on every kind of request, blobs included.
    Storage,
}

impl Fault {
    fn label(self) -> &'static str {
        match self {
            Fault::Crash => "handler-crash",
            Fault::Duplicates => "duplicate-delivery",
            Fault::Storage => "storage-faults",
        }
    }

    async fn proxy(self) -> StorageProxy {
        match self {
            Fault::Crash => proxy(FaultPolicy::none(), 19).await,
            Fault::Duplicates => {
                let policy = FaultPolicy {
                    duplicate_puts: 1.0,
                    extra_copies: 2,
                    kinds: vec![RequestKind::QueuePut],
                    ..FaultPolicy::default()
                };
                proxy(policy, 23).await
            }
            Fault::Storage => proxy(storage_faults(0.04), 29).await,
        }
    }
}

/// Faults so far: kills, extra queue messages, or injected storage faults (blob ones apart).
fn faults_so_far(fault: Fault, kills: &[usize], proxy: &StorageProxy) -> (u64, u64) {
    let blob = |p: &StorageProxy| {
        p.faults_by_kind()
            .iter()
            .filter(|(k, _)| k.starts_with("blob_"))
            .map(|(_, n)| n)
            .sum::<u64>()
    };
    match fault {
        Fault::Duplicates => (proxy.duplicates_put(), 0),
        Fault::Storage => (proxy.faults_injected(), blob(proxy)),
        Fault::Crash => (kills.iter().sum::<usize>() as u64, 0),
    }
}

/// Exports a seeded table under `fault`, verifies the export, restores it into a new table
/// under the same fault, and verifies the restore. Under [`Fault::Crash`], the export's parts
/// and then the import's rows wait at the proxy while handlers are killed (one kill per
/// instance in each: the host gives up on an instance at its third), so neither can end before
/// its kills, and the invocations blocked there die with their handler.
async fn backup_fault_run(fault: Fault, rows: u64, take: u32) {
    // These runs load the machine (three phases of faults, up to 3 instances): apart from the
    // latency and memory measurements that take this lock (`backups::verify`).
    let _alone = support::alone().await;
    let instances = if matches!(fault, Fault::Crash) { 3 } else { 2 };
    let proxy = fault.proxy().await;
    let app = match fault {
        Fault::Crash => app_behind(&proxy, instances).await,
        _ => TestApp::start_through(instances, Some(&proxy)).await,
    };
    let (source, source_rows) = seeded_source(&app, source_entities(rows, 91)).await;
    let target = Target::new(fault.label());
    let mut killer = Killer::new(&app);

    let export = start_export(&app, &source, take, &target);
    let export = match fault {
        // (The export's start writes its reservation to the container: held after it.)
        Fault::Crash => {
            let hold = |_: &String| proxy.hold(Hold::blob_writes_to(&target.container));
            let export = start_then_arm(&app, &proxy, export, hold).await;
            let count = deliveries_budget(&killer.kills, 1);
            killer.kill(&app, Some(&proxy), count, 1, None).await;
            proxy.release();
            export
        }
        _ => export.await,
    };
    let (export_verdict, manifest) = verify_export(&app, &export, &source_rows, &target).await;
    let (export_faults, export_blob_faults) = faults_so_far(fault, &killer.kills, &proxy);
    let mut summary = Summary::new(format!("export-{}", fault.label()));
    summary.faults = export_faults;
    summary.add(&export_verdict);
    explain(&app, &export_verdict);
    summary.report(&[&export_verdict]);
    let manifest_rows = manifest.as_ref().and_then(|m| m["rows"].as_i64()).unwrap();

    let destination = unique_name("Restored");
    if let Fault::Crash = fault {
        proxy.hold(Hold::writes_to(&destination));
    }
    let import = start_import(&app, &target, &destination).await;
    if let Fault::Crash = fault {
        let count = deliveries_budget(&killer.kills, 2);
        killer.kill(&app, Some(&proxy), count, 2, None).await;
        proxy.release();
    }
    let import_verdict =
        verify_import(&app, &import, &source_rows, &destination, manifest_rows).await;
    let (all_faults, all_blob_faults) = faults_so_far(fault, &killer.kills, &proxy);
    let mut summary = Summary::new(format!("import-{}", fault.label()));
    summary.faults = all_faults - export_faults;
    summary.add(&import_verdict);
    if !matches!(fault, Fault::Crash) {
        let p = &proxy;
        let counts = p.counts();
        let of = |prefix: &str| -> u64 {
            counts
                .iter()
                .filter(|((k, _), _)| k.starts_with(prefix))
                .map(|(_, n)| n)
                .sum()
        };
        eprintln!(
            "{}: {} requests through the proxy, {} of them blob requests; blob faults {export_blob_faults} in the export, {} in the import; faults by kind {:?}",
            fault.label(),
            of(""),
            of("blob_"),
            all_blob_faults - export_blob_faults,
            p.faults_by_kind()
        );
    }
    explain(&app, &import_verdict);
    summary.report(&[&import_verdict]);
    match fault {
        Fault::Crash => {
            let kills = &killer.kills;
            eprintln!("kills per instance after the export and the import: {kills:?}");
            assert!(
                export_faults > 0 && all_faults > export_faults,
                "the export or the import ended before a kill"
            );
            check_kills(&app, kills).await;
        }
        Fault::Storage => {
            assert!(
                export_blob_faults > 0 && all_blob_faults > export_blob_faults,
                "no blob fault in the export or none in the import"
            );
        }
        Fault::Duplicates => assert!(export_faults > 0 && all_faults > export_faults),
    }
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_and_import_with_handler_crashes() {
    backup_fault_run(Fault::Crash, 2400, 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_and_import_with_duplicate_delivery() {
    backup_fault_run(Fault::Duplicates, 300, 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_and_import_with_storage_faults() {
    // About 30 parts: at 4 % per fault kind (a quarter of requests faulted, delays included), a
    // phase with no blob fault is then a one-in-ten-thousand event, not one in two hundred.
    backup_fault_run(Fault::Storage, 600, 5).await;
}

/// The manifest is written before the export is recorded `completed`, and never after: the
/// docs say it is "written once when the export completes" and that "the same parts always give
/// the same manifest bytes".
/// (A late duplicate of a finished work item can run the completion step again after the scan
/// was recorded completed: it must find the manifest and leave it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manifest_is_never_rewritten_after_the_export_completed() {
    let proxy = Fault::Duplicates.proxy().await;
    let connection = proxy.connection_string();
    let app = TestApp::start(2, &[("AzureWebJobsStorage", connection.as_str())]).await;
    let (source, source_rows) = seeded_source(&app, source_entities(300, 93)).await;
    let target = Target::new("written-once");
    let export = start_export(&app, &source, 5, &target).await;
    let (verdict, _) = verify_export(&app, &export, &source_rows, &target).await;
    app.shutdown().await;
    assert!(verdict.problems.is_empty(), "{:#?}", verdict.problems);
}

/// Imports the export after its part `name` was overwritten with `corrupted`; the import must
/// fail naming the part, and write none of `part_keys` (the part's rows) nor `injected`.
async fn import_corrupted(
    app: &TestApp,
    target: &Target,
    name: &str,
    corrupted: Bytes,
    part_keys: &[(String, String)],
    injected: Option<&(String, String)>,
) -> String {
    blobs()
        .upload(
            &target.container,
            &target.blob(name),
            corrupted,
            &BlobWrite::new("application/gzip"),
        )
        .await
        .unwrap();
    let destination = unique_name("Restored");
    let import = start_import(app, target, &destination).await;
    let status = app.wait_for_end(&import, SCAN_TIMEOUT).await;
    let error = status["error"].as_str().unwrap_or_default().to_string();
    assert_eq!(status["state"], "failed", "{status}");
    assert!(
        error.contains(name),
        "the error names the part {name}: {status}"
    );
    assert!(status["failedWorkItems"].as_i64() >= Some(1), "{status}");
    let restored = RawClient::azurite().rows(&destination).await;
    let written: BTreeSet<(String, String)> = restored
        .iter()
        .map(|e| (e.partition_key(), e.row_key()))
        .collect();
    let from_part: Vec<&(String, String)> =
        part_keys.iter().filter(|k| written.contains(*k)).collect();
    assert!(
        from_part.is_empty(),
        "rows of the corrupted part were written: {from_part:?}"
    );
    assert!(
        !injected.is_some_and(|k| written.contains(k)),
        "{injected:?} written"
    );
    eprintln!(
        "corrupted part {name} ({} rows): import {} with {error:?}; {} rows of other parts restored",
        part_keys.len(),
        status["state"],
        restored.len()
    );
    error
}

/// A part overwritten after its export fails the import naming the part, and none of its rows
/// is written: the same number of bytes with one flipped (the SHA-256 check), then a valid gzip
/// of its own lines with one value changed and a row added (bigger than the manifest says).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_part_fails_the_import_naming_it() {
    let app = TestApp::start(2, &[]).await;
    let (source, source_rows) = seeded_source(&app, source_entities(150, 97)).await;
    let target = Target::new("corrupted");
    let export = start_export(&app, &source, 10, &target).await;
    let (verdict, manifest) = verify_export(&app, &export, &source_rows, &target).await;
    assert!(verdict.problems.is_empty(), "{:?}", verdict.problems);
    let manifest = manifest.unwrap();
    let parts = manifest["parts"].as_array().unwrap();
    assert!(parts.len() >= 3, "{manifest}");
    // The part with the most rows, so that "none of its rows" means something.
    let part = parts.iter().max_by_key(|p| p["rows"].as_u64()).unwrap();
    let name = part["name"].as_str().unwrap().to_string();
    let original = download(&blobs(), &target.container, &target.blob(&name))
        .await
        .unwrap();
    let mut lines = part_lines(&original).unwrap();
    let part_keys: Vec<(String, String)> = lines.iter().filter_map(line_key).collect();

    let mut flipped = original.to_vec();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x01;
    let error = import_corrupted(&app, &target, &name, flipped.into(), &part_keys, None).await;
    assert!(error.contains("SHA-256"), "{error}");

    lines[0]["Corrupted"] = json!("yes");
    let injected = ("zz-injected".to_string(), "1".to_string());
    lines.push(json!({"PartitionKey": injected.0, "RowKey": injected.1, "Note": "not exported"}));
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    for line in &lines {
        writeln!(gz, "{line}").unwrap();
    }
    let rewritten = Bytes::from(gz.finish().unwrap());
    assert_ne!(rewritten, original);
    import_corrupted(&app, &target, &name, rewritten, &part_keys, Some(&injected)).await;
    app.shutdown().await;
}

/// The manifest an import restores is the one checked when it started (docs: "its SHA-256 is
/// recorded, and a chunk item that finds other bytes fails the scan instead of mixing two
/// exports"). Here the manifest is replaced by a valid one listing one part fewer after the
/// import was accepted and before its first item ran (queue receives refused meanwhile): the
/// import must either restore the first manifest (the whole source) or fail naming the change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_restores_the_manifest_it_checked_at_start() {
    let proxy = proxy(FaultPolicy::none(), 31).await;
    let connection = proxy.connection_string();
    let app = TestApp::start(1, &[("AzureWebJobsStorage", connection.as_str())]).await;
    let (source, source_rows) = seeded_source(&app, source_entities(60, 95)).await;
    let target = Target::new("pinned");
    let export = start_export(&app, &source, 10, &target).await;
    let (verdict, manifest) = verify_export(&app, &export, &source_rows, &target).await;
    assert!(verdict.problems.is_empty(), "{:?}", verdict.problems);
    let mut replaced = manifest.unwrap();
    let parts = replaced["parts"].as_array_mut().unwrap();
    let dropped = parts.pop().unwrap();
    let rows = replaced["rows"].as_u64().unwrap() - dropped["rows"].as_u64().unwrap();
    replaced["rows"] = json!(rows);

    // No queue receive succeeds until the manifest is replaced: the root item waits.
    proxy.set_faults(FaultPolicy {
        server_busy: 1.0,
        kinds: vec![RequestKind::QueueGet],
        ..FaultPolicy::default()
    });
    let destination = unique_name("Restored");
    let import = start_import(&app, &target, &destination).await;
    blobs()
        .upload(
            &target.container,
            &target.blob("manifest.json"),
            Bytes::from(serde_json::to_vec(&replaced).unwrap()),
            &BlobWrite::new("application/json"),
        )
        .await
        .unwrap();
    proxy.set_faults(FaultPolicy::none());
    let status = app.wait_for_end(&import, SCAN_TIMEOUT).await;
    let restored = RawClient::azurite().rows(&destination).await;
    app.shutdown().await;
    let whole = status["state"] == "completed" && raw::diff(&source_rows, &restored).is_empty();
    let refused = status["state"] == "failed"
        && status["error"]
            .as_str()
            .is_some_and(|e| e.contains("manifest"));
    assert!(
        whole || refused,
        "the import restored {} of {} rows (the replaced manifest lists {rows}): {status}",
        restored.len(),
        source_rows.len()
    );
}
