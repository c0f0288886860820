//! Unit tests of [`super`]'s names and manifests.

use serde_json::json;

use super::*;

#[test]
fn names_are_deterministic_and_checked() {
    assert_eq!(
        part_name("s-1a", "c-0123abcd").unwrap(),
        "parts/s-1a/c-0123abcd.jsonl.gz"
    );
    for (scan, item) in [("", "c"), ("s", "a/b"), ("s", "é"), ("s", &"x".repeat(129))] {
        assert!(part_name(scan, item).is_err(), "{scan:?} {item:?}");
    }
    let layout = ExportLayout::new("backups/2026-01-01").unwrap();
    assert_eq!(layout.prefix(), "backups/2026-01-01/");
    assert_eq!(layout.manifest_blob(), "backups/2026-01-01/manifest.json");
    assert_eq!(
        layout.blob("parts/s/c.jsonl.gz"),
        "backups/2026-01-01/parts/s/c.jsonl.gz"
    );
    assert_eq!(
        ExportLayout::new("").unwrap().manifest_blob(),
        "manifest.json"
    );
    assert_eq!(ExportLayout::new("a/").unwrap().prefix(), "a/");
    for bad in ["/abs", "a/../b", "a\u{1}", &"p".repeat(513)] {
        assert!(ExportLayout::new(bad).is_err(), "{bad:?}");
    }
}

fn manifest_part(name: &str, rows: u64) -> ManifestPart {
    ManifestPart {
        name: name.into(),
        rows,
        bytes: 100,
        sha256: "ab".repeat(32),
    }
}

#[test]
fn manifests_round_trip_and_are_checked() {
    let started = time::macros::datetime!(2026-01-01 00:00:00.123 UTC);
    let completed = time::macros::datetime!(2026-01-01 00:05:00 UTC);
    let manifest = Manifest::new(
        "Source",
        "s1",
        vec![
            manifest_part("parts/s1/c-2.jsonl.gz", 5),
            manifest_part("parts/s1/c-1.jsonl.gz", 7),
        ],
        started,
        completed,
    );
    assert_eq!(manifest.rows, 12);
    assert_eq!(manifest.parts[0].name, "parts/s1/c-1.jsonl.gz");
    let json = manifest.to_json();
    let value: serde_json::Value = serde_json::from_slice(&json).unwrap();
    assert_eq!(
        value,
        json!({
            "format": "tablescan-export/1", "sourceTable": "Source", "scanId": "s1", "rows": 12,
            "parts": [
                {"name": "parts/s1/c-1.jsonl.gz", "rows": 7, "bytes": 100, "sha256": "ab".repeat(32)},
                {"name": "parts/s1/c-2.jsonl.gz", "rows": 5, "bytes": 100, "sha256": "ab".repeat(32)},
            ],
            "startedAt": "2026-01-01T00:00:00.123Z", "completedAt": "2026-01-01T00:05:00Z",
        })
    );
    assert_eq!(Manifest::parse(&json).unwrap(), manifest);

    let broken = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut v = value.clone();
        edit(&mut v);
        Manifest::parse(v.to_string().as_bytes())
            .unwrap_err()
            .to_string()
    };
    for (edit, expected) in [
        (
            &(|v: &mut serde_json::Value| v["format"] = json!("tablescan-export/2"))
                as &dyn Fn(&mut serde_json::Value),
            "is not \"tablescan-export/1\"",
        ),
        (
            &|v| v["rows"] = json!(13),
            "rows is 13, but the parts hold 12",
        ),
        (
            &|v| v["parts"][1]["name"] = v["parts"][0]["name"].clone(),
            "listed twice",
        ),
        (
            &|v| v["parts"][0]["sha256"] = json!("xyz"),
            "not 64 hex digits",
        ),
        (
            &|v| v["parts"][0]["name"] = json!("/abs.jsonl.gz"),
            "not a relative name",
        ),
        (
            &|v| v["parts"][0]["name"] = json!("p.json"),
            "ending in .jsonl.gz",
        ),
        (
            &|v| v["startedAt"] = json!("yesterday"),
            "not a valid manifest",
        ),
        (&|v| v["rows"] = json!(-1), "not a valid manifest"),
    ] {
        let e = broken(edit);
        assert!(e.starts_with("manifest: ") && e.contains(expected), "{e}");
    }
}
