//! Drivers: what a scan does with the rows it finds. Each driver is one module implementing
//! `job::Driver` (see `job/driver.rs` for what a driver decides and its invariants) and one
//! entry of [`registry`] below; nothing else names it. A driver imports the job layer
//! (`job/`), storage, the scan engine and the shared kit ([`kit`]) — never a handler, the
//! runner, or another driver.

pub mod copy;
pub mod count;
pub mod delete;
pub mod enqueue;
pub mod expire;
pub mod export;
pub mod import;
pub mod index;
pub mod kit;
#[cfg(all(test, feature = "lab"))]
pub(crate) mod tests;

use crate::app::job::Drivers;
use crate::app::state::AppState;
use crate::storage::stores::Stores;

use kit::hooks::hooks;

/// Every driver a scan can name, in the order a refused request lists them: the app is built
/// with this list (`AppState::new`).
pub fn registry<S: Stores>() -> Drivers<AppState<S>> {
    Drivers::new(vec![
        hooks::<copy::CopyDriver, S>(),
        hooks::<count::CountDriver, S>(),
        hooks::<delete::DeleteDriver, S>(),
        hooks::<enqueue::EnqueueDriver, S>(),
        hooks::<expire::ExpireDriver, S>(),
        hooks::<export::ExportDriver, S>(),
        hooks::<import::ImportDriver, S>(),
        hooks::<index::IndexDriver, S>(),
    ])
}
