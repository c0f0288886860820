//! [`BlobStore`] over Azure Blob Storage (and Azurite) with `azure_storage_blobs` 0.21.
//!
//! Invariants:
//! - A store is built from a [`StorageAccount`] (`account.blob_store(counters)`), so it sends
//!   through the account's pooled HTTP client and, for a keyless connection, asks the account's
//!   one token provider (one token cache for tables, queues and blobs). A connection without a
//!   blob endpoint fails here, with the message naming the setting to add.
//! - The SDK's own retry is off (`azure::client_options`); every attempt goes through
//!   [`AzureBlobStore::attempts`]: counted once, retried under the account's policy
//!   (`storage::retry`) only when transient, errors mapped by `azure::map_sdk_error`.
//! - A keyless connection's RBAC 403 names the connection and the Storage Blob Data Contributor
//!   role (`auth::with_role_hint` knows the table and queue roles only).
//! - A ranged download (`download_range`) asks for exactly its range. For a range under 4 MiB
//!   the SDK adds `x-ms-range-get-content-crc64`, which the service honours and Azurite's strict
//!   mode refuses (500 `FeatureNotSupported`); after one such refusal the store (and its clones)
//!   read a 4 MiB window from the offset instead — a fallback for the emulator, counted as the
//!   extra request it is.
//! - A ranged download holds its range's bytes and no more, whatever the window: a buffer of the
//!   range's length (or one network chunk sliced, when that holds the whole range), the rest of
//!   a window drained and dropped chunk by chunk. Callers bound their memory by the lengths they
//!   ask for (lookups charge them to their budget, `app::functions::lookup::budget`).
//! - A download never buffers more than its bound (+1 byte): a longer blob is refused from the
//!   response's length before its body is read, and the body is read chunk by chunk, stopping
//!   past the bound whatever the service sends.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use azure_core::error::ErrorKind;
use azure_core::prelude::{IfMatchCondition, NextMarker, Prefix, Range};
use azure_core::request_options::MaxResults;
use azure_storage::CloudLocation;
use azure_storage_blobs::blob::{BlobBlockType, BlockList, BlockListType};
use azure_storage_blobs::container::operations::BlobItem;
use azure_storage_blobs::prelude::{
    BlobClient, BlobContentEncoding, BlobContentType, BlobServiceClient, BlockId, ClientBuilder,
};
use bytes::{Bytes, BytesMut};
use futures::StreamExt;

use super::auth::{sdk_credentials, token_connection};
use super::azure::{client_options, map_sdk_error};
use super::blob::{
    check_blob, check_commit, check_container, check_list, check_put_block, check_range,
    check_upload, too_large, BlobListPage, BlobProperties, BlobRequestCounters, BlobRequestKind,
    BlobStore, BlobWrite, BlockListing, Downloaded, WriteCondition,
};
use super::connection::StorageAccount;
use super::retry_policy::{retry, RetryPolicy};
use super::{StorageError, StorageErrorKind, StorageResult};

/// The shortest range the SDK reads without asking for its CRC64 (`azure_core`'s `Range`).
const MIN_RANGE_WITHOUT_CRC: u64 = 4 * 1024 * 1024;

impl StorageAccount {
    /// A blob store over this account, counting requests in `counters`; an error naming the
    /// setting to add if the connection gives no blob endpoint.
    pub fn blob_store(&self, counters: Arc<BlobRequestCounters>) -> StorageResult<AzureBlobStore> {
        AzureBlobStore::new(self, counters)
    }
}

/// Azure Blob Storage behind the [`BlobStore`] interface. Cheap to clone; clones share the HTTP
/// connection pool, the token provider and the request counters.
#[derive(Clone)]
pub struct AzureBlobStore {
    client: BlobServiceClient,
    counters: Arc<BlobRequestCounters>,
    retry: RetryPolicy,
    /// A keyless account's connection name: its RBAC 403s name the role it needs.
    token_connection: Option<String>,
    /// Set once the service refused a short range's CRC64 header (Azurite's strict mode).
    crc_refused: Arc<AtomicBool>,
}

