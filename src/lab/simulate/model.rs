//! The cloud model's constants: one calibrated set for every scenario (see docs/simulator.md for
//! how each was chosen). Nothing here may be tuned per scenario. The Flex Consumption plan's
//! settings (`Flex`) are the app's deployment choices plus the platform's unpublished scale
//! timings, which scenarios vary on purpose to show the sensitivity.

use std::time::Duration;

use serde::Serialize;

/// The Functions hosting plan a scenario runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Plan {
    /// Linux Consumption: every function of the app on every instance, one vCPU each, the
    /// incremental scale controller calibrated against the blog's runs.
    Consumption,
    /// Flex Consumption: per-function scaling, target-based scale-out, instance memory sizes.
    Flex,
}

impl Plan {
    pub fn name(self) -> &'static str {
        match self {
            Plan::Consumption => "consumption",
            Plan::Flex => "flex",
        }
    }
}

/// A Flex Consumption app's settings and the platform timings the model assumes for it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Flex {
    /// `instanceMemoryMB`: 512, 2048 (the default) or 4096.
    pub instance_memory_mb: u32,
    /// `maximumInstanceCount`: on-demand instances of each per-function scale group (here: each
    /// queue function), not of the app combined; always-ready instances do not count toward it
    /// (the platform's default 100, lowest 1, highest 1,000). Default here: what tablescan's
    /// template deploys (20, `infra/main.parameters.json`; tested to agree).
    pub max_instances: usize,
    /// Always-ready instances per queue function (default 0: on demand only).
    pub always_ready: usize,
    /// The subscription's regional quota in cores (250 by default), shared by all Flex apps.
    pub regional_quota_cores: f64,
    /// Instances target-based scaling may add to one function per decision (published: 4).
    pub instances_per_decision: usize,
    /// Target executions per instance: host.json `batchSize` (Microsoft's documented target for
    /// Storage Queues, the default) or, when true, `batchSize + newBatchThreshold` (what the
    /// Storage Queues extension's own target scaler computes without dynamic concurrency).
    pub target_includes_threshold: bool,
    /// Seconds between scale decisions (NOT published: a parameter, see the sensitivity).
    pub scale_interval_s: f64,
    /// Seconds from allocation until a new instance takes messages (NOT published).
    pub cold_start_s: f64,
    /// An on-demand instance idle this long while its function wants fewer instances is removed
    /// (NOT published).
    pub scale_in_idle_s: f64,
}

impl Default for Flex {
    fn default() -> Self {
        Flex {
            instance_memory_mb: 2048,
            max_instances: 40,
            always_ready: 0,
            regional_quota_cores: 250.0,
            instances_per_decision: 4,
            target_includes_threshold: false,
            scale_interval_s: 10.0,
            cold_start_s: 5.0,
            scale_in_idle_s: 60.0,
        }
    }
}

impl Flex {
    /// The published instance sizes.
    pub const MEMORY_SIZES_MB: [u32; 3] = [512, 2048, 4096];

    /// CPU cores of an instance of this memory size (documented: 0.25, 1 and 2).
    pub fn cores(&self) -> f64 {
        match self.instance_memory_mb {
            512 => 0.25,
            4096 => 2.0,
            _ => 1.0,
        }
    }

    /// Billed (provisioned) memory in GB.
    pub fn memory_gb(&self) -> f64 {
        self.instance_memory_mb as f64 / 1024.0
    }

    /// Instances the regional core quota allows (every instance of the app, always-ready ones
    /// too; the model assumes no other Flex app shares the quota).
    pub fn quota_instances(&self) -> usize {
        ((self.regional_quota_cores / self.cores()).floor() as usize).max(1)
    }

    /// On-demand instances one function may have at once: the maximum instance count, within
    /// the regional quota.
    pub fn instance_cap(&self) -> usize {
        self.max_instances.min(self.quota_instances()).max(1)
    }

    /// Whether the settings are ones the platform accepts.
    pub fn validate(&self) -> Result<(), String> {
        if !Self::MEMORY_SIZES_MB.contains(&self.instance_memory_mb) {
            return Err(format!(
                "--instance-memory: must be 512, 2048 or 4096, got {}",
                self.instance_memory_mb
            ));
        }
        if !(1..=1000).contains(&self.max_instances) {
            return Err(format!(
                "--max-instances: must be 1..=1000 on Flex Consumption, got {}",
                self.max_instances
            ));
        }
        if self.instances_per_decision == 0 || self.scale_interval_s <= 0.0 {
            return Err(
                "--flex-instances-per-decision and --flex-scale-interval must be > 0".into(),
            );
        }
        Ok(())
    }

