//! The golden files' harness (used by `tests/app/golden_formats.rs`): the text layout of a golden
//! file of examples, comparing against (or, with `UPDATE_GOLDEN=1`, rewriting) a golden file, a
//! table store that records every transaction it commits, and the times the code stamps with
//! the clock replaced by a fixed one.
//!
//! A golden file of examples is UTF-8 text: `# ` lines say what the file holds, each example
//! starts with `## <name>` and has `<key>: <value>` lines (a value is exact bytes as the code
//! writes them, on one line: compact JSON never holds a raw line break), examples are separated
//! by an empty line.

use std::path::PathBuf;
use std::sync::Mutex;

use crate::support::stores::forward_table_store;
use tablescan::app::tracking::format_time;
use tablescan::storage::{BatchOperation, Entity, StorageResult, TableStore};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Set to rewrite the golden files from what the code writes now (then review the diff).
pub const UPDATE_ENV: &str = "UPDATE_GOLDEN";

/// One example of a golden file: its name and its `key: value` lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    pub name: String,
    pub lines: Vec<(String, String)>,
}

impl Example {
    pub fn new(name: impl Into<String>) -> Example {
        Example {
            name: name.into(),
            lines: Vec::new(),
        }
    }

    pub fn line(mut self, key: impl Into<String>, value: impl Into<String>) -> Example {
        let (key, value) = (key.into(), value.into());
        assert!(
            !value.contains('\n') && !key.contains(": "),
            "{key}: a golden value is one line"
        );
        self.lines.push((key, value));
        self
    }

    /// The value of the first line with this key.
    pub fn get(&self, key: &str) -> &str {
        self.lines
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("example {:?} has no {key:?} line", self.name))
    }
}

/// The file's text: `header` as `# ` lines, then the examples.
pub fn render(header: &str, examples: &[Example]) -> String {
    let mut out = String::new();
    for line in header.lines() {
        out.push_str(format!("# {line}").trim_end());
        out.push('\n');
    }
    for example in examples {
        out.push_str(&format!("\n## {}\n", example.name));
        for (key, value) in &example.lines {
            out.push_str(&format!("{key}: {value}\n"));
        }
    }
    out
}

/// The examples of a golden file's text (header lines skipped).
pub fn parse(text: &str) -> Vec<Example> {
    let mut examples: Vec<Example> = Vec::new();
    for line in text.lines() {
        if let Some(name) = line.strip_prefix("## ") {
            examples.push(Example::new(name));
        } else if line.is_empty() || line.starts_with("# ") || line == "#" {
            continue;
        } else {
            let (key, value) = line
                .split_once(": ")
                .unwrap_or_else(|| panic!("golden line {line:?} is not `key: value`"));
            let example = examples
                .last_mut()
                .unwrap_or_else(|| panic!("golden line {line:?} before any example"));
            example.lines.push((key.to_string(), value.to_string()));
        }
    }
    examples
}

pub fn path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name)
}

pub fn updating() -> bool {
    std::env::var_os(UPDATE_ENV).is_some_and(|v| !v.is_empty() && v != "0")
}

/// The golden file's bytes.
pub fn read(name: &str) -> Vec<u8> {
    let path = path(name);
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "golden file {} unreadable ({e}); write it with {UPDATE_ENV}=1 and review it",
            path.display()
        )
    })
}

/// Asserts that `actual` is the golden file's content byte for byte, or, with
/// `UPDATE_GOLDEN=1`, writes it there. A difference names the first differing line.
pub fn check(name: &str, actual: &[u8]) {
    let path = path(name);
    if updating() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        eprintln!("golden: wrote {}", path.display());
        return;
    }
    let expected = read(name);
    if expected == actual {
        return;
    }
    let (want, got) = (
        String::from_utf8_lossy(&expected),
        String::from_utf8_lossy(actual),
    );
    let line = want
        .lines()
        .zip(got.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| want.lines().count().min(got.lines().count()));
    panic!(
        "{} differs from what the code writes now, first at line {}:\n  golden: {:?}\n  now:    {:?}\n\
         A stored or queued format changed. If that is deliberate, follow docs/compatibility.md \
         (keep reading the old format; {UPDATE_ENV}=1 rewrites the file; review the diff).",
        path.display(),
        line + 1,
        want.lines().nth(line).unwrap_or("(end of file)"),
        got.lines().nth(line).unwrap_or("(end of file)"),
    );
}

