//! The scan engine on the in-memory table: the blog's worked example, edge cases, termination,
//! and property tests against a filtered, sorted copy of the table.

use crate::support::scan::{block_on, expected, key_strategy, store_with, TABLE};
use crate::support::stores::forward_table_store;
use proptest::prelude::*;
use tablescan::lab::memory::{MemoryTableStore, Pagination};
use tablescan::scan::{list, ScanParameters, Scanner, Step, StepBudget, Strategy};
use tablescan::storage::{Entity, Filter, Query, TableStore};

fn scan_keys(
    store: &MemoryTableStore,
    params: &ScanParameters,
    strategy: Strategy,
) -> Vec<(String, String)> {
    let mut keys = Vec::new();
    block_on(list(store, TABLE, params, strategy, |rows| {
        keys.extend(rows.into_iter().map(|e| (e.partition_key, e.row_key)));
        Ok(())
    }))
    .expect("scan succeeds");
    keys
}

fn blog_rows() -> Vec<(&'static str, &'static str)> {
    vec![
        ("Dashner", "Cleopatra"),
        ("Davis", "Gemma"),
        ("Davis", "Loralee"),
        ("Dodge", "Lowell"),
        ("Hartlage", "Marketta"),
        ("Nuckles", "Timmy"),
        ("Rundle", "Coleen"),
        ("Splawn", "Lise"),
        ("Wedell", "Annabelle"),
        ("Wongus", "Rosenda"),
    ]
}

/// Records every query the engine sends, to compare with the blog's request sequence.
struct Recording {
    inner: MemoryTableStore,
    filters: std::sync::Mutex<Vec<String>>,
}

impl TableStore for Recording {
    async fn query_page(
        &self,
        table: &str,
        query: &Query,
    ) -> tablescan::storage::StorageResult<tablescan::storage::Page> {
        self.filters.lock().unwrap().push(
            query
                .filter
                .as_ref()
                .map(Filter::to_odata)
                .unwrap_or_default(),
        );
        self.inner.query_page(table, query).await
    }
    forward_table_store!(inner: submit_batch_with_etags, get_entity, create_table, delete_table);
}

#[test]
fn blog_worked_example_step_by_step() {
    let store = Recording {
        inner: store_with(&blog_rows(), Pagination::default()),
        filters: Default::default(),
    };
    // The blog's example reads one page per prefix.
    let params = ScanParameters {
        take: 2,
        segments_per_first_prefix: 1,
        segments_per_subsequent_prefix: 1,
        ..ScanParameters::default()
    };
    let scanner = Scanner::new(&store, TABLE, &params, StepBudget::UNLIMITED);

    // Start: a PK query for the empty prefix (HEAD semantics) and the prefix query over everything.
    let start = block_on(scanner.execute(&Step::Start)).unwrap();
    assert_eq!(start.queries, 0);
    assert_eq!(start.steps.len(), 2);
    assert!(
        matches!(&start.steps[0], Step::PartitionKeyQuery { partition_key, row_key_skip: None, .. } if partition_key.is_empty())
    );

    // The top-level prefix query: four pages, each fanning out a PK query and a child prefix.
    let top = block_on(scanner.execute(&start.steps[1])).unwrap();
    let filters = store.filters.lock().unwrap().clone();
    assert_eq!(
        filters,
        vec![
            "PartitionKey gt ''".to_string(),
            "PartitionKey ge 'E'".to_string(),
            "PartitionKey ge 'O'".to_string(),
            "PartitionKey ge 'T'".to_string(),
        ]
    );
    let segments: Vec<Vec<&str>> = top
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Segment { entities, .. } => {
                Some(entities.iter().map(|e| e.partition_key.as_str()).collect())
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        segments,
        vec![
            vec!["Dashner", "Davis"],
            vec!["Hartlage", "Nuckles"],
            vec!["Rundle", "Splawn"],
            vec!["Wedell", "Wongus"]
        ]
    );
    let descriptions: Vec<String> = top.steps.iter().map(Step::describe).collect();
    assert_eq!(
        descriptions,
        vec![
            "segment of 2 rows",
            "PK eq \"Davis\" and RK gt \"Gemma\"",
            "prefix \"D\": PK gt \"Davis\" and lt \"E\"",
            "segment of 2 rows",
            "PK eq \"Nuckles\" and RK gt \"Timmy\"",
            "prefix \"N\": PK gt \"Nuckles\" and lt \"O\"",
            "segment of 2 rows",
            "PK eq \"Splawn\" and RK gt \"Lise\"",
            "prefix \"S\": PK gt \"Splawn\" and lt \"T\"",
            "segment of 2 rows",
        ]
    );

    // Children: Davis/Loralee from the PK query, Dodge from the D prefix, nothing elsewhere.
    let davis = block_on(scanner.execute(&top.steps[1])).unwrap();
    assert_eq!(davis.row_count(), 1);
    let d = block_on(scanner.execute(&top.steps[2])).unwrap();
    assert_eq!(d.row_count(), 1);
    for empty in [&top.steps[4], &top.steps[5], &top.steps[7], &top.steps[8]] {
        let out = block_on(scanner.execute(empty)).unwrap();
        assert_eq!(out.row_count(), 0, "{}", empty.describe());
        assert!(out.steps.is_empty());
    }

    // And the whole scan, depth-first, returns all ten rows in order.
    let all = scan_keys(&store.inner, &params, Strategy::Prefix);
    let want: Vec<(String, String)> = blog_rows()
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(all, want);
}