impl AzureBlobStore {
    pub(crate) fn new(
        account: &StorageAccount,
        counters: Arc<BlobRequestCounters>,
    ) -> StorageResult<Self> {
        let endpoint = account
            .blob_endpoint()
            .map_err(|missing| StorageError::invalid_input(missing.to_string()))?;
        let location = CloudLocation::Custom {
            account: account.account_name().to_string(),
            uri: endpoint.to_string(),
        };
        let client = ClientBuilder::with_location(location, sdk_credentials(account))
            .client_options(client_options(account))
            .blob_service_client();
        Ok(AzureBlobStore {
            client,
            counters,
            retry: account.retry_policy(),
            token_connection: token_connection(account),
            crc_refused: Arc::new(AtomicBool::new(false)),
        })
    }

    fn blob(&self, container: &str, name: &str) -> BlobClient {
        self.client.container_client(container).blob_client(name)
    }

    /// Runs `op` under the retry policy, counting every attempt as one request of `kind`.
    async fn attempts<T, F, Fut>(&self, kind: BlobRequestKind, mut op: F) -> StorageResult<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = StorageResult<T>>,
    {
        retry(&self.retry, || {
            self.counters.record(kind);
            op()
        })
        .await
        .map_err(|error| match &self.token_connection {
            Some(connection) => with_blob_role_hint(error, connection),
            None => error,
        })
    }

    /// One download attempt: the first `max_bytes + 1` bytes at most, then the size check.
    async fn download_once(
        &self,
        container: &str,
        name: &str,
        max_bytes: u64,
    ) -> StorageResult<Downloaded> {
        let operation = || format!("download blob {container}/{name}");
        // At least 4 MiB: for a shorter range the SDK asks for the range's CRC64, which Azurite
        // refuses (FeatureNotSupported). A blob longer than the bound is refused from the
        // response's Content-Length, before its body is read, so the larger window costs nothing.
        let window = max_bytes.saturating_add(1).max(MIN_RANGE_WITHOUT_CRC);
        let mut pages = self
            .blob(container, name)
            .get()
            .range(Range::new(0, window))
            .chunk_size(window)
            .into_stream();
        let response = match pages.next().await {
            Some(Ok(response)) => response,
            Some(Err(e)) if is_empty_blob_range(&e) => {
                return self.download_empty(container, name).await
            }
            Some(Err(e)) => return Err(map_sdk_error(&operation(), e)),
            None => {
                return Err(StorageError::invalid_response(
                    operation() + ": no response",
                ))
            }
        };
        // The service serves min(size, window) bytes from 0, so Content-Length over the bound
        // means the blob is (the SDK keeps no total length to say by how much).
        if response.blob.properties.content_length > max_bytes {
            return Err(too_large(container, name, max_bytes));
        }
        // The SDK hands the body over in chunks (in practice one, which it has already read
        // whole): a single chunk is kept as it is, never copied; several are joined once, into
        // a buffer sized from Content-Length. A copy would hold the body twice (measured: +102
        // MiB of peak RSS for a 43 MiB part).
        let mut body = response.data;
        let mut chunks: Vec<Bytes> = Vec::new();
        let mut len = 0u64;
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| map_sdk_error(&operation(), e))?;
            len += chunk.len() as u64;
            if len > max_bytes {
                return Err(too_large(container, name, max_bytes));
            }
            chunks.push(chunk);
        }
        let bytes = if chunks.len() == 1 {
            chunks.pop().unwrap_or_default()
        } else {
            let mut joined = BytesMut::with_capacity(len as usize);
            for chunk in &chunks {
                joined.extend_from_slice(chunk);
            }
            joined.freeze()
        };
        Ok(Downloaded {
            bytes,
            properties: properties_of(name, &response.blob.properties),
        })
    }

    /// One ranged read attempt: the exact range, or (once the store learned the CRC64 header is
    /// refused) a window of at least [`MIN_RANGE_WITHOUT_CRC`] bytes cut to the range.
    async fn range_once(
        &self,
        container: &str,
        name: &str,
        offset: u64,
        len: u64,
    ) -> StorageResult<Bytes> {
        if !self.crc_refused.load(Ordering::Relaxed) {
            match self.read_window(container, name, offset, len, len).await {
                Err(e) if e.code.as_deref() == Some("FeatureNotSupported") => {
                    self.crc_refused.store(true, Ordering::Relaxed);
                    self.counters.record(BlobRequestKind::Read);
                }
                other => return other,
            }
        }
        let window = len.max(MIN_RANGE_WITHOUT_CRC);
        self.read_window(container, name, offset, window, len).await
    }

    /// The first `keep` bytes of `offset..offset + window` (fewer at the blob's end; none past
    /// it), holding no more than them: the rest of the window is read and dropped, so that the
    /// connection stays reusable.
    async fn read_window(
        &self,
        container: &str,
        name: &str,
        offset: u64,
        window: u64,
        keep: u64,
    ) -> StorageResult<Bytes> {
        let operation = || format!("read a range of blob {container}/{name}");
        let mut pages = self
            .blob(container, name)
            .get()
            .range(Range::new(offset, offset + window))
            .chunk_size(window)
            .into_stream();
        let response = match pages.next().await {
            Some(Ok(response)) => response,
            Some(Err(e)) if is_empty_blob_range(&e) => return Ok(Bytes::new()),
            Some(Err(e)) => return Err(map_sdk_error(&operation(), e)),
            None => {
                return Err(StorageError::invalid_response(
                    operation() + ": no response",
                ))
            }
        };
        let mut body = response.data;
        let keep = keep as usize;
        let mut joined = BytesMut::new();
        let mut seen = 0u64;
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| map_sdk_error(&operation(), e))?;
            if seen == 0 && window == keep as u64 && chunk.len() >= keep {
                return Ok(chunk.slice(..keep));
            }
            seen += chunk.len() as u64;
            let wanted = keep - joined.len();
            if wanted > 0 {
                if joined.capacity() == 0 {
                    // One buffer of the range's length: no doubling copies as it fills.
                    joined.reserve(keep);
                }
                joined.extend_from_slice(&chunk[..wanted.min(chunk.len())]);
            }
            if seen >= window {
                break;
            }
        }
        Ok(joined.freeze())
    }

    /// A zero-length blob answers any range with 416: its properties say it is empty.
    async fn download_empty(&self, container: &str, name: &str) -> StorageResult<Downloaded> {
        let properties = self
            .blob(container, name)
            .get_properties()
            .await
            .map_err(|e| {
                map_sdk_error(&format!("read properties of blob {container}/{name}"), e)
            })?;
        let properties = properties_of(name, &properties.blob.properties);
        if properties.size != 0 {
            return Err(StorageError::invalid_response(format!(
                "download blob {container}/{name}: range refused although the blob holds {} bytes",
                properties.size
            )));
        }
        Ok(Downloaded {
            bytes: Bytes::new(),
            properties,
        })
    }
}

