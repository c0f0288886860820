//! `PrefixScanPoison` and `TableCopyPoison` (queue triggers on `<queue>-poison`): settle a
//! message the host gave up on, so a work item whose handler died on every delivery fails its
//! scan instead of leaving it `running` forever. See [`Runner::settle_poisoned`].

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Uri};

use crate::app::messages::WorkMessage;
use crate::app::observe;
use crate::app::protocol::InvocationResponse;
use crate::app::state::AppState;
use crate::app::work::Runner;
use crate::storage::stores::Stores;

pub async fn handle<M: WorkMessage, S: Stores>(
    State(state): State<Arc<AppState<S>>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> InvocationResponse {
    let observed =
        observe::Invocation::start::<M>(&uri, &headers, &body, state.config.max_dequeue_count);
    observed.finish(Runner::new(&state).settle_poisoned::<M>(&body).await)
}
