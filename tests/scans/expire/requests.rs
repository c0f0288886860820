//! What an expire or delete request asks for, end to end: refusals (a 400 naming the field,
//! nothing recorded), a time in `Timestamp` or a DateTime property (the service's own
//! comparison), and dry runs (nothing written: the table listed afterwards is unchanged; the
//! status names the rows that would go and estimates the real run's requests).

use serde_json::{json, Value};

use super::{key_text, keys_of, seed, unix_now, DAY, HANG};
use crate::support::e2e::TestApp;
use crate::support::raw::{json_string, RawClient};
use crate::support::unique_name;

/// How many scans the app lists.
async fn listed(app: &TestApp) -> usize {
    let (status, list) = app.get("/api/scans").await;
    assert_eq!(status, 200, "{list}");
    list["scans"].as_array().map_or(0, Vec::len)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_expire_requests_are_refused_naming_the_field_and_record_nothing() {
    let client = RawClient::azurite();
    let app = TestApp::start(1, &[]).await;
    let table = unique_name("Refused");
    let rows: Vec<(String, String)> = vec![("p".into(), "1".into())];
    seed(&client, &table, &rows).await;
    let base =
        json!({"driver": "expire", "sourceTable": table, "confirm": table, "olderThan": "30d"});
    let with = |field: &str, value: Value| {
        let mut body = base.clone();
        body[field] = value;
        body
    };
    let mut without_older = base.clone();
    without_older.as_object_mut().unwrap().remove("olderThan");
    let mut without_confirm = base.clone();
    without_confirm.as_object_mut().unwrap().remove("confirm");
    let key_time = json!({"key": "PartitionKey", "format": "ticks"});
    let cases = [
        (with("olderThan", json!(0)), "olderThan"),
        (with("olderThan", json!("0")), "olderThan"),
        (with("olderThan", json!("-1d")), "olderThan"),
        (with("olderThan", json!("30x")), "olderThan"),
        (with("olderThan", json!("1e9d")), "olderThan"),
        (with("olderThan", json!("59s")), "olderThan"),
        (without_older, "olderThan"),
        (without_confirm, "confirm"),
        (with("confirm", json!("Other")), "confirm"),
        (with("cutoff", json!("2020-01-01T00:00:00Z")), "cutoff"),
        (with("timeProperty", json!("RowKey")), "timeProperty"),
        (
            with("keyTime", json!({"key": "RowKey", "format": "weeks"})),
            "keyTime.format",
        ),
        (
            with("keyTime", json!({"key": "Timestamp", "format": "ticks"})),
            "keyTime.key",
        ),
        (
            with("keyTime", key_time.clone())
                .as_object()
                .cloned()
                .map(|mut b| {
                    b.insert("timeProperty".into(), json!("CreatedAt"));
                    Value::Object(b)
                })
                .unwrap(),
            "keyTime",
        ),
        (
            with(
                "keyTime",
                json!({"key": "PartitionKey", "format": "ticks", "prefix": "a"}),
            )
            .as_object()
            .cloned()
            .map(|mut b| {
                b.insert("partitionKeyPrefix".into(), json!("b"));
                Value::Object(b)
            })
            .unwrap(),
            "keyTime.prefix",
        ),
    ];
    for (body, field) in cases {
        let (status, reply, _) = app.post_scan(&body).await;
        assert_eq!(status, 400, "{body} → {reply}");
        assert_eq!(reply["error"]["field"], field, "{body} → {reply}");
    }
    assert_eq!(listed(&app).await, 0, "a refused request recorded a scan");
    assert_eq!(keys_of(&client, &table).await, rows);
    app.shutdown().await;
}

/// Rows with a `CreatedAt` DateTime 60 days and 1 day old, or none; with `olderThan` 30 days
/// only the first go. (A `CreatedAt` of another type never matches on Azure; Azurite compares
/// a string with the date's text, so that case is not tested here.) By `Timestamp` (the default), the
/// rows just written are all younger than a minute: none go, and the cutoff is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_property_time_is_compared_by_the_service() {
    let client = RawClient::azurite();
    let app = TestApp::start(1, &[]).await;
    let table = unique_name("Created");
    client.create_table(&table).await.unwrap();
    let iso = |days: i64| key_text("iso8601", unix_now() + days * DAY);
    let dated = |pk: &str, rk: &str, days: i64| {
        format!(
            r#"{{"PartitionKey":"{pk}","RowKey":"{rk}","CreatedAt":{},"CreatedAt@odata.type":"Edm.DateTime"}}"#,
            json_string(&iso(days))
        )
    };
    let mut bodies = Vec::new();
    for pk in ["a", "b"] {
        bodies.push(dated(pk, "old", -60));
        bodies.push(dated(pk, "young", -1));
        bodies.push(format!(
            r#"{{"PartitionKey":"{pk}","RowKey":"none","V":1}}"#
        ));
    }
    for body in &bodies {
        client.insert(&table, body).await.unwrap();
    }
    let by_timestamp =
        json!({"driver": "expire", "sourceTable": table, "confirm": table, "olderThan": "1m"});
    let (_, status) = app.scan_until_end(&by_timestamp, HANG).await;
    assert_eq!(
        (&status["state"], &status["rowsWritten"]),
        (&json!("completed"), &json!(0)),
        "{status}"
    );
    assert!(status["parameters"]["cutoff"].is_string(), "{status}");
    assert_eq!(keys_of(&client, &table).await.len(), 6);

    let mut by_property = by_timestamp.clone();
    by_property["olderThan"] = json!("30d");
    by_property["timeProperty"] = json!("CreatedAt");
    let (_, status) = app.scan_until_end(&by_property, HANG).await;
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(
        (&status["rowsWritten"], &status["rowsMatched"]),
        (&json!(2), &json!(2)),
        "{status}"
    );
    let left: Vec<String> = keys_of(&client, &table)
        .await
        .iter()
        .map(|(p, r)| format!("{p}/{r}"))
        .collect();
    assert_eq!(left, ["a/none", "a/young", "b/none", "b/young"]);
    app.shutdown().await;
}

