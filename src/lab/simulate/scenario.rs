//! What to simulate: the command line, the designs (the blog's app and tablescan's, with the
//! settings tablescan ships: scan parameter defaults from `scan::params`, queue settings from the
//! shipped host.json), the hosting plan, and the suites (calibration, goals, sensitivity).

use std::path::PathBuf;

use serde::Serialize;

use crate::scan::{ScanParameters, StepBudget};

use super::model::{Flex, Model, Plan};

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

/// Named sets of scenarios.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Suite {
    /// The blog's five published runs (Consumption), the model's calibration.
    Calibration,
    /// tablescan at its defaults on Consumption and Flex, 3,558,594 and 35,000,000 rows.
    Goals,
    /// Flex at 3,558,594 rows, one unpublished or deployment parameter varied at a time.
    Sensitivity,
    /// The sensitivity rows that matter most, at 35,000,000 rows.
    Sensitivity35m,
    /// tablescan's enqueue driver on Flex at 35,000,000 rows, `rowsPerMessage` 1 and 32.
    Enqueue,
    /// An index build of `--index-property` at 35,000,000 rows on Consumption, and the count
    /// scan of the same table it is compared with.
    Index,
}

/// What tablescan's scan does with the rows (`prefix` variant only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DriverArg {
    /// Copy the table (the default).
    Copy,
    /// Put every row on a queue (docs/enqueue.md), `--rows-per-message` rows a message.
    Enqueue,
    /// Build a secondary index of `--index-property` (docs/index.md); each index scenario runs
    /// with a count scan of the same table, its comparison.
    Index,
    /// Count the rows (the index build's comparison).
    Count,
}

/// An index build's settings (docs/index.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IndexDesign {
    /// The property indexed: `Id` (a different value on every row) or `Authors` (~1,000
    /// values); see `props`.
    pub property: String,
    pub container: String,
    pub prefix: String,
    /// Values looked up after the build, each checked against the table's own data.
    pub check_values: usize,
}

/// An enqueue scan's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct EnqueueDesign {
    pub rows_per_message: u32,
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
    /// The Markdown report: goal tables with each run's storage floor, sensitivity tables
    /// (default: `--out` with `.md`).
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Named scenario sets (comma-separated): calibration, goals, sensitivity, sensitivity35m.
    /// Default, when neither --suite nor --rows nor --variant is given: calibration,goals.
    #[arg(long, value_delimiter = ',')]
    pub suite: Vec<Suite>,
    /// Table sizes to simulate (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub rows: Vec<u64>,
    /// Variants to simulate (comma-separated): serial, reference-prefix, prefix.
    #[arg(long, value_delimiter = ',')]
    pub variant: Vec<Variant>,
    /// Hosting plans for tablescan's design (comma-separated): consumption, flex. The blog's
    /// rows always run on Consumption (their calibration). Default: consumption.
    #[arg(long, value_delimiter = ',')]
    pub plan: Vec<Plan>,
    /// Seed for the data and every random choice of the model.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Stop a scenario that has not finished after this many simulated minutes.
    #[arg(long, default_value_t = 60.0)]
    pub horizon_minutes: f64,
    /// tablescan design (`prefix` variant): copy work split, `page` or `partition-key`.
    #[arg(long, value_enum, default_value_t = SplitArg::Page)]
    pub work_split: SplitArg,
    /// tablescan design: the scan's driver, `copy`, `enqueue`, `index` (with a count of the same
    /// table beside each) or `count`.
    #[arg(long, value_enum, default_value_t = DriverArg::Copy)]
    pub driver: DriverArg,
    /// tablescan design, `--driver enqueue`: the scan's `rowsPerMessage`.
    #[arg(long, default_value_t = 1)]
    pub rows_per_message: u32,
    /// `--driver index` options (boxed: the CLI's command enum stays small).
    #[command(flatten)]
    pub index: Box<IndexArgs>,
    /// tablescan design: page size (takeCount).
    #[arg(long, default_value_t = 1000)]
    pub take: u32,
    /// tablescan design: segmentsPerFirstPrefix (default: tablescan's).
    #[arg(long)]
    pub segments_first: Option<u32>,
    /// tablescan design: segmentsPerSubsequentPrefix (default: tablescan's).
    #[arg(long)]
    pub segments_subsequent: Option<u32>,
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
    /// tablescan design: host.json `extensions.queues.batchSize` (default: the shipped host.json;
    /// the blog rows keep 16).
    #[arg(long)]
    pub batch_size: Option<u8>,
    /// tablescan design: host.json `newBatchThreshold` (default: the shipped host.json; the blog
    /// rows keep 8).
    #[arg(long)]
    pub new_batch_threshold: Option<usize>,
    /// tablescan design: host.json `visibilityTimeout` in seconds, the delay before a failed
    /// message is retried (default: the shipped host.json).
    #[arg(long)]
    pub visibility_timeout: Option<f64>,
    /// The model's and the plans' settings (boxed: they are many, and the CLI's command enum
    /// stays small).
    #[command(flatten)]
    pub platform: Box<PlatformArgs>,
    /// Scenarios simulated at once, each on its own OS thread with its own virtual-time runtime
    /// (results do not depend on it). Default: the machine's available parallelism.
    #[arg(long)]
    pub jobs: Option<usize>,
}

