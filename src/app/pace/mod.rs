//! A scan's request rate limit (`maxRequestsPerSecond`), held across every instance working on
//! the scan: a shared GCRA-style schedule leased in chunks (design and figures:
//! docs/rate-limit.md).
//!
//! Invariants:
//! 1. Every storage request a work item of a limited scan makes goes through its [`Meter`],
//!    which takes one token of the scan's [`Pacer`] before the request is sent (`Counted`).
//!    Requests the meter counted before it knew the scan's limit are charged when it learns it.
//!    A work item's commit (`work/finish.rs`) takes its tokens ahead (`Meter::prepay`, as many
//!    as a commit usually sends) and then spends them without waiting (`Meter::tick_prepaid`;
//!    past them, a request waits for its token as usual). So the optimistic read-and-write of
//!    a counter shard is not stretched by token waits (with 40 instances waiting, such writes
//!    contended until steps failed: simulated, docs/enqueue.md), and every request still has
//!    a token of its own.
//! 2. A token is a time slot: the scan's schedule row hands out disjoint spans of time
//!    ([`lease`]); a span of `chunk` tokens lasts `chunk / limit` seconds, and its tokens are
//!    spent one every `1 / limit` seconds, none before its slot and none later than [`GRACE_US`]
//!    after it (a token unspent by then is dropped). So over any window the scan's requests are
//!    at most `limit` per second plus one chunk's leftovers, whatever the number of instances.
//! 3. The schedule's own requests are charged as tokens of the chunk they lease.
//! 4. A scan without a limit has no pacer: its meter only counts (no request, no wait).
//! 5. Times are each instance's clock (UTC): instances are assumed to agree within a few
//!    milliseconds; an instance whose clock is off by `d` moves at most `d × limit` requests.

pub mod adaptive;
pub mod control;
pub mod lease;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::storage::StorageResult;

use adaptive::{AccountPacer, ScanPacing};
use lease::Schedule;

/// The smallest and largest `maxRequestsPerSecond` a scan may ask for.
pub const MIN_LIMIT: u32 = 10;
pub const MAX_LIMIT: u32 = 20_000;
/// Fewest tokens a lease takes: the lease costs two requests (a read and a conditional write),
/// so its overhead is at most 2 / 64 ≈ 3 % of the scan's requests.
pub const MIN_CHUNK: u32 = 64;
/// How long a solo chunk lasts: the schedule an instance leases when it leases alone and did
/// not use all of its last chunk (`lease` invariant 2). Another instance's first lease then
/// waits for it at most this long.
pub const SOLO_SPAN_US: i64 = 1_000_000;
/// A token may be spent up to this long after its slot (then it is dropped).
pub const GRACE_US: i64 = 20_000;
/// Slots are laid out for this much less than the limit, so that the jitter of sending (a busy
/// instance, the network) keeps the busiest seconds within the limit.
pub const MARGIN: f64 = 0.03;
/// Most tokens one request gives up for being late ([`Pacer::take`]).
const MAX_LATE: u32 = 3;
/// Most scans whose pacer an instance keeps (the map is cleared when it grows past this).
const MAX_PACERS: usize = 1_000;

/// Tokens per lease for `limit`: a twentieth of a second's worth (so an instance's share comes
/// in spans of 50 ms), at least [`MIN_CHUNK`].
pub fn chunk_for(limit: u32) -> u32 {
    (limit / 20).max(MIN_CHUNK)
}

thread_local! {
    /// This thread's reading of the wall clock against tokio's clock, taken once: the pacer's
    /// time is tokio's (virtual in the simulator) from that point on.
    static BASE: (tokio::time::Instant, i64) = (
        tokio::time::Instant::now(),
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64),
    );
}

/// Now, in microseconds since the Unix epoch.
pub fn now_us() -> i64 {
    BASE.with(|(instant, micros)| micros + instant.elapsed().as_micros() as i64)
}

/// The storage requests one work item makes: counted, and paced if its scan has a limit.
#[derive(Debug, Default)]
pub struct Meter {
    count: AtomicU64,
    pacer: OnceLock<Arc<Pacer>>,
    /// Tokens taken ahead ([`Meter::prepay`]) and not yet spent ([`Meter::tick_prepaid`]).
    prepaid: AtomicU64,
    /// The scan's adaptive pacing per account, once the scan is known (`adaptive`).
    adaptive: OnceLock<Arc<ScanPacing>>,
    /// Attempts the service refused (503, 500 OperationTimedOut), each retried.
    refused: AtomicU64,
}

/// Hears of one request's refused attempts: counts them into the work item's meter and tells
/// the account's pacer.
struct Refusals {
    meter: Arc<Meter>,
    account: Option<Arc<AccountPacer>>,
}

