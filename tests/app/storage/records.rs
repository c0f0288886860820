//! tablescan's own records against Azurite, at the service's limits: a work item's recorded
//! outcome is split into string properties of at most 64 KiB of UTF-16 and must fit the 1 MiB
//! entity as the service counts it; what does not fit is refused before anything is sent, with a
//! message that says so, and diagnostics are cut with a marker instead of failing the write.

use crate::support;

use support::{new_table, table_store};
use tablescan::app::tracking::{NewWork, RecordError, ScanState, Tracker, WorkState};
use tablescan::storage::azure_table::AzureTableStore;
use tablescan::storage::request_counts::RequestCounts;
use tablescan::storage::StorageErrorKind;

/// A new scans table and a new work table.
async fn bookkeeping_tables(store: &AzureTableStore) -> (String, String) {
    (
        new_table(store, "RecScans").await,
        new_table(store, "RecWork").await,
    )
}

#[tokio::test]
async fn outcomes_up_to_the_entity_limit_are_recorded_and_larger_ones_refused_before_sending() {
    let (store, counters) = table_store();
    let (scans, work) = bookkeeping_tables(&store).await;
    let tracker = Tracker::new(&store, &scans, &work);
    let root = NewWork {
        id: "s-0123456789abcdef".into(),
        kind: "scan-step",
        shard: 0,
    };
    tracker
        .create_scan_work("rec1", 1, &root)
        .await
        .expect("scan work");
    let Some(WorkState::Pending { etag }) = tracker.work_state("rec1", 0, &root.id).await.unwrap()
    else {
        panic!("root is pending")
    };

    // Non-BMP characters count twice in UTF-16: 480,000 of them are 1,920,000 bytes of UTF-8 and
    // 960,000 bytes as the service counts them, under the 1 MiB entity limit only if every chunk
    // is measured in UTF-16 units.
    let large = "\u{1F600}".repeat(240_000);
    let before = counters.snapshot();
    let too_large = format!("{large}{large}");
    match tracker
        .record_outcome("rec1", 0, &root.id, &etag, &too_large, &[])
        .await
    {
        Err(RecordError::Storage(e)) => {
            assert_eq!(e.kind, StorageErrorKind::InvalidInput, "{e}");
            assert!(
                e.message.contains("cannot be recorded") && e.message.contains("1 MiB"),
                "{e}"
            );
        }
        other => panic!("an outcome over 1 MiB must be refused: {other:?}"),
    }
    assert_eq!(
        counters.snapshot().since(&before),
        RequestCounts::default(),
        "nothing was sent"
    );

    let new_etag = tracker
        .record_outcome("rec1", 0, &root.id, &etag, &large, &[])
        .await
        .expect("an outcome of 960,000 bytes as UTF-16 is recorded");
    match tracker.work_state("rec1", 0, &root.id).await.unwrap() {
        Some(WorkState::Expanded { etag, outcome }) => {
            assert_eq!(etag, new_etag.etag);
            assert!(outcome == large, "the recorded outcome reads back exactly");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn long_errors_are_cut_with_a_marker_and_still_stored() {
    let (store, _) = table_store();
    let (scans, work) = bookkeeping_tables(&store).await;
    let tracker = Tracker::new(&store, &scans, &work);
    let record = tablescan::app::tracking::ScanRecord {
        id: "9999-rec2".into(),
        state: ScanState::Running,
        request: serde_json::json!({"driver": "count"}),
        shards: 1,
        started_at: time::OffsetDateTime::now_utc(),
        completed_at: None,
        error: None,
        context: None,
        etag: String::new(),
    };
    tracker.insert_scan(&record).await.unwrap();
    // 100,000 non-BMP characters: 200,000 UTF-16 units, three times a string property's limit.
    let error = "\u{1F4A5}".repeat(100_000);
    assert!(tracker
        .finish_scan(&record.id, ScanState::Failed, Some(&error))
        .await
        .expect("a long error does not fail the write"));
    let stored = tracker.get_scan(&record.id).await.unwrap().unwrap();
    let stored_error = stored.error.expect("error stored");
    assert!(stored_error.starts_with("\u{1F4A5}\u{1F4A5}"));
    assert!(
        stored_error.ends_with("[truncated: 200000 UTF-16 units in all]"),
        "{}",
        &stored_error[stored_error.len() - 60..]
    );
    assert!(stored_error.encode_utf16().count() <= 8_000);
}