/// `tablescan simulate --driver index` options.
#[derive(Debug, Clone, clap::Args)]
pub struct IndexArgs {
    /// tablescan design, `--driver index`: the property indexed, `Authors` (~1,000 distinct
    /// values) or `Id` (a different value on every row).
    #[arg(long, default_value = "Authors")]
    pub index_property: String,
    /// tablescan design, `--driver index`: the index's container.
    #[arg(long, default_value = "indexes")]
    pub index_container: String,
    /// tablescan design, `--driver index`: the index's prefix in its container.
    #[arg(long, default_value = "sim")]
    pub index_prefix: String,
    /// `--driver index`: values looked up after the build (through the real lookup API), each
    /// lookup's rows checked against the simulated table's data.
    #[arg(long, default_value_t = 4)]
    pub index_check_values: usize,
}

/// `tablescan simulate` options for the cloud model and the hosting plans.
#[derive(Debug, Clone, clap::Args)]
pub struct PlatformArgs {
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
    /// Maximum instances: Consumption's scale limit (default 200) and Flex's
    /// `maximumInstanceCount` (default 40, the template's; on-demand instances per function).
    #[arg(long)]
    pub max_instances: Option<usize>,
    /// Cold start of a new instance, seconds, on both plans (default 5; not published).
    #[arg(long)]
    pub cold_start: Option<f64>,
    /// Flex: instance memory in MB (512, 2048, 4096).
    #[arg(long, default_value_t = 2048)]
    pub instance_memory: u32,
    /// Flex: always-ready instances per queue function.
    #[arg(long, default_value_t = 0)]
    pub always_ready: usize,
    /// Flex: seconds between target-based scale decisions (not published; default 10).
    #[arg(long)]
    pub flex_scale_interval: Option<f64>,
    /// Flex: instances added to a function per scale decision (published: 4).
    #[arg(long)]
    pub flex_instances_per_decision: Option<usize>,
    /// Flex: target executions per instance = batchSize + newBatchThreshold (the Storage Queues
    /// extension's own scaler) instead of batchSize (Microsoft's documented target).
    #[arg(long)]
    pub flex_target_includes_threshold: bool,
    /// Flex: idle seconds before an unneeded on-demand instance is removed (not published).
    #[arg(long)]
    pub flex_scale_in_idle: Option<f64>,
    /// Model override: mean rows per partition key of the generated table.
    #[arg(long)]
    pub mean_rows_per_key: Option<f64>,
    /// The scan's `maxRequestsPerSecond` (tablescan's design only; default: none).
    #[arg(long)]
    pub max_requests_per_second: Option<u32>,
    /// tablescan's adaptive pacing per account (issue 43); `false` runs the earlier behaviour.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub adaptive_pacing: bool,
    /// Another workload on the same account (a live application): requests per second it
    /// sends while the scan runs, each refused one counted (`neighbour`). Default: none.
    #[arg(long, default_value_t = 0)]
    pub neighbour_requests_per_second: u32,
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
    /// host.json `extensions.queues.batchSize` / `newBatchThreshold` / `maxPollingInterval` /
    /// `visibilityTimeout` of the function app.
    pub batch_size: u8,
    pub new_batch_threshold: usize,
    pub max_polling_ms: f64,
    pub visibility_timeout_ms: f64,
    /// The scan request's `maxRequestsPerSecond`, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_requests_per_second: Option<u32>,
    /// tablescan's adaptive pacing per account (issue 43) is on.
    pub adaptive_pacing: bool,
    /// Another workload's requests per second on the account (0: none).
    #[serde(skip_serializing_if = "is_zero")]
    pub neighbour_requests_per_second: u32,
    /// An enqueue scan instead of a copy (tablescan's app only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enqueue: Option<EnqueueDesign>,
    /// An index build instead of a copy (tablescan's app only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<IndexDesign>,
    /// A count scan instead of a copy (tablescan's app only).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub count: bool,
}