impl crate::storage::refused::Sink for Refusals {
    fn refused(&self, account_limit: bool) {
        self.meter.refused.fetch_add(1, Ordering::Relaxed);
        if let (true, Some(account)) = (account_limit, &self.account) {
            account.refused();
        }
    }
}

impl Meter {
    pub fn new() -> Arc<Meter> {
        Arc::new(Meter::default())
    }

    /// Requests counted so far (the schedule's own included).
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Counts one request about to be sent: it spends a prepaid token ([`Meter::prepay`]) if
    /// one is left, without waiting; else it waits for its token as [`Meter::tick`] does.
    pub async fn tick_prepaid(&self) -> StorageResult<()> {
        let spent = self
            .prepaid
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        match spent {
            Ok(_) => {
                self.count.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(_) => self.tick().await,
        }
    }

    /// Takes `n` tokens now (waiting for their slots if paced), for the next `n` requests
    /// counted by [`Meter::tick_prepaid`] to spend without waiting. Tokens left unspent are
    /// lost: fewer requests than the limit, never more.
    pub async fn prepay(&self, n: u32) -> StorageResult<()> {
        let Some(pacer) = self.pacer.get() else {
            return Ok(());
        };
        for _ in 0..n {
            pacer.take(self).await?;
        }
        self.prepaid.fetch_add(u64::from(n), Ordering::Relaxed);
        Ok(())
    }

    /// Counts one request about to be sent, waiting for its token first if paced.
    pub async fn tick(&self) -> StorageResult<()> {
        self.count.fetch_add(1, Ordering::Relaxed);
        match self.pacer.get() {
            None => Ok(()),
            Some(pacer) => pacer.take(self).await,
        }
    }

    /// Paces this meter's requests by `pacer` from now on; those already counted are charged.
    pub fn pace_by(&self, pacer: Arc<Pacer>) {
        if self.pacer.set(pacer.clone()).is_ok() {
            pacer.charge(self.count());
        }
    }

    /// The pacer, if the meter has one.
    pub fn pacer(&self) -> Option<&Arc<Pacer>> {
        self.pacer.get()
    }

    /// Paces this meter's requests adaptively per account from now on (`adaptive`).
    pub fn adapt_by(&self, pacing: Arc<ScanPacing>) {
        let _ = self.adaptive.set(pacing);
    }

    /// Attempts the service refused so far (each retried by the adapters).
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Runs one request to `connection`'s account: after its adaptive pacing's wait (if the
    /// scan is paced there), with its refused attempts counted and reported to that pacing.
    pub async fn send<T>(
        self: &Arc<Self>,
        connection: &str,
        request: impl std::future::Future<Output = StorageResult<T>>,
    ) -> StorageResult<T> {
        let account = self.adaptive.get().map(|p| p.account(connection));
        if let Some(account) = &account {
            let requests = account.before_send().await?;
            self.count.fetch_add(requests, Ordering::Relaxed);
        }
        let sink = Arc::new(Refusals {
            meter: self.clone(),
            account,
        });
        crate::storage::refused::scope(sink, request).await
    }
}

/// This instance's tokens of one scan: the current chunk's next slot and what is left of it.
#[derive(Debug, Default)]
struct Window {
    /// The next slot (microseconds since the epoch, fractional).
    next: f64,
    left: u32,
    /// Requests made without a token (the schedule's own, a deferral's), paid by the next tokens.
    debt: u64,
}

impl Window {
    /// Drops the tokens whose slot passed more than [`GRACE_US`] ago and pays the debt.
    fn settle(&mut self, now: i64, spacing: f64) {
        let stale = now as f64 - GRACE_US as f64 - self.next;
        if self.left > 0 && stale > 0.0 {
            let k = ((stale / spacing).ceil() as u64).min(u64::from(self.left)) as u32;
            self.left -= k;
            self.next += f64::from(k) * spacing;
        }
        let paid = self.debt.min(u64::from(self.left)) as u32;
        self.debt -= u64::from(paid);
        self.left -= paid;
        self.next += f64::from(paid) * spacing;
    }

    /// The slot of the next token, taken.
    fn take(&mut self, now: i64, spacing: f64) -> Option<f64> {
        self.settle(now, spacing);
        if self.left == 0 {
            return None;
        }
        let at = self.next;
        self.next += spacing;
        self.left -= 1;
        Some(at)
    }
}

/// One scan's pacer on this instance, shared by all its work items here.
pub struct Pacer {
    limit: u32,
    chunk: u32,
    schedule: Box<dyn Schedule>,
    window: Mutex<Window>,
    /// One lease at a time per instance: the others wait for its chunk.
    leasing: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Pacer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pacer")
            .field("limit", &self.limit)
            .field("chunk", &self.chunk)
            .finish()
    }
}

impl Pacer {
    pub fn new(limit: u32, schedule: Box<dyn Schedule>) -> Self {
        Pacer {
            limit,
            chunk: chunk_for(limit),
            schedule,
            window: Mutex::default(),
            leasing: tokio::sync::Mutex::new(()),
        }
    }

    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Tokens of a solo chunk (`lease` invariant 2): [`SOLO_SPAN_US`] of the schedule, at least
    /// a chunk.
    fn solo_chunk(&self) -> u32 {
        let tokens = SOLO_SPAN_US as f64 / self.spacing();
        (tokens as u32).max(self.chunk)
    }

