//! `tablescan bench`: measured cost and speed of scans on this machine, side by side.
//!
//! The source table is seeded once with the demo's generator and reused by every variant. Each
//! variant runs through a fresh local Functions host whose storage traffic (handler AND host, so
//! queue polling is counted too) goes through a counting [`StorageProxy`] in front of Azurite.
//! Requests are split by kind and by the table or queue they address, so bookkeeping (the scans
//! and work tables) is told apart from data reads and writes. Progress is read directly from
//! storage, not through the proxy, so watching a scan costs it nothing.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use serde::Serialize;
use serde_json::{json, Value};

use crate::app::functions::get_scan::scan_status;
use crate::app::tracking::Tracker;
use crate::dataset::{self, RowsPerKey};
use crate::demo::{fingerprint, post_scan, seed, start_app_with, watch_scan, Storage};
use crate::host::RunningHost;
use crate::proxy::{Counts, FaultPolicy, StorageProxy};
use crate::storage::azure_table::AzureTableStore;
use crate::storage::counters::RequestCounters;
use crate::storage::{MAX_BATCH_OPERATIONS, MAX_TAKE};

/// Printed with every result: wall times on Azurite are not Azure's.
pub const AZURITE_NOTE: &str = "Note: Azurite evaluates every $filter by scanning the whole table, so on Azurite \
prefix queries (many small filtered queries) are far slower than on Azure, where a PartitionKey range \
query reads only that range. Wall times here are honest but pessimistic for prefix variants; request \
counts, CPU and memory do not depend on this.";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Variant {
    /// Copy with the serial strategy (one paging chain, copy work fanned out).
    SerialCopy,
    /// Copy with the reference design's work split (one message per partition key, re-read).
    ReferenceCopy,
    /// Copy with tablescan's prefix scan and page work split.
    PrefixCopy,
    /// Count with the serial strategy.
    SerialCount,
    /// Count with the prefix strategy.
    PrefixCount,
}

impl Variant {
    pub const ALL: [Variant; 5] = [
        Variant::SerialCopy,
        Variant::ReferenceCopy,
        Variant::PrefixCopy,
        Variant::SerialCount,
        Variant::PrefixCount,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Variant::SerialCopy => "serial-copy",
            Variant::ReferenceCopy => "reference-copy",
            Variant::PrefixCopy => "prefix-copy",
            Variant::SerialCount => "serial-count",
            Variant::PrefixCount => "prefix-count",
        }
    }

    pub fn is_copy(self) -> bool {
        matches!(
            self,
            Variant::SerialCopy | Variant::ReferenceCopy | Variant::PrefixCopy
        )
    }

    /// The scan request, exactly as a user would POST it.
    fn request(self, source: &str, destination: &str) -> Value {
        let strategy = match self {
            Variant::SerialCopy | Variant::SerialCount => "serial",
            _ => "prefix",
        };
        let mut body = json!({"driver": if self.is_copy() { "copy" } else { "count" },
            "sourceTable": source, "strategy": strategy});
        if self.is_copy() {
            body["destinationTable"] = json!(destination);
        }
        if self == Variant::ReferenceCopy {
            body["workSplit"] = json!("partitionKey");
        }
        body
    }
}

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Rows in the source table.
    #[arg(long, default_value_t = 100_000)]
    pub rows: u64,
    /// Seed of the dataset generator (same seed, same table).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Mean rows per partition key of the generator's skewed distribution.
    #[arg(long, default_value_t = 3.0)]
    pub rows_per_key: f64,
    /// Local host instances (handler processes) consuming the queues.
    #[arg(long, default_value_t = 1)]
    pub instances: usize,
    /// Write the results as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Write an SVG chart of rows copied (or counted) over time to this file.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Variants to run (comma-separated) [default: all].
    #[arg(long, value_enum, value_delimiter = ',')]
    pub variants: Vec<Variant>,
    /// Give up on a variant that runs longer than this.
    #[arg(long, default_value_t = 3600)]
    pub timeout_seconds: u64,
    /// No progress bars.
    #[arg(long)]
    pub quiet: bool,
    /// The handler binary to stage [default: this executable]; tests point it at the built binary.
    #[arg(skip)]
    pub handler_binary: Option<PathBuf>,
}

