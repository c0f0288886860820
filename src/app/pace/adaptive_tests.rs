//! Adaptive pacing across instances in paused (virtual) time: instances' pacers share their
//! scan's row in the in-memory table store, and their requests go to a throttling account (a
//! token bucket refusing past its capacity, each refusal reported as the adapters' retry loop
//! reports it, then retried after a backoff). Several instances converge under the account's
//! capacity with few refusals, and recover once the throttling stops.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::adaptive::{ScanPacing, TableRows};
use super::*;
use crate::lab::memory::MemoryTableStore;
use crate::storage::TableStore;

/// An account refusing requests past `capacity` per second (burst: a tenth of a second).
struct Account {
    capacity: Mutex<f64>,
    bucket: Mutex<(f64, tokio::time::Instant)>,
    sent: AtomicU64,
    refused: AtomicU64,
    /// Admitted requests by second since the start.
    per_second: Mutex<Vec<u64>>,
    start: tokio::time::Instant,
}

impl Account {
    fn new(capacity: f64) -> Arc<Account> {
        let now = tokio::time::Instant::now();
        Arc::new(Account {
            capacity: Mutex::new(capacity),
            bucket: Mutex::new((capacity / 10.0, now)),
            sent: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            per_second: Mutex::default(),
            start: now,
        })
    }

    fn admit(&self) -> bool {
        let now = tokio::time::Instant::now();
        let capacity = *self.capacity.lock().unwrap();
        let mut b = self.bucket.lock().unwrap();
        b.0 = (b.0 + capacity * now.duration_since(b.1).as_secs_f64()).min(capacity / 10.0);
        b.1 = now;
        self.sent.fetch_add(1, Ordering::Relaxed);
        if b.0 < 1.0 {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        b.0 -= 1.0;
        let second = now.duration_since(self.start).as_secs() as usize;
        let mut per = self.per_second.lock().unwrap();
        let len = per.len().max(second + 1);
        per.resize(len, 0);
        per[second] += 1;
        true
    }

    /// One request: 5 ms there and back; a refusal is reported and retried after 50 ms.
    async fn request(&self) {
        loop {
            tokio::time::sleep(Duration::from_millis(5)).await;
            if self.admit() {
                return;
            }
            crate::storage::refused::report(true);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn rate_over(&self, seconds: std::ops::Range<usize>) -> f64 {
        let per = self.per_second.lock().unwrap();
        let n = seconds.len() as f64;
        per[seconds].iter().sum::<u64>() as f64 / n
    }
}

/// `instances` instances with `items` items each, every item sending requests back to back to
/// `account` for `seconds`, paced adaptively through one scan's rows; returns the rows' requests.
async fn run(account: Arc<Account>, instances: usize, items: usize, seconds: u64) -> u64 {
    let store = MemoryTableStore::default();
    store.create_table("Work").await.unwrap();
    let pacings: Vec<Arc<ScanPacing>> = (0..instances)
        .map(|_| {
            let rows = TableRows {
                store: store.clone(),
                table: "Work".to_string(),
                scan_id: "s".to_string(),
            };
            Arc::new(ScanPacing::new(Arc::new(rows)))
        })
        .collect();
    let end = tokio::time::Instant::now() + Duration::from_secs(seconds);
    let tasks = (0..instances * items).map(|i| {
        let meter = Meter::new();
        meter.adapt_by(pacings[i % instances].clone());
        let account = account.clone();
        tokio::spawn(async move {
            while tokio::time::Instant::now() < end {
                let request = async {
                    account.request().await;
                    Ok(())
                };
                meter.send("Source", request).await.unwrap();
            }
            meter.count()
        })
    });
    let counted = futures::future::join_all(tasks).await;
    counted.into_iter().map(|r| r.unwrap()).sum()
}

#[tokio::test(start_paused = true)]
async fn instances_converge_under_the_account_and_recover_when_it_frees_up() {
    // 8 instances × 16 items back to back: ~3,200 requests/s asked, the account gives 1,000.
    let account = Account::new(1_000.0);
    let freed = account.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(60)).await;
        *freed.capacity.lock().unwrap() = 2_000.0;
    });
    let row_requests = run(account.clone(), 8, 16, 120).await;
    let (sent, refused) = (
        account.sent.load(Ordering::Relaxed),
        account.refused.load(Ordering::Relaxed),
    );
    let settled = account.rate_over(30..60);
    let recovered = account.rate_over(100..120);
    println!(
        "{sent} attempts, {refused} refused ({:.2} %), row requests {row_requests}, settled {settled:.0}/s, after the account freed up {recovered:.0}/s",
        refused as f64 * 100.0 / sent as f64
    );
    assert!(refused as f64 <= sent as f64 * 0.05, "{refused} of {sent}");
    assert!((700.0..=1_000.0).contains(&settled), "settled at {settled}");
    assert!(recovered > 1_200.0, "did not recover: {recovered}");
}

#[tokio::test(start_paused = true)]
async fn without_refusals_nothing_is_paced_and_rows_are_only_read_now_and_then() {
    let account = Account::new(1e9);
    let row_requests = run(account.clone(), 4, 4, 20).await;
    let sent = account.sent.load(Ordering::Relaxed);
    // Unpaced, each item sends one request per 5 ms: 16 × 200/s for 20 s.
    assert!(sent as f64 >= 16.0 * 200.0 * 20.0 * 0.99, "{sent}");
    // One read per instance per 5 s (IDLE_REFRESH_US), and nothing written.
    assert!(row_requests <= 4 * 5, "{row_requests} row requests");
}
