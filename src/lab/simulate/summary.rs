//! A finished scenario's figures, all simulated: duration, executions, instances, requests, the
//! cost under its plan's price model, and the floor that the storage account's limits alone
//! impose on a copy of the same table (so the distance to it is visible).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use serde::Serialize;

use crate::storage::{MAX_BATCH_OPERATIONS, MAX_TAKE};

use super::cloud::{Account, CloudQueues};
use super::data::{Sink, SyntheticTable};
use super::enqueue::{figures, EnqueueFigures, QueueSink};
use super::host::Host;
use super::index::{Breakdown, IndexFigures};
use super::model::{prices, Flex, Model, Plan};
use super::scenario::{Design, Scenario};

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
    /// Most live instances at once (all functions).
    pub max_instances: usize,
    pub storage_requests_per_1000_rows: f64,
    pub queue_messages_per_1000_rows: f64,
    pub estimated_cost_usd: f64,
    /// Always true: every figure here comes from the model, not from Azure.
    pub simulated: bool,
    pub plan: &'static str,
    /// What this scenario varies from its suite's baseline, if anything.
    pub label: Option<String>,
    /// The floor the storage account's limits alone impose on copying this table.
    pub floor: Floor,
    pub cost: Cost,
    /// Table, queue and blob requests, every attempt (throttled ones too).
    pub requests: u64,
    /// Most requests (tables and queues, every attempt) in one simulated second.
    pub peak_requests_per_second: u64,
    /// Requests the account's request-rate target refused (503).
    pub account_throttled_requests: u64,
    /// Most live instances at once per function (Flex) and for the app.
    pub peak_instances: BTreeMap<&'static str, usize>,
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
    /// The Flex app's settings (Flex scenarios only).
    pub flex: Option<Flex>,
    /// (simulated seconds, instances).
    pub instances_over_time: Vec<(f64, usize)>,
    /// (simulated seconds, distinct rows in the destination).
    pub rows_over_time: Vec<(f64, u64)>,
    /// An enqueue scan's figures (enqueue scenarios only; `rows_copied` and `copy_verified`
    /// then count the rows found in the destination queue's messages).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enqueue: Option<EnqueueFigures>,
    /// An index build's or its comparison count's figures (those scenarios only; then
    /// `rows_copied` is the rows indexed or counted, and `copy_verified` says every row was and
    /// every checked lookup returned exactly its value's rows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<IndexFigures>,
    /// Refused requests, the settled rate, the adaptive pacing and another workload (issue 43).
    pub pacing: super::pacing::PacingFigures,
    /// Real (wall-clock) seconds the simulation took.
    pub wall_seconds: f64,
}

/// How fast the storage account alone would let any design copy the table.
#[derive(Debug, Clone, Serialize)]
pub struct Floor {
    /// Fewest table requests a copy needs: one query per 1,000 rows read, and one entity group
    /// transaction per partition key per 100 rows written.
    pub minimum_requests: u64,
    pub account_requests_per_second: f64,
    /// `minimum_requests` at the account's request-rate target.
    pub account_seconds: f64,
    pub largest_partition_rows: u64,
    pub partition_entities_per_second: f64,
    /// The largest partition read once at the per-partition entity target (its writes go to
    /// another table's partition, in parallel).
    pub partition_seconds: f64,
    /// The larger of the two: no design can copy the table faster.
    pub seconds: f64,
    /// Which limit that is.
    pub binding: &'static str,
    /// This run's own requests (tables and queues) at the account's request-rate target: the
    /// floor for this design's request count.
    pub run_requests_seconds: f64,
    /// An enqueue's fewest messages at one queue's message rate (enqueue scenarios only; then
    /// `minimum_requests` is the enqueue's: a query per 1,000 rows and a put per message).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_seconds: Option<f64>,
}

