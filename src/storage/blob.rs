//! Blob Storage as export and import need it: the [`BlobStore`] interface, its request counters,
//! and the name and size rules both adapters check before sending (the Azure adapter in
//! [`super::azure_blob`], the in-memory one in `memory_blob` under `lab`).
//!
//! What the interface offers, nothing more: create a container if missing; upload a block blob
//! in one request (content type and encoding, an optional precondition) and get its ETag; stage
//! blocks and commit a block list (a blob assembled over several invocations, e.g. a manifest);
//! read a blob's block list; download a blob up to a size bound; read properties (or learn it does
//! not exist); list blobs under a prefix one bounded page at a time, with a continuation marker;
//! delete a blob (idempotent: a missing blob is not an error).
//!
//! Invariants:
//! - Every input is checked here before anything is sent (one `check_*` function per operation:
//!   names, block ids, the bounds below), so both adapters refuse the same requests alike.
//! - Every loop whose work comes from storage is bounded: a download reads at most `max_bytes`
//!   (+1 to detect more), a listing returns at most [`MAX_LIST_RESULTS`] blobs per call, a commit
//!   names at most [`MAX_COMMITTED_BLOCKS`] blocks.
//! - Errors are [`StorageError`]s of the same kinds as tables and queues (404 not found, 409
//!   conflict, 412 precondition failed, throttling and timeouts transient).
//! - Adapters count one request per attempt ([`BlobRequestCounters`]) and retry transient
//!   failures themselves, so callers see final outcomes only.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use serde::Serialize;

use super::{StorageError, StorageResult};

/// Most blobs one listing call returns (the service's own maximum).
pub const MAX_LIST_RESULTS: u32 = 5000;
/// Longest block id, in bytes before base64 (the service's limit).
pub const MAX_BLOCK_ID_BYTES: usize = 64;
/// Most blocks one committed block blob may have (the service's limit).
pub const MAX_COMMITTED_BLOCKS: usize = 50_000;
/// Largest body one upload or block request sends. Ours, not the service's (which allows
/// gigabytes): the body is held in memory, and the request must finish within the pooled HTTP
/// client's 60 s timeout.
pub const MAX_REQUEST_BODY_BYTES: usize = 64 * 1024 * 1024;
/// Longest blob name, in characters (the service's limit).
pub const MAX_BLOB_NAME_CHARS: usize = 1024;

/// What a written blob says about itself, and when it may be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobWrite {
    /// `Content-Type` stored with the blob (e.g. `application/gzip`).
    pub content_type: String,
    /// `Content-Encoding` stored with the blob, if any.
    pub content_encoding: Option<String>,
    pub condition: WriteCondition,
}

impl BlobWrite {
    /// Unconditional write of content of this type, with no content encoding.
    pub fn new(content_type: impl Into<String>) -> Self {
        BlobWrite {
            content_type: content_type.into(),
            content_encoding: None,
            condition: WriteCondition::Always,
        }
    }

    pub fn with_encoding(mut self, content_encoding: impl Into<String>) -> Self {
        self.content_encoding = Some(content_encoding.into());
        self
    }

    pub fn with_condition(mut self, condition: WriteCondition) -> Self {
        self.condition = condition;
        self
    }
}

/// When a write may replace what is there.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum WriteCondition {
    /// Create or replace.
    #[default]
    Always,
    /// Only if no blob has this name (`If-None-Match: *`); otherwise a
    /// [`super::StorageErrorKind::Conflict`] error (409 `BlobAlreadyExists`).
    IfNotExists,
    /// Only if the blob's ETag is this one (`If-Match`); otherwise, a missing blob included,
    /// [`super::StorageErrorKind::PreconditionFailed`] (412 `ConditionNotMet`).
    IfMatch(String),
}

/// A blob's properties, as a listing or a properties read reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobProperties {
    pub name: String,
    /// Content length in bytes.
    pub size: u64,
    /// The ETag, quoted or not as the service sent it: compare only with another from the same
    /// store, and pass it back as it is in [`WriteCondition::IfMatch`].
    pub etag: String,
    pub content_type: Option<String>,
    pub content_encoding: Option<String>,
}

/// A downloaded blob: its bytes and its properties.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Downloaded {
    pub bytes: Bytes,
    pub properties: BlobProperties,
}

/// One page of a listing. Only the absence of `next_marker` means the listing is finished (a
/// page may be short, even empty, and still carry one).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlobListPage {
    /// In name order.
    pub blobs: Vec<BlobProperties>,
    /// Where the next page starts; opaque.
    pub next_marker: Option<String>,
}

