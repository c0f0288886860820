//! Drivers: what a scan does with the rows it finds. Each driver is one module implementing
//! `job::Driver` (see `job/driver.rs` for what a driver decides and its invariants) and one
//! entry of [`registry`] below; nothing else names it. A driver imports the job layer
//! (`job/`), storage, the scan engine and the shared kit ([`kit`]) — never a handler, the
//! runner, or another driver.

pub mod copy;
pub mod count;
pub mod delete;
pub mod export;
pub mod import;
pub mod index;
pub mod kit;
#[cfg(all(test, feature = "lab"))]
mod tests;

use crate::app::job::Drivers;
use crate::app::state::AppState;
use crate::storage::{QueueStore, TableStore};

use kit::hooks::hooks;

/// Every driver a scan can name, in the order a refused request lists them: the app is built
/// with this list (`AppState::new`).
pub fn registry<T: TableStore + Clone, Q: QueueStore + Clone>() -> Drivers<AppState<T, Q>> {
    Drivers::new(vec![
        hooks::<copy::CopyDriver, T, Q>(),
        hooks::<count::CountDriver, T, Q>(),
        hooks::<delete::DeleteDriver, T, Q>(),
        hooks::<export::ExportDriver, T, Q>(),
        hooks::<import::ImportDriver, T, Q>(),
        hooks::<index::IndexDriver, T, Q>(),
    ])
}
