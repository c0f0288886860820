//! The stored format of schedules (docs/schedules.md, "Stored format"): the schedule row and
//! its run rows, exactly as `ScheduleStore` writes them, against `tests/golden/schedule-rows.txt`
//! (rewrite with `UPDATE_GOLDEN=1`, see tests/golden/README.md); then read back by today's code
//! from rows the test's own raw client wrote from the golden lines.

use crate::support;

use crate::golden_formats::harness::{check_examples, op_from_line, replay, Example, Op, Recorder};
use serde_json::{json, Value};
use support::raw::RawClient;
use tablescan::app::schedule::store::{Outcome, Run, Schedule, ScheduleStore, SCHEDULES};
use tablescan::app::schedule::{Overlap, ScheduleDef};
use tablescan::storage::TableStore;
use time::macros::datetime;

fn example(name: &str, ops: &[Op]) -> Example {
    let mut example = Example::new(name).line("partition", ops[0].partition.clone());
    for (i, op) in ops.iter().enumerate() {
        example = example.line(format!("op {}", i + 1), op.text());
    }
    example
}

#[tokio::test]
async fn schedule_rows_as_stored() {
    let table = support::unique_name("GoldenSchedules");
    let recorder = Recorder::new(support::table_store().0);
    recorder.inner.create_table(&table).await.unwrap();
    let store = ScheduleStore {
        store: &recorder,
        table: &table,
    };
    let def = ScheduleDef {
        cron: "0 0 3 * * *".into(),
        scan: json!({"driver": "export", "sourceTable": "Logs", "destinationContainer": "backups",
            "destinationPrefix": "logs/{dueTime}"}),
        overlap: Overlap::Skip,
        keep: Some(7),
    };
    let due = datetime!(2027-01-15 03:00:00 UTC);
    let next = datetime!(2027-01-16 03:00:00 UTC);
    store.put("nightly", &def, Some(due), None).await.unwrap();
    let put = recorder.take();
    let mut run = Run {
        due,
        outcome: Outcome::Starting,
        scan_id: Some(tablescan::app::schedule::scan_id("nightly", due)),
        error: None,
        prefix: Some("logs/20270115T030000Z".into()),
        claim: "00000000-0000-0000-0000-00000000c1a1".into(),
        pruned: false,
    };
    assert!(store.claim_run("nightly", &run).await.unwrap());
    let claimed = recorder.take();
    run.outcome = Outcome::Started;
    store.update_run("nightly", &run).await.unwrap();
    let started = recorder.take();
    let read = store.get("nightly").await.unwrap().unwrap();
    let scan = run.scan_id.clone().unwrap();
    assert!(store
        .advance(&read, Some(next), Some((due, &scan)))
        .await
        .unwrap());
    let advanced = recorder.take();
    let mut failed = Run {
        due: next,
        outcome: Outcome::Starting,
        scan_id: Some(tablescan::app::schedule::scan_id("nightly", next)),
        error: Some("scan.sourceTable: table Logs does not exist".into()),
        prefix: None,
        claim: "00000000-0000-0000-0000-00000000c1a2".into(),
        pruned: false,
    };
    assert!(store.claim_run("nightly", &failed).await.unwrap());
    failed.outcome = Outcome::Failed;
    store.update_run("nightly", &failed).await.unwrap();
    let failed_ops = recorder.take();
    run.pruned = true;
    store.update_run("nightly", &run).await.unwrap();
    let pruned = recorder.take();

    let examples = vec![
        example(
            "PUT records the schedule, due next at its first occurrence",
            &put,
        ),
        example("a firing claims a due time: the run row's insert", &claimed),
        example("the scan started: the run row rewritten", &started),
        example(
            "the schedule moves to its next due time, under the ETag it was read with",
            &advanced,
        ),
        example(
            "a run that could not start: claimed, then its error recorded",
            &failed_ops,
        ),
        example("keep: an export run whose prefix was deleted", &pruned),
    ];
    let header = "Schedule rows (scans table): the schedule (PartitionKey `~schedules`, RowKey\n\
                  its name) and its runs (PartitionKey `~runs-<name>`, RowKey 999999999999 minus\n\
                  the due time in Unix seconds, 12 digits: newest first); times are UTC stamps\n\
                  `yyyyMMddTHHmmssZ` (docs/schedules.md).";
    let golden = check_examples("schedule-rows.txt", header, &examples);

    // Read back by today's code from rows written by the test's own client.
    let ops: Vec<Op> = golden
        .iter()
        .flat_map(|e| {
            let partition = e.get("partition").to_string();
            e.lines
                .iter()
                .filter(|(k, _)| k.starts_with("op "))
                .map(move |(_, v)| op_from_line(&partition, v))
                .collect::<Vec<_>>()
        })
        .collect();
    let rows = replay(ops.iter());
    let raw = RawClient::azurite();
    let stored = support::unique_name("GoldenSchedRead");
    raw.create_table(&stored).await.unwrap();
    for row in rows.values() {
        raw.insert(&stored, &Value::Object(row.clone()).to_string())
            .await
            .unwrap();
    }
    let (plain, _) = support::table_store();
    let reader = ScheduleStore {
        store: &plain,
        table: &stored,
    };
    let schedule = reader.get("nightly").await.unwrap().unwrap();
    assert_eq!(
        Schedule {
            etag: String::new(),
            ..schedule
        },
        Schedule {
            name: "nightly".into(),
            def,
            next_due: Some(next),
            last_due: Some(due),
            last_scan: Some(scan),
            etag: String::new(),
        }
    );
    assert_eq!(reader.list().await.unwrap().len(), 1);
    let runs = reader.runs("nightly", 10).await.unwrap();
    assert_eq!(runs, vec![failed, run], "newest first");
    assert_eq!(SCHEDULES, "~schedules");
}
