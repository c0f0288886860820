//! An in-memory blob store for unit and property tests of what runs on [`BlobStore`]. Never a
//! stand-in for Azurite in integration tests.
//!
//! It keeps the rules callers rely on, checked the same way as the Azure adapter
//! (`blob::check_*`): containers must exist; an upload or a commit replaces the blob and discards
//! its staged blocks; a commit takes each id's latest staged block, else its committed one;
//! conditions answer 409 `BlobAlreadyExists` / 412 `ConditionNotMet`; listings come in name order,
//! a bounded page at a time, with an opaque marker; a download reads nothing past its bound; a
//! delete of a missing blob (or container) answers `false`, not an error.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};

use crate::storage::blob::{
    check_blob, check_commit, check_container, check_list, check_put_block, check_range,
    check_upload, too_large, BlobListPage, BlobProperties, BlobRequestCounters, BlobRequestKind,
    BlobStore, BlobWrite, BlockListing, Downloaded, WriteCondition,
};
use crate::storage::{StorageError, StorageResult};

struct Blob {
    bytes: Bytes,
    content_type: String,
    content_encoding: Option<String>,
    etag: String,
    /// The committed blocks, in order (empty for a blob uploaded whole).
    committed: Vec<(String, Bytes)>,
}

#[derive(Default)]
struct Container {
    blobs: BTreeMap<String, Blob>,
    /// Staged blocks by blob name, in the order first staged.
    staged: HashMap<String, Vec<(String, Bytes)>>,
}

#[derive(Default)]
struct State {
    containers: HashMap<String, Container>,
    next_etag: u64,
}

impl State {
    fn container(&mut self, container: &str) -> StorageResult<&mut Container> {
        self.containers.get_mut(container).ok_or_else(|| {
            StorageError::from_status(
                404,
                Some("ContainerNotFound".into()),
                format!("container {container} not found"),
            )
        })
    }

    fn etag(&mut self) -> String {
        self.next_etag += 1;
        format!("\"0x{:X}\"", self.next_etag)
    }

    /// Stores `bytes` as the blob if `write.condition` allows; returns the new ETag.
    fn write(
        &mut self,
        container: &str,
        name: &str,
        bytes: Bytes,
        committed: Vec<(String, Bytes)>,
        write: &BlobWrite,
    ) -> StorageResult<String> {
        let etag = self.etag();
        let c = self.container(container)?;
        let existing = c.blobs.get(name).map(|b| b.etag.as_str());
        match (&write.condition, existing) {
            (WriteCondition::IfNotExists, Some(_)) => {
                return Err(StorageError::from_status(
                    409,
                    Some("BlobAlreadyExists".into()),
                    format!("blob {container}/{name} already exists"),
                ))
            }
            (WriteCondition::IfMatch(expected), found) if found != Some(expected.as_str()) => {
                return Err(StorageError::from_status(
                    412,
                    Some("ConditionNotMet".into()),
                    format!("blob {container}/{name}: the ETag condition is not met"),
                ))
            }
            _ => {}
        }
        c.staged.remove(name);
        c.blobs.insert(
            name.to_string(),
            Blob {
                bytes,
                content_type: write.content_type.clone(),
                content_encoding: write.content_encoding.clone(),
                etag: etag.clone(),
                committed,
            },
        );
        Ok(etag)
    }
}

/// The in-memory blob store. Cloning shares the same containers and counters.
#[derive(Clone, Default)]
pub struct MemoryBlobStore {
    state: Arc<Mutex<State>>,
    counters: Arc<BlobRequestCounters>,
}

impl MemoryBlobStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// A store counting its requests in `counters`.
    pub fn with_counters(counters: Arc<BlobRequestCounters>) -> Self {
        MemoryBlobStore {
            state: Arc::default(),
            counters,
        }
    }

    pub fn counters(&self) -> &Arc<BlobRequestCounters> {
        &self.counters
    }

    fn request(&self, kind: BlobRequestKind) -> std::sync::MutexGuard<'_, State> {
        self.counters.record(kind);
        self.state.lock().unwrap()
    }
}

