//! In-memory stores behind the storage traits, for unit and property tests of pure algorithms
//! and for the in-process app tests: an ordered table ([`MemoryTableStore`], with injectable
//! pagination), queues ([`MemoryQueueStore`]) and blobs ([`MemoryBlobStore`]). Never a stand-in
//! for Azurite where a test asserts real storage behaviour.

mod blob;
mod queue;
mod table;

pub use blob::MemoryBlobStore;
pub use queue::MemoryQueueStore;
pub use table::{MemoryTableStore, Pagination};

use crate::storage::stores::Stores;

/// The in-memory table, queue and blob stores, as one kind of [`Stores`] (in-process app tests).
pub struct MemoryStores;

impl Stores for MemoryStores {
    type Table = MemoryTableStore;
    type Queue = MemoryQueueStore;
    type Blob = MemoryBlobStore;
}
