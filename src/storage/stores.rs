//! [`Stores`]: the one name for the kinds of table, queue and blob store a function app runs on,
//! so that code over the app's state says `<S: Stores>` and `AppState<S>`.
//!
//! A trait with associated types, not trait objects (the store traits have async methods, so
//! they are not object safe) and not enums (an enum would need the lab's memory and simulator
//! stores as variants in shipped code). Each kind is one zero-sized marker type:
//! [`AzureStores`] here; the in-memory and the simulator's kinds are lab code.

use super::azure_blob::AzureBlobStore;
use super::azure_queue::AzureQueueStore;
use super::azure_table::AzureTableStore;
use super::blob::BlobStore;
use super::{QueueStore, TableStore};

/// The table, queue and blob stores of one kind. Implemented by zero-sized marker types only.
pub trait Stores: Send + Sync + 'static {
    type Table: TableStore + Clone;
    type Queue: QueueStore + Clone;
    type Blob: BlobStore + Clone;
}

/// Azure Table, Queue and Blob Storage (and Azurite): what ships.
pub struct AzureStores;

impl Stores for AzureStores {
    type Table = AzureTableStore;
    type Queue = AzureQueueStore;
    type Blob = AzureBlobStore;
}
