//! What a partition-key or serial step still has to read, as key bounds ([`Region`]), and how
//! such a range is resumed after a row or split in two when a step's query budget is spent on
//! empty pages (steps never carry continuation tokens).

use crate::storage::{compare_keys, key_successor, keys::min_key, CompareOp, Filter};

use super::error::ScanError;
use super::midpoint::key_between;
use super::params::ScanParameters;
use super::step::{LowerBound, Step};

/// What a partition-key or serial step still has to read, as key bounds.
#[derive(Debug, Clone)]
pub(super) enum Region {
    /// Rows of partition `pk` with `skip` < RowKey (≤ `through`).
    Partition {
        pk: String,
        skip: Option<String>,
        through: Option<String>,
    },
    /// Rows of the scan range with `after` < (PartitionKey, RowKey) (≤ `through`).
    Serial {
        after: Option<(String, String)>,
        through: Option<(String, String)>,
    },
}

impl Region {
    pub(super) fn filter(&self, p: &ScanParameters) -> Option<Filter> {
        let mut parts = Vec::new();
        match self {
            Region::Partition { pk, skip, through } => {
                parts.push(Filter::pk(CompareOp::Eq, pk.clone()));
                if let Some(rk) = skip {
                    parts.push(Filter::rk(CompareOp::Gt, rk.clone()));
                }
                if let Some(rk) = through {
                    parts.push(Filter::rk(CompareOp::Le, rk.clone()));
                }
            }
            Region::Serial { after, through } => {
                if !p.prefix.is_empty() {
                    parts.push(Filter::pk(CompareOp::Ge, p.prefix.clone()));
                }
                if let Some(l) = &p.lower {
                    parts.push(Filter::pk(CompareOp::Gt, l.clone()));
                }
                if let Some(u) = tighter_upper(key_successor(&p.prefix), &p.upper) {
                    parts.push(Filter::pk(CompareOp::Lt, u));
                }
                if let Some((pk, rk)) = after {
                    parts.push(Filter::or(vec![
                        Filter::and(vec![
                            Filter::pk(CompareOp::Eq, pk.clone()),
                            Filter::rk(CompareOp::Gt, rk.clone()),
                        ]),
                        Filter::pk(CompareOp::Gt, pk.clone()),
                    ]));
                }
                if let Some((pk, rk)) = through {
                    parts.push(Filter::or(vec![
                        Filter::and(vec![
                            Filter::pk(CompareOp::Eq, pk.clone()),
                            Filter::rk(CompareOp::Le, rk.clone()),
                        ]),
                        Filter::pk(CompareOp::Lt, pk.clone()),
                    ]));
                }
            }
        }
        (!parts.is_empty()).then(|| Filter::and(parts))
    }

    /// The whole region as a step.
    pub(super) fn step(self, depth: u32) -> Step {
        match self {
            Region::Partition {
                pk,
                skip,
                through: None,
            } => Step::PartitionKeyQuery {
                partition_key: pk,
                row_key_skip: skip,
                depth,
            },
            Region::Partition {
                pk,
                skip,
                through: Some(through),
            } => Step::PartitionKeyRange {
                partition_key: pk,
                row_key_skip: skip,
                row_key_through: through,
                depth,
            },
            Region::Serial {
                after,
                through: None,
            } => Step::Serial { after },
            Region::Serial {
                after,
                through: Some(through),
            } => Step::SerialRange {
                after,
                through,
                depth,
            },
        }
    }

    /// The part of the region after the row `(pk, rk)`, as a step.
    pub(super) fn resume(self, (pk, rk): (String, String), depth: u32) -> Step {
        match self {
            Region::Partition { pk, through, .. } => Region::Partition {
                pk,
                skip: Some(rk),
                through,
            },
            Region::Serial { through, .. } => Region::Serial {
                after: Some((pk, rk)),
                through,
            },
        }
        .step(depth)
    }

