//! `tablescan simulate`: a deterministic discrete-event simulation, in virtual time, of a table
//! copy on an Azure Functions Consumption plan, driving tablescan's real router, scan engine,
//! work splitting and bookkeeping against in-memory stores wrapped in a cloud model.
//!
//! Virtual time is tokio's paused clock on a current-thread runtime: every `sleep` (latency,
//! CPU, polling, backoff) advances time only when nothing else can run, so hours of simulated
//! cloud run in seconds and the same seed gives the same result. Every figure it produces is
//! simulated, not measured.

pub mod blog;
pub mod chart;
pub mod cloud;
pub mod data;
pub mod host;
pub mod model;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use serde::Serialize;
use serde_json::json;
use tokio::time::{sleep, Instant};
use tower::ServiceExt;

use crate::app::config::Config;
use crate::app::server::app;
use crate::app::state::AppState;
use crate::app::tracking::{seed_backoff_jitter, ScanState};
use crate::scan::{Scanner, StepBudget, Strategy};
use crate::storage::memory::MemoryTableStore;
use crate::storage::memory_queue::MemoryQueueStore;
use crate::storage::QueueStore;

use cloud::{Account, CloudQueues, CloudTables, Retry};
use data::{nuget_like, Sink, SyntheticStore};
use host::{Host, ScanMode};
use model::{prices, Model};

/// The published runs' table sizes.
pub const BLOG_ROWS: [u64; 3] = [3_558_594, 7_000_000, 35_000_000];

/// Which design copies the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Variant {
    /// The blog's serial baseline: one long execution pages the table and enqueues copy work.
    Serial,
    /// The reference (blog) prefix scan: per-partition-key copy messages, whole prefix loops and
    /// whole partitions per step.
    ReferencePrefix,
    /// tablescan's own design (defaults: one copy item per page, bounded steps).
    Prefix,
}

impl Variant {
    pub fn name(self) -> &'static str {
        match self {
            Variant::Serial => "serial",
            Variant::ReferencePrefix => "reference-prefix",
            Variant::Prefix => "prefix",
        }
    }
}

/// `tablescan simulate` options.
#[derive(Debug, Clone, clap::Args)]
pub struct SimulateArgs {
    /// Where to write the JSON results.
    #[arg(long)]
    pub out: PathBuf,
    /// The rows-over-time and instances-over-time chart (default: `--out` with `.svg`).
    #[arg(long)]
    pub chart: Option<PathBuf>,
    /// Table sizes to simulate (comma-separated). Default: the blog's five rows plus tablescan's
    /// design at 3.5M, 7M and 35M rows.
    #[arg(long, value_delimiter = ',')]
    pub rows: Vec<u64>,
    /// Variants to simulate (comma-separated): serial, reference-prefix, prefix.
    #[arg(long, value_delimiter = ',')]
    pub variant: Vec<Variant>,
    /// Seed for the data and every random choice of the model.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Stop a scenario that has not finished after this many simulated minutes.
    #[arg(long, default_value_t = 60.0)]
    pub horizon_minutes: f64,
    /// tablescan design (`prefix` variant): copy work split, `page` or `partition-key`.
    #[arg(long, value_enum, default_value_t = SplitArg::Page)]
    pub work_split: SplitArg,
    /// tablescan design: page size (takeCount).
    #[arg(long, default_value_t = 1000)]
    pub take: u32,
    /// tablescan design: segmentsPerFirstPrefix.
    #[arg(long, default_value_t = 1)]
    pub segments_first: u32,
    /// tablescan design: segmentsPerSubsequentPrefix.
    #[arg(long, default_value_t = 1)]
    pub segments_subsequent: u32,
    /// tablescan design: pages one partition-key step reads before continuing in a new message.
    #[arg(long)]
    pub budget_pages: Option<usize>,
    /// tablescan design: queries one prefix step sends before continuing in a new message.
    #[arg(long)]
    pub budget_queries: Option<usize>,
    /// tablescan design: counter shards (TABLESCAN_COUNTER_SHARDS).
    #[arg(long, default_value_t = 16)]
    pub counter_shards: u32,
    /// tablescan design: batches in flight per copy (TABLESCAN_COPY_CONCURRENCY).
    #[arg(long, default_value_t = 8)]
    pub copy_concurrency: usize,
    /// tablescan design: host.json `extensions.queues.batchSize` (the blog rows keep 16).
    #[arg(long)]
    pub batch_size: Option<u8>,
    /// tablescan design: host.json `newBatchThreshold` (the blog rows keep 8).
    #[arg(long)]
    pub new_batch_threshold: Option<usize>,
    /// Model override: CPU per row read or written, ms (a slower runtime costs more).
    #[arg(long)]
    pub cpu_per_row_ms: Option<f64>,
    /// Model override: CPU per execution, ms.
    #[arg(long)]
    pub cpu_per_execution_ms: Option<f64>,
    /// Model override: storage account request rate cap (requests/s).
    #[arg(long)]
    pub account_requests_per_sec: Option<f64>,
    /// Model override: per-queue message rate cap (messages/s).
    #[arg(long)]
    pub queue_messages_per_sec: Option<f64>,
    /// Model override: maximum instances.
    #[arg(long)]
    pub max_instances: Option<usize>,
    /// Model override: mean rows per partition key of the generated table.
    #[arg(long)]
    pub mean_rows_per_key: Option<f64>,
    /// Scenarios simulated at once, each on its own OS thread with its own virtual-time runtime
    /// (results do not depend on it). Default: the machine's available parallelism.
    #[arg(long)]
    pub jobs: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum SplitArg {
    Page,
    PartitionKey,
}

/// The tablescan settings a scenario runs with.
#[derive(Debug, Clone, Serialize)]
pub struct Design {
    /// Which function app runs: `blog` (one queue, untracked copies; serial and
    /// reference-prefix) or `tablescan` (its real handlers and bookkeeping).
    pub app: &'static str,
    pub strategy: &'static str,
    pub work_split: SplitArg,
    pub take: u32,
    pub segments_first: u32,
    pub segments_subsequent: u32,
    pub budget_pages: usize,
    pub budget_queries: usize,
    pub counter_shards: u32,
    pub copy_concurrency: usize,
    /// host.json `extensions.queues.batchSize` / `newBatchThreshold` of the function app.
    pub batch_size: u8,
    pub new_batch_threshold: usize,
}

/// One scenario to run.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub rows: u64,
    pub variant: Variant,
    pub design: Design,
}

