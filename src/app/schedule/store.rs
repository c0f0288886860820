//! Where schedules live: rows of the scans table (a bookkeeping table), in partitions no scan id
//! can have (scan ids are hex digits and `-`; these start with `~`). The format, with its golden
//! file, is in docs/schedules.md ("Stored format").
//!
//! - `~schedules` / `<name>`: the schedule: `Cron`, `Scan` (the scan body, JSON text),
//!   `Overlap`, `Keep` (optional), `NextDue` (a stamp, `20261128T030000Z`; absent when the
//!   expression matches no later date), `LastDue` and `LastScan` (the last started run).
//! - `~runs-<name>` / `<999999999999 − due time in Unix seconds, 12 digits>`: one run, newest
//!   first: `Due`, `Outcome` (`starting`, `started`, `skipped`, `failed`), `ScanId`, `Error`,
//!   `Prefix` (an export's destination prefix), `Claim` (who inserted it), `Pruned`.
//!
//! Invariants:
//! - an idle firing reads one query: `PartitionKey eq '~schedules' and NextDue le '<now>'`
//!   (stamps compare as strings in time order), a table that does not exist being no schedule;
//! - a run row is only ever inserted by [`ScheduleStore::claim_run`]; the insert that succeeds
//!   is the one run of its due time (a retried insert recognises its own row by `Claim`);
//! - the schedule row's firing updates are merges under the ETag the firing read: a firing
//!   that lost a race (another instance, or a PUT in between) changes nothing.

use time::OffsetDateTime;

use crate::storage::odata;
use crate::storage::{BatchOperation, Entity, Filter, Query, StorageError, StorageErrorKind};
use crate::storage::{CompareOp, TableStore};

use super::{parse_stamp, stamp, Overlap, ScheduleDef};

/// The partition of the schedule rows.
pub const SCHEDULES: &str = "~schedules";
/// How many run rows a schedule keeps (older ones are deleted as new ones are claimed).
pub const KEPT_RUNS: usize = 50;

/// The partition of a schedule's run rows.
pub fn runs_partition(name: &str) -> String {
    format!("~runs-{name}")
}

/// A run row's key: newest first.
pub fn run_key(due: OffsetDateTime) -> String {
    format!("{:012}", 999_999_999_999i64 - due.unix_timestamp())
}

/// A stored schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    pub name: String,
    pub def: ScheduleDef,
    pub next_due: Option<OffsetDateTime>,
    pub last_due: Option<OffsetDateTime>,
    pub last_scan: Option<String>,
    pub etag: String,
}

/// What became of a due time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Claimed; the scan is being started (or its starter stopped before it said).
    Starting,
    Started,
    /// `overlap: skip` and the previous run was still running.
    Skipped,
    /// The scan could not start; `Run::error` says why.
    Failed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Starting => "starting",
            Outcome::Started => "started",
            Outcome::Skipped => "skipped",
            Outcome::Failed => "failed",
        }
    }

    fn parse(s: &str) -> Option<Outcome> {
        Some(match s {
            "starting" => Outcome::Starting,
            "started" => Outcome::Started,
            "skipped" => Outcome::Skipped,
            "failed" => Outcome::Failed,
            _ => return None,
        })
    }
}

/// One run row.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub due: OffsetDateTime,
    pub outcome: Outcome,
    pub scan_id: Option<String>,
    pub error: Option<String>,
    pub prefix: Option<String>,
    pub claim: String,
    pub pruned: bool,
}

/// The schedule rows of one bookkeeping table.
pub struct ScheduleStore<'a, T> {
    pub store: &'a T,
    pub table: &'a str,
}

