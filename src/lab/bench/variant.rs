//! The scan variants the benchmark compares, and the request each one POSTs.

use clap::ValueEnum;
use serde::Serialize;
use serde_json::{json, Value};

/// Listed in the order they run: `prefix-import` restores what `prefix-export` wrote, and
/// `prefix-delete` empties the floor's copy of the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Variant {
    /// Copy with the serial strategy (one paging chain, copy work fanned out).
    SerialCopy,
    /// Copy with the reference design's work split (one message per partition key, re-read).
    ReferenceCopy,
    /// Copy with tablescan's prefix scan and page work split.
    PrefixCopy,
    /// Count with the serial strategy.
    SerialCount,
    /// Count with the prefix strategy.
    PrefixCount,
    /// Export (backup) to Blob Storage with the prefix strategy.
    PrefixExport,
    /// Import (restore) of `prefix-export`'s backup into a new table.
    PrefixImport,
    /// Delete every row of a copy of the source (the floor's), with the prefix strategy.
    PrefixDelete,
    /// Put every row of the source on a queue ([`ENQUEUE_ROWS_PER_MESSAGE`] rows a message).
    PrefixEnqueue,
    /// The same at the driver's default `rowsPerMessage`, 1: one put per row.
    #[value(name = "prefix-enqueue-1")]
    #[serde(rename = "prefix-enqueue-1")]
    PrefixEnqueueOne,
    /// Build an index of the source's `Authors` property (issue 29) into the export's container.
    PrefixIndex,
}

/// `rowsPerMessage` of `prefix-enqueue`: the batching a consumer of a big table would choose
/// (docs/enqueue.md); its minimum is one put per this many rows.
pub const ENQUEUE_ROWS_PER_MESSAGE: u64 = 32;

/// The property `prefix-index` indexes: every generated row has one, ~1,000 distinct values.
pub const INDEXED_PROPERTY: &str = "Authors";

/// What a variant does with the rows, which sets its minimum and how it is verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Job {
    Copy,
    Count,
    Export,
    Import,
    Delete,
    Enqueue,
    Index,
}

/// The names a variant's request refers to.
#[derive(Debug, Clone)]
pub struct Targets {
    pub source: String,
    pub destination: String,
    /// Where `prefix-export` writes and `prefix-import` reads.
    pub container: String,
    pub prefix: String,
    /// The table `prefix-delete` empties.
    pub doomed: String,
    /// The queue `prefix-enqueue` fills.
    pub queue: String,
}

