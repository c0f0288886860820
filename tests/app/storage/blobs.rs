//! The blob store against real Azurite: uploads with content type and encoding, conditions,
//! downloads within a size bound, listings a bounded page at a time, blocks staged over several
//! "invocations" and committed, not-found and conflict errors; an export part through it; and a
//! keyless (Entra ID bearer) connection on an HTTPS Azurite in OAuth mode.
//!
//! The keyless part uses the shared identity test support (`tests/support/identity.rs`): every
//! test sets its process-wide settings first, before any client is built.

use crate::support;

use support::identity::app_service_settings;
use support::identity::endpoints::{fakes, Identity};

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::json;
use sha2::{Digest, Sha256};
use tablescan::app::export_format::{
    decode_part, encode_part, part_name, DecodeLimits, ExportLayout, Manifest, ManifestPart,
    MANIFEST_CONTENT_TYPE, MAX_MANIFEST_BYTES, PART_CONTENT_TYPE,
};
use tablescan::storage::azure_blob::AzureBlobStore;
use tablescan::storage::blob::{
    BlobRequestCounters, BlobStore, BlobWrite, BlockListing, WriteCondition,
};
use tablescan::storage::connection::StorageAccount;
use tablescan::storage::{Entity, StorageErrorKind};

/// A blob store with a key on the shared (plain http) Azurite.
fn keyed_store() -> (AzureBlobStore, Arc<BlobRequestCounters>) {
    // Every client of this process trusts the OAuth Azurite's certificate (set before any is built).
    support::identity::keyless_environment();
    let counters = Arc::new(BlobRequestCounters::new());
    let store = support::account().blob_store(counters.clone()).unwrap();
    (store, counters)
}

/// A fresh container on `store`.
async fn container(store: &AzureBlobStore, prefix: &str) -> String {
    let name = support::unique_name(prefix);
    assert!(store.create_container(&name).await.unwrap());
    name
}

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[tokio::test]
async fn upload_download_properties_and_conditions() {
    let (store, counters) = keyed_store();
    let c = container(&store, "up").await;
    assert!(!store.create_container(&c).await.unwrap(), "exists already");

    let body = Bytes::from_static(b"\x1f\x8b hello \xff");
    let write = BlobWrite::new("application/x-ndjson").with_encoding("gzip");
    let etag = store
        .upload(&c, "dir/a b+é.bin", body.clone(), &write)
        .await
        .unwrap();
    let got = store.download(&c, "dir/a b+é.bin", 1024).await.unwrap();
    assert_eq!(got.bytes, body);
    assert_eq!(got.properties.etag, etag);
    assert_eq!(got.properties.size, body.len() as u64);
    assert_eq!(
        got.properties.content_type.as_deref(),
        Some("application/x-ndjson")
    );
    assert_eq!(got.properties.content_encoding.as_deref(), Some("gzip"));
    let props = store
        .properties(&c, "dir/a b+é.bin")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (props.size, props.etag.as_str()),
        (body.len() as u64, etag.as_str())
    );

    // Write once: a second IfNotExists write conflicts; IfMatch needs the current ETag.
    let once = BlobWrite::new("text/plain").with_condition(WriteCondition::IfNotExists);
    store
        .upload(&c, "once", Bytes::from("1"), &once)
        .await
        .unwrap();
    let e = store
        .upload(&c, "once", Bytes::from("2"), &once)
        .await
        .unwrap_err();
    assert_eq!(e.kind, StorageErrorKind::Conflict, "{e}");
    let stale =
        BlobWrite::new("text/plain").with_condition(WriteCondition::IfMatch("\"0x1\"".into()));
    let e = store
        .upload(&c, "dir/a b+é.bin", Bytes::new(), &stale)
        .await
        .unwrap_err();
    assert_eq!(e.kind, StorageErrorKind::PreconditionFailed, "{e}");
    let fresh = BlobWrite::new("text/plain").with_condition(WriteCondition::IfMatch(etag.clone()));
    let newer = store
        .upload(&c, "dir/a b+é.bin", Bytes::new(), &fresh)
        .await
        .unwrap();
    assert_ne!(newer, etag);
    // An ETag condition on a blob that does not exist is not met either.
    let e = store
        .upload(&c, "absent", Bytes::new(), &fresh)
        .await
        .unwrap_err();
    assert_eq!(e.kind, StorageErrorKind::PreconditionFailed, "{e}");
    // An empty blob downloads as empty (the service refuses any range of it: 416).
    let empty = store.download(&c, "dir/a b+é.bin", 10).await.unwrap();
    assert!(empty.bytes.is_empty());
    assert_eq!(empty.properties.etag, newer);

    // Missing things.
    assert_eq!(store.properties(&c, "nothing").await.unwrap(), None);
    let e = store.download(&c, "nothing", 10).await.unwrap_err();
    assert_eq!(e.kind, StorageErrorKind::NotFound, "{e}");
    assert_eq!(e.code.as_deref(), Some("BlobNotFound"), "{e}");
    let e = store
        .upload("no-such-container", "a", Bytes::new(), &write)
        .await
        .unwrap_err();
    assert_eq!(e.code.as_deref(), Some("ContainerNotFound"), "{e}");
    assert_eq!(
        store.properties("no-such-container", "a").await.unwrap(),
        None
    );
    // Refused before sending.
    let before = counters.snapshot().total();
    let e = store
        .upload("Bad_Name", "a", Bytes::new(), &write)
        .await
        .unwrap_err();
    assert_eq!(e.kind, StorageErrorKind::InvalidInput);
    assert_eq!(counters.snapshot().total(), before);
    let counts = counters.snapshot();
    assert_eq!(counts.admin, 2);
    assert!(counts.write >= 6 && counts.read >= 5, "{counts:?}");
}

