//! `"keep": N` on an export schedule: once a run has completed, the blobs of the schedule's
//! older export prefixes are deleted, keeping the newest N completed ones.
//!
//! Invariants:
//! - only prefixes older than the N-th newest COMPLETED run are deleted, so N complete exports
//!   always remain;
//! - a run whose scan is still running is never pruned, whatever its age;
//! - each run's prefix is its own (`keep` requires `{dueTime}` in `destinationPrefix`, checked
//!   at PUT, and stamps have one length, so no run's prefix is a prefix of another's);
//! - a pruned run is marked (`Pruned`) after its blobs are gone: a pruning interrupted midway is
//!   done again by the next run, deleting what is left.

use serde_json::Value;

use crate::app::job::request::default_connection;
use crate::app::pace::Meter;
use crate::app::state::AppState;
use crate::app::tracking::ScanState;
use crate::storage::blob::BlobStore;
use crate::storage::stores::Stores;
use crate::storage::StorageError;

use super::store::{Outcome, Run, Schedule, ScheduleStore, KEPT_RUNS};

/// After a due time was handled: prunes old exports (with `keep`) and old run rows. Returns a
/// note for the log line.
pub async fn after_run<S: Stores>(
    state: &AppState<S>,
    store: &ScheduleStore<'_, S::Table>,
    schedule: &Schedule,
) -> Result<String, StorageError> {
    let runs = store.runs(&schedule.name, KEPT_RUNS + 10).await?;
    let mut note = String::new();
    if let Some(keep) = schedule.def.keep {
        let pruned = prune_exports(state, store, schedule, &runs, keep as usize).await?;
        if pruned > 0 {
            note = format!("; deleted the exports of {pruned} older run(s)");
        }
    }
    store.trim_runs(&schedule.name, &runs).await?;
    Ok(note)
}

/// The runs to prune, given each candidate's scan state (newest first): those older than the
/// `keep`-th completed one, except any still running. Pure.
pub fn to_prune(runs: &[(Run, Option<ScanState>)], keep: usize) -> Vec<usize> {
    let Some(kth) = runs
        .iter()
        .enumerate()
        .filter(|(_, (_, state))| *state == Some(ScanState::Completed))
        .nth(keep.saturating_sub(1))
        .map(|(i, _)| i)
    else {
        return Vec::new();
    };
    (kth + 1..runs.len())
        .filter(|&i| runs[i].1 != Some(ScanState::Running))
        .collect()
}

async fn prune_exports<S: Stores>(
    state: &AppState<S>,
    store: &ScheduleStore<'_, S::Table>,
    schedule: &Schedule,
    runs: &[Run],
    keep: usize,
) -> Result<usize, StorageError> {
    let tracker = state.tracker_on(state.bookkeeping());
    let mut candidates = Vec::new();
    for run in runs {
        if run.prefix.is_none() || run.pruned || run.outcome == Outcome::Skipped {
            continue;
        }
        let scan_state = match &run.scan_id {
            Some(id) => tracker.get_scan(id).await?.map(|r| r.state),
            None => None,
        };
        // A run claimed moments ago whose scan is not recorded yet may be starting.
        let scan_state = match (run.outcome, scan_state) {
            (Outcome::Starting, None) => Some(ScanState::Running),
            (_, s) => s,
        };
        candidates.push((run.clone(), scan_state));
    }
    let scan = &schedule.def.scan;
    let text = |field: &str| scan.get(field).and_then(Value::as_str).map(str::to_string);
    let connection = text("destinationConnection").unwrap_or_else(default_connection);
    let Some(container) = text("destinationContainer") else {
        return Ok(0);
    };
    let blobs = state.blob_store(&connection, &Meter::new())?;
    let chosen = to_prune(&candidates, keep);
    for &i in &chosen {
        let mut run = candidates[i].0.clone();
        let prefix = run.prefix.clone().unwrap_or_default();
        delete_prefix(&blobs, &container, &folder(&prefix)).await?;
        run.pruned = true;
        store.update_run(&schedule.name, &run).await?;
    }
    Ok(chosen.len())
}

/// An export prefix as the export writes under it: a "folder" ending with `/`.
fn folder(prefix: &str) -> String {
    if prefix.is_empty() || prefix.ends_with('/') {
        prefix.to_string()
    } else {
        format!("{prefix}/")
    }
}

/// Deletes every blob whose name starts with `prefix` (never the whole container: an empty
/// prefix deletes nothing).
async fn delete_prefix<B: BlobStore>(
    blobs: &B,
    container: &str,
    prefix: &str,
) -> Result<(), StorageError> {
    if prefix.is_empty() {
        return Ok(());
    }
    loop {
        // Deleting as we go: each listing from the start finds what is left.
        let page = blobs.list(container, prefix, 1000, None).await?;
        if page.blobs.is_empty() {
            return Ok(());
        }
        for blob in &page.blobs {
            blobs.delete(container, &blob.name).await?;
        }
    }
}

#[cfg(test)]
mod tests {
    use time::macros::datetime;

    use super::*;

    fn run(n: i64) -> Run {
        Run {
            due: datetime!(2026-11-28 03:00:00 UTC) - time::Duration::days(n),
            outcome: Outcome::Started,
            scan_id: Some(format!("{n}")),
            error: None,
            prefix: Some(format!("p/{n}")),
            claim: String::new(),
            pruned: false,
        }
    }

    #[test]
    fn keeps_n_completed_and_never_a_running_one() {
        use ScanState::*;
        let states = [
            Some(Running),   // 0: newest, still running
            Some(Completed), // 1
            Some(Failed),    // 2
            Some(Completed), // 3: the 2nd completed
            Some(Running),   // 4: old but running: kept
            Some(Completed), // 5
            None,            // 6: record removed
        ];
        let runs: Vec<_> = states
            .iter()
            .enumerate()
            .map(|(i, s)| (run(i as i64), *s))
            .collect();
        assert_eq!(to_prune(&runs, 2), vec![5, 6]);
        assert_eq!(to_prune(&runs, 3), vec![6]);
        assert_eq!(to_prune(&runs, 4), Vec::<usize>::new());
        assert_eq!(to_prune(&runs, 1), vec![2, 3, 5, 6]);
    }
}
