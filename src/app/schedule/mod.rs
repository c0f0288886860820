//! Schedules: scans that recur (docs/schedules.md). `PUT /api/schedules/{name}` records a cron
//! expression and a `POST /api/scans` body; the `Scheduler` timer function starts the scans that
//! are due.
//!
//! Invariants (each kept by the module named):
//! 1. A schedule's scan body passes the same checks as `POST /api/scans` before anything is
//!    recorded (`api`, through `start_scan::check`); a refused PUT writes nothing.
//! 2. Exactly one run per (schedule, due time), whatever the instances, duplicate firings or
//!    restarts: a run is claimed by inserting its run row (`store::claim_run`, an insert that
//!    fails if the row exists) before anything starts, and the scan it starts has an id derived
//!    from the schedule and the due time ([`scan_id`]).
//! 3. Which due time to run, skip or leave is decided by the pure `decide::decide` over the
//!    schedule, its last started run and the injected clock's now.
//! 4. An idle firing (nothing due) costs one storage request: one query of the schedules whose
//!    recorded next due time has come (`store::due_schedules`).
//! 5. A run that cannot start is recorded as a failed run (its error on the run row); the
//!    schedule moves on to its next due time.

pub mod api;
pub mod decide;
pub mod fire;
pub mod keep;
pub mod store;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use time::OffsetDateTime;

/// What a due time does while the schedule's last scan still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Overlap {
    /// Record the due time as skipped (the default).
    #[default]
    Skip,
    /// Start another scan anyway.
    Allow,
}

impl Overlap {
    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Skip => "skip",
            Overlap::Allow => "allow",
        }
    }
}

/// A schedule as `PUT /api/schedules/{name}` takes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScheduleDef {
    pub cron: String,
    pub scan: Value,
    #[serde(default)]
    pub overlap: Overlap,
    /// For export scans: how many of the schedule's completed exports to keep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep: Option<u32>,
}

/// The longest schedule name.
pub const MAX_NAME: usize = 63;
/// The placeholder an export's `destinationPrefix` may hold.
pub const DUE_TIME_PLACEHOLDER: &str = "{dueTime}";

/// Whether `name` is a schedule name: 1–63 ASCII letters, digits and `-`.
pub fn is_valid_name(name: &str) -> bool {
    (1..=MAX_NAME).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// A due time as schedules store and show it, and as `{dueTime}` becomes: `20261128T030000Z`.
pub fn stamp(t: OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}{:02}{:02}T{:02}{:02}{:02}Z",
        t.year(),
        t.month() as u8,
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// Reads a [`stamp`] back.
pub fn parse_stamp(text: &str) -> Option<OffsetDateTime> {
    let format = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    time::PrimitiveDateTime::parse(text, format)
        .ok()
        .map(|t| t.assume_utc())
}

/// The id of the scan a schedule starts for a due time: the scan id form (inverted milliseconds,
/// so ids still sort newest first, then 8 hex digits), with the due time's milliseconds and the
/// first 32 bits of the name's XXH3-64. The same (schedule, due time) always gives the same id.
pub fn scan_id(name: &str, due: OffsetDateTime) -> String {
    let millis = (due.unix_timestamp_nanos() / 1_000_000) as u64;
    let hash = xxhash_rust::xxh3::xxh3_64(name.as_bytes()) >> 32;
    format!(
        "{:013}-{:08x}",
        9_999_999_999_999u64.saturating_sub(millis),
        hash
    )
}

/// The scan body of a run at `due`: `{dueTime}` in `destinationPrefix` replaced by its stamp.
pub fn scan_body_at(scan: &Value, due: OffsetDateTime) -> Value {
    let mut body = scan.clone();
    if let Some(Value::String(prefix)) = body.get_mut("destinationPrefix") {
        *prefix = prefix.replace(DUE_TIME_PLACEHOLDER, &stamp(due));
    }
    body
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use time::macros::datetime;

    use super::*;

    #[test]
    fn names_stamps_and_ids() {
        assert!(is_valid_name("nightly-export-2"));
        assert!(!is_valid_name(""));
        assert!(!is_valid_name(&"a".repeat(64)));
        assert!(!is_valid_name("a_b") && !is_valid_name("a b") && !is_valid_name("é"));
        let due = datetime!(2026-11-28 03:00:00 UTC);
        assert_eq!(stamp(due), "20261128T030000Z");
        assert_eq!(parse_stamp("20261128T030000Z"), Some(due));
        assert_eq!(scan_id("nightly", due), scan_id("nightly", due));
        assert_ne!(scan_id("nightly", due), scan_id("hourly", due));
        assert!(crate::app::job::is_valid_scan_id(&scan_id("nightly", due)));
        let body = scan_body_at(
            &json!({"driver": "export", "destinationPrefix": "logs/{dueTime}/"}),
            due,
        );
        assert_eq!(body["destinationPrefix"], "logs/20261128T030000Z/");
    }
}
