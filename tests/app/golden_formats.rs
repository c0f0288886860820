//! Golden copies of every stored and queued format, and a scan that survives a redeployment
//! (issue 27, part 7; the rule is docs/compatibility.md).
//!
//! During a deployment old and new handlers run side by side on one scan, so every format one
//! version writes, the next must read. Each test here (a) builds real examples through the
//! code's public API from fixed inputs (times and ids fixed; clock stamps replaced, see
//! `golden/harness.rs`) and asserts that the bytes the code writes equal the golden file under
//! `tests/golden/` (rewritten only with `UPDATE_GOLDEN=1`, so a change is a reviewed diff), and
//! (b) reads each golden file back with today's decoders — through Azurite for stored rows,
//! written there by the test's own REST client — and checks it gives the values built.
//!
//! Then `a_copy_continues_across_a_redeployment_mid_scan`: every handler killed at once, later
//! the whole host stopped and a new one started on the same storage, and the copy completes
//! exactly.

use crate::support;

#[path = "../golden/harness.rs"]
pub(crate) mod harness;

use std::collections::BTreeMap;
use std::time::Duration;

use harness::{check, check_examples, op_from_line, replay, Example, Op, Recorder};
use serde_json::{json, Value};
use support::raw::RawClient;
use tablescan::app::drivers::enqueue::{pack, EnqueueTarget};
use tablescan::app::drivers::export::ExportOptions;
use tablescan::app::drivers::import::{ImportOptions, ImportWork, PartRef};
use tablescan::app::drivers::index::PublishedSegment;
use tablescan::app::drivers::kit::range::page_items;
use tablescan::app::export_format::{
    decode_part, encode_part, part_name, sha256_hex, DecodeLimits, ExportLayout, Manifest,
    ManifestPart,
};
use tablescan::app::index_files::SegmentEntry;
use tablescan::app::job::request::parse_request;
use tablescan::app::job::WorkOutcome;
use tablescan::app::job::{DriverName, RangeWork, ScanContext, TableRef, WorkSplit};
use tablescan::app::messages::{
    decode, encode, round_of, shard_for, with_round, work_id, ChildSpec, ItemJson, ItemMessage,
    MessageError, StepMessage, WorkMessage,
};
use tablescan::app::tracking::{
    Completion, Counters, NewWork, ScanRecord, ScanState, Tracker, WorkState,
};
use tablescan::scan::{LowerBound, ScanParameters, Step, Strategy};
use tablescan::storage::{odata, Entity, MessageEncoding, QueueStore, TableStore};
use time::macros::datetime;
use time::OffsetDateTime;

/// The scan every example belongs to (a scan id as `POST /api/scans` makes them).
const SCAN: &str = "9999998234567-0badcafe";
const SHARDS: u32 = 4;

fn started_at() -> OffsetDateTime {
    datetime!(2026-01-02 03:04:05.678 UTC)
}

// ---------------------------------------------------------------------------------------------
// Queue messages

fn step(step: Step, shard: Option<u32>) -> StepMessage {
    StepMessage {
        scan_id: SCAN.into(),
        step,
        shard,
    }
}

fn pair(a: &str, b: &str) -> (String, String) {
    (a.to_string(), b.to_string())
}

/// A scan step of every kind that is queued (`Step::Segment` never is: it is a step's output,
/// consumed in the invocation that read it).
fn step_messages() -> Vec<(&'static str, StepMessage)> {
    vec![
        ("start: a prefix scan's root", step(Step::Start, None)),
        (
            "prefixQuery after a key, bounded above; the first child of its parent (its shard named)",
            step(
                Step::PrefixQuery {
                    prefix: "ab".into(),
                    lower: LowerBound::After("ab".into()),
                    upper: Some("ac".into()),
                    depth: 2,
                },
                Some(1),
            ),
        ),
        (
            "prefixQuery from a key, unbounded above",
            step(
                Step::PrefixQuery {
                    prefix: String::new(),
                    lower: LowerBound::From("k\u{e9}y\u{1F600}".into()),
                    upper: None,
                    depth: 0,
                },
                None,
            ),
        ),
        (
            "partitionKeyQuery",
            step(
                Step::PartitionKeyQuery {
                    partition_key: "it's".into(),
                    row_key_skip: None,
                    depth: 3,
                },
                None,
            ),
        ),
        (
            "partitionKeyQuery after a row key",
            step(
                Step::PartitionKeyQuery {
                    partition_key: "p1".into(),
                    row_key_skip: Some("r0099".into()),
                    depth: 3,
                },
                Some(3),
            ),
        ),
        (
            "serial: a serial scan's root",
            step(Step::Serial { after: None }, None),
        ),
        (
            "serial after a row",
            step(
                Step::Serial {
                    after: Some(pair("p1", "r1")),
                },
                None,
            ),
        ),
        (
            "partitionKeyRange",
            step(
                Step::PartitionKeyRange {
                    partition_key: "p1".into(),
                    row_key_skip: Some("r1".into()),
                    row_key_through: "r5".into(),
                    depth: 4,
                },
                None,
            ),
        ),
        (
            "partitionKeyRange from the partition's start",
            step(
                Step::PartitionKeyRange {
                    partition_key: "p1".into(),
                    row_key_skip: None,
                    row_key_through: "r5".into(),
                    depth: 4,
                },
                None,
            ),
        ),
        (
            "serialRange",
            step(
                Step::SerialRange {
                    after: Some(pair("p1", "r1")),
                    through: pair("p9", "r9"),
                    depth: 1,
                },
                None,
            ),
        ),
        (
            "serialRange from the range's start",
            step(
                Step::SerialRange {
                    after: None,
                    through: pair("p9", "r9"),
                    depth: 1,
                },
                Some(0),
            ),
        ),
    ]
}

/// A driver's work item, typed as its driver reads it.
#[derive(Debug, Clone, PartialEq)]
enum Typed {
    Range(RangeWork),
    Import(ImportWork),
}

fn item(typed: Typed, shard: Option<u32>) -> (ItemMessage, Typed) {
    let work = match &typed {
        Typed::Range(w) => ItemJson::from_item(w),
        Typed::Import(w) => ItemJson::from_item(w),
    }
    .unwrap();
    let message = ItemMessage {
        scan_id: SCAN.into(),
        work,
        shard,
    };
    (message, typed)
}

/// Keys-only rows as a scan step reads them (for `page_items`, how range items are made).
fn keys(keys: &[(&str, &str)]) -> Vec<Entity> {
    keys.iter().map(|(pk, rk)| Entity::new(*pk, *rk)).collect()
}

fn sha(n: u8) -> String {
    format!("{n:02x}").repeat(32)
}

/// Every driver's work items: copy, count (filtered), delete and export all queue range items
/// (`RangeWork`), made from scanned pages by `page_items`; import queues chunk and part items.
fn item_messages() -> Vec<(&'static str, ItemMessage, Typed)> {
    let page = keys(&[("p1", "r1"), ("p1", "r2"), ("p2", "r0")]);
    let range = page_items(WorkSplit::Page, &page).remove(0);
    let by_partition = page_items(WorkSplit::PartitionKey, &page).remove(0);
    let after = RangeWork::After {
        after: pair("p2", "r0"),
        to: pair("p3", "r9"),
    };
    let single = page_items(WorkSplit::Page, &keys(&[("", "empty pk")])).remove(0);
    let cases = [
        (
            "copy: range (workSplit page)",
            Typed::Range(range.clone()),
            Some(2),
        ),
        (
            "copy: rows of one partition (workSplit partitionKey)",
            Typed::Range(by_partition),
            None,
        ),
        (
            "copy/count/delete/export: after (the rest of a range that grew)",
            Typed::Range(after),
            None,
        ),
        ("count (filtered): range", Typed::Range(single), None),
        ("delete: range", Typed::Range(range.clone()), Some(0)),
        ("export: range", Typed::Range(range), None),
        (
            "import: chunk of parts (manifest digest pinned)",
            Typed::Import(ImportWork::Parts {
                start: 0,
                sha256: Some(sha(0xab)),
                write: false,
            }),
            None,
        ),
        (
            "import: chunk of parts (scans started before the digest was recorded)",
            Typed::Import(ImportWork::Parts {
                start: 200,
                sha256: None,
                write: false,
            }),
            None,
        ),
        (
            "import: verification of parts, from a line on",
            Typed::Import(ImportWork::Verify {
                parts: vec![PartRef::from(&ManifestPart {
                    name: format!("parts/{SCAN}/c-0123456789abcdef0123456789abcdef.jsonl.gz"),
                    rows: 2000,
                    bytes: 48213,
                    sha256: sha(0x9f),
                })],
                skip: 1000,
            }),
            None,
        ),
        (
            "import: chunk of parts of the write phase",
            Typed::Import(ImportWork::Parts {
                start: 0,
                sha256: Some(sha(0xab)),
                write: true,
            }),
            None,
        ),
        (
            "import: part",
            Typed::Import(ImportWork::Part {
                name: format!("parts/{SCAN}/c-0123456789abcdef0123456789abcdef.jsonl.gz"),
                rows: 2000,
                bytes: 18_443,
                sha256: sha(0x9f),
                skip: 0,
            }),
            Some(3),
        ),
        (
            "import: part, its rows from a skip on",
            Typed::Import(ImportWork::Part {
                name: "parts/s/c-1.jsonl.gz".into(),
                rows: 2000,
                bytes: 18_443,
                sha256: sha(0x9f),
                skip: 1000,
            }),
            None,
        ),
    ];
    cases
        .into_iter()
        .map(|(name, typed, shard)| {
            let (message, typed) = item(typed, shard);
            (name, message, typed)
        })
        .collect()
}

/// A message's golden lines: the queue text, the envelope JSON inside it, its work id and the
/// shard of its row (both part of its identity across versions).
fn message_example<M: WorkMessage>(name: &str, message: &M) -> Example {
    let queue = encode(message).unwrap();
    let json = String::from_utf8(MessageEncoding::Base64.decode(&queue).unwrap()).unwrap();
    let id = work_id(message);
    Example::new(name)
        .line("queue", queue)
        .line("json", json)
        .line("work id", id.clone())
        .line(
            "row shard of 4",
            shard_for(message, &id, SHARDS).to_string(),
        )
}

/// Reads a golden message back: the queue text decodes to the JSON, which decodes to `built`,
/// with the same work id and shard.
fn read_message<M: WorkMessage + PartialEq + std::fmt::Debug>(golden: &Example, built: &M) -> M {
    let json = MessageEncoding::Base64.decode(golden.get("queue")).unwrap();
    assert_eq!(json, golden.get("json").as_bytes(), "{}", golden.name);
    let message: M = decode(golden.get("json")).unwrap();
    assert_eq!(&message, built, "{}", golden.name);
    let id = work_id(&message);
    assert_eq!(id, golden.get("work id"), "{}", golden.name);
    assert_eq!(
        shard_for(&message, &id, SHARDS).to_string(),
        golden.get("row shard of 4"),
        "{}",
        golden.name
    );
    message
}

