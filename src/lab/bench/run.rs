//! Orchestration: seed the source once, then run each variant through its own local host behind
//! a counting proxy, verify the result and turn the counts into a [`VariantResult`].
//!
//! Invariant: every variant gets fresh queue and table names ([`Names`]) and a fresh proxy, so
//! nothing carries over between variants; figures are only reported for verified variants.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::passes::{floor_jobs, FloorRuns};
use super::queue_check::{enqueue_verdict, read_queue};
use super::report::{BenchReport, VariantResult};
use super::requests::{delta, per_1000, Minimum, Requests};
use super::sampler::HandlerSampler;
use super::upstream::Upstream;
use super::variant::{Job, Targets, Variant};
use super::BenchArgs;
use crate::app::functions::get_scan::scan_status;
use crate::app::tracking::Tracker;
use crate::lab::dataset::{self, RowsPerKey};
use crate::lab::demo::{fingerprint, post_scan, seed, start_app_with, watch_scan, Storage};
use crate::lab::host::stats::FunctionStats;
use crate::lab::host::RunningHost;
use crate::lab::proxy::{Counts, StorageProxy};
use crate::storage::azure_blob::AzureBlobStore;
use crate::storage::azure_queue::AzureQueueStore;
use crate::storage::azure_table::AzureTableStore;
use crate::storage::blob::{BlobRequestCounters, BlobStore};
use crate::storage::request_counts::RequestCounters;

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
    let upstream = Upstream {
        table: socket(azurite.table_port()),
        queue: socket(azurite.queue_port()),
        blob: socket(azurite.blob_port()),
    };
    let binary = match &args.handler_binary {
        Some(b) => b.clone(),
        None => std::env::current_exe().map_err(|e| e.to_string())?,
    };
    let store = storage
        .account
        .table_store(std::sync::Arc::new(RequestCounters::new()));
    let blobs = storage
        .account
        .blob_store(std::sync::Arc::new(BlobRequestCounters::new()))
        .map_err(|e| e.to_string())?;
    let queues = storage
        .account
        .queue_store(std::sync::Arc::new(RequestCounters::new()));
    let variants = selected_variants(args);
    if variants.contains(&Variant::PrefixImport) && !variants.contains(&Variant::PrefixExport) {
        return Err("prefix-import restores prefix-export's backup: select both".into());
    }
    let source = seed_source(&store, args).await?;
    // The copy floor's destination in the first pass is what prefix-delete empties.
    let doomed = format!("BenchFloor{}", source.suffix);
    let jobs = floor_jobs(&variants);
    let floor_runs = FloorRuns {
        upstream,
        seed: args.seed,
        source: &source.name,
        suffix: &source.suffix,
        doomed: &doomed,
    };
    let mut floors = floor_runs.pass(&jobs, 1).await?;
    let mut results = Vec::new();
    for (i, variant) in variants.into_iter().enumerate() {
        let names = Names::new(&source.suffix, i);
        let targets = Targets {
            source: source.name.clone(),
            destination: names.destination.clone(),
            container: format!("bench{}", source.suffix),
            prefix: "export".into(),
            doomed: doomed.clone(),
            queue: names.enqueue_queue.clone(),
        };
        let run = RunSpec {
            variant,
            binary: &binary,
            store: &store,
            blobs: &blobs,
            queues: &queues,
            targets,
            source_rows: source.rows,
            source_sum: &source.checksum,
            minimum: source.minimum,
            names,
            args,
        };
        let result = run_with_timeout(&run, upstream).await?;
        // Right after the variant, while the machine is as it was: its job's data requests as
        // many at a time as it had in flight.
        floors.extend(floor_runs.matched(&result, i).await?);
        results.push(result);
    }
    floors.extend(floor_runs.pass(&jobs, 2).await?);
    Ok(BenchReport {
        rows: source.rows,
        seed: args.seed,
        rows_per_key: args.rows_per_key,
        partition_keys: source.minimum.partition_keys,
        instances: args.instances,
        minimum: source.minimum,
        source_checksum: source.checksum,
        floors,
        variants: results,
    })
}

/// The seeded source table, shared by every variant.
struct Source {
    name: String,
    /// Random suffix of this run's table and queue names.
    suffix: String,
    rows: u64,
    checksum: String,
    minimum: Minimum,
}

