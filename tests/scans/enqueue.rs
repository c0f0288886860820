//! The enqueue driver (issue 26), end to end: scans started over HTTP through the local
//! Functions host, executed by the real handler binary on Azurite, their messages read back
//! from the destination queue by the test's own REST client (`support::raw::RawQueueClient`:
//! its own signing, its own XML reading, base64 decoded here, rows sliced with serde_json's
//! `RawValue`) and compared with the source read by the raw table client: every row in at least
//! one message, every property's text byte for byte (doubles by their bits). Then every
//! refusal, and the fault suite's faults (handler kills, duplicated messages, storage faults)
//! during an enqueue: no row missing.

use crate::support;

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value};
use support::e2e::{seed, TestApp};
use support::faults::{
    app_behind, check_kills, duplicating_proxy, proxy, seeded_source, source_entities,
    storage_faults, wait_recorded_end, Killer, Summary, Verdict,
};
use support::raw::{self, RawClient, RawEntity, RawMessage, RawQueueClient};
use support::router::{call, InProcessApp};
use support::{account, unique_name};
use tablescan::lab::dataset;
use tablescan::lab::proxy::{FaultPolicy, Hold};
use tablescan::storage::request_counts::{RequestCounters, RequestKind};
use tablescan::storage::Entity;

/// The marker of a row sent as its keys only (docs/enqueue.md).
const TOO_LARGE: &str = "@tablescan.tooLarge";
/// The queue's limit on a message's text (UTF-8 bytes, as put).
const MAX_TEXT: usize = 64 * 1024;
const SCAN_TIMEOUT: Duration = Duration::from_secs(240);

/// One message read back: its text's length as stored, its scan id and its rows (raw).
struct Message {
    stored_len: usize,
    scan_id: String,
    rows: Vec<RawEntity>,
    expiration_time: String,
}

/// docs/schemas/enqueue-message.schema.json, compiled once.
fn message_schema() -> &'static jsonschema::Validator {
    static SCHEMA: OnceLock<jsonschema::Validator> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/docs/schemas/enqueue-message.schema.json"
        );
        let schema: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        jsonschema::validator_for(&schema).expect("the schema compiles")
    })
}

/// Decodes a message (base64 or not) and slices its rows as raw JSON texts.
fn decode(message: &RawMessage, base64: bool) -> Message {
    let payload = match base64 {
        true => String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(message.text.trim())
                .expect("the message is base64"),
        )
        .expect("the payload is UTF-8"),
        false => message.text.clone(),
    };
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Payload<'a> {
        #[serde(rename = "scanId")]
        scan_id: String,
        #[serde(borrow)]
        rows: &'a serde_json::value::RawValue,
    }
    let value: Value = serde_json::from_str(&payload).expect("the payload is JSON");
    let errors: Vec<String> = message_schema()
        .iter_errors(&value)
        .map(|e| format!("{e} at {}", e.instance_path))
        .collect();
    assert!(
        errors.is_empty(),
        "against the documented schema: {errors:?}"
    );
    let parsed: Payload<'_> = serde_json::from_str(&payload)
        .unwrap_or_else(|e| panic!("message is not the documented JSON ({e}): {payload:.200}"));
    let rows = raw::parse_page(&format!("{{\"value\":{}}}", parsed.rows.get()))
        .expect("rows are entity objects");
    Message {
        stored_len: message.text.len(),
        scan_id: parsed.scan_id,
        rows,
        expiration_time: message.expiration_time.clone(),
    }
}

/// The decoded keys of a row (texts may escape differently; the strings must be equal).
fn key(row: &RawEntity) -> (String, String) {
    (row.partition_key(), row.row_key())
}

/// What one enqueue scan's messages hold against the rows it had to send.
#[derive(Debug, Default)]
struct Delivered {
    messages: usize,
    rows: usize,
    duplicates: usize,
    markers: usize,
    most_rows: usize,
    longest_text: usize,
}