/// A download reads at most its bound: a blob one byte longer fails naming the bound, one of
/// exactly the bound succeeds; a 5 MiB blob under a 1 MiB bound too.
#[tokio::test]
async fn downloads_stop_at_their_size_bound() {
    let (store, _) = keyed_store();
    let c = container(&store, "bound").await;
    let write = BlobWrite::new("application/octet-stream");
    let bytes: Vec<u8> = (0..1001u32).map(|i| (i % 251) as u8).collect();
    store
        .upload(&c, "b", Bytes::from(bytes.clone()), &write)
        .await
        .unwrap();
    let got = store.download(&c, "b", 1001).await.unwrap();
    assert_eq!(&got.bytes[..], &bytes[..]);
    let e = store.download(&c, "b", 1000).await.unwrap_err();
    assert_eq!(e.kind, StorageErrorKind::InvalidInput, "{e}");
    assert!(e.message.contains("larger than the 1000-byte bound"), "{e}");
    let big = Bytes::from(vec![7u8; 5 << 20]);
    store.upload(&c, "big", big.clone(), &write).await.unwrap();
    let e = store.download(&c, "big", 1 << 20).await.unwrap_err();
    assert_eq!(e.kind, StorageErrorKind::InvalidInput, "{e}");
    assert_eq!(store.download(&c, "big", 5 << 20).await.unwrap().bytes, big);
}

#[tokio::test]
async fn listings_come_a_bounded_page_at_a_time() {
    let (store, counters) = keyed_store();
    let c = container(&store, "list").await;
    let write = BlobWrite::new("text/plain");
    let mut expected = Vec::new();
    for i in 0..7 {
        let name = format!("exp/parts/s1/c-{i:02}.jsonl.gz");
        store
            .upload(&c, &name, Bytes::from(vec![b'x'; i + 1]), &write)
            .await
            .unwrap();
        expected.push(name);
    }
    store
        .upload(&c, "exp/manifest.json", Bytes::from("{}"), &write)
        .await
        .unwrap();
    store
        .upload(&c, "other/parts/x", Bytes::from("1"), &write)
        .await
        .unwrap();

    let before = counters.snapshot().list;
    let (mut names, mut marker, mut pages) = (Vec::new(), None::<String>, 0);
    loop {
        let page = store
            .list(&c, "exp/parts/", 3, marker.as_deref())
            .await
            .unwrap();
        pages += 1;
        assert!(page.blobs.len() <= 3);
        for blob in &page.blobs {
            let i: u64 = blob.name[15..17].parse().unwrap();
            assert_eq!(blob.size, i + 1, "{}", blob.name);
        }
        names.extend(page.blobs.into_iter().map(|b| b.name));
        match page.next_marker {
            Some(next) => marker = Some(next),
            None => break,
        }
        assert!(pages < 10, "the listing does not end");
    }
    assert_eq!(names, expected);
    assert_eq!(pages, 3);
    assert_eq!(counters.snapshot().list - before, 3);
    let all = store.list(&c, "", 5000, None).await.unwrap();
    assert_eq!(all.blobs.len(), 9);
    assert_eq!(all.next_marker, None);
    assert!(store.list(&c, "", 5001, None).await.is_err());
}