impl Default for BenchArgs {
    fn default() -> Self {
        BenchArgs {
            rows: 100_000,
            seed: 1,
            rows_per_key: 3.0,
            instances: 1,
            out: None,
            svg: None,
            variants: Vec::new(),
            timeout_seconds: 3600,
            quiet: false,
            handler_binary: None,
        }
    }
}

/// The fewest storage requests that can read and write a table: one query per 1,000 rows, and
/// (to copy) one entity group transaction per partition key per 100 rows.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Minimum {
    pub reads: u64,
    pub batches: u64,
    pub partition_keys: u64,
}

impl Minimum {
    pub fn of(partition_sizes: impl IntoIterator<Item = u64>) -> Minimum {
        let (mut rows, mut batches, mut keys) = (0u64, 0u64, 0u64);
        for n in partition_sizes {
            rows += n;
            batches += n.div_ceil(MAX_BATCH_OPERATIONS as u64);
            keys += 1;
        }
        Minimum {
            reads: rows.div_ceil(u64::from(MAX_TAKE)),
            batches,
            partition_keys: keys,
        }
    }

    fn requests(&self, copy: bool) -> u64 {
        self.reads + if copy { self.batches } else { 0 }
    }
}

/// Storage requests of one variant, split by kind; table kinds count the data tables only,
/// `bookkeeping_*` the scans and work tables.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Requests {
    pub total: u64,
    pub query: u64,
    pub batch: u64,
    pub point_read: u64,
    pub table_admin: u64,
    pub bookkeeping: u64,
    pub bookkeeping_query: u64,
    pub bookkeeping_batch: u64,
    pub bookkeeping_point_read: u64,
    pub queue_put: u64,
    pub queue_get: u64,
    pub queue_delete: u64,
    pub queue_update: u64,
    pub queue_admin: u64,
}

impl Requests {
    /// Classifies the proxy's counts (delta over the run) given the bookkeeping table names.
    pub fn classify(counts: &Counts, bookkeeping_tables: &[&str]) -> Requests {
        let mut r = Requests::default();
        for ((kind, resource), &n) in counts {
            r.total += n;
            let bookkeeping = bookkeeping_tables
                .iter()
                .any(|t| t.eq_ignore_ascii_case(resource));
            let slot = match (kind.as_str(), bookkeeping) {
                ("query", false) => &mut r.query,
                ("batch", false) => &mut r.batch,
                ("point_read", false) => &mut r.point_read,
                ("query", true) => &mut r.bookkeeping_query,
                ("batch", true) => &mut r.bookkeeping_batch,
                ("point_read", true) => &mut r.bookkeeping_point_read,
                ("queue_put", _) => &mut r.queue_put,
                ("queue_get", _) => &mut r.queue_get,
                ("queue_delete", _) => &mut r.queue_delete,
                ("queue_update", _) => &mut r.queue_update,
                ("queue_admin", _) => &mut r.queue_admin,
                // Table create/delete: the destination and, at handler start, bookkeeping tables.
                _ => &mut r.table_admin,
            };
            *slot += n;
        }
        r.bookkeeping = r.bookkeeping_query + r.bookkeeping_batch + r.bookkeeping_point_read;
        r
    }

    /// Requests the handler itself makes (everything but the host's queue receives, deletes,
    /// visibility updates and queue creation).
    pub fn handler_made(&self) -> u64 {
        self.data() + self.table_admin + self.bookkeeping + self.queue_put
    }

    /// Reads and writes of the source and destination tables.
    pub fn data(&self) -> u64 {
        self.query + self.batch + self.point_read
    }

    fn per_1000(&self, rows: u64) -> BTreeMap<&'static str, f64> {
        let f = |n: u64| per_1000(n, rows);
        BTreeMap::from([
            ("total", f(self.total)),
            ("data", f(self.data())),
            ("query", f(self.query)),
            ("batch", f(self.batch)),
            ("point_read", f(self.point_read)),
            ("table_admin", f(self.table_admin)),
            ("bookkeeping", f(self.bookkeeping)),
            ("bookkeeping_query", f(self.bookkeeping_query)),
            ("bookkeeping_batch", f(self.bookkeeping_batch)),
            ("bookkeeping_point_read", f(self.bookkeeping_point_read)),
            ("queue_put", f(self.queue_put)),
            ("queue_get", f(self.queue_get)),
            ("queue_delete", f(self.queue_delete)),
            ("queue_update", f(self.queue_update)),
            ("queue_admin", f(self.queue_admin)),
        ])
    }
}

