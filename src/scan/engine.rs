//! Executing steps against a [`TableStore`].

use crate::storage::{
    compare_keys, key_successor, keys::min_key, CompareOp, Entity, Filter, Query, StorageError,
    TableStore,
};

use super::params::{ScanParameters, Strategy};
use super::step::{LowerBound, Step};

/// How much work one step may do before it hands the rest on as a follow-up step. This is what
/// keeps every Functions invocation short whatever the table and the parameters look like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepBudget {
    /// Non-empty pages one partition-key or serial step reads before continuing in a new step.
    pub max_pages: usize,
    /// Queries one step of any kind sends, counting empty pages and the partition-key queries
    /// a prefix-query step runs inline. Checked before every query. 0 counts as 1.
    pub max_queries: usize,
}

impl StepBudget {
    /// No limits: a step runs to its natural end (used by the in-process depth-first listing).
    pub const UNLIMITED: StepBudget = StepBudget {
        max_pages: usize::MAX,
        max_queries: usize::MAX,
    };

    /// The budget of the Functions app.
    pub const DEFAULT: StepBudget = StepBudget {
        max_pages: 8,
        max_queries: 16,
    };
}

impl Default for StepBudget {
    fn default() -> Self {
        StepBudget::DEFAULT
    }
}

/// What executing one step produced: segments of rows and follow-up steps, in depth-first
/// (PK, RK) order, plus the number of queries sent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepOutput {
    pub steps: Vec<Step>,
    pub queries: usize,
}

impl StepOutput {
    /// Rows in the segments of this output.
    pub fn row_count(&self) -> usize {
        self.steps
            .iter()
            .map(|s| {
                if let Step::Segment { entities, .. } = s {
                    entities.len()
                } else {
                    0
                }
            })
            .sum()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
    #[error("invalid step: {0}")]
    InvalidStep(String),
    #[error("the scan cannot go on: {0}")]
    Unaddressable(String),
    /// The store answered a query with a row outside the query's range: the scan cannot stay
    /// exact on such answers.
    #[error("store answered outside the query: {0}")]
    StoreMisbehaved(String),
}

/// Executes scan steps for one table and one set of parameters.
pub struct Scanner<'a, T: TableStore> {
    store: &'a T,
    table: &'a str,
    params: &'a ScanParameters,
    budget: StepBudget,
    select: Option<Vec<String>>,
}

impl<'a, T: TableStore> Scanner<'a, T> {
    pub fn new(
        store: &'a T,
        table: &'a str,
        params: &'a ScanParameters,
        budget: StepBudget,
    ) -> Self {
        let select = params.select_columns();
        Scanner {
            store,
            table,
            params,
            budget,
            select,
        }
    }

    /// The root step of a scan with the given strategy.
    pub fn root(strategy: Strategy) -> Step {
        match strategy {
            Strategy::Prefix => Step::Start,
            Strategy::Serial => Step::Serial { after: None },
        }
    }

    /// Executes one step. A `Segment` has nothing to execute and yields nothing.
    ///
    /// Sends at most `budget.max_queries` queries (at least one), whatever the step, the
    /// parameters and the table; what is left is handed on as follow-up steps, without losing or
    /// repeating a row. Every follow-up step covers strictly less than the step it came from, or
    /// (for a range of one key that came back empty) is a retry under a new identity.
    pub async fn execute(&self, step: &Step) -> Result<StepOutput, ScanError> {
        let mut out = StepOutput::default();
        match step {
            Step::Start => self.start(&mut out),
            Step::PrefixQuery {
                prefix,
                lower,
                upper,
                depth,
            } => {
                self.prefix_query(prefix, lower.clone(), upper.clone(), *depth, &mut out)
                    .await?
            }
            Step::PartitionKeyQuery {
                partition_key,
                row_key_skip,
                depth,
            } => {
                let region = Region::Partition {
                    pk: partition_key.clone(),
                    skip: row_key_skip.clone(),
                    through: None,
                };
                self.paged(region, *depth, true, &mut out).await?
            }
            Step::PartitionKeyRange {
                partition_key,
                row_key_skip,
                row_key_through,
                depth,
            } => {
                let region = Region::Partition {
                    pk: partition_key.clone(),
                    skip: row_key_skip.clone(),
                    through: Some(row_key_through.clone()),
                };
                self.paged(region, *depth, true, &mut out).await?
            }
            Step::Serial { after } => {
                let region = Region::Serial {
                    after: after.clone(),
                    through: None,
                };
                self.paged(region, 0, true, &mut out).await?
            }
            Step::SerialRange {
                after,
                through,
                depth,
            } => {
                let region = Region::Serial {
                    after: after.clone(),
                    through: Some(through.clone()),
                };
                self.paged(region, *depth, true, &mut out).await?
            }
            Step::Segment { .. } => {}
        }
        Ok(out)
    }

