//! How many table and blob requests the proxy had in flight, averaged over time: the
//! benchmark's measure of the concurrency a variant sent its storage requests with, so that a
//! bare client can be made to send the same requests the same way (`bench::floor`).
//!
//! Invariant: `integral` is the sum over time of the requests in flight (request-seconds) up
//! to `last`; every change of `now` first adds `now × (t − last)` and moves `last` to `t`.

use std::sync::{Arc, Mutex};

use tokio::time::Instant;

#[derive(Debug)]
struct State {
    now: u64,
    integral: f64,
    last: Instant,
}

/// A time-weighted gauge of requests in flight.
#[derive(Debug, Clone)]
pub struct InFlight {
    state: Arc<Mutex<State>>,
}

/// A point to average from ([`InFlight::mean_since`]).
#[derive(Debug, Clone, Copy)]
pub struct InFlightMark {
    integral: f64,
    at: Instant,
}

/// One request in flight; it lands when dropped.
#[derive(Debug)]
pub struct InFlightGuard {
    gauge: InFlight,
}

impl Default for InFlight {
    fn default() -> Self {
        InFlight {
            state: Arc::new(Mutex::new(State {
                now: 0,
                integral: 0.0,
                last: Instant::now(),
            })),
        }
    }
}

impl State {
    fn advance(&mut self, t: Instant) {
        self.integral += self.now as f64 * (t - self.last).as_secs_f64();
        self.last = t;
    }
}

impl InFlight {
    /// Counts one request in flight until the guard is dropped.
    pub fn enter(&self) -> InFlightGuard {
        self.change(|n| n + 1);
        InFlightGuard {
            gauge: self.clone(),
        }
    }

    fn change(&self, f: impl FnOnce(u64) -> u64) {
        let mut s = self.state.lock().unwrap();
        s.advance(Instant::now());
        s.now = f(s.now);
    }

    pub fn mark(&self) -> InFlightMark {
        let mut s = self.state.lock().unwrap();
        let at = Instant::now();
        s.advance(at);
        InFlightMark {
            integral: s.integral,
            at,
        }
    }

    /// The mean number of requests in flight since `mark` (0 if no time has passed).
    pub fn mean_since(&self, mark: &InFlightMark) -> f64 {
        let end = self.mark();
        let seconds = (end.at - mark.at).as_secs_f64();
        if seconds > 0.0 {
            (end.integral - mark.integral) / seconds
        } else {
            0.0
        }
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.gauge.change(|n| n.saturating_sub(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn the_mean_weighs_each_count_by_how_long_it_lasted() {
        let gauge = InFlight::default();
        let mark = gauge.mark();
        let a = gauge.enter();
        tokio::time::advance(Duration::from_secs(1)).await; // 1 in flight for 1 s
        let b = gauge.enter();
        let c = gauge.enter();
        tokio::time::advance(Duration::from_secs(2)).await; // 3 in flight for 2 s
        drop((a, b, c));
        tokio::time::advance(Duration::from_secs(1)).await; // none for 1 s
        assert_eq!(gauge.mean_since(&mark), 7.0 / 4.0);
        let later = gauge.mark();
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(gauge.mean_since(&later), 0.0);
    }

    #[tokio::test(start_paused = true)]
    async fn no_time_no_mean() {
        let gauge = InFlight::default();
        let _a = gauge.enter();
        let mark = gauge.mark();
        assert_eq!(gauge.mean_since(&mark), 0.0);
    }
}
