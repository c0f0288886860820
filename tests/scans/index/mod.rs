//! Secondary indexes end to end on Azurite, through the local Functions host and the real
//! handler: a scan of driver `index` builds one, `POST /api/lookups` finds rows through it.
//!
//! The oracle is the test's own: which rows hold a value is decided by what the test wrote to
//! each row (the typed JSON text it sent), and every row is read back with the test's own REST
//! client (`support::raw`), never tablescan's parser. "No false negatives" is checked as: every
//! row the test wrote with a value is in the lookup's answer, with the texts the raw read gives;
//! and nothing else is.
//!
//! Faults during a build (duplicated messages, storage faults; kills are here): [`faults`].
//! Forged and damaged index files: [`hostile`], and what lookups hold over them:
//! [`hostile_memory`].

mod faults;
mod hostile;
mod hostile_memory;
mod prune;
use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::value::RawValue;
use serde_json::{json, Value};
use support::e2e::TestApp;
use support::raw::{self, RawClient, RawEntity};
use support::unique_name;
use tablescan::storage::azure_blob::AzureBlobStore;
use tablescan::storage::blob::{BlobRequestCounters, BlobStore, BlobWrite};

const SCAN_TIMEOUT: Duration = Duration::from_secs(240);

fn blobs() -> AzureBlobStore {
    support::account()
        .blob_store(Arc::new(BlobRequestCounters::new()))
        .expect("Azurite has a blob endpoint")
}

/// One typed value: the JSON members the test writes for property `V`, and its filter literal.
struct Typed {
    json: &'static str,
    literal: &'static str,
}

/// A value of every EDM type, and values that differ only in type (42, 42L, 42.0). Azurite
/// answers `V eq 42L` with a 500 when a row it reads holds an Int32, Double or Boolean `V`, so
/// the Int64 value gets a table of its own ([`INT64_TABLE`]).
const VALUES: &[Typed] = &[
    Typed {
        json: r#""V":"alice""#,
        literal: "'alice'",
    },
    Typed {
        json: r#""V":"o'brien é""#,
        literal: "'o''brien é'",
    },
    Typed {
        json: r#""V":"""#,
        literal: "''",
    },
    Typed {
        json: r#""V":42"#,
        literal: "42",
    },
    Typed {
        json: r#""V":42.0,"V@odata.type":"Edm.Double""#,
        literal: "42.0",
    },
    Typed {
        json: r#""V":1.5"#,
        literal: "1.5",
    },
    Typed {
        json: r#""V":true"#,
        literal: "true",
    },
    Typed {
        json: r#""V":"2024-01-02T03:04:05.1234567Z","V@odata.type":"Edm.DateTime""#,
        literal: "datetime'2024-01-02T03:04:05.1234567Z'",
    },
    Typed {
        json: r#""V":"c9b6a3e4-1d2f-4b5a-9c8d-7e6f5a4b3c2d","V@odata.type":"Edm.Guid""#,
        literal: "guid'c9b6a3e4-1d2f-4b5a-9c8d-7e6f5a4b3c2d'",
    },
    Typed {
        json: r#""V":"Cgs=","V@odata.type":"Edm.Binary""#,
        literal: "X'0A0B'",
    },
];

/// The Int64 table's values: no Int32, Double or Boolean beside the Int64 (see [`VALUES`]).
const INT64_TABLE: &[Typed] = &[
    Typed {
        json: r#""V":"alice""#,
        literal: "'alice'",
    },
    Typed {
        json: r#""V":"42","V@odata.type":"Edm.Int64""#,
        literal: "42L",
    },
    Typed {
        json: r#""V":"-9223372036854775808","V@odata.type":"Edm.Int64""#,
        literal: "-9223372036854775808L",
    },
    Typed {
        json: r#""V":"42""#,
        literal: "'42'",
    },
];

/// Values no row holds (each close to one that some row holds).
const ABSENT: &[&str] = &[
    "'bob'",
    "'Alice'",
    "43",
    "42.5",
    "false",
    "2.5",
    "datetime'2024-01-02T03:04:05.1234568Z'",
    "guid'c9b6a3e4-1d2f-4b5a-9c8d-7e6f5a4b3c2e'",
    "X'0A0C'",
];

/// Partition keys the service accepts that trip naive code: empty, quotes, non-ASCII, spaces,
/// one a prefix of another.
const PARTITIONS: &[&str] = &["", "a'b", "é", "p 1", "p", "p1", "~z"];