/// Checks messages against `expected` (source rows, projected as the scan asked): every row in
/// at least one message, with exactly the source's property texts (or the marker, when the row
/// is too big for a message alone), no row that is not expected, every text within 64 KiB and
/// never expiring, at most `per_message` rows each. Problems go to `verdict`.
fn check_messages(
    id: &str,
    messages: &[Message],
    expected: &[RawEntity],
    per_message: usize,
    base64: bool,
    verdict: &mut Verdict,
) -> Delivered {
    let mut got = Delivered {
        messages: messages.len(),
        ..Delivered::default()
    };
    let mut seen: BTreeMap<(String, String), usize> = BTreeMap::new();
    let wanted: BTreeMap<(String, String), &RawEntity> =
        expected.iter().map(|e| (key(e), e)).collect();
    for m in messages {
        got.longest_text = got.longest_text.max(m.stored_len);
        got.most_rows = got.most_rows.max(m.rows.len());
        if m.scan_id != id {
            verdict
                .problems
                .push(format!("a message of scan {}", m.scan_id));
        }
        if m.stored_len > MAX_TEXT || m.rows.is_empty() || m.rows.len() > per_message {
            verdict.problems.push(format!(
                "a message of {} bytes and {} rows",
                m.stored_len,
                m.rows.len()
            ));
        }
        if !m.expiration_time.contains("9999") {
            verdict
                .problems
                .push(format!("a message expires at {}", m.expiration_time));
        }
        for row in &m.rows {
            got.rows += 1;
            *seen.entry(key(row)).or_default() += 1;
            let Some(source) = wanted.get(&key(row)) else {
                verdict.mismatches += 1;
                verdict
                    .problems
                    .push(format!("row {:?} not expected", key(row)));
                continue;
            };
            if row.properties.contains_key(TOO_LARGE) {
                got.markers += 1;
                let alone: usize = source.properties.values().map(String::len).sum();
                if row.text(TOO_LARGE) != Some("true")
                    || row.properties.len() != 1
                    || alone < 40_000
                {
                    verdict.mismatches += 1;
                    verdict
                        .problems
                        .push(format!("bad marker row {:?}", row.properties.keys()));
                }
                continue;
            }
            let differences = raw::diff_entity(&as_sent(source, base64), row);
            if !differences.is_empty() {
                verdict.mismatches += 1;
                verdict
                    .problems
                    .push(format!("row {:?} differs: {differences:?}", key(row)));
            }
        }
    }
    for e in expected {
        match seen.get(&key(e)) {
            None => verdict.lost += 1,
            Some(n) => got.duplicates += n - 1,
        }
    }
    if verdict.lost > 0 {
        verdict
            .problems
            .push(format!("{} rows in no message", verdict.lost));
    }
    verdict.rows_copied = seen.len();
    got
}

/// `row` as a message carries it (docs/enqueue.md): every Double annotated, also those whose
/// fraction or exponent already says so (which the service leaves unannotated); without base64,
/// U+FFFE and U+FFFF written as JSON escapes (XML cannot carry them).
fn as_sent(row: &RawEntity, base64: bool) -> RawEntity {
    let mut row = row.clone();
    if !base64 {
        for text in row.properties.values_mut() {
            *text = text
                .replace('\u{FFFE}', "\\ufffe")
                .replace('\u{FFFF}', "\\uffff");
        }
    }
    let doubles: Vec<String> = row
        .properties
        .iter()
        .filter(|(name, text)| !name.contains('@') && raw::double_bits(text, None).is_some())
        .map(|(name, _)| format!("{name}@odata.type"))
        .collect();
    for annotation in doubles {
        row.properties
            .entry(annotation)
            .or_insert_with(|| "\"Edm.Double\"".to_string());
    }
    row
}

/// Starts an enqueue scan of `source` to a new queue; returns the scan id and the queue.
async fn start_enqueue(app: &TestApp, source: &str, extra: Value) -> (String, String) {
    let queue = unique_name("rows");
    let mut body = json!({"driver": "enqueue", "sourceTable": source, "destinationQueue": queue});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let (status, reply, _) = app.post_scan(&body).await;
    assert_eq!(status, 202, "POST /api/scans: {reply}");
    (reply["id"].as_str().unwrap().to_string(), queue)
}

/// Runs one enqueue scan to its end and checks its messages against `expected`.
async fn enqueue_and_check(
    app: &TestApp,
    source: &str,
    extra: Value,
    expected: &[RawEntity],
) -> (Value, Delivered, Verdict) {
    let (id, queue) = start_enqueue(app, source, extra.clone()).await;
    let status = app.wait_for_end(&id, SCAN_TIMEOUT).await;
    let base64 = extra["messageEncoding"] != "none";
    let per_message = extra["rowsPerMessage"].as_u64().unwrap_or(1) as usize;
    let read = RawQueueClient::azurite()
        .receive_all(&queue, 4 * expected.len() + 100)
        .await;
    let messages: Vec<Message> = read.iter().map(|m| decode(m, base64)).collect();
    let mut verdict = Verdict::default();
    let delivered = check_messages(&id, &messages, expected, per_message, base64, &mut verdict);
    (status, delivered, verdict)
}