/// Whether the service refused the range because the blob is empty (416 `InvalidRange`).
fn is_empty_blob_range(error: &azure_core::Error) -> bool {
    matches!(error.kind(), ErrorKind::HttpResponse { status, .. } if u16::from(*status) == 416)
}

fn properties_of(name: &str, p: &azure_storage_blobs::blob::BlobProperties) -> BlobProperties {
    BlobProperties {
        name: name.to_string(),
        size: p.content_length,
        etag: p.etag.to_string(),
        content_type: Some(p.content_type.clone()).filter(|t| !t.is_empty()),
        content_encoding: p.content_encoding.clone().filter(|e| !e.is_empty()),
    }
}

/// A Put Blob or Put Block List builder with a [`BlobWrite`]'s content type, encoding and
/// condition (the two builders are distinct types with the same methods).
macro_rules! with_write {
    ($put:expr, $write:expr) => {{
        let write: &BlobWrite = $write;
        let mut put = $put.content_type(BlobContentType::from(write.content_type.clone()));
        if let Some(encoding) = &write.content_encoding {
            put = put.content_encoding(BlobContentEncoding::from(encoding.clone()));
        }
        if let Some(condition) = condition_header(&write.condition) {
            put = put.if_match(condition);
        }
        put
    }};
}

fn condition_header(condition: &WriteCondition) -> Option<IfMatchCondition> {
    match condition {
        WriteCondition::Always => None,
        WriteCondition::IfNotExists => Some(IfMatchCondition::NotMatch("*".into())),
        WriteCondition::IfMatch(etag) => Some(IfMatchCondition::Match(etag.clone())),
    }
}