fn owned(rows: &[(&str, &str)]) -> Vec<(String, String)> {
    rows.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[test]
fn edge_keys_are_each_returned_once_in_utf16_order() {
    let rows = [
        ("", "r0"),
        ("", "r1"),
        ("D", "1"),
        ("D\u{FFFF}", "1"),
        ("D\u{FFFF}\u{FFFF}", "1"),
        ("D\u{FFFF}x", "1"),
        ("Da", "1"),
        ("D\u{1F600}", "1"),
        ("D\u{E000}", "1"),
        ("D'quote''", "it's"),
        ("\u{10FFFF}", "1"),
        ("\u{FFFF}", "1"),
        ("\u{FFFF}\u{FFFF}", "1"),
        ("E", "1"),
    ];
    let store = store_with(&rows, Pagination::default());
    for take in 1..=3 {
        for (expand, inline) in [(true, false), (true, true), (false, false)] {
            for prefix in ["", "D", "D\u{FFFF}", "\u{FFFF}"] {
                let params = ScanParameters {
                    take,
                    prefix: prefix.into(),
                    expand_partition_keys: expand,
                    inline_first_partition_page: inline,
                    ..Default::default()
                };
                let want = expected(&owned(&rows), &params);
                assert_eq!(
                    scan_keys(&store, &params, Strategy::Prefix),
                    want,
                    "prefix {prefix:?} take {take} expand {expand}"
                );
                assert_eq!(
                    scan_keys(&store, &params, Strategy::Serial),
                    want,
                    "serial prefix {prefix:?} take {take}"
                );
            }
        }
    }
}

#[test]
fn single_huge_partition_is_walked_in_bounded_steps() {
    let rows: Vec<(String, String)> = (0..2500)
        .map(|i| ("only".to_string(), format!("{i:05}")))
        .collect();
    let store = MemoryTableStore::default();
    store.load(
        TABLE,
        rows.iter()
            .map(|(pk, rk)| Entity::new(pk.clone(), rk.clone())),
    );
    let params = ScanParameters {
        take: 100,
        ..Default::default()
    };
    let budget = StepBudget {
        max_pages: 3,
        max_queries: 4,
        max_rows: usize::MAX,
        max_row_bytes: usize::MAX,
    };
    let scanner = Scanner::new(&store, TABLE, &params, budget);
    // Breadth-first like the queues: every step stays within its budget.
    let mut pending = vec![Step::Start];
    let mut seen = Vec::new();
    while let Some(step) = pending.pop() {
        let out = block_on(scanner.execute(&step)).unwrap();
        assert!(
            out.queries <= 4,
            "{} sent {} queries",
            step.describe(),
            out.queries
        );
        for s in out.steps {
            match s {
                Step::Segment { entities, .. } => {
                    seen.extend(entities.into_iter().map(|e| (e.partition_key, e.row_key)))
                }
                other => pending.push(other),
            }
        }
    }
    seen.sort();
    assert_eq!(seen, rows);
}

#[test]
fn termination_with_u_ffff_after_the_prefix() {
    // The reference's `gt 'D\uffff'` would return these keys again and loop (docs/prefix-scan.md,
    // "Exact on every table"); the exact successor bound must finish with a bounded number of
    // queries.
    let rows = [
        ("D\u{FFFF}", "1"),
        ("D\u{FFFF}\u{FFFF}", "1"),
        ("D\u{FFFF}\u{FFFF}a", "1"),
        ("Da", "1"),
        ("E", "1"),
    ];
    let params = ScanParameters {
        take: 1,
        ..Default::default()
    };
    let store = store_with(&rows, Pagination::default());
    let queries = block_on(list(&store, TABLE, &params, Strategy::Prefix, |_| Ok(()))).unwrap();
    assert!(queries < 40, "{queries} queries for five rows");
    assert_eq!(
        scan_keys(&store, &params, Strategy::Prefix),
        expected(&owned(&rows), &params)
    );
}

#[test]
fn bounds_and_prefix_equal_key() {
    let rows = [
        ("B000", "a"),
        ("B001", "a"),
        ("B002", "a"),
        ("B003", "a"),
        ("B", "x"),
        ("C", "y"),
    ];
    let store = store_with(&rows, Pagination::default());
    let params = ScanParameters {
        prefix: "B".into(),
        lower: Some("B000".into()),
        upper: Some("B003".into()),
        take: 1,
        ..Default::default()
    };
    assert_eq!(
        scan_keys(&store, &params, Strategy::Prefix),
        owned(&[("B001", "a"), ("B002", "a")])
    );
    let params = ScanParameters {
        prefix: "B".into(),
        take: 2,
        ..Default::default()
    };
    assert_eq!(
        scan_keys(&store, &params, Strategy::Prefix)[0],
        ("B".to_string(), "x".to_string())
    );
    assert!(ScanParameters {
        take: 0,
        ..Default::default()
    }
    .validate()
    .is_err());
    assert!(ScanParameters {
        take: 1001,
        ..Default::default()
    }
    .validate()
    .is_err());
    assert!(ScanParameters {
        lower: Some("b".into()),
        upper: Some("a".into()),
        ..Default::default()
    }
    .validate()
    .is_err());
}

#[test]
fn empty_table_and_select() {
    let store = store_with::<&str>(&[], Pagination::default());
    assert!(scan_keys(&store, &ScanParameters::default(), Strategy::Prefix).is_empty());
    let mut e = Entity::new("p", "r");
    e.properties.insert("A", serde_json::json!(1));
    e.properties.insert("B", serde_json::json!("x"));
    store.load(TABLE, [e]);
    let params = ScanParameters {
        select: Some(vec!["B".into()]),
        ..Default::default()
    };
    let mut got = Vec::new();
    block_on(list(&store, TABLE, &params, Strategy::Prefix, |rows| {
        got.extend(rows);
        Ok(())
    }))
    .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].properties.keys().collect::<Vec<_>>(), vec!["B"]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn prefix_scan_equals_filtered_sorted_table(
        keys in prop::collection::vec((key_strategy(&["\u{10FFFF}", "\u{D7FF}", "a\u{FFFF}"]), prop::sample::select(vec!["1", "2", "3", "'x"])), 0..40),
        prefix in key_strategy(&["\u{10FFFF}", "\u{D7FF}", "a\u{FFFF}"]),
        lower in prop::option::of(key_strategy(&["\u{10FFFF}", "\u{D7FF}", "a\u{FFFF}"])),
        upper in prop::option::of(key_strategy(&["\u{10FFFF}", "\u{D7FF}", "a\u{FFFF}"])),
        take in 1u32..=5,
        expand in any::<bool>(),
        inline in any::<bool>(),
        first in 1u32..=3,
        subsequent in 1u32..=3,
        seed in any::<u64>(),
        quirk in 0.0f64..0.4,
    ) {
        let owned_keys: Vec<(String, String)> = keys.iter().map(|(pk, rk)| (pk.clone(), rk.to_string())).collect();
        let params = ScanParameters {
            prefix, lower, upper, take, expand_partition_keys: expand, inline_first_partition_page: inline,
            segments_per_first_prefix: first, segments_per_subsequent_prefix: subsequent, select: None,
        };
        prop_assume!(params.validate().is_ok());
        let store = MemoryTableStore::new(Pagination::adversarial(seed, quirk));
        store.load(TABLE, owned_keys.iter().map(|(pk, rk)| Entity::new(pk.clone(), rk.clone())));
        let want = expected(&owned_keys, &params);
        prop_assert_eq!(scan_keys(&store, &params, Strategy::Prefix), want.clone());
        prop_assert_eq!(scan_keys(&store, &params, Strategy::Serial), want);
    }
}
