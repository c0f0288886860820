//! Hostile index files (issue 38): what a lookup answers when the files it reads were forged or
//! damaged by someone with blob write access. An index file is data, never a command: every name
//! is checked, every size is bounded before it is read, every byte relied on is checksummed,
//! and a file that cannot be used is a 409 naming it (404 when the source table is gone).
//!
//! Each case copies a real index (built by the app) to a prefix of its own and forges one file
//! there with the blob client, from bytes the test writes itself: JSON edited as JSON, segments
//! from the test's own encoder of docs/index-format.md ([`forge`]), never tablescan's writer.
//! Memory bounds: [`super::hostile_memory`].

use super::*;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// A real index, built by the app from a seeded table, to copy per case.
pub struct Built {
    pub container: String,
    pub prefix: String,
    pub build: String,
    pub table: String,
    pub written: BTreeMap<(String, String), Option<&'static str>>,
    pub raw_rows: Vec<RawEntity>,
}

/// Seeds a table of `rows` rows and builds its index.
pub async fn built(app: &TestApp, client: &RawClient, rows: usize) -> Built {
    let table = unique_name("Hostile");
    let written = seed(client, &table, rows, "h").await;
    let raw_rows = client.rows(&table).await;
    let container = unique_name("hostile");
    let prefix = "real".to_string();
    let status = build(
        app,
        &json!({"driver": "index", "sourceTable": table, "property": "V", "takeCount": 10,
            "destinationContainer": container, "destinationPrefix": prefix}),
    )
    .await;
    Built {
        container,
        prefix,
        build: status["id"].as_str().unwrap().to_string(),
        table,
        written,
        raw_rows,
    }
}

impl Built {
    /// Copies every blob of the index (pointer, manifest, segments) to prefix `to`.
    pub async fn copy(&self, to: &str) {
        let store = blobs();
        let from = format!("{}/", self.prefix);
        let mut marker = None;
        loop {
            let page = store
                .list(&self.container, &from, 1000, marker.as_deref())
                .await
                .unwrap();
            for blob in page.blobs {
                let bytes = self.read(&blob.name).await;
                let name = format!("{to}/{}", &blob.name[from.len()..]);
                self.write(&name, bytes).await;
            }
            match page.next_marker {
                Some(next) => marker = Some(next),
                None => return,
            }
        }
    }

    pub async fn read(&self, name: &str) -> Vec<u8> {
        let found = blobs()
            .download(&self.container, name, 128 << 20)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        found.bytes.to_vec()
    }

    pub async fn write(&self, name: &str, bytes: Vec<u8>) {
        blobs()
            .upload(
                &self.container,
                name,
                bytes.into(),
                &BlobWrite::new("application/octet-stream"),
            )
            .await
            .unwrap();
    }

    pub fn manifest_name(&self, prefix: &str) -> String {
        format!("{prefix}/builds/{}/manifest.json", self.build)
    }

    pub async fn json(&self, name: &str) -> Value {
        serde_json::from_slice(&self.read(name).await).unwrap()
    }

    pub async fn write_json(&self, name: &str, value: &Value) {
        self.write(name, serde_json::to_vec(value).unwrap()).await;
    }

