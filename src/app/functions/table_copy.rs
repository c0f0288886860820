//! `TableCopy` (queue trigger): runs one work item of the scan's driver per message — the
//! runner of every driver's items, not only copies (the function and its queue keep their
//! historical names: deployments depend on them). The driver comes from the scan's recorded
//! context, never from the message; the item's JSON is read by that driver
//! (`drivers::run_item`). Copy items re-read one scanned page's key range and upsert it
//! (`drivers/copy.rs`).

pub use crate::app::drivers::range::{batches, range_filter, range_filter_after};
use crate::app::drivers::run_item;
use crate::app::messages::ItemMessage;
use crate::app::state::AppState;
use crate::app::work::{Begun, Work, WorkError, WorkOutcome};
use crate::storage::{QueueStore, TableStore};

impl Work for ItemMessage {
    async fn execute<T: TableStore + Clone, Q: QueueStore + Clone>(
        state: &AppState<T, Q>,
        begun: &Begun<Self>,
    ) -> Result<WorkOutcome, WorkError> {
        run_item(state, begun).await
    }
}
