//! The scan variants the benchmark compares, and the request each one POSTs.

use clap::ValueEnum;
use serde::Serialize;
use serde_json::{json, Value};

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
}

impl Variant {
    pub const ALL: [Variant; 5] = [
        Variant::SerialCopy,
        Variant::ReferenceCopy,
        Variant::PrefixCopy,
        Variant::SerialCount,
        Variant::PrefixCount,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Variant::SerialCopy => "serial-copy",
            Variant::ReferenceCopy => "reference-copy",
            Variant::PrefixCopy => "prefix-copy",
            Variant::SerialCount => "serial-count",
            Variant::PrefixCount => "prefix-count",
        }
    }

    pub fn is_copy(self) -> bool {
        matches!(
            self,
            Variant::SerialCopy | Variant::ReferenceCopy | Variant::PrefixCopy
        )
    }

    /// The scan request, exactly as a user would POST it.
    pub(super) fn request(self, source: &str, destination: &str) -> Value {
        let strategy = match self {
            Variant::SerialCopy | Variant::SerialCount => "serial",
            _ => "prefix",
        };
        let mut body = json!({"driver": if self.is_copy() { "copy" } else { "count" },
            "sourceTable": source, "strategy": strategy});
        if self.is_copy() {
            body["destinationTable"] = json!(destination);
        }
        if self == Variant::ReferenceCopy {
            body["workSplit"] = json!("partitionKey");
        }
        body
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_post_the_right_requests() {
        let r = Variant::ReferenceCopy.request("S", "D");
        assert_eq!(r["workSplit"], "partitionKey");
        assert_eq!(r["strategy"], "prefix");
        let c = Variant::SerialCount.request("S", "D");
        assert_eq!(
            (c["driver"].as_str(), c.get("destinationTable")),
            (Some("count"), None)
        );
        let names: Vec<_> = Variant::ALL.iter().map(|v| v.name()).collect();
        for v in Variant::ALL {
            assert_eq!(
                v.to_possible_value().unwrap().get_name(),
                v.name(),
                "CLI and JSON names agree"
            );
        }
        assert_eq!(names.len(), 5);
    }
}
