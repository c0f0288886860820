//! Request guards on Azurite, through the local Functions host and the real handler: a second
//! connection naming the app's own Azurite as `localhost` (the app's is `127.0.0.1`) is the
//! same account, so it reaches neither tablescan's bookkeeping tables nor a copy's own source;
//! and a body naming a key twice is refused. Each refusal is a 400 naming the field, and what is
//! stored is read back with the test's own REST client (`support::raw`): nothing was written.

use crate::support;

use std::time::Duration;

use serde_json::{json, Value};
use support::e2e::TestApp;
use support::raw::{RawClient, RawEntity};
use support::unique_name;

/// Seeds `rows` rows in two partitions, as the test's own JSON text.
async fn seed(client: &RawClient, table: &str, rows: usize) -> Vec<RawEntity> {
    client.create_table(table).await.expect("create table");
    for i in 0..rows {
        let body = format!(
            r#"{{"PartitionKey":"pk{}","RowKey":"r{i:03}","N":{i}}}"#,
            i % 2
        );
        client.insert(table, &body).await.expect("raw insert");
    }
    client.rows(table).await
}

/// Every table's rows, or `None` for a table that does not exist.
async fn snapshot(client: &RawClient, tables: &[&str]) -> Vec<Option<Vec<RawEntity>>> {
    let mut all = Vec::new();
    for table in tables {
        all.push(match client.read_all(table).await {
            Ok(rows) => Some(rows),
            Err(e) if e.status == 404 => None,
            Err(e) => panic!("raw read of {table}: {e}"),
        });
    }
    all
}

/// POSTs `body` byte for byte (duplicate keys survive) and returns the status and reply.
async fn post_raw(app: &TestApp, body: &str) -> (u16, Value) {
    let response = app
        .client
        .post(format!("{}/api/scans", app.base))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_localhost_alias_of_the_apps_azurite_reaches_no_bookkeeping_table_nor_its_own_source() {
    let azurite = support::azurite();
    let own = azurite.connection_string();
    assert!(own.contains("127.0.0.1"), "{own}");
    let alias = own.replace("127.0.0.1", "localhost");
    let app = TestApp::start(
        1,
        &[
            ("TABLESCAN_CONNECTIONS", "Alias"),
            ("Alias", alias.as_str()),
        ],
    )
    .await;
    let client = RawClient::azurite();
    let source = unique_name("Guarded");
    let source_rows = seed(&client, &source, 6).await;

    // A finished scan, whose record and counters a refused request must leave as they are.
    let (_, done) = app
        .scan_until_end(
            &json!({"driver": "count", "sourceTable": source, "sourceConnection": "Alias"}),
            Duration::from_secs(60),
        )
        .await;
    assert_eq!(done["state"], "completed", "{done}");
    assert_eq!(done["rowsMatched"], 6, "{done}");

    let names = app.names.clone();
    let copied = unique_name("NeverMade");
    let watched = [
        names.scans_table.as_str(),
        names.work_table.as_str(),
        source.as_str(),
        copied.as_str(),
    ];
    let before = snapshot(&client, &watched).await;
    assert!(
        before[0].is_some() && before[1].is_some(),
        "bookkeeping tables exist"
    );
    assert_eq!(before[2].as_ref(), Some(&source_rows));

    let upper = source.to_ascii_uppercase();
    let cases: Vec<(Value, &str)> = vec![
        (
            json!({"driver": "count", "sourceTable": names.work_table, "sourceConnection": "Alias"}),
            "sourceTable",
        ),
        (
            json!({"driver": "count", "sourceTable": names.scans_table.to_ascii_uppercase(), "sourceConnection": "Alias"}),
            "sourceTable",
        ),
        (
            json!({"driver": "copy", "sourceTable": source, "destinationTable": names.scans_table, "destinationConnection": "Alias"}),
            "destinationTable",
        ),
        (
            json!({"driver": "delete", "sourceTable": names.work_table, "confirm": names.work_table, "sourceConnection": "Alias"}),
            "sourceTable",
        ),
        (
            json!({"driver": "copy", "sourceTable": source, "destinationTable": source, "destinationConnection": "Alias"}),
            "destinationTable",
        ),
        (
            json!({"driver": "copy", "sourceTable": source, "sourceConnection": "Alias", "destinationTable": upper}),
            "destinationTable",
        ),
    ];
    for (body, field) in cases {
        let (status, reply, _) = app.post_scan(&body).await;
        assert_eq!(status, 400, "{body} → {reply}");
        assert_eq!(reply["error"]["field"], field, "{body} → {reply}");
    }
    // The issue's body: last-one-wins would have run a delete of the source.
    let duplicate = format!(
        r#"{{"driver":"count","sourceTable":"{source}","driver":"delete","confirm":"{source}"}}"#
    );
    let (status, reply) = post_raw(&app, &duplicate).await;
    assert_eq!(status, 400, "{reply}");
    assert_eq!(reply["error"]["field"], "driver", "{reply}");

    // Give anything that was queued time to run, then read everything back.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        snapshot(&client, &watched).await,
        before,
        "nothing was written"
    );
    assert_eq!(app.queued_messages().await, 0);
    let (status, list) = app.get("/api/scans").await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(
        list["scans"].as_array().map(Vec::len),
        Some(1),
        "only the first scan is recorded: {list}"
    );
    app.shutdown().await;
}
