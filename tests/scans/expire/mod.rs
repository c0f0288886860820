//! Expire (TTL for Table Storage), ETag-checked deletes and dry runs, end to end on Azurite
//! through the local host and the real handler (docs/expire.md). Tables are seeded and read
//! back with the test's own REST client (`support::raw`), and which rows are expired is the
//! test's own judgement of the times it wrote (its own key formats below), never tablescan's.
//! - `keys`: every `keyTime` format on PartitionKey and RowKey; unreadable keys skipped;
//! - `etag`: a row changed between its read and its delete survives (store hook, proxy hold);
//! - `requests`: refusals, `Timestamp` and `timeProperty`, dry runs.

mod costs;
mod etag;
mod keys;
mod requests;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::support::raw::{json_string, RawClient};

/// Catches a hang only: each scan here ends in 2 to 10 s.
pub const HANG: Duration = Duration::from_secs(120);
/// A day in seconds.
pub const DAY: i64 = 86_400;

/// Seconds since the Unix epoch now (the local clock; Azurite's is the same machine's). Rows
/// are dated days away from any cutoff, so no race with the clock matters.
pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// The test's own writing of a time (Unix seconds) in each `keyTime` format.
pub fn key_text(format: &str, unix: i64) -> String {
    let ticks = unix as i128 * 10_000_000 + 621_355_968_000_000_000;
    match format {
        "ticks" => format!("{ticks:019}"),
        "reverseTicks" => format!("{:019}", 3_155_378_975_999_999_999i128 - ticks),
        "unixSeconds" => format!("{unix:010}"),
        "unixMilliseconds" => format!("{:013}", unix * 1000),
        "iso8601" => {
            let at = time::OffsetDateTime::from_unix_timestamp(unix).unwrap();
            format!(
                "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
                at.year(),
                at.month() as u8,
                at.day(),
                at.hour(),
                at.minute(),
                at.second()
            )
        }
        other => panic!("no format {other}"),
    }
}

/// Creates `table` and inserts one row per key pair, with a string property `V`.
pub async fn seed(client: &RawClient, table: &str, keys: &[(String, String)]) {
    client.create_table(table).await.expect("create table");
    for (pk, rk) in keys {
        let body = format!(
            r#"{{"PartitionKey":{},"RowKey":{},"V":"seeded"}}"#,
            json_string(pk),
            json_string(rk)
        );
        client.insert(table, &body).await.expect("raw insert");
    }
}

/// The keys of every row of `table`, sorted (read with the raw client).
pub async fn keys_of(client: &RawClient, table: &str) -> Vec<(String, String)> {
    let mut keys: Vec<(String, String)> = client
        .rows(table)
        .await
        .iter()
        .map(|e| (e.partition_key(), e.row_key()))
        .collect();
    keys.sort();
    keys
}