    /// The first segment of the build, relative to the prefix.
    pub async fn segment(&self) -> String {
        let manifest = self.json(&self.manifest_name(&self.prefix)).await;
        manifest["segments"][0]["name"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// A copy at `prefix` whose manifest lists only `segments` (name relative to the prefix,
    /// bytes), each written.
    pub async fn with_segments(&self, prefix: &str, segments: &[(String, Vec<u8>)]) {
        self.copy(prefix).await;
        let name = self.manifest_name(prefix);
        let mut manifest = self.json(&name).await;
        let mut listed = Vec::new();
        for (segment, bytes) in segments {
            listed.push(json!({"name": segment, "ranges": 1, "rows": 1, "bytes": bytes.len()}));
            self.write(&format!("{prefix}/{segment}"), bytes.clone())
                .await;
        }
        manifest["segments"] = json!(listed);
        self.write_json(&name, &manifest).await;
    }

    /// A segment name of this build (relative to the prefix).
    pub fn segment_name(&self, stem: &str) -> String {
        format!("builds/{}/segments/{stem}.seg", self.build)
    }

    pub async fn lookup(&self, app: &TestApp, prefix: &str, value: &str) -> (u16, Value) {
        let body =
            json!({"sourceContainer": self.container, "sourcePrefix": prefix, "value": value});
        let (status, answer, _) = post_lookup(app, &body).await;
        (status, answer)
    }
}

/// Asserts a lookup answered `status` with a message holding every one of `says`.
pub fn refused(case: &str, (status, answer): (u16, Value), want: u16, says: &[&str]) {
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    eprintln!("{case}: {status} {message}");
    assert_eq!(status, want, "{case}: {answer}");
    for s in says {
        assert!(message.contains(s), "{case}: {s:?} not in {answer}");
    }
}

/// One range of a forged segment: its keys, bucket size and flags.
pub struct ForgedRange {
    pub keys: [String; 4],
    pub bucket: u32,
    pub always: bool,
}

impl ForgedRange {
    /// A range over every key a seeded table holds.
    pub fn everything(bucket: u32, always: bool) -> ForgedRange {
        ForgedRange {
            keys: ["", "", "\u{FFFD}", "\u{FFFD}"].map(String::from),
            bucket,
            always,
        }
    }
}

/// A segment as docs/index-format.md lays it out (version 1: no row checksums; 2: each row
/// followed by XXH3-64 of its slots, seeded with its index), `slot(j, r, k)` giving slot `k`
/// of range `r` in body row `j`.
pub fn forge(
    version: u16,
    buckets: u32,
    ranges: &[ForgedRange],
    slot: impl Fn(u32, usize, u32) -> u16,
) -> Vec<u8> {
    let put32 = |out: &mut Vec<u8>, v: u32| out.extend_from_slice(&v.to_le_bytes());
    let row_slots: u32 = ranges.iter().map(|r| r.bucket).sum();
    let mut out = b"TSIDXSEG".to_vec();
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    for v in [0, buckets, ranges.len() as u32, row_slots, 0] {
        put32(&mut out, v);
    }
    for r in ranges {
        for v in [r.bucket, u32::from(r.always), 0] {
            put32(&mut out, v);
        }
        out.extend_from_slice(&1u64.to_le_bytes());
        for key in &r.keys {
            put32(&mut out, key.len() as u32);
            out.extend_from_slice(key.as_bytes());
        }
    }
    let directory_len = out.len() as u32 + 8;
    out[12..16].copy_from_slice(&directory_len.to_le_bytes());
    let checksum = xxh3_64(&out);
    out.extend_from_slice(&checksum.to_le_bytes());
    for j in 0..buckets {
        let start = out.len();
        for (r, range) in ranges.iter().enumerate() {
            for k in 0..range.bucket {
                out.extend_from_slice(&slot(j, r, k).to_le_bytes());
            }
        }
        if version >= 2 {
            let sum = xxh3_64_with_seed(&out[start..], u64::from(j));
            out.extend_from_slice(&sum.to_le_bytes());
        }
    }
    out
}

/// A String value's fingerprint and two buckets among `buckets` (docs/index-format.md, "Hash").
pub fn placement(text: &str, buckets: u32) -> (u16, u32, u32) {
    let hash = xxh3_64(&[&[1u8][..], text.as_bytes()].concat());
    let fp = ((hash >> 32) % 65535 + 1) as u16;
    let b = u64::from(buckets);
    let i1 = ((hash & 0xFFFF_FFFF) * b) >> 32;
    let mix = xxh3_64(&fp.to_le_bytes()) % b;
    (fp, i1 as u32, ((mix + b - i1) % b) as u32)
}

/// Names in index files are checked before anything is read through them, as a scan's are:
/// a forged manifest cannot send a lookup to tablescan's bookkeeping tables, to a name the
/// service would read as a path, to another table than the pointer records, or to a segment
/// outside its build; oversized and malformed pointers and manifests are 409s naming them,
/// and a source table deleted since the build is a 404 naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_names_in_index_files_are_refused_naming_the_file() {
    let app = TestApp::start(1, &[]).await;
    let client = RawClient::azurite();
    let index = built(&app, &client, 60).await;
    let other = unique_name("Other");
    seed(&client, &other, 20, "o").await;
    let everything = forge(1, 1, &[ForgedRange::everything(0, true)], |_, _, _| 0);
    let manifest = |p: &str| index.manifest_name(p);

    // Where the manifest sends the lookup: each a 409 naming the manifest, with the reason.
    let scans = app.names.scans_table.clone();
    let dot_dot = format!("builds/{}/segments/../../../x.seg", index.build);
    let real = index.segment().await;
    for (case, field, value, says) in [
        ("bookkeeping", "sourceTable", json!(scans), "bookkeeping"),
        (
            "bookkeeping, other case",
            "sourceTable",
            json!(scans.to_uppercase()),
            "bookkeeping",
        ),
        (
            "a path",
            "sourceTable",
            json!("../devstoreaccount1/EnqSrc"),
            "not a valid table name",
        ),
        ("another table", "sourceTable", json!(other), "the pointer"),
        ("a key", "property", json!("PartitionKey"), "property"),
        (
            "an expression",
            "property",
            json!("V eq 'x' or V"),
            "property",
        ),
        (
            "a connection",
            "sourceConnection",
            json!("Other"),
            "not allowed",
        ),
        (
            "another build",
            "scanId",
            json!("8204684855781-5306e88b"),
            "not build",
        ),
        ("a format", "format", json!("tablescan-index/9"), "format"),
        (
            "..",
            "segments",
            json!([{"name": dot_dot, "ranges": 1, "rows": 1, "bytes": 10}]),
            "not a segment of build",
        ),
        (
            "twice",
            "segments",
            json!([{"name": real, "ranges": 1, "rows": 1, "bytes": 10}, {"name": real, "ranges": 1, "rows": 1, "bytes": 10}]),
            "twice",
        ),
    ] {
        let prefix = unique_name("names");
        let seg = index.segment_name("ffff0000");
        index
            .with_segments(&prefix, &[(seg, everything.clone())])
            .await;
        let mut forged = index.json(&manifest(&prefix)).await;
        forged[field] = value;
        index.write_json(&manifest(&prefix), &forged).await;
        let answer = index.lookup(&app, &prefix, "'alice'").await;
        refused(case, answer, 409, &[&manifest(&prefix), says]);
    }

    // The pointer: a build that is a path, an unknown format, a manifest elsewhere, over 64 KiB.
    for (case, field, value, says) in [
        ("a path", "build", json!("../../x"), "not a scan id"),
        (
            "a format",
            "format",
            json!("tablescan-index-pointer/9"),
            "format",
        ),
        (
            "a manifest elsewhere",
            "manifest",
            json!("../other/manifest.json"),
            "manifest",
        ),
        ("64 KiB", "pad", json!("x".repeat(65 * 1024)), "65536"),
    ] {
        let prefix = unique_name("pointer");
        index.copy(&prefix).await;
        let name = format!("{prefix}/index.json");
        let mut pointer = index.json(&name).await;
        pointer[field] = value;
        index.write_json(&name, &pointer).await;
        let answer = index.lookup(&app, &prefix, "'alice'").await;
        refused(case, answer, 409, &[&name, says]);
    }

    // A manifest over 8 MiB is refused unread; one over the first read (256 KiB) but within
    // the bound is read whole.
    for (pad, status) in [(9 << 20, 409), (300 << 10, 200)] {
        let prefix = unique_name("big");
        index.copy(&prefix).await;
        let mut forged = index.json(&manifest(&prefix)).await;
        forged["pad"] = json!("x".repeat(pad));
        index.write_json(&manifest(&prefix), &forged).await;
        let (got, answer) = index.lookup(&app, &prefix, "'alice'").await;
        assert_eq!(got, status, "a manifest padded with {pad} bytes: {answer}");
        if status == 409 {
            refused(
                "8 MiB",
                (got, answer),
                409,
                &[&manifest(&prefix), "8388608"],
            );
        }
    }

    // The real index still answers, and says what it searched.
    let (status, answer) = index.lookup(&app, &index.prefix, "'alice'").await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["index"]["sourceTable"], json!(index.table));
    assert_eq!(answer["index"]["sourceConnection"], "AzureWebJobsStorage");

