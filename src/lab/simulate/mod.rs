//! `tablescan simulate`: a deterministic discrete-event simulation, in virtual time, of a table
//! copy on an Azure Functions Consumption or Flex Consumption plan, driving tablescan's real
//! router, scan engine, work splitting and bookkeeping against in-memory stores wrapped in a
//! cloud model.
//!
//! Virtual time is tokio's paused clock on a current-thread runtime: every `sleep` (latency,
//! CPU, polling, backoff) advances time only when nothing else can run, so hours of simulated
//! cloud run in seconds and the same seed gives the same result. The app's time of day (a
//! phase claim's age, the completion lease, a scan's start and end) is virtual too: every
//! instance of a run shares one clock following tokio's (`Clock::following_tokio`). Every figure
//! it produces is simulated, not measured.

pub mod api;
pub mod blog;
pub mod cloud;
pub mod cloud_blob;
pub mod data;
pub mod enqueue;
pub mod host;
pub mod index;
pub mod model;
pub mod pacing;
pub mod props;
pub mod report;
pub mod scenario;
pub mod summary;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::time::{sleep, Instant};

use crate::app::config::Config;
use crate::app::server::app;
use crate::app::state::AppState;
use crate::app::tracking::{seed_backoff_jitter, ScanState};
use crate::clock::Clock;
use crate::lab::memory::MemoryQueueStore;
use crate::lab::memory::MemoryTableStore;
use crate::scan::{Scanner, StepBudget, Strategy};
use crate::storage::QueueStore;

use api::start_scan;
use cloud::{Account, CloudQueues, CloudTables, Retry};
use cloud_blob::{CloudBlobs, SimStores};
use data::{nuget_like, Sink, SyntheticStore};
use enqueue::QueueSink;
use host::{Host, ScanMode};
use model::{Model, Plan};
pub use scenario::{
    model_from, scenarios, Design, PlatformArgs, Scenario, SimulateArgs, SplitArg, Suite, Variant,
    BLOG_ROWS,
};
use summary::{summarize, Run};
pub use summary::{Floor, ScenarioResult};

/// Runs `tablescan simulate`.
pub fn run_simulate(args: SimulateArgs) -> Result<(), String> {
    let model = model_from(&args);
    let scenarios = scenarios(&args);
    let jobs = args.jobs.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let mut results = run_scenarios(&scenarios, &model, args.seed, args.horizon_minutes, jobs)?;
    pair_with_counts(&mut results);
    let out = json!({
        "simulated": true,
        "note": "Every figure is simulated by tablescan's cloud model (docs/simulator.md), not measured on Azure.",
        "model": model,
        "scenarios": results,
    });
    let text = serde_json::to_string_pretty(&out).map_err(|e| e.to_string())?;
    write(&args.out, &text)?;
    let chart_path = args
        .chart
        .clone()
        .unwrap_or_else(|| args.out.with_extension("svg"));
    write(&chart_path, &report::chart(&results))?;
    let report_path = args
        .report
        .clone()
        .unwrap_or_else(|| args.out.with_extension("md"));
    write(&report_path, &report::render(&results, &model, args.seed))?;
    Ok(())
}

/// Sets each index build's ratio to the count of the same table (same rows, plan and label).
pub fn pair_with_counts(results: &mut [ScenarioResult]) {
    let count_of = |r: &ScenarioResult, results: &[ScenarioResult]| {
        results
            .iter()
            .filter_map(|c| Some((c, c.index.as_ref()?)))
            .find(|(c, f)| {
                f.driver == "count" && (c.rows, c.plan, &c.label) == (r.rows, r.plan, &r.label)
            })
            .map(|(_, f)| f.requests.total)
    };
    for i in 0..results.len() {
        let count = count_of(&results[i], results);
        if let (Some(f), Some(count)) = (results[i].index.as_mut(), count) {
            if f.driver == "index" && count > 0 {
                f.ratio_to_count = Some(f.requests.total as f64 / count as f64);
            }
        }
    }
}