    /// `Start`: a partition-key query for a key equal to the prefix (the prefix query's strict
    /// `gt` can never return it), then the prefix query over the whole range.
    fn start(&self, out: &mut StepOutput) {
        let p = self.params;
        if p.contains_partition_key(&p.prefix) {
            out.steps.push(Step::PartitionKeyQuery {
                partition_key: p.prefix.clone(),
                row_key_skip: None,
                depth: 1,
            });
        }
        let lower = match &p.lower {
            Some(l) if compare_keys(l, &p.prefix).is_gt() => l.clone(),
            _ => p.prefix.clone(),
        };
        let upper = tighter_upper(key_successor(&p.prefix), &p.upper);
        if upper
            .as_deref()
            .map_or(true, |u| compare_keys(&lower, u).is_lt())
        {
            out.steps.push(Step::PrefixQuery {
                prefix: p.prefix.clone(),
                lower: LowerBound::After(lower),
                upper,
                depth: 1,
            });
        }
    }

    fn range_filter(lower: &LowerBound, upper: &Option<String>) -> Filter {
        let mut parts = vec![lower.filter()];
        if let Some(u) = upper {
            parts.push(Filter::pk(CompareOp::Lt, u.clone()));
        }
        Filter::and(parts)
    }

    async fn page(
        &self,
        filter: Option<&Filter>,
        continuation: Option<crate::storage::Continuation>,
        out: &mut StepOutput,
    ) -> Result<crate::storage::Page, ScanError> {
        let query = Query {
            filter: filter.cloned(),
            top: Some(self.params.take),
            select: self.select.clone(),
            continuation,
        };
        out.queries += 1;
        let page = self.store.query_page(self.table, &query).await?;
        // Discovery needs every key of a page to place its bounds; a key it cannot name stops
        // the step, naming the row (see `storage::UnaddressableRow`).
        match page.unaddressable.first() {
            Some(row) => Err(ScanError::Unaddressable(row.to_string())),
            None => Ok(page),
        }
    }

    /// Queries this step may still send (at least one per step).
    fn queries_left(&self, out: &StepOutput) -> bool {
        out.queries < self.budget.max_queries.max(1)
    }