#[test]
fn queue_messages() {
    let steps = step_messages();
    let examples: Vec<Example> = steps
        .iter()
        .map(|(name, m)| message_example(name, m))
        .collect();
    let header = "Queue messages of the PrefixScan function: one scan step each (envelope `scan-step` v2).\n\
                  queue: the message text as queued (base64); json: the envelope inside it;\n\
                  work id and row shard: the identity of its work row. See docs/compatibility.md.";
    let golden = check_examples("messages-scan-step.txt", header, &examples);
    for (g, (_, built)) in golden.iter().zip(&steps) {
        read_message(g, built);
    }

    let items = item_messages();
    let examples: Vec<Example> = items
        .iter()
        .map(|(name, m, _)| message_example(name, m))
        .collect();
    let header = "Queue messages of the TableCopy function: one driver work item each (envelope\n\
                  `table-copy` v2, whatever the driver). Lines as in messages-scan-step.txt.";
    let golden = check_examples("messages-table-copy.txt", header, &examples);
    for (g, (_, built, typed)) in golden.iter().zip(&items) {
        let message = read_message(g, built);
        let read = match typed {
            Typed::Range(_) => Typed::Range(message.work.parse().unwrap()),
            Typed::Import(_) => Typed::Import(message.work.parse().unwrap()),
        };
        assert_eq!(&read, typed, "{}", g.name);
    }
}

/// A work message a poison function re-queued (issue 27, part 8): the same envelope with its
/// re-queue round in `r`; `d` kept byte for byte, so the same work id and shard. A reader that
/// does not know `r` ignores it (an unknown field), and reads the same work.
#[test]
fn requeued_messages() {
    let (name, step) = step_messages().remove(0);
    let (item_name, item, _) = item_messages().remove(0);
    let requeued = |example: Example, round: u32| {
        let json = with_round(example.get("json"), round).unwrap();
        Example::new(format!("{} (re-queued for round {round})", example.name))
            .line("queue", MessageEncoding::Base64.encode(json.as_bytes()))
            .line("json", json)
            .line("work id", example.get("work id").to_string())
            .line("row shard of 4", example.get("row shard of 4").to_string())
    };
    let examples = vec![
        requeued(message_example(name, &step), 1),
        requeued(message_example(item_name, &item), 3),
    ];
    let header =
        "Work queue messages a poison function put back on their live queue for a re-queue\n\
                  round: the envelope's `r` is the round (absent on a driver's message: round 0).\n\
                  Lines as in messages-scan-step.txt. See docs/compatibility.md.";
    let golden = check_examples("messages-requeued.txt", header, &examples);
    read_message(&golden[0], &step);
    read_message(&golden[1], &item);
    assert_eq!(round_of(golden[0].get("json")), 1);
    assert_eq!(round_of(golden[1].get("json")), 3);
}