fn per_1000(n: u64, rows: u64) -> f64 {
    n as f64 * 1000.0 / rows.max(1) as f64
}

fn delta(after: &Counts, before: &Counts) -> Counts {
    after
        .iter()
        .map(|(k, n)| (k.clone(), n - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// CPU time and peak memory of the handler processes, from their own accounting in `/proc`.
/// Handlers can restart, so every PID ever seen is kept with its latest reading.
#[derive(Debug, Default)]
struct HandlerSampler {
    /// PID → (CPU nanoseconds when first seen during the scan, latest CPU nanoseconds).
    cpu: BTreeMap<u32, (u64, u64)>,
    peak_rss: u64,
    available: bool,
}

/// `/proc/<pid>/stat` reports CPU time in USER_HZ ticks, which Linux fixes at 100 per second
/// for user space on every architecture.
const TICKS_PER_SECOND: u64 = 100;

/// CPU time of a process in nanoseconds. Prefers the scheduler's per-thread accounting
/// (`/proc/<pid>/task/*/schedstat`, nanosecond resolution): `/proc/<pid>/stat` counts in 10 ms
/// ticks, too coarse for a small scan, which could then appear to use no CPU at all. The handler's
/// runtime threads live as long as the process, so summing its live threads is complete enough.
fn cpu_nanos(pid: u32) -> Option<u64> {
    let from_schedstat = || -> Option<u64> {
        let mut total = 0u64;
        for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
            let text = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
            total += text.split_whitespace().next()?.parse::<u64>().ok()?;
        }
        Some(total)
    };
    from_schedstat().or_else(|| cpu_ticks(pid).map(|t| t * (1_000_000_000 / TICKS_PER_SECOND)))
}

fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces; fields are counted after its closing parenthesis.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, i.e. 12th and 13th after the name.
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

fn peak_rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

impl HandlerSampler {
    fn sample(&mut self, host: &RunningHost) {
        for pid in host.handler_pids().into_iter().flatten() {
            if let Some(nanos) = cpu_nanos(pid) {
                self.available = true;
                let entry = self.cpu.entry(pid).or_insert((nanos, nanos));
                entry.1 = entry.1.max(nanos);
            }
            if let Some(rss) = peak_rss_bytes(pid) {
                self.peak_rss = self.peak_rss.max(rss);
            }
        }
    }

    /// CPU milliseconds used since each process was first sampled. The first sample is taken
    /// just before the scan starts, so handler start-up is excluded; a handler started during the
    /// scan counts from its first sample.
    fn cpu_ms(&self) -> Option<f64> {
        self.available
            .then(|| self.cpu.values().map(|(a, b)| b - a).sum::<u64>() as f64 / 1_000_000.0)
    }
}

/// One variant's measured figures.
#[derive(Debug, Clone, Serialize)]
pub struct VariantResult {
    pub name: &'static str,
    pub wall_seconds: f64,
    pub rows_per_second: f64,
    /// All storage requests (handler and host, data, bookkeeping and queues) per 1,000 rows.
    pub requests_per_1000_rows: f64,
    pub requests_per_1000_rows_by_kind: BTreeMap<&'static str, f64>,
    pub minimum_requests_per_1000_rows: f64,
    /// Total requests ÷ minimum.
    pub ratio_to_minimum: f64,
    /// Data-table requests (source queries, destination batches, point reads) ÷ minimum.
    pub data_ratio_to_minimum: f64,
    /// Messages put on the queues per 1,000 rows.
    pub queue_messages_per_1000_rows: f64,
    /// Queue-triggered invocations the host made (its own count, retries and duplicates included).
    pub invocations: u64,
    pub invocations_by_function: BTreeMap<String, u64>,
    /// Work items committed (`messagesProcessed` in the scan status).
    pub messages_processed: i64,
    pub max_invocation_seconds: f64,
    pub handler_cpu_ms_per_1000_rows: Option<f64>,
    /// Handler CPU ÷ the storage requests the handler made: what one request costs it, which
    /// bounds the CPU per 1,000 rows from below at (requests per 1,000 rows) × this.
    pub handler_cpu_us_per_request: Option<f64>,
    pub handler_peak_rss_bytes: Option<u64>,
    pub rows: u64,
    pub requests: Requests,
    /// Copies: destination row count and checksum equal the source's; counts: the counted rows
    /// equal the source's row count. Figures are only reported for verified variants.
    pub verified: bool,
    /// (seconds since the POST, rows copied or counted) as sampled while running.
    pub progress: Vec<(f64, u64)>,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub rows: u64,
    pub seed: u64,
    pub rows_per_key: f64,
    pub partition_keys: u64,
    pub instances: usize,
    pub minimum: Minimum,
    pub source_checksum: String,
    pub variants: Vec<VariantResult>,
}

/// Runs the benchmark, prints the table, and writes `--out` and `--svg` when given.
pub async fn run_bench(args: BenchArgs) -> Result<(), String> {
    let report = measure(&args).await?;
    println!("{}", render_table(&report));
    println!("{AZURITE_NOTE}");
    if let Some(path) = &args.out {
        let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &args.svg {
        std::fs::write(path, render_svg(&report))
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

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

/// The human-readable tables and the goals the issue sets.
pub fn render_table(report: &BenchReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let m = &report.minimum;
    let _ = writeln!(
        s,
        "\n{} rows, {} partition keys ({:.2} rows/key), seed {}, {} instance(s). Minimum: {} reads + {} batches \
         = {:.1} requests per 1,000 rows to copy, {:.1} to count.",
        report.rows,
        m.partition_keys,
        report.rows as f64 / m.partition_keys.max(1) as f64,
        report.seed,
        report.instances,
        m.reads,
        m.batches,
        per_1000(m.requests(true), report.rows),
        per_1000(m.requests(false), report.rows),
    );
    let _ = writeln!(
        s,
        "\n{:<15} {:>8} {:>8} {:>9} {:>8} {:>7} {:>6} {:>8} {:>7} {:>8} {:>9} {:>7} {:>8}",
        "variant",
        "wall s",
        "rows/s",
        "req/1k",
        "min/1k",
        "ratio",
        "data",
        "msgs/1k",
        "invoc",
        "max inv",
        "cpu ms/1k",
        "RSS MiB",
        "verified"
    );
    for v in &report.variants {
        let _ = writeln!(
            s,
            "{:<15} {:>8.1} {:>8.0} {:>9.1} {:>8.1} {:>7.3} {:>6.3} {:>8.1} {:>7} {:>7.2}s {:>9} {:>7} {:>8}",
            v.name,
            v.wall_seconds,
            v.rows_per_second,
            v.requests_per_1000_rows,
            v.minimum_requests_per_1000_rows,
            v.ratio_to_minimum,
            v.data_ratio_to_minimum,
            v.queue_messages_per_1000_rows,
            v.invocations,
            v.max_invocation_seconds,
            v.handler_cpu_ms_per_1000_rows
                .map(|c| format!("{c:.1}"))
                .unwrap_or_else(|| "n/a".into()),
            v.handler_peak_rss_bytes
                .map(|b| format!("{:.1}", b as f64 / 1048576.0))
                .unwrap_or_else(|| "n/a".into()),
            if v.verified { "yes" } else { "NO" }
        );
    }
    let _ = writeln!(
        s,
        "\nStorage requests per 1,000 rows by kind (query/batch/point = source and destination tables; \
         bk = bookkeeping: scans and work tables):"
    );
    let cols = [
        ("query", "query"),
        ("batch", "batch"),
        ("point_read", "point"),
        ("table_admin", "t.admin"),
        ("bookkeeping_point_read", "bk point"),
        ("bookkeeping_batch", "bk batch"),
        ("bookkeeping_query", "bk query"),
        ("queue_put", "q put"),
        ("queue_get", "q get"),
        ("queue_delete", "q del"),
        ("queue_update", "q upd"),
        ("queue_admin", "q admin"),
    ];
    let _ = write!(s, "{:<15}", "variant");
    for (_, label) in cols {
        let _ = write!(s, " {label:>8}");
    }
    let _ = writeln!(s);
    for v in &report.variants {
        let _ = write!(s, "{:<15}", v.name);
        for (key, _) in cols {
            let _ = write!(s, " {:>8.2}", v.requests_per_1000_rows_by_kind[key]);
        }
        let _ = writeln!(s);
    }
    let _ = writeln!(
        s,
        "\nratio = all requests (handler and host: data, bookkeeping, queues) / minimum; data = source \
         and destination requests only / minimum. invoc = queue-triggered invocations counted by the \
         host; max inv = longest single one. CPU and RSS are the handler processes' own accounting."
    );
    s.push_str(&goals(report));
    s
}

/// The issue's goals, judged on the measured figures.
fn goals(report: &BenchReport) -> String {
    use std::fmt::Write;
    let mut s = String::from("\nGoals:\n");
    let find = |name: &str| report.variants.iter().find(|v| v.name == name);
    let mark = |ok: bool| if ok { "met   " } else { "MISSED" };
    if let Some(p) = find("prefix-copy") {
        let _ = writeln!(
            s,
            "  {} prefix-copy total requests ≤ 1.15 × minimum: {:.3} × (data tables alone: {:.3} ×)",
            mark(p.ratio_to_minimum <= 1.15),
            p.ratio_to_minimum,
            p.data_ratio_to_minimum
        );
        if let Some(r) = find("reference-copy") {
            let _ = writeln!(
                s,
                "  {} prefix-copy fewer requests than reference-copy: {:.1} vs {:.1} per 1,000 rows",
                mark(p.requests_per_1000_rows < r.requests_per_1000_rows),
                p.requests_per_1000_rows,
                r.requests_per_1000_rows
            );
        }
    }
    for v in report.variants.iter().filter(|v| v.name.ends_with("-copy")) {
        if let Some(cpu) = v.handler_cpu_ms_per_1000_rows {
            let _ = writeln!(
                s,
                "  {} {} handler CPU ≤ 5 ms per 1,000 rows: {cpu:.2} ms ({:.0} µs per request × {:.1} handler requests per 1,000 rows)",
                mark(cpu <= 5.0),
                v.name,
                v.handler_cpu_us_per_request.unwrap_or(f64::NAN),
                per_1000(v.requests.handler_made(), v.rows)
            );
        }
    }
    for v in &report.variants {
        if let Some(rss) = v.handler_peak_rss_bytes {
            let _ = writeln!(
                s,
                "  {} {} handler peak RSS ≤ 64 MiB: {:.1} MiB",
                mark(rss <= 64 * 1024 * 1024),
                v.name,
                rss as f64 / 1048576.0
            );
        }
    }
    let all = report.variants.iter().all(|v| v.verified);
    let _ = writeln!(
        s,
        "  {} every variant verified against the source ({} rows, checksum {})",
        mark(all),
        report.rows,
        report.source_checksum
    );
    s
}

/// A line chart of rows copied (solid) or counted (dashed) over time, one line per variant.
pub fn render_svg(report: &BenchReport) -> String {
    use std::fmt::Write;
    const COLORS: [&str; 5] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"];
    let (w, h) = (860.0, 480.0);
    let (left, right, top, bottom) = (80.0, 200.0, 40.0, 50.0);
    let (pw, ph) = (w - left - right, h - top - bottom);
    let max_t = report
        .variants
        .iter()
        .flat_map(|v| v.progress.iter().map(|p| p.0))
        .fold(1.0f64, f64::max);
    let max_rows = report.rows.max(1) as f64;
    let x = |t: f64| left + t / max_t * pw;
    let y = |r: f64| top + ph - r / max_rows * ph;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{left}" y="22" font-size="15">Rows copied (solid) or counted (dashed) over time — {} rows, {} instance(s)</text>"#,
        report.rows, report.instances
    );
    for i in 0..=5 {
        let f = i as f64 / 5.0;
        let (gx, gy) = (x(f * max_t), y(f * max_rows));
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{gy:.1}" x2="{:.1}" y2="{gy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{:.0}</text>"##,
            left + pw,
            left - 6.0,
            gy + 4.0,
            f * max_rows
        );
        let _ = writeln!(
            s,
            r##"<line x1="{gx:.1}" y1="{top}" x2="{gx:.1}" y2="{:.1}" stroke="#eee"/><text x="{gx:.1}" y="{:.1}" text-anchor="middle">{:.0}</text>"##,
            top + ph,
            top + ph + 16.0,
            f * max_t
        );
    }
    let _ = writeln!(
        s,
        r##"<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#444"/><text x="{:.1}" y="{:.1}" text-anchor="middle">seconds since POST /api/scans</text>"##,
        left + pw / 2.0,
        h - 10.0
    );
    for (i, v) in report.variants.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let points: Vec<String> = v
            .progress
            .iter()
            .map(|(t, r)| format!("{:.1},{:.1}", x(*t), y(*r as f64)))
            .collect();
        let dash = if v.name.ends_with("-count") {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        };
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="{}"/>"#,
            points.join(" ")
        );
        let ly = top + 10.0 + i as f64 * 20.0;
        let lx = left + pw + 15.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{ly}" x2="{:.1}" y2="{ly}" stroke="{color}" stroke-width="2"{dash}/><text x="{:.1}" y="{:.1}">{} ({:.0} s)</text>"#,
            lx + 25.0,
            lx + 30.0,
            ly + 4.0,
            v.name,
            v.wall_seconds
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimum_counts_reads_and_batches_per_partition() {
        let m = Minimum::of([1, 100, 101, 250]);
        assert_eq!(
            (m.reads, m.batches, m.partition_keys),
            (1, 1 + 1 + 2 + 3, 4)
        );
        assert_eq!(Minimum::of(std::iter::repeat(3).take(1000)).reads, 3);
        assert_eq!(m.requests(true), 8);
        assert_eq!(m.requests(false), 1);
    }

    #[test]
    fn requests_split_data_bookkeeping_and_queues() {
        let counts: Counts = [
            (("query", "Src"), 3),
            (("batch", "Dst"), 10),
            (("point_read", "Work"), 4),
            (("batch", "work"), 2),
            (("query", "Scans"), 1),
            (("table_admin", ""), 2),
            (("queue_get", "q-ps"), 7),
            (("queue_put", "q-tc"), 5),
        ]
        .into_iter()
        .map(|((k, r), n)| ((k.to_string(), r.to_string()), n))
        .collect();
        let r = Requests::classify(&counts, &["Scans", "Work"]);
        assert_eq!((r.query, r.batch, r.point_read, r.data()), (3, 10, 0, 13));
        assert_eq!(
            (r.bookkeeping, r.bookkeeping_point_read, r.bookkeeping_batch),
            (7, 4, 2)
        );
        assert_eq!(
            (r.queue_get, r.queue_put, r.table_admin, r.total),
            (7, 5, 2, 34)
        );
        assert_eq!(r.per_1000(2000)["total"], 17.0);
    }

    #[test]
    fn variants_post_the_right_requests() {
        let r = Variant::ReferenceCopy.request("S", "D");
        assert_eq!(r["workSplit"], "partitionKey");
        assert_eq!(r["strategy"], "prefix");
        let c = Variant::SerialCount.request("S", "D");
        assert_eq!(
            (c["driver"].as_str(), c.get("destinationTable")),
            (Some("count"), None)
        );
        let names: Vec<_> = Variant::ALL.iter().map(|v| v.name()).collect();
        for v in Variant::ALL {
            assert_eq!(
                v.to_possible_value().unwrap().get_name(),
                v.name(),
                "CLI and JSON names agree"
            );
        }
        assert_eq!(names.len(), 5);
    }

    #[test]
    fn reads_own_process_accounting() {
        let pid = std::process::id();
        assert!(cpu_ticks(pid).is_some());
        assert!(peak_rss_bytes(pid).unwrap() > 1024 * 1024);
    }

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