fn properties_of(name: &str, blob: &Blob) -> BlobProperties {
    BlobProperties {
        name: name.to_string(),
        size: blob.bytes.len() as u64,
        etag: blob.etag.clone(),
        content_type: Some(blob.content_type.clone()),
        content_encoding: blob.content_encoding.clone(),
    }
}

impl BlobStore for MemoryBlobStore {
    async fn create_container(&self, container: &str) -> StorageResult<bool> {
        check_container(container)?;
        let mut state = self.request(BlobRequestKind::Admin);
        if state.containers.contains_key(container) {
            return Ok(false);
        }
        state
            .containers
            .insert(container.to_string(), Container::default());
        Ok(true)
    }

    async fn upload(
        &self,
        container: &str,
        name: &str,
        body: Bytes,
        write: &BlobWrite,
    ) -> StorageResult<String> {
        check_upload(container, name, &body)?;
        self.request(BlobRequestKind::Write)
            .write(container, name, body, Vec::new(), write)
    }

    async fn put_block(
        &self,
        container: &str,
        name: &str,
        block_id: &str,
        body: Bytes,
    ) -> StorageResult<()> {
        check_put_block(container, name, block_id, &body)?;
        let mut state = self.request(BlobRequestKind::Write);
        let staged = state
            .container(container)?
            .staged
            .entry(name.to_string())
            .or_default();
        match staged.iter_mut().find(|(id, _)| id == block_id) {
            Some((_, bytes)) => *bytes = body,
            None => staged.push((block_id.to_string(), body)),
        }
        Ok(())
    }

    async fn commit_blocks(
        &self,
        container: &str,
        name: &str,
        block_ids: &[String],
        write: &BlobWrite,
    ) -> StorageResult<String> {
        check_commit(container, name, block_ids)?;
        let mut state = self.request(BlobRequestKind::Write);
        let c = state.container(container)?;
        let staged = c.staged.get(name);
        let committed = c.blobs.get(name).map(|b| &b.committed);
        let find = |list: Option<&Vec<(String, Bytes)>>, id: &str| {
            list.and_then(|l| l.iter().find(|(i, _)| i == id).map(|(_, b)| b.clone()))
        };
        let mut blocks = Vec::with_capacity(block_ids.len());
        let mut bytes = BytesMut::new();
        for id in block_ids {
            let block = find(staged, id)
                .or_else(|| find(committed, id))
                .ok_or_else(|| {
                    StorageError::from_status(
                        400,
                        Some("InvalidBlockList".into()),
                        format!("commit block list of blob {container}/{name}: no block {id:?}"),
                    )
                })?;
            bytes.extend_from_slice(&block);
            blocks.push((id.clone(), block));
        }
        state.write(container, name, bytes.freeze(), blocks, write)
    }

    async fn block_list(&self, container: &str, name: &str) -> StorageResult<BlockListing> {
        check_blob(container, name)?;
        let mut state = self.request(BlobRequestKind::Read);
        let c = state.container(container)?;
        let ids = |list: Option<&Vec<(String, Bytes)>>| -> Vec<String> {
            list.map(|l| l.iter().map(|(id, _)| id.clone()).collect())
                .unwrap_or_default()
        };
        Ok(BlockListing {
            committed: ids(c.blobs.get(name).map(|b| &b.committed)),
            uncommitted: ids(c.staged.get(name)),
        })
    }

    async fn download(
        &self,
        container: &str,
        name: &str,
        max_bytes: u64,
    ) -> StorageResult<Downloaded> {
        check_blob(container, name)?;
        let mut state = self.request(BlobRequestKind::Read);
        let blob = state
            .container(container)?
            .blobs
            .get(name)
            .ok_or_else(|| blob_not_found(container, name))?;
        if blob.bytes.len() as u64 > max_bytes {
            return Err(too_large(container, name, max_bytes));
        }
        Ok(Downloaded {
            bytes: blob.bytes.clone(),
            properties: properties_of(name, blob),
        })
    }

