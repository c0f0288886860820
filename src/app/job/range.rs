//! Key ranges of the source table, the unit of most drivers' work: [`RangeWork`] — up to
//! 2,000 scanned rows, the rest of a range that grew, or the reference design's named rows —
//! and the exact filters that read one ([`range_filter`], [`range_filter_after`]). A scan step
//! that works on its rows records their ranges with its outcome (`WorkOutcome::in_step`).
//!
//! Invariant: the filter of a range covers exactly its rows in (PartitionKey, RowKey) order —
//! never a row outside — whatever the keys (prefixes of each other, the empty key).

use serde::{Deserialize, Serialize};

use crate::storage::{CompareOp, Filter};

/// The rows one range work item covers. Serialized as `{"kind": …}`; the text is the item's
/// identity, so it must never change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum RangeWork {
    /// Every row from `from` to `to` inclusive in (PartitionKey, RowKey) order: up to 2,000
    /// scanned rows (a page, or contiguous pages joined), re-read once.
    Range {
        from: (String, String),
        to: (String, String),
    },
    /// Every row after `after` (exclusive) up to `to` inclusive: the rest of a range that grew
    /// past what one invocation reads (rows inserted since it was scanned), or of rows a paced
    /// driver handed on (`job::Worked`).
    After {
        after: (String, String),
        to: (String, String),
    },
    /// The reference design's split (kept for honest comparison): named rows of one partition,
    /// re-read with `PK eq pk and RK between first and last` and checked to all be there.
    Rows { pk: String, row_keys: Vec<String> },
}

/// The exact filter for rows from `from` to `to` inclusive in (PK, RK) order.
pub fn range_filter(from: &(String, String), to: &(String, String)) -> Filter {
    key_range_filter(from, CompareOp::Ge, to)
}

/// The exact filter for rows after `after` (exclusive) up to `to` inclusive in (PK, RK) order.
pub fn range_filter_after(after: &(String, String), to: &(String, String)) -> Filter {
    key_range_filter(after, CompareOp::Gt, to)
}

/// Rows whose RowKey compares with `start_op` to the start row's within its partition, the
/// partitions in between, and the end partition's rows up to `to` inclusive.
fn key_range_filter(
    start: &(String, String),
    start_op: CompareOp,
    to: &(String, String),
) -> Filter {
    if start.0 == to.0 {
        return Filter::and(vec![
            Filter::pk(CompareOp::Eq, start.0.clone()),
            Filter::rk(start_op, start.1.clone()),
            Filter::rk(CompareOp::Le, to.1.clone()),
        ]);
    }
    Filter::or(vec![
        Filter::and(vec![
            Filter::pk(CompareOp::Eq, start.0.clone()),
            Filter::rk(start_op, start.1.clone()),
        ]),
        Filter::and(vec![
            Filter::pk(CompareOp::Gt, start.0.clone()),
            Filter::pk(CompareOp::Lt, to.0.clone()),
        ]),
        Filter::and(vec![
            Filter::pk(CompareOp::Eq, to.0.clone()),
            Filter::rk(CompareOp::Le, to.1.clone()),
        ]),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::messages::ItemJson;

    #[test]
    fn range_filter_is_exact() {
        let f = range_filter(&("b".into(), "5".into()), &("d".into(), "2".into()));
        let inside = [("b", "5"), ("b", "9"), ("c", "0"), ("d", "0"), ("d", "2")];
        let outside = [("b", "4"), ("a", "9"), ("d", "3"), ("e", "0")];
        assert!(inside.iter().all(|(p, r)| f.matches(p, r)));
        assert!(outside.iter().all(|(p, r)| !f.matches(p, r)));
        let after = range_filter_after(&("b".into(), "5".into()), &("d".into(), "2".into()));
        assert!(!after.matches("b", "5") && after.matches("b", "6") && after.matches("d", "2"));
        assert!(!after.matches("d", "3") && after.matches("c", "") && !after.matches("a", "9"));
        let same = range_filter_after(&("b".into(), "2".into()), &("b".into(), "4".into()));
        assert!(same.matches("b", "3") && !same.matches("b", "2") && !same.matches("b", "5"));
        let same = range_filter(&("b".into(), "2".into()), &("b".into(), "4".into()));
        assert!(same.matches("b", "3") && !same.matches("b", "5") && !same.matches("c", "3"));
    }

    /// Items are identified by their JSON text: it must never change.
    #[test]
    fn range_items_serialize_as_earlier_copy_items() {
        let work = RangeWork::Range {
            from: ("a".into(), "1".into()),
            to: ("b".into(), "2".into()),
        };
        assert_eq!(
            ItemJson::from_item(&work).unwrap().as_str(),
            r#"{"kind":"range","from":["a","1"],"to":["b","2"]}"#
        );
    }
}