/// A manifest assembled over several invocations: each stages its block (a redelivery restages
/// the same id), a later one commits the list; committing again with one more block keeps the
/// committed ones.
#[tokio::test]
async fn blocks_staged_over_invocations_are_committed_in_order() {
    let (store, _) = keyed_store();
    let c = container(&store, "blocks").await;
    let name = "exp/manifest.json";
    assert_eq!(
        store.block_list(&c, name).await.unwrap(),
        BlockListing::default()
    );
    // Three "invocations", each with its own store (as separate processes would have).
    for (id, text) in [
        ("part-0002", "two,"),
        ("part-0001", "one,"),
        ("part-0002", "TWO,"),
    ] {
        let (other, _) = keyed_store();
        other
            .put_block(&c, name, id, Bytes::from(text))
            .await
            .unwrap();
    }
    let listing = store.block_list(&c, name).await.unwrap();
    assert!(listing.committed.is_empty());
    let mut staged = listing.uncommitted.clone();
    staged.sort();
    assert_eq!(staged, vec!["part-0001", "part-0002"]);
    let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let json = BlobWrite::new(MANIFEST_CONTENT_TYPE);
    let etag = store
        .commit_blocks(&c, name, &ids(&["part-0001", "part-0002"]), &json)
        .await
        .unwrap();
    let got = store.download(&c, name, 100).await.unwrap();
    assert_eq!(&got.bytes[..], b"one,TWO,");
    assert_eq!(got.properties.etag, etag);
    assert_eq!(
        got.properties.content_type.as_deref(),
        Some(MANIFEST_CONTENT_TYPE)
    );
    store
        .put_block(&c, name, "part-0003", Bytes::from("three"))
        .await
        .unwrap();
    store
        .commit_blocks(
            &c,
            name,
            &ids(&["part-0001", "part-0002", "part-0003"]),
            &json,
        )
        .await
        .unwrap();
    assert_eq!(
        &store.download(&c, name, 100).await.unwrap().bytes[..],
        b"one,TWO,three"
    );
    let listing = store.block_list(&c, name).await.unwrap();
    assert_eq!(
        listing.committed,
        vec!["part-0001", "part-0002", "part-0003"]
    );
    assert!(listing.uncommitted.is_empty());
    let e = store
        .commit_blocks(&c, name, &ids(&["part-0009"]), &json)
        .await
        .unwrap_err();
    assert_eq!(e.status, Some(400), "{e}");
    let e = store
        .commit_blocks(&c, name, &ids(&["a", "bb"]), &json)
        .await
        .unwrap_err();
    assert_eq!(e.kind, StorageErrorKind::InvalidInput);
}

fn entity(i: u32) -> Entity {
    let mut e = Entity::new(format!("p{}", i % 3), format!("r{i:04}"));
    e.properties = json!({
        "N": i, "Name": format!("row {i} \u{2028}"),
        "Big": (i as i64 * 1_000_000_007).to_string(), "Big@odata.type": "Edm.Int64",
    })
    .as_object()
    .cloned()
    .unwrap()
    .into();
    e.properties.insert_raw(
        "D",
        serde_json::value::RawValue::from_string(format!("{}.5e-3", i)).unwrap(),
    );
    e
}

