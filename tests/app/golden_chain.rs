//! The stored and queued formats of incremental exports against their golden copies
//! (`tests/golden/chain-*`): a key chunk (also a tombstone file's form), a delta's manifest, a
//! delta's work items and an import's chain items, and the settings the two scans record. Each
//! is checked as written and read back with today's code.

use tablescan::app::drivers::export::{DeltaWork, ExportOptions, ExportWork, Since};
use tablescan::app::drivers::import::{ChainMember, ImportOptions, ImportWork};
use tablescan::app::export_chain::{
    decode_keys, encode_keys, DeltaInfo, KeyChunk, ParentRef, Scope, DELTA_FORMAT,
};
use tablescan::app::export_format::{Manifest, ManifestPart};
use time::macros::datetime;

use crate::golden_formats::harness::{self, check, check_examples, Example};

const SCAN: &str = "9999998234567-0badcafe";

fn sha(n: u8) -> String {
    format!("{n:02x}").repeat(32)
}

fn key(pk: &str, rk: &str) -> (String, String) {
    (pk.to_string(), rk.to_string())
}

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(bytes)
        .read_to_end(&mut out)
        .unwrap();
    out
}

#[test]
fn key_chunk() {
    // Keys in the service's order: U+1F600 (surrogates D83D DE00) before U+FFFD, "" first.
    let keys = [
        key("", "a"),
        key("it's", "o'clock"),
        key("\u{1F600}", ""),
        key("\u{fffd}", "1"),
    ];
    let encoded = encode_keys(&keys);
    check("chain-keys.jsonl", &gunzip(&encoded.bytes));
    let kept = harness::kept("chain-keys.jsonl.gz", &encoded.bytes);
    assert_eq!(gunzip(&kept), harness::read("chain-keys.jsonl"));
    let sha256 = tablescan::app::export_format::sha256_hex(&kept);
    assert_eq!(decode_keys(&kept, 4, &sha256).unwrap(), keys);
}

#[test]
fn delta_manifest() {
    let part = |name: &str, rows: u64, n: u8| ManifestPart {
        name: format!("{name}/{SCAN}/t-0123456789abcdef0123456789abcdef.jsonl.gz"),
        rows,
        bytes: 1000 + rows,
        sha256: sha(n),
    };
    let mut manifest = Manifest::new(
        "Packages",
        SCAN,
        vec![part("parts", 12, 1)],
        datetime!(2026-01-02 03:04:05.678 UTC),
        datetime!(2026-01-02 03:09:10 UTC),
    );
    manifest.format = DELTA_FORMAT.into();
    manifest.service_started_at = Some(datetime!(2026-01-02 03:04:05 UTC));
    manifest.scope = Some(Scope {
        filter: Some("Downloads gt 1000".into()),
        select: Some(vec!["Id".into()]),
        partition_key_prefix: "a".into(),
        ..Scope::default()
    });
    let chunk = part("keys", 40, 2);
    manifest.keys = Some(vec![KeyChunk {
        name: chunk.name,
        first: key("a", "1"),
        rows: chunk.rows,
        bytes: chunk.bytes,
        sha256: chunk.sha256,
    }]);
    manifest.delta = Some(DeltaInfo {
        parent: ParentRef {
            prefix: "nightly/2026-01-01".into(),
            sha256: sha(3),
        },
        base: "nightly/2025-12-28".into(),
        watermark: datetime!(2026-01-01 03:03:00 UTC),
        deleted_rows: 2,
        deleted: vec![part("deleted", 2, 4)],
    });
    check("chain-delta-manifest.json", &manifest.to_json());
    let read = Manifest::parse(&harness::read("chain-delta-manifest.json")).unwrap();
    assert_eq!(read, manifest);
}

