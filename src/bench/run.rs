//! Orchestration: seed the source once, then run each variant through its own local host behind
//! a counting proxy, verify the result and turn the counts into a [`VariantResult`].
//!
//! Invariant: every variant gets fresh queue and table names ([`Names`]) and a fresh proxy, so
//! nothing carries over between variants; figures are only reported for verified variants.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::report::{BenchReport, VariantResult};
use super::requests::{delta, per_1000, Minimum, Requests};
use super::sampler::HandlerSampler;
use super::variant::Variant;
use super::BenchArgs;
use crate::app::functions::get_scan::scan_status;
use crate::app::tracking::Tracker;
use crate::dataset::{self, RowsPerKey};
use crate::demo::{fingerprint, post_scan, seed, start_app_with, watch_scan, Storage};
use crate::host::RunningHost;
use crate::proxy::{Counts, FaultPolicy, StorageProxy};
use crate::storage::azure_table::AzureTableStore;
use crate::storage::counters::RequestCounters;

fn socket(endpoint_port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], endpoint_port))
}

/// Seeds the source once and measures every selected variant in turn.
pub async fn measure(args: &BenchArgs) -> Result<BenchReport, String> {
    if args.rows == 0 {
        return Err("--rows must be at least 1".into());
    }
    let storage = Storage::open().await?;
    // Requests are counted by a plain-HTTP proxy, which can front Azurite but not Azure's TLS
    // endpoints; without the counts the figures this command exists for are missing.
    let azurite = storage.azurite().ok_or(
        "bench counts every storage request through a local proxy in front of Azurite; \
         unset AzureWebJobsStorage to run it on a private Azurite",
    )?;
    let (table_up, queue_up) = (socket(azurite.table_port()), socket(azurite.queue_port()));
    let binary = match &args.handler_binary {
        Some(b) => b.clone(),
        None => std::env::current_exe().map_err(|e| e.to_string())?,
    };
    let store = storage
        .account
        .table_store(std::sync::Arc::new(RequestCounters::new()));
    let per_key = RowsPerKey {
        mean: args.rows_per_key,
    };
    let sizes = dataset::partition_keys(args.rows, args.seed, per_key);
    let minimum = Minimum::of(sizes.iter().map(|(_, n)| u64::from(*n)));
    let suffix = format!("{:06x}", rand::random::<u32>() & 0xff_ffff);
    let source = format!("BenchSource{suffix}");

    let t = Instant::now();
    eprintln!(
        "seeding {} rows ({} partition keys) into {source} ...",
        args.rows, minimum.partition_keys
    );
    seed(&store, &source, args.rows, args.seed, per_key)
        .await
        .map_err(|e| format!("seeding {source}: {e}"))?;
    let (source_rows, source_sum) = fingerprint(&store, &source).await?;
    if source_rows != args.rows {
        return Err(format!(
            "{source} holds {source_rows} rows, expected {} (was it seeded before?)",
            args.rows
        ));
    }
    eprintln!(
        "seeded and fingerprinted in {:.1} s: {source_rows} rows, checksum {source_sum}",
        t.elapsed().as_secs_f64()
    );

    let variants: Vec<Variant> = if args.variants.is_empty() {
        Variant::ALL.to_vec()
    } else {
        let mut v = args.variants.clone();
        v.sort();
        v.dedup();
        v
    };
    let mut results = Vec::new();
    for (i, variant) in variants.into_iter().enumerate() {
        let run = RunSpec {
            variant,
            binary: &binary,
            store: &store,
            source: &source,
            source_rows,
            source_sum: &source_sum,
            minimum,
            names: Names::new(&suffix, i),
            args,
        };
        let proxy = StorageProxy::start(table_up, queue_up, FaultPolicy::none(), args.seed)
            .await
            .map_err(|e| format!("cannot start the counting proxy: {e}"))?;
        let result = tokio::time::timeout(
            Duration::from_secs(args.timeout_seconds),
            run_variant(&run, &proxy),
        )
        .await
        .map_err(|_| {
            format!(
                "{} did not finish within {} s",
                variant.name(),
                args.timeout_seconds
            )
        })??;
        results.push(result);
    }
    Ok(BenchReport {
        rows: source_rows,
        seed: args.seed,
        rows_per_key: args.rows_per_key,
        partition_keys: minimum.partition_keys,
        instances: args.instances,
        minimum,
        source_checksum: source_sum,
        variants: results,
    })
}

