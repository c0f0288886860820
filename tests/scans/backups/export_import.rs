//! Export and import end to end on Azurite, through the local Functions host and the real
//! handler: the export's files are read back **without tablescan's decoder** (the test's own
//! gzip + generic JSON + SHA-256), the restore is read with the test's own REST client
//! (`support::raw`), and which rows a filter selects is decided by the test's own predicate.
//! Requests the drivers must refuse get a 4xx naming the field, and write nothing.

use crate::support;

use std::collections::BTreeSet;
use std::io::Read;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use support::backup::{blobs, put};
use support::e2e::TestApp;
use support::raw::{self, RawClient, RawEntity};
use support::{unique_name, with_fields};
use tablescan::storage::azure_blob::AzureBlobStore;
use tablescan::storage::blob::{BlobStore, BlobWrite};

async fn download(store: &AzureBlobStore, container: &str, name: &str) -> Bytes {
    store
        .download(container, name, 64 << 20)
        .await
        .unwrap_or_else(|e| panic!("{container}/{name}: {e}"))
        .bytes
}

/// Seeds `rows` rows over a dozen partitions, written as the test's own JSON text: an Int32
/// `Downloads` (the filter's subject), a whole Double, an Int64, a string with a line separator.
async fn seed(client: &RawClient, table: &str, rows: usize) -> Vec<RawEntity> {
    client.create_table(table).await.expect("create table");
    for i in 0..rows {
        let body = format!(
            r#"{{"PartitionKey":"pk{:02}","RowKey":"r{i:03}","Downloads":{},"Score":{i}.0,"Score@odata.type":"Edm.Double","Big":"{}","Big@odata.type":"Edm.Int64","Name":"row {i}\u2028"}}"#,
            i % 12,
            i * 37 % 100,
            i as i64 * 1_000_000_007
        );
        client.insert(table, &body).await.expect("raw insert");
    }
    let read = client.rows(table).await;
    assert_eq!(read.len(), rows);
    read
}

/// The lines of a part, inflated by flate2 and parsed as generic JSON (not tablescan's decoder).
fn part_lines(bytes: &[u8]) -> Vec<serde_json::Map<String, Value>> {
    let mut text = String::new();
    flate2::read::MultiGzDecoder::new(bytes)
        .read_to_string(&mut text)
        .expect("a gzip file of UTF-8 text");
    assert!(text.ends_with('\n'), "every line ends with a line feed");
    text.split_terminator('\n')
        .map(|line| match serde_json::from_str(line) {
            Ok(Value::Object(map)) => map,
            other => panic!("not a JSON object: {line:?} ({other:?})"),
        })
        .collect()
}

/// Checks an export's manifest and parts against the rows expected in it (keys and property
/// names), and returns the manifest.
async fn check_export(
    store: &AzureBlobStore,
    container: &str,
    prefix: &str,
    expected: &[RawEntity],
    scan_id: &str,
) -> Value {
    let manifest: Value = serde_json::from_slice(
        &download(store, container, &format!("{prefix}/manifest.json")).await,
    )
    .expect("the manifest is JSON");
    assert_eq!(manifest["format"], "tablescan-export/1");
    assert_eq!(manifest["scanId"], scan_id);
    assert_eq!(manifest["rows"].as_u64(), Some(expected.len() as u64));
    let parts = manifest["parts"].as_array().expect("parts");
    let names: Vec<&str> = parts.iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert!(names.windows(2).all(|w| w[0] < w[1]), "parts in name order");
    let mut keys = BTreeSet::new();
    for part in parts {
        let name = part["name"].as_str().unwrap();
        assert!(name.starts_with(&format!("parts/{scan_id}/")) && name.ends_with(".jsonl.gz"));
        let bytes = download(store, container, &format!("{prefix}/{name}")).await;
        assert_eq!(part["bytes"].as_u64(), Some(bytes.len() as u64), "{name}");
        let digest: String = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(part["sha256"].as_str(), Some(digest.as_str()), "{name}");
        let lines = part_lines(&bytes);
        assert_eq!(part["rows"].as_u64(), Some(lines.len() as u64), "{name}");
        for line in lines {
            let key = (line["PartitionKey"].to_string(), line["RowKey"].to_string());
            let source = expected
                .iter()
                .find(|e| {
                    (
                        json!(e.partition_key()).to_string(),
                        json!(e.row_key()).to_string(),
                    ) == key
                })
                .unwrap_or_else(|| panic!("{name}: unexpected row {key:?}"));
            let mut want: Vec<&str> = source.properties.keys().map(String::as_str).collect();
            let mut got: Vec<&str> = line.keys().map(String::as_str).collect();
            want.extend(["PartitionKey", "RowKey"]);
            want.sort_unstable();
            got.sort_unstable();
            // Every property, and Edm.Double on every double (Azurite drops it on store).
            want.retain(|n| *n != "Score@odata.type");
            got.retain(|n| *n != "Score@odata.type");
            assert_eq!(got, want, "{name}: properties of {key:?}");
            if line.contains_key("Score") {
                assert_eq!(line["Score@odata.type"], "Edm.Double", "{name}: {key:?}");
            }
            assert!(keys.insert(key.clone()), "{name}: {key:?} exported twice");
        }
    }
    assert_eq!(
        keys.len(),
        expected.len(),
        "every expected row exported once"
    );
    manifest
}

