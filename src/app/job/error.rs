//! Why a unit of work failed ([`WorkError`]), and whether retrying can help.

use crate::app::messages::MessageError;
use crate::storage::StorageError;

/// Why a work item (or a driver's step) failed.
#[derive(Debug, thiserror::Error)]
pub enum WorkError {
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
    #[error("{0}")]
    Failed(String),
    /// Fails the same way on every attempt (a row that cannot be addressed, a record over the
    /// service's limits): recorded as failed at once instead of after every retry.
    #[error("{0}")]
    Permanent(String),
}

impl WorkError {
    /// Whether retrying cannot help: recorded as failed on the first attempt.
    pub fn is_permanent(&self) -> bool {
        match self {
            WorkError::Permanent(_) => true,
            WorkError::Storage(s) => s.kind == crate::storage::StorageErrorKind::InvalidInput,
            WorkError::Failed(_) => false,
        }
    }
}

impl From<crate::scan::ScanError> for WorkError {
    fn from(e: crate::scan::ScanError) -> Self {
        match e {
            crate::scan::ScanError::Storage(s) => WorkError::Storage(s),
            e @ crate::scan::ScanError::Unaddressable(_) => WorkError::Permanent(e.to_string()),
            other => WorkError::Failed(other.to_string()),
        }
    }
}

impl From<MessageError> for WorkError {
    fn from(e: MessageError) -> Self {
        WorkError::Failed(e.to_string())
    }
}