/// A row of `bytes` bytes of string properties (each at most 30,000 characters).
fn big_row(pk: &str, rk: &str, bytes: usize) -> Entity {
    let mut e = Entity::new(pk, rk);
    for (i, start) in (0..bytes).step_by(30_000).enumerate() {
        let n = (bytes - start).min(30_000);
        e.properties
            .insert(format!("Text{i}"), json!("é".repeat(n / 2)));
    }
    e
}

/// Rows written as JSON text by the raw client: doubles that need all 17 digits, a whole
/// double, an Int64, a Guid and a string with U+FFFF, which XML cannot carry.
fn raw_rows() -> Vec<String> {
    let doubles = support::raw::HARD_DOUBLES;
    doubles
        .iter()
        .enumerate()
        .map(|(i, d)| {
            format!(
                "{{\"PartitionKey\":\"Raw.Values\",\"RowKey\":\"{i}\",\"D\":{d},\"D@odata.type\":\"Edm.Double\",\"N\":\"{i}\",\"N@odata.type\":\"Edm.Int64\",\"G\":\"c9a646d3-9c61-4cb7-bfcd-ee2522c8f63{i}\",\"G@odata.type\":\"Edm.Guid\",\"U\":\"a\\uffffb\"}}"
            )
        })
        .collect()
}