/// An export with a filter and a select writes the documented format with exactly the rows
/// the filter selects and the selected columns; its import restores them byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filtered_export_is_the_documented_format_and_restores_exactly() {
    let app = TestApp::start(1, &[]).await;
    let client = RawClient::azurite();
    let store = blobs();
    let source = unique_name("Backup");
    let all = seed(&client, &source, 90).await;
    let container = unique_name("backups");
    let prefix = format!("nightly/{source}");
    // The test's own predicate for `Downloads gt 50`, and the projection of select.
    let matching: Vec<RawEntity> = all
        .iter()
        .filter(|e| raw::integer(e.text("Downloads")).unwrap() > 50)
        .map(|e| {
            let mut e = e.clone();
            e.properties
                .retain(|n, _| ["Name", "Score", "Score@odata.type"].contains(&n.as_str()));
            e
        })
        .collect();
    assert!(!matching.is_empty() && matching.len() < all.len());

    let body = json!({"driver": "export", "sourceTable": source, "takeCount": 7,
        "filter": "Downloads gt 50", "select": ["Name", "Score"],
        "destinationContainer": container, "destinationPrefix": prefix});
    let id = app.start_scan(&body).await;
    let status = app.wait_for_end(&id, Duration::from_secs(180)).await;
    assert_eq!(status["state"], "completed", "{status}");
    let m = matching.len() as i64;
    let counts = ["rowsScanned", "rowsMatched", "rowsWritten"].map(|f| status[f].as_i64());
    assert_eq!(
        counts,
        [Some(all.len() as i64), Some(m), Some(m)],
        "{status}"
    );
    check_export(&store, &container, &prefix, &matching, &id).await;

    // The same prefix again is refused: an export never overwrites another.
    let (code, reply, _) = app.post_scan(&body).await;
    assert_eq!(
        (code, &reply["error"]["field"]),
        (400, &json!("destinationPrefix")),
        "{reply}"
    );

    let restored = unique_name("Restored");
    let body = json!({"driver": "import", "sourceContainer": container,
        "sourcePrefix": prefix, "destinationTable": restored});
    let status = app.scan_until_end(&body, Duration::from_secs(180)).await.1;
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(status["rowsWritten"].as_i64(), Some(m), "{status}");
    assert_eq!(
        raw::diff(&matching, &client.rows(&restored).await),
        Vec::<String>::new()
    );
    app.shutdown().await;
}

/// An import whose part does not match its manifest fails, naming the part, and an export of
/// an empty range writes a manifest with no parts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_fails_naming_a_part_that_does_not_match_and_empty_exports_work() {
    let app = TestApp::start(1, &[]).await;
    let client = RawClient::azurite();
    let store = blobs();
    let source = unique_name("Tampered");
    seed(&client, &source, 30).await;
    let container = unique_name("tamper");
    let body = json!({"driver": "export", "sourceTable": source, "takeCount": 10,
        "destinationContainer": container});
    let status = app.scan_until_end(&body, Duration::from_secs(180)).await.1;
    assert_eq!(status["state"], "completed", "{status}");

    let manifest: Value =
        serde_json::from_slice(&download(&store, &container, "manifest.json").await).unwrap();
    let victim = manifest["parts"][0]["name"].as_str().unwrap().to_string();
    let mut lines = part_lines(&download(&store, &container, &victim).await);
    lines.pop();
    let mut text = String::new();
    for line in &lines {
        text.push_str(&serde_json::to_string(line).unwrap());
        text.push('\n');
    }
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gz, text.as_bytes()).unwrap();
    let write = BlobWrite::new("application/gzip");
    store
        .upload(
            &container,
            &victim,
            Bytes::from(gz.finish().unwrap()),
            &write,
        )
        .await
        .unwrap();
    let restored = unique_name("Restored");
    let body =
        json!({"driver": "import", "sourceContainer": container, "destinationTable": restored});
    let status = app.scan_until_end(&body, Duration::from_secs(180)).await.1;
    assert_eq!(status["state"], "failed", "{status}");
    let error = status["error"].as_str().unwrap_or_default();
    assert!(
        error.contains(&victim) && error.contains("SHA-256"),
        "{status}"
    );

    // An export of an empty range: a manifest with no parts, and an import of it writes nothing.
    let prefix = "empty";
    let body = json!({"driver": "export", "sourceTable": source, "partitionKeyPrefix": "zz",
        "destinationContainer": container, "destinationPrefix": prefix});
    let status = app.scan_until_end(&body, Duration::from_secs(180)).await.1;
    assert_eq!(status["state"], "completed", "{status}");
    check_export(
        &store,
        &container,
        prefix,
        &[],
        status["id"].as_str().unwrap(),
    )
    .await;
    let empty = unique_name("Empty");
    let body = json!({"driver": "import", "sourceContainer": container, "sourcePrefix": prefix, "destinationTable": empty});
    let status = app.scan_until_end(&body, Duration::from_secs(180)).await.1;
    assert_eq!(
        (status["state"].as_str(), status["rowsWritten"].as_i64()),
        (Some("completed"), Some(0)),
        "{status}"
    );
    assert!(client.rows(&empty).await.is_empty());
    app.shutdown().await;
}

