//! The pacer against the in-memory table store in paused (virtual) time: two instances'
//! pacers share one schedule row, many items on each ask for tokens at once. These hold the
//! limit deterministically; `tests/scans/rate_limit.rs` measures it on Azurite (a measurement:
//! docs/development.md, "Measurements").

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
    let limit = 200;
    let run = run_paced(limit, 2, 8, 250, Duration::from_millis(3)).await;
    assert_holds_the_limit(limit, run);
}

/// The paced run `(requests, lease requests, seconds, busiest 1-s window)` held `limit` in its
/// busiest second, ran at 90-100 % of it, and its leases cost at most 4 % of its requests.
fn assert_holds_the_limit(
    limit: u32,
    (requests, leases, elapsed, busiest): (u64, u64, f64, usize),
) {
    let rate = (requests + leases) as f64 / elapsed;
    println!("{requests} requests + {leases} lease requests in {elapsed:.2} s: {rate:.1}/s, busiest second {busiest}");
    assert!(busiest as f64 <= f64::from(limit) * 1.05, "{busiest}");
    assert!(rate >= f64::from(limit) * 0.9, "{rate}");
    assert!(rate <= f64::from(limit), "{rate}");
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
    let schedule = TableSchedule::new(store.clone(), "Work", "s");
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

/// `instances` pacers at `limit` on one schedule row, each with `items` items sending
/// `per_item` requests `gap` apart: (requests, lease requests, seconds, busiest 1-s window).
async fn run_paced(
    limit: u32,
    instances: usize,
    items: usize,
    per_item: usize,
    gap: Duration,
) -> (u64, u64, f64, usize) {
    // Instances start a millisecond apart (their first leases would all race, past the
    // schedule's rounds).
    let script: Vec<Item> = (0..instances * items)
        .map(|i| Item {
            instance: i % instances,
            start: Duration::from_millis((i % instances) as u64),
            requests: per_item,
            gap,
        })
        .collect();
    let run = run_items(limit, instances, &script).await;
    let requests = run.times.len() as u64;
    let elapsed = (run.end - run.start) as f64 / 1e6;
    let mut times = run.times;
    let busiest = busiest_window(&mut times, 1_000_000);
    (requests, run.leases, elapsed, busiest)
}

/// One work item of [`run_items`]: on pacer `instance`, from `start` on, `requests` requests,
/// each `gap` after the previous one was sent.
struct Item {
    instance: usize,
    start: Duration,
    requests: usize,
    gap: Duration,
}

/// What [`run_items`] saw: when each request was sent (µs), the lease requests, start and end.
struct Run {
    times: Vec<i64>,
    leases: u64,
    start: i64,
    end: i64,
}

/// `instances` pacers at `limit` on one schedule row (the in-memory store), running `items`.
async fn run_items(limit: u32, instances: usize, items: &[Item]) -> Run {
    let store = MemoryTableStore::default();
    store.create_table("Work").await.unwrap();
    let pacers: Vec<Arc<Pacer>> = (0..instances)
        .map(|_| {
            Arc::new(Pacer::new(
                limit,
                Box::new(TableSchedule::new(store.clone(), "Work", "s")),
            ))
        })
        .collect();
    let times = Arc::new(Mutex::new(Vec::new()));
    let meters: Vec<Arc<Meter>> = items.iter().map(|_| Meter::new()).collect();
    let start = now_us();
    let tasks = items.iter().zip(&meters).map(|(item, meter)| {
        meter.pace_by(pacers[item.instance].clone());
        let (meter, times) = (meter.clone(), times.clone());
        let (delay, requests, gap) = (item.start, item.requests, item.gap);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            for _ in 0..requests {
                meter.tick().await.unwrap();
                times.lock().unwrap().push(now_us());
                tokio::time::sleep(gap).await;
            }
        })
    });
    futures::future::join_all(tasks).await;
    let end = now_us();
    let times = times.lock().unwrap().clone();
    let total: u64 = meters.iter().map(|m| m.count()).sum();
    Run {
        leases: total - times.len() as u64,
        times,
        start,
        end,
    }
}

/// One instance sending a sixth of the limit, alone: once a chunk ends unused it leases solo
/// chunks of a second, each one conditional write, so its leases cost well under 1 % of its
/// requests (with only the chunks of 50 ms it used a sixth of each and leased ~14 times a
/// second: two requests each, ~9 %).
#[tokio::test(start_paused = true)]
async fn an_instance_far_below_the_limit_leases_little() {
    // 8 items, each a request every 25 ms: ~320 requests/s against 2,000.
    let (requests, leases, elapsed, busiest) =
        run_paced(2_000, 1, 8, 400, Duration::from_millis(25)).await;
    println!(
        "{requests} requests + {leases} lease requests in {elapsed:.2} s, busiest second {busiest}"
    );
    assert!(leases as f64 <= requests as f64 * 0.01, "{leases}");
    // Unpaced it takes 10 s: the limit does not slow it.
    assert!(elapsed <= 10.2, "slowed down: {elapsed}");
}

/// Many instances asking for more than the limit: together they hold it, in every second, no
/// solo chunk slows them, and the leases stay a few percent.
#[tokio::test(start_paused = true)]
async fn many_instances_above_the_limit_hold_it() {
    let limit = 2_000;
    let run = run_paced(limit, 8, 8, 300, Duration::from_millis(2)).await;
    assert_holds_the_limit(limit, run);
}