/// Seeds `rows` rows: even rows hold `'alice'` (a value in many ranges), the others cycle
/// through [`VALUES`] and a row without `V`. Returns the literal each row was written with
/// (`None`: no `V`), by key texts as the raw read gives them.
async fn seed(
    client: &RawClient,
    table: &str,
    rows: usize,
    tag: &str,
) -> BTreeMap<(String, String), Option<&'static str>> {
    seed_with(client, table, rows, tag, VALUES).await
}

/// [`seed`] with `values` (the first in even rows).
async fn seed_with(
    client: &RawClient,
    table: &str,
    rows: usize,
    tag: &str,
    values: &'static [Typed],
) -> BTreeMap<(String, String), Option<&'static str>> {
    client.create_table(table).await.expect("create table");
    let mut written = BTreeMap::new();
    for i in 0..rows {
        // The tricky keys themselves, and 5 more partitions after each (about 40 in all).
        let pk = match (i / PARTITIONS.len()) % 6 {
            0 => PARTITIONS[i % PARTITIONS.len()].to_string(),
            n => format!("{}{n}", PARTITIONS[i % PARTITIONS.len()]),
        };
        let pk = pk.as_str();
        let rk = format!("{tag}{i:04}'");
        let pick = if i % 2 == 0 {
            Some(&values[0])
        } else {
            values.get((i / 2) % (values.len() + 1))
        };
        let members = pick.map_or(String::new(), |t| format!(",{}", t.json));
        let body = format!(
            r#"{{"PartitionKey":{},"RowKey":{},"Other":{i}{members}}}"#,
            raw::json_string(pk),
            raw::json_string(&rk)
        );
        client.insert(table, &body).await.expect("raw insert");
        written.insert(
            (raw::json_string(pk), raw::json_string(&rk)),
            pick.map(|t| t.literal),
        );
    }
    written
}

async fn start(app: &TestApp, body: &Value) -> String {
    let (status, reply, _) = app.post_scan(body).await;
    assert_eq!(status, 202, "{body} → {reply}");
    reply["id"].as_str().unwrap().to_string()
}

async fn build(app: &TestApp, body: &Value) -> Value {
    let id = start(app, body).await;
    let status = app.wait_for_end(&id, SCAN_TIMEOUT).await;
    assert_eq!(status["state"], "completed", "{status}");
    status
}

async fn post_lookup(app: &TestApp, body: &Value) -> (u16, Value, Vec<RawEntity>) {
    let response = app
        .client
        .post(format!("{}/api/lookups", app.base))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    // The rows as the answer's own text, parsed by the test's raw parser.
    #[derive(serde::Deserialize)]
    struct Rows<'a> {
        #[serde(borrow, default)]
        rows: Vec<&'a RawValue>,
    }
    let rows: Rows<'_> = serde_json::from_str(&text).unwrap();
    let texts: Vec<&str> = rows.rows.iter().map(|r| r.get()).collect();
    let page = format!(r#"{{"value":[{}]}}"#, texts.join(","));
    (
        status,
        value,
        raw::parse_page(&page).expect("rows are entities"),
    )
}

/// Every page of a lookup of `literal` (following `continuationToken`): the rows, the pages'
/// answers.
async fn lookup_all(
    app: &TestApp,
    container: &str,
    prefix: &str,
    literal: &str,
) -> (Vec<RawEntity>, Vec<Value>) {
    let mut rows = Vec::new();
    let mut answers = Vec::new();
    let mut token: Option<String> = None;
    for _ in 0..100 {
        let mut body =
            json!({"sourceContainer": container, "sourcePrefix": prefix, "value": literal});
        if let Some(t) = &token {
            body["continuationToken"] = json!(t);
        }
        let (status, answer, page) = post_lookup(app, &body).await;
        assert_eq!(status, 200, "{literal}: {answer}");
        rows.extend(page);
        token = answer["continuationToken"].as_str().map(str::to_string);
        answers.push(answer);
        if token.is_none() {
            return (rows, answers);
        }
    }
    panic!("a lookup of {literal} never ended");
}

