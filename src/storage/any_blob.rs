//! [`AnyBlobStore`]: the blob store a function app holds per connection, behind one concrete type,
//! so the app's state needs no third storage type parameter for the two drivers that use blobs.
//! Every method delegates; nothing else happens here.
//!
//! One kind today: Azure Blob Storage (and Azurite). The lab's in-memory blob store is not a
//! variant (shipped code names no lab code, and no app test holds one); its unit tests use it
//! through [`BlobStore`] directly. Another kind would be one more variant and one more arm in
//! `delegate!` (static dispatch, so the Azure path pays nothing for it).

use bytes::Bytes;

use super::azure_blob::AzureBlobStore;
use super::blob::{BlobListPage, BlobProperties, BlobStore, BlobWrite, BlockListing, Downloaded};
use super::StorageResult;

/// A blob store of one of the kinds tablescan runs on. Cheap to clone.
#[derive(Clone)]
pub enum AnyBlobStore {
    Azure(AzureBlobStore),
}

/// `delegate!(self, s => s.method(args))` on whichever store this is.
macro_rules! delegate {
    ($self:ident, $s:ident => $call:expr) => {
        match $self {
            AnyBlobStore::Azure($s) => $call.await,
        }
    };
}

impl BlobStore for AnyBlobStore {
    async fn create_container(&self, container: &str) -> StorageResult<bool> {
        delegate!(self, s => s.create_container(container))
    }

    async fn upload(
        &self,
        container: &str,
        name: &str,
        body: Bytes,
        write: &BlobWrite,
    ) -> StorageResult<String> {
        delegate!(self, s => s.upload(container, name, body, write))
    }

    async fn put_block(
        &self,
        container: &str,
        name: &str,
        block_id: &str,
        body: Bytes,
    ) -> StorageResult<()> {
        delegate!(self, s => s.put_block(container, name, block_id, body))
    }

    async fn commit_blocks(
        &self,
        container: &str,
        name: &str,
        block_ids: &[String],
        write: &BlobWrite,
    ) -> StorageResult<String> {
        delegate!(self, s => s.commit_blocks(container, name, block_ids, write))
    }

    async fn block_list(&self, container: &str, name: &str) -> StorageResult<BlockListing> {
        delegate!(self, s => s.block_list(container, name))
    }

    async fn download(
        &self,
        container: &str,
        name: &str,
        max_bytes: u64,
    ) -> StorageResult<Downloaded> {
        delegate!(self, s => s.download(container, name, max_bytes))
    }

    async fn download_range(
        &self,
        container: &str,
        name: &str,
        offset: u64,
        len: u64,
    ) -> StorageResult<Bytes> {
        delegate!(self, s => s.download_range(container, name, offset, len))
    }

    async fn properties(
        &self,
        container: &str,
        name: &str,
    ) -> StorageResult<Option<BlobProperties>> {
        delegate!(self, s => s.properties(container, name))
    }

    async fn list(
        &self,
        container: &str,
        prefix: &str,
        max_results: u32,
        marker: Option<&str>,
    ) -> StorageResult<BlobListPage> {
        delegate!(self, s => s.list(container, prefix, max_results, marker))
    }
    async fn delete(&self, container: &str, name: &str) -> StorageResult<bool> {
        delegate!(self, s => s.delete(container, name))
    }
}