/// The source rows projected as a `select` of `names` answers: keys, those properties (nulls
/// left out) and their annotations.
fn projected(rows: &[RawEntity], names: &[&str]) -> Vec<RawEntity> {
    rows.iter()
        .map(|e| {
            let mut p = e.clone();
            p.properties.retain(|name, _| {
                let base = name.split('@').next().unwrap_or(name);
                names.contains(&base)
            });
            p
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_lands_in_a_message_bit_exact() {
    let app = TestApp::start(1, &[]).await;
    let client = RawClient::azurite();
    let source = unique_name("Source");
    let mut entities = source_entities(300, 5);
    let mut max = dataset::entity("Z\u{FFFF}", 0);
    max.row_key = "max".into();
    entities.push(max);
    // 60,000 bytes: alone it fits 64 KiB unencoded, not 48 KiB of base64 payload; 90,000
    // bytes fits neither.
    entities.push(big_row("Big", "60k", 60_000));
    entities.push(big_row("Big", "90k", 90_000));
    seed(&app.store, &source, entities.clone()).await;
    for body in raw_rows() {
        client.insert(&source, &body).await.expect("raw insert");
    }
    let rows = client.rows(&source).await;
    let n = rows.len();

    // rowsPerMessage 1, base64 (the defaults), in the scan's steps.
    let (status, got, verdict) = enqueue_and_check(&app, &source, json!({}), &rows).await;
    eprintln!("enqueue rowsPerMessage 1 base64: {got:?}, status {status}");
    assert!(verdict.problems.is_empty(), "{:#?}", verdict.problems);
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(status["rowsScanned"], n as i64);
    assert_eq!(status["rowsWritten"], n as i64);
    assert_eq!(status["messagesWritten"], got.messages as i64);
    assert_eq!((got.messages, got.duplicates, got.markers), (n, 0, 2));
    // Paced at the queue's rate when the request names no limit; a named one wins.
    assert_eq!(status["maxRequestsPerSecond"], 2000, "{status}");

    // 32 rows a message, no encoding: cut by size (the 60,000-byte row goes alone, whole).
    let extra = json!({"rowsPerMessage": 32, "messageEncoding": "none",
        "maxRequestsPerSecond": 20000});
    let (status, got, verdict) = enqueue_and_check(&app, &source, extra, &rows).await;
    eprintln!("enqueue rowsPerMessage 32 none: {got:?}");
    assert!(verdict.problems.is_empty(), "{:#?}", verdict.problems);
    assert_eq!(status["maxRequestsPerSecond"], 20000, "{status}");
    assert_eq!(status["rowsWritten"], n as i64);
    assert_eq!(status["messagesWritten"], got.messages as i64);
    assert_eq!((got.duplicates, got.markers, got.most_rows), (0, 1, 32));
    assert!(got.longest_text > 48 * 1024, "{got:?}");
    assert!(got.messages < n / 4, "{got:?}");

    // A filter and a select (work items that re-read their ranges with the filter).
    let filter = "Listed eq true";
    let wanted: Vec<RawEntity> = rows
        .iter()
        .filter(|e| e.text("Listed") == Some("true"))
        .cloned()
        .collect();
    let select = ["Downloads", "Rating", "Published", "Hash", "Missing"];
    let extra = json!({"rowsPerMessage": 32, "filter": filter, "select": select});
    let (status, got, verdict) =
        enqueue_and_check(&app, &source, extra, &projected(&wanted, &select)).await;
    eprintln!("enqueue filter + select: {got:?}");
    assert!(verdict.problems.is_empty(), "{:#?}", verdict.problems);
    assert!(wanted.len() > 50 && wanted.len() < n, "{}", wanted.len());
    assert_eq!(status["rowsScanned"], n as i64);
    assert_eq!(status["rowsMatched"], wanted.len() as i64);
    assert_eq!(status["rowsWritten"], wanted.len() as i64);
    assert_eq!(status["messagesWritten"], got.messages as i64);
    assert_eq!(got.duplicates, 0);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_name_the_field_and_create_nothing() {
    let app = TestApp::start(1, &[]).await;
    let source = unique_name("Source");
    seed(&app.store, &source, vec![dataset::entity("p", 0)]).await;
    let queues = RawQueueClient::azurite();
    let fresh = unique_name("fresh");
    let own = [
        app.names.prefix_queue.clone(),
        app.names.copy_queue.clone(),
        format!("{}-poison", app.names.prefix_queue),
        format!("{}-poison", app.names.copy_queue),
        format!("{}-cleanup", app.names.prefix_queue),
        format!("{}-cleanup-poison", app.names.prefix_queue),
    ];
    let mut cases: Vec<(Value, &str)> = vec![
        (json!({}), "destinationQueue"),
        (json!({"destinationQueue": "ab"}), "destinationQueue"),
        (
            json!({"destinationQueue": "a".repeat(64)}),
            "destinationQueue",
        ),
        (json!({"destinationQueue": "Rows"}), "destinationQueue"),
        (json!({"destinationQueue": "-rows"}), "destinationQueue"),
        (json!({"destinationQueue": "rows-"}), "destinationQueue"),
        (json!({"destinationQueue": "ro--ws"}), "destinationQueue"),
        (json!({"destinationQueue": "ro_ws"}), "destinationQueue"),
        (json!({"destinationQueue": 7}), "destinationQueue"),
        (
            json!({"destinationQueue": fresh, "destinationConnection": "Nope"}),
            "destinationConnection",
        ),
        (
            json!({"destinationQueue": fresh, "rowsPerMessage": 0}),
            "rowsPerMessage",
        ),
        (
            json!({"destinationQueue": fresh, "rowsPerMessage": 101}),
            "rowsPerMessage",
        ),
        (
            json!({"destinationQueue": fresh, "rowsPerMessage": -1}),
            "rowsPerMessage",
        ),
        (
            json!({"destinationQueue": fresh, "rowsPerMessage": "8"}),
            "rowsPerMessage",
        ),
        (
            json!({"destinationQueue": fresh, "messageEncoding": "utf8"}),
            "messageEncoding",
        ),
        (
            json!({"destinationQueue": fresh, "destinationTable": "T"}),
            "destinationTable",
        ),
        (
            json!({"destinationQueue": fresh, "confirm": source}),
            "confirm",
        ),
        (
            json!({"destinationQueue": fresh, "workSplit": "page"}),
            "workSplit",
        ),
        (
            json!({"destinationQueue": fresh, "destinationContainer": "c"}),
            "destinationContainer",
        ),
        (
            json!({"destinationQueue": fresh, "filter": "Listed eq"}),
            "filter",
        ),
    ];
    for q in &own {
        cases.push((json!({"destinationQueue": q}), "destinationQueue"));
    }
    for (fields, field) in &cases {
        let mut body = json!({"driver": "enqueue", "sourceTable": source});
        for (k, v) in fields.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (status, reply, _) = app.post_scan(&body).await;
        assert!((400..500).contains(&status), "{body} got {status}: {reply}");
        assert_eq!(reply["error"]["field"], *field, "{body}: {reply}");
    }
    let (status, reply, _) = app
        .post_scan(&json!({"driver": "enqueue", "destinationQueue": fresh}))
        .await;
    assert_eq!(
        (status, reply["error"]["field"].as_str()),
        (400, Some("sourceTable")),
        "{reply}"
    );
    // Nothing written: no queue, no scan.
    assert!(!queues.exists(&fresh).await, "queue {fresh} was created");
    let (status, list) = app.get("/api/scans").await;
    assert_eq!(status, 200);
    assert_eq!(list["scans"].as_array().map(Vec::len), Some(0), "{list}");
    app.shutdown().await;
}

/// `destinationQueue` checked in-process (the router called as the host would, on Azurite over
/// the real adapters): tablescan's own queues — the step, copy and cleanup queues and each one's
/// `-poison` queue — and a 64-character name are a 400 naming `destinationQueue` before any
/// storage request; a 63-character name, valid for Azure (a Functions consumer of it would have
/// no poison queue: docs/enqueue.md), is accepted and its queue created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_queues_are_refused_in_process_before_any_request() {
    let app = InProcessApp::start(&[]);
    let config = &app.state.config;
    let mut refused: Vec<String> = Vec::new();
    for q in [
        &config.prefix_scan_queue,
        &config.table_copy_queue,
        &config.cleanup_queue,
    ] {
        refused.extend([q.clone(), format!("{q}-poison")]);
    }
    let source = unique_name("Source");
    let long = format!("{:x<63}", unique_name("q"));
    refused.push(format!("{long}x"));
    let before = app.counters.snapshot();
    for q in &refused {
        let body = json!({"driver": "enqueue", "sourceTable": source, "destinationQueue": q});
        let (status, reply) = call(&app.state, "POST", "/api/scans", Some(body)).await;
        assert_eq!(
            (status.as_u16(), reply["error"]["field"].as_str()),
            (400, Some("destinationQueue")),
            "{q}: {reply}"
        );
    }
    let sent = app.counters.snapshot().since(&before);
    assert_eq!(sent.total(), 0, "nothing sent, nothing written: {sent:?}");
    let raw = RawQueueClient::azurite();
    let store = account().table_store(Arc::new(RequestCounters::new()));
    seed(&store, &source, vec![dataset::entity("p", 0)]).await;
    let body = json!({"driver": "enqueue", "sourceTable": source, "destinationQueue": long});
    let (status, reply) = call(&app.state, "POST", "/api/scans", Some(body)).await;
    assert_eq!(status.as_u16(), 202, "{reply}");
    assert!(raw.exists(&long).await, "{long} created");
}

/// The faults an enqueue is run under.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Handlers SIGKILLed mid-scan (3 instances, 4 kills), the puts to the destination queue
    /// held at the proxy meanwhile (as `faults::crash_run` holds a copy's writes).
    Kills,
    /// Every queue put (tablescan's work and the destination's messages) stored 2-3 times.
    Duplicates,
    /// Throttling (503), timeouts, resets and delays on every kind of request.
    Storage,
}

/// An enqueue of `rows` rows under `fault`; `filter` (one that every row passes) makes the
/// scan's key ranges work items that re-read their rows, instead of steps that put what they
/// read.
async fn fault_run(fault: Fault, rows: u64, take: u32, per_message: u32, filter: Option<&str>) {
    let (kind, instances) = match fault {
        Fault::Kills => ("enqueue-handler-crash", 3),
        Fault::Duplicates => ("enqueue-duplicate-delivery", 2),
        Fault::Storage => ("enqueue-storage-faults", 2),
    };
    let mut summary = Summary::new(kind);
    let proxy = match fault {
        Fault::Kills => proxy(FaultPolicy::none(), 67).await,
        Fault::Duplicates => duplicating_proxy(71).await,
        Fault::Storage => proxy(storage_faults(0.04), 73).await,
    };
    let app = match fault {
        Fault::Kills => app_behind(&proxy, instances).await,
        _ => TestApp::start_through(instances, Some(&proxy)).await,
    };
    let (source, source_rows) = seeded_source(&app, source_entities(rows, 91)).await;
    let mut extra = json!({"rowsPerMessage": per_message, "takeCount": take});
    if let Some(filter) = filter {
        extra["filter"] = json!(filter);
    }
    let (id, queue) = match fault {
        Fault::Kills => {
            // The destination queue is named by the start (which creates it): its puts are
            // held from the scan's first delivery on.
            let start = start_enqueue(&app, &source, extra);
            support::faults::start_then_arm(&app, &proxy, start, |(_, queue)| {
                proxy.hold(Hold {
                    kinds: vec![RequestKind::QueuePut],
                    resources: vec![queue.clone()],
                    ..Hold::default()
                })
            })
            .await
        }
        _ => start_enqueue(&app, &source, extra).await,
    };
    let kills = match fault {
        Fault::Kills => {
            let mut killer = Killer::new(&app);
            killer.kill(&app, Some(&proxy), 4, 2, None).await;
            proxy.release();
            Some(killer.kills)
        }
        _ => None,
    };
    let state = wait_recorded_end(&app, &id, SCAN_TIMEOUT).await;
    let (_, status) = app.get(&format!("/api/scans/{id}")).await;
    let read = RawQueueClient::azurite()
        .receive_all(&queue, 8 * source_rows.len())
        .await;
    let messages: Vec<Message> = read.iter().map(|m| decode(m, true)).collect();
    let mut verdict = Verdict::default();
    let got = check_messages(
        &id,
        &messages,
        &source_rows,
        per_message as usize,
        true,
        &mut verdict,
    );
    if state != "completed" {
        verdict
            .problems
            .push(format!("scan ended {state}: {status}"));
    }
    let n = source_rows.len() as i64;
    if status["rowsWritten"] != n || status["rowsScanned"] != n {
        verdict.mismatches += 1;
        verdict.problems.push(format!("counters: {status}"));
    }
    if status["messagesWritten"].as_u64().unwrap_or(0) as usize > got.messages {
        verdict
            .problems
            .push(format!("more messages counted than read: {status}"));
    }
    summary.faults = match (&kills, fault) {
        (Some(kills), _) => kills.iter().sum::<usize>() as u64,
        (None, Fault::Duplicates) => proxy.duplicates_put(),
        (None, _) => proxy.faults_injected(),
    };
    eprintln!(
        "{kind}: {got:?}; messagesWritten {}; queue puts through the proxy {}",
        status["messagesWritten"],
        proxy.count_of(RequestKind::QueuePut)
    );
    summary.add(&verdict);
    summary.report(&[&verdict]);
    if let Some(kills) = &kills {
        check_kills(&app, kills).await;
    }
    assert!(summary.faults > 0, "no fault was injected");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_under_handler_kills() {
    fault_run(Fault::Kills, 1600, 4, 1, None).await;
}

/// The same through work items (a filter every row passes): the items re-read their rows and
/// put them; a killed item is run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_items_under_handler_kills() {
    fault_run(Fault::Kills, 1600, 4, 3, Some("VersionIndex ge 0")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_under_duplicated_messages() {
    fault_run(Fault::Duplicates, 300, 5, 8, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_under_storage_faults() {
    fault_run(Fault::Storage, 300, 5, 1, None).await;
}

/// Puts paced so slowly (40 requests a second) that every step and item outlasts
/// `TABLESCAN_HAND_OFF_SECONDS` (1 s here): each hands the rows it did not reach on to items
/// of their own, which read them again (`Config::hand_off_after`). Every row still lands in a
/// message, once (no fault here), and the counters stay exact; the handler's log shows the
/// hand-offs. In steps (no filter) and in work items (a filter every row passes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_puts_hand_their_rows_on() {
    let settings = [
        ("TABLESCAN_HAND_OFF_SECONDS", "1"),
        (
            "RUST_LOG",
            "warn,tablescan::app::work=info,tablescan::app::drivers::enqueue=info",
        ),
    ];
    let app = TestApp::start(1, &settings).await;
    let (source, source_rows) = seeded_source(&app, source_entities(600, 17)).await;
    let n = source_rows.len();
    for (filter, who) in [(None, "a step"), (Some("VersionIndex ge 0"), "an item")] {
        let mut extra = json!({"takeCount": 100, "maxRequestsPerSecond": 40});
        if let Some(filter) = filter {
            extra["filter"] = json!(filter);
        }
        let (status, got, verdict) = enqueue_and_check(&app, &source, extra, &source_rows).await;
        assert!(verdict.problems.is_empty(), "{who}: {:?}", verdict.problems);
        assert_eq!(status["state"], "completed", "{status}");
        assert_eq!((got.rows, got.duplicates), (n, 0), "{who}: {got:?}");
        for field in [
            "rowsScanned",
            "rowsMatched",
            "rowsWritten",
            "messagesWritten",
        ] {
            assert_eq!(status[field], n, "{who}: {field} in {status}");
        }
        let id = status["id"].as_str().unwrap();
        let needle = format!("{who} handed rows on");
        let handed = app.host().log_lines();
        let handed = handed
            .iter()
            .filter(|l| l.contains(&needle) && l.contains(id))
            .count();
        assert!(handed > 0, "{who}: no hand-off logged");
    }
    app.shutdown().await;
}
