//! App settings, parsed once from the environment into a typed struct.
//!
//! Every setting the handler reads is here, with its default; README.md documents each one and
//! `local.settings.sample.json` lists them all.

use std::collections::BTreeMap;
use std::fmt;

use crate::app::catalog::{PREFIX_SCAN_QUEUE_SETTING, TABLE_COPY_QUEUE_SETTING};
use crate::scan::StepBudget;

/// The app setting holding the function app's own storage connection string (queues, bookkeeping,
/// and the default account for source and destination tables).
pub const STORAGE_SETTING: &str = "AzureWebJobsStorage";

/// The handler's configuration.
#[derive(Clone)]
pub struct Config {
    /// Port the Functions host told us to listen on (`FUNCTIONS_CUSTOMHANDLER_PORT`).
    pub port: u16,
    /// Queue of prefix-scan steps (`TABLESCAN_PREFIXSCAN_QUEUE`, default `tablescan-prefixscan`).
    pub prefix_scan_queue: String,
    /// Queue of table-copy work (`TABLESCAN_TABLECOPY_QUEUE`, default `tablescan-tablecopy`).
    pub table_copy_queue: String,
    /// Table of scan records (`TABLESCAN_SCANS_TABLE`, default `TablescanScans`).
    pub scans_table: String,
    /// Table of pending-work rows and sharded counters (`TABLESCAN_WORK_TABLE`, default `TablescanWork`).
    pub work_table: String,
    /// Connection strings a scan request may name, by app-setting name. Always holds
    /// `AzureWebJobsStorage`; others come from `TABLESCAN_CONNECTIONS` (comma-separated names).
    /// Values are secrets: never logged.
    pub connections: BTreeMap<String, String>,
    /// Must equal host.json `extensions.queues.maxDequeueCount` (`TABLESCAN_MAX_DEQUEUE_COUNT`,
    /// default 5): on the last attempt a failing work item is recorded as failed before the host
    /// moves its message to the poison queue.
    pub max_dequeue_count: u64,
    /// Counter shards (partitions) per scan (`TABLESCAN_COUNTER_SHARDS`, default 16, 1..=64).
    pub counter_shards: u32,
    /// Entity group transactions in flight per copy invocation (`TABLESCAN_COPY_CONCURRENCY`, default 8).
    pub copy_concurrency: usize,
    /// How much one scan step may read before continuing in a new message.
    pub step_budget: StepBudget,
    /// Test-only fault switch (`TABLESCAN_TEST_FAIL_PREFIX`): work items whose step touches a
    /// partition key with this prefix fail every attempt. Unset in production.
    pub test_fail_prefix: Option<String>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Connection strings hold account keys: print only their names.
        f.debug_struct("Config")
            .field("port", &self.port)
            .field("prefix_scan_queue", &self.prefix_scan_queue)
            .field("table_copy_queue", &self.table_copy_queue)
            .field("scans_table", &self.scans_table)
            .field("work_table", &self.work_table)
            .field("connections", &self.connections.keys().collect::<Vec<_>>())
            .field("max_dequeue_count", &self.max_dequeue_count)
            .field("counter_shards", &self.counter_shards)
            .field("copy_concurrency", &self.copy_concurrency)
            .field("step_budget", &self.step_budget)
            .finish()
    }
}

/// A setting that is missing or unusable.
#[derive(Debug, thiserror::Error)]
#[error("app setting {name}: {message}")]
pub struct ConfigError {
    pub name: String,
    pub message: String,
}

fn err(name: &str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        name: name.to_string(),
        message: message.into(),
    }
}

impl Config {
    /// Reads the configuration from the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the configuration through `lookup` (tests pass a map).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let get = |name: &str| {
            lookup(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let number = |name: &str, default: u64, min: u64, max: u64| -> Result<u64, ConfigError> {
            match get(name) {
                None => Ok(default),
                Some(v) => match v.parse::<u64>() {
                    Ok(n) if (min..=max).contains(&n) => Ok(n),
                    _ => Err(err(
                        name,
                        format!("must be a whole number from {min} to {max}, got {v:?}"),
                    )),
                },
            }
        };
        let port = match get("FUNCTIONS_CUSTOMHANDLER_PORT") {
            None => 0,
            Some(v) => v
                .parse()
                .map_err(|_| err("FUNCTIONS_CUSTOMHANDLER_PORT", format!("not a port: {v:?}")))?,
        };
        let mut connections = BTreeMap::new();
        let storage = get(STORAGE_SETTING)
            .ok_or_else(|| err(STORAGE_SETTING, "is required (a storage connection string)"))?;
        connections.insert(STORAGE_SETTING.to_string(), storage);
        if let Some(names) = get("TABLESCAN_CONNECTIONS") {
            for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                let value = get(name).ok_or_else(|| {
                    err(
                        "TABLESCAN_CONNECTIONS",
                        format!("names {name}, but app setting {name} is not set"),
                    )
                })?;
                connections.insert(name.to_string(), value);
            }
        }
        let queue = |name: &str, default: &str| -> Result<String, ConfigError> {
            let value = get(name).unwrap_or_else(|| default.to_string());
            crate::app::validate::queue_name(&value).map_err(|m| err(name, m))?;
            Ok(value)
        };
        let table = |name: &str, default: &str| -> Result<String, ConfigError> {
            let value = get(name).unwrap_or_else(|| default.to_string());
            crate::app::validate::table_name(&value).map_err(|m| err(name, m))?;
            Ok(value)
        };
        Ok(Config {
            port,
            prefix_scan_queue: queue(PREFIX_SCAN_QUEUE_SETTING, "tablescan-prefixscan")?,
            table_copy_queue: queue(TABLE_COPY_QUEUE_SETTING, "tablescan-tablecopy")?,
            scans_table: table("TABLESCAN_SCANS_TABLE", "TablescanScans")?,
            work_table: table("TABLESCAN_WORK_TABLE", "TablescanWork")?,
            connections,
            max_dequeue_count: number("TABLESCAN_MAX_DEQUEUE_COUNT", 5, 1, 1000)?,
            counter_shards: number("TABLESCAN_COUNTER_SHARDS", 16, 1, 64)? as u32,
            copy_concurrency: number("TABLESCAN_COPY_CONCURRENCY", 8, 1, 64)? as usize,
            step_budget: StepBudget::default(),
            test_fail_prefix: get("TABLESCAN_TEST_FAIL_PREFIX"),
        })
    }
}