    /// Billed seconds for one activity period of an instance: at least 1 s, then rounded up to
    /// the next 100 ms (the plan's documented billing granularity).
    pub fn billed_period(active: Duration) -> Duration {
        let tenths = (active.as_secs_f64() * 10.0 - 1e-9).ceil().max(10.0);
        Duration::from_millis(tenths as u64 * 100)
    }
}

/// Every constant of the model.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Model {
    // --- Table Storage (same-region request latencies) ---
    /// Fixed part of a query's latency.
    pub query_base_ms: f64,
    /// Per row returned (server-side read + serialization).
    pub query_per_row_ms: f64,
    /// Per KiB returned (transfer).
    pub query_per_kib_ms: f64,
    /// Wire size of a row read with `$select=PartitionKey,RowKey`.
    pub key_row_bytes: f64,
    /// Wire size of a full row (NuGet-like leaf entity).
    pub full_row_bytes: f64,
    pub batch_base_ms: f64,
    pub batch_per_entity_ms: f64,
    pub point_read_ms: f64,
    pub table_admin_ms: f64,
    /// Latency of a throttled (503) answer.
    pub throttled_ms: f64,
    /// Uniform latency jitter, ± this fraction.
    pub jitter: f64,
    /// Per-partition throughput target (entities/s).
    pub partition_entities_per_sec: f64,
    /// Per-account request rate (tables and queues share it).
    pub account_requests_per_sec: f64,

    // --- Queue Storage ---
    pub queue_put_ms: f64,
    pub queue_get_ms: f64,
    pub queue_delete_ms: f64,
    pub queue_update_ms: f64,
    /// Messages per second one queue accepts (enqueues; deliveries are not capped).
    pub queue_messages_per_sec: f64,

    // --- Blob Storage (index builds; requests count against the account's rate) ---
    /// Put Blob / Put Block / Put Block List, before the body's transfer.
    pub blob_write_ms: f64,
    /// Get Blob (whole or a range) and Get Blob Properties, before the body's transfer.
    pub blob_read_ms: f64,
    /// List Blobs (one page) and Create Container.
    pub blob_list_ms: f64,
    /// Transfer of a body, per MiB.
    pub blob_per_mib_ms: f64,

    // --- Retry policy of the storage adapters (mirrors `storage::retry_policy::RetryPolicy::default()`;
    // checked by tests/scans/lab/simulate.rs) ---
    pub retry_max_attempts: u32,
    pub retry_base_ms: f64,
    pub retry_max_ms: f64,

    // --- Functions Consumption plan ---
    pub batch_size: u8,
    pub new_batch_threshold: usize,
    pub min_polling_ms: f64,
    pub max_polling_ms: f64,
    /// host.json `visibilityTimeout`: how long a failed execution's message stays invisible.
    pub failed_visibility_ms: f64,
    pub function_timeout_s: f64,
    pub max_dequeue_count: u64,
    pub max_instances: usize,
    /// At most one new instance per this many seconds (queue triggers).
    pub scale_out_interval_s: f64,
    /// How often the scale controller looks at the queues.
    pub scale_check_interval_s: f64,
    /// Queue messages per instance the scale controller targets.
    pub target_messages_per_instance: f64,
    /// Time from allocation until a new instance's host and custom handler take messages.
    pub cold_start_s: f64,
    /// Per invocation: host dispatch plus the custom handler's HTTP round trip (not CPU-bound).
    pub invocation_overhead_ms: f64,
    /// Per invocation CPU on the instance's single vCPU (host + handler).
    pub cpu_per_execution_ms: f64,
    /// Per storage request CPU (TLS, HTTP, JSON).
    pub cpu_per_request_ms: f64,
    /// Per row read or written CPU (parse, serialize).
    pub cpu_per_row_ms: f64,
    /// Memory billed while a Consumption instance runs executions.
    pub billed_memory_gb: f64,
    /// Consumption instances have one vCPU.
    pub consumption_cores: f64,

    // --- Data ---
    /// Mean versions (rows) per package id.
    pub mean_rows_per_key: f64,
}