/// Seeds a fresh source table with the generator and fingerprints it.
async fn seed_source(store: &AzureTableStore, args: &BenchArgs) -> Result<Source, String> {
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
    seed(store, &source, args.rows, args.seed, per_key)
        .await
        .map_err(|e| format!("seeding {source}: {e}"))?;
    let (source_rows, source_sum) = fingerprint(store, &source).await?;
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
    Ok(Source {
        name: source,
        suffix,
        rows: source_rows,
        checksum: source_sum,
        minimum,
    })
}

/// `--variants` sorted and without duplicates; all of them when none is named.
fn selected_variants(args: &BenchArgs) -> Vec<Variant> {
    if args.variants.is_empty() {
        Variant::ALL.to_vec()
    } else {
        let mut v = args.variants.clone();
        v.sort();
        v.dedup();
        v
    }
}

/// One variant behind its own counting proxy, given up after `--timeout-seconds`.
async fn run_with_timeout(run: &RunSpec<'_>, upstream: Upstream) -> Result<VariantResult, String> {
    let args = run.args;
    let proxy = upstream.counting_proxy(args.seed).await?;
    tokio::time::timeout(
        Duration::from_secs(args.timeout_seconds),
        run_variant(run, &proxy),
    )
    .await
    .map_err(|_| {
        format!(
            "{} did not finish within {} s",
            run.variant.name(),
            args.timeout_seconds
        )
    })?
}

/// Unique queue and table names per variant, so nothing carries over between runs.
struct Names {
    prefix_queue: String,
    copy_queue: String,
    scans_table: String,
    work_table: String,
    destination: String,
    /// The queue `prefix-enqueue` puts the rows on.
    enqueue_queue: String,
}

impl Names {
    fn new(suffix: &str, index: usize) -> Names {
        Names {
            prefix_queue: format!("bench{suffix}-{index}-ps"),
            copy_queue: format!("bench{suffix}-{index}-tc"),
            scans_table: format!("BenchScans{suffix}x{index}"),
            work_table: format!("BenchWork{suffix}x{index}"),
            destination: format!("BenchCopy{suffix}x{index}"),
            enqueue_queue: format!("bench{suffix}-{index}-rows"),
        }
    }
}

struct RunSpec<'a> {
    variant: Variant,
    binary: &'a std::path::Path,
    store: &'a AzureTableStore,
    blobs: &'a AzureBlobStore,
    queues: &'a AzureQueueStore,
    targets: Targets,
    source_rows: u64,
    source_sum: &'a str,
    minimum: Minimum,
    names: Names,
    args: &'a BenchArgs,
}

/// Runs one variant through a fresh local host, verifies it, and computes its figures.
async fn run_variant(run: &RunSpec<'_>, proxy: &StorageProxy) -> Result<VariantResult, String> {
    let n = &run.names;
    let settings = [
        ("TABLESCAN_PREFIXSCAN_QUEUE", n.prefix_queue.clone()),
        ("TABLESCAN_TABLECOPY_QUEUE", n.copy_queue.clone()),
        ("TABLESCAN_SCANS_TABLE", n.scans_table.clone()),
        ("TABLESCAN_WORK_TABLE", n.work_table.clone()),
    ];
    eprintln!("\n== {}", run.variant.name());
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
    let driven = outcome?;
    // After shutdown: the last messages are deleted and polling has stopped.
    let counts = delta(&proxy.counts(), &driven.before);
    verify(run, &driven.status).await?;
    let mut result = figures(run, driven, &counts);
    if run.variant.job() == Job::Index {
        result.lookups = Some(measure_lookups(run, proxy, &settings).await?);
    }
    Ok(result)
}

/// Lookups on the index the variant built, through a host of their own (the build's requests
/// are counted by then).
async fn measure_lookups(
    run: &RunSpec<'_>,
    proxy: &StorageProxy,
    settings: &[(&str, String)],
) -> Result<super::lookups::LookupReport, String> {
    let (_dir, host) =
        start_app_with(run.binary, &proxy.connection_string(), 1, 0, settings).await?;
    let base = format!("http://{}", host.http_addr());
    let target = super::lookups::Target {
        base: &base,
        container: &run.targets.container,
        prefix: "index",
        source: &run.targets.source,
    };
    let report = super::lookups::measure(run.store, &target).await;
    host.shutdown().await;
    report
}