/// A dry run reads and counts, writes nothing (the table listed afterwards is as seeded),
/// names up to 20 of the rows that would go, and estimates the real run's requests; the real
/// run then deletes exactly those it counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_writes_nothing_and_says_what_would_go() {
    let client = RawClient::azurite();
    let app = TestApp::start(1, &[]).await;
    let now = unix_now();
    // Expire: partition keys in ticks, 25 expired (60 days), 5 live (1 day).
    let ttl = unique_name("DryTtl");
    let rows: Vec<(String, String)> = (0..30)
        .map(|i| {
            let days = if i < 25 { -60 } else { -1 };
            (key_text("ticks", now + days * DAY + i), "r".to_string())
        })
        .collect();
    seed(&client, &ttl, &rows).await;
    // Delete: 3 partitions of 40 rows.
    let all = unique_name("DryAll");
    let every: Vec<(String, String)> = (0..120)
        .map(|i| (format!("p{}", i / 40), format!("{i:03}")))
        .collect();
    seed(&client, &all, &every).await;

    let expire = json!({"driver": "expire", "sourceTable": ttl, "confirm": ttl, "olderThan": "30d",
                        "keyTime": {"key": "PartitionKey", "format": "ticks"}});
    let delete = json!({"driver": "delete", "sourceTable": all, "confirm": all});
    for (body, table, seeded, gone) in [
        (&expire, &ttl, &rows, &rows[..25]),
        (&delete, &all, &every, &every[..]),
    ] {
        let mut dry = body.clone();
        dry["dryRun"] = json!(true);
        let (_, status) = app.scan_until_end(&dry, HANG).await;
        assert_eq!(status["state"], "completed", "{status}");
        let mut expected = seeded.clone();
        expected.sort();
        assert_eq!(&keys_of(&client, table).await, &expected, "a dry run wrote");
        assert_eq!(status["rowsWritten"], 0, "{status}");
        assert_eq!(status["rowsMatched"], gone.len(), "{status}");
        let sample = status["sampleKeys"].as_array().cloned().unwrap_or_default();
        assert_eq!(sample.len(), gone.len().min(20), "{status}");
        for key in &sample {
            let key = (
                key[0].as_str().unwrap().to_string(),
                key[1].as_str().unwrap().to_string(),
            );
            assert!(gone.contains(&key), "{key:?} would not go: {status}");
        }
        let estimate = status["estimatedStorageRequests"].as_i64().unwrap();
        let (_, real) = app.scan_until_end(body, HANG).await;
        assert_eq!(real["rowsWritten"], gone.len(), "{real}");
        assert!(real.get("estimatedStorageRequests").is_none(), "{real}");
        let sent = real["storageRequests"].as_i64().unwrap();
        println!("{table}: estimated {estimate} storage requests, the real run sent {sent}");
        // Within a tenth, or a work item's bookkeeping (a dry run's items hold what the real
        // run's steps do: a few requests each, against a query and ten transactions a page).
        let off = (estimate - sent).abs();
        assert!(
            off * 10 <= sent || off <= 5,
            "estimated {estimate}, sent {sent}"
        );
    }
    app.shutdown().await;
}