/// Checks a lookup's rows against the oracle: exactly the rows written with `literal`, each
/// with the texts of the raw read (annotations compared when both sides give one: Azurite
/// drops `Edm.Double` on a stored whole double, which tablescan adds back).
fn check_rows(
    literal: &str,
    got: &[RawEntity],
    written: &BTreeMap<(String, String), Option<&'static str>>,
    raw_rows: &[RawEntity],
) {
    let expected: BTreeSet<(String, String)> = written
        .iter()
        .filter(|(_, l)| **l == Some(literal))
        .map(|(k, _)| k.clone())
        .collect();
    let keys: Vec<(String, String)> = got
        .iter()
        .map(|e| (e.partition_key_text.clone(), e.row_key_text.clone()))
        .collect();
    let unique: BTreeSet<(String, String)> = keys.iter().cloned().collect();
    assert_eq!(unique.len(), keys.len(), "{literal}: a row returned twice");
    let missing: Vec<_> = expected.difference(&unique).collect();
    let extra: Vec<_> = unique.difference(&expected).collect();
    assert!(missing.is_empty(), "{literal}: false negatives {missing:?}");
    assert!(
        extra.is_empty(),
        "{literal}: rows that do not hold it {extra:?}"
    );
    let by_key: BTreeMap<(&str, &str), &RawEntity> =
        raw_rows.iter().map(|e| (e.key(), e)).collect();
    for row in got {
        let source = by_key[&row.key()];
        for (name, text) in &source.properties {
            if name.ends_with("@odata.type") && !row.properties.contains_key(name) {
                continue;
            }
            assert_eq!(
                row.text(name),
                Some(text.as_str()),
                "{literal}: {name} of {:?}",
                row.key()
            );
        }
        for name in row.properties.keys() {
            assert!(
                source.properties.contains_key(name) || name.ends_with("@odata.type"),
                "{literal}: {name} added to {:?}",
                row.key()
            );
        }
    }
}

