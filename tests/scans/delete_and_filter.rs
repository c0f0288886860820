//! The drivers beyond copy, end to end on Azurite through the local Functions host and the real
//! handler binary: delete (only the rows in range, on the neighbours of every bound),
//! redelivery over rows already gone, and `filter`/`select`. Their bad requests are in-process:
//! `tests/app/validation.rs`. Every table is
//! read back with the test's own REST client (`support::raw`), and which rows are in range is
//! decided by the test's own predicate (UTF-16 code-unit order), never by tablescan's.

use crate::support;

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
        let before = raw::seed_keys(&client, &table, &keys).await;
        let id = app.start_scan(&range.request(&table, take, strategy)).await;
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
    raw::seed_keys(&client, &table, &refs).await;
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
            .unwrap()
            .deleted,
        7
    );
    assert_eq!(
        delete_batch(&store, &table, "p", ops)
            .await
            .unwrap()
            .deleted,
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

// ---------------------------------------------------------------------------------------------
// filter and select

/// One row of the filter tests, as the test knows it (its own oracle).
#[derive(Debug, Clone)]
struct Row {
    pk: String,
    rk: String,
    downloads: i64,
    listed: bool,
    name: Option<String>,
    score: f64,
    count: i32,
    day: u32,
    id: String,
    data: Vec<u8>,
}

fn typed_rows() -> Vec<Row> {
    (0..48u32)
        .map(|i| Row {
            pk: format!("P{:02}", i / 4),
            rk: format!("{:02}", i % 4),
            downloads: i64::from(i) * 100,
            listed: i % 3 != 0,
            name: (i % 5 != 0).then(|| format!("pkg{i}'s")),
            score: f64::from(i) * 0.5 + 0.25,
            count: i as i32 - 10,
            day: 1 + i % 28,
            id: format!("{i:08x}-0000-0000-0000-{i:012x}"),
            data: vec![i as u8, 0xff],
        })
        .collect()
}

impl Row {
    fn json(&self) -> String {
        use base64::Engine;
        let name = self
            .name
            .as_ref()
            .map(|n| format!(r#""Name":{},"#, raw::json_string(n)))
            .unwrap_or_default();
        format!(
            concat!(
                r#"{{"PartitionKey":"{}","RowKey":"{}","Downloads":"{}","Downloads@odata.type":"Edm.Int64","#,
                r#""Listed":{},{}"Score":{},"Score@odata.type":"Edm.Double","Count":{},"#,
                r#""Created":"2024-01-{:02}T12:00:00.0000000Z","Created@odata.type":"Edm.DateTime","#,
                r#""Id":"{}","Id@odata.type":"Edm.Guid","Data":"{}","Data@odata.type":"Edm.Binary"}}"#
            ),
            self.pk,
            self.rk,
            self.downloads,
            self.listed,
            name,
            self.score,
            self.count,
            self.day,
            self.id,
            base64::engine::general_purpose::STANDARD.encode(&self.data)
        )
    }
}

type Predicate = fn(&Row) -> bool;

/// Filters of every literal type and operator, with the test's own predicate for each.
fn filter_cases() -> Vec<(&'static str, Predicate)> {
    vec![
        ("Downloads gt 1000L and Listed eq true", |r| {
            r.downloads > 1000 && r.listed
        }),
        ("Name eq 'pkg7''s'", |r| r.name.as_deref() == Some("pkg7's")),
        ("Score ge 10.25 and Score lt 15.0", |r| {
            r.score >= 10.25 && r.score < 15.0
        }),
        ("Score gt 1.5E+1", |r| r.score > 15.0),
        ("Count lt 0 or Count eq 20", |r| {
            r.count < 0 || r.count == 20
        }),
        ("not (Listed eq true)", |r| !r.listed),
        ("Created ge datetime'2024-01-20T00:00:00Z'", |r| r.day >= 20),
        ("Created lt datetime'2024-01-03T13:00:00+02:00'", |r| {
            // 11:00 UTC on the 3rd: before that day's 12:00 rows.
            r.day < 3
        }),
        ("Id eq guid'00000005-0000-0000-0000-000000000005'", |r| {
            r.id.starts_with("00000005")
        }),
        ("Data eq X'07FF'", |r| r.data == [7, 0xff]),
        ("Data eq binary'07ff'", |r| r.data == [7, 0xff]),
        (
            "(Downloads le 700L or Downloads ge 4100L) and not (Count eq -6)",
            |r| (r.downloads <= 700 || r.downloads >= 4100) && r.count != -6,
        ),
        ("1000L lt Downloads and Listed eq false", |r| {
            r.downloads > 1000 && !r.listed
        }),
    ]
}

async fn seed_typed(client: &RawClient, table: &str) -> Vec<RawEntity> {
    client.create_table(table).await.unwrap();
    for row in typed_rows() {
        client.insert(table, &row.json()).await.expect("raw insert");
    }
    client.rows(table).await
}

/// The raw rows whose keys the predicate selects (the expected result, from the test's rows).
fn expected_rows(all: &[RawEntity], predicate: Predicate) -> Vec<RawEntity> {
    let wanted: Vec<(String, String)> = typed_rows()
        .into_iter()
        .filter(predicate)
        .map(|r| (r.pk, r.rk))
        .collect();
    let rows: Vec<RawEntity> = all
        .iter()
        .filter(|e| wanted.contains(&(e.partition_key(), e.row_key())))
        .cloned()
        .collect();
    assert_eq!(rows.len(), wanted.len());
    rows
}

/// What Azurite makes of each filter, combined with a key range as the drivers send it: the
/// rows it returns are exactly those the test's predicate selects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azurite_applies_every_filter_form_inside_a_key_range() {
    use tablescan::app::job::range::range_filter;
    use tablescan::storage::{odata, Filter, Query, TableStore};

    let (store, _) = support::table_store();
    let client = RawClient::azurite();
    let table = unique_name("Typed");
    let all = seed_typed(&client, &table).await;
    // Everything but the first and the last partition: the key range must hold too.
    let range = range_filter(&("P01".into(), "00".into()), &("P10".into(), "03".into()));
    let in_range = |r: &Row| r.pk.as_str() >= "P01" && r.pk.as_str() <= "P10";
    for (text, predicate) in filter_cases() {
        let expr = odata::parse(text).unwrap();
        let mut query = Query {
            filter: Some(Filter::and(vec![range.clone(), Filter::Where(expr)])),
            top: Some(7),
            select: Some(Vec::new()),
            continuation: None,
        };
        let mut got = Vec::new();
        loop {
            let page = store
                .query_page(&table, &query)
                .await
                .unwrap_or_else(|e| panic!("{text}: {e}"));
            got.extend(
                page.entities
                    .into_iter()
                    .map(|e| (e.partition_key, e.row_key)),
            );
            match page.continuation {
                Some(c) => query.continuation = Some(c),
                None => break,
            }
        }
        let want: Vec<(String, String)> = expected_rows(&all, predicate)
            .iter()
            .map(|e| (e.partition_key(), e.row_key()))
            .filter(|(pk, _)| {
                in_range(&Row {
                    pk: pk.clone(),
                    ..typed_rows()[0].clone()
                })
            })
            .collect();
        assert!(
            !want.is_empty(),
            "{text}: the case selects nothing in range"
        );
        assert_eq!(got, want, "{text}");
    }
}

/// Filtered copy, select copy, filtered count and filtered delete through the host: each
/// checked against the test's predicate with the raw client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_and_select_apply_inside_every_key_range() {
    let app = TestApp::start(1, &[]).await;
    let client = RawClient::azurite();
    let source = unique_name("Typed");
    let all = seed_typed(&client, &source).await;
    let n = all.len() as i64;
    let (filter, predicate) = filter_cases().remove(0);
    let matching = expected_rows(&all, predicate);
    let m = matching.len() as i64;

    // Copy with a filter: exactly the matching rows, byte for byte.
    let dest = unique_name("Filtered");
    let body = json!({"driver": "copy", "sourceTable": source, "destinationTable": dest, "takeCount": 5, "filter": filter});
    let status = app.scan_until_end(&body, Duration::from_secs(240)).await.1;
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(
        raw::diff(&matching, &client.rows(&dest).await),
        Vec::<String>::new()
    );
    assert_eq!(
        (
            status["rowsScanned"].as_i64(),
            status["rowsMatched"].as_i64(),
            status["rowsWritten"].as_i64()
        ),
        (Some(n), Some(m), Some(m)),
        "{status}"
    );
    assert_eq!(
        status["parameters"]["filter"], "(Downloads gt 1000L) and (Listed eq true)",
        "the canonical form is recorded"
    );

    // Copy with select: keys plus the named properties (a row without Name gets none).
    let dest = unique_name("Selected");
    let body = json!({"driver": "copy", "sourceTable": source, "destinationTable": dest, "takeCount": 6, "select": ["Name", "Score"]});
    let status = app.scan_until_end(&body, Duration::from_secs(240)).await.1;
    assert_eq!(status["state"], "completed", "{status}");
    let projected: Vec<RawEntity> = all
        .iter()
        .map(|e| {
            let mut e = e.clone();
            e.properties
                .retain(|name, _| ["Name", "Score", "Score@odata.type"].contains(&name.as_str()));
            e
        })
        .collect();
    assert!(projected.iter().any(|e| !e.properties.contains_key("Name")));
    assert_eq!(
        raw::diff(&projected, &client.rows(&dest).await),
        Vec::<String>::new()
    );
    assert_eq!(status["rowsWritten"], n, "{status}");

    // Count with a filter: discovery sees every key, the filter counts the matching rows.
    let body = json!({"driver": "count", "sourceTable": source, "takeCount": 4, "filter": filter});
    let status = app.scan_until_end(&body, Duration::from_secs(240)).await.1;
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(
        (
            status["rowsScanned"].as_i64(),
            status["rowsMatched"].as_i64()
        ),
        (Some(n), Some(m)),
        "{status}"
    );
    // Without a filter, rowsMatched is every row.
    let body = json!({"driver": "count", "sourceTable": source});
    let status = app.scan_until_end(&body, Duration::from_secs(240)).await.1;
    assert_eq!(
        (
            status["rowsScanned"].as_i64(),
            status["rowsMatched"].as_i64()
        ),
        (Some(n), Some(n)),
        "{status}"
    );

    // Delete with a filter and a range: matching rows in range go, every other row stays.
    let (filter, predicate) = filter_cases().remove(4);
    let body = json!({"driver": "delete", "sourceTable": source, "confirm": source, "takeCount": 3,
        "partitionKeyLowerBound": "P02", "partitionKeyUpperBound": "P09", "filter": filter});
    let status = app.scan_until_end(&body, Duration::from_secs(240)).await.1;
    assert_eq!(status["state"], "completed", "{status}");
    let doomed: Vec<(String, String)> = expected_rows(&all, predicate)
        .iter()
        .map(|e| (e.partition_key(), e.row_key()))
        .filter(|(pk, _)| pk.as_str() > "P02" && pk.as_str() < "P09")
        .collect();
    assert!(!doomed.is_empty());
    let kept: Vec<RawEntity> = all
        .iter()
        .filter(|e| !doomed.contains(&(e.partition_key(), e.row_key())))
        .cloned()
        .collect();
    assert_eq!(
        raw::diff(&kept, &client.rows(&source).await),
        Vec::<String>::new()
    );
    assert_eq!(status["rowsWritten"], doomed.len() as i64, "{status}");
    assert_eq!(status["rowsMatched"], doomed.len() as i64, "{status}");
    app.shutdown().await;
}