fn write(path: &std::path::Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
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
                eprintln!("simulating {} ...", s.name());
                let r = run_scenario(s, model, seed, horizon_minutes);
                match &r {
                    Ok(r) => eprintln!(
                        "  SIMULATED {}: completed {} in {:.0} s (storage floor {:.0} s, {}; this run's requests at the account target {:.0} s), {} instances, ${:.3}; {} requests, {} refused ({:.2} %), peak {}/s, settled {}/s{} (wall {:.0} s)",
                        s.name(), r.completed, r.duration_seconds, r.floor.seconds, r.floor.binding,
                        r.floor.run_requests_seconds, r.max_instances, r.estimated_cost_usd,
                        r.requests, r.throttled_requests, r.pacing.refused_fraction * 100.0,
                        r.peak_requests_per_second, r.pacing.settled_requests_per_second,
                        r.pacing.neighbour.as_ref().map_or(String::new(), |n| format!(
                            "; other workload {}/s: {} of {} refused ({:.2} %)",
                            n.requests_per_second, n.refused, n.requests, n.refused_fraction * 100.0)),
                        r.wall_seconds
                    ),
                    Err(e) => eprintln!("  {}: {e}", s.name()),
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

/// Runs one scenario in its own virtual-time runtime.
pub fn run_scenario(
    scenario: &Scenario,
    model: &Model,
    seed: u64,
    horizon_minutes: f64,
) -> Result<ScenarioResult, String> {
    let wall = std::time::Instant::now();
    if scenario.plan == Plan::Flex {
        scenario.flex.validate()?;
    }
    let mut table = nuget_like(scenario.rows, model.mean_rows_per_key, seed);
    if scenario.has_properties() {
        table = table.with_properties();
    }
    let source = Arc::new(table);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map_err(|e| e.to_string())?;
    // host.json belongs to the design under test, not to the cloud model.
    let mut model = model.clone();
    model.batch_size = scenario.design.batch_size;
    model.new_batch_threshold = scenario.design.new_batch_threshold;
    model.max_polling_ms = scenario.design.max_polling_ms;
    model.failed_visibility_ms = scenario.design.visibility_timeout_ms;
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
    let destination = (scenario.design.enqueue.is_some() && scenario.variant == Variant::Prefix)
        .then(|| Arc::new(QueueSink::new(enqueue::DESTINATION_QUEUE, sink.clone())));
    let queues = CloudQueues {
        inner: MemoryQueueStore::without_yields(),
        account: account.clone(),
        messages_put: Arc::new(AtomicU64::new(0)),
        destination: destination.clone(),
    };
    let blobs = CloudBlobs::new(account.clone());
    let stores = (tables.clone(), queues.clone(), blobs.clone());
    let clock = Clock::following_tokio();
    let state = app_state(&scenario.design, &model, stores.clone(), clock.clone())?;
    let neighbour = (scenario.design.neighbour_requests_per_second > 0).then(|| {
        pacing::Neighbour::start(
            account.clone(),
            scenario.design.neighbour_requests_per_second,
        )
    });
    // The API's handler (it serves the start request); each instance gets its own below.
    let router = app(state.clone());
    let new_handler: host::NewHandler = {
        let (design, model) = (scenario.design.clone(), model.clone());
        Box::new(move || {
            app(app_state(&design, &model, stores.clone(), clock.clone())
                .expect("the design's state was built once"))
        })
    };
    let api = router.clone();
    let blog = (scenario.variant != Variant::Prefix).then(|| {
        Arc::new(blog::Blog::new(
            tables.clone(),
            queues.clone(),
            scenario.design.take,
        ))
    });
    let (scan_id, segments) = match &blog {
        Some(blog) => (start_blog(blog, &queues, scenario.variant).await?, None),
        // tablescan: start the scan through the real API, as a client would.
        None => {
            let (id, segments) = start_scan(&router, &scenario.design).await?;
            (id, Some(segments))
        }
    };
    let mode = match &blog {
        Some(b) => ScanMode::Blog(b.clone()),
        None => ScanMode::Router,
    };
    let host = Arc::new(Host::new(
        model.clone(),
        scenario.plan,
        scenario.flex.clone(),
        state.clone(),
        new_handler,
        mode,
        epoch,
    ));
    match scenario.plan {
        // One instance is up when the run starts (it served the start request).
        Plan::Consumption => host.add_instance(),
        // Per-function scaling from zero; always-ready instances are there from the start.
        Plan::Flex => {
            for &f in host.functions() {
                for _ in 0..scenario.flex.always_ready {
                    host.add_flex_instance(f, true);
                }
            }
        }
    }
    tokio::spawn(host.clone().scale(queues.clone()));
    let watch = Watch {
        scenario,
        host: &host,
        account: &account,
        queues: &queues,
        sink: &sink,
        tracker: state.tracker_on(&memory),
        scan_id: blog.is_none().then_some(scan_id.as_str()),
        horizon: Duration::from_secs_f64(horizon_minutes * 60.0),
    };
    let watched = watch.run().await?;
    host.stopped.store(true, Ordering::Relaxed);
    if let Some(n) = &neighbour {
        n.stopped.store(true, Ordering::Relaxed);
    }
    let per_second = watched.per_second.clone();
    let watched_completed = watched.completed;
    let run = Run {
        host: &host,
        account: &account,
        queues: &queues,
        sink: &sink,
        source: &source,
        completed: watched.completed,
        rows_over_time: watched.rows_over_time,
        peak_requests_per_second: watched.peak_requests_per_second,
        destination: destination.as_deref(),
    };
    let mut result = summarize(scenario, &model, seed, run);
    let row = pacing::pace_row(&memory, &state.config.work_table, &scan_id).await;
    result.pacing = pacing::PacingFigures {
        refused_fraction: result.throttled_requests as f64 / result.requests.max(1) as f64,
        settled_requests_per_second: pacing::settled(&per_second),
        paced_rate_per_instance: row.map(|(rate, _)| rate),
        last_decrease_seconds: row.map(|(_, at)| {
            (at - crate::app::pace::now_us()) as f64 / 1e6 + epoch.elapsed().as_secs_f64()
        }),
        neighbour: neighbour.map(|n| n.figures()),
    };
    if let Some((first, subsequent)) = segments {
        // What the scan ran with (a driver may choose its own when the design left the default).
        result.design.segments_first = first;
        result.design.segments_subsequent = subsequent;
    }
    if scenario.has_properties() && watched_completed {
        // After the figures: the check's own requests are not the build's.
        let requests = index::Breakdown::of(&account);
        let design = scenario.design.index.as_ref();
        let figures = index::figures(&api, requests, &scan_id, design, &source).await?;
        let figures = figures.with_executions(&host.executions.lock().unwrap());
        result.rows_copied = figures.rows;
        result.copy_verified = figures.verified(source.total_rows());
        result.index = Some(figures);
    }
    Ok(result)
}

/// The real app's state over the modelled storage, configured as the scenario's design says,
/// on the run's virtual `clock`.
fn app_state(
    d: &Design,
    model: &Model,
    (tables, queues, blobs): (CloudTables, CloudQueues, CloudBlobs),
    clock: Clock,
) -> Result<Arc<AppState<SimStores>>, String> {
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
        max_rows: usize::MAX,
        max_row_bytes: usize::MAX,
    };
    let own = || "AzureWebJobsStorage".to_string();
    Ok(AppState::with_connections(
        config,
        [(own(), tables)].into(),
        [(own(), queues)].into(),
        [(own(), Ok(blobs))].into(),
        crate::app::drivers::registry(),
    )
    .on_clock(clock))
    .map(|state| match d.adaptive_pacing {
        true => state,
        false => state.without_adaptive_pacing(),
    })
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
    account: &'a Account,
    queues: &'a CloudQueues,
    sink: &'a Sink,
    tracker: crate::app::tracking::Tracker<'a, MemoryTableStore>,
    /// tablescan's scan; `None` for the blog's app, which tracks nothing.
    scan_id: Option<&'a str>,
    horizon: Duration,
}

/// What watching a run saw.
struct Watched {
    completed: bool,
    rows_over_time: Vec<(f64, u64)>,
    peak_requests_per_second: u64,
    /// The requests of each simulated second.
    per_second: Vec<u64>,
}

impl Watch<'_> {
    fn requests(&self) -> u64 {
        self.account.table_counters.snapshot().total()
            + self.account.queue_counters.snapshot().total()
            + self.account.blob_counters.snapshot().total()
    }

    /// Whether the copy completed, rows copied over (simulated) time, and the peak request rate.
    async fn run(&self) -> Result<Watched, String> {
        let epoch = self.host.epoch;
        let mut rows_over_time = vec![(0.0, 0)];
        let mut tick = 0u64;
        let mut last = self.requests();
        let mut peak = 0;
        let mut per_second = Vec::new();
        let completed = loop {
            sleep(Duration::from_secs(1)).await;
            let now = self.requests();
            peak = peak.max(now - last);
            per_second.push(now - last);
            last = now;
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
        Ok(Watched {
            completed,
            rows_over_time,
            peak_requests_per_second: peak,
            per_second,
        })
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