/// Builds an index over every EDM type and tricky keys, and looks up present and absent values:
/// no false negatives, nothing else, paged; a missing index is 404, a malformed literal a 400
/// naming `value`, bad build requests 400 naming their field with nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_finds_every_row_of_every_type_and_nothing_else() {
    let app = TestApp::start(1, &[]).await;
    let client = RawClient::azurite();
    let table = unique_name("Indexed");
    let written = seed(&client, &table, 600, "r").await;
    let raw_rows = client.rows(&table).await;
    assert_eq!(raw_rows.len(), 600);
    let container = unique_name("indexes");
    let prefix = format!("by-v/{table}");

    // Before any build: 404.
    let lookup = json!({"sourceContainer": container, "sourcePrefix": prefix, "value": "'alice'"});
    let (status, answer, _) = post_lookup(&app, &lookup).await;
    assert_eq!(status, 404, "{answer}");

    // Bad build requests: 400 naming the field, and nothing written (no container).
    for (field, patch) in [
        ("property", json!({"property": "RowKey"})),
        ("property", json!({"property": "Timestamp"})),
        (
            "destinationContainer",
            json!({"destinationContainer": "Not_Valid"}),
        ),
        (
            "destinationConnection",
            json!({"destinationConnection": "DefaultEndpointsProtocol=https;AccountName=x"}),
        ),
        (
            "keepSupersededSeconds",
            json!({"keepSupersededSeconds": 30 * 24 * 3600 + 1}),
        ),
    ] {
        let mut body = json!({"driver": "index", "sourceTable": table, "property": "V",
            "destinationContainer": unique_name("never"), "destinationPrefix": prefix});
        for (k, v) in patch.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (status, reply, _) = app.post_scan(&body).await;
        assert_eq!(
            (status, reply["error"]["field"].as_str()),
            (400, Some(field)),
            "{reply}"
        );
        let never = body["destinationContainer"].as_str().unwrap();
        if !never.contains('_') {
            let listed = blobs().list(never, "", 10, None).await;
            assert!(
                listed.is_err(),
                "{field}: the container {never} was created"
            );
        }
    }

    let status = build(
        &app,
        // The engine's fan-out (not the build's default of 16 and 16): many small ranges, so that a
        // value in all of them pages.
        &json!({"driver": "index", "sourceTable": table, "property": "V",
        "takeCount": 10, "destinationContainer": container, "destinationPrefix": prefix,
        "segmentsPerFirstPrefix": 4, "segmentsPerSubsequentPrefix": 2}),
    )
    .await;
    let with_v = written.values().filter(|l| l.is_some()).count() as i64;
    assert_eq!(status["rowsScanned"].as_i64(), Some(600), "{status}");
    assert_eq!(
        status["rowsWritten"].as_i64(),
        Some(with_v),
        "rows indexed: {status}"
    );

    for typed in VALUES {
        let (rows, answers) = lookup_all(&app, &container, &prefix, typed.literal).await;
        check_rows(typed.literal, &rows, &written, &raw_rows);
        let first = &answers[0];
        assert_eq!(first["index"]["property"], "V", "{first}");
        assert_eq!(first["index"]["sourceTable"], json!(table), "{first}");
        assert_eq!(first["index"]["rows"].as_i64(), Some(with_v), "{first}");
        let ranges = first["ranges"].as_u64().unwrap();
        let candidates = first["candidateRanges"].as_u64().unwrap();
        assert!(candidates <= ranges && candidates >= 1, "{first}");
        eprintln!("lookup {}: {} rows, {candidates} of {ranges} ranges, {} pages, {} storage requests on the first", typed.literal, rows.len(), answers.len(), first["storageRequests"]);
    }
    // 'alice' is in every range: paged, a bounded number of ranges per call.
    let (_, answers) = lookup_all(&app, &container, &prefix, "'alice'").await;
    assert!(
        answers.len() > 1,
        "'alice' in every range needs several pages: {}",
        answers[0]
    );
    for absent in ABSENT {
        let (rows, answers) = lookup_all(&app, &container, &prefix, absent).await;
        check_rows(absent, &rows, &written, &raw_rows);
        eprintln!(
            "absent {absent}: {} candidate ranges",
            answers[0]["candidateRanges"]
        );
    }

    // Int64 values, in a table of their own (see VALUES).
    let int64 = unique_name("Int64");
    let written = seed_with(&client, &int64, 60, "i", INT64_TABLE).await;
    let raw_rows = client.rows(&int64).await;
    let prefix64 = format!("by-v/{int64}");
    build(
        &app,
        &json!({"driver": "index", "sourceTable": int64, "property": "V",
        "takeCount": 10, "destinationContainer": container, "destinationPrefix": prefix64}),
    )
    .await;
    for literal in ["42L", "-9223372036854775808L", "'42'", "43L", "'alice'"] {
        let (rows, _) = lookup_all(&app, &container, &prefix64, literal).await;
        check_rows(literal, &rows, &written, &raw_rows);
    }

    // A malformed literal: 400 naming value; a token of another value: 400 naming it.
    for bad in ["alice", "'unterminated", "42X", "guid'nope'", ""] {
        let body = json!({"sourceContainer": container, "sourcePrefix": prefix, "value": bad});
        let (status, answer, _) = post_lookup(&app, &body).await;
        assert_eq!(
            (status, answer["error"]["field"].as_str()),
            (400, Some("value")),
            "{bad}: {answer}"
        );
    }
    let (_, first, _) = post_lookup(&app, &lookup).await;
    let token = first["continuationToken"]
        .as_str()
        .expect("a token")
        .to_string();
    let body = json!({"sourceContainer": container, "sourcePrefix": prefix, "value": "42", "continuationToken": token});
    let (status, answer, _) = post_lookup(&app, &body).await;
    assert_eq!(
        (status, answer["error"]["field"].as_str()),
        (400, Some("continuationToken")),
        "{answer}"
    );
    let body = json!({"sourceContainer": container, "sourcePrefix": prefix, "value": "42", "sourceConnection": "UseDevelopmentStorage=true"});
    let (status, answer, _) = post_lookup(&app, &body).await;
    assert_eq!(
        (status, answer["error"]["field"].as_str()),
        (400, Some("sourceConnection")),
        "{answer}"
    );
    app.shutdown().await;
}

/// A new container holding blob `b` of `len` patterned bytes: the store, the container and the
/// bytes.
async fn patterned_blob(len: u32) -> (AzureBlobStore, String, Vec<u8>) {
    let store = blobs();
    let container = unique_name("ranges");
    store.create_container(&container).await.unwrap();
    let body: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    let write = BlobWrite::new("application/octet-stream");
    let bytes = body.clone().into();
    store.upload(&container, "b", bytes, &write).await.unwrap();
    (store, container, body)
}

/// The ranged read the lookup relies on, against Azurite: exact bytes, a range past the end,
/// an empty range, a missing blob.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ranged_read_returns_exactly_its_bytes() {
    let (store, container, body) = patterned_blob(100_000).await;
    for (offset, len) in [(0, 10), (12_345, 777), (99_990, 10), (99_995, 100), (5, 0)] {
        let got = store
            .download_range(&container, "b", offset, len)
            .await
            .unwrap();
        let end = (offset + len).min(body.len() as u64) as usize;
        assert_eq!(&got[..], &body[offset as usize..end], "{offset}+{len}");
    }
    let past = store
        .download_range(&container, "b", 200_000, 10)
        .await
        .unwrap();
    assert!(past.is_empty());
    let e = store
        .download_range(&container, "missing", 0, 10)
        .await
        .unwrap_err();
    assert!(e.is_not_found(), "{e}");
}