    /// The region as two steps that each cover less of it (made when the budget went on empty
    /// pages: continuation tokens are never put in steps, so this is how such a step makes
    /// progress). A region of a single key cannot be split: it is retried with `depth + 1`, so
    /// that the retry is a work item of its own.
    pub(super) fn split(self, p: &ScanParameters, depth: u32) -> Vec<Step> {
        let halves = match &self {
            Region::Partition { pk, skip, through } => between_row_keys(
                &skip.clone().map_or(RowBound::Min, RowBound::Key),
                &through.clone().map_or(RowBound::Max, RowBound::Key),
            )
            .map(|m| {
                (
                    Region::Partition {
                        pk: pk.clone(),
                        skip: skip.clone(),
                        through: Some(m.clone()),
                    },
                    Region::Partition {
                        pk: pk.clone(),
                        skip: Some(m),
                        through: through.clone(),
                    },
                )
            }),
            Region::Serial { after, through } => {
                between_positions(&serial_lower(p, after), &serial_upper(p, through)).map(|m| {
                    (
                        Region::Serial {
                            after: after.clone(),
                            through: Some(m.clone()),
                        },
                        Region::Serial {
                            after: Some(m),
                            through: through.clone(),
                        },
                    )
                })
            }
        };
        if let Some((first, second)) = halves {
            return vec![first.step(depth), second.step(depth)];
        }
        let single_key = match &self {
            Region::Partition {
                skip,
                through: Some(t),
                ..
            } => skip.as_deref().map_or(true, |s| compare_keys(s, t).is_lt()),
            Region::Serial {
                after,
                through: Some(t),
            } => {
                let (lpk, lrk) = serial_lower(p, after);
                match compare_keys(&lpk, &t.0) {
                    std::cmp::Ordering::Less => true,
                    std::cmp::Ordering::Equal => match lrk {
                        RowBound::Min => true,
                        RowBound::Key(l) => compare_keys(&l, &t.1).is_lt(),
                        RowBound::Max => false,
                    },
                    std::cmp::Ordering::Greater => false,
                }
            }
            _ => false,
        };
        // Otherwise the region holds no key at all (the store paged over nothing): done.
        if single_key {
            vec![self.step(depth + 1)]
        } else {
            Vec::new()
        }
    }
}

/// A row-key bound within one partition: below every row key, a key, or above every row key.
#[derive(Debug, Clone, PartialEq, Eq)]
enum RowBound {
    Min,
    Key(String),
    Max,
}

/// A row key `m` with `lower` < m < `upper`, or `None` if there is none. `Min` as the lower bound
/// admits `""`.
fn between_row_keys(lower: &RowBound, upper: &RowBound) -> Option<String> {
    match (lower, upper) {
        (RowBound::Max, _) | (_, RowBound::Min) => None,
        (RowBound::Min, RowBound::Max) => key_between("", None),
        (RowBound::Min, RowBound::Key(u)) if u.is_empty() => None,
        (RowBound::Min, RowBound::Key(u)) => Some(key_between("", Some(u)).unwrap_or_default()),
        (RowBound::Key(l), RowBound::Max) => key_between(l, None),
        (RowBound::Key(l), RowBound::Key(u)) => key_between(l, Some(u)),
    }
}

/// The exclusive lower end of a serial region as a position: after the row given, or the start
/// of the scan range.
fn serial_lower(p: &ScanParameters, after: &Option<(String, String)>) -> (String, RowBound) {
    match (after, &p.lower) {
        (Some((pk, rk)), _) => (pk.clone(), RowBound::Key(rk.clone())),
        (None, Some(l)) if compare_keys(l, &p.prefix).is_ge() => (l.clone(), RowBound::Max),
        (None, _) => (p.prefix.clone(), RowBound::Min),
    }
}

/// The inclusive upper end of a serial region as a position: the row given, or below every row
/// of the scan range's exclusive upper partition key (`None`: unbounded).
fn serial_upper(
    p: &ScanParameters,
    through: &Option<(String, String)>,
) -> (Option<String>, RowBound) {
    match through {
        Some((pk, rk)) => (Some(pk.clone()), RowBound::Key(rk.clone())),
        None => (
            tighter_upper(key_successor(&p.prefix), &p.upper),
            RowBound::Min,
        ),
    }
}

/// A position strictly between an exclusive `lower` and an inclusive `upper` (partition key
/// `None`: above everything; `(u, Min)`: below every row of partition `u`), or `None` if the
/// range holds no more than `upper` itself.
fn between_positions(
    (lpk, lrk): &(String, RowBound),
    (upk, urk): &(Option<String>, RowBound),
) -> Option<(String, String)> {
    if let Some(u) = upk {
        match compare_keys(lpk, u) {
            std::cmp::Ordering::Greater => return None,
            std::cmp::Ordering::Equal => {
                return between_row_keys(lrk, urk).map(|rk| (lpk.clone(), rk))
            }
            std::cmp::Ordering::Less => {}
        }
    }
    if let Some(m) = key_between(lpk, upk.as_deref()) {
        return Some((m, String::new()));
    }
    // Adjacent partition keys (`u` is `lpk + '\0'`): split inside one of them.
    between_row_keys(lrk, &RowBound::Max)
        .map(|rk| (lpk.clone(), rk))
        .or_else(|| {
            let u = upk.clone()?;
            between_row_keys(&RowBound::Min, urk).map(|rk| (u, rk))
        })
}