impl Default for Model {
    fn default() -> Self {
        Model {
            query_base_ms: 10.0,
            query_per_row_ms: 0.05,
            query_per_kib_ms: 0.12,
            key_row_bytes: 60.0,
            full_row_bytes: 550.0,
            batch_base_ms: 12.0,
            batch_per_entity_ms: 0.12,
            point_read_ms: 6.0,
            table_admin_ms: 25.0,
            throttled_ms: 5.0,
            jitter: 0.25,
            partition_entities_per_sec: 2_000.0,
            account_requests_per_sec: 20_000.0,

            queue_put_ms: 9.0,
            queue_get_ms: 12.0,
            queue_delete_ms: 7.0,
            queue_update_ms: 9.0,
            queue_messages_per_sec: 2_000.0,

            blob_write_ms: 12.0,
            blob_read_ms: 8.0,
            blob_list_ms: 15.0,
            blob_per_mib_ms: 20.0,

            retry_max_attempts: 8,
            retry_base_ms: 100.0,
            retry_max_ms: 10_000.0,

            batch_size: 16,
            new_batch_threshold: 8,
            min_polling_ms: 100.0,
            max_polling_ms: 60_000.0,
            failed_visibility_ms: 0.0,
            function_timeout_s: 600.0,
            max_dequeue_count: 5,
            max_instances: 200,
            scale_out_interval_s: 30.0,
            scale_check_interval_s: 10.0,
            target_messages_per_instance: 24.0,
            cold_start_s: 5.0,
            invocation_overhead_ms: 3.0,
            cpu_per_execution_ms: 1.5,
            cpu_per_request_ms: 0.15,
            cpu_per_row_ms: 0.004,
            billed_memory_gb: 0.25,
            consumption_cores: 1.0,

            mean_rows_per_key: 14.0,
        }
    }
}

impl Model {
    pub fn ms(v: f64) -> Duration {
        Duration::from_secs_f64(v.max(0.0) / 1000.0)
    }

    /// Query latency for `rows` rows of `row_bytes` each (before jitter).
    pub fn query_ms(&self, rows: usize, row_bytes: f64) -> f64 {
        self.query_base_ms
            + self.query_per_row_ms * rows as f64
            + self.query_per_kib_ms * rows as f64 * row_bytes / 1024.0
    }

    /// The backoff ceiling before retry number `retry` (1-based), as the adapters compute it.
    pub fn retry_ceiling_ms(&self, retry: u32) -> f64 {
        (self.retry_base_ms * 2f64.powi(retry.saturating_sub(1).min(30) as i32))
            .min(self.retry_max_ms)
    }
}

/// Public list prices used for the cost estimate (pay-as-you-go, USD). See docs/simulator.md for
/// their sources and date; free grants are ignored.
pub mod prices {
    /// Functions Consumption: execution time, per GB-s.
    pub const FUNCTIONS_GB_S: f64 = 0.000016;
    /// Functions Consumption: per execution ($0.20 per million).
    pub const FUNCTIONS_EXECUTION: f64 = 0.20 / 1_000_000.0;
    /// Flex Consumption, on demand: execution time per GB-s of the instance's memory.
    pub const FLEX_ON_DEMAND_GB_S: f64 = 0.000026;
    /// Flex Consumption: per execution, on demand and always ready ($0.40 per million).
    pub const FLEX_EXECUTION: f64 = 0.40 / 1_000_000.0;
    /// Flex Consumption, always ready: baseline per GB-s provisioned, busy or not.
    pub const FLEX_ALWAYS_READY_BASELINE_GB_S: f64 = 0.000004;
    /// Flex Consumption, always ready: execution time per GB-s while the instance executes.
    pub const FLEX_ALWAYS_READY_GB_S: f64 = 0.000016;
    /// Table storage transactions (LRS), per transaction ($0.00036 per 10,000).
    pub const TABLE_TRANSACTION: f64 = 0.00036 / 10_000.0;
    /// Queue storage operations, per operation ($0.0004 per 10,000, class 1/2 averaged).
    pub const QUEUE_OPERATION: f64 = 0.0004 / 10_000.0;
}