/// A golden file kept as written once (a blob whose bytes may legitimately change, e.g. with
/// the compressor, while what it holds is checked elsewhere): written with `UPDATE_GOLDEN=1`
/// (or when missing is an error), else read as it is. Returns its bytes.
pub fn kept(name: &str, fresh: &[u8]) -> Vec<u8> {
    if updating() {
        check(name, fresh);
    }
    read(name)
}

/// Checks a rendered golden file of examples and returns the examples read back from the
/// golden file (what a new version must still read).
pub fn check_examples(name: &str, header: &str, examples: &[Example]) -> Vec<Example> {
    check(name, render(header, examples).as_bytes());
    let golden = parse(&String::from_utf8(read(name)).expect("golden files are UTF-8"));
    assert_eq!(golden.len(), examples.len(), "{name}: examples");
    golden
}

/// What the clock stamps are replaced with in golden rows.
pub fn fixed_now() -> OffsetDateTime {
    time::macros::datetime!(2026-01-02 03:09:10.111 UTC)
}

/// Properties the code stamps with the clock (`now`, or `now` plus a period: the completion
/// lease's end): checked to be in the one form the code writes them ([`format_time`], annotated
/// `Edm.DateTime`), then set to [`fixed_now`].
const CLOCK_PROPERTIES: [&str; 6] = [
    "ClaimedAt",
    "CreatedAt",
    "FinishedAt",
    "CompletedAt",
    "CompletionLeaseUntil",
    "WorkRemovedAt",
];

/// Also sets claim tokens ([`TOKEN_PROPERTIES`]) to [`FIXED_TOKEN`].
pub fn fix_clock(entity: &Entity) -> Entity {
    let mut entity = entity.clone();
    for name in CLOCK_PROPERTIES {
        let Some(text) = entity.properties.get_str(name) else {
            continue;
        };
        let parsed = OffsetDateTime::parse(&text, &Rfc3339)
            .unwrap_or_else(|e| panic!("{name} {text:?} is not RFC 3339: {e}"));
        assert_eq!(
            format_time(parsed),
            text,
            "{name} is written by format_time"
        );
        assert_eq!(
            entity.properties.get_str(&format!("{name}@odata.type")),
            Some("Edm.DateTime".to_string()),
            "{name} is annotated"
        );
        entity
            .properties
            .insert(name, serde_json::json!(format_time(fixed_now())));
    }
    for name in TOKEN_PROPERTIES {
        let Some(text) = entity.properties.get_str(name) else {
            continue;
        };
        let hex = |c: char| c.is_ascii_digit() || ('a'..='f').contains(&c);
        assert!(
            text.len() == 16 && text.chars().all(hex),
            "{name} {text:?} is a claim token: 16 lowercase hex digits"
        );
        entity
            .properties
            .insert(name, serde_json::json!(FIXED_TOKEN));
    }
    entity
}

/// Properties holding a random claim token (the attempt that claimed a phase start, took a
/// completion lease or ended a scan): checked to be in the form the code writes, then set to [`FIXED_TOKEN`].
const TOKEN_PROPERTIES: [&str; 3] = ["ClaimedBy", "CompletionLeaseBy", "EndedBy"];
/// What claim tokens are replaced with in golden rows.
pub const FIXED_TOKEN: &str = "0123456789abcdef";

/// One committed operation of a transaction, as sent (clock stamps fixed).
#[derive(Debug, Clone)]
pub struct Op {
    pub partition: String,
    /// `Insert`, `Upsert`, `Replace`, `Merge` or `Delete`, with ` If-Match` when conditional.
    pub kind: String,
    pub row_key: String,
    /// The entity's JSON as sent (`Entity::wire`); empty for a delete.
    pub json: String,
}