impl<T: TableStore> ScheduleStore<'_, T> {
    /// The schedules due at `now`: one query (one request unless more than a page is due).
    pub async fn due_schedules(&self, now: OffsetDateTime) -> Result<Vec<Schedule>, StorageError> {
        let due =
            odata::parse(&format!("NextDue le '{}'", stamp(now))).expect("a stamp filter parses");
        self.query_schedules(Filter::and(vec![
            Filter::pk(CompareOp::Eq, SCHEDULES),
            Filter::Where(due),
        ]))
        .await
    }

    /// Every schedule, by name.
    pub async fn list(&self) -> Result<Vec<Schedule>, StorageError> {
        self.query_schedules(Filter::pk(CompareOp::Eq, SCHEDULES))
            .await
    }

    async fn query_schedules(&self, filter: Filter) -> Result<Vec<Schedule>, StorageError> {
        let rows = self.query_all(filter, None).await?;
        Ok(rows.into_iter().filter_map(parse_schedule).collect())
    }

    /// Every row `filter` matches (at most `top`), following continuations; none if the table
    /// does not exist yet.
    async fn query_all(
        &self,
        filter: Filter,
        top: Option<usize>,
    ) -> Result<Vec<Entity>, StorageError> {
        let mut query = Query {
            filter: Some(filter),
            top: top.map(|t| t.min(1000) as u32),
            select: None,
            continuation: None,
        };
        let mut rows = Vec::new();
        loop {
            let page = match self.store.query_page(self.table, &query).await {
                Err(e) if e.is_not_found() => return Ok(rows),
                other => other?,
            };
            rows.extend(page.entities);
            match page.continuation {
                Some(c) if top.map_or(true, |t| rows.len() < t) => query.continuation = Some(c),
                _ => return Ok(rows),
            }
        }
    }

    pub async fn get(&self, name: &str) -> Result<Option<Schedule>, StorageError> {
        Ok(
            match self.store.get_entity(self.table, SCHEDULES, name).await {
                Err(e) if e.is_not_found() => None,
                other => other?.and_then(|(entity, etag)| {
                    parse_schedule(entity).map(|s| Schedule { etag, ..s })
                }),
            },
        )
    }

    /// Records `def` as schedule `name` due next at `next_due`, keeping the last run of the
    /// `existing` row (replaced under its ETag; inserted when there is none). A 409 or 412 means
    /// another PUT got there first.
    pub async fn put(
        &self,
        name: &str,
        def: &ScheduleDef,
        next_due: Option<OffsetDateTime>,
        existing: Option<&Schedule>,
    ) -> Result<(), StorageError> {
        let mut entity = Entity::new(SCHEDULES, name);
        let p = &mut entity.properties;
        p.insert("Cron", def.cron.clone().into());
        p.insert("Scan", def.scan.to_string().into());
        p.insert("Overlap", def.overlap.as_str().into());
        if let Some(keep) = def.keep {
            p.insert("Keep", keep.into());
        }
        if let Some(next) = next_due {
            p.insert("NextDue", stamp(next).into());
        }
        if let Some(old) = existing {
            if let Some(due) = old.last_due {
                p.insert("LastDue", stamp(due).into());
            }
            if let Some(scan) = &old.last_scan {
                p.insert("LastScan", scan.clone().into());
            }
        }
        let op = match existing {
            Some(old) => BatchOperation::Replace {
                entity,
                etag: Some(old.etag.clone()),
            },
            None => BatchOperation::Insert(entity),
        };
        self.store.submit_batch(self.table, SCHEDULES, &[op]).await
    }

    /// Records a firing's result on the schedule row, under the ETag it was read with: the next
    /// due time and, when a run started, its due time and scan. `false`: the row changed since
    /// (another firing or a PUT won), nothing written.
    pub async fn advance(
        &self,
        schedule: &Schedule,
        next_due: Option<OffsetDateTime>,
        started: Option<(OffsetDateTime, &str)>,
    ) -> Result<bool, StorageError> {
        let mut entity = Entity::new(SCHEDULES, schedule.name.as_str());
        let p = &mut entity.properties;
        // A merge cannot remove a property: no later date is an empty stamp, which no `le`
        // comparison with a real stamp selects.
        p.insert("NextDue", next_due.map(stamp).unwrap_or_default().into());
        if let Some((due, scan)) = started {
            p.insert("LastDue", stamp(due).into());
            p.insert("LastScan", scan.into());
        }
        let op = BatchOperation::Merge {
            entity,
            etag: Some(schedule.etag.clone()),
        };
        match self.store.submit_batch(self.table, SCHEDULES, &[op]).await {
            Err(e)
                if matches!(
                    e.kind,
                    StorageErrorKind::PreconditionFailed | StorageErrorKind::NotFound
                ) =>
            {
                Ok(false)
            }
            other => other.map(|()| true),
        }
    }

    /// Deletes the schedule and its run rows; `false` if there was none.
    pub async fn delete(&self, name: &str) -> Result<bool, StorageError> {
        let op = BatchOperation::Delete {
            row_key: name.to_string(),
            etag: None,
        };
        let existed = match self.store.submit_batch(self.table, SCHEDULES, &[op]).await {
            Err(e) if e.is_not_found() => false,
            other => other.map(|()| true)?,
        };
        let partition = runs_partition(name);
        let rows = self
            .query_all(Filter::pk(CompareOp::Eq, partition.as_str()), None)
            .await?;
        self.delete_rows(&partition, rows.iter().map(|r| r.row_key.clone()))
            .await?;
        Ok(existed)
    }

    async fn delete_rows(
        &self,
        partition: &str,
        keys: impl Iterator<Item = String>,
    ) -> Result<(), StorageError> {
        let ops: Vec<_> = keys
            .map(|row_key| BatchOperation::Delete {
                row_key,
                etag: None,
            })
            .collect();
        for chunk in ops.chunks(100) {
            match self.store.submit_batch(self.table, partition, chunk).await {
                Err(e) if e.is_not_found() => {}
                other => other?,
            }
        }
        Ok(())
    }

    /// Inserts `run`'s row; `false` if another claim holds its due time.
    pub async fn claim_run(&self, name: &str, run: &Run) -> Result<bool, StorageError> {
        let partition = runs_partition(name);
        let op = BatchOperation::Insert(run_entity(&partition, run));
        match self.store.submit_batch(self.table, &partition, &[op]).await {
            Ok(()) => Ok(true),
            // The adapter may have retried an insert whose answer was lost: ours if it holds
            // our claim.
            Err(e) if e.kind == StorageErrorKind::Conflict => {
                let held = self
                    .store
                    .get_entity(self.table, &partition, &run_key(run.due))
                    .await?;
                Ok(
                    held.and_then(|(e, _)| e.properties.get_str("Claim"))
                        == Some(run.claim.clone()),
                )
            }
            Err(e) => Err(e),
        }
    }

    /// Rewrites a claimed run's row (its outcome, error, prefix, pruned mark).
    pub async fn update_run(&self, name: &str, run: &Run) -> Result<(), StorageError> {
        let partition = runs_partition(name);
        let op = BatchOperation::Replace {
            entity: run_entity(&partition, run),
            etag: None,
        };
        self.store.submit_batch(self.table, &partition, &[op]).await
    }

    /// The schedule's newest runs, at most `top`.
    pub async fn runs(&self, name: &str, top: usize) -> Result<Vec<Run>, StorageError> {
        let partition = runs_partition(name);
        let rows = self
            .query_all(Filter::pk(CompareOp::Eq, partition.as_str()), Some(top))
            .await?;
        Ok(rows.into_iter().take(top).filter_map(parse_run).collect())
    }

    /// Deletes the run rows past the newest [`KEPT_RUNS`] of `runs` (newest first), keeping any
    /// an export prefix is still kept by (not pruned).
    pub async fn trim_runs(&self, name: &str, runs: &[Run]) -> Result<(), StorageError> {
        let old = runs
            .iter()
            .skip(KEPT_RUNS)
            .filter(|r| r.prefix.is_none() || r.pruned)
            .map(|r| run_key(r.due));
        self.delete_rows(&runs_partition(name), old).await
    }
}