/// A block blob's blocks, by the ids their writers gave them (see [`BlobStore::put_block`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockListing {
    /// The committed blocks, in the blob's order.
    pub committed: Vec<String>,
    /// Blocks staged and not yet committed (the service discards them after a week, or when
    /// a commit leaves them out).
    pub uncommitted: Vec<String>,
}

/// A blob service: the operations export and import need. Implementations count every request
/// they send and retry transient failures themselves.
pub trait BlobStore: Send + Sync + 'static {
    /// Creates the container if missing; `Ok(false)` if it already existed.
    fn create_container(&self, container: &str)
        -> impl Future<Output = StorageResult<bool>> + Send;

    /// Uploads a whole block blob in one request (at most [`MAX_REQUEST_BODY_BYTES`]) and
    /// returns its new ETag.
    fn upload(
        &self,
        container: &str,
        name: &str,
        body: Bytes,
        write: &BlobWrite,
    ) -> impl Future<Output = StorageResult<String>> + Send;

    /// Stages one block of a block blob under `block_id` (1..=64 bytes of the caller's choosing;
    /// every block of one blob must have an id of the same length). Staging the same id again
    /// replaces the staged block, so a redelivered writer may repeat it.
    fn put_block(
        &self,
        container: &str,
        name: &str,
        block_id: &str,
        body: Bytes,
    ) -> impl Future<Output = StorageResult<()>> + Send;

    /// Commits the blob as these blocks in this order (each the latest staged block with that id,
    /// else the committed one) and returns the new ETag. Blocks left out are discarded.
    fn commit_blocks(
        &self,
        container: &str,
        name: &str,
        block_ids: &[String],
        write: &BlobWrite,
    ) -> impl Future<Output = StorageResult<String>> + Send;

    /// The blob's committed and staged blocks (both empty if there is no such blob).
    fn block_list(
        &self,
        container: &str,
        name: &str,
    ) -> impl Future<Output = StorageResult<BlockListing>> + Send;

    /// Downloads the blob if it is at most `max_bytes` long; a longer blob is an
    /// [`super::StorageErrorKind::InvalidInput`] error naming the bound, and at most
    /// `max_bytes + 1` bytes of it are read. A missing blob is a not-found error.
    fn download(
        &self,
        container: &str,
        name: &str,
        max_bytes: u64,
    ) -> impl Future<Output = StorageResult<Downloaded>> + Send;

    /// Bytes `offset..offset + len` of the blob (at most [`MAX_REQUEST_BODY_BYTES`]), fewer if
    /// the blob ends first; nothing, without a request, for `len` 0. A missing blob is a
    /// not-found error.
    fn download_range(
        &self,
        container: &str,
        name: &str,
        offset: u64,
        len: u64,
    ) -> impl Future<Output = StorageResult<Bytes>> + Send;

    /// The blob's properties, or `None` if it does not exist.
    fn properties(
        &self,
        container: &str,
        name: &str,
    ) -> impl Future<Output = StorageResult<Option<BlobProperties>>> + Send;

    /// One page of the blobs whose names start with `prefix`, in name order: at most
    /// `max_results` (1..=[`MAX_LIST_RESULTS`]), from `marker` (a previous page's `next_marker`).
    fn list(
        &self,
        container: &str,
        prefix: &str,
        max_results: u32,
        marker: Option<&str>,
    ) -> impl Future<Output = StorageResult<BlobListPage>> + Send;

    /// Deletes the blob (with its snapshots, if any): `Ok(true)` if it was there, `Ok(false)` if
    /// it was not (no error: a redelivered cleanup repeats its deletes). A missing container is
    /// a missing blob too.
    fn delete(
        &self,
        container: &str,
        name: &str,
    ) -> impl Future<Output = StorageResult<bool>> + Send;
}

/// The kinds of blob request counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlobRequestKind {
    /// Put Blob, Put Block, Put Block List.
    Write,
    /// Get Blob, Get Blob Properties, Get Block List.
    Read,
    /// List Blobs (one page).
    List,
    /// Create Container.
    Admin,
    /// Delete Blob.
    Delete,
}

/// Blob requests sent, by kind (each attempt counts: each is a billable transaction).
#[derive(Debug, Default)]
pub struct BlobRequestCounters {
    write: AtomicU64,
    read: AtomicU64,
    list: AtomicU64,
    admin: AtomicU64,
    delete: AtomicU64,
}