impl Scenario {
    /// The design each variant uses; only `prefix` takes the command line's design options.
    pub fn new(rows: u64, variant: Variant, args: &SimulateArgs) -> Self {
        let reference = Design {
            app: "blog",
            strategy: "prefix",
            work_split: SplitArg::PartitionKey,
            take: 1000,
            segments_first: 1,
            segments_subsequent: 1,
            // The reference runs a whole prefix loop, and a whole partition, in one execution.
            budget_pages: usize::MAX,
            budget_queries: usize::MAX,
            counter_shards: args.counter_shards,
            copy_concurrency: args.copy_concurrency,
            // The blog's host.json kept the queue defaults.
            batch_size: Model::default().batch_size,
            new_batch_threshold: Model::default().new_batch_threshold,
        };
        let design = match variant {
            Variant::Serial => Design {
                strategy: "serial",
                ..reference
            },
            Variant::ReferencePrefix => reference,
            Variant::Prefix => {
                let default = StepBudget::default();
                Design {
                    app: "tablescan",
                    strategy: "prefix",
                    work_split: args.work_split,
                    take: args.take,
                    segments_first: args.segments_first,
                    segments_subsequent: args.segments_subsequent,
                    budget_pages: args.budget_pages.unwrap_or(default.max_pages),
                    budget_queries: args.budget_queries.unwrap_or(default.max_queries),
                    counter_shards: args.counter_shards,
                    copy_concurrency: args.copy_concurrency,
                    batch_size: args.batch_size.unwrap_or(reference.batch_size),
                    new_batch_threshold: args
                        .new_batch_threshold
                        .unwrap_or(reference.new_batch_threshold),
                }
            }
        };
        Scenario {
            rows,
            variant,
            design,
        }
    }
}

