//! The simulated blob service (index builds), and [`SimStores`], the simulator's kind of stores.
//!
//! Like the tables and queues of `cloud.rs`: every request sleeps half its latency, is admitted
//! against the account's request rate (the account's target covers all its services), runs
//! against the in-memory [`MemoryBlobStore`] "at the server", then sleeps the rest; a refused
//! request answers 503 and is retried with the adapters' policy. Every attempt is counted in
//! `Account::blob_counters` by kind, so a run's request totals include its blob requests.
//! Latency: a base per kind plus the body's transfer (`Model::blob_*`).

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;

use crate::lab::memory::MemoryBlobStore;
use crate::storage::blob::{
    BlobListPage, BlobProperties, BlobRequestKind, BlobStore, BlobWrite, BlockListing, Downloaded,
};
use crate::storage::stores::Stores;
use crate::storage::StorageResult;

use super::cloud::{Account, CloudQueues, CloudTables};
use super::model::Model;

/// The simulated table, queue and blob services, as one kind of [`Stores`] (the app the
/// simulator runs).
pub struct SimStores;

impl Stores for SimStores {
    type Table = CloudTables;
    type Queue = CloudQueues;
    type Blob = CloudBlobs;
}

/// The simulated blob service of the account.
#[derive(Clone)]
pub struct CloudBlobs {
    pub inner: MemoryBlobStore,
    pub account: Arc<Account>,
}

impl CloudBlobs {
    pub fn new(account: Arc<Account>) -> Self {
        CloudBlobs {
            inner: MemoryBlobStore::new(),
            account,
        }
    }

    /// One request of `kind` moving `sent` bytes up; `run` returns the result and the bytes it
    /// brought back (their transfer is added to the latency).
    async fn request<T, F>(
        &self,
        kind: BlobRequestKind,
        sent: usize,
        mut run: impl FnMut() -> F,
    ) -> StorageResult<T>
    where
        F: Future<Output = (StorageResult<T>, usize)>,
    {
        let account = &self.account;
        let m = &account.model;
        let base = match kind {
            BlobRequestKind::Write | BlobRequestKind::Delete => m.blob_write_ms,
            BlobRequestKind::Read => m.blob_read_ms,
            BlobRequestKind::List | BlobRequestKind::Admin => m.blob_list_ms,
        };
        let transfer = |bytes: usize| bytes as f64 / (1024.0 * 1024.0) * m.blob_per_mib_ms;
        let count = || account.blob_counters.record(kind);
        let run = || {
            let f = run();
            async move {
                let (result, received) = f.await;
                (result, Model::ms(transfer(received)))
            }
        };
        account.send(count, base + transfer(sent), None, run).await
    }
}

impl BlobStore for CloudBlobs {
    async fn create_container(&self, container: &str) -> StorageResult<bool> {
        self.request(BlobRequestKind::Admin, 0, || async {
            (self.inner.create_container(container).await, 0)
        })
        .await
    }

    async fn upload(
        &self,
        container: &str,
        name: &str,
        body: Bytes,
        write: &BlobWrite,
    ) -> StorageResult<String> {
        self.request(BlobRequestKind::Write, body.len(), || async {
            let r = self.inner.upload(container, name, body.clone(), write);
            (r.await, 0)
        })
        .await
    }

    async fn put_block(
        &self,
        container: &str,
        name: &str,
        block_id: &str,
        body: Bytes,
    ) -> StorageResult<()> {
        self.request(BlobRequestKind::Write, body.len(), || async {
            let r = self
                .inner
                .put_block(container, name, block_id, body.clone());
            (r.await, 0)
        })
        .await
    }

    async fn commit_blocks(
        &self,
        container: &str,
        name: &str,
        block_ids: &[String],
        write: &BlobWrite,
    ) -> StorageResult<String> {
        self.request(BlobRequestKind::Write, 0, || async {
            let r = self.inner.commit_blocks(container, name, block_ids, write);
            (r.await, 0)
        })
        .await
    }

    async fn block_list(&self, container: &str, name: &str) -> StorageResult<BlockListing> {
        self.request(BlobRequestKind::Read, 0, || async {
            (self.inner.block_list(container, name).await, 0)
        })
        .await
    }

    async fn download(
        &self,
        container: &str,
        name: &str,
        max_bytes: u64,
    ) -> StorageResult<Downloaded> {
        self.request(BlobRequestKind::Read, 0, || async {
            let r = self.inner.download(container, name, max_bytes).await;
            let n = r.as_ref().map_or(0, |d| d.bytes.len());
            (r, n)
        })
        .await
    }

    async fn download_range(
        &self,
        container: &str,
        name: &str,
        offset: u64,
        len: u64,
    ) -> StorageResult<Bytes> {
        self.request(BlobRequestKind::Read, 0, || async {
            let r = self
                .inner
                .download_range(container, name, offset, len)
                .await;
            let n = r.as_ref().map_or(0, Bytes::len);
            (r, n)
        })
        .await
    }

    async fn delete(&self, container: &str, name: &str) -> StorageResult<bool> {
        self.request(BlobRequestKind::Delete, 0, || async {
            (self.inner.delete(container, name).await, 0)
        })
        .await
    }

    async fn properties(
        &self,
        container: &str,
        name: &str,
    ) -> StorageResult<Option<BlobProperties>> {
        self.request(BlobRequestKind::Read, 0, || async {
            (self.inner.properties(container, name).await, 0)
        })
        .await
    }

    async fn list(
        &self,
        container: &str,
        prefix: &str,
        max_results: u32,
        marker: Option<&str>,
    ) -> StorageResult<BlobListPage> {
        self.request(BlobRequestKind::List, 0, || async {
            let r = self.inner.list(container, prefix, max_results, marker);
            (r.await, 0)
        })
        .await
    }
}