/// An export's part and manifest through Azurite: the bytes downloaded hash (by the test's own
/// SHA-256) to what the manifest says, and decode to the rows written.
#[tokio::test]
async fn an_export_part_and_its_manifest_round_trip() {
    let (store, _) = keyed_store();
    let c = container(&store, "export").await;
    let layout = ExportLayout::new("backups/t1").unwrap();
    let rows: Vec<Entity> = (0..500).map(entity).collect();
    let part = encode_part(&rows).unwrap();
    let relative = part_name("s1", "c-0123456789abcdef").unwrap();
    let blob = layout.blob(&relative);
    assert_eq!(blob, "backups/t1/parts/s1/c-0123456789abcdef.jsonl.gz");
    let write = BlobWrite::new(PART_CONTENT_TYPE);
    store
        .upload(&c, &blob, part.bytes.clone(), &write)
        .await
        .unwrap();
    let now = time::OffsetDateTime::now_utc();
    let manifest = Manifest::new(
        "Source",
        "s1",
        vec![ManifestPart {
            name: relative.clone(),
            rows: part.rows,
            bytes: part.bytes.len() as u64,
            sha256: part.sha256.clone(),
        }],
        now,
        now,
    );
    let json = BlobWrite::new(MANIFEST_CONTENT_TYPE).with_condition(WriteCondition::IfNotExists);
    store
        .upload(
            &c,
            &layout.manifest_blob(),
            Bytes::from(manifest.to_json()),
            &json,
        )
        .await
        .unwrap();

    let read = store
        .download(&c, &layout.manifest_blob(), MAX_MANIFEST_BYTES)
        .await
        .unwrap();
    let read = Manifest::parse(&read.bytes).unwrap();
    assert_eq!(read, manifest);
    let entry = &read.parts[0];
    let downloaded = store
        .download(&c, &layout.blob(&entry.name), 1 << 20)
        .await
        .unwrap();
    assert_eq!(sha256(&downloaded.bytes), entry.sha256);
    assert_eq!(downloaded.bytes.len() as u64, entry.bytes);
    assert_eq!(
        downloaded.properties.content_type.as_deref(),
        Some(PART_CONTENT_TYPE)
    );
    assert_eq!(downloaded.properties.content_encoding, None);
    let decoded = decode_part(
        &downloaded.bytes,
        entry.rows,
        &entry.sha256,
        &DecodeLimits::default(),
    )
    .unwrap();
    assert_eq!(decoded.len(), rows.len());
    for (got, want) in decoded.iter().zip(&rows) {
        assert_eq!(
            (&got.partition_key, &got.row_key),
            (&want.partition_key, &want.row_key)
        );
        for (name, value) in want.properties.iter() {
            assert_eq!(
                got.properties.get(name).unwrap().get(),
                value.get(),
                "{name}"
            );
        }
        assert_eq!(
            got.properties.get_str("D@odata.type").as_deref(),
            Some("Edm.Double")
        );
    }
}

// ---- keyless: an Entra ID bearer connection on HTTPS + OAuth Azurite -------------------------

/// A blob store on the OAuth Azurite from identity-based settings only (no key anywhere), its
/// tokens from a fake App Service identity endpoint answering for `identity`.
fn keyless_store(identity: &Identity) -> AzureBlobStore {
    let url = fakes().app_service(identity);
    let account = StorageAccount::new(app_service_settings("Backup", &url));
    assert_eq!(account.auth_kind(), "token");
    account
        .blob_store(Arc::new(BlobRequestCounters::new()))
        .unwrap()
}

/// Blobs upload, stage, commit, list and download with bearer tokens, one token for every
/// request; a token for another audience is refused with a clear 403 that carries no token.
#[tokio::test]
async fn a_keyless_connection_uses_blobs_with_bearer_tokens() {
    let identity = Identity::default();
    let store = keyless_store(&identity);
    let c = support::unique_name("keyless");
    assert!(store.create_container(&c).await.unwrap());
    let write = BlobWrite::new(PART_CONTENT_TYPE);
    let etag = store
        .upload(&c, "p/a.jsonl.gz", Bytes::from("abc"), &write)
        .await
        .unwrap();
    store
        .put_block(&c, "m.json", "b1", Bytes::from("{"))
        .await
        .unwrap();
    store
        .put_block(&c, "m.json", "b2", Bytes::from("}"))
        .await
        .unwrap();
    store
        .commit_blocks(
            &c,
            "m.json",
            &["b1".into(), "b2".into()],
            &BlobWrite::new("application/json"),
        )
        .await
        .unwrap();
    let page = store.list(&c, "", 10, None).await.unwrap();
    let names: Vec<_> = page.blobs.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, vec!["m.json", "p/a.jsonl.gz"]);
    let got = store.download(&c, "p/a.jsonl.gz", 3).await.unwrap();
    assert_eq!(
        (&got.bytes[..], got.properties.etag.as_str()),
        (&b"abc"[..], etag.as_str())
    );
    assert_eq!(
        &store.download(&c, "m.json", 2).await.unwrap().bytes[..],
        b"{}"
    );
    assert_eq!(
        store.block_list(&c, "m.json").await.unwrap().committed,
        vec!["b1", "b2"]
    );
    assert_eq!(identity.issued(), 1, "one token served every request");

    // The same blob with a token for another audience.
    let other = Identity::default();
    other.wrong_audience.store(true, Ordering::SeqCst);
    let refused = keyless_store(&other);
    let e = refused.download(&c, "p/a.jsonl.gz", 3).await.unwrap_err();
    assert_eq!(e.status, Some(403), "{e}");
    assert_eq!(e.code.as_deref(), Some("AuthenticationFailed"), "{e}");
    assert_eq!(e.kind, StorageErrorKind::Rejected, "{e}");
    assert!(!format!("{e} {e:?}").contains("eyJ"), "{e}");
}