/// Copies and imports: the destination holds the source's rows and checksum and the scan wrote
/// them all; counts: the scan counted the source's rows; exports: the manifest and the scan say
/// every row was written (prefix-import then checks the rows themselves); deletes: the table is
/// empty and the scan deleted every row; enqueues: every row is on the queue (read back).
async fn verify(run: &RunSpec<'_>, status: &Value) -> Result<(), String> {
    let t = &run.targets;
    let (verified, why) = match run.variant.job() {
        Job::Copy | Job::Import => {
            let fingerprint = fingerprint(run.store, &t.destination).await?;
            copy_verdict(
                &t.destination,
                fingerprint,
                status,
                run.source_rows,
                run.source_sum,
            )
        }
        Job::Count => count_verdict(status, run.source_rows),
        Job::Export => {
            let manifest = format!("{}/manifest.json", t.prefix);
            let bytes = run
                .blobs
                .download(&t.container, &manifest, 64 << 20)
                .await
                .map_err(|e| format!("{}/{manifest}: {e}", t.container))?
                .bytes;
            let manifest: Value = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
            export_verdict(&manifest, status, run.source_rows)
        }
        Job::Index => {
            let pointer = run
                .blobs
                .download(&t.container, "index/index.json", 1 << 20)
                .await
                .map_err(|e| format!("{}/index/index.json: {e}", t.container))?;
            let written = status["rowsWritten"].as_i64().unwrap_or(-1);
            (
                written == run.source_rows as i64,
                format!(
                    "pointer index/index.json ({} bytes) published; rowsWritten {written}; source {} rows",
                    pointer.bytes.len(),
                    run.source_rows
                ),
            )
        }
        Job::Enqueue => {
            let sent = status["messagesWritten"].as_u64().unwrap_or(0);
            let found = read_queue(run.queues, &t.queue, sent).await?;
            enqueue_verdict(&found, status, run.source_rows)
        }
        Job::Delete => {
            let (left, _) = fingerprint(run.store, &t.doomed).await?;
            let deleted = status["rowsWritten"].as_i64().unwrap_or(-1);
            (
                left == 0 && deleted == run.source_rows as i64,
                format!("{} holds {left} rows; rowsWritten {deleted}", t.doomed),
            )
        }
    };
    if !verified {
        return Err(format!("{} verification failed: {why}", run.variant.name()));
    }
    eprintln!("verified: {why}");
    Ok(())
}

fn copy_verdict(
    destination: &str,
    (dest_rows, dest_sum): (u64, String),
    status: &Value,
    rows: u64,
    source_sum: &str,
) -> (bool, String) {
    let written = status["rowsWritten"].as_i64().unwrap_or(-1);
    let ok = dest_rows == rows && dest_sum == source_sum && written == rows as i64;
    (
        ok,
        format!(
            "{destination} has {dest_rows} rows, checksum {dest_sum}, rowsWritten {written}; source {rows} rows, checksum {source_sum}"
        ),
    )
}

fn export_verdict(manifest: &Value, status: &Value, rows: u64) -> (bool, String) {
    let listed = manifest["rows"].as_u64().unwrap_or(0);
    let written = status["rowsWritten"].as_i64().unwrap_or(-1);
    let parts = manifest["parts"].as_array().map_or(0, Vec::len);
    (
        listed == rows && written == rows as i64,
        format!("the manifest lists {listed} rows in {parts} parts, rowsWritten {written}; source {rows} rows"),
    )
}

fn count_verdict(status: &Value, rows: u64) -> (bool, String) {
    let counted = status["rowsScanned"].as_i64().unwrap_or(-1);
    (
        counted == rows as i64,
        format!("counted {counted} rows; source {rows}"),
    )
}

/// A verified variant's figures from its final status, samples and request counts.
fn figures(run: &RunSpec<'_>, driven: Driven, counts: &Counts) -> VariantResult {
    let Driven {
        status,
        progress,
        sampler,
        stats,
        started,
        mean_in_flight,
        ..
    } = driven;
    let rows = run.source_rows;
    let n = &run.names;
    let wall = status_wall(&status).unwrap_or_else(|| started.elapsed().as_secs_f64());
    let requests = Requests::classify(counts, &[&n.scans_table, &n.work_table]);
    let minimum = run.minimum.requests_of(run.variant);
    let invocations_by_function: BTreeMap<String, u64> = stats
        .iter()
        .map(|(f, s)| (f.clone(), s.invocations))
        .collect();
    VariantResult {
        name: run.variant.name(),
        job: run.variant.job(),
        wall_seconds: wall,
        rows_per_second: rows as f64 / wall.max(1e-9),
        mean_in_flight,
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
        verified: true,
        progress,
        lookups: None,
    }
}