/// Unique queue and table names per variant, so nothing carries over between runs.
struct Names {
    prefix_queue: String,
    copy_queue: String,
    scans_table: String,
    work_table: String,
    destination: String,
}

impl Names {
    fn new(suffix: &str, index: usize) -> Names {
        Names {
            prefix_queue: format!("bench{suffix}-{index}-ps"),
            copy_queue: format!("bench{suffix}-{index}-tc"),
            scans_table: format!("BenchScans{suffix}x{index}"),
            work_table: format!("BenchWork{suffix}x{index}"),
            destination: format!("BenchCopy{suffix}x{index}"),
        }
    }
}

struct RunSpec<'a> {
    variant: Variant,
    binary: &'a std::path::Path,
    store: &'a AzureTableStore,
    source: &'a str,
    source_rows: u64,
    source_sum: &'a str,
    minimum: Minimum,
    names: Names,
    args: &'a BenchArgs,
}

async fn run_variant(run: &RunSpec<'_>, proxy: &StorageProxy) -> Result<VariantResult, String> {
    let n = &run.names;
    let settings = [
        ("TABLESCAN_PREFIXSCAN_QUEUE", n.prefix_queue.clone()),
        ("TABLESCAN_TABLECOPY_QUEUE", n.copy_queue.clone()),
        ("TABLESCAN_SCANS_TABLE", n.scans_table.clone()),
        ("TABLESCAN_WORK_TABLE", n.work_table.clone()),
    ];
    let name = run.variant.name();
    eprintln!("\n== {name}");
    let (_dir, host) = start_app_with(
        run.binary,
        &proxy.connection_string(),
        run.args.instances,
        0,
        &settings,
    )
    .await?;
    let outcome = drive(run, proxy, &host).await;
    host.shutdown().await;
    let (status, progress, sampler, stats, before, started) = outcome?;
    // After shutdown: the last messages are deleted and polling has stopped.
    let counts = delta(&proxy.counts(), &before);

    let rows = run.source_rows;
    let (verified, why) = if run.variant.is_copy() {
        let (dest_rows, dest_sum) = fingerprint(run.store, &n.destination).await?;
        let written = status["rowsWritten"].as_i64().unwrap_or(-1);
        let ok = dest_rows == rows && dest_sum == run.source_sum && written == rows as i64;
        (
            ok,
            format!(
                "{} has {dest_rows} rows, checksum {dest_sum}, rowsWritten {written}; source {rows} rows, checksum {}",
                n.destination, run.source_sum
            ),
        )
    } else {
        let counted = status["rowsScanned"].as_i64().unwrap_or(-1);
        (
            counted == rows as i64,
            format!("counted {counted} rows; source {rows}"),
        )
    };
    if !verified {
        return Err(format!("{name} verification failed: {why}"));
    }
    eprintln!("verified: {why}");

    let wall = status_wall(&status).unwrap_or_else(|| started.elapsed().as_secs_f64());
    let requests = Requests::classify(&counts, &[&n.scans_table, &n.work_table]);
    let minimum = run.minimum.requests(run.variant.is_copy());
    let invocations_by_function: BTreeMap<String, u64> = stats
        .iter()
        .map(|(f, s)| (f.clone(), s.invocations))
        .collect();
    Ok(VariantResult {
        name,
        wall_seconds: wall,
        rows_per_second: rows as f64 / wall.max(1e-9),
        requests_per_1000_rows: per_1000(requests.total, rows),
        requests_per_1000_rows_by_kind: requests.per_1000(rows),
        minimum_requests_per_1000_rows: per_1000(minimum, rows),
        ratio_to_minimum: requests.total as f64 / minimum as f64,
        data_ratio_to_minimum: requests.data() as f64 / minimum as f64,
        queue_messages_per_1000_rows: per_1000(requests.queue_put, rows),
        invocations: stats.values().map(|s| s.invocations).sum(),
        invocations_by_function,
        messages_processed: status["messagesProcessed"].as_i64().unwrap_or(0),
        max_invocation_seconds: stats
            .values()
            .map(|s| s.longest.as_secs_f64())
            .fold(0.0, f64::max),
        handler_cpu_ms_per_1000_rows: sampler.cpu_ms().map(|ms| ms * 1000.0 / rows as f64),
        handler_cpu_us_per_request: sampler
            .cpu_ms()
            .map(|ms| ms * 1000.0 / requests.handler_made().max(1) as f64),
        handler_peak_rss_bytes: (sampler.peak_rss > 0).then_some(sampler.peak_rss),
        rows,
        requests,
        verified,
        progress,
    })
}