/// One scenario's simulated results (the JSON contract's fields first).
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioResult {
    pub rows: u64,
    pub variant: &'static str,
    pub completed: bool,
    /// Simulated seconds to completion; when not completed, how long was simulated.
    pub duration_seconds: f64,
    pub max_executions_per_30s: u64,
    pub max_execution_seconds: f64,
    pub max_instances: usize,
    pub storage_requests_per_1000_rows: f64,
    pub queue_messages_per_1000_rows: f64,
    pub estimated_cost_usd: f64,
    /// Always true: every figure here comes from the model, not from Azure.
    pub simulated: bool,
    pub seed: u64,
    pub partition_keys: usize,
    pub rows_copied: u64,
    /// Every source row reached the destination and nothing else did.
    pub copy_verified: bool,
    pub executions: u64,
    pub timed_out_executions: u64,
    pub throttled_requests: u64,
    pub throttled_by: BTreeMap<String, u64>,
    pub instance_busy_seconds: f64,
    pub design: Design,
    /// (simulated seconds, instances).
    pub instances_over_time: Vec<(f64, usize)>,
    /// (simulated seconds, distinct rows in the destination).
    pub rows_over_time: Vec<(f64, u64)>,
    /// Real (wall-clock) seconds the simulation took.
    pub wall_seconds: f64,
}

/// Runs `tablescan simulate`.
pub fn run_simulate(args: SimulateArgs) -> Result<(), String> {
    let model = model_from(&args);
    let scenarios = scenarios(&args);
    let jobs = args.jobs.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let results = run_scenarios(&scenarios, &model, args.seed, args.horizon_minutes, jobs)?;
    let out = json!({
        "simulated": true,
        "note": "Every figure is simulated by tablescan's cloud model (docs/simulator.md), not measured on Azure.",
        "model": model,
        "scenarios": results,
    });
    let text = serde_json::to_string_pretty(&out).map_err(|e| e.to_string())?;
    std::fs::write(&args.out, text).map_err(|e| format!("{}: {e}", args.out.display()))?;
    let chart_path = args
        .chart
        .clone()
        .unwrap_or_else(|| args.out.with_extension("svg"));
    std::fs::write(&chart_path, chart::render(&results))
        .map_err(|e| format!("{}: {e}", chart_path.display()))?;
    Ok(())
}

/// Runs scenarios on up to `jobs` OS threads, biggest tables first; results in input order.
///
/// Each scenario runs on one thread from start to end, in its own current-thread runtime with
/// its own stores, model state and (thread-local) bookkeeping jitter, so its result does not
/// depend on what runs beside it.
pub fn run_scenarios(
    scenarios: &[Scenario],
    model: &Model,
    seed: u64,
    horizon_minutes: f64,
    jobs: usize,
) -> Result<Vec<ScenarioResult>, String> {
    // Longest first, so the big scenarios do not start last and run alone.
    let mut order: Vec<usize> = (0..scenarios.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(scenarios[i].rows));
    let next = AtomicUsize::new(0);
    let slots: Vec<Mutex<Option<Result<ScenarioResult, String>>>> =
        scenarios.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..jobs.clamp(1, scenarios.len().max(1)) {
            scope.spawn(|| loop {
                let Some(&i) = order.get(next.fetch_add(1, Ordering::Relaxed)) else {
                    return;
                };
                let s = &scenarios[i];
                eprintln!(
                    "simulating {} rows, variant {} ...",
                    s.rows,
                    s.variant.name()
                );
                let r = run_scenario(s, model, seed, horizon_minutes);
                match &r {
                    Ok(r) => eprintln!(
                        "  simulated {} rows, {}: completed {} in {:.0} s, max {} executions/30 s, max execution {:.1} s, {} instances, ${:.2} (wall {:.0} s)",
                        r.rows, r.variant, r.completed, r.duration_seconds, r.max_executions_per_30s,
                        r.max_execution_seconds, r.max_instances, r.estimated_cost_usd, r.wall_seconds
                    ),
                    Err(e) => eprintln!("  {} rows, {}: {e}", s.rows, s.variant.name()),
                }
                *slots[i].lock().unwrap() = Some(r);
            });
        }
    });
    slots
        .into_iter()
        .map(|s| s.into_inner().unwrap().expect("every scenario ran"))
        .collect()
}

/// The model with the command line's overrides.
pub fn model_from(args: &SimulateArgs) -> Model {
    let mut m = Model::default();
    if let Some(v) = args.cpu_per_row_ms {
        m.cpu_per_row_ms = v;
    }
    if let Some(v) = args.cpu_per_execution_ms {
        m.cpu_per_execution_ms = v;
    }
    if let Some(v) = args.account_requests_per_sec {
        m.account_requests_per_sec = v;
    }
    if let Some(v) = args.queue_messages_per_sec {
        m.queue_messages_per_sec = v;
    }
    if let Some(v) = args.max_instances {
        m.max_instances = v;
    }
    if let Some(v) = args.mean_rows_per_key {
        m.mean_rows_per_key = v;
    }
    m
}

