//! The drivers beyond copy, end to end on Azurite through the local Functions host and the real
//! handler binary: delete (only the rows in range, on the neighbours of every bound), the
//! confirmation rule, redelivery over rows already gone, and `filter`/`select`. Every table is
//! read back with the test's own REST client (`support::raw`), and which rows are in range is
//! decided by the test's own predicate (UTF-16 code-unit order), never by tablescan's.

mod support;

use std::cmp::Ordering;
use std::time::Duration;

use serde_json::{json, Value};
use support::e2e::TestApp;
use support::raw::{self, RawClient, RawEntity};
use support::unique_name;

/// Azure's key order: UTF-16 code units.
fn cmp16(a: &str, b: &str) -> Ordering {
    a.encode_utf16().cmp(b.encode_utf16())
}

/// A scan's key range as the test understands it.
#[derive(Debug, Clone, Default)]
struct Range {
    prefix: &'static str,
    lower: Option<&'static str>,
    upper: Option<&'static str>,
}

impl Range {
    fn contains(&self, pk: &str) -> bool {
        pk.starts_with(self.prefix)
            && self
                .lower
                .map_or(true, |l| cmp16(pk, l) == Ordering::Greater)
            && self.upper.map_or(true, |u| cmp16(pk, u) == Ordering::Less)
    }

    fn request(&self, source: &str, take: u32, strategy: &str) -> Value {
        let mut body = json!({
            "driver": "delete", "sourceTable": source, "confirm": source,
            "partitionKeyPrefix": self.prefix, "takeCount": take, "strategy": strategy,
        });
        if let Some(l) = self.lower {
            body["partitionKeyLowerBound"] = json!(l);
        }
        if let Some(u) = self.upper {
            body["partitionKeyUpperBound"] = json!(u);
        }
        body
    }
}

/// Inserts one row per (partition key, row key) with a few typed properties, as JSON text the
/// test writes itself.
async fn seed_raw(client: &RawClient, table: &str, keys: &[(&str, &str)]) -> Vec<RawEntity> {
    client.create_table(table).await.expect("create table");
    for (i, (pk, rk)) in keys.iter().enumerate() {
        let body = format!(
            r#"{{"PartitionKey":{},"RowKey":{},"N":"{i}","N@odata.type":"Edm.Int64","D":{i}.5,"S":"row {i}"}}"#,
            raw::json_string(pk),
            raw::json_string(rk)
        );
        client.insert(table, &body).await.expect("raw insert");
    }
    let rows = client.rows(table).await;
    assert_eq!(rows.len(), keys.len(), "seeded {table}");
    rows
}

async fn start(app: &TestApp, body: &Value) -> String {
    let (status, reply, _) = app.post_scan(body).await;
    assert_eq!(status, 202, "{body} → {reply}");
    reply["id"].as_str().unwrap().to_string()
}

/// Partition keys around each bound: equal to it, prefixes of each other, just below and above
/// (a space and `!` sort right after the empty continuation, U+FFFF last), the empty key.
fn neighbour_keys() -> Vec<&'static str> {
    vec![
        "",
        " ",
        "A",
        "Ab",
        "ABc",
        "a",
        "aa",
        "aa\u{FFFF}",
        "ab",
        "ab ",
        "ab!",
        "abc",
        "abc'd",
        "abz",
        "ab\u{FFFF}",
        "ab\u{FFFF}x",
        "ac",
        "b",
        "k",
        "k0",
        "k1",
        "k1 ",
        "k1!",
        "k2",
        "k3",
        "k3!",
        "l",
        "l\u{FFFF}",
        "m",
        "m ",
        "m!",
        "ma",
        "n",
        "o",
        "o\u{FFFF}",
        "p",
        "p ",
        "pa",
        "q",
        "zz",
        "zz!",
        "zzz",
        "{",
        "\u{1F600}",
    ]
}

