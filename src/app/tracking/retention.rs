//! Retention: what an ended scan leaves behind, and how it goes (docs/retention.md).
//!
//! Invariants:
//! 1. Only an ended scan loses rows, and its work rows (work items and counters) go only once
//!    its record holds its final counters (`FinalCounters`), so a status read never depends on
//!    rows that may be gone, and never sees zeros for a scan that did work.
//! 2. The record outlives the work rows: a record is deleted only once `WorkRemovedAt` is on it
//!    (or, for a record the sweep finds without it, after its cleanup removed the rows). A late
//!    message of a scan whose rows are gone therefore finds the scan ended and is dropped without
//!    writing (a missing row is "nothing to drop"); a message of a scan whose record is gone finds
//!    no scan and writes nothing either.
//! 3. Work rows go no earlier than `TABLESCAN_WORK_RETENTION` after the end, far longer than any
//!    invocation that saw the scan running can still run (`INVOCATION_TIMEOUT` plus the 2 s a
//!    cached `running` state is trusted): so no execution can still register children (an
//!    Insert) after the rows went.
//! 4. Every step is idempotent and bounded: a delivery deletes at most
//!    [`MAX_DELETE_BATCHES`] transactions of at most 100 rows, and the sweep of expired records
//!    reads one query page of at most [`SWEEP_RECORDS`] records.

use std::time::Duration;

use time::OffsetDateTime;

use super::codec::{get_str, get_time, put_str, put_time};
use super::records::{ScanRecord, ScanState, SCAN_ROW};
use super::{again, contention, shard_partition, Counters, Tracker};
use crate::retry::Verdict;
use crate::storage::{
    odata, BatchOperation, CompareOp, Entity, Filter, Query, StorageError, StorageErrorKind,
    TableStore, MAX_BATCH_OPERATIONS,
};

/// The record's property holding its final counters (JSON of [`Counters`]), written before any
/// of its work rows is deleted.
pub const FINAL_COUNTERS: &str = "FinalCounters";
/// The record's property saying when its last work row was deleted (`Edm.DateTime`).
pub const WORK_REMOVED_AT: &str = "WorkRemovedAt";
/// Most delete transactions one cleanup delivery submits (≤ 100 rows each).
pub const MAX_DELETE_BATCHES: usize = 20;
/// Most expired records one sweep reads (and deletes or hands to a cleanup).
pub const SWEEP_RECORDS: u32 = 10;
/// A scan id whose record is missing this long after the id's start time will never get one:
/// a start writes the record within its own request, which runs at most 9.5 minutes.
const RECORD_APPEARS_WITHIN: time::Duration = time::Duration::minutes(15);
/// Below this, a work retention could delete rows while an execution that saw the scan running
/// still runs (longer than `INVOCATION_TIMEOUT` plus the cached-state trust).
pub const SAFE_WORK_RETENTION: Duration = Duration::from_secs(15 * 60);

/// A scan record as retention sees it: the record, its completion lease, its kept summary.
#[derive(Debug, Clone)]
pub struct Kept {
    pub record: ScanRecord,
    pub lease: Option<OffsetDateTime>,
    /// The final counters, once the cleanup recorded them (then they are what a status shows).
    pub final_counters: Option<Counters>,
    pub work_removed_at: Option<OffsetDateTime>,
}

/// What a cleanup delivery does next for a scan, given the time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// Nothing yet: come back after this long.
    Wait(Duration),
    /// Record the final counters and delete work rows.
    RemoveWork,
    /// Delete the record.
    RemoveRecord,
}

/// The retention periods (app settings `TABLESCAN_WORK_RETENTION`, `TABLESCAN_SCAN_RETENTION`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub work: Duration,
    pub scan: Duration,
}

impl Retention {
    /// What is due for a scan that ended at `ended`, at `now`.
    pub fn due(&self, ended: OffsetDateTime, work_removed: bool, now: OffsetDateTime) -> Due {
        let (period, step) = match work_removed {
            false => (self.work, Due::RemoveWork),
            true => (self.scan, Due::RemoveRecord),
        };
        let at = ended + period;
        if now >= at {
            step
        } else {
            Due::Wait((at - now).try_into().unwrap_or(Duration::ZERO))
        }
    }
}

