//! `tablescan bench` on a few hundred rows, so its code paths cannot rot: every variant runs
//! through the local host on Azurite, is verified, and the JSON contract and chart are written.

use serde_json::Value;
use tablescan::lab::bench::{run_bench, BenchArgs};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bench_runs_every_variant_verifies_and_writes_the_contract() {
    // The bench counts requests through a proxy in front of its own Azurite.
    std::env::remove_var("AzureWebJobsStorage");
    let dir = tempfile::tempdir().unwrap();
    let (out, svg) = (dir.path().join("bench.json"), dir.path().join("bench.svg"));
    let args = BenchArgs {
        rows: 300,
        seed: 7,
        out: Some(out.clone()),
        svg: Some(svg.clone()),
        quiet: true,
        timeout_seconds: 240,
        handler_binary: Some(env!("CARGO_BIN_EXE_tablescan").into()),
        ..BenchArgs::default()
    };
    run_bench(args).await.expect("bench runs");

    let report: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(report["rows"], 300);
    let variants = report["variants"].as_array().unwrap();
    let names: Vec<&str> = variants
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "serial-copy",
            "reference-copy",
            "prefix-copy",
            "serial-count",
            "prefix-count",
            "prefix-export",
            "prefix-import",
            "prefix-delete",
            "prefix-enqueue",
            "prefix-enqueue-1",
            "prefix-index"
        ]
    );
    // The floors, before and after the variants: each job's data requests by a bare client;
    // the third pass right after each variant that writes batches, as many at a time as it had
    // requests in flight.
    // Copy: reads + batches = the minimum; export: a read and a part per page; import: a part
    // read per page + the batches; delete: reads + batches.
    let floors = report["floors"].as_array().unwrap();
    let (reads, batches) = (
        report["minimum"]["reads"].as_u64().unwrap(),
        report["minimum"]["batches"].as_u64().unwrap(),
    );
    let mut seen = Vec::new();
    for floor in floors {
        let job = floor["job"].as_str().unwrap();
        seen.push((job, floor["pass"].as_u64().unwrap()));
        assert_eq!(floor["rows"], 300, "{floor}");
        let expected = match job {
            "export" => 2 * reads,
            _ => reads + batches,
        };
        assert_eq!(floor["requests"].as_u64(), Some(expected), "{floor}");
        for field in [
            "cpu_us_per_request",
            "cpu_ms_per_1000_rows",
            "mean_in_flight",
        ] {
            assert!(floor[field].as_f64().unwrap() > 0.0, "{floor}");
        }
        let at_a_time = floor["in_flight"].as_u64().unwrap();
        let expected = match (job, floor["pass"].as_u64().unwrap()) {
            ("export", _) => 1,
            (_, 3) => in_flight_of(variants, floor["variant"].as_str().unwrap()),
            _ => 8,
        };
        assert_eq!(at_a_time, expected, "{floor}");
    }
    let jobs = ["copy", "export", "import", "delete"];
    let mut expected: Vec<(&str, u64)> = jobs.iter().map(|job| (*job, 1)).collect();
    expected.extend([
        ("copy", 3),
        ("copy", 3),
        ("copy", 3),
        ("import", 3),
        ("delete", 3),
    ]);
    expected.extend(jobs.iter().map(|job| (*job, 2)));
    assert_eq!(seen, expected);
    let matched: Vec<&str> = floors
        .iter()
        .filter_map(|f| f["variant"].as_str())
        .collect();
    assert_eq!(
        matched,
        [
            "serial-copy",
            "reference-copy",
            "prefix-copy",
            "prefix-import",
            "prefix-delete"
        ]
    );
    let minimum = &report["minimum"];
    let keys = minimum["partition_keys"].as_u64().unwrap();
    assert!(keys > 30 && keys < 300, "{keys} partition keys");
    assert_eq!(minimum["reads"], 1);
    for v in variants {
        let name = v["name"].as_str().unwrap();
        for field in [
            "wall_seconds",
            "rows_per_second",
            "requests_per_1000_rows",
            "minimum_requests_per_1000_rows",
            "queue_messages_per_1000_rows",
            "invocations",
            "max_invocation_seconds",
            "handler_cpu_ms_per_1000_rows",
            "handler_peak_rss_bytes",
            "mean_in_flight",
        ] {
            let x = v[field]
                .as_f64()
                .unwrap_or_else(|| panic!("{name}.{field}: {v}"));
            assert!(x > 0.0, "{name}.{field} = {x}");
        }
        assert_eq!(v["verified"], true, "{name}");
        if matches!(name, "prefix-enqueue" | "prefix-enqueue-1" | "prefix-index") {
            // The new drivers (docs/bench.md): verified above; no table batches; the index
            // writes blobs, the enqueue driver none.
            assert_eq!(v["requests"]["batch"].as_u64().unwrap(), 0, "{name}");
            let blob_writes = v["requests"]["blob_write"].as_u64().unwrap();
            assert_eq!(blob_writes > 0, name == "prefix-index", "{name}");
            if name == "prefix-index" {
                // Lookups of present and absent values, each checked against a filtered full
                // scan of the same value by the bench itself.
                let l = &v["lookups"];
                assert!(
                    l["index_present"]["rows_per_lookup"].as_f64().unwrap() > 0.0,
                    "{l}"
                );
                assert_eq!(
                    l["index_absent"]["rows_per_lookup"].as_f64(),
                    Some(0.0),
                    "{l}"
                );
                for kind in [
                    "index_present",
                    "index_absent",
                    "scan_present",
                    "scan_absent",
                ] {
                    assert!(
                        l[kind]["requests_per_lookup"].as_f64().unwrap() >= 1.0,
                        "{l}"
                    );
                    assert!(l[kind]["p99_ms"].as_f64().unwrap() > 0.0, "{l}");
                }
            }
            continue;
        }
        let writes = ["-copy", "-import", "-delete"]
            .iter()
            .any(|s| name.ends_with(s));
        // The minimum: one read per 1,000 rows (of the table, or of an export's parts), plus
        // (writes to a table) one batch per partition per 100 rows; an export writes a part per
        // read and a manifest, an import reads the manifest.
        let expected_minimum = match name {
            "prefix-export" => 3,
            "prefix-import" => 2 + keys,
            _ => 1 + if writes { keys } else { 0 },
        } as f64
            * 1000.0
            / 300.0;
        let minimum = v["minimum_requests_per_1000_rows"].as_f64().unwrap();
        assert!(
            (minimum - expected_minimum).abs() < 1e-6,
            "{name}: {minimum}"
        );
        let ratio = v["ratio_to_minimum"].as_f64().unwrap();
        let per_k = v["requests_per_1000_rows"].as_f64().unwrap();
        assert!(
            (ratio - per_k / minimum).abs() < 1e-6,
            "{name}: ratio {ratio}"
        );
        let kinds = &v["requests_per_1000_rows_by_kind"];
        let data = kinds["data"].as_f64().unwrap();
        assert!(
            (v["data_ratio_to_minimum"].as_f64().unwrap() - data / minimum).abs() < 1e-6,
            "{name}"
        );
        // Every copy, import and delete writes each partition at least once; counts and exports
        // write nothing to data tables; exports and imports write and read blobs.
        let batches = v["requests"]["batch"].as_u64().unwrap();
        if writes {
            assert!(batches >= keys, "{name}: {batches} batches for {keys} keys");
        } else {
            assert_eq!(batches, 0, "{name}");
        }
        let blob = |kind: &str| v["requests"][kind].as_u64().unwrap();
        match name {
            "prefix-export" => assert!(blob("blob_write") >= 2 && blob("blob_list") >= 1, "{name}"),
            "prefix-import" => assert!(blob("blob_read") >= 2 && blob("blob_write") == 0, "{name}"),
            _ => assert_eq!(blob("blob_write") + blob("blob_read"), 0, "{name}"),
        }
        if name != "prefix-import" {
            assert!(v["requests"]["query"].as_u64().unwrap() >= 1, "{name}");
        }
        assert!(v["requests"]["bookkeeping"].as_u64().unwrap() > 0, "{name}");
        assert!(v["requests"]["queue_get"].as_u64().unwrap() > 0, "{name}");
        assert!(v["messages_processed"].as_i64().unwrap() >= 1, "{name}");
        let progress = v["progress"].as_array().unwrap();
        assert_eq!(progress.last().unwrap()[1], 300, "{name}: final progress");
    }
    // The reference split sends one copy message per partition key; tablescan's one per page.
    let msgs = |n: usize| {
        variants[n]["queue_messages_per_1000_rows"]
            .as_f64()
            .unwrap()
    };
    assert!(
        msgs(1) > msgs(2),
        "reference {} vs prefix {}",
        msgs(1),
        msgs(2)
    );

    let chart = std::fs::read_to_string(&svg).unwrap();
    assert!(chart.starts_with("<svg"));
    assert_eq!(chart.matches("<polyline").count(), variants.len());
    for name in names {
        assert!(chart.contains(name), "{name} in the legend");
    }
}

