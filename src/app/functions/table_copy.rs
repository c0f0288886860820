//! `TableCopy` (queue trigger): runs one work item of the scan's driver per message — the
//! runner of every driver's items, not only copies (the function and its queue keep their
//! historical names: deployments depend on them). The driver comes from the scan's recorded
//! context, never from the message, and found in the app's registry; the item's JSON is read
//! by that driver (`DriverHooks::run`).

use crate::app::job::{Begun, Executed, WorkError};
use crate::app::messages::ItemMessage;
use crate::app::state::AppState;
use crate::app::work::Work;
use crate::storage::stores::Stores;

impl Work for ItemMessage {
    async fn execute<S: Stores>(
        state: &AppState<S>,
        begun: &Begun<Self>,
    ) -> Result<Executed, WorkError> {
        let driver = state.drivers.of(&begun.scan)?;
        Ok(driver.run(state, begun).await?.into())
    }
}
