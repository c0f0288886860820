//! The cloud model's constants: one calibrated set for every scenario (see docs/simulator.md for
//! how each was chosen). Nothing here may be tuned per scenario.

use std::time::Duration;

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

    // --- Retry policy of the storage adapters (mirrors `storage::retry::RetryPolicy::default()`
    // on branch `storage`, not merged here yet) ---
    pub retry_max_attempts: u32,
    pub retry_base_ms: f64,
    pub retry_max_ms: f64,

    // --- Functions Consumption plan ---
    pub batch_size: u8,
    pub new_batch_threshold: usize,
    pub min_polling_ms: f64,
    pub max_polling_ms: f64,
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
    /// Memory billed while an instance runs executions.
    pub billed_memory_gb: f64,

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

            retry_max_attempts: 6,
            retry_base_ms: 100.0,
            retry_max_ms: 10_000.0,

            batch_size: 16,
            new_batch_threshold: 8,
            min_polling_ms: 100.0,
            max_polling_ms: 60_000.0,
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
    /// Table storage transactions (LRS), per transaction ($0.00036 per 10,000).
    pub const TABLE_TRANSACTION: f64 = 0.00036 / 10_000.0;
    /// Queue storage operations, per operation ($0.0004 per 10,000, class 1/2 averaged).
    pub const QUEUE_OPERATION: f64 = 0.0004 / 10_000.0;
}
