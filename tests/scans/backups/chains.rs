//! Incremental exports (`since`) and chain restores, end to end on Azurite through the local host
//! and the real handler. A seeded random history of inserts, updates, deletes and re-inserts of
//! deleted keys is exported as a full export and three deltas (one with rows changed while it
//! runs, armed on its first held blob write; one with nothing changed since its parent), and
//! the chain is restored as of each backup.
//!
//! Oracles independent of tablescan's format code: the table's state at each backup is read with
//! the test's own REST client (`support::raw`); manifests are generic JSON, part and tombstone
//! files are inflated with flate2 and parsed as generic JSON (`support::backup::part_lines`),
//! digests are computed here.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{json, Value};
use support::backup::{blobs, download, line_key, list_all, part_lines, put, sha256_hex};
use support::e2e::TestApp;
use support::faults::{proxy, start_then_arm};
use support::raw::{self, RawClient, RawEntity};
use support::unique_name;
use tablescan::lab::proxy::{FaultPolicy, Hold};
use tablescan::storage::azure_blob::AzureBlobStore;

/// Bounds that only catch a hang (a scan here takes 2 to 10 s).
const SCAN_BOUND: Duration = Duration::from_secs(180);

type Key = (String, String);

/// splitmix64: the history is the same on every run of a seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// `count` distinct members of `from`, removed from it.
    fn take(&mut self, from: &mut Vec<Key>, count: usize) -> Vec<Key> {
        (0..count.min(from.len()))
            .map(|_| {
                let i = self.below(from.len());
                from.swap_remove(i)
            })
            .collect()
    }
}

/// One row's JSON text: an Int32, a whole Double, an Int64 and a string, all of `version`.
fn row_text((pk, rk): (&str, &str), version: u64) -> String {
    format!(
        r#"{{"PartitionKey":"{pk}","RowKey":"{rk}","V":{},"Score":{}.0,"Score@odata.type":"Edm.Double","Big":"{}","Big@odata.type":"Edm.Int64","Name":"v{version} é\u2028"}}"#,
        version % 1000,
        version % 97,
        version as i64 * 1_000_000_007
    )
}

/// The table as the test drives it: live keys, deleted keys, and a version counter.
struct History {
    client: RawClient,
    table: String,
    rng: Rng,
    live: Vec<Key>,
    gone: Vec<Key>,
    version: u64,
    next_row: u64,
}

impl History {
    async fn write(&mut self, key: &Key) {
        self.version += 1;
        let text = row_text((&key.0, &key.1), self.version);
        let (table, keys) = (&self.table, (key.0.as_str(), key.1.as_str()));
        self.client
            .upsert(table, keys, &text)
            .await
            .expect("upsert");
    }

    async fn insert_new(&mut self, count: usize) -> Vec<Key> {
        let mut added = Vec::new();
        for _ in 0..count {
            let n = self.next_row;
            self.next_row += 1;
            let key = (format!("p{}", n % 7), format!("r{n:05}"));
            self.write(&key).await;
            self.live.push(key.clone());
            added.push(key);
        }
        added
    }

    /// Updates, deletes, inserts and re-inserts of deleted keys; returns the keys touched.
    async fn round(
        &mut self,
        updates: usize,
        deletes: usize,
        inserts: usize,
        back: usize,
    ) -> Vec<Key> {
        let mut touched = Vec::new();
        let mut pool = self.live.clone();
        for key in self.rng.take(&mut pool, updates) {
            self.write(&key).await;
            touched.push(key);
        }
        for key in self.rng.take(&mut pool, deletes) {
            assert!(self
                .client
                .delete(&self.table, &key.0, &key.1)
                .await
                .unwrap());
            self.live.retain(|k| *k != key);
            self.gone.push(key.clone());
            touched.push(key);
        }
        let mut gone = std::mem::take(&mut self.gone);
        for key in self.rng.take(&mut gone, back) {
            self.write(&key).await;
            self.live.push(key.clone());
            touched.push(key);
        }
        self.gone.extend(gone);
        touched.extend(self.insert_new(inserts).await);
        touched
    }
}

