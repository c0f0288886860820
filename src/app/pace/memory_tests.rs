//! The pacer against the in-memory table store in paused (virtual) time: two instances'
//! pacers share one schedule row, many items on each ask for tokens at once.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::lease::TableSchedule;
use super::*;
use crate::lab::memory::MemoryTableStore;
use crate::storage::TableStore;

/// The highest count of `times` (microseconds) in any window of `width` microseconds.
fn busiest_window(times: &mut [i64], width: i64) -> usize {
    times.sort_unstable();
    let mut best = 0;
    let mut start = 0;
    for end in 0..times.len() {
        while times[end] - times[start] >= width {
            start += 1;
        }
        best = best.max(end - start + 1);
    }
    best
}

#[tokio::test(start_paused = true)]
async fn two_instances_share_the_limit_and_leases_cost_a_few_percent() {
    let store = MemoryTableStore::default();
    store.create_table("Work").await.unwrap();
    let limit = 200;
    let pacer = |_: usize| {
        Arc::new(Pacer::new(
            limit,
            Box::new(TableSchedule {
                store: store.clone(),
                table: "Work".into(),
                scan_id: "s".into(),
            }),
        ))
    };
    let pacers = [pacer(0), pacer(1)];
    let times = Arc::new(Mutex::new(Vec::new()));
    let meters: Vec<Arc<Meter>> = (0..16).map(|_| Meter::new()).collect();
    let start = now_us();
    let tasks = meters.iter().enumerate().map(|(i, meter)| {
        meter.pace_by(pacers[i % 2].clone());
        let (meter, times) = (meter.clone(), times.clone());
        tokio::spawn(async move {
            for _ in 0..250 {
                meter.tick().await.unwrap();
                times.lock().unwrap().push(now_us());
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        })
    });
    futures::future::join_all(tasks).await;
    let elapsed = (now_us() - start) as f64 / 1e6;
    let requests = 16 * 250;
    let total: u64 = meters.iter().map(|m| m.count()).sum();
    let leases = total - requests;
    let mut times = times.lock().unwrap().clone();
    let busiest = busiest_window(&mut times, 1_000_000);
    println!(
        "{requests} requests + {leases} lease requests in {elapsed:.2} s: {:.1}/s, busiest second {busiest}",
        total as f64 / elapsed
    );
    assert!(busiest as f64 <= f64::from(limit) * 1.05, "{busiest}");
    assert!(total as f64 / elapsed >= f64::from(limit) * 0.9);
    assert!(total as f64 / elapsed <= f64::from(limit));
    assert!(leases as f64 <= requests as f64 * 0.04, "{leases}");
}

#[tokio::test(start_paused = true)]
async fn a_meter_without_a_pacer_only_counts() {
    let meter = Meter::new();
    let before = tokio::time::Instant::now();
    for _ in 0..1000 {
        meter.tick().await.unwrap();
    }
    assert_eq!(meter.count(), 1000);
    assert_eq!(tokio::time::Instant::now(), before);
}

/// Prepaid tokens are waited for once, then spent without waiting; the request after them
/// waits for its own token.
#[tokio::test(start_paused = true)]
async fn prepaid_tokens_are_spent_without_waiting_then_requests_wait() {
    let store = MemoryTableStore::default();
    store.create_table("Work").await.unwrap();
    let schedule = TableSchedule {
        store: store.clone(),
        table: "Work".into(),
        scan_id: "s".into(),
    };
    let pacer = Arc::new(Pacer::new(100, Box::new(schedule)));
    let meter = Meter::new();
    meter.pace_by(pacer.clone());
    // The first lease's chunk is spent from now on, one token every ~10 ms.
    meter.prepay(4).await.unwrap();
    let paid = tokio::time::Instant::now();
    for _ in 0..4 {
        meter.tick_prepaid().await.unwrap();
    }
    let now = tokio::time::Instant::now();
    assert_eq!(now, paid, "prepaid requests never wait");
    // The fifth waits for the chunk's next slot (~10 ms at 100/s), and no more.
    meter.tick_prepaid().await.unwrap();
    let waited = paid.elapsed().as_secs_f64();
    assert!((0.001..0.025).contains(&waited), "{waited}");
}