/// The scenarios the arguments ask for.
pub fn scenarios(args: &SimulateArgs) -> Vec<Scenario> {
    if args.rows.is_empty() && args.variant.is_empty() {
        let mut out = vec![
            Scenario::new(BLOG_ROWS[0], Variant::Serial, args),
            Scenario::new(BLOG_ROWS[0], Variant::ReferencePrefix, args),
            Scenario::new(BLOG_ROWS[1], Variant::Serial, args),
            Scenario::new(BLOG_ROWS[1], Variant::ReferencePrefix, args),
            Scenario::new(BLOG_ROWS[2], Variant::ReferencePrefix, args),
        ];
        out.extend(
            BLOG_ROWS
                .iter()
                .map(|&r| Scenario::new(r, Variant::Prefix, args)),
        );
        return out;
    }
    let rows = if args.rows.is_empty() {
        BLOG_ROWS.to_vec()
    } else {
        args.rows.clone()
    };
    let variants = if args.variant.is_empty() {
        vec![Variant::Serial, Variant::ReferencePrefix, Variant::Prefix]
    } else {
        args.variant.clone()
    };
    rows.iter()
        .flat_map(|&r| variants.iter().map(move |&v| (r, v)))
        .map(|(r, v)| Scenario::new(r, v, args))
        .collect()
}

/// Runs one scenario in its own virtual-time runtime.
pub fn run_scenario(
    scenario: &Scenario,
    model: &Model,
    seed: u64,
    horizon_minutes: f64,
) -> Result<ScenarioResult, String> {
    let wall = std::time::Instant::now();
    let source = Arc::new(nuget_like(scenario.rows, model.mean_rows_per_key, seed));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map_err(|e| e.to_string())?;
    // host.json belongs to the design under test, not to the cloud model.
    let mut model = model.clone();
    model.batch_size = scenario.design.batch_size;
    model.new_batch_threshold = scenario.design.new_batch_threshold;
    model.target_messages_per_instance =
        (model.batch_size as usize + model.new_batch_threshold) as f64;
    let mut result = runtime.block_on(simulate(
        scenario,
        Arc::new(model),
        seed,
        source,
        horizon_minutes,
    ))?;
    result.wall_seconds = wall.elapsed().as_secs_f64();
    Ok(result)
}

/// Starts tablescan's scan through its real HTTP API; returns the scan id.
async fn start_scan(router: &axum::Router, d: &Design) -> Result<String, String> {
    let body = json!({
        "driver": "copy", "sourceTable": "Source", "destinationTable": "Dest",
        "strategy": d.strategy, "takeCount": d.take,
        "workSplit": match d.work_split { SplitArg::Page => "page", SplitArg::PartitionKey => "partitionKey" },
        "segmentsPerFirstPrefix": d.segments_first, "segmentsPerSubsequentPrefix": d.segments_subsequent,
    });
    let response = router
        .clone()
        .oneshot(
            Request::builder()
                .method("POST")
                .uri("/api/scans")
                .header("content-type", "application/json")
                .body(Body::from(body.to_string()))
                .expect("valid request"),
        )
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    let reply: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("starting the scan failed: {status} {reply}"));
    }
    Ok(reply["id"].as_str().ok_or("no scan id")?.to_string())
}