/// A short ranged read holds its own bytes only: Azurite refuses the CRC64 header the SDK sends
/// for ranges under 4 MiB, so the store reads a 4-MiB window instead, and used to keep the whole
/// window's buffer behind a 10-byte answer (lookups charge reads their lengths, issue 38).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_ranged_read_holds_its_bytes_only() {
    let (store, container, body) = patterned_blob(5 << 20).await;
    for (offset, len) in [(0, 10), (7, 10), ((4 << 20) - 2, 5), (3, (4 << 20) + 10)] {
        let got = store
            .download_range(&container, "b", offset, len)
            .await
            .unwrap();
        let end = (offset + len) as usize;
        assert_eq!(&got[..], &body[offset as usize..end], "{offset}+{len}");
        if len < 1 << 20 {
            // The buffer behind the bytes: the range's length (a vector's least capacity is 8).
            let held = got.try_into_mut().map(|b| b.capacity());
            assert_eq!(held, Ok(len.max(8) as usize), "{offset}+{len}");
        }
    }
}

/// Starts a build to `prefix` that fails: a table of `rows` rows whose every range item fails
/// (the app runs with `TABLESCAN_TEST_FAIL_PREFIX` = `zzfail`).
async fn start_failing_build(
    app: &TestApp,
    client: &RawClient,
    rows: usize,
    (container, prefix): (&str, &str),
) -> String {
    let failing = unique_name("Failing");
    client.create_table(&failing).await.unwrap();
    for i in 0..rows {
        let body = format!(
            r#"{{"PartitionKey":"zzfail{}","RowKey":"{i}","V":"bob"}}"#,
            i % 3
        );
        client.insert(&failing, &body).await.unwrap();
    }
    start(
        app,
        &json!({"driver": "index", "sourceTable": failing, "property": "V",
        "strategy": "serial", "destinationContainer": container, "destinationPrefix": prefix}),
    )
    .await
}

/// A rebuild writes beside the index and switches in one write: lookups during it answer from
/// the old build, whole; after it, from the new one. A build that fails leaves the index as it
/// was, and a running build holds the prefix against a second one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_switches_atomically_and_a_failed_build_leaves_the_index() {
    let app = TestApp::start(1, &[("TABLESCAN_TEST_FAIL_PREFIX", "zzfail")]).await;
    let client = RawClient::azurite();
    let table = unique_name("Rebuilt");
    let mut written = seed(&client, &table, 120, "a").await;
    let container = unique_name("rebuilds");
    let prefix = "idx";
    let body = json!({"driver": "index", "sourceTable": table, "property": "V", "takeCount": 5,
        "destinationContainer": container, "destinationPrefix": prefix});
    let first = build(&app, &body).await;
    let first_id = first["id"].as_str().unwrap().to_string();
    let old_rows = client.rows(&table).await;
    let (old_alice, _) = lookup_all(&app, &container, prefix, "'alice'").await;
    check_rows("'alice'", &old_alice, &written, &old_rows);

    // New rows holding 'alice'; they are found only once the rebuild has switched.
    written.extend(seed(&client, &table, 60, "b").await);
    let new_rows = client.rows(&table).await;
    let id = start(&app, &body).await;
    // While it runs, a second build of the prefix is refused.
    let (status, reply, _) = app.post_scan(&body).await;
    assert_eq!(
        (status, reply["error"]["field"].as_str()),
        (400, Some("destinationPrefix")),
        "{reply}"
    );
    let mut seen_old = 0;
    loop {
        let (status, answer, _) = post_lookup(
            &app,
            &json!({"sourceContainer": container,
            "sourcePrefix": prefix, "value": "'alice'"}),
        )
        .await;
        assert_eq!(status, 200, "{answer}");
        let build_id = answer["index"]["build"].as_str().unwrap().to_string();
        if build_id == first_id {
            seen_old += 1;
            let (rows, _) = lookup_all(&app, &container, prefix, "'alice'").await;
            let keys: BTreeSet<_> = rows.iter().map(|r| r.key()).collect();
            let old: BTreeSet<_> = old_alice.iter().map(|r| r.key()).collect();
            // The old build's ranges cover the old rows; new rows inside them may show too.
            assert!(
                old.is_subset(&keys),
                "an answer from the old index lost rows"
            );
            continue;
        }
        assert_eq!(build_id, id, "{answer}");
        break;
    }
    let status = app.wait_for_end(&id, SCAN_TIMEOUT).await;
    assert_eq!(status["state"], "completed", "{status}");
    eprintln!("rebuild: {seen_old} lookups answered from the old index while it ran");
    let (rows, _) = lookup_all(&app, &container, prefix, "'alice'").await;
    check_rows("'alice'", &rows, &written, &new_rows);

    let failed = start_failing_build(&app, &client, 30, (&container, prefix)).await;
    let status = app.wait_for_end(&failed, SCAN_TIMEOUT).await;
    assert_eq!(status["state"], "failed", "{status}");
    let (status, answer, _) = post_lookup(
        &app,
        &json!({"sourceContainer": container,
        "sourcePrefix": prefix, "value": "'alice'"}),
    )
    .await;
    assert_eq!(
        (status, answer["index"]["build"].as_str()),
        (200, Some(id.as_str())),
        "{answer}"
    );
    // The failed build released the prefix: the next build takes it over.
    build(&app, &body).await;
    app.shutdown().await;
}

