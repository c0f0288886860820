//! The simulator on tiny tables: deterministic for a seed, the copy verified row by row, the
//! JSON contract, and the model's calibration anchors. All figures here are simulated.

use clap::Parser;
use serde_json::Value;

use tablescan::simulate::model::Model;
use tablescan::simulate::{
    run_scenario, run_scenarios, run_simulate, scenarios, Scenario, ScenarioResult, SimulateArgs,
    Variant,
};

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
fn results_are_byte_identical_whatever_runs_beside_them() {
    // Scenarios run on parallel threads; each must give exactly what it gives alone (the
    // bookkeeping's jitter is per thread, every store and model state per scenario).
    let a = args(&[
        "--rows",
        "20000",
        "--variant",
        "prefix,reference-prefix,serial",
    ]);
    let list = scenarios(&a);
    let model = Model::default();
    let json = |results: Vec<ScenarioResult>| -> String {
        let mut v = serde_json::to_value(results).unwrap();
        for s in v.as_array_mut().unwrap() {
            // Real time, the only figure that is not simulated.
            s.as_object_mut().unwrap().remove("wall_seconds");
        }
        v.to_string()
    };
    let alone = json(run_scenarios(&list, &model, 5, 30.0, 1).unwrap());
    let together = json(run_scenarios(&list, &model, 5, 30.0, 3).unwrap());
    assert_eq!(alone, together);
}

#[test]
fn serial_cannot_outlive_the_execution_limit() {
    // A tiny table with a tiny execution limit is the 7M-row case in miniature: the one long
    // paging execution hits the limit (it would restart from the first page, so the run stops
    // there and does not complete); the prefix scan, made of short executions, completes under
    // the same limit.
    let a = args(&[]);
    let model = Model {
        function_timeout_s: 3.0,
        ..Model::default()
    };
    let serial = run_scenario(&Scenario::new(60_000, Variant::Serial, &a), &model, 3, 5.0).unwrap();
    assert!(!serial.completed);
    assert!(serial.timed_out_executions >= 1);
    assert!(serial.max_execution_seconds >= 3.0);
    assert!(serial.rows_copied < 60_000);
    // (Not the blog's prefix scan: its bulk fan-out of ~250 sequential puts takes ~3 s itself.)
    let prefix = run_scenario(&Scenario::new(60_000, Variant::Prefix, &a), &model, 3, 5.0).unwrap();
    assert!(prefix.completed && prefix.copy_verified);
    assert!(prefix.max_execution_seconds < 3.0);
}

#[test]
fn json_contract_and_chart() {
    let dir = std::env::temp_dir().join(format!("tablescan-sim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("sim.json");
    let mut a = args(&[
        "--rows",
        "5000",
        "--variant",
        "prefix,reference-prefix,serial",
    ]);
    a.out = out.clone();
    run_simulate(a).unwrap();
    let json: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    // Every figure is labelled as simulated: the document, each scenario, and the note.
    assert_eq!(json["simulated"], true);
    assert!(json["note"].as_str().unwrap().contains("simulated"));
    let scenarios = json["scenarios"].as_array().unwrap();
    assert_eq!(scenarios.len(), 3);
    for (s, variant) in scenarios
        .iter()
        .zip(["prefix", "reference-prefix", "serial"])
    {
        assert_eq!(s["variant"], variant);
        assert_eq!(s["rows"], 5000);
        assert_eq!(s["completed"], true);
        assert_eq!(s["simulated"], true);
        assert_eq!(s["copy_verified"], true);
        let app = if variant == "prefix" {
            "tablescan"
        } else {
            "blog"
        };
        assert_eq!(s["design"]["app"], app);
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
fn default_scenarios_are_the_published_rows_then_tablescan() {
    let a = args(&[]);
    let got: Vec<(u64, &str)> = scenarios(&a)
        .iter()
        .map(|s| (s.rows, s.variant.name()))
        .collect();
    assert_eq!(
        got,
        [
            (3_558_594, "serial"),
            (3_558_594, "reference-prefix"),
            (7_000_000, "serial"),
            (7_000_000, "reference-prefix"),
            (35_000_000, "reference-prefix"),
            (3_558_594, "prefix"),
            (7_000_000, "prefix"),
            (35_000_000, "prefix"),
        ]
    );
    // Design options apply to tablescan's design only, never to the blog's calibration rows.
    let tuned = args(&["--batch-size", "32", "--take", "500", "--budget-pages", "2"]);
    for s in scenarios(&tuned) {
        match s.variant {
            Variant::Prefix => assert_eq!(
                (s.design.take, s.design.budget_pages, s.design.batch_size),
                (500, 2, 32)
            ),
            _ => assert_eq!(
                (s.design.take, s.design.app, s.design.batch_size),
                (1000, "blog", 16)
            ),
        }
    }
}

#[test]
fn calibration_anchors() {
    let m = Model::default();
    // The blog: "about 8 minutes" to page 3.5M full rows serially.
    let full = 3_558_594.0 / 1000.0 * m.query_ms(1000, m.full_row_bytes) / 60_000.0;
    assert!((7.0..8.7).contains(&full), "{full} min");
    // The serial run's paging execution took 5 min 21 s: a keys-only page plus one bulk put
    // must leave room for ~20 ms of CPU on a shared vCPU within ~90 ms.
    let keys = m.query_ms(1000, m.key_row_bytes) + m.queue_put_ms;
    assert!((65.0..85.0).contains(&keys), "{keys} ms");
}