/// A prefix-query range spent its budget on empty pages before reading a row: split it at a key
/// in its middle into two prefix-query steps, or, for a range of one partition key, hand that
/// partition to a partition-key query.
pub(super) fn split_prefix_range(
    prefix: &str,
    lower: &LowerBound,
    upper: &Option<String>,
    depth: u32,
) -> Vec<Step> {
    // The least key in the range.
    let least = match lower {
        LowerBound::From(k) => k.clone(),
        LowerBound::After(k) => format!("{k}\0"),
    };
    if let Some(middle) = key_between(&least, upper.as_deref()) {
        return vec![
            Step::PrefixQuery {
                prefix: prefix.to_string(),
                lower: lower.clone(),
                upper: Some(middle.clone()),
                depth,
            },
            Step::PrefixQuery {
                prefix: prefix.to_string(),
                lower: LowerBound::From(middle),
                upper: upper.clone(),
                depth,
            },
        ];
    }
    match upper {
        Some(u) if compare_keys(&least, u).is_lt() => vec![Step::PartitionKeyQuery {
            partition_key: least,
            row_key_skip: None,
            depth,
        }],
        // The range holds no key at all (the store paged over nothing): done.
        _ => Vec::new(),
    }
}

/// A prefix query's row must be in its range (`lower`, `upper`) and extend `prefix`: the next
/// character after the prefix names the child prefix.
pub(super) fn check_in_prefix_range(
    pk: &str,
    prefix: &str,
    lower: &LowerBound,
    upper: &Option<String>,
) -> Result<(), ScanError> {
    let above_lower = match lower {
        LowerBound::After(k) => compare_keys(pk, k).is_gt(),
        LowerBound::From(k) => compare_keys(pk, k).is_ge(),
    };
    let below_upper = upper
        .as_deref()
        .map_or(true, |u| compare_keys(pk, u).is_lt());
    let extends = pk.strip_prefix(prefix).is_some_and(|rest| !rest.is_empty());
    if above_lower && below_upper && extends {
        Ok(())
    } else {
        Err(ScanError::StoreMisbehaved(format!(
            "partition key {pk:?} is outside the prefix query for prefix {prefix:?} above {:?} and below {:?}",
            lower.key(),
            upper.as_deref().unwrap_or("(none)")
        )))
    }
}

/// The lower of two exclusive upper bounds, where `None` means unbounded.
pub(super) fn tighter_upper(a: Option<String>, b: &Option<String>) -> Option<String> {
    match (a, b) {
        (Some(a), Some(b)) => Some(min_key(&a, b).to_string()),
        (a, None) => a,
        (None, b) => b.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scan::midpoint::tests::key;
    use proptest::prelude::{any, prop, prop_assert, prop_assert_eq, proptest, ProptestConfig};

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        #[test]
        fn row_key_middle_splits_a_range_in_two_non_empty_parts(
            lower in prop::option::of(key()),
            upper in prop::option::of(key()),
        ) {
            let lo = lower.clone().map_or(RowBound::Min, RowBound::Key);
            let hi = upper.clone().map_or(RowBound::Max, RowBound::Key);
            if let Some(m) = between_row_keys(&lo, &hi) {
                // (lower, m] holds m; (m, upper] holds m + "\0" or upper.
                if let Some(l) = &lower {
                    prop_assert!(compare_keys(l, &m).is_lt());
                }
                if let Some(u) = &upper {
                    prop_assert!(compare_keys(&m, u).is_lt());
                }
            } else if let (Some(l), Some(u)) = (&lower, &upper) {
                let adjacent = *u == format!("{}\0", l);
                prop_assert!(compare_keys(l, u).is_ge() || adjacent);
            } else {
                prop_assert_eq!(upper.as_deref(), Some(""));
            }
        }

        #[test]
        fn position_middle_is_strictly_inside(
            lpk in key(), lrk in prop::option::of(key()), max in any::<bool>(),
            upk in prop::option::of(key()), urk in prop::option::of(key()),
        ) {
            let lower = (lpk.clone(), match lrk { Some(k) => RowBound::Key(k), None if max => RowBound::Max, None => RowBound::Min });
            let upper = (upk.clone(), urk.clone().map_or(RowBound::Min, RowBound::Key));
            let rank = |b: &RowBound| match b { RowBound::Min => 0, RowBound::Key(_) => 1, RowBound::Max => 2 };
            let cmp_bound = |a: &RowBound, b: &RowBound| match (a, b) {
                (RowBound::Key(x), RowBound::Key(y)) => compare_keys(x, y),
                _ => rank(a).cmp(&rank(b)),
            };
            if let Some((mpk, mrk)) = between_positions(&lower, &upper) {
                let m = RowBound::Key(mrk);
                let above_lower = compare_keys(&lower.0, &mpk).then_with(|| cmp_bound(&lower.1, &m));
                prop_assert!(above_lower.is_lt());
                if let Some(u) = &upper.0 {
                    let below_upper = compare_keys(&mpk, u).then_with(|| cmp_bound(&m, &upper.1));
                    prop_assert!(below_upper.is_lt());
                }
            }
        }
    }
}