fn key_of(e: &RawEntity) -> Key {
    (e.partition_key(), e.row_key())
}

/// Starts an export (a delta with `since`) and waits for its end; its status.
async fn export(app: &TestApp, source: &str, at: (&str, &str), since: Option<&str>) -> Value {
    let mut body = json!({"driver": "export", "sourceTable": source, "takeCount": 9,
        "destinationContainer": at.0, "destinationPrefix": at.1});
    if let Some(since) = since {
        body["since"] = json!(since);
    }
    let id = app.start_scan(&body).await;
    app.wait_for_end(&id, SCAN_BOUND).await
}

async fn manifest(store: &AzureBlobStore, container: &str, prefix: &str) -> (Value, String) {
    let bytes = download(store, container, &format!("{prefix}/manifest.json"))
        .await
        .unwrap_or_else(|| panic!("{container}/{prefix}/manifest.json is missing"));
    (serde_json::from_slice(&bytes).unwrap(), sha256_hex(&bytes))
}

/// The keys listed in a manifest's files (`parts`, or a delta's tombstone files), read here.
async fn listed_keys(
    store: &AzureBlobStore,
    container: &str,
    prefix: &str,
    files: &Value,
) -> BTreeSet<Key> {
    let mut keys = BTreeSet::new();
    for file in files.as_array().into_iter().flatten() {
        let name = format!("{prefix}/{}", file["name"].as_str().unwrap());
        let bytes = download(store, container, &name)
            .await
            .expect("listed file");
        assert_eq!(
            file["sha256"].as_str(),
            Some(sha256_hex(&bytes).as_str()),
            "{name}"
        );
        for line in part_lines(&bytes).unwrap() {
            assert!(keys.insert(line_key(&line).unwrap()), "{name}: a key twice");
        }
    }
    keys
}

/// Checks a delta against the table's states before its parent ran (`before`) and when it
/// ran (`now`), apart from `touched` keys (changed while it ran): its parent, every changed
/// row in its parts, and exactly the deleted keys as tombstones.
async fn check_delta(
    store: &AzureBlobStore,
    container: &str,
    (prefix, parent): (&str, &str),
    (before, now): (&[RawEntity], &[RawEntity]),
    touched: &BTreeSet<Key>,
) {
    let (m, _) = manifest(store, container, prefix).await;
    let (_, parent_sha) = manifest(store, container, parent).await;
    assert_eq!(m["format"], "tablescan-export-delta/1", "{m}");
    assert_eq!(
        m["delta"]["parent"],
        json!({"prefix": parent, "sha256": parent_sha})
    );
    let old: BTreeMap<Key, &RawEntity> = before.iter().map(|e| (key_of(e), e)).collect();
    let new: BTreeMap<Key, &RawEntity> = now.iter().map(|e| (key_of(e), e)).collect();
    let parts = listed_keys(store, container, prefix, &m["parts"]).await;
    let tombstones = listed_keys(store, container, prefix, &m["delta"]["deleted"]).await;
    for (key, row) in &new {
        if old.get(key) != Some(row) && !touched.contains(key) {
            assert!(
                parts.contains(key),
                "{prefix}: changed row {key:?} is not in the delta"
            );
        }
    }
    let deleted: BTreeSet<Key> = old
        .keys()
        .filter(|k| !new.contains_key(*k))
        .cloned()
        .collect();
    let untouched =
        |s: &BTreeSet<Key>| -> BTreeSet<Key> { s.difference(touched).cloned().collect() };
    assert_eq!(
        untouched(&tombstones),
        untouched(&deleted),
        "{prefix}: tombstones"
    );
    assert_eq!(
        m["delta"]["deletedRows"].as_u64(),
        Some(tombstones.len() as u64)
    );
}