/// Every delete removes exactly the rows whose partition key is in its range, on every
/// neighbour of its bounds and prefix, and leaves every other row byte for byte; its counters
/// are exact (no faults here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_removes_exactly_the_rows_in_range() {
    let app = TestApp::start(1, &[]).await;
    let client = RawClient::azurite();
    let mut keys: Vec<(&str, &str)> = Vec::new();
    for pk in neighbour_keys() {
        for rk in ["", "1", "1 ", "2"] {
            keys.push((pk, rk));
        }
    }
    let cases = [
        (
            Range {
                prefix: "ab",
                ..Range::default()
            },
            2,
            "prefix",
        ),
        (
            Range {
                prefix: "",
                lower: Some("m"),
                upper: Some("p"),
            },
            3,
            "prefix",
        ),
        (
            Range {
                prefix: "",
                lower: None,
                upper: Some("a"),
            },
            2,
            "prefix",
        ),
        (
            Range {
                prefix: "",
                lower: Some("zz"),
                upper: None,
            },
            1000,
            "prefix",
        ),
        (
            Range {
                prefix: "k",
                lower: Some("k1"),
                upper: Some("k3"),
            },
            2,
            "prefix",
        ),
        (
            Range {
                prefix: "a",
                ..Range::default()
            },
            5,
            "serial",
        ),
    ];
    for (range, take, strategy) in cases {
        let table = unique_name("Del");
        let before = seed_raw(&client, &table, &keys).await;
        let id = start(&app, &range.request(&table, take, strategy)).await;
        let status = app.wait_for_end(&id, Duration::from_secs(240)).await;
        let (inside, outside): (Vec<RawEntity>, Vec<RawEntity>) = before
            .into_iter()
            .partition(|e| range.contains(&e.partition_key()));
        assert!(!inside.is_empty() && !outside.is_empty(), "{range:?}");
        let after = client.rows(&table).await;
        assert_eq!(
            raw::diff(&outside, &after),
            Vec::<String>::new(),
            "{range:?}: every row outside the range is left as it was, and none inside"
        );
        assert_eq!(after.len(), outside.len(), "{range:?}");
        assert_eq!(status["state"], "completed", "{range:?}: {status}");
        let n = inside.len() as i64;
        for field in ["rowsScanned", "rowsWritten", "rowsMatched"] {
            assert_eq!(status[field], n, "{range:?} {field}: {status}");
        }
        assert_eq!(status["parameters"]["confirm"], json!(table), "{status}");
    }
    app.shutdown().await;
}

/// A delete needs `confirm` equal to `sourceTable`; otherwise a 4xx names `confirm` and
/// nothing is written (no scan, no row touched).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_requires_confirm_equal_to_the_source_table() {
    let app = TestApp::start(1, &[]).await;
    let client = RawClient::azurite();
    let table = unique_name("Keep");
    let before = seed_raw(&client, &table, &[("a", "1"), ("b", "2")]).await;
    let upper = table.to_ascii_uppercase();
    for confirm in [
        None,
        Some(json!("")),
        Some(json!("Other")),
        Some(json!(upper)),
        Some(json!(true)),
    ] {
        let mut body = json!({"driver": "delete", "sourceTable": table});
        if let Some(c) = &confirm {
            body["confirm"] = c.clone();
        }
        let (status, reply, _) = app.post_scan(&body).await;
        assert_eq!(status, 400, "{body} → {reply}");
        assert_eq!(reply["error"]["field"], "confirm", "{body} → {reply}");
    }
    for (extra, field) in [
        (json!({"destinationTable": "Elsewhere"}), "destinationTable"),
        (json!({"workSplit": "page"}), "workSplit"),
    ] {
        let mut body = json!({"driver": "delete", "sourceTable": table, "confirm": table});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (status, reply, _) = app.post_scan(&body).await;
        assert_eq!(status, 400, "{body} → {reply}");
        assert_eq!(reply["error"]["field"], field, "{body} → {reply}");
    }
    let (_, list) = app.get("/api/scans").await;
    assert_eq!(list["scans"].as_array().map(Vec::len), Some(0), "{list}");
    assert_eq!(
        raw::diff(&before, &client.rows(&table).await),
        Vec::<String>::new()
    );
    app.shutdown().await;
}

/// A redelivered delete batch finds some of its rows already gone: Azurite fails the whole
/// transaction (404), and the batch deletes what is left after re-reading it, touching nothing
/// else in the partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_batch_tolerates_rows_already_gone() {
    use tablescan::app::drivers::delete::delete_batch;
    use tablescan::storage::{BatchOperation, TableStore};

    let (store, _) = support::table_store();
    let client = RawClient::azurite();
    let table = unique_name("Gone");
    let keys: Vec<(String, String)> = (0..12)
        .map(|i| ("p".to_string(), format!("{i:02}")))
        .collect();
    let refs: Vec<(&str, &str)> = keys.iter().map(|(p, r)| (p.as_str(), r.as_str())).collect();
    seed_raw(&client, &table, &refs).await;
    // Rows 00 and 11 are outside the batch; 03, 04 and 07 are already gone.
    for rk in ["03", "04", "07"] {
        store
            .submit_batch(
                &table,
                "p",
                &[BatchOperation::Delete {
                    row_key: rk.into(),
                    etag: None,
                }],
            )
            .await
            .unwrap();
    }
    let ops: Vec<BatchOperation> = (1..=10)
        .map(|i| BatchOperation::Delete {
            row_key: format!("{i:02}"),
            etag: None,
        })
        .collect();
    let e = store
        .submit_batch(&table, "p", &ops)
        .await
        .expect_err("a delete of a gone row fails the batch");
    assert!(e.is_not_found(), "{e}");
    assert_eq!(
        delete_batch(&store, &table, "p", ops.clone())
            .await
            .unwrap(),
        7
    );
    assert_eq!(
        delete_batch(&store, &table, "p", ops).await.unwrap(),
        0,
        "all gone: nothing to do"
    );
    let left: Vec<String> = client
        .rows(&table)
        .await
        .iter()
        .map(|e| e.row_key())
        .collect();
    assert_eq!(left, vec!["00", "11"]);
}