impl Op {
    fn of(partition: &str, op: &BatchOperation) -> Op {
        let conditional = |etag: &Option<String>| if etag.is_some() { " If-Match" } else { "" };
        let (kind, entity) = match op {
            BatchOperation::Insert(e) => ("Insert".to_string(), Some(e)),
            BatchOperation::Upsert(e) => ("Upsert".to_string(), Some(e)),
            BatchOperation::Replace { entity, etag } => {
                (format!("Replace{}", conditional(etag)), Some(entity))
            }
            BatchOperation::Merge { entity, etag } => {
                (format!("Merge{}", conditional(etag)), Some(entity))
            }
            BatchOperation::Delete { etag, .. } => (format!("Delete{}", conditional(etag)), None),
        };
        Op {
            partition: partition.to_string(),
            kind,
            row_key: op.row_key().to_string(),
            json: entity
                .map(|e| serde_json::to_string(&fix_clock(e).wire()).unwrap())
                .unwrap_or_default(),
        }
    }

    /// `<kind> <json>`: how an operation is one golden line.
    pub fn text(&self) -> String {
        format!("{} {}", self.kind, self.json)
            .trim_end()
            .to_string()
    }
}

/// A table store that records every transaction it commits (only committed ones: a retried
/// transaction appears once), over a real store.
pub struct Recorder<S> {
    pub inner: S,
    committed: Mutex<Vec<Op>>,
}

impl<S: TableStore> Recorder<S> {
    pub fn new(inner: S) -> Self {
        Recorder {
            inner,
            committed: Mutex::new(Vec::new()),
        }
    }

    /// The operations committed since the last call.
    pub fn take(&self) -> Vec<Op> {
        std::mem::take(&mut self.committed.lock().unwrap())
    }

    fn record(&self, partition: &str, operations: &[BatchOperation]) {
        let mut committed = self.committed.lock().unwrap();
        committed.extend(operations.iter().map(|op| Op::of(partition, op)));
    }
}

impl<S: TableStore> TableStore for Recorder<S> {
    forward_table_store!(inner: query_page);

    async fn submit_batch_with_etags(
        &self,
        table: &str,
        partition_key: &str,
        operations: &[BatchOperation],
    ) -> StorageResult<Vec<Option<String>>> {
        let etags = self
            .inner
            .submit_batch_with_etags(table, partition_key, operations)
            .await?;
        self.record(partition_key, operations);
        Ok(etags)
    }

    forward_table_store!(inner: get_entity, create_table, delete_table);
}

/// Rows as stored after `ops` (in order): an insert, upsert or replace sets the row, a merge
/// overlays its properties, a delete removes it. Keyed by (partition, row key); each row is its
/// JSON object text, the entity's properties in name order after the keys.
pub fn replay<'a>(
    ops: impl IntoIterator<Item = &'a Op>,
) -> std::collections::BTreeMap<(String, String), serde_json::Map<String, serde_json::Value>> {
    let mut rows = std::collections::BTreeMap::new();
    for op in ops {
        let key = (op.partition.clone(), op.row_key.clone());
        let kind = op.kind.split(' ').next().unwrap();
        if kind == "Delete" {
            rows.remove(&key);
            continue;
        }
        let entity: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&op.json).expect("an operation's entity is a JSON object");
        match kind {
            "Merge" => {
                let row: &mut serde_json::Map<_, _> =
                    rows.get_mut(&key).expect("a merge needs its row");
                row.extend(entity);
            }
            _ => {
                rows.insert(key, entity);
            }
        }
    }
    rows
}

/// An operation read back from a golden line `<kind> <json>` (`partition` from its example).
pub fn op_from_line(partition: &str, text: &str) -> Op {
    let (kind, json) = match text.find(" {") {
        Some(at) => (&text[..at], &text[at + 1..]),
        None => (text, ""),
    };
    let row_key = serde_json::from_str::<serde_json::Value>(json)
        .ok()
        .and_then(|v| v["RowKey"].as_str().map(str::to_string))
        .unwrap_or_default();
    Op {
        partition: partition.to_string(),
        kind: kind.to_string(),
        row_key,
        json: json.to_string(),
    }
}
