//! No request can make one step unbounded: whatever the parameters (even ones validation would
//! refuse) and however the store pages, one `Scanner::execute` sends at most the step budget's
//! queries, and the whole scan still returns every row in range exactly once, in order.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::support::scan::{block_on, expected, key_strategy, store_with, TABLE};
use crate::support::stores::forward_table_store;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tablescan::lab::memory::Pagination;
use tablescan::scan::{
    LowerBound, ScanError, ScanParameters, Scanner, Step, StepBudget, Strategy,
    MAX_SEGMENTS_PER_PREFIX,
};
use tablescan::storage::{
    BatchOperation, Continuation, Entity, Page, Query, StorageResult, TableStore,
};

/// Marks the continuations of the empty pages `Counting` makes up.
const FAKE: &str = "\u{0}\u{0}fake\u{0}";

/// Counts `query_page` calls, and can answer a query with an empty page and a continuation
/// instead of asking the inner store: the next `forced_empty` queries, and each query with
/// probability `empty_probability`.
struct Counting<S> {
    inner: S,
    queries: AtomicUsize,
    forced_empty: AtomicUsize,
    empty_probability: f64,
    rng: Mutex<StdRng>,
}

impl<S> Counting<S> {
    fn new(inner: S) -> Self {
        Self::with_empty_pages(inner, 0.0, 0)
    }

    fn with_empty_pages(inner: S, empty_probability: f64, seed: u64) -> Self {
        Counting {
            inner,
            queries: AtomicUsize::new(0),
            forced_empty: AtomicUsize::new(0),
            empty_probability,
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
        }
    }

    fn count(&self) -> usize {
        self.queries.load(Ordering::SeqCst)
    }
}

/// Wraps a continuation (or none) into a made-up one, and back.
fn fake(c: &Option<Continuation>) -> Continuation {
    match c {
        None => Continuation {
            next_partition_key: format!("{FAKE}-"),
            next_row_key: None,
        },
        Some(c) => Continuation {
            next_partition_key: format!("{FAKE}+{}", c.next_partition_key),
            next_row_key: c.next_row_key.clone(),
        },
    }
}

fn unfake(c: &Option<Continuation>) -> Option<Continuation> {
    let c = c.as_ref()?;
    match c.next_partition_key.strip_prefix(FAKE) {
        None => Some(c.clone()),
        Some("-") => None,
        Some(rest) => Some(Continuation {
            next_partition_key: rest.strip_prefix('+').unwrap().to_string(),
            next_row_key: c.next_row_key.clone(),
        }),
    }
}

impl<S: TableStore> TableStore for Counting<S> {
    async fn query_page(&self, table: &str, query: &Query) -> StorageResult<Page> {
        self.queries.fetch_add(1, Ordering::SeqCst);
        let forced = self
            .forced_empty
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        let random = self.empty_probability > 0.0
            && self.rng.lock().unwrap().gen_bool(self.empty_probability);
        let query = Query {
            continuation: unfake(&query.continuation),
            ..query.clone()
        };
        if forced || random {
            return Ok(Page {
                continuation: Some(fake(&query.continuation)),
                ..Page::default()
            });
        }
        self.inner.query_page(table, &query).await
    }
    forward_table_store!(inner: submit_batch_with_etags, get_entity, create_table, delete_table);
}

/// What a budgeted scan did.
struct Run {
    rows: Vec<(String, String)>,
    executions: usize,
    most_queries: usize,
}

