//! Executing steps against a [`TableStore`].

use crate::storage::{compare_keys, key_successor, CompareOp, Entity, Filter, Query, TableStore};

use super::budget::StepBudget;
use super::error::ScanError;
use super::params::{ScanParameters, Strategy};
use super::region::{check_in_prefix_range, split_prefix_range, tighter_upper, Region};
use super::step::{LowerBound, Step};

/// What executing one step produced: segments of rows and follow-up steps, in depth-first
/// (PK, RK) order, plus the number of queries sent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepOutput {
    pub steps: Vec<Step>,
    pub queries: usize,
    /// Rows read (the rows of the segments).
    pub rows: usize,
    /// Their text's bytes (`Entity::text_len`).
    pub row_bytes: usize,
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

    /// This scanner with another `$select` (`None`: every column): the columns it reads are
    /// the caller's choice, whatever the parameters say.
    pub fn with_select(self, select: Option<Vec<String>>) -> Self {
        Scanner { select, ..self }
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
                self.paged(region, *depth, None, &mut out).await?
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
                self.paged(region, *depth, None, &mut out).await?
            }
            Step::Serial { after } => {
                let region = Region::Serial {
                    after: after.clone(),
                    through: None,
                };
                self.paged(region, 0, None, &mut out).await?
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
                self.paged(region, *depth, None, &mut out).await?
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
        out.rows += page.entities.len();
        out.row_bytes += page.entities.iter().map(Entity::text_len).sum::<usize>();
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

    /// Whether this step may read another page of its own: queries left and the row budget
    /// not reached.
    fn pages_left(&self, out: &StepOutput) -> bool {
        self.queries_left(out)
            && out.rows < self.budget.max_rows
            && out.row_bytes < self.budget.max_row_bytes
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
            if !self.pages_left(out) {
                // Only after a jump: the first round always has budget.
                out.steps.push(Step::PrefixQuery {
                    prefix: prefix.to_string(),
                    lower,
                    upper,
                    depth,
                });
                return Ok(());
            }
            let (rows, has_more) = self
                .prefix_pages(prefix, &lower, &upper, wanted, out)
                .await?;
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
            let child_successor = self
                .fan_out_child(prefix, last_pk, last_rk, &upper, depth, out)
                .await?;
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

    /// One round of the prefix query loop: up to `wanted` non-empty pages of the range from
    /// `lower` (every key checked to lie in it), and whether more rows remain.
    async fn prefix_pages(
        &self,
        prefix: &str,
        lower: &LowerBound,
        upper: &Option<String>,
        wanted: usize,
        out: &mut StepOutput,
    ) -> Result<(Vec<Entity>, bool), ScanError> {
        let filter = Self::range_filter(lower, upper);
        let mut rows: Vec<Entity> = Vec::new();
        let mut non_empty = 0usize;
        let mut continuation = None;
        let has_more = loop {
            let page = self.page(Some(&filter), continuation.take(), out).await?;
            if !page.entities.is_empty() {
                for e in &page.entities {
                    check_in_prefix_range(&e.partition_key, prefix, lower, upper)?;
                }
                rows.extend(page.entities);
                non_empty += 1;
            }
            match page.continuation {
                None => break false,
                Some(_) if non_empty >= wanted || !self.pages_left(out) => break true,
                Some(c) => continuation = Some(c),
            }
        };
        Ok((rows, has_more))
    }

    /// After a round that left rows unread: the rest of the last partition (`last_pk` after
    /// `last_rk`) and a step for the rest of the child prefix (ours plus the last partition key's
    /// next character). Returns the child prefix's successor, where the loop jumps to.
    async fn fan_out_child(
        &self,
        prefix: &str,
        last_pk: String,
        last_rk: String,
        upper: &Option<String>,
        depth: u32,
        out: &mut StepOutput,
    ) -> Result<Option<String>, ScanError> {
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
        let child_upper = tighter_upper(child_successor.clone(), upper);
        let rest_of_partition = Region::Partition {
            pk: last_pk.clone(),
            skip: Some(last_rk),
            through: None,
        };
        if self.params.expand_partition_keys && !self.params.inline_first_partition_page {
            out.steps.push(rest_of_partition.step(depth + 1));
        } else if self.params.expand_partition_keys {
            // Its first page inline (most partitions end there, and the rows join this
            // segment's work: no step and no tiny work item of their own); what is left of a
            // bigger partition fans out as its own step.
            self.paged(rest_of_partition, depth + 1, Some(1), out)
                .await?;
        } else {
            // Inline, sharing this step's query budget.
            self.paged(rest_of_partition, depth, Some(self.budget.max_pages), out)
                .await?;
        }
        out.steps.push(Step::PrefixQuery {
            prefix: child_prefix,
            lower: LowerBound::After(last_pk),
            upper: child_upper,
            depth: depth + 1,
        });
        Ok(child_successor)
    }

    /// Reads a partition-key or serial region, a segment per non-empty page, following
    /// continuations until the query ends or the budget is spent: `max_pages` non-empty pages
    /// (`inline_pages` when given), or `max_queries` queries for the whole step (empty pages
    /// count). The rest then becomes a follow-up step resuming after the last row read. When no
    /// row was read, the whole region is handed on if it is not the step being executed
    /// (`inline_pages` given: a partition read inline by a prefix-query step), and otherwise
    /// split in two.
    async fn paged(
        &self,
        region: Region,
        depth: u32,
        inline_pages: Option<usize>,
        out: &mut StepOutput,
    ) -> Result<(), ScanError> {
        let own_step = inline_pages.is_none();
        let max_pages = inline_pages.unwrap_or(self.budget.max_pages).max(1);
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
            // As in a prefix query: a row outside the region stops the step (rows a step
            // reads may be written or deleted where they are read).
            if let Some(f) = &filter {
                let outside = page
                    .entities
                    .iter()
                    .find(|e| !f.matches(&e.partition_key, &e.row_key));
                if let Some(e) = outside {
                    return Err(ScanError::StoreMisbehaved(format!(
                        "row ({:?}, {:?}) is outside the query {}",
                        e.partition_key,
                        e.row_key,
                        f.to_odata()
                    )));
                }
            }
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
            if pages < max_pages && self.pages_left(out) {
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