/// The build's storage requests beside a count scan of the same table (the scan's own requests:
/// the build adds the property's `$select`, one staging write per run of rows, and phase 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_costs_about_what_a_count_scan_costs() {
    use tablescan::storage::Entity;
    let app = TestApp::start(1, &[]).await;
    let table = unique_name("Costed");
    let rows: Vec<Entity> = (0..6000)
        .map(|i| {
            let mut e = Entity::new(format!("p{:03}", i % 40), format!("r{i:05}"));
            e.properties.insert("V", json!(format!("v{}", i % 97)));
            e
        })
        .collect();
    support::e2e::seed(&app.store, &table, rows).await;
    let count = build(&app, &json!({"driver": "count", "sourceTable": table})).await;
    let container = unique_name("costs");
    let index = build(
        &app,
        &json!({"driver": "index", "sourceTable": table, "property": "V",
        "destinationContainer": container}),
    )
    .await;
    let (c, i) = (
        count["storageRequests"].as_f64().unwrap(),
        index["storageRequests"].as_f64().unwrap(),
    );
    eprintln!(
        "build cost: count scan {c} requests, index build {i} ({:.2}x)",
        i / c
    );
    assert_eq!(index["rowsWritten"].as_i64(), Some(6000), "{index}");
    let (rows, answers) = lookup_all(&app, &container, "", "'v5'").await;
    assert_eq!(rows.len(), 6000 / 97 + 1, "{}", answers[0]);
    eprintln!(
        "lookup of a value in {} rows: {} of {} ranges, {} storage requests",
        rows.len(),
        answers[0]["candidateRanges"],
        answers[0]["ranges"],
        answers[0]["storageRequests"]
    );
    app.shutdown().await;
}

/// Handlers killed while a build runs (redelivered steps and items, a completion step run
/// again): the build still completes, and every row holding a value is found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_with_killed_handlers_has_no_false_negatives() {
    let app = TestApp::start(2, &[]).await;
    let client = RawClient::azurite();
    let table = unique_name("Killed");
    let written = seed(&client, &table, 300, "k").await;
    let raw_rows = client.rows(&table).await;
    let container = unique_name("kills");
    let id = start(
        &app,
        &json!({"driver": "index", "sourceTable": table, "property": "V",
        "takeCount": 3, "destinationContainer": container}),
    )
    .await;
    let kills = support::faults::kill_while_running(&app, &id, 2, 2).await;
    // Status reads go through the handlers: wait for every killed one to be back (a read sent
    // to one being restarted gets an empty answer), as a build that outlasts the kills ends
    // right after the last one.
    let host = app.host();
    for _ in 0..200 {
        let generations = host.handler_generations();
        if generations.iter().zip(&kills).all(|(g, k)| *g > *k as u64) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    host.wait_ready(Duration::from_secs(60))
        .await
        .expect("the killed handlers restarted");
    let status = app.wait_for_end(&id, SCAN_TIMEOUT).await;
    eprintln!("kills during the build: {kills:?}; {status}");
    assert_eq!(status["state"], "completed", "{status}");
    for typed in VALUES {
        let (rows, _) = lookup_all(&app, &container, "", typed.literal).await;
        check_rows(typed.literal, &rows, &written, &raw_rows);
    }
    app.shutdown().await;
}
