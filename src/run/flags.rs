//! The flags of a scan request: one flag per field of `POST /api/scans` (`--source-table` is
//! `sourceTable`), turned into the request body the API validates, and an API error's field
//! turned back into its flag.
//!
//! Invariants:
//! - a flag is the kebab-case spelling of its field, and [`flag_of`] inverts it, so every error
//!   the API names a field for names the flag the user typed;
//! - nothing here checks a value beyond its JSON type (a number, a boolean): every check is the
//!   API's own (`app::job::request` and the drivers), so `run` and the app refuse alike;
//! - a field the flags below do not name yet (a driver added later) is given as
//!   `--field NAME=JSON`, checked by the API like any other.

use clap::Args;
use serde_json::{Map, Value};

/// The fields of `POST /api/scans` as flags (docs/api.md has every field, default and limit).
#[derive(Debug, Clone, Default, Args)]
pub struct ScanFlags {
    /// sourceTable: the table scanned (not for import).
    #[arg(long)]
    pub source_table: Option<String>,
    /// sourceConnection: the app setting (environment variable) of the source's account.
    #[arg(long)]
    pub source_connection: Option<String>,
    /// destinationTable: copy, import.
    #[arg(long)]
    pub destination_table: Option<String>,
    /// destinationConnection: the destination's account (its tables, blobs or queues).
    #[arg(long)]
    pub destination_connection: Option<String>,
    /// destinationQueue: enqueue.
    #[arg(long)]
    pub destination_queue: Option<String>,
    /// rowsPerMessage: enqueue, 1..=100.
    #[arg(long, allow_negative_numbers = true)]
    pub rows_per_message: Option<i64>,
    /// messageEncoding: enqueue, base64 or none.
    #[arg(long)]
    pub message_encoding: Option<String>,
    /// destinationContainer: export, index.
    #[arg(long)]
    pub destination_container: Option<String>,
    /// destinationPrefix: export, index.
    #[arg(long)]
    pub destination_prefix: Option<String>,
    /// sourceContainer: import.
    #[arg(long)]
    pub source_container: Option<String>,
    /// sourcePrefix: import.
    #[arg(long)]
    pub source_prefix: Option<String>,
    /// property: index.
    #[arg(long)]
    pub property: Option<String>,
    /// keepSupersededSeconds: index.
    #[arg(long, allow_negative_numbers = true)]
    pub keep_superseded_seconds: Option<i64>,
    /// confirm: delete; must equal --source-table.
    #[arg(long)]
    pub confirm: Option<String>,
    /// filter: an OData condition on non-key properties.
    #[arg(long)]
    pub filter: Option<String>,
    /// select: properties to write besides the keys, comma-separated (or the flag repeated).
    #[arg(long, value_delimiter = ',')]
    pub select: Option<Vec<String>>,
    /// strategy: prefix or serial.
    #[arg(long)]
    pub strategy: Option<String>,
    /// partitionKeyPrefix.
    #[arg(long)]
    pub partition_key_prefix: Option<String>,
    /// partitionKeyLowerBound (exclusive).
    #[arg(long)]
    pub partition_key_lower_bound: Option<String>,
    /// partitionKeyUpperBound (exclusive).
    #[arg(long)]
    pub partition_key_upper_bound: Option<String>,
    /// takeCount: page size, 1..=1000.
    #[arg(long, allow_negative_numbers = true)]
    pub take_count: Option<i64>,
    /// expandPartitionKeys: true or false.
    #[arg(long)]
    pub expand_partition_keys: Option<bool>,
    /// segmentsPerFirstPrefix: 1..=16.
    #[arg(long, allow_negative_numbers = true)]
    pub segments_per_first_prefix: Option<i64>,
    /// segmentsPerSubsequentPrefix: 1..=16.
    #[arg(long, allow_negative_numbers = true)]
    pub segments_per_subsequent_prefix: Option<i64>,
    /// workSplit: copy, page or partitionKey.
    #[arg(long)]
    pub work_split: Option<String>,
    /// maxRequestsPerSecond: the scan's storage request rate limit, 10..=20000.
    #[arg(long, allow_negative_numbers = true)]
    pub max_requests_per_second: Option<i64>,
    /// Any other field of the request, as NAME=JSON (e.g. --field 'takeCount=500'); a value
    /// that is not JSON is taken as a string.
    #[arg(long = "field", value_name = "NAME=JSON")]
    pub fields: Vec<String>,
}

/// A refusal before the API is asked: a `--field` that is not `NAME=VALUE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlagError(pub String);