/// One scenario to run.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub rows: u64,
    pub variant: Variant,
    pub design: Design,
    pub plan: Plan,
    /// The Flex app's settings (used on Flex only).
    pub flex: Flex,
    /// What this scenario varies from its suite's baseline (sensitivity rows), if anything.
    pub label: Option<String>,
}

/// Queue settings of a host.json (`extensions.queues`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueueSettings {
    pub batch_size: u8,
    pub new_batch_threshold: usize,
    pub max_polling_ms: f64,
    pub visibility_timeout_ms: f64,
}

/// The queue settings of the host.json tablescan ships, each falling back to the extension's
/// default when absent.
pub fn shipped_queue_settings() -> QueueSettings {
    let host: serde_json::Value = serde_json::from_str(crate::deploy::stage::HOST_JSON)
        .expect("the shipped host.json parses");
    let queues = &host["extensions"]["queues"];
    let batch = queues["batchSize"].as_u64().unwrap_or(16).clamp(1, 32) as u8;
    let threshold = queues["newBatchThreshold"]
        .as_u64()
        .map_or(batch as usize / 2, |n| n as usize);
    let timespan = |key: &str, default: f64| {
        queues[key]
            .as_str()
            .and_then(timespan_ms)
            .unwrap_or(default)
    };
    QueueSettings {
        batch_size: batch,
        new_batch_threshold: threshold,
        max_polling_ms: timespan("maxPollingInterval", 60_000.0),
        visibility_timeout_ms: timespan("visibilityTimeout", 0.0),
    }
}

/// `hh:mm:ss` (optionally with fractional seconds) in milliseconds.
fn timespan_ms(text: &str) -> Option<f64> {
    let parts: Vec<&str> = text.split(':').collect();
    let [h, m, s] = parts.as_slice() else {
        return None;
    };
    let h: f64 = h.parse().ok()?;
    let m: f64 = m.parse().ok()?;
    let s: f64 = s.parse().ok()?;
    Some(((h * 60.0 + m) * 60.0 + s) * 1000.0)
}

impl Scenario {
    /// The design each variant uses; only `prefix` takes the command line's design options.
    /// The plan is Consumption; see [`Scenario::on`].
    pub fn new(rows: u64, variant: Variant, args: &SimulateArgs) -> Self {
        let model = Model::default();
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
            batch_size: model.batch_size,
            new_batch_threshold: model.new_batch_threshold,
            max_polling_ms: model.max_polling_ms,
            visibility_timeout_ms: model.failed_visibility_ms,
            max_requests_per_second: None,
            adaptive_pacing: false,
            neighbour_requests_per_second: args.platform.neighbour_requests_per_second,
            enqueue: None,
            index: None,
            count: false,
        };
        let design = match variant {
            Variant::Serial => Design {
                strategy: "serial",
                ..reference
            },
            Variant::ReferencePrefix => reference,
            Variant::Prefix => tablescan_design(args),
        };
        Scenario {
            rows,
            variant,
            design,
            plan: Plan::Consumption,
            flex: flex_from(args),
            label: None,
        }
    }

    /// The same scenario on another plan (tablescan's design only: the blog rows are the
    /// Consumption calibration).
    pub fn on(mut self, plan: Plan) -> Self {
        if self.variant == Variant::Prefix {
            self.plan = plan;
        }
        self
    }

    /// A name for tables and logs: rows, variant, plan and what it varies.
    pub fn name(&self) -> String {
        let mut name = format!(
            "{} {} on {}",
            self.rows,
            self.variant.name(),
            self.plan.name()
        );
        if let Some(e) = &self.design.enqueue {
            name.push_str(&format!(", enqueue {} rows a message", e.rows_per_message));
        }
        if let Some(i) = &self.design.index {
            name.push_str(&format!(", index of {}", i.property));
        }
        if self.design.count {
            name.push_str(", count");
        }
        if let Some(label) = &self.label {
            name.push_str(&format!(" ({label})"));
        }
        name
    }

    /// The same scenario as an enqueue scan at `rows_per_message` (tablescan's design only).
    pub fn enqueue(mut self, rows_per_message: u32) -> Self {
        if self.variant == Variant::Prefix {
            self.design.enqueue = Some(EnqueueDesign { rows_per_message });
        }
        self
    }
}

