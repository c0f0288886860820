//! Scan steps: plain serializable data carrying key bounds, never continuation tokens.

use serde::{Deserialize, Serialize};

use crate::storage::{CompareOp, Entity, Filter};

/// The lower end of a prefix query's partition-key range.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum LowerBound {
    /// `PartitionKey gt key`.
    After(String),
    /// `PartitionKey ge key` (used to jump past a whole discovered prefix to its exact successor).
    From(String),
}

impl LowerBound {
    pub fn key(&self) -> &str {
        match self {
            LowerBound::After(k) | LowerBound::From(k) => k,
        }
    }

    pub fn filter(&self) -> Filter {
        match self {
            LowerBound::After(k) => Filter::pk(CompareOp::Gt, k.clone()),
            LowerBound::From(k) => Filter::pk(CompareOp::Ge, k.clone()),
        }
    }
}

/// One unit of scan work, or (for [`Step::Segment`]) its result rows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Step {
    /// The root of a prefix scan: expands into the first queries (no query of its own).
    Start,
    /// Discover partition keys that start with `prefix` inside (`lower`, `upper`).
    #[serde(rename_all = "camelCase")]
    PrefixQuery {
        prefix: String,
        lower: LowerBound,
        /// Exclusive; `None` means unbounded above.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        upper: Option<String>,
        depth: u32,
    },
    /// Read the rows of one partition, those with RowKey > `row_key_skip` when given.
    #[serde(rename_all = "camelCase")]
    PartitionKeyQuery {
        partition_key: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        row_key_skip: Option<String>,
        depth: u32,
    },
    /// Serial paging of the whole scan range, resuming after the (PartitionKey, RowKey) given.
    #[serde(rename_all = "camelCase")]
    Serial {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<(String, String)>,
    },
    /// Part of a partition-key query: the rows of one partition with `row_key_skip` < RowKey ≤
    /// `row_key_through`. Made only when a step spent its query budget on empty pages and split
    /// its range in two to make progress (steps never carry continuation tokens).
    #[serde(rename_all = "camelCase")]
    PartitionKeyRange {
        partition_key: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        row_key_skip: Option<String>,
        row_key_through: String,
        depth: u32,
    },
    /// Part of a serial scan: the rows of the scan range with `after` < (PartitionKey, RowKey) ≤
    /// `through` (`after: None` starts at the range's start). Made like
    /// [`Step::PartitionKeyRange`]; `depth` only tells retries of a range that cannot be split
    /// further apart.
    #[serde(rename_all = "camelCase")]
    SerialRange {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<(String, String)>,
        through: (String, String),
        depth: u32,
    },
    /// Rows one query page produced (always at least one), in (PK, RK) order.
    Segment { entities: Vec<Entity>, depth: u32 },
}

impl Step {
    /// A short human-readable description for logs and errors.
    pub fn describe(&self) -> String {
        match self {
            Step::Start => "start".into(),
            Step::PrefixQuery {
                prefix,
                lower,
                upper,
                ..
            } => {
                let op = match lower {
                    LowerBound::After(_) => "gt",
                    LowerBound::From(_) => "ge",
                };
                format!(
                    "prefix {prefix:?}: PK {op} {:?} and lt {:?}",
                    lower.key(),
                    upper.as_deref().unwrap_or("(none)")
                )
            }
            Step::PartitionKeyQuery {
                partition_key,
                row_key_skip,
                ..
            } => match row_key_skip {
                Some(rk) => format!("PK eq {partition_key:?} and RK gt {rk:?}"),
                None => format!("PK eq {partition_key:?}"),
            },
            Step::PartitionKeyRange {
                partition_key,
                row_key_skip,
                row_key_through,
                ..
            } => match row_key_skip {
                Some(rk) => format!(
                    "PK eq {partition_key:?} and RK gt {rk:?} and RK le {row_key_through:?}"
                ),
                None => format!("PK eq {partition_key:?} and RK le {row_key_through:?}"),
            },
            Step::SerialRange {
                after,
                through: (tpk, trk),
                ..
            } => match after {
                Some((pk, rk)) => {
                    format!("serial after ({pk:?}, {rk:?}) through ({tpk:?}, {trk:?})")
                }
                None => format!("serial from the start through ({tpk:?}, {trk:?})"),
            },
            Step::Serial {
                after: Some((pk, rk)),
            } => format!("serial after ({pk:?}, {rk:?})"),
            Step::Serial { after: None } => "serial from the start".into(),
            Step::Segment { entities, .. } => format!("segment of {} rows", entities.len()),
        }
    }
}