impl ScanFlags {
    /// The request body of `driver` with these flags, fields in the order of the API's table.
    pub fn body(&self, driver: &str) -> Result<Map<String, Value>, FlagError> {
        let text = |v: &Option<String>| v.clone().map(Value::from);
        let number = |v: &Option<i64>| v.map(Value::from);
        let pairs: [(&str, Option<Value>); 26] = [
            ("sourceTable", text(&self.source_table)),
            ("sourceConnection", text(&self.source_connection)),
            ("destinationTable", text(&self.destination_table)),
            ("destinationConnection", text(&self.destination_connection)),
            ("destinationQueue", text(&self.destination_queue)),
            ("rowsPerMessage", number(&self.rows_per_message)),
            ("messageEncoding", text(&self.message_encoding)),
            ("destinationContainer", text(&self.destination_container)),
            ("destinationPrefix", text(&self.destination_prefix)),
            ("sourceContainer", text(&self.source_container)),
            ("sourcePrefix", text(&self.source_prefix)),
            ("property", text(&self.property)),
            (
                "keepSupersededSeconds",
                number(&self.keep_superseded_seconds),
            ),
            ("confirm", text(&self.confirm)),
            ("filter", text(&self.filter)),
            ("select", self.select.clone().map(Value::from)),
            ("strategy", text(&self.strategy)),
            ("partitionKeyPrefix", text(&self.partition_key_prefix)),
            (
                "partitionKeyLowerBound",
                text(&self.partition_key_lower_bound),
            ),
            (
                "partitionKeyUpperBound",
                text(&self.partition_key_upper_bound),
            ),
            ("takeCount", number(&self.take_count)),
            (
                "expandPartitionKeys",
                self.expand_partition_keys.map(Value::from),
            ),
            (
                "segmentsPerFirstPrefix",
                number(&self.segments_per_first_prefix),
            ),
            (
                "segmentsPerSubsequentPrefix",
                number(&self.segments_per_subsequent_prefix),
            ),
            ("workSplit", text(&self.work_split)),
            (
                "maxRequestsPerSecond",
                number(&self.max_requests_per_second),
            ),
        ];
        let mut body = Map::new();
        body.insert("driver".into(), Value::from(driver));
        for (field, value) in pairs {
            if let Some(value) = value {
                body.insert(field.into(), value);
            }
        }
        for pair in &self.fields {
            let (name, value) = pair
                .split_once('=')
                .filter(|(n, _)| !n.is_empty())
                .ok_or_else(|| FlagError(format!("--field: {pair:?} is not NAME=VALUE")))?;
            let value = serde_json::from_str(value).unwrap_or_else(|_| Value::from(value));
            body.insert(name.to_string(), value);
        }
        Ok(body)
    }
}

/// The flag of an API error's `field` (a path such as `select[3]` names its flag): `driver`
/// is the `<DRIVER>` argument, a whole-body error has no flag.
pub fn flag_of(field: &str) -> Option<String> {
    let name = field
        .split(['.', '['])
        .next()
        .unwrap_or_default()
        .trim_start_matches('.');
    match name {
        "" | "body" => None,
        "driver" => Some("<DRIVER>".into()),
        _ => {
            let mut flag = String::from("--");
            for c in name.chars() {
                if c.is_ascii_uppercase() {
                    flag.push('-');
                    flag.push(c.to_ascii_lowercase());
                } else {
                    flag.push(c);
                }
            }
            Some(flag)
        }
    }
}

/// An API error's message with its field named as the flag: `takeCount: must be …` becomes
/// `--take-count: must be …`.
pub fn flag_message(field: Option<&str>, message: &str) -> String {
    let Some(field) = field else {
        return message.to_string();
    };
    let Some(flag) = flag_of(field) else {
        return message.to_string();
    };
    let rest = message
        .strip_prefix(field)
        .and_then(|r| r.strip_prefix(':'))
        .map(str::trim_start)
        .unwrap_or(message);
    format!("{flag}: {rest}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_become_flags_and_back() {
        assert_eq!(flag_of("takeCount").as_deref(), Some("--take-count"));
        assert_eq!(flag_of("select[3]").as_deref(), Some("--select"));
        assert_eq!(flag_of("confirm").as_deref(), Some("--confirm"));
        assert_eq!(flag_of("driver").as_deref(), Some("<DRIVER>"));
        assert_eq!(flag_of("body"), None);
        assert_eq!(
            flag_message(Some("takeCount"), "takeCount: must be 1..=1000, got 0"),
            "--take-count: must be 1..=1000, got 0"
        );
        assert_eq!(
            flag_message(Some("confirm"), "must equal sourceTable"),
            "--confirm: must equal sourceTable"
        );
    }

    #[test]
    fn the_body_holds_the_flags_given_and_the_extra_fields() {
        let flags = ScanFlags {
            source_table: Some("Packages".into()),
            select: Some(vec!["A".into(), "B".into()]),
            take_count: Some(0),
            fields: vec!["rowsPerMessage=4".into(), "note=plain text".into()],
            ..ScanFlags::default()
        };
        let body = Value::Object(flags.body("copy").unwrap());
        assert_eq!(
            body,
            serde_json::json!({"driver": "copy", "sourceTable": "Packages", "select": ["A", "B"],
                "takeCount": 0, "rowsPerMessage": 4, "note": "plain text"})
        );
        let bad = ScanFlags {
            fields: vec!["=1".into()],
            ..ScanFlags::default()
        };
        assert!(bad.body("copy").unwrap_err().0.starts_with("--field"));
    }
}
