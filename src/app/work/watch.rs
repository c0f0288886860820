//! Noticing, while an invocation works, that its scan has ended (issue 38: a cancelled enqueue
//! kept putting for 57 s, until its hand-off deadline, because a step or item looked at its
//! scan's state only when it began).
//!
//! Invariants:
//! 1. While an invocation runs a work item ([`watching`]), its instance learns that the item's
//!    scan ended (cancelled, or failed by another item) within [`NOTICE`] of the end: when it
//!    starts and every [`CHECK_INTERVAL`] the watch reads the scan's record — unless the
//!    instance's state cache (`AppState::scan_states`) holds an ended state, or a running one
//!    it still trusts (read within [`CACHE_TRUST`] by any invocation there) — and records what
//!    it read in the cache. A cancel this instance answered, and a failure it recorded, are in
//!    its cache at once.
//! 2. Drivers look at the cache (`drivers::kit::scan_ended`, no request) before each unit of
//!    work that writes (a put, a batch, a blob) and start none once it says the scan ended; the
//!    units already started finish (at most a driver's requests in flight). So once a cancel has
//!    answered, an invocation starts no write later than [`NOTICE`] after it, and at a scan's
//!    rate limit at most `NOTICE × maxRequestsPerSecond` requests (plus those in flight) are
//!    sent after it.
//! 3. An invocation that stopped so commits what it did (its counters: the rows it wrote or put
//!    count), and queues no child (`Runner::commit`): the counters of an ended scan then change
//!    no more once its invocations under way have stopped, and they say what was written before
//!    the end was noticed.
//! 4. The cost is bounded: about one point read of the scan record per [`CHECK_INTERVAL`] per
//!    scan and instance while invocations work there (none for an invocation shorter than that,
//!    unless it waited for admission longer than the cache's trust), charged to the scan's rate
//!    limit without waiting for a token (a backlog of paced requests must not delay the check)
//!    and, like the host's deletes and a deferral's put, not counted in `storageRequests`.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use crate::app::pace::Meter;
use crate::app::state::AppState;
use crate::app::tracking::ScanState;
use crate::storage::stores::Stores;

/// How often an invocation's watch looks at its scan's state.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(2);
/// How long the state cache trusts a `running` state it read (`state::RUNNING_STATE_TTL`; the
/// tests below hold the two equal): a watch that finds it that fresh does not read again.
pub const CACHE_TRUST: Duration = Duration::from_secs(2);
/// The longest an invocation may go on starting writes after its scan ended (invariant 1): a
/// check interval, plus the age of a cached state it trusted.
pub const NOTICE: Duration = CHECK_INTERVAL.saturating_add(CACHE_TRUST);

/// Runs `work` (an invocation's execution and commit) while keeping this instance's knowledge of
/// scan `scan_id`'s state fresh (invariant 1). `requests`: the invocation's meter, whose scan's
/// rate limit the reads are charged to.
pub async fn watching<S: Stores, F: Future>(
    app: &AppState<S>,
    scan_id: &str,
    requests: &Meter,
    work: F,
) -> F::Output {
    tokio::select! {
        biased;
        out = work => out,
        never = refresh(app, scan_id, requests) => match never {},
    }
}

/// At once, then every [`CHECK_INTERVAL`], reads the scan's state unless the cache knows it
/// (fresh, or ended); never returns. At once: the state the invocation began with may be old (it
/// waited for admission to a paced scan's rate, up to two minutes), and then this first read
/// runs beside the work's first requests, before its first write. A read that fails is tried at
/// the next tick.
async fn refresh<S: Stores>(app: &AppState<S>, scan_id: &str, requests: &Meter) -> Infallible {
    let mut ticks = tokio::time::interval(CHECK_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        match app.scan_states.get(scan_id) {
            Some(ScanState::Running) => continue,
            // Ended states never change: nothing more to learn.
            Some(_) => return std::future::pending().await,
            None => {}
        }
        if let Some(pacer) = requests.pacer() {
            pacer.charge(1);
        }
        let tracker = app.tracker_on(app.bookkeeping());
        match tracker.get_scan(scan_id).await {
            // The cache keeps an end recorded here meanwhile (a read that began before it).
            Ok(Some(record)) => app.scan_states.put(scan_id, record.state),
            // Removed by retention (long ended).
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(scan = %scan_id, error = %e, "could not read the scan's state; trying again")
            }
        }
    }
}
