//! Measurement (not a test of behaviour): `tablescan run copy` of the bench's table through the
//! counting proxy: every storage request of the run (data, bookkeeping, queue polls, receives,
//! deletes and status reads) against the minimum, rows per second and the process's peak RSS.
//! Figures in docs/bench.md ("`tablescan run`"). Its properties keep deterministic tests:
//! `exact` (the copy is exact), `resume`.

use std::time::{Duration, Instant};

use super::Names;
use crate::support;
use support::e2e::seed;
use support::faults::proxy;
use support::unique_name;
use tablescan::lab::dataset::{self, RowsPerKey};
use tablescan::lab::proxy::FaultPolicy;

/// The bench's table: 20,000 rows, its default distribution, seed 1.
const ROWS: u64 = 20_000;

#[tokio::test]
#[ignore = "measurement: requests, rows/s and peak RSS of tablescan run copy (docs/bench.md)"]
async fn measure_run_copy_requests_speed_and_memory() {
    let _alone = support::alone().await;
    let concurrency = std::env::var("RUN_CONCURRENCY").unwrap_or_else(|_| "24".into());
    let (store, _) = support::table_store();
    let (source, destination) = (unique_name("MeasureSrc"), unique_name("MeasureDst"));
    let partitions: Vec<Vec<_>> = dataset::entities(ROWS, 1, RowsPerKey::default()).collect();
    let minimum = ROWS.div_ceil(1000)
        + partitions
            .iter()
            .map(|p| (p.len() as u64).div_ceil(100))
            .sum::<u64>();
    seed(&store, &source, partitions.into_iter().flatten().collect()).await;
    let proxy = proxy(FaultPolicy::none(), 1).await;
    let names = Names::new();
    let connection = proxy.connection_string();
    let args = [
        "run",
        "copy",
        "--source-table",
        &source,
        "--destination-table",
        &destination,
        "--json",
        "--quiet",
        "--concurrency",
        &concurrency,
    ];
    let mut command = names.command(&args);
    command.env("AzureWebJobsStorage", &connection);
    let started = Instant::now();
    let mut child = command.spawn().unwrap();
    let pid = child.id().unwrap();
    let mut peak_kib = 0u64;
    let status = loop {
        if let Some(kib) = vm_hwm(pid) {
            peak_kib = peak_kib.max(kib);
        }
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let wall = started.elapsed().as_secs_f64();
    assert!(status.success(), "{status:?}");
    let requests: u64 = proxy.counts().values().sum();
    let ratio = requests as f64 / minimum as f64;
    println!(
        "run copy, {ROWS} rows, concurrency {concurrency}: {requests} requests, minimum {minimum}, ratio {ratio:.3}; {wall:.1} s, {:.0} rows/s; peak RSS {:.1} MiB",
        ROWS as f64 / wall,
        peak_kib as f64 / 1024.0
    );
    for ((kind, target), n) in proxy.counts() {
        println!("  {kind} {target}: {n}");
    }
}

/// The process's peak resident set (`VmHWM`), in KiB.
fn vm_hwm(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