    async fn download_range(
        &self,
        container: &str,
        name: &str,
        offset: u64,
        len: u64,
    ) -> StorageResult<Bytes> {
        check_range(container, name, len)?;
        if len == 0 {
            return Ok(Bytes::new());
        }
        let mut state = self.request(BlobRequestKind::Read);
        let blob = state
            .container(container)?
            .blobs
            .get(name)
            .ok_or_else(|| blob_not_found(container, name))?;
        let size = blob.bytes.len() as u64;
        let start = offset.min(size) as usize;
        let end = offset.saturating_add(len).min(size) as usize;
        Ok(blob.bytes.slice(start..end))
    }

    async fn properties(
        &self,
        container: &str,
        name: &str,
    ) -> StorageResult<Option<BlobProperties>> {
        check_blob(container, name)?;
        let state = self.request(BlobRequestKind::Read);
        Ok(state
            .containers
            .get(container)
            .and_then(|c| c.blobs.get(name))
            .map(|blob| properties_of(name, blob)))
    }

    async fn list(
        &self,
        container: &str,
        prefix: &str,
        max_results: u32,
        marker: Option<&str>,
    ) -> StorageResult<BlobListPage> {
        check_list(container, max_results)?;
        let mut state = self.request(BlobRequestKind::List);
        let c = state.container(container)?;
        // The marker is the name the next page starts at.
        let start = marker.unwrap_or(prefix).to_string();
        let mut names = c
            .blobs
            .range(start..)
            .take_while(|(name, _)| name.starts_with(prefix));
        let blobs: Vec<_> = names
            .by_ref()
            .take(max_results as usize)
            .map(|(name, blob)| properties_of(name, blob))
            .collect();
        let next_marker = names.next().map(|(name, _)| name.clone());
        Ok(BlobListPage { blobs, next_marker })
    }
    async fn delete(&self, container: &str, name: &str) -> StorageResult<bool> {
        check_blob(container, name)?;
        let mut state = self.request(BlobRequestKind::Delete);
        // A missing container holds no blob: nothing to delete, as on the service.
        let Some(c) = state.containers.get_mut(container) else {
            return Ok(false);
        };
        c.staged.remove(name);
        Ok(c.blobs.remove(name).is_some())
    }
}