/// A lease from memory (solo) is tried only while this instance leased alone; when another
/// instance leased in between, it loses, is counted, and the lease reads the row as usual.
#[tokio::test]
async fn a_solo_lease_from_memory_that_loses_reads_the_row() {
    use super::lease::Schedule;
    let store = MemoryTableStore::default();
    store.create_table("Work").await.unwrap();
    let a = TableSchedule::new(store.clone(), "Work", "s");
    let b = TableSchedule::new(store.clone(), "Work", "s");
    let (span, solo) = (50_000, 1_000_000);
    let t0 = 1_000_000_000;
    // A makes the row; its chunk ends unused; alone, it leases solo from memory: one request.
    assert_eq!(a.grant(t0, span, solo).await.unwrap().requests, 2);
    let alone = a.grant(t0 + 100_000, span, solo).await.unwrap();
    assert_eq!(
        (alone.start, alone.span_us, alone.requests),
        (t0 + 100_000, solo, 1)
    );
    // B leases after A's solo chunk: it read a row it did not write, so a plain chunk.
    let other = b.grant(t0 + 200_000, span, solo).await.unwrap();
    assert_eq!((other.start, other.span_us), (t0 + 1_100_000, span));
    // A's write from memory loses (counted), then it reads: B's chunk is ahead, a plain chunk.
    let lost = a.grant(t0 + 1_120_000, span, solo).await.unwrap();
    assert_eq!(
        (lost.start, lost.span_us, lost.requests),
        (t0 + 1_150_000, span, 3)
    );
    // No one leased since A: its read finds its own write, its chunk ended: solo again.
    let again = a.grant(t0 + 2_000_000, span, solo).await.unwrap();
    assert_eq!(
        (again.start, again.span_us, again.requests),
        (t0 + 2_000_000, solo, 2)
    );
}

/// A burst after a quiet start: one instance sends a few requests, then is idle, then both
/// instances' items ask for far more than the limit at once. Tokens whose slots passed unused
/// were dropped (an idle instance saves none for a burst), and the solo chunk the quiet
/// instance held ends in the schedule like any other: no second, and no tenth of a second,
/// holds more than the limit allows.
#[tokio::test(start_paused = true)]
async fn a_burst_after_a_quiet_start_holds_the_limit_in_every_tenth_of_a_second() {
    let limit = 200;
    let mut script = vec![Item {
        instance: 0,
        start: Duration::ZERO,
        requests: 10,
        gap: Duration::from_millis(40),
    }];
    for i in 0..16 {
        script.push(Item {
            instance: i % 2,
            start: Duration::from_millis(2_000),
            requests: 40,
            gap: Duration::ZERO,
        });
    }
    let run = run_items(limit, 2, &script).await;
    let burst: Vec<i64> = run
        .times
        .iter()
        .copied()
        .filter(|t| *t >= run.start + 2_000_000)
        .collect();
    let (mut all, mut burst_only) = (run.times.clone(), burst.clone());
    let second = busiest_window(&mut all, 1_000_000);
    let tenth = busiest_window(&mut burst_only, 100_000);
    let seconds = (run.end - run.start - 2_000_000) as f64 / 1e6;
    println!(
        "burst: {} requests in {seconds:.2} s after the quiet start, {} lease requests, busiest second {second}, busiest 100 ms {tenth}",
        burst.len(),
        run.leases
    );
    assert_eq!(burst.len(), 640);
    assert!(second as f64 <= f64::from(limit) * 1.05, "{second}");
    // A tenth of a second holds 19.4 slots (the 3 % margin); with the quiet instance's unused
    // tokens kept instead of dropped, the burst spent them at once: 25.
    assert!(tenth <= 21, "{tenth} in 100 ms");
    // The burst ran at the limit, not slower: its requests and the leases at 97 % of 200/s,
    // and at most one chunk's span more (the last items wait for a chunk leased behind the
    // other instance's: 3.71 s against 3.42 s at full rate).
    let full_rate = f64::from(limit) * (1.0 - MARGIN);
    let chunk_span = f64::from(chunk_for(limit)) / full_rate;
    let most = (burst.len() as u64 + run.leases) as f64 / full_rate + chunk_span + 0.01;
    assert!(seconds <= most, "{seconds} s, at most {most}");
}

/// An instance too busy to send on time: its clock jumps 100 ms while 32 items wait for their
/// slots (`tokio::time::advance`, the stall). Woken 100 ms late, each gives up its token and
/// takes another; tokens whose slots passed more than [`GRACE_US`] ago are dropped. So what is
/// sent at the instant the stall ends is at most the grace's worth of tokens, not one more for
/// every waiting item (45 with the give-up turned off), and the busiest second still holds the
/// limit.
#[tokio::test(start_paused = true)]
async fn requests_woken_late_give_up_their_tokens_instead_of_bunching() {
    let limit = 1_000;
    let script: Vec<Item> = (0..32)
        .map(|_| Item {
            instance: 0,
            start: Duration::ZERO,
            requests: 40,
            gap: Duration::ZERO,
        })
        .collect();
    let stall = tokio::spawn(async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        tokio::time::advance(Duration::from_millis(100)).await;
        now_us()
    });
    let run = run_items(limit, 1, &script).await;
    let woke = stall.await.unwrap();
    let at_once = run.times.iter().filter(|t| **t == woke).count();
    let stalled = run
        .times
        .iter()
        .filter(|t| (woke - 100_000..woke).contains(*t))
        .count();
    let mut all = run.times.clone();
    let second = busiest_window(&mut all, 1_000_000);
    println!(
        "stall: {} requests, {at_once} sent at the instant the stall ended, {stalled} during it, busiest second {second}",
        run.times.len()
    );
    assert_eq!(stalled, 0, "nothing is sent while the instance stalls");
    let grace_tokens = (GRACE_US as f64 * f64::from(limit) / 1e6).ceil() as usize;
    assert!(
        (1..=grace_tokens).contains(&at_once),
        "{at_once} at once (the grace holds {grace_tokens})"
    );
    assert!(second as f64 <= f64::from(limit) * 1.05, "{second}");
}
