//! The scan's pacing as the simulator reports it (issue 43, SIMULATED): refused requests, the
//! rate the scan settled at, the adaptive pacing's rows at the end, and another workload on
//! the same account (a live application) with its refused requests.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::cloud::Account;
use crate::app::pace::adaptive::{rate_row, RATE, RATE_AT};
use crate::app::pace::lease::pace_partition;
use crate::lab::memory::MemoryTableStore;
use crate::storage::TableStore;

/// The connection every simulated store is on (one account).
const CONNECTION: &str = "AzureWebJobsStorage";

/// What the simulator reports of a run's pacing (all simulated).
#[derive(Debug, Clone, Default, Serialize)]
pub struct PacingFigures {
    /// Attempts the account refused (503: its request rate or a partition's), of all attempts.
    pub refused_fraction: f64,
    /// The median of the scan's requests per second over the middle half of the run: the rate
    /// it settled at.
    pub settled_requests_per_second: u64,
    /// The adaptive pacing's row for the account at the end (`None`: never paced).
    pub paced_rate_per_instance: Option<f64>,
    /// When the last decrease was, in simulated seconds from the start.
    pub last_decrease_seconds: Option<f64>,
    /// The other workload's figures, if one was modelled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub neighbour: Option<NeighbourFigures>,
}

/// Another workload's requests on the account while the scan ran.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NeighbourFigures {
    pub requests_per_second: u32,
    pub requests: u64,
    pub refused: u64,
    pub refused_fraction: f64,
}

/// The median of `per_second` over its middle half.
pub fn settled(per_second: &[u64]) -> u64 {
    let n = per_second.len();
    let mut middle = per_second[n / 4..n - n / 4].to_vec();
    middle.sort_unstable();
    middle.get(middle.len() / 2).copied().unwrap_or(0)
}

/// The scan's adaptive pacing row in the bookkeeping store: (rate per instance, cut at µs).
pub async fn pace_row(
    memory: &MemoryTableStore,
    work_table: &str,
    scan_id: &str,
) -> Option<(f64, i64)> {
    let (entity, _) = memory
        .get_entity(work_table, &pace_partition(scan_id), &rate_row(CONNECTION))
        .await
        .ok()??;
    let rate = entity.properties.get_str(RATE)?.parse().ok()?;
    let at = entity.properties.get_str(RATE_AT)?.parse().ok()?;
    Some((rate, at))
}

/// A workload of `rate` requests per second on `account`, sent every 10 ms (simulated) until
/// `stopped`; a refused request is counted and not retried (the figure is what its users see).
pub struct Neighbour {
    pub rate: u32,
    pub requests: AtomicU64,
    pub refused: AtomicU64,
    pub stopped: AtomicBool,
}

impl Neighbour {
    pub fn start(account: Arc<Account>, rate: u32) -> Arc<Neighbour> {
        let n = Arc::new(Neighbour {
            rate,
            requests: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
        });
        let me = n.clone();
        tokio::spawn(async move {
            let per_tick = f64::from(rate) / 100.0;
            let mut owed = 0.0;
            // Bounded by the run: the simulator stops it when the scan ends.
            while !me.stopped.load(Ordering::Relaxed) {
                owed += per_tick;
                while owed >= 1.0 {
                    owed -= 1.0;
                    me.requests.fetch_add(1, Ordering::Relaxed);
                    if !account.admit_neighbour() {
                        me.refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        n
    }

    pub fn figures(&self) -> NeighbourFigures {
        let requests = self.requests.load(Ordering::Relaxed);
        let refused = self.refused.load(Ordering::Relaxed);
        NeighbourFigures {
            requests_per_second: self.rate,
            requests,
            refused,
            refused_fraction: refused as f64 / requests.max(1) as f64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settled_is_the_median_of_the_middle_half() {
        let per_second = [0, 0, 100, 200, 300, 400, 900, 0];
        assert_eq!(settled(&per_second), 300);
        assert_eq!(settled(&[]), 0);
    }
}