/// Runs a whole scan depth-first, one `execute` per step like the queue functions, checking
/// after each that it sent no more queries than the budget allows and that the store saw exactly
/// the queries the step reports.
fn run<S: TableStore>(
    store: &Counting<S>,
    params: &ScanParameters,
    strategy: Strategy,
    budget: StepBudget,
) -> Run {
    let scanner = Scanner::new(store, TABLE, params, budget);
    let limit = budget.max_queries.max(1);
    let mut stack = vec![Scanner::<Counting<S>>::root(strategy)];
    let mut run = Run {
        rows: Vec::new(),
        executions: 0,
        most_queries: 0,
    };
    while let Some(step) = stack.pop() {
        if let Step::Segment { entities, .. } = step {
            run.rows
                .extend(entities.into_iter().map(|e| (e.partition_key, e.row_key)));
            continue;
        }
        let before = store.count();
        let out = block_on(scanner.execute(&step)).expect("step succeeds");
        let sent = store.count() - before;
        assert_eq!(sent, out.queries, "{}", step.describe());
        assert_eq!(out.rows, out.row_count(), "{}", step.describe());
        // A step stops reading once its row budget is reached; its first page and a
        // partition's page read inline come first, so it reads at most two pages more.
        let take = params.take as usize;
        assert!(
            out.rows <= budget.max_rows.saturating_add(2 * take),
            "{} read {} rows, row budget {}",
            step.describe(),
            out.rows,
            budget.max_rows
        );
        // The same for its bytes of row text: at most two pages more than the byte budget.
        let longest = (out.steps.iter())
            .filter_map(|s| match s {
                Step::Segment { entities, .. } => entities.iter().map(|e| e.text_len()).max(),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        let bytes = (out.steps.iter())
            .map(|s| match s {
                Step::Segment { entities, .. } => entities.iter().map(|e| e.text_len()).sum(),
                _ => 0,
            })
            .sum::<usize>();
        assert_eq!(out.row_bytes, bytes, "{}", step.describe());
        assert!(
            bytes <= budget.max_row_bytes.saturating_add(2 * take * longest),
            "{} read {bytes} bytes of rows, byte budget {}",
            step.describe(),
            budget.max_row_bytes
        );
        assert!(
            sent <= limit,
            "{} sent {sent} queries, budget {limit}",
            step.describe()
        );
        assert!(
            !out.steps.contains(&step),
            "{} handed itself on unchanged",
            step.describe()
        );
        run.most_queries = run.most_queries.max(sent);
        run.executions += 1;
        assert!(run.executions < 100_000, "the scan does not end");
        stack.extend(out.steps.into_iter().rev());
    }
    run
}

fn keys(n: usize, pk: impl Fn(usize) -> String) -> Vec<(String, String)> {
    (0..n).map(|i| (pk(i), format!("{:03}", i % 7))).collect()
}

/// The request: `segmentsPerFirstPrefix: 4294967295` on a 5,000-row table made one
/// prefix-query step send 500 queries.
#[test]
fn huge_segments_stay_within_the_step_budget() {
    let keys = keys(5000, |i| format!("p{:04}", i / 7));
    for expand in [true, false] {
        let params = ScanParameters {
            take: 10,
            expand_partition_keys: expand,
            segments_per_first_prefix: u32::MAX,
            segments_per_subsequent_prefix: u32::MAX,
            ..Default::default()
        };
        let store = Counting::new(store_with(&keys, Pagination::default()));
        let run = run(&store, &params, Strategy::Prefix, StepBudget::default());
        assert_eq!(run.rows, expected(&keys, &params), "expand {expand}");
        assert!(run.most_queries <= 16);
        assert!(run.executions > 500 / 16, "{} executions", run.executions);
    }
}

/// A store that only answers empty pages at first: the step cannot read a row within its
/// budget, and must still hand on less than it was given.
#[test]
fn a_budget_spent_on_empty_pages_splits_the_step() {
    let keys = keys(300, |i| format!("k{}{}", i % 10, "é😀".repeat(i % 3)));
    let budget = StepBudget {
        max_pages: 2,
        max_queries: 3,
        max_rows: usize::MAX,
        max_row_bytes: usize::MAX,
    };
    let partition = keys[0].0.clone();
    let cases = [
        (
            Strategy::Prefix,
            Step::PrefixQuery {
                prefix: "k".into(),
                lower: LowerBound::After("k".into()),
                upper: Some("l".into()),
                depth: 1,
            },
        ),
        (
            Strategy::Prefix,
            Step::PartitionKeyQuery {
                partition_key: partition.clone(),
                row_key_skip: None,
                depth: 1,
            },
        ),
        (Strategy::Serial, Step::Serial { after: None }),
    ];
    for (strategy, step) in cases {
        let params = ScanParameters {
            take: 3,
            ..Default::default()
        };
        let store = Counting::new(store_with(&keys, Pagination::default()));
        let scanner = Scanner::new(&store, TABLE, &params, budget);
        store.forced_empty.store(3, Ordering::SeqCst);
        let out = block_on(scanner.execute(&step)).unwrap();
        assert_eq!(out.queries, 3);
        assert_eq!(out.row_count(), 0);
        assert_eq!(out.steps.len(), 2, "{}: {:?}", step.describe(), out.steps);
        assert!(!out.steps.contains(&step));

        // Splitting again and again (each half's first queries empty too) still ends, exactly.
        let mut want = expected(&keys, &params);
        if let Step::PartitionKeyQuery { partition_key, .. } = &step {
            want.retain(|(pk, _)| pk == partition_key);
        }
        if let Step::PrefixQuery { .. } = &step {
            want.retain(|(pk, _)| pk.starts_with('k') && pk != "k");
        }
        let mut rows = Vec::new();
        let mut stack: Vec<Step> = out.steps.into_iter().rev().collect();
        let mut executions = 0;
        while let Some(s) = stack.pop() {
            if let Step::Segment { entities, .. } = s {
                rows.extend(entities.into_iter().map(|e| (e.partition_key, e.row_key)));
                continue;
            }
            if executions % 3 == 0 {
                store.forced_empty.store(3, Ordering::SeqCst);
            }
            executions += 1;
            assert!(executions < 10_000);
            let out = block_on(scanner.execute(&s)).unwrap();
            assert!(out.queries <= 3, "{}", s.describe());
            stack.extend(out.steps.into_iter().rev());
        }
        assert_eq!(rows, want, "{strategy:?} from {}", step.describe());
    }
}

/// Splitting ends at ranges of one key: a prefix range of one partition key becomes that
/// partition's query, and a range of one row key is retried as a work item of its own.
#[test]
fn single_key_ranges_cannot_split_but_still_change() {
    let keys = vec![
        ("k\0".to_string(), "a".to_string()),
        ("k\0".to_string(), "a\0".to_string()),
    ];
    let params = ScanParameters::default();
    let store = Counting::new(store_with(&keys, Pagination::default()));
    let budget = StepBudget {
        max_pages: 1,
        max_queries: 2,
        max_rows: usize::MAX,
        max_row_bytes: usize::MAX,
    };
    let scanner = Scanner::new(&store, TABLE, &params, budget);
    let cases = [
        (
            Step::PrefixQuery {
                prefix: "k".into(),
                lower: LowerBound::After("k".into()),
                upper: Some("k\0\0".into()),
                depth: 2,
            },
            Step::PartitionKeyQuery {
                partition_key: "k\0".into(),
                row_key_skip: None,
                depth: 2,
            },
        ),
        (
            Step::PartitionKeyRange {
                partition_key: "k\0".into(),
                row_key_skip: Some("a".into()),
                row_key_through: "a\0".into(),
                depth: 3,
            },
            Step::PartitionKeyRange {
                partition_key: "k\0".into(),
                row_key_skip: Some("a".into()),
                row_key_through: "a\0".into(),
                depth: 4,
            },
        ),
        (
            Step::SerialRange {
                after: Some(("k\0".into(), "a".into())),
                through: ("k\0".into(), "a\0".into()),
                depth: 0,
            },
            Step::SerialRange {
                after: Some(("k\0".into(), "a".into())),
                through: ("k\0".into(), "a\0".into()),
                depth: 1,
            },
        ),
    ];
    for (step, then) in cases {
        store.forced_empty.store(2, Ordering::SeqCst);
        let out = block_on(scanner.execute(&step)).unwrap();
        assert_eq!(out.queries, 2);
        assert_eq!(out.steps, vec![then.clone()], "{}", step.describe());
        // Without empty pages, the follow-up reads what the range holds.
        let out = block_on(scanner.execute(&then)).unwrap();
        assert!(out.row_count() >= 1, "{}", then.describe());
    }
    // A range that holds no key is done, whatever the store says.
    store.forced_empty.store(2, Ordering::SeqCst);
    let empty = Step::PartitionKeyRange {
        partition_key: "k\0".into(),
        row_key_skip: Some("b".into()),
        row_key_through: "a".into(),
        depth: 1,
    };
    let out = block_on(scanner.execute(&empty)).unwrap();
    assert!(out.steps.is_empty());
}

/// The old engine sliced the last partition key at the prefix's byte length, which panics inside
/// a multi-byte character; a key outside the queried prefix is now a clear error.
#[test]
fn a_key_outside_the_prefix_is_an_error_not_a_panic() {
    struct Liar;
    impl TableStore for Liar {
        async fn query_page(&self, _: &str, _: &Query) -> StorageResult<Page> {
            Ok(Page {
                entities: vec![Entity::new("éx", "1")],
                continuation: Some(Continuation {
                    next_partition_key: "f".into(),
                    next_row_key: None,
                }),
                ..Page::default()
            })
        }
        async fn submit_batch_with_etags(
            &self,
            _: &str,
            _: &str,
            _: &[BatchOperation],
        ) -> StorageResult<Vec<Option<String>>> {
            unreachable!()
        }
        async fn get_entity(
            &self,
            _: &str,
            _: &str,
            _: &str,
        ) -> StorageResult<Option<(Entity, String)>> {
            unreachable!()
        }
        async fn create_table(&self, _: &str) -> StorageResult<bool> {
            unreachable!()
        }
        async fn delete_table(&self, _: &str) -> StorageResult<bool> {
            unreachable!()
        }
    }
    let params = ScanParameters::default();
    let scanner = Scanner::new(&Liar, TABLE, &params, StepBudget::default());
    let step = Step::PrefixQuery {
        prefix: "a".into(),
        lower: LowerBound::After("a".into()),
        upper: Some("b".into()),
        depth: 1,
    };
    match block_on(scanner.execute(&step)) {
        Err(e @ ScanError::StoreMisbehaved(_)) => {
            assert!(e.to_string().contains("\"éx\""), "{e}")
        }
        other => panic!("expected an error naming the key, got {other:?}"),
    }

    // The same answer to a partition-key step: the row is outside the partition queried.
    let step = Step::PartitionKeyQuery {
        partition_key: "a".into(),
        row_key_skip: None,
        depth: 1,
    };
    match block_on(scanner.execute(&step)) {
        Err(e @ ScanError::StoreMisbehaved(_)) => {
            assert!(e.to_string().contains("\"éx\""), "{e}")
        }
        other => panic!("expected an error naming the key, got {other:?}"),
    }
}

fn segments() -> impl proptest::strategy::Strategy<Value = u32> {
    prop_oneof![
        1..=MAX_SEGMENTS_PER_PREFIX,
        Just(0),
        Just(u32::MAX),
        MAX_SEGMENTS_PER_PREFIX..=u32::MAX,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    #[test]
    fn no_step_exceeds_its_budget_and_the_scan_stays_exact(
        keys in prop::collection::vec((key_strategy(&["\u{10FFFF}", "a\u{FFFF}"]), prop::sample::select(vec!["1", "2", "3", "é", "😀"])), 0..60),
        prefix in key_strategy(&["\u{10FFFF}", "a\u{FFFF}"]),
        lower in prop::option::of(key_strategy(&["\u{10FFFF}", "a\u{FFFF}"])),
        upper in prop::option::of(key_strategy(&["\u{10FFFF}", "a\u{FFFF}"])),
        take in prop_oneof![1u32..=4, 1u32..=1000],
        expand in any::<bool>(),
        inline in any::<bool>(),
        first in segments(),
        subsequent in segments(),
        (max_pages, max_queries) in prop::sample::select(vec![(1, 1), (2, 3), (1, 2), (3, 2), (8, 16)]),
        (max_rows, max_row_bytes) in (prop::sample::select(vec![usize::MAX, usize::MAX, 1, 3, 10]), prop::sample::select(vec![usize::MAX, usize::MAX, 1, 40, 200])),
        seed in any::<u64>(),
        quirk in 0.0f64..0.4,
        injected in prop::sample::select(vec![0.0, 0.0, 0.2, 0.4]),
    ) {
        let keys: Vec<(String, String)> = keys.into_iter().map(|(pk, rk)| (pk, rk.to_string())).collect();
        let params = ScanParameters {
            prefix, lower, upper, take, expand_partition_keys: expand, inline_first_partition_page: inline,
            segments_per_first_prefix: first, segments_per_subsequent_prefix: subsequent, select: None,
        };
        // Every parameter valid except, possibly, the segments, which go to the engine as they are.
        prop_assume!(ScanParameters { segments_per_first_prefix: 1, segments_per_subsequent_prefix: 1, ..params.clone() }.validate().is_ok());
        let budget = StepBudget { max_pages, max_queries, max_rows, max_row_bytes };
        let want = expected(&keys, &params);
        for strategy in [Strategy::Prefix, Strategy::Serial] {
            let store = Counting::with_empty_pages(
                store_with(&keys, Pagination::adversarial(seed, quirk)),
                injected,
                seed,
            );
            let run = run(&store, &params, strategy, budget);
            prop_assert!(run.most_queries <= max_queries);
            prop_assert_eq!(&run.rows, &want, "{:?}", strategy);
        }
    }
}
