//! Restoring a chain of exports (docs/backups.md): at start the import walks from the delta it
//! was given to the chain's base, checking each parent's manifest against the SHA-256 its child
//! recorded and the table it names; every member's parts and tombstone files are verified
//! (phase 0, one member after another) before any row is written; then each member is written
//! in its own phase, base first — its rows upserted and its tombstones deleted — so that each
//! key ends as its latest word in the chain says.
//!
//! Invariants: a broken chain (a parent missing, changed, of another table, or a chain longer
//! than [`MAX_CHAIN_MEMBERS`]) is refused before anything is written, naming the member; within
//! one delta a key is never both written and tombstoned (`export_chain`), so a member's writes
//! and deletes may run in any order; a tombstone of a row already gone is not an error.

use std::sync::atomic::{AtomicBool, Ordering};

use futures::stream::{self, StreamExt};
use serde::{Deserialize, Serialize};

use crate::app::export_chain::MAX_CHAIN_MEMBERS;
use crate::app::export_format::{sha256_hex, ExportLayout, Manifest, MAX_MANIFEST_BYTES};
use crate::app::job::{ScanContext, WorkError};
use crate::app::pace::Meter;
use crate::app::state::AppState;
use crate::storage::blob::BlobStore;
use crate::storage::stores::Stores;
use crate::storage::{BatchOperation, Entity, StorageError, TableStore};

use super::{ImportOptions, PartRef};
use crate::app::drivers::kit::range::batches_of;

/// The write phase root's result for the chain's last member: no phase follows.
pub const LAST_MEMBER: &str = "last-member";

/// One export of a restored chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainMember {
    pub prefix: String,
    pub sha256: String,
}

impl ImportOptions {
    /// Members restored (1 without a chain).
    pub(super) fn members(&self) -> u64 {
        self.chain.len().max(1) as u64
    }

    /// The manifest digest member `member` must have.
    pub(super) fn member_sha256(&self, member: u64) -> Option<String> {
        match self.chain.get(member as usize) {
            Some(m) => Some(m.sha256.clone()),
            None => self.manifest_sha256.clone(),
        }
    }

    /// Where member `member`'s blobs are.
    pub(super) fn member_layout(&self, member: u64) -> Result<ExportLayout, WorkError> {
        let prefix = self
            .chain
            .get(member as usize)
            .map_or(&self.prefix, |m| &m.prefix);
        ExportLayout::new(prefix).map_err(|e| WorkError::Permanent(e.to_string()))
    }
}

/// What member `member`'s write phase (and its verification) goes through: its parts, then its
/// tombstone files.
pub(super) fn listed(manifest: &Manifest, member: u64) -> Vec<PartRef> {
    let parts = manifest
        .parts
        .iter()
        .map(|p| PartRef::listed(p, member, false));
    let deleted = manifest.delta.iter().flat_map(|d| &d.deleted);
    parts
        .chain(deleted.map(|p| PartRef::listed(p, member, true)))
        .collect()
}

/// The chain ending at the delta `last` (its manifest's digest `sha256`), base first.
pub(super) async fn walk<S: Stores>(
    state: &AppState<S>,
    context: &ScanContext,
    options: &ImportOptions,
    last: &Manifest,
    sha256: &str,
) -> Result<Vec<ChainMember>, WorkError> {
    let blobs = state.blob_store(&context.source.connection, &Meter::new())?;
    let container = &options.container;
    let mut chain = vec![ChainMember {
        prefix: options.prefix.clone(),
        sha256: sha256.to_string(),
    }];
    let mut child = last.clone();
    // Bounded: at most MAX_CHAIN_MEMBERS manifests are read.
    while let Some(delta) = child.delta.clone() {
        let parent = &delta.parent;
        let broken = |why: String| {
            WorkError::Permanent(format!(
                "the chain is broken at {container}/{}: {why}; nothing was written",
                parent.prefix
            ))
        };
        if chain.len() >= MAX_CHAIN_MEMBERS {
            return Err(broken(format!(
                "the chain is longer than {MAX_CHAIN_MEMBERS} exports"
            )));
        }
        let layout = ExportLayout::new(&parent.prefix).map_err(|e| broken(e.to_string()))?;
        let bytes = match blobs
            .download(container, &layout.manifest_blob(), MAX_MANIFEST_BYTES)
            .await
        {
            Err(e) if e.is_not_found() => return Err(broken("its manifest is missing".into())),
            other => other?.bytes,
        };
        let actual = sha256_hex(&bytes);
        if actual != parent.sha256 {
            return Err(broken(format!(
                "its manifest's SHA-256 is {actual}, but its delta recorded {}",
                parent.sha256
            )));
        }
        let manifest = Manifest::parse(&bytes).map_err(|e| broken(e.to_string()))?;
        if manifest.source_table != last.source_table {
            return Err(broken(format!(
                "it is an export of table {:?}, not {:?}",
                manifest.source_table, last.source_table
            )));
        }
        chain.push(ChainMember {
            prefix: parent.prefix.clone(),
            sha256: actual,
        });
        if manifest.delta.is_none() && parent.prefix != delta.base {
            return Err(broken(format!(
                "it is a full export, but the chain's base is {}",
                delta.base
            )));
        }
        child = manifest;
    }
    chain.reverse();
    Ok(chain)
}

/// Deletes the rows with `rows`' keys in same-partition batches, `concurrency` at a time, as
/// `import::write_rows` writes; a batch refused because a row is already gone is retried row by
/// row, each gone row counted as done. Returns the tombstones applied.
pub(super) async fn delete_rows<S: TableStore>(
    target: &S,
    table: &str,
    rows: Vec<Entity>,
    (concurrency, ended): (usize, &(dyn Fn() -> bool + Sync)),
) -> Result<u64, (u64, StorageError)> {
    let delete = |e: Entity| BatchOperation::Delete {
        row_key: e.row_key,
        etag: None,
    };
    let stop = AtomicBool::new(false);
    let stop = &stop;
    let results: Vec<Result<u64, StorageError>> = stream::iter(batches_of(rows, delete))
        .map(|(pk, ops)| async move {
            if stop.load(Ordering::Relaxed) || ended() {
                return Ok(0);
            }
            let done = match target.submit_batch(table, &pk, &ops).await {
                Err(e) if e.is_not_found() => one_by_one(target, table, &pk, &ops).await,
                other => other.map(|_| ops.len() as u64),
            };
            if done.is_err() {
                stop.store(true, Ordering::Relaxed);
            }
            done
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let written = results.iter().filter_map(|r| r.as_ref().ok()).sum();
    match results.into_iter().find_map(Result::err) {
        Some(e) => Err((written, e)),
        None => Ok(written),
    }
}

async fn one_by_one<S: TableStore>(
    target: &S,
    table: &str,
    pk: &str,
    ops: &[BatchOperation],
) -> Result<u64, StorageError> {
    for op in ops {
        match target
            .submit_batch(table, pk, std::slice::from_ref(op))
            .await
        {
            Ok(_) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(ops.len() as u64)
}