/// Parses a period: a whole number and a unit, `s`, `m`, `h` or `d` (`90s`, `36h`, `30d`).
/// Hand-written: four units; a crate would be a dependency for one line of arithmetic.
pub fn parse_period(text: &str) -> Result<Duration, String> {
    let unit = text.chars().last().unwrap_or(' ');
    let seconds = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3_600,
        'd' => 86_400,
        _ => {
            return Err(format!(
                "{text:?} is not a period like 90s, 15m, 36h or 30d"
            ))
        }
    };
    let number: u64 = text[..text.len() - 1]
        .parse()
        .map_err(|_| format!("{text:?} is not a period like 90s, 15m, 36h or 30d"))?;
    number
        .checked_mul(seconds)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{text:?} is too long"))
}

/// The partition key from which the scans table holds the scans started at or before `t` (ids
/// are inverted milliseconds, see `start_scan::new_scan_id`).
pub fn started_by_key(t: OffsetDateTime) -> String {
    let millis = (t.unix_timestamp_nanos() / 1_000_000).max(0) as u64;
    format!("{:013}", 9_999_999_999_999u64.saturating_sub(millis))
}

/// When scan `scan_id` started, read from its id (`None`: not an id this version makes).
pub fn started_at(scan_id: &str) -> Option<OffsetDateTime> {
    let digits = scan_id.get(..13)?;
    let inverted: u64 = digits.parse().ok()?;
    let millis = 9_999_999_999_999u64.checked_sub(inverted)?;
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(millis) * 1_000_000).ok()
}

/// Whether a missing record of `scan_id` can still appear (a start in progress): not once its
/// id is [`RECORD_APPEARS_WITHIN`] old, so a message of a pruned scan is dropped at once.
pub fn record_may_appear(scan_id: &str, now: OffsetDateTime) -> bool {
    started_at(scan_id).map_or(true, |t| now - t < RECORD_APPEARS_WITHIN)
}

/// [`record_may_appear`] for a message kept waiting for its record rather than dropped: only for
/// an id that parses and did not start in the future (beyond [`CLOCK_SKEW`]), as every start's
/// does, so a forged id cannot keep a message waiting for ever.
pub fn start_in_progress(scan_id: &str, now: OffsetDateTime) -> bool {
    started_at(scan_id).is_some_and(|t| t - now < CLOCK_SKEW && now - t < RECORD_APPEARS_WITHIN)
}

/// How far ahead of this instance's clock another instance's may be.
const CLOCK_SKEW: time::Duration = time::Duration::minutes(5);

/// Splits a partition's row keys into delete transactions of at most 100 rows, at most
/// `max_batches` of them (the rest waits for the next delivery).
pub fn delete_batches(row_keys: &[String], max_batches: usize) -> Vec<Vec<BatchOperation>> {
    row_keys
        .chunks(MAX_BATCH_OPERATIONS)
        .take(max_batches)
        .map(|chunk| {
            chunk
                .iter()
                .map(|k| BatchOperation::Delete {
                    row_key: k.clone(),
                    etag: None,
                })
                .collect()
        })
        .collect()
}

