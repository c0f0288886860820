//! The shared driver kit: what several drivers use, so that no driver imports another —
//! range items ([`range`]), the adapter that registers a driver ([`hooks`]), and the small
//! checks and row edits below (blob targets, queue targets, whether the scan ended, dropping
//! nulls, how a range item is re-read).

pub mod deletes;
pub mod hooks;
pub mod range;

use crate::app::config::Config;
use crate::app::error::ApiError;
use crate::app::job::request::check_connection;
use crate::app::job::{ScanContext, WorkError};
use crate::app::state::AppState;
use crate::app::tracking::ScanState;
use crate::storage::blob::check_container;
use crate::storage::stores::Stores;
use crate::storage::Entity;

/// 4xx naming `field` unless `connection` is allowed and has a blob endpoint.
pub fn check_blob_connection(
    config: &Config,
    field: &str,
    connection: &str,
) -> Result<(), ApiError> {
    check_connection(config, field, connection)?;
    config.connections[connection]
        .blob_endpoint()
        .map(|_| ())
        .map_err(|missing| ApiError::field(field, missing))
}

/// 4xx naming `field` for a container name the service would refuse.
pub fn check_container_field(field: &str, container: &str) -> Result<(), ApiError> {
    check_container(container).map_err(|e| ApiError::field(field, e.message))
}

/// 4xx naming `field` for a queue a driver writes to on `connection`: an allowed connection, a
/// name the service accepts (Azure's rules exactly: 3-63 characters; the app's own queues are
/// held to 56 so that their `-poison` queues fit, a destination is not), and no name that
/// starts with one of the app's own queues' — the step, copy and cleanup queues, their
/// `-poison` queues and whatever else the host or a later version derives from them
/// (`tablescan-prefixscan-poison-poison`) — refused by name on every connection, as the
/// bookkeeping tables are, so that an alias of the app's account that is not recognised as one
/// cannot reach them either.
pub fn check_queue_target(
    config: &Config,
    field: &str,
    connection: &str,
    queue: &str,
) -> Result<(), ApiError> {
    check_connection(config, field, connection)?;
    crate::app::validate::destination_queue_name(queue).map_err(|m| ApiError::field(field, m))?;
    let own = [
        &config.prefix_scan_queue,
        &config.table_copy_queue,
        &config.cleanup_queue,
    ];
    if let Some(own) = own.iter().find(|q| queue.starts_with(q.as_str())) {
        return Err(ApiError::field(
            field,
            format!("{queue} starts with {own}, the name of one of tablescan's own queues"),
        ));
    }
    Ok(())
}

/// Whether this instance knows that scan `scan_id` has ended (cancelled, or failed by another
/// item): its state cache says so, kept fresh while an invocation works (`work::watch`). No
/// request. A driver starts no further unit of work that writes (a put, a batch, a blob) once
/// it does, and hands nothing on; what it did counts (`work::watch`'s invariants).
pub fn scan_ended<S: Stores>(state: &AppState<S>, scan_id: &str) -> bool {
    state
        .scan_states
        .get(scan_id)
        .is_some_and(|s| s != ScanState::Running)
}

/// Removes the properties whose value is `null` (and their annotations): the service answers
/// a selected property an entity lacks as null, and stores no nulls.
pub fn drop_nulls(row: &mut Entity) {
    let nulls: Vec<String> = row
        .properties
        .iter()
        .filter(|(_, value)| value.get() == "null")
        .map(|(name, _)| name.to_string())
        .collect();
    for name in nulls {
        row.properties.remove(&name);
        row.properties.remove(&format!("{name}@odata.type"));
    }
}

/// How a range item of `scan` is re-read: `select` (`None`: every column; `Some(vec![])`: keys
/// only), the scan's filter, and the test-only failure switch.
pub fn read_spec<S: Stores>(
    state: &AppState<S>,
    scan: &ScanContext,
    select: Option<Vec<String>>,
) -> Result<range::ReadSpec, WorkError> {
    Ok(range::ReadSpec {
        select,
        filter: scan.row_filter()?,
        fail_prefix: state.config.test_fail_prefix.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_targets_follow_azure_and_spare_tablescans_own() {
        let config = Config::from_lookup(|name| {
            (name == "AzureWebJobsStorage").then(|| "UseDevelopmentStorage=true".to_string())
        })
        .unwrap();
        let check =
            |q: &str| check_queue_target(&config, "destinationQueue", "AzureWebJobsStorage", q);
        for ok in [
            "abc",
            "a-b-c",
            &"a".repeat(57),
            &"a".repeat(63),
            "rows1",
            "9-a",
            "my-tablescan-prefixscan",
            "tablescan-prefix",
            "tablescan-table-copy",
        ] {
            assert!(check(ok).is_ok(), "{ok}");
        }
        for bad in [
            "ab",
            &"a".repeat(64),
            "-ab",
            "ab-",
            "a--b",
            "Abc",
            "a_b",
            "tablescan-prefixscan",
            "tablescan-tablecopy",
            "tablescan-prefixscan-poison",
            "tablescan-tablecopy-poison",
            "tablescan-prefixscan-cleanup",
            "tablescan-prefixscan-cleanup-poison",
            "tablescan-prefixscan-poison-poison",
            "tablescan-tablecopy-poison-poison",
            "tablescan-tablecopy2",
            "tablescan-prefixscan-x",
        ] {
            match check(bad) {
                Err(ApiError::InvalidField { field, .. }) => {
                    assert_eq!(field, "destinationQueue", "{bad}")
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
        let unknown = check_queue_target(&config, "destinationQueue", "Nope", "rows");
        assert!(unknown.is_err());
    }
}