/// The floor for copying `source` under `model`'s storage limits, and for `run_requests`.
pub fn floor(source: &SyntheticTable, model: &Model, run_requests: u64) -> Floor {
    let batch = MAX_BATCH_OPERATIONS as u64;
    let writes: u64 = source.partition_sizes().map(|n| n.div_ceil(batch)).sum();
    let reads = source.total_rows().div_ceil(MAX_TAKE as u64);
    let minimum_requests = reads + writes;
    let largest = source.partition_sizes().max().unwrap_or(0);
    let account_rate = model.account_requests_per_sec;
    let partition_rate = model.partition_entities_per_sec;
    let account_seconds = minimum_requests as f64 / account_rate;
    let partition_seconds = largest as f64 / partition_rate;
    let (seconds, binding) = if account_seconds >= partition_seconds {
        (account_seconds, "account request rate")
    } else {
        (partition_seconds, "partition entity rate")
    };
    Floor {
        minimum_requests,
        account_requests_per_second: account_rate,
        account_seconds,
        largest_partition_rows: largest,
        partition_entities_per_second: partition_rate,
        partition_seconds,
        seconds,
        binding,
        run_requests_seconds: run_requests as f64 / account_rate,
        queue_seconds: None,
    }
}

/// The estimated bill for one run (list prices, free grants ignored), by meter.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Cost {
    /// Execution time: Consumption's observed memory, or Flex's instance memory while active.
    pub compute_usd: f64,
    /// Flex always-ready baseline for the run's duration (it also accrues between runs).
    pub always_ready_baseline_usd: f64,
    pub executions_usd: f64,
    pub table_transactions_usd: f64,
    pub queue_operations_usd: f64,
    pub total_usd: f64,
}

/// The bill under the scenario's plan.
fn cost(plan: Plan, flex: &Flex, model: &Model, run: &Run<'_>, executions: u64) -> Cost {
    let duration = run.host.epoch.elapsed().as_secs_f64();
    let instances = run.host.instances.lock().unwrap().clone();
    let (compute, baseline, per_execution) = match plan {
        Plan::Consumption => {
            let busy: f64 = instances.iter().map(|i| i.busy_time().as_secs_f64()).sum();
            (
                busy * model.billed_memory_gb * prices::FUNCTIONS_GB_S,
                0.0,
                prices::FUNCTIONS_EXECUTION,
            )
        }
        Plan::Flex => {
            let gb = flex.memory_gb();
            let mut compute = 0.0;
            let mut baseline = 0.0;
            for i in &instances {
                let billed = i.billed_time().as_secs_f64() * gb;
                if i.always_ready {
                    compute += billed * prices::FLEX_ALWAYS_READY_GB_S;
                    baseline += duration * gb * prices::FLEX_ALWAYS_READY_BASELINE_GB_S;
                } else {
                    compute += billed * prices::FLEX_ON_DEMAND_GB_S;
                }
            }
            (compute, baseline, prices::FLEX_EXECUTION)
        }
    };
    let table = run.account.table_counters.snapshot().table_total() as f64;
    let queue = run.account.queue_counters.snapshot().queue_total() as f64;
    let mut c = Cost {
        compute_usd: compute,
        always_ready_baseline_usd: baseline,
        executions_usd: executions as f64 * per_execution,
        table_transactions_usd: table * prices::TABLE_TRANSACTION,
        queue_operations_usd: queue * prices::QUEUE_OPERATION,
        total_usd: 0.0,
    };
    c.total_usd = c.compute_usd
        + c.always_ready_baseline_usd
        + c.executions_usd
        + c.table_transactions_usd
        + c.queue_operations_usd;
    c
}

/// What a finished scenario left to measure.
pub struct Run<'a> {
    pub host: &'a Host,
    pub account: &'a Account,
    pub queues: &'a CloudQueues,
    pub sink: &'a Sink,
    pub source: &'a SyntheticTable,
    pub completed: bool,
    pub rows_over_time: Vec<(f64, u64)>,
    pub peak_requests_per_second: u64,
    /// An enqueue scan's destination queue (`None` for copies).
    pub destination: Option<&'a QueueSink>,
}