impl<T: TableStore> Tracker<'_, T> {
    /// The scan's record with its lease and kept summary (one point read).
    pub async fn get_kept(&self, scan_id: &str) -> Result<Option<Kept>, StorageError> {
        match self
            .store
            .get_entity(self.scans_table, scan_id, SCAN_ROW)
            .await
        {
            Ok(found) => Ok(found.and_then(|(e, etag)| Self::parse_kept(e, etag))),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn parse_kept(entity: Entity, etag: String) -> Option<Kept> {
        let p = &entity.properties;
        let final_counters = get_str(p, FINAL_COUNTERS).and_then(|t| serde_json::from_str(&t).ok());
        let work_removed_at = get_time(p, WORK_REMOVED_AT);
        let lease = get_time(p, super::records::LEASE_PROPERTY);
        Some(Kept {
            final_counters,
            work_removed_at,
            lease,
            record: Self::parse_scan(entity, etag)?,
        })
    }

    /// The final counters of an ended scan, recorded on its record if they are not yet (merge
    /// conditional on the record's ETag; a concurrent cleanup's are kept). Read from the counter
    /// rows, so only before any of them is deleted (invariant 1).
    pub async fn keep_final_counters(&self, kept: &Kept) -> Result<Counters, StorageError> {
        let id = kept.record.id.clone();
        let mut kept = kept.clone();
        let mut schedule = contention();
        loop {
            if let Some(counters) = kept.final_counters {
                return Ok(counters);
            }
            let counters = self.totals(&id, kept.record.shards).await?;
            let mut entity = Entity::new(id.clone(), SCAN_ROW);
            let text = serde_json::to_string(&counters).expect("counters serialize");
            put_str(&mut entity.properties, FINAL_COUNTERS, &text);
            let op = BatchOperation::Merge {
                entity,
                etag: Some(kept.record.etag.clone()),
            };
            match self.store.submit_batch(self.scans_table, &id, &[op]).await {
                Ok(()) => return Ok(counters),
                Err(e) if e.kind == StorageErrorKind::PreconditionFailed => {
                    again(&mut schedule, Verdict::Retry, "scan record").await?;
                    kept = self.get_kept(&id).await?.ok_or_else(|| gone(&id))?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Deletes up to [`MAX_DELETE_BATCHES`] transactions of the scan's work rows (items and
    /// counters), shard by shard. `true`: none is left.
    pub async fn remove_some_work(&self, scan_id: &str, shards: u32) -> Result<bool, StorageError> {
        let mut budget = MAX_DELETE_BATCHES;
        for shard in 0..shards {
            let pk = shard_partition(scan_id, shard);
            while budget > 0 {
                let keys = self.row_keys(&pk, budget).await?;
                if keys.is_empty() {
                    break;
                }
                for ops in delete_batches(&keys, budget) {
                    budget -= 1;
                    match self.store.submit_batch(self.work_table, &pk, &ops).await {
                        Ok(()) => {}
                        // Another delivery deleted some of them: it, or our next one, goes on.
                        Err(e) if e.is_not_found() => return Ok(false),
                        Err(e) => return Err(e),
                    }
                }
            }
            if budget == 0 {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Up to `batches × 100` row keys of one partition of the work table (one query page).
    async fn row_keys(&self, pk: &str, batches: usize) -> Result<Vec<String>, StorageError> {
        let query = Query {
            filter: Some(Filter::pk(CompareOp::Eq, pk)),
            top: Some((batches * MAX_BATCH_OPERATIONS).min(1_000) as u32),
            select: Some(vec!["RowKey".to_string()]),
            continuation: None,
        };
        let page = self.store.query_page(self.work_table, &query).await?;
        Ok(page.entities.into_iter().map(|e| e.row_key).collect())
    }

    /// Notes on the record that its work rows are gone (idempotent; a missing record is fine).
    pub async fn mark_work_removed(&self, scan_id: &str) -> Result<(), StorageError> {
        let mut entity = Entity::new(scan_id, SCAN_ROW);
        put_time(&mut entity.properties, WORK_REMOVED_AT, self.now());
        let op = BatchOperation::Merge { entity, etag: None };
        self.on_record_if_any(scan_id, op).await
    }

    /// Deletes a scan's record (idempotent).
    pub async fn delete_record(&self, scan_id: &str) -> Result<(), StorageError> {
        let op = BatchOperation::Delete {
            row_key: SCAN_ROW.to_string(),
            etag: None,
        };
        self.on_record_if_any(scan_id, op).await
    }

    /// Applies `op` to a scan's record; a missing record (already removed) is not an error.
    async fn on_record_if_any(
        &self,
        scan_id: &str,
        op: BatchOperation,
    ) -> Result<(), StorageError> {
        match self
            .store
            .submit_batch(self.scans_table, scan_id, &[op])
            .await
        {
            Err(e) if e.is_not_found() => Ok(()),
            other => other,
        }
    }

    /// Up to [`SWEEP_RECORDS`] records of scans that ended before `cutoff` (one query page:
    /// scans started by then, `CompletedAt` before it).
    pub async fn expired_records(&self, cutoff: OffsetDateTime) -> Result<Vec<Kept>, StorageError> {
        let ended = odata::parse(&format!(
            "CompletedAt lt datetime'{}'",
            super::format_time(cutoff)
        ))
        .expect("a valid condition");
        let query = Query {
            filter: Some(Filter::and(vec![
                Filter::pk(CompareOp::Ge, started_by_key(cutoff)),
                Filter::rk(CompareOp::Eq, SCAN_ROW),
                Filter::Where(ended),
            ])),
            top: Some(SWEEP_RECORDS),
            select: None,
            continuation: None,
        };
        let page = match self.store.query_page(self.scans_table, &query).await {
            Err(e) if e.is_not_found() => return Ok(Vec::new()),
            other => other?,
        };
        Ok(page
            .entities
            .into_iter()
            .filter_map(|e| Self::parse_kept(e, String::new()))
            .filter(|k| k.record.state != ScanState::Running)
            .collect())
    }
}

fn gone(scan_id: &str) -> StorageError {
    StorageError::new(
        StorageErrorKind::NotFound,
        format!("scan record {scan_id} is gone"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_parse_with_a_unit() {
        assert_eq!(parse_period("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_period("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_period("36h"), Ok(Duration::from_secs(36 * 3600)));
        assert_eq!(parse_period("30d"), Ok(Duration::from_secs(30 * 86_400)));
        for bad in [
            "",
            "d",
            "30",
            "1.5d",
            "-1d",
            "30 d",
            "1w",
            "99999999999999999999d",
        ] {
            assert!(parse_period(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn deletes_are_batched_by_100_within_the_budget() {
        let keys: Vec<String> = (0..450).map(|i| format!("w{i:04}")).collect();
        let batches = delete_batches(&keys, 20);
        assert_eq!(
            batches.iter().map(Vec::len).collect::<Vec<_>>(),
            [100, 100, 100, 100, 50]
        );
        let deleted: Vec<&str> = batches.iter().flatten().map(|o| o.row_key()).collect();
        assert_eq!(deleted, keys.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(batches
            .iter()
            .flatten()
            .all(|o| matches!(o, BatchOperation::Delete { etag: None, .. })));
        assert_eq!(delete_batches(&keys, 2).len(), 2, "the budget bounds them");
        assert!(delete_batches(&[], 20).is_empty());
    }

    #[test]
    fn what_is_due_follows_the_periods() {
        let r = Retention {
            work: Duration::from_secs(60),
            scan: Duration::from_secs(600),
        };
        let end = OffsetDateTime::from_unix_timestamp(1_000_000).unwrap();
        let at = |s: i64| end + time::Duration::seconds(s);
        assert_eq!(
            r.due(end, false, at(10)),
            Due::Wait(Duration::from_secs(50))
        );
        assert_eq!(r.due(end, false, at(60)), Due::RemoveWork);
        assert_eq!(
            r.due(end, true, at(60)),
            Due::Wait(Duration::from_secs(540))
        );
        assert_eq!(r.due(end, true, at(601)), Due::RemoveRecord);
    }

    #[test]
    fn scan_ids_tell_when_their_scan_started() {
        let now = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let id = format!("{}-0000abcd", started_by_key(now));
        assert_eq!(started_at(&id), Some(now));
        assert!(record_may_appear(&id, now + time::Duration::minutes(14)));
        assert!(!record_may_appear(&id, now + time::Duration::minutes(16)));
        assert!(record_may_appear("not-an-id", now), "unknown ids wait");
        // Older scans sort after newer ones: `started_by_key` bounds them from below.
        let older = format!("{}-00000000", started_by_key(now - time::Duration::days(1)));
        assert!(older > started_by_key(now));
    }
}

#[cfg(test)]
mod settings_tests {
    use std::collections::BTreeMap;

    use crate::app::config::Config;

    fn config(pairs: &[(&str, &str)]) -> Result<Config, crate::app::config::ConfigError> {
        let mut map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        map.insert(
            "AzureWebJobsStorage".into(),
            "UseDevelopmentStorage=true".into(),
        );
        Config::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn retention_settings_are_checked_naming_them() {
        let defaults = config(&[]).unwrap();
        assert_eq!(defaults.retention.work.as_secs(), 86_400);
        assert_eq!(defaults.retention.scan.as_secs(), 30 * 86_400);
        assert_eq!(defaults.cleanup_queue, "tablescan-prefixscan-cleanup");
        for (pairs, named) in [
            (
                vec![("TABLESCAN_WORK_RETENTION", "1w")],
                "TABLESCAN_WORK_RETENTION",
            ),
            (
                vec![("TABLESCAN_WORK_RETENTION", "0s")],
                "TABLESCAN_WORK_RETENTION",
            ),
            (
                vec![("TABLESCAN_SCAN_RETENTION", "3651d")],
                "TABLESCAN_SCAN_RETENTION",
            ),
            (
                vec![("TABLESCAN_SCAN_RETENTION", "12h")],
                "TABLESCAN_SCAN_RETENTION",
            ),
            (
                vec![("TABLESCAN_PREFIXSCAN_QUEUE", &*"q".repeat(50))],
                "TABLESCAN_PREFIXSCAN_QUEUE",
            ),
        ] {
            let e = config(&pairs)
                .err()
                .unwrap_or_else(|| panic!("{pairs:?} accepted"));
            assert_eq!(e.name, named, "{e}");
        }
        let short = config(&[
            ("TABLESCAN_WORK_RETENTION", "2s"),
            ("TABLESCAN_SCAN_RETENTION", "2s"),
        ])
        .unwrap();
        assert_eq!(short.retention.scan.as_secs(), 2);
    }
}
