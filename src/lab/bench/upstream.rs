//! The Azurite endpoints a bench run talks to, and the counting proxies in front of them.

use std::net::SocketAddr;

use crate::lab::proxy::{FaultPolicy, StorageProxy};

/// Azurite's table, queue and blob endpoints, which each variant's proxy fronts.
#[derive(Debug, Clone, Copy)]
pub(super) struct Upstream {
    pub(super) table: SocketAddr,
    pub(super) queue: SocketAddr,
    pub(super) blob: SocketAddr,
}

impl Upstream {
    /// A counting proxy (no faults) in front of all three endpoints.
    pub(super) async fn counting_proxy(&self, seed: u64) -> Result<StorageProxy, String> {
        StorageProxy::start_with_blob(self.table, self.queue, self.blob, FaultPolicy::none(), seed)
            .await
            .map_err(|e| format!("cannot start a counting proxy: {e}"))
    }
}