/// The scenario's figures (all simulated).
pub fn summarize(scenario: &Scenario, model: &Model, seed: u64, run: Run<'_>) -> ScenarioResult {
    let host = run.host;
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
    let busy: f64 = host
        .instances
        .lock()
        .unwrap()
        .iter()
        .map(|i| i.busy_time().as_secs_f64())
        .sum();
    let table_requests = run.account.table_counters.snapshot().table_total();
    let requests = table_requests
        + run.account.queue_counters.snapshot().queue_total()
        + run.account.blob_counters.snapshot().total();
    let rows = scenario.rows as f64;
    let cost = cost(
        scenario.plan,
        &scenario.flex,
        model,
        &run,
        executions.len() as u64,
    );
    let throttled_by = run.account.throttled_by.lock().unwrap().clone();
    let throttled = run.account.throttled.load(Ordering::Relaxed);
    let enqueue = match (run.destination, &scenario.design.enqueue) {
        (Some(queue), Some(e)) => Some(figures(
            run.source,
            model,
            e.rows_per_message,
            queue,
            throttled_by
                .get(&format!("queue {}", queue.queue))
                .copied()
                .unwrap_or(0),
            (requests, throttled),
            Breakdown::of(run.account).tables_and_queues,
        )),
        _ => None,
    };
    let peak_instances = host.peak_instances.lock().unwrap().clone();
    ScenarioResult {
        rows: scenario.rows,
        variant: scenario.variant.name(),
        completed: run.completed,
        duration_seconds: host.epoch.elapsed().as_secs_f64(),
        max_executions_per_30s: bins.values().copied().max().unwrap_or(0),
        max_execution_seconds: max_execution.as_secs_f64(),
        max_instances: peak_instances.get("app").copied().unwrap_or(0),
        storage_requests_per_1000_rows: table_requests as f64 * 1000.0 / rows,
        queue_messages_per_1000_rows: run.queues.messages_put.load(Ordering::Relaxed) as f64
            * 1000.0
            / rows,
        estimated_cost_usd: cost.total_usd,
        simulated: true,
        plan: scenario.plan.name(),
        label: scenario.label.clone(),
        floor: match &enqueue {
            Some(e) => enqueue_floor(floor(run.source, model, requests), e),
            None => floor(run.source, model, requests),
        },
        cost,
        requests,
        peak_requests_per_second: run.peak_requests_per_second,
        account_throttled_requests: throttled_by.get("account").copied().unwrap_or(0),
        peak_instances,
        seed,
        partition_keys: run.source.partitions(),
        rows_copied: run.sink.unique_rows(),
        copy_verified: run.sink.verified(),
        executions: executions.len() as u64,
        timed_out_executions: timed_out,
        throttled_requests: throttled,
        throttled_by,
        instance_busy_seconds: busy,
        design: scenario.design.clone(),
        flex: (scenario.plan == Plan::Flex).then(|| scenario.flex.clone()),
        instances_over_time: host.instance_timeline.lock().unwrap().clone(),
        rows_over_time: run.rows_over_time,
        enqueue,
        index: None,
        pacing: Default::default(),
        wall_seconds: 0.0,
    }
}

/// The floor of an enqueue: its fewest requests at the account's rate, its largest partition
/// read at the partition's rate, or (usually binding) its fewest messages at the queue's rate.
pub fn enqueue_floor(copy: Floor, e: &EnqueueFigures) -> Floor {
    let account_seconds = e.minimum_requests as f64 / copy.account_requests_per_second;
    let mut floor = Floor {
        minimum_requests: e.minimum_requests,
        account_seconds,
        queue_seconds: Some(e.queue_floor_seconds),
        ..copy
    };
    (floor.seconds, floor.binding) = [
        (account_seconds, "account request rate"),
        (floor.partition_seconds, "partition entity rate"),
        (e.queue_floor_seconds, "queue message rate"),
    ]
    .into_iter()
    .fold((0.0, ""), |best, x| if x.0 > best.0 { x } else { best });
    floor
}
