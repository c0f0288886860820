//! The simulator on tiny tables: deterministic for a seed, the copy verified row by row, the
//! JSON contract and report, the Flex Consumption model (per-function scaling, the scale-out
//! step, the instance cap, instance sizes, billing), the storage floor, and the model's
//! calibration anchors. All figures here are simulated.

use clap::Parser;
use serde_json::Value;

use std::sync::Arc;
use std::time::Duration;

use tablescan::lab::simulate::cloud::{charge_cpu, Cpu, CPU};
use tablescan::lab::simulate::data::SyntheticTable;
use tablescan::lab::simulate::model::{Flex, Model, Plan};
use tablescan::lab::simulate::summary::floor;
use tablescan::lab::simulate::{
    pair_with_counts, run_scenario, run_scenarios, run_simulate, scenarios, Scenario,
    ScenarioResult, SimulateArgs, Variant,
};
use tablescan::scan::ScanParameters;

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
fn json_contract_chart_and_report() {
    let dir = std::env::temp_dir().join(format!("tablescan-sim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("sim.json");
    let mut a = args(&[
        "--rows",
        "5000",
        "--variant",
        "prefix,reference-prefix,serial",
        "--plan",
        "consumption,flex",
    ]);
    a.out = out.clone();
    run_simulate(a).unwrap();
    let json: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    // Every figure is labelled as simulated: the document, each scenario, and the note.
    assert_eq!(json["simulated"], true);
    assert!(json["note"].as_str().unwrap().contains("simulated"));
    let scenarios = json["scenarios"].as_array().unwrap();
    assert_eq!(scenarios.len(), 4);
    for (s, (variant, plan)) in scenarios.iter().zip([
        ("prefix", "consumption"),
        ("prefix", "flex"),
        ("reference-prefix", "consumption"),
        ("serial", "consumption"),
    ]) {
        assert_eq!(s["variant"], variant);
        assert_eq!(s["plan"], plan);
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
        assert_eq!(s["flex"].is_object(), plan == "flex");
        for field in [
            "duration_seconds",
            "max_executions_per_30s",
            "max_execution_seconds",
            "max_instances",
            "storage_requests_per_1000_rows",
            "queue_messages_per_1000_rows",
            "estimated_cost_usd",
            "requests",
            "peak_requests_per_second",
        ] {
            assert!(s[field].as_f64().is_some_and(|v| v > 0.0), "{field} in {s}");
        }
        // The storage floor is printed beside every result.
        let floor = &s["floor"];
        assert!(floor["seconds"].as_f64().unwrap() > 0.0);
        assert!(floor["minimum_requests"].as_u64().unwrap() >= 5);
        assert!(
            floor["run_requests_seconds"].as_f64().unwrap()
                >= floor["account_seconds"].as_f64().unwrap()
        );
    }
    // The reference split queues a message per partition key; ours one per page.
    assert!(
        scenarios[2]["queue_messages_per_1000_rows"]
            .as_f64()
            .unwrap()
            > 5.0
                * scenarios[0]["queue_messages_per_1000_rows"]
                    .as_f64()
                    .unwrap()
    );
    let svg = std::fs::read_to_string(dir.join("sim.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("SIMULATED") && svg.contains("polyline"));
    let report = std::fs::read_to_string(dir.join("sim.md")).unwrap();
    assert!(report.starts_with("# SIMULATED"));
    assert!(report.contains("| 5000 | prefix | flex |"), "{report}");
    assert!(report.contains("storage floor"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn default_scenarios_are_the_published_rows_then_the_goals() {
    let a = args(&[]);
    let got: Vec<(u64, &str, &str)> = scenarios(&a)
        .iter()
        .map(|s| (s.rows, s.variant.name(), s.plan.name()))
        .collect();
    assert_eq!(
        got,
        [
            (3_558_594, "serial", "consumption"),
            (3_558_594, "reference-prefix", "consumption"),
            (7_000_000, "serial", "consumption"),
            (7_000_000, "reference-prefix", "consumption"),
            (35_000_000, "reference-prefix", "consumption"),
            (3_558_594, "prefix", "consumption"),
            (3_558_594, "prefix", "flex"),
            (35_000_000, "prefix", "consumption"),
            (35_000_000, "prefix", "flex"),
        ]
    );
    // Design options apply to tablescan's design only, never to the blog's calibration rows,
    // and the blog rows stay on Consumption whatever --plan says.
    let tuned = args(&[
        "--batch-size",
        "32",
        "--take",
        "500",
        "--budget-pages",
        "2",
        "--rows",
        "1000",
        "--plan",
        "flex",
    ]);
    for s in scenarios(&tuned) {
        match s.variant {
            Variant::Prefix => {
                assert_eq!(
                    (s.design.take, s.design.budget_pages, s.design.batch_size),
                    (500, 2, 32)
                );
                assert_eq!(s.plan, Plan::Flex);
            }
            _ => {
                assert_eq!(
                    (s.design.take, s.design.app, s.design.batch_size),
                    (1000, "blog", 16)
                );
                assert_eq!(s.plan, Plan::Consumption);
            }
        }
    }
}

#[test]
fn tablescan_runs_with_the_settings_it_ships() {
    // The scan parameters are tablescan's defaults and the queue settings come from the
    // host.json that `stage` and `package` ship (read here from the file on disk).
    let shipped: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/host.json")).unwrap(),
    )
    .unwrap();
    let queues = &shipped["extensions"]["queues"];
    let d = Scenario::new(1000, Variant::Prefix, &args(&[])).design;
    assert_eq!(d.batch_size as u64, queues["batchSize"].as_u64().unwrap());
    assert_eq!(
        d.new_batch_threshold as u64,
        queues["newBatchThreshold"].as_u64().unwrap()
    );
    let ms = |key: &str| {
        let secs: Vec<f64> = queues[key]
            .as_str()
            .unwrap()
            .split(':')
            .map(|p| p.parse().unwrap())
            .collect();
        ((secs[0] * 60.0 + secs[1]) * 60.0 + secs[2]) * 1000.0
    };
    assert_eq!(d.max_polling_ms, ms("maxPollingInterval"));
    assert_eq!(d.visibility_timeout_ms, ms("visibilityTimeout"));
    // --visibility-timeout overrides it (seconds), for the sweep.
    let v = Scenario::new(1000, Variant::Prefix, &args(&["--visibility-timeout", "5"])).design;
    assert_eq!(v.visibility_timeout_ms, 5000.0);
    let params = ScanParameters::default();
    assert_eq!(
        (d.segments_first, d.segments_subsequent),
        (
            params.segments_per_first_prefix,
            params.segments_per_subsequent_prefix
        )
    );
    // The blog's design keeps its own (calibrated) settings.
    let blog = Scenario::new(1000, Variant::ReferencePrefix, &args(&[])).design;
    assert_eq!(
        (
            blog.batch_size,
            blog.new_batch_threshold,
            blog.segments_first
        ),
        (16, 8, 1)
    );
}

#[test]
fn flex_scales_each_function_on_its_own_instances_within_the_cap() {
    let a = args(&["--plan", "flex", "--max-instances", "3"]);
    let model = Model::default();
    let scenario = Scenario::new(400_000, Variant::Prefix, &a).on(Plan::Flex);
    assert_eq!(scenario.flex.max_instances, 3);
    let first = run_scenario(&scenario, &model, 4, 30.0).unwrap();
    let second = run_scenario(&scenario, &model, 4, 30.0).unwrap();
    assert!(first.completed && first.copy_verified, "{first:?}");
    assert_eq!(first.plan, "flex");
    assert_eq!(first.duration_seconds, second.duration_seconds);
    assert_eq!(first.instances_over_time, second.instances_over_time);
    // Per-function scaling: each queue function had instances of its own, and neither had more
    // on-demand instances than the maximum instance count, which caps each function group, not
    // the app combined. (Prefix steps write the rows they read, so the copy runs in PrefixScan;
    // TableCopy runs only the items of partitions too big for one step, if any.)
    assert!((1..=3).contains(&first.peak_instances["PrefixScan"]));
    assert!(first.peak_instances.get("TableCopy").copied().unwrap_or(0) <= 3);
    assert_eq!(
        first.peak_instances["PrefixScan"], 3,
        "the copy wanted more than the cap"
    );
    assert!(first.max_instances <= 6, "{:?}", first.peak_instances);
    assert!(first.instances_over_time.iter().all(|&(_, n)| n <= 6));
    // Flex bills provisioned memory (2 GB) at the on-demand rate, no baseline.
    assert!(first.cost.compute_usd > 0.0);
    assert_eq!(first.cost.always_ready_baseline_usd, 0.0);
}

#[test]
fn flex_adds_at_most_the_published_step_per_decision() {
    // A table big enough that the scan queue wants many instances at once; one scale decision
    // every 20 s, so the steps are visible: each decision adds at most 4 instances per function.
    // (200,000 rows peaked at 3 instances, or 2 after a change of a few requests' timing: too
    // close to the bound; 1,000,000 rows reach 5, in about 12 s of the test's time.)
    let a = args(&["--plan", "flex", "--flex-scale-interval", "20"]);
    let scenario = Scenario::new(1_000_000, Variant::Prefix, &a).on(Plan::Flex);
    let r = run_scenario(&scenario, &Model::default(), 2, 30.0).unwrap();
    assert!(r.completed && r.copy_verified);
    let mut by_time: std::collections::BTreeMap<u64, (usize, usize)> = Default::default();
    let mut previous = 0;
    for &(t, n) in &r.instances_over_time {
        let e = by_time.entry(t.round() as u64).or_insert((previous, n));
        e.1 = n;
        previous = n;
    }
    for (t, (before, after)) in by_time {
        assert!(after <= before + 8, "at {t} s: {before} -> {after}");
        assert_eq!(t % 20, 0, "instances change only at decisions");
    }
    assert!(
        r.max_instances > 2,
        "the copy scaled out: {:?}",
        r.peak_instances
    );
}

#[test]
fn flex_always_ready_instances_bill_a_baseline() {
    let a = args(&["--plan", "flex", "--always-ready", "1"]);
    let scenario = Scenario::new(20_000, Variant::Prefix, &a).on(Plan::Flex);
    let r = run_scenario(&scenario, &Model::default(), 3, 30.0).unwrap();
    assert!(r.completed && r.copy_verified);
    // Two functions, one always-ready 2 GB instance each, for the whole run.
    let expected = 2.0 * 2.0 * r.duration_seconds * 0.000004;
    assert!(
        (r.cost.always_ready_baseline_usd - expected).abs() < 1e-9,
        "{} vs {expected}",
        r.cost.always_ready_baseline_usd
    );
    assert!(r.peak_instances["PrefixScan"] >= 1 && r.peak_instances["TableCopy"] >= 1);
    // (An idle function still has its always-ready instance.)
    // Always-ready instances do not count toward the maximum instance count: with a maximum of
    // 1, a busy function runs its always-ready instance and one on-demand instance.
    let a = args(&[
        "--plan",
        "flex",
        "--always-ready",
        "1",
        "--max-instances",
        "1",
    ]);
    let scenario = Scenario::new(200_000, Variant::Prefix, &a).on(Plan::Flex);
    let r = run_scenario(&scenario, &Model::default(), 4, 30.0).unwrap();
    assert!(r.completed && r.copy_verified);
    assert_eq!(r.peak_instances["PrefixScan"], 2, "{:?}", r.peak_instances);
}

#[test]
fn flex_instance_sizes_billing_and_cpu() {
    let sized = |mb| Flex {
        instance_memory_mb: mb,
        ..Flex::default()
    };
    assert_eq!(
        Flex::MEMORY_SIZES_MB.map(|mb| sized(mb).cores()),
        [0.25, 1.0, 2.0]
    );
    assert_eq!(sized(2048).memory_gb(), 2.0);
    assert_eq!(Flex::default().max_instances, 40, "the template's default");
    // The regional quota (250 cores) caps 4,096 MB instances at 125 whatever the maximum.
    let big = Flex {
        max_instances: 1000,
        ..sized(4096)
    };
    assert_eq!(big.instance_cap(), 125);
    assert_eq!(big.quota_instances(), 125);
    assert_eq!(sized(512).quota_instances(), 1000);
    assert_eq!(
        Flex {
            max_instances: 100,
            ..sized(2048)
        }
        .instance_cap(),
        100
    );
    assert!(sized(1024).validate().is_err());
    assert!(Flex {
        max_instances: 1001,
        ..Flex::default()
    }
    .validate()
    .is_err());
    // Billing: at least 1 s per activity period, then rounded up to 100 ms.
    for (active_ms, billed_ms) in [
        (1, 1000),
        (200, 1000),
        (1000, 1000),
        (1001, 1100),
        (2350, 2400),
    ] {
        assert_eq!(
            Flex::billed_period(Duration::from_millis(active_ms)),
            Duration::from_millis(billed_ms),
            "{active_ms} ms"
        );
    }
    // A quarter core runs 1 ms of CPU in 4 ms; two cores run two slices at once.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        for (cores, slices, expected_ms) in [(0.25, 1, 4), (1.0, 2, 2), (2.0, 2, 1)] {
            let cpu = Arc::new(Cpu::with_cores(cores));
            let start = tokio::time::Instant::now();
            let work = (0..slices).map(|_| CPU.scope(cpu.clone(), charge_cpu(1.0)));
            futures::future::join_all(work).await;
            assert_eq!(
                start.elapsed(),
                Duration::from_millis(expected_ms),
                "{cores} cores"
            );
        }
    });
}

#[test]
fn the_storage_floor_counts_the_fewest_requests_and_the_largest_partition() {
    let model = Model::default();
    // 2,500 rows in 3 partitions: 3 queries to read, 1 + 2 + 20 batches to write.
    let table = SyntheticTable::new(vec![
        ("a".into(), 100),
        ("b".into(), 101),
        ("c".into(), 1999),
        ("d".into(), 300),
    ]);
    let f = floor(&table, &model, 40_000);
    assert_eq!(f.minimum_requests, 3 + 1 + 2 + 20 + 3);
    assert_eq!(f.largest_partition_rows, 1999);
    assert_eq!(f.partition_seconds, 1999.0 / 2000.0);
    assert_eq!(f.binding, "partition entity rate");
    assert_eq!(f.seconds, f.partition_seconds);
    assert_eq!(f.run_requests_seconds, 2.0);
    // Many small partitions: the account's request rate binds.
    let wide = SyntheticTable::new((0..50_000).map(|i| (format!("k{i:05}"), 2)).collect());
    let f = floor(&wide, &model, 0);
    assert_eq!(f.minimum_requests, 100 + 50_000);
    assert_eq!(f.binding, "account request rate");
    assert_eq!(f.seconds, 50_100.0 / 20_000.0);
}

#[test]
fn the_model_retries_as_the_storage_adapters_do() {
    let m = Model::default();
    let policy = tablescan::storage::retry_policy::RetryPolicy::default();
    assert_eq!(m.retry_max_attempts, policy.max_attempts);
    assert_eq!(m.retry_base_ms, policy.base_delay.as_millis() as f64);
    assert_eq!(m.retry_max_ms, policy.max_delay.as_millis() as f64);
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

/// The Flex rows run with what tablescan's template deploys.
#[test]
fn flex_defaults_are_the_templates() {
    let parameters: serde_json::Value =
        serde_json::from_str(include_str!("../../../infra/main.parameters.json")).unwrap();
    let flex = tablescan::lab::simulate::model::Flex::default();
    let p = &parameters["parameters"];
    assert_eq!(
        p["maximumInstanceCount"]["value"],
        flex.max_instances as u64
    );
    assert_eq!(
        p["instanceMemoryMB"]["value"],
        flex.instance_memory_mb as u64
    );
}

/// A copy at `maxRequestsPerSecond` on Flex (simulated): the figures, printed.
fn rate_limited(rows: u64, limit: u32, horizon_minutes: f64) -> (ScenarioResult, ScenarioResult) {
    let limit_arg = limit.to_string();
    let limited = args(&["--plan", "flex", "--max-requests-per-second", &limit_arg]);
    let free = args(&["--plan", "flex"]);
    let model = Model::default();
    let run = |a: &SimulateArgs| {
        let scenario = Scenario::new(rows, Variant::Prefix, a).on(Plan::Flex);
        run_scenario(&scenario, &model, 11, horizon_minutes).unwrap()
    };
    let (free, limited) = (run(&free), run(&limited));
    for (name, r) in [("unlimited", &free), ("limited", &limited)] {
        println!(
            "SIMULATED {rows} rows, Flex, {name}: {:.0} s, {} requests ({:.0}/s on average), peak {}/s, \
             refused by the account {}, peak instances {:?}, {:.1} requests per 1,000 rows, wall {:.0} s",
            r.duration_seconds,
            r.requests,
            r.requests as f64 / r.duration_seconds,
            r.peak_requests_per_second,
            r.account_throttled_requests,
            r.peak_instances,
            r.storage_requests_per_1000_rows,
            r.wall_seconds,
        );
    }
    (free, limited)
}

#[test]
fn a_rate_limited_copy_holds_its_limit_on_flex() {
    let (free, limited) = rate_limited(3_558_594, 2_000, 120.0);
    assert!(limited.completed && limited.copy_verified, "{limited:?}");
    assert!(
        free.peak_requests_per_second > 2_500,
        "the copy would go faster"
    );
    // The account's load, every request (the host's queue polls too, which are not the scan's).
    assert!(
        limited.peak_requests_per_second <= 2_200,
        "{}",
        limited.peak_requests_per_second
    );
    assert_eq!(limited.account_throttled_requests, 0);
}

/// The scenario: a 35M-row copy at 2,000 requests/s on Flex (simulated; a few minutes
/// of wall time: `cargo test --test scans lab::simulate:: -- --ignored --nocapture`).
#[test]
#[ignore = "soak: a 35M-row simulation (docs/development.md, Measurements)"]
fn a_35m_row_copy_at_2000_requests_per_second_on_flex() {
    let (_, limited) = rate_limited(35_000_000, 2_000, 240.0);
    assert!(limited.completed && limited.copy_verified, "{limited:?}");
    assert!(limited.peak_requests_per_second <= 2_200);
    assert_eq!(limited.account_throttled_requests, 0);
}

/// The scan's JSON less the wall time (the only figure that is not simulated).
fn simulated_json(r: &ScenarioResult) -> String {
    let mut v = serde_json::to_value(r).unwrap();
    v.as_object_mut().unwrap().remove("wall_seconds");
    v.to_string()
}

/// tablescan's enqueue driver (issue 26) in the simulator: every row reaches the destination
/// queue (read back from the messages), the queue's rate is the floor, and the requests stay
/// near the minimum of a query per 1,000 rows and a put per message (simulated).
#[test]
fn an_enqueue_puts_every_row_on_the_queue_near_its_minimum() {
    let model = Model::default();
    // rowsPerMessage 1: 20,000 puts beside ~200 other requests; 32: 625 puts beside the same
    // ~200 and the pacer's leases (an enqueue is paced at 2,000 requests/s by default), so the
    // fixed requests weigh almost half (docs/enqueue.md).
    for (per_message, most) in [(1u32, 1.10), (32, 1.50)] {
        let n = per_message.to_string();
        let a = args(&["--driver", "enqueue", "--rows-per-message", &n]);
        let scenario = Scenario::new(20_000, Variant::Prefix, &a);
        let r = run_scenario(&scenario, &model, 7, 30.0).unwrap();
        assert!(r.completed && r.copy_verified, "{per_message}: {r:?}");
        assert_eq!(r.design.enqueue.unwrap().rows_per_message, per_message);
        // The fan-out the scan recorded: the driver's at several rows a message.
        let fan_out = if per_message > 1 { (16, 16) } else { (4, 2) };
        assert_eq!(
            (r.design.segments_first, r.design.segments_subsequent),
            fan_out
        );
        let e = r.enqueue.as_ref().expect("enqueue figures");
        assert_eq!(e.minimum_messages, 20_000u64.div_ceil(per_message as u64));
        assert_eq!(e.minimum_requests, 20 + e.minimum_messages);
        assert!(e.messages >= e.minimum_messages, "{e:?}");
        assert_eq!((e.duplicate_rows, e.refused_puts), (0, 0), "{e:?}");
        assert!(e.admitted_ratio_to_minimum <= most, "{per_message}: {e:?}");
        assert_eq!(r.floor.binding, "queue message rate");
        assert_eq!(r.floor.queue_seconds, Some(e.queue_floor_seconds));
        assert!(r.duration_seconds >= e.queue_floor_seconds);
        let again = run_scenario(&scenario, &model, 7, 30.0).unwrap();
        assert_eq!(simulated_json(&r), simulated_json(&again), "same seed");
    }
    // A copy's JSON has no enqueue fields (the existing figures are unchanged).
    let copy = run_scenario(
        &Scenario::new(5_000, Variant::Prefix, &args(&[])),
        &model,
        7,
        30.0,
    );
    let copy: Value = serde_json::from_str(&simulated_json(&copy.unwrap())).unwrap();
    assert!(copy.get("enqueue").is_none() && copy["floor"].get("queue_seconds").is_none());
    assert!(copy["design"].get("enqueue").is_none());
}

/// An index build (issue 29) in the simulator, end to end: tablescan's real index driver over
/// the simulated blob service, then lookups through the real API, each value's rows checked
/// against the simulated table's own data (no false negatives, nothing else returned); its
/// requests by kind beside a count of the same table (simulated).
#[test]
fn an_index_build_finds_every_row_of_the_values_looked_up() {
    let model = Model::default();
    let a = args(&["--driver", "index", "--index-check-values", "3"]);
    // `--driver index` runs a count of the same table beside each build.
    let pair = scenarios(&args(&[
        "--rows",
        "20000",
        "--variant",
        "prefix",
        "--driver",
        "index",
    ]));
    assert_eq!(pair.len(), 2);
    assert!(pair[0].design.count && pair[1].design.index.is_some());
    let build = Scenario::new(20_000, Variant::Prefix, &a);
    let mut results: Vec<ScenarioResult> = [build.clone().count(), build]
        .iter()
        .map(|s| run_scenario(s, &model, 7, 30.0).unwrap())
        .collect();
    pair_with_counts(&mut results);
    let (count, index) = (&results[0], &results[1]);
    for r in [count, index] {
        assert!(r.completed && r.copy_verified, "{r:?}");
        assert_eq!(r.rows_copied, 20_000);
        assert_eq!(r.requests, r.index.as_ref().unwrap().requests.total);
    }
    let c = count.index.as_ref().unwrap();
    let f = index.index.as_ref().unwrap();
    assert_eq!((c.driver, f.driver), ("count", "index"));
    assert_eq!(c.requests.blobs.total(), 0);
    assert!(
        f.requests.blobs.write > 0 && f.requests.blobs.read > 0,
        "{f:?}"
    );
    let ratio = f.ratio_to_count.expect("paired with its count");
    assert_eq!(ratio, f.requests.total as f64 / c.requests.total as f64);
    // Three values of the table (each held by ~20 rows of 20,000) and one no row holds.
    assert_eq!(f.lookups.len(), 4, "{f:?}");
    for l in &f.lookups[..3] {
        assert!(l.expected_rows > 0, "{l:?}");
    }
    assert_eq!(f.lookups[3].expected_rows, 0);
    for l in &f.lookups {
        assert_eq!((l.missing_rows, l.wrong_rows), (0, 0), "{l:?}");
    }
    // A property with a different value on every row: each lookup finds its one row.
    let distinct = args(&["--driver", "index", "--index-property", "Id"]);
    let r = run_scenario(
        &Scenario::new(5_000, Variant::Prefix, &distinct),
        &model,
        7,
        30.0,
    );
    let r = r.unwrap();
    assert!(r.completed && r.copy_verified, "{r:?}");
    let lookups = &r.index.as_ref().unwrap().lookups;
    assert_eq!(lookups.len(), 5);
    assert!(lookups[..4]
        .iter()
        .all(|l| l.expected_rows == 1 && l.missing_rows == 0));
}

/// A queue slower than the scan (400 messages/s here, so that 20,000 rows show it): refused
/// puts (503) are retried and counted, and a step whose puts stay refused past the retry policy
/// fails and is run again, putting its messages again. No row is lost either way; the scan's
/// `maxRequestsPerSecond` under the queue's rate avoids the refusals (simulated).
#[test]
fn a_throttled_enqueue_retries_refused_puts_and_loses_no_row() {
    let model = Model {
        queue_messages_per_sec: 400.0,
        ..Model::default()
    };
    let free = args(&["--driver", "enqueue"]);
    let paced = args(&["--driver", "enqueue", "--max-requests-per-second", "380"]);
    let run = |a: &SimulateArgs| {
        let r = run_scenario(&Scenario::new(20_000, Variant::Prefix, a), &model, 7, 30.0);
        let r = r.unwrap();
        assert!(r.completed && r.copy_verified, "{r:?}");
        r
    };
    let (free, paced) = (run(&free), run(&paced));
    let (f, p) = (free.enqueue.unwrap(), paced.enqueue.unwrap());
    assert!(f.refused_puts > 0, "{f:?}");
    assert_eq!(
        free.throttled_by.get("queue rows-to-process"),
        Some(&f.refused_puts)
    );
    assert!(f.ratio_to_minimum > f.admitted_ratio_to_minimum);
    assert_eq!((p.refused_puts, p.duplicate_rows), (0, 0), "{p:?}");
    assert!(p.admitted_ratio_to_minimum <= 1.10, "{p:?}");
    assert!(paced.duration_seconds >= p.queue_floor_seconds);
}

/// The scenario: 35M rows put on one queue at `rowsPerMessage` 1 and 32, on Flex, with
/// and without `maxRequestsPerSecond: 2000` (simulated; long: at 1 row a message the queue's
/// floor alone is 4.9 simulated hours. `cargo test --release --test scans lab::
/// a_35m_row_enqueue -- --ignored --nocapture`).
#[test]
#[ignore = "soak: 35M-row simulations (docs/development.md, Measurements)"]
fn a_35m_row_enqueue_at_1_and_32_rows_a_message() {
    let model = Model::default();
    for (per_message, limit) in [(32, None), (32, Some(2000)), (1, Some(2000))] {
        let n = per_message.to_string();
        let mut argv = vec![
            "--plan",
            "flex",
            "--driver",
            "enqueue",
            "--rows-per-message",
            &n,
        ];
        let limit_arg = limit.map(|l: u32| l.to_string());
        if let Some(l) = &limit_arg {
            argv.extend(["--max-requests-per-second", l]);
        }
        let scenario = Scenario::new(35_000_000, Variant::Prefix, &args(&argv)).on(Plan::Flex);
        let r = run_scenario(&scenario, &model, 11, 420.0).unwrap();
        let e = r.enqueue.as_ref().unwrap();
        println!(
            "SIMULATED 35M rows, Flex, rowsPerMessage {per_message}, maxRequestsPerSecond {limit:?}: \
             completed {} in {:.0} s (queue floor {:.0} s), every row on the queue {}, messages {} \
             (minimum {}), refused puts {}, duplicate rows {}, requests admitted {:.3} x the minimum \
             ({} requests), every attempt {:.3} x, peak {}/s, peak instances {:?}, ${:.3}, wall {:.0} s",
            r.completed, r.duration_seconds, e.queue_floor_seconds, r.copy_verified, e.messages,
            e.minimum_messages, e.refused_puts, e.duplicate_rows, e.admitted_ratio_to_minimum,
            e.minimum_requests, e.ratio_to_minimum, r.peak_requests_per_second, r.peak_instances,
            r.estimated_cost_usd, r.wall_seconds,
        );
        if limit.is_some() {
            assert!(r.completed && r.copy_verified, "{r:?}");
        }
        if per_message > 1 {
            assert!(e.admitted_ratio_to_minimum <= 1.10, "{e:?}");
        }
    }
}