    // A source table deleted since the build: 404 naming it.
    use tablescan::storage::TableStore;
    app.store.delete_table(&index.table).await.unwrap();
    let answer = index.lookup(&app, &index.prefix, "'alice'").await;
    refused("deleted", answer, 404, &[&index.table, "does not exist"]);
    app.shutdown().await;
}

/// Segments that are damaged, truncated, extended or forged over the format's bounds: each a
/// 409 naming the segment, found from the bytes the lookup reads anyway (the body rows' own
/// checksums) or from its 32-byte header before anything bigger is read. A version 1 segment
/// (no row checksums) is still read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_or_oversized_segments_answer_409_naming_them() {
    let app = TestApp::start(1, &[]).await;
    let client = RawClient::azurite();
    let index = built(&app, &client, 60).await;
    let real = index.segment().await;
    let bytes = index.read(&format!("{}/{real}", index.prefix)).await;
    let directory_len = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;

    // The real segment's body zeroed after its directory (was: 200 with no rows).
    let mut zeroed = bytes.clone();
    zeroed[directory_len..].fill(0);
    // One bit of the body row 'alice' reads first.
    let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    let (_, i1, _) = placement("alice", word(16));
    let stride = 2 * word(24) as usize + 8;
    let mut flipped = bytes.clone();
    flipped[directory_len + i1 as usize * stride] ^= 1;
    let mut too_long = bytes.clone();
    too_long.extend_from_slice(&[0; 100]);
    // Headers over the bounds, each with a valid rest: a 4-GiB directory, 512-MiB rows.
    let mut huge_directory = bytes.clone();
    huge_directory[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
    let mut huge_rows = bytes.clone();
    huge_rows[24..28].copy_from_slice(&(256u32 << 20).to_le_bytes());
    // The sweep's bomb: 16 MiB of one range with buckets of 4 Mi slots, valid checksums.
    let bomb = forge(
        2,
        2,
        &[ForgedRange::everything(4 << 20, false)],
        |_, _, _| 0,
    );
    let cases: Vec<(&str, Vec<u8>, Vec<&str>)> = vec![
        ("zeroed body", zeroed, vec!["checksum"]),
        ("one bit", flipped, vec!["checksum"]),
        ("extended", too_long, vec!["bytes"]),
        ("4-GiB directory", huge_directory, vec!["4294967295"]),
        ("512-MiB rows", huge_rows, vec!["body rows"]),
        ("bomb", bomb, vec!["body rows are 4194304 slots"]),
    ];
    for (case, forged, says) in cases {
        let prefix = unique_name("damaged");
        let stem = index.segment_name("ffff0001");
        index
            .with_segments(&prefix, &[(stem.clone(), forged)])
            .await;
        // Values in every range, and in none: the rows read for both are checked.
        for value in ["'alice'", "'nobody'"] {
            let answer = index.lookup(&app, &prefix, value).await;
            let name = format!("{}/{prefix}/{stem}", index.container);
            let mut all = says.clone();
            all.push(&name);
            if case == "one bit" && value == "'nobody'" {
                continue; // its rows may not be the one flipped
            }
            refused(case, answer, 409, &all);
        }
    }

    // Listed with another size than it has, listed twice, missing.
    let prefix = unique_name("sizes");
    index.copy(&prefix).await;
    let name = index.manifest_name(&prefix);
    let mut manifest = index.json(&name).await;
    manifest["segments"][0]["bytes"] = json!(bytes.len() - 1);
    index.write_json(&name, &manifest).await;
    let answer = index.lookup(&app, &prefix, "'alice'").await;
    refused("size", answer, 409, &[&real, "its manifest lists"]);
    let entry = manifest["segments"][0].clone();
    manifest["segments"] = json!(vec![entry; 16]);
    index.write_json(&name, &manifest).await;
    let answer = index.lookup(&app, &prefix, "'alice'").await;
    refused("16 times", answer, 409, &[&name, "twice"]);
    let prefix = unique_name("missing");
    index.copy(&prefix).await;
    blobs()
        .delete(&index.container, &format!("{prefix}/{real}"))
        .await
        .unwrap();
    let answer = index.lookup(&app, &prefix, "'alice'").await;
    refused("missing", answer, 409, &[&real, "missing"]);

    // A version 1 segment written by the test: 'alice' in bucket 1 of its one range.
    let (fp, i1, _) = placement("alice", 7);
    let v1 = forge(1, 7, &[ForgedRange::everything(2, false)], |j, _, k| {
        if j == i1 && k == 1 {
            fp
        } else {
            0
        }
    });
    let prefix = unique_name("version1");
    index
        .with_segments(&prefix, &[(index.segment_name("ffff0002"), v1)])
        .await;
    let (rows, _) = lookup_all(&app, &index.container, &prefix, "'alice'").await;
    check_rows("'alice'", &rows, &index.written, &index.raw_rows);
    app.shutdown().await;
}

