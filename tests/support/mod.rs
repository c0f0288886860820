//! Helpers shared by the integration tests that run against Azurite (`mod support;`).
//!
//! One Azurite serves the whole test process (started lazily); each test isolates itself by
//! using its own uniquely named tables and queues.
#![allow(dead_code)]

pub mod backup;
pub mod e2e;
pub mod faults;
pub mod host;
pub mod identity;
pub mod raw;
pub mod router;
pub mod scan;
pub mod stores;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tablescan::lab::azurite::Azurite;
use tablescan::storage::azure_queue::AzureQueueStore;
use tablescan::storage::azure_table::AzureTableStore;
use tablescan::storage::connection::StorageAccount;
use tablescan::storage::request_counts::RequestCounters;
use tablescan::storage::TableStore;

/// The Azurite shared by this test process.
pub fn azurite() -> &'static Azurite {
    Azurite::shared()
}

/// An account on the shared Azurite with its own HTTP client. Not shared between tests on
/// purpose: each `#[tokio::test]` has its own runtime, and a pooled connection dies with the
/// runtime that opened it ("dispatch task is gone"), which would show up as retried requests.
pub fn account() -> StorageAccount {
    azurite().account()
}

/// A name unique within this test process and across runs, valid both as a table name
/// (alphanumeric, starts with a letter, 3..=63) and as a queue name (lowercase letters and digits).
/// `prefix` must start with a letter; it is lowercased and stripped of other characters.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut name: String = prefix
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect::<String>()
        .to_ascii_lowercase();
    assert!(
        name.starts_with(|c: char| c.is_ascii_lowercase()),
        "prefix {prefix:?} must start with a letter"
    );
    let suffix = format!(
        "{}x{:x}",
        COUNTER.fetch_add(1, Ordering::Relaxed),
        rand::random::<u32>()
    );
    name.truncate(63 - suffix.len());
    name.push_str(&suffix);
    name
}

/// Fresh counters and a table store on the shared Azurite.
pub fn table_store() -> (AzureTableStore, Arc<RequestCounters>) {
    let counters = Arc::new(RequestCounters::new());
    (account().table_store(counters.clone()), counters)
}

/// Fresh counters and a queue store on the shared Azurite.
pub fn queue_store() -> (AzureQueueStore, Arc<RequestCounters>) {
    let counters = Arc::new(RequestCounters::new());
    (account().queue_store(counters.clone()), counters)
}

/// Creates a uniquely named table and returns its name.
pub async fn new_table<T: TableStore>(store: &T, prefix: &str) -> String {
    let name = unique_name(prefix);
    assert!(
        store.create_table(&name).await.expect("create table"),
        "table {name} already existed"
    );
    name
}

/// Runs the caller alone among the tests of this process that also call it: fault runs (which
/// load the machine on purpose) and measurements of memory and latency (which a loaded machine
/// would skew). Hold the guard for the whole test.
pub async fn alone() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

/// A copy of the JSON object `base` with `key` set to `value`.
pub fn with_field(
    base: &serde_json::Value,
    key: &str,
    value: serde_json::Value,
) -> serde_json::Value {
    let mut body = base.clone();
    body[key] = value;
    body
}

/// A copy of the JSON object `base` without `key`.
pub fn without_field(base: &serde_json::Value, key: &str) -> serde_json::Value {
    let mut body = base.clone();
    body.as_object_mut().unwrap().remove(key);
    body
}

/// A copy of the JSON object `base` with every field of the object `extra` set.
pub fn with_fields(base: &serde_json::Value, extra: serde_json::Value) -> serde_json::Value {
    let mut body = base.clone();
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// Creates a uniquely named queue (`prefix` + a suffix), puts `text` on it and receives it
/// (at most one message, 30 s visibility); the queue's name and what was received.
pub async fn queue_round_trip<Q: tablescan::storage::QueueStore>(
    queues: &Q,
    prefix: &str,
    text: &str,
) -> (String, Vec<tablescan::storage::ReceivedMessage>) {
    let queue = unique_name(prefix);
    queues.create_queue(&queue).await.unwrap();
    queues
        .put_message(&queue, text, std::time::Duration::ZERO)
        .await
        .unwrap();
    let got = queues
        .get_messages(&queue, 1, std::time::Duration::from_secs(30))
        .await
        .unwrap();
    (queue, got)
}

/// An account SAS on the development account for `services` (`b`, `q`, `t`) with every
/// permission and service, container and object access, valid for an hour, signed with the
/// development key by the test itself; the SAS (a query string) and its signature.
pub fn account_sas(services: &str) -> (String, String) {
    let expiry = (time::OffsetDateTime::now_utc() + time::Duration::hours(1))
        .format(&time::macros::format_description!(
            "[year]-[month]-[day]T[hour]:[minute]:[second]Z"
        ))
        .unwrap();
    let (version, permissions, types) = ("2018-11-09", "rwdlacup", "sco");
    let to_sign = format!(
        "devstoreaccount1\n{permissions}\n{services}\n{types}\n\n{expiry}\n\n\n{version}\n"
    );
    let key =
        azure_core::auth::Secret::new(tablescan::storage::connection::DEVELOPMENT_ACCOUNT_KEY);
    let sig = azure_core::hmac::hmac_sha256(&to_sign, &key).unwrap();
    let encode = |s: &str| {
        s.replace('+', "%2B")
            .replace('/', "%2F")
            .replace('=', "%3D")
            .replace(':', "%3A")
    };
    let sas = format!(
        "sv={version}&ss={services}&srt={types}&se={}&sp={permissions}&sig={}",
        encode(&expiry),
        encode(&sig)
    );
    (sas, sig)
}