fn run_entity(partition: &str, run: &Run) -> Entity {
    let mut entity = Entity::new(partition, run_key(run.due));
    let p = &mut entity.properties;
    p.insert("Due", stamp(run.due).into());
    p.insert("Outcome", run.outcome.as_str().into());
    p.insert("Claim", run.claim.clone().into());
    for (name, value) in [
        ("ScanId", &run.scan_id),
        ("Error", &run.error),
        ("Prefix", &run.prefix),
    ] {
        if let Some(v) = value {
            p.insert(name, v.clone().into());
        }
    }
    if run.pruned {
        p.insert("Pruned", true.into());
    }
    entity
}

fn parse_run(entity: Entity) -> Option<Run> {
    let p = &entity.properties;
    Some(Run {
        due: parse_stamp(&p.get_str("Due")?)?,
        outcome: Outcome::parse(&p.get_str("Outcome")?)?,
        scan_id: p.get_str("ScanId"),
        error: p.get_str("Error"),
        prefix: p.get_str("Prefix"),
        claim: p.get_str("Claim").unwrap_or_default(),
        pruned: p.get_value("Pruned").and_then(|v| v.as_bool()) == Some(true),
    })
}

fn parse_schedule(entity: Entity) -> Option<Schedule> {
    let p = &entity.properties;
    let overlap = match p.get_str("Overlap").as_deref() {
        Some("allow") => Overlap::Allow,
        _ => Overlap::Skip,
    };
    let def = ScheduleDef {
        cron: p.get_str("Cron")?,
        scan: serde_json::from_str(&p.get_str("Scan")?).ok()?,
        overlap,
        keep: p
            .get_value("Keep")
            .and_then(|v| v.as_u64())
            .map(|k| k as u32),
    };
    Some(Schedule {
        name: entity.row_key.clone(),
        def,
        next_due: p.get_str("NextDue").and_then(|s| parse_stamp(&s)),
        last_due: p.get_str("LastDue").and_then(|s| parse_stamp(&s)),
        last_scan: p.get_str("LastScan"),
        etag: String::new(),
    })
}