async fn simulate(
    scenario: &Scenario,
    model: Arc<Model>,
    seed: u64,
    source: Arc<data::SyntheticTable>,
    horizon_minutes: f64,
) -> Result<ScenarioResult, String> {
    seed_backoff_jitter(seed);
    let epoch = Instant::now();
    let retry = if scenario.variant == Variant::Prefix {
        Retry::Tablescan
    } else {
        Retry::BlogSdk
    };
    let account = Account::new(model.clone(), seed, retry);
    let sink = Arc::new(Sink::new(source.clone()));
    let memory = MemoryTableStore::default();
    let tables = CloudTables {
        memory: memory.clone(),
        synthetic: SyntheticStore {
            source_table: "Source".into(),
            destination_table: "Dest".into(),
            source: source.clone(),
            sink: sink.clone(),
        },
        account: account.clone(),
    };
    let queues = CloudQueues {
        inner: MemoryQueueStore::without_yields(),
        account: account.clone(),
        messages_put: Arc::new(AtomicU64::new(0)),
    };
    let state = app_state(&scenario.design, &model, tables.clone(), queues.clone())?;
    let router = app(state.clone());
    let blog = (scenario.variant != Variant::Prefix).then(|| {
        Arc::new(blog::Blog::new(
            tables.clone(),
            queues.clone(),
            scenario.design.take,
        ))
    });
    let scan_id = match &blog {
        Some(blog) => start_blog(blog, &queues, scenario.variant).await?,
        // tablescan: start the scan through the real API, as a client would.
        None => start_scan(&router, &scenario.design).await?,
    };
    let host = Arc::new(Host {
        model: model.clone(),
        state: state.clone(),
        router,
        mode: match &blog {
            Some(b) => ScanMode::Blog(b.clone()),
            None => ScanMode::Router,
        },
        epoch,
        instances: Mutex::new(Vec::new()),
        executions: Mutex::new(Vec::new()),
        instance_timeline: Mutex::new(Vec::new()),
        stopped: AtomicBool::new(false),
        running: AtomicUsize::new(0),
        timeouts: AtomicUsize::new(0),
    });
    host.add_instance();
    tokio::spawn(host.clone().scale(queues.clone()));
    let watch = Watch {
        scenario,
        host: &host,
        queues: &queues,
        sink: &sink,
        tracker: state.tracker_on(&memory),
        scan_id: blog.is_none().then_some(scan_id.as_str()),
        horizon: Duration::from_secs_f64(horizon_minutes * 60.0),
    };
    let (completed, rows_over_time) = watch.run().await?;
    host.stopped.store(true, Ordering::Relaxed);
    Ok(summarize(
        scenario,
        &model,
        seed,
        &Run {
            host: &host,
            account: &account,
            queues: &queues,
            sink: &sink,
            source: &source,
        },
        completed,
        rows_over_time,
    ))
}

/// The real app's state over the modelled storage, configured as the scenario's design says.
fn app_state(
    d: &Design,
    model: &Model,
    tables: CloudTables,
    queues: CloudQueues,
) -> Result<Arc<AppState<CloudTables, CloudQueues>>, String> {
    let settings: BTreeMap<&str, String> = [
        (
            "AzureWebJobsStorage",
            "UseDevelopmentStorage=true".to_string(),
        ),
        ("TABLESCAN_COUNTER_SHARDS", d.counter_shards.to_string()),
        ("TABLESCAN_COPY_CONCURRENCY", d.copy_concurrency.to_string()),
        (
            "TABLESCAN_MAX_DEQUEUE_COUNT",
            model.max_dequeue_count.to_string(),
        ),
    ]
    .into_iter()
    .collect();
    let mut config =
        Config::from_lookup(|k| settings.get(k).cloned()).map_err(|e| e.to_string())?;
    config.step_budget = StepBudget {
        max_pages: d.budget_pages,
        max_queries: d.budget_queries,
    };
    Ok(AppState::new(
        config,
        [("AzureWebJobsStorage".to_string(), tables)]
            .into_iter()
            .collect(),
        queues,
    ))
}

/// The blog's app: one worker queue and one start message; nothing is tracked.
async fn start_blog(
    blog: &blog::Blog,
    queues: &CloudQueues,
    variant: Variant,
) -> Result<String, String> {
    queues
        .create_queue(&blog.queue)
        .await
        .map_err(|e| e.to_string())?;
    let root = match variant {
        Variant::Serial => Scanner::<CloudTables>::root(Strategy::Serial),
        _ => Scanner::<CloudTables>::root(Strategy::Prefix),
    };
    queues
        .put_message(
            &blog.queue,
            &blog::BlogMessage::Scan(root).encode(),
            Duration::ZERO,
        )
        .await
        .map_err(|e| e.to_string())?;
    Ok(String::new())
}

/// Watches a running scenario (reading bookkeeping directly, outside the model) once a
/// simulated second, until it completes, fails, or runs past the horizon.
struct Watch<'a> {
    scenario: &'a Scenario,
    host: &'a Host,
    queues: &'a CloudQueues,
    sink: &'a Sink,
    tracker: crate::app::tracking::Tracker<'a, MemoryTableStore>,
    /// tablescan's scan; `None` for the blog's app, which tracks nothing.
    scan_id: Option<&'a str>,
    horizon: Duration,
}

