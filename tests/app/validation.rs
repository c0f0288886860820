//! Request validation in-process (the app's router over the real storage adapters on Azurite;
//! no host, no handler process): a bad request is a 400 naming the field, refused before any
//! storage call, and nothing is written (read back with the test's own REST client). The
//! protocol-level refusals (bodies, methods, sizes) are in `inprocess.rs` and, through the real
//! host, `tests/scans/faults.rs` (`hostile_http_requests_get_4xx_and_write_nothing`).

use serde_json::{json, Value};

use crate::support::raw::{self, RawClient};
use crate::support::router::{call, InProcessApp};
use crate::support::{unique_name, with_fields};

/// A delete needs `confirm` equal to `sourceTable`; otherwise a 4xx names `confirm` and
/// nothing is written (no scan, no row touched).
#[tokio::test]
async fn delete_requires_confirm_equal_to_the_source_table() {
    let app = InProcessApp::start(&[]);
    let client = RawClient::azurite();
    let table = unique_name("Keep");
    let before = raw::seed_keys(&client, &table, &[("a", "1"), ("b", "2")]).await;
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
        let (status, reply) = call(&app.state, "POST", "/api/scans", Some(body.clone())).await;
        assert_eq!(status, 400, "{body} → {reply}");
        assert_eq!(reply["error"]["field"], "confirm", "{body} → {reply}");
    }
    for (extra, field) in [
        (json!({"destinationTable": "Elsewhere"}), "destinationTable"),
        (json!({"workSplit": "page"}), "workSplit"),
    ] {
        let body = with_fields(
            &json!({"driver": "delete", "sourceTable": table, "confirm": table}),
            extra,
        );
        let (status, reply) = call(&app.state, "POST", "/api/scans", Some(body.clone())).await;
        assert_eq!(status, 400, "{body} → {reply}");
        assert_eq!(reply["error"]["field"], field, "{body} → {reply}");
    }
    let (_, list) = call(&app.state, "GET", "/api/scans", None).await;
    assert_eq!(list["scans"].as_array().map(Vec::len), Some(0), "{list}");
    assert_eq!(
        raw::diff(&before, &client.rows(&table).await),
        Vec::<String>::new()
    );
}

/// A filter or select the service would refuse, or a driver that takes none, is a 4xx naming
/// the field (with the position and the reason for filters), and nothing is written.
#[tokio::test]
async fn bad_filters_and_selects_get_4xx_naming_the_field() {
    let app = InProcessApp::start(&[]);
    let client = RawClient::azurite();
    let source = unique_name("Typed");
    raw::seed_keys(&client, &source, &[("a", "1")]).await;
    let dest = unique_name("Never");
    let copy = |extra: Value| {
        with_fields(
            &json!({"driver": "copy", "sourceTable": source, "destinationTable": dest}),
            extra,
        )
    };
    let cases: Vec<(Value, &str, &str)> = vec![
        (
            copy(json!({"filter": "PartitionKey eq 'a'"})),
            "filter",
            "at character 1: PartitionKey is a key property",
        ),
        (
            copy(json!({"filter": "A eq 1 and RowKey ge 'x'"})),
            "filter",
            "at character 12",
        ),
        (
            copy(json!({"filter": "A like 'x'"})),
            "filter",
            "unknown operator",
        ),
        (
            copy(json!({"filter": "A eq 'unterminated"})),
            "filter",
            "unterminated",
        ),
        (
            copy(json!({"filter": "A eq 99999999999"})),
            "filter",
            "Int32 range",
        ),
        (copy(json!({"filter": "A eq guid'nope'"})), "filter", "GUID"),
        (copy(json!({"filter": "A eq B"})), "filter", "literal"),
        (
            copy(json!({"filter": "x".repeat(3000)})),
            "filter",
            "characters",
        ),
        (
            copy(
                json!({"filter": (0..10).map(|i| format!("A eq {i}")).collect::<Vec<_>>().join(" or ")}),
            ),
            "filter",
            "comparisons",
        ),
        (copy(json!({"filter": 5})), "filter", "string"),
        (copy(json!({"select": []})), "select", "1 to 252"),
        (copy(json!({"select": ["A", "A"]})), "select", "twice"),
        (
            copy(json!({"select": ["bad name"]})),
            "select",
            "not a property name",
        ),
        (copy(json!({"select": ["RowKey"]})), "select", "always read"),
        (
            copy(json!({"workSplit": "partitionKey", "filter": "A eq 1"})),
            "filter",
            "partitionKey",
        ),
        (
            json!({"driver": "count", "sourceTable": source, "select": ["A"]}),
            "select",
            "count driver",
        ),
        (
            json!({"driver": "delete", "sourceTable": source, "confirm": source, "select": ["A"]}),
            "select",
            "delete driver",
        ),
    ];
    for (body, field, says) in cases {
        let (status, reply) = call(&app.state, "POST", "/api/scans", Some(body.clone())).await;
        let shown: String = body.to_string().chars().take(120).collect();
        assert_eq!(status, 400, "{shown} → {reply}");
        assert_eq!(reply["error"]["field"], field, "{shown} → {reply}");
        let message = reply["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(says),
            "{shown} → {reply} should say {says:?}"
        );
    }
    let (_, list) = call(&app.state, "GET", "/api/scans", None).await;
    assert_eq!(list["scans"].as_array().map(Vec::len), Some(0), "{list}");
    assert!(
        client.read_all(&dest).await.is_err(),
        "no destination created"
    );
}