/// What following one scan to its end collected.
struct Driven {
    /// The final scan status.
    status: Value,
    /// (seconds since the POST, rows copied or counted).
    progress: Vec<(f64, u64)>,
    sampler: HandlerSampler,
    stats: BTreeMap<String, FunctionStats>,
    /// The proxy's counts just before the POST.
    before: Counts,
    /// Table and blob requests in flight on average from the POST to the end.
    mean_in_flight: f64,
    started: Instant,
}

/// The host's invocation counts once every committed message's invocation has returned: the
/// invocation that ends a scan records the end before it answers, and a short scan's others
/// may answer after it too, so counts read at once can miss them all (a 0.5-s copy read 0).
/// Waits for `messagesProcessed` invocations (the event; they usually take milliseconds), at
/// most [`SETTLE_BOUND`], which only catches a host that lost count: then it says so.
async fn settled_stats(host: &RunningHost, status: &Value) -> BTreeMap<String, FunctionStats> {
    let committed = status["messagesProcessed"].as_u64().unwrap_or(0);
    let deadline = Instant::now() + SETTLE_BOUND;
    // Bounded by the deadline.
    loop {
        let stats = host.invocation_stats();
        let seen: u64 = stats.values().map(|s| s.invocations).sum();
        if seen >= committed {
            return stats;
        }
        if Instant::now() >= deadline {
            eprintln!(
                "bench: {seen} invocations returned of the {committed} messages the scan processed, after {SETTLE_BOUND:?}; reporting those"
            );
            return stats;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How long [`settled_stats`] waits for the invocations a scan's status counts to return.
const SETTLE_BOUND: Duration = Duration::from_secs(60);

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
    let in_flight = proxy.in_flight().mark();
    let started = Instant::now();
    let body = run.variant.request(&run.targets);
    eprintln!("$ curl -X POST {base}/api/scans -H 'Content-Type: application/json' -d '{body}'");
    let location = post_scan(&client, &base, &body).await?;
    let id = location.rsplit('/').next().unwrap_or_default().to_string();
    let tracker = Tracker::new(run.store, &n.scans_table, &n.work_table);
    let drivers = crate::app::drivers::registry::<crate::storage::stores::AzureStores>();
    let field = run.variant.progress_field();
    let mut progress = vec![(0.0, 0u64)];
    let status = watch_scan(
        run.variant.name(),
        run.source_rows,
        run.args.quiet,
        Duration::from_millis(500),
        started,
        || async {
            scan_status(&tracker, &id, &drivers)
                .await
                .map_err(|e| e.to_string())
        },
        |at, status| {
            let rows = status[field].as_i64().unwrap_or(0).max(0) as u64;
            progress.push((at.as_secs_f64(), rows));
            sampler.sample(host);
        },
    )
    .await?;
    sampler.sample(host);
    let mean_in_flight = proxy.in_flight().mean_since(&in_flight);
    let stats = settled_stats(host, &status).await;
    Ok(Driven {
        mean_in_flight,
        status,
        progress,
        sampler,
        stats,
        before,
        started,
    })
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

    #[test]
    fn variants_selected_sorted_and_once() {
        let mut args = BenchArgs::default();
        assert_eq!(selected_variants(&args), Variant::ALL);
        args.variants = vec![
            Variant::PrefixCount,
            Variant::SerialCopy,
            Variant::PrefixCount,
        ];
        assert_eq!(
            selected_variants(&args),
            [Variant::SerialCopy, Variant::PrefixCount]
        );
    }

    #[test]
    fn verdicts_compare_with_the_source() {
        let status = json!({"rowsWritten": 10, "rowsScanned": 10});
        let (ok, why) = copy_verdict("Dst", (10, "abc".into()), &status, 10, "abc");
        assert!(ok, "{why}");
        assert!(
            why.starts_with("Dst has 10 rows, checksum abc, rowsWritten 10"),
            "{why}"
        );
        assert!(!copy_verdict("Dst", (10, "abd".into()), &status, 10, "abc").0);
        assert!(!copy_verdict("Dst", (10, "abc".into()), &json!({}), 10, "abc").0);
        assert!(!copy_verdict("Dst", (9, "abc".into()), &status, 10, "abc").0);
        assert_eq!(
            count_verdict(&status, 10),
            (true, "counted 10 rows; source 10".to_string())
        );
        assert!(!count_verdict(&status, 11).0);
        assert!(!count_verdict(&json!({}), 0).0);
    }
}