/// Restores `prefix` into a new table and compares it with `expected`; a `touched` key may
/// hold either its `expected` version or its `later` one (or be absent in the one it is absent).
async fn check_restore(
    app: &TestApp,
    client: &RawClient,
    (container, prefix): (&str, &str),
    expected: &[RawEntity],
    (touched, later): (&BTreeSet<Key>, &[RawEntity]),
) {
    let restored = unique_name("AsOf");
    let body = json!({"driver": "import", "sourceContainer": container,
        "sourcePrefix": prefix, "destinationTable": restored});
    let (_, status) = app.scan_until_end(&body, SCAN_BOUND).await;
    assert_eq!(status["state"], "completed", "{prefix}: {status}");
    let got = client.rows(&restored).await;
    let plain = |rows: &[RawEntity]| -> Vec<RawEntity> {
        rows.iter()
            .filter(|e| !touched.contains(&key_of(e)))
            .cloned()
            .collect()
    };
    assert_eq!(
        raw::diff(&plain(expected), &plain(&got)),
        Vec::<String>::new(),
        "{prefix}"
    );
    for key in touched {
        let find = |rows: &[RawEntity]| rows.iter().find(|e| key_of(e) == *key).cloned();
        let have = find(&got);
        assert!(
            have == find(expected) || have == find(later),
            "{prefix}: touched row {key:?} is {have:?}, in neither version"
        );
    }
}

/// A seeded history over a full export and three deltas restores, as of each backup, to the
/// table as it was then; each delta holds every changed row and exactly the deleted keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_restores_the_table_as_of_each_backup() {
    let proxy = proxy(FaultPolicy::none(), 41).await;
    let app = TestApp::start_through(1, Some(&proxy)).await;
    let client = RawClient::azurite();
    let store = blobs();
    let source = unique_name("Chain");
    client.create_table(&source).await.unwrap();
    let mut history = History {
        client: RawClient::azurite(),
        table: source.clone(),
        rng: Rng(0x41),
        live: Vec::new(),
        gone: Vec::new(),
        version: 0,
        next_row: 0,
    };
    history.insert_new(90).await;
    let container = unique_name("chain");
    let names = ["full", "d1", "d2", "d3"].map(|n| format!("{source}/{n}"));
    let none = BTreeSet::new();

    let s0 = client.rows(&source).await;
    let status = export(&app, &source, (&container, &names[0]), None).await;
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(status["rowsWritten"].as_i64(), Some(90), "{status}");

    history.round(12, 8, 6, 0).await;
    let s1 = client.rows(&source).await;
    let status = export(&app, &source, (&container, &names[1]), Some(&names[0])).await;
    assert_eq!(status["state"], "completed", "{status}");
    check_delta(
        &store,
        &container,
        (&names[1], &names[0]),
        (&s0, &s1),
        &none,
    )
    .await;

    // Delta 2: re-inserts of deleted keys, and rows changed while it runs (once its first blob
    // write is held: the tile has read its keys and rows by then).
    history.round(10, 6, 4, 4).await;
    let s2 = client.rows(&source).await;
    let body = json!({"driver": "export", "sourceTable": source, "takeCount": 9,
        "destinationContainer": container, "destinationPrefix": names[2], "since": names[1]});
    let hold = |_: &String| proxy.hold(Hold::blob_writes_to(&container));
    let id = start_then_arm(&app, &proxy, app.start_scan(&body), hold).await;
    tokio::time::timeout(SCAN_BOUND, proxy.wait_held(|h| h.now >= 1))
        .await
        .expect("the delta's first blob write is held");
    let during: BTreeSet<Key> = history.round(3, 2, 2, 1).await.into_iter().collect();
    proxy.release();
    let status = app.wait_for_end(&id, SCAN_BOUND).await;
    assert_eq!(status["state"], "completed", "{status}");
    let s2_after = client.rows(&source).await;
    check_delta(
        &store,
        &container,
        (&names[2], &names[1]),
        (&s1, &s2),
        &during,
    )
    .await;

    // Delta 3: nothing changed since delta 2 ended (its parts hold only rows within the
    // watermark's margin); its parent saw the changes made during it only partly.
    let status = export(&app, &source, (&container, &names[3]), Some(&names[2])).await;
    assert_eq!(status["state"], "completed", "{status}");
    check_delta(
        &store,
        &container,
        (&names[3], &names[2]),
        (&s2, &s2_after),
        &during,
    )
    .await;

    for (prefix, state) in names.iter().zip([&s0, &s1, &s2, &s2_after]) {
        let touched = if prefix == &names[2] { &during } else { &none };
        check_restore(
            &app,
            &client,
            (&container, prefix),
            state,
            (touched, &s2_after),
        )
        .await;
    }
    app.shutdown().await;
}