/// Messages of the first version (v1: the whole scan context in every message) are refused,
/// naming their version: only v2 is read (nothing was ever deployed that queued v1).
#[test]
fn v1_messages_are_refused() {
    let context = contexts().remove(0).1;
    let range = RangeWork::Range {
        from: pair("a", "1"),
        to: pair("b", "2"),
    };
    let context_json = serde_json::to_string(&context).unwrap();
    let item = format!(
        r#"{{"n":"table-copy","v":1,"d":{{"s":{context_json},"w":{}}}}}"#,
        serde_json::to_string(&range).unwrap()
    );
    let start =
        format!(r#"{{"n":"scan-step","v":1,"d":{{"s":{context_json},"w":{{"kind":"start"}}}}}}"#);
    let example = |name: &str, json: &str| {
        Example::new(name)
            .line("queue", MessageEncoding::Base64.encode(json.as_bytes()))
            .line("json", json)
    };
    let examples = [
        example("table-copy v1: a copy range item", &item),
        example("scan-step v1: start", &start),
    ];
    let header = "Messages of the first version (each carried its scan's whole context).\n\
                  Never written, and refused when read (only v2 is read).";
    let golden = check_examples("messages-v1.txt", header, &examples);
    for (g, expected) in golden.iter().zip(["table-copy", "scan-step"]) {
        let refused = match expected {
            "table-copy" => decode::<ItemMessage>(g.get("json")).map(|_| ()),
            _ => decode::<StepMessage>(g.get("json")).map(|_| ()),
        };
        assert!(
            matches!(refused, Err(MessageError::WrongKind { version: 1, .. })),
            "{}: {refused:?}",
            g.name
        );
    }
    let _ = (context, range);
}

// ---------------------------------------------------------------------------------------------
// Scan contexts and scan records

fn table(table: &str) -> TableRef {
    TableRef {
        connection: "AzureWebJobsStorage".into(),
        table: table.into(),
    }
}

/// The parameters a start request gives a scan (defaults, keys only while scanning).
fn params() -> ScanParameters {
    ScanParameters {
        select: Some(Vec::new()),
        inline_first_partition_page: true,
        ..ScanParameters::default()
    }
}

fn canonical(filter: &str) -> String {
    odata::parse(filter).unwrap().render()
}

fn export_options() -> ExportOptions {
    ExportOptions {
        connection: "BackupStorage".into(),
        container: "backups".into(),
        prefix: "nightly/2026-01-02".into(),
        started_at: started_at(),
    }
}

fn import_options() -> ImportOptions {
    ImportOptions {
        container: "backups".into(),
        prefix: "nightly/2026-01-02".into(),
        manifest_sha256: Some(sha(0x5e)),
    }
}

/// A context of each driver as its start records it (`ScanRequest::context` with the driver's
/// `setup`), with the request each was started with.
fn contexts() -> Vec<(&'static str, ScanContext, Value)> {
    let base = ScanContext {
        scan_id: SCAN.into(),
        shards: SHARDS,
        driver: DriverName::new("copy"),
        strategy: Strategy::Prefix,
        source: table("Packages"),
        destination: Some(table("PackagesCopy")),
        params: ScanParameters {
            select: None,
            ..params()
        },
        work_split: WorkSplit::Page,
        filter: None,
        select: None,
        options: None,
        in_step: true,
        max_requests_per_second: None,
    };
    let bounded = ScanParameters {
        prefix: "pk".into(),
        lower: Some("pk0".into()),
        upper: Some("pk9".into()),
        take: 500,
        ..params()
    };
    vec![
        (
            "copy: works in its steps (workSplit page, no filter, prefix strategy)",
            base.clone(),
            json!({"driver": "copy", "sourceTable": "Packages", "destinationTable": "PackagesCopy"}),
        ),
        (
            "copy: workSplit partitionKey, serial, key range, another destination connection",
            ScanContext {
                strategy: Strategy::Serial,
                destination: Some(TableRef {
                    connection: "OtherStorage".into(),
                    table: "PackagesCopy".into(),
                }),
                params: bounded.clone(),
                work_split: WorkSplit::PartitionKey,
                in_step: false,
                ..base.clone()
            },
            json!({"driver": "copy", "sourceTable": "Packages", "strategy": "serial",
                   "partitionKeyPrefix": "pk", "partitionKeyLowerBound": "pk0",
                   "partitionKeyUpperBound": "pk9", "takeCount": 500,
                   "destinationTable": "PackagesCopy", "destinationConnection": "OtherStorage",
                   "workSplit": "partitionKey"}),
        ),
        (
            "copy: filter and select (items re-read)",
            ScanContext {
                params: params(),
                filter: Some(canonical("Size gt 10 and Name ne 'x'")),
                select: Some(vec!["Name".into(), "Size".into()]),
                in_step: false,
                ..base.clone()
            },
            json!({"driver": "copy", "sourceTable": "Packages", "destinationTable": "PackagesCopy",
                   "filter": canonical("Size gt 10 and Name ne 'x'"), "select": ["Name", "Size"]}),
        ),
        (
            "count: filtered",
            ScanContext {
                driver: DriverName::new("count"),
                destination: None,
                params: params(),
                filter: Some(canonical("Size gt 10")),
                in_step: false,
                ..base.clone()
            },
            json!({"driver": "count", "sourceTable": "Packages", "filter": canonical("Size gt 10")}),
        ),
        (
            "delete: works in its steps (keys only)",
            ScanContext {
                driver: DriverName::new("delete"),
                destination: None,
                params: params(),
                ..base.clone()
            },
            json!({"driver": "delete", "sourceTable": "Packages", "confirm": "Packages"}),
        ),
        (
            "export: filter, select, options",
            ScanContext {
                driver: DriverName::new("export"),
                destination: None,
                params: params(),
                filter: Some(canonical("Size gt 10")),
                select: Some(vec!["Name".into()]),
                options: Some(serde_json::to_value(export_options()).unwrap()),
                in_step: false,
                ..base.clone()
            },
            json!({"driver": "export", "sourceTable": "Packages", "filter": canonical("Size gt 10"),
                   "select": ["Name"], "destinationContainer": "backups",
                   "destinationPrefix": "nightly/2026-01-02", "destinationConnection": "BackupStorage"}),
        ),
        (
            "import: no source table, options with the manifest's digest",
            ScanContext {
                driver: DriverName::new("import"),
                source: table(""),
                params: params(),
                options: Some(serde_json::to_value(import_options()).unwrap()),
                in_step: false,
                ..base.clone()
            },
            json!({"driver": "import", "sourceContainer": "backups",
                   "sourcePrefix": "nightly/2026-01-02", "destinationTable": "PackagesCopy"}),
        ),
        (
            "copy: rate-limited (maxRequestsPerSecond)",
            ScanContext {
                max_requests_per_second: Some(2_000),
                ..base
            },
            json!({"driver": "copy", "sourceTable": "Packages", "destinationTable": "PackagesCopy",
                   "maxRequestsPerSecond": 2000}),
        ),
    ]
}

#[test]
fn scan_contexts() {
    let all = contexts();
    let examples: Vec<Example> = all
        .iter()
        .map(|(name, c, _)| Example::new(*name).line("json", serde_json::to_string(c).unwrap()))
        .collect();
    let header =
        "Scan contexts: what every work item of a scan reads and writes, recorded on the\n\
                  scan record's `Context` property at start (docs/architecture.md).";
    let golden = check_examples("scan-contexts.txt", header, &examples);
    for (g, (_, built, _)) in golden.iter().zip(&all) {
        let read: ScanContext = serde_json::from_str(g.get("json")).unwrap();
        assert_eq!(&read, built, "{}", g.name);
        match read.driver.as_str() {
            "export" => assert_eq!(
                read.options::<ExportOptions>().unwrap().started_at,
                started_at()
            ),
            "import" => assert_eq!(
                read.options::<ImportOptions>().unwrap().manifest_sha256,
                import_options().manifest_sha256
            ),
            _ => {}
        }
    }
}

/// The request a scan records: the start request as parsed, the driver's fields with their
/// defaults (as `start` records it).
fn recorded_request(body: &Value) -> Value {
    let drivers = ["copy", "count", "delete", "export", "import"];
    let mut request = parse_request(body.to_string().as_bytes(), &drivers).unwrap();
    let fields = Value::Object(request.fields.clone());
    let fields = match request.driver.as_str() {
        "copy" => serde_json::to_value(
            serde_json::from_value::<tablescan::app::drivers::copy::CopyFields>(fields).unwrap(),
        ),
        "count" => Ok(json!({})),
        "delete" => serde_json::to_value(
            serde_json::from_value::<tablescan::app::drivers::delete::DeleteFields>(fields)
                .unwrap(),
        ),
        "export" => serde_json::to_value(
            serde_json::from_value::<tablescan::app::drivers::export::ExportFields>(fields)
                .unwrap(),
        ),
        "import" => serde_json::to_value(
            serde_json::from_value::<tablescan::app::drivers::import::ImportFields>(fields)
                .unwrap(),
        ),
        other => panic!("no driver {other}"),
    };
    request.fields = fields.unwrap().as_object().unwrap().clone();
    serde_json::to_value(&request).unwrap()
}

/// How a scan record's scan ended: its state and error.
type ScanEnd = (ScanState, Option<&'static str>);

/// Scan records of each driver, each running, and the copy's also completed and failed; each
/// example's scan id is its own (the record's partition key).
fn scan_records() -> Vec<(String, ScanRecord, Option<ScanEnd>)> {
    let mut out = Vec::new();
    for (i, (name, mut context, body)) in contexts().into_iter().enumerate() {
        let id = format!("{}{i:02}", &SCAN[..SCAN.len() - 2]);
        context.scan_id = id.clone();
        let record = ScanRecord {
            id,
            state: ScanState::Running,
            request: recorded_request(&body),
            context: Some(context),
            shards: SHARDS,
            started_at: started_at(),
            completed_at: None,
            error: None,
            etag: String::new(),
        };
        out.push((format!("{name}: running"), record.clone(), None));
        if i == 0 {
            let mut again = |suffix: &str, state, error| {
                let id = format!("{}{suffix}", &SCAN[..SCAN.len() - 2]);
                let record = ScanRecord {
                    id: id.clone(),
                    context: record.context.clone().map(|c| ScanContext {
                        scan_id: id.clone(),
                        ..c
                    }),
                    ..record.clone()
                };
                let label = format!("{name}: {}", state_name(state));
                out.push((label, record, Some((state, error))));
            };
            again("c0", ScanState::Completed, None);
            again(
                "f0",
                ScanState::Failed,
                Some("1 work item(s) failed; see the failed work rows of scan …"),
            );
            again("x0", ScanState::Cancelled, Some("cancelled by request"));
        }
    }
    out
}

fn state_name(state: ScanState) -> &'static str {
    state.as_str()
}

/// A fresh Azure table store on the shared Azurite, recording the transactions it commits, and
/// a tracker's two tables created on it.
async fn recording_tracker() -> (
    Recorder<tablescan::storage::azure_table::AzureTableStore>,
    String,
    String,
) {
    let store = Recorder::new(support::table_store().0);
    let (scans, work) = (
        support::unique_name("GoldenScans"),
        support::unique_name("GoldenWork"),
    );
    Tracker::new(&store, &scans, &work)
        .ensure_tables()
        .await
        .unwrap();
    store.take();
    (store, scans, work)
}

fn ops_example(name: &str, ops: &[Op]) -> Example {
    let mut example = Example::new(name);
    if let Some(first) = ops.first() {
        example = example.line("partition", first.partition.clone());
    }
    for (i, op) in ops.iter().enumerate() {
        assert_eq!(
            op.partition, ops[0].partition,
            "one transaction, one partition"
        );
        example = example.line(format!("op {}", i + 1), op.text());
    }
    example
}

fn ops_of(example: &Example) -> Vec<Op> {
    let partition = example
        .lines
        .iter()
        .find(|(k, _)| k == "partition")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    example
        .lines
        .iter()
        .filter(|(k, _)| k.starts_with("op "))
        .map(|(_, v)| op_from_line(&partition, v))
        .collect()
}

/// Writes rows (JSON objects) into a new table with the test's own REST client, as a table holds
/// them after a version wrote them; returns the table.
async fn stored(
    rows: &BTreeMap<(String, String), serde_json::Map<String, Value>>,
    prefix: &str,
) -> String {
    let raw = RawClient::azurite();
    let table = support::unique_name(prefix);
    raw.create_table(&table).await.unwrap();
    for row in rows.values() {
        raw.insert(&table, &Value::Object(row.clone()).to_string())
            .await
            .unwrap_or_else(|e| panic!("insert {row:?}: {e}"));
    }
    table
}

#[tokio::test]
async fn scan_records_as_stored() {
    let (store, scans, work) = recording_tracker().await;
    let tracker = Tracker::new(&store, &scans, &work);
    let records = scan_records();
    let mut examples = Vec::new();
    for (name, record, end) in &records {
        tracker.insert_scan(record).await.unwrap();
        let mut ops = store.take();
        if let Some((state, error)) = end {
            assert!(tracker
                .finish_scan(&record.id, *state, *error)
                .await
                .unwrap());
            ops.extend(store.take());
        }
        examples.push(ops_example(name, &ops));
    }
    let header = "Scan records (scans table; PartitionKey = scan id, RowKey `scan`): the transactions\n\
                  that write them, each operation's entity as sent. A start inserts the record; the\n\
                  end merges State, CompletedAt, Error and EndedBy, the ending call's token\n\
                  (If-Match). Clock stamps and claim tokens fixed.";
    let golden = check_examples("scan-records.txt", header, &examples);

    // Read back: the rows as stored, written by the test's own client, read by today's tracker.
    let rows = replay(golden.iter().flat_map(ops_of).collect::<Vec<_>>().iter());
    let table = stored(&rows, "GoldenScansRead").await;
    let reader = support::table_store().0;
    let tracker = Tracker::new(&reader, &table, &work);
    for (g, (_, built, end)) in golden.iter().zip(&records) {
        let read = tracker.get_scan(&built.id).await.unwrap().expect("record");
        assert_eq!(read.request, built.request, "{}", g.name);
        assert_eq!(read.context, built.context, "{}", g.name);
        assert_eq!(
            Some(read.recorded_context().unwrap()),
            built.context,
            "{}",
            g.name
        );
        assert_eq!((read.shards, read.started_at), (SHARDS, started_at()));
        let (state, error, completed) = match end {
            None => (ScanState::Running, None, None),
            Some((s, e)) => (*s, e.map(str::to_string), Some(harness::fixed_now())),
        };
        assert_eq!(
            (read.state, read.error, read.completed_at),
            (state, error, completed),
            "{}",
            g.name
        );
    }
}

/// A record without a `Context` property is read, but its work cannot run: no context is
/// derived from its recorded request.
#[tokio::test]
async fn a_scan_record_without_a_context_cannot_run() {
    let (_, record, _) = scan_records().remove(0);
    let id = format!("{}l0", &SCAN[..SCAN.len() - 2]);
    let golden = harness::parse(&String::from_utf8(harness::read("scan-records.txt")).unwrap());
    let mut rows = replay(ops_of(&golden[0]).iter());
    let row = rows.values_mut().next().unwrap();
    assert!(row.remove("Context").is_some());
    row.insert("PartitionKey".into(), json!(id));
    let table = stored(&rows, "GoldenLegacyScans").await;
    let reader = support::table_store().0;
    let read = Tracker::new(&reader, &table, "unused")
        .get_scan(&id)
        .await
        .unwrap()
        .expect("record");
    assert_eq!(read.context, None);
    assert_eq!(read.request, record.request);
    assert!(read
        .recorded_context()
        .is_err_and(|e| e.contains("no usable recorded context")));
}

// ---------------------------------------------------------------------------------------------
// Work rows, counter rows and recorded outcomes

fn counters(f: impl FnOnce(&mut Counters)) -> Counters {
    let mut c = Counters::default();
    f(&mut c);
    c
}

fn range(from: (&str, &str), to: (&str, &str)) -> RangeWork {
    RangeWork::Range {
        from: pair(from.0, from.1),
        to: pair(to.0, to.1),
    }
}

fn range_child(work: &RangeWork) -> ChildSpec {
    ChildSpec::Item(ItemJson::from_item(work).unwrap())
}

fn import_child(work: &ImportWork) -> ChildSpec {
    ChildSpec::Item(ItemJson::from_item(work).unwrap())
}

/// An export item's result: its part descriptors (what the manifest lists).
fn export_result() -> String {
    let part = ManifestPart {
        name: part_name(SCAN, &export_item_ids()[0]).unwrap(),
        rows: 3,
        bytes: 1843,
        sha256: sha(0x9f),
    };
    serde_json::to_string(&vec![&part]).unwrap()
}

/// A small index build's assembly result (docs/index.md): the segment it wrote, or none when an
/// earlier delivery had published the build.
fn published_result(wrote: bool) -> String {
    let segment = wrote.then(|| SegmentEntry {
        name: format!("builds/{SCAN}/segments/0123456789abcdef0123456789abcdef.seg"),
        ranges: 12,
        rows: 20_000,
        bytes: 48_213,
    });
    let result = PublishedSegment {
        published: true,
        segment,
    };
    serde_json::to_string(&result).unwrap()
}

/// Outcomes as this version records them (`WorkOutcome`, in a row's `Outcome0`, `Outcome1`, …).
fn outcomes() -> Vec<(&'static str, WorkOutcome)> {
    let step_outcome = WorkOutcome {
        children: vec![
            ChildSpec::Step(Step::PrefixQuery {
                prefix: "p".into(),
                lower: LowerBound::After("p4".into()),
                upper: None,
                depth: 1,
            }),
            range_child(&range(("p1", "r1"), ("p1", "r2"))),
            // Its row lives in another shard than its parent's (where its id hashes).
            range_child(&range(("p4", "r0"), ("p4", "r0"))),
        ],
        delta: counters(|c| {
            c.rows_scanned = 3;
            c.storage_requests = 2;
        }),
        first_grouped: true,
        ..WorkOutcome::default()
    };
    vec![
        (
            "scan step: a follow-up step and two items, the first child in the item's own shard",
            step_outcome,
        ),
        (
            "scan step that worked on the rows it read (copy, delete): their key ranges",
            WorkOutcome {
                children: vec![ChildSpec::Step(Step::PartitionKeyQuery {
                    partition_key: "p9".into(),
                    row_key_skip: Some("r999".into()),
                    depth: 2,
                })],
                delta: counters(|c| {
                    c.rows_scanned = 1500;
                    c.storage_requests = 3;
                }),
                first_grouped: true,
                in_step: vec![
                    range(("p1", "r1"), ("p8", "r7")),
                    range(("p9", "r0"), ("p9", "r999")),
                ],
                ..WorkOutcome::default()
            },
        ),
        (
            "delete step without children (recorded so that a duplicate adopts its reading)",
            WorkOutcome {
                delta: counters(|c| {
                    c.rows_scanned = 12;
                    c.storage_requests = 1;
                }),
                first_grouped: true,
                in_step: vec![range(("a", "1"), ("b", "2"))],
                ..WorkOutcome::default()
            },
        ),
        (
            "export item: its part descriptors as its result",
            WorkOutcome {
                delta: counters(|c| {
                    c.rows_written = 3;
                    c.rows_matched = 3;
                    c.storage_requests = 2;
                }),
                result: Some(export_result()),
                ..WorkOutcome::default()
            },
        ),
        (
            "index assembly item that published a small build: its segment's descriptor",
            WorkOutcome {
                delta: counters(|c| c.storage_requests = 9),
                result: Some(published_result(true)),
                ..WorkOutcome::default()
            },
        ),
        (
            "index assembly item delivered again after the build was published: no descriptor",
            WorkOutcome {
                delta: counters(|c| c.storage_requests = 2),
                result: Some(published_result(false)),
                ..WorkOutcome::default()
            },
        ),
        (
            "import chunk: part items and the next chunk",
            WorkOutcome {
                children: vec![
                    import_child(&ImportWork::Part {
                        name: "parts/s/c-1.jsonl.gz".into(),
                        rows: 7,
                        bytes: 1843,
                        sha256: sha(0x9f),
                        skip: 0,
                    }),
                    import_child(&ImportWork::Parts {
                        start: 200,
                        sha256: Some(sha(0x5e)),
                        write: false,
                    }),
                ],
                delta: counters(|c| c.storage_requests = 1),
                first_grouped: true,
                ..WorkOutcome::default()
            },
        ),
    ]
}

#[test]
fn work_outcomes() {
    let all = outcomes();
    let examples: Vec<Example> = all
        .iter()
        .map(|(name, o)| Example::new(*name).line("json", serde_json::to_string(o).unwrap()))
        .collect();
    let header = "Recorded outcomes of work items (the `Outcome0`, `Outcome1`, ... properties of an\n\
                  `expanded` work row, split every 32,000 UTF-16 units): children, counters, result.";
    let golden = check_examples("work-outcomes.txt", header, &examples);
    for (g, (_, built)) in golden.iter().zip(&all) {
        let read: WorkOutcome = serde_json::from_str(g.get("json")).unwrap();
        assert_eq!(&read, built, "{}", g.name);
    }
}

/// Outcomes earlier versions recorded, still adopted: the previous version's `g` (first *item*
/// in the item's own shard), and counters without `dropped`/`rows_matched` (zero).
#[test]
fn earlier_outcomes_are_still_read() {
    let step = r#"{"kind":"partitionKeyQuery","partitionKey":"p9","depth":2}"#;
    let item = r#"{"kind":"range","from":["a","1"],"to":["b","2"]}"#;
    let delta = r#"{"created":0,"completed":0,"failed":0,"rows_scanned":7,"rows_written":0,"storage_requests":1,"messages":0}"#;
    let grouped = format!(r#"{{"c":[{{"s":{step}}},{{"c":{item}}}],"d":{delta},"g":true}}"#);
    let ungrouped = format!(r#"{{"c":[{{"c":{item}}}],"d":{delta}}}"#);
    let examples = [
        Example::new("previous version: the first item in the item's own shard (g)")
            .line("json", grouped),
        Example::new("earlier versions: children where their ids hash; counters without dropped and rows_matched")
            .line("json", ungrouped),
    ];
    let header = "Outcomes recorded by earlier versions: never written any more, still adopted.";
    let golden = check_examples("work-outcomes-earlier.txt", header, &examples);
    let read: Vec<WorkOutcome> = golden
        .iter()
        .map(|g| serde_json::from_str(g.get("json")).unwrap())
        .collect();
    let delta = counters(|c| {
        c.rows_scanned = 7;
        c.storage_requests = 1;
    });
    assert_eq!(read[0].delta, delta);
    assert!(read[0].grouped && !read[0].first_grouped);
    assert!(!read[0].in_own_shard(0) && read[0].in_own_shard(1));
    assert_eq!(read[1].delta, delta);
    assert!(!read[1].in_own_shard(0));
    assert_eq!(
        read[1].children,
        vec![ChildSpec::Item(
            ItemJson::from_item(&serde_json::from_str::<RangeWork>(item).unwrap()).unwrap()
        )]
    );
}

/// The row of scan `scan_id`'s root step (its first scan step, `Step::Start`).
fn root_row(scan_id: &str) -> NewWork {
    let root = StepMessage {
        scan_id: scan_id.into(),
        step: Step::Start,
        shard: None,
    };
    NewWork {
        id: work_id(&root),
        kind: StepMessage::NAME,
        shard: shard_for(&root, &work_id(&root), SHARDS),
    }
}

/// The ETag of a child's pending row.
async fn pending_etag<S: TableStore>(tracker: &Tracker<'_, S>, child: &NewWork) -> String {
    match tracker
        .work_state(SCAN, child.shard, &child.id)
        .await
        .unwrap()
    {
        Some(WorkState::Pending { etag }) => etag,
        other => panic!("{} is {other:?}", child.id),
    }
}

/// Completes a pending child (done, or failed with `failure`); returns what that adds to the
/// scan's totals.
async fn complete_child<S: TableStore>(
    tracker: &Tracker<'_, S>,
    child: &NewWork,
    delta: Counters,
    failure: Option<&str>,
    result: Option<&str>,
) -> Counters {
    let etag = pending_etag(tracker, child).await;
    let (shard, id) = (child.shard, &child.id);
    tracker
        .complete(SCAN, shard, id, &etag, delta, failure, result, None)
        .await
        .unwrap();
    delta.plus(&counters(|c| {
        c.completed = 1;
        c.failed = i64::from(failure.is_some());
        c.messages = 1;
    }))
}

/// The life of one export scan's work in the work table: each step a committed transaction.
/// Returns (example name, the transaction's operations, the scan's totals after it).
async fn work_scenario(
    store: &Recorder<tablescan::storage::azure_table::AzureTableStore>,
    tracker: &Tracker<'_, Recorder<tablescan::storage::azure_table::AzureTableStore>>,
) -> Vec<(&'static str, Vec<Op>, Counters)> {
    let mut out = Vec::new();
    let mut totals = Counters::default();
    let root_row = root_row(SCAN);
    let (root_id, own) = (root_row.id.clone(), root_row.shard);
    tracker
        .create_scan_work(SCAN, SHARDS, &root_row)
        .await
        .unwrap();
    totals.created += 1;
    out.push((
        "scan started: the root's row (pending) and its shard's counter",
        store.take(),
        totals,
    ));

    let outcome = outcomes().remove(0).1;
    let children: Vec<NewWork> = outcome
        .children
        .iter()
        .enumerate()
        .map(|(i, child)| {
            let shard = outcome.in_own_shard(i).then_some(own);
            let (id, kind, hint) = match child {
                ChildSpec::Step(s) => {
                    let m = StepMessage {
                        scan_id: SCAN.into(),
                        step: s.clone(),
                        shard,
                    };
                    (
                        work_id(&m),
                        StepMessage::NAME,
                        shard_for(&m, &work_id(&m), SHARDS),
                    )
                }
                ChildSpec::Item(w) => {
                    let m = ItemMessage {
                        scan_id: SCAN.into(),
                        work: w.clone(),
                        shard,
                    };
                    (
                        work_id(&m),
                        ItemMessage::NAME,
                        shard_for(&m, &work_id(&m), SHARDS),
                    )
                }
            };
            NewWork {
                id,
                kind,
                shard: hint,
            }
        })
        .collect();
    let Some(WorkState::Pending { etag }) = tracker.work_state(SCAN, own, &root_id).await.unwrap()
    else {
        panic!("the root is pending");
    };
    let json = serde_json::to_string(&outcome).unwrap();
    let recorded = tracker
        .record_outcome(SCAN, own, &root_id, &etag, &json, &[&children[0]])
        .await
        .unwrap();
    totals.created += 1;
    out.push((
        "root executed: its outcome recorded (pending -> expanded), its first child registered with it",
        store.take(),
        totals,
    ));
    for (i, child) in children.iter().enumerate().skip(1) {
        tracker.register_children(SCAN, &[child]).await.unwrap();
        totals.created += 1;
        let name = [
            "",
            "the root's second child registered",
            "the root's third child registered",
        ][i];
        out.push((name, store.take(), totals));
    }
    let done = tracker
        .complete(
            SCAN,
            own,
            &root_id,
            &recorded.etag,
            outcome.delta,
            None,
            None,
            recorded.counter,
        )
        .await
        .unwrap();
    assert!(matches!(done, Completion::Committed { .. }));
    totals = totals.plus(&outcome.delta).plus(&counters(|c| {
        c.completed = 1;
        c.messages = 1;
    }));
    out.push((
        "root finished (expanded -> done) with its counters",
        store.take(),
        totals,
    ));

    let step_child = &children[0];
    let etag = pending_etag(tracker, step_child).await;
    tracker
        .drop_work(SCAN, step_child.shard, &step_child.id, &etag)
        .await
        .unwrap();
    totals = totals.plus(&counters(|c| {
        c.completed = 1;
        c.dropped = 1;
    }));
    out.push((
        "a step of an ended scan dropped (pending -> dropped)",
        store.take(),
        totals,
    ));

    let delta = outcomes().remove(3).1.delta;
    let result = export_result();
    totals = totals.plus(&complete_child(tracker, &children[1], delta, None, Some(&result)).await);
    out.push((
        "an export item finished (pending -> done) with its result",
        store.take(),
        totals,
    ));

    let delta = counters(|c| c.storage_requests = 1);
    let error = "storage: the part could not be written (HTTP 403)";
    totals = totals.plus(&complete_child(tracker, &children[2], delta, Some(error), None).await);
    out.push((
        "an item failed for good (pending -> failed) with its error",
        store.take(),
        totals,
    ));
    out
}

#[tokio::test]
async fn work_and_counter_rows_as_stored() {
    let (store, scans, work) = recording_tracker().await;
    let tracker = Tracker::new(&store, &scans, &work);
    let scenario = work_scenario(&store, &tracker).await;
    let is_counter = |op: &Op| op.row_key == "counter";
    let split = |counter: bool| -> Vec<Example> {
        scenario
            .iter()
            .map(|(name, ops, _)| {
                let ops: Vec<Op> = ops
                    .iter()
                    .filter(|o| is_counter(o) == counter)
                    .cloned()
                    .collect();
                ops_example(name, &ops)
            })
            .collect()
    };
    let header =
        "Work rows (work table; PartitionKey `<scan id>-<shard:02>`, RowKey = work id): the\n\
                  operations on them of each transaction in the life of one scan's work (the same\n\
                  transactions' counter rows are in counter-rows.txt). Clock stamps fixed.";
    let golden_rows = check_examples("work-rows.txt", header, &split(false));
    let header = "Counter rows (RowKey `counter`, one per shard partition that has work): the\n\
                  operations on them of the transactions in work-rows.txt, example by example.";
    let golden_counters = check_examples("counter-rows.txt", header, &split(true));

    // Read back, transaction by transaction: the rows as stored after it, written by the test's
    // own client, read by today's tracker.
    let reader = support::table_store().0;
    let mut ops: Vec<Op> = Vec::new();
    let outcome_json = serde_json::to_string(&outcomes().remove(0).1).unwrap();
    let mut last_table = String::new();
    for ((rows_example, counter_example), (name, _, totals)) in
        golden_rows.iter().zip(&golden_counters).zip(&scenario)
    {
        let touched = ops_of(rows_example);
        ops.extend(touched.iter().cloned());
        ops.extend(ops_of(counter_example));
        let table = stored(&replay(ops.iter()), "GoldenWorkRead").await;
        let read = Tracker::new(&reader, &scans, &table);
        for op in &touched {
            let shard: u32 = op.partition.rsplit('-').next().unwrap().parse().unwrap();
            let state = read.work_state(SCAN, shard, &op.row_key).await.unwrap();
            let row = &replay(ops.iter())[&(op.partition.clone(), op.row_key.clone())];
            match (row["State"].as_str().unwrap(), state) {
                ("pending", Some(WorkState::Pending { .. })) => {}
                ("expanded", Some(WorkState::Expanded { outcome, .. })) => {
                    assert_eq!(outcome, outcome_json, "{name}")
                }
                ("done" | "failed" | "dropped", Some(WorkState::Finished)) => {}
                (s, state) => panic!("{name}: a {s} row read as {state:?}"),
            }
        }
        let read_totals = read.totals(SCAN, SHARDS).await.unwrap();
        assert_eq!(&read_totals, totals, "{name}: totals");
        last_table = table;
    }
    let read = Tracker::new(&reader, &scans, &last_table);
    assert_eq!(
        read.work_results(SCAN, SHARDS, 10).await.unwrap(),
        vec![export_result()]
    );
    assert!(read.is_drained(SCAN, SHARDS).await.unwrap());
}

/// A step that handed rows on (docs/enqueue.md, "Hand-offs"): its outcome recorded (again, or
/// first for a step without children) under the row's ETag, with the items that take the rest
/// as more children, no in-step ranges, what it worked counted, and an empty chunk after it,
/// where reading stops. Read back from the golden bytes (one row's earlier outcome three chunks
/// long, the other row pending), each row reads as its new outcome alone.
#[tokio::test]
async fn handed_off_outcomes_as_stored() {
    let (store, scans, work) = recording_tracker().await;
    let tracker = Tracker::new(&store, &scans, &work);
    let row = root_row(SCAN);
    tracker.create_scan_work(SCAN, SHARDS, &row).await.unwrap();
    let step = ChildSpec::Step(Step::PartitionKeyQuery {
        partition_key: "p9".into(),
        row_key_skip: Some("r999".into()),
        depth: 2,
    });
    let first = WorkOutcome {
        children: vec![step.clone()],
        delta: counters(|c| c.rows_scanned = 1500),
        first_grouped: true,
        in_step: vec![range(("p1", "r1"), ("p8", "r7"))],
        ..WorkOutcome::default()
    };
    let etag = pending_etag(&tracker, &row).await;
    let json = serde_json::to_string(&first).unwrap();
    let recorded = tracker
        .record_outcome(SCAN, row.shard, &row.id, &etag, &json, &[])
        .await
        .unwrap();
    store.take();
    let after = RangeWork::After {
        after: pair("p5", "r0"),
        to: pair("p8", "r7"),
    };
    let handed = WorkOutcome {
        children: vec![step, range_child(&after)],
        delta: counters(|c| {
            c.rows_scanned = 1500;
            c.rows_matched = 700;
            c.rows_written = 700;
            c.messages_written = 700;
        }),
        first_grouped: true,
        ..WorkOutcome::default()
    };
    let handed_json = serde_json::to_string(&handed).unwrap();
    tracker
        .rewrite_outcome(SCAN, row.shard, &row.id, &recorded.etag, &handed_json)
        .await
        .unwrap()
        .expect("the row as recorded");
    let mut examples = vec![ops_example(
        "a step that put 700 of its 1,500 rows hands the rest (after p5/r0) to an item: its \
         outcome recorded again (expanded -> expanded)",
        &store.take(),
    )];
    // A step without children recorded no outcome before its puts: the hand-off records it.
    let leaf = StepMessage {
        scan_id: SCAN.into(),
        step: Step::PartitionKeyQuery {
            partition_key: "q1".into(),
            row_key_skip: None,
            depth: 2,
        },
        shard: None,
    };
    let leaf_row = NewWork {
        id: work_id(&leaf),
        kind: StepMessage::NAME,
        shard: shard_for(&leaf, &work_id(&leaf), SHARDS),
    };
    tracker.register_children(SCAN, &[&leaf_row]).await.unwrap();
    store.take();
    let rest = RangeWork::After {
        after: pair("q1", "r0999"),
        to: pair("q1", "r1999"),
    };
    let leaf_handed = WorkOutcome {
        children: vec![range_child(&rest)],
        delta: counters(|c| {
            c.rows_scanned = 2000;
            c.rows_matched = 1000;
            c.rows_written = 1000;
            c.messages_written = 1000;
        }),
        ..WorkOutcome::default()
    };
    let leaf_json = serde_json::to_string(&leaf_handed).unwrap();
    let etag = pending_etag(&tracker, &leaf_row).await;
    tracker
        .rewrite_outcome(SCAN, leaf_row.shard, &leaf_row.id, &etag, &leaf_json)
        .await
        .unwrap()
        .expect("the row as registered");
    examples.push(ops_example(
        "a step without children (no outcome recorded) that put 1,000 of its 2,000 rows hands \
         the rest to an item: its outcome recorded (pending -> expanded)",
        &store.take(),
    ));
    let header =
        "Hand-offs (work table; PartitionKey `<scan id>-<shard:02>`, RowKey = work id): a\n\
                  step's outcome recorded (again), with the items that take the rows it did not\n\
                  reach; an empty Outcome<n> ends the outcome.";
    let golden = check_examples("work-rows-handed-off.txt", header, &examples);
    // Replayed onto the rows as they were: the first expanded with its first outcome, whose
    // second and third chunks stand for a longer outcome recorded before; the second pending.
    let key_of = |w: &NewWork| (format!("{SCAN}-{:02}", w.shard), w.id.clone());
    let row_json = |w: &NewWork, more: Value| {
        let (pk, rk) = key_of(w);
        let mut row = json!({"PartitionKey": pk, "RowKey": rk});
        row.as_object_mut()
            .unwrap()
            .extend(more.as_object().unwrap().clone());
        row.as_object().unwrap().clone()
    };
    let mut rows = BTreeMap::new();
    let stale = json!({"State": "expanded", "Outcome0": json, "Outcome1": "stale",
        "Outcome2": "stale"});
    rows.insert(key_of(&row), row_json(&row, stale));
    rows.insert(
        key_of(&leaf_row),
        row_json(&leaf_row, json!({"State": "pending"})),
    );
    for op in golden.iter().flat_map(ops_of) {
        let merged: serde_json::Map<String, Value> = serde_json::from_str(&op.json).unwrap();
        let key = (op.partition.clone(), op.row_key.clone());
        rows.get_mut(&key).expect("a step's row").extend(merged);
    }
    let table = stored(&rows, "GoldenHandOffRead").await;
    let reader = support::table_store().0;
    let read = Tracker::new(&reader, &scans, &table);
    for (w, want) in [(&row, &handed_json), (&leaf_row, &leaf_json)] {
        match read.work_state(SCAN, w.shard, &w.id).await.unwrap() {
            Some(WorkState::Expanded { outcome, .. }) => assert_eq!(&outcome, want),
            other => panic!("the handed-off row {} read as {other:?}", w.id),
        }
    }
}

/// A phase start's claim row (`phase-<n>` in the phase root's shard partition, docs/
/// architecture.md "Phases"): inserted by the one drained check that starts the phase; read
/// back, a claim as old as the golden one (its clock fixed in the past) is taken over.
#[tokio::test]
async fn phase_claim_rows_as_stored() {
    let (store, scans, work) = recording_tracker().await;
    let tracker = Tracker::new(&store, &scans, &work);
    assert!(tracker.claim_phase_start(SCAN, 3, 1).await.unwrap());
    let claimed = store.take();
    assert!(
        !tracker.claim_phase_start(SCAN, 3, 1).await.unwrap(),
        "a fresh claim is another check's"
    );
    let examples = vec![ops_example(
        "the drained check that starts phase 1 claims it first (insert: one winner)",
        &claimed,
    )];
    let header = "Phase claim rows (work table; PartitionKey `<scan id>-<shard:02>` of the phase\n\
                  root, RowKey `phase-<n>`): which drained check starts phase n; ClaimedAt, an\n\
                  older claim is taken over; ClaimedBy, the claiming attempt's token (a retried\n\
                  insert knows its own claim). Clock stamps and claim tokens fixed.";
    let golden = check_examples("phase-claim-rows.txt", header, &examples);
    let ops: Vec<Op> = golden.iter().flat_map(ops_of).collect();
    let table = stored(&replay(ops.iter()), "GoldenClaimRead").await;
    let reader = support::table_store().0;
    let read = Tracker::new(&reader, &scans, &table);
    assert!(
        read.claim_phase_start(SCAN, 3, 1).await.unwrap(),
        "stale: taken over"
    );
    assert!(!read.claim_phase_start(SCAN, 3, 1).await.unwrap());

    // A claim written before `ClaimedBy` (no token): another attempt's, taken over as well.
    let token = format!(r#","ClaimedBy":"{}""#, harness::FIXED_TOKEN);
    let earlier: Vec<Op> = ops
        .iter()
        .map(|op| Op {
            json: op.json.replace(&token, ""),
            ..op.clone()
        })
        .collect();
    assert!(earlier.iter().all(|op| !op.json.contains("ClaimedBy")));
    let table = stored(&replay(earlier.iter()), "GoldenClaimEarlier").await;
    let read = Tracker::new(&reader, &scans, &table);
    assert!(read.claim_phase_start(SCAN, 3, 1).await.unwrap());
    assert!(!read.claim_phase_start(SCAN, 3, 1).await.unwrap());
}

// ---------------------------------------------------------------------------------------------
// Marks on a scan's record and work rows: last delivery, completion lease, kept summary

/// The life of one scan's record and root row through the marks later versions added: each
/// step a committed transaction (example name, its operations).
async fn marks_scenario(
    store: &Recorder<tablescan::storage::azure_table::AzureTableStore>,
    tracker: &Tracker<'_, Recorder<tablescan::storage::azure_table::AzureTableStore>>,
    id: &str,
) -> Vec<(&'static str, Vec<Op>)> {
    let mut out = Vec::new();
    let (_, mut record, _) = scan_records().remove(0);
    record.id = id.to_string();
    record.context = record.context.map(|c| ScanContext {
        scan_id: id.to_string(),
        ..c
    });
    tracker.insert_scan(&record).await.unwrap();
    out.push(("scan started: its record", store.take()));
    let root_row = root_row(id);
    tracker
        .create_scan_work(id, SHARDS, &root_row)
        .await
        .unwrap();
    out.push(("its root's row and counter", store.take()));
    let Some(WorkState::Pending { etag }) = tracker
        .work_state(id, root_row.shard, &root_row.id)
        .await
        .unwrap()
    else {
        panic!("the root is pending");
    };
    let etag = tracker
        .mark_last_delivery(id, root_row.shard, &root_row.id, &etag)
        .await
        .unwrap()
        .expect("marked");
    out.push((
        "the root's last delivery marks its row (LastDelivery, If-Match)",
        store.take(),
    ));
    tracker
        .start_round(
            id,
            root_row.shard,
            &root_row.id,
            &etag,
            (1, "0f6e3c1a-poison"),
        )
        .await
        .unwrap()
        .expect("round started");
    out.push((
        "the poison function re-queues it: round 1 starts (LastDelivery false, Requeues, RequeuedBy, If-Match)",
        store.take(),
    ));
    assert!(tracker.take_completion_lease(id).await.unwrap());
    out.push((
        "a completion step takes the lease on the record (CompletionLeaseUntil, If-Match)",
        store.take(),
    ));
    assert!(tracker
        .finish_scan(id, ScanState::Completed, None)
        .await
        .unwrap());
    out.push(("the scan ends (completed)", store.take()));
    let kept = tracker.get_kept(id).await.unwrap().expect("kept");
    tracker.keep_final_counters(&kept).await.unwrap();
    out.push((
        "its cleanup keeps its final counters on the record (FinalCounters, If-Match)",
        store.take(),
    ));
    // Its deletes of the work rows carry no entity (nothing to keep a golden copy of); the
    // read-back keeps the rows, and checks the record's marks.
    assert!(tracker.remove_some_work(id, SHARDS).await.unwrap());
    store.take();
    tracker.mark_work_removed(id).await.unwrap();
    out.push((
        "its cleanup notes the work rows gone (WorkRemovedAt)",
        store.take(),
    ));
    out
}

#[tokio::test]
async fn record_and_work_row_marks_as_stored() {
    let (store, scans, work) = recording_tracker().await;
    let tracker = Tracker::new(&store, &scans, &work);
    let id = format!("{}m0", &SCAN[..SCAN.len() - 2]);
    let scenario = marks_scenario(&store, &tracker, &id).await;
    let examples: Vec<Example> = scenario
        .iter()
        .flat_map(|(name, ops)| {
            // One example per partition a step wrote (a transaction is one partition).
            let mut by_partition: BTreeMap<&str, Vec<Op>> = BTreeMap::new();
            for op in ops {
                by_partition
                    .entry(op.partition.as_str())
                    .or_default()
                    .push(op.clone());
            }
            by_partition
                .into_values()
                .map(|ops| ops_example(name, &ops))
                .collect::<Vec<_>>()
        })
        .collect();
    let header = "Marks on a scan's record (scans table) and work rows (work table): a work row's\n\
                  `LastDelivery`, `Requeues` and `RequeuedBy`, the record's `CompletionLeaseUntil`\n\
                  and `CompletionLeaseBy`, and the summary its cleanup keeps (`FinalCounters`,\n\
                  `WorkRemovedAt`; docs/retention.md), in the life of one scan, each\n\
                  transaction's operations as sent. Clock stamps and claim tokens fixed.";
    let golden = check_examples("record-marks.txt", header, &examples);

    // Read back after each transaction: the rows as stored, written by the test's own client
    // (the record's partition is the scan id, work rows' `<scan id>-<shard>`), read by today's
    // tracker.
    let reader = support::table_store().0;
    let mut ops: Vec<Op> = Vec::new();
    for g in &golden {
        ops.extend(ops_of(g));
        let rows = replay(ops.iter());
        let (records, work_rows): (BTreeMap<_, _>, BTreeMap<_, _>) = rows
            .into_iter()
            .partition(|((partition, _), _)| partition == &id);
        let scans_table = stored(&records, "GoldenMarkScans").await;
        let work_table = stored(&work_rows, "GoldenMarkWork").await;
        let read = Tracker::new(&reader, &scans_table, &work_table);
        let kept = read.get_kept(&id).await.unwrap().expect("record");
        let marks = |name: &str| ops.iter().any(|o| o.json.contains(name));
        let lease = marks("CompletionLeaseUntil").then(harness::fixed_now);
        assert_eq!(kept.lease, lease, "{}", g.name);
        assert_eq!(
            read.get_scan_and_lease(&id).await.unwrap().unwrap().1,
            lease
        );
        let removed = marks("WorkRemovedAt").then(harness::fixed_now);
        assert_eq!(kept.work_removed_at, removed, "{}", g.name);
        if marks("FinalCounters") {
            let expected = counters(|c| c.created = 1);
            assert_eq!(kept.final_counters, Some(expected), "{}", g.name);
            // A kept summary is what a status read reports, the work rows gone.
            assert_eq!(
                read.keep_final_counters(&kept).await.unwrap(),
                expected,
                "{}",
                g.name
            );
        } else {
            assert_eq!(kept.final_counters, None, "{}", g.name);
        }
        for ((partition, row_key), row) in &work_rows {
            if row_key == "counter" {
                continue;
            }
            let shard: u32 = partition.rsplit('-').next().unwrap().parse().unwrap();
            let (_, marks) = read
                .work_state_rounds(&id, shard, row_key)
                .await
                .unwrap()
                .expect("row");
            let marked = row.get("LastDelivery") == Some(&json!(true));
            assert_eq!(marks.marked, marked, "{}", g.name);
            let requeues = row.get("Requeues").and_then(Value::as_u64).unwrap_or(0);
            assert_eq!(u64::from(marks.rounds), requeues, "{}", g.name);
            let by = row.get("RequeuedBy").and_then(Value::as_str);
            assert_eq!(marks.requeued_by.as_deref(), by, "{}", g.name);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// What the app writes through its handlers: the cleanup message, the export prefix reservation

type InProcess =
    std::sync::Arc<tablescan::app::state::AppState<tablescan::storage::stores::AzureStores>>;

/// The app in-process on the shared Azurite (tables, queues and blobs of its own account), with
/// its own queues and tables.
fn in_process_app() -> InProcess {
    use tablescan::storage::request_counts::RequestCounters;
    let names = [
        support::unique_name("ps"),
        support::unique_name("tc"),
        support::unique_name("GoldenScans"),
        support::unique_name("GoldenWork"),
    ];
    let connection = support::azurite().connection_string();
    let settings: BTreeMap<&str, &str> = BTreeMap::from([
        ("AzureWebJobsStorage", connection.as_str()),
        ("TABLESCAN_PREFIXSCAN_QUEUE", names[0].as_str()),
        ("TABLESCAN_TABLECOPY_QUEUE", names[1].as_str()),
        ("TABLESCAN_SCANS_TABLE", names[2].as_str()),
        ("TABLESCAN_WORK_TABLE", names[3].as_str()),
    ]);
    let config =
        tablescan::app::config::Config::from_lookup(|k| settings.get(k).map(|v| v.to_string()))
            .unwrap();
    let counters = std::sync::Arc::new(RequestCounters::new());
    let own = "AzureWebJobsStorage".to_string();
    let account = support::account();
    tablescan::app::state::AppState::with_connections(
        config,
        BTreeMap::from([(own.clone(), account.table_store(counters.clone()))]),
        BTreeMap::from([(own.clone(), account.queue_store(counters))]),
        BTreeMap::from([(own, Ok(support::backup::blobs()))]),
        tablescan::app::drivers::registry(),
    )
}

/// Delivers one queue message (its text as the host decodes it) to `function`, as the host
/// would; returns the status and the invocation's log lines.
async fn deliver(app: &InProcess, function: &str, decoded: &str) -> (u16, String) {
    let payload = json!({
        "Data": { "message": serde_json::to_string(decoded).unwrap() },
        "Metadata": {
            "DequeueCount": "1",
            "Id": "\"m\"",
            "PopReceipt": "\"pop\"",
            "InsertionTime": "2026-01-02T03:09:10+00:00",
            "sys": { "MethodName": function, "UtcNow": "2026-01-02T03:09:10Z",
                     "RandGuid": "00000000-0000-0000-0000-000000000000" }
        }
    });
    let (status, reply) =
        support::router::call(app, "POST", &format!("/{function}"), Some(payload)).await;
    (status.as_u16(), reply["Logs"].to_string())
}

#[tokio::test]
async fn scan_cleanup_messages() {
    let app = in_process_app();
    let queue = app.config.cleanup_queue.clone();
    app.queue_cleanup(SCAN, Duration::ZERO).await.unwrap();
    let queued = app
        .queues
        .get_messages(&queue, 32, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(queued.len(), 1, "one cleanup message");
    let text = queued[0].text.clone();
    let json = String::from_utf8(MessageEncoding::Base64.decode(&text).unwrap()).unwrap();
    let examples = [Example::new("the cleanup of a scan")
        .line("queue", text)
        .line("json", json)];
    let header =
        "Queue messages of the ScanCleanup function (queue `<scan step queue>-cleanup`): the\n\
                  scan whose retention to apply (docs/retention.md). queue: the message text as\n\
                  queued (base64); json: the message inside it.";
    let golden = check_examples("messages-scan-cleanup.txt", header, &examples);

    // Read back: the golden message, delivered as the host would, is read as naming its scan
    // (which has no record here: nothing to clean).
    let g = &golden[0];
    let decoded = MessageEncoding::Base64.decode(g.get("queue")).unwrap();
    assert_eq!(decoded, g.get("json").as_bytes());
    let named: Value = serde_json::from_str(g.get("json")).unwrap();
    assert_eq!(named, json!({"scan": SCAN}), "the message names its scan");
    app.queues
        .delete_message(&queue, &queued[0].id, &queued[0].pop_receipt)
        .await
        .unwrap();
    let (status, logs) = deliver(&app, "ScanCleanup", g.get("json")).await;
    assert_eq!(status, 200, "{logs}");
    assert!(
        logs.contains(&format!("scan {SCAN} has no record")),
        "{logs}"
    );
}

/// The reservation's `reservedAt`, checked to be RFC 3339 in UTC, replaced by the fixed time,
/// and its `scanId` (a fresh scan id) by `SCAN`, in the bytes as written.
fn fix_reservation(bytes: &[u8], scan_id: &str) -> Vec<u8> {
    let value: Value = serde_json::from_slice(bytes).unwrap();
    let at = value["reservedAt"].as_str().unwrap();
    let parsed = OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|e| panic!("reservedAt {at:?}: {e}"));
    assert_eq!(parsed.offset(), time::UtcOffset::UTC, "{at}");
    assert_eq!(value["scanId"], scan_id);
    let fixed = harness::fixed_now()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    let quoted = |s: &str| serde_json::to_string(s).unwrap();
    assert_eq!(text.matches(&quoted(at)).count(), 1);
    assert_eq!(text.matches(&quoted(scan_id)).count(), 1);
    text.replace(&quoted(at), &quoted(&fixed))
        .replace(&quoted(scan_id), &quoted(SCAN))
        .into_bytes()
}

#[tokio::test]
async fn export_reservation() {
    use tablescan::storage::blob::BlobStore;
    let app = in_process_app();
    let source = support::unique_name("GoldenSource");
    let raw = RawClient::azurite();
    raw.create_table(&source).await.unwrap();
    raw.insert(&source, r#"{"PartitionKey":"p","RowKey":"r"}"#)
        .await
        .unwrap();
    let container = support::unique_name("golden");
    let body = |prefix: &str| {
        json!({"driver": "export", "sourceTable": source, "destinationContainer": container,
               "destinationPrefix": prefix})
    };
    let (status, reply) =
        support::router::call(&app, "POST", "/api/scans", Some(body("nightly"))).await;
    assert_eq!(status.as_u16(), 202, "{reply}");
    let id = reply["id"].as_str().unwrap().to_string();
    let blobs = support::backup::blobs();
    let written = support::backup::download(&blobs, &container, "nightly/reservation.json")
        .await
        .expect("the start reserved the prefix");
    check("export-reservation.json", &fix_reservation(&written, &id));

    // Read back by today's start: a prefix reserved by the golden reservation (a scan that was
    // never recorded and can no longer be, as its id is old) is taken over by a new export; an
    // unreadable one is refused naming the field.
    let golden = harness::read("export-reservation.json");
    let write = tablescan::storage::blob::BlobWrite::new("application/json");
    for (prefix, bytes) in [("old", golden.clone()), ("bad", b"{}".to_vec())] {
        let name = format!("{prefix}/reservation.json");
        blobs
            .upload(&container, &name, bytes.into(), &write)
            .await
            .unwrap();
    }
    let (status, reply) =
        support::router::call(&app, "POST", "/api/scans", Some(body("old"))).await;
    assert_eq!(status.as_u16(), 202, "{reply}");
    let taker = reply["id"].as_str().unwrap();
    let now = support::backup::download(&blobs, &container, "old/reservation.json")
        .await
        .unwrap();
    let now: Value = serde_json::from_slice(&now).unwrap();
    assert_eq!(now["scanId"], taker, "taken over");
    let (status, reply) =
        support::router::call(&app, "POST", "/api/scans", Some(body("bad"))).await;
    assert_eq!(status.as_u16(), 400, "{reply}");
    assert!(reply.to_string().contains("destinationPrefix"), "{reply}");
}

// ---------------------------------------------------------------------------------------------
// The export format

/// Rows as the Table service returns them: every EDM type, a double with no fraction marker
/// left to annotate, strings that need escapes, a lone surrogate.
fn export_rows() -> Vec<Vec<Entity>> {
    let lines = [
        r#"{"PartitionKey":"p1","RowKey":"r1","Big":"9223372036854775807","Big@odata.type":"Edm.Int64","Bin":"AQID","Bin@odata.type":"Edm.Binary","Count":42,"Flag":true,"Id":"c2a1f7de-2f4e-4f5b-9d7e-0a1b2c3d4e5f","Id@odata.type":"Edm.Guid","Name":"a\ud83d\ude00b \"q\" \u2028","Score":0.1,"When":"2026-01-02T03:04:05.1234567Z","When@odata.type":"Edm.DateTime"}"#,
        r#"{"PartitionKey":"p1","RowKey":"r2","Lone":"\ud800","Nan":"NaN","Nan@odata.type":"Edm.Double","Whole":3.0,"Whole@odata.type":"Edm.Double","Tiny":5e-324}"#,
        r#"{"PartitionKey":"it's","RowKey":"","Empty":""}"#,
    ];
    let entity = |line: &str| match serde_json::from_str(line).unwrap() {
        tablescan::storage::ServiceEntity::Entity(e) => e,
        other => panic!("{other:?}"),
    };
    vec![
        vec![entity(lines[0]), entity(lines[1])],
        vec![entity(lines[2])],
    ]
}

/// The work ids of the export's two items (as `messages-table-copy.txt` would show them).
fn export_item_ids() -> Vec<String> {
    [
        range(("p1", "r1"), ("p1", "r2")),
        range(("it's", ""), ("it's", "")),
    ]
    .iter()
    .map(|w| work_id(&item(Typed::Range(w.clone()), None).0))
    .collect()
}

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(bytes)
        .read_to_end(&mut out)
        .unwrap();
    out
}

#[test]
fn export_parts_and_manifest() {
    let mut parts = Vec::new();
    let mut expected = BTreeMap::new();
    for (i, (rows, id)) in export_rows().into_iter().zip(export_item_ids()).enumerate() {
        let encoded = encode_part(&rows).unwrap();
        let (lines, blob) = (
            format!("export-part-{}.jsonl", i + 1),
            format!("export-part-{}.jsonl.gz", i + 1),
        );
        // The lines are the format, byte for byte. The gzip bytes around them may change with
        // the compressor, so the blob is kept as written once: a file a new version must read.
        check(&lines, &gunzip(&encoded.bytes));
        let golden_blob = harness::kept(&blob, &encoded.bytes);
        assert_eq!(
            gunzip(&golden_blob),
            harness::read(&lines),
            "{blob} holds {lines}"
        );
        let name = part_name(SCAN, &id).unwrap();
        expected.insert(name.clone(), (blob, rows));
        parts.push(ManifestPart {
            name,
            rows: encoded.rows,
            bytes: golden_blob.len() as u64,
            sha256: sha256_hex(&golden_blob),
        });
    }
    let manifest = Manifest::new(
        "Packages",
        SCAN,
        parts,
        started_at(),
        datetime!(2026-01-02 03:09:10 UTC),
    );
    check("export-manifest.json", &manifest.to_json());

    // Read back: the manifest, and each part it lists, with today's decoder.
    let read = Manifest::parse(&harness::read("export-manifest.json")).unwrap();
    assert_eq!(read, manifest);
    assert_eq!(read.parts.len(), expected.len());
    for part in &read.parts {
        let (blob, rows) = &expected[&part.name];
        let bytes = harness::read(blob);
        let decoded =
            decode_part(&bytes, part.rows, &part.sha256, &DecodeLimits::default()).unwrap();
        assert_eq!(&decoded, rows, "{blob}");
    }
}

#[test]
fn export_names() {
    let id = &export_item_ids()[0];
    let examples: Vec<Example> = ["", "nightly/2026-01-02", "a/"]
        .iter()
        .map(|prefix| {
            let layout = ExportLayout::new(prefix).unwrap();
            let part = part_name(SCAN, id).unwrap();
            Example::new(format!("prefix {prefix:?}"))
                .line("manifest blob", layout.manifest_blob())
                .line("part name (as listed)", part.clone())
                .line("part blob", layout.blob(&part))
        })
        .collect();
    let header = "Export blob names: `<prefix>manifest.json` and `<prefix>parts/<scan id>/<work item\n\
                  id>.jsonl.gz` (docs/export-format.md); the manifest lists parts relative to the prefix.";
    let golden = check_examples("export-names.txt", header, &examples);
    for g in &golden {
        let part = g.get("part name (as listed)");
        let (scan, rest) = part
            .strip_prefix("parts/")
            .and_then(|p| p.split_once('/'))
            .unwrap();
        let item = rest.strip_suffix(".jsonl.gz").unwrap();
        assert_eq!(part_name(scan, item).unwrap(), part);
        let prefix = g
            .get("manifest blob")
            .strip_suffix("manifest.json")
            .unwrap();
        let layout = ExportLayout::new(prefix).unwrap();
        assert_eq!(layout.blob(part), g.get("part blob"));
    }
}

// ---------------------------------------------------------------------------------------------
// The secondary index's files (docs/index-format.md)

/// The values of the index examples: every EDM type, tricky ones included, as filter literals.
const INDEX_LITERALS: [&str; 16] = [
    "'alice'",
    "''",
    "'it''s 日本 🎉'",
    "42",
    "42L",
    "-9223372036854775808L",
    "3.0",
    "-0.0",
    "2.5E-3",
    "true",
    "datetime'2024-01-01T00:00:00Z'",
    "datetime'1601-01-01T00:00:00.0000001Z'",
    "guid'c56a4180-65aa-42ec-a945-5fd21dec0538'",
    "X'000AFF'",
    "X''",
    "false",
];

fn index_ranges() -> Vec<tablescan::index::StagedRange> {
    use tablescan::index::{IndexValue, KeyBounds, StagedRange};
    let values: Vec<IndexValue> = INDEX_LITERALS
        .iter()
        .map(|l| IndexValue::from_literal(l).unwrap())
        .collect();
    vec![
        StagedRange::from_values(KeyBounds::new(("p1", "a"), ("p1", "z")), &values[..6]),
        StagedRange::from_values(KeyBounds::new(("p2", ""), ("p3", "r'9")), &values[4..]),
        StagedRange::new(KeyBounds::new(("q", "1"), ("q", "1")), 0, vec![]),
        StagedRange::from_values(
            KeyBounds::new(("\u{1F600}", "é"), ("\u{1F600}", "ü")),
            &values,
        ),
    ]
}

/// Values as the index keys them: canonical bytes, hash, fingerprint, and buckets among 1,000
/// (test vectors for another reader of the format).
#[test]
fn index_values() {
    use tablescan::index::hash::Placement;
    use tablescan::index::IndexValue;
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let examples: Vec<Example> = INDEX_LITERALS
        .iter()
        .map(|literal| {
            let value = IndexValue::from_literal(literal).unwrap();
            let hash = value.index_hash();
            let p = Placement::of(hash, 1000);
            Example::new(*literal)
                .line("type", value.edm_name())
                .line("canonical bytes", hex(&value.canonical_bytes()))
                .line("hash", format!("{hash:016x}"))
                .line("fingerprint", p.fingerprint.to_string())
                .line("buckets of 1000", format!("{} {}", p.bucket1, p.bucket2))
        })
        .collect();
    let header = "Index values (docs/index-format.md): each literal's type, canonical bytes (hex), hash\n\
                  (XXH3-64, seed 0, of the canonical bytes), fingerprint and two buckets when B = 1000.";
    let golden = check_examples("index-values.txt", header, &examples);
    for g in &golden {
        let value = IndexValue::from_literal(&g.name).unwrap();
        assert_eq!(hex(&value.canonical_bytes()), g.get("canonical bytes"));
        let hash = u64::from_str_radix(g.get("hash"), 16).unwrap();
        assert_eq!(value.index_hash(), hash, "{}", g.name);
        let p = Placement::of(hash, 1000);
        assert_eq!(p.fingerprint.to_string(), g.get("fingerprint"));
    }
}

/// A staging record and the segment built from it: exact bytes, and read back, every staged
/// value a candidate of its ranges.
#[test]
fn index_staging_record_and_segment() {
    use tablescan::index::{build_segment, decode_staging, encode_staging, SEGMENT_VERSION};
    let ranges = index_ranges();
    check("index-staging.bin", &encode_staging(&ranges).unwrap());
    check("index-segment.bin", &build_segment(&ranges).unwrap());

    let staged = decode_staging(&harness::read("index-staging.bin")).unwrap();
    assert_eq!(staged, ranges);
    check_index_segment("index-segment.bin", SEGMENT_VERSION, &ranges);
}

/// The segment as version 1 wrote it (no body row checksums; docs/compatibility.md): still read,
/// every staged value a candidate of its ranges.
#[test]
fn index_segment_of_version_1_is_still_read() {
    check_index_segment(
        "index-segment-v1.bin",
        tablescan::index::SEGMENT_VERSION_1,
        &index_ranges(),
    );
}

/// The pointer (with what its build indexed, and as earlier versions wrote it) and a
/// manifest, as a build publishes them: exact bytes, and read back through the lookup's checks.
#[test]
fn index_pointer_and_manifest() {
    use tablescan::app::index_files::{
        check_manifest, check_pointer, IndexManifest, Indexed, Pointer, Superseded,
        MANIFEST_FORMAT, POINTER_FORMAT,
    };
    let build = "8204684855781-5306e88b";
    let at = |s: &str| {
        time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).unwrap()
    };
    let indexed = Indexed {
        property: "Owner".into(),
        source_table: "Packages".into(),
        source_connection: "AzureWebJobsStorage".into(),
    };
    let pointer = |indexed: Option<Indexed>| Pointer {
        format: POINTER_FORMAT.into(),
        build: build.into(),
        manifest: format!("builds/{build}/manifest.json"),
        switched_at: at("2026-11-26T20:01:02.345Z"),
        superseded: vec![Superseded {
            build: "8204684899999-0a1b2c3d".into(),
            at: at("2026-11-26T20:01:02.345Z"),
        }],
        indexed,
    };
    let manifest = IndexManifest {
        format: MANIFEST_FORMAT.into(),
        scan_id: build.into(),
        property: indexed.property.clone(),
        source_table: indexed.source_table.clone(),
        source_connection: indexed.source_connection.clone(),
        rows: 35_000_000,
        ranges: 17_500,
        segments: vec![SegmentEntry {
            name: format!("builds/{build}/segments/0a1b2c3d4e5f60718293a4b5c6d7e8f9.seg"),
            ranges: 1500,
            rows: 3_000_000,
            bytes: 7_340_032,
        }],
        started_at: at("2026-11-26T19:40:00Z"),
        built_at: at("2026-11-26T20:01:02Z"),
    };
    check(
        "index-pointer.json",
        &serde_json::to_vec(&pointer(Some(indexed.clone()))).unwrap(),
    );
    check(
        "index-pointer-earlier.json",
        &serde_json::to_vec(&pointer(None)).unwrap(),
    );
    check(
        "index-manifest.json",
        &serde_json::to_vec(&manifest).unwrap(),
    );
    for (name, recorded) in [
        ("index-pointer.json", Some(indexed.clone())),
        ("index-pointer-earlier.json", None),
    ] {
        let read: Pointer = serde_json::from_slice(&harness::read(name)).unwrap();
        check_pointer(&read).unwrap();
        assert_eq!(read.indexed, recorded, "{name}");
        assert_eq!(read.superseded.len(), 1);
    }
    let read: IndexManifest =
        serde_json::from_slice(&harness::read("index-manifest.json")).unwrap();
    check_manifest(&read, build).unwrap();
    assert_eq!(read.indexed(), indexed);
    assert_eq!(read.segments, manifest.segments);
}

/// Reads a golden segment as a lookup does (its header, its directory, two body rows per value)
/// and checks every staged value is a candidate of the ranges holding it.
fn check_index_segment(name: &str, version: u16, ranges: &[tablescan::index::StagedRange]) {
    use tablescan::index::{IndexValue, SegmentDirectory, SegmentHeader, DIRECTORY_FIXED_LEN};
    let segment = harness::read(name);
    let header = SegmentHeader::parse(&segment[..DIRECTORY_FIXED_LEN]).unwrap();
    assert_eq!(header.version, version, "{name}");
    let len = header.directory_len as usize;
    let directory = SegmentDirectory::parse(&segment[..len]).unwrap();
    assert_eq!(directory.segment_len(), segment.len() as u64);
    assert_eq!(directory.range_count(), ranges.len());
    for literal in INDEX_LITERALS {
        let value = IndexValue::from_literal(literal).unwrap();
        let [(o1, l1), (o2, l2)] = directory.bucket_spans(&value);
        let span = |o: u64, l: u64| &segment[o as usize..(o + l) as usize];
        let found = directory
            .candidates(&value, span(o1, l1), span(o2, l2))
            .unwrap();
        for (i, range) in ranges.iter().enumerate() {
            assert_eq!(directory.range(i).keys, range.keys);
            if range.hashes.contains(&value.index_hash()) {
                assert!(found.contains(&i), "{name}: {literal} in range {i}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The enqueue driver's messages (docs/enqueue.md) and its recorded settings

/// Rows as a scan reads them: typed properties in the service's JSON, and one too big for a
/// message of its own.
fn enqueue_rows() -> Vec<Entity> {
    let entity = |pk: &str, rk: &str, json: Value| {
        let mut e = Entity::new(pk, rk);
        for (name, value) in json.as_object().unwrap() {
            e.properties.insert(name.clone(), value.clone());
        }
        e
    };
    vec![
        entity(
            "Newtonsoft.Json",
            "13.0.3",
            json!({"Downloads": "5200000000", "Downloads@odata.type": "Edm.Int64",
                   "Listed": true, "Published": "2023-03-08T07:42:54.1234567Z",
                   "Published@odata.type": "Edm.DateTime", "Rating": 4.5,
                   "Rating@odata.type": "Edm.Double", "Title": "Newtonsoft.Json 13.0.3",
                   "Hash": "AAECAwQ=", "Hash@odata.type": "Edm.Binary",
                   "Id": "c9a646d3-9c61-4cb7-bfcd-ee2522c8f633", "Id@odata.type": "Edm.Guid",
                   "Versions": 42}),
        ),
        entity("Z\u{FFFF}", "max", json!({"Note": "a\u{FFFF}b"})),
        entity("Huge.Row", "1", json!({"Text": "x".repeat(60_000)})),
    ]
}

fn enqueue_target(rows_per_message: u32, encoding: MessageEncoding) -> EnqueueTarget {
    EnqueueTarget {
        connection: "AzureWebJobsStorage".into(),
        queue: "packages-to-process".into(),
        rows_per_message,
        encoding,
    }
}

#[test]
fn enqueue_messages() {
    let rows = enqueue_rows();
    let mut examples = Vec::new();
    for (name, target) in [
        (
            "base64, rowsPerMessage 32",
            enqueue_target(32, MessageEncoding::Base64),
        ),
        (
            "none, rowsPerMessage 2",
            enqueue_target(2, MessageEncoding::None),
        ),
    ] {
        let texts = pack(SCAN, &rows, &target).unwrap();
        let mut example = Example::new(name);
        for (i, text) in texts.iter().enumerate() {
            if text.len() > 2_000 {
                // 60,000 bytes of one row without base64: kept by its size and digest only.
                example = example
                    .line(format!("message {i} bytes"), text.len().to_string())
                    .line(format!("message {i} sha256"), sha256_hex(text.as_bytes()));
                continue;
            }
            example = example.line(format!("message {i}"), text.clone());
            if target.encoding == MessageEncoding::Base64 {
                let json = MessageEncoding::Base64.decode(text).unwrap();
                example = example.line(
                    format!("message {i} decoded"),
                    String::from_utf8(json).unwrap(),
                );
            }
        }
        examples.push(example);
    }
    let settings = serde_json::to_string(&enqueue_target(32, MessageEncoding::Base64)).unwrap();
    examples.push(Example::new("recorded settings (the scan context's o)").line("o", settings));
    let header = "Messages the enqueue driver puts on its destination queue (docs/enqueue.md): the text\n\
                  as put (base64 of the JSON, or the JSON itself), and an enqueue scan's recorded settings.";
    let golden = check_examples("enqueue-message.txt", header, &examples);
    // Read back as a consumer would: base64 decoded, JSON parsed, every row accounted for.
    let first = &golden[0];
    let json = MessageEncoding::Base64
        .decode(first.get("message 0"))
        .unwrap();
    let message: Value = serde_json::from_slice(&json).unwrap();
    assert_eq!(message["scanId"], SCAN);
    let rows_read = message["rows"].as_array().unwrap();
    assert_eq!(rows_read.len(), 3);
    assert_eq!(rows_read[0]["Downloads@odata.type"], "Edm.Int64");
    assert_eq!(rows_read[1]["Note"], "a\u{FFFF}b");
    assert_eq!(
        rows_read[2],
        json!({"PartitionKey": "Huge.Row", "RowKey": "1", "@tablescan.tooLarge": true})
    );
    let none: Value = serde_json::from_str(golden[1].get("message 0")).unwrap();
    assert_eq!(none["rows"][1]["PartitionKey"], "Z\u{FFFF}");
    let target: EnqueueTarget = serde_json::from_str(golden[2].get("o")).unwrap();
    assert_eq!(target, enqueue_target(32, MessageEncoding::Base64));
}

// ---------------------------------------------------------------------------------------------
// A rate-limited scan's schedule row (docs/rate-limit.md)

#[tokio::test]
async fn pace_rows_as_stored() {
    use tablescan::app::pace::lease::{Schedule, TableSchedule};
    let work = support::unique_name("GoldenPace");
    let schedule = TableSchedule::new(Recorder::new(support::table_store().0), work.clone(), SCAN);
    schedule.store.inner.create_table(&work).await.unwrap();
    // 2027-01-01T00:00:00Z in microseconds; each lease takes 50 ms of the schedule, a solo
    // lease 1 s.
    let t0 = 1_798_761_600_000_000_i64;
    let (span, solo) = (50_000, 1_000_000);
    let first = schedule.grant(t0, span, solo).await.unwrap();
    assert_eq!((first.start, first.span_us, first.requests), (t0, span, 2));
    let inserted = schedule.store.take();
    let second = schedule.grant(t0 + 10_000, span, solo).await.unwrap();
    assert_eq!(second.start, t0 + 50_000, "the schedule was ahead of now");
    assert_eq!((second.span_us, second.requests), (span, 2));
    let replaced = schedule.store.take();
    // The row was as this instance wrote it, and its chunk ended unused: a solo chunk, from
    // now, written without a read.
    let third = schedule.grant(t0 + 200_000, span, solo).await.unwrap();
    assert_eq!(
        (third.start, third.span_us, third.requests),
        (t0 + 200_000, solo, 1)
    );
    let alone = schedule.store.take();
    let examples = vec![
        ops_example(
            "a scan's first lease inserts its pace row: NextFreeAt = now + the chunk's span",
            &inserted,
        ),
        ops_example(
            "a later lease replaces it under the ETag it read: NextFreeAt = max(NextFreeAt, now) + span",
            &replaced,
        ),
        ops_example(
            "an instance leasing alone whose chunk ended replaces it under the ETag it wrote: NextFreeAt = now + the solo span",
            &alone,
        ),
    ];
    let header =
        "Pace rows (work table; PartitionKey `<scan id>-00`, RowKey `pace`): a rate-limited\n\
                  scan's shared schedule, NextFreeAt in microseconds since the Unix epoch as a\n\
                  string (docs/rate-limit.md).";
    let golden = check_examples("pace-rows.txt", header, &examples);
    // Read back: the rows as stored, written by the test's own client, leased by today's code.
    let ops: Vec<Op> = golden.iter().flat_map(ops_of).collect();
    let table = stored(&replay(ops.iter()), "GoldenPaceRead").await;
    let read = TableSchedule::new(support::table_store().0, table, SCAN);
    let fourth = read.grant(t0, span, solo).await.unwrap();
    assert_eq!((fourth.start, fourth.span_us), (t0 + 1_200_000, span));
}