impl Variant {
    pub const ALL: [Variant; 11] = [
        Variant::SerialCopy,
        Variant::ReferenceCopy,
        Variant::PrefixCopy,
        Variant::SerialCount,
        Variant::PrefixCount,
        Variant::PrefixExport,
        Variant::PrefixImport,
        Variant::PrefixDelete,
        Variant::PrefixEnqueue,
        Variant::PrefixEnqueueOne,
        Variant::PrefixIndex,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Variant::SerialCopy => "serial-copy",
            Variant::ReferenceCopy => "reference-copy",
            Variant::PrefixCopy => "prefix-copy",
            Variant::SerialCount => "serial-count",
            Variant::PrefixCount => "prefix-count",
            Variant::PrefixExport => "prefix-export",
            Variant::PrefixImport => "prefix-import",
            Variant::PrefixDelete => "prefix-delete",
            Variant::PrefixEnqueue => "prefix-enqueue",
            Variant::PrefixEnqueueOne => "prefix-enqueue-1",
            Variant::PrefixIndex => "prefix-index",
        }
    }

    pub fn job(self) -> Job {
        match self {
            Variant::SerialCopy | Variant::ReferenceCopy | Variant::PrefixCopy => Job::Copy,
            Variant::SerialCount | Variant::PrefixCount => Job::Count,
            Variant::PrefixExport => Job::Export,
            Variant::PrefixImport => Job::Import,
            Variant::PrefixDelete => Job::Delete,
            Variant::PrefixEnqueue | Variant::PrefixEnqueueOne => Job::Enqueue,
            Variant::PrefixIndex => Job::Index,
        }
    }

    /// An enqueue's `rowsPerMessage`.
    pub fn rows_per_message(self) -> Option<u64> {
        match self {
            Variant::PrefixEnqueue => Some(ENQUEUE_ROWS_PER_MESSAGE),
            Variant::PrefixEnqueueOne => Some(1),
            _ => None,
        }
    }

    pub fn is_copy(self) -> bool {
        self.job() == Job::Copy
    }

    /// The status field that says how far it got: rows written, or for a count rows scanned.
    pub fn progress_field(self) -> &'static str {
        match self.job() {
            Job::Count => "rowsScanned",
            _ => "rowsWritten",
        }
    }

    /// The scan request, exactly as a user would POST it.
    pub(super) fn request(self, t: &Targets) -> Value {
        let strategy = match self {
            Variant::SerialCopy | Variant::SerialCount => "serial",
            _ => "prefix",
        };
        match self.job() {
            Job::Copy => {
                let mut body = json!({"driver": "copy", "sourceTable": t.source,
                    "strategy": strategy, "destinationTable": t.destination});
                if self == Variant::ReferenceCopy {
                    body["workSplit"] = json!("partitionKey");
                }
                body
            }
            Job::Count => json!({"driver": "count", "sourceTable": t.source, "strategy": strategy}),
            Job::Export => {
                json!({"driver": "export", "sourceTable": t.source, "strategy": strategy,
                "destinationContainer": t.container, "destinationPrefix": t.prefix})
            }
            Job::Import => json!({"driver": "import", "sourceContainer": t.container,
                "sourcePrefix": t.prefix, "destinationTable": t.destination}),
            Job::Delete => json!({"driver": "delete", "sourceTable": t.doomed,
                "confirm": t.doomed, "strategy": strategy}),
            Job::Enqueue => json!({"driver": "enqueue", "sourceTable": t.source,
                "strategy": strategy, "destinationQueue": t.queue,
                "rowsPerMessage": self.rows_per_message()}),
            Job::Index => json!({"driver": "index", "sourceTable": t.source,
                "strategy": strategy, "property": INDEXED_PROPERTY,
                "destinationContainer": t.container, "destinationPrefix": "index"}),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets() -> Targets {
        Targets {
            source: "S".into(),
            destination: "D".into(),
            container: "c".into(),
            prefix: "p".into(),
            doomed: "X".into(),
            queue: "q".into(),
        }
    }

    #[test]
    fn variants_post_the_right_requests() {
        let t = targets();
        let r = Variant::ReferenceCopy.request(&t);
        assert_eq!(r["workSplit"], "partitionKey");
        assert_eq!(r["strategy"], "prefix");
        let c = Variant::SerialCount.request(&t);
        assert_eq!(
            (c["driver"].as_str(), c.get("destinationTable")),
            (Some("count"), None)
        );
        let e = Variant::PrefixExport.request(&t);
        assert_eq!(
            (&e["destinationContainer"], &e["destinationPrefix"]),
            (&json!("c"), &json!("p"))
        );
        let i = Variant::PrefixImport.request(&t);
        assert_eq!(
            (
                &i["sourcePrefix"],
                &i["destinationTable"],
                i.get("sourceTable")
            ),
            (&json!("p"), &json!("D"), None)
        );
        let d = Variant::PrefixDelete.request(&t);
        assert_eq!(
            (&d["sourceTable"], &d["confirm"]),
            (&json!("X"), &json!("X"))
        );
        let names: Vec<_> = Variant::ALL.iter().map(|v| v.name()).collect();
        for v in Variant::ALL {
            assert_eq!(
                v.to_possible_value().unwrap().get_name(),
                v.name(),
                "CLI and JSON names agree"
            );
        }
        let q = Variant::PrefixEnqueue.request(&t);
        assert_eq!(
            (&q["destinationQueue"], &q["rowsPerMessage"]),
            (&json!("q"), &json!(32))
        );
        let x = Variant::PrefixIndex.request(&t);
        assert_eq!(
            (&x["property"], &x["destinationContainer"]),
            (&json!("Authors"), &json!("c"))
        );
        let one = Variant::PrefixEnqueueOne.request(&t);
        assert_eq!(one["rowsPerMessage"], 1);
        assert_eq!(names.len(), 11);
        assert!(
            Variant::PrefixExport < Variant::PrefixImport,
            "an import runs after its export"
        );
    }
}