/// What must be refused is refused with a 400 naming the field, and writes nothing: a `since`
/// that is another table's export, an export that did not complete, or no export; a delta of
/// another filter or select than its base; and restores of a tampered chain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_chains_and_mismatched_deltas_are_refused_before_writing() {
    let app = TestApp::start(1, &[]).await;
    let client = RawClient::azurite();
    let store = blobs();
    let (source, other) = (unique_name("Refused"), unique_name("Other"));
    for table in [&source, &other] {
        client.create_table(table).await.unwrap();
        for i in 0..12u64 {
            let key = (format!("p{}", i % 3), format!("r{i:02}"));
            client
                .upsert(table, (&key.0, &key.1), &row_text((&key.0, &key.1), i))
                .await
                .unwrap();
        }
    }
    let container = unique_name("refusals");
    for (table, prefix) in [(&source, "base"), (&other, "other")] {
        let status = export(&app, table, (&container, prefix), None).await;
        assert_eq!(status["state"], "completed", "{status}");
    }
    put(
        &store,
        &container,
        "failed/reservation.json",
        r#"{"scanId":"s-x"}"#,
        "application/json",
    )
    .await;
    let delta = |since: &str, extra: Value| {
        let mut body = json!({"driver": "export", "sourceTable": source,
            "destinationContainer": container, "destinationPrefix": "delta", "since": since});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    let refusals = [
        (delta("other", json!({})), "since", "not of"),
        (delta("failed", json!({})), "since", "did not complete"),
        (delta("nothing", json!({})), "since", "holds no export"),
        (
            delta("base", json!({"filter": "V gt 3"})),
            "filter",
            "differs",
        ),
        (delta("base", json!({"select": ["V"]})), "select", "differs"),
    ];
    for (body, field, says) in refusals {
        let (code, reply, _) = app.post_scan(&body).await;
        assert_eq!(
            (code, &reply["error"]["field"]),
            (400, &json!(field)),
            "{body}: {reply}"
        );
        assert!(reply.to_string().contains(says), "{body}: {reply}");
    }
    assert!(
        list_all(&store, &container, "delta/").await.is_empty(),
        "a refusal wrote nothing"
    );

    // A good delta, then its parent tampered with, then removed.
    let status = export(&app, &source, (&container, "delta"), Some("base")).await;
    assert_eq!(status["state"], "completed", "{status}");
    let manifest = download(&store, &container, "base/manifest.json")
        .await
        .unwrap();
    let mut changed = manifest.to_vec();
    changed.push(b' ');
    put(
        &store,
        &container,
        "base/manifest.json",
        changed,
        "application/json",
    )
    .await;
    let restore = |destination: &str| {
        json!({"driver": "import", "sourceContainer": container, "sourcePrefix": "delta",
            "destinationTable": destination})
    };
    let destination = unique_name("Never");
    let (code, reply, _) = app.post_scan(&restore(&destination)).await;
    assert_eq!(
        (code, &reply["error"]["field"]),
        (400, &json!("sourcePrefix")),
        "{reply}"
    );
    assert!(
        reply.to_string().contains("broken at") && reply.to_string().contains("/base"),
        "{reply}"
    );
    store_delete(&store, &container, "base/manifest.json").await;
    let (code, reply, _) = app.post_scan(&restore(&destination)).await;
    assert_eq!(code, 400, "{reply}");
    assert!(reply.to_string().contains("manifest is missing"), "{reply}");
    assert!(
        client.read_all(&destination).await.is_err(),
        "no table was created"
    );
    app.shutdown().await;
}

async fn store_delete(store: &AzureBlobStore, container: &str, name: &str) {
    use tablescan::storage::blob::BlobStore;
    store.delete(container, name).await.unwrap();
}
