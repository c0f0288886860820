//! Executing steps against a [`TableStore`].

use crate::storage::{
    compare_keys, key_successor, keys::min_key, CompareOp, Entity, Filter, Query, StorageError,
    TableStore,
};

use super::params::{ScanParameters, Strategy};
use super::step::{LowerBound, Step};

/// How much work one step may do before it hands the rest on as a follow-up step. This is what
/// keeps every Functions invocation short whatever the table looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepBudget {
    /// Non-empty pages one partition-key or serial step reads before continuing in a new step.
    pub max_pages: usize,
    /// Queries one prefix-query step sends before continuing in a new step.
    pub max_queries: usize,
}

impl StepBudget {
    /// No limits: a step runs to its natural end (used by the in-process depth-first listing).
    pub const UNLIMITED: StepBudget = StepBudget {
        max_pages: usize::MAX,
        max_queries: usize::MAX,
    };
}

impl Default for StepBudget {
    fn default() -> Self {
        StepBudget {
            max_pages: 8,
            max_queries: 16,
        }
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
                self.partition_key_query(partition_key, row_key_skip.clone(), *depth, &mut out)
                    .await?
            }
            Step::Serial { after } => self.serial(after.clone(), &mut out).await?,
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

    /// The prefix query loop: read up to N non-empty pages of the range; if more rows remain,
    /// hand the rest of the last partition and the rest of its child prefix to new steps, then
    /// jump past the whole child prefix (to its exact successor) and repeat.
    async fn prefix_query(
        &self,
        prefix: &str,
        mut lower: LowerBound,
        upper: Option<String>,
        depth: u32,
        out: &mut StepOutput,
    ) -> Result<(), ScanError> {
        let mut wanted = self.params.segments_per_first_prefix as usize;
        loop {
            let filter = Self::range_filter(&lower, &upper);
            let mut rows: Vec<Entity> = Vec::new();
            let mut non_empty = 0usize;
            let mut continuation = None;
            let has_more = loop {
                let page = self.page(Some(&filter), continuation.take(), out).await?;
                if !page.entities.is_empty() {
                    rows.extend(page.entities);
                    non_empty += 1;
                }
                match page.continuation {
                    None => break false,
                    Some(c) if non_empty >= wanted => {
                        let _ = c;
                        break true;
                    }
                    Some(c) => continuation = Some(c),
                }
            };
            let Some(last) = rows.last() else {
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
            // The child prefix: ours plus the next character of the last partition key. The last
            // key is strictly above `prefix` (the range starts above it), so that character exists.
            let next_char = last_pk[prefix.len()..].chars().next().ok_or_else(|| {
                ScanError::InvalidStep(format!(
                    "partition key {last_pk:?} does not extend prefix {prefix:?}"
                ))
            })?;
            let child_prefix = format!("{prefix}{next_char}");
            let child_successor = key_successor(&child_prefix);
            let child_upper = tighter_upper(child_successor.clone(), &upper);
            if self.params.expand_partition_keys {
                out.steps.push(Step::PartitionKeyQuery {
                    partition_key: last_pk.clone(),
                    row_key_skip: Some(last_rk),
                    depth: depth + 1,
                });
            } else {
                self.partition_key_query(&last_pk, Some(last_rk), depth, out)
                    .await?;
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
            wanted = self.params.segments_per_subsequent_prefix as usize;
            if out.queries >= self.budget.max_queries {
                out.steps.push(Step::PrefixQuery {
                    prefix: prefix.to_string(),
                    lower,
                    upper,
                    depth,
                });
                return Ok(());
            }
        }
    }

    /// Reads one partition (rows after `row_key_skip`), a segment per non-empty page, and
    /// continues in a new step once the page budget is spent.
    async fn partition_key_query(
        &self,
        pk: &str,
        row_key_skip: Option<String>,
        depth: u32,
        out: &mut StepOutput,
    ) -> Result<(), ScanError> {
        let mut parts = vec![Filter::pk(CompareOp::Eq, pk)];
        if let Some(rk) = &row_key_skip {
            parts.push(Filter::rk(CompareOp::Gt, rk.clone()));
        }
        let filter = Filter::and(parts);
        self.paged(Some(&filter), depth, out, |last| Step::PartitionKeyQuery {
            partition_key: pk.to_string(),
            row_key_skip: Some(last.row_key.clone()),
            depth,
        })
        .await
    }

    /// Serial paging of the scan range from a resume point.
    async fn serial(
        &self,
        after: Option<(String, String)>,
        out: &mut StepOutput,
    ) -> Result<(), ScanError> {
        let p = self.params;
        let mut parts = Vec::new();
        if !p.prefix.is_empty() {
            parts.push(Filter::pk(CompareOp::Ge, p.prefix.clone()));
        }
        if let Some(l) = &p.lower {
            parts.push(Filter::pk(CompareOp::Gt, l.clone()));
        }
        let upper = tighter_upper(key_successor(&p.prefix), &p.upper);
        if let Some(u) = upper {
            parts.push(Filter::pk(CompareOp::Lt, u));
        }
        if let Some((pk, rk)) = &after {
            parts.push(Filter::or(vec![
                Filter::and(vec![
                    Filter::pk(CompareOp::Eq, pk.clone()),
                    Filter::rk(CompareOp::Gt, rk.clone()),
                ]),
                Filter::pk(CompareOp::Gt, pk.clone()),
            ]));
        }
        let filter = (!parts.is_empty()).then(|| Filter::and(parts));
        self.paged(filter.as_ref(), 0, out, |last| Step::Serial {
            after: Some((last.partition_key.clone(), last.row_key.clone())),
        })
        .await
    }

    /// Follows continuations, one segment per non-empty page, until the query ends or the page
    /// budget is spent; then the remainder becomes the step `resume` builds from the last row.
    async fn paged(
        &self,
        filter: Option<&Filter>,
        depth: u32,
        out: &mut StepOutput,
        resume: impl Fn(&Entity) -> Step,
    ) -> Result<(), ScanError> {
        let mut continuation = None;
        let mut pages = 0usize;
        let mut last_row: Option<Entity> = None;
        loop {
            let page = self.page(filter, continuation.take(), out).await?;
            if !page.entities.is_empty() {
                pages += 1;
                last_row = page.entities.last().cloned();
                out.steps.push(Step::Segment {
                    entities: page.entities,
                    depth: depth + 1,
                });
            }
            match page.continuation {
                None => return Ok(()),
                Some(c) => {
                    if pages >= self.budget.max_pages {
                        if let Some(last) = &last_row {
                            out.steps.push(resume(last));
                            return Ok(());
                        }
                    }
                    continuation = Some(c);
                }
            }
        }
    }
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