/// A point-in-time copy of [`BlobRequestCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct BlobRequestCounts {
    pub write: u64,
    pub read: u64,
    pub list: u64,
    pub admin: u64,
    pub delete: u64,
}

impl BlobRequestCounts {
    pub fn total(&self) -> u64 {
        self.write + self.read + self.list + self.admin + self.delete
    }
}

impl BlobRequestCounters {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn record(&self, kind: BlobRequestKind) {
        let cell = match kind {
            BlobRequestKind::Write => &self.write,
            BlobRequestKind::Read => &self.read,
            BlobRequestKind::List => &self.list,
            BlobRequestKind::Admin => &self.admin,
            BlobRequestKind::Delete => &self.delete,
        };
        cell.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> BlobRequestCounts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        BlobRequestCounts {
            write: get(&self.write),
            read: get(&self.read),
            list: get(&self.list),
            admin: get(&self.admin),
            delete: get(&self.delete),
        }
    }
}

/// A container name the service accepts: 3..=63 lowercase letters, digits and single hyphens,
/// starting and ending with a letter or digit.
pub fn check_container(container: &str) -> StorageResult<()> {
    let bytes = container.as_bytes();
    let valid = (3..=63).contains(&bytes.len())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
        && !container.contains("--");
    if valid {
        Ok(())
    } else {
        Err(StorageError::invalid_input(format!(
            "container name {container:?} is not valid: 3 to 63 lowercase letters, digits and \
             single hyphens, starting and ending with a letter or digit"
        )))
    }
}

/// A blob name that reaches the service as written: 1..=1024 characters, no control
/// characters, no `.`/`..` path segment (a URL would resolve it away), not ending in `/` or `.`.
pub fn check_blob_name(name: &str) -> StorageResult<()> {
    let problem = if name.is_empty() {
        Some("is empty")
    } else if name.chars().count() > MAX_BLOB_NAME_CHARS {
        Some("is longer than 1024 characters")
    } else if name.chars().any(char::is_control) {
        Some("holds a control character")
    } else if name
        .split('/')
        .any(|segment| segment == "." || segment == "..")
    {
        Some("has a `.` or `..` path segment")
    } else if name.ends_with('/') || name.ends_with('.') {
        Some("ends with `/` or `.`")
    } else {
        None
    };
    match problem {
        None => Ok(()),
        Some(problem) => Err(StorageError::invalid_input(format!(
            "blob name {name:?} {problem}"
        ))),
    }
}

/// A block id: 1..=64 bytes.
pub fn check_block_id(block_id: &str) -> StorageResult<()> {
    if block_id.is_empty() || block_id.len() > MAX_BLOCK_ID_BYTES {
        return Err(StorageError::invalid_input(format!(
            "block id {block_id:?} must be 1 to {MAX_BLOCK_ID_BYTES} bytes"
        )));
    }
    Ok(())
}

/// A block list to commit: 1..=50,000 valid ids, all of one length (the service's rule).
pub fn check_block_list(block_ids: &[String]) -> StorageResult<()> {
    if block_ids.is_empty() || block_ids.len() > MAX_COMMITTED_BLOCKS {
        return Err(StorageError::invalid_input(format!(
            "a block list needs 1 to {MAX_COMMITTED_BLOCKS} blocks, got {}",
            block_ids.len()
        )));
    }
    for id in block_ids {
        check_block_id(id)?;
        if id.len() != block_ids[0].len() {
            return Err(StorageError::invalid_input(format!(
                "block ids {:?} and {id:?} differ in length; every block of a blob needs an id of \
                 the same length",
                block_ids[0]
            )));
        }
    }
    Ok(())
}

/// A request body within [`MAX_REQUEST_BODY_BYTES`].
pub fn check_body(what: &str, body: &[u8]) -> StorageResult<()> {
    if body.len() > MAX_REQUEST_BODY_BYTES {
        return Err(StorageError::invalid_input(format!(
            "{what} is {} bytes, over the {MAX_REQUEST_BODY_BYTES}-byte bound of one request",
            body.len()
        )));
    }
    Ok(())
}

/// A listing's page size: 1..=[`MAX_LIST_RESULTS`].
pub fn check_max_results(max_results: u32) -> StorageResult<()> {
    if max_results == 0 || max_results > MAX_LIST_RESULTS {
        return Err(StorageError::invalid_input(format!(
            "a listing returns 1 to {MAX_LIST_RESULTS} blobs per page, asked {max_results}"
        )));
    }
    Ok(())
}