/// A keyless connection's 403 that says the identity lacks a data role gains the connection and
/// the blob role it needs (the table/queue counterpart is `auth::with_role_hint`).
fn with_blob_role_hint(mut error: StorageError, connection: &str) -> StorageError {
    let code = error.code.as_deref().unwrap_or("");
    let network = code == "AuthorizationFailure";
    if error.status == Some(403) && (network || code == "AuthorizationPermissionMismatch") {
        error.message.push_str(&format!(
            " (connection {connection} uses an Entra ID token: its identity needs the Storage Blob \
             Data Contributor role on the storage account{})",
            if network {
                ", and the account's network rules must let this app in"
            } else {
                ""
            }
        ));
    }
    error
}

impl BlobStore for AzureBlobStore {
    async fn create_container(&self, container: &str) -> StorageResult<bool> {
        check_container(container)?;
        let result = self
            .attempts(BlobRequestKind::Admin, || async {
                self.client
                    .container_client(container)
                    .create()
                    .await
                    .map_err(|e| map_sdk_error(&format!("create container {container}"), e))
            })
            .await;
        match result {
            Ok(_) => Ok(true),
            Err(e) if e.kind == StorageErrorKind::Conflict => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn upload(
        &self,
        container: &str,
        name: &str,
        body: Bytes,
        write: &BlobWrite,
    ) -> StorageResult<String> {
        check_upload(container, name, &body)?;
        self.attempts(BlobRequestKind::Write, || async {
            let put = self.blob(container, name).put_block_blob(body.clone());
            with_write!(put, write)
                .await
                .map(|r| r.etag)
                .map_err(|e| map_sdk_error(&format!("upload blob {container}/{name}"), e))
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
        check_put_block(container, name, block_id, &body)?;
        let id = BlockId::new(Bytes::copy_from_slice(block_id.as_bytes()));
        self.attempts(BlobRequestKind::Write, || async {
            self.blob(container, name)
                .put_block(id.clone(), body.clone())
                .await
                .map(|_| ())
                .map_err(|e| {
                    map_sdk_error(
                        &format!("put block {block_id:?} of blob {container}/{name}"),
                        e,
                    )
                })
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
        check_commit(container, name, block_ids)?;
        let list = BlockList {
            blocks: block_ids
                .iter()
                .map(|id| BlobBlockType::new_latest(Bytes::copy_from_slice(id.as_bytes())))
                .collect(),
        };
        self.attempts(BlobRequestKind::Write, || async {
            let put = self.blob(container, name).put_block_list(list.clone());
            with_write!(put, write).await.map(|r| r.etag).map_err(|e| {
                map_sdk_error(&format!("commit block list of blob {container}/{name}"), e)
            })
        })
        .await
    }

    async fn block_list(&self, container: &str, name: &str) -> StorageResult<BlockListing> {
        check_blob(container, name)?;
        let result = self
            .attempts(BlobRequestKind::Read, || async {
                self.blob(container, name)
                    .get_block_list()
                    .block_list_type(BlockListType::All)
                    .await
                    .map_err(|e| {
                        map_sdk_error(&format!("read block list of blob {container}/{name}"), e)
                    })
            })
            .await;
        let response = match result {
            Ok(response) => response,
            Err(e) if e.code.as_deref() == Some("BlobNotFound") => {
                return Ok(BlockListing::default())
            }
            Err(e) => return Err(e),
        };
        let mut listing = BlockListing::default();
        for block in response.block_with_size_list.blocks {
            let (list, id) = match block.block_list_type {
                BlobBlockType::Committed(id) => (&mut listing.committed, id),
                BlobBlockType::Uncommitted(id) | BlobBlockType::Latest(id) => {
                    (&mut listing.uncommitted, id)
                }
            };
            list.push(String::from_utf8_lossy(id.as_ref()).into_owned());
        }
        Ok(listing)
    }

    async fn download(
        &self,
        container: &str,
        name: &str,
        max_bytes: u64,
    ) -> StorageResult<Downloaded> {
        check_blob(container, name)?;
        self.attempts(BlobRequestKind::Read, || {
            self.download_once(container, name, max_bytes)
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
        check_range(container, name, len)?;
        if len == 0 {
            return Ok(Bytes::new());
        }
        self.attempts(BlobRequestKind::Read, || {
            self.range_once(container, name, offset, len)
        })
        .await
    }

    async fn properties(
        &self,
        container: &str,
        name: &str,
    ) -> StorageResult<Option<BlobProperties>> {
        check_blob(container, name)?;
        let result = self
            .attempts(BlobRequestKind::Read, || async {
                self.blob(container, name)
                    .get_properties()
                    .await
                    .map_err(|e| {
                        map_sdk_error(&format!("read properties of blob {container}/{name}"), e)
                    })
            })
            .await;
        match result {
            Ok(response) => Ok(Some(properties_of(name, &response.blob.properties))),
            // A HEAD answer has no body: a missing blob and a missing container are both 404.
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn list(
        &self,
        container: &str,
        prefix: &str,
        max_results: u32,
        marker: Option<&str>,
    ) -> StorageResult<BlobListPage> {
        check_list(container, max_results)?;
        let response = self
            .attempts(BlobRequestKind::List, || async {
                let mut list = self
                    .client
                    .container_client(container)
                    .list_blobs()
                    .max_results(MaxResults::new(
                        std::num::NonZeroU32::new(max_results).expect("checked above"),
                    ));
                if !prefix.is_empty() {
                    list = list.prefix(Prefix::from(prefix.to_string()));
                }
                if let Some(marker) = marker {
                    list = list.marker(NextMarker::new(marker.to_string()));
                }
                let operation = format!("list blobs in container {container}");
                match list.into_stream().next().await {
                    Some(result) => result.map_err(|e| map_sdk_error(&operation, e)),
                    None => Err(StorageError::invalid_response(operation + ": no response")),
                }
            })
            .await?;
        let blobs = response
            .blobs
            .items
            .iter()
            .filter_map(|item| match item {
                BlobItem::Blob(blob) => Some(properties_of(&blob.name, &blob.properties)),
                BlobItem::BlobPrefix(_) => None,
            })
            .collect();
        Ok(BlobListPage {
            blobs,
            next_marker: response.next_marker.map(|m| m.as_str().to_string()),
        })
    }
    async fn delete(&self, container: &str, name: &str) -> StorageResult<bool> {
        check_blob(container, name)?;
        let result = self
            .attempts(BlobRequestKind::Delete, || async {
                // The SDK sends `x-ms-delete-snapshots: include` by default: a blob with
                // snapshots is deleted with them instead of refused.
                self.blob(container, name)
                    .delete()
                    .await
                    .map_err(|e| map_sdk_error(&format!("delete blob {container}/{name}"), e))
            })
            .await;
        match result {
            Ok(_) => Ok(true),
            // BlobNotFound, or ContainerNotFound: nothing to delete either way.
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rbac_403s_name_the_blob_role() {
        let forbidden = |code: &str| {
            StorageError::from_status(403, Some(code.into()), "upload blob c/n failed: denied")
        };
        let hinted = with_blob_role_hint(forbidden("AuthorizationPermissionMismatch"), "Backup");
        assert!(
            hinted.message.contains(
                "connection Backup uses an Entra ID token: its identity needs the Storage Blob \
                 Data Contributor role on the storage account)"
            ),
            "{hinted}"
        );
        let network = with_blob_role_hint(forbidden("AuthorizationFailure"), "Backup");
        assert!(network.message.contains("network rules"), "{network}");
        for error in [
            forbidden("AuthenticationFailed"),
            StorageError::from_status(404, Some("BlobNotFound".into()), "nope"),
        ] {
            let before = error.to_string();
            assert_eq!(with_blob_role_hint(error, "Backup").to_string(), before);
        }
    }

    #[test]
    fn a_connection_without_a_blob_endpoint_fails_naming_the_setting() {
        use crate::storage::connection::ConnectionSettings;
        let settings = ConnectionSettings::from_app_settings("Src", |key| match key {
            "Src__tableServiceUri" => Some("https://acct.table.core.windows.net".into()),
            "Src__queueServiceUri" => Some("https://acct.queue.core.windows.net".into()),
            _ => None,
        })
        .unwrap();
        let account = StorageAccount::new(settings);
        let error = account
            .blob_store(Arc::new(BlobRequestCounters::new()))
            .err()
            .expect("no blob endpoint");
        assert_eq!(error.kind, StorageErrorKind::InvalidInput);
        assert!(
            error.message.contains("app setting Src__blobServiceUri"),
            "{error}"
        );
    }
}
