//! What can stop a step.

use crate::storage::StorageError;

#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
    #[error("invalid step: {0}")]
    InvalidStep(String),
    #[error("the scan cannot go on: {0}")]
    Unaddressable(String),
    /// The store answered a query with a row outside the query's range: the scan cannot stay
    /// exact on such answers.
    #[error("store answered outside the query: {0}")]
    StoreMisbehaved(String),
}
