//! The memory lookups hold of index files, bounded in bytes for the whole process: every
//! lookup of the process shares the same two pools.
//!
//! - **Reads** ([`READ_BUDGET`]): what a lookup reads and works on at once (a pointer, a
//!   manifest being parsed, a segment's directory and the body rows read for a value). Each
//!   piece of work asks for everything it will hold in one [`Budget::read`], and waits for it.
//! - **Held** ([`HELD_BUDGET`], at most [`HELD_PER_LOOKUP`] a lookup): what a lookup keeps
//!   across those waits (its list of segments, its candidate ranges). Never waited for: a
//!   lookup over its own bound is refused, and one that finds the process's pool spent is told
//!   to try again.
//!
//! The directory cache has its own bound (`segments::DIRECTORY_CACHE_BYTES`).
//!
//! Invariants:
//! 1. The index bytes lookups hold are at most `READ_BUDGET + HELD_BUDGET` plus the cache, however
//!    many lookups run and whatever their index files say (the sizes asked for come from bounds
//!    checked before reading: `crate::index::SegmentHeader`).
//! 2. No deadlock: a [`Charge`] is waited for only by work that holds no other charge (it
//!    drops what it has and asks again for the whole, `segments`), and held bytes are never
//!    waited for. Waits are first come, first served (tokio's semaphore), so a large charge is
//!    not starved by small ones.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Bytes of index files the process's lookups read and work on at once (the largest segment
/// the bounds allow needs about 21 MiB: a 16-MiB directory parsed, and a 4-MiB piece of it read).
pub const READ_BUDGET: u64 = 24 << 20;
/// Bytes the process's lookups keep across their reads (segment lists, candidate ranges).
pub const HELD_BUDGET: u64 = 16 << 20;
/// Bytes one lookup keeps across its reads: about 15,000 candidate ranges of short keys.
pub const HELD_PER_LOOKUP: u64 = 4 << 20;

/// The two pools (see the module documentation), and the most ever in use, for the log.
pub struct Budget {
    reads: Arc<Semaphore>,
    read_total: u64,
    held: Arc<Semaphore>,
    held_total: u64,
    peak: AtomicU64,
}

/// Bytes of the read pool, given back when dropped.
pub struct Charge(OwnedSemaphorePermit);

impl Charge {
    pub fn bytes(&self) -> u64 {
        self.0.num_permits() as u64
    }
}

/// Why held bytes were refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeldRefused {
    /// Over [`HELD_PER_LOOKUP`]: this lookup keeps too much.
    Lookup { bytes: u64 },
    /// The process's pool is spent by other lookups: try again.
    Process,
}

/// One lookup's held bytes, given back when dropped.
pub struct Held {
    budget: Arc<Budget>,
    permit: Option<OwnedSemaphorePermit>,
    limit: u64,
}

impl Held {
    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.permit.as_ref().map_or(0, |p| p.num_permits() as u64)
    }

    /// Holds `bytes` more, or refuses without waiting.
    pub fn add(&mut self, bytes: u64) -> Result<(), HeldRefused> {
        let total = self.bytes() + bytes;
        if total > self.limit {
            return Err(HeldRefused::Lookup { bytes: total });
        }
        if bytes == 0 {
            return Ok(());
        }
        let more = self
            .budget
            .held
            .clone()
            .try_acquire_many_owned(bytes as u32)
            .map_err(|_| HeldRefused::Process)?;
        match &mut self.permit {
            Some(p) => p.merge(more),
            None => self.permit = Some(more),
        }
        self.budget.note_peak();
        Ok(())
    }
}

impl Budget {
    pub fn new(read_total: u64, held_total: u64) -> Budget {
        Budget {
            reads: Arc::new(Semaphore::new(read_total as usize)),
            read_total,
            held: Arc::new(Semaphore::new(held_total as usize)),
            held_total,
            peak: AtomicU64::new(0),
        }
    }

    /// The whole read pool.
    pub fn read_total(&self) -> u64 {
        self.read_total
    }

    /// Waits for `bytes` of the read pool (invariant 2: the caller holds no other charge);
    /// `None` for more than the whole pool.
    pub async fn read(&self, bytes: u64) -> Option<Charge> {
        if bytes > self.read_total {
            return None;
        }
        let permit = self
            .reads
            .clone()
            .acquire_many_owned(bytes as u32)
            .await
            .expect("the semaphore is never closed");
        self.note_peak();
        Some(Charge(permit))
    }

    /// An empty hold for one lookup, of at most `limit` bytes.
    pub fn hold(self: &Arc<Self>, limit: u64) -> Held {
        Held {
            budget: self.clone(),
            permit: None,
            limit,
        }
    }

    /// Bytes of both pools in use now.
    pub fn in_use(&self) -> u64 {
        (self.read_total - self.reads.available_permits() as u64)
            + (self.held_total - self.held.available_permits() as u64)
    }

    /// The most bytes of both pools ever in use at once (as seen after each charge).
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    fn note_peak(&self) {
        self.peak.fetch_max(self.in_use(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Many tasks asking for charges of every size, each holding nothing while it waits: all
    /// finish (no deadlock), and the pool is never over its total.
    #[tokio::test(start_paused = true)]
    async fn charges_never_exceed_the_pool_and_every_waiter_finishes() {
        let budget = Arc::new(Budget::new(1000, 100));
        let in_use = Arc::new(AtomicU64::new(0));
        let most = Arc::new(AtomicU64::new(0));
        let tasks: Vec<_> = (0..200u64)
            .map(|i| {
                let (budget, in_use, most) = (budget.clone(), in_use.clone(), most.clone());
                tokio::spawn(async move {
                    let want = [1000, 1, 400, 999, 250][i as usize % 5];
                    let charge = budget.read(want).await.unwrap();
                    let now = in_use.fetch_add(charge.bytes(), Ordering::SeqCst) + want;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(1 + i % 7)).await;
                    in_use.fetch_sub(want, Ordering::SeqCst);
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        assert!(most.load(Ordering::SeqCst) <= 1000);
        assert_eq!(budget.in_use(), 0);
        assert!(budget.peak() <= 1000 + 100);
        assert!(budget.read(1001).await.is_none());
    }

    #[tokio::test]
    async fn held_bytes_are_refused_not_waited_for() {
        let budget = Arc::new(Budget::new(1000, 100));
        let mut a = budget.hold(60);
        let mut b = budget.hold(60);
        a.add(50).unwrap();
        assert_eq!(a.add(20), Err(HeldRefused::Lookup { bytes: 70 }));
        b.add(40).unwrap();
        assert_eq!(b.add(20), Err(HeldRefused::Process));
        drop(a);
        b.add(20).unwrap();
        assert_eq!(b.bytes(), 60);
        assert_eq!(budget.in_use(), 60);
    }
}
