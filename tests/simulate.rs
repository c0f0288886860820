//! The simulator on tiny tables: deterministic for a seed, the copy verified row by row, the
//! JSON contract, and the model's calibration anchors. All figures here are simulated.

use clap::Parser;
use serde_json::Value;

use tablescan::simulate::model::Model;
use tablescan::simulate::{run_scenario, run_simulate, Scenario, SimulateArgs, Variant};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: SimulateArgs,
}

fn args(extra: &[&str]) -> SimulateArgs {
    let mut argv = vec!["simulate", "--out", "unused.json"];
    argv.extend_from_slice(extra);
    Cli::parse_from(argv).args
}

#[test]
fn same_seed_same_result_and_every_row_copied() {
    let a = args(&[]);
    let model = Model::default();
    for variant in [Variant::Prefix, Variant::ReferencePrefix, Variant::Serial] {
        let scenario = Scenario::new(20_000, variant, &a);
        let first = run_scenario(&scenario, &model, 7, 30.0).unwrap();
        let second = run_scenario(&scenario, &model, 7, 30.0).unwrap();
        assert!(first.completed, "{variant:?} finished");
        assert!(first.copy_verified, "{variant:?}: every row, nothing else");
        assert_eq!(first.rows_copied, 20_000);
        assert_eq!(
            first.duration_seconds, second.duration_seconds,
            "{variant:?}"
        );
        assert_eq!(first.executions, second.executions, "{variant:?}");
        assert_eq!(
            first.storage_requests_per_1000_rows, second.storage_requests_per_1000_rows,
            "{variant:?}"
        );
        assert_eq!(first.rows_over_time, second.rows_over_time, "{variant:?}");
        assert!(first.max_execution_seconds > 0.0 && first.estimated_cost_usd > 0.0);
    }
    // Another seed is another table and another run.
    let other = run_scenario(&Scenario::new(20_000, Variant::Prefix, &a), &model, 8, 30.0).unwrap();
    let base = run_scenario(&Scenario::new(20_000, Variant::Prefix, &a), &model, 7, 30.0).unwrap();
    assert_ne!(other.partition_keys, base.partition_keys);
}

#[test]
fn serial_cannot_outlive_the_execution_limit() {
    // A tiny table with a tiny execution limit is the 7M-row case in miniature: the one long
    // paging execution times out, is redelivered, restarts and never completes; the prefix scan,
    // made of short executions, completes under the same limit.
    let a = args(&[]);
    let model = Model {
        function_timeout_s: 3.0,
        ..Model::default()
    };
    let serial = run_scenario(&Scenario::new(60_000, Variant::Serial, &a), &model, 3, 5.0).unwrap();
    assert!(!serial.completed);
    assert!(
        serial.timed_out_executions >= 2,
        "{}",
        serial.timed_out_executions
    );
    assert!(serial.max_execution_seconds >= 3.0);
    let prefix = run_scenario(&Scenario::new(60_000, Variant::Prefix, &a), &model, 3, 5.0).unwrap();
    assert!(prefix.completed && prefix.copy_verified);
}

#[test]
fn json_contract_and_chart() {
    let dir = std::env::temp_dir().join(format!("tablescan-sim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("sim.json");
    let mut a = args(&["--rows", "5000", "--variant", "prefix,reference-prefix"]);
    a.out = out.clone();
    run_simulate(a).unwrap();
    let json: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let scenarios = json["scenarios"].as_array().unwrap();
    assert_eq!(scenarios.len(), 2);
    for (s, variant) in scenarios.iter().zip(["prefix", "reference-prefix"]) {
        assert_eq!(s["variant"], variant);
        assert_eq!(s["rows"], 5000);
        assert_eq!(s["completed"], true);
        assert_eq!(s["simulated"], true);
        for field in [
            "duration_seconds",
            "max_executions_per_30s",
            "max_execution_seconds",
            "max_instances",
            "storage_requests_per_1000_rows",
            "queue_messages_per_1000_rows",
            "estimated_cost_usd",
        ] {
            assert!(s[field].as_f64().is_some_and(|v| v > 0.0), "{field} in {s}");
        }
    }
    // The reference split queues a message per partition key; ours one per page.
    assert!(
        scenarios[1]["queue_messages_per_1000_rows"]
            .as_f64()
            .unwrap()
            > 5.0
                * scenarios[0]["queue_messages_per_1000_rows"]
                    .as_f64()
                    .unwrap()
    );
    let svg = std::fs::read_to_string(dir.join("sim.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("SIMULATED") && svg.contains("polyline"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn calibration_anchor_a_full_page_takes_about_137_ms() {
    // The blog: ~8 min to page 3.5M rows serially, i.e. ~137 ms per 1,000-row page.
    let m = Model::default();
    let page = m.query_ms(1000, m.full_row_bytes);
    assert!((125.0..150.0).contains(&page), "{page} ms");
    let eight_minutes = 3_558_594.0 / 1000.0 * page / 60_000.0;
    assert!((7.3..8.7).contains(&eight_minutes), "{eight_minutes} min");
}