impl Watch<'_> {
    /// Whether the copy completed, and rows copied over (simulated) time.
    async fn run(&self) -> Result<(bool, Vec<(f64, u64)>), String> {
        let epoch = self.host.epoch;
        let mut rows_over_time = vec![(0.0, 0)];
        let mut tick = 0u64;
        let completed = loop {
            sleep(Duration::from_secs(1)).await;
            tick += 1;
            if tick % 5 == 0 {
                rows_over_time.push((epoch.elapsed().as_secs_f64(), self.sink.unique_rows()));
            }
            if let Some(done) = self.ended().await? {
                break done;
            }
            if epoch.elapsed() >= self.horizon {
                break false;
            }
        };
        rows_over_time.push((epoch.elapsed().as_secs_f64(), self.sink.unique_rows()));
        Ok((completed, rows_over_time))
    }

    /// `Some(completed)` once the run is over.
    async fn ended(&self) -> Result<Option<bool>, String> {
        let Some(scan_id) = self.scan_id else {
            // The blog tracked nothing: the copy is over when the queue is empty and idle.
            if self.queues.inner.is_empty() && self.host.running.load(Ordering::Relaxed) == 0 {
                return Ok(Some(true));
            }
            // The serial paging restarts from its first page after a timeout, so it cannot
            // finish: stop at the first one (the blog halted it after a restart).
            let serial_timed_out = self.scenario.variant == Variant::Serial
                && self.host.timeouts.load(Ordering::Relaxed) > 0;
            return Ok(serial_timed_out.then_some(false));
        };
        let record = self
            .tracker
            .get_scan(scan_id)
            .await
            .map_err(|e| e.to_string())?;
        Ok(match record.map(|r| r.state) {
            Some(ScanState::Completed) => Some(true),
            Some(ScanState::Running) | None => None,
            Some(other) => {
                eprintln!("  scan ended {}", other.as_str());
                Some(false)
            }
        })
    }
}

/// What a finished scenario left to measure.
struct Run<'a> {
    host: &'a Host,
    account: &'a Account,
    queues: &'a CloudQueues,
    sink: &'a Sink,
    source: &'a data::SyntheticTable,
}

/// The scenario's figures (all simulated).
fn summarize(
    scenario: &Scenario,
    model: &Model,
    seed: u64,
    run: &Run<'_>,
    completed: bool,
    rows_over_time: Vec<(f64, u64)>,
) -> ScenarioResult {
    let Run {
        host,
        account,
        queues,
        sink,
        source,
    } = run;
    let duration = host.epoch.elapsed();
    let executions = host.executions.lock().unwrap().clone();
    let mut bins: BTreeMap<u64, u64> = BTreeMap::new();
    for e in &executions {
        *bins.entry(e.start.as_secs() / 30).or_default() += 1;
    }
    let max_execution = executions
        .iter()
        .map(|e| e.duration)
        .max()
        .unwrap_or_default();
    let timed_out = executions
        .iter()
        .filter(|e| e.duration.as_secs_f64() >= model.function_timeout_s)
        .count() as u64;
    let instances = host.instances.lock().unwrap().clone();
    let busy: f64 = instances.iter().map(|i| i.busy_time().as_secs_f64()).sum();
    let table_requests = account.table_counters.snapshot().table_total();
    let queue_requests = account.queue_counters.snapshot().queue_total();
    let rows = scenario.rows as f64;
    let cost = busy * model.billed_memory_gb * prices::FUNCTIONS_GB_S
        + executions.len() as f64 * prices::FUNCTIONS_EXECUTION
        + table_requests as f64 * prices::TABLE_TRANSACTION
        + queue_requests as f64 * prices::QUEUE_OPERATION;
    ScenarioResult {
        rows: scenario.rows,
        variant: scenario.variant.name(),
        completed,
        duration_seconds: duration.as_secs_f64(),
        max_executions_per_30s: bins.values().copied().max().unwrap_or(0),
        max_execution_seconds: max_execution.as_secs_f64(),
        max_instances: instances.len(),
        storage_requests_per_1000_rows: table_requests as f64 * 1000.0 / rows,
        queue_messages_per_1000_rows: queues.messages_put.load(Ordering::Relaxed) as f64 * 1000.0
            / rows,
        estimated_cost_usd: cost,
        simulated: true,
        seed,
        partition_keys: source.partitions(),
        rows_copied: sink.unique_rows(),
        copy_verified: sink.verified(),
        executions: executions.len() as u64,
        timed_out_executions: timed_out,
        throttled_requests: account.throttled.load(Ordering::Relaxed),
        throttled_by: account.throttled_by.lock().unwrap().clone(),
        instance_busy_seconds: busy,
        design: scenario.design.clone(),
        instances_over_time: host.instance_timeline.lock().unwrap().clone(),
        rows_over_time,
        wall_seconds: 0.0,
    }
}
