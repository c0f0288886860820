//! How much one step may do: the bound that keeps every invocation short.

/// How much work one step may do before it hands the rest on as a follow-up step. This is what
/// keeps every Functions invocation short whatever the table and the parameters look like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepBudget {
    /// Non-empty pages one partition-key or serial step reads before continuing in a new step.
    pub max_pages: usize,
    /// Queries one step of any kind sends, counting empty pages and the partition-key queries
    /// a prefix-query step runs inline. Checked before every query. 0 counts as 1.
    pub max_queries: usize,
    /// Rows after which a step reads no further page of its own: for steps that do work on
    /// every row they read. Checked before each next page of a query and before each next
    /// round of a prefix query; the first page of a step, and the one page of a partition a
    /// prefix step reads inline, are always read, so a step reads at most `max_rows` plus two
    /// pages.
    pub max_rows: usize,
    /// Bytes of row text (`Entity::text_len`: keys, names and values as the service sent them)
    /// after which a step reads no further page of its own, checked like `max_rows`: what a
    /// step that holds its rows holds is bounded by size too, whatever the rows' size.
    pub max_row_bytes: usize,
}

impl StepBudget {
    /// No limits: a step runs to its natural end (used by the in-process depth-first listing).
    pub const UNLIMITED: StepBudget = StepBudget {
        max_pages: usize::MAX,
        max_queries: usize::MAX,
        max_rows: usize::MAX,
        max_row_bytes: usize::MAX,
    };

    /// The budget of the Functions app.
    pub const DEFAULT: StepBudget = StepBudget {
        max_pages: 8,
        max_queries: 16,
        max_rows: usize::MAX,
        max_row_bytes: usize::MAX,
    };

    /// This budget, reading no further page once `rows` rows or `bytes` bytes of row text
    /// were read (see `max_rows`, `max_row_bytes`).
    pub fn with_max_rows(self, rows: usize, bytes: usize) -> StepBudget {
        StepBudget {
            max_rows: rows,
            max_row_bytes: bytes,
            ..self
        }
    }
}

impl Default for StepBudget {
    fn default() -> Self {
        StepBudget::DEFAULT
    }
}