/// tablescan's design: its defaults (scan parameters, step budget, shipped host.json) with the
/// command line's overrides.
fn tablescan_design(args: &SimulateArgs) -> Design {
    let budget = StepBudget::default();
    let params = ScanParameters::default();
    let shipped = shipped_queue_settings();
    Design {
        app: "tablescan",
        strategy: "prefix",
        work_split: args.work_split,
        take: args.take,
        segments_first: args
            .segments_first
            .unwrap_or(params.segments_per_first_prefix),
        segments_subsequent: args
            .segments_subsequent
            .unwrap_or(params.segments_per_subsequent_prefix),
        budget_pages: args.budget_pages.unwrap_or(budget.max_pages),
        budget_queries: args.budget_queries.unwrap_or(budget.max_queries),
        counter_shards: args.counter_shards,
        copy_concurrency: args.copy_concurrency,
        batch_size: args.batch_size.unwrap_or(shipped.batch_size),
        new_batch_threshold: args
            .new_batch_threshold
            .unwrap_or(shipped.new_batch_threshold),
        max_polling_ms: shipped.max_polling_ms,
        visibility_timeout_ms: args
            .visibility_timeout
            .map_or(shipped.visibility_timeout_ms, |s| s * 1000.0),
        max_requests_per_second: args.platform.max_requests_per_second,
        adaptive_pacing: args.platform.adaptive_pacing,
        neighbour_requests_per_second: args.platform.neighbour_requests_per_second,
        enqueue: (args.driver == DriverArg::Enqueue).then_some(EnqueueDesign {
            rows_per_message: args.rows_per_message,
        }),
        index: (args.driver == DriverArg::Index).then(|| index_design(args)),
        count: args.driver == DriverArg::Count,
    }
}

fn index_design(args: &SimulateArgs) -> IndexDesign {
    IndexDesign {
        property: args.index.index_property.clone(),
        container: args.index.index_container.clone(),
        prefix: args.index.index_prefix.clone(),
        check_values: args.index.index_check_values,
    }
}

impl Scenario {
    /// The same scenario as an index build (tablescan's design only).
    pub fn index(mut self, args: &SimulateArgs) -> Self {
        if self.variant == Variant::Prefix {
            (self.design.enqueue, self.design.count) = (None, false);
            self.design.index = Some(index_design(args));
        }
        self
    }

    /// The same scenario as a count scan (tablescan's design only).
    pub fn count(mut self) -> Self {
        if self.variant == Variant::Prefix {
            (self.design.enqueue, self.design.index) = (None, None);
            self.design.count = true;
        }
        self
    }

    /// Whether the table's rows carry the simulated properties (index builds and counts).
    pub fn has_properties(&self) -> bool {
        self.design.index.is_some() || self.design.count
    }
}

/// The Flex settings the command line asks for.
pub fn flex_from(args: &SimulateArgs) -> Flex {
    let d = Flex::default();
    Flex {
        instance_memory_mb: args.platform.instance_memory,
        max_instances: args.platform.max_instances.unwrap_or(d.max_instances),
        always_ready: args.platform.always_ready,
        instances_per_decision: args
            .platform
            .flex_instances_per_decision
            .unwrap_or(d.instances_per_decision),
        target_includes_threshold: args.platform.flex_target_includes_threshold,
        scale_interval_s: args
            .platform
            .flex_scale_interval
            .unwrap_or(d.scale_interval_s),
        cold_start_s: args.platform.cold_start.unwrap_or(d.cold_start_s),
        scale_in_idle_s: args
            .platform
            .flex_scale_in_idle
            .unwrap_or(d.scale_in_idle_s),
        ..d
    }
}

/// The model with the command line's overrides.
pub fn model_from(args: &SimulateArgs) -> Model {
    let mut m = Model::default();
    if let Some(v) = args.platform.cpu_per_row_ms {
        m.cpu_per_row_ms = v;
    }
    if let Some(v) = args.platform.cpu_per_execution_ms {
        m.cpu_per_execution_ms = v;
    }
    if let Some(v) = args.platform.account_requests_per_sec {
        m.account_requests_per_sec = v;
    }
    if let Some(v) = args.platform.queue_messages_per_sec {
        m.queue_messages_per_sec = v;
    }
    if let Some(v) = args.platform.max_instances {
        m.max_instances = v;
    }
    if let Some(v) = args.platform.cold_start {
        m.cold_start_s = v;
    }
    if let Some(v) = args.platform.mean_rows_per_key {
        m.mean_rows_per_key = v;
    }
    m
}