/// Requests the export and import drivers refuse: a 4xx naming the field, no scan recorded,
/// no table created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_export_and_import_requests_get_4xx_naming_the_field() {
    // A SAS connection with table and queue endpoints only: no blob endpoint, nor an account
    // name to derive one from (the requests are refused before any storage is used).
    let azurite = support::azurite();
    let no_blobs = format!(
        "SharedAccessSignature=sv=2020-08-04&ss=tq&srt=sco&sp=rl&se=2099-01-01T00:00:00Z&sig=x%3D;\
         TableEndpoint={};QueueEndpoint={}",
        azurite.table_endpoint(),
        azurite.queue_endpoint()
    );
    let app = TestApp::start(
        1,
        &[
            ("TABLESCAN_CONNECTIONS", "NoBlobs"),
            ("NoBlobs", no_blobs.as_str()),
        ],
    )
    .await;
    let (client, store) = (RawClient::azurite(), blobs());
    let source = unique_name("Checked");
    seed(&client, &source, 3).await;
    let container = unique_name("checked");
    store.create_container(&container).await.unwrap();
    put(
        &store,
        &container,
        "junk/manifest.json",
        Bytes::from_static(b"{\"format\":\"other\"}"),
        "application/json",
    )
    .await;
    let dest = unique_name("NeverMade");
    let never = unique_name("nevermade");
    let export = |extra: Value| {
        with_fields(
            &json!({"driver": "export", "sourceTable": source, "destinationContainer": container}),
            extra,
        )
    };
    let import = |extra: Value| {
        with_fields(
            &json!({"driver": "import", "sourceContainer": container, "sourcePrefix": "junk", "destinationTable": dest}),
            extra,
        )
    };
    let cases = [
        (
            export(json!({"destinationContainer": "Bad_Name"})),
            "destinationContainer",
        ),
        (
            export(json!({"destinationContainer": null})),
            "destinationContainer",
        ),
        (
            export(json!({"destinationPrefix": "/abs"})),
            "destinationPrefix",
        ),
        (
            export(json!({"destinationPrefix": "a/../b"})),
            "destinationPrefix",
        ),
        (
            export(json!({"destinationPrefix": "junk"})),
            "destinationPrefix",
        ),
        (
            export(json!({"destinationConnection": "Elsewhere"})),
            "destinationConnection",
        ),
        (
            export(json!({"destinationConnection": "NoBlobs"})),
            "destinationConnection",
        ),
        (
            export(json!({"destinationTable": "Other"})),
            "destinationTable",
        ),
        (export(json!({"filter": "Downloads gt"})), "filter"),
        (import(json!({})), "sourcePrefix"),
        (
            import(json!({"sourcePrefix": "nothing/here"})),
            "sourcePrefix",
        ),
        (import(json!({"sourceContainer": "x"})), "sourceContainer"),
        (
            import(json!({"sourceConnection": "NoBlobs"})),
            "sourceConnection",
        ),
        (import(json!({"sourceTable": source})), "sourceTable"),
        (import(json!({"filter": "Downloads gt 1"})), "filter"),
        (import(json!({"select": ["Name"]})), "select"),
        (
            import(json!({"destinationTable": "1bad"})),
            "destinationTable",
        ),
        (
            import(json!({"partitionKeyPrefix": "a"})),
            "partitionKeyPrefix",
        ),
    ];
    for (body, field) in cases {
        let (status, reply, _) = app.post_scan(&body).await;
        assert_eq!(status, 400, "{body} → {reply}");
        assert_eq!(reply["error"]["field"], field, "{body} → {reply}");
    }
    let (_, list) = app.get("/api/scans").await;
    assert_eq!(list["scans"].as_array().map(Vec::len), Some(0), "{list}");
    let listed = store.list(&never, "", 10, None).await;
    assert!(
        listed.is_err(),
        "the export's container was not created: {listed:?}"
    );
    let made = client.read_all(&dest).await;
    assert!(made.is_err(), "the import's destination was not created");
    app.shutdown().await;
}