/// Strings and binaries too long for one filter literal (over 2,048 characters) are indexed and
/// found: every row holding one, and no row holding a value that differs only at its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_longer_than_a_filter_are_found() {
    let app = TestApp::start(1, &[]).await;
    let client = RawClient::azurite();
    let table = unique_name("Long");
    client.create_table(&table).await.unwrap();
    let short = "x".repeat(2_047);
    let long: String = "it's 日本 ".repeat(32_000 / 10);
    let bytes: Vec<u8> = (0..60_000u32).map(|i| (i % 251) as u8).collect();
    use base64::Engine;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let mut near = bytes.clone();
    *near.last_mut().unwrap() ^= 1;
    let values = [
        (raw::json_string(&short), "s".to_string()),
        (raw::json_string(&format!("{short}y")), "s2".into()),
        (raw::json_string(&long), "l".into()),
        (raw::json_string(&format!("{long}!")), "l2".into()),
        (
            format!(r#""{}","V@odata.type":"Edm.Binary""#, b64(&bytes)),
            "b".into(),
        ),
        (
            format!(r#""{}","V@odata.type":"Edm.Binary""#, b64(&near)),
            "b2".into(),
        ),
    ];
    for i in 0..36 {
        let (json, tag) = &values[i % values.len()];
        let body = format!(
            r#"{{"PartitionKey":"p{}","RowKey":"{tag}{i:03}","V":{json}}}"#,
            i % 4
        );
        client.insert(&table, &body).await.unwrap();
    }
    let container = unique_name("long");
    build(
        &app,
        &json!({"driver": "index", "sourceTable": table, "property": "V", "takeCount": 5,
            "destinationContainer": container}),
    )
    .await;
    let hex: String = bytes.iter().map(|b| format!("{b:02X}")).collect();
    for (literal, tag) in [
        (format!("'{short}'"), "s"),
        (format!("'{}'", long.replace('\'', "''")), "l"),
        (format!("X'{hex}'"), "b"),
    ] {
        let (rows, _) = lookup_all(&app, &container, "", &literal).await;
        let mut keys: Vec<String> = rows.iter().map(|r| r.row_key()).collect();
        keys.sort();
        let want: Vec<String> = (0..36)
            .filter(|i| values[i % values.len()].1 == tag)
            .map(|i| format!("{tag}{i:03}"))
            .collect();
        assert_eq!(keys, want, "{tag}: {} characters", literal.chars().count());
    }
    app.shutdown().await;
}