/// The scenarios the arguments ask for: the suites, then any --rows/--variant/--plan product.
pub fn scenarios(args: &SimulateArgs) -> Vec<Scenario> {
    let explicit = !args.rows.is_empty() || !args.variant.is_empty() || !args.plan.is_empty();
    let suites = if args.suite.is_empty() && !explicit {
        vec![Suite::Calibration, Suite::Goals]
    } else {
        args.suite.clone()
    };
    let mut out: Vec<Scenario> = suites.iter().flat_map(|s| suite(*s, args)).collect();
    if explicit {
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
        let plans = if args.plan.is_empty() {
            vec![Plan::Consumption]
        } else {
            args.plan.clone()
        };
        for &r in &rows {
            for &v in &variants {
                let plans: &[Plan] = if v == Variant::Prefix {
                    &plans
                } else {
                    &[Plan::Consumption]
                };
                for &p in plans {
                    let scenario = Scenario::new(r, v, args).on(p);
                    // An index build is compared with a count of the same table.
                    if scenario.design.index.is_some() {
                        out.push(scenario.clone().count());
                    }
                    out.push(scenario);
                }
            }
        }
    }
    out
}

/// One suite's scenarios.
pub fn suite(suite: Suite, args: &SimulateArgs) -> Vec<Scenario> {
    let prefix = |rows, plan| Scenario::new(rows, Variant::Prefix, args).on(plan);
    match suite {
        Suite::Calibration => vec![
            Scenario::new(BLOG_ROWS[0], Variant::Serial, args),
            Scenario::new(BLOG_ROWS[0], Variant::ReferencePrefix, args),
            Scenario::new(BLOG_ROWS[1], Variant::Serial, args),
            Scenario::new(BLOG_ROWS[1], Variant::ReferencePrefix, args),
            Scenario::new(BLOG_ROWS[2], Variant::ReferencePrefix, args),
        ],
        Suite::Goals => [BLOG_ROWS[0], BLOG_ROWS[2]]
            .iter()
            .flat_map(|&r| [prefix(r, Plan::Consumption), prefix(r, Plan::Flex)])
            .collect(),
        Suite::Sensitivity => sensitivity(prefix(BLOG_ROWS[0], Plan::Flex), false),
        Suite::Sensitivity35m => sensitivity(prefix(BLOG_ROWS[2], Plan::Flex), true),
        Suite::Enqueue => [1, 32]
            .iter()
            .map(|&n| prefix(BLOG_ROWS[2], Plan::Flex).enqueue(n))
            .collect(),
        Suite::Index => {
            let base = prefix(35_000_000, Plan::Consumption);
            vec![base.clone().count(), base.index(args)]
        }
    }
}

/// One Flex parameter varied at a time from `base` (its defaults are the goal rows, not
/// repeated here). `short` keeps the few that matter most (for the 35M rows).
fn sensitivity(base: Scenario, short: bool) -> Vec<Scenario> {
    let vary = |label: String, change: &dyn Fn(&mut Flex)| {
        let mut s = base.clone();
        change(&mut s.flex);
        s.label = Some(label);
        s
    };
    let mut out = Vec::new();
    let intervals: &[f64] = if short {
        &[30.0]
    } else {
        &[2.0, 5.0, 20.0, 30.0]
    };
    for &v in intervals {
        out.push(vary(format!("scale interval {v} s"), &|f| {
            f.scale_interval_s = v
        }));
    }
    if !short {
        for v in [1usize, 8] {
            out.push(vary(format!("{v} instances per decision"), &|f| {
                f.instances_per_decision = v
            }));
        }
        for v in [1.0, 10.0, 20.0] {
            out.push(vary(format!("cold start {v} s"), &|f| f.cold_start_s = v));
        }
        out.push(vary("target batchSize + newBatchThreshold".into(), &|f| {
            f.target_includes_threshold = true
        }));
        out.push(vary("1 always ready per function".into(), &|f| {
            f.always_ready = 1
        }));
        out.push(vary("scale-in after 10 s idle".into(), &|f| {
            f.scale_in_idle_s = 10.0
        }));
    }
    for v in [512u32, 4096] {
        out.push(vary(format!("{v} MB"), &|f| f.instance_memory_mb = v));
    }
    let caps: &[usize] = if short {
        &[12, 20, 40, 60]
    } else {
        &[10, 40, 200]
    };
    for &v in caps {
        out.push(vary(format!("max {v} instances"), &|f| f.max_instances = v));
    }
    out
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}
