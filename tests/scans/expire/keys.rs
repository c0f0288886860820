//! Every `keyTime` format, on PartitionKey and on RowKey: exactly the rows the test dated
//! older than the cutoff are deleted; rows of a live time, keys without a time and keys
//! without the prefix stay. A time in the PartitionKey keeps the scan within the expired
//! keys (`rowsScanned` counts only them and the one unreadable key among them); a time in the
//! RowKey is read from every row, and every unreadable key is counted (`rowsSkipped`).

use serde_json::{json, Value};

use super::{key_text, keys_of, seed, unix_now, DAY, HANG};
use crate::support::e2e::TestApp;
use crate::support::raw::RawClient;
use crate::support::unique_name;

const FORMATS: [&str; 5] = [
    "ticks",
    "reverseTicks",
    "unixSeconds",
    "unixMilliseconds",
    "iso8601",
];
const PREFIX: &str = "t-";

/// One table's case: its rows, those the test expects gone, and the request.
struct Case {
    table: String,
    rows: Vec<(String, String)>,
    expired: Vec<(String, String)>,
    /// Unreadable keys the scan reads (and counts).
    unreadable_read: i64,
    body: Value,
}

/// Times (days from now) of expired rows and of live ones, against `olderThan` 30 days.
const EXPIRED_DAYS: [i64; 3] = [-400, -60, -31];
const LIVE_DAYS: [i64; 3] = [-29, -1, 2];

fn case(key: &str, format: &str) -> Case {
    let table = unique_name("Ttl");
    let now = unix_now();
    let text = |days: i64, extra: i64| key_text(format, now + days * DAY + extra);
    // A key whose time cannot be read but which sorts among the expired ones (a digit prefix
    // of them: below the cutoff's text, or above it for reverse ticks), one that sorts after
    // every digit, and one without the prefix.
    let among = match format {
        "reverseTicks" => format!("{PREFIX}9"),
        _ => format!("{PREFIX}0"),
    };
    let junk = [among, format!("{PREFIX}zzz"), "other".to_string()];
    let (mut rows, mut expired) = (Vec::new(), Vec::new());
    let mut add = |time_key: String, is_expired: bool, other: &str| {
        let row = match key {
            "PartitionKey" => (time_key, other.to_string()),
            _ => (other.to_string(), time_key),
        };
        if is_expired {
            expired.push(row.clone());
        }
        rows.push(row);
    };
    for (i, days) in EXPIRED_DAYS.iter().enumerate() {
        add(format!("{PREFIX}{}", text(*days, i as i64)), true, "a");
        add(format!("{PREFIX}{}-x", text(*days, 7)), true, "b");
    }
    for (i, days) in LIVE_DAYS.iter().enumerate() {
        add(format!("{PREFIX}{}", text(*days, i as i64)), false, "a");
        add(format!("{PREFIX}{}-x", text(*days, 7)), false, "b");
    }
    for j in &junk {
        add(j.clone(), false, "a");
    }
    let unreadable_read = match key {
        "PartitionKey" => 1,
        _ => junk.len() as i64,
    };
    let body = json!({
        "driver": "expire", "sourceTable": table, "confirm": table, "olderThan": "30d",
        "keyTime": {"key": key, "format": format, "prefix": PREFIX},
    });
    Case {
        table,
        rows,
        expired,
        unreadable_read,
        body,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_format_expires_exactly_the_old_rows_on_either_key() {
    let client = RawClient::azurite();
    let app = TestApp::start(1, &[]).await;
    let mut cases = Vec::new();
    for key in ["PartitionKey", "RowKey"] {
        for format in FORMATS {
            let case = case(key, format);
            seed(&client, &case.table, &case.rows).await;
            let id = app.start_scan(&case.body).await;
            cases.push((key, format, case, id));
        }
    }
    for (key, format, case, id) in cases {
        let status = app.wait_for_end(&id, HANG).await;
        let what = format!("{key} {format}: {status}");
        assert_eq!(status["state"], "completed", "{what}");
        let mut left = case.rows.clone();
        left.retain(|r| !case.expired.contains(r));
        left.sort();
        assert_eq!(keys_of(&client, &case.table).await, left, "{what}");
        let expired = case.expired.len() as i64;
        assert_eq!(status["rowsWritten"], expired, "{what}");
        assert_eq!(status["rowsMatched"], expired, "{what}");
        assert_eq!(status["rowsSkipped"], case.unreadable_read, "{what}");
        assert_eq!(status["rowsChanged"], 0, "{what}");
        let scanned = status["rowsScanned"].as_i64().unwrap();
        match key {
            // Only the expired keys and the unreadable one among them are read.
            "PartitionKey" => assert_eq!(scanned, expired + 1, "{what}"),
            _ => assert_eq!(scanned, case.rows.len() as i64, "{what}"),
        }
        let cutoff = status["parameters"]["cutoff"].as_str().unwrap_or_default();
        assert!(cutoff.ends_with('Z') && cutoff.len() == 28, "{what}");
    }
    app.shutdown().await;
}