/// The error of a download of a blob that does not exist.
fn blob_not_found(container: &str, name: &str) -> StorageError {
    StorageError::from_status(
        404,
        Some("BlobNotFound".into()),
        format!("download blob {container}/{name} failed: not found"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::StorageErrorKind;

    fn gzip() -> BlobWrite {
        BlobWrite::new("application/gzip")
    }

    #[tokio::test]
    async fn upload_download_and_conditions() {
        let store = MemoryBlobStore::new();
        let e = store
            .upload("c1x", "a", Bytes::from_static(b"x"), &gzip())
            .await
            .unwrap_err();
        assert_eq!(e.code.as_deref(), Some("ContainerNotFound"));
        assert!(store.create_container("c1x").await.unwrap());
        assert!(!store.create_container("c1x").await.unwrap());
        let etag = store
            .upload("c1x", "a", Bytes::from_static(b"hello"), &gzip())
            .await
            .unwrap();
        let got = store.download("c1x", "a", 5).await.unwrap();
        assert_eq!(&got.bytes[..], b"hello");
        assert_eq!(got.properties.etag, etag);
        assert_eq!(
            got.properties.content_type.as_deref(),
            Some("application/gzip")
        );
        let e = store.download("c1x", "a", 4).await.unwrap_err();
        assert_eq!(e.kind, StorageErrorKind::InvalidInput);
        assert!(e.message.contains("4-byte bound"), "{e}");
        assert!(store
            .download("c1x", "b", 9)
            .await
            .unwrap_err()
            .is_not_found());
        let exists = gzip().with_condition(WriteCondition::IfNotExists);
        let e = store
            .upload("c1x", "a", Bytes::new(), &exists)
            .await
            .unwrap_err();
        assert_eq!(e.kind, StorageErrorKind::Conflict);
        let stale = gzip().with_condition(WriteCondition::IfMatch("\"0x0\"".into()));
        let e = store
            .upload("c1x", "a", Bytes::new(), &stale)
            .await
            .unwrap_err();
        assert_eq!(e.kind, StorageErrorKind::PreconditionFailed);
        let fresh = gzip().with_condition(WriteCondition::IfMatch(etag.clone()));
        let newer = store
            .upload("c1x", "a", Bytes::new(), &fresh)
            .await
            .unwrap();
        assert_ne!(newer, etag);
        assert_eq!(store.properties("c1x", "a").await.unwrap().unwrap().size, 0);
        assert_eq!(store.properties("c1x", "zz").await.unwrap(), None);
        assert_eq!(store.counters().snapshot().admin, 2);
        assert!(store.delete("c1x", "a").await.unwrap());
        assert!(!store.delete("c1x", "a").await.unwrap(), "idempotent");
        assert!(!store.delete("nocontainer", "a").await.unwrap());
        assert_eq!(store.properties("c1x", "a").await.unwrap(), None);
        assert_eq!(store.counters().snapshot().delete, 3);
    }

    #[tokio::test]
    async fn blocks_commit_in_order_and_can_be_recommitted() {
        let store = MemoryBlobStore::new();
        store.create_container("man").await.unwrap();
        for (id, body) in [("b2", "two;"), ("b1", "one;"), ("b2", "TWO;")] {
            store
                .put_block("man", "m.json", id, Bytes::from(body))
                .await
                .unwrap();
        }
        let listing = store.block_list("man", "m.json").await.unwrap();
        assert_eq!(listing.uncommitted, vec!["b2", "b1"]);
        let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let json = BlobWrite::new("application/json");
        store
            .commit_blocks("man", "m.json", &ids(&["b1", "b2"]), &json)
            .await
            .unwrap();
        let got = store.download("man", "m.json", 100).await.unwrap();
        assert_eq!(&got.bytes[..], b"one;TWO;");
        // A later invocation stages one more block and commits all three.
        store
            .put_block("man", "m.json", "b3", Bytes::from("three"))
            .await
            .unwrap();
        store
            .commit_blocks("man", "m.json", &ids(&["b1", "b2", "b3"]), &json)
            .await
            .unwrap();
        let got = store.download("man", "m.json", 100).await.unwrap();
        assert_eq!(&got.bytes[..], b"one;TWO;three");
        let listing = store.block_list("man", "m.json").await.unwrap();
        assert_eq!(listing.committed, vec!["b1", "b2", "b3"]);
        assert!(listing.uncommitted.is_empty());
        let e = store
            .commit_blocks("man", "m.json", &ids(&["b9"]), &json)
            .await
            .unwrap_err();
        assert_eq!(e.code.as_deref(), Some("InvalidBlockList"));
        assert_eq!(
            store.block_list("man", "none").await.unwrap(),
            BlockListing::default()
        );
    }

    #[tokio::test]
    async fn listings_page_under_a_prefix() {
        let store = MemoryBlobStore::new();
        store.create_container("lst").await.unwrap();
        for name in ["p/a", "p/b", "p/c", "q/a", "o"] {
            store
                .upload("lst", name, Bytes::from_static(b"1"), &gzip())
                .await
                .unwrap();
        }
        let mut names = Vec::new();
        let mut marker: Option<String> = None;
        let mut pages = 0;
        loop {
            let page = store.list("lst", "p/", 2, marker.as_deref()).await.unwrap();
            pages += 1;
            names.extend(page.blobs.into_iter().map(|b| b.name));
            match page.next_marker {
                Some(m) => marker = Some(m),
                None => break,
            }
        }
        assert_eq!(names, vec!["p/a", "p/b", "p/c"]);
        assert_eq!(pages, 2);
        let all = store.list("lst", "", 5000, None).await.unwrap();
        assert_eq!(all.blobs.len(), 5);
        assert_eq!(all.next_marker, None);
    }
}
