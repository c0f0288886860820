//! host.json `extensions.queues`: the Storage Queues extension's options.
//!
//! Invariant: unknown keys are refused, and every value is range-checked here, so a
//! [`QueuesOptions`] is always usable as is.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use super::json::{join, read_section, Int, TimeSpanText, Unknown};
use super::ConfigError;
use crate::lab::host::timespan::parse_timespan;
use crate::storage::MessageEncoding;

/// `extensions.queues`, with the runtime's defaults except where noted.
#[derive(Debug, Clone, PartialEq)]
pub struct QueuesOptions {
    pub batch_size: u32,
    /// `None` = not set; see [`QueuesOptions::effective_new_batch_threshold`].
    pub new_batch_threshold: Option<u32>,
    /// Default 2 s: what Core Tools uses in development (the Azure runtime default is 1 min).
    pub max_polling_interval: Duration,
    pub visibility_timeout: Duration,
    pub max_dequeue_count: u64,
    pub message_encoding: MessageEncoding,
}

impl Default for QueuesOptions {
    fn default() -> Self {
        QueuesOptions {
            batch_size: 16,
            new_batch_threshold: None,
            max_polling_interval: Duration::from_secs(2),
            visibility_timeout: Duration::ZERO,
            max_dequeue_count: 5,
            message_encoding: MessageEncoding::Base64,
        }
    }
}

impl QueuesOptions {
    /// The runtime computes `(batchSize / 2) * processorCount`, with processorCount = 1 on
    /// Consumption (`WEBSITE_SKU=Dynamic`). tablescan targets Consumption, so an unset
    /// `WEBSITE_SKU` counts as Consumption here; any other SKU uses this machine's core count.
    pub fn effective_new_batch_threshold(&self, website_sku: Option<&str>) -> u32 {
        if let Some(n) = self.new_batch_threshold {
            return n;
        }
        let processors = match website_sku {
            None => 1,
            Some(sku) if sku.eq_ignore_ascii_case("Dynamic") => 1,
            Some(_) => std::thread::available_parallelism()
                .map(|n| n.get() as u32)
                .unwrap_or(1),
        };
        (self.batch_size / 2) * processors
    }
}

/// `extensions.queues` as written (unknown keys are refused).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct QueuesJson {
    batch_size: Option<Int>,
    new_batch_threshold: Option<Int>,
    max_polling_interval: Option<TimeSpanText>,
    visibility_timeout: Option<TimeSpanText>,
    max_dequeue_count: Option<Int>,
    message_encoding: Option<String>,
}

const PATH: &str = "extensions.queues";

/// Parses `extensions.queues` of host.json `f`.
pub(super) fn parse_queues(q: Value, f: &Path) -> Result<QueuesOptions, ConfigError> {
    let q: QueuesJson = read_section(q, f, PATH, Unknown::Refuse)?;
    let error = |key: &str, message: String| ConfigError::new(f, join(PATH, key), message);
    let mut o = QueuesOptions::default();
    if let Some(Int(n)) = q.batch_size {
        if !(1..=32).contains(&n) {
            return Err(error("batchSize", format!("{n} is outside 1..=32")));
        }
        o.batch_size = n as u32;
    }
    if let Some(Int(n)) = q.new_batch_threshold {
        if !(0..=10_000).contains(&n) {
            return Err(error("newBatchThreshold", format!("{n} must be >= 0")));
        }
        o.new_batch_threshold = Some(n as u32);
    }
    let span = |key: &str, text: &TimeSpanText| parse_timespan(&text.0).map_err(|e| error(key, e));
    if let Some(text) = &q.max_polling_interval {
        o.max_polling_interval = span("maxPollingInterval", text)?;
        if o.max_polling_interval < Duration::from_millis(100) {
            return Err(error(
                "maxPollingInterval",
                "must be at least 00:00:00.100".into(),
            ));
        }
    }
    if let Some(text) = &q.visibility_timeout {
        o.visibility_timeout = span("visibilityTimeout", text)?;
        if o.visibility_timeout > Duration::from_secs(7 * 86_400) {
            return Err(error("visibilityTimeout", "must be at most 7 days".into()));
        }
    }
    if let Some(Int(n)) = q.max_dequeue_count {
        if n < 1 {
            return Err(error("maxDequeueCount", "must be at least 1".into()));
        }
        o.max_dequeue_count = n as u64;
    }
    if let Some(e) = &q.message_encoding {
        o.message_encoding = if e.eq_ignore_ascii_case("base64") {
            MessageEncoding::Base64
        } else if e.eq_ignore_ascii_case("none") {
            MessageEncoding::None
        } else {
            return Err(error(
                "messageEncoding",
                format!("{e:?}: use base64 or none"),
            ));
        };
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<QueuesOptions, ConfigError> {
        parse_queues(v, Path::new("host.json"))
    }

    #[test]
    fn every_option_is_read_and_range_checked() {
        let o = parse(serde_json::json!({"BatchSize": "4", "newBatchThreshold": 0,
            "maxPollingInterval": "00:00:05", "visibilityTimeout": "00:00:30",
            "maxDequeueCount": 3, "messageEncoding": "None"}))
        .unwrap();
        assert_eq!(
            o,
            QueuesOptions {
                batch_size: 4,
                new_batch_threshold: Some(0),
                max_polling_interval: Duration::from_secs(5),
                visibility_timeout: Duration::from_secs(30),
                max_dequeue_count: 3,
                message_encoding: MessageEncoding::None,
            }
        );
        let field = |v| parse(v).unwrap_err().field;
        assert_eq!(
            field(serde_json::json!({"batchSize": 0})),
            "extensions.queues.batchSize"
        );
        assert_eq!(
            field(serde_json::json!({"newBatchThreshold": -1})),
            "extensions.queues.newBatchThreshold"
        );
        assert_eq!(
            field(serde_json::json!({"visibilityTimeout": "8.00:00:00"})),
            "extensions.queues.visibilityTimeout"
        );
        assert_eq!(
            field(serde_json::json!({"maxDequeueCount": 0})),
            "extensions.queues.maxDequeueCount"
        );
        assert_eq!(
            field(serde_json::json!({"messageEncoding": "utf8"})),
            "extensions.queues.messageEncoding"
        );
        assert_eq!(
            field(serde_json::json!({"prefetch": 1})),
            "extensions.queues.prefetch"
        );
    }
}