    /// The prefix query loop: read up to N non-empty pages of the range; if more rows remain,
    /// hand the rest of the last partition and the rest of its child prefix to new steps, then
    /// jump past the whole child prefix (to its exact successor) and repeat.
    ///
    /// The query budget is checked before every query: once it is spent, reading stops as if N
    /// pages had been read (the fan-out is exact whatever was read), and the rest of the range
    /// becomes a new prefix-query step. If the budget went on empty pages before any row was
    /// read, the range is split in two so that the follow-up steps still cover less.
    async fn prefix_query(
        &self,
        prefix: &str,
        mut lower: LowerBound,
        upper: Option<String>,
        depth: u32,
        out: &mut StepOutput,
    ) -> Result<(), ScanError> {
        // (Validation keeps both 1..=16; the step budget bounds a step whatever they are.)
        let mut wanted = self.params.segments_per_first_prefix.max(1) as usize;
        // Whether `lower` moved past the step's own lower bound.
        let mut advanced = false;
        loop {
            if !self.queries_left(out) {
                // Only after a jump: the first round always has budget.
                out.steps.push(Step::PrefixQuery {
                    prefix: prefix.to_string(),
                    lower,
                    upper,
                    depth,
                });
                return Ok(());
            }
            let filter = Self::range_filter(&lower, &upper);
            let mut rows: Vec<Entity> = Vec::new();
            let mut non_empty = 0usize;
            let mut continuation = None;
            let has_more = loop {
                let page = self.page(Some(&filter), continuation.take(), out).await?;
                if !page.entities.is_empty() {
                    for e in &page.entities {
                        check_in_prefix_range(&e.partition_key, prefix, &lower, &upper)?;
                    }
                    rows.extend(page.entities);
                    non_empty += 1;
                }
                match page.continuation {
                    None => break false,
                    Some(_) if non_empty >= wanted || !self.queries_left(out) => break true,
                    Some(c) => continuation = Some(c),
                }
            };
            let Some(last) = rows.last() else {
                if has_more {
                    // The budget went on empty pages.
                    if advanced {
                        out.steps.push(Step::PrefixQuery {
                            prefix: prefix.to_string(),
                            lower,
                            upper,
                            depth,
                        });
                    } else {
                        out.steps
                            .extend(split_prefix_range(prefix, &lower, &upper, depth));
                    }
                }
                return Ok(());
            };
            let (last_pk, last_rk) = (last.partition_key.clone(), last.row_key.clone());
            out.steps.push(Step::Segment {
                entities: rows,
                depth: depth + 1,
            });
            if !has_more {
                return Ok(());
            }
            // The child prefix: ours plus the next character of the last partition key (which
            // `check_in_prefix_range` found to extend the prefix).
            let next_char = last_pk
                .strip_prefix(prefix)
                .and_then(|rest| rest.chars().next())
                .ok_or_else(|| {
                    ScanError::StoreMisbehaved(format!(
                        "partition key {last_pk:?} does not extend prefix {prefix:?}"
                    ))
                })?;
            let child_prefix = format!("{prefix}{next_char}");
            let child_successor = key_successor(&child_prefix);
            let child_upper = tighter_upper(child_successor.clone(), &upper);
            let rest_of_partition = Region::Partition {
                pk: last_pk.clone(),
                skip: Some(last_rk),
                through: None,
            };
            if self.params.expand_partition_keys {
                out.steps.push(rest_of_partition.step(depth + 1));
            } else {
                // Inline, sharing this step's query budget.
                self.paged(rest_of_partition, depth, false, out).await?;
            }
            out.steps.push(Step::PrefixQuery {
                prefix: child_prefix,
                lower: LowerBound::After(last_pk),
                upper: child_upper,
                depth: depth + 1,
            });
            // Jump past every key with the child prefix; stop if nothing can remain in range.
            let Some(successor) = child_successor else {
                return Ok(());
            };
            if upper
                .as_deref()
                .is_some_and(|u| compare_keys(&successor, u).is_ge())
            {
                return Ok(());
            }
            lower = LowerBound::From(successor);
            wanted = self.params.segments_per_subsequent_prefix.max(1) as usize;
            advanced = true;
        }
    }

    /// Reads a partition-key or serial region, a segment per non-empty page, following
    /// continuations until the query ends or the budget is spent: `max_pages` non-empty pages, or
    /// `max_queries` queries for the whole step (empty pages count). The rest then becomes a
    /// follow-up step resuming after the last row read. When no row was read, the whole region is
    /// handed on if it is not the step being executed (`own_step` false: a partition read inline
    /// by a prefix-query step), and otherwise split in two.
    async fn paged(
        &self,
        region: Region,
        depth: u32,
        own_step: bool,
        out: &mut StepOutput,
    ) -> Result<(), ScanError> {
        if !self.queries_left(out) {
            // Only inline: the calling step spent the budget.
            out.steps.push(region.step(depth));
            return Ok(());
        }
        let filter = region.filter(self.params);
        let mut continuation = None;
        let mut pages = 0usize;
        let mut last_row: Option<(String, String)> = None;
        loop {
            let page = self.page(filter.as_ref(), continuation.take(), out).await?;
            if let Some(last) = page.entities.last() {
                pages += 1;
                last_row = Some((last.partition_key.clone(), last.row_key.clone()));
                out.steps.push(Step::Segment {
                    entities: page.entities,
                    depth: depth + 1,
                });
            }
            let Some(c) = page.continuation else {
                return Ok(());
            };
            if pages < self.budget.max_pages.max(1) && self.queries_left(out) {
                continuation = Some(c);
                continue;
            }
            match last_row {
                Some(last) => out.steps.push(region.resume(last, depth)),
                None if !own_step => out.steps.push(region.step(depth)),
                None => out.steps.extend(region.split(self.params, depth)),
            }
            return Ok(());
        }
    }
}