    /// Microseconds between two slots: the limit less [`MARGIN`].
    fn spacing(&self) -> f64 {
        1e6 / (f64::from(self.limit) * (1.0 - MARGIN))
    }

    /// Charges `n` requests made without a token.
    pub fn charge(&self, n: u64) {
        self.window.lock().unwrap().debt += n;
    }

    /// How long a token taken now would wait (0 if one is free now): the instance's backlog.
    pub fn backlog(&self) -> Duration {
        let mut window = self.window.lock().unwrap();
        let now = now_us();
        window.settle(now, self.spacing());
        let ahead = window.next - now as f64 + window.debt as f64 * self.spacing();
        Duration::from_micros(ahead.max(0.0) as u64)
    }

    /// Waits for a token; a lease the token needs is counted into `meter`. A token whose slot
    /// has passed by more than [`GRACE_US`] when its wait ends (the instance was too busy to
    /// send on time) is given up and another taken, at most [`MAX_LATE`] times, so that late
    /// requests do not bunch up with those on time.
    async fn take(&self, meter: &Meter) -> StorageResult<()> {
        let mut late = 0;
        // Bounded: each round takes a token (at most MAX_LATE + 1 of them) or leases a chunk.
        loop {
            let slot = self.window.lock().unwrap().take(now_us(), self.spacing());
            if let Some(at) = slot {
                let wait = at - now_us() as f64;
                if wait > 0.0 {
                    tokio::time::sleep(Duration::from_micros(wait as u64)).await;
                }
                if now_us() as f64 - at > GRACE_US as f64 && late < MAX_LATE {
                    late += 1;
                    continue;
                }
                return Ok(());
            }
            let _leasing = self.leasing.lock().await;
            let free = {
                let mut window = self.window.lock().unwrap();
                window.settle(now_us(), self.spacing());
                window.left > 0
            };
            if free {
                continue;
            }
            let spacing = self.spacing();
            let span = (f64::from(self.chunk) * spacing).round() as i64;
            let solo = (f64::from(self.solo_chunk()) * spacing).round() as i64;
            let grant = self.schedule.grant(now_us(), span, solo).await?;
            meter.count.fetch_add(grant.requests, Ordering::Relaxed);
            let mut window = self.window.lock().unwrap();
            window.next = grant.start as f64;
            window.left = (grant.span_us as f64 / spacing).round() as u32;
            window.debt += grant.requests;
        }
    }
}

/// This instance's pacers, by scan.
#[derive(Default)]
pub struct Pacers {
    pacers: Mutex<HashMap<String, Arc<Pacer>>>,
}

impl Pacers {
    /// The pacer of `scan_id` at `limit`, made by `schedule` on first use.
    pub fn get_or_make(
        &self,
        scan_id: &str,
        limit: u32,
        schedule: impl FnOnce() -> Box<dyn Schedule>,
    ) -> Arc<Pacer> {
        let mut pacers = self.pacers.lock().unwrap();
        if let Some(pacer) = pacers.get(scan_id) {
            return pacer.clone();
        }
        if pacers.len() >= MAX_PACERS {
            pacers.clear();
        }
        let pacer = Arc::new(Pacer::new(limit, schedule()));
        pacers.insert(scan_id.to_string(), pacer.clone());
        pacer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_drops_stale_tokens_and_pays_debt_first() {
        let spacing = 10_000.0; // 100 per second
        let mut w = Window {
            next: 0.0,
            left: 10,
            debt: 2,
        };
        // At 55 ms, slots up to 35 ms are stale (grace 20 ms): 0..=30 ms dropped (4), then
        // the debt takes 40 and 50 ms; the token is the 60 ms slot.
        assert_eq!(w.take(55_000, spacing), Some(60_000.0));
        assert_eq!((w.left, w.debt), (3, 0));
        assert_eq!(w.take(55_000, spacing), Some(70_000.0));
    }

    #[test]
    fn chunks_grow_with_the_limit() {
        assert_eq!(chunk_for(10), MIN_CHUNK);
        assert_eq!(chunk_for(2_000), 100);
        assert_eq!(chunk_for(20_000), 1_000);
    }
}

#[cfg(all(test, feature = "lab"))]
mod memory_tests;

#[cfg(all(test, feature = "lab"))]
mod adaptive_tests;