/// The third floor pass's batches at a time for `variant`: its mean requests in flight,
/// rounded up.
fn in_flight_of(variants: &[Value], variant: &str) -> u64 {
    let v = variants.iter().find(|v| v["name"] == variant).unwrap();
    v["mean_in_flight"].as_f64().unwrap().ceil().max(1.0) as u64
}

/// A delete alone still runs the export and import floors (the delete floor empties the import
/// floor's table), checks them against its proxy, and reports only the floors it is judged by.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_delete_alone_reports_the_copy_and_delete_floors() {
    std::env::remove_var("AzureWebJobsStorage");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bench.json");
    let args = BenchArgs {
        rows: 120,
        seed: 3,
        out: Some(out.clone()),
        quiet: true,
        timeout_seconds: 240,
        variants: vec![tablescan::lab::bench::Variant::PrefixDelete],
        handler_binary: Some(env!("CARGO_BIN_EXE_tablescan").into()),
        ..BenchArgs::default()
    };
    run_bench(args).await.expect("bench runs");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let floors: Vec<(&str, u64)> = report["floors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["job"].as_str().unwrap(), f["pass"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        floors,
        [
            ("copy", 1),
            ("delete", 1),
            ("delete", 3),
            ("copy", 2),
            ("delete", 2)
        ]
    );
    assert_eq!(report["variants"][0]["verified"], true);
}