/// What a partition-key or serial step still has to read, as key bounds.
#[derive(Debug, Clone)]
enum Region {
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
    fn filter(&self, p: &ScanParameters) -> Option<Filter> {
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
    fn step(self, depth: u32) -> Step {
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
    fn resume(self, (pk, rk): (String, String), depth: u32) -> Step {
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
    fn split(self, p: &ScanParameters, depth: u32) -> Vec<Step> {
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
fn split_prefix_range(
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
fn check_in_prefix_range(
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

/// The rank of a character in UTF-16 order: U+0000..U+D7FF, then U+10000..U+10FFFF, then
/// U+E000..U+FFFF, numbered from 0 without gaps.
fn utf16_rank(c: char) -> u32 {
    match c as u32 {
        n @ 0..=0xD7FF => n,
        n @ 0x1_0000..=0x10_FFFF => n - 0x1_0000 + 0xD800,
        n => n - 0xE000 + 0xD800 + 0x10_0000,
    }
}

/// The number of characters (ranks are `0..RANKS`).
const RANKS: u32 = 0xD800 + 0x10_0000 + 0x2000;

fn char_of_rank(r: u32) -> char {
    let n = match r {
        0..=0xD7FF => r,
        0xD800..=0x10_D7FF => r - 0xD800 + 0x1_0000,
        _ => r - 0xD800 - 0x10_0000 + 0xE000,
    };
    char::from_u32(n).expect("ranks map to characters")
}

/// A key strictly between `a` and `b` in UTF-16 order (`b: None` is unbounded above), about
/// halfway at the first character where they differ; `None` if there is none (`b <= a`, or `b`
/// is `a` followed by U+0000). Uses U+0000 only when `b` forces it.
pub(crate) fn key_between(a: &str, b: Option<&str>) -> Option<String> {
    if b.is_some_and(|b| compare_keys(a, b).is_ge()) {
        return None;
    }
    // While `bounded`, the key so far equals both `a` and `b` up to `i`; afterwards it is
    // already below `b`, and only `a` bounds the rest.
    let mut bounded = b.is_some();
    let a: Vec<u32> = a.chars().map(utf16_rank).collect();
    let b: Vec<u32> = b.map_or_else(Vec::new, |b| b.chars().map(utf16_rank).collect());
    let mut out: Vec<u32> = Vec::new();
    let mut i = 0;
    loop {
        let high = if bounded { *b.get(i)? } else { RANKS };
        match a.get(i) {
            // `b` goes on after a U+0000 here: that U+0000 alone is a key between.
            None if high == 0 => {
                out.push(0);
                if b.len() > i + 1 {
                    break;
                }
                return None;
            }
            None => {
                out.push(high / 2);
                break;
            }
            Some(&low) if bounded && low == high => out.push(low),
            Some(&low) if high - low >= 2 => {
                out.push(low + (high - low) / 2);
                break;
            }
            Some(&low) => {
                out.push(low);
                bounded = false;
            }
        }
        i += 1;
    }
    Some(out.into_iter().map(char_of_rank).collect())
}

/// The lower of two exclusive upper bounds, where `None` means unbounded.
fn tighter_upper(a: Option<String>, b: &Option<String>) -> Option<String> {
    match (a, b) {
        (Some(a), Some(b)) => Some(min_key(&a, b).to_string()),
        (a, None) => a,
        (None, b) => b.clone(),
    }
}

/// Runs a whole scan in-process, depth-first, calling `on_rows` for every segment in (PK, RK)
/// order. Returns the number of queries sent.
pub async fn list<T: TableStore>(
    store: &T,
    table: &str,
    params: &ScanParameters,
    strategy: Strategy,
    mut on_rows: impl FnMut(Vec<Entity>) -> Result<(), ScanError>,
) -> Result<usize, ScanError> {
    let scanner = Scanner::new(store, table, params, StepBudget::UNLIMITED);
    let mut stack = vec![Scanner::<T>::root(strategy)];
    let mut queries = 0;
    while let Some(step) = stack.pop() {
        if let Step::Segment { entities, .. } = step {
            on_rows(entities)?;
            continue;
        }
        let output = scanner.execute(&step).await?;
        queries += output.queries;
        stack.extend(output.steps.into_iter().rev());
    }
    Ok(queries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::{any, prop, prop_assert, prop_assert_eq, proptest, ProptestConfig};
    use proptest::strategy::Strategy as _;

    fn key() -> impl proptest::strategy::Strategy<Value = String> {
        let parts = prop::sample::select(vec![
            "",
            "\0",
            "\u{1}",
            "a",
            "b",
            "az",
            "\u{D7FF}",
            "\u{E000}",
            "\u{FFFF}",
            "\u{10000}",
            "\u{1F600}",
            "\u{10FFFF}",
            "é",
        ]);
        prop::collection::vec(parts, 0..5).prop_map(|p| p.concat())
    }

    #[test]
    fn ranks_follow_utf16_order() {
        let chars = [
            '\0',
            'a',
            '\u{D7FF}',
            '\u{10000}',
            '\u{1F600}',
            '\u{10FFFF}',
            '\u{E000}',
            '\u{FFFF}',
        ];
        for w in chars.windows(2) {
            assert!(utf16_rank(w[0]) < utf16_rank(w[1]), "{w:?}");
            assert!(compare_keys(&w[0].to_string(), &w[1].to_string()).is_lt());
        }
        assert_eq!(utf16_rank('\u{FFFF}'), RANKS - 1);
        for c in chars {
            assert_eq!(char_of_rank(utf16_rank(c)), c);
        }
    }

    #[test]
    fn key_between_edge_cases() {
        assert_eq!(key_between("a", Some("a\0")), None);
        assert_eq!(key_between("a", Some("a")), None);
        assert_eq!(key_between("b", Some("a")), None);
        assert_eq!(key_between("", Some("")), None);
        let m = key_between("a", Some("b")).unwrap();
        assert!(compare_keys("a", &m).is_lt() && compare_keys(&m, "b").is_lt());
        assert!(!m.contains('\0'), "{m:?}");
        let m = key_between("\u{FFFF}\u{FFFF}", None).unwrap();
        assert!(compare_keys("\u{FFFF}\u{FFFF}", &m).is_lt());
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        #[test]
        fn key_between_is_strictly_between(a in key(), b in prop::option::of(key())) {
            match key_between(&a, b.as_deref()) {
                Some(m) => {
                    prop_assert!(compare_keys(&a, &m).is_lt(), "{:?} !< {:?}", a, m);
                    if let Some(b) = &b {
                        prop_assert!(compare_keys(&m, b).is_lt(), "{:?} !< {:?}", m, b);
                        // U+0000 only where `b` forces it.
                        prop_assert!(!m.contains('\0') || b.contains(['\0', '\u{1}']), "{:?}", m);
                    } else {
                        prop_assert!(!m.contains('\0'), "{:?}", m);
                    }
                }
                None => {
                    let b = b.expect("an unbounded range always has a middle");
                    let adjacent = b == format!("{}\0", a);
                    prop_assert!(compare_keys(&a, &b).is_ge() || adjacent);
                }
            }
        }

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
