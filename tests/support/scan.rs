//! Fixtures of the scan engine's tests (`tests/app/scan/`): the table they scan, a current-thread
//! runtime, the oracle (what a scan must return) and the adversarial keys of the property tests.

use proptest::prelude::*;
use tablescan::lab::memory::{MemoryTableStore, Pagination};
use tablescan::scan::ScanParameters;
use tablescan::storage::{compare_keys, Entity};

/// The table every in-memory scan test reads.
pub const TABLE: &str = "source";

/// Runs `f` to completion on a fresh current-thread runtime.
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// An in-memory [`TABLE`] holding one row (no properties) per `(partition key, row key)`.
pub fn store_with<K: AsRef<str>>(keys: &[(K, K)], pagination: Pagination) -> MemoryTableStore {
    let store = MemoryTableStore::new(pagination);
    store.load(
        TABLE,
        keys.iter()
            .map(|(pk, rk)| Entity::new(pk.as_ref(), rk.as_ref())),
    );
    store
}

/// What a scan must return: rows in range, sorted by (PK, RK) in UTF-16 order.
pub fn expected(keys: &[(String, String)], params: &ScanParameters) -> Vec<(String, String)> {
    let mut rows: Vec<_> = keys
        .iter()
        .filter(|(pk, _)| params.contains_partition_key(pk))
        .cloned()
        .collect();
    rows.sort_by(|a, b| compare_keys(&a.0, &b.0).then(compare_keys(&a.1, &b.1)));
    rows.dedup();
    rows
}

/// The key parts every property test draws from: empty, ASCII, a quote, the highest BMP code
/// unit, a private-use character, a surrogate pair and a two-byte UTF-8 character.
const KEY_PARTS: [&str; 9] = [
    "",
    "a",
    "b",
    "ab",
    "'",
    "\u{FFFF}",
    "\u{E000}",
    "\u{1F600}",
    "é",
];

/// Keys of up to three parts drawn from [`KEY_PARTS`] and `extra`.
pub fn key_strategy(extra: &[&'static str]) -> impl Strategy<Value = String> {
    let mut alphabet = KEY_PARTS.to_vec();
    alphabet.extend_from_slice(extra);
    prop::collection::vec(prop::sample::select(alphabet), 0..4).prop_map(|parts| parts.concat())
}
