//! What an index build deletes once the pointer names it (docs/index.md, "Retention"): its own
//! staging records; old builds' staging records; superseded builds once their grace
//! (`keepSupersededSeconds`) has passed — not before, so a lookup paging through one still
//! answers from it; never-published builds at once; never a build newer than the one deleting.
//!
//! What exists is read with the test's own List Blobs client ([`RawBlobs`]: its own SharedKey
//! signing and XML reading), not tablescan's blob store.

use super::*;

use std::time::SystemTime;

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tablescan::storage::connection::{DEVELOPMENT_ACCOUNT, DEVELOPMENT_ACCOUNT_KEY};

/// A List Blobs client on the shared Azurite (hand-written: the oracle shares no code with the
/// store it checks).
struct RawBlobs {
    http: reqwest::Client,
    /// `http://127.0.0.1:port/devstoreaccount1`
    base: String,
    key: Vec<u8>,
}

impl RawBlobs {
    fn azurite() -> RawBlobs {
        RawBlobs {
            http: reqwest::Client::new(),
            base: support::azurite().blob_endpoint(),
            key: base64::engine::general_purpose::STANDARD
                .decode(DEVELOPMENT_ACCOUNT_KEY)
                .unwrap(),
        }
    }

    /// One List Blobs page: Blob SharedKey, `GET` + 12 empty standard headers + the `x-ms-`
    /// headers + `/account/devstoreaccount1/container` + each query parameter, sorted.
    async fn page(&self, container: &str, query: &[(&str, &str)]) -> String {
        let date = httpdate::fmt_http_date(SystemTime::now());
        let version = "2021-10-04";
        let mut sorted = query.to_vec();
        sorted.sort();
        let mut string_to_sign = format!(
            "GET\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:{date}\nx-ms-version:{version}\n/{DEVELOPMENT_ACCOUNT}/{DEVELOPMENT_ACCOUNT}/{container}"
        );
        for (k, v) in &sorted {
            string_to_sign.push_str(&format!("\n{k}:{v}"));
        }
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).unwrap();
        mac.update(string_to_sign.as_bytes());
        let signature =
            base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
        let response = self
            .http
            .get(format!("{}/{container}", self.base))
            .query(query)
            .header(
                "authorization",
                format!("SharedKey {DEVELOPMENT_ACCOUNT}:{signature}"),
            )
            .header("x-ms-date", &date)
            .header("x-ms-version", version)
            .send()
            .await
            .unwrap();
        let status = response.status();
        let body = response.text().await.unwrap();
        assert!(status.is_success(), "raw List Blobs: {status} {body}");
        body
    }

    /// Every blob name under `prefix`.
    async fn names(&self, container: &str, prefix: &str) -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        let mut marker = String::new();
        for _ in 0..100 {
            let mut query = vec![
                ("comp", "list"),
                ("prefix", prefix),
                ("restype", "container"),
            ];
            if !marker.is_empty() {
                query.push(("marker", marker.as_str()));
            }
            let xml = self.page(container, &query).await;
            names.extend(elements(&xml, "Name"));
            match elements(&xml, "NextMarker").pop() {
                Some(next) if !next.is_empty() => marker = next,
                _ => return names,
            }
        }
        panic!("listing {container}/{prefix} never ended");
    }
}

/// The texts of every `<tag>…</tag>` element (XML's five escapes undone).
fn elements(xml: &str, tag: &str) -> Vec<String> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    xml.split(open.as_str())
        .skip(1)
        .filter_map(|s| s.split_once(close.as_str()).map(|(text, _)| text))
        .map(|t| {
            t.replace("&lt;", "<")
                .replace("&gt;", ">")
                .replace("&quot;", "\"")
                .replace("&apos;", "'")
                .replace("&amp;", "&")
        })
        .collect()
}

/// A build's blobs, relative to its folder.
async fn files(raw: &RawBlobs, container: &str, prefix: &str, build: &str) -> BTreeSet<String> {
    let folder = format!("{prefix}/builds/{build}/");
    raw.names(container, &folder)
        .await
        .into_iter()
        .map(|n| n[folder.len()..].to_string())
        .collect()
}

/// A published build's blobs: its manifest and segments, and no staging record left.
fn published(files: &BTreeSet<String>, what: &str) {
    assert!(files.contains("manifest.json"), "{what}: {files:?}");
    assert!(
        files.iter().any(|f| f.starts_with("segments/")),
        "{what}: {files:?}"
    );
    assert!(
        !files.iter().any(|f| f.starts_with("staging/")),
        "{what}: staging records left: {files:?}"
    );
}

/// A scan id of a build started `offset_ms` from now (the format the app makes).
fn build_id(offset_ms: i64) -> String {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    format!("{:013}-0000beef", 9_999_999_999_999i64 - (now + offset_ms))
}

/// A blob delete answers whether the blob was there, and a missing blob (or container) is not
/// an error; each delete is counted as one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blob_delete_is_idempotent() {
    let counters = Arc::new(BlobRequestCounters::new());
    let store = support::account().blob_store(counters.clone()).unwrap();
    let container = unique_name("deletes");
    store.create_container(&container).await.unwrap();
    let write = BlobWrite::new("application/octet-stream");
    for name in ["a/1", "a/2"] {
        store
            .upload(&container, name, bytes::Bytes::from_static(b"x"), &write)
            .await
            .unwrap();
    }
    let raw = RawBlobs::azurite();
    assert_eq!(raw.names(&container, "a/").await.len(), 2);
    assert!(store.delete(&container, "a/1").await.unwrap());
    assert!(!store.delete(&container, "a/1").await.unwrap(), "again");
    assert!(!store.delete(&unique_name("nosuch"), "a/1").await.unwrap());
    let left = raw.names(&container, "a/").await;
    assert_eq!(left, BTreeSet::from(["a/2".to_string()]));
    assert_eq!(counters.snapshot().delete, 3);
}

