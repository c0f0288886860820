//! The scan engine on Azurite: property tests with adversarial keys (fewer cases than on the
//! in-memory table, since Azurite scans the whole table for every filter), and the `list` CLI.

use crate::support;

use std::process::Command;

use crate::support::scan::{expected, key_strategy};
use proptest::prelude::*;
use tablescan::scan::{list, ScanParameters, Strategy};
use tablescan::storage::{BatchOperation, Entity, TableStore};

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn prefix_scan_on_azurite_equals_the_filtered_sorted_table(
        keys in prop::collection::vec((key_strategy(&["Z"]), prop::sample::select(vec!["1", "2", "x'y"])), 1..25),
        prefix in key_strategy(&["Z"]),
        lower in prop::option::of(key_strategy(&["Z"])),
        upper in prop::option::of(key_strategy(&["Z"])),
        take in 1u32..=5,
        expand in any::<bool>(),
    ) {
        let params = ScanParameters { prefix, lower, upper, take, expand_partition_keys: expand, ..ScanParameters::default() };
        prop_assume!(params.validate().is_ok());
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let (store, _) = support::table_store();
        let owned: Vec<(String, String)> = keys.iter().map(|(p, r)| (p.clone(), r.to_string())).collect();
        let got = rt.block_on(async {
            let table = support::new_table(&store, "Prop").await;
            let mut unique = owned.clone();
            unique.sort();
            unique.dedup();
            for (pk, rk) in &unique {
                store.submit_batch(&table, pk, &[BatchOperation::Insert(Entity::new(pk.clone(), rk.clone()))]).await.unwrap();
            }
            let mut by_strategy = Vec::new();
            for strategy in [Strategy::Prefix, Strategy::Serial] {
                let mut seen = Vec::new();
                list(&store, &table, &params, strategy, |rows| {
                    seen.extend(rows.into_iter().map(|e| (e.partition_key, e.row_key)));
                    Ok(())
                }).await.unwrap();
                by_strategy.push(seen);
            }
            store.delete_table(&table).await.unwrap();
            by_strategy
        });
        let want = expected(&owned, &params);
        prop_assert_eq!(&got[0], &want);
        prop_assert_eq!(&got[1], &want);
    }
}

fn tablescan() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tablescan"))
}

#[tokio::test]
async fn list_command_prints_rows_in_key_order_and_fails_clearly() {
    let (store, _) = support::table_store();
    let table = support::new_table(&store, "ListCli").await;
    let rows = [
        ("b", "2"),
        ("a", "1"),
        ("", "0"),
        ("a\u{1F600}", "s"),
        ("a\u{FFFF}", "m"),
    ];
    // Written as JSON text by the test's own client, not through tablescan's entity type.
    let client = support::raw::RawClient::azurite();
    for (pk, rk) in rows {
        let body = format!(
            "{{\"PartitionKey\":{},\"RowKey\":{},\"Big\":\"12345678901\",\"Big@odata.type\":\"Edm.Int64\"}}",
            support::raw::json_string(pk),
            support::raw::json_string(rk)
        );
        client.insert(&table, &body).await.unwrap();
    }
    let cs = support::azurite().connection_string();
    let out = tablescan()
        .args([
            "list",
            "--table",
            &table,
            "--take",
            "1",
            "--connection-string",
            &cs,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    // UTF-16 order: U+1F600 (D83D DE00) sorts below U+FFFF.
    assert_eq!(text, "\t0\na\t1\na\u{1F600}\ts\na\u{FFFF}\tm\nb\t2\n");

    let out = tablescan()
        .args([
            "list",
            "--table",
            &table,
            "--prefix",
            "a",
            "--lower",
            "a",
            "--format",
            "jsonl",
            "--strategy",
            "serial",
            "--connection-string",
            &cs,
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["PartitionKey"], "a\u{1F600}");
    assert_eq!(lines[0]["Big@odata.type"], "Edm.Int64");

    list_fails(
        &["--table", "NoSuchTable1", "--connection-string", &cs],
        "does not exist",
    );
    list_fails(
        &["--table", &table, "--take", "0", "--connection-string", &cs],
        "--take",
    );
}

/// `tablescan list` with `args` exits with 1 and says `says` on stderr.
fn list_fails(args: &[&str], says: &str) {
    let out = tablescan().arg("list").args(args).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(says),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