#[test]
fn chain_items_and_settings() {
    let chunk = KeyChunk {
        name: format!("keys/{SCAN}/c-0123456789abcdef0123456789abcdef.jsonl.gz"),
        first: key("pk", "rk"),
        rows: 2000,
        bytes: 9000,
        sha256: sha(5),
    };
    let since = Since {
        prefix: "nightly/2026-01-01".into(),
        sha256: sha(3),
        base: "nightly/2025-12-28".into(),
        watermark: datetime!(2026-01-01 03:03:00 UTC),
    };
    let export = |w: DeltaWork| serde_json::to_string(&ExportWork::Delta(w)).unwrap();
    let import = |w: ImportWork| serde_json::to_string(&w).unwrap();
    let texts = [
        (
            "delta: fan-out over the parent's chunks",
            export(DeltaWork::Tiles { start: 200 }),
        ),
        (
            "delta: tile",
            export(DeltaWork::Tile {
                from: Some(key("pk", "rk")),
                after: None,
                to: Some(key("pl", "")),
                chunks: vec![chunk.clone()],
            }),
        ),
        (
            "delta: the rest of a tile",
            export(DeltaWork::Tile {
                from: None,
                after: Some(key("pk", "zz")),
                to: None,
                chunks: vec![chunk],
            }),
        ),
        (
            "import: chunk of a chain member's files, write phase",
            import(ImportWork::Parts {
                start: 0,
                sha256: Some(sha(6)),
                write: true,
                member: 2,
            }),
        ),
        (
            "import: a member's tombstone file",
            import(ImportWork::Part {
                name: format!("deleted/{SCAN}/t-0123456789abcdef0123456789abcdef.jsonl.gz"),
                rows: 3,
                bytes: 80,
                sha256: sha(7),
                skip: 0,
                member: 1,
                deleted: true,
            }),
        ),
        (
            "import: a write phase past the chain",
            import(ImportWork::Done),
        ),
        (
            "export settings: a delta",
            serde_json::to_string(&ExportOptions {
                connection: "BackupStorage".into(),
                container: "backups".into(),
                prefix: "nightly/2026-01-02".into(),
                started_at: datetime!(2026-01-02 03:04:05.678 UTC),
                service_started_at: Some(datetime!(2026-01-02 03:04:05 UTC)),
                since: Some(since),
                since_requested: None,
            })
            .unwrap(),
        ),
        (
            "import settings: a chain",
            serde_json::to_string(&ImportOptions {
                container: "backups".into(),
                prefix: "nightly/2026-01-02".into(),
                manifest_sha256: Some(sha(8)),
                chain: vec![
                    ChainMember {
                        prefix: "nightly/2026-01-01".into(),
                        sha256: sha(9),
                    },
                    ChainMember {
                        prefix: "nightly/2026-01-02".into(),
                        sha256: sha(8),
                    },
                ],
            })
            .unwrap(),
        ),
    ];
    let examples: Vec<Example> = texts
        .iter()
        .map(|(name, text)| Example::new(*name).line("json", text.clone()))
        .collect();
    let header = "Incremental exports' queued items (an export's delta work, an import's chain \
                  items) and recorded settings, as compact JSON (docs/backups.md).";
    let golden = check_examples("chain-items.txt", header, &examples);
    // Read back: each item and setting parses, and gives the same text again.
    for (example, (_, text)) in golden.iter().zip(&texts) {
        let json = example.get("json");
        let value: serde_json::Value = serde_json::from_str(json).unwrap();
        let again = if example.name.starts_with("delta") {
            serde_json::to_string(&serde_json::from_value::<ExportWork>(value).unwrap())
        } else if example.name.starts_with("import:") {
            serde_json::to_string(&serde_json::from_value::<ImportWork>(value).unwrap())
        } else if example.name.starts_with("export") {
            serde_json::to_string(&serde_json::from_value::<ExportOptions>(value).unwrap())
        } else {
            serde_json::to_string(&serde_json::from_value::<ImportOptions>(value).unwrap())
        };
        assert_eq!(&again.unwrap(), text, "{}", example.name);
    }
}