type Driven = (
    Value,
    Vec<(f64, u64)>,
    HandlerSampler,
    BTreeMap<String, crate::host::stats::FunctionStats>,
    Counts,
    Instant,
);

/// Starts the scan over HTTP and follows it to the end while sampling the handlers.
async fn drive(
    run: &RunSpec<'_>,
    proxy: &StorageProxy,
    host: &RunningHost,
) -> Result<Driven, String> {
    let n = &run.names;
    let base = format!("http://{}", host.http_addr());
    let client = reqwest::Client::new();
    let mut sampler = HandlerSampler::default();
    sampler.sample(host);
    let before = proxy.counts();
    let started = Instant::now();
    let body = run.variant.request(run.source, &n.destination);
    eprintln!("$ curl -X POST {base}/api/scans -H 'Content-Type: application/json' -d '{body}'");
    let location = post_scan(&client, &base, &body).await?;
    let id = location.rsplit('/').next().unwrap_or_default().to_string();
    let tracker = Tracker::new(run.store, &n.scans_table, &n.work_table);
    let copy = run.variant.is_copy();
    let mut progress = vec![(0.0, 0u64)];
    let status = watch_scan(
        run.variant.name(),
        run.source_rows,
        run.args.quiet,
        Duration::from_millis(500),
        started,
        || async { scan_status(&tracker, &id).await.map_err(|e| e.to_string()) },
        |at, status| {
            let field = if copy { "rowsWritten" } else { "rowsScanned" };
            let rows = status[field].as_i64().unwrap_or(0).max(0) as u64;
            progress.push((at.as_secs_f64(), rows));
            sampler.sample(host);
        },
    )
    .await?;
    sampler.sample(host);
    let stats = host.invocation_stats();
    Ok((status, progress, sampler, stats, before, started))
}

/// The scan's own wall time: `completedAt − startedAt` as recorded in storage.
fn status_wall(status: &Value) -> Option<f64> {
    let parse = |f: &str| {
        time::OffsetDateTime::parse(
            status[f].as_str()?,
            &time::format_description::well_known::Rfc3339,
        )
        .ok()
    };
    let secs = (parse("completedAt")? - parse("startedAt")?).as_seconds_f64();
    (secs > 0.0).then_some(secs)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn wall_time_from_the_status_record() {
        let s = json!({"startedAt": "2024-01-01T00:00:00.250Z", "completedAt": "2024-01-01T00:00:10.750Z"});
        assert_eq!(status_wall(&s), Some(10.5));
        assert_eq!(
            status_wall(&json!({"startedAt": "2024-01-01T00:00:00Z"})),
            None
        );
    }
}