/// A blob's address: a valid container and blob name.
pub fn check_blob(container: &str, name: &str) -> StorageResult<()> {
    check_container(container)?;
    check_blob_name(name)
}

/// What [`BlobStore::upload`] checks before sending.
pub fn check_upload(container: &str, name: &str, body: &[u8]) -> StorageResult<()> {
    check_blob(container, name)?;
    check_body(&format!("blob {container}/{name}"), body)
}

/// What [`BlobStore::put_block`] checks before sending.
pub fn check_put_block(
    container: &str,
    name: &str,
    block_id: &str,
    body: &[u8],
) -> StorageResult<()> {
    check_blob(container, name)?;
    check_block_id(block_id)?;
    check_body(&format!("block {block_id:?} of {container}/{name}"), body)
}

/// What [`BlobStore::commit_blocks`] checks before sending.
pub fn check_commit(container: &str, name: &str, block_ids: &[String]) -> StorageResult<()> {
    check_blob(container, name)?;
    check_block_list(block_ids)
}

/// What [`BlobStore::download_range`] checks before sending.
pub fn check_range(container: &str, name: &str, len: u64) -> StorageResult<()> {
    check_blob(container, name)?;
    if len > MAX_REQUEST_BODY_BYTES as u64 {
        return Err(StorageError::invalid_input(format!(
            "a range of {len} bytes of {container}/{name} is over the {MAX_REQUEST_BODY_BYTES}-byte bound of one request"
        )));
    }
    Ok(())
}

/// What [`BlobStore::list`] checks before sending.
pub fn check_list(container: &str, max_results: u32) -> StorageResult<()> {
    check_container(container)?;
    check_max_results(max_results)
}

/// The error for a blob longer than a download's bound.
pub fn too_large(container: &str, name: &str, max_bytes: u64) -> StorageError {
    StorageError::invalid_input(format!(
        "blob {container}/{name} is larger than the {max_bytes}-byte bound of this download"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::StorageErrorKind;

    #[test]
    fn names_are_checked_as_the_service_would() {
        for good in ["abc", "export-2026", "a1b", &"x".repeat(63)] {
            check_container(good).unwrap();
        }
        for bad in [
            "ab",
            "Abc",
            "a--b",
            "-ab",
            "ab-",
            "a_b",
            &"x".repeat(64),
            "a.b",
        ] {
            let e = check_container(bad).unwrap_err();
            assert_eq!(e.kind, StorageErrorKind::InvalidInput);
            assert!(e.message.contains("container name"), "{e}");
        }
        for good in ["a", "p/parts/s1/c-00.jsonl.gz", "é/ü", &"n".repeat(1024)] {
            check_blob_name(good).unwrap();
        }
        for (bad, why) in [
            ("", "empty"),
            ("a/./b", "path segment"),
            ("../a", "path segment"),
            ("a/", "ends with"),
            ("a.", "ends with"),
            ("a\nb", "control"),
            (&"n".repeat(1025) as &str, "1024"),
        ] {
            let e = check_blob_name(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }

    #[test]
    fn block_lists_need_ids_of_one_length() {
        check_block_list(&["b-01".into(), "b-02".into()]).unwrap();
        assert!(check_block_list(&[]).is_err());
        let e = check_block_list(&["b-1".into(), "b-10".into()]).unwrap_err();
        assert!(e.message.contains("differ in length"), "{e}");
        assert!(check_block_id(&"x".repeat(65)).is_err());
        assert!(check_block_id("").is_err());
        check_block_id(&"x".repeat(64)).unwrap();
    }

    #[test]
    fn counters_count_by_kind() {
        let counters = BlobRequestCounters::new();
        counters.record(BlobRequestKind::Write);
        counters.record(BlobRequestKind::Write);
        counters.record(BlobRequestKind::List);
        counters.record(BlobRequestKind::Delete);
        let counts = counters.snapshot();
        assert_eq!((counts.write, counts.list, counts.read), (2, 1, 0));
        assert_eq!(counts.delete, 1);
        assert_eq!(counts.total(), 4);
        check_max_results(1).unwrap();
        check_max_results(MAX_LIST_RESULTS).unwrap();
        assert!(check_max_results(0).is_err() && check_max_results(5001).is_err());
    }
}