/// Four builds of one prefix, each cleaning up once it switched. A build's staging records are
/// gone once it completed. A rebuild keeps the build it replaces, and the next rebuild keeps it
/// too while its grace runs: a lookup paging through it still answers from it. A rebuild
/// started after the grace deletes it (and every build superseded before), and a
/// never-published build at once; a build newer than the one cleaning (as a running one would
/// be) is never touched. A staging record left in an ended build is deleted by the next build. A token of a deleted build answers 404. (A build really running beside another's
/// cleanup cannot be set up: the reservation refuses a second build of a prefix; a late
/// duplicate of an old build's item is the only way one meets it, and the newer build planted
/// here stands for it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_deletes_superseded_builds_after_their_grace_and_no_newer_build() {
    let app = TestApp::start(1, &[]).await;
    let client = RawClient::azurite();
    let raw = RawBlobs::azurite();
    let table = unique_name("Pruned");
    // As many rows as the first test's: 'alice' is in more ranges than a lookup reads per call.
    let written = seed(&client, &table, 600, "a").await;
    let raw_rows = client.rows(&table).await;
    let container = unique_name("prunes");
    let prefix = "idx";
    let body = |keep: u64| {
        // Many small ranges (the engine's fan-out), so that a lookup of 'alice' pages.
        json!({"driver": "index", "sourceTable": table, "property": "V", "takeCount": 10,
        "destinationContainer": container, "destinationPrefix": prefix,
        "keepSupersededSeconds": keep, "segmentsPerFirstPrefix": 4, "segmentsPerSubsequentPrefix": 2})
    };
    let id = |status: Value| status["id"].as_str().unwrap().to_string();

    let a = id(build(&app, &body(3600)).await);
    published(&files(&raw, &container, prefix, &a).await, "A");
    let lookup = json!({"sourceContainer": container, "sourcePrefix": prefix, "value": "'alice'"});
    let (status, first, mut rows) = post_lookup(&app, &lookup).await;
    assert_eq!(
        (status, first["index"]["build"].as_str()),
        (200, Some(a.as_str()))
    );
    let token = first["continuationToken"]
        .as_str()
        .expect("paged")
        .to_string();

    // B: A, superseded by B's own switch, is in its grace: kept whole.
    let b = id(build(&app, &body(3600)).await);
    published(&files(&raw, &container, prefix, &a).await, "A after B");
    published(&files(&raw, &container, prefix, &b).await, "B");
    // A staging record left in A (as a cleanup that failed would leave it): C deletes it.
    let store = blobs();
    let write = BlobWrite::new("application/octet-stream");
    let plant = |name: String| {
        let (store, write, container) = (&store, &write, &container);
        async move {
            let bytes = bytes::Bytes::from_static(b"x");
            store.upload(container, &name, bytes, write).await.unwrap();
        }
    };
    plant(format!("{prefix}/builds/{a}/staging/left.rec")).await;
    // C: A was superseded when B switched, within C's grace: kept, but for its staging.
    let c = id(build(&app, &body(3600)).await);
    published(&files(&raw, &container, prefix, &a).await, "A after C");
    // The lookup that started on A pages on through A, whole.
    let mut next = Some(token.clone());
    while let Some(t) = next {
        let mut page = lookup.clone();
        page["continuationToken"] = json!(t);
        let (status, answer, got) = post_lookup(&app, &page).await;
        assert_eq!(
            (status, answer["index"]["build"].as_str()),
            (200, Some(a.as_str())),
            "{answer}"
        );
        rows.extend(got);
        next = answer["continuationToken"].as_str().map(str::to_string);
    }
    check_rows("'alice'", &rows, &written, &raw_rows);

    // A never-published build older than D (no manifest), one newer than D, and a staging
    // record left in C, which D supersedes.
    let (failed, newer) = (build_id(-600_000), build_id(3_600_000));
    for name in [
        format!("{prefix}/builds/{failed}/staging/x.rec"),
        format!("{prefix}/builds/{failed}/segments/x.seg"),
        format!("{prefix}/builds/{newer}/staging/x.rec"),
        format!("{prefix}/builds/{c}/staging/left.rec"),
    ] {
        plant(name).await;
    }
    // D, started more than its 2 s of grace after C switched: A and B go (superseded when B and
    // C switched), C stays (superseded by D's own switch) but for its staging, the
    // never-published build goes, the newer one stays.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let d = id(build(&app, &body(2)).await);
    for (gone, what) in [(&a, "A"), (&b, "B"), (&failed, "the failed build")] {
        let left = files(&raw, &container, prefix, gone).await;
        assert!(left.is_empty(), "{what} after D: {left:?}");
    }
    published(&files(&raw, &container, prefix, &c).await, "C after D");
    published(&files(&raw, &container, prefix, &d).await, "D");
    let newer_files = files(&raw, &container, prefix, &newer).await;
    assert_eq!(newer_files, BTreeSet::from(["staging/x.rec".to_string()]));

    // A's token: its build is gone, 404; a new lookup answers from D, whole.
    let mut page = lookup.clone();
    page["continuationToken"] = json!(token);
    let (status, answer, _) = post_lookup(&app, &page).await;
    assert_eq!(status, 404, "{answer}");
    let (rows, answers) = lookup_all(&app, &container, prefix, "'alice'").await;
    assert_eq!(answers[0]["index"]["build"].as_str(), Some(d.as_str()));
    check_rows("'alice'", &rows, &written, &raw_rows);
    app.shutdown().await;
}
