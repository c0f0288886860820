//! The proxy as a throttling account: table requests above a set rate are refused with the
//! service's `503 ServerBusy` "Operations per second is over the account limit.", as an
//! account past its request-rate target refuses them (issue
//! 43: a copy through it meets throttling for real, on Azurite).
//!
//! Invariants:
//! 1. Off until [`StorageProxy::throttle_above`]: nothing is refused and nothing is counted.
//! 2. A token bucket of `rate` per second holding at most `burst` tokens (it starts full):
//!    over any interval of `t` seconds at most `burst + rate × t` table requests go through;
//!    a refused request takes no token and is never forwarded.
//! 3. Queue requests (the host's polls among them) are never throttled.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use super::{Service, StorageProxy};

/// The bucket: `None` while off; else (rate per second, burst, tokens, last refill).
#[derive(Default)]
pub(super) struct Throttle {
    bucket: Mutex<Option<(f64, f64, f64, Instant)>>,
    refused: AtomicU64,
    admitted: AtomicU64,
}

impl Throttle {
    /// Whether a request to `service` is refused now (it takes a token if not).
    pub(super) fn refuses(&self, service: Service) -> bool {
        if service != Service::Table {
            return false;
        }
        let mut bucket = self.bucket.lock().unwrap();
        let Some((rate, burst, tokens, last)) = bucket.as_mut() else {
            return false;
        };
        let now = Instant::now();
        *tokens = (*tokens + rate.to_owned() * now.duration_since(*last).as_secs_f64()).min(*burst);
        *last = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            self.admitted.fetch_add(1, Ordering::Relaxed);
            false
        } else {
            self.refused.fetch_add(1, Ordering::Relaxed);
            true
        }
    }
}

/// The account's answer to a request past its request-rate target.
pub(super) fn over_the_limit(
    service: Service,
) -> hyper::Response<http_body_util::Full<bytes::Bytes>> {
    super::error_response(
        service,
        hyper::StatusCode::SERVICE_UNAVAILABLE,
        "ServerBusy",
        "Operations per second is over the account limit.",
    )
}

impl StorageProxy {
    /// Refuses table requests above `rate` per second (bursts up to `burst`) with `503
    /// ServerBusy` from now on; `None` switches it off.
    pub fn throttle_above(&self, limit: Option<(f64, f64)>) {
        *self.shared.throttle.bucket.lock().unwrap() =
            limit.map(|(rate, burst)| (rate, burst, burst, Instant::now()));
    }

    /// Table requests the throttle refused, and those it let through, so far.
    pub fn throttled(&self) -> (u64, u64) {
        let t = &self.shared.throttle;
        (
            t.refused.load(Ordering::Relaxed),
            t.admitted.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_refuses_nothing_and_on_holds_the_bucket() {
        let t = Throttle::default();
        assert!((0..1000).all(|_| !t.refuses(Service::Table)));
        assert_eq!(t.admitted.load(Ordering::Relaxed), 0);
        // A bucket of 5 at a rate so low that nothing refills during the test.
        *t.bucket.lock().unwrap() = Some((1e-9, 5.0, 5.0, Instant::now()));
        let refused = (0..8).filter(|_| t.refuses(Service::Table)).count();
        assert_eq!(refused, 3);
        assert!(!t.refuses(Service::Queue), "queues are never throttled");
    }
}
